"""retrysim.validate: passes on real runs, catches each broken invariant on tiny tables.

The hand-made run has one group and two messages over a one-bucket horizon: message 0
commits at its first delivery; message 1 fails (RECONSUME_LATER, level 3 on the schedule
topic), is Ready again on the retry topic 10 s later and commits. Each test breaks one
thing and checks which invariants report it.
"""

from __future__ import annotations

import copy
from argparse import Namespace

import pytest
from pyspark.sql import functions as F

import retrysim.runner
from retrysim import cli
from retrysim.config import build_scenario
from retrysim.digest import table_digests
from retrysim.sinks import read_table
from retrysim.tables import SCHEMAS
from retrysim.validate import (
    INVARIANTS,
    Report,
    ValidationError,
    validate_command,
    validate_output,
    validate_tables,
)

RUN, G = "hand", "g"
SCHEDULE, RETRY = "SCHEDULE_TOPIC_XXXX", "%RETRY%g"
OK, LATER = "CONSUME_SUCCESS", "RECONSUME_LATER"


def _attempt(msg, delivery, rt, topic, queue, ready, end, outcome, state, **rest):
    row = dict(group=G, msg_id=msg, delivery=delivery, reconsume_times=rt, source_topic=topic,
               queue_id=queue, ready_ms=ready, start_ms=ready, processing_ms=end - ready,
               end_ms=end, outcome=outcome, result_state=state, batch_size=1)  # fmt: skip
    return {**row, "settled_ms": end if state == "Commit" else None, **rest}


def _transition(msg, delivery, seq, state, at, topic, queue, reason, level=None):
    return dict(group=G, msg_id=msg, delivery=delivery, seq=seq, state=state, at_ms=at,
                topic=topic, queue_id=queue, delay_level=level, reason=reason)  # fmt: skip


HAND = {
    "runs": [dict(scenario="hand", seed=1, config_json='{"horizon": 60000}',
                  engine_version="0", spark_master="local", status="complete", rounds=2)],
    "messages": [dict(group=G, topic="t", msg_id=m, queue_id=m, born_ms=10 * m, size_bytes=100)
                 for m in (0, 1)],
    "attempts": [
        _attempt(0, 1, 0, "t", 0, 0, 5, OK, "Commit"),
        _attempt(1, 1, 0, "t", 1, 10, 15, LATER, "WaitingRetry", delay_level=3,
                 next_ready_ms=10_015),
        _attempt(1, 2, 1, RETRY, 0, 10_015, 10_020, OK, "Commit"),
    ],
    "transitions": [
        _transition(0, 1, 1, "Ready", 0, "t", 0, "published"),
        _transition(0, 1, 2, "Inflight", 0, "t", 0, "delivered"),
        _transition(0, 1, 3, "Commit", 5, "t", 0, OK),
        _transition(1, 1, 1, "Ready", 10, "t", 1, "published"),
        _transition(1, 1, 2, "Inflight", 10, "t", 1, "delivered"),
        _transition(1, 1, 3, "WaitingRetry", 15, SCHEDULE, 2, LATER, level=3),
        _transition(1, 2, 5, "Ready", 10_015, RETRY, 0, "retry_due"),
        _transition(1, 2, 6, "Inflight", 10_015, RETRY, 0, "delivered"),
        _transition(1, 2, 7, "Commit", 10_020, RETRY, 0, OK),
    ],
    "dead_letters": [],
    "load": [dict(group=G, bucket_start_ms=0, bucket_ms=60_000, deliveries=3, first_deliveries=2,
                  retries=1, commits=2, dlq=0, discards=0, inflight=0, waiting_retry=0,
                  ready_backlog=0, commitlog_writes=4, commitlog_bytes=400, replays=0,
                  schedule_backlog=[0, 0, 0], busy_thread_ms=15.0, utilization=0.0,
                  oldest_ready_age_ms=0)],
    "summary": [dict(group=G, messages=2, deliveries=3, retries=1, commits=2, dlq=0, discards=0,
                     pending=0, replayed=0, amplification=1.5, commitlog_writes=4,
                     write_amplification=2.0, max_ready_backlog=0, max_waiting_retry=1,
                     peak_utilization=0.0, engine="rounds")],
}  # fmt: skip


def check(spark, tables: dict[str, list[dict]]) -> Report:
    frames = {}
    for name, schema in SCHEMAS.items():
        rows = [tuple({**row, "run_id": RUN}.get(f.name) for f in schema.fields)
                for row in tables[name]]  # fmt: skip
        frames[name] = spark.createDataFrame(rows, schema)
    return validate_tables(frames)


def broken(report: Report) -> set[str]:
    return {finding.invariant.name for finding in report.broken}


def examples(report: Report, name: str) -> str:
    return " | ".join(next(f for f in report.findings if f.invariant.name == name).examples)


def edit(**tables) -> dict[str, list[dict]]:
    changed = copy.deepcopy(HAND)
    changed.update(tables)
    return changed


def test_hand_made_run_is_valid(spark):
    report = check(spark, HAND)
    assert report.ok, report.format()
    assert report.runs == (RUN,)
    assert [f.invariant for f in report.findings] == list(INVARIANTS)


def test_illegal_transition(spark):
    transitions = copy.deepcopy(HAND["transitions"])
    transitions[0]["reason"] = "retry_due"  # a first Ready that was never published
    report = check(spark, edit(transitions=transitions))
    assert "legal_path" in broken(report)
    assert "msg_id=0" in examples(report, "legal_path")
    assert "start -> Ready (reason retry_due)" in examples(report, "legal_path")


def test_commit_after_commit_is_illegal(spark):
    transitions = [*HAND["transitions"], _transition(0, 2, 5, "Ready", 20, "t", 0, "retry_due")]
    report = check(spark, edit(transitions=transitions))
    assert "legal_path" in broken(report)
    assert "Commit -> Ready (reason retry_due)" in examples(report, "legal_path")


def test_delivery_gap(spark):
    attempts = copy.deepcopy(HAND["attempts"])
    attempts[2].update(delivery=3, reconsume_times=2)
    transitions = copy.deepcopy(HAND["transitions"])
    for row in transitions[6:]:
        row.update(delivery=3, seq=row["seq"] + 4)
    report = check(spark, edit(attempts=attempts, transitions=transitions))
    assert broken(report) == {"deliveries_consecutive"}
    assert "msg_id=1 delivery=3" in examples(report, "deliveries_consecutive")


def test_time_going_backwards(spark):
    attempts = copy.deepcopy(HAND["attempts"])
    attempts[2]["ready_ms"] = 12  # Ready again before it went WaitingRetry at 15
    transitions = copy.deepcopy(HAND["transitions"])
    transitions[6]["at_ms"] = 12
    report = check(spark, edit(attempts=attempts, transitions=transitions))
    assert broken(report) == {"time_order"}
    assert "WaitingRetry -> Ready at seq 5 (delivery 2) at 12 ms, after 15 ms" in examples(
        report, "time_order"
    )


def test_summary_count_that_does_not_reconcile(spark):
    summary = copy.deepcopy(HAND["summary"])
    summary[0]["commits"] = 1
    report = check(spark, edit(summary=summary))
    assert broken(report) == {"summary_counts"}
    assert "summary.commits (final Commit states) = 1, expected 2" in examples(
        report, "summary_counts"
    )


def test_load_count_that_does_not_reconcile(spark):
    load = copy.deepcopy(HAND["load"])
    load[0].update(commits=1, inflight=1)
    report = check(spark, edit(load=load))
    assert broken(report) == {"load_totals", "load_gauges"}
    assert "load.commits = 1, expected 2" in examples(report, "load_totals")
    assert "final inflight = 1, expected 0" in examples(report, "load_gauges")


def test_dead_letter_without_a_dlq_delivery(spark):
    dead = [dict(group=G, msg_id=0, dlq_topic="%DLQ%g", dlq_at_ms=5, deliveries=1,
                 origin_topic="t")]  # fmt: skip
    report = check(spark, edit(dead_letters=dead))
    assert broken(report) == {"dead_letters", "summary_counts"}
    assert "msg_id=0 delivery=1: 1 dead letter(s)" in examples(report, "dead_letters")


def test_run_without_runs_row(spark):
    report = check(spark, edit(runs=[]))
    assert broken(report) == {"runs_row"}
    assert examples(report, "runs_row") == "run_id=hand: 0 runs row(s), 0 complete"


# --------------------------------------------------------------------------- real runs

SCENARIO = {
    "name": "validate",
    "seed": 5,
    "horizon": "2h",
    "load_bucket": "7m",  # the horizon is not a whole number of buckets
    "groups": [
        {"name": "conc", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 2,
         "consumers": "unlimited", "workload": {"messages": 150, "over": "2m", "queues": 2},
         "behavior": {"fail_probability": 0.3, "poison_fraction": 0.05, "processing_time": "1s",
                      "send_back_failure_probability": 0.2},
         "replay": {"at": "40m", "rate": "1/s"}},
        {"name": "fifo", "flavor": "rocketmq4.orderly", "max_reconsume_times": 2,
         "workload": {"messages": 40, "over": "1m", "queues": 2},
         "behavior": {"fail_probability": 0.2, "processing_time": "100ms"}},
        {"name": "http", "flavor": "http.unordered", "consumers": "unlimited",
         "workload": {"messages": 60, "over": "1m", "queues": 2},
         "behavior": {"fail_probability": 0.2, "poison_fraction": 0.05, "processing_time": "1s"}},
        {"name": "push", "flavor": "rocketmq5.push", "max_reconsume_times": 1,
         "dlq_enabled": False, "consumers": {"instances": 1, "threads": 2},
         "workload": {"messages": 60, "over": "1m", "queues": 2},
         "behavior": {"fail_probability": 0.3, "processing_time": "50ms"}},
        {"name": "cast", "flavor": "rocketmq4.broadcasting", "consumers": "unlimited",
         "workload": {"messages": 40, "over": "1m"}, "behavior": {"fail_probability": 0.2}},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def real_run(spark, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("validate") / "out")
    retrysim.runner.simulate(spark, build_scenario(SCENARIO), output=output, run_id="real")
    return output


def test_validator_passes_on_a_real_run(spark, real_run):
    report = validate_output(spark, real_run)
    assert report.ok, report.format()
    assert report.runs == ("real",)
    summary = {row["group"]: row for row in read_table(spark, real_run, "summary").collect()}
    assert summary["conc"]["replayed"] > 0 and summary["conc"]["dlq"] > 0
    assert summary["push"]["discards"] > 0 and summary["cast"]["discards"] > 0
    assert summary["http"]["pending"] > 0  # poison messages still waiting at the horizon


def test_a_run_failing_validation_publishes_nothing(spark, real_run, monkeypatch):
    before = table_digests(spark, real_run, "real")
    summary_from = retrysim.runner.summary_from
    monkeypatch.setattr(
        retrysim.runner,
        "summary_from",
        lambda *args: summary_from(*args).withColumn("commits", F.col("commits") + 1),
    )
    with pytest.raises(ValidationError, match=r"run real failed validation.*summary_counts"):
        retrysim.runner.simulate(spark, build_scenario(SCENARIO), output=real_run, run_id="real")
    assert table_digests(spark, real_run, "real") == before, "the earlier version stays"


class _KeepSession:
    """The test session, for a command that stops its session when done."""

    def __init__(self, spark) -> None:
        self._spark = spark

    def __getattr__(self, name):
        return getattr(self._spark, name)

    def stop(self) -> None:
        pass


def test_validate_command(spark, real_run, monkeypatch, capsys):
    monkeypatch.setattr("retrysim.session.build_session", lambda *a, **k: _KeepSession(spark))
    assert validate_command(Namespace(output=real_run, run_id="real")) == 0
    out = capsys.readouterr().out
    assert "validating 1 run(s)" in out and out.count("  ok    ") == len(INVARIANTS)
    with pytest.raises(cli.ScenarioError, match="--run-id: no complete run 'nope'"):
        validate_command(Namespace(output=real_run, run_id="nope"))


def test_cli_reports_a_failed_validation_with_exit_code_1(monkeypatch, capsys):
    report = Report((RUN,), ())

    def failing(args):
        raise ValidationError(RUN, report)

    monkeypatch.setattr(cli, "simulate_command", failing)
    assert cli.main(["simulate"]) == cli.EXIT_FAILED
    assert "retrysim: error: run hand failed validation" in capsys.readouterr().err
