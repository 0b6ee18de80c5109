"""The session's settings for a run: the driver JVM takes the compiler directive that keeps
C2 off (commands that simulate start with it) and gives it back when a run asks for C2; a
query of Python tasks runs without whole-stage code generation, and the setting comes back."""

from __future__ import annotations

import pytest

from retrysim import session


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
