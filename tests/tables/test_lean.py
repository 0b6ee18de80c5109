"""Lean output (``--tables lean``): transitions and messages are not stored but derived, and
what a reader gets is the same rows a full run stores."""

from __future__ import annotations

import subprocess

import deltalake
import pytest
from chispa import assert_df_equality
from support import PROJECT, group, scenario

from retrysim import register_views, simulate
from retrysim.scenario.errors import ScenarioError

pytestmark = pytest.mark.spark  # spark-submit runs, each in its own JVM

SCENARIO = scenario(
    group(
        "pay",
        workload={"messages": 300, "over": "1m", "queues": 2},
        behavior={"fail_probability": 0.3, "poison_fraction": 0.05, "processing_time": "30ms"},
        max_reconsume_times=3,
    ),
    group(
        "push",
        flavor="rocketmq5.push",
        workload={"messages": 200, "over": "1m"},
        behavior={"fail_probability": 0.4, "processing_time": "10ms"},
        max_reconsume_times=2,
    ),
    horizon="30m",
)


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("lean"))
    full = simulate(spark, SCENARIO, output=output, run_id="full", validate=False)
    lean = simulate(spark, SCENARIO, output=output, run_id="lean", tables="lean")
    return full, lean


def without_run(df):
    return df.drop("run_id").orderBy(*[c for c in df.columns if c != "run_id"])


def test_lean_run_stores_no_transitions_or_messages(runs):
    full, _ = runs
    for name in ("transitions", "messages"):
        stored = deltalake.DeltaTable(f"{full.output}/{name}").to_pandas()
        assert set(stored["run_id"]) == {"full"}, name
    recorded = deltalake.DeltaTable(f"{full.output}/runs").to_pandas().set_index("run_id")
    assert recorded.loc["lean", "tables"] == "lean"
    assert recorded.loc["full", "tables"] == "full"


@pytest.mark.parametrize("name", ["transitions", "messages", "attempts", "summary"])
def test_lean_run_reads_as_the_full_run(runs, name):
    full, lean = runs
    assert lean.table(name).count() > 0
    assert_df_equality(without_run(lean.table(name)), without_run(full.table(name)))


def test_sql_views_cover_both_runs(spark, runs):
    full, _ = runs
    assert "transitions" in register_views(spark, full.output)
    counts = {
        r["run_id"]: r["n"]
        for r in spark.sql(
            "SELECT run_id, count(*) AS n FROM transitions WHERE state = 'DLQ' GROUP BY run_id"
        ).collect()
    }
    assert counts["full"] == counts["lean"] > 0
    per_run = spark.sql("SELECT run_id, count(*) AS n FROM messages GROUP BY run_id")
    assert {r["run_id"]: r["n"] for r in per_run.collect()} == {"full": 500, "lean": 500}


def test_unknown_tables_mode_is_refused(spark, tmp_path):
    with pytest.raises(ScenarioError, match="--tables"):
        simulate(spark, SCENARIO, output=str(tmp_path), tables="tiny")
    assert not any(tmp_path.iterdir())


def test_lean_through_the_command_line(tmp_path):
    command = [
        str(PROJECT / "spark-submit.sh"), "jobs/simulate.py", "--output", str(tmp_path),
        "--run-id", "cli-lean", "--master", "local[1]", "--tables", "lean", "--quiet",
        "--set", "groups.0.workload.messages=300",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tables (delta-spark, lean)" in done.stdout  # the JARs setup fetched
    assert not (tmp_path / "transitions").exists()
    assert deltalake.DeltaTable(str(tmp_path / "attempts")).to_pandas()["run_id"].nunique() == 1
