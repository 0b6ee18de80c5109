"""The ``dead_letters`` table: one row per move to the DLQ, with the replay that re-sent it."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from retrysim.model.states import (
    DLQ,
    READY_REPLAYED,
)
from retrysim.scenario.spec import Scenario
from retrysim.tables.groups import literal_map
from retrysim.tables.schemas import (
    DEAD_LETTERS,
    data_schema,
    select_schema,
)


def dead_letters_from_attempts(attempts: DataFrame, scenario: Scenario) -> DataFrame:
    """One row per move to the DLQ, with the replay that re-sent it, if any."""
    origin = literal_map({g.name: g.source_topic for g in scenario.groups})
    replays = attempts.where(F.col("ready_reason") == F.lit(READY_REPLAYED)).select(
        "group", "msg_id", (F.col("delivery") - 1).alias("delivery"),
        F.col("ready_ms").alias("replayed_at_ms"),
    )  # fmt: skip
    dead = attempts.where(F.col("result_state") == F.lit(DLQ)).select(
        "group",
        "msg_id",
        "delivery",
        F.coalesce(F.col("leave_topic"), F.col("end_topic")).alias("dlq_topic"),
        F.col("settled_ms").alias("dlq_at_ms"),
        F.col("delivery").alias("deliveries"),
        origin[F.col("group")].alias("origin_topic"),
    )
    return select_schema(
        dead.join(replays, ["group", "msg_id", "delivery"], "left"), data_schema(DEAD_LETTERS)
    )
