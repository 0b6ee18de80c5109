"""The ``dead_letters`` table: one row per move to the DLQ, with the replay that re-sent it."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from retrysim.model.states import (
    DLQ,
    READY_REPLAYED,
)
from retrysim.scenario.spec import Scenario
from retrysim.tables.group_sums import GroupSums
from retrysim.tables.groups import literal_map
from retrysim.tables.schemas import (
    DEAD_LETTERS,
    data_schema,
    local_rows,
    select_schema,
)
from retrysim.tables.transitions import parent_of


def dead_letters_from_attempts(
    attempts: DataFrame, scenario: Scenario, known: dict[str, GroupSums] | None = None
) -> DataFrame:
    """One row per move to the DLQ, with the replay that re-sent it, if any. The groups in
    ``known`` that moved nothing to the DLQ are not read (none at all: no scan)."""
    quiet = sorted(name for name, sums in (known or {}).items() if not sums.dead_letters)
    if quiet:
        if not {group.name for group in scenario.groups} - set(quiet):
            return local_rows(attempts.sparkSession, [], data_schema(DEAD_LETTERS))
        attempts = attempts.where(~F.col("group").isin(*quiet))
    origin = literal_map({g.name: g.source_topic for g in scenario.groups})
    replays = attempts.where(F.col("ready_reason") == F.lit(READY_REPLAYED)).select(
        "group", "msg_id", parent_of(F.col("delivery"), F.col("parent_delivery")).alias("delivery"),
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
    # a 4.9 client's second copy sent to the DLQ: a dead letter of its own, never replayed
    copies = attempts.where(F.col("copy_state") == F.lit(DLQ)).select(
        "group",
        "msg_id",
        F.lit(None).cast("int").alias("delivery"),
        F.col("copy_topic").alias("dlq_topic"),
        F.col("copy_ms").alias("dlq_at_ms"),
        F.col("delivery").alias("deliveries"),
        origin[F.col("group")].alias("origin_topic"),
    )
    dead = dead.unionByName(copies)
    return select_schema(
        dead.join(replays, ["group", "msg_id", "delivery"], "left"), data_schema(DEAD_LETTERS)
    )
