"""The check's fast passes over a staged run's Parquet files, in the Spark tasks' Python.

:func:`retrysim.checks.validate.validate_tables` reduces a run's tables to a few numbers per
run and group (digests and counts) before it compares them. Built as Spark expressions, those
scans spend most of a cold run in the JVM's compiler (Catalyst's planning, Janino and the
generated code of a few hundred expressions; docs/performance.md), for work that is a few
vector operations per column. Here the same numbers come from one Spark stage whose tasks
read the staged files with pyarrow (a file's row groups, a batch at a time: memory stays
flat) and compute every pass with NumPy, hashing with numba kernels that give Spark's
``xxhash64`` bit for bit.

The results are the Spark passes' results, value for value (on a run with one runs row: a
run with several fails ``runs_row`` either way), so the two mix freely: a pass whose rules
live only in Spark (the 5.x pops' commit-log writes) stays in Spark, a lean run's messages,
which it does not stage, are made again in the tasks from its scenario, and the comparison
on the driver does not know which side computed what. The row-by-row pass, which
runs only when a digest disagrees, and ``retrysim validate`` over published tables stay in
Spark. tests/checks/test_file_passes.py holds the two to equal outputs, on real runs of every
flavor and on broken runs.

The Spark expressions the passes mirror: :mod:`retrysim.checks.chain_digests` (the digests and the
chains), :func:`retrysim.checks.rows.attempt_steps` (an attempt's steps and the rules its row
breaks alone) and :mod:`retrysim.checks.counts`. Null handling follows Spark's: a hash skips
a null value (and a null mask keeps it apart), a comparison with a null is neither true nor
false, and an aggregate ignores nulls.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from retrysim.checks import counts
from retrysim.checks.invariants import (
    END_STATES,
    HASHED,
    LINK_FIRST,
    LINK_ODD,
    LINK_REPLAY,
    LINK_RETRY,
    REASON_CODE,
    RETRY_REASONS,
    STATE_CODE,
)
from retrysim.checks.spark_hash import Value, constant, null, number, spark_hash
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
    REASON_LATE_SEND_BACK,
    REASON_SEND_BACK_FAILED,
    REASON_SEND_BACK_FALLBACK,
    WAITING_RETRY,
)
from retrysim.model.workload import messages_np
from retrysim.model.xxh64 import LOW32
from retrysim.scenario import limits
from retrysim.scenario.loading import scenario_from_json
from retrysim.scenario.spec import Scenario
from retrysim.session import python_tasks
from retrysim.store.sinks import STATUS_COMPLETE
from retrysim.tables.schemas import SCHEMAS, data_schema
from retrysim.tables.transitions import REASON_DELIVERED, SEQ_PER_DELIVERY

# The passes this module computes, by the name validate gives them, and the table each reads.
PASS_TABLES = {"load": "load", "summary": "summary", "derived": "attempts",
               "chains": "attempts", "messages": "messages", "dead": "dead_letters",
               "runs": "runs", "instances": "instance_load",
               "transitions": "transitions"}  # fmt: skip
BATCH_ROWS = 1 << 19
# A lean run's messages are not staged: the tasks make them again from its scenario.
GENERATED = "<made again from the run's scenario>"

# --------------------------------------------------------------------------- Arrow columns


class Batch:
    """A record batch's columns as :class:`Value` (by the Spark type of the table's column),
    with lookups of string columns as codes."""

    def __init__(self, batch: pa.RecordBatch | pa.Table, kinds: dict[str, str]) -> None:
        self.rows = batch.num_rows
        self._columns = {name: batch.column(name) for name in batch.schema.names}
        self._kinds = kinds
        self._cache: dict[str, Value] = {}
        self._encoded: dict[str, tuple[list, np.ndarray]] = {}

    def derive(self, name: str, kind: str, column: pa.Array) -> Value:
        """``column`` (computed from others) as the column ``name`` of Spark type ``kind``."""
        self._columns[name] = column
        self._kinds = {**self._kinds, name: kind}
        self._cache.pop(name, None)
        return self[name]

    def array(self, name: str) -> pa.Array:
        column = self._columns.get(name)
        if column is None:
            return pa.nulls(self.rows, _ARROW_TYPE[self._kinds[name]])
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        return column

    def __getitem__(self, name: str) -> Value:
        if name not in self._cache:
            self._cache[name] = self._value(name)
        return self._cache[name]

    def _value(self, name: str) -> Value:
        kind, column = self._kinds[name], self.array(name)
        valid = _valid(column)
        if kind == "str":
            if pa.types.is_dictionary(column.type):
                column = column.dictionary_decode()
            if not pa.types.is_string(column.type):
                column = column.cast(pa.string())
            buffers = column.buffers()
            offsets = np.frombuffer(buffers[1], dtype=np.int32)
            offsets = offsets[column.offset : column.offset + len(column) + 1]
            data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] else _NO_BYTES
            return Value("str", valid, offsets=offsets, data=data)
        if pa.types.is_boolean(column.type):
            column = column.cast(pa.int64())
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
        return number(kind, values, valid)

    def ints(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The column's values (int64; 0 where null) and which are not null."""
        value = self[name]
        return value.bits.view(np.int64), value.valid

    def doubles(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        column = self.array(name)
        return pc.fill_null(column, 0.0).to_numpy(zero_copy_only=False), _valid(column)

    def encoded(self, name: str) -> tuple[list, np.ndarray]:
        """A column's distinct values and each row's index among them (one past the last
        where null), encoded once for every lookup of the column."""
        if name not in self._encoded:
            encoded = pc.dictionary_encode(self.array(name))
            words = encoded.dictionary.to_pylist()
            indices = pc.fill_null(encoded.indices, len(words)).to_numpy(zero_copy_only=False)
            self._encoded[name] = words, indices
        return self._encoded[name]

    def codes(self, name: str, mapping: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
        """A string column as ``mapping``'s codes (``lookup``: null where the string is null
        or not in ``mapping``)."""
        words, indices = self.encoded(name)
        table = np.array([mapping.get(w, 0) for w in words] + [0], dtype=np.int64)
        known = np.array([w in mapping for w in words] + [False])
        return table[indices], known[indices]

    def equals(self, name: str, text: str) -> tuple[np.ndarray, np.ndarray]:
        """``col == text``: the answer, and where it is not null."""
        code, known = self.codes(name, {text: 1})
        return known & (code == 1), self[name].valid


_NO_BYTES = np.zeros(0, np.uint8)
_ARROW_TYPE = {"long": pa.int64(), "int": pa.int32(), "str": pa.string(), "double": pa.float64(),
               "bool": pa.bool_()}  # fmt: skip


def _valid(column: pa.Array) -> np.ndarray:
    if column.null_count == 0:
        return np.ones(len(column), bool)
    return pc.is_valid(column).to_numpy(zero_copy_only=False)


def _kinds(schema) -> dict[str, str]:
    """A Spark schema's columns as the kinds :class:`Value` hashes them by."""
    kinds = {"string": "str", "bigint": "long", "int": "int", "boolean": "int",
             "double": "double"}  # fmt: skip
    return {f.name: kinds.get(f.dataType.simpleString(), "other") for f in schema.fields}


# --------------------------------------------------------------------------- aggregates


class Sums:
    """Per group, the aggregates of a pass over batches: sums, smallest and largest values
    (``min_*`` and ``max_*``/``size_bytes`` keys), combined across batches and tasks."""

    def __init__(self) -> None:
        self.groups: dict[object, dict[str, int | float]] = defaultdict(dict)

    def add(self, group, values: dict[str, int | float | None]) -> None:
        found = self.groups[group]
        for key, value in values.items():
            if value is None:
                continue
            if key not in found:
                found[key] = value
            elif key.startswith("min_"):
                found[key] = min(found[key], value)
            elif key.startswith("max_") or key == "size_bytes":
                found[key] = max(found[key], value)
            else:
                found[key] += value


def digest_sums(hashes: list[tuple[np.ndarray, np.ndarray]], prefix: str, rows: np.ndarray):
    """:func:`retrysim.checks.chain_digests._digest_sums` over the ``rows`` of a group: the count of
    present hashes and the sums of their halves (each pair: the hash bits, where present)."""
    present = hi = lo = 0
    for bits, where in hashes:
        chosen = bits[where & rows]
        present += int(chosen.size)
        hi += int((chosen >> np.uint64(32)).astype(np.int64).sum())
        lo += int((chosen & LOW32).astype(np.int64).sum())
    return {f"{prefix}_rows": present, f"{prefix}_hash_hi": hi, f"{prefix}_hash_lo": lo}


def _groups(batch: Batch) -> Iterator[tuple[object, np.ndarray]]:
    """Each group of the batch and its rows (None: the rows whose group is null)."""
    words, indices = batch.encoded("group")
    for code, name in enumerate(words):
        yield name, indices == code
    if (indices == len(words)).any():
        yield None, indices == len(words)


def _put(values: dict, key: str, got: np.ndarray, valid: np.ndarray, rows: np.ndarray, how,
         cast=int) -> None:  # fmt: skip
    """``values[key]``: ``how`` (np.sum, np.min, np.max) of a group's non-null values, as
    Spark aggregates them; none (Spark's null, left out) when every value is null."""
    chosen = got[rows & valid]
    if chosen.size:
        values[key] = cast(how(chosen))


def _count(mask: np.ndarray, rows: np.ndarray) -> int:
    return int(np.count_nonzero(mask & rows))


# --------------------------------------------------------------------------- attempts

_CODE = STATE_CODE
_WHY = REASON_CODE
_STEP_NAMES = ("ready", "start", "end", "leave")
_EXPECTED = {"ready": (READY,), "start": (INFLIGHT,), "end": END_STATES, "leave": (DLQ, DISCARD)}
ATTEMPT_COLUMNS = ("group", "msg_id", "delivery", "reconsume_times", "broker_reconsume_times",
                   "source_topic", "queue_id", "ready_ms", "start_ms", "end_ms", "result_state",
                   "delay_level", "next_ready_ms", "settled_ms", "ready_reason", "end_state",
                   "end_topic", "end_queue_id", "end_reason", "leave_state", "leave_topic",
                   "leave_queue_id", "leave_reason", "born_ms", "next_topic", "next_queue_id",
                   "next_reason", "poison_fixed", "parent_delivery", "copy_state", "copy_ms",
                   "copy_topic", "copy_queue_id", "copy_delay_level",
                   "copy_ready_ms")  # fmt: skip


def _before(late: tuple, early: tuple) -> np.ndarray:
    """``is_before``: both present and ``late < early``."""
    return late[1] & early[1] & (late[0] < early[0])


def _differs(left: tuple, right: tuple) -> np.ndarray:
    """``~left.eqNullSafe(right)``."""
    both = left[1] & right[1]
    return (left[1] != right[1]) | (both & (left[0] != right[0]))


def _coalesce(*pairs: tuple) -> tuple[np.ndarray, np.ndarray]:
    values, valid = pairs[-1][0].copy(), pairs[-1][1].copy()
    for value, present in reversed(pairs[:-1]):
        values = np.where(present, value, values)
        valid = present | valid
    return values, valid


def _link(kind: Value, msg_id: Value, delivery: Value, rt: Value, ready: Value, born: Value,
          route: Value) -> np.ndarray:  # fmt: skip
    """:func:`retrysim.checks.chain_digests._link`."""
    return spark_hash([kind, msg_id, delivery, rt, ready, born, route], kind.valid.size)


def _reconsume_counts(rt: tuple, broker_rt: tuple) -> Value:
    """:func:`retrysim.checks.chain_digests._counts`: both counts as one long."""
    return number("long", rt[0] * (1 << 32) + broker_rt[0], rt[1] & broker_rt[1])


def attempt_passes(
    batch: Batch, horizon: int | None, ends: dict[object, int], hashed: bool, want: set[str]
) -> Iterator[tuple[str, object, dict]]:
    """The ``derived`` and ``chains`` passes over a batch of attempts (``want`` says which;
    ``horizon``: its run's; ``ends``: each group's load end), per group."""
    n = batch.rows
    code = _CODE
    # a 4.9 client's second send-back takes the leave step (transitions.step_columns)
    left, copied = batch["leave_state"].valid, batch["copy_state"].valid
    present = {"ready": np.ones(n, bool), "start": batch["start_ms"].valid,
               "end": batch["end_state"].valid, "leave": left | copied}  # fmt: skip
    leave_state = np.where(left, batch.codes("leave_state", code)[0],
                           batch.codes("copy_state", code)[0])  # fmt: skip
    state_of = {
        "ready": (np.full(n, code[READY]), present["ready"]),
        "start": (np.full(n, code[INFLIGHT]), present["start"]),
        "end": (batch.codes("end_state", code)[0], present["end"]),
        "leave": (leave_state, present["leave"]),
    }  # a present step's state code (0: a state the model does not know); null if absent
    ms_column = {"ready": "ready_ms", "start": "start_ms", "end": "end_ms", "leave": "settled_ms"}
    ms = {}
    for step, column in ms_column.items():
        values, valid = batch.ints(column)
        ms[step] = (values, valid & present[step])
    copy_ms = batch.ints("copy_ms")
    ms["leave"] = (np.where(left, ms["leave"][0], copy_ms[0]),
                   np.where(left, ms["leave"][1], copy_ms[1] & copied))  # fmt: skip
    t_n = sum(present[s].astype(np.int64) for s in _STEP_NAMES)
    last_step = np.select([present["leave"], present["end"], present["start"]], [4, 3, 2], 1)
    own_leave = present["leave"] & ~copied  # the delivery's own last state, not its copy's
    last_state = np.select(
        [own_leave, present["end"], present["start"]],
        [state_of["leave"][0], state_of["end"][0], state_of["start"][0]],
        state_of["ready"][0],
    )
    last_ms = _coalesce((ms["leave"][0], ms["leave"][1] & ~copied), ms["end"], ms["start"],
                        ms["ready"])  # fmt: skip
    off_step = sum(
        (present[s] & ~np.isin(state_of[s][0], [code[x] for x in _EXPECTED[s]])).astype(np.int64)
        for s in _STEP_NAMES
    ) - (copied & (leave_state == code[WAITING_RETRY]))
    no_time = sum((present[s] & ~ms[s][1]).astype(np.int64) for s in _STEP_NAMES)

    def in_state(wanted: str) -> np.ndarray:
        return sum((present[s] & (state_of[s][0] == code[wanted])).astype(np.int64)
                   for s in _STEP_NAMES)  # fmt: skip

    reason = batch.codes("ready_reason", _WHY)[0]  # 0: null or not a reason the model knows
    inflight = in_state(INFLIGHT)
    delivery_values, delivery_valid = batch.ints("delivery")
    first_kind = np.isin(reason, [_WHY[READY_PUBLISHED], _WHY[READY_REPLAYED]])
    end_scheduled = batch.equals("end_topic", limits.SCHEDULE_TOPIC)[0]
    end_waiting = present["end"] & (state_of["end"][0] == code[WAITING_RETRY])
    leave_unread = (
        present["leave"]
        & batch.equals("leave_state", DISCARD)[0]
        & batch.equals("leave_reason", REASON_BROADCAST)[0]
    )
    counted = {
        "t_deliveries": inflight,
        "t_first_deliveries": np.where(delivery_valid & (delivery_values == 1), inflight, 0),
        "t_retries": np.where(first_kind, 0, inflight),
        "t_commits": in_state(COMMIT),
        "t_dlq": in_state(DLQ),
        "t_discards": in_state(DISCARD),
        "t_replays": (reason == _WHY[READY_REPLAYED]).astype(np.int64),
        "t_commitlog_writes": np.isin(
            reason, [_WHY[READY_PUBLISHED], _WHY[READY_REPLAYED], _WHY[READY_RETRY_DUE]]
        ).astype(np.int64)
        + (end_waiting & end_scheduled)
        + in_state(DLQ)
        + leave_unread
        + (copied & (leave_state == code[WAITING_RETRY])),  # a copy in the schedule topic
        "t_late_send_backs": copied.astype(np.int64),
    }
    step_hashes = _step_hashes(batch, present) if "derived" in want and hashed else None
    links = None
    if "chains" in want:
        steps = _Steps(state_of, present, ms, last_state, last_step, last_ms, t_n, off_step,
                       no_time, end_waiting, copied)  # fmt: skip
        links = _links(batch, steps, horizon, ends)
    for group, rows in _groups(batch):
        if "derived" in want:
            values = {name: int(column[rows].sum()) for name, column in counted.items()}
            if not (rows & delivery_valid).any():
                del values["t_first_deliveries"]  # a sum of nulls: null in Spark
            if step_hashes is None:
                values.update({"derived_rows": 0, "derived_hash_hi": 0, "derived_hash_lo": 0})
            else:
                values.update(digest_sums(step_hashes, "derived", rows))
            yield "derived", group, values
        if "chains" in want:
            yield "chains", group, links(group, rows)


def _step_hashes(batch: Batch, present: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each step's transition hash (:func:`retrysim.checks.rows.step_hash`), where present."""
    n = batch.rows
    delivery_values, delivery_valid = batch.ints("delivery")
    null_int = null("int", n)
    end_waiting = batch.equals("end_state", WAITING_RETRY)[0]
    fields = {
        "ready": ("Ready", batch["ready_ms"], batch["source_topic"], batch["queue_id"],
                  null_int, batch["ready_reason"]),
        "start": ("Inflight", batch["start_ms"], batch["source_topic"], batch["queue_id"],
                  null_int, constant("str", REASON_DELIVERED, n)),
        "end": (batch["end_state"], batch["end_ms"], batch["end_topic"], batch["end_queue_id"],
                batch["delay_level"].where(end_waiting), batch["end_reason"]),
        "leave": _leave_fields(batch),
    }  # fmt: skip
    hashes = []
    for k, step in enumerate(_STEP_NAMES, start=1):
        state, at_ms, topic, queue_id, delay_level, reason = fields[step]
        if isinstance(state, str):
            state = constant("str", {"Ready": READY, "Inflight": INFLIGHT}[state], n)
        seq = number("int", (delivery_values - 1) * SEQ_PER_DELIVERY + k, delivery_valid)
        by_name = {"msg_id": batch["msg_id"], "delivery": batch["delivery"], "seq": seq,
                   "state": state, "at_ms": at_ms, "topic": topic, "queue_id": queue_id,
                   "delay_level": delay_level, "reason": reason}  # fmt: skip
        hashes.append((spark_hash([by_name[name] for name in HASHED], n), present[step]))
    return hashes


def _leave_fields(batch: Batch) -> tuple[Value, ...]:
    """The leave step's transition (transitions.step_columns): the leave after WaitingRetry,
    or a 4.9 client's second send-back."""
    left = pc.is_valid(batch.array("leave_state"))

    def either(name: str, kind: str, leave: pa.Array, copy: pa.Array) -> Value:
        return batch.derive(name, kind, pc.if_else(left, leave, copy))

    late = pa.array([REASON_LATE_SEND_BACK] * batch.rows, pa.string())
    return (
        either("_leave_state", "str", batch.array("leave_state"), batch.array("copy_state")),
        either("_leave_ms", "long", batch.array("settled_ms"), batch.array("copy_ms")),
        either("_leave_topic", "str", batch.array("leave_topic"), batch.array("copy_topic")),
        either("_leave_queue", "int", batch.array("leave_queue_id"), batch.array("copy_queue_id")),
        either(
            "_leave_level",
            "int",
            pa.nulls(batch.rows, pa.int32()),
            batch.array("copy_delay_level").cast(pa.int32()),
        ),
        either("_leave_reason", "str", batch.array("leave_reason"), late),
    )


@dataclass(frozen=True)
class _Steps:
    """An attempt batch's steps as :func:`attempt_passes` reads them, for the chains pass."""

    state_of: dict
    present: dict
    ms: dict
    last_state: np.ndarray
    last_step: np.ndarray
    last_ms: tuple
    t_n: np.ndarray
    off_step: np.ndarray
    no_time: np.ndarray
    end_waiting: np.ndarray
    copied: np.ndarray


def _rows_bad(batch: Batch, steps: _Steps, a: dict, result, result_known) -> np.ndarray:
    """The rows that break a rule alone (:func:`retrysim.checks.rows._local_rules`)."""
    n = batch.rows
    code = _CODE
    state_of, present, ms, t_n = steps.state_of, steps.present, steps.ms, steps.t_n
    last_state, last_step, last_ms = steps.last_state, steps.last_step, steps.last_ms
    off_step, no_time, end_waiting = steps.off_step, steps.no_time, steps.end_waiting
    copied = steps.copied
    # a timed-out delivery out of retries: the DLQ, or a discard without one
    end_dead = present["end"] & np.isin(state_of["end"][0], [code[DLQ], code[DISCARD]])
    legal = (
        (last_step == t_n)
        & (off_step == 0)
        & (~present["leave"] | np.where(copied, end_waiting | end_dead, end_waiting))
        & (state_of["ready"][0] == code[READY])
    )
    expected_n = np.select(
        [result == code[READY], result == code[INFLIGHT],
         np.isin(result, [code[COMMIT], code[WAITING_RETRY]]),
         np.isin(result, [code[DLQ], code[DISCARD]])],
        [1, 2, 3, np.where(end_waiting, 4, 3)], -1,
    )  # fmt: skip
    settled = np.isin(result, [code[COMMIT], code[DLQ], code[DISCARD]])
    end_ms_if_settled = (a["end_ms"][0], a["end_ms"][1] & (result != code[INFLIGHT]))
    mismatch = ~result_known | (
        (t_n != expected_n + copied)
        | _differs(ms["ready"], a["ready_ms"])
        | _differs(ms["start"], a["start_ms"])
        | _differs(ms["end"], end_ms_if_settled)
        | (last_state != result)
        | (settled & _differs(last_ms, a["settled_ms"]))
    )
    path_backwards = (
        (no_time > 0)
        | _before(ms["start"], ms["ready"])
        | _before(ms["end"], ms["start"])
        | _before(ms["leave"], ms["end"])
    )
    attempt_backwards = (
        _before(a["start_ms"], a["ready_ms"])
        | _before(a["end_ms"], a["start_ms"])
        | _before(a["settled_ms"], a["end_ms"])
        | _before(a["next_ready_ms"], a["end_ms"])
    )
    due = a["next_ready_ms"][1]
    unrouted = (
        (batch["next_topic"].valid != due)
        | (batch["next_queue_id"].valid != due)
        | (batch["next_reason"].valid != due)
    )
    rules = {"illegal": ~legal, "off_step": off_step > 0, "path_backwards": path_backwards,
             "mismatch": mismatch, "attempt_backwards": attempt_backwards,
             "unrouted": unrouted}  # fmt: skip
    rows_bad = np.zeros(n, bool)
    for broken in rules.values():
        rows_bad |= broken
    return rows_bad


def _links(batch: Batch, steps: _Steps, horizon: int | None, ends: dict):
    """The chains pass (:func:`retrysim.checks.chain_digests._attempt_links` and the rules an
    attempt row breaks alone, :func:`retrysim.checks.rows._local_rules`): a function of a
    group's rows giving its sums."""
    n = batch.rows
    code = _CODE
    ms, last_state = steps.ms, steps.last_state
    end_waiting, copied = steps.end_waiting, steps.copied
    result, result_known = batch.codes("result_state", code)
    rt, broker_rt = batch.ints("reconsume_times"), batch.ints("broker_reconsume_times")
    end_reason_failed = batch.equals("end_reason", REASON_SEND_BACK_FAILED)[0]
    end_reason_local = batch.codes(
        "end_reason", {REASON_SEND_BACK_FAILED: 1, REASON_SEND_BACK_FALLBACK: 1}
    )[1]
    counted = np.where(end_reason_local, rt[0] + 1, broker_rt[0] + 1)
    counted_valid = np.where(end_reason_local, rt[1], broker_rt[1])
    next_rt = (counted, counted_valid)
    next_broker_rt = (
        np.where(end_reason_failed, broker_rt[0], counted),
        np.where(end_reason_failed, broker_rt[1], counted_valid),
    )
    a = {name: batch.ints(name) for name in ("ready_ms", "start_ms", "end_ms", "next_ready_ms",
                                             "settled_ms", "born_ms")}  # fmt: skip
    due = a["next_ready_ms"][1]
    rows_bad = _rows_bad(batch, steps, a, result, result_known)
    # the links
    reason = batch.codes("ready_reason", _WHY)[0]
    kind = np.select(
        [reason == _WHY[READY_PUBLISHED], np.isin(reason, [_WHY[r] for r in RETRY_REASONS]),
         reason == _WHY[READY_REPLAYED]],
        [LINK_FIRST, LINK_RETRY, LINK_REPLAY], LINK_ODD,
    )  # fmt: skip
    replayed = kind == LINK_REPLAY
    poison = batch["poison_fixed"]
    t_route = spark_hash(
        [batch["source_topic"], batch["queue_id"], batch["ready_reason"], poison], n
    )
    next_route = spark_hash(
        [batch["next_topic"], batch["next_queue_id"], batch["next_reason"], poison], n
    )
    msg_id, delivery = batch["msg_id"], batch["delivery"]
    parent = batch.derive(
        "_parent", "int",
        pc.coalesce(batch.array("parent_delivery"),
                    pc.subtract(batch.array("delivery"), pa.scalar(1, pa.int32()))),
    )  # fmt: skip
    take = _link(
        number("int", kind),
        msg_id,
        parent,
        _reconsume_counts(rt, broker_rt),
        number("long", ms["ready"][0], ms["ready"][1]),
        number("long", np.where(replayed, 0, a["born_ms"][0]), replayed | a["born_ms"][1]),
        number("long", np.where(replayed, 0, t_route.view(np.int64))),
    )
    offers = (
        np.isin(last_state, [code[WAITING_RETRY], code[INFLIGHT]])
        & due
        & (horizon is not None)
        & (a["next_ready_ms"][0] < (horizon if horizon is not None else 0))
    )

    def offered(ready: Value) -> np.ndarray:
        return _link(
            constant("int", LINK_RETRY, n),
            msg_id,
            delivery,
            _reconsume_counts(next_rt, next_broker_rt),
            ready,
            batch["born_ms"],
            number("long", next_route.view(np.int64)),
        )

    offer = offered(batch["next_ready_ms"])
    dead = last_state == code[DLQ]
    dead_link = spark_hash([msg_id, delivery, batch["settled_ms"]], n)
    # a 4.9 client's second copy: a retry of its own, or a dead letter
    copy_code = batch.codes("copy_state", code)[0]
    copy_ready = batch.ints("copy_ready_ms")
    copy_waits = copied & (copy_code == code[WAITING_RETRY])
    copy_offers = (
        copy_waits & copy_ready[1] & (horizon is not None)
        & (copy_ready[0] < (horizon if horizon is not None else 0))
    )  # fmt: skip
    copy_offer = offered(batch["copy_ready_ms"])
    copy_dead = copied & (copy_code == code[DLQ])
    copy_dead_link = spark_hash([msg_id, delivery, batch["copy_ms"]], n)
    still_inflight = result_known & (result == code[INFLIGHT]) & ~due
    until = _coalesce(a["next_ready_ms"], a["settled_ms"])

    def sums(group, rows: np.ndarray) -> dict[str, int]:
        load_end = ends.get(group)
        if load_end is None:
            open_retry = end_waiting & ~until[1]
            copy_open = np.zeros(n, bool)  # Spark: a comparison with a null load end
        else:
            open_retry = end_waiting & (~until[1] | (until[0] >= load_end))
            copy_open = copy_waits & (copy_ready[0] >= load_end)
        found = {}
        found.update(digest_sums([(take, np.ones(n, bool))], "take", rows))
        found.update(digest_sums([(offer, offers), (copy_offer, copy_offers)], "offer", rows))
        found.update(digest_sums([(dead_link, dead), (copy_dead_link, copy_dead)], "dlq", rows))
        found.update({
            "replayed_takes": _count(replayed, rows),
            "last_commit": _count(last_state == code[COMMIT], rows),
            "last_dlq": _count(dead, rows) + _count(copy_dead, rows),
            "last_discard": _count(last_state == code[DISCARD], rows)
            + _count(copied & (copy_code == code[DISCARD]), rows),
            "end_inflight": _count(still_inflight, rows),
            "end_ready_backlog": _count(result_known & (result == code[READY]), rows),
            "end_waiting_retry": _count(open_retry, rows) + _count(copy_open, rows),
            "rows_bad": _count(rows_bad, rows),
        })  # fmt: skip
        return found

    return sums


# --------------------------------------------------------------------------- other tables


def transition_pass(batch: Batch) -> Iterator[tuple[str, object, dict]]:
    hashes = spark_hash([batch[name] for name in HASHED], batch.rows)
    everywhere = np.ones(batch.rows, bool)
    for group, rows in _groups(batch):
        yield "transitions", group, digest_sums([(hashes, everywhere)], "t", rows)


def message_pass(batch: Batch, horizon: int | None) -> Iterator[tuple[str, object, dict]]:
    n = batch.rows
    born = batch["born_ms"]
    route = spark_hash(
        [batch["topic"], batch["queue_id"], constant("str", READY_PUBLISHED, n),
         constant("int", 0, n)], n,
    )  # fmt: skip
    route_value = number("long", route.view(np.int64))
    first = _link(constant("int", LINK_FIRST, n), batch["msg_id"], constant("int", 0, n),
                  constant("long", 0, n), born, born, route_value)  # fmt: skip
    born_values, born_valid = batch.ints("born_ms")
    before_horizon = born_valid & (horizon is not None) & (born_values < (horizon or 0))
    ids = spark_hash([batch["msg_id"]], n, null_mask=False)
    msg_values, msg_valid = batch.ints("msg_id")
    size_values, size_valid = batch.ints("size_bytes")
    everywhere = np.ones(n, bool)
    for group, rows in _groups(batch):
        values = {**digest_sums([(first, before_horizon)], "first", rows),
                  **digest_sums([(ids, everywhere)], "ids", rows),
                  "message_rows": int(rows.sum())}  # fmt: skip
        _put(values, "min_msg_id", msg_values, msg_valid, rows, np.min)
        _put(values, "max_msg_id", msg_values, msg_valid, rows, np.max)
        _put(values, "size_bytes", size_values, size_valid, rows, np.max)
        yield "messages", group, values


def dead_letter_pass(batch: Batch) -> Iterator[tuple[str, object, dict]]:
    n = batch.rows
    deliveries_values, deliveries_valid = batch.ints("deliveries")
    dead = spark_hash([batch["msg_id"], batch["deliveries"], batch["dlq_at_ms"]], n)
    replayed = batch["replayed_at_ms"].valid
    zero = constant("long", 0, n)
    replay = _link(constant("int", LINK_REPLAY, n), batch["msg_id"],
                   number("int", deliveries_values, deliveries_valid), zero,
                   batch["replayed_at_ms"], zero, zero)  # fmt: skip
    late = _before(batch.ints("replayed_at_ms"), batch.ints("dlq_at_ms"))
    everywhere = np.ones(n, bool)
    for group, rows in _groups(batch):
        expected = None if group is None else limits.DLQ_TOPIC_PREFIX + group
        if expected is None:
            wrong_topic = batch["dlq_topic"].valid
        else:
            same, valid = batch.equals("dlq_topic", expected)
            wrong_topic = ~(valid & same)
        yield (
            "dead",
            group,
            {
                **digest_sums([(dead, everywhere)], "dead", rows),
                **digest_sums([(replay, replayed)], "replay", rows),
                "dead_bad": _count(wrong_topic | late, rows),
                "dead_letter_rows": int(rows.sum()),
                "dead_letters_replayed": _count(replayed, rows),
            },
        )


def load_pass(table: pa.Table, kinds: dict[str, str]) -> Iterator[tuple[str, object, dict]]:
    """:func:`retrysim.checks.counts.load_counts` over a whole load table."""
    batch = Batch(table, kinds)
    start, start_valid = batch.ints("bucket_start_ms")
    width, width_valid = batch.ints("bucket_ms")
    for group, rows in _groups(batch):
        values: dict = {"load_rows": int(rows.sum())}
        starts = start[rows & start_valid]
        widths = width[rows & width_valid]
        values["load_buckets"] = int(np.unique(starts).size)
        if starts.size:
            values["load_first_ms"] = int(starts.min())
        if widths.size:
            values["bucket_ms_min"], values["bucket_ms"] = int(widths.min()), int(widths.max())
        if starts.size and widths.size:
            values["load_end_ms"] = int(starts.max()) + int(widths.max())
        for name in counts.LOAD_SUMS:
            _put(values, f"load_{name}", *batch.ints(name), rows, np.sum)
        last = np.flatnonzero(rows & start_valid)
        last = last[start[last] == starts.max()] if starts.size else last[:0]
        for gauge in counts.GAUGES:
            got, valid = batch.ints(gauge)
            if last.size and valid[last[0]]:
                values[f"load_end_{gauge}"] = int(got[last[0]])
            peak, peak_valid = batch.ints(f"{gauge}_max")
            _put(values, f"load_peak_{gauge}", peak, peak_valid, rows, np.max)
            values[f"load_under_{gauge}"] = _count(peak_valid & valid & (peak < got), rows)
        _put(values, "load_busy_thread_ms", *batch.doubles("busy_thread_ms"), rows, np.sum, float)
        yield "load", group, values


def instance_pass(table: pa.Table, kinds: dict[str, str]) -> Iterator[tuple[str, object, dict]]:
    batch = Batch(table, kinds)
    for group, rows in _groups(batch):
        values: dict = {"instance_rows": int(rows.sum())}
        _put(values, "instance_deliveries", *batch.ints("deliveries"), rows, np.sum)
        busy = batch.doubles("busy_thread_ms")
        _put(values, "instance_busy_thread_ms", *busy, rows, np.sum, float)
        yield "instances", group, values


def summary_pass(table: pa.Table, kinds: dict[str, str]) -> Iterator[tuple[str, object, dict]]:
    batch = Batch(table, kinds)
    for group, rows in _groups(batch):
        values: dict = {"summary_rows": int(rows.sum())}
        for name in counts.SUMMARY_COLUMNS:
            double = kinds[name] == "double"
            got = batch.doubles(name) if double else batch.ints(name)
            _put(values, f"s_{name}", *got, rows, np.max, float if double else int)
        yield "summary", group, values


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Task:
    """One task's share of run ``run``: the ``passes`` over a file's ``row_groups`` (about
    ``rows`` rows), over a whole small table (``path`` its folder, no row groups), or over
    a lean run's messages ``ids`` (group, first id, end), made again (``path`` GENERATED).
    A whole table is one task a run: its aggregates (firsts, lasts, distinct counts) are
    not sums across tasks."""

    run: str
    table: str
    path: str
    passes: tuple[str, ...]
    row_groups: tuple[int, ...] | None = None
    rows: int = 0
    ids: tuple[str, int, int] | None = None  # generated messages: group, first id, end


@dataclass(frozen=True)
class Context:
    """What every task needs besides its files: per run, its horizon, its groups' load ends,
    whether the attempts' transitions are hashed, and its stored scenario (``configs``, for
    the messages a lean run makes again)."""

    horizons: dict[str, int | None]
    ends: dict[str, dict[object, int]]
    hashed: dict[str, bool]
    configs: dict[str, str | None]


def run_task(task: Task, context: Context) -> Iterator[tuple[str, str, object, dict]]:
    """The rows of one task: (pass, run, group, aggregates)."""
    kinds = _kinds(data_schema(SCHEMAS[task.table]))
    if task.table == "attempts":  # the columns the passes read, no more
        kinds = {name: kinds[name] for name in ATTEMPT_COLUMNS}
    horizon = context.horizons.get(task.run)
    if task.table in _WHOLE_TABLES:
        table = _read_folder(task.path, kinds)
        whole = {"load": load_pass, "instance_load": instance_pass, "summary": summary_pass}
        if task.table == "runs":
            yield from ((p, task.run, None, v) for p, v in runs_pass(table))
            return
        for name, group, values in whole[task.table](table, kinds):
            yield name, task.run, group, values
        return
    if task.ids is not None:
        batches = [_generated_messages(context.configs[task.run], *task.ids)]
    else:
        batches = _batches(task.path, task.row_groups, kinds)
    for record_batch in batches:
        batch = Batch(record_batch, kinds)
        if task.table == "attempts":
            ends = context.ends.get(task.run, {})
            hashed = context.hashed.get(task.run, True)
            found = attempt_passes(batch, horizon, ends, hashed, set(task.passes))
        elif task.table == "transitions":
            found = transition_pass(batch)
        elif task.table == "messages":
            found = message_pass(batch, horizon)
        else:
            found = dead_letter_pass(batch)
        for name, group, values in found:
            yield name, task.run, group, values


@lru_cache(maxsize=4)
def _scenario(config: str) -> Scenario:
    return scenario_from_json(config)


def _generated_messages(config: str, group: str, low: int, high: int) -> pa.Table:
    """A lean run's messages ``low`` to ``high`` of ``group``, made again from the run's
    scenario by :func:`retrysim.model.workload.messages_np`, which tests hold bit for bit to
    the Spark derivation readers see (:func:`retrysim.model.workload.messages_df`)."""
    scenario = _scenario(config)
    found = next(g for g in scenario.groups if g.name == group)
    ids, queue_ids, born = messages_np(found.workload, group, scenario.seed,
                                       msg_ids=np.arange(low, high, dtype=np.int64))  # fmt: skip
    rows = high - low
    return pa.table({
        "group": pa.repeat(group, rows),
        "topic": pa.repeat(found.source_topic, rows),
        "msg_id": pa.array(ids, pa.int64()),
        "queue_id": pa.array(queue_ids, pa.int32()),
        "born_ms": pa.array(born, pa.int64()),
        "size_bytes": pa.repeat(pa.scalar(found.workload.size_bytes, pa.int32()), rows),
    })  # fmt: skip


def runs_pass(table: pa.Table) -> Iterator[tuple[str, dict]]:
    """:func:`retrysim.checks.counts.runs_counts` of one run's runs table (no row: none)."""
    if not table.num_rows:
        return
    status = table.column("status").to_pylist() if "status" in table.column_names else []
    yield "runs", {"rows": table.num_rows,
                   "complete": sum(1 for s in status if s == STATUS_COMPLETE)}  # fmt: skip


def _parquet_files(folder: str) -> list[str]:
    """The data files Spark reads in ``folder`` (it skips names starting with ``_`` or ``.``)."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        found += [os.path.join(root, name) for name in sorted(names)
                  if not name.startswith(("_", ".")) and not name.endswith(".crc")]  # fmt: skip
    return found


def _read_folder(folder: str, kinds: dict[str, str]) -> pa.Table:
    tables = [pq.read_table(path, columns=_present(path, kinds)) for path in _parquet_files(folder)]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pa.table({"group": pa.array([], pa.string())})
    return pa.concat_tables(tables, promote_options="permissive")


def _present(path: str, kinds: dict[str, str]) -> list[str]:
    names = pq.read_schema(path).names
    return [name for name in kinds if name in names]


def _batches(path: str, row_groups: tuple[int, ...], kinds: dict[str, str]) -> Iterable:
    reader = pq.ParquetFile(path)
    columns = [name for name in kinds if name in reader.schema_arrow.names]
    return reader.iter_batches(batch_size=BATCH_ROWS, row_groups=list(row_groups),
                               columns=columns)  # fmt: skip


# --------------------------------------------------------------------------- the stage

_WHOLE_TABLES = ("load", "instance_load", "summary", "runs")
_SPLIT_ROWS = 1 << 20  # rows of a task over a big file: its row groups up to about this many


def _shares(tasks: list[Task], cores: int) -> list[list[Task]]:
    """``tasks`` (biggest first) dealt to ``cores`` Spark tasks, each to the least loaded: a
    Spark task takes far longer to start running Python than a file's share of rows takes
    to compute, so the stage has no more tasks than cores."""
    shares: list[list[Task]] = [[] for _ in range(max(cores, 1))]
    load = [0] * len(shares)
    for task in tasks:
        least = load.index(min(load))
        shares[least].append(task)
        load[least] += task.rows + 1
    return [share for share in shares if share]


def plan_tasks(
    files: dict[str, dict[str, str]], passes: set[str], configs: dict[str, str | None]
) -> list[Task]:
    """The shares of the stage: ``files`` run -> table -> staged folder; ``passes``: the
    passes to compute; ``configs``: each run's stored scenario. Big files are split by row
    groups, biggest first."""
    by_table: dict[str, list[str]] = defaultdict(list)
    for name in passes:
        by_table[PASS_TABLES[name]].append(name)
    tasks: list[tuple[int, Task]] = []
    for run, tables in sorted(files.items()):
        for table, wanted in sorted(by_table.items()):
            if table not in tables:
                continue
            if table in _WHOLE_TABLES:
                tasks.append((0, Task(run, table, tables[table], tuple(sorted(wanted)))))
                continue
            if tables[table] == GENERATED:
                tasks += [(task.rows, task) for task in _generated_tasks(run, configs[run])]
                continue
            for path in _parquet_files(tables[table]):
                meta = pq.ParquetFile(path).metadata
                share: list[int] = []
                rows = 0
                for index in range(meta.num_row_groups):
                    share.append(index)
                    rows += meta.row_group(index).num_rows
                    if rows >= _SPLIT_ROWS:
                        tasks.append((rows, Task(run, table, path, tuple(sorted(wanted)),
                                                 tuple(share), rows)))  # fmt: skip
                        share, rows = [], 0
                if share:
                    tasks.append((rows, Task(run, table, path, tuple(sorted(wanted)),
                                             tuple(share), rows)))  # fmt: skip
    return [task for _, task in sorted(tasks, key=lambda item: -item[0])]


def _generated_tasks(run: str, config: str | None) -> list[Task]:
    """A lean run's messages, made again in the tasks: each group's ids in shares."""
    tasks = []
    for group in _scenario(config).groups if config else ():
        count = group.workload.messages
        for low in range(0, count, _SPLIT_ROWS):
            high = min(low + _SPLIT_ROWS, count)
            tasks.append(Task(run, "messages", GENERATED, ("messages",), rows=high - low,
                              ids=(group.name, low, high)))  # fmt: skip
    return tasks


def run_configs(files: dict[str, dict[str, str]]) -> dict[str, list[str | None]]:
    """Each run's scenario as its runs rows store it (``config_json``), read on the driver."""
    return {
        run: _read_folder(tables["runs"], {"config_json": "str"}).to_pydict().get("config_json", [])
        if "runs" in tables
        else []
        for run, tables in files.items()
    }


def context_of(files: dict[str, dict[str, str]], hashed: dict[str, bool]) -> Context:
    """Each run's horizon (from its runs row's scenario) and its groups' load ends, read on
    the driver from the two small tables."""
    configs = {run: found[-1] if found else None for run, found in run_configs(files).items()}
    horizons = {run: _horizon(config) for run, config in configs.items()}
    ends: dict[str, dict[object, int]] = {}
    for run, tables in files.items():
        if "load" in tables:
            load = _read_folder(tables["load"], _LOAD_KINDS)
            ends[run] = {
                group: values["load_end_ms"]
                for _, group, values in load_pass(load, _LOAD_KINDS)
                if "load_end_ms" in values and group is not None  # a join on null: no match
            }
    return Context(horizons, ends, hashed, configs)


_LOAD_KINDS = {"group": "str", "bucket_start_ms": "long", "bucket_ms": "long",
               **{name: "long" for name in (*counts.LOAD_SUMS, *counts.GAUGES,
                                            *[f"{g}_max" for g in counts.GAUGES])},
               "busy_thread_ms": "double"}  # fmt: skip


def _horizon(config: str | None) -> int | None:
    """``get_json_object(config_json, '$.horizon').cast('long')``."""
    try:
        value = json.loads(config)["horizon"]
        return int(value) if isinstance(value, int | float | str) else None
    except (TypeError, ValueError, KeyError):
        return None


_COUNTED = "pass string, run string, group string, values string"


def file_counts(
    spark, files: dict[str, dict[str, str]], passes: set[str], hashed: dict[str, bool]
) -> list[tuple[str, str, object, dict]]:
    """The ``passes`` over the staged ``files`` (run -> table -> folder) as one Spark stage:
    rows (pass, run, group, aggregates), one per pass, run and group."""
    context = context_of(files, hashed)
    tasks = plan_tasks(files, passes, context.configs)
    if not tasks:
        return []

    shares = _shares(tasks, min(len(tasks), spark.sparkContext.defaultParallelism))

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sums: dict[tuple[str, str], Sums] = defaultdict(Sums)
        for batch in batches:
            for index in batch.column("id").to_pylist():
                for task in shares[index]:
                    for name, run_id, group, values in run_task(task, context):
                        sums[name, run_id].add(group, values)
        found = [(name, run_id, group, json.dumps(values))
                 for (name, run_id), by_group in sums.items()
                 for group, values in by_group.groups.items()]  # fmt: skip
        yield pa.RecordBatch.from_arrays(
            [pa.array(column, pa.string()) for column in zip(*found, strict=True)]
            if found
            else [pa.array([], pa.string())] * 4,
            names=["pass", "run", "group", "values"],
        )

    # A SQL stage, not an RDD one: its tasks reuse the Python workers the event-by-event
    # stage warmed (Spark keeps the two kinds apart; a new RDD worker would import numpy,
    # pyarrow and numba again).
    stage = spark.range(0, len(shares), numPartitions=len(shares)).mapInArrow(run, _COUNTED)
    spark.sparkContext.setJobDescription("validating: the staged files' digests and counts")
    try:
        with python_tasks(spark):
            rows = stage.collect()
        collected = [
            (row["pass"], row["run"], row["group"], json.loads(row["values"])) for row in rows
        ]
    finally:
        spark.sparkContext.setJobDescription(None)
    merged: dict[tuple[str, str], Sums] = defaultdict(Sums)
    for name, run_id, group, values in collected:
        merged[name, run_id].add(group, values)
    return [
        (name, run_id, group, values)
        for (name, run_id), found in merged.items()
        for group, values in found.groups.items()
    ]
