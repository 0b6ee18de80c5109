"""The command line bends to a new user: ``--unset`` (and ``KEY=null``) to switch flavors, a
misspelt option or command named with the nearest one under the program name run, output
folders that cannot be written named as such, input checked before a JVM starts under
spark-submit.sh, and ``--dry-run``. No Spark here: a JVM that would start is a fake one
that leaves a marker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import PROJECT

from retrysim.cli.arguments import job_parser
from retrysim.cli.main import main
from retrysim.cli.precheck import JOBS
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import load_scenario

EXIT_BAD_INPUT = 2


def _error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("retrysim: error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr and "usage:" not in stderr
    return errors[0]


# --------------------------------------------------------------------------- --unset


def test_unset_and_null_return_a_key_to_its_default_so_a_flavor_can_be_switched():
    switch = ["--set", "groups.0.flavor=rocketmq5.simple"]
    with pytest.raises(
        ScenarioError, match=r"consume_timeout: does not apply to rocketmq5\.simple"
    ):
        load_scenario(None, job_parser("simulate", "x").parse_args(switch).overrides)
    for first in (
        ["--unset", "groups.0.consume_timeout"],
        ["--set", "groups.0.consume_timeout=null"],
    ):
        args = job_parser("simulate", "x").parse_args([*first, *switch])
        group = load_scenario(args.scenario, args.overrides).groups[0]
        assert (group.flavor, group.consume_timeout) == ("rocketmq5.simple", None)
    # by group name too, and a list item set to null leaves its list
    scenario = load_scenario(None, ["groups.order-service.behavior.outages.0=null"])
    assert scenario.groups[0].behavior.outages == ()


def test_unset_of_a_key_the_file_does_not_set_is_a_no_op_but_a_misspelt_one_is_named():
    assert load_scenario(None, ["groups.0.ack_index=null"]) == load_scenario(None)
    with pytest.raises(ScenarioError) as refused:
        load_scenario(None, ["groups.0.consume_timout=null"])
    assert str(refused.value) == (
        "--set: groups.0.consume_timout: unknown key 'consume_timout'; did you mean "
        "'consume_timeout'?"
    )


# --------------------------------------------------------------------------- did you mean


def _precheck(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retrysim.cli.precheck", *args], cwd=PROJECT, capture_output=True,
        text=True, timeout=60, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_a_misspelt_option_is_named_with_the_nearest_under_the_program_name_run():
    ran = "./spark-submit.sh jobs/simulate.py"
    done = _precheck("jobs/simulate.py", "--sceanrio", "x.yaml", env={"RETRYSIM_PROG": ran})
    assert done.returncode == EXIT_BAD_INPUT
    assert _error_line(done.stderr) == (
        "retrysim: error: unknown option --sceanrio; did you mean --scenario? "
        f"(options: {ran} --help)"
    )


def test_misspelt_commands_and_choices_get_the_nearest_one(capsys):
    for argv, expect in (
        (["simulat"], "unknown command 'simulat'; did you mean 'simulate'? (commands: simulate"),
        (["runs", "lst"], "unknown command 'lst'; did you mean 'list'?"),
        (["plan", "--taget", "dlq=0"], "unknown option --taget; did you mean --target? "
         "(options: retrysim plan --help)"),
        (["simulate", "--tables", "leen"], "--tables: value 'leen': must be one of full, lean; "
         "did you mean 'lean'?"),
        (["simulate", "--unset", "a=b"], "--unset: value 'a=b': give a key alone"),
        ([], "a command is required: simulate, digest, validate, plan, plans, report, runs"),
        (["runs"], "a command is required: list, show, delete, vacuum, optimize"),
        (["digest", "--output", "x"], "--run-id: is required"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as ended:
            main(argv)
        assert ended.value.code == EXIT_BAD_INPUT
        assert expect in _error_line(capsys.readouterr().err), argv


def test_every_job_runs_the_command_the_precheck_checks_it_as():
    for job, command in JOBS.items():
        assert f'run_job("{command}")' in (PROJECT / "jobs" / job).read_text(encoding="utf-8")
    assert sorted(path.name for path in (PROJECT / "jobs").glob("*.py")) == sorted(JOBS)


# --------------------------------------------------------------------------- --output


@pytest.mark.parametrize("command", ["simulate", "plan", "conformance"])
def test_an_output_folder_on_a_virtual_file_system_is_named_as_such(command, capsys):
    for extra in ([], ["--force"] if command != "conformance" else []):
        code = main([command, "--output", "/proc/x", *extra])
        assert code == EXIT_BAD_INPUT
        assert _error_line(capsys.readouterr().err) == (
            "retrysim: error: --output: /proc/x: /proc is on a virtual file system that stores "
            "no files; give a folder on a disk"
        )
    assert not os.path.exists("/proc/x")


# --------------------------------------------------------------------------- before the JVM


@pytest.fixture
def fake_java(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose every ``java`` leaves ``marker`` and fails: a JVM start shows."""
    marker = tmp_path / "java-started"
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n", encoding="utf-8")
    java.chmod(0o755)
    path = f"{home / 'bin'}:{os.environ['PATH']}"
    return {**os.environ, "JAVA_HOME": str(home), "PATH": path}, marker


def _submit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["./spark-submit.sh", *args], cwd=PROJECT, capture_output=True, text=True, timeout=120,
        check=False, env=env,
    )  # fmt: skip


def test_bad_input_under_spark_submit_is_refused_before_a_jvm_starts(fake_java, tmp_path):
    env, marker = fake_java
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    out = str(tmp_path / "out")
    for args, expect in (
        (["jobs/simulate.py", "--sceanrio", "x.yaml"], "unknown option --sceanrio; did you mean "
         "--scenario? (options: ./spark-submit.sh jobs/simulate.py --help)"),
        (["jobs/simulate.py", "--scenario", str(empty), "--output", out], f"--scenario: {empty} "
         "is empty"),
        (["jobs/capacity_plan.py", "--output", "/proc/x"], "--output: /proc/x: /proc is on a "
         "virtual file system"),
        (["jobs/conformance.py", "--set", "groups.0.flavr=x", "--output", out],
         "groups[0].flavr: unknown key; did you mean 'flavor'?"),
    ):  # fmt: skip
        done = _submit(env, *args)
        assert done.returncode == EXIT_BAD_INPUT, done.stderr
        assert expect in _error_line(done.stderr), args
        assert done.stdout == ""
        assert not marker.exists(), f"a JVM started for {args}"
    assert sorted(os.listdir(tmp_path)) == ["empty.yaml", "jdk"]


def test_dry_run_prints_the_plan_writes_nothing_and_starts_no_jvm(fake_java, tmp_path):
    env, marker = fake_java
    out = tmp_path / "out"
    done = _submit(env, "jobs/simulate.py", "--output", str(out), "--set",
                   "groups.0.workload.messages=2000", "--dry-run")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "retrysim: dry run of default: nothing is simulated or written"
    engine = [line for line in lines if "engine" in line]
    assert len(engine) == 1 and re.fullmatch(
        r"retrysim: group order-service: engine sequential \(event by event\); about "
        r"[\d,]+ deliveries \(x2\.\d\d per message\), [\d.]+ [KM]iB of disk",
        engine[0],
    ), lines
    assert re.fullmatch(
        r"retrysim: estimate: about [\d.]+ [KM]iB of disk at .*, about \d+ s launch to exit on a "
        r"quiet 2-core machine(; about \d+ s now \(load [\d.]+\))?",
        lines[-1],
    )
    assert not marker.exists()
    assert not out.exists()
    helped = _submit(env, "jobs/simulate.py", "--help")
    assert helped.returncode == 0
    assert helped.stdout.startswith("usage: ./spark-submit.sh jobs/simulate.py [-h]")
    assert not marker.exists()


def test_the_precheck_imports_neither_spark_nor_the_engines():
    """spark-submit.sh runs it before every job: it stays light (about 0.15 s on 2 cores)."""
    code = (
        "import sys, retrysim.cli.precheck; print(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'pyspark', 'pandas', 'numba', 'deltalake', 'pyarrow', 'matplotlib'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"


def test_a_plans_dry_run_prints_each_point_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    sweep = ["--sweep", "consumers.instances=2,4", "--target", "p99_time_to_commit=1m"]
    args = ["plan", "--scenario", "conf/flash-sale.yaml", *sweep, "--output", str(out)]
    assert main([*args, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "retrysim: dry run of a plan of flash-sale: nothing is simulated or written"
    for number, instances in ((1, 2), (2, 4)):
        assert re.fullmatch(
            rf"retrysim: point {number} \(groups\.checkout\.consumers\.instances={instances}\): "
            r"group checkout sequential, about [\d,]+ deliveries; about \d+ s",
            lines[number],
        ), lines
    estimate = r"retrysim: estimate: 2 points, about \d+ s launch to exit on a quiet 2-core "
    assert re.fullmatch(estimate + r"machine(; about \d+ s now \(load [\d.]+\))?", lines[3])
    assert not out.exists()
