"""The groups as a small frame: what the load and summary tables join their counts to."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType

from retrysim.model.policy import policy_for
from retrysim.model.topology import BROADCAST
from retrysim.scenario.spec import Scenario
from retrysim.tables.schemas import (
    literal_rows,
    nullable_schema,
)


def literal_map(values: dict[str, object]) -> Column:
    return F.create_map(*[x for key, value in values.items() for x in (F.lit(key), F.lit(value))])


GROUPS = nullable_schema(
    ("group", StringType()),
    ("origin_topic", StringType()),
    ("messages", LongType()),
    ("size_bytes", LongType()),
    ("pool", LongType()),
    ("levels", IntegerType()),
    ("threads", LongType()),
    ("assignable_instances", IntegerType()),
)


def group_rows(scenario: Scenario) -> list[tuple]:
    """One row per group in :data:`GROUPS`' columns: message count, size, source topic, the
    threads its tables count (``pool``: every instance's; a broadcasting group's tables
    follow one instance), delay levels, threads per instance and how many instances can get
    work."""
    table = scenario.broker.message_delay_level
    rows = []
    for g in scenario.groups:
        topology = policy_for(g, table).topology
        one = topology.balancing == BROADCAST
        rows.append(
            (
                g.name,
                g.source_topic,
                g.workload.messages,
                g.workload.size_bytes,
                topology.threads if one else g.consumers.pool_size,
                len(table) if g.flavor_record.uses_delay_table else 0,
                topology.threads,
                topology.assignable_instances,
            )
        )
    return rows


def groups_df(spark: SparkSession, scenario: Scenario) -> DataFrame:
    """:func:`group_rows` as a small frame."""
    return literal_rows(spark, group_rows(scenario), GROUPS)
