"""Capacity plans: sweep grids, targets and the recommendation (pure Python), the bad-input
contract of ``retrysim plan``, and one small plan end to end through Spark whose plan rows,
recommendation and binding target are checked against values computed here from the
points' own summary and load tables."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F
from support import PROJECT, SMALL_FLASH_SALE

from retrysim.planning.plan import (
    check_plan_id,
    format_plan,
    point_run_id,
    prepare_plan,
    read_plan,
    run_plan,
    write_plan_table,
)
from retrysim.planning.sweep import MAX_POINTS, grid, parse_sweep
from retrysim.planning.targets import (
    Outcome,
    Target,
    describe,
    evaluate,
    overall_pool,
    parse_target,
    recommend,
    topology_note,
)
from retrysim.reporting.report import write_plan_report
from retrysim.scenario.errors import ScenarioError
from retrysim.store.sinks import DeltaRsSink, read_table

ONE = {"groups": [{"name": "g", "flavor": "rocketmq4.concurrently"}]}
TWO = {
    "groups": [
        {"name": "a", "flavor": "rocketmq4.concurrently"},
        {"name": "b", "flavor": "rocketmq4.concurrently"},
    ]
}


# --------------------------------------------------------------------------- sweep keys


def test_group_shorthand_names_the_only_group():
    axis = parse_sweep("consumers.instances=1, 2,4", ONE)
    assert (axis.key, axis.group, axis.values) == (
        "groups.g.consumers.instances",
        "g",
        ("1", "2", "4"),
    )
    assert axis.touches_pool("g") and axis.field == "consumers.instances"


def test_index_and_name_spellings_are_one_canonical_key():
    by_index = parse_sweep("groups.1.behavior.fail_probability=0.1", TWO)
    by_name = parse_sweep("groups.b.behavior.fail_probability=0.1", TWO)
    assert by_index.key == by_name.key == "groups.b.behavior.fail_probability"
    assert not by_index.touches_pool("b")
    assert parse_sweep("horizon=1h,2h", TWO).group is None


def test_shorthand_with_two_groups_asks_for_the_group():
    with pytest.raises(ScenarioError, match=r"consumers.instances: the scenario has 2 groups"):
        parse_sweep("consumers.instances=1,2", TWO)


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("consumers.instances", "expected key=v1,v2"),
        ("consumers.instances=1,,2", "empty value"),
        ("consumers.instances=2,2", "listed twice"),
        ("groups.c.consumers.instances=2", "no group 'c'"),
        ("groups.a=2", "name a key inside the group"),
        ("consumer.instances=2", "unknown key 'consumer'; did you mean 'consumers'\\? allowed: a "),
    ],
)
def test_malformed_sweeps(text, expect):
    with pytest.raises(ScenarioError, match=expect):
        parse_sweep(text, TWO if "groups" in text else ONE)


def test_grid_is_cartesian_first_axis_slowest():
    axes = [parse_sweep("consumers.threads=1,2", ONE), parse_sweep("seed=7,8,9", ONE)]
    points = grid(axes)
    assert len(points) == 6
    assert points[:2] == [
        {"groups.g.consumers.threads": "1", "seed": "7"},
        {"groups.g.consumers.threads": "1", "seed": "8"},
    ]


def test_grid_limits():
    same = [
        parse_sweep("consumers.threads=1,2", ONE),
        parse_sweep("groups.0.consumers.threads=3", ONE),
    ]
    with pytest.raises(ScenarioError, match="swept twice"):
        grid(same)
    wide = [
        parse_sweep("seed=" + ",".join(map(str, range(11))), ONE),
        parse_sweep("consumers.threads=" + ",".join(map(str, range(1, 11))), ONE),
    ]
    with pytest.raises(ScenarioError, match=f"at most {MAX_POINTS}"):
        grid(wide)


def _scenario_file(tmp_path: Path, groups: int = 1) -> str:
    data = {
        "name": "unit",
        "horizon": "1h",
        "groups": [
            {
                "name": f"g{i}",
                "flavor": "rocketmq4.concurrently",
                "consumers": {"instances": 1, "threads": 2},
                "workload": {"messages": 10},
            }
            for i in range(groups)
        ],
    }
    path = tmp_path / "unit.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_prepare_plan_builds_every_point(tmp_path):
    spec = prepare_plan(
        _scenario_file(tmp_path),
        overrides=["groups.0.workload.messages=20"],
        sweeps=["consumers.instances=1,3", "behavior.fail_probability=0,0.5"],
        targets=["p99_time_to_commit=5m", "g0.dlq=0"],
    )
    assert len(spec.points) == 4
    last = spec.points[-1]
    group = last.scenario.groups[0]
    assert (group.consumers.pool_size, group.behavior.fail_probability) == (6, 0.5)
    assert group.workload.messages == 20
    assert spec.case(last, "g0") == (("behavior.fail_probability", "0.5"),)
    assert last.setting_values()["groups.g0.consumers.instances"] == 3


def test_a_bad_sweep_value_is_named_by_its_key(tmp_path):
    with pytest.raises(ScenarioError) as error:
        prepare_plan(_scenario_file(tmp_path), sweeps=["consumers.instances=2,0"])
    assert str(error.value).startswith("--sweep consumers.instances: value '0': ")
    assert "between 1 and" in str(error.value)
    with pytest.raises(ScenarioError, match="unknown key"):
        prepare_plan(_scenario_file(tmp_path), sweeps=["behavior.fail_probabilty=0.1"])


def test_plan_ids():
    assert check_plan_id("cap-1") == "cap-1"
    for bad in ("", "-x", "a/b", "x" * 121):
        with pytest.raises(ScenarioError, match="--plan-id"):
            check_plan_id(bad)
    assert point_run_id("cap", 3) == "cap-p3"


# --------------------------------------------------------------------------- targets


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("p99_time_to_commit=5m", Target("p99_time_to_commit", 300_000.0)),
        ("max_oldest_ready_age=90s", Target("max_oldest_ready_age", 90_000.0)),
        ("max_ready_backlog=10_000", Target("max_ready_backlog", 10_000.0)),
        ("peak_utilization=80%", Target("peak_utilization", 0.8)),
        ("peak_utilization=0.75", Target("peak_utilization", 0.75)),
        ("a.dlq=0", Target("dlq", 0.0, "a")),
        ("write_amplification=2.5", Target("write_amplification", 2.5)),
    ],
)
def test_parse_target(text, target):
    assert parse_target(text, ["a", "b"]) == target


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("p99=5m", "unknown metric 'p99'; allowed: p50_time_to_commit"),
        ("p99_time_to_commit=5", "a duration such as 90s"),
        ("dlq=-1", "a whole number >= 0"),
        ("dlq=1.5", "a whole number >= 0"),
        ("peak_utilization=120%", "a fraction 0..1"),
        ("c.dlq=0", "no group 'c'"),
        ("dlq", "expected metric=value"),
    ],
)
def test_bad_targets(text, expect):
    with pytest.raises(ScenarioError, match=expect):
        parse_target(text, ["a", "b"])


def test_evaluate_lists_missed_targets_worst_first_and_a_missing_value_misses():
    targets = [
        Target("p99_time_to_commit", 1000.0),
        Target("dlq", 10.0),
        Target("pending", 0.0),
        Target("dlq", 100.0, "other"),
    ]
    metrics = {"p99_time_to_commit_ms": 1500.0, "dlq": 40, "pending": 0}
    assert [t.metric for t in evaluate(metrics, targets, "g")] == ["dlq", "p99_time_to_commit"]
    assert [t.metric for t in evaluate(metrics, targets, "other")] == ["p99_time_to_commit"]
    assert evaluate({"p99_time_to_commit_ms": None}, targets[:1], "g") == targets[:1]


# --------------------------------------------------------------------------- recommendation

P99, BACKLOG = Target("p99_time_to_commit", 60_000.0), Target("max_ready_backlog", 100.0)


def _outcome(point, pool, p99, backlog, case=(), group="g", threads=None):
    metrics = {"p99_time_to_commit_ms": p99, "max_ready_backlog": backlog}
    instances = None if pool is None else pool // (threads or 1)
    return Outcome(
        point,
        group,
        case,
        instances,
        threads or (pool and 1),
        pool,
        metrics,
        tuple(evaluate(metrics, [P99, BACKLOG], group)),
    )


def test_smallest_meeting_pool_and_the_target_the_next_smaller_pool_misses():
    outcomes = [_outcome(1, 4, 90_000, 50), _outcome(2, 8, 30_000, 10), _outcome(3, 16, 1_000, 0)]
    (rec,) = recommend(outcomes)
    assert (rec.point, rec.pool, [t.metric for t in rec.binding]) == (2, 8, ["p99_time_to_commit"])
    assert rec.smaller.point == 1
    assert "binding: p99_time_to_commit (1m30s > 1m00s) at the next smaller pool (4" in describe(
        rec
    )


def test_the_order_of_points_does_not_matter_and_larger_failures_are_noted():
    outcomes = [
        _outcome(1, 16, 90_000, 50),
        _outcome(2, 4, 90_000, 500),
        _outcome(3, 8, 30_000, 10),
    ]
    (rec,) = recommend(outcomes)
    assert rec.point == 3
    assert [t.metric for t in rec.binding] == ["max_ready_backlog", "p99_time_to_commit"]
    assert rec.larger_failing == (1,)


def test_nothing_binds_when_the_smallest_pool_meets_every_target():
    (rec,) = recommend([_outcome(1, 2, 10, 0), _outcome(2, 4, 5, 0)])
    assert (rec.point, rec.binding, rec.smaller) == (1, (), None)
    assert "no target is binding" in describe(rec)


def test_no_point_meets():
    outcomes = [_outcome(1, 2, 90_000, 500), _outcome(2, 4, 61_000, 0), _outcome(3, None, 1, 0)]
    (rec,) = recommend(outcomes)
    assert not rec.found and rec.closest.point == 2  # the unlimited pool is never recommended
    assert "no point meets the targets" in describe(rec)
    assert "p99_time_to_commit 1m01s > 1m00s" in describe(rec)


def _with(outcome: Outcome, **metrics) -> Outcome:
    return dataclasses.replace(outcome, metrics={**outcome.metrics, **metrics})


def test_idle_instances_say_add_queues_not_instances():
    outcomes = [_outcome(1, 4, 90_000, 500, threads=1), _outcome(2, 8, 90_000, 500, threads=1)]
    outcomes[1] = _with(outcomes[1], idle_instances=4, busiest_instance_utilization=1.0)
    (rec,) = recommend(outcomes)
    assert not rec.found
    assert "4 of 8 instances ran no delivery at point p2" in describe(rec)
    assert describe(rec).endswith("add queues, not instances.")


def test_a_saturated_instance_in_a_group_with_threads_to_spare_is_named():
    outcomes = [_outcome(1, 4, 90_000, 50, threads=1), _outcome(2, 8, 30_000, 10, threads=1)]
    outcomes[0] = _with(
        outcomes[0], idle_instances=0, busiest_instance=0, busiest_instance_utilization=1.0,
        peak_utilization=0.4,
    )  # fmt: skip
    outcomes[1] = _with(outcomes[1], idle_instances=0, busiest_instance_utilization=0.5)
    (rec,) = recommend(outcomes)
    text = describe(rec)
    assert rec.point == 2 and "At point p1 instance 0 ran at 100% of its threads" in text
    assert "raise retry_queue_nums" in text
    # without a saturated instance or an idle one, nothing is added
    quiet = _with(outcomes[0], busiest_instance_utilization=0.5)
    assert topology_note(quiet) == "" and topology_note(None) == ""


def test_one_recommendation_per_case_and_one_pool_for_every_case():
    low, high = (("behavior.fail_probability", "0.01"),), (("behavior.fail_probability", "0.1"),)
    outcomes = [
        _outcome(1, 4, 30_000, 0, low),
        _outcome(2, 8, 20_000, 0, low),
        _outcome(3, 4, 90_000, 0, high),
        _outcome(4, 8, 50_000, 0, high),
    ]
    recs = recommend(outcomes)
    assert [(r.case, r.point) for r in recs] == [(low, 1), (high, 4)]
    assert overall_pool(outcomes, "g") == 8
    assert overall_pool(outcomes[:3], "g") is None  # pool 8 was not run in the second case


# --------------------------------------------------------------------------- command line


def _plan_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "retrysim", "plan", "--output", str(tmp_path / "out"), *args],
        capture_output=True,
        text=True,
        cwd=PROJECT,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("--sweep", "consumers.instances=2,0"), "--sweep consumers.instances: value '0'"),
        (("--target", "p99=5m"), "--target: unknown metric 'p99'"),
        (("--sweep", "consumers.threads=1", "--plan-id", "a b"), "--plan-id: value 'a b'"),
    ],
)
def test_bad_plan_input_exits_2_with_one_line_and_writes_nothing(tmp_path, args, expect):
    done = _plan_cli(tmp_path, "--scenario", "conf/flash-sale.yaml", *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"retrysim: error: {expect}"), done.stderr
    assert not (tmp_path / "out").exists()


def test_two_group_shorthand_is_refused_by_the_cli(tmp_path):
    done = _plan_cli(
        tmp_path, "--scenario", "conf/orderly-blocking.yaml", "--sweep", "consumers.threads=1,2"
    )
    assert done.returncode == 2
    assert "name the group, e.g. groups.ledger-default.consumers.threads" in done.stderr


# --------------------------------------------------------------------------- end to end

# The small flash sale (support.SMALL_FLASH_SALE): the smallest pool misses both targets, the
# middle one only the backlog, so the largest is recommended and max_ready_backlog binds. This
# run is also the flash-sale scenario's test.
E2E_SET = SMALL_FLASH_SALE
E2E_SWEEP = "consumers.instances=1,2,4"
E2E_TARGETS = ("p99_time_to_commit=2s", "max_ready_backlog=100")


@pytest.fixture(scope="module")
def e2e_plan(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    spec = prepare_plan(PROJECT / "conf" / "flash-sale.yaml", E2E_SET, [E2E_SWEEP], E2E_TARGETS)
    lines: list[str] = []
    # Invariants are tested elsewhere (test_validate); here the plan rows are checked
    # against the points' own tables.
    result = run_plan(spark, spec, str(folder / "out"), "e2e", lines.append, validate=False)
    return result, lines


def _independent(spark, output: str, run_id: str) -> dict:
    """A point's metrics straight from its own summary and load rows."""
    summary = read_table(spark, output, "summary").where(F.col("run_id") == run_id).first()
    oldest = (
        read_table(spark, output, "load")
        .where(F.col("run_id") == run_id)
        .agg(F.max("oldest_ready_age_ms_max"))
        .first()[0]
    )
    return {**summary.asDict(), "max_oldest_ready_age_ms": oldest}


def test_plan_rows_recommendation_and_binding_target(spark, e2e_plan):
    result, lines = e2e_plan
    rows = {r["point"]: r for r in result.table.collect()}
    assert sorted(rows) == [1, 2, 3]
    limits = {"p99_time_to_commit_ms": 2_000, "max_ready_backlog": 100}
    expected_failed = {}
    for point, instances in ((1, 1), (2, 2), (3, 4)):
        row = rows[point]
        truth = _independent(spark, result.output, f"e2e-p{point}")
        assert (row["point_run_id"], row["group"]) == (f"e2e-p{point}", "checkout")
        assert (row["instances"], row["threads"], row["pool"]) == (instances, 4, 4 * instances)
        for column in (
            "messages",
            "deliveries",
            "commits",
            "dlq",
            "pending",
            "max_ready_backlog",
            "p99_time_to_commit_ms",
            "peak_utilization",
            "max_oldest_ready_age_ms",
        ):
            assert row[column] == truth[column], column
        failed = {c for c, limit in limits.items() if truth[c] is None or truth[c] > limit}
        expected_failed[point] = failed
        names = {
            "p99_time_to_commit_ms": "p99_time_to_commit",
            "max_ready_backlog": "max_ready_backlog",
        }
        assert set((row["failed_targets"] or "").split(",")) - {""} == {names[c] for c in failed}
        assert row["meets_targets"] == (not failed)
        assert json.loads(row["targets_json"]) == limits
        assert json.loads(row["settings_json"]) == {
            "groups.checkout.consumers.instances": instances
        }
    # The scenario is sized so that the smallest pool misses both targets, the middle one
    # only the backlog, and the largest meets both.
    assert [len(expected_failed[p]) for p in (1, 2, 3)] == [2, 1, 0]
    assert rows[3]["recommended"] and rows[3]["binding_target"] == "max_ready_backlog"
    best = min(p for p in rows if not expected_failed[p])
    binding = expected_failed[best - 1] if best > 1 else set()
    assert [p for p in rows if rows[p]["recommended"]] == [best]
    assert set(rows[best]["binding_target"].split(",")) == ({names[c] for c in binding} or {"none"})
    assert all(rows[p]["binding_target"] is None for p in rows if p != best)
    assert sum("point " in line and " done: " in line for line in lines) == 3
    text = format_plan(result)
    assert "<- recommended" in text and f"point p{best}" in text


def test_rewriting_a_plan_id_replaces_its_rows(spark, e2e_plan):
    result, _ = e2e_plan
    before = read_table(spark, result.output, "plan").where(F.col("run_id") == "e2e").count()
    assert before == 3
    rows = [tuple(r) for r in result.table.drop("run_id").where(F.col("point") == 1).collect()]
    write_plan_table(spark, result.output, "e2e-copy", rows, DeltaRsSink())
    write_plan_table(spark, result.output, "e2e-copy", rows, DeltaRsSink())
    assert read_plan(spark, result.output, "e2e-copy").count() == 1
    assert read_plan(spark, result.output, "e2e").count() == 3
    assert not os.path.exists(os.path.join(result.output, "_staging"))
    assert math.isfinite(result.elapsed_s)


def test_plan_report_of_the_plan(spark, e2e_plan):
    result, _ = e2e_plan
    best = next(
        o.point for o in result.outcomes if any(r.point == o.point for r in result.recommendations)
    )
    text = Path(write_plan_report(spark, result.output, "e2e")).read_text()
    assert "Trade-off curves" in text and 'data-chart="checkout: trade-offs"' in text
    assert f"point p{best}, run e2e-p{best}" in text
    assert text.count('<tr class="recommended">') == 1
