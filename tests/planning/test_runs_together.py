"""Runs simulated together (a plan's points and replications, retrysim.runner.simulate_runs):
one event-by-event stage, one Spark stage a round and one check for all of them, and each
run's tables exactly the ones it gets when simulated alone."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import functions as F
from support import (
    PUBLISHED_BEFORE_THE_FAILURE,
    FailingDeadLetters,
    group,
    retrying_scenario,
    scenario,
)

import retrysim.tables.staging
from retrysim.checks.validate import ValidationError
from retrysim.reporting.report import REPORTS_DIR, draw_run_report
from retrysim.runner import RunRequest, runs_together, simulate, simulate_runs
from retrysim.scenario.errors import ScenarioError
from retrysim.store import views
from retrysim.store.lease import acquire_lease, live_run_ids
from retrysim.store.sinks import table_path
from retrysim.tables.schemas import PARTITION_COLUMN, SCHEMAS, TABLE_ORDER


def _point(instances: int, seed: int):
    """A point of a plan: a 4.x pool that fills up, and ordered queues run a queue a time."""
    pay = group(
        "pay", max_reconsume_times=3, consumers={"instances": instances, "threads": 2},
        workload={"messages": 300, "over": "10s", "queues": 4},
        behavior={"fail_probability": 0.3, "processing_time": "60ms"},
    )  # fmt: skip
    ordered = group(
        "ord", flavor="rocketmq4.orderly", consumers={"instances": 2, "threads": 4},
        workload={"messages": 200, "over": "10s", "queues": 3},
        behavior={"fail_probability": 0.1, "processing_time": "20ms"},
    )  # fmt: skip
    return scenario(pay, ordered, seed=seed, horizon="30m", load_bucket="10s")


def _replaying(seed: int, horizon: str):
    """Two groups for the round engine, one replaying its dead letters at 5 minutes."""
    pay = group(
        "pay", max_reconsume_times=1, consumers="unlimited",
        workload={"messages": 300, "over": "1m", "queues": 3},
        behavior={"fail_probability": 0.5, "processing_time": "10ms"},
        replay={"at": "5m", "rate": "20/s"},
    )  # fmt: skip
    audit = group(
        "audit", max_reconsume_times=3, consumers="unlimited",
        workload={"messages": 100, "over": "30s", "queues": 2},
        behavior={"fail_probability": 0.2, "processing_time": "5ms"},
    )  # fmt: skip
    return scenario(pay, audit, name="replaying", seed=seed, horizon=horizon, load_bucket="1m")


def _whole(seed: int):
    """A point whose groups all run whole in a task: its tasks write its transitions,
    messages and dead letters too (retrysim.tables.message_tables), the others' staging does."""
    data = _point(2, seed)
    return data.model_copy(update={"groups": data.groups[:1]})


REQUESTS = (
    RunRequest(_point(1, 7), "p1"),
    RunRequest(_point(3, 8), "p2"),
    RunRequest(retrying_scenario("rounds", 9, 200), "p3"),  # unlimited: the round engine's
    RunRequest(_replaying(10, "30m"), "p4"),
    # p4's groups, which its rounds share, with their own seed and a horizon in the replay
    RunRequest(_replaying(11, "310s"), "p5"),
    RunRequest(_whole(12), "p6"),
)
# A run's frontier of up to this many retrying messages is finished event by event: p4's
# and p5's after their second round, when p3 still has its third, which it then simulates
# in one stage with their first round of replay.
TAIL_ROWS = 10


@pytest.fixture(scope="module")
def together(spark, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("together") / "out")
    lines: list[str] = []
    report = functools.partial(draw_run_report, output)
    results = simulate_runs(
        spark, REQUESTS, output, lines.append, tail_rows=TAIL_ROWS, report=report
    )
    return output, results, lines


def test_the_runs_share_their_rounds_and_their_event_by_event_stage(together):
    _, results, lines = together
    assert [result.run_id for result in results] == ["p1", "p2", "p3", "p4", "p5", "p6"]
    assert sum(line.startswith("event-by-event simulation of") for line in lines) == 1, lines
    # p1 and p2: pay whole, and ord's 3 queues one key each; p6: pay whole
    assert "event-by-event simulation of 3 runs' groups (9 independent keys) ..." in lines
    assert "3 of 6 runs by rounds together ..." in lines
    # one line a round for the batch: each round of the three runs is one stage, and so is
    # p3's third round with p4's and p5's first of replay (after their own tails' stage)
    rounds = [line.split(":")[0] for line in lines if line.startswith("round")]
    assert rounds == ["round 1", "round 2", "rounds 3+", "round 4 (2 of 3 runs replay)",
                      "round 5 (replay)"], lines  # fmt: skip
    assert "rounds 3+: 5 messages of 2 runs still retrying" in " ".join(lines)
    assert sum(line.startswith("validated: ") for line in lines) == 1
    assert [result.rounds for result in results] == [0, 0, 3, 5, 4, 0]
    for result in results:  # each run's own report, drawn from its own tables
        page = Path(result.report).read_text(encoding="utf-8")
        assert os.path.basename(result.report) == f"{result.run_id}.html"
        assert result.run_id in page


@pytest.mark.parametrize("number", [1, 2, 3, 4, 5])  # p1 is p2's shape
def test_each_run_has_the_tables_it_has_alone(spark, together, tmp_path, number):
    output, results, _ = together
    request = REQUESTS[number]
    alone = str(tmp_path / "alone")
    by_itself = simulate(
        spark, request.scenario, alone, request.run_id, validate=False, tail_rows=TAIL_ROWS
    )
    assert results[number].rounds == by_itself.rounds
    for name in SCHEMAS:
        if name == "runs":
            continue
        mine = views.table(spark, output, name, request.run_id)
        expected = views.table(spark, alone, name, request.run_id)
        assert mine.count() > 0 or name in ("dead_letters", "instance_load"), name
        assert_df_equality(mine, expected, ignore_row_order=True, ignore_nullable=True)
    runs = views.table(spark, output, "runs", request.run_id).collect()
    assert [(row["seed"], row["status"]) for row in runs] == [(request.scenario.seed, "complete")]


def test_a_broken_run_among_them_publishes_none_of_them(spark, together, monkeypatch):
    output, _, _ = together
    before = {table: DeltaTable(table_path(output, table)).version() for table in TABLE_ORDER}
    summary_from = retrysim.tables.staging.summary_from
    monkeypatch.setattr(
        retrysim.tables.staging,
        "summary_from",
        lambda *args: summary_from(*args).withColumn("commits", F.col("commits") + 1),
    )
    again = [RunRequest(_point(2, 11), "q1"), RunRequest(_point(4, 12), "q2"),
             RunRequest(_whole(13), "q3")]  # fmt: skip
    report = functools.partial(draw_run_report, output)  # with 2 cores, q1's drawn early
    # q3's summary comes from its task's sums (not summary_from): it passes, and stays
    # unpublished with the others
    with pytest.raises(ValidationError, match=r"run q1, q2 failed validation.*summary_counts"):
        simulate_runs(spark, again, output, report=report)
    after = {table: DeltaTable(table_path(output, table)).version() for table in TABLE_ORDER}
    assert after == before, "nothing committed: every table stays at its version"
    assert not os.path.exists(os.path.join(output, "_staging"))
    assert not [name for name in os.listdir(os.path.join(output, REPORTS_DIR)) if name[0] == "q"]


def test_a_run_id_taken_partway_releases_the_leases_taken_before(spark, together, tmp_path):
    output = str(tmp_path / "out")
    held = acquire_lease(output, "b2")  # a live writer of b2
    try:
        batch = [RunRequest(_point(1, 7), "b1"), RunRequest(_point(1, 8), "b2")]
        with pytest.raises(ScenarioError, match="b2"):
            simulate_runs(spark, batch, output)
        assert live_run_ids(output) == {"b2"}, "b1's lease was released"
    finally:
        held.release()


def test_they_are_published_together_and_a_failure_removes_them_all(spark, together):
    output, _, _ = together
    sink = FailingDeadLetters()
    again = [RunRequest(_point(2, 21), "f1"), RunRequest(_point(4, 22), "f2")]
    with pytest.raises(RuntimeError, match="injected failure"):
        simulate_runs(spark, again, output, sink=sink, validate=False)
    assert set(sink.published) == PUBLISHED_BEFORE_THE_FAILURE, "a commit a table"
    assert len(sink.published) == len(PUBLISHED_BEFORE_THE_FAILURE)
    for name in TABLE_ORDER:
        left = DeltaTable(table_path(output, name)).to_pyarrow_table(
            partitions=[(PARTITION_COLUMN, "in", ["f1", "f2"])]
        )
        assert left.num_rows == 0, name
    assert not os.path.exists(os.path.join(output, "_staging"))


def test_many_runs_go_in_batches_of_bounded_runs_and_buckets():
    small = _point(1, 7)  # 2 groups x 180 buckets of 10 s
    assert [len(batch) for batch in runs_together([small] * 250)] == [100, 100, 50]
    fine = small.model_copy(update={"load_bucket": 1})  # 2 x 1.8M buckets of 1 ms: alone
    assert runs_together([small, fine, small, small]) == [[0], [1], [2, 3]]
    assert runs_together([small] * 7) == [list(range(7))]


def test_runs_together_need_their_own_run_ids(spark, tmp_path):
    twice = [RunRequest(_point(1, 7), "same"), RunRequest(_point(2, 7), "same")]
    with pytest.raises(ScenarioError, match="need different run ids"):
        simulate_runs(spark, twice, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
