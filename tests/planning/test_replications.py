"""Replications: the seeds they run under, the Student-t interval of each metric (checked
against a printed t table and the standard library's statistics, not against our own
formulas), the runs rows that name them, replication 1 being the plain run row for row,
and plans that judge each point over its replications."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from support import PROJECT, SMALL_FLASH_SALE

from retrysim.planning.plan import format_plan, point_run_id, prepare_plan, run_plan
from retrysim.planning.replications import (
    check_confidence,
    check_replications,
    interval,
    replicate,
    replication_run_id,
    replication_seed,
    t_quantile,
)
from retrysim.planning.targets import Outcome, Target, judge, recommend
from retrysim.runner import simulate
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import load_scenario
from retrysim.store.sinks import read_table

# Student's t quantiles as printed in statistics textbooks' tables (3 decimals).
T_TABLE = [
    (0.975, 1, 12.706),
    (0.975, 2, 4.303),
    (0.975, 3, 3.182),
    (0.975, 4, 2.776),
    (0.975, 9, 2.262),
    (0.975, 29, 2.045),
    (0.975, 120, 1.980),
    (0.95, 10, 1.812),
    (0.995, 5, 4.032),
    (0.9, 20, 1.325),
]


@pytest.mark.parametrize(("p", "df", "printed"), T_TABLE)
def test_t_quantiles_match_the_printed_table(p, df, printed):
    assert t_quantile(p, df) == pytest.approx(printed, abs=5e-4)


def test_interval_is_the_mean_plus_minus_t_times_the_standard_error():
    values = [10.0, 12.0, 14.0, 20.0]
    found = interval(values)
    half = 3.182 * statistics.stdev(values) / 2  # t(0.975, 3) from the table, n = 4
    assert found.n == 4 and found.mean == statistics.mean(values) == 14.0
    assert found.sd == pytest.approx(statistics.stdev(values))
    assert (found.low, found.high) == pytest.approx((14.0 - half, 14.0 + half), abs=2e-3)
    assert (found.min, found.max, found.missing) == (10.0, 20.0, 0)


def test_interval_edges_one_value_missing_values_and_the_floor_at_zero():
    one = interval([5.0, None])
    assert (one.n, one.mean, one.low, one.high, one.missing) == (1, 5.0, None, None, 1)
    none = interval([None, float("nan")])
    assert (none.n, none.mean, none.missing) == (0, None, 2)
    wide = interval([0.0, 0.0, 9.0])  # mean 3, the t interval reaches below 0
    assert wide.low == 0.0 and wide.high > 9.0


def test_an_interval_level_outside_0_1_is_refused():
    for level in (0, 1, 1.5):
        with pytest.raises(ValueError, match="must be within"):
            interval([1.0, 2.0], level)


def test_seeds_first_is_the_scenarios_own_the_rest_distinct_and_reproducible():
    seeds = [replication_seed(42, k) for k in range(1, 101)]
    assert seeds[0] == 42
    assert len(set(seeds)) == 100 and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [replication_seed(42, k) for k in range(1, 101)]
    assert replication_seed(7, 2) != replication_seed(42, 2)
    assert replication_run_id("run", 1, 1) == "run"
    assert replication_run_id("run", 3, 5) == "run-r3"


def test_bad_replications_and_confidence_name_their_flag():
    for value in (0, 101, 2.5, True):
        with pytest.raises(ScenarioError, match=r"^--replications: value"):
            check_replications(value)
    with pytest.raises(ScenarioError, match=r"^--run-id: .*longer than a run id's 128"):
        check_replications(10, "a" * 126)
    for value in (0, -0.1, 1.01, float("nan")):
        with pytest.raises(ScenarioError, match=r"^--confidence: value"):
            check_confidence(value)
    assert check_confidence(1) == 1.0


# --------------------------------------------------------------------------- judging


P99 = Target("p99_time_to_commit", 60_000.0)
BACKLOG = Target("max_ready_backlog", 100.0)


def _runs(*pairs: tuple[float, float]) -> list[dict]:
    return [{"p99_time_to_commit_ms": p, "max_ready_backlog": b} for p, b in pairs]


def test_judge_counts_the_replications_that_miss_each_target_and_meet_them_all():
    runs = _runs((50_000, 90), (70_000, 90), (65_000, 150), (10_000, 10))
    failed, misses, share = judge(runs, [P99, BACKLOG], "g")
    assert failed == (P99, BACKLOG)  # missed by 2, then by 1
    assert misses == {"p99_time_to_commit": 2, "max_ready_backlog": 1}
    assert share == 0.5  # runs 1 and 4 meet both


def _outcome(point: int, pool: int, share: float, confidence: float) -> Outcome:
    return Outcome(
        point=point, group="g", case=(), instances=pool // 4, threads=4, pool=pool,
        metrics={"p99_time_to_commit_ms": 1.0}, failed=(P99,) if share < 1 else (),
        replications=5, met_share=share, confidence=confidence,
        misses={"p99_time_to_commit": round((1 - share) * 5)},
    )  # fmt: skip


@pytest.mark.parametrize(("confidence", "best"), [(0.8, 2), (0.95, 3), (0.4, 1)])
def test_the_recommendation_is_the_smallest_pool_whose_share_reaches_the_confidence(
    confidence, best
):
    shares = {1: 0.4, 2: 0.8, 3: 1.0}
    outcomes = [_outcome(p, 4 * 2**p, shares[p], confidence) for p in (1, 2, 3)]
    (rec,) = recommend(outcomes)
    assert rec.point == best
    if best > 1:
        assert rec.binding == (P99,) and rec.smaller.point == best - 1


def test_the_cli_refuses_bad_replication_flags_before_spark(tmp_path):
    for args, expect in (
        (("plan", "--replications", "0"), "retrysim: error: --replications: value '0'"),
        (("plan", "--confidence", "1.5"), "retrysim: error: --confidence: value '1.5'"),
        (("simulate", "--replications", "x"), "retrysim: error: --replications: value 'x'"),
        (
            ("plan", "--sweep", "consumers.instances=" + ",".join(map(str, range(1, 12))),
             "--replications", "100"),
            "retrysim: error: --replications: 11 points x 100 replications make up to 1,100 runs",
        ),
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "retrysim", *args, "--scenario", "conf/flash-sale.yaml",
             "--output", str(tmp_path / "out")],
            cwd=PROJECT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert expect in done.stderr.strip().splitlines()[-1]
        assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- through Spark

# conf/flash-sale.yaml, small, with failures so that retries differ between seeds.
SMALL = (
    "groups.0.workload.messages=300",
    "groups.0.workload.over=2s",
    "groups.0.behavior.fail_probability=0.05",
    "horizon=5m",
    "load_bucket=1s",
)


@pytest.fixture(scope="module")
def three(spark, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("replications") / "out")
    scenario = load_scenario(PROJECT / "conf" / "flash-sale.yaml", SMALL)
    reps = replicate(spark, scenario, 3, output=output, run_id="rep", validate=False)
    plain = simulate(spark, scenario, output=output, run_id="plain", validate=False)
    return reps, plain, scenario


def test_each_replication_is_a_run_whose_runs_row_names_it(spark, three):
    reps, _, scenario = three
    assert reps.run_ids == ["rep-r1", "rep-r2", "rep-r3"]
    rows = {
        r["run_id"]: r
        for r in read_table(spark, reps.output, "runs")
        .select("run_id", "seed", "replication_of", "point", "replication", "status")
        .collect()
    }
    for k in (1, 2, 3):
        row = rows[f"rep-r{k}"]
        assert (row["replication_of"], row["point"], row["replication"]) == ("rep", None, k)
        assert row["seed"] == replication_seed(scenario.seed, k) and row["status"] == "complete"
    assert (rows["plain"]["replication_of"], rows["plain"]["replication"]) == ("plain", 1)


def test_replication_one_is_the_plain_run_and_the_others_differ(spark, three):
    reps, plain, _ = three
    first, second = (result.attempts.drop("run_id") for result in reps.results[:2])
    assert_df_equality(first, plain.attempts.drop("run_id"), ignore_row_order=True)
    assert first.exceptAll(second).count() > 0


def test_intervals_across_replications_from_the_summary_table(spark, three):
    reps, _, _ = three
    summary = {
        r["run_id"]: r.asDict()
        for r in read_table(spark, reps.output, "summary")
        .where(F.col("run_id").startswith("rep-r"))
        .collect()
    }
    frame = reps.intervals().set_index("metric")
    for metric in ("deliveries", "retries", "p99_time_to_commit_ms", "max_ready_backlog"):
        values = [summary[f"rep-r{k}"][metric] for k in (1, 2, 3)]
        row = frame.loc[metric]
        half = 4.303 * statistics.stdev(values) / 3**0.5  # t(0.975, 2) from the table
        assert row["replications"] == 3 and row["mean"] == pytest.approx(statistics.mean(values))
        assert row["ci_high"] == pytest.approx(statistics.mean(values) + half, rel=1e-3)
        assert (row["min"], row["max"]) == (min(values), max(values))
    assert len({summary[f"rep-r{k}"]["retries"] for k in (1, 2, 3)}) > 1  # the seeds differ


# A plan of three pools with three replications each, on the small flash sale.
PLAN_SET = SMALL_FLASH_SALE


@pytest.fixture(scope="module")
def replicated_plan(spark, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("plan-reps") / "out")
    spec = prepare_plan(
        PROJECT / "conf" / "flash-sale.yaml", PLAN_SET, ["consumers.instances=1,2,4"],
        ["p99_time_to_commit=2s", "max_ready_backlog=100"], replications=3, confidence=2 / 3,
    )  # fmt: skip
    lines: list[str] = []
    result = run_plan(spark, spec, output, "reps", lines.append, verbose=True, validate=False)
    return result, lines


def test_a_replicated_plan_judges_each_point_over_its_replications(spark, replicated_plan):
    result, lines = replicated_plan
    # progress: the nine runs simulated together and staged: a line each time, not one per run
    assert lines.count("simulating 9 runs together ...") == 1
    assert (
        lines.count("  event-by-event simulation of 9 runs' groups (9 independent keys) ...") == 1
    )
    assert lines.count("  staging the tables of 9 runs ...") == 1
    assert not [line for line in lines if "staging tables" in line]
    summary = {
        r["run_id"]: r.asDict() for r in read_table(spark, result.output, "summary").collect()
    }
    oldest = {
        r["run_id"]: r[1]
        for r in read_table(spark, result.output, "load")
        .groupBy("run_id")
        .agg(F.max("oldest_ready_age_ms_max"))
        .collect()
    }
    rows = {r["point"]: r.asDict() for r in result.table.collect()}
    best = None
    for point in (1, 2, 3):
        row = rows[point]
        runs = [f"{point_run_id('reps', point)}-r{k}" for k in (1, 2, 3)]
        assert row["point_run_id"] == point_run_id("reps", point) and row["replications"] == 3
        for column in ("deliveries", "p99_time_to_commit_ms", "max_ready_backlog"):
            values = [summary[run][column] for run in runs]
            assert row[column] == pytest.approx(statistics.mean(values)), column
            if len(set(values)) > 1:
                half = 4.303 * statistics.stdev(values) / 3**0.5
                assert row[f"{column}_ci_high"] == pytest.approx(
                    statistics.mean(values) + half, rel=1e-3
                )
        assert row["max_oldest_ready_age_ms"] == pytest.approx(
            statistics.mean(oldest[run] for run in runs)
        )
        met = [
            summary[run]["p99_time_to_commit_ms"] <= 2_000
            and summary[run]["max_ready_backlog"] <= 100
            for run in runs
        ]
        assert row["meets_targets_share"] == pytest.approx(sum(met) / 3)
        assert row["meets_targets"] == (sum(met) >= 2) and row["confidence"] == pytest.approx(2 / 3)
        if best is None and sum(met) >= 2:
            best = point
        assert json.loads(row["targets_json"]) == {
            "max_ready_backlog": 100.0,
            "p99_time_to_commit_ms": 2000.0,
        }
    assert best is not None
    assert [p for p in rows if rows[p]["recommended"]] == [best]
    text = format_plan(result)
    assert "3 points x 3 replications" in text and "meet all" in text
    assert "±" in text
