"""The launcher starts the driver JVM from the class archive that scripts/class-archive.sh
records (JDK class data sharing; docs/cluster.md): the classes a run loads come mapped
from the archive, not loaded one by one from Spark's jars."""

from __future__ import annotations

import os
import subprocess

import pytest
from support import PROJECT

pytestmark = pytest.mark.spark  # a spark-submit run in its own JVM

ARCHIVE_SCRIPT = str(PROJECT / "scripts" / "class-archive.sh")


def test_the_driver_maps_spark_classes_from_the_archive(tmp_path):
    found = subprocess.run([ARCHIVE_SCRIPT], capture_output=True, text=True, check=True)
    archive = found.stdout.strip()
    assert archive.endswith(".jsa") and os.path.isfile(archive), found.stderr
    log = tmp_path / "classes.log"
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"-Xlog:class+load=info:file={log}"}
    env.pop("SPARK_CONF_DIR", None)
    run = subprocess.run(
        [str(PROJECT / "spark-submit.sh"), "jobs/simulate.py", "--output", str(tmp_path / "out"),
         "--quiet", "--no-report", "--no-validate", "--set", "groups.0.workload.messages=200"],
        cwd=PROJECT, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = log.read_text().splitlines()
    archived = [line for line in loaded if "source: shared objects file (top)" in line]
    spark = [line for line in archived if " org.apache.spark." in line]
    # about 15,000 of a run's classes come from the archive, thousands of them Spark's
    assert len(archived) > 5000 and len(spark) > 1000, (len(archived), len(spark))
    assert "Unable to use shared archive" not in run.stderr
