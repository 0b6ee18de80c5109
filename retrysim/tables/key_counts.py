"""A whole group's load counts and busiest seconds, summed up in the task that simulated it.

The twin of the two staging scans :mod:`retrysim.tables.key_peaks` leaves to Spark: the
load's compact rows (:func:`retrysim.tables.load._compact`: attempts grouped by the buckets
of their events) and each rate's busiest second per bucket (the rate half of
:func:`retrysim.tables.peaks.bucket_changes`). The same keys, the same null semantics (a
comparison with null is null, and ``when`` takes null for false) and the same commit-log
writes (:func:`retrysim.tables.commitlog_writes.write_times`), in NumPy over the rows as they leave;
tests/tables/test_key_peaks.py holds them equal to the Spark passes.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from retrysim.model.behavior import TIMEOUT
from retrysim.model.states import (
    COMMIT,
    DISCARD,
    DLQ,
    INFLIGHT,
    READY,
    READY_PUBLISHED,
    READY_REPLAYED,
    READY_RETRY_DUE,
    REASON_BROADCAST,
    WAITING_RETRY,
)
from retrysim.scenario import limits
from retrysim.tables.commitlog_writes import ACK_TIME_INTERVAL_MS
from retrysim.tables.group_sums import RATE_COLUMNS, RETRY_NUMBER_CAP

NULL = np.iinfo(np.int64).min  # a null long
_MISSING = np.iinfo(np.int64).max  # no value yet, for a minimum
STATES = (COMMIT, WAITING_RETRY, DLQ, DISCARD, INFLIGHT, READY)
# the compact rows' keys, in _compact's order (b_writes: one column per write here)
_FLAGS = ("started", "first", "retry", "replayed")
_BUCKETS = ("b_ready", "b_start", "b_end", "b_settled", "b_wr_until", "b_busy_last")
_MERGE_ROWS = 200_000  # partial compact rows kept before they are merged


def ints(batch: pa.RecordBatch, name: str) -> np.ndarray:
    """A column as int64, NULL where null."""
    return pc.fill_null(batch.column(name).cast(pa.int64()), NULL).to_numpy()


def _truth(array: pa.Array) -> np.ndarray:
    """A boolean column as int8: 1 true, 0 false, -1 null (three-valued, as Spark's)."""
    return pc.fill_null(array.cast(pa.int8()), -1).to_numpy(zero_copy_only=False)


def _equal(batch: pa.RecordBatch, name: str, *values: str) -> np.ndarray:
    """``name IN values``, three-valued (null where the column is)."""
    column = batch.column(name)
    found = pc.is_in(column, value_set=pa.array(values, column.type))
    return _truth(pc.if_else(pc.is_null(column), pa.scalar(None, pa.bool_()), found))


def _and(*flags: np.ndarray) -> np.ndarray:
    """Three-valued AND: false if any is false, else null if any is null."""
    stacked = np.stack(flags)
    return np.where((stacked == 0).any(axis=0), 0, np.where((stacked < 0).any(axis=0), -1, 1))


def _not(flag: np.ndarray) -> np.ndarray:
    return np.where(flag < 0, -1, 1 - flag)


def _when(condition: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``F.when(condition, value)``: the value where the condition is true (not null)."""
    return np.where(condition == 1, value, NULL)


def _floor_div(values: np.ndarray, by: int) -> np.ndarray:
    return np.where(values == NULL, NULL, values // by)


def _present(*values: np.ndarray) -> np.ndarray:
    return np.logical_and.reduce([v != NULL for v in values])


class Columns(Protocol):
    """What the sums read of a batch of staged attempt rows: a record batch's columns
    (:class:`BatchColumns`), or the compiled loop's rows before they become one
    (:class:`retrysim.engine.event_rows.Chunk`, which answers from its codes without
    converting a column)."""

    def longs(self, name: str) -> np.ndarray:
        """A column as int64, NULL where null."""

    def isin(self, name: str, *values: str) -> np.ndarray:
        """``name IN values``, three-valued as int8 (1 true, 0 false, -1 null)."""

    def index_in(self, name: str, values: tuple[str, ...]) -> np.ndarray:
        """Each string's position in ``values``, -1 where null; a ValueError if any is
        none of them."""


class BatchColumns:
    """A record batch's :class:`Columns`."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch

    def longs(self, name: str) -> np.ndarray:
        return ints(self.batch, name)

    def isin(self, name: str, *values: str) -> np.ndarray:
        return _equal(self.batch, name, *values)

    def index_in(self, name: str, values: tuple[str, ...]) -> np.ndarray:
        column = self.batch.column(name)
        index = pc.fill_null(pc.index_in(column, value_set=pa.array(values, column.type)), -1)
        if (pc.sum(pc.equal(index, -1)).as_py() or 0) != column.null_count:
            raise ValueError(f"a {name} outside {values}")
        return index.to_numpy(zero_copy_only=False)


def columns_of(batch: pa.RecordBatch | Columns) -> Columns:
    return BatchColumns(batch) if isinstance(batch, pa.RecordBatch) else batch


class Attempts:
    """The columns of one batch of staged attempt rows that the counts read."""

    def __init__(self, columns: Columns) -> None:
        self.columns = columns
        for name in (
            "ready_ms", "start_ms", "processing_ms", "end_ms", "settled_ms", "next_ready_ms",
            "delay_level", "delivery", "reconsume_times", "batch_size",
        ):  # fmt: skip
            setattr(self, name.removesuffix("_ms"), columns.longs(name))
        self.started = (self.start != NULL).astype(np.int8)
        self.waits_retry = columns.isin("end_state", WAITING_RETRY)
        self.scheduled = _and(self.waits_retry, columns.isin("end_topic", limits.SCHEDULE_TOPIC))
        processing = np.where(self.processing == NULL, 0, self.processing)
        self.busy = _and(self.started, np.where(self.processing == NULL, -1, processing > 0))
        self.busy_end = np.where(self.busy == 1, self.start + processing, NULL)
        self.retry = _and(
            self.started, _not(columns.isin("ready_reason", READY_PUBLISHED, READY_REPLAYED))
        )
        # WaitingRetry until the next delivery is Ready (or the dead letter lands)
        self.waited_until = np.where(self.next_ready != NULL, self.next_ready, self.settled)
        # a 4.9 client's second send-back: its copy's state from copy_ms (WaitingRetry in
        # the schedule topic until copy_ready_ms, or the DLQ or a discard)
        self.copy = columns.longs("copy_ms")
        self.copy_ready = columns.longs("copy_ready_ms")
        self.copy_level = columns.longs("copy_delay_level")
        self.copy_waits = columns.isin("copy_state", WAITING_RETRY)
        self.copy_dead = columns.isin("copy_state", DLQ)

    def write_times(self, pop: tuple[int, bool] | None, horizon: int) -> list[np.ndarray]:
        """:func:`retrysim.tables.commitlog_writes.write_times` of these rows: each possible write's
        moment, NULL where the attempt does not make it before the horizon."""
        columns = self.columns
        unread = _and(
            columns.isin("result_state", DISCARD), columns.isin("leave_reason", REASON_BROADCAST)
        )
        dead = (columns.isin("result_state", DLQ) == 1) | (unread == 1)
        times = [
            _when(
                columns.isin("ready_reason", READY_PUBLISHED, READY_REPLAYED, READY_RETRY_DUE),
                self.ready,
            ),
            _when(self.scheduled, self.end),
            np.where(dead, self.settled, NULL),
            np.where((self.copy_waits == 1) | (self.copy_dead == 1), self.copy, NULL),
        ]
        if pop is not None:
            times += self._pop_write_times(*pop)
        return [np.where((t != NULL) & (t < horizon), t, NULL) for t in times]

    def _pop_write_times(
        self, invisible: int, nacks: bool, delays: tuple[int, ...]
    ) -> list[np.ndarray]:
        """:func:`retrysim.tables.commitlog_writes.pop_write_times` of a group that pops."""
        columns, start, end = self.columns, self.start, self.end
        committed = columns.isin("end_state", COMMIT) == 1
        outcome = columns.isin("outcome", TIMEOUT)
        nacked = nacks & (columns.isin("end_state", WAITING_RETRY) == 1) & (outcome == 0)
        left_at = np.where(columns.isin("result_state", DLQ, DISCARD) == 1, self.settled, NULL)
        leaves = left_at != NULL
        visible_again = np.where(start != NULL, start + invisible, NULL)
        retry = np.minimum(self.columns.longs("broker_reconsume_times") + 1, len(delays)) - 1
        retry_due = np.where(end != NULL, end + np.asarray(delays, np.int64)[retry], NULL)
        early = ACK_TIME_INTERVAL_MS

        def minus(at: np.ndarray, by: int) -> np.ndarray:
            return np.where(at == NULL, NULL, at - by)

        def timer_put(when, now, at, due) -> list[np.ndarray]:
            later = when & _present(now, due) & (due > now)
            return [np.where(when, now, NULL), np.where(later, at, NULL)]

        invisible_after = np.where(leaves, left_at + invisible, NULL)
        return [
            *timer_put(start != NULL, start, visible_again, minus(visible_again, early)),
            *timer_put(committed, end, visible_again, visible_again),
            *timer_put(nacked, end, retry_due, minus(retry_due, early)),
            *timer_put(nacked, end, visible_again, visible_again),
            left_at,
            *timer_put(leaves, left_at, invisible_after, minus(invisible_after, early)),
            *timer_put(leaves, left_at, invisible_after, invisible_after),
        ]


class CompactCounter:
    """The load's compact rows of one group (:func:`retrysim.tables.load._compact`): per
    batch, the rows' keys are made unique with their counts and sums, and the partial rows
    are merged again as they grow and at the end."""

    def __init__(self, bucket_ms: int) -> None:
        self.bucket_ms = bucket_ms
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.rows = self.merged = 0  # rows held; rows after the last merge

    def add(self, rows: Attempts, writes: list[np.ndarray]) -> None:
        b = self.bucket_ms
        try:
            state = rows.columns.index_in("result_state", STATES)
        except ValueError:
            raise ValueError("an attempt's result_state is none of retrysim's states") from None
        has_next = rows.next_ready != NULL
        keys = [
            rows.started,
            _and(rows.started, np.where(rows.delivery == NULL, -1, rows.delivery == 1)),
            rows.retry,
            rows.columns.isin("ready_reason", READY_REPLAYED),
            state,
            (rows.end != NULL).astype(np.int8),
            rows.waits_retry,
            *[_floor_div(t, b) for t in writes],
            _when(rows.scheduled, rows.delay_level),
            _floor_div(rows.ready, b),
            _floor_div(rows.start, b),
            _floor_div(rows.end, b),
            _floor_div(rows.settled, b),
            _when(rows.waits_retry, _floor_div(rows.waited_until, b)),
            _when(
                rows.busy, _floor_div(np.where(rows.busy_end == NULL, NULL, rows.busy_end - 1), b)
            ),
            rows.batch_size,
            np.where(has_next, rows.delay_level, NULL),
            np.where(  # least() skips a null: a null reconsume_times gives the cap
                has_next,
                np.where(
                    rows.reconsume_times == NULL,
                    RETRY_NUMBER_CAP,
                    np.minimum(rows.reconsume_times + 1, RETRY_NUMBER_CAP),
                ),
                NULL,
            ),
            rows.columns.index_in("copy_state", STATES),
            _floor_div(rows.copy, b),
            _floor_div(rows.copy_ready, b),
            rows.copy_level,
        ]
        waited = (rows.start == NULL) | (rows.start > rows.ready)
        busy = rows.busy == 1
        matrix = np.stack([k.astype(np.int64) for k in keys], axis=1)
        self.parts.append(
            (
                matrix,
                np.ones(len(matrix), dtype=np.int64),
                np.where(busy, rows.start, 0),
                busy.astype(np.int64),
                np.where(busy, rows.busy_end, 0),
                np.where(waited & (rows.ready != NULL), rows.ready, _MISSING),
            )
        )
        self.parts.append(_grouped(*self.parts.pop()))  # a batch's few kinds of rows
        self.rows += len(self.parts[-1][0])
        if self.rows > max(_MERGE_ROWS, 2 * self.merged):  # geometric: never quadratic
            self._merge()

    def _merge(self) -> None:
        if self.parts:
            self.parts = [_grouped(*(np.concatenate(p) for p in zip(*self.parts, strict=True)))]
            self.rows = self.merged = len(self.parts[0][0])

    def finish(self, group: str, writes: int) -> list[tuple]:
        """The compact rows, in _compact's columns."""
        self._merge()
        if not self.parts:
            return []
        matrix, n, start_sum, busy, end_sum, min_ready = self.parts[0]
        flags = {-1: None, 0: False, 1: True}
        rows = []
        for key, count, starts, busy_rows, ends, ready in zip(
            matrix.tolist(), n.tolist(), start_sum.tolist(), busy.tolist(), end_sum.tolist(),
            min_ready.tolist(), strict=True,
        ):  # fmt: skip
            longs = [None if v == NULL else v for v in key]
            rows.append(
                (
                    group,
                    *[flags[v] for v in key[:4]],
                    None if key[4] < 0 else STATES[key[4]],
                    flags[key[5]],
                    flags[key[6]],
                    longs[7 : 7 + writes],
                    *longs[7 + writes : -4],
                    None if key[-4] < 0 else STATES[key[-4]],
                    *longs[-3:],
                    count,
                    starts if busy_rows else None,
                    ends if busy_rows else None,
                    None if ready == _MISSING else ready,
                )
            )
        return rows


_MIX = np.uint64(0x9E3779B97F4A7C15)  # a 64-bit odd constant (the golden ratio's)


def _unique_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of an int64 ``matrix``: the index of one row of each kind, and each
    row's kind. Rows are told apart by a 64-bit hash of their values, and every row is then
    compared with its kind's row: equal hashes of different rows (never seen) fall back to
    sorting the rows' bytes, so the grouping is exact either way."""
    hashed = np.zeros(len(matrix), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in matrix.T:
            hashed = (hashed ^ column.view(np.uint64)) * _MIX
            hashed ^= hashed >> np.uint64(29)
    _, first, kind = np.unique(hashed, return_index=True, return_inverse=True)
    if not (matrix[first][kind] == matrix).all():
        width = matrix.shape[1]
        rows = np.ascontiguousarray(matrix).view(np.dtype((np.void, 8 * width))).ravel()
        _, first, kind = np.unique(rows, return_index=True, return_inverse=True)
    return first, kind.ravel()


def _grouped(
    matrix: np.ndarray, n: np.ndarray, start_sum: np.ndarray, busy: np.ndarray,
    end_sum: np.ndarray, min_ready: np.ndarray,
) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Compact rows (keys, counts and sums) with equal keys added up."""
    first, kind = _unique_rows(matrix)
    kinds = len(first)

    def total(values: np.ndarray) -> np.ndarray:
        out = np.zeros(kinds, dtype=np.int64)
        np.add.at(out, kind, values)
        return out

    lowest = np.full(kinds, _MISSING, dtype=np.int64)
    np.minimum.at(lowest, kind, min_ready)
    return matrix[first], total(n), total(start_sum), total(busy), total(end_sum), lowest


class BusiestSeconds:
    """Each rate's count per second with any, for its busiest second per bucket (the rate
    half of :func:`retrysim.tables.peaks.bucket_changes`: deliveries and retries at a
    delivery's start, commit-log writes at their moments, before the horizon). Kept
    sparse, a few rows per second that has any, as Spark's groupBy keeps them: a horizon
    of a year has 31.6M seconds."""

    RATES = len(RATE_COLUMNS)

    def __init__(self, horizon_ms: int, bucket_ms: int) -> None:
        self.horizon, self.bucket_ms = horizon_ms, bucket_ms
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []  # (second x RATES + rate, count)

    def add(self, rows: Attempts, writes: list[np.ndarray]) -> None:
        starts = (rows.started == 1) & (rows.start < self.horizon)
        retries = starts & (rows.retry == 1)
        moments = np.concatenate([t[t != NULL] for t in writes])
        for rate, at in enumerate((rows.start[starts], rows.start[retries], moments)):
            keys, counts = np.unique(at // 1000 * self.RATES + rate, return_counts=True)
            self.parts.append((keys, counts.astype(np.int64)))

    def by_bucket(self) -> dict[int, tuple[int, int, int]]:
        """bucket -> the busiest second's count of each rate, for the buckets with any
        second in which a delivery started or a write happened."""
        if not self.parts:
            return {}
        keys, counts = (np.concatenate(part) for part in zip(*self.parts, strict=True))
        keys, kind = np.unique(keys, return_inverse=True)
        totals = np.zeros(len(keys), dtype=np.int64)
        np.add.at(totals, kind.ravel(), counts)
        seconds, at = np.unique(keys // self.RATES, return_inverse=True)
        per_second = np.zeros((self.RATES, len(seconds)), dtype=np.int64)
        per_second[keys % self.RATES, at.ravel()] = totals
        buckets = seconds * 1000 // self.bucket_ms
        starts = np.flatnonzero(np.diff(buckets, prepend=-1))
        highest = np.maximum.reduceat(per_second, starts, axis=1)
        return {
            int(bucket): tuple(int(v) for v in column)
            for bucket, column in zip(buckets[starts], highest.T, strict=True)
        }
