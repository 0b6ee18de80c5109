"""The reference simulator (tests/reference/simulator.py) pinned on hand-written timelines.

Every expected time below is computed by hand from docs/model.md and docs/flavors.md, not by
the reference. The last part is a hypothesis property test: over small random scenarios of
every flavor the rows always form legal state paths, deliveries are numbered 1, 2, ..., time
never goes backwards, finite pools never run more than C consume requests at once and a
blocking lane never runs two messages at once. No Spark.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import source_rules
from reference.simulator import COPY_COLUMNS, parse_duration_ms, simulate_scenario
from reference.strategies import FLAVORS, group_configs, pool_size

from retrysim.model.rng import uniform_np

S = 1000
MIN = 60 * S
HOUR = 60 * MIN

ATTEMPT_KEYS = {
    "broker_reconsume_times",
    "group",
    "msg_id",
    "delivery",
    "reconsume_times",
    "source_topic",
    "queue_id",
    "consumer_instance",
    "born_ms",
    "ready_ms",
    "start_ms",
    "processing_ms",
    "end_ms",
    "outcome",
    "result_state",
    "delay_level",
    "next_ready_ms",
    "settled_ms",
    "batch_size",
    "parent_delivery",
    *COPY_COLUMNS,
}
TRANSITION_KEYS = {
    "group",
    "msg_id",
    "delivery",
    "seq",
    "state",
    "at_ms",
    "topic",
    "queue_id",
    "delay_level",
    "reason",
}
MESSAGE_KEYS = {"group", "topic", "msg_id", "queue_id", "born_ms", "size_bytes"}


def run(horizon="6h", levels=None, **group):
    """Simulate one group named "g" (topic "g" unless given)."""
    group = {"name": "g", **group}
    scenario = {"name": "t", "seed": 42, "horizon": horizon, "groups": [group]}
    if levels is not None:
        scenario["broker"] = {"message_delay_level": levels}
    return simulate_scenario(scenario)


def one(n=1, queues=1, over="1ms"):
    return {"messages": n, "over": over, "queues": queues}


def attempts(r, msg_id=0):
    return [a for a in r["attempts"] if a["msg_id"] == msg_id]


def trans(r, msg_id=0):
    return [t for t in r["transitions"] if t["msg_id"] == msg_id]


def tr(msg_id, delivery, seq, state, at_ms, topic, queue_id, delay_level, reason):
    """A transitions row of group "g"."""
    return {
        "group": "g",
        "msg_id": msg_id,
        "delivery": delivery,
        "seq": seq,
        "state": state,
        "at_ms": at_ms,
        "topic": topic,
        "queue_id": queue_id,
        "delay_level": delay_level,
        "reason": reason,
    }


def starts(r, msg_id=0):
    return [a["start_ms"] for a in attempts(r, msg_id)]


def path(r, msg_id=0):
    return [(t["seq"], t["state"], t["at_ms"]) for t in trans(r, msg_id)]


ALWAYS_FAIL = {"fail_probability": 1.0, "processing_time": 0}


# --------------------------------------------------------------------------- parsing


def test_durations():
    assert parse_duration_ms("10s") == 10 * S
    assert parse_duration_ms("1500ms") == 1500
    assert parse_duration_ms("2h") == 2 * HOUR
    assert parse_duration_ms("1m") == MIN
    assert parse_duration_ms("1d") == 24 * HOUR
    assert parse_duration_ms(0) == 0


def test_cached_draws_equal_uniform_np():
    from reference.simulator import _Uniforms

    u = _Uniforms(42, "grp", 5000)
    for m, d in [(0, 0), (17, 3), (4999, 32), (123, 33), (123, 300), (77, 1000), (4096, 1)]:
        expected = float(uniform_np(42, "grp", "fail", np.array([m]), d)[0])
        assert u("fail", m, d) == expected, (m, d)


def test_row_keys_and_messages_table():
    r = run(workload={"messages": 5, "over": "5s", "queues": 2, "size_bytes": 77})
    assert [set(a) for a in r["attempts"]] == [ATTEMPT_KEYS] * 5
    assert all(set(t) == TRANSITION_KEYS for t in r["transitions"])
    assert r["messages"] == [
        {
            "group": "g",
            "topic": "g",
            "msg_id": i,
            "queue_id": i % 2,
            "born_ms": i * S,
            "size_bytes": 77,
        }
        for i in range(5)
    ]


# --------------------------------------------------------------------------- 1. 4.x default


DEFAULT_STARTS_S = [
    0,
    10,
    40,
    100,
    220,
    400,
    640,
    940,
    1300,
    1720,
    2200,
    2740,
    3340,
    4540,
    6340,
    9940,
    17140,
]


def test_concurrently_always_failing_default_table():
    r = run(flavor="rocketmq4.concurrently", workload=one(), behavior=ALWAYS_FAIL)
    rows = attempts(r)
    assert [a["start_ms"] for a in rows] == [s * S for s in DEFAULT_STARTS_S]
    assert [a["reconsume_times"] for a in rows] == list(range(17))
    assert [a["delay_level"] for a in rows] == [*range(3, 19), None]
    assert [a["result_state"] for a in rows] == ["WaitingRetry"] * 16 + ["DLQ"]
    assert rows[-1]["settled_ms"] == 17_140 * S
    assert [a["next_ready_ms"] for a in rows[:-1]] == [s * S for s in DEFAULT_STARTS_S[1:]]
    assert rows[0]["source_topic"] == "g"
    assert {a["source_topic"] for a in rows[1:]} == {"%RETRY%g"}
    assert {a["queue_id"] for a in rows[1:]} == {0}
    t = trans(r)
    assert [x["seq"] for x in t] == [
        4 * (d - 1) + k for d in range(1, 18) for k in (1, 2, 3)
    ]  # DLQ at failure: no k = 4
    assert t[0] == tr(0, 1, 1, "Ready", 0, "g", 0, None, "published")
    assert t[1]["state"] == "Inflight" and t[1]["reason"] == "delivered"
    assert t[2] == tr(0, 1, 3, "WaitingRetry", 0, "SCHEDULE_TOPIC_XXXX", 2, 3, "RECONSUME_LATER")
    assert t[3] == tr(0, 2, 5, "Ready", 10 * S, "%RETRY%g", 0, None, "retry_due")
    # the 16th retry waits at level 18 (2 h), queue 17
    assert (t[-4]["topic"], t[-4]["queue_id"], t[-4]["delay_level"]) == (
        "SCHEDULE_TOPIC_XXXX",
        17,
        18,
    )
    assert t[-1] == tr(0, 17, 67, "DLQ", 17_140 * S, "%DLQ%g", 0, None, "max_reconsume_times")


# --------------------------------------------------------------------------- 2. 4.x options


def test_concurrently_max_reconsume_times_3():
    r = run(
        flavor="rocketmq4.concurrently", max_reconsume_times=3, workload=one(), behavior=ALWAYS_FAIL
    )
    assert starts(r) == [0, 10 * S, 40 * S, 100 * S]
    assert attempts(r)[-1]["result_state"] == "DLQ"
    assert path(r)[-1] == (15, "DLQ", 100 * S)


def test_concurrently_delay_level_negative():
    r = run(
        flavor="rocketmq4.concurrently",
        delay_level_when_next_consume=-1,
        workload=one(),
        behavior=ALWAYS_FAIL,
    )
    assert starts(r) == [0]
    assert trans(r)[-1]["state"] == "DLQ"
    assert trans(r)[-1]["reason"] == "delay_level_negative"
    assert trans(r)[-1]["topic"] == "%DLQ%g"


def test_concurrently_fixed_delay_level():
    r = run(
        flavor="rocketmq4.concurrently",
        delay_level_when_next_consume=2,
        max_reconsume_times=3,
        workload=one(),
        behavior=ALWAYS_FAIL,
    )
    assert starts(r) == [0, 5 * S, 10 * S, 15 * S]  # level 2 = 5 s every time
    assert [a["delay_level"] for a in attempts(r)] == [2, 2, 2, None]


def test_concurrently_short_table_clamps():
    r = run(
        flavor="rocketmq4.concurrently",
        levels="1s 2s 3s 4s 5s",
        workload=one(),
        behavior=ALWAYS_FAIL,
    )
    # levels 3, 4, then 5 (clamped) for every later retry: 3 s, 4 s, 5 s, 5 s, ...
    expected = [0, 3, 7] + [7 + 5 * i for i in range(1, 15)]
    assert starts(r) == [s * S for s in expected]
    assert [a["delay_level"] for a in attempts(r)] == [3, 4] + [5] * 14 + [None]
    assert {t["queue_id"] for t in trans(r) if t["topic"] == "SCHEDULE_TOPIC_XXXX"} == {2, 3, 4}
    assert path(r)[-1] == (67, "DLQ", 77 * S)


def test_concurrently_timeout_exact_and_periodic():
    base = {"flavor": "rocketmq4.concurrently", "workload": one(), "max_reconsume_times": 0}
    # exact: processing 20 min > 15 min -> TIMEOUT at 15 min, sent back at level 3 ... but M=0
    r = run(**base, consume_timeout_check="exact", behavior={"processing_time": "20m"})
    a = attempts(r)[0]
    assert (a["outcome"], a["end_ms"], a["processing_ms"]) == ("TIMEOUT", 15 * MIN, 20 * MIN)
    assert a["result_state"] == "DLQ"
    # periodic (the default): the cleaner runs at 15, 30, ... min; the first run strictly
    # after 15 min is 30
    r = run(**base, behavior={"processing_time": "20m"})
    a = attempts(r)[0]
    assert (a["outcome"], a["end_ms"]) == ("CONSUME_SUCCESS", 20 * MIN)
    r = run(**base, consume_timeout_check="periodic", behavior={"processing_time": "40m"})
    a = attempts(r)[0]
    assert (a["outcome"], a["end_ms"]) == ("TIMEOUT", 30 * MIN)
    # a timeout is sent back at level 3 (10 s), whatever rt and delay_level_when_next_consume
    r = run(
        flavor="rocketmq4.concurrently",
        workload=one(),
        consume_timeout="1s",
        consume_timeout_check="exact",
        delay_level_when_next_consume=-1,
        behavior={"processing_time": "2s"},
        horizon="30s",
    )
    rows = attempts(r)
    assert [a["start_ms"] for a in rows] == [0, 11 * S, 22 * S]
    assert [a["delay_level"] for a in rows[:2]] == [3, 3]
    assert [a["outcome"] for a in rows[:2]] == ["TIMEOUT", "TIMEOUT"]


PERIODIC_SWEEP = """
name: sweep
seed: 42
horizon: 10m
groups:
  - name: g
    flavor: rocketmq4.concurrently
    consumers: {instances: 1, threads: 40}
    workload: {messages: 40, over: 4s, queues: 1}
    consume_timeout: 1m
    consume_timeout_check: periodic
    behavior:
      fail_probability: 0
      processing_time: {dist: constant, mean: 130s}
"""


def test_concurrently_periodic_cleaner_sends_back_16_per_run():
    # 40 listeners of 130 s started at 0, 0.1, ..., 3.9 s on one queue: at the run at 120 s
    # all 40 are expired and running, and ProcessQueue.cleanExpiredMsg sends back 16 of
    # them, head first (msg_ids 0..15); the other 24 return at start + 130 s, before the
    # run at 180 s, and commit
    r = simulate_scenario(yaml.safe_load(PERIODIC_SWEEP))
    first = {a["msg_id"]: a for a in r["attempts"] if a["delivery"] == 1}
    assert sorted(first) == list(range(40))
    assert [first[m]["start_ms"] for m in range(40)] == [100 * m for m in range(40)]
    cleaned = [m for m in range(40) if first[m]["outcome"] == "TIMEOUT"]
    assert cleaned == list(range(16))
    for m in range(16):
        a = first[m]
        assert (a["end_ms"], a["processing_ms"]) == (120 * S, 130 * S)
        assert (a["result_state"], a["delay_level"], a["next_ready_ms"]) == (
            "WaitingRetry",
            3,
            130 * S,
        )
        assert trans(r, m)[2] == tr(
            m, 1, 3, "WaitingRetry", 120 * S, "SCHEDULE_TOPIC_XXXX", 2, 3, "TIMEOUT"
        )
    for m in range(16, 40):
        a = first[m]
        assert (a["outcome"], a["end_ms"]) == ("CONSUME_SUCCESS", 100 * m + 130 * S)
        assert (a["result_state"], a["settled_ms"]) == ("Commit", 100 * m + 130 * S)
        assert [a["delivery"] for a in attempts(r, m)] == [1]
    # the 16 are retried from %RETRY%g 10 s later, each as its own listener's thread frees
    for m in range(16):
        second = attempts(r, m)[1]
        assert (second["delivery"], second["source_topic"], second["reconsume_times"]) == (
            2,
            "%RETRY%g",
            1,
        )
        assert (second["ready_ms"], second["start_ms"]) == (130 * S, 130 * S + 100 * m)


def test_clean_expired_msg_sweep_stops_at_the_first_head_not_expired():
    @dataclass
    class Msg:
        consume_start_time_stamp: int | None

    sent = []
    pq = source_rules.ProcessQueue()
    for offset, start in enumerate([0] * 20 + [50, 0, None]):
        pq.put_message(offset, Msg(start))
    back = lambda msg, level: sent.append((msg, level))  # noqa: E731
    source_rules.clean_expired_msg_sweep(pq, 100, 60, back)  # 16 of the 20 expired
    assert len(sent) == 16 and {level for _, level in sent} == {3} and pq.size() == 7
    source_rules.clean_expired_msg_sweep(pq, 100, 60, back)  # 4 more, then offset 20 (50)
    assert len(sent) == 20 and pq.first_entry()[0] == 20
    pq.remove_message(20)  # its listener returns: offset 21 is expired, 22 not started
    source_rules.clean_expired_msg_sweep(pq, 100, 60, back)
    assert len(sent) == 21 and pq.first_entry()[0] == 22


# --------------------------------------------------------------------------- 3. 5.x push


PUSH_INTERVALS_S = [10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200]


def test_push_always_failing_apsaramq_defaults():
    r = run(
        flavor="rocketmq5.push",
        deployment="apsaramq",
        workload=one(),
        behavior=ALWAYS_FAIL,
        horizon="8h",
    )
    rows = attempts(r)
    expected = [sum(PUSH_INTERVALS_S[:i]) * S for i in range(17)]
    assert [a["start_ms"] for a in rows] == expected
    assert expected[-1] == 17_140 * S
    assert [a["result_state"] for a in rows] == ["WaitingRetry"] * 16 + ["DLQ"]
    assert rows[-1]["settled_ms"] == 24_340 * S
    assert rows[-1]["next_ready_ms"] is None
    assert {a["delay_level"] for a in rows} == {None}
    t = trans(r)
    assert t[2]["topic"] == "g" and t[2]["state"] == "WaitingRetry"  # waits where it was
    assert (t[3]["topic"], t[3]["queue_id"], t[3]["reason"]) == ("%RETRY%g_g", 0, "retry_due")
    assert [(x["seq"], x["state"], x["at_ms"]) for x in t[-2:]] == [
        (67, "WaitingRetry", 17_140 * S),
        (68, "DLQ", 24_340 * S),
    ]
    assert t[-1]["topic"] == "%DLQ%g" and t[-1]["reason"] == "max_reconsume_times"


@pytest.mark.parametrize(
    "config", [{"retry_policy": {"kind": "grpc_client"}}, {}, {"flavor": "customized"}]
)
def test_push_grpc_client_index(config):
    """The open-source client's index: also what a push group (or a customized one without
    its own list) does by default, deployment apache."""
    r = run(**{"flavor": "rocketmq5.push", **config}, workload=one(), behavior=ALWAYS_FAIL,
            horizon="4h")  # fmt: skip
    rows = attempts(r)
    # each retry written by the open-source reviver 3 s after it is due
    lag = 3 * S
    assert [a["start_ms"] for a in rows[:6]] == [
        0, 1 * S + lag, 6 * S + 2 * lag, 16 * S + 3 * lag, 46 * S + 4 * lag, 106 * S + 5 * lag
    ]  # fmt: skip
    assert rows[-1]["delivery"] == 17
    assert rows[-1]["start_ms"] == HOUR + 45 * MIN + 46 * S + 16 * lag
    assert rows[-1]["settled_ms"] == 2 * HOUR + 45 * MIN + 46 * S + 17 * lag


def test_push_timeout_is_one_minute_on_apsaramq():
    r = run(
        flavor="rocketmq5.push",
        deployment="apsaramq",
        max_reconsume_times=1,
        workload=one(),
        behavior={"processing_time": "90s"},
    )
    rows = attempts(r)
    assert (rows[0]["outcome"], rows[0]["end_ms"]) == ("TIMEOUT", MIN)
    assert rows[1]["start_ms"] == MIN + 10 * S
    assert rows[1]["end_ms"] == 2 * MIN + 10 * S
    assert rows[1]["settled_ms"] == 2 * MIN + 40 * S  # leave after the 2nd backoff (30 s)


def test_open_source_push_times_out_when_the_proxy_stops_renewing():
    """60 s, then renewals 10 s ahead by 1, 3, 5, 10, 30 and 60 minutes: the one due after
    3 h (at 13,710 s) nacks instead, and the retry waits the client's first interval and the
    reviver's 3 s."""
    r = run(flavor="rocketmq5.push", max_reconsume_times=1, workload=one(),
            behavior={"processing_time": "4h"}, horizon="9h")  # fmt: skip
    rows = attempts(r)
    assert (rows[0]["outcome"], rows[0]["end_ms"]) == ("TIMEOUT", 13_710 * S)
    assert rows[1]["start_ms"] == 13_714 * S


def test_push_ordered_blocks_and_leaves_at_failure():
    r = run(
        flavor="rocketmq5.push",
        ordered=True,
        max_reconsume_times=2,
        workload=one(2),
        behavior=ALWAYS_FAIL,
    )
    # retry n waits the n-th entry of the default list (1 s, 5 s, ...), the queue blocked
    assert starts(r, 0) == [0, S, 6 * S]
    assert path(r, 0)[-1] == (11, "DLQ", 6 * S)
    assert starts(r, 1) == [6 * S, 7 * S, 12 * S]
    assert {t["reason"] for t in trans(r, 0) if t["state"] == "Ready"} == {
        "published",
        "local_retry",
    }
    assert {t["topic"] for t in trans(r, 0) if t["state"] != "DLQ"} == {"g"}


def test_push_ordered_dead_letters_a_null_result_at_once():
    """rocketmq-clients ProcessQueueImpl.eraseFifoMessage: only FAILURE is retried."""
    nulls = {"fail_first": 1, "outcome_mix": {"reconsume_later": 0, "null_return": 1}}
    r = run(flavor="rocketmq5.push", ordered=True, workload=one(2), behavior=nulls)
    assert path(r, 0)[-1] == (3, "DLQ", 10)  # at its end (10 ms), not retried
    assert trans(r, 0)[-1]["reason"] == "null_result"
    assert starts(r, 1) == [10]  # and the queue moves on at once


# --------------------------------------------------------------------------- 4. ApsaraMQ


def test_apsaramq_ready_wait_example():
    r = run(
        flavor="rocketmq5.push",
        deployment="apsaramq",
        workload=one(),
        behavior={"ready_wait": "5s", "processing_time": "6s", "fail_first": 1},
    )
    assert path(r) == [
        (1, "Ready", 0),
        (2, "Inflight", 5 * S),
        (3, "WaitingRetry", 11 * S),
        (5, "Ready", 21 * S),
        (6, "Inflight", 26 * S),
        (7, "Commit", 32 * S),
    ]


# --------------------------------------------------------------------------- 5. simple


def test_simple_invisible_duration():
    r = run(
        flavor="rocketmq5.simple",
        invisible_duration="30s",
        workload=one(),
        behavior={"processing_time": "10s", "fail_first": 1},
    )
    # the 5.x seed's simple mode has no WaitingRetry: a message not acknowledged stays
    # Inflight (invisible) until its invisible duration ends and the open-source reviver
    # writes it back, 3 s later; then it is Ready again
    back = 33 * S
    assert path(r) == [
        (1, "Ready", 0),
        (2, "Inflight", 0),
        (5, "Ready", back),
        (6, "Inflight", back),
        (7, "Commit", back + 10 * S),
    ]
    assert trans(r)[2]["topic"] == "%RETRY%g_g"
    first = attempts(r)[0]
    assert (first["result_state"], first["end_ms"], first["next_ready_ms"]) == (
        "Inflight", back, back,
    )  # fmt: skip
    r = run(
        flavor="rocketmq5.simple",
        invisible_duration="30s",
        workload=one(),
        behavior={"processing_time": "40s"},
        horizon="70s",
    )
    rows = attempts(r)
    assert [(a["start_ms"], a["end_ms"], a["outcome"]) for a in rows] == [
        (0, back, "TIMEOUT"),
        (back, 2 * back, "TIMEOUT"),
        (2 * back, None, None),
    ]
    assert rows[0]["next_ready_ms"] == back  # 0 ms after it was revived
    assert [a["result_state"] for a in rows] == ["Inflight"] * 3  # the last at the horizon
    # out of retries: the DLQ when the reviver takes it back, not a backoff later
    r = run(
        flavor="rocketmq5.simple",
        invisible_duration="30s",
        max_reconsume_times=1,
        workload=one(),
        behavior=ALWAYS_FAIL,
    )
    assert path(r)[-3:] == [(5, "Ready", back), (6, "Inflight", back), (7, "DLQ", 2 * back)]
    # ApsaraMQ's service: no reviver's lag
    r = run(
        flavor="rocketmq5.simple",
        deployment="apsaramq",
        invisible_duration="30s",
        max_reconsume_times=1,
        workload=one(),
        behavior=ALWAYS_FAIL,
    )
    assert path(r)[-3:] == [(5, "Ready", 30 * S), (6, "Inflight", 30 * S), (7, "DLQ", 60 * S)]


# --------------------------------------------------------------------------- 6. HTTP


def test_http_unordered_always_failing():
    r = run(
        flavor="http.unordered",
        workload=one(),
        horizon="25h",
        behavior={"fail_probability": 1.0, "processing_time": "1s"},
    )
    rows = attempts(r)
    assert len(rows) == 289
    assert [a["start_ms"] for a in rows] == [i * 301 * S for i in range(289)]
    last = rows[-1]
    assert last["end_ms"] == 86_689 * S
    assert last["settled_ms"] == 86_989 * S
    assert last["result_state"] == "DLQ"
    t = trans(r)
    assert (t[3]["state"], t[3]["topic"], t[3]["queue_id"], t[3]["reason"]) == (
        "Ready",
        "g",
        0,
        "visible_again",
    )
    assert [(x["seq"], x["state"]) for x in t[-2:]] == [
        (4 * 288 + 3, "WaitingRetry"),
        (4 * 288 + 4, "DLQ"),
    ]


def test_http_ordered_blocks_its_queue():
    r = run(
        flavor="http.ordered", workload=one(2), behavior={"fail_first": 2, "processing_time": 0}
    )
    assert starts(r, 0) == [0, MIN, 2 * MIN]
    assert starts(r, 1) == [2 * MIN, 3 * MIN, 4 * MIN]
    # an always-failing head keeps the queue until its DLQ, one interval after the 289th
    r = run(flavor="http.ordered", workload=one(2), behavior=ALWAYS_FAIL)
    assert len(attempts(r, 0)) == 289
    assert attempts(r, 0)[-1]["settled_ms"] == 289 * MIN
    assert starts(r, 1)[0] == 289 * MIN


# --------------------------------------------------------------------------- 7. orderly


def test_orderly_fails_five_times():
    r = run(
        flavor="rocketmq4.orderly",
        workload=one(2),
        behavior={"fail_first": 5, "processing_time": 0},
    )
    assert starts(r, 0) == [0, S, 2 * S, 3 * S, 4 * S, 5 * S]
    assert [a["reconsume_times"] for a in attempts(r, 0)] == [0, 1, 2, 3, 4, 5]
    assert attempts(r, 0)[-1]["result_state"] == "Commit"
    assert starts(r, 1)[0] == 5 * S
    assert {t["topic"] for t in r["transitions"]} == {"g"}
    assert {t["reason"] for t in r["transitions"] if t["state"] == "Ready"} == {
        "published",
        "local_retry",
    }


def test_orderly_max_reconsume_times_releases_queue():
    r = run(
        flavor="rocketmq4.orderly",
        max_reconsume_times=2,
        workload=one(2),
        behavior={"fail_first": 3, "processing_time": 0},
    )
    assert starts(r, 0) == [0, S, 2 * S]
    # ConsumeMessageOrderlyService.sendMessageBack: RECONSUME_TIME 2 >= 2 and DELAY 3 + 2;
    # a 4.9.7 broker keeps the DELAY on the dead letter: a minute in the schedule topic
    assert path(r, 0)[-2:] == [(11, "WaitingRetry", 2 * S), (12, "DLQ", 62 * S)]
    assert (trans(r)[-2]["topic"], trans(r)[-2]["queue_id"], trans(r)[-2]["delay_level"]) == (
        "SCHEDULE_TOPIC_XXXX", 4, 5,
    )  # fmt: skip
    # the queue moves on at the failure, not when the dead letter lands
    assert starts(r, 1) == [2 * S, 3 * S, 4 * S]


def test_orderly_poison_blocks_to_horizon():
    r = run(
        flavor="rocketmq4.orderly",
        workload=one(2),
        horizon="1m",
        behavior={"poison_fraction": 1.0, "processing_time": 0},
    )
    assert starts(r, 0) == [i * S for i in range(60)]  # the 61st would be due at the horizon
    assert attempts(r, 0)[-1]["result_state"] == "WaitingRetry"
    assert attempts(r, 0)[-1]["next_ready_ms"] == 60 * S
    (later,) = attempts(r, 1)
    assert (later["result_state"], later["ready_ms"], later["start_ms"]) == ("Ready", 0, None)
    assert path(r, 1) == [(1, "Ready", 0)]


# --------------------------------------------------------------------------- 8. broadcasting


def test_broadcasting_discards():
    r = run(flavor="rocketmq4.broadcasting", workload=one(), behavior=ALWAYS_FAIL)
    assert len(attempts(r)) == 1
    assert attempts(r)[0]["result_state"] == "Discard"
    last = trans(r)[-1]
    assert (last["seq"], last["state"], last["topic"], last["reason"]) == (
        3,
        "Discard",
        "g",
        "broadcast_no_retry",
    )


def test_broadcasting_timeout_is_sent_back_where_nobody_reads_it():
    """ProcessQueue.cleanExpiredMsg skips only orderly consumers: an expired broadcast
    message is sent back at level 3 (schedule topic, then %RETRY%g), and no broadcasting
    consumer subscribes the retry topic: two commit-log writes, then nothing."""
    r = run(
        flavor="rocketmq4.broadcasting",
        consume_timeout="1s",
        consume_timeout_check="exact",
        workload=one(),
        behavior={"processing_time": "5s"},
    )
    assert [(a["result_state"], a["delay_level"], a["settled_ms"]) for a in attempts(r)] == [
        ("Discard", 3, 11 * S),
    ]
    assert [(t["state"], t["at_ms"], t["topic"], t["queue_id"], t["reason"]) for t in trans(r)][
        2:
    ] == [
        ("WaitingRetry", S, "SCHEDULE_TOPIC_XXXX", 2, "TIMEOUT"),
        ("Discard", 11 * S, "%RETRY%g", 0, "broadcast_no_retry"),
    ]


# --------------------------------------------------------------------------- 9. pools


def test_single_thread_serialises():
    r = run(
        consumers={"instances": 1, "threads": 1},
        workload=one(3),
        behavior={"processing_time": "100ms"},
    )
    assert [starts(r, m)[0] for m in range(3)] == [0, 100, 200]


def test_retry_competes_fifo_with_new_messages():
    # born 0, 1, 2, 3 s; each first delivery fails; 1.5 s processing; every retry 1 s later
    r = run(
        consumers={"instances": 1, "threads": 1},
        levels="1s",
        workload={"messages": 4, "over": "4s", "queues": 1},
        behavior={"fail_first": 1, "processing_time": "1500ms"},
    )
    assert starts(r, 0) == [0, 4500]
    assert starts(r, 1) == [1500, 7500]
    assert starts(r, 2) == [3000, 9000]
    assert starts(r, 3) == [6000, 10500]


def test_same_millisecond_free_then_eligible_then_fifo():
    # born 0, 1, 2 s; 1 s processing; first deliveries fail; every retry 1 s later; 1 thread.
    # At 2 s the thread frees, m0's retry and m2 both become eligible: (2000, 0) < (2000, 2).
    r = run(
        consumers={"instances": 1, "threads": 1},
        levels="1s",
        workload={"messages": 3, "over": "3s", "queues": 1},
        behavior={"fail_first": 1, "processing_time": "1s"},
    )
    assert starts(r, 0) == [0, 2000]
    assert starts(r, 1) == [1000, 4000]
    assert starts(r, 2) == [3000, 5000]


def test_blocking_lane_with_ready_wait():
    # head: first delivery at ready + 5 s; its local retry (Ready 6 s) at 11 s; the next
    # message (published at 0) at max(0 + 5 s, release 11 s)
    r = run(
        flavor="rocketmq4.orderly",
        workload=one(2),
        behavior={"ready_wait": "5s", "fail_first": 1, "processing_time": 0},
    )
    assert starts(r, 0) == [5 * S, 11 * S]
    assert attempts(r, 0)[1]["ready_ms"] == 6 * S
    assert starts(r, 1) == [11 * S, 17 * S]


def test_blocking_lanes_are_per_queue():
    r = run(
        flavor="rocketmq4.orderly",
        workload=one(4, queues=2),
        behavior={"fail_first": 2, "processing_time": 0},
    )
    assert [starts(r, m) for m in range(4)] == [
        [0, S, 2 * S],
        [0, S, 2 * S],
        [2 * S, 3 * S, 4 * S],
        [2 * S, 3 * S, 4 * S],
    ]


def test_threads_stay_busy_past_timeout():
    r = run(
        consumers={"instances": 1, "threads": 1},
        consume_timeout="1s",
        consume_timeout_check="exact",
        workload=one(2),
        behavior={"processing_time": "3s"},
        horizon="12s",
    )
    a0, a1 = attempts(r, 0)[0], attempts(r, 1)[0]
    assert (a0["start_ms"], a0["end_ms"], a0["outcome"], a0["processing_ms"]) == (
        0,
        S,
        "TIMEOUT",
        3 * S,
    )
    assert a0["next_ready_ms"] == 11 * S
    assert (a1["start_ms"], a1["end_ms"]) == (3 * S, 4 * S)
    assert attempts(r, 0)[1]["start_ms"] == 11 * S  # the thread is free again at 6 s


def test_unlimited_pool():
    r = run(consumers="unlimited", workload=one(50), behavior={"processing_time": "1s"})
    assert {a["start_ms"] for a in r["attempts"]} == {0}


# --------------------------------------------------------------------------- 10. batches


def test_batch_ack_index():
    r = run(
        consume_message_batch_max_size=4,
        ack_index=1,
        workload=one(4),
        behavior={"processing_time": "100ms"},
    )
    first = [attempts(r, m)[0] for m in range(4)]
    assert {(a["start_ms"], a["end_ms"], a["processing_ms"], a["batch_size"]) for a in first} == {
        (0, 400, 400, 4)
    }
    assert [a["result_state"] for a in first] == [
        "Commit",
        "Commit",
        "WaitingRetry",
        "WaitingRetry",
    ]
    assert {a["outcome"] for a in first} == {"CONSUME_SUCCESS"}
    for m in (2, 3):
        t = trans(r, m)
        assert (t[2]["state"], t[2]["reason"], t[2]["delay_level"]) == (
            "WaitingRetry",
            "beyond_ack_index",
            3,
        )
        second = attempts(r, m)[1]
        # both retries are due at 10.4 s in the one %RETRY% queue: one batch of 2
        assert (second["start_ms"], second["batch_size"], second["result_state"]) == (
            10_400,
            2,
            "Commit",
        )


def test_batch_one_failing_member_fails_all():
    u = uniform_np(42, "g", "fail", np.arange(4), 1)
    assert sorted(range(4), key=lambda i: u[i])[0] == 2 and u[2] < 0.40 < min(u[0], u[1], u[3])
    r = run(
        consume_message_batch_max_size=4,
        workload=one(4),
        behavior={"fail_probability": 0.40, "processing_time": "100ms"},
        horizon="5s",
    )
    first = [attempts(r, m)[0] for m in range(4)]
    assert {(a["outcome"], a["result_state"], a["end_ms"]) for a in first} == {
        ("RECONSUME_LATER", "WaitingRetry", 400)
    }


def test_batches_only_from_one_lane():
    r = run(
        consume_message_batch_max_size=4,
        workload=one(4, queues=2),
        behavior={"processing_time": "100ms"},
    )
    assert {a["batch_size"] for a in r["attempts"]} == {2}


# --------------------------------------------------------------------------- 11. send-back


def test_send_back_failure_retries_locally():
    r = run(
        max_reconsume_times=0,
        workload=one(),
        behavior={"send_back_failure_probability": 1.0, "fail_first": 3, "processing_time": 0},
    )
    rows = attempts(r)
    assert [a["start_ms"] for a in rows] == [0, 5 * S, 10 * S, 15 * S]
    assert [a["reconsume_times"] for a in rows] == [0, 1, 2, 3]
    assert rows[-1]["result_state"] == "Commit"
    t = trans(r)
    assert (
        t[2]["state"],
        t[2]["topic"],
        t[2]["queue_id"],
        t[2]["delay_level"],
        t[2]["reason"],
    ) == ("WaitingRetry", "g", 0, None, "send_back_failed")
    assert (t[3]["state"], t[3]["at_ms"], t[3]["topic"], t[3]["reason"]) == (
        "Ready",
        5 * S,
        "g",
        "local_retry",
    )
    assert not [x for x in r["transitions"] if x["state"] == "DLQ"]
    assert [a["broker_reconsume_times"] for a in rows] == [0, 0, 0, 0]


def test_a_failed_send_back_does_not_use_up_a_broker_retry():
    """Worked by hand from the 4.9.7 source: every failure's send-back fails once (the draw
    of deliveries 1, 3, 5 is below the failure share, found with uniform_np), then goes
    through; the broker counts only its own copies, so the level is 3 + its count and the
    DLQ comes after max broker retries, not max deliveries."""
    r = run(
        max_reconsume_times=2,
        workload=one(),
        behavior={**ALWAYS_FAIL, "send_back_failure_probability": 0.5},
        levels="1s 2s 3s 4s 5s 6s",
    )
    rows = attempts(r)
    failed = [a["delivery"] for a in rows if a["next_ready_ms"] is not None
              and a["delay_level"] is None]  # fmt: skip
    # whatever the draws, the broker's count rises only when a send-back reached it
    for a, b in itertools.pairwise(rows):
        if b["delivery"] in [d + 1 for d in failed]:
            assert (b["reconsume_times"], b["broker_reconsume_times"]) == (
                a["reconsume_times"] + 1, a["broker_reconsume_times"],
            )  # fmt: skip
        else:
            assert b["reconsume_times"] == b["broker_reconsume_times"]
            assert b["broker_reconsume_times"] == a["broker_reconsume_times"] + 1
            assert a["delay_level"] == 3 + a["broker_reconsume_times"]
    assert rows[-1]["result_state"] == "DLQ" and rows[-1]["broker_reconsume_times"] == 2
    assert len(rows) == 3 + len(failed) and failed


def test_producer_fallback_levels_by_the_client_count_and_dead_letters_late():
    """RPC fails, the plain re-send succeeds (sendMessageBackAsNormalMessage): DELAY = 3 + rt
    even with delay_level_when_next_consume -1, and a 4.9.7 broker dead-letters at rt + 1 >=
    max through the schedule topic (the DELAY property survives handleRetryAndDLQ)."""
    r = run(
        max_reconsume_times=2,
        delay_level_when_next_consume=-1,
        workload=one(),
        behavior={**ALWAYS_FAIL, "send_back_fallback_probability": 1.0},
        levels="1s 2s 3s 4s 5s 6s",
    )
    rows = attempts(r)
    # one delivery fewer than the RPC path (3 with max 2): RECONSUME_TIME 2 >= 2 at rt 1
    assert [a["start_ms"] for a in rows] == [0, 3 * S]
    assert [(a["reconsume_times"], a["broker_reconsume_times"]) for a in rows] == [(0, 0), (1, 1)]
    assert [a["delay_level"] for a in rows] == [3, 4]
    last = trans(r)[-2:]
    assert [(t["state"], t["at_ms"], t["topic"], t["queue_id"], t["reason"]) for t in last] == [
        ("WaitingRetry", 3 * S, "SCHEDULE_TOPIC_XXXX", 3, "send_back_fallback"),
        ("DLQ", 7 * S, "%DLQ%g", 0, "max_reconsume_times"),
    ]
    assert (rows[-1]["result_state"], rows[-1]["settled_ms"]) == ("DLQ", 7 * S)


# --------------------------------------------------------------------------- 12. presets


def test_sqs_defaults():
    r = run(
        flavor="sqs", workload=one(), behavior={"fail_probability": 1.0, "processing_time": "1s"}
    )
    rows = attempts(r)
    assert [a["start_ms"] for a in rows] == [i * 30 * S for i in range(10)]
    assert rows[-1]["settled_ms"] == 300 * S and rows[-1]["result_state"] == "DLQ"
    assert trans(r)[3]["reason"] == "visible_again"


def test_pubsub_defaults():
    r = run(
        flavor="pubsub", workload=one(), behavior={"fail_probability": 1.0, "processing_time": "1s"}
    )
    rows = attempts(r)
    assert [a["start_ms"] for a in rows] == [0, 11 * S, 32 * S, 73 * S, 154 * S]
    assert rows[-1]["settled_ms"] == 315 * S
    r = run(
        flavor="pubsub",
        retry_policy={"kind": "pubsub", "max_delivery_attempts": 5},
        workload=one(),
        behavior={"processing_time": "15s"},
        horizon="12s",
    )
    assert (attempts(r)[0]["outcome"], attempts(r)[0]["end_ms"]) == ("TIMEOUT", 10 * S)


def test_exponential_and_customized_policies():
    def revived(seconds):  # each retry written by the open-source reviver 3 s after it is due
        return [s * S + i * 3 * S for i, s in enumerate(seconds)]

    r = run(
        flavor="rocketmq5.push",
        max_reconsume_times=8,
        workload=one(),
        retry_policy={"kind": "exponential", "initial": "1s", "max": "60s", "multiplier": 2},
        behavior=ALWAYS_FAIL,
    )
    assert starts(r) == revived((0, 1, 3, 7, 15, 31, 63, 123, 183))
    assert attempts(r)[-1]["settled_ms"] == revived((0,) * 9 + (243,))[-1]
    r = run(
        flavor="rocketmq5.push",
        max_reconsume_times=4,
        workload=one(),
        retry_policy={"kind": "customized", "intervals": ["1s", "5s", "30s"]},
        behavior=ALWAYS_FAIL,
    )
    assert starts(r) == revived((0, 1, 6, 36, 66))
    assert attempts(r)[-1]["settled_ms"] == 96 * S + 5 * 3 * S
    r = run(
        flavor="rocketmq5.push",
        deployment="apsaramq",
        max_reconsume_times=3,
        workload=one(),
        retry_policy={"kind": "exponential", "initial": "1s", "max": "1h", "multiplier": 1.5},
        behavior=ALWAYS_FAIL,
    )
    assert starts(r) == [0, 1000, 2500, 4750]  # 1 s, 1.5 s, 2.25 s (no reviver's lag)
    assert attempts(r)[-1]["settled_ms"] == 4750 + 3375


def test_dlq_disabled_discards():
    r = run(max_reconsume_times=0, dlq_enabled=False, workload=one(), behavior=ALWAYS_FAIL)
    assert path(r)[-1] == (3, "Discard", 0)
    assert trans(r)[-1]["topic"] == "g" and trans(r)[-1]["reason"] == "max_reconsume_times"
    r = run(
        flavor="rocketmq5.push",
        deployment="apsaramq",
        max_reconsume_times=0,
        dlq_enabled=False,
        workload=one(),
        behavior=ALWAYS_FAIL,
    )
    assert path(r) == [
        (1, "Ready", 0),
        (2, "Inflight", 0),
        (3, "WaitingRetry", 0),
        (4, "Discard", 10 * S),
    ]
    assert attempts(r)[0]["result_state"] == "Discard"


# --------------------------------------------------------------------------- 13. replay


def test_replay_after_dlq():
    r = run(
        max_reconsume_times=0,
        workload={"messages": 3, "over": "3s", "queues": 2},
        behavior={"poison_fraction": 1.0, "processing_time": 0},
        replay={"at": "1500ms", "rate": "1/s", "poison_fixed": True},
    )
    # m0, m1 dead-lettered at 0 s and 1 s (< 1.5 s), m2 at 2 s (not replayed)
    for m, at, queue in ((0, 1500, 0), (1, 2500, 1)):
        rows = attempts(r, m)
        assert [a["result_state"] for a in rows] == ["DLQ", "Commit"]
        second = rows[1]
        assert (
            second["delivery"],
            second["reconsume_times"],
            second["ready_ms"],
            second["source_topic"],
            second["queue_id"],
        ) == (2, 0, at, "g", queue)
        assert trans(r, m)[3] == tr(m, 2, 5, "Ready", at, "g", queue, None, "replayed")
    assert [a["result_state"] for a in attempts(r, 2)] == ["DLQ"]


def test_replay_without_fix_dead_letters_again_once():
    r = run(
        max_reconsume_times=0,
        workload=one(1),
        horizon="1h",
        behavior={"poison_fraction": 1.0, "processing_time": 0},
        replay={"at": "10s", "rate": 2, "poison_fixed": False},
    )
    assert [(a["start_ms"], a["result_state"]) for a in attempts(r)] == [
        (0, "DLQ"),
        (10 * S, "DLQ"),
    ]


def test_replay_rate_spacing():
    r = run(
        max_reconsume_times=0,
        workload={"messages": 3, "over": "3ms", "queues": 8},
        behavior={"poison_fraction": 1.0, "processing_time": 0},
        replay={"at": "1m", "rate": "6000/m"},
    )
    assert [attempts(r, m)[1]["ready_ms"] for m in range(3)] == [MIN, MIN + 10, MIN + 20]


# --------------------------------------------------------------------------- 14. horizon


def test_horizon_rows():
    # inflight at the horizon (also when it would end exactly at it)
    for proc in ("2h", "1h"):
        r = run(
            flavor="rocketmq4.orderly",
            workload=one(),
            horizon="1h",
            behavior={"processing_time": proc},
        )
        (a,) = attempts(r)
        assert (a["result_state"], a["start_ms"], a["processing_ms"]) == (
            "Inflight",
            0,
            parse_duration_ms(proc),
        )
        assert (a["end_ms"], a["outcome"], a["settled_ms"]) == (None, None, None)
        assert path(r) == [(1, "Ready", 0), (2, "Inflight", 0)]
    # a retry due exactly at the horizon is not delivered
    r = run(workload=one(), horizon="10s", behavior=ALWAYS_FAIL)
    (a,) = attempts(r)
    assert (a["result_state"], a["next_ready_ms"]) == ("WaitingRetry", 10 * S)
    # an after-backoff leave at the horizon stays WaitingRetry
    r = run(
        flavor="rocketmq5.push",
        deployment="apsaramq",
        max_reconsume_times=0,
        workload=one(),
        horizon="10s",
        behavior=ALWAYS_FAIL,
    )
    (a,) = attempts(r)
    assert (a["result_state"], a["settled_ms"]) == ("WaitingRetry", None)
    assert path(r)[-1] == (3, "WaitingRetry", 0)
    # ready but never started: one thread, 40 min each
    r = run(
        consumers={"instances": 1, "threads": 1},
        consume_timeout="1h",
        workload=one(3),
        horizon="1h",
        behavior={"processing_time": "40m"},
    )
    assert [attempts(r, m)[0]["result_state"] for m in range(3)] == ["Commit", "Inflight", "Ready"]
    ready = attempts(r, 2)[0]
    assert all(
        ready[k] is None
        for k in ("start_ms", "processing_ms", "end_ms", "outcome", "settled_ms", "batch_size")
    )
    assert path(r, 2) == [(1, "Ready", 0)]
    # ready before the horizon but eligible only after it
    r = run(workload=one(), horizon="1h", behavior={"ready_wait": "2h"})
    assert attempts(r)[0]["result_state"] == "Ready"
    # born at or after the horizon: a messages row, no attempts
    r = run(workload={"messages": 2, "over": "2h", "queues": 1}, horizon="1h")
    assert len(r["messages"]) == 2 and [a["msg_id"] for a in r["attempts"]] == [0]


def test_pull_interval_and_ready_wait():
    r = run(
        pull_interval="1s",
        workload={"messages": 3, "over": "3s", "queues": 1},
        behavior={"ready_wait": "200ms", "processing_time": 0},
    )
    assert [starts(r, m)[0] for m in range(3)] == [1000, 2000, 3000]


def test_outage_window():
    r = run(
        workload={"messages": 4, "over": "4s", "queues": 1},
        levels="1s",
        behavior={
            "processing_time": 0,
            "outages": [{"start": "1s", "end": "3s", "processing_time": "5ms"}],
        },
    )
    # msgs starting in [1 s, 3 s) fail and take 5 ms; level 3 is clamped to the 1 s table
    assert [a["result_state"] for a in r["attempts"] if a["delivery"] == 1] == [
        "Commit",
        "WaitingRetry",
        "WaitingRetry",
        "Commit",
    ]
    assert starts(r, 1) == [1000, 2005, 3010]  # 2005 is still inside the outage
    assert starts(r, 2) == [2000, 3005]
    assert attempts(r, 1)[0]["processing_ms"] == 5


def test_multiple_groups_and_speed():
    scenario = {
        "seed": 7,
        "horizon": "6h",
        "groups": [
            {
                "name": "a",
                "workload": {"messages": 20_000},
                "behavior": {
                    "fail_probability": 0.2,
                    "processing_time": {"dist": "lognormal", "mean": "50ms", "p99": "400ms"},
                },
            },
            {
                "name": "b",
                "flavor": "rocketmq4.orderly",
                "consumers": {"instances": 1, "threads": 4},
                "workload": {"messages": 2_000},
                "behavior": {"fail_probability": 0.1, "processing_time": "20ms"},
            },
        ],
    }
    t0 = time.perf_counter()
    r = simulate_scenario(scenario)
    assert time.perf_counter() - t0 < 30
    assert {m["group"] for m in r["messages"]} == {"a", "b"}
    assert len(r["messages"]) == 22_000
    assert r == simulate_scenario(scenario)  # deterministic


# --------------------------------------------------------------------------- properties

TERMINAL = {"Commit", "DLQ", "Discard"}


def check_paths(r, horizon):
    """Each message's deliveries are numbered 1..n, each a legal path in time order that
    follows its predecessor (the delivery before, or the one ``parent_delivery`` names: a
    4.9 client's second copy, model.md §6, whose retry is Ready at ``copy_ready_ms``)."""
    by_msg = defaultdict(list)
    for t in r["transitions"]:
        by_msg[(t["group"], t["msg_id"])].append(t)
    atts = defaultdict(list)
    for a in r["attempts"]:
        atts[(a["group"], a["msg_id"])].append(a)
    assert set(by_msg) == set(atts)
    for key, ts in by_msg.items():
        rows = sorted(atts[key], key=lambda a: a["delivery"])
        assert [a["delivery"] for a in rows] == list(range(1, len(rows) + 1))
        forked = any(a["copy_state"] or a["parent_delivery"] for a in rows)
        times = [t["at_ms"] for t in sorted(ts, key=lambda t: t["seq"])]
        assert forked or times == sorted(times), key
        assert all(t < horizon for t in times)
        per_d = defaultdict(dict)
        for t in ts:
            k = t["seq"] - 4 * (t["delivery"] - 1)
            assert 1 <= k <= 4
            per_d[t["delivery"]][k] = t
        children = defaultdict(list)
        for a in rows:
            parent = a["parent_delivery"] or a["delivery"] - 1
            children[parent].append(a)
            check_delivery(a, per_d[a["delivery"]], rows[parent - 1] if parent else None, horizon)
        for parent, kids in children.items():
            if not parent:
                continue
            a = rows[parent - 1]
            state, copied = a["result_state"], a["copy_state"] == "WaitingRetry"
            retried = state in ("WaitingRetry", "DLQ") or (
                state == "Inflight" and a["next_ready_ms"]
            )
            assert retried and len(kids) <= 1 + copied, (key, parent)
            if not forked:
                assert parent == len(rows) - 1 or kids[0]["delivery"] == parent + 1


def check_delivery(a, steps, before, horizon):
    """One delivery's steps, and how its Ready follows ``before``, the delivery it retries."""
    d = a["delivery"]
    assert steps[1]["state"] == "Ready" and steps[1]["at_ms"] == a["ready_ms"]
    copy_child = before is not None and (
        before["copy_state"] == "WaitingRetry" and a["ready_ms"] == before["copy_ready_ms"]
    )
    if before is None:
        assert d == 1 and steps[1]["reason"] == "published" and a["reconsume_times"] == 0
    elif before["result_state"] == "DLQ" and not copy_child:
        assert steps[1]["reason"] == "replayed" and a["reconsume_times"] == 0
        assert a["ready_ms"] > before["settled_ms"]
    else:
        prev_end, prev_next = before["result_state"], before["next_ready_ms"]
        if copy_child:
            prev_end, prev_next = "WaitingRetry", before["copy_ready_ms"]
        assert prev_end == "WaitingRetry" or (prev_end == "Inflight" and prev_next)
        assert steps[1]["reason"] in {"retry_due", "local_retry", "visible_again"}
        assert a["ready_ms"] == prev_next
    states = [steps[k]["state"] for k in sorted(steps)]
    assert sorted(steps) == list(range(1, len(steps) + 1))
    at = [steps[k]["at_ms"] for k in sorted(steps)]
    assert at == sorted(at)
    state = a["result_state"]
    if state == "Ready":
        assert states == ["Ready"] and a["start_ms"] is None
    elif state == "Inflight":
        assert states == ["Ready", "Inflight"]
    else:
        assert states[:2] == ["Ready", "Inflight"] and len(states) in (3, 4)
        assert a["ready_ms"] <= a["start_ms"] <= a["end_ms"] < horizon
        if a["copy_state"]:  # a second copy, sent back when the listener failed
            assert a["outcome"] == "TIMEOUT" and states[2] == state
            assert steps[4]["reason"] == "late_send_back" and steps[4]["at_ms"] == a["copy_ms"]
        elif len(states) == 4:
            assert states[2] == "WaitingRetry" and states[3] in {"DLQ", "Discard"}
            assert state == states[3] and a["settled_ms"] == steps[4]["at_ms"]
        else:
            assert states[2] == state
        if state in TERMINAL:
            assert a["settled_ms"] is not None


def check_pool(r, threads, horizon):
    """At no millisecond do more than `threads` consume requests hold a thread."""
    if threads is None:
        return
    deltas = defaultdict(Fraction)
    for a in r["attempts"]:
        if a["start_ms"] is None or not a["processing_ms"]:
            continue
        w = Fraction(1, a["batch_size"])
        deltas[a["start_ms"]] += w
        deltas[a["start_ms"] + a["processing_ms"]] -= w
    busy = Fraction(0)
    for t in sorted(deltas):
        busy += deltas[t]
        assert busy <= threads, t


def check_blocking(r, horizon):
    """A blocking lane never runs deliveries of two messages at once."""
    lanes = defaultdict(list)
    for a in r["attempts"]:
        if a["start_ms"] is None:
            continue
        end = a["end_ms"] if a["end_ms"] is not None else horizon
        lanes[(a["source_topic"], a["queue_id"])].append((a["start_ms"], end, a["msg_id"]))
    for spans in lanes.values():
        for s1, e1, m1 in spans:
            for s2, e2, m2 in spans:
                if m1 != m2:
                    assert e1 <= s2 or e2 <= s1, (m1, m2)


@st.composite
def scenarios(draw):
    group, blocking = draw(group_configs())
    scenario = {
        "name": "p",
        "seed": draw(st.integers(0, 5)),
        "horizon": draw(st.sampled_from(["1m", "10m", "1h"])),
        "broker": {"message_delay_level": "1s 2s 5s 10s"},
        "groups": [group],
    }
    return scenario, blocking, pool_size(group)


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(scenarios())
def test_property_legal_paths(case):
    scenario, blocking, threads = case
    horizon = parse_duration_ms(scenario["horizon"])
    r = simulate_scenario(scenario)
    check_paths(r, horizon)
    check_pool(r, threads, horizon)
    if blocking:
        check_blocking(r, horizon)
    replayed = [t for t in r["transitions"] if t["reason"] == "replayed"]
    if "replay" not in scenario["groups"][0]:
        assert not replayed
    for a in r["attempts"]:
        assert a["batch_size"] in (None, 1, 2, 3)


@pytest.mark.parametrize("flavor", [f.split("+")[0] for f, _ in FLAVORS])
def test_every_flavor_commits_when_nothing_fails(flavor):
    r = run(flavor=flavor, workload={"messages": 20, "over": "10s", "queues": 2})
    assert {a["result_state"] for a in r["attempts"]} == {"Commit"}
    assert len(r["attempts"]) == 20
