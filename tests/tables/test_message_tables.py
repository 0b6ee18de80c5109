"""The messages, transitions and dead letters that the tasks of the event-by-event stage
write for the groups they simulate whole (retrysim.tables.message_tables) must be the Spark
derivations' rows over the same attempts, exactly: transitions_from_attempts,
all_messages and dead_letters_from_attempts."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from support import BUSY_GROUP

from retrysim.engine.event_stage import output_parts, write_sequential_attempts
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.model.workload import all_messages
from retrysim.runner import simulate
from retrysim.scenario.loading import build_scenario
from retrysim.tables.dead_letters import dead_letters_from_attempts
from retrysim.tables.message_tables import TASK_TABLES, TASK_TABLES_DIR
from retrysim.tables.schemas import (
    ATTEMPTS,
    DEAD_LETTERS,
    MESSAGES,
    TRANSITIONS,
    data_schema,
    without_comments,
)
from retrysim.tables.transitions import transitions_from_attempts

GROUPS = [
    BUSY_GROUP,  # compiled: three instances by queue, a full pool, send-backs, the DLQ
    {   # the lanes' loop: batches of up to four share a thread
        "name": "batched", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 1,
        "consume_message_batch_max_size": 4,
        "consumers": {"instances": 2, "threads": 1},
        "workload": {"messages": 1500, "over": "60s", "queues": 4, "size_bytes": 300},
        "behavior": {"fail_probability": 0.3, "processing_time": "30ms"},
    },
    {   # 5.x simple: pops, invisible time, the DLQ disabled (Discard)
        "name": "popped", "flavor": "rocketmq5.simple", "dlq_enabled": False,
        "max_reconsume_times": 1, "invisible_duration": "10s",
        "consumers": {"instances": 1, "threads": 2},
        "workload": {"messages": 800, "over": "30s", "queues": 2, "arrival": "poisson"},
        "behavior": {"fail_probability": 0.4, "processing_time": "100ms"},
    },
    {   # ordered queues on a pool that can fill: one key for the group
        "name": "ordered", "flavor": "rocketmq4.orderly", "max_reconsume_times": 2,
        "consumers": {"instances": 1, "threads": 2},
        "workload": {"messages": 400, "over": "30s", "queues": 4},
        "behavior": {"fail_probability": 0.2, "processing_time": "20ms"},
    },
    {   # broadcasting: failures are discarded
        "name": "broadcast", "flavor": "rocketmq4.broadcasting",
        "consumers": {"instances": 2, "threads": 1},
        "workload": {"messages": 300, "over": "20s", "queues": 2},
        "behavior": {"fail_probability": 0.3, "processing_time": "50ms"},
    },
]  # fmt: skip


def _scenario(groups: list[dict]):
    return build_scenario(
        {"name": "task-tables", "seed": 11, "horizon": "100s", "load_bucket": "10s",
         "broker": {"message_delay_level": "1s 5s 10s 30s 1m"}, "groups": groups}
    )  # fmt: skip


def _stage(spark, config, folder: str) -> dict[str, object]:
    """Every group whole, as the stage runs them, with the tasks' tables."""
    specs = key_specs(config, group_plans(config))
    attempts = os.path.join(folder, "attempts")
    tables = os.path.join(folder, TASK_TABLES_DIR)
    write_sequential_attempts(spark, specs, set(), 2, attempts, task_tables=(tables, TASK_TABLES))

    def read_staged(schema, path: str):  # as staging reads them
        return spark.read.schema(without_comments(data_schema(schema))).parquet(path)

    read = {"attempts": read_staged(ATTEMPTS, attempts)}
    for name, schema in (("messages", MESSAGES), ("transitions", TRANSITIONS),
                         ("dead_letters", DEAD_LETTERS)):  # fmt: skip
        read[name] = read_staged(schema, os.path.join(tables, name))
    return read


@pytest.fixture(scope="module", params=["groups", "one group in parts"])
def staged(request, spark, tmp_path_factory):
    groups = GROUPS if request.param == "groups" else [BUSY_GROUP]
    config = _scenario(groups)
    if request.param != "groups":  # one group on two cores: two tasks write a share each
        assert output_parts(spark.sparkContext.defaultParallelism, [object()]) > 1
    return config, _stage(spark, config, str(tmp_path_factory.mktemp("task-tables")))


# each table the tasks write, and how Spark derives it (the twin the tasks' is held to)
_DERIVATIONS = {
    "transitions": lambda spark, config, tables: transitions_from_attempts(tables["attempts"]),
    "messages": lambda spark, config, tables: all_messages(spark, config),
    "dead_letters": lambda spark, config, tables: dead_letters_from_attempts(
        tables["attempts"], config
    ),
}


@pytest.mark.parametrize("table", sorted(_DERIVATIONS))
def test_each_table_the_tasks_write_is_sparks_derivation(spark, staged, table):
    config, tables = staged
    derived = _DERIVATIONS[table](spark, config, tables)
    assert derived.count() > 0
    assert_df_equality(tables[table], derived, ignore_row_order=True, ignore_nullable=True)


def test_a_table_without_rows_has_a_file_with_its_columns(spark, tmp_path):
    quiet = dict(GROUPS[4], behavior={"fail_probability": 0.0, "processing_time": "5ms"})
    config = _scenario([quiet])
    tables = _stage(spark, config, str(tmp_path))
    assert tables["dead_letters"].count() == 0
    folder = tmp_path / TASK_TABLES_DIR / "dead_letters"
    (only,) = os.listdir(folder)
    assert pq.read_schema(folder / only).names == data_schema(DEAD_LETTERS).fieldNames()


def test_a_run_takes_them_and_replays_keep_spark_dead_letters(spark, tmp_path):
    """Through simulate(), with the invariant check: every group whole takes the tasks'
    tables; a group that replays its dead letters takes the stage's transitions and
    messages, and Spark's dead letters (a replay's row may be in another task's share)."""
    replayed = dict(BUSY_GROUP, name="replayed", replay={"at": "60s", "rate": "100/s"})
    lines: list[str] = []
    result = simulate(spark, _scenario([replayed, GROUPS[1]]), str(tmp_path), progress=lines.append)
    made = {line.split()[1] for line in lines if "as the event-by-event stage wrote" in line}
    assert made == {"messages", "transitions"}
    dead = result.dead_letters
    assert dead.where("replayed_at_ms is not null").count() > 0
    assert dead.count() == result.attempts.where("result_state = 'DLQ'").count()
