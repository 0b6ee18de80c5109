"""One key through the compiled event loop (:func:`simulate_compiled`): its messages in
publish order and the retries it imports as the loop's slots in; its rows out of the loop's
buffer as the chunks and record batches the Spark stage takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from retrysim.engine.event_lanes import _run_lanes
from retrysim.engine.event_loop import ELSEWHERE, EXPORTED, MEMBER, _run
from retrysim.engine.event_rules import (
    _FIXED_ROW,
    _OUT,
    _STRING_COLUMNS,
    _WIDTH,
    D_REPLAY_RATE,
    K_REPLAY_AT,
    K_REPLAY_FIXED,
    K_REPLAY_QUEUES,
    NULL,
    S_BROKER_RT,
    S_DELIVERY,
    S_ELIGIBLE,
    S_FIELDS,
    S_FIXED,
    S_INDEX,
    S_MSG_ID,
    S_PARENT,
    S_QUEUE,
    S_READY,
    S_REASON,
    S_RT,
    S_TOPIC,
    S_WITHDRAWN,
    _doubles,
    _scalars,
    _table,
    key_names,
    key_prefixes,
)
from retrysim.model import behavior as listener
from retrysim.model.behavior import ListenerModel
from retrysim.model.policy import Policy, policy_for
from retrysim.numba_cache import cache_by_source
from retrysim.scenario.loading import load_scenario
from retrysim.tables.schemas import STAGE_ARROW

cache_by_source(__name__, __loader__, __file__)  # before the first @njit(cache=True)


@njit(cache=True)
def _typed_columns(out, rows, positions, values, bitmaps, nulls):
    """Columns ``positions`` of ``out``'s first ``rows`` into ``values`` (their Arrow width)
    and ``bitmaps`` (Arrow's validity bits, zeroed before), their null counts into
    ``nulls``: one pass where a copy, a mask and a cast took three."""
    for c in range(len(positions)):
        row = out[positions[c]]
        count = 0
        for i in range(rows):
            value = row[i]
            if value == NULL:
                values[c, i] = 0
                count += 1
            else:
                values[c, i] = value
                bitmaps[c, i >> 3] |= np.uint8(1 << (i & 7))
        nulls[c] = count


# The output columns by the width of their Arrow arrays: the longs, and the ints with the
# strings' codes (the indices their strings are taken by).
_LONGS = np.array([i for i, n in enumerate(_OUT) if STAGE_ARROW.field(n).type == pa.int64()])
_NARROW = np.array([i for i in range(_WIDTH) if i not in set(_LONGS.tolist())])
assert all(STAGE_ARROW.field(_OUT[i]).type in (pa.int32(), pa.string()) for i in _NARROW), (
    "a staged column of another width"
)
_POSITION = {name: position for position, name in enumerate(_OUT)}


def _batch(out: np.ndarray, rows: int, group: str, names: pa.Array) -> pa.RecordBatch:
    """A chunk of rows as a record batch in STAGE_ARROW's shape: the string columns taken
    from ``names`` by code in Arrow (no Python string objects), NULL to missing."""
    columns: list[pa.Array | None] = [None] * _WIDTH
    for positions, dtype in ((_LONGS, np.int64), (_NARROW, np.int32)):
        kind = pa.from_numpy_dtype(dtype)
        values = np.empty((len(positions), rows), dtype)
        bitmaps = np.zeros((len(positions), (rows + 7) // 8), np.uint8)
        nulls = np.empty(len(positions), np.int64)
        _typed_columns(out, rows, positions, values, bitmaps, nulls)
        for c, position in enumerate(positions.tolist()):
            null_count = int(nulls[c])
            array = pa.Array.from_buffers(
                kind,
                rows,
                [pa.py_buffer(bitmaps[c]) if null_count else None, pa.py_buffer(values[c])],
                null_count=null_count,
            )
            name = _OUT[position]
            columns[position] = pc.take(names, array) if name in _STRING_COLUMNS else array
    group_column = pc.take(pa.array([group]), pa.array(np.zeros(rows, np.int32)))
    poison_fixed = pa.array(out[_FIXED_ROW, :rows] != 0)
    return pa.RecordBatch.from_arrays([group_column, *columns, poison_fixed], schema=STAGE_ARROW)


class Chunk:
    """A chunk of the loop's rows before it becomes a record batch: the
    :class:`~retrysim.tables.key_counts.Columns` the sums read, answered from the loop's
    own longs and string codes (not every column of every batch converted), and the record
    batch, made only for the rows a task writes.
    Valid until the loop goes on (it reuses its buffer): the loop then empties it."""

    def __init__(self, out: np.ndarray, rows: int, group: str, names: pa.Array, codes: dict):
        self.out, self.rows, self.group, self.names, self.codes = out, rows, group, names, codes

    @property
    def num_rows(self) -> int:
        return self.rows

    def longs(self, name: str) -> np.ndarray:
        return self.out[_POSITION[name], : self.rows]

    def isin(self, name: str, *values: str) -> np.ndarray:
        codes = self.longs(name)
        found = np.isin(codes, [c for value in values for c in self.codes.get(value, ())])
        return np.where(codes == NULL, np.int8(-1), found.astype(np.int8))

    def index_in(self, name: str, values: tuple[str, ...]) -> np.ndarray:
        codes = self.longs(name)
        table = np.full(len(self.names), -2, np.int64)  # -2: none of them
        for position, value in enumerate(values):
            table[list(self.codes.get(value, ()))] = position
        index = np.where(codes == NULL, -1, table[np.where(codes == NULL, 0, codes)])
        if (index == -2).any():
            raise ValueError(f"a {name} outside {values}")
        return index

    def arrow(self) -> pa.RecordBatch:
        return _batch(self.out, self.rows, self.group, self.names)


def simulate_compiled(
    spec, msg_ids, queue_ids, born, heartbeat=None, unit=None, imports=None, chunks=False,
    publish=True,
) -> Iterator[pa.RecordBatch] | Iterator[Chunk]:  # fmt: skip
    """The rows :func:`~retrysim.engine.event_stage.simulate_key` gives, from the compiled
    loop (``spec`` is a :class:`~retrysim.engine.event_stage.KeySpec` it covers), as the
    record batches the Spark stage hands on. With ``unit`` (the instances it runs, the
    instances it sends retries to), those of one unit of the group (docs/model.md §5,
    "Units"), fed the retries ``imports`` (a frame of the deliveries other units' rows
    lead to, as :func:`retrysim.engine.rounds.next_frontier` gives them). Without
    ``publish``, the messages are not published: the loop starts from ``imports`` alone (a
    round run's frontier, whose ``poison_fixed`` column, where there is one, says which
    messages a replay fixed). With ``chunks``, :class:`Chunk` s instead of record
    batches."""
    policy, behavior = spec.policy, spec.behavior
    order = _publish_order(born, msg_ids)
    msg_ids, queue_ids, born = msg_ids[order], queue_ids[order], born[order]
    count = int(np.searchsorted(born, spec.horizon_ms)) if publish else 0
    model = ListenerModel(behavior)
    d, windows = _doubles(model)
    prefixes = key_prefixes(spec.seed, spec.group)
    poisoned = listener.poisoned(spec.seed, spec.group, msg_ids, behavior.poison_fraction)
    topology = policy.topology
    names = pa.array(key_names(policy), type=pa.string())
    k = _scalars(policy, behavior, spec.horizon_ms)
    replay = policy.replay
    if replay is not None and replay.at < spec.horizon_ms and count:
        k[K_REPLAY_AT], k[K_REPLAY_FIXED] = replay.at, replay.poison_fixed
        k[K_REPLAY_QUEUES] = spec.queues
        d[D_REPLAY_RATE] = replay.rate
    member = np.full(topology.instances, MEMBER, np.int64)
    own = count
    if unit is not None:
        runs, exported = unit
        member[:] = ELSEWHERE
        member[list(exported)] = EXPORTED
        member[list(runs)] = MEMBER
        first = np.array([topology.instance(policy.topic, q, 0, 1) for q in range(topology.queues)])
        own = int(np.isin(first[queue_ids[:count]], runs).sum())
    rules = (
        k, d, windows, prefixes, _table(policy.intervals_ms), _table(policy.levels),
        _table(policy.resend_levels), _table(policy.resend_intervals_ms), msg_ids, queue_ids,
        born, poisoned, count,
    )  # fmt: skip
    if policy.batch_size > 1 or policy.blocking:
        if unit is not None or imports is not None:
            raise ValueError(f"group {spec.group}: batches and ordered queues run whole")
        loop = _run_lanes(*rules, policy.batch_size, policy.blocking)
    else:
        loop = _run(*rules, member, _import_slots(policy, imports, msg_ids, names))
    codes: dict[str, list[int]] = {}
    for code, name in enumerate(names.to_pylist()):
        codes.setdefault(name, []).append(code)
    for out, rows, now, deliveries, first in loop:
        if heartbeat is not None:
            heartbeat.beat(int(now), int(deliveries), int(first), own)
        if rows and chunks:
            chunk = Chunk(out, rows, spec.group, names, codes)
            yield chunk
            chunk.out = None  # the loop reuses the buffer
        elif rows:
            yield _batch(out, rows, spec.group, names)
    if heartbeat is not None:
        heartbeat.beat(spec.horizon_ms, int(deliveries), own, own, done=True)


def _publish_order(born: np.ndarray, msg_ids: np.ndarray) -> np.ndarray:
    """The messages' positions in (born_ms, msg_id) order. Where the ids ascend already (as
    messages_np makes them), a sort of each born time with its position packed into the
    low bits, more than twice as fast as a lexsort at 30M messages."""
    count = len(born)
    index_bits = max(1, (count - 1).bit_length())
    ascending = count < 2 or bool((np.diff(msg_ids) > 0).all())
    if (
        not ascending
        or not count
        or born.min() < 0
        or int(born.max()).bit_length() + index_bits > 63
    ):
        return np.lexsort((msg_ids, born))
    packed = np.sort((born << index_bits) | np.arange(count, dtype=np.int64))
    return packed & ((1 << index_bits) - 1)


def _import_slots(policy: Policy, imports, msg_ids: np.ndarray, names: pa.Array) -> np.ndarray:
    """The retries ``imports`` (a frame of :data:`retrysim.engine.event_key.IMPORTED`) as
    the loop's slots: the
    strings as their codes (a name that is two topics takes the first code, as the loop
    does), each message by its position in ``msg_ids``."""
    slots = np.empty((S_FIELDS, 0 if imports is None else len(imports)), np.int64)
    if not slots.shape[1]:
        return slots
    code = {name: c for c, name in reversed(list(enumerate(names.to_pylist())))}
    by_id = np.argsort(msg_ids, kind="stable")
    wanted = imports["msg_id"].to_numpy(np.int64)
    slots[S_INDEX] = by_id[np.searchsorted(msg_ids, wanted, sorter=by_id)]
    slots[S_MSG_ID] = wanted
    for field, column in ((S_DELIVERY, "delivery"), (S_RT, "reconsume_times"),
                          (S_BROKER_RT, "broker_reconsume_times"), (S_QUEUE, "queue_id"),
                          (S_READY, "ready_ms")):  # fmt: skip
        slots[field] = imports[column].to_numpy(np.int64)
    slots[S_TOPIC] = imports["source_topic"].map(code).to_numpy(np.int64)
    slots[S_REASON] = imports["ready_reason"].map(code).to_numpy(np.int64)
    slots[S_ELIGIBLE] = policy.eligible_ms(slots[S_READY])  # NumPy arrays take it as it is
    fixed = imports.get("poison_fixed", None)
    slots[S_FIXED] = 0 if fixed is None else fixed.to_numpy(bool)
    slots[S_WITHDRAWN] = 0
    slots[S_PARENT] = slots[S_DELIVERY] - 1  # units run no message sent back twice
    return slots


def warm_up() -> None:
    """Compile both loops (or load them from numba's cache on disk) on two messages of the
    embedded default scenario's first unordered group, one message per consume request and
    in batches: setup runs it once, so that no Spark task pays the compilation."""
    scenario = load_scenario()
    delay_table = scenario.broker.message_delay_level
    group = next(g for g in scenario.groups if not policy_for(g, delay_table).blocking)
    policy = policy_for(group, delay_table)
    ids = np.arange(2, dtype=np.int64)
    for batch_size in (1, 2):
        spec = SimpleNamespace(
            group=group.name, policy=dataclasses.replace(policy, batch_size=batch_size),
            behavior=group.behavior, seed=scenario.seed, horizon_ms=scenario.horizon,
        )  # fmt: skip
        for _ in simulate_compiled(spec, ids, ids, ids):
            pass
