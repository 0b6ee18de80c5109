"""Commit-log writes: the moments each attempt writes to the broker's commit log.

The load table and the exact peaks (and so the summary) read an attempt's writes from
:func:`write_times`, one derivation: a write is counted once, at its moment, and only before
the horizon. docs/flavors.md cites the source of each kind:

* the copy of the message on the topic it is Ready on: published, replayed, or a retry due
  (the schedule topic's delivery to ``%RETRY%``, or the 5.x reviver's copy);
* a 4.x send-back into ``SCHEDULE_TOPIC_XXXX`` (WaitingRetry there);
* a dead letter, and an expired broadcast message's copy that nobody reads;
* a 4.9 client's second send-back: into the schedule topic, or a dead letter;
* a 5.x pop's bookkeeping (:func:`pop_write_times`).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from retrysim.model.behavior import TIMEOUT
from retrysim.model.policy import Policy, policy_for
from retrysim.model.states import (
    COMMIT,
    DISCARD,
    DLQ,
    READY_PUBLISHED,
    READY_REPLAYED,
    READY_RETRY_DUE,
    WAITING_RETRY,
)
from retrysim.scenario import limits
from retrysim.scenario.spec import Scenario
from retrysim.tables.transitions import lands_unread

# PopAckConstants.ackTimeInterval: a checkpoint is due this long before its revive time
ACK_TIME_INTERVAL_MS = 1_000


PopSettings = tuple[int, bool, tuple[int, ...]]


def pops_of(policy: Policy) -> PopSettings | None:
    """A group's pop settings, if its deliveries are 5.x pops
    (:attr:`Policy.pop_invisible_ms`): its invisible time, whether a failed delivery is
    nacked by ``changeInvisibleDuration``, as the push consumer does, rather than left to
    become visible, as the simple consumer's, and the nack's delays (retry n's is the n-th,
    the last after that)."""
    if policy.pop_invisible_ms is None:
        return None
    return policy.pop_invisible_ms, not policy.invisible_until_retry, policy.intervals_ms


def pop_settings(scenario: Scenario) -> dict[str, PopSettings]:
    """The groups that pop (:func:`pops_of`): name -> their settings."""
    table = scenario.broker.message_delay_level
    settings = {group.name: pops_of(policy_for(group, table)) for group in scenario.groups}
    return {name: pop for name, pop in settings.items() if pop is not None}


def pop_write_times(
    invisible: Column,
    start: Column,
    end: Column,
    committed: Column,
    nacked: Column,
    nack_delay: Column,
    left_at: Column,
) -> Column:
    """The commit-log writes of one 5.x pop delivery (a column per possible write, null where
    it does not happen), with the broker's defaults (``enablePopBufferMerge=false``, the timer
    wheel on). A checkpoint or an ack carries a delivery time; while that is ahead, the timer
    wheel writes it twice: to its own topic now, and to the revive topic when it is due (a
    checkpoint is due ``ACK_TIME_INTERVAL_MS`` before its revive time; the second write is
    placed at the revive time).

    * the pop's checkpoint, due when the message would be visible again (``start +
      invisible``);
    * ``committed``: the ack, due at the same moment;
    * ``nacked`` (the push consumer's failure): ``changeInvisibleDuration`` writes a new
      checkpoint, due ``nack_delay`` after the end (when the retry is due; the reviver
      writes the retry itself later), and acks the original;
    * ``left_at`` (the message dead-lettered or discarded then): the reviver's copy, and the
      pop that finds it over the limit, with its checkpoint and its ack.

    Every argument is a column of one attempt; ``invisible`` is null for a group that does
    not pop."""
    pops = invisible.isNotNull()
    started = pops & start.isNotNull()
    visible_again = start + invisible
    committed, nacked = pops & committed, pops & nacked
    leaves = pops & left_at.isNotNull()
    early = F.lit(ACK_TIME_INTERVAL_MS)
    retry_due = end + nack_delay
    writes = [
        *_timer_put(started, start, visible_again, visible_again - early),  # the checkpoint
        *_timer_put(committed, end, visible_again, visible_again),  # the ack
        *_timer_put(nacked, end, retry_due, retry_due - early),  # the new checkpoint
        *_timer_put(nacked, end, visible_again, visible_again),  # the original's ack
        (leaves, left_at),  # the revived copy
        *_timer_put(leaves, left_at, left_at + invisible, left_at + invisible - early),
        *_timer_put(leaves, left_at, left_at + invisible, left_at + invisible),
    ]
    return [F.when(when, at).cast("long") for when, at in writes]


def _timer_put(
    when: Column, now: Column, at: Column, due: Column
) -> tuple[tuple[Column, Column], tuple[Column, Column]]:
    """``HookUtils.transformTimerMessage``: a message due after ``now`` is written now to the
    timer's topic and again (at ``at``) to its own; one due already is written once."""
    return (when, now), (when & (due > now), at)


def _per_group(settings: dict[str, PopSettings], index: int, dtype: str) -> Column:
    """One of the groups' pop settings as a column (null for a group that does not pop)."""
    column = F.lit(None).cast(dtype)
    for name, values in settings.items():
        column = F.when(F.col("group") == F.lit(name), F.lit(values[index])).otherwise(column)
    return column


def nack_delays(settings: dict[str, PopSettings]) -> Column:
    """Each row's nack delay (:func:`pop_write_times`): its group's entry for its retry, the
    delivery's ``broker_reconsume_times`` + 1 (null for a group that does not pop)."""
    column = F.lit(None).cast("long")
    retry = F.col("broker_reconsume_times") + F.lit(1)
    for name, (_, _, delays) in settings.items():
        table = F.array(*[F.lit(delay).cast("long") for delay in delays])
        delay = F.element_at(table, F.least(retry, F.lit(len(delays))).cast("int"))
        column = F.when(F.col("group") == F.lit(name), delay).otherwise(column)
    return column


def before(times: list[Column], horizon: int | Column) -> list[Column]:
    """``times``, each null unless it happens before the horizon. Columns, not an array
    filtered by a lambda: Spark evaluates higher-order functions without generated code, and
    one in a projection slows the whole scan (docs/performance.md)."""
    return [F.when(t < horizon, t) for t in times]


def write_times(scenario: Scenario) -> list[Column]:
    """Every possible commit-log write of an attempt row, a column each: its moment, or null
    when the attempt does not make it before the horizon."""
    c = F.col
    state = c("result_state")
    ready_copy = c("ready_reason").isin(READY_PUBLISHED, READY_REPLAYED, READY_RETRY_DUE)
    scheduled = (c("end_state") == F.lit(WAITING_RETRY)) & (
        c("end_topic") == F.lit(limits.SCHEDULE_TOPIC)
    )
    dead = (state == F.lit(DLQ)) | lands_unread(state, c("leave_reason"))
    times = [
        F.when(ready_copy, c("ready_ms")),
        F.when(scheduled, c("end_ms")),
        F.when(dead, c("settled_ms")),
        F.when(c("copy_state").isin(WAITING_RETRY, DLQ), c("copy_ms")),
    ]
    settings = pop_settings(scenario)
    if settings:
        nacks = _per_group(settings, 1, "boolean")
        times += pop_write_times(
            _per_group(settings, 0, "long"),
            c("start_ms"),
            c("end_ms"),
            committed=c("end_state") == F.lit(COMMIT),
            nacked=nacks
            & (c("end_state") == F.lit(WAITING_RETRY))
            & (c("outcome") != F.lit(TIMEOUT)),
            nack_delay=nack_delays(settings),
            left_at=F.when(state.isin(DLQ, DISCARD), c("settled_ms")),
        )
    return before(times, scenario.horizon)
