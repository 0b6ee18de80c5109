"""The Delta Lake JARs: fetched once with Maven, then every start reads the cache.

* the cache holds delta-spark and delta-storage at the installed delta-spark package's
  version, and the project names no repository (Maven's own configuration decides);
* with the network cut (a network namespace of its own, only loopback up), a run of the
  README's first command commits through delta-spark: no resolver is asked;
* with the network cut and nothing cached (an offline laptop's first start), the launcher
  says so in one line and the run commits with delta-rs.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import PROJECT

from retrysim.session import delta_jar_paths

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # spark-submit runs

# spelled apart: this file is among those searched
MAVEN_HOST, REPOSITORIES, REPOSITORY = (
    "maven" + ".apache.org",
    "<reposi" + "tories>",
    "<reposi" + "tory>",
)
SMALL = ("--set", "groups.0.workload.messages=2000", "--set", "horizon=1h")
CUT = 'ip link set lo up && exec "$@"'  # a namespace's loopback starts down


def offline(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` in a network namespace of its own: loopback only, nothing outside."""
    return subprocess.run(
        ["unshare", "--net", "sh", "-c", CUT, "sh", *command], cwd=PROJECT, env=env,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def can_cut_the_network() -> str | None:
    """Why a network namespace cannot be made here (no unshare, no privilege), or None."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "unshare or ip (util-linux, iproute2) not found"
    probe = subprocess.run(["unshare", "--net", "sh", "-c", CUT, "sh", "true"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    return None if probe.returncode == 0 else f"unshare --net: {probe.stderr.strip()}"


NO_NAMESPACE = can_cut_the_network()
needs_namespace = pytest.mark.skipif(NO_NAMESPACE is not None, reason=f"{NO_NAMESPACE}")


def test_the_cache_holds_the_installed_version_and_no_repository_is_named():
    version = importlib.metadata.version("delta-spark")
    assert version.startswith("4.1.")
    names = sorted(Path(jar).name for jar in delta_jar_paths())
    assert f"delta-spark_2.13-{version}.jar" in names
    assert f"delta-storage-{version}.jar" in names
    assert not [n for n in names if n.startswith(("scala-library", "log4j", "slf4j"))], names
    tracked = subprocess.run(["git", "ls-files"], cwd=PROJECT, capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
    for name in tracked:
        path = PROJECT / name
        if path.is_file() and path.suffix in (".xml", ".sh", ".py", ".toml", ".md", ".conf"):
            text = path.read_text(encoding="utf-8", errors="replace")
            assert REPOSITORIES not in text and REPOSITORY not in text, name
            assert MAVEN_HOST not in text and "repo1" + ".maven" not in text, name


@needs_namespace
def test_a_start_with_the_jars_cached_asks_no_resolver(tmp_path):
    assert delta_jar_paths(), "run-tests.sh fetches the JARs before the tests"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    command = ["./spark-submit.sh", "jobs/simulate.py", "--output", str(tmp_path / "out"), *SMALL]
    done = offline(command, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "committed 8 tables with the delta-spark sink" in done.stdout
    assert "fetching" not in done.stderr and "Ivy" not in done.stderr, done.stderr[-2000:]


@needs_namespace
def test_where_nothing_can_be_fetched_one_line_says_so_and_delta_rs_commits(tmp_path):
    empty_cache, empty_repository = tmp_path / "jars", tmp_path / "m2"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "RETRYSIM_JARS_DIR": str(empty_cache),
        "MAVEN_OPTS": f"-Dmaven.repo.local={empty_repository}",  # nothing cached by Maven
    }
    command = ["./spark-submit.sh", "jobs/simulate.py", "--output", str(tmp_path / "out"), *SMALL]
    done = offline(command, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "Delta Lake JARs" in line]
    assert len(said) == 1, done.stderr[-3000:]
    assert said[0].startswith("retrysim: fetching the Delta Lake JARs")
    assert said[0].endswith("committing with delta-rs") and "failed (mvn: " in said[0]
    assert "committed 8 tables with the delta-rs sink" in done.stdout
    assert not list(empty_cache.glob("delta-*/*.jar"))
    again = offline(command, env)  # within the hour: not tried again, said again
    assert again.returncode == 0
    (line,) = [line for line in again.stderr.splitlines() if "Delta Lake JARs" in line]
    assert line.startswith("retrysim: no Delta Lake JARs (mvn: ")


def test_the_launcher_adds_the_jars_to_the_users_own_class_path_settings(tmp_path):
    """A class path or JAR list given as --conf keeps its entries and gains the cached JARs
    (spark-submit's --driver-class-path or --jars flag would replace the setting), and the
    session names retrysim's log store."""
    job = tmp_path / "show_conf.py"
    job.write_text(
        "from retrysim.session import build_session\n"
        "conf = build_session(master='local[1]').sparkContext.getConf()\n"
        "for key in ('spark.driver.extraClassPath', 'spark.jars', "
        "'spark.delta.logStore.file.impl'):\n"
        "    print(key, conf.get(key, ''))\n"
    )
    own = sorted((PROJECT / ".venv").glob("lib/python3*/site-packages/pyspark/jars/zstd-*.jar"))[0]
    command = ["./spark-submit.sh", "--conf", "spark.driver.extraClassPath=/opt/user/extra.jar",
               f"--conf=spark.jars=file://{own}", str(job)]  # fmt: skip
    done = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = dict(
        line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith("spark.")
    )
    path, jars = shown["spark.driver.extraClassPath"].split(":"), shown["spark.jars"].split(",")
    assert path[0] == "/opt/user/extra.jar" and jars[0].endswith(own.name), shown
    for jar in delta_jar_paths():
        assert jar in path and any(j.endswith(Path(jar).name) for j in jars), (jar, shown)
    assert shown["spark.delta.logStore.file.impl"] == "retrysim.delta.LocalFileLogStore"
