"""Worked timelines from ROCKETMQ_SEMANTICS.md, run through the Spark engine end to end.

Expected times are written out by hand from the delay table, not computed by the engine.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from support import group, scenario

from retrysim import simulate

ALWAYS_FAIL = {"behavior": {"fail_probability": 1.0}}
# Waits before retries 1..16 under the default table: levels 3..18.
DEFAULT_WAITS_S = [10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]


def _cumulative(waits: list[int]) -> list[int]:
    times, now = [0], 0
    for wait in waits:
        now += wait * 1000
        times.append(now)
    return times


@pytest.fixture(scope="module")
def default_table_run(spark, tmp_path_factory):
    return simulate(
        spark,
        scenario(
            group("always", **ALWAYS_FAIL),
            group("max3", max_reconsume_times=3, **ALWAYS_FAIL),
            group("dlq-now", delay_level_when_next_consume=-1, **ALWAYS_FAIL),
            group("fixed5", delay_level_when_next_consume=5, max_reconsume_times=2, **ALWAYS_FAIL),
            group("no-dlq", max_reconsume_times=1, dlq_enabled=False, **ALWAYS_FAIL),
            group("ok"),
        ),
        output=str(tmp_path_factory.mktemp("timelines")),
        run_id="timelines",
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


def test_five_level_table_clamps_every_retry_after_the_second(spark, tmp_path):
    result = simulate(
        spark,
        scenario(
            group("custom", max_reconsume_times=5, **ALWAYS_FAIL),
            broker={"message_delay_level": "1s 2s 3s 4s 5s"},
        ),
        output=str(tmp_path),
        run_id="custom",
    )
    rows = _attempts(result, "custom")
    # Retry 1 asks level 3 (3 s), retry 2 level 4 (4 s), retries 3.. level 5+ -> last (5 s).
    assert [r["ready_ms"] for r in rows] == [0, 3_000, 7_000, 12_000, 17_000, 22_000]
    assert [r["delay_level"] for r in rows] == [3, 4, 5, 5, 5, None]
