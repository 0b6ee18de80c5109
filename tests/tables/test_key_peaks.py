"""A group simulated whole in one task brings its exact peaks and settle times from there
(retrysim.tables.key_peaks): they must be the Spark passes' rows over the same attempts,
exactly, for every way a group is simulated event by event."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from support import BUSY_GROUP, simulated_with_sums

from retrysim.engine.event_stage import (
    output_parts,
    write_sequential_attempts,
)
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.scenario.loading import build_scenario
from retrysim.tables.dead_letters import dead_letters_from_attempts
from retrysim.tables.group_sums import (
    COUNTS,
    PEAK_HALVES,
    RATES,
    SHARES,
    GroupSums,
    GroupSumsParam,
)
from retrysim.tables.instances import changes_of_shared_groups
from retrysim.tables.load import compact_attempts
from retrysim.tables.peaks import bucket_changes
from retrysim.tables.summary import times_to_settle

SCENARIO = {
    "name": "whole-groups", "seed": 7, "horizon": "100s", "load_bucket": "10s",
    "broker": {"message_delay_level": "1s 5s 10s 30s 1m"},
    "groups": [
        BUSY_GROUP,  # compiled: three instances by queue, a full pool
        {   # the lanes' loop: batches of up to four share a thread
            "name": "batched", "flavor": "rocketmq4.concurrently",
            "consume_message_batch_max_size": 4,
            "consumers": {"instances": 2, "threads": 1},
            "workload": {"messages": 1500, "over": "60s", "queues": 4},
            "behavior": {"fail_probability": 0.1, "processing_time": "30ms"},
        },
        {   # 5.x pops on a pool too small for them
            "name": "popped", "flavor": "rocketmq5.push",
            "consumers": {"instances": 1, "threads": 2},
            "workload": {"messages": 1200, "over": "30s", "queues": 2},
            "behavior": {"fail_probability": 0.3, "processing_time": "100ms"},
        },
        {   # ordered queues that never fill the pool: a key per queue, summed up by Spark
            "name": "ordered", "flavor": "rocketmq4.orderly",
            "consumers": {"instances": 1, "threads": 4},
            "workload": {"messages": 400, "over": "30s", "queues": 4},
            "behavior": {"fail_probability": 0.1, "processing_time": "20ms"},
        },
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def simulated(spark, tmp_path_factory):
    """Every group event by event, as the stage runs them, with the tasks' sums."""
    return simulated_with_sums(spark, tmp_path_factory.mktemp("whole-groups"), SCENARIO)


def test_whole_groups_bring_their_sums_and_per_queue_keys_do_not(simulated):
    _, _, sums = simulated
    assert set(sums) == {"busy", "batched", "popped"}
    busy = sums["busy"]
    assert {row[1] for row in busy.changes} == {0, 3, 4, 5}  # the schedule topic's levels
    assert busy.instances and {row[1] for row in busy.instances} == {0, 1, 2}
    assert sums["popped"].instances is None  # one instance: its rows are the load's
    assert busy.ttc is not None and busy.ttd is not None


@pytest.mark.parametrize(
    ("spark_pass", "some", "none"),
    [
        (bucket_changes, ["group != 'ordered' and ready_backlog_rise > 0",
                          "group = 'popped' and commitlog_writes_busiest > 1"], []),
        # every count the load and the summary read, and the retries by level: 4.x with the
        # schedule topic and the fallback's dead letters, batches, 5.x pops with their writes
        (compact_attempts, ["group = 'popped' and size(filter(b_writes, b -> b is not null)) > 3"],
         ["group = 'busy' and level is not null and not started"]),
        (changes_of_shared_groups, ["group = 'batched' and threads_busy_area > 0"], []),
        (times_to_settle, ["true"], []),
    ],
    ids=["gauges", "load counts", "instances' changes", "times to settle"],
)  # fmt: skip
def test_the_sums_give_the_spark_pass_over_the_same_attempts(simulated, spark_pass, some, none):
    """Each Spark pass that staging skips for a group summed up whole in its task gives,
    from the task's sums, what it gives reading the group's attempts: on rows that hold
    what the case names (``some``) and not what it rules out (``none``)."""
    config, attempts, sums = simulated
    expected = spark_pass(attempts, config)
    assert all(expected.where(rows).count() > 0 for rows in some)
    assert all(expected.where(rows).count() == 0 for rows in none)
    assert_df_equality(spark_pass(attempts, config, sums), expected, ignore_row_order=True)


def test_dead_letters_are_read_only_where_a_task_saw_some(simulated):
    config, attempts, sums = simulated
    assert sums["busy"].dead_letters > 0 and sums["batched"].dead_letters == 0
    expected = dead_letters_from_attempts(attempts, config)
    assert_df_equality(
        dead_letters_from_attempts(attempts, config, sums), expected, ignore_row_order=True
    )
    quiet = {name: sums[name] for name in ("batched",)}
    alone = build_scenario({**SCENARIO, "groups": [SCENARIO["groups"][1]]})
    unread = dead_letters_from_attempts(attempts, alone, quiet)
    assert unread.inputFiles() == [] and unread.count() == 0
    assert dead_letters_from_attempts(attempts, alone).inputFiles()


def test_a_group_alone_on_the_cores_is_written_by_all_of_them(spark, simulated, tmp_path):
    """One whole group on two cores: two tasks simulate it, each writes its share of the batches
    of its rows as a Parquet file of its own (pyarrow, in the task), and each sums up a
    share of all of them (the peaks, the counts), merged on the driver. The files read back
    as Spark's writer would have left the rows."""
    config, attempts, sums = simulated
    plans = [plan for plan in group_plans(config) if plan.name == "busy"]
    specs = key_specs(config, plans)
    assert output_parts(spark.sparkContext.defaultParallelism, specs) == 2
    alone = spark.sparkContext.accumulator({}, GroupSumsParam())
    folder = tmp_path / "alone"
    count = write_sequential_attempts(spark, specs, set(), 2, str(folder), sums=alone)
    # a small key's rows may come in one batch, and then only the first task writes
    assert {path.name for path in folder.iterdir()} <= {"part-00000.parquet", "part-00001.parquet"}
    rows = spark.read.parquet(str(folder))
    assert rows.schema == attempts.schema and count == attempts.where("group = 'busy'").count()
    assert_df_equality(rows, attempts.where("group = 'busy'"), ignore_row_order=True)
    assert alone.value == {(0, "busy"): sums["busy"]}  # by KeySpec.key


def test_the_halves_of_the_peaks_merge_in_any_order_and_a_retried_half_replaces():
    """Two tasks sum up the peaks of two sets of buckets, one with the rates and
    the other with the counts: merged, their rows are one task's, in its order, with each
    share's values; a half that comes again (a retried task) changes nothing."""
    even, odd = (frozenset({half}) for half in PEAK_HALVES)  # here, buckets 0 and 1
    row = lambda bucket, level: (bucket, level, "g", 1)  # noqa: E731
    rates = {"ttc": [1.0, 2.0], "ttd": None, "busiest": ((0, (3, 1, 4)),)}
    counts = {"compact": (("g", True),), "dead_letters": 7}
    peaks = (row(0, 0), row(1, 0), row(0, 3), row(1, 3))
    whole = GroupSums("g", SHARES, peaks, None, **rates, **counts)
    first = GroupSums("g", even | {RATES}, (row(0, 0), row(0, 3)), None, **rates)
    second = GroupSums("g", odd | {COUNTS}, (row(1, 0), row(1, 3)), None, **counts)
    for merged in (first.merged(second), second.merged(first)):
        assert merged == whole and merged.complete
        assert merged.merged(first) == whole and merged.merged(second) == whole
    assert not first.merged(first).complete
