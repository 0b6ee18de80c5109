"""A real Spark standalone cluster on loopback gives the same eight tables as local mode.

``scripts/local-cluster.sh`` starts one master and two workers (separate JVMs, one core
each) on free ports with its state in a temporary folder, so a cluster someone already runs
from ``.cluster/`` is not disturbed. The small scenario of test_determinism.py then runs:

* on the cluster, with the master as spark-submit's option (``--master spark://...``),
* in ``local[2]``, side by side with the first,
* on the cluster again, with the master as the job's own option (``jobs/simulate.py
  --master spark://...``) into the same folder as the first cluster run.

All eight tables' digests must be equal, every commit must be delta-spark's, the executors
of both workers must have received the package zip and the Delta Lake JAR (the cached one
from spark-submit.sh, then the one ``--packages`` resolves, as docs/cluster.md shows), and
the cluster is stopped afterwards even when the test fails (fixture teardown), with nothing
of it left running. Not skipped anywhere: a cluster that cannot
start is a failure with the script's message and the daemons' log lines.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable
from test_determinism import (
    PROJECT,
    assert_same_digests,
    assert_scenario_exercised,
    finish,
    run,
    simulate_command,
    start,
)

from retrysim.checks.run_digest import table_digests
from retrysim.store.sinks import read_table
from retrysim.tables.schemas import SCHEMAS

pytestmark = pytest.mark.spark  # spark-submit runs, each in its own JVM

SCRIPT = str(PROJECT / "scripts" / "local-cluster.sh")
HOST = "127.0.0.1"


@dataclass
class Cluster:
    url: str
    ui: str
    state: Path
    env: dict[str, str]


def free_ports(count: int) -> list[int]:
    """Ports free right now on loopback (held open together, so they are distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cluster_script(action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, action], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300
    )


def processes_under(state: Path) -> dict[int, str]:
    """Processes whose command line or working directory lies in ``state``: the daemons,
    and the executors and Python workers the workers started in their work dirs."""
    found, inside = {}, f"{state}/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if inside in args or f"{cwd}/".startswith(inside):
            found[int(entry.name)] = args[:200]
    return found


def cluster_env(state: Path, master_port: int, ui_port: int) -> dict[str, str]:
    return {
        **os.environ,
        "RETRYSIM_CLUSTER_DIR": str(state),
        "RETRYSIM_CLUSTER_HOST": HOST,
        "RETRYSIM_MASTER_PORT": str(master_port),
        "RETRYSIM_MASTER_UI_PORT": str(ui_port),
        "RETRYSIM_WORKER_UI_PORT": "0",
        "RETRYSIM_WORKERS": "2",
        "RETRYSIM_WORKER_CORES": "1",
        "RETRYSIM_WORKER_MEMORY": "2g",
        "RETRYSIM_CLUSTER_TIMEOUT": "180",
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("cluster")
    env: dict[str, str] = {}
    try:
        for _attempt in range(3):  # a port picked free may be taken before the master binds
            master_port, ui_port = free_ports(2)
            env = cluster_env(state, master_port, ui_port)
            started = cluster_script("start", env)
            if started.returncode == 0 or "is in use" not in started.stderr:
                break
        if started.returncode != 0:
            pytest.fail(
                f"scripts/local-cluster.sh start failed (exit {started.returncode}):\n"
                f"{started.stdout}\n{started.stderr}",
                pytrace=False,
            )
        yield Cluster(f"spark://{HOST}:{master_port}", f"http://{HOST}:{ui_port}", state, env)
    finally:
        if env:  # never run stop without this test's own RETRYSIM_CLUSTER_DIR
            stop_and_check(state, env)


def stop_and_check(state: Path, env: dict[str, str]) -> None:
    """Stop the cluster; nothing started in its folder may be left running."""
    stopped = cluster_script("stop", env)
    deadline = time.monotonic() + 30  # executors exit after their worker
    while (left := processes_under(state)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:  # only processes in this test's own cluster folder
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not left, f"still running after stop: {left}"
    status = cluster_script("status", env)
    assert status.returncode == 3, status.stdout


def completed_apps(cluster: Cluster, expected: int) -> list[dict]:
    """The master's completed applications, once there are ``expected`` of them (a driver
    that just exited may take a moment to be marked finished)."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(f"{cluster.ui}/json/", timeout=10) as reply:
            apps = json.load(reply)["completedapps"]
        if len(apps) >= expected or time.monotonic() > deadline:
            return apps
        time.sleep(0.5)


@pytest.mark.slow
def test_cluster_gives_the_same_tables_as_local_mode(spark, cluster, tmp_path):
    status = cluster_script("status", cluster.env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert cluster.url in status.stdout
    assert status.stdout.count(" ALIVE ") == 2, status.stdout
    again = cluster_script("start", cluster.env)
    assert again.returncode == 0 and "already running" in again.stdout, again.stdout

    on_cluster, on_local = tmp_path / "cluster", tmp_path / "local"
    first = start(simulate_command(on_cluster, "cl", cluster.url), tmp_path / "cl.log")
    local = start(simulate_command(on_local, "lo", "local[2]"), tmp_path / "lo.log")
    finish(first, local)
    # two replications simulated together: both runs' keys are the tasks of one stage,
    # spread over both workers; the first replication is the scenario's own seed. Delta
    # comes as docs/cluster.md shows a cluster user adding it: --packages, resolved by
    # Spark (its Ivy cache after the first time), not the cached JARs
    job_option = simulate_command(on_cluster, "cl-job", cluster.url, job_master=True)
    job_option += ["--replications", "2"]
    package = f"io.delta:delta-spark_2.13:{importlib.metadata.version('delta-spark')}"
    job_option[1:1] = ["--packages", package]
    assert "--master" not in job_option[: job_option.index("jobs/simulate.py")]
    run(job_option, tmp_path / "cl-job.log")

    expected = table_digests(spark, str(on_local), "lo")
    assert_scenario_exercised(expected)
    for run_id in ("cl", "cl-job-r1"):
        actual = table_digests(spark, str(on_cluster), run_id)
        assert_same_digests(expected, actual, f"cluster run {run_id} vs local[2]")
    second = table_digests(spark, str(on_cluster), "cl-job-r2")
    assert second != expected, "the second replication runs under its own seed"

    runs = read_table(spark, str(on_cluster), "runs").select("run_id", "spark_master")
    masters = {row["run_id"]: row["spark_master"] for row in runs.collect()}
    assert masters == {"cl": cluster.url, "cl-job-r1": cluster.url, "cl-job-r2": cluster.url}
    for log in ("cl.log", "cl-job.log"):
        assert "shipping the package to executors" in (tmp_path / log).read_text()
    for table in SCHEMAS:  # every commit on the cluster went through delta-spark
        made_by = {c.get("engineInfo", "") for c in DeltaTable(f"{on_cluster}/{table}").history()}
        assert all("Delta-Lake/" in engine for engine in made_by), (table, made_by)
    apps = completed_apps(cluster, 2)
    assert len(apps) == 2, apps
    for worker in ("worker-1", "worker-2"):  # both workers ran executors of both apps
        work = cluster.state / "work" / worker
        shipped = list(work.glob("app-*/*/retrysim-*.zip"))
        assert len(shipped) == 2, (worker, shipped)
        delta = sorted(path.name for path in work.glob("app-*/*/*delta-spark_2.13-*.jar"))
        assert len(delta) == 2, (worker, delta)  # the cached JAR, and the resolved package


def test_start_fails_clearly_when_the_master_port_is_taken(tmp_path):
    state = tmp_path / "cluster"
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        (ui_port,) = free_ports(1)
        env = cluster_env(state, port, ui_port)
        result = cluster_script("start", env)
    assert result.returncode == 1
    assert f"port {port} on {HOST} is in use" in result.stderr
    assert not processes_under(state)
    assert cluster_script("status", env).returncode == 3
