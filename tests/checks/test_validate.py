"""retrysim.checks.validate: passes on real runs, catches each broken invariant on tiny tables.

The hand-made run has one group and two messages over a one-bucket horizon: message 0
commits at its first delivery; message 1 fails (RECONSUME_LATER, level 3 on the schedule
topic), is Ready again on the retry topic 10 s later and commits. Each test breaks one
thing and checks which invariants report it.
"""

from __future__ import annotations

import copy
import os
import shutil
from argparse import Namespace
from dataclasses import dataclass

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

import retrysim.runner
import retrysim.tables.staging
from retrysim.checks import invariants as inv
from retrysim.checks.invariants import INVARIANTS
from retrysim.checks.rows import checked_counts, delivery_rows
from retrysim.checks.validate import (
    Report,
    ValidationError,
    load_ends,
    published_tables,
    validate_output,
    validate_tables,
    whole_chains,
)
from retrysim.cli import simulate as simulate_cli
from retrysim.cli.common import EXIT_FAILED
from retrysim.cli.main import main as cli_main
from retrysim.cli.validate import validate_command
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import build_scenario
from retrysim.store.sinks import arrow_schema, read_table, table_path
from retrysim.tables.schemas import ALL_SCHEMAS, SCHEMAS, TABLE_ORDER

RUN, G = "hand", "g"
SCHEDULE, RETRY = "SCHEDULE_TOPIC_XXXX", "%RETRY%g"
OK, LATER = "CONSUME_SUCCESS", "RECONSUME_LATER"


def _attempt(msg, delivery, rt, topic, queue, ready, end, outcome, state, **rest):
    """An attempt row, with the derivation columns its transitions come from: Ready
    (published or retry_due) on its own topic and queue, Inflight, and ``state`` at ``end``
    on the same topic and queue unless ``rest`` says otherwise."""
    row = dict(group=G, msg_id=msg, delivery=delivery, reconsume_times=rt,
               broker_reconsume_times=rt, source_topic=topic,
               queue_id=queue, ready_ms=ready, start_ms=ready, processing_ms=end - ready,
               end_ms=end, outcome=outcome, result_state=state, batch_size=1,
               ready_reason="published" if delivery == 1 else "retry_due", end_state=state,
               end_topic=topic, end_queue_id=queue, end_reason=outcome, born_ms=10 * msg,
               poison_fixed=False)  # fmt: skip
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
                 next_ready_ms=10_015, end_topic=SCHEDULE, end_queue_id=2, next_topic=RETRY,
                 next_queue_id=0, next_reason="retry_due"),
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
                  oldest_ready_age_ms=0, inflight_max=1, waiting_retry_max=1,
                  ready_backlog_max=0, schedule_backlog_max=[0, 0, 1], utilization_max=0.0,
                  oldest_ready_age_ms_max=0)],
    "instance_load": [dict(group=G, consumer_instance=0, bucket_start_ms=0, bucket_ms=60_000,
                           deliveries=3, ready_backlog=0, ready_backlog_max=0,
                           busy_thread_ms=15.0, utilization=0.0, utilization_max=0.0)],
    "summary": [dict(group=G, messages=2, deliveries=3, retries=1, commits=2, dlq=0, discards=0,
                     pending=0, replayed=0, amplification=1.5, commitlog_writes=4,
                     write_amplification=2.0, max_ready_backlog=0, max_waiting_retry=1,
                     peak_utilization=0.0, max_inflight=1, max_schedule_backlog=1,
                     max_oldest_ready_age_ms=0, peak_deliveries_per_s=2, peak_retries_per_s=1,
                     peak_commitlog_writes_per_s=3, engine="rounds")],
}  # fmt: skip


def frames(spark, runs: dict[str, dict[str, list[dict]]]) -> dict:
    """The eight tables holding every run of ``runs`` (run id -> rows per table)."""
    found = {}
    for name, schema in SCHEMAS.items():
        rows = [
            tuple({**row, "run_id": run}.get(f.name) for f in schema.fields)
            for run, tables in runs.items()
            for row in tables[name]
        ]
        found[name] = spark.createDataFrame(rows, schema)
    return found


def edit(**tables) -> dict[str, list[dict]]:
    changed = copy.deepcopy(HAND)
    changed.update(tables)
    return changed


def _message_0(attempt: dict, change) -> dict[str, list[dict]]:
    """The hand run with message 0's attempt updated by ``attempt`` and its transitions
    (Ready, Inflight, Commit) changed to match: a path the attempt itself describes."""
    attempts, transitions = copy.deepcopy(HAND["attempts"]), copy.deepcopy(HAND["transitions"])
    attempts[0].update(attempt)
    return edit(attempts=attempts, transitions=change(transitions[:3]) + transitions[3:])


def _illegal_first_ready():
    # a first Ready that was never published
    return _message_0({"ready_reason": "retry_due"},
                      lambda path: [{**path[0], "reason": "retry_due"}, *path[1:]])  # fmt: skip


def _ready_after_commit():
    ready = _attempt(0, 2, 1, "t", 0, 20, 20, None, "Ready", start_ms=None, processing_ms=None,
                     end_ms=None, end_state=None, end_topic=None, end_queue_id=None)  # fmt: skip
    return edit(
        attempts=[*HAND["attempts"], ready],
        transitions=[*HAND["transitions"], _transition(0, 2, 5, "Ready", 20, "t", 0, "retry_due")],
    )


def _dead_letter_after_commit():
    leave = dict(leave_state="DLQ", leave_topic="%DLQ%g", leave_queue_id=0,
                 leave_reason="max_reconsume", settled_ms=6)  # fmt: skip
    dlq = _transition(0, 1, 4, "DLQ", 6, "%DLQ%g", 0, "max_reconsume")
    return _message_0(leave, lambda path: [*path, dlq])


def _delivery_gap():
    attempts = copy.deepcopy(HAND["attempts"])
    attempts[2].update(delivery=3)
    transitions = copy.deepcopy(HAND["transitions"])
    for row in transitions[6:]:
        row.update(delivery=3, seq=row["seq"] + 4)
    return edit(attempts=attempts, transitions=transitions)


def _time_backwards():
    attempts = copy.deepcopy(HAND["attempts"])
    attempts[2]["ready_ms"] = 12  # Ready again before it went WaitingRetry at 15
    transitions = copy.deepcopy(HAND["transitions"])
    transitions[6]["at_ms"] = 12
    return edit(attempts=attempts, transitions=transitions)


def _misrouted():
    attempts = copy.deepcopy(HAND["attempts"])
    attempts[1]["next_queue_id"] = 3  # the retry is Ready on queue 0
    return edit(attempts=attempts)


def _unrouted():
    attempts = copy.deepcopy(HAND["attempts"])
    attempts[0]["next_reason"] = "retry_due"  # a commit routes no retry
    return edit(attempts=attempts)


def _message_0_twice():
    """Message 0 listed twice with its delivery and transitions, and summary and load
    counting it twice: every chain digest balances; only the ids show it."""
    summary, load = copy.deepcopy(HAND["summary"]), copy.deepcopy(HAND["load"])
    summary[0].update(
        messages=3,
        deliveries=4,
        commits=3,
        commitlog_writes=5,
        amplification=4 / 3,
        write_amplification=5 / 3,
    )
    load[0].update(deliveries=4, first_deliveries=3, commits=3, commitlog_writes=5,
                   commitlog_bytes=500, busy_thread_ms=20.0)  # fmt: skip
    instances = [{**HAND["instance_load"][0], "deliveries": 4, "busy_thread_ms": 20.0}]
    return edit(
        instance_load=instances,
        messages=[*HAND["messages"], HAND["messages"][0]],
        attempts=[*HAND["attempts"], HAND["attempts"][0]],
        transitions=[*HAND["transitions"], *HAND["transitions"][:3]],
        summary=summary,
        load=load,
    )


def _ids_apart():
    """The hand run with message 1 renumbered 1000: ids that are not one range."""
    changed = copy.deepcopy(HAND)
    for name in ("messages", "attempts", "transitions"):
        for row in changed[name]:
            row["msg_id"] = 1000 if row["msg_id"] == 1 else row["msg_id"]
    return changed


def _summary_off():
    summary = copy.deepcopy(HAND["summary"])
    summary[0]["commits"] = 1
    return edit(summary=summary)


def _load_off():
    load = copy.deepcopy(HAND["load"])
    load[0].update(commits=1, inflight=1)
    return edit(load=load)


def _peaks_off():
    """A bucket-end sample where a peak belongs: the summary's largest WaitingRetry from
    the load's bucket ends (0) instead of its peaks (1), and a load peak below its gauge."""
    summary, load = copy.deepcopy(HAND["summary"]), copy.deepcopy(HAND["load"])
    summary[0]["max_waiting_retry"] = 0
    load[0]["ready_backlog_max"] = -1
    return edit(summary=summary, load=load)


def _stray_dead_letter():
    dead = [dict(group=G, msg_id=0, dlq_topic="%DLQ%g", dlq_at_ms=5, deliveries=1,
                 origin_topic="t")]  # fmt: skip
    return edit(dead_letters=dead)


@dataclass(frozen=True)
class Broken:
    """A hand-made run with one thing broken: what must be reported, and how."""

    tables: dict[str, list[dict]]
    broken: set[str]
    examples: dict[str, str]
    exact: bool = True  # broken is the whole set, not a subset


RUNS = {
    "hand": Broken(HAND, set(), {}),
    "ids-apart": Broken(_ids_apart(), set(), {}),
    "message-twice": Broken(
        _message_0_twice(),
        {"messages_attempts", "attempts_transitions", "summary_counts"},
        {"messages_attempts": "run_id=message-twice group=g msg_id=0: 2 message row(s)",
         "attempts_transitions": "msg_id=0 delivery=1: 2 attempt row(s) ending Commit"},
    ),
    "illegal": Broken(
        _illegal_first_ready(),
        {"legal_path"},
        {"legal_path": "run_id=illegal group=g msg_id=0 delivery=1: start -> Ready (reason "
                       "retry_due)"},
        exact=False,
    ),
    "ready-after-commit": Broken(
        _ready_after_commit(),
        {"legal_path"},
        {"legal_path": "Commit -> Ready (reason retry_due)"},
        exact=False,
    ),
    "skipped-step": Broken(
        _message_0({"start_ms": None}, lambda path: [path[0], path[2]]),
        {"legal_path"},
        {"legal_path": "msg_id=0 delivery=1: start -> Ready (reason published) -> Commit"},
        exact=False,
    ),
    "state-off-its-step": Broken(
        _message_0({"end_state": "Ready"}, lambda path: [*path[:2], {**path[2], "state": "Ready"}]),
        {"seq_numbering"},
        {"seq_numbering": "3 transition(s) at steps 1..3 (seq - 4*(delivery-1))"},
        exact=False,
    ),
    # a transitions table that is not what the attempts say: found by the digest, shown
    # row by row
    "seq-off": Broken(
        edit(transitions=[*HAND["transitions"][:2], {**HAND["transitions"][2], "seq": 4},
                          *HAND["transitions"][3:]]),
        {"attempts_transitions"},
        {"attempts_transitions": "msg_id=0 delivery=1: transition seq 4 Commit at 5 ms (topic t, "
                                 "queue 0, delay level null, reason CONSUME_SUCCESS) is not one "
                                 "the attempts give"},
    ),
    "leave-after-commit": Broken(
        _dead_letter_after_commit(),
        {"legal_path"},
        {"legal_path": "start -> Ready (reason published) -> Inflight -> Commit -> DLQ"},
        exact=False,
    ),
    "gap": Broken(
        _delivery_gap(),
        {"deliveries_consecutive"},
        {"deliveries_consecutive": "run_id=gap group=g msg_id=1 delivery=3"},
    ),
    "backwards": Broken(
        _time_backwards(),
        {"time_order"},
        {"time_order": "WaitingRetry -> Ready (reason retry_due) -> Inflight -> Commit at 12, "
                       "10015, 10020 ms, after 15 ms"},
    ),
    "misrouted": Broken(
        _misrouted(),
        {"attempts_routing"},
        {"attempts_routing": "msg_id=1 delivery=1: born_ms 10 (message born 10 ms), "
                             "poison_fixed 0 after replay null; routed its retry to %RETRY%g "
                             "queue 3 (retry_due), next_ready 10015 ms; the next delivery is "
                             "Ready on %RETRY%g queue 0 (retry_due)"},
    ),
    "broker-count": Broken(
        # the retry copy's count must be the stored copy's + 1 (consumerSendMsgBack)
        edit(
            attempts=[*HAND["attempts"][:2], {**HAND["attempts"][2], "broker_reconsume_times": 0}]
        ),
        {"reconsume_times"},
        {"reconsume_times": "msg_id=1 delivery=2: reconsume_times 1 (broker 0), expected 1 "
                            "(broker 1)"},
    ),
    "born-elsewhere": Broken(
        edit(attempts=[*HAND["attempts"][:2], {**HAND["attempts"][2], "born_ms": 11}]),
        {"attempts_routing"},
        {"attempts_routing": "msg_id=1 delivery=2: born_ms 11 (message born 10 ms)"},
    ),
    "unrouted": Broken(
        _unrouted(),
        {"attempts_routing"},
        {"attempts_routing": "msg_id=0 delivery=1: born_ms 0 (message born 0 ms), poison_fixed "
                             "0 after replay null; routed its retry to null queue null "
                             "(retry_due), next_ready null ms"},
    ),
    "summary": Broken(
        _summary_off(),
        {"summary_counts"},
        {"summary_counts": "run_id=summary group=g: summary.commits (final Commit states) = 1, "
                           "expected 2"},
    ),
    "load": Broken(
        _load_off(),
        {"load_totals", "load_gauges"},
        {"load_totals": "load.commits = 1, expected 2",
         "load_gauges": "final inflight = 1, expected 0"},
    ),
    "instances": Broken(
        edit(instance_load=[{**HAND["instance_load"][0], "deliveries": 2,
                             "busy_thread_ms": 14.0}]),
        {"load_totals"},
        {"load_totals": "instance_load.busy_thread_ms = 14.0, expected 15.0"},
    ),
    "peaks": Broken(
        _peaks_off(),
        {"load_gauges"},
        {"load_gauges": "summary.max_waiting_retry (largest load.waiting_retry_max) = 0, "
                        "expected 1"},
    ),
    "dead": Broken(
        _stray_dead_letter(),
        {"dead_letters", "summary_counts"},
        {"dead_letters": "run_id=dead group=g msg_id=0 delivery=1: 1 dead letter(s)"},
    ),
    "no-message-row": Broken(
        edit(messages=HAND["messages"][:1]),
        {"messages_attempts", "summary_counts"},
        {"messages_attempts": "run_id=no-message-row group=g msg_id=1: 0 message row(s) born "
                              "at null ms (horizon 60000 ms), 1 first delivery(ies) Ready at "
                              "10 ms"},
    ),
    "no-runs-row": Broken(
        edit(runs=[]), {"runs_row"}, {"runs_row": "run_id=no-runs-row: 0 runs row(s), 0 complete"}
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def hand_report(spark) -> Report:
    """All hand-made runs checked in one pass: each run is judged on its own."""
    return validate_tables(frames(spark, {run: case.tables for run, case in RUNS.items()}))


def test_report_covers_every_run_and_invariant(hand_report):
    assert hand_report.runs == tuple(sorted(RUNS))
    assert [f.invariant for f in hand_report.findings] == list(INVARIANTS)
    assert not hand_report.ok
    assert "hand" not in hand_report.broken_by_run(), hand_report.format()
    assert "FAIL  legal_path" in hand_report.format()


@pytest.mark.parametrize("run", [run for run in RUNS if run != "hand"])
def test_broken_invariant_is_reported_with_examples(hand_report, run):
    case = RUNS[run]
    broken = hand_report.broken_by_run().get(run, set())
    if case.exact:
        assert broken == case.broken, hand_report.format()
    else:
        assert case.broken <= broken, hand_report.format()
    for name, fragment in case.examples.items():
        found = next(f for f in hand_report.findings if f.invariant.name == name)
        mine = [example for example in found.examples if f"run_id={run} " in example
                or f"run_id={run}:" in example]  # fmt: skip
        assert any(fragment in example for example in mine), (fragment, mine)


# The hand runs whose chains of deliveries stay whole: what they break is found by the
# passes without a shuffle (summary, load, the transitions digest). Every other broken run
# must fail the chain digests, which is what sends validation row by row.
WHOLE = {"hand", "ids-apart", "seq-off", "summary", "load", "instances", "peaks"}


def test_chain_digests_see_every_broken_delivery_or_message(spark):
    whole = whole_chains(frames(spark, {run: case.tables for run, case in RUNS.items()}))
    assert {run for (run, _), ok in whole.items() if ok} == WHOLE
    row_checks = {*inv.DELIVERY_CHECKS, *inv.MESSAGE_CHECKS}
    for run in WHOLE:  # consistent with what the row-by-row pass reports
        assert not RUNS[run].broken & row_checks - {"attempts_transitions"}, run


def test_each_broken_run_alone_is_reported(spark):
    """A run validated on its own (the module's report checks them all together, where one
    broken chain sends every run row by row): the fast passes decide for whole chains."""
    for run in ("hand", "load", "gap", "misrouted", "message-twice", "ids-apart"):
        report = validate_tables(frames(spark, {run: RUNS[run].tables}))
        assert report.row_by_row == (run not in WHOLE), run
        assert set(report.broken_by_run().get(run, set())) == RUNS[run].broken, report.format()


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
                      "send_back_failure_probability": 0.2,
                      "send_back_fallback_probability": 0.3},
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
        {"name": "simple", "flavor": "rocketmq5.simple", "invisible_duration": "10s",
         "max_reconsume_times": 2, "consumers": "unlimited",
         "workload": {"messages": 60, "over": "1m", "queues": 2},
         "behavior": {"fail_probability": 0.3, "poison_fraction": 0.05,
                      "processing_time": {"dist": "exponential", "mean": "3s"}}},
        {"name": "cast", "flavor": "rocketmq4.broadcasting", "consumers": "unlimited",
         "consume_timeout": "1s", "workload": {"messages": 40, "over": "1m"},
         "behavior": {"fail_probability": 0.2,
                      "processing_time": {"dist": "exponential", "mean": "1s"}}},
        # a 4.9 client's late send-backs (docs/model.md §6): listeners past the cleaner's
        # runs that then fail send a second copy, some of them to the DLQ
        {"name": "late", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 2,
         "consume_timeout": "1s", "consumers": {"instances": 1, "threads": 4},
         "workload": {"messages": 60, "over": "1m", "queues": 2},
         "behavior": {"fail_probability": 0.4,
                      "processing_time": {"dist": "exponential", "mean": "1s"}}},
        # and without a DLQ: a timed-out delivery out of retries and its copy are discarded
        {"name": "lost", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 0,
         "dlq_enabled": False, "consume_timeout": "1s",
         "consumers": {"instances": 1, "threads": 4},
         "workload": {"messages": 40, "over": "1m", "queues": 2},
         "behavior": {"fail_probability": 0.5,
                      "processing_time": {"dist": "exponential", "mean": "1s"}}},
    ],
}  # fmt: skip


def test_validator_passes_on_a_real_run(spark, real_run):
    report = validate_output(spark, real_run)
    assert report.ok, report.format()
    assert report.runs == ("real",)
    assert not report.row_by_row, "a correct run's chains of deliveries are whole"
    summary = {row["group"]: row for row in read_table(spark, real_run, "summary").collect()}
    assert summary["conc"]["replayed"] > 0  # dead letters replayed (and committed then)
    assert summary["push"]["discards"] > 0 and summary["cast"]["discards"] > 0
    assert summary["http"]["pending"] > 0  # poison messages still waiting at the horizon
    late, lost = summary["late"], summary["lost"]
    assert late["late_send_backs"] > 0 and late["engine"] == "sequential"
    assert late["commits"] + late["dlq"] + late["pending"] == 60 + late["late_send_backs"]
    assert lost["late_send_backs"] > 0 and lost["discards"] > lost["late_send_backs"]


def test_a_second_copys_missing_retry_breaks_the_chains(spark, real_run):
    """A retry of a second copy taken out of the attempts: the links its copy offered are
    no longer taken, and the row-by-row pass names the delivery."""
    tables = published_tables(spark, real_run, "real")
    copies = F.col("parent_delivery").isNotNull() & (F.col("group") == "late")
    tables["attempts"] = tables["attempts"].where(~copies)
    report = validate_tables(tables)
    assert not report.ok and report.row_by_row
    assert {"attempts_transitions", "summary_counts"} <= {f.invariant.name for f in report.broken}


def test_the_row_by_row_pass_follows_a_second_copy(spark, real_run):
    """The row-by-row pass, run on a whole run (validation runs it only on a broken one),
    finds nothing wrong where a message lives on as two copies, and counts the copies' ends
    as the digests do: each copy's retry follows the delivery it was sent back from."""
    tables = published_tables(spark, real_run, "real")
    checked = delivery_rows(tables, load_ends(tables))
    late = checked.where((F.col("group") == "late") & F.col("a_parent_delivery").isNotNull())
    assert late.count() > 0  # deliveries of a message sent back twice
    counted = {row["group"]: row for row in checked_counts(checked).collect()}
    summary = {row["group"]: row for row in read_table(spark, real_run, "summary").collect()}
    for group, row in counted.items():
        broken = {
            name: row[f"delivery_{name}"] for name in inv.DELIVERY_CHECKS if row[f"delivery_{name}"]
        }
        assert not broken, (group, broken)
        ends = (row["final_commit"], row["final_dlq"], row["final_discard"])
        want = summary[group]
        assert ends == (want["commits"], want["dlq"], want["discards"]), group


SMALL = {**SCENARIO, "groups": [{**SCENARIO["groups"][0], "workload": {"messages": 30}}]}


def delta_versions(output: str) -> dict[str, int]:
    return {table: DeltaTable(table_path(output, table)).version() for table in TABLE_ORDER}


def test_a_run_failing_validation_publishes_nothing(spark, real_run, monkeypatch):
    before = delta_versions(real_run)
    summary_from = retrysim.tables.staging.summary_from
    monkeypatch.setattr(
        retrysim.tables.staging,
        "summary_from",
        lambda *args: summary_from(*args).withColumn("commits", F.col("commits") + 1),
    )
    with pytest.raises(ValidationError, match=r"run real failed validation.*summary_counts"):
        retrysim.runner.simulate(spark, build_scenario(SMALL), output=real_run, run_id="real")
    assert delta_versions(real_run) == before, "nothing committed: the earlier version stays"
    assert not os.path.exists(os.path.join(real_run, "_staging"))


class _KeepSession:
    """The test session, for a command that stops its session when done."""

    def __init__(self, spark) -> None:
        self._spark = spark

    def __getattr__(self, name):
        return getattr(self._spark, name)

    def stop(self) -> None:
        pass


def test_validate_command(spark, real_run, monkeypatch, capsys):
    monkeypatch.setattr("retrysim.cli.validate.build_session", lambda *a, **k: _KeepSession(spark))
    assert validate_command(Namespace(output=real_run, run_id="real")) == 0
    out = capsys.readouterr().out
    assert "validating 1 run(s)" in out and out.count("  ok    ") == len(INVARIANTS)
    with pytest.raises(ScenarioError, match="--run-id: no complete run 'nope'"):
        validate_command(Namespace(output=real_run, run_id="nope"))


def test_validate_catches_a_row_appended_to_a_published_table(
    spark, real_run, tmp_path, monkeypatch, capsys
):
    """A transition appended behind the simulator's back (a Commit after a Commit): the
    command exits 1, names the invariant (the transitions are no longer what the attempts
    give) and the row."""
    output = str(tmp_path / "copy")
    shutil.copytree(real_run, output)
    row = dict(run_id="real", group="conc", msg_id=7, delivery=9, seq=35, state="Commit",
               at_ms=1, topic="t", queue_id=0, delay_level=None,
               reason="CONSUME_SUCCESS")  # fmt: skip
    schema = arrow_schema(ALL_SCHEMAS["transitions"])
    write_deltalake(table_path(output, "transitions"), pa.Table.from_pylist([row], schema=schema),
                    mode="append", partition_by=["run_id"])  # fmt: skip
    monkeypatch.setattr("retrysim.cli.validate.build_session", lambda *a, **k: _KeepSession(spark))

    assert cli_main(["validate", "--output", output, "--run-id", "real"]) == EXIT_FAILED

    out = capsys.readouterr().out
    assert "FAIL  attempts_transitions" in out and out.count("FAIL  ") == 1, out
    assert (
        "run_id=real group=conc msg_id=7 delivery=9: transition seq 35 Commit at 1 ms (topic t, "
        "queue 0, delay level null, reason CONSUME_SUCCESS) is not one the attempts give" in out
    )
    assert "invariant(s) broken" in out


def test_cli_reports_a_failed_validation_with_exit_code_1(monkeypatch, capsys):
    report = Report((RUN,), ())

    def failing(args):
        raise ValidationError(RUN, report)

    monkeypatch.setattr(simulate_cli, "simulate_command", failing)
    assert cli_main(["simulate"]) == EXIT_FAILED
    assert "retrysim: error: run hand failed validation" in capsys.readouterr().err
