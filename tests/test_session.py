"""The session's settings for a run: the driver JVM takes the compiler directive that keeps
C2 off (commands that simulate start with it) and gives it back when a run asks for C2; a
query of Python tasks runs without whole-stage code generation, and the setting comes back;
the driver and the workers import the installed, compiled pyspark."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from retrysim import session
from tests.support import PROJECT


def _directives(spark) -> str:
    return str(session._diagnostic_command(spark.sparkContext._gateway, "compilerDirectivesPrint"))


def test_the_driver_jvm_compiles_with_c1_alone_until_a_run_asks_for_c2(spark):
    before = _directives(spark)
    assert not session.light_jit()
    session._compile_lightly(spark.sparkContext._gateway)
    try:
        assert session.light_jit()
        directives = _directives(spark)
        assert directives.count("Directive:") == before.count("Directive:") + 1
        ours = directives.split("Directive:")[1]  # the newest first
        assert "matching: *.*" in ours
        assert "Exclude:true" in ours.split("c2 directives:")[1]
        assert "Exclude:true" not in ours.split("c2 directives:")[0]
    finally:
        session.full_jit(spark)
    assert not session.light_jit()
    assert _directives(spark) == before
    session.full_jit(spark)  # a second time: nothing to give back
    assert _directives(spark) == before


def _codegen_stages(df) -> int:
    plan = df._jdf.queryExecution().executedPlan().toString()
    return plan.count("*(")  # whole-stage code generation marks its operators "*(n)"


def test_a_query_of_python_tasks_runs_without_code_generation_and_the_setting_comes_back(spark):
    key = "spark.sql.codegen.wholeStage"
    before = spark.conf.get(key)
    assert _codegen_stages(spark.range(4)) > 0
    with session.python_tasks(spark):
        assert spark.conf.get(key) == "false"
        assert _codegen_stages(spark.range(4)) == 0
    assert spark.conf.get(key) == before
    with pytest.raises(RuntimeError), session.python_tasks(spark):
        raise RuntimeError("the query failed")
    assert spark.conf.get(key) == before


def test_the_driver_and_the_workers_import_the_installed_pyspark_not_its_zip(tmp_path):
    """Spark puts SPARK_HOME/python/lib/pyspark.zip first on each Python process's path; setup
    puts this venv's zips last, so that a driver under spark-submit, a worker daemon and its
    workers import pyspark's compiled modules from site-packages."""
    job = tmp_path / "where.py"
    job.write_text(
        textwrap.dedent("""
        import json, os, sys
        import pyspark
        from retrysim.session import build_session

        def where(batches):
            import pyarrow as pa
            for _ in batches:
                yield pa.RecordBatch.from_pylist([{"file": pyspark.__file__,
                                                   "path": os.environ["PYTHONPATH"]}])

        spark = build_session("where", "local[1]")
        columns = "file string, path string"
        (worker,) = spark.range(1, numPartitions=1).mapInArrow(where, columns).collect()
        print(json.dumps({"driver": pyspark.__file__, "driver_path": os.environ["PYTHONPATH"],
                          "worker": worker["file"], "worker_path": worker["path"]}))
        spark.stop()
    """)
    )
    done = subprocess.run(["./spark-submit.sh", str(job)], cwd=PROJECT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    installed = str(PROJECT / ".venv")
    for side in ("driver", "worker"):
        assert "pyspark.zip" in found[f"{side}_path"]  # Spark put its zip first, as ever
        assert found[side].startswith(installed) and ".zip" not in found[side]
