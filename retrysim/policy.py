"""Retry policies: "what delay, and is this the end?" answered as Spark column expressions.

A consumer flavor is an object (data plus small pure functions), so a new flavor is a new
class, not a new ``if`` in the engine. Each policy adds to a round's attempts:

* ``with_consume_result``: ``outcome`` and ``end_ms`` from the listener's draws and the
  flavor's consume-timeout rule;
* ``with_next_step``: ``result_state``, ``delay_level``, ``next_ready_ms``, ``reason`` and the
  topic and queue the message goes to (``to_topic``, ``to_queue_id``).

Rules and their place in the Apache RocketMQ source are in ROCKETMQ_SEMANTICS.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from retrysim import limits
from retrysim.behavior import CONSUME_SUCCESS, TIMEOUT
from retrysim.config import Group

COMMIT, WAITING_RETRY, DLQ, DISCARD, INFLIGHT, READY = (
    "Commit",
    "WaitingRetry",
    "DLQ",
    "Discard",
    "Inflight",
    "Ready",
)
REASON_MAX_RECONSUME = "max_reconsume_times"
REASON_NEGATIVE_LEVEL = "delay_level_negative"


def delay_for_level(delay_table_ms: tuple[int, ...], level: Column) -> Column:
    """The delay of a 1-based level; a level past the table's end is clamped to its last level,
    as the broker does (HookUtils.handleScheduleMessage)."""
    table = F.array(*[F.lit(ms).cast("long") for ms in delay_table_ms])
    return F.element_at(table, F.least(level, F.lit(len(delay_table_ms))))


@dataclass(frozen=True)
class Concurrently4:
    """``rocketmq4.concurrently``: broker-side retry through SCHEDULE_TOPIC_XXXX.

    * A failed delivery with ``reconsumeTimes = rt`` asks for level ``3 + rt``
      (``delayLevelWhenNextConsume`` 0), a fixed level ``n > 0``, or ``-1`` for the DLQ now.
    * The broker sends it to ``%DLQ%group`` when ``rt >= maxReconsumeTimes`` or the level is
      negative (AbstractSendMessageProcessor.consumerSendMsgBack), at the failed delivery.
    * Otherwise it waits ``delay(min(level, levels))`` in schedule queue ``level - 1`` and
      becomes Ready on ``%RETRY%group`` with ``rt + 1``.
    * Consume timeout: the 4.x client never interrupts the listener; ProcessQueue's cleaner
      sends an expired message back at fixed level 3. ``exact`` places that at
      ``start + consumeTimeout``; ``periodic`` at the cleaner's next run (it runs every
      ``consumeTimeout``, from consumer start), which is what a real client does. The thread
      stays busy until the listener returns, which only matters once capacity is finite.
    * ``dlq_enabled: false`` (not a 4.x switch; kept for symmetry with 5.x) discards instead.
    """

    group: str
    topic: str
    delay_table_ms: tuple[int, ...]
    max_reconsume_times: int
    delay_level_when_next_consume: int
    consume_timeout_ms: int
    timeout_check: str
    dlq_enabled: bool

    @classmethod
    def from_config(cls, group: Group, delay_table_ms: tuple[int, ...]) -> Concurrently4:
        max_times = group.max_reconsume_times
        return cls(
            group=group.name,
            topic=group.source_topic,
            delay_table_ms=delay_table_ms,
            max_reconsume_times=(
                limits.DEFAULT_MAX_RECONSUME_TIMES_CONCURRENT if max_times == -1 else max_times
            ),
            delay_level_when_next_consume=group.delay_level_when_next_consume,
            consume_timeout_ms=group.consume_timeout,
            timeout_check=group.consume_timeout_check,
            dlq_enabled=group.dlq_enabled,
        )

    @property
    def retry_topic(self) -> str:
        return limits.RETRY_TOPIC_PREFIX + self.group

    @property
    def dlq_topic(self) -> str:
        return limits.DLQ_TOPIC_PREFIX + self.group

    def timeout_leave_ms(self, start: Column) -> Column:
        """When an expired delivery is sent back, if the listener is still running then."""
        timeout = F.lit(self.consume_timeout_ms).cast("long")
        if self.timeout_check == "exact":
            return start + timeout
        # The first cleaner run (at T, 2T, ...) strictly later than start + T.
        return (F.floor((start + timeout) / timeout).cast("long") + F.lit(1)) * timeout

    def with_consume_result(self, df: DataFrame) -> DataFrame:
        start, processing = F.col("start_ms"), F.col("processing_ms")
        leave = self.timeout_leave_ms(start)
        timed_out = start + processing > leave
        return df.withColumn(
            "outcome", F.when(timed_out, F.lit(TIMEOUT)).otherwise(F.col("listener_outcome"))
        ).withColumn("end_ms", F.when(timed_out, leave).otherwise(start + processing))

    def with_next_step(self, df: DataFrame) -> DataFrame:
        rt, outcome, end = F.col("reconsume_times"), F.col("outcome"), F.col("end_ms")
        if self.delay_level_when_next_consume == 0:
            asked = rt + F.lit(limits.BROKER_FIRST_RETRY_LEVEL)
        else:
            asked = F.lit(self.delay_level_when_next_consume)
        requested = F.when(outcome == F.lit(TIMEOUT), F.lit(limits.TIMEOUT_SEND_BACK_LEVEL))
        requested = requested.otherwise(asked)
        level = F.least(requested, F.lit(len(self.delay_table_ms)))
        success = outcome == F.lit(CONSUME_SUCCESS)
        exhausted = rt >= F.lit(self.max_reconsume_times)
        leaves = exhausted | (requested < F.lit(0))
        end_state = F.lit(DLQ if self.dlq_enabled else DISCARD)

        def pick(on_success: Column, on_leave: Column, on_retry: Column) -> Column:
            return F.when(success, on_success).when(leaves, on_leave).otherwise(on_retry)

        null_int, null_long = F.lit(None).cast("int"), F.lit(None).cast("long")
        source_queue = F.col("queue_id")
        leave_topic = F.lit(self.dlq_topic) if self.dlq_enabled else F.col("source_topic")
        leave_queue = F.lit(limits.DLQ_QUEUE_ID) if self.dlq_enabled else source_queue
        return (
            df.withColumn("result_state", pick(F.lit(COMMIT), end_state, F.lit(WAITING_RETRY)))
            .withColumn("delay_level", pick(null_int, null_int, level.cast("int")))
            .withColumn(
                "next_ready_ms",
                pick(null_long, null_long, end + delay_for_level(self.delay_table_ms, level)),
            )
            .withColumn(
                "reason",
                pick(
                    F.lit(CONSUME_SUCCESS),
                    F.when(exhausted, F.lit(REASON_MAX_RECONSUME)).otherwise(
                        F.lit(REASON_NEGATIVE_LEVEL)
                    ),
                    outcome,
                ),
            )
            .withColumn(
                "to_topic",
                pick(F.col("source_topic"), leave_topic, F.lit(limits.SCHEDULE_TOPIC)),
            )
            .withColumn(
                "to_queue_id", pick(source_queue, leave_queue, (level - F.lit(1)).cast("int"))
            )
            .withColumn("next_source_topic", F.lit(self.retry_topic))
            .withColumn("next_queue_id", F.lit(limits.RETRY_QUEUE_ID))
        )


POLICIES = {"rocketmq4.concurrently": Concurrently4}


def policy_for(group: Group, delay_table_ms: tuple[int, ...]) -> Concurrently4:
    """The policy object of a group's flavor (validated in config, so the lookup succeeds)."""
    return POLICIES[group.flavor].from_config(group, delay_table_ms)
