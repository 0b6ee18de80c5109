"""State transitions derived from attempts: three per delivery, so none are stored twice.

Each delivery is Ready (published, or due on the retry topic), then Inflight, then one end
state (Commit, WaitingRetry, DLQ or Discard), unless the horizon cut it while Inflight.
``seq`` numbers a message's transitions across deliveries: 3·(delivery−1) + 1, 2, 3.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from retrysim.policy import INFLIGHT, READY
from retrysim.tables import TRANSITIONS, data_schema, select_schema

TRANSITIONS_PER_DELIVERY = 3
REASON_PUBLISHED, REASON_RETRY_DUE, REASON_DELIVERED = "published", "retry_due", "delivered"


def _transition(
    offset: int,
    state: Column,
    at_ms: Column,
    topic: Column,
    queue_id: Column,
    delay_level: Column,
    reason: Column,
) -> Column:
    seq = (F.col("delivery") - F.lit(1)) * F.lit(TRANSITIONS_PER_DELIVERY) + F.lit(offset)
    return F.struct(
        seq.cast("int").alias("seq"),
        state.alias("state"),
        at_ms.cast("long").alias("at_ms"),
        topic.alias("topic"),
        queue_id.cast("int").alias("queue_id"),
        delay_level.cast("int").alias("delay_level"),
        reason.alias("reason"),
    )


def transitions_from_attempts(attempts: DataFrame) -> DataFrame:
    """Explode staged attempts (with ``to_topic``, ``to_queue_id``, ``reason``) into
    transition rows in the ``transitions`` table's shape (no run_id)."""
    null_int = F.lit(None).cast("int")
    source_topic, queue_id = F.col("source_topic"), F.col("queue_id")
    ready = _transition(
        1,
        F.lit(READY),
        F.col("ready_ms"),
        source_topic,
        queue_id,
        null_int,
        F.when(F.col("delivery") == 1, F.lit(REASON_PUBLISHED)).otherwise(F.lit(REASON_RETRY_DUE)),
    )
    inflight = _transition(
        2, F.lit(INFLIGHT), F.col("start_ms"), source_topic, queue_id, null_int,
        F.lit(REASON_DELIVERED),
    )  # fmt: skip
    end = F.when(
        F.col("result_state") != F.lit(INFLIGHT),
        _transition(
            3,
            F.col("result_state"),
            F.col("end_ms"),
            F.col("to_topic"),
            F.col("to_queue_id"),
            F.col("delay_level"),
            F.col("reason"),
        ),
    )
    exploded = attempts.select(
        "group", "msg_id", "delivery", F.explode(F.array(ready, inflight, end)).alias("t")
    ).where(F.col("t").isNotNull())
    return select_schema(
        exploded.select("group", "msg_id", "delivery", "t.*"), data_schema(TRANSITIONS)
    )
