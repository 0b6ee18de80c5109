"""Atomic, idempotent runs under faults and concurrency (retrysim.store.recovery).

* a driver killed with SIGKILL after round 2 leaves no row of its run (neither deltalake
  nor read_table sees one); the same run id then completes;
* publishing a run id again replaces it (same rows, not doubled);
* a failure between two table commits leaves no row of its run: rolled back at once, or,
  when the process could not roll back, hidden from read_table and removed by recovery;
* two runs writing to one output at the same time both complete (commit races retried,
  including two writers creating a table), and validation passes on both;
* leases: a live writer's partial run is never recovered; dead writers are recognised.

Subprocesses run ``python -m retrysim`` with a quick JVM (C1 only, serial GC) to save CPU.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import functions as F
from support import (
    PROJECT,
    PUBLISHED_BEFORE_THE_FAILURE,
    QUICK_JVM,
    FailingDeadLetters,
    FailingDeadLettersSpark,
)

from retrysim.checks.validate import validate_output
from retrysim.runner import simulate
from retrysim.scenario.loading import build_scenario
from retrysim.store import recovery
from retrysim.store.lease import acquire_lease, holders
from retrysim.store.recovery import publish_run, recover
from retrysim.store.sinks import DeltaRsSink, DeltaSparkSink, arrow_schema, read_table, table_path
from retrysim.tables.schemas import PARTITION_COLUMN, SCHEMAS, TABLE_ORDER, data_schema

pytestmark = pytest.mark.spark  # spark-submit runs, each in its own JVM

SCENARIO = {
    "name": "atomic",
    "seed": 11,
    "horizon": "30m",
    "load_bucket": "1m",
    "groups": [
        {
            "name": "pay",
            "flavor": "rocketmq4.concurrently",
            "max_reconsume_times": 3,
            "consumers": "unlimited",
            "workload": {"messages": 300, "over": "1m", "queues": 2},
            "behavior": {
                "fail_probability": 0.3,
                "poison_fraction": 0.02,
                "processing_time": "20ms",
            },
        }
    ],
}
SUBPROCESS_TIMEOUT_S = 240


def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    if not path.exists():  # written once: a second writer must not truncate it under a reader
        path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False), encoding="utf-8")
    return path


ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
    "PYSPARK_SUBMIT_ARGS": f'--driver-java-options "{QUICK_JVM}" pyspark-shell',
}


def cli(tmp_path: Path, output: Path, run_id: str, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "retrysim", "simulate", "--scenario",
               str(scenario_file(tmp_path)), "--output", str(output), "--run-id", run_id,
               "--master", "local[1]", *extra]  # fmt: skip
    return subprocess.Popen(
        command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=ENV, start_new_session=True,  # its own process group: the JVM can be reaped too
    )  # fmt: skip


def reap(process: subprocess.Popen[str]) -> None:
    """Wait for ``process``; then end what is left of its process group (its JVM)."""
    process.wait(timeout=SUBPROCESS_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def delta_run_ids(output: Path, table: str) -> set[str]:
    path = table_path(str(output), table)
    if not DeltaTable.is_deltatable(path):
        return set()
    return {part[PARTITION_COLUMN] for part in DeltaTable(path).partitions()}


def delta_rows(output: Path, table: str, run_id: str) -> int:
    path = table_path(str(output), table)
    if not DeltaTable.is_deltatable(path):
        return 0
    data = DeltaTable(path).to_pyarrow_table(columns=[PARTITION_COLUMN])
    return data.column(PARTITION_COLUMN).to_pylist().count(run_id)


def assert_no_rows(spark, output: Path, run_id: str) -> None:
    for table in SCHEMAS:
        assert delta_rows(output, table, run_id) == 0, f"{table} holds rows of {run_id}"
        shown = read_table(spark, str(output), table, complete_only=False)
        assert shown.where(F.col(PARTITION_COLUMN) == run_id).count() == 0, table


def assert_complete(spark, output: Path, run_id: str, messages: int = 300) -> None:
    assert read_table(spark, str(output), "runs").where(F.col("run_id") == run_id).count() == 1
    for table in SCHEMAS:
        assert delta_rows(output, table, run_id) > 0, f"{table} has no rows of {run_id}"
    assert delta_rows(output, "messages", run_id) == messages


def _stage(folder: Path, table: str, rows: list[dict]) -> str:
    folder.mkdir(parents=True)
    schema = arrow_schema(data_schema(SCHEMAS[table]))
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "part-0.parquet")
    return str(folder)


MESSAGE = {"group": "g", "topic": "t", "msg_id": 0, "queue_id": 0, "born_ms": 0, "size_bytes": 1}


def _runs_row(status: str) -> dict:
    return {"scenario": "s", "seed": 1, "config_json": "{}", "status": status, "rounds": 1}


# --------------------------------------------------------------------------- faults


def test_killed_run_leaves_nothing_and_then_completes(spark, tmp_path):
    output = tmp_path / "out"
    process = cli(tmp_path, output, "killed", "--tail-rows", "0")  # a Spark stage per round
    watchdog = threading.Timer(SUBPROCESS_TIMEOUT_S, process.kill)
    watchdog.start()
    seen = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            seen.append(line)
            if line.startswith("retrysim: round 2:"):
                os.kill(process.pid, signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
        reap(process)
    assert process.returncode == -signal.SIGKILL, "".join(seen[-20:])

    assert_no_rows(spark, output, "killed")
    dead = [h for h in holders(str(output)) if h.run_id == "killed"]
    assert dead and not any(h.alive for h in dead), "the killed writer's lease stays, dead"
    assert any(p.is_dir() for p in (output / "_staging").iterdir()), "its staging is left"

    result = simulate(spark, build_scenario(SCENARIO), output=str(output), run_id="killed")

    assert_complete(spark, output, "killed")
    assert result.summary.first()["messages"] == 300
    assert not (output / "_staging").exists(), "the dead writer's staging was cleaned up"


def staged_run(folder: Path, status: str = "complete") -> tuple[dict[str, str], str]:
    """One row per table, staged as Parquet like a run about to publish; and its marker."""
    rows = {table: [{}] for table in SCHEMAS} | {"messages": [MESSAGE], "runs": [_runs_row(status)]}
    staged = {table: _stage(folder / table, table, rows[table]) for table in SCHEMAS}
    return staged, _stage(folder / "marker", "runs", [_runs_row("publishing")])


@pytest.mark.parametrize("failing", [FailingDeadLetters, FailingDeadLettersSpark],
                         ids=["delta-rs", "delta-spark"])  # fmt: skip
def test_failure_between_table_commits_is_rolled_back(spark, tmp_path, failing):
    output = tmp_path / "out"
    lease = acquire_lease(str(output), "half")
    staged, marker = staged_run(Path(lease.staging))
    sink = failing()
    with pytest.raises(RuntimeError, match="injected failure before publishing dead_letters"):
        publish_run(sink, spark, str(output), staged, marker, lease)
    lease.release()
    assert sink.published[0] == "runs" and set(sink.published) == PUBLISHED_BEFORE_THE_FAILURE
    assert_no_rows(spark, output, "half")
    assert not (output / "_staging").exists()


def test_rerun_replaces_and_a_crashed_half_published_run_is_hidden_then_removed(
    spark, tmp_path, monkeypatch
):
    output = tmp_path / "out"
    for again in range(2):  # publishing a run id again replaces it
        done = acquire_lease(str(output), "done")
        publish_run(DeltaRsSink(), spark, str(output), *staged_run(tmp_path / f"done{again}"),
                    done)  # fmt: skip
        done.release()
    assert {table: delta_rows(output, table, "done") for table in SCHEMAS} == dict.fromkeys(
        SCHEMAS, 1
    )
    versions = {t: DeltaTable(table_path(str(output), t)).version() for t in TABLE_ORDER}
    # runs: publishing + complete per run; every data table: one commit per run
    assert versions["runs"] == 3 and all(versions[t] == 1 for t in TABLE_ORDER if t != "runs")
    lease = acquire_lease(str(output), "half")
    with monkeypatch.context() as patch:  # the process "dies" before it can roll back
        patch.setattr(recovery, "remove_runs", lambda output, run_ids: None)
        with pytest.raises(RuntimeError, match="injected failure"):
            publish_run(FailingDeadLetters(), spark, str(output),
                        *staged_run(Path(lease.staging)), lease)  # fmt: skip
    for table in ("runs", "messages", "attempts", "transitions"):
        assert delta_rows(output, table, "half") > 0, table
    for table in SCHEMAS:  # read_table never shows the half-published run
        shown = read_table(spark, str(output), table).select(PARTITION_COLUMN).distinct()
        assert [row[0] for row in shown.collect()] == ["done"], table
    assert recover(str(output)).runs == [], "a live writer's run is never removed"

    lease.release()  # its heartbeat stops, as when the process is gone
    assert recover(str(output)).runs == ["half"]

    assert_no_rows(spark, output, "half")
    for table in SCHEMAS:
        assert delta_run_ids(output, table) == {"done"}, table


# --------------------------------------------------------------------------- concurrency


def test_two_concurrent_runs_both_complete(spark, tmp_path):
    output = tmp_path / "out"
    processes = {run: cli(tmp_path, output, run) for run in ("left", "right")}
    logs = {}
    for run, process in processes.items():
        logs[run], _ = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
        reap(process)
    for run, process in processes.items():
        assert process.returncode == 0, logs[run][-3000:]

    for table in SCHEMAS:
        assert delta_run_ids(output, table) == {"left", "right"}, table
    assert_complete(spark, output, "left")
    assert_complete(spark, output, "right")
    statuses = read_table(spark, str(output), "runs").select("run_id", "status").collect()
    assert sorted(map(tuple, statuses)) == [("left", "complete"), ("right", "complete")]
    same = {table: delta_rows(output, table, "left") for table in SCHEMAS}
    assert same == {table: delta_rows(output, table, "right") for table in SCHEMAS}

    report = validate_output(spark, str(output))
    assert report.ok and report.runs == ("left", "right"), report.format()


@pytest.mark.parametrize("sink", [DeltaRsSink(), DeltaSparkSink()], ids=lambda s: s.name)
def test_commit_races_to_create_and_update_a_table_are_retried(spark, tmp_path, sink):
    """Six writers at once into one table, which none of them finds: one creates it, the
    others lose the race (delta-rs' conflicts, Delta Lake's ConcurrentAppend and
    ProtocolChanged exceptions), retry, and land."""
    output, writers = tmp_path / "out", 6
    staged = [_stage(tmp_path / f"s{i}", "messages", [MESSAGE]) for i in range(writers)]
    start, errors = threading.Barrier(writers), []

    def publish(index: int) -> None:
        start.wait()
        try:
            sink.publish(spark, str(output), "messages", staged[index], f"r{index}")
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert delta_run_ids(output, "messages") == {f"r{i}" for i in range(writers)}
    assert len(DeltaTable(table_path(str(output), "messages")).history()) == writers


# --------------------------------------------------------------------------- leases


def test_recovery_spares_live_writers_and_complete_runs(tmp_path):
    output = tmp_path / "out"
    sink = DeltaRsSink()

    def publish(run_id: str, status: str) -> None:
        folder = tmp_path / "staged" / run_id
        sink.publish(None, str(output), "runs", _stage(folder / "r", "runs", [_runs_row(status)]),
                     run_id)  # fmt: skip
        sink.publish(None, str(output), "messages", _stage(folder / "m", "messages", [MESSAGE]),
                     run_id)  # fmt: skip

    publish("done", "complete")
    lease = acquire_lease(str(output), "live")
    try:
        publish("live", "publishing")
        assert recover(str(output)).runs == []
        assert delta_run_ids(output, "messages") == {"done", "live"}
    finally:
        lease.release()
    assert recover(str(output)).runs == ["live"]
    assert delta_run_ids(output, "messages") == delta_run_ids(output, "runs") == {"done"}
