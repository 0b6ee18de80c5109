"""One key of the event-by-event stage: what a task needs to simulate it (:class:`KeySpec`),
its heartbeat to the driver, and its rows from the compiled loop (:func:`simulate_key`).

Both engines use it: the event stage for its keys and the round engine for a round run's
thin frontier. It loads no numba on the driver: the loop is imported by the task that runs
it (:mod:`retrysim.engine.event_rows`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from retrysim.model.behavior import longest_processing_ms
from retrysim.model.policy import Policy
from retrysim.model.topology import Units
from retrysim.scenario.spec import Behavior, Workload
from retrysim.tables.key_counts import Columns

if TYPE_CHECKING:  # a worker of the compiled loop never loads pandas (a slow import)
    import pandas as pd


# how often a key's task tells the driver how far it got (the driver's watcher reads every 6 s)
HEARTBEAT_S = 2.0


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


def simulate_key(
    spec: KeySpec,
    msg_ids,
    queue_ids,
    born,
    heartbeat: Heartbeat | None = None,
    unit: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    imports: pd.DataFrame | None = None,
    chunks: bool = False,
    publish: bool = True,
) -> Iterator[pa.RecordBatch] | Iterator[Columns]:
    """Staged attempt rows of one key's messages, from the compiled loop
    (:func:`~retrysim.engine.event_rows.simulate_compiled`), as record batches in
    STAGE_ARROW's shape, or with ``chunks`` as the loop's chunks (:func:`as_batch` makes
    each a record batch). ``unit`` and ``imports``: those of one unit of the group, fed the
    retries other units sent it (:func:`units_of`); without ``publish``, the deliveries of
    ``imports`` alone (a round run's frontier)."""
    from retrysim.engine.event_rows import simulate_compiled  # numba: on executors only

    msg_ids, queue_ids, born = (
        np.asarray(values, dtype=np.int64) for values in (msg_ids, queue_ids, born)
    )
    yield from simulate_compiled(
        spec, msg_ids, queue_ids, born, heartbeat, unit, imports, chunks, publish
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
        # a message sent back twice numbers its deliveries as they start, over every unit
        or policy.may_send_back_twice(longest_processing_ms(spec.behavior))
    ):
        return None
    return policy.topology.units()


# a group within its run (KeySpec.key): the stage's choices name groups so
GroupKey = tuple[int, str]


# The columns of a retry one unit sends another (as retrysim.engine.rounds.next_frontier
# gives them)
IMPORTED = ("msg_id", "delivery", "reconsume_times", "broker_reconsume_times", "source_topic",
            "queue_id", "ready_ms", "ready_reason")  # fmt: skip


def pandas_nullable(kind: pa.DataType):
    """Arrow's nullable integers as pandas' (not floats), for frames made from record
    batches (a ``types_mapper``)."""
    import pandas as pd

    return {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}.get(kind)
