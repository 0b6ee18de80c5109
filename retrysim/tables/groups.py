"""The groups as a small frame: what the load and summary tables join their counts to."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType

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
)


def groups_df(spark: SparkSession, scenario: Scenario) -> DataFrame:
    """One row per group: message count, size, source topic, pool size, delay levels."""
    rows = [
        (
            g.name,
            g.source_topic,
            g.workload.messages,
            g.workload.size_bytes,
            g.consumers.pool_size,
            len(scenario.broker.message_delay_level) if g.flavor_record.uses_delay_table else 0,
        )
        for g in scenario.groups
    ]
    return literal_rows(spark, rows, GROUPS)
