"""The sequential engine: an exact event-by-event simulation, one Spark task per key.

Ordered queues (head-of-line blocking), a consumer pool that fills up (time in Ready emerges
from load) and batches cannot be computed a round at a time: whether a delivery starts
depends on other messages. docs/model.md §5 is simulated with a heap of events per key (one
ordered queue when the pool can never be full, else a whole group): the task makes the
key's messages and takes them in publish order, hashed draws come in NumPy blocks, rows
leave in chunks. Keys run as tasks of one ``mapInArrow`` stage; unordered keys run compiled
(:mod:`retrysim.engine.compiled`), and a whole group's rows are summed up for staging as
they leave (:mod:`retrysim.tables.key_peaks`).
"""

from __future__ import annotations

import gc
import heapq
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.accumulators import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from retrysim.model.behavior import CONSUME_SUCCESS, RECONSUME_LATER, DrawCache, ListenerModel
from retrysim.model.policy import Policy, Step, next_reconsume_times
from retrysim.model.states import (
    DLQ,
    INFLIGHT,
    READY,
    READY_PUBLISHED,
    READY_REPLAYED,
    REASON_BEYOND_ACK,
    WAITING_RETRY,
)
from retrysim.model.topology import Units
from retrysim.model.workload import messages_np
from retrysim.scenario import limits
from retrysim.scenario.spec import Behavior, Workload
from retrysim.session import python_tasks
from retrysim.tables.commitlog_writes import pops_of
from retrysim.tables.group_sums import COUNTS, PEAK_HALVES, RATES, SHARES
from retrysim.tables.key_counts import Columns
from retrysim.tables.key_peaks import GroupSummer
from retrysim.tables.schemas import SCHEMAS, STAGE, STAGE_ARROW, data_schema
from retrysim.tables.schemas import write_rows as write_small_rows
from retrysim.tables.task_tables import TaskTableWriter, messages_of, parquet_writer

if TYPE_CHECKING:  # a worker of the compiled loop never loads pandas (a slow import)
    import pandas as pd

OUTPUT_CHUNK_ROWS = 100_000
_FREE, _ELIGIBLE, _REPLAY = 0, 1, 2  # event phases within one millisecond (model §5)
# A _FREE event's payload: the id of a released lane (>= 0), or a thread of instance i (-1 - i).
_COLUMNS = STAGE.fieldNames()
_NO_STEP = (None,) * 11
# how often a key's task tells the driver how far it got (the driver's watcher reads every 6 s)
HEARTBEAT_S = 2.0
_CLOCK_EVERY = 4096  # loop turns between looks at the clock


class Heartbeat:
    """A key's progress for the driver (:func:`read_heartbeats`): simulated time reached,
    deliveries so far, and how many of its messages had their first delivery (most of the
    work: retries are fewer and sparser), rewritten as a small JSON file every
    :data:`HEARTBEAT_S` seconds in a folder the driver reads (the run's staging folder, which
    executors write anyway). Where an executor cannot write there, the heartbeat goes quiet;
    the simulation is unaffected."""

    def __init__(self, folder: str | None, key: int, horizon_ms: int) -> None:
        self.path = None if folder is None else os.path.join(folder, f"{key}.json")
        self.horizon_ms = horizon_ms
        self.last = -HEARTBEAT_S  # the first beat is written at once: the driver's first
        # progress line comes one watch after the loop starts, not HEARTBEAT_S later

    def beat(
        self, sim_ms: int, deliveries: int, first: int, messages: int, done: bool = False
    ) -> None:
        if self.path is None or (not done and time.monotonic() - self.last < HEARTBEAT_S):
            return
        self.last = time.monotonic()
        beat = {"sim_ms": self.horizon_ms if done else sim_ms, "horizon_ms": self.horizon_ms,
                "deliveries": deliveries, "first": messages if done else first,
                "messages": messages}  # fmt: skip
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(f"{self.path}.tmp", "w") as out:
                json.dump(beat, out)
            os.replace(f"{self.path}.tmp", self.path)
        except OSError:
            self.path = None


def read_heartbeats(folder: str) -> list[dict]:
    """The latest heartbeat of every key that has sent one."""
    beats = []
    try:
        names = [name for name in os.listdir(folder) if name.endswith(".json")]
    except OSError:
        return beats
    for name in names:
        try:
            with open(os.path.join(folder, name)) as beat:
                beats.append(json.load(beat))
        except (OSError, ValueError):
            continue  # being replaced just now: the next look sees it
    return beats


# Which of the runs simulated together a row of the round engine belongs to (KeySpec.run):
# a column of its frontiers and attempts, and a folder of its batch's round files (_run=k)
RUN = "_run"


@dataclass(frozen=True)
class KeySpec:
    """What a task needs to simulate one group: its rules, behavior, seed and horizon."""

    group: str
    topic: str
    policy: Policy
    behavior: Behavior
    seed: int
    horizon_ms: int
    queues: int
    workload: Workload  # its messages, made in the task (retrysim.model.workload.messages_np)
    # for summing up a whole group's rows in its task (retrysim.tables.key_peaks)
    load_bucket_ms: int
    shared: bool  # more than one instance can get its work: instance_load needs its own sums
    run: int = 0  # which of the runs simulated together in one stage it belongs to

    @property
    def key(self) -> tuple[int, str]:
        """The group within its run: what the stage's choices (per lane, in units) name."""
        return self.run, self.group


class _Delivery:
    """A delivery that is Ready: waiting for its eligible time, a lane or a thread."""

    __slots__ = (
        "broker_rt",
        "delivery",
        "eligible_ms",
        "index",
        "queue_id",
        "ready_ms",
        "reason",
        "rt",
        "topic",
    )

    def __init__(self, index, delivery, rt, broker_rt, topic, queue_id, ready_ms, reason,
                 eligible_ms):  # fmt: skip
        self.index, self.delivery, self.rt, self.broker_rt = index, delivery, rt, broker_rt
        self.topic, self.queue_id = topic, queue_id
        self.ready_ms, self.reason, self.eligible_ms = ready_ms, reason, eligible_ms


class _Simulation:
    """One key's event loop (docs/model.md §5-§8). Messages are addressed by their position
    in publish order, ``(born_ms, msg_id)``."""

    def __init__(self, spec: KeySpec, msg_ids: np.ndarray, queue_ids: np.ndarray, born,
                 publish: bool = True, heartbeat: Heartbeat | None = None):  # fmt: skip
        order = np.lexsort((msg_ids, born))
        self.msg_ids, self.queue_ids, self.born = msg_ids[order], queue_ids[order], born[order]
        # messages published in time (none when continuing a frontier of retries)
        self.count = int(np.searchsorted(self.born, spec.horizon_ms)) if publish else 0
        self.spec, self.policy, self.horizon = spec, spec.policy, spec.horizon_ms
        self.model = ListenerModel(spec.behavior)
        self.draws = DrawCache(spec.seed, spec.group, self.msg_ids, spec.behavior.poison_fraction)
        self.topology = topology = self.policy.topology
        # free threads per instance (None: unlimited)
        self.free = None if topology.threads is None else [topology.threads] * topology.instances
        # calls in flight at a downstream that answers to load, per instance and in all
        downstream = spec.behavior.downstream
        self.loaded = downstream is not None
        self.per_group = self.loaded and downstream.shared
        self.busy, self.busy_all = [0] * topology.instances, 0
        self.events: list[tuple] = []
        self.sequence = 0
        self.lane_ids: dict[tuple[str, int], int] = {}  # blocking lanes
        # deliveries waiting for a thread, per (topic, queue, instance), and per instance a
        # heap of those lanes' heads
        self.wait_ids: dict[tuple[str, int, int], int] = {}
        self.lane_waiting: list[list[tuple]] = []
        self.heads: dict[int, list[tuple]] = {}
        # instances given a waiting delivery or a free thread since the last dispatch: the
        # others are either idle or full, and dispatching them would start nothing
        self.touched: set[int] = set()
        self.rows: list[tuple] = []
        self.fixed: set[int] = set()  # positions whose poison was fixed by a replay
        self.last_delivery: dict[int, int] = {}
        self.dead: list[tuple[int, int, int]] = []  # (dlq_at_ms, msg_id, position)
        self.next_arrival = 0
        # blocking lanes: positions in publish order, a cursor, replays, and a busy flag
        self.lane_queue: dict[int, np.ndarray] = {}
        self.lane_cursor: dict[int, int] = {}
        self.lane_replays: dict[int, list[tuple]] = {}
        self.lane_busy: dict[int, bool] = {}
        # the delivery a lane released last, and released deliveries taken back before they
        # were eligible (by id: their events are skipped)
        self.lane_released: dict[int, _Delivery] = {}
        self.withdrawn: set[int] = set()
        self.heartbeat = heartbeat or Heartbeat(None, 0, self.horizon)
        self.deliveries = self.first_deliveries = 0
        if self.policy.blocking:
            self._build_lanes()

    # ------------------------------------------------------------------ lanes and events

    def _push(self, at_ms: int, phase: int, payload: object) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (at_ms, phase, self.sequence, payload))

    def _lane(self, topic: str, queue_id: int) -> int:
        key = (topic, queue_id)
        lane = self.lane_ids.get(key)
        if lane is None:
            lane = self.lane_ids[key] = len(self.lane_ids)
        return lane

    def _instance(self, entry: _Delivery) -> int:
        return self.topology.instance(
            entry.topic, entry.queue_id, int(self.msg_ids[entry.index]), entry.delivery
        )

    def _build_lanes(self) -> None:
        queues = self.queue_ids[: self.count]
        for queue_id in np.unique(queues).tolist():
            lane = self._lane(self.spec.topic, queue_id)
            self.lane_queue[lane] = np.flatnonzero(queues == queue_id)
            self.lane_cursor[lane] = 0
        for lane in list(self.lane_queue):
            self._release(lane, 0)

    def _first_delivery(self, position: int, delivery: int, ready_ms: int, queue_id: int,
                        reason: str) -> _Delivery:  # fmt: skip
        return _Delivery(position, delivery, 0, 0, self.spec.topic, queue_id, ready_ms, reason, 0)

    def _release(self, lane: int, at_ms: int) -> None:
        """A blocking lane is free: its next message (publish order) becomes eligible."""
        queue, cursor = self.lane_queue.get(lane), self.lane_cursor.get(lane, 0)
        original = None
        if queue is not None and cursor < len(queue):
            position = int(queue[cursor])
            original = (int(self.born[position]), int(self.msg_ids[position]), position)
        replays = self.lane_replays.get(lane)
        if replays and (original is None or replays[0][:2] < original[:2]):
            _, _, entry = heapq.heappop(replays)
        elif original is not None:
            self.lane_cursor[lane] = cursor + 1
            position = original[2]
            entry = self._first_delivery(
                position, 1, original[0], int(self.queue_ids[position]), READY_PUBLISHED
            )
        else:
            self.lane_busy[lane] = False
            return
        self.lane_busy[lane] = True
        entry.eligible_ms = max(self.policy.eligible_ms(entry.ready_ms), at_ms)
        self.lane_released[lane] = entry
        self._push(entry.eligible_ms, _ELIGIBLE, entry)

    def _withdraw_later_first(self, lane: int, ready_ms: int, msg_id: int, now: int) -> None:
        """A replay Ready at ``ready_ms`` comes before a first delivery the lane released
        while idle but which is not eligible yet (published later): take that one back, so
        that :meth:`_release` serves the lane in Ready order (the reference's rule)."""
        entry = self.lane_released.get(lane)
        if (
            entry is not None
            and self.lane_busy.get(lane)
            and entry.reason == READY_PUBLISHED
            and entry.eligible_ms > now
            and (entry.ready_ms, int(self.msg_ids[entry.index])) > (ready_ms, msg_id)
        ):
            self.withdrawn.add(id(entry))
            self.lane_cursor[lane] -= 1
            self.lane_busy[lane] = False
            del self.lane_released[lane]

    def _next_arrival_ms(self) -> int | None:
        """Eligible time of the next first delivery of an unordered group, if any."""
        if self.policy.blocking or self.next_arrival >= self.count:
            return None
        return self.policy.eligible_ms(int(self.born[self.next_arrival]))

    def _take_arrivals(self, now: int) -> None:
        while not self.policy.blocking and self.next_arrival < self.count:
            position = self.next_arrival
            ready = int(self.born[position])
            eligible = self.policy.eligible_ms(ready)
            if eligible != now:
                return
            entry = self._first_delivery(
                position, 1, ready, int(self.queue_ids[position]), READY_PUBLISHED
            )
            entry.eligible_ms = eligible
            self._wait(entry)
            self.next_arrival += 1

    def continue_from(self, frontier: pd.DataFrame) -> None:
        """Start from deliveries already Ready (a round run's frontier) instead of publishing:
        each message's later deliveries are simulated from there."""
        position_of = {msg_id: index for index, msg_id in enumerate(self.msg_ids.tolist())}
        positions = [position_of[msg_id] for msg_id in frontier["msg_id"].tolist()]
        columns = (
            "delivery",
            "reconsume_times",
            "broker_reconsume_times",
            "source_topic",
            "queue_id",
            "ready_ms",
            "ready_reason",
            "poison_fixed",
        )
        values = zip(positions, *(frontier[c].tolist() for c in columns), strict=True)
        for position, delivery, rt, broker_rt, topic, queue_id, ready, reason, fixed in values:
            if fixed:
                self.fixed.add(position)
            self.last_delivery[position] = delivery - 1
            entry = _Delivery(
                position,
                delivery,
                rt,
                broker_rt,
                topic,
                queue_id,
                ready,
                reason,
                self.policy.eligible_ms(ready),
            )
            self._push(entry.eligible_ms, _ELIGIBLE, entry)

    # ------------------------------------------------------------------ the loop

    def run(self) -> Iterator[list[tuple]]:
        """Simulate to the horizon, yielding staged rows in chunks."""
        replay = self.policy.replay
        if replay is not None and replay.at < self.horizon and self.count:
            self._push(replay.at, _REPLAY, None)
        turns = 0
        while True:
            arrival = self._next_arrival_ms()
            event = self.events[0][0] if self.events else None
            if arrival is None and event is None:
                break
            now = min(t for t in (arrival, event) if t is not None)
            if now >= self.horizon:
                break
            while self.events and self.events[0][0] == now and self.events[0][1] == _FREE:
                payload = heapq.heappop(self.events)[3]
                if payload < 0:
                    instance = -1 - payload
                    if self.free is not None:
                        self.free[instance] += 1
                    if self.loaded:
                        self.busy[instance] -= 1
                        self.busy_all -= 1
                    self.touched.add(instance)
                else:
                    self._release(payload, now)
            self._take_arrivals(now)
            while self.events and self.events[0][0] == now and self.events[0][1] == _ELIGIBLE:
                entry = heapq.heappop(self.events)[3]
                if id(entry) in self.withdrawn:
                    self.withdrawn.discard(id(entry))
                else:
                    self._wait(entry)
            if self.events and self.events[0][0] == now and self.events[0][1] == _REPLAY:
                heapq.heappop(self.events)
                self._replay(now)
                if self.events and self.events[0][0] == now:
                    continue  # replayed deliveries eligible now: take them first
                # else what already waits is dispatched now, not at the next event
            self._dispatch(now)
            turns += 1
            if turns % _CLOCK_EVERY == 0:
                self.heartbeat.beat(now, self.deliveries, self.first_deliveries, self.count)
            if len(self.rows) >= OUTPUT_CHUNK_ROWS:
                yield self.rows
                self.rows = []
        self._flush_pending()
        self.heartbeat.beat(
            self.horizon, self.deliveries, self.first_deliveries, self.count, done=True
        )
        yield self.rows

    def _wait(self, entry: _Delivery) -> None:
        instance = self._instance(entry)
        lane_key = (entry.topic, entry.queue_id, instance)
        lane = self.wait_ids.get(lane_key)
        if lane is None:
            lane = self.wait_ids[lane_key] = len(self.lane_waiting)
            self.lane_waiting.append([])
        key = (entry.eligible_ms, int(self.msg_ids[entry.index]), entry.delivery)
        waiting = self.lane_waiting[lane]
        if not waiting or key < waiting[0][:3]:
            heapq.heappush(self.heads.setdefault(instance, []), (*key, lane))
            self.touched.add(instance)
        heapq.heappush(waiting, (*key, entry))

    def _dispatch(self, now: int) -> None:
        """Start what waits, per instance, while the instance has a free thread. Instances
        do not share threads; in ascending order, because a downstream they share counts
        the calls started before each one (docs/model.md §3)."""
        size, free = self.policy.batch_size, self.free
        touched, self.touched = self.touched, set()
        for instance in sorted(touched):
            heads = self.heads.get(instance)
            if heads is None:
                continue
            while heads and (free is None or free[instance] > 0):
                *key, lane = heapq.heappop(heads)
                waiting = self.lane_waiting[lane]
                if not waiting or list(waiting[0][:3]) != key:
                    continue  # a stale head: that delivery left in an earlier batch
                batch = [heapq.heappop(waiting)[3] for _ in range(min(size, len(waiting)))]
                if waiting:
                    heapq.heappush(heads, (*waiting[0][:3], lane))
                self._start(batch, instance, now)
            if not heads:
                del self.heads[instance]

    # ------------------------------------------------------------------ a consume request

    def _start(self, batch: list[_Delivery], instance: int, now: int) -> None:
        policy = self.policy
        results = []
        concurrency = (self.busy_all if self.per_group else self.busy[instance]) + 1
        for entry in batch:
            draws = self.draws.get(entry.index, entry.delivery)
            poisoned = self.draws.is_poisoned(entry.index) and entry.index not in self.fixed
            results.append(self.model.result(draws, entry.delivery, now, poisoned, concurrency))
        processing = sum(result[1] for result in results)
        failing = next((result[0] for result in results if result[0] != CONSUME_SUCCESS), None)
        outcome, end = policy.consume_result(now, processing, failing or CONSUME_SUCCESS)
        self.deliveries += len(batch)
        self.first_deliveries += sum(entry.delivery == 1 for entry in batch)
        if self.free is not None:
            self.free[instance] -= 1
        if self.loaded:
            self.busy[instance] += 1
            self.busy_all += 1
        if self.free is not None or self.loaded:
            self._push(now + processing, _FREE, -1 - instance)
        for position, (entry, result) in enumerate(zip(batch, results, strict=True)):
            beyond_ack = (
                outcome == CONSUME_SUCCESS
                and policy.ack_index is not None
                and position > policy.ack_index
            )
            self._settle(entry, now, processing, outcome, end, result[2], len(batch), beyond_ack)

    def _settle(
        self, entry: _Delivery, now: int, processing: int, outcome: str, end: int,
        send_back: int, batch_size: int, beyond_ack: bool,
    ) -> None:  # fmt: skip
        policy = self.policy
        self.last_delivery[entry.index] = entry.delivery
        if end >= self.horizon:
            self._row(
                entry,
                (now, processing, None, None, INFLIGHT, None, None, None, batch_size, *_NO_STEP),
            )
            return
        step = policy.next_step(
            entry.rt,
            entry.broker_rt,
            RECONSUME_LATER if beyond_ack else outcome,
            now,
            end,
            send_back,
            entry.topic,
            entry.queue_id,
            int(self.msg_ids[entry.index]),
            entry.delivery,
        )
        if beyond_ack and step.end_reason == RECONSUME_LATER:
            step = step._replace(end_reason=REASON_BEYOND_ACK)
        if step.leave_state is not None and step.settled_ms >= self.horizon:
            step = step._replace(
                result_state=WAITING_RETRY,
                settled_ms=None,
                leave_state=None,
                leave_topic=None,
                leave_queue_id=None,
                leave_reason=None,
            )
        self._row(entry, _step_values(now, processing, outcome, end, step, batch_size))
        if (
            policy.blocking
            and step.next_ready_ms is None
            and step.end_topic == limits.SCHEDULE_TOPIC
        ):
            # re-sent to the broker (4.x orderly): the queue moves on now, whenever the
            # message lands
            self._push(end, _FREE, self._lane(entry.topic, entry.queue_id))
        elif policy.blocking and step.result_state != WAITING_RETRY:
            self._push(step.settled_ms, _FREE, self._lane(entry.topic, entry.queue_id))
        if step.result_state in (WAITING_RETRY, INFLIGHT):  # retried, or leaving later
            due = step.next_ready_ms
            if due is not None and due < self.horizon:
                rt, broker_rt = next_reconsume_times(entry.rt, entry.broker_rt, step.end_reason)
                self._push(
                    policy.eligible_ms(due),
                    _ELIGIBLE,
                    _Delivery(
                        entry.index,
                        entry.delivery + 1,
                        rt,
                        broker_rt,
                        step.next_topic,
                        step.next_queue_id,
                        due,
                        step.next_reason,
                        policy.eligible_ms(due),
                    ),
                )
            return
        self.draws.forget(entry.index)
        if step.result_state == DLQ:
            self.dead.append((step.settled_ms, int(self.msg_ids[entry.index]), entry.index))

    def _row(self, entry: _Delivery, rest: tuple) -> None:
        """Append one staged attempt row (STAGE column order)."""
        self.rows.append(
            (
                self.spec.group,
                int(self.msg_ids[entry.index]),
                entry.delivery,
                entry.rt,
                entry.broker_rt,
                entry.topic,
                entry.queue_id,
                self._instance(entry),
                int(self.born[entry.index]),
                entry.ready_ms,
                entry.reason,
                *rest,
                entry.index in self.fixed,
            )
        )

    # ------------------------------------------------------------------ replay and horizon

    def _replay(self, now: int) -> None:
        """docs/model.md §8: re-publish the dead letters so far, ``rate`` per second."""
        replay = self.policy.replay
        # A dead letter is known when its last delivery settles, which for an after-backoff
        # leave is before it reaches the DLQ: only those already there are replayed.
        dead = sorted(entry for entry in self.dead if entry[0] < now)
        for rank, (_, _, position) in enumerate(dead):
            ready = now + int(rank * 1000.0 / replay.rate)
            if ready >= self.horizon:
                break
            if replay.poison_fixed:
                self.fixed.add(position)
            entry = self._first_delivery(
                position,
                self.last_delivery[position] + 1,
                ready,
                rank % self.spec.queues,
                READY_REPLAYED,
            )
            if self.policy.blocking:
                lane = self._lane(entry.topic, entry.queue_id)
                heapq.heappush(
                    self.lane_replays.setdefault(lane, []),
                    (ready, int(self.msg_ids[position]), entry),
                )
                self._withdraw_later_first(lane, ready, int(self.msg_ids[position]), now)
                if not self.lane_busy.get(lane):
                    self._release(lane, now)
            else:
                entry.eligible_ms = self.policy.eligible_ms(ready)
                self._push(entry.eligible_ms, _ELIGIBLE, entry)
        self.dead = []

    def _flush_pending(self) -> None:
        """Deliveries Ready before the horizon that never started (docs/model.md §7)."""
        left = [
            payload
            for _, phase, _, payload in self.events
            if phase == _ELIGIBLE and id(payload) not in self.withdrawn
        ]
        left += [item[3] for waiting in self.lane_waiting for item in waiting]
        left += [item[2] for replays in self.lane_replays.values() for item in replays]
        for lane, queue in self.lane_queue.items():
            for position in queue[self.lane_cursor[lane] :].tolist():
                left.append(
                    self._first_delivery(
                        position,
                        1,
                        int(self.born[position]),
                        int(self.queue_ids[position]),
                        READY_PUBLISHED,
                    )
                )
        for position in range(
            self.next_arrival if not self.policy.blocking else self.count, self.count
        ):
            left.append(
                self._first_delivery(
                    position,
                    1,
                    int(self.born[position]),
                    int(self.queue_ids[position]),
                    READY_PUBLISHED,
                )
            )
        for entry in left:
            if entry.ready_ms < self.horizon:
                self._row(entry, (None, None, None, None, READY, None, None, None, None, *_NO_STEP))


def _step_values(start, processing, outcome, end, step: Step, batch_size: int) -> tuple:
    return (
        start,
        processing,
        end,
        outcome,
        step.result_state,
        step.delay_level,
        step.next_ready_ms,
        step.settled_ms,
        batch_size,
        step.end_state,
        step.end_topic,
        step.end_queue_id,
        step.end_reason,
        step.leave_state,
        step.leave_topic,
        step.leave_queue_id,
        step.leave_reason,
        step.next_topic,
        step.next_queue_id,
        step.next_reason,
    )


def _nullable(kind: pa.DataType):
    """Arrow's nullable integers as pandas' (not floats), for frames made from record
    batches (a ``types_mapper``)."""
    import pandas as pd

    return {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}.get(kind)


_PANDAS_TYPES = {
    field.name: {"string": "object", "bigint": "Int64", "int": "Int32", "boolean": "bool"}[
        field.dataType.simpleString()
    ]
    for field in STAGE.fields
}


def simulate_key(
    spec: KeySpec,
    msg_ids,
    queue_ids,
    born,
    heartbeat: Heartbeat | None = None,
    compiled: bool = True,
    arrow: bool = False,
    unit: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    imports: pd.DataFrame | None = None,
    chunks: bool = False,
) -> Iterator[pd.DataFrame] | Iterator[pa.RecordBatch]:
    """Staged attempt rows of one key's messages, as pandas frames in STAGE's shape (with
    ``arrow``: record batches in STAGE_ARROW's): from the compiled loop
    (:mod:`retrysim.engine.compiled`), or with ``compiled=False`` from :class:`_Simulation`,
    its plain-Python twin, which the tests hold it to. ``unit`` and ``imports``: those of
    one unit of the group, fed the retries other units sent it (the compiled loop's,
    :func:`units_of`). With ``arrow`` and ``chunks``, the compiled loop's rows come as its
    chunks (:func:`as_batch` makes each a record batch)."""
    msg_ids, queue_ids, born = (
        np.asarray(values, dtype=np.int64) for values in (msg_ids, queue_ids, born)
    )
    if compiled:
        from retrysim.engine.compiled import simulate_compiled  # numba: on executors only

        loop = simulate_compiled(
            spec, msg_ids, queue_ids, born, heartbeat, unit, imports, chunks=arrow and chunks
        )
        for batch in loop:
            yield (
                batch if arrow else batch.to_pandas(types_mapper=_nullable).astype(_PANDAS_TYPES)
            )
        return
    if unit is not None:
        raise ValueError(f"group {spec.group}: only the compiled loop runs a unit of a group")
    import pandas as pd  # the Python loop's frames

    simulation = _Simulation(spec, msg_ids, queue_ids, born, heartbeat=heartbeat)
    for rows in simulation.run():
        if rows:
            frame = pd.DataFrame.from_records(rows, columns=_COLUMNS).astype(_PANDAS_TYPES)
            yield (
                pa.RecordBatch.from_pandas(frame, schema=STAGE_ARROW, preserve_index=False)
                if arrow
                else frame
            )


def as_batch(rows: pa.RecordBatch | Columns) -> pa.RecordBatch:
    """A record batch of :func:`simulate_key`'s rows (the compiled loop's chunks, made one
    only where a task writes them)."""
    return rows if isinstance(rows, pa.RecordBatch) else rows.arrow()


def units_of(spec: KeySpec) -> Units | None:
    """The units a group is simulated in (:meth:`Topology.units`), or None when it runs
    whole: only where it replays nothing, its retries go to the topology's retry queues,
    and no downstream shared by its instances ties them together."""
    policy, downstream = spec.policy, spec.behavior.downstream
    lanes = policy.blocking or policy.batch_size > 1  # the lanes' loop runs a group whole
    shared = downstream is not None and downstream.shared
    if (
        policy.replay is not None  # a replay re-sends to every queue: it ties the units
        or lanes
        or shared
        or policy.retry_topic != policy.topology.retry_topic
    ):
        return None
    return policy.topology.units()


# a group within its run (KeySpec.key): the stage's choices name groups so
GroupKey = tuple[int, str]


def key_count(
    specs: list[KeySpec], per_lane: set[GroupKey], split: set[GroupKey] = frozenset()
) -> int:
    """How many keys :func:`sequential_attempts` simulates: a queue of each group in
    ``per_lane``, each unit but the retry owners' of each group in ``split``, else the
    group (the sets name groups by :attr:`KeySpec.key`)."""
    return len([task for task in _tasks(specs, per_lane, split, 1) if task.part == 0])


@dataclass(frozen=True)
class _Task:
    """One task of the event-by-event stage: a key (a queue of ``lane``, else the whole
    group's messages), the share ``part`` of ``parts`` of its rows it writes, and the unit
    it runs (the instances it runs, and those it sends retries to), if not the group."""

    spec: int
    lane: int | None
    part: int = 0
    parts: int = 1
    unit: tuple[tuple[int, ...], tuple[int, ...]] | None = None


def _tasks(
    specs: list[KeySpec], per_lane: set[GroupKey], split: set[GroupKey], parts: int
) -> list[_Task]:
    tasks = []
    for index, spec in enumerate(specs):
        if spec.key in per_lane:
            tasks += [_Task(index, lane) for lane in range(spec.queues)]
        elif spec.key in split:
            units = units_of(spec)
            tasks += [_Task(index, None, unit=(runs, units.retry_owners)) for runs in units.first]
        else:
            tasks += [_Task(index, None, part, parts) for part in range(parts)]
    return tasks


def sequential_attempts(
    spark: SparkSession,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    partitions: int,
    heartbeats: str | None = None,
    sums: Accumulator | None = None,
    split: set[GroupKey] = frozenset(),
) -> DataFrame:
    """Staged attempts of ``specs``' groups, one task per key: a queue of the groups in
    ``per_lane`` (ordered queues that never fill the pool), each unit but the retry
    owners' of the groups in ``split`` (:func:`units_of`; :func:`retry_owner_attempts`
    runs the retry owners next), else the whole group. Each key sends its
    :class:`Heartbeat` to the folder ``heartbeats``, if given, and each whole group its
    :class:`retrysim.tables.key_peaks.GroupSums` to the accumulator ``sums`` (of
    :class:`retrysim.tables.key_peaks.GroupSumsParam`, under its :attr:`KeySpec.key`), if
    given.

    The stage's input is the keys alone, spread evenly over ``partitions``: each task makes
    its keys' messages itself (:func:`retrysim.model.workload.messages_np`, the messages
    table's values bit for bit), one key at a time, so no message crosses the network and
    a task holds one key's messages at once. Rows go back as Arrow record batches
    (``mapInArrow``), which the compiled loop builds without pandas.

    Where whole groups are fewer than the cores, each is simulated by several tasks at once
    (:func:`output_parts`), each keeping its share of the batches (each batch goes to the
    part that has kept the fewest rows so far): the loop is cheap next to encoding its rows,
    and they are the same in every task, so all cores write (and the first two sum up the
    group's rows, a share each)."""
    tasks, positions = _stage_tasks(spark, specs, per_lane, partitions, split)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for position in batch.column(0).to_pylist():
                task = tasks[position]
                yield from _simulate_one(specs[task.spec], task, position, heartbeats, sums)

    return positions.mapInArrow(run, STAGE)


@dataclass(frozen=True)
class RunFolders:
    """Where the event-by-event stage writes one run's files: its attempts, and the
    :data:`retrysim.tables.task_tables.TASK_TABLES` ``tables`` its whole groups' tasks make
    (each under ``task_tables/<table>``)."""

    attempts: str
    task_tables: str | None = None
    tables: tuple[str, ...] = ()


def write_sequential_attempts(
    spark: SparkSession,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    partitions: int,
    folder: str,
    heartbeats: str | None = None,
    sums: Accumulator | None = None,
    split: set[GroupKey] = frozenset(),
    task_tables: tuple[str, tuple[str, ...]] | None = None,
) -> int:
    """:func:`write_runs_attempts` for one run: its rows in ``folder``, and with
    ``task_tables`` (a folder, table names) those tables."""
    tables_dir, tables = task_tables or (None, ())
    outputs = [RunFolders(folder, tables_dir, tables)]
    return write_runs_attempts(spark, specs, per_lane, partitions, outputs, heartbeats, sums, split)


def write_runs_attempts(
    spark: SparkSession,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    partitions: int,
    outputs: list[RunFolders],
    heartbeats: str | None = None,
    sums: Accumulator | None = None,
    split: set[GroupKey] = frozenset(),
) -> int:
    """:func:`sequential_attempts`' rows as Parquet files, each run's (``KeySpec.run``) in
    the folder ``outputs[run].attempts``, one per core and run (``part-<n>.parquet``, each
    task running its keys in turn), written by the tasks themselves; returns the row count.
    Several runs in one stage (a plan's points and replications) pay the stage's start once,
    and a cluster runs them side by side.

    Spark's writer takes the rows through Arrow into the JVM and encodes them again there,
    several times the simulation's own work. Here each task encodes
    its rows with pyarrow (STAGE_ARROW's types are the ones Spark writes and reads back)
    into a folder of its own attempt, and returns the files' names; the driver moves the
    files of the attempts Spark kept (one per task) into place and removes the rest, so a
    failed or speculative attempt leaves nothing behind, as with Spark's committer. The
    folders must be ones every executor and the driver see (as for Spark's writer).

    The tasks that simulate a whole group also write the run's ``tables``
    (:mod:`retrysim.tables.task_tables`) into ``<task_tables>/<table>`` the same way; each
    such folder is there afterwards, with at least one file."""
    tasks, positions = _stage_tasks(spark, specs, per_lane, partitions, split)
    attempts_dir = os.path.join(outputs[0].attempts, "_attempts")

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        name = f"part-{context.partitionId():05d}.parquet"
        attempt = os.path.join(attempts_dir, str(context.taskAttemptId()))
        by_run: dict[int, list[int]] = {}
        for batch in batches:
            for position in batch.column(0).to_pylist():
                by_run.setdefault(specs[tasks[position].spec].run, []).append(position)
        written = []
        for index, positions in by_run.items():
            folder = os.path.join(attempt, str(index))
            found = _write_keys(specs, tasks, positions, folder, name, outputs[index].tables,
                                heartbeats, sums)  # fmt: skip
            written += [{"run": index, **row} for row in found]
        yield pa.RecordBatch.from_pylist(written, schema=_WRITTEN_ARROW)

    cores = spark.sparkContext.defaultParallelism
    try:
        with python_tasks(spark):
            written = positions.coalesce(cores).mapInArrow(run, _WRITTEN).collect()
        into = {
            (index, table): os.path.join(out.task_tables, table)
            for index, out in enumerate(outputs)
            for table in out.tables
        } | {(index, "attempts"): out.attempts for index, out in enumerate(outputs)}
        for target in into.values():
            os.makedirs(target, exist_ok=True)
        for row in written:
            target = into[row["run"], row["table"]]
            os.replace(row["path"], os.path.join(target, os.path.basename(row["path"])))
        for (_, table), target in into.items():
            if table != "attempts" and not os.listdir(target):  # no rows: a file with the columns
                write_small_rows([], data_schema(SCHEMAS[table]), target)
    finally:
        shutil.rmtree(attempts_dir, ignore_errors=True)
    return sum(row["rows"] for row in written if row["table"] == "attempts")


def _write_keys(
    specs: list[KeySpec],
    tasks: list[_Task],
    positions: list[int],
    folder: str,
    name: str,
    tables: tuple[str, ...],
    heartbeats: str | None,
    sums: Accumulator | None,
) -> list[dict]:
    """One task's keys of one run, simulated in turn: their rows as ``folder/name`` and the
    whole groups' ``tables`` as ``folder/<table>/name``; (table, path, rows) of each file."""
    derived = TaskTableWriter(folder, name, tables)

    def rows() -> Iterator[pa.RecordBatch]:
        for position in positions:
            task = tasks[position]
            spec = specs[task.spec]
            whole = task.lane is None and task.unit is None
            messages = messages_np(spec.workload, spec.group, spec.seed, task.lane)
            for chunk in _simulate_one(spec, task, position, heartbeats, sums, messages):
                if whole:
                    derived.add_attempts(chunk, spec.topic)
                yield chunk
            if whole and "messages" in tables:
                size = spec.workload.size_bytes
                made = messages_of(messages, spec.group, spec.topic, size, task.part, task.parts)
                derived.write("messages", made)

    path = os.path.join(folder, name)
    with no_cyclic_gc():
        count = write_rows(rows(), path)
    written = [{"table": "attempts", "path": path, "rows": count}] if count else []
    return written + [
        {"table": table, "path": path, "rows": count} for table, path, count in derived.close()
    ]


# what each task of write_sequential_attempts wrote
_WRITTEN = StructType(
    [StructField(name, kind) for name, kind in (("run", LongType()), ("table", StringType()),
                                                ("path", StringType()), ("rows", LongType()))]
)  # fmt: skip
_WRITTEN_ARROW = to_arrow_schema(_WRITTEN)
ROW_GROUP_ROWS = 500_000  # rows per Parquet row group (Spark's 128 MB blocks, about)


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Python's cyclic collector off for a task's loop: the loop's arrays and batches make
    no cycles, and the collections their allocations set off cost a task at 3M messages
    about 4 % of its time (perf); reference counting still frees everything at once."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def write_rows(batches: Iterator[pa.RecordBatch], path: str) -> int:
    """Write ``batches`` (STAGE_ARROW) as one Parquet file at ``path``, in row groups of
    about ROW_GROUP_ROWS, as Spark's writer would (snappy); no rows, no file. Returns the
    row count."""
    writer, pending, held, count = None, [], 0, 0
    try:
        for batch in batches:
            pending.append(batch)
            held += batch.num_rows
            if held >= ROW_GROUP_ROWS:
                writer = writer or parquet_writer(path, STAGE_ARROW)
                writer.write_table(pa.Table.from_batches(pending), row_group_size=held)
                count, pending, held = count + held, [], 0
        if held:
            writer = writer or parquet_writer(path, STAGE_ARROW)
            writer.write_table(pa.Table.from_batches(pending), row_group_size=held)
            count += held
    finally:
        if writer is not None:
            writer.close()
    return count


def _stage_tasks(
    spark: SparkSession,
    specs: list[KeySpec],
    per_lane: set[GroupKey],
    partitions: int,
    split: set[GroupKey],
) -> tuple[list[_Task], DataFrame]:
    """The event-by-event stage's tasks, and its input: their positions, spread evenly."""
    whole = [s for s in specs if s.key not in per_lane | split]
    parts = output_parts(spark.sparkContext.defaultParallelism, whole)
    tasks = _tasks(specs, per_lane, split, parts)
    positions = spark.range(len(tasks), numPartitions=max(1, min(partitions, len(tasks))))
    return tasks, positions


def retry_owner_attempts(
    spark: SparkSession, specs: list[KeySpec], sent: DataFrame, heartbeats: str | None = None
) -> DataFrame:
    """The retry owners' rows of the groups ``specs`` that run in units, each group's
    owners' unit in tasks of one stage (as many as :func:`output_parts` gives, each writing
    its share of the rows as in :func:`sequential_attempts`), fed the retries ``sent``: the
    deliveries the other units' rows lead to at the retry owners (a frame of ``group`` and
    :data:`IMPORTED`, as
    :func:`retrysim.engine.rounds.next_frontier` gives them)."""
    parts = output_parts(spark.sparkContext.defaultParallelism, specs)
    tasks = [_Task(index, None, part, parts, (units_of(spec).retry_owners, ()))
             for index, spec in enumerate(specs) for part in range(parts)]  # fmt: skip
    # a value of the task column for each task that Spark's hash sends to a partition of
    # its own; every task gets a row, retries or not
    value = _partition_keys(spark, len(tasks))
    keyed = spark.createDataFrame(
        [(value[t], t, specs[task.spec].group) for t, task in enumerate(tasks)],
        "_key int, _task int, group string",
    )
    retries = sent.join(F.broadcast(keyed), "group").select("_key", "_task", *IMPORTED)
    rows = keyed.drop("group").unionByName(retries, allowMissingColumns=True)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        data = pa.Table.from_batches(list(batches)).to_pandas(types_mapper=_nullable)
        for position, imports in data.groupby("_task", sort=True):
            task = tasks[int(position)]
            yield from _simulate_one(
                specs[task.spec], task, (1 << 20) + int(position), heartbeats, None,
                imports=imports.dropna(subset=["msg_id"]),
            )  # fmt: skip

    return rows.repartition(len(tasks), "_key").mapInArrow(run, STAGE)


def _partition_keys(spark: SparkSession, count: int) -> list[int]:
    """For each of ``count`` hash partitions, an int that ``repartition(count, column)``
    sends there (Spark's Murmur3 ``hash``, modulo ``count``)."""
    found = (
        spark.range(64 * count)
        .select(
            F.col("id").cast("int").alias("value"),
            F.expr(f"pmod(hash(cast(id as int)), {count})").alias("partition"),
        )
        .groupBy("partition")
        .agg(F.min("value").alias("value"))
        .collect()
    )
    value = {row["partition"]: row["value"] for row in found}
    return [value[partition] for partition in range(count)]


# The columns of a retry one unit sends another (as retrysim.engine.rounds.next_frontier
# gives them)
IMPORTED = ("msg_id", "delivery", "reconsume_times", "broker_reconsume_times", "source_topic",
            "queue_id", "ready_ms", "ready_reason")  # fmt: skip
MOST_OUTPUT_PARTS = 4  # each part holds the whole key's messages: bounds a key's memory


def output_parts(cores: int, whole: list[KeySpec]) -> int:
    """How many tasks simulate each of the groups ``whole`` (each simulated whole by a
    task): the cores each would have to itself, up to :data:`MOST_OUTPUT_PARTS`."""
    return max(1, min(MOST_OUTPUT_PARTS, cores // len(whole))) if whole else 1


def _shares(task: _Task) -> frozenset[str]:
    """What a task sums up of its whole group (retrysim.tables.key_peaks): all of it alone,
    else the first two of its parts a share each (each part simulates all of the rows): the
    peaks of the first set of buckets with the rates, and those of the other with the counts
    (:data:`~retrysim.tables.group_sums.PEAK_HALVES`)."""
    if task.parts == 1:
        return SHARES
    first, other = (frozenset({half}) for half in PEAK_HALVES)
    return {0: first | {RATES}, 1: other | {COUNTS}}.get(task.part, frozenset())


def _simulate_one(
    spec: KeySpec,
    task: _Task,
    heartbeat_id: int,
    heartbeats: str | None,
    sums: Accumulator | None,
    messages: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    imports: pd.DataFrame | None = None,
) -> Iterator[pa.RecordBatch]:
    """A task's rows, or with ``task.parts`` > 1 its ``part`` of them: each batch goes to
    the part that has kept the fewest rows so far, the first on a tie (every task makes the
    same batches of the same rows, so the parts agree); part 0 beats the key's
    heartbeat, and parts 0 and 1 sum up a whole group's rows. ``messages``: the key's
    messages as :func:`~retrysim.model.workload.messages_np` makes them, if made already."""
    if messages is None:
        messages = messages_np(spec.workload, spec.group, spec.seed, task.lane)
    msg_ids, queue_ids, born = messages
    heartbeat = Heartbeat(heartbeats if task.part == 0 else None, heartbeat_id, spec.horizon_ms)
    batches = simulate_key(
        spec, msg_ids, queue_ids, born, heartbeat, arrow=True, unit=task.unit, imports=imports,
        chunks=True,
    )  # fmt: skip
    whole = task.lane is None and task.unit is None
    shares = _shares(task)
    if whole and sums is not None and shares:
        summer = GroupSummer(
            spec.group,
            spec.horizon_ms,
            spec.load_bucket_ms,
            spec.shared,
            pops_of(spec.policy),
            shares,
        )
        batches = map(summer.add, batches)
    else:
        summer = None
    written = [0] * task.parts  # rows each part has written: a batch goes to the fewest
    for batch in batches:
        if not batch.num_rows:
            continue
        part = written.index(min(written))
        written[part] += batch.num_rows
        if part == task.part:
            yield as_batch(batch)
    if summer is not None:
        sums.add({spec.key: summer.finish()})


def frontier_attempts(frontier: DataFrame, specs: list[KeySpec], partitions: int) -> DataFrame:
    """The rest of the deliveries of a round run's frontier, in one stage.

    For unordered consumption whose instances' pools never fill, messages do not interact, so a
    thin frontier of long retry chains is finished event by event in one stage instead of
    one Spark stage per remaining round (an always-failing HTTP message alone takes 289).
    Messages are spread over tasks by id; each task simulates its messages' chains, a
    (run, group) at a time (the frontier's :data:`RUN` column and ``specs``' keys say whose).
    The rows are hashed by group and message only, so a run's messages meet in the same
    tasks whichever runs share the stage."""
    by_key = {spec.key: spec for spec in specs}

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd  # a pandas UDF's worker has it already

        from retrysim.engine.compiled import simulate_compiled  # numba: on executors only

        data = [batch for batch in batches if len(batch)]
        if not data:
            return
        rows = pd.concat(data, ignore_index=True)
        for (number, name), part in rows.groupby([RUN, "group"], sort=True):
            spec = by_key[(int(number), name)]
            messages = part.drop_duplicates("msg_id")
            loop = simulate_compiled(
                spec,
                messages["msg_id"].to_numpy(np.int64),
                messages["queue_id"].to_numpy(np.int64),
                messages["born_ms"].to_numpy(np.int64),
                imports=part,
                publish=False,
            )
            for batch in loop:
                frame = batch.to_pandas(types_mapper=_nullable).astype(_PANDAS_TYPES)
                yield frame.assign(**{RUN: np.int32(number)})

    schema = StructType([*STAGE.fields, StructField(RUN, IntegerType(), False)])
    return frontier.repartition(partitions, "group", "msg_id").mapInPandas(run, schema)
