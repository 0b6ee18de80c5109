"""A run whose groups were each summed up whole in a task stages its small tables on the
driver (retrysim.tables.summed_tables): they must be the Spark passes' tables over the same
attempts, exactly, row for row and bit for bit."""

from __future__ import annotations

import pandas as pd
import pytest
from chispa import assert_df_equality
from support import BUSY_GROUP, simulated_with_sums

from retrysim.tables.instances import instance_load_from
from retrysim.tables.load import load_from_attempts, retries_by_level
from retrysim.tables.schemas import INSTANCE_LOAD, LOAD, SUMMARY, data_schema, local_rows
from retrysim.tables.summary import summary_from
from retrysim.tables.summed_tables import small_tables

SCENARIO = {
    "name": "summed", "seed": 11, "horizon": "100s", "load_bucket": "10s",
    "broker": {"message_delay_level": "1s 5s 10s 30s 1m"},
    "groups": [
        BUSY_GROUP,  # each of its three instances' own rows
        {   # more instances than queues: one idles
            "name": "idle", "flavor": "rocketmq4.concurrently",
            "consumers": {"instances": 3, "threads": 4},
            "workload": {"messages": 800, "over": "60s", "queues": 2},
            "behavior": {"fail_probability": 0.3, "processing_time": "200ms"},
        },
        {   # every instance gets every message; a failure is discarded
            "name": "broadcast", "flavor": "rocketmq4.broadcasting",
            "consumers": {"instances": 2, "threads": 1},
            "workload": {"messages": 300, "over": "30s", "queues": 2},
            "behavior": {"fail_probability": 0.2, "processing_time": "150ms"},
        },
        {   # the event-by-event loop in Python: poison dead-lettered, then replayed
            "name": "replayed", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 1,
            "consumers": {"instances": 1, "threads": 2},
            "workload": {"messages": 200, "over": "10s", "queues": 2},
            "behavior": {"poison_fraction": 0.2, "processing_time": "50ms"},
            "replay": {"at": "40s", "rate": "10/s", "poison_fixed": True},
        },
        {   # 5.x: one instance, its own pool; no delay table
            "name": "popped", "flavor": "rocketmq5.simple", "invisible_duration": "10s",
            "consumers": {"instances": 1, "threads": 2},
            "workload": {"messages": 600, "over": "30s", "queues": 2},
            "behavior": {"fail_probability": 0.3, "processing_time": "100ms"},
        },
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def simulated(spark, tmp_path_factory):
    return simulated_with_sums(spark, tmp_path_factory.mktemp("summed"), SCENARIO)


def _frame(spark, rows: list[dict], schema):
    columns = data_schema(schema)
    return local_rows(spark, [tuple(r[c] for c in columns.fieldNames()) for r in rows], columns)


def test_the_small_tables_are_the_spark_passes_over_the_same_attempts(spark, simulated):
    config, attempts, sums = simulated
    engines = {group.name: "sequential" for group in config.groups}
    assert set(sums) == {group.name for group in config.groups}
    summed = small_tables(config, engines, sums)
    assert summed is not None

    load = load_from_attempts(spark, attempts, config).localCheckpoint()
    instance_load = instance_load_from(spark, attempts, config, load).localCheckpoint()
    summary = summary_from(spark, attempts, load, config, engines, instance_load=instance_load)
    # the scenario reaches what each column is for
    assert load.where("group = 'busy' and size(schedule_backlog) = 5").count() > 0
    assert load.where("group = 'busy' and utilization_max = 1.0").count() > 0
    assert load.where("oldest_ready_age_ms_max > oldest_ready_age_ms").count() > 0
    assert instance_load.where("group = 'busy'").select("consumer_instance").distinct().count() == 3
    by_group = {row["group"]: row for row in summary.collect()}
    assert by_group["idle"]["idle_instances"] == 1 and by_group["broadcast"]["discards"] > 0
    assert by_group["busy"]["dlq"] > 0 and by_group["busy"]["max_schedule_backlog"] > 0
    assert by_group["replayed"]["replayed"] > 0 and by_group["replayed"]["commits"] == 200

    for rows, expected, schema in (
        (summed.load, load, LOAD),
        (summed.instance_load, instance_load, INSTANCE_LOAD),
        (summed.summary, summary, SUMMARY),
    ):
        assert_df_equality(
            _frame(spark, rows, schema), expected, ignore_row_order=True, ignore_nullable=True
        )
    pd.testing.assert_frame_equal(summed.retries, retries_by_level(attempts))


def test_it_declines_what_it_cannot_make_exactly(spark, simulated, tmp_path_factory):
    config, _, sums = simulated
    engines = {group.name: "sequential" for group in config.groups}
    assert small_tables(config, engines, {k: v for k, v in sums.items() if k != "idle"}) is None
    busy = sums["busy"]
    without_instances = {**sums, "busy": type(busy)(**{**vars(busy), "instances": None})}
    assert small_tables(config, engines, without_instances) is None
    # one thread for 13 messages a second: batches of three form, and share its time
    group = {**SCENARIO["groups"][1], "consumers": {"instances": 1, "threads": 1},
             "consume_message_batch_max_size": 3}  # fmt: skip
    folder = tmp_path_factory.mktemp("summed")
    config, attempts, sums = simulated_with_sums(spark, folder, {**SCENARIO, "groups": [group]})
    assert set(sums) == {"idle"} and attempts.where("batch_size = 3").count() > 0
    assert small_tables(config, {"idle": "sequential"}, sums) is None
