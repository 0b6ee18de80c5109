"""A scenario on a real RocketMQ 4.9.7 namesrv and broker (jvm/broker4) against retrysim's
event loop on the same messages and the same listener, through ``retrysim conformance``:
every exact figure of docs/conformance.md must agree, and the tables hold them. The test
that runs a broker is marked ``broker`` (it starts JVMs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from deltalake import DeltaTable
from support import PROJECT

from retrysim.cli.common import EXIT_BAD_INPUT, EXIT_OK

LADDER = PROJECT / "conf" / "conformance" / "ladder-4x.yaml"


def conformance(tmp_path, scenario, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "retrysim", "conformance", "--scenario", str(scenario),
               "--output", str(tmp_path / "out"), "--master", "local[1]", *args]  # fmt: skip
    return subprocess.run(
        command, cwd=PROJECT, capture_output=True, text=True, timeout=600, check=False,
        env=os.environ,
    )  # fmt: skip


@pytest.mark.broker
def test_the_ladder_on_a_real_broker_gives_retrysims_exact_figures(tmp_path):
    """conf/conformance/ladder-4x.yaml: 40 messages, 30 % failures, 10 % poison, two
    retries on a table of n-second levels, then the DLQ."""
    done = conformance(tmp_path, LADDER, "--run-id", "ladder")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.startswith("payments")]
    assert len(lines) == 16 and all(line[-1] == "yes" for line in lines)
    rows = DeltaTable(str(tmp_path / "out" / "conformance")).to_pandas()
    assert set(rows["run_id"]) == {"ladder"} and rows["within"].all()
    figures = dict(zip(rows["figure"], rows["broker"], strict=True))
    assert figures["messages"] == 40
    assert 0 < figures["retry delay, worst difference (ms)"] <= 150  # the broker is a bit late
    assert figures["duplicate deliveries"] == 0
    assert figures["p99 time to commit (ms)"] > 2_000  # the retried ones
    assert figures["puts to %DLQ%payments"] > 0  # the poison reached the DLQ
    assert figures["puts to SCHEDULE_TOPIC_XXXX"] > figures["puts to %DLQ%payments"]
    deliveries = DeltaTable(str(tmp_path / "out" / "broker_deliveries")).to_pandas()
    assert len(deliveries) == sum(
        figures[f"puts to {topic}"] for topic in ("orders", "%RETRY%payments")
    )  # every copy put on a topic the group reads was delivered once


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"flavor": "rocketmq4.orderly"}, "flavor rocketmq4.orderly: the broker harness runs"),
        ({"flavor": "rocketmq5.push", "deployment": "apsaramq"}, "deployment: apsaramq is a"),
        ({"consumers": "unlimited"}, "consumers: unlimited has no real pool"),
        ({"behavior": {"send_back_failure_probability": 0.1}}, "send-back failures cannot"),
        ({"consume_timeout": "90s"}, "consume_timeout: the 4.x client takes whole minutes"),
        ({"retry_queue_nums": 2}, "retry_queue_nums"),
        ({"replay": {"at": "20s", "rate": "10/s"}}, "replay"),
    ],
)
def test_what_the_harness_cannot_run_is_refused_in_one_line(tmp_path, change, named):
    data = yaml.safe_load(LADDER.read_text())
    data["groups"][0].update(change)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(data))
    done = conformance(tmp_path, scenario)
    assert done.returncode == EXIT_BAD_INPUT and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("retrysim: error:")]
    assert len(errors) == 1 and named in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written
