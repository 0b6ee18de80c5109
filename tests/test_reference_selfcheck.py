"""Self-check of the pure-Python RocketMQ 4.x reference on the worked timelines.

The reference (tests/reference/rocketmq4_concurrent.py) is the oracle for the Spark engine,
so it is pinned here against hand-computed timelines from ROCKETMQ_SEMANTICS.md. No Spark.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from reference.rocketmq4_concurrent import RefGroup, RefMessage, simulate_all, simulate_message

SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
DAY = 24 * HOUR
# "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_TABLE = tuple(
    s * SEC
    for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
ATTEMPT_KEYS = {
    "group", "msg_id", "delivery", "reconsume_times", "source_topic", "queue_id", "ready_ms",
    "start_ms", "processing_ms", "end_ms", "outcome", "result_state", "delay_level",
    "next_ready_ms",
}  # fmt: skip
TRANSITION_KEYS = {
    "group", "msg_id", "delivery", "seq", "state", "at_ms", "topic", "queue_id", "delay_level",
    "reason",
}  # fmt: skip
MSG = RefMessage(msg_id=7, queue_id=2, born_ms=0)


def group(**overrides) -> RefGroup:
    base = {
        "group": "g",
        "topic": "T",
        "horizon_ms": DAY,
        "delay_table_ms": DEFAULT_TABLE,
        "max_reconsume_times": 16,
    }
    return RefGroup(**(base | overrides))


def always(outcome: str | None, p: int = 0, n: int = 40) -> dict[int, tuple[str | None, int]]:
    return {d: (outcome, p) for d in range(1, n + 1)}


def check_shape(attempts: list[dict], transitions: list[dict]) -> None:
    assert all(set(a) == ATTEMPT_KEYS for a in attempts)
    assert all(set(t) == TRANSITION_KEYS for t in transitions)
    for t in transitions:
        assert t["seq"] in range(3 * (t["delivery"] - 1) + 1, 3 * t["delivery"] + 1)


def test_default_table_always_later_dead_letters_after_16_retries():
    attempts, transitions = simulate_message(group(), MSG, always("RECONSUME_LATER"))
    check_shape(attempts, transitions)
    ready_s = [0, 10, 40, 100, 220, 400, 640, 940, 1300, 1720, 2200, 2740, 3340, 4540, 6340,
               9940, 17140]  # fmt: skip
    assert [a["ready_ms"] for a in attempts] == [s * SEC for s in ready_s]
    assert [a["delivery"] for a in attempts] == list(range(1, 18))
    assert [a["reconsume_times"] for a in attempts] == list(range(17))
    assert [a["delay_level"] for a in attempts] == [*range(3, 19), None]
    assert [a["result_state"] for a in attempts] == ["WaitingRetry"] * 16 + ["DLQ"]
    assert (attempts[0]["source_topic"], attempts[0]["queue_id"]) == ("T", 2)
    assert {(a["source_topic"], a["queue_id"]) for a in attempts[1:]} == {("%RETRY%g", 0)}
    assert len(transitions) == 51
    assert [t["seq"] for t in transitions] == list(range(1, 52))
    waits = [t for t in transitions if t["state"] == "WaitingRetry"]
    assert [(t["topic"], t["queue_id"], t["delay_level"]) for t in waits] == [
        ("SCHEDULE_TOPIC_XXXX", lvl - 1, lvl) for lvl in range(3, 19)
    ]
    assert transitions[-1] == {
        "group": "g", "msg_id": 7, "delivery": 17, "seq": 51, "state": "DLQ",
        "at_ms": 17_140_000, "topic": "%DLQ%g", "queue_id": 0, "delay_level": None,
        "reason": "max_reconsume_times",
    }  # fmt: skip


def test_max_reconsume_times_3_full_rows():
    attempts, transitions = simulate_message(
        group(max_reconsume_times=3), MSG, always("RECONSUME_LATER")
    )
    retry = ("%RETRY%g", 0)
    expected_attempts = [
        (1, "T", 2, 0, "WaitingRetry", 3, 10_000),
        (2, *retry, 10_000, "WaitingRetry", 4, 40_000),
        (3, *retry, 40_000, "WaitingRetry", 5, 100_000),
        (4, *retry, 100_000, "DLQ", None, None),
    ]
    assert attempts == [
        {
            "group": "g",
            "msg_id": 7,
            "delivery": d,
            "reconsume_times": d - 1,
            "source_topic": topic,
            "queue_id": q,
            "ready_ms": ready,
            "start_ms": ready,
            "processing_ms": 0,
            "end_ms": ready,
            "outcome": "RECONSUME_LATER",
            "result_state": state,
            "delay_level": lvl,
            "next_ready_ms": nxt,
        }
        for d, topic, q, ready, state, lvl, nxt in expected_attempts
    ]
    expected_transitions = []
    for d, topic, q, ready, state, lvl, _ in expected_attempts:
        row = {"group": "g", "msg_id": 7, "delivery": d, "at_ms": ready, "delay_level": None}
        expected_transitions += [
            row | {"seq": 3 * d - 2, "state": "Ready", "topic": topic, "queue_id": q,
                   "reason": "published" if d == 1 else "retry_due"},
            row | {"seq": 3 * d - 1, "state": "Inflight", "topic": topic, "queue_id": q,
                   "reason": "delivered"},
        ]  # fmt: skip
        if state == "DLQ":
            end = {"topic": "%DLQ%g", "queue_id": 0, "reason": "max_reconsume_times"}
        else:
            end = {"topic": "SCHEDULE_TOPIC_XXXX", "queue_id": lvl - 1, "delay_level": lvl,
                   "reason": "RECONSUME_LATER"}  # fmt: skip
        expected_transitions.append(row | {"seq": 3 * d, "state": state} | end)
    assert transitions == expected_transitions


def test_success_commits_on_source_queue():
    attempts, transitions = simulate_message(group(), MSG, {1: ("CONSUME_SUCCESS", 250)})
    assert len(attempts) == 1
    assert attempts[0]["result_state"] == "Commit"
    assert (attempts[0]["end_ms"], attempts[0]["delay_level"]) == (250, None)
    assert transitions[-1] == {
        "group": "g", "msg_id": 7, "delivery": 1, "seq": 3, "state": "Commit", "at_ms": 250,
        "topic": "T", "queue_id": 2, "delay_level": None, "reason": "CONSUME_SUCCESS",
    }  # fmt: skip


@pytest.mark.parametrize("outcome", ["RECONSUME_LATER", "EXCEPTION", "NULL_RETURN"])
def test_negative_level_dead_letters_at_once(outcome):
    cfg = group(delay_level_when_next_consume=-1)
    attempts, transitions = simulate_message(cfg, MSG, always(outcome, p=5))
    assert len(attempts) == 1
    assert (attempts[0]["result_state"], attempts[0]["next_ready_ms"]) == ("DLQ", None)
    assert transitions[-1]["state"] == "DLQ"
    end = transitions[-1]
    assert (end["at_ms"], end["topic"], end["queue_id"], end["delay_level"]) == (
        5,
        "%DLQ%g",
        0,
        None,
    )
    assert transitions[-1]["reason"] == "delay_level_negative"


def test_dlq_disabled_discards_on_source_queue():
    cfg = group(delay_level_when_next_consume=-1, dlq_enabled=False)
    attempts, transitions = simulate_message(cfg, MSG, always("EXCEPTION"))
    assert attempts[0]["result_state"] == "Discard"
    end = transitions[-1]
    assert (end["state"], end["topic"], end["queue_id"]) == ("Discard", "T", 2)
    assert end["reason"] == "delay_level_negative"
    cfg = group(max_reconsume_times=1, dlq_enabled=False)
    attempts, transitions = simulate_message(cfg, MSG, always("EXCEPTION"))
    assert [a["result_state"] for a in attempts] == ["WaitingRetry", "Discard"]
    end = transitions[-1]
    assert (end["state"], end["topic"], end["queue_id"]) == ("Discard", "%RETRY%g", 0)
    assert end["reason"] == "max_reconsume_times"


def test_short_table_clamps_to_last_level():
    cfg = group(delay_table_ms=tuple(s * SEC for s in (1, 2, 3, 4, 5)))
    attempts, _ = simulate_message(cfg, MSG, always("RECONSUME_LATER"))
    assert len(attempts) == 17
    assert [a["delay_level"] for a in attempts] == [3, 4] + [5] * 14 + [None]
    waits = [b["ready_ms"] - a["ready_ms"] for a, b in pairwise(attempts)]
    assert waits == [3 * SEC, 4 * SEC] + [5 * SEC] * 14


def test_fixed_positive_level_from_listener():
    attempts, _ = simulate_message(
        group(delay_level_when_next_consume=2, max_reconsume_times=3), MSG, always("EXCEPTION")
    )
    assert [a["ready_ms"] for a in attempts] == [0, 5_000, 10_000, 15_000]
    assert [a["delay_level"] for a in attempts] == [2, 2, 2, None]


def test_exact_timeout_sends_back_at_level_3():
    draws = {1: ("TIMEOUT", 20 * MIN), 2: ("TIMEOUT", 20 * MIN), 3: ("CONSUME_SUCCESS", 0)}
    attempts, transitions = simulate_message(group(), MSG, draws)
    first, second, third = attempts
    assert (first["outcome"], first["end_ms"], first["delay_level"]) == ("TIMEOUT", 15 * MIN, 3)
    assert first["next_ready_ms"] == 15 * MIN + 10 * SEC
    assert first["processing_ms"] == 20 * MIN
    assert (second["start_ms"], second["delay_level"]) == (15 * MIN + 10 * SEC, 3)
    assert third["ready_ms"] == second["end_ms"] + 10 * SEC == 30 * MIN + 20 * SEC
    assert third["result_state"] == "Commit"
    assert transitions[2]["reason"] == "TIMEOUT"
    assert (transitions[2]["topic"], transitions[2]["queue_id"]) == ("SCHEDULE_TOPIC_XXXX", 2)


def test_exact_timeout_is_strict_and_ignores_negative_listener_level():
    attempts, _ = simulate_message(group(), MSG, {1: ("CONSUME_SUCCESS", 15 * MIN)})
    assert (attempts[0]["outcome"], attempts[0]["end_ms"]) == ("CONSUME_SUCCESS", 15 * MIN)
    cfg = group(delay_level_when_next_consume=-1)
    draws = {1: (None, 15 * MIN + 1), 2: ("CONSUME_SUCCESS", 0)}
    attempts, _ = simulate_message(cfg, MSG, draws)
    assert [a["result_state"] for a in attempts] == ["WaitingRetry", "Commit"]
    assert attempts[0]["outcome"] == "TIMEOUT"


@pytest.mark.parametrize(
    ("born", "p", "outcome", "end"),
    [
        (0, 20 * MIN, "CONSUME_SUCCESS", 20 * MIN),  # c = 30 min
        (0, 40 * MIN, "TIMEOUT", 30 * MIN),
        (5 * MIN, 25 * MIN, "CONSUME_SUCCESS", 30 * MIN),  # start + p == c: not expired
        (5 * MIN, 25 * MIN + 1, "TIMEOUT", 30 * MIN),
        (15 * MIN, 30 * MIN, "CONSUME_SUCCESS", 45 * MIN),  # c strictly after 30 min
        (15 * MIN, 30 * MIN + 1, "TIMEOUT", 45 * MIN),
    ],
)
def test_periodic_timeout(born, p, outcome, end):
    msg = RefMessage(msg_id=1, queue_id=0, born_ms=born)
    draws = {1: (outcome, p), 2: ("CONSUME_SUCCESS", 0)}
    attempts, _ = simulate_message(group(timeout_check="periodic"), msg, draws)
    assert (attempts[0]["outcome"], attempts[0]["end_ms"]) == (outcome, end)


def test_horizon_cuts():
    assert simulate_message(group(horizon_ms=100), RefMessage(1, 0, born_ms=100), {}) == ([], [])
    # retry due exactly at the horizon: stays pending, no second delivery
    attempts, transitions = simulate_message(
        group(horizon_ms=10 * SEC), MSG, always("RECONSUME_LATER")
    )
    assert len(attempts) == 1 and len(transitions) == 3
    assert attempts[0]["next_ready_ms"] == 10 * SEC
    # second delivery starts before the horizon but ends exactly at it: Inflight
    attempts, transitions = simulate_message(
        group(horizon_ms=10 * SEC + 5), MSG, {1: ("RECONSUME_LATER", 0), 2: (None, 5)}
    )
    check_shape(attempts, transitions)
    assert attempts[1] == {
        "group": "g", "msg_id": 7, "delivery": 2, "reconsume_times": 1,
        "source_topic": "%RETRY%g", "queue_id": 0, "ready_ms": 10 * SEC, "start_ms": 10 * SEC,
        "processing_ms": 5, "end_ms": None, "outcome": None, "result_state": "Inflight",
        "delay_level": None, "next_ready_ms": None,
    }  # fmt: skip
    assert [(t["seq"], t["state"]) for t in transitions] == [
        (1, "Ready"), (2, "Inflight"), (3, "WaitingRetry"), (4, "Ready"), (5, "Inflight"),
    ]  # fmt: skip
    # a timeout whose leave time is past the horizon is also just Inflight
    attempts, transitions = simulate_message(group(horizon_ms=10 * MIN), MSG, {1: (None, HOUR)})
    assert attempts[0]["result_state"] == "Inflight" and len(transitions) == 2


@pytest.mark.parametrize(
    ("mode", "draw"),
    [
        ("exact", ("TIMEOUT", 15 * MIN)),
        ("exact", ("CONSUME_SUCCESS", 15 * MIN + 1)),
        ("periodic", ("TIMEOUT", 20 * MIN)),
        ("periodic", ("RECONSUME_LATER", 40 * MIN)),
    ],
)
def test_timeout_mismatch_raises(mode, draw):
    with pytest.raises(AssertionError, match="delivery 1"):
        simulate_message(group(timeout_check=mode), MSG, {1: draw})


def test_missing_draw_raises_key_error():
    with pytest.raises(KeyError):
        simulate_message(group(), MSG, {1: ("RECONSUME_LATER", 0)})


def test_simulate_all_concatenates_in_message_order():
    cfg = group(max_reconsume_times=1)
    msgs = [RefMessage(1, 0, 0), RefMessage(2, 1, 500), RefMessage(3, 0, 2 * DAY)]
    draws = {1: always("CONSUME_SUCCESS"), 2: always("EXCEPTION")}
    attempts, transitions = simulate_all(cfg, msgs, draws)
    check_shape(attempts, transitions)
    assert [(a["msg_id"], a["delivery"]) for a in attempts] == [(1, 1), (2, 1), (2, 2)]
    assert [t["msg_id"] for t in transitions] == [1] * 3 + [2] * 6
    assert attempts[-1]["result_state"] == "DLQ" and attempts[-1]["end_ms"] == 10_500
