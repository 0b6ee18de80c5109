"""The CLI's bad-input contract, end to end through ``python -m retrysim simulate``.

Every case fails before Spark starts: exit code 2, exactly one ``retrysim: error:`` line on
stderr naming the field and what is allowed, and nothing written.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import PROJECT

from retrysim.scenario.errors import ScenarioError

EXIT_BAD_INPUT = 2
DELETE = object()

BASE: dict[str, Any] = {
    "name": "bad-input",
    "seed": 1,
    "horizon": "1h",
    "broker": {"message_delay_level": "1s 5s 10s"},
    "groups": [
        {
            "name": "g",
            "topic": "orders",
            "flavor": "rocketmq4.concurrently",
            "max_reconsume_times": -1,
            "consume_timeout": "15m",
            "consumers": {"instances": 1, "threads": 2},
            "workload": {"messages": 10, "over": "1m", "queues": 2, "size_bytes": 100},
            "behavior": {
                "fail_probability": 0.1,
                "poison_fraction": 0.0,
                "processing_time": {"dist": "lognormal", "mean": "50ms", "p99": "400ms"},
                "outages": [{"start": "10m", "end": "25m", "fail_probability": 1.0}],
            },
        }
    ],
}


def edit(**changes: Any) -> str:
    """BASE as YAML with dotted-path changes (``groups__0__behavior__x`` style keys)."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node: Any = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        if value is DELETE:
            del node[key]
        else:
            node[key] = value
    return yaml.safe_dump(data, sort_keys=False)


VALID = edit()


@dataclass(frozen=True)
class Case:
    id: str
    expect: tuple[str, ...]  # substrings of the error line: the field, then what is allowed
    scenario: str | None = VALID  # YAML text; None: no scenario file at all
    args: tuple[str, ...] = ()
    output: str = "out"  # relative to tmp_path
    setup: Callable[[Path], None] | None = None  # prepares tmp_path before the run


def _file(relative: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / relative).write_text("not a folder\n", encoding="utf-8")

    return setup


def _directory_as_scenario(tmp: Path) -> None:
    (tmp / "scenario.yaml").mkdir()


g0 = "groups__0__"
b0 = "groups__0__behavior__"

CASES = [
    # --- the file itself
    Case(
        "malformed-yaml",
        ("--scenario", "is not valid YAML at line 3", "expected ',' or '}'"),
        scenario="groups: [\n  {name: a\n",
    ),
    Case(
        "yaml-list",
        ("--scenario", "holds a list of 2 items, not a mapping of keys"),
        scenario="- a\n- b\n",
    ),
    Case("yaml-scalar", ("--scenario", "holds a single value ('x'), not a mapping"), scenario="x"),
    Case("yaml-empty", ("--scenario", "is empty; a scenario is a mapping of keys"), scenario=""),
    Case("yaml-comments-only", ("--scenario", "is empty"), scenario="# nothing yet\n"),
    Case("missing-file", ("--scenario", "cannot read", "No such file or directory"), scenario=None),
    Case(
        "scenario-is-directory",
        ("--scenario", "cannot read", "Is a directory"),
        scenario=None,
        setup=_directory_as_scenario,
    ),
    # --- unknown keys
    Case(
        "unknown-top-level-key",
        ("groupz: unknown key", "did you mean 'groups'?", "Allowed keys: broker, groups"),
        scenario=VALID.replace("groups:", "groupz:"),
    ),
    Case(
        "unknown-group-key",
        ("groups[0].max_reconsume_time: unknown key", "did you mean 'max_reconsume_times'?"),
        scenario=VALID.replace("max_reconsume_times:", "max_reconsume_time:"),
    ),
    Case(
        "unknown-behavior-key",
        ("groups[0].behavior.fail_prob: unknown key", "did you mean 'fail_probability'?"),
        scenario=VALID.replace("fail_probability: 0.1", "fail_prob: 0.1"),
    ),
    Case(
        "unknown-broker-key",
        ("broker.messageDelayLevel: unknown key", "Allowed keys: message_delay_level"),
        scenario=VALID.replace("message_delay_level:", "messageDelayLevel:"),
    ),
    # --- types and counts
    Case(
        "messages-not-a-number",
        ("groups[0].workload.messages", "'many'", "valid integer"),
        edit(**{g0 + "workload__messages": "many"}),
    ),
    Case(
        "messages-fractional",
        ("groups[0].workload.messages", "1.5", "valid integer"),
        edit(**{g0 + "workload__messages": 1.5}),
    ),
    Case(
        "messages-zero",
        ("groups[0].workload.messages", "value 0", "between 1 and 10,000,000,000"),
        edit(**{g0 + "workload__messages": 0}),
    ),
    Case(
        "messages-negative",
        ("groups[0].workload.messages", "value -5", "between 1 and 10,000,000,000"),
        edit(**{g0 + "workload__messages": -5}),
    ),
    Case(
        "queues-zero",
        ("groups[0].workload.queues", "between 1 and 65,536"),
        edit(**{g0 + "workload__queues": 0}),
    ),
    Case(
        "threads-zero",
        ("groups[0].consumers.threads", "between 1 and 1,000"),
        edit(**{g0 + "consumers__threads": 0}),
    ),
    Case(
        "arrival-unknown",
        ("groups[0].workload.arrival", "'uniform', 'poisson', 'profile' or 'file'"),
        edit(**{g0 + "workload__arrival": "burst"}),
    ),
    Case(
        "dlq-enabled-not-boolean",
        ("groups[0].dlq_enabled", "'maybe'", "valid boolean"),
        edit(**{g0 + "dlq_enabled": "maybe"}),
    ),
    Case("seed-negative", ("seed", "between 0 and 9,223,372,036,854,775,807"), edit(seed=-1)),
    # --- durations
    Case(
        "duration-malformed",
        ("groups[0].workload.over", "'10x'", "ms, s, m, h or d"),
        edit(**{g0 + "workload__over": "10x"}),
    ),
    Case(
        "duration-words",
        ("groups[0].consume_timeout", "'5 parsecs'", "ms, s, m, h or d"),
        edit(**{g0 + "consume_timeout": "5 parsecs"}),
    ),
    Case("duration-unknown-unit", ("horizon", "'10y'", "ms, s, m, h or d"), edit(horizon="10y")),
    Case(
        "duration-bare-number",
        ("groups[0].behavior.outages[0].start", "malformed duration 600", "e.g. 1500ms"),
        edit(**{b0 + "outages__0__start": 600}),
    ),
    Case("horizon-zero", ("horizon", "'0s'", "between 1ms and 366d"), edit(horizon="0s")),
    Case("horizon-negative", ("horizon", "'-1h'"), edit(horizon="-1h")),
    Case("load-bucket-tiny", ("load_bucket", ">= 100ms"), edit(load_bucket="1ms")),
    Case(
        "consume-timeout-too-small",
        ("groups[0].consume_timeout", "'10ms'", "between 1s and 1d"),
        edit(**{g0 + "consume_timeout": "10ms"}),
    ),
    # --- probabilities
    Case(
        "fail-probability-above-1",
        ("groups[0].behavior.fail_probability", "1.5", "between 0 and 1"),
        edit(**{b0 + "fail_probability": 1.5}),
    ),
    Case(
        "fail-probability-negative",
        ("groups[0].behavior.fail_probability", "-0.1", "between 0 and 1"),
        edit(**{b0 + "fail_probability": -0.1}),
    ),
    Case(
        "poison-fraction-2",
        ("groups[0].behavior.poison_fraction", "value 2", "between 0 and 1"),
        edit(**{b0 + "poison_fraction": 2}),
    ),
    Case(
        "outage-fail-probability",
        ("groups[0].behavior.outages[0].fail_probability", "between 0 and 1"),
        edit(**{b0 + "outages__0__fail_probability": 1.2}),
    ),
    Case(
        "start-at-not-a-timestamp",
        ("start_at", "value '2026-11-31T08:00:00Z'", "expected an ISO 8601 date and time"),
        edit(start_at="2026-11-31T08:00:00Z"),
    ),
    Case(
        "downstream-capacity-zero",
        ("groups[0].behavior.downstream.capacity", "value 0: must be between 1 and 1,000,000"),
        edit(**{b0 + "downstream": {"capacity": 0}}),
    ),
    Case(
        "downstream-scope-unknown",
        ("groups[0].behavior.downstream.per", "'host'", "'group' or 'instance'"),
        edit(**{b0 + "downstream": {"capacity": 4, "per": "host"}}),
    ),
    Case(
        "downstream-shared-by-broadcasting-instances",
        ("groups[0].behavior.downstream.per", "value 'group'", "follows one instance", "2"),
        edit(
            **{
                g0 + "flavor": "rocketmq4.broadcasting",
                g0 + "consumers": {"instances": 2, "threads": 2},
                b0 + "downstream": {"capacity": 2},
            }
        ),
    ),
    Case(
        "fail-first-negative",
        ("groups[0].behavior.fail_first", "between 0 and 100,000"),
        edit(**{b0 + "fail_first": -1}),
    ),
    # --- flavors and groups
    Case(
        "flavor-typo",
        (
            "groups[0].flavor",
            "unknown flavor",
            "did you mean 'rocketmq4.concurrently'?",
            "allowed: rocketmq4.concurrently, rocketmq4.orderly",
        ),
        edit(**{g0 + "flavor": "rocketmq4.concurent"}),
    ),
    Case(
        "flavor-missing",
        ("groups[0].flavor", "is required", "allowed: rocketmq4.concurrently", "pubsub"),
        edit(**{g0 + "flavor": DELETE}),
    ),
    Case(
        "duplicate-group-names",
        ("groups", "duplicate group names ['g']", "each group needs its own name"),
        edit(groups=[BASE["groups"][0], BASE["groups"][0]]),
    ),
    Case("groups-empty", ("groups", "must list at least one item"), edit(groups=[])),
    Case(
        "groups-missing", ("groups", "is required", "list of consumer groups"), edit(groups=DELETE)
    ),
    # --- broker delay table
    Case(
        "delay-table-bad-token",
        ("broker.message_delay_level", "level 2 token '5q'", "s, m, h, d"),
        edit(broker={"message_delay_level": "1s 5q"}),
    ),
    Case(
        "delay-table-empty",
        ("broker.message_delay_level", "space-separated delays"),
        edit(broker={"message_delay_level": ""}),
    ),
    # --- consistency within a group
    Case(
        "outage-end-before-start",
        ("groups[0].behavior.outages[0]", "must be after start"),
        edit(**{b0 + "outages": [{"start": "25m", "end": "10m"}]}),
    ),
    Case(
        "lognormal-p99-below-mean",
        ("groups[0].behavior.processing_time", "0 < mean < p99 <= 14.97 x mean"),
        edit(**{b0 + "processing_time": {"dist": "lognormal", "mean": "400ms", "p99": "50ms"}}),
    ),
    Case(
        "lognormal-without-p99",
        ("groups[0].behavior.processing_time", "needs p99"),
        edit(**{b0 + "processing_time": {"dist": "lognormal", "mean": "50ms"}}),
    ),
    Case(
        "processing-dist-unknown",
        ("groups[0].behavior.processing_time.dist", "'constant', 'exponential' or 'lognormal'"),
        edit(**{b0 + "processing_time": {"dist": "weibull", "mean": "50ms"}}),
    ),
    Case(
        "max-reconsume-times-minus-2",
        ("groups[0].max_reconsume_times", "value -2", "between -1 and 10,000"),
        edit(**{g0 + "max_reconsume_times": -2}),
    ),
    Case(
        "delay-level-when-next-consume-minus-2",
        ("groups[0].delay_level_when_next_consume", "value -2", ">= -1"),
        edit(**{g0 + "delay_level_when_next_consume": -2}),
    ),
    # --- per-flavor ranges and keys (docs/flavors.md)
    Case(
        "send-back-failure-on-5x",
        (
            "groups[0].behavior.send_back_failure_probability",
            "applies only to rocketmq4.concurrently",
        ),
        edit(**{g0 + "flavor": "rocketmq5.push", b0 + "send_back_failure_probability": 0.1}),
    ),
    Case(
        "send-back-failure-above-1",
        ("groups[0].behavior.send_back_failure_probability", "value 1.5", "between 0 and 1"),
        edit(**{b0 + "send_back_failure_probability": 1.5}),
    ),
    Case(
        "send-back-shares-above-1",
        (
            "groups[0].behavior.send_back_fallback_probability",
            "value 0.5",
            "between 0 and 0.3",
        ),
        edit(
            **{
                b0 + "send_back_failure_probability": 0.7,
                b0 + "send_back_fallback_probability": 0.5,
            }
        ),
    ),
    Case(
        "max-retries-over-1000-on-5x",
        ("groups[0].max_reconsume_times", "value 1001", "between -1 and 1,000 for rocketmq5.push"),
        edit(**{g0 + "flavor": "rocketmq5.push", g0 + "max_reconsume_times": 1001}),
    ),
    Case(
        "max-retries-on-http",
        ("groups[0].max_reconsume_times", "must stay -1 for http.unordered", "fixed 288"),
        edit(**{g0 + "flavor": "http.unordered", g0 + "max_reconsume_times": 5}),
    ),
    Case(
        "invisible-under-10s",
        ("groups[0].invisible_duration", "'5s'", "between 10s and 12h"),
        edit(
            **{
                g0 + "flavor": "rocketmq5.simple",
                g0 + "consume_timeout": DELETE,
                g0 + "invisible_duration": "5s",
            }
        ),
    ),
    Case(
        "invisible-over-12h",
        ("groups[0].invisible_duration", "'13h'", "between 10s and 12h"),
        edit(
            **{
                g0 + "flavor": "rocketmq5.simple",
                g0 + "consume_timeout": DELETE,
                g0 + "invisible_duration": "13h",
            }
        ),
    ),
    Case(
        "invisible-on-push",
        ("groups[0].invisible_duration", "applies only to rocketmq5.simple, not to rocketmq5.push"),
        edit(**{g0 + "flavor": "rocketmq5.push", g0 + "invisible_duration": "30s"}),
    ),
    Case(
        "consume-timeout-on-simple",
        ("groups[0].consume_timeout", "does not apply to rocketmq5.simple", "invisible_duration"),
        edit(**{g0 + "flavor": "rocketmq5.simple"}),
    ),
    Case(
        "suspend-below-10ms",
        ("groups[0].suspend_current_queue_time", "'5ms'", "between 10ms and 30s"),
        edit(
            **{
                g0 + "flavor": "rocketmq4.orderly",
                g0 + "consume_timeout": DELETE,
                g0 + "suspend_current_queue_time": "5ms",
            }
        ),
    ),
    Case(
        "suspend-above-30s",
        ("groups[0].suspend_current_queue_time", "'31s'", "between 10ms and 30s"),
        edit(
            **{
                g0 + "flavor": "rocketmq4.orderly",
                g0 + "consume_timeout": DELETE,
                g0 + "suspend_current_queue_time": "31s",
            }
        ),
    ),
    Case(
        "suspend-on-concurrently",
        ("groups[0].suspend_current_queue_time", "applies only to rocketmq4.orderly"),
        edit(**{g0 + "suspend_current_queue_time": "1s"}),
    ),
    Case(
        "suspend-on-ordered-push",
        (
            "groups[0].suspend_current_queue_time",
            "applies only to rocketmq4.orderly",
            "not to rocketmq5.push",
        ),
        edit(
            **{
                g0 + "flavor": "rocketmq5.push",
                g0 + "ordered": True,
                g0 + "suspend_current_queue_time": "1s",
            }
        ),
    ),
    Case(
        "retry-policy-unknown-kind",
        ("groups[0].retry_policy.kind", "'linear'", "exponential, customized, grpc_client"),
        edit(**{g0 + "flavor": "rocketmq5.push", g0 + "retry_policy": {"kind": "linear"}}),
    ),
    Case(
        "retry-policy-on-4x",
        ("groups[0].retry_policy", "does not apply to rocketmq4.concurrently", "takes none"),
        edit(**{g0 + "retry_policy": {"kind": "exponential"}}),
    ),
    Case(
        "exponential-max-below-initial",
        ("groups[0].retry_policy", "max (1s) must be >= initial"),
        edit(
            **{
                g0 + "flavor": "exponential",
                g0 + "retry_policy": {"kind": "exponential", "initial": "5s", "max": "1s"},
            }
        ),
    ),
    Case(
        "pubsub-attempts-below-5",
        ("groups[0].retry_policy.max_delivery_attempts", "value 4", "between 5 and 100"),
        edit(
            **{
                g0 + "flavor": "pubsub",
                g0 + "consume_timeout": DELETE,
                g0 + "retry_policy": {"kind": "pubsub", "max_delivery_attempts": 4},
            }
        ),
    ),
    Case(
        "consumers-not-a-pool",
        ("groups[0].consumers", "'lots'", "{instances, threads} or 'unlimited'"),
        edit(**{g0 + "consumers": "lots"}),
    ),
    Case(
        "replay-rate-malformed",
        ("groups[0].replay.rate", "'fast'", "100/s, 6000/m or 1/h"),
        edit(**{g0 + "replay": {"at": "3h", "rate": "fast"}}),
    ),
    Case(
        "replay-without-dlq",
        ("groups[0].replay", "needs a dead-letter queue"),
        edit(**{g0 + "dlq_enabled": False, g0 + "replay": {"at": "3h", "rate": "10/s"}}),
    ),
    # --- the size guard (retrysim.engine.sizing): estimated from the scenario before Spark starts
    Case(
        "size-disk",
        (
            "groups[0].workload.messages",
            "the run needs about",
            "TiB of disk at",
            "free)",
            "10,000,000,000 messages x ~",
            "deliveries each",
            "pass --force to run anyway",
        ),
        edit(**{g0 + "workload__messages": 10_000_000_000, g0 + "consumers": "unlimited"}),
    ),
    Case(
        "size-memory-of-one-ordered-queue",
        (
            "groups[0].workload.messages",
            "GiB of memory in one Python task for group g",
            "10,000,000,000 messages in one key of the sequential engine",
            "--force",
        ),
        edit(
            **{
                g0 + "workload__messages": 10_000_000_000,
                g0 + "workload__queues": 1,
                g0 + "flavor": "rocketmq4.orderly",
                g0 + "consume_timeout": DELETE,
            }
        ),
    ),
    # --- command-line arguments
    Case("set-without-equals", ("--set", "expected key=value, got 'foo'"), args=("--set", "foo")),
    Case(
        "set-unknown-group-name",
        ("--set", "no list item 'nosuch'", "use an index 0..0 or ['g']"),
        args=("--set", "groups.nosuch.flavor=x"),
    ),
    Case(
        "set-bad-value",
        ("groups[0].behavior.fail_probability", "value 3", "between 0 and 1"),
        args=("--set", "groups.g.behavior.fail_probability=3"),
    ),
    Case(
        "run-id-with-slash",
        ("--run-id", "'a/b'", "letters, digits, '.', '_' or '-'"),
        args=("--run-id", "a/b"),
    ),
    Case(
        "output-is-a-file",
        ("--output", "afile is a file", "give a folder"),
        output="afile",
        setup=_file("afile"),
    ),
    Case(
        "output-parent-is-a-file",
        ("--output", "afile is a file, not a folder"),
        output="afile/out",
        setup=_file("afile"),
    ),
    # --- Spark's settings, checked before it starts (retrysim.cli.common.check_spark)
    Case(
        "master-spark-cannot-parse",
        ("--master", "value 'garbage://nowhere'", "local[N]", "spark://HOST:PORT"),
        args=("--master", "garbage://nowhere"),
    ),
    Case("master-no-threads", ("--master", "value 'local[0]'"), args=("--master", "local[0]")),
    Case(
        "master-nothing-answers",  # port 1: refused at once, as a stopped master's is
        ("--master", "no Spark master answers at 127.0.0.1:1 within 5 s", "local-cluster.sh"),
        args=("--master", "spark://127.0.0.1:1"),
    ),
]


def run_cli(
    tmp_path: Path, case: Case, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    scenario = tmp_path / "scenario.yaml"
    if case.scenario is not None:
        scenario.write_text(case.scenario, encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "retrysim",
        "simulate",
        "--scenario",
        str(scenario),
        "--output",
        str(tmp_path / case.output),
        *case.args,
    ]
    return subprocess.run(
        command, cwd=PROJECT, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def files_under(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def assert_one_error(result: subprocess.CompletedProcess[str], expect: tuple[str, ...]) -> str:
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    assert result.stdout == "", "nothing is reported as done before the input is validated"
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("retrysim: error:")]
    assert len(errors) == 1, result.stderr
    (line,) = errors
    for fragment in expect:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def test_valid_base_scenario_passes_validation():
    """The cases are single edits of BASE, so BASE itself must be valid."""
    from retrysim.scenario.loading import build_scenario

    build_scenario(yaml.safe_load(VALID))


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input(tmp_path, case):
    if case.setup is not None:
        case.setup(tmp_path)
    result_files_before = files_under(tmp_path) | (
        {"scenario.yaml"} if case.scenario is not None else set()
    )
    output = tmp_path / case.output
    existed = output.exists()

    result = run_cli(tmp_path, case)

    assert_one_error(result, case.expect)
    assert files_under(tmp_path) == result_files_before, "nothing may be written"
    if not existed:
        assert not output.exists()


def test_output_in_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: permissions do not stop writes (see output-parent-*)")
        case = Case("read-only", ("--output", "ro is not a writable folder"), output="ro/out")
        before = files_under(tmp_path) | {"scenario.yaml"}
        result = run_cli(tmp_path, case)
        assert_one_error(result, case.expect)
        assert files_under(tmp_path) == before
    finally:
        folder.chmod(0o755)


def test_output_holding_delta_table_of_another_schema(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    pyarrow = pytest.importorskip("pyarrow")
    out = tmp_path / "out"
    table = out / "attempts"
    deltalake.write_deltalake(str(table), pyarrow.table({"x": [1]}))
    version = deltalake.DeltaTable(str(table)).version()
    before = files_under(tmp_path) | {"scenario.yaml"}

    result = run_cli(tmp_path, Case("delta", ()))

    assert_one_error(
        result,
        (
            "--output",
            f"table {table} has columns ['x']",
            "this version writes ['run_id', 'group', 'msg_id'",
            "use another --output folder",
        ),
    )
    assert files_under(tmp_path) == before
    after = deltalake.DeltaTable(str(table))
    assert after.version() == version
    assert after.to_pyarrow_table().to_pydict() == {"x": [1]}


def test_size_guard_force_only_warns_and_a_normal_scenario_passes_silently(tmp_path):
    """``--force`` turns the refusal into a warning; the default scenario needs neither."""
    from retrysim.engine.sizing import check_size
    from retrysim.scenario.loading import build_scenario, load_scenario

    huge = build_scenario(yaml.safe_load(edit(**{g0 + "workload__messages": 10_000_000_000})))
    warnings: list[str] = []
    groups = check_size(huge, str(tmp_path / "out"), "local[2]", force=True, warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith("groups[0].workload.messages: the run")
    assert warnings[0].endswith("running anyway (--force)")
    assert groups[0].deliveries > 10_000_000_000

    check_size(load_scenario(None), str(tmp_path / "out"), "local[2]", warn=warnings.append)
    assert len(warnings) == 1


def test_validate_without_tables(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "retrysim", "validate", "--output", str(tmp_path / "none")],
        cwd=PROJECT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert_one_error(result, ("--output", "no retrysim tables in", "none"))
    assert not (tmp_path / "none").exists()


def test_a_delta_spark_sink_without_its_classes_stops_before_spark_starts(tmp_path):
    """Spark would start, simulate and fail at the first commit; the check says it first.
    Without the JARs: an empty cache (RETRYSIM_JARS_DIR), as where nothing was fetched."""
    case = Case(
        "delta-spark-without-classes",
        ("--delta-sink", "value 'delta-spark'", "Delta Lake classes are not on the classpath"),
        args=("--delta-sink", "delta-spark"),
    )
    (tmp_path / "no-jars").mkdir()
    before = files_under(tmp_path) | {"scenario.yaml"}
    result = run_cli(tmp_path, case, {"RETRYSIM_JARS_DIR": str(tmp_path / "no-jars")})
    assert_one_error(result, case.expect)
    assert files_under(tmp_path) == before


MASTERS_SPARK_TAKES = ("local", "local[2]", "local[*]", "local[4,3]", "local[*,2]",
                       "local-cluster[2,1,1024]", "spark://host:7077", "spark://a:1,b:2", "yarn",
                       "k8s://https://host:443")  # fmt: skip
MASTERS_SPARK_REFUSES = ("garbage://nowhere", "local[0]", "local[two]", "spark://host",
                         "spark://", "mesos://host:5050", "local [2]")  # fmt: skip


def test_the_launcher_and_the_job_take_the_same_masters():
    """spark-submit.sh stops a master Spark cannot parse in one line, exit 2, before a JVM
    starts (well under a second here); the job's own check refuses the same ones and takes
    the rest."""
    from retrysim.session import _MASTER, check_master

    for master in MASTERS_SPARK_TAKES:
        assert _MASTER.match(master), master
    for master in MASTERS_SPARK_REFUSES:
        with pytest.raises(ScenarioError, match="--master"):
            check_master(master)
        launched = subprocess.run(
            [str(PROJECT / "spark-submit.sh"), "--master", master, "jobs/simulate.py"],
            cwd=PROJECT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert launched.returncode == EXIT_BAD_INPUT, (master, launched.stderr)
        # (a fresh clone's first launch also says it sets itself up, on stderr)
        errors = [line for line in launched.stderr.splitlines() if "error" in line]
        assert errors == [
            f"retrysim: error: --master: value '{master}': use local, local[N], local[*], "
            "local[N,F], local-cluster[N,C,M], spark://HOST:PORT[,HOST:PORT...], yarn or "
            "k8s://[https://]HOST[:PORT]"
        ]
        assert not launched.stdout
        assert "class archive" not in launched.stderr  # refused before the JVM's first start


def test_under_spark_submit_the_error_line_goes_to_stderr():
    """spark-submit's Python runner merges the driver's stderr into stdout; the command sends
    its stderr to the launcher's own, so the error line is on stderr, and stdout has none."""
    launched = subprocess.run(
        [str(PROJECT / "spark-submit.sh"), "jobs/simulate.py", "--set", "foo"],
        cwd=PROJECT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert launched.returncode == EXIT_BAD_INPUT, launched.stdout + launched.stderr
    errors = [line for line in launched.stderr.splitlines() if "error" in line]
    assert errors == ["retrysim: error: --set: expected key=value, got 'foo'"]
    assert "error" not in launched.stdout
