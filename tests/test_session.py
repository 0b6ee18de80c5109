"""The session's JIT setting: the driver JVM takes the compiler directive that keeps C2
off (commands that simulate start with it) and gives it back when a run asks for C2."""

from __future__ import annotations

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
