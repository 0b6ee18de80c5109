"""Retry policies: "what delay, and is this the end?", as data with two interpreters.

A group's rules are a :class:`Policy`, built by :func:`policy_for` from its flavor's record
(:mod:`retrysim.model.flavors`). Two small interpreters read it and must agree: Spark column
expressions for the round engine (``with_consume_result``, ``with_next_step``, here) and the
event loop's compiled rules (:mod:`retrysim.engine.event_rules`, from the policy's fields
as arrays); the tests check the two against each other on a grid of cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from retrysim.model.behavior import (
    CONSUME_SUCCESS,
    NULL_RETURN,
    SEND_BACK_FAILED,
    SEND_BACK_FALLBACK,
    TIMEOUT,
)
from retrysim.model.states import (
    COMMIT,
    DISCARD,
    DLQ,
    INFLIGHT,
    LOCAL,
    NO_RETRY,
    READY_LOCAL,
    READY_RETRY_DUE,
    READY_VISIBLE,
    REASON_BROADCAST,
    REASON_MAX_RECONSUME,
    REASON_NEGATIVE_LEVEL,
    REASON_NULL_RESULT,
    REASON_SEND_BACK_FAILED,
    REASON_SEND_BACK_FALLBACK,
    REVIVE,
    SCHEDULE,
    VISIBLE,
    WAITING_RETRY,
)
from retrysim.model.topology import BROADCAST, BY_QUEUE, Topology
from retrysim.scenario import limits
from retrysim.scenario.spec import Group, Replay

# The six cases after a settled delivery, in the order with_next_step picks values by.
_OK, _DROPPED, _RESUBMIT, _GONE, _LATER, _RETRIED = range(6)
_READY_REASON = {SCHEDULE: READY_RETRY_DUE, REVIVE: READY_RETRY_DUE, VISIBLE: READY_VISIBLE}


class Step(NamedTuple):
    """What follows a settled delivery: the columns ``with_next_step`` adds, the fields of the
    compiled rule's tuple (``event_rules._next_step``), in this order."""

    result_state: str
    delay_level: int | None
    next_ready_ms: int | None
    settled_ms: int | None
    end_state: str
    end_topic: str
    end_queue_id: int
    end_reason: str
    leave_state: str | None
    leave_topic: str | None
    leave_queue_id: int | None
    leave_reason: str | None
    next_topic: str | None
    next_queue_id: int | None
    next_reason: str | None


@dataclass(frozen=True)
class Policy:
    """A group's retry rules as data. Build it with :func:`policy_for`."""

    flavor: str
    group: str
    topic: str
    blocking: bool
    retry_path: str
    max_retries: int
    intervals_ms: tuple[int, ...]
    levels: tuple[int, ...] | None
    from_start: bool
    leave_after_backoff: bool
    timeout_ms: int | None
    periodic_timeout: bool
    # a 4.9 client sends a delivery the cleaner sent back again when its listener fails
    late_send_back: bool
    timeout_level: int | None
    timeout_interval_ms: int | None
    dlq_now: bool
    # a listener's null result dead-letters the message at once (the 5.x FIFO push client
    # retries only a failure)
    null_dead_letters: bool
    # a failed delivery stays Inflight (invisible) until it is Ready again (5.x simple)
    invisible_until_retry: bool
    dlq_enabled: bool
    # the levels and intervals of a 4.x client's plain send to %RETRY%<group> (DELAY =
    # 3 + reconsume_times): the concurrent producer fallback (when it can happen) and the
    # orderly send of an exhausted message, which a 4.9.7 broker dead-letters late
    resend_levels: tuple[int, ...] | None
    resend_intervals_ms: tuple[int, ...] | None
    # a 5.x push pop's invisible time when it is not the consume timeout (open-source:
    # the proxy's 60 s, renewed)
    receive_invisible_ms: int | None
    # how long after its revive time the 5.x reviver writes a retry (open-source: 3 s)
    revive_lag_ms: int
    # a 4.x push client's pullThresholdForQueue: the most deliveries of a queue it caches
    pull_threshold: int | None
    # a 5.x push client's maxCacheMessageCount over its one assignment (an unordered
    # group's): the most deliveries an instance caches, received from the topic and its
    # retry topic together
    pop_cache: int | None
    # a 5.x simple consumer: each thread receives one message, by a pop, when it is free
    pops_per_thread: bool
    batch_size: int
    ack_index: int | None
    pull_interval_ms: int
    ready_wait_ms: int
    replay: Replay | None
    topology: Topology

    @property
    def dlq_topic(self) -> str:
        return limits.DLQ_TOPIC_PREFIX + self.group

    @property
    def retry_topic(self) -> str | None:
        """The topic a broker-side retry comes back on (None: the same topic and queue)."""
        if self.retry_path == SCHEDULE:
            return limits.RETRY_TOPIC_PREFIX + self.group
        if self.retry_path == REVIVE:
            return f"{limits.RETRY_TOPIC_PREFIX}{self.group}_{self.topic}"
        return None

    @property
    def sequential(self) -> bool:
        """Whether this group needs the sequential engine from the start (not just on
        saturation): ordered queues and batches are decided by dispatch order, and so is a
        pool whose threads could fill a queue's cache (the pull threshold) before the pool,
        and which instance takes a 5.x push group's delivery (:attr:`shared_polls`)."""
        threads = self.topology.threads
        small_cache = threads is not None and (
            (self.pull_threshold is not None and self.pull_threshold < threads)
            # a full 5.x cache holds its next receive back a second, even with threads free
            or (self.pop_cache is not None and self.pop_cache <= threads)
        )
        return self.blocking or self.batch_size > 1 or small_cache or self.shared_polls

    @property
    def shared_polls(self) -> bool:
        """Whether the broker picks the instance of each delivery: a 5.x push group of
        several instances pops the topic together, and the broker answers the long poll made
        first (docs/model.md §5), where the round engine fixes each delivery's instance."""
        threads = self.topology.threads
        return self.pop_cache is not None and threads is not None and self.topology.instances > 1

    def may_expire(self, longest_ms: float) -> bool:
        """Whether a consume request can outlast the timeout: a processing time up to
        ``longest_ms`` a delivery, a batch's members one after another."""
        return self.timeout_ms is not None and longest_ms * self.batch_size > self.timeout_ms

    def cleaner_may_send_back(self, longest_ms: float) -> bool:
        """Whether the 4.x periodic check may send a delivery back (:meth:`may_expire`)."""
        return self.periodic_timeout and self.may_expire(longest_ms)

    def may_send_back_twice(self, longest_ms: float) -> bool:
        """Whether a 4.9 client may send a delivery back twice: its timeout can expire before
        a processing time up to ``longest_ms`` ends (docs/model.md §6, the late send-back)."""
        return self.late_send_back and self.may_expire(longest_ms)

    def cleaner_may_fill(self, longest_ms: float) -> bool:
        """Whether a run of the 4.x periodic check may find more than CLEANER_MESSAGES of a
        process queue expired (:meth:`cleaner_may_send_back`, with more threads an instance
        or an unlimited pool): it sends back the first ones in the order they started, which
        only the event-by-event engine knows."""
        threads = self.topology.threads
        return self.cleaner_may_send_back(longest_ms) and (
            threads is None or threads * self.batch_size > limits.CLEANER_MESSAGES
        )

    @property
    def falls_back(self) -> bool:
        """Whether a send-back can take the producer fallback (docs/flavors.md)."""
        return self.resend_levels is not None and self.retry_path == SCHEDULE

    @property
    def dead_letters_late(self) -> bool:
        """Whether an exhausted message is re-sent and dead-lettered out of the schedule
        topic (4.x orderly on a 4.9.7 broker, docs/flavors.md)."""
        return self.resend_levels is not None and self.retry_path == LOCAL

    @property
    def pop_invisible_ms(self) -> int | None:
        """A 5.x pop's invisible time, when every delivery writes a checkpoint and an ack to
        the commit log (unordered revive-path groups; a FIFO pop keeps its state out of the
        commit log): the proxy's receive invisibility for an open-source push consumer, else
        its consume timeout, or ``invisible_duration`` (docs/flavors.md, 5.x pop writes)."""
        if self.retry_path != REVIVE or self.blocking:
            return None
        return self.receive_invisible_ms or self.timeout_ms

    @property
    def timeout_sent_back_unread(self) -> bool:
        """Whether a timeout is sent back to a retry topic nobody reads (4.x broadcasting)."""
        return self.retry_path == NO_RETRY and self.timeout_level is not None

    def eligible_ms(self, ready_ms: int) -> int:
        """When a Ready delivery can start: after the ready wait, at the next pull tick."""
        due = ready_ms + self.ready_wait_ms
        pull = self.pull_interval_ms
        return due if pull <= 0 else -(-due // pull) * pull

    def with_consume_result(self, df: DataFrame) -> DataFrame:
        """Add ``outcome`` and ``end_ms`` (the column twin of ``event_rules._consume_result``)."""
        return df.withColumns(self.consume_result_columns())

    def consume_result_columns(self) -> dict[str, Column]:
        """The columns :meth:`with_consume_result` adds, as expressions."""
        start, processing = F.col("start_ms"), F.col("processing_ms")
        if self.timeout_ms is None:
            return {"outcome": F.col("listener_outcome"), "end_ms": start + processing}
        timeout = F.lit(self.timeout_ms).cast("long")
        if self.periodic_timeout and self.timeout_ms:
            leave = (F.floor((start + timeout) / timeout).cast("long") + F.lit(1)) * timeout
        else:
            leave = start + timeout
        timed_out = start + processing > leave
        if self.invisible_until_retry:  # a copy not acked in time stays invisible until revived
            revived = leave + F.lit(self.revive_lag_ms)
            failed = F.col("listener_outcome") != F.lit(CONSUME_SUCCESS)
            end = F.when(timed_out | failed, revived)
        else:
            end = F.when(timed_out, leave)
        return {
            "outcome": F.when(timed_out, F.lit(TIMEOUT)).otherwise(F.col("listener_outcome")),
            "end_ms": end.otherwise(start + processing),
        }

    def with_next_step(self, df: DataFrame) -> DataFrame:
        """Add the :class:`Step` columns (the column twin of ``event_rules._next_step``)."""
        cases, steps = self.next_step_columns()
        return df.withColumns(cases).withColumns(steps).drop(*cases)

    def next_step_columns(self) -> tuple[dict[str, Column], dict[str, Column]]:
        """What :meth:`with_next_step` adds, as two projections of expressions: the helper
        columns of the first are dropped after the second.

        The first computes which of six cases applies (commit, dropped, resubmitted
        locally, leaving now, leaving after the backoff, retried) and the retry's level and
        due time; each output column then picks its value for that case, so no condition is
        written, or evaluated, twice.
        """
        rt, outcome = F.col("reconsume_times"), F.col("outcome")
        broker_rt = F.col("broker_reconsume_times")
        timed_out = outcome == F.lit(TIMEOUT)
        send_back = F.col("send_back")
        retry = broker_rt + F.lit(1)
        interval = _table_lookup(self.intervals_ms, retry)
        level = _table_lookup(self.levels, retry) if self.levels else F.lit(None).cast("int")
        if self.timeout_interval_ms is not None:
            interval = F.when(timed_out, F.lit(self.timeout_interval_ms)).otherwise(interval)
            level = F.when(timed_out, F.lit(self.timeout_level)).otherwise(level)
        exhausted = broker_rt >= F.lit(self.max_retries)
        fallback = F.lit(False)
        if self.falls_back:
            fallback = (send_back == F.lit(SEND_BACK_FALLBACK)) & ~timed_out
            exhausted = F.when(fallback, rt + F.lit(1) >= F.lit(self.max_retries)).otherwise(
                exhausted
            )
        resent = fallback | (exhausted if self.dead_letters_late else F.lit(False))
        if self.resend_levels is not None:
            local = rt + F.lit(1)
            interval = F.when(resent, _table_lookup(self.resend_intervals_ms, local)).otherwise(
                interval
            )
            level = F.when(resent, _table_lookup(self.resend_levels, local)).otherwise(level)
        origin = F.col("start_ms" if self.from_start else "end_ms")
        nulled = F.lit(self.null_dead_letters) & (outcome == F.lit(NULL_RETURN))
        negative = (F.lit(self.dlq_now) | nulled) & ~timed_out & ~fallback
        gone_now = exhausted & F.lit(not self.leave_after_backoff) & ~resent
        dropped = F.lit(self.retry_path == NO_RETRY)
        sent_back_unread = dropped & timed_out & F.lit(self.timeout_sent_back_unread)
        case = (
            F.when(outcome == F.lit(CONSUME_SUCCESS), F.lit(_OK))
            .when(sent_back_unread, F.lit(_LATER))
            .when(dropped, F.lit(_DROPPED))
            .when((send_back == F.lit(SEND_BACK_FAILED)) & ~timed_out, F.lit(_RESUBMIT))
            .when(negative | gone_now, F.lit(_GONE))
            .when(exhausted, F.lit(_LATER))
            .otherwise(F.lit(_RETRIED))
        )
        cases = {
            "_case": case,
            "_level": level.cast("int"),
            "_due": (origin + interval + F.lit(self.revive_lag_ms)).cast("long"),
            "_leave_reason": F.when(exhausted, F.lit(REASON_MAX_RECONSUME))
            .when(nulled, F.lit(REASON_NULL_RESULT))
            .otherwise(F.lit(REASON_NEGATIVE_LEVEL)),
        }
        if self.resend_levels is not None:
            cases["_resent"] = resent
        return cases, self._step_columns()

    def _step_columns(self) -> dict[str, Column]:
        here_topic, here_queue = F.col("source_topic"), F.col("queue_id")
        end, due, level = F.col("end_ms"), F.col("_due"), F.col("_level")
        state = F.lit(DLQ if self.dlq_enabled else DISCARD)
        leave_topic = F.lit(self.dlq_topic) if self.dlq_enabled else here_topic
        leave_queue = F.lit(limits.DLQ_QUEUE_ID) if self.dlq_enabled else here_queue
        leave_reason = F.col("_leave_reason")
        wait_topic, wait_queue, back_topic, back_queue = self._wait_and_back(level)
        null_int, null_long, null_str = (F.lit(None).cast(t) for t in ("int", "long", "string"))
        wr, commit, discard = F.lit(WAITING_RETRY), F.lit(COMMIT), F.lit(DISCARD)
        back_reason = F.lit(_READY_REASON.get(self.retry_path, READY_LOCAL))

        def pick(*by_case: Column) -> Column:
            """The value for the row's case (order: ok, dropped, resubmit, gone, later, retried).

            A CASE over the case number, cases with the same value merged into one branch and
            null the default: picking from an array would build that array for every row and
            column, which made this step the costliest of the round.
            """
            branches: dict[str, tuple[list[int], Column]] = {}
            for number, value in enumerate(by_case):
                branches.setdefault(str(value), ([], value))[0].append(number)
            case = F.col("_case")
            result: Column | None = None
            for numbers, value in branches.values():
                if any(value is null for null in (null_int, null_long, null_str)):
                    continue
                condition = case == F.lit(numbers[0]) if len(numbers) == 1 else case.isin(*numbers)
                result = (
                    F.when(condition, value) if result is None else result.when(condition, value)
                )
            return result if result is not None else by_case[0]

        resubmit_due = end + F.lit(limits.SEND_BACK_RESUBMIT_MS)
        # leaving later: where the message waits before it leaves (after backoff: where it
        # was; re-sent by a 4.x client: the schedule topic), why, and where it goes
        later_level, later_topic, later_queue = null_int, here_topic, here_queue
        later = (state, leave_topic, leave_queue, leave_reason)
        why_wait = F.col("outcome")
        schedule_queue = (level - F.lit(1)).cast("int")
        if self.resend_levels is not None:
            resent = F.col("_resent")
            later_level = F.when(resent, level)
            later_topic = F.when(resent, F.lit(limits.SCHEDULE_TOPIC)).otherwise(here_topic)
            later_queue = F.when(resent, schedule_queue).otherwise(here_queue)
            if self.falls_back:  # re-sent by the fallback, not by the exhausted-path send
                why_wait = F.when(resent, F.lit(REASON_SEND_BACK_FALLBACK)).otherwise(why_wait)
        if self.timeout_sent_back_unread:
            later_level, later_topic, later_queue = (
                level,
                F.lit(limits.SCHEDULE_TOPIC),
                schedule_queue,
            )
            later = (
                discard,
                F.lit(self.topology.retry_topic),
                self.topology.retry_queue_col(),
                F.lit(REASON_BROADCAST),
            )
        later_state, later_leave_topic, later_leave_queue, later_leave_reason = later
        # a retried delivery waits in WaitingRetry, or (5.x simple) stays Inflight
        retried = (wr, wr, wait_topic, wait_queue, why_wait)
        if self.invisible_until_retry:
            retried = (F.lit(INFLIGHT), null_str, null_str, null_int, null_str)
        retried_state, retried_end, retried_topic, retried_queue, retried_why = retried
        return {
            "result_state": pick(commit, discard, wr, state, later_state, retried_state),
            "delay_level": pick(null_int, null_int, null_int, null_int, later_level, level),
            "next_ready_ms": pick(null_long, null_long, resubmit_due, null_long, null_long, due),
            "settled_ms": pick(end, end, null_long, end, due, null_long),
            "end_state": pick(commit, discard, wr, state, wr, retried_end),
            "end_topic": pick(
                here_topic, here_topic, here_topic, leave_topic, later_topic, retried_topic
            ),
            "end_queue_id": pick(
                here_queue, here_queue, here_queue, leave_queue, later_queue, retried_queue
            ),
            "end_reason": pick(
                F.lit(CONSUME_SUCCESS),
                F.lit(REASON_BROADCAST),
                F.lit(REASON_SEND_BACK_FAILED),
                leave_reason,
                why_wait,
                retried_why,
            ),
            "leave_state": pick(null_str, null_str, null_str, null_str, later_state, null_str),
            "leave_topic": pick(
                null_str, null_str, null_str, null_str, later_leave_topic, null_str
            ),
            "leave_queue_id": pick(
                null_int, null_int, null_int, null_int, later_leave_queue, null_int
            ),
            "leave_reason": pick(
                null_str, null_str, null_str, null_str, later_leave_reason, null_str
            ),
            "next_topic": pick(null_str, null_str, here_topic, null_str, null_str, back_topic),
            "next_queue_id": pick(null_int, null_int, here_queue, null_int, null_int, back_queue),
            "next_reason": pick(
                null_str, null_str, F.lit(READY_LOCAL), null_str, null_str, back_reason
            ),
        }

    def _wait_and_back(self, level: Column) -> tuple[Column, Column, Column, Column]:
        here_topic, here_queue = F.col("source_topic"), F.col("queue_id")
        if self.retry_path == SCHEDULE:
            return (
                F.lit(limits.SCHEDULE_TOPIC),
                (level - F.lit(1)).cast("int"),
                F.lit(self.retry_topic),
                self.topology.retry_queue_col(),
            )
        if self.retry_path == REVIVE:
            return here_topic, here_queue, F.lit(self.retry_topic), F.lit(limits.RETRY_QUEUE_ID)
        return here_topic, here_queue, here_topic, here_queue

    def eligible_col(self, ready: Column) -> Column:
        """The column twin of :meth:`eligible_ms`."""
        due = ready + F.lit(self.ready_wait_ms)
        if self.pull_interval_ms <= 0:
            return due
        pull = F.lit(self.pull_interval_ms)
        return (F.ceil(due / pull) * pull).cast("long")


def next_reconsume_columns(
    rt: Column, broker_rt: Column, end_reason: Column
) -> tuple[Column, Column]:
    """(reconsume_times, broker_reconsume_times) of the delivery a retry leads to.

    The broker stores a send-back's copy with the *stored* copy's count + 1
    (``consumerSendMsgBack``), and the client reads it from there; a local resubmit after a
    failed send-back counts on the client only, and the producer fallback stores the
    client's count + 1. Every other retry counts one on both sides. (The event loop's twin:
    ``event_loop._next_delivery``.)
    """
    one = F.lit(1)
    local = end_reason.isin(REASON_SEND_BACK_FAILED, REASON_SEND_BACK_FALLBACK)
    counted = F.when(local, rt + one).otherwise(broker_rt + one)
    kept = F.when(end_reason == F.lit(REASON_SEND_BACK_FAILED), broker_rt).otherwise(counted)
    return counted.cast("int"), kept.cast("int")


def _table_lookup(table: tuple[int, ...], retry: Column) -> Column:
    values = F.array(*[F.lit(v) for v in table])
    return F.element_at(values, F.least(retry, F.lit(len(table))).cast("int"))


def policy_for(group: Group, delay_table_ms: tuple[int, ...]) -> Policy:
    """The :class:`Policy` of a validated group (docs/flavors.md, row by row)."""
    fields = group.flavor_record.rules(group, delay_table_ms)
    return Policy(
        flavor=group.flavor,
        group=group.name,
        topic=group.source_topic,
        blocking=group.blocking,
        # the 4.x client's cleaner (its flavors' default); every other flavor checks exactly
        periodic_timeout=group.consume_timeout_check == "periodic"
        and "consume_timeout_check" in group.flavor_record.reads,
        late_send_back=group.client_version == "4.9"
        and "client_version" in group.flavor_record.reads,
        dlq_enabled=group.dlq_enabled,
        batch_size=group.consume_message_batch_max_size,
        ack_index=group.ack_index,
        pull_interval_ms=group.pull_interval,
        ready_wait_ms=group.behavior.ready_wait,
        replay=group.replay,
        topology=topology_of(group, fields["retry_path"]),
        **fields,
    )


def topology_of(group: Group, retry_path: str) -> Topology:
    """How ``group``'s deliveries spread over its instances (:mod:`retrysim.model.topology`)."""
    consumers = group.consumers
    balancing = group.flavor_record.balancing
    # 4.x send-backs go to the retry queues of the broker that stored the message (for
    # broadcasting, only an expired message's, which nobody reads)
    by_broker = (balancing == BY_QUEUE and retry_path == SCHEDULE) or balancing == BROADCAST
    return Topology(
        balancing=balancing,
        # an unlimited pool is one instance that never fills
        instances=1 if consumers.unlimited else consumers.instances,
        threads=None if consumers.unlimited else consumers.threads,
        queues=group.workload.queues,
        brokers=group.brokers,
        retry_queue_nums=group.retry_queue_nums,
        allocate=group.allocate,
        retry_topic=limits.RETRY_TOPIC_PREFIX + group.name if by_broker else None,
    )
