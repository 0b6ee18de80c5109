"""A whole group's exact peaks and settle times, summed up in the task that simulated it.

A group simulated event by event as one key has every attempt in that task, so the task
computes what staging would otherwise explode, shuffle and sort every attempt for: each
gauge's net change and rise per (bucket, level) (the gauge half of
:func:`retrysim.tables.peaks.bucket_changes`), each instance's
(:func:`retrysim.tables.peaks.instance_changes`) and the exact times to commit and to the
DLQ (:func:`retrysim.tables.summary.times_to_settle`), with the load's counts and the
busiest seconds of :mod:`retrysim.tables.key_counts`. The same moments and the same
arithmetic, in NumPy over the rows as they leave; a few rows per bucket go to the driver with
the stage's accumulator (two tasks that simulate the same group send a share each).
tests/tables/test_key_peaks.py holds them equal to the Spark passes.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import numpy as np
import pyarrow as pa

from retrysim.model.states import COMMIT, DLQ
from retrysim.tables.group_sums import (
    ALL_LEVELS,
    COUNTS,
    FIRST_BUCKETS_OF_8,
    GAUGES,
    PEAK_HALVES,
    PEAKS,
    QUANTILES,
    RATES,
    SHARES,
    THREAD_UNITS,
    GroupSums,
)
from retrysim.tables.key_counts import NULL as _NULL
from retrysim.tables.key_counts import (
    Attempts,
    BusiestSeconds,
    Columns,
    CompactCounter,
    columns_of,
)

_T_BITS = 42  # a moment's sort key: (level or instance) << _T_BITS | t


class GroupSummer:
    """Sums up one group's staged attempt rows (Arrow record batches in STAGE_ARROW's shape)
    as they leave the loop: each batch becomes its moments, kept as a few narrow arrays, and
    :meth:`finish` sorts them once."""

    def __init__(
        self,
        group: str,
        horizon_ms: int,
        bucket_ms: int,
        per_instance: bool,
        pop: tuple[int, bool] | None = None,
        shares: frozenset[str] = SHARES,
    ) -> None:
        """``pop``: the group's pop settings (retrysim.tables.commitlog_writes.pop_settings), if it
        pops; ``shares``: what to sum up (PEAKS or one of PEAK_HALVES, COUNTS, RATES)."""
        self.group, self.horizon, self.bucket_ms, self.pop = group, horizon_ms, bucket_ms, pop
        self.shares = shares
        halves = [i for i, half in enumerate(PEAK_HALVES) if half in shares]
        self.parity = halves[0] if halves else None  # the buckets this task's peaks cover
        self.peaks = PEAKS in shares or self.parity is not None
        self.buckets = -(-horizon_ms // bucket_ms)
        self.longest_wait = np.full(self.buckets, -1, dtype=np.int64)
        self.moments: list[tuple[np.ndarray, ...]] = []
        self.instance_moments: list[tuple[np.ndarray, ...]] | None = [] if per_instance else None
        self.settled: dict[str, list[np.ndarray]] = {COMMIT: [], DLQ: []}
        self.compact = CompactCounter(bucket_ms)
        self.busiest = BusiestSeconds(horizon_ms, bucket_ms)
        self.writes = 0  # how many commit-log writes an attempt can make (a column each)

    def add(self, batch: pa.RecordBatch | Columns) -> pa.RecordBatch | Columns:
        """Take ``batch``'s moments (a record batch or the compiled loop's chunk of rows);
        returns it, to pass it on."""
        rows = Attempts(columns_of(batch))
        if COUNTS in self.shares or RATES in self.shares:
            writes = rows.write_times(self.pop, self.horizon)
            self.writes = len(writes)
        if COUNTS in self.shares:
            self.compact.add(rows, writes)
        if RATES in self.shares:
            self.busiest.add(rows, writes)
            born = rows.columns.longs("born_ms")
            for kind in (COMMIT, DLQ):
                kept = (rows.columns.isin("result_state", kind) == 1) & (rows.settled != _NULL)
                kept &= born != _NULL
                self.settled[kind].append(rows.settled[kept] - born[kept])
            copied = (rows.copy_dead == 1) & (born != _NULL)  # a second copy's dead letter
            self.settled[DLQ].append(rows.copy[copied] - born[copied])
        if self.peaks:
            self._add_peaks(rows)
        return batch

    def _mine(self, at: np.ndarray) -> np.ndarray | bool:
        """Which moments fall in the buckets this task's peaks cover."""
        if self.parity is None:
            return True
        return ((at // self.bucket_ms) % 8 < FIRST_BUCKETS_OF_8) == (self.parity == 0)

    def _add_peaks(self, rows: Attempts) -> None:
        ready, start, processing, end = rows.ready, rows.start, rows.processing, rows.end
        waited_until, level, batch_size = rows.waited_until, rows.delay_level, rows.batch_size
        started = rows.started == 1
        waited = ~started | (start > ready)
        # Attempts' three-valued flags, true only where Spark's when() takes them
        waits_retry, scheduled, busy = rows.waits_retry == 1, rows.scheduled == 1, rows.busy == 1
        copied = rows.copy_waits == 1
        # Spark's FLOOR(1.0E12 / CAST(batch_size AS DOUBLE)), as a long
        share = np.where(
            busy, np.floor(THREAD_UNITS / np.maximum(batch_size, 1).astype(np.float64)), 0
        ).astype(np.int64)
        freed = np.where(busy, start + processing, _NULL)
        frees_at_end = busy & (end != _NULL) & (freed == end)
        ended = end != _NULL
        one, zero = np.int8(1), np.int8(0)
        # peaks._moments, the gauges (the moments that change no gauge are left out)
        gauge_moments = (
            (waited & (ready != _NULL), ready, ALL_LEVELS, {"ready_backlog": one}),
            (
                started,
                start,
                ALL_LEVELS,
                {"ready_backlog": -waited.astype(np.int8), "inflight": one, "threads_busy": share},
            ),
            (started & waited, start - 1, ALL_LEVELS, {}),  # the longest wait's moment
            (
                ended,
                end,
                ALL_LEVELS,
                {
                    "inflight": -one,
                    "waiting_retry": waits_retry.astype(np.int8),
                    "schedule": scheduled.astype(np.int8),
                    "threads_busy": np.where(frees_at_end, -share, 0),
                },
            ),
            (busy & ~frees_at_end, freed, ALL_LEVELS, {"threads_busy": -share}),
            (
                waits_retry & (waited_until != _NULL),
                waited_until,
                ALL_LEVELS,
                {"waiting_retry": -one, "schedule": -scheduled.astype(np.int8)},
            ),
            (scheduled & ended, end, level, {"schedule": one}),
            (scheduled & (waited_until != _NULL), waited_until, level, {"schedule": -one}),
            # a 4.9 client's second copy, WaitingRetry in the schedule topic until it is due
            (copied, rows.copy, ALL_LEVELS, {"waiting_retry": one, "schedule": one}),
            (copied, rows.copy_ready, ALL_LEVELS, {"waiting_retry": -one, "schedule": -one}),
            (copied, rows.copy, rows.copy_level, {"schedule": one}),
            (copied, rows.copy_ready, rows.copy_level, {"schedule": -one}),
        )
        for when, at, at_level, changes in gauge_moments:
            chosen = when & (at < self.horizon) & self._mine(at)
            if not chosen.any():
                continue
            levels = np.broadcast_to(np.asarray(at_level, dtype=np.int64), chosen.shape)[chosen]
            values = [np.broadcast_to(changes.get(g, zero), chosen.shape)[chosen] for g in GAUGES]
            self.moments.append(
                (
                    at[chosen],
                    levels.astype(np.int16),
                    *[v.astype(np.int8) for v in values[:4]],
                    values[4].astype(np.int64),
                )
            )
        waiting = started & waited & (start - 1 < self.horizon)
        np.maximum.at(
            self.longest_wait,
            (start[waiting] - 1) // self.bucket_ms,
            start[waiting] - ready[waiting],
        )
        if self.instance_moments is not None:
            self._add_instance_moments(
                rows.columns, ready, start, waited, started, share, freed, frees_at_end, busy
            )

    def _add_instance_moments(
        self, columns, ready, start, waited, started, share, freed, frees_at_end, busy
    ) -> None:
        """peaks.instance_changes' moments: the Ready backlog, threads busy and deliveries,
        up to the last bucket's end."""
        until = self.buckets * self.bucket_ms
        instance = columns.longs("consumer_instance")
        instance = np.where(instance == _NULL, -1, instance)
        one = np.int8(1)
        for when, at, ready_change, threads, delivered in (
            (waited & (ready != _NULL), ready, one, 0, 0),
            (started, start, -waited.astype(np.int8), share, 1),
            (frees_at_end, freed, 0, -share, 0),
            (busy & ~frees_at_end, freed, 0, -share, 0),
        ):
            chosen = when & (at < until) & self._mine(at)
            threads = np.broadcast_to(threads, chosen.shape)
            ready_change = np.broadcast_to(ready_change, chosen.shape)
            chosen &= (threads != 0) | (ready_change != 0) | bool(delivered)
            if chosen.any():
                self.instance_moments.append(
                    (
                        at[chosen],
                        instance[chosen].astype(np.int64),
                        ready_change[chosen].astype(np.int8),
                        threads[chosen].astype(np.int64),
                        np.full(int(chosen.sum()), delivered, dtype=np.int8),
                    )
                )

    def finish(self) -> GroupSums:
        sums = GroupSums(self.group, self.shares)
        if self.peaks:
            instances = None if self.instance_moments is None else self._instance_rows()
            sums = replace(
                sums,
                gauges=tuple(self._gauge_rows()),
                instances=None if instances is None else tuple(instances),
            )
        if RATES in self.shares:
            sums = replace(
                sums,
                ttc=_percentiles(self.settled[COMMIT]),
                ttd=_percentiles(self.settled[DLQ]),
                busiest=tuple(self.busiest.by_bucket().items()),
            )
        if COUNTS in self.shares:
            compact = self.compact.finish(self.group, self.writes)
            sums = replace(
                sums,
                compact=tuple(compact),
                # its own move to the DLQ and its second copy's (CompactCounter.finish)
                dead_letters=sum(row[-4] * ((row[5] == DLQ) + (row[-8] == DLQ)) for row in compact),
            )
        return sums

    def _gauge_rows(self) -> list[tuple]:
        if not self.moments:
            return []
        t, level, *changes = (np.concatenate(part) for part in zip(*self.moments, strict=True))
        self.moments = []
        runs = _Runs(t, level, self.bucket_ms)
        totals, rises = zip(*(runs.total_and_rise(change) for change in changes), strict=True)
        rows = []
        for i, (bucket, at_level) in enumerate(zip(runs.bucket, runs.key, strict=True)):
            wait = self.longest_wait[bucket] if at_level == ALL_LEVELS else -1
            rows.append(
                (
                    int(bucket),
                    int(at_level),
                    self.group,
                    *[int(total[i]) for total in totals],
                    int(wait) if wait >= 0 else None,
                    *[int(rise[i]) for rise in rises],
                )
            )
        return rows

    def _instance_rows(self) -> list[tuple]:
        if not self.instance_moments:
            return []
        parts = (np.concatenate(part) for part in zip(*self.instance_moments, strict=True))
        t, instance, ready, threads, delivered = parts
        self.instance_moments = []
        runs = _Runs(t, instance + 1, self.bucket_ms)  # null instances (-1) sort first
        ready_total, ready_rise = runs.total_and_rise(ready)
        threads_total, threads_rise = runs.total_and_rise(threads)
        deliveries = runs.sum(delivered)
        area = runs.area(threads)
        return [
            (
                int(runs.bucket[i]),
                None if runs.key[i] == 0 else int(runs.key[i] - 1),
                self.group,
                int(ready_total[i]),
                int(threads_total[i]),
                int(deliveries[i]),
                Decimal(area[i]),
                int(ready_rise[i]),
                int(threads_rise[i]),
            )
            for i in range(len(runs.bucket))
        ]


class _Runs:
    """Moments sorted by (key, time), split into runs of one (key, bucket): a gauge's value
    after each millisecond is a running sum within the run, counted at the last moment of
    the millisecond (a range frame's peers), as peaks._gauge_changes counts it."""

    def __init__(self, t: np.ndarray, key: np.ndarray, bucket_ms: int) -> None:
        # stable: each batch's moments of one kind come in time order, runs a merge sort
        # takes whole (a quicksort would sort them again)
        self.order = _order_by(key.astype(np.int64), t)
        self.t = t[self.order]
        keys = key[self.order]
        buckets = self.t // bucket_ms
        new_run = np.ones(len(self.t), dtype=bool)
        new_run[1:] = (keys[1:] != keys[:-1]) | (buckets[1:] != buckets[:-1])
        self.starts = np.flatnonzero(new_run)
        self.lengths = np.diff(np.append(self.starts, len(self.t)))
        self.last = self.starts + self.lengths - 1
        self.key, self.bucket = keys[self.starts], buckets[self.starts]
        self.bucket_end = (self.bucket + 1) * bucket_ms
        last_of_ms = np.ones(len(self.t), dtype=bool)
        last_of_ms[:-1] = (self.t[1:] != self.t[:-1]) | new_run[1:]
        # each run's values after its milliseconds, as a slice of the moments that end one
        self.ends = np.flatnonzero(last_of_ms)
        self.run_ends = np.searchsorted(self.ends, self.starts)
        self.entered = self.t[self.starts] > self.bucket * bucket_ms

    def sum(self, change: np.ndarray) -> np.ndarray:
        return np.add.reduceat(change[self.order].astype(np.int64), self.starts)

    def total_and_rise(self, change: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """peaks._gauge_changes' ``_total`` and ``_rise`` of one gauge, per run."""
        running = np.cumsum(change[self.order], dtype=np.int64)
        before = np.zeros(len(self.starts), dtype=np.int64)
        before[self.starts > 0] = running[self.starts[self.starts > 0] - 1]
        highest = np.maximum.reduceat(running[self.ends], self.run_ends) - before
        total = running[self.last] - before
        return total, np.where(self.entered, np.maximum(highest, 0), highest)

    def area(self, threads: np.ndarray) -> list[int]:
        """Per run, the sum of each threads-busy change times the time from it to the
        bucket's end, exact: a change is a share of THREAD_UNITS (one per batch size), and
        per share the sum of +-1 x time fits a long."""
        ordered = threads[self.order]
        to_end = np.repeat(self.bucket_end, self.lengths) - self.t
        area = [0] * len(self.starts)
        for share in np.unique(np.abs(ordered[ordered != 0])).tolist():
            sign = np.where(ordered == share, 1, np.where(ordered == -share, -1, 0))
            per_run = np.add.reduceat(sign * to_end, self.starts)
            area = [a + share * int(s) for a, s in zip(area, per_run.tolist(), strict=True)]
        return area


def _order_by(key: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The stable argsort of the moments by (key, t): a sort of the values with each one's
    position packed into its low bits, quicker than the indirect sort it gives: it moves
    the integers themselves, not indices into them (it falls back to that sort where the
    three do not fit in 63 bits)."""
    count = len(t)
    if not count:
        return np.empty(0, dtype=np.int64)
    index_bits = max(1, (count - 1).bit_length())
    t_bits = max(1, int(t.max()).bit_length())
    if (
        int(t.min()) < 0
        or int(key.min()) < 0
        or (int(key.max()).bit_length() + t_bits + index_bits > 63)
    ):
        return np.argsort((key << _T_BITS) | t, kind="stable")
    packed = (((key << t_bits) | t) << index_bits) | np.arange(count, dtype=np.int64)
    return np.sort(packed, kind="stable") & ((1 << index_bits) - 1)


def _percentiles(parts: list[np.ndarray]) -> list[float] | None:
    """summary.exact_percentiles of one (group, kind): the value at rank (n - 1) p,
    interpolated linearly between the two closest ranks, in its order of operations. Only
    those ranks are put in place (a partition, not a sort of every value)."""
    values = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    if not len(values):
        return None
    positions = [float(len(values) - 1) * share for share in QUANTILES]
    ranks = sorted({int(f(position)) for position in positions for f in (np.floor, np.ceil)})
    values = np.partition(values, ranks)
    result = []
    for position in positions:
        lo, hi = int(np.floor(position)), int(np.ceil(position))
        low, high = float(values[lo]), float(values[hi])
        result.append(
            low if lo == hi or low == high else (hi - position) * low + (position - lo) * high
        )
    return result
