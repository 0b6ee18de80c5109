"""Same scenario, same seed → the same eight tables, whatever runs it.

One small scenario (conf/default.yaml made small with ``--set``, keeping failures, poison
messages and the outage so that retries and dead letters happen) goes through the real
launcher, ``./spark-submit.sh jobs/simulate.py``, as subprocesses:

* A: ``local[1]`` with 4 shuffle partitions;
* B: ``local[2]`` with 7 shuffle partitions, no partition coalescing and small input splits,
  so every stage is cut differently from A;
* C: A again, same run id into the same folder (the run is replaced, never duplicated).

A and B run side by side to keep the wall time down (separate folders). The digests of
all eight tables (``retrysim.checks.run_digest``) must be equal. The digest itself is unit-tested
below on small frames. test_cluster.py reuses the scenario and helpers of this module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T
from support import PROJECT, QUICK_JVM

from retrysim.checks.run_digest import digest_columns, format_digests, frame_digest, table_digests
from retrysim.store.sinks import read_table
from retrysim.tables.schemas import SCHEMAS

pytestmark = pytest.mark.spark  # spark-submit runs, each in its own JVM

SUBMIT = str(PROJECT / "spark-submit.sh")
# conf/default.yaml, small: 2,000 messages over 1 h, 5 % failures, 1 % poison, the 10m-25m
# outage; at most 3 retries, so the outage and the poison messages reach the DLQ in 4 rounds.
SMALL = (
    "groups.0.workload.messages=2000",
    "groups.0.max_reconsume_times=3",
    "groups.0.behavior.poison_fraction=0.01",
)
RUN_TIMEOUT_S = 900
# support.QUICK_JVM for both (the executor options matter on the cluster only)
QUICK_JVM_CONF = (
    f"spark.driver.extraJavaOptions={QUICK_JVM}",
    f"spark.executor.extraJavaOptions={QUICK_JVM}",
)


# where it ran and where it belongs among replications: not the run's content
RUN_LABELS = {"spark_master", "replication_of", "point", "replication"}


def simulate_command(
    output: Path, run_id: str, master: str, *conf: str, job_master: bool = False
) -> list[str]:
    """``./spark-submit.sh [--master M] [--conf ...] jobs/simulate.py ...`` for SMALL;
    ``job_master`` passes the master as the job's own ``--master`` option instead."""
    submit = [SUBMIT] if job_master else [SUBMIT, "--master", master]
    for item in (*QUICK_JVM_CONF, *conf):
        submit += ["--conf", item]
    job = ["jobs/simulate.py", "--output", str(output), "--run-id", run_id, "--quiet"]
    if job_master:
        job += ["--master", master]
    for item in SMALL:
        job += ["--set", item]
    return submit + job


def start(
    command: list[str], log: Path, stderr: Path | None = None, env: dict | None = None
) -> tuple:
    """Start a run in the background, its output going to ``log`` (a file, not a pipe:
    nothing can block on a full pipe buffer while runs go side by side); stderr too unless
    ``stderr`` names another file."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("w", encoding="utf-8") as out:
        err = stderr.open("w", encoding="utf-8") if stderr else subprocess.STDOUT
        try:
            process = subprocess.Popen(command, cwd=PROJECT, stdout=out, stderr=err, env=env)
        finally:
            if stderr:
                err.close()
    return process, stderr or log


def finish(*runs: tuple) -> None:
    """Wait for the runs; fail with the end of its log when one fails or times out."""
    for process, log in runs:
        try:
            code = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = f"timed out after {RUN_TIMEOUT_S}s"
        if code != 0:
            tail = "\n".join(log.read_text(encoding="utf-8").splitlines()[-40:])
            pytest.fail(f"{' '.join(map(str, process.args))} failed ({code}):\n{tail}")


def run(command: list[str], log: Path) -> None:
    finish(start(command, log))


def assert_same_digests(expected: dict, actual: dict, what: str) -> None:
    assert list(actual) == list(SCHEMAS), what
    different = {t: (expected[t], actual[t]) for t in SCHEMAS if expected[t] != actual[t]}
    assert not different, (
        f"{what}: tables differ (table: (expected, actual)) {different}\n"
        f"expected:\n{format_digests(expected)}\nactual:\n{format_digests(actual)}"
    )


def assert_scenario_exercised(digests: dict) -> None:
    """The scenario must produce retries and dead letters, or the comparison proves little."""
    rows = {table: count for table, (count, _digest) in digests.items()}
    assert rows["runs"] == 1
    assert rows["summary"] == 1
    assert rows["messages"] == 2000
    assert rows["attempts"] > rows["messages"], "no retries happened"
    assert rows["dead_letters"] > 0, "no message reached the DLQ"


@pytest.mark.slow
def test_same_tables_on_local1_local2_and_a_repeat(spark, tmp_path):
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    fast = ("spark.sql.shuffle.partitions=4",)
    other = (
        "spark.sql.shuffle.partitions=7",
        "spark.sql.adaptive.coalescePartitions.enabled=false",
        "spark.sql.files.maxPartitionBytes=65536",
        "spark.default.parallelism=3",
    )
    a = start(simulate_command(out_a, "det", "local[1]", *fast), tmp_path / "a.log")
    b = start(simulate_command(out_b, "det-b", "local[2]", *other), tmp_path / "b.log")
    finish(a, b)
    digests_a = table_digests(spark, str(out_a), "det")
    digests_b = table_digests(spark, str(out_b), "det-b")
    assert_scenario_exercised(digests_a)
    assert_same_digests(digests_a, digests_b, "local[1] vs local[2] with other partitioning")

    # The digest command, side by side with the repeat run.
    command = [sys.executable, "-m", "retrysim", "digest", "--output", str(out_b)]
    printed = tmp_path / "digest.out"
    quick = {"JAVA_TOOL_OPTIONS": QUICK_JVM}
    cli = start([*command, "--run-id", "det-b"], printed, tmp_path / "digest.err", quick)
    run(simulate_command(out_a, "det", "local[1]", *fast), tmp_path / "c.log")
    finish(cli)
    assert printed.read_text(encoding="utf-8") == format_digests(digests_b) + "\n"

    digests_c = table_digests(spark, str(out_a), "det")
    assert_same_digests(digests_a, digests_c, "repeat run (same run id, same folder)")
    assert read_table(spark, str(out_a), "runs").count() == 1


# --------------------------------------------------------------------------- the digest


@pytest.fixture(scope="module")
def rows(spark):
    schema = "a long, b string, c double"
    data = [(i, None if i % 7 == 0 else f"s{i % 13}", i / 3) for i in range(500)]
    return spark.createDataFrame(data, schema)


def test_digest_ignores_order_and_partitioning(rows):
    columns = ["a", "b", "c"]
    expected = frame_digest(rows, columns)
    assert expected[0] == 500
    assert frame_digest(rows.repartition(7, "b").orderBy(F.rand(3)), columns) == expected
    assert frame_digest(rows.coalesce(1).orderBy(F.desc("a")), columns) == expected


def test_digest_sees_one_changed_value_duplicates_and_null_positions(spark, rows):
    columns = ["a", "b", "c"]
    expected = frame_digest(rows, columns)
    changed = rows.withColumn("c", F.when(F.col("a") == 17, F.lit(0.5)).otherwise(F.col("c")))
    assert frame_digest(changed, columns)[1] != expected[1]
    doubled = rows.unionByName(rows.where(F.col("a") == 1))
    assert frame_digest(doubled, columns) != expected
    left = spark.createDataFrame([(None, "1")], "x string, y string")
    right = spark.createDataFrame([("1", None)], "x string, y string")
    assert frame_digest(left, ["x", "y"]) != frame_digest(right, ["x", "y"])


def test_digest_sum_does_not_overflow_under_ansi(spark):
    """Row hashes near ±2^63 summed as long would raise under ANSI; the decimal sum wraps
    modulo 2^64 instead."""
    assert spark.conf.get("spark.sql.ansi.enabled") in ("true", None)
    frame = spark.range(20_000).select(F.col("id"), (F.col("id") * 7919).alias("k"))
    count, digest = frame_digest(frame, ["id", "k"])
    assert count == 20_000
    hashes = frame.select(
        F.xxhash64(F.col("id").isNull(), "id", F.col("k").isNull(), "k").alias("h")
    )
    with pytest.raises(Exception, match=r"(?i)overflow"):
        hashes.agg(F.sum("h")).first()
    total = hashes.agg(F.sum(F.col("h").cast("decimal(38,0)"))).first()[0]
    assert isinstance(total, Decimal)
    assert digest == f"{int(total) % 2**64:016x}"


def test_digest_of_nothing(spark, tmp_path):
    empty = spark.createDataFrame([], "a long")
    assert frame_digest(empty, ["a"]) == (0, "0000000000000000")
    digests = table_digests(spark, str(tmp_path), "no-such-run")
    assert digests == {table: (0, "0000000000000000") for table in SCHEMAS}


def test_digest_columns_exclude_only_run_specific_ones():
    """Every schema column is hashed but run_id, wall-clock timestamps and the master; new
    columns are picked up from SCHEMAS without a change here."""
    for table, schema in SCHEMAS.items():
        excluded = {
            field.name
            for field in schema.fields
            if field.name == "run_id"
            or isinstance(field.dataType, T.TimestampType)
            or (table == "runs" and field.name in RUN_LABELS)
        }
        expected = [name for name in schema.fieldNames() if name not in excluded]
        assert digest_columns(table) == expected
        assert expected, table
    runs = digest_columns("runs")
    assert not RUN_LABELS & set(runs)
    assert not {"run_id", "started_at", "finished_at", "spark_master"} & set(runs)
    assert {"scenario", "seed", "config_json", "status"} <= set(runs)
