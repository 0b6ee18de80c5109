"""Worked timelines from ROCKETMQ_SEMANTICS.md, run through the Spark engine end to end.

Expected times are written out by hand from the delay table, not computed by the engine.
"""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from support import group, scenario

from retrysim import simulate
from retrysim.engine import rounds as engine

ALWAYS_FAIL = {"behavior": {"fail_probability": 1.0}}
# Waits before retries 1..16 under the default table: levels 3..18.
DEFAULT_WAITS_S = [10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]


def _cumulative(waits: list[int]) -> list[int]:
    times, now = [0], 0
    for wait in waits:
        now += wait * 1000
        times.append(now)
    return times


def default_table_run_scenario():
    return scenario(
        group("always", **ALWAYS_FAIL),
        group("max3", max_reconsume_times=3, **ALWAYS_FAIL),
        group("dlq-now", delay_level_when_next_consume=-1, **ALWAYS_FAIL),
        group("fixed5", delay_level_when_next_consume=5, max_reconsume_times=2, **ALWAYS_FAIL),
        group("no-dlq", max_reconsume_times=1, dlq_enabled=False, **ALWAYS_FAIL),
        group("ok"),
    )


@pytest.fixture(scope="module")
def default_table_run(spark, tmp_path_factory):
    return simulate(
        spark,
        default_table_run_scenario(),
        output=str(tmp_path_factory.mktemp("timelines")),
        run_id="timelines",
        validate=False,  # the timelines are the check here; test_validate covers invariants
        tail_rows=0,  # one Spark stage per round: the column rules for every retry
        small_group=0,  # by rounds, though the pool is small
    )


def _attempts(result, name: str) -> list:
    return (
        result.attempts.where(F.col("group") == name)
        .orderBy("delivery")
        .select("delivery", "reconsume_times", "ready_ms", "result_state", "delay_level")
        .collect()
    )


def test_always_failing_message_takes_17_deliveries_and_reaches_dlq_at_17140s(default_table_run):
    rows = _attempts(default_table_run, "always")
    assert len(rows) == 17
    assert [r["ready_ms"] for r in rows] == _cumulative(DEFAULT_WAITS_S)
    assert [r["reconsume_times"] for r in rows] == list(range(17))
    assert [r["delay_level"] for r in rows[:-1]] == list(range(3, 19))
    assert rows[-1]["result_state"] == "DLQ"
    dead = default_table_run.dead_letters.where(F.col("group") == "always").collect()
    assert [(d["dlq_at_ms"], d["deliveries"], d["dlq_topic"]) for d in dead] == [
        (17_140_000, 17, "%DLQ%always")
    ]


def test_max_reconsume_times_3_gives_4_deliveries(default_table_run):
    rows = _attempts(default_table_run, "max3")
    assert [r["ready_ms"] for r in rows] == [0, 10_000, 40_000, 100_000]
    assert rows[-1]["result_state"] == "DLQ"


def test_delay_level_minus_one_sends_to_dlq_at_once(default_table_run):
    rows = _attempts(default_table_run, "dlq-now")
    assert [(r["delivery"], r["result_state"]) for r in rows] == [(1, "DLQ")]
    reason = (
        default_table_run.transitions.where((F.col("group") == "dlq-now") & (F.col("seq") == 3))
        .select("reason")
        .first()
    )
    assert reason["reason"] == "delay_level_negative"


def test_fixed_delay_level_is_used_for_every_retry(default_table_run):
    rows = _attempts(default_table_run, "fixed5")  # level 5 = 1 min, every time
    assert [r["ready_ms"] for r in rows] == [0, 60_000, 120_000]
    assert [r["delay_level"] for r in rows] == [5, 5, None]


def test_dlq_disabled_discards(default_table_run):
    rows = _attempts(default_table_run, "no-dlq")
    assert [r["result_state"] for r in rows] == ["WaitingRetry", "Discard"]


def test_success_commits_on_first_delivery(default_table_run):
    rows = _attempts(default_table_run, "ok")
    assert [(r["delivery"], r["result_state"]) for r in rows] == [(1, "Commit")]


def test_always_failing_transitions_walk_the_state_machine(default_table_run):
    states = [
        r["state"]
        for r in default_table_run.transitions.where(F.col("group") == "always")
        .orderBy("seq")
        .collect()
    ]
    assert states == ["Ready", "Inflight", "WaitingRetry"] * 16 + ["Ready", "Inflight", "DLQ"]


@pytest.mark.parametrize(
    "thin_rows, held_rows",
    [(0, 1), (10**9, 1)],
    ids=["every-round-through-files", "held-in-memory-written-every-round"],
)
def test_rounds_give_the_same_attempts_through_files_or_held_in_memory(
    spark, tmp_path, monkeypatch, default_table_run, thin_rows, held_rows
):
    """The fixture's run keeps its thin rounds in executor memory and writes them at the
    end; here every round goes through Parquet, or held rounds are written after every
    round while the next frontier still reads the last of them."""
    monkeypatch.setattr(engine, "THIN_ROWS", thin_rows)
    monkeypatch.setattr(engine, "HELD_ROWS", held_rows)
    again = simulate(
        spark,
        default_table_run_scenario(),
        output=str(tmp_path),
        run_id="timelines",
        validate=False,
        tail_rows=0,
        small_group=0,
    )
    assert again.rounds == default_table_run.rounds
    columns = [c for c in again.attempts.columns if c != "run_id"]
    assert_df_equality(
        again.attempts.select(*columns),
        default_table_run.attempts.select(*columns),
        ignore_row_order=True,
    )


def test_five_level_table_clamps_every_retry_after_the_second(spark, tmp_path):
    result = simulate(
        spark,
        scenario(
            group("custom", max_reconsume_times=5, **ALWAYS_FAIL),
            broker={"message_delay_level": "1s 2s 3s 4s 5s"},
        ),
        output=str(tmp_path),
        run_id="custom",
        validate=False,  # the timelines are the check here; test_validate covers invariants
    )
    rows = _attempts(result, "custom")
    # Retry 1 asks level 3 (3 s), retry 2 level 4 (4 s), retries 3.. level 5+ -> last (5 s).
    assert [r["ready_ms"] for r in rows] == [0, 3_000, 7_000, 12_000, 17_000, 22_000]
    assert [r["delay_level"] for r in rows] == [3, 4, 5, 5, 5, None]


# --------------------------------------------------------------------------- issue 4 timelines
# The worked examples of the seed documents and ROCKETMQ_SEMANTICS.md, for every flavor.

ALWAYS = {"fail_probability": 1.0}


@pytest.fixture(scope="module")
def flavors_run(spark, tmp_path_factory):
    return simulate(
        spark,
        scenario(
            # ApsaraMQ: Ready at 0, pulled at 5 s, fails after 6 s, 10 s interval.
            group("apsara", flavor="rocketmq5.push", deployment="apsaramq",
                  behavior={"fail_first": 1, "processing_time": "6s", "ready_wait": "5s"}),
            # Simple consumer, 30 s invisible: a failure after 10 s retries 20 s later.
            group("simple-fail", flavor="rocketmq5.simple", invisible_duration="30s",
                  behavior={"fail_first": 1, "processing_time": "10s"}),
            # ... and a run past the invisible time (40 s) is retried at once.
            group("simple-timeout", flavor="rocketmq5.simple", invisible_duration="30s",
                  behavior={"fail_first": 1, "processing_time": "40s"}),
            group("http", flavor="http.unordered", behavior=ALWAYS),
            group("orderly", flavor="rocketmq4.orderly", behavior={"fail_first": 5},
                  workload={"messages": 2, "over": "0s", "queues": 1}),
            group("broadcast", flavor="rocketmq4.broadcasting", behavior=ALWAYS),
            group("push-max3", flavor="rocketmq5.push", max_reconsume_times=3, behavior=ALWAYS,
                  deployment="apsaramq"),
            group("push-default", flavor="rocketmq5.push", behavior=ALWAYS),
            group("push-apsaramq", flavor="rocketmq5.push", behavior=ALWAYS,
                  deployment="apsaramq"),
            group("push-grpc", flavor="rocketmq5.push", retry_policy={"kind": "grpc_client"},
                  behavior=ALWAYS),
            # FIFO: local retries after the group's retry policy, the queue blocked meanwhile
            group("fifo-default", flavor="rocketmq5.push", ordered=True, behavior=ALWAYS,
                  workload={"messages": 2, "over": "0s", "queues": 1}),
            group("fifo-exponential", flavor="rocketmq5.push", ordered=True, behavior=ALWAYS,
                  max_reconsume_times=3, retry_policy={"kind": "exponential", "initial": "1s",
                                                       "max": "4s", "multiplier": 2}),
            horizon="2d",
        ),
        output=str(tmp_path_factory.mktemp("flavors")),
        run_id="flavors",
        validate=False,  # the timelines are the check here; test_validate covers invariants
    )  # fmt: skip


def _rows(result, name: str, *columns: str) -> list[tuple]:
    frame = result.attempts.where(F.col("group") == name).orderBy("msg_id", "delivery")
    return [tuple(row) for row in frame.select(*columns).collect()]


def test_apsaramq_example_consumption_interval_is_21s(flavors_run):
    rows = _rows(flavors_run, "apsara", "ready_ms", "start_ms", "end_ms", "next_ready_ms")
    assert rows[0] == (0, 5_000, 11_000, 21_000)  # 6 s processing + 10 s interval
    assert rows[1][:2] == (21_000, 26_000)  # 21 s after the first consumption started


def test_simple_consumer_retry_interval_is_invisible_time_minus_processing(flavors_run):
    failed = _rows(
        flavors_run, "simple-fail", "start_ms", "processing_ms", "end_ms", "outcome",
        "result_state", "next_ready_ms",
    )  # fmt: skip
    # the listener fails at 10 s; not acknowledged, the message stays Inflight (invisible)
    # for the 20 s left of its invisible duration and the open-source reviver's 3 s, then
    # it is Ready again
    assert failed[0] == (0, 10_000, 33_000, "RECONSUME_LATER", "Inflight", 33_000)
    timed_out = _rows(flavors_run, "simple-timeout", "start_ms", "end_ms", "outcome",
                      "next_ready_ms")  # fmt: skip
    assert timed_out[0] == (0, 33_000, "TIMEOUT", 33_000)  # Ready as soon as revived
    assert timed_out[1][0] == 33_000


def test_http_unordered_retries_every_5_minutes_and_stops_after_288(flavors_run):
    rows = _rows(flavors_run, "http", "delivery", "ready_ms", "result_state", "settled_ms")
    assert len(rows) == 289
    assert [r[1] for r in rows] == [n * 300_000 for n in range(289)]
    assert rows[-1][2:] == ("DLQ", 289 * 300_000)  # one interval after the last failure


def test_orderly_fails_5_times_then_succeeds_1s_apart_and_blocks_its_queue(flavors_run):
    rows = _rows(flavors_run, "orderly", "msg_id", "delivery", "start_ms", "result_state")
    first = [r for r in rows if r[0] == 0]
    assert [r[2] for r in first] == [0, 1_000, 2_000, 3_000, 4_000, 5_000]
    assert [r[3] for r in first] == ["WaitingRetry"] * 5 + ["Commit"]
    assert next(r for r in rows if r[0] == 1)[2] == 5_000  # waited behind message 0
    topics = {r["topic"] for r in flavors_run.transitions.where(F.col("group") == "orderly")
              .select("topic").collect()}  # fmt: skip
    assert topics == {"orderly"}  # local retries: no schedule, retry or DLQ topic


def test_broadcasting_never_retries(flavors_run):
    assert _rows(flavors_run, "broadcast", "delivery", "result_state") == [(1, "Discard")]
    reasons = _rows_reasons(flavors_run, "broadcast")
    assert reasons[-1] == "broadcast_no_retry"


def _rows_reasons(result, name: str) -> list[str]:
    frame = result.transitions.where(F.col("group") == name).orderBy("seq")
    return [row["reason"] for row in frame.select("reason").collect()]


def test_5x_max_retries_3_means_4_deliveries_then_dlq_after_backoff(flavors_run):
    rows = _rows(flavors_run, "push-max3", "ready_ms", "result_state", "settled_ms")
    assert [r[0] for r in rows] == [0, 10_000, 40_000, 100_000]
    assert rows[-1][1:] == ("DLQ", 100_000 + 120_000)  # the 4th retry's 2 min, then DLQ


def test_5x_ladders_of_both_deployments_and_the_grpc_client_index(flavors_run):
    ladder = _rows(flavors_run, "push-apsaramq", "ready_ms", "settled_ms")
    assert len(ladder) == 17 and ladder[-1] == (17_140_000, 17_140_000 + 7_200_000)
    grpc = _rows(flavors_run, "push-grpc", "ready_ms", "settled_ms")
    # each retry, and the dead letter, written by the open-source reviver 3 s after it is due
    assert grpc[1][0] == 1_000 + 3_000 and grpc[-1][0] == 6_346_000 + 16 * 3_000
    assert grpc[-1][1] == 6_346_000 + 3_600_000 + 17 * 3_000  # DLQ at about 2h46m37s
    # open-source RocketMQ 5, the default deployment, is the client's index
    assert _rows(flavors_run, "push-default", "ready_ms", "settled_ms") == grpc


def test_5x_fifo_retries_locally_after_the_retry_policy_and_blocks_its_queue(flavors_run):
    """rocketmq-clients ProcessQueueImpl.eraseFifoMessage: the next attempt waits
    getNextAttemptDelay(attempt) of the group's policy, indexed from its first entry (the
    server's default customized list 1s, 5s, 10s, ... 30m); the 17th failure goes to the DLQ
    at once and only then does the queue's next message start."""
    rows = _rows(flavors_run, "fifo-default", "msg_id", "start_ms", "result_state", "settled_ms")
    first = [r for r in rows if r[0] == 0]
    waits = [1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800]
    assert [r[1] for r in first] == [1_000 * sum(waits[:n]) for n in range(17)]
    assert first[-1][2:] == ("DLQ", 6_346_000)
    assert next(r for r in rows if r[0] == 1)[1] == 6_346_000  # waited behind message 0
    exponential = _rows(flavors_run, "fifo-exponential", "start_ms", "result_state")
    assert exponential == [(0, "WaitingRetry"), (1_000, "WaitingRetry"),
                           (3_000, "WaitingRetry"), (7_000, "DLQ")]  # 1 s, 2 s, 4 s  # fmt: skip
