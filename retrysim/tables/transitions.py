"""State transitions derived from staged attempts, so no state change is stored twice.

Each delivery is Ready (published, due again, or replayed), then Inflight when it starts, then
one end state (Commit, WaitingRetry, DLQ or Discard) when it settles, and, for flavors that
move a message to the DLQ one backoff after its last failure, the DLQ or Discard that
follows that WaitingRetry (docs/model.md §9). The fourth step is also where a 4.9 client's
second send-back of a delivery the cleaner sent back enters its copy's state (a timed-out
delivery has no leave). ``seq = 4 * (delivery - 1) + k``.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from retrysim.model.states import (
    DISCARD,
    INFLIGHT,
    READY,
    REASON_BROADCAST,
    REASON_LATE_SEND_BACK,
    WAITING_RETRY,
)
from retrysim.tables.schemas import PARTITION_COLUMN, TRANSITIONS, data_schema, select_schema

SEQ_PER_DELIVERY = 4
REASON_DELIVERED = "delivered"


def _transition(
    offset: int,
    state: Column,
    at_ms: Column,
    topic: Column,
    queue_id: Column,
    delay_level: Column,
    reason: Column,
) -> dict[str, Column]:
    seq = (F.col("delivery") - F.lit(1)) * F.lit(SEQ_PER_DELIVERY) + F.lit(offset)
    return {
        "seq": seq.cast("int"),
        "state": state,
        "at_ms": at_ms.cast("long"),
        "topic": topic,
        "queue_id": queue_id.cast("int"),
        "delay_level": delay_level.cast("int"),
        "reason": reason,
    }


def parent_of(delivery: Column, parent_delivery: Column) -> Column:
    """The delivery a delivery follows (0: its message): ``parent_delivery`` where the row
    names one (a message sent back twice numbers its deliveries as they start), else the one
    before."""
    return F.coalesce(parent_delivery, delivery - F.lit(1))


def lands_unread(state: Column, reason: Column) -> Column:
    """A leave that is a commit-log write though nobody reads it: a 4.x broadcasting
    consumer's expired message, sent back into ``%RETRY%<group>`` (docs/flavors.md), the one
    Discard after WaitingRetry with reason ``broadcast_no_retry``. Every other Discard writes
    nothing."""
    return (state == F.lit(DISCARD)) & (reason == F.lit(REASON_BROADCAST))


def step_columns() -> list[tuple[Column, dict[str, Column]]]:
    """An attempt row's four steps k = 1..4 (Ready, Inflight, the end state, the leave after
    WaitingRetry): per step, whether the delivery has it and the transition's columns. The
    one derivation of transitions: :func:`transition_steps` makes rows of it, and the
    invariant check (retrysim.checks.invariants) reads the columns as they are, per attempt."""
    null_int = F.lit(None).cast("int")
    here = (F.col("source_topic"), F.col("queue_id"))
    ready = _transition(1, F.lit(READY), F.col("ready_ms"), *here, null_int, F.col("ready_reason"))
    inflight = _transition(
        2, F.lit(INFLIGHT), F.col("start_ms"), *here, null_int, F.lit(REASON_DELIVERED)
    )
    end = _transition(
        3,
        F.col("end_state"),
        F.col("end_ms"),
        F.col("end_topic"),
        F.col("end_queue_id"),
        F.when(F.col("end_state") == F.lit(WAITING_RETRY), F.col("delay_level")),
        F.col("end_reason"),
    )
    left = F.col("leave_state").isNotNull()
    leave = _transition(
        4,
        F.coalesce(F.col("leave_state"), F.col("copy_state")),
        F.when(left, F.col("settled_ms")).otherwise(F.col("copy_ms")),
        F.when(left, F.col("leave_topic")).otherwise(F.col("copy_topic")),
        F.when(left, F.col("leave_queue_id")).otherwise(F.col("copy_queue_id")),
        F.when(~left, F.col("copy_delay_level")),
        F.when(left, F.col("leave_reason")).otherwise(F.lit(REASON_LATE_SEND_BACK)),
    )
    return [
        (F.lit(True), ready),
        (F.col("start_ms").isNotNull(), inflight),
        (F.col("end_state").isNotNull(), end),
        (left | F.col("copy_state").isNotNull(), leave),
    ]


def transition_steps() -> Column:
    """An attempt row's transitions as an array of its four steps (null where the delivery
    has no such step), for :func:`transitions_from_attempts` to explode."""
    return F.array(
        *[
            F.when(present, F.struct(*[value.alias(name) for name, value in fields.items()]))
            for present, fields in step_columns()
        ]
    )


def transitions_from_attempts(attempts: DataFrame) -> DataFrame:
    """Explode attempts into transition rows: staged attempts give the ``transitions`` table's
    data columns; rows of the ``attempts`` table (with ``run_id``) give the table's rows, which
    is how a lean run's transitions are read (``Result.transitions``, ``register_views``)."""
    keep_run = PARTITION_COLUMN in attempts.columns
    keys = [PARTITION_COLUMN] if keep_run else []
    exploded = attempts.select(
        *keys,
        "group",
        "msg_id",
        "delivery",
        F.explode(transition_steps()).alias("t"),
    ).where(F.col("t").isNotNull())
    schema = TRANSITIONS if keep_run else data_schema(TRANSITIONS)
    return select_schema(exploded.select(*keys, "group", "msg_id", "delivery", "t.*"), schema)
