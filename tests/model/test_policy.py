"""The two interpreters of every flavor's rules must agree: Spark columns and the event
loop's compiled rules.

Each case is one settled delivery (reconsume_times, outcome, times, send-back result); the
column version (round engine) and the compiled one (the event loop, called through
tests/compiled_rules.py) must give the same next step, for every flavor, including
timeouts, exhausted retries and clamped tables.
"""

from __future__ import annotations

import itertools

import pytest
from chispa import assert_df_equality
from compiled_rules import reconsume_of, result_of, step_of
from pyspark.sql import functions as F
from support import group, scenario

from retrysim.model.behavior import (
    CONSUME_SUCCESS,
    EXCEPTION,
    RECONSUME_LATER,
    SEND_BACK_DONE,
    SEND_BACK_FAILED,
    SEND_BACK_FALLBACK,
    TIMEOUT,
    longest_processing_ms,
)
from retrysim.model.flavors import delay_table_levels, exponential_intervals
from retrysim.model.policy import Step, next_reconsume_columns, policy_for
from retrysim.model.states import REASON_SEND_BACK_FAILED, REASON_SEND_BACK_FALLBACK

FLAVOR_GROUPS = {
    "concurrently": {},
    "concurrently-fixed-level": {"delay_level_when_next_consume": 4, "max_reconsume_times": 3},
    "concurrently-dlq-now": {"delay_level_when_next_consume": -1},
    "concurrently-fallback": {"delay_level_when_next_consume": -1, "max_reconsume_times": 3,
                              "behavior": {"send_back_failure_probability": 0.2,
                                           "send_back_fallback_probability": 0.3}},
    "concurrently-periodic": {"consume_timeout": "1m", "consume_timeout_check": "periodic"},
    "concurrently-no-dlq": {"dlq_enabled": False, "max_reconsume_times": 2},
    "concurrently-brokers": {"brokers": 2, "retry_queue_nums": 3,
                             "workload": {"queues": 8}},
    "orderly": {"flavor": "rocketmq4.orderly", "max_reconsume_times": 2},
    "broadcasting": {"flavor": "rocketmq4.broadcasting"},
    "http-unordered": {"flavor": "http.unordered"},
    "http-ordered": {"flavor": "http.ordered"},
    "push": {"flavor": "rocketmq5.push", "max_reconsume_times": 3, "deployment": "apsaramq"},
    "push-grpc": {"flavor": "rocketmq5.push", "retry_policy": {"kind": "grpc_client"}},
    "push-ordered": {"flavor": "rocketmq5.push", "ordered": True, "max_reconsume_times": 2},
    "simple": {"flavor": "rocketmq5.simple", "invisible_duration": "30s", "dlq_enabled": False},
    "exponential": {
        "flavor": "exponential",
        "retry_policy": {"kind": "exponential", "initial": "1s", "max": "20s", "multiplier": 1.5},
    },
    "customized": {"flavor": "customized", "retry_policy": {"kind": "customized",
                                                            "intervals": ["1s", "7s"]}},
    "sqs": {"flavor": "sqs", "retry_policy": {"kind": "sqs", "max_receive_count": 3}},
    "pubsub": {"flavor": "pubsub"},
}  # fmt: skip
OUTCOMES = (CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION, TIMEOUT)
STEP_COLUMNS = list(Step._fields)


def _policy(name: str, **extra):
    config = scenario(
        group(name, **{**FLAVOR_GROUPS[name], **extra}),
        broker={"message_delay_level": "1s 5s 10s 30s 1m 2m"},
    )
    return policy_for(config.groups[0], config.broker.message_delay_level)


def _cases():
    for rt, behind, outcome, send_back in itertools.product(
        (0, 1, 2, 3, 5, 16, 300),
        (0, 2),
        OUTCOMES,
        (SEND_BACK_DONE, SEND_BACK_FALLBACK, SEND_BACK_FAILED),
    ):
        start = 1_000 * rt + 7
        # the broker's count trails the client's after failed send-backs
        brt = max(rt - behind, 0)
        yield (rt, brt, outcome, start, start + 250, send_back, "orders", 3, 40 + rt, rt + 1)
        # a retry copy on broker 1's third retry queue: its next retry stays on broker 1
        yield (
            rt,
            brt,
            outcome,
            start,
            start + 250,
            send_back,
            "%RETRY%concurrently-brokers",
            5,
            41 + rt,
            rt + 2,
        )


def _next_step_twins(spark):
    """Every flavor at once (one Spark job): a column ``flavor`` tells the cases apart."""
    cases = list(_cases())
    frame = spark.createDataFrame(
        cases,
        "reconsume_times int, broker_reconsume_times int, outcome string, start_ms long, "
        "end_ms long, send_back int, source_topic string, queue_id int, msg_id long, "
        "delivery int",
    )
    actual, expected_rows = None, []
    for name in sorted(FLAVOR_GROUPS):
        policy = _policy(name)
        part = frame.transform(policy.with_next_step).select(
            F.lit(name).alias("flavor"), "reconsume_times", "broker_reconsume_times", "outcome",
            "send_back", *STEP_COLUMNS,
        )  # fmt: skip
        actual = part if actual is None else actual.unionByName(part)
        expected_rows += [
            (name, rt, brt, outcome, send_back,
             *step_of(policy, rt, brt, outcome, start, end, send_back, topic, q, msg_id,
                               delivery))
            for rt, brt, outcome, start, end, send_back, topic, q, msg_id, delivery in cases
        ]  # fmt: skip
    return actual, expected_rows


def _consume_result_twins(spark):
    starts = (0, 59_999, 60_000, 61_234, 3_600_000)
    processings = (0, 10_000, 29_999, 30_000, 30_001, 60_000, 119_999, 120_001, 900_001)
    cases = [(s, p, RECONSUME_LATER) for s in starts for p in processings]
    frame = spark.createDataFrame(
        cases, "start_ms long, processing_ms long, listener_outcome string"
    )
    actual, expected_rows = None, []
    for name in ("concurrently", "concurrently-periodic", "simple", "orderly", "pubsub"):
        policy = _policy(name)
        part = frame.transform(policy.with_consume_result).select(
            F.lit(name).alias("flavor"), "start_ms", "processing_ms", "outcome", "end_ms"
        )
        actual = part if actual is None else actual.unionByName(part)
        expected_rows += [(name, s, p, *result_of(policy, s, p, o)) for s, p, o in cases]
    return actual, expected_rows


def _next_reconsume_twins(spark):
    """A send-back that failed counts on the client only, the producer's fallback stores the
    client's count + 1, every other retry counts the stored copy's + 1."""
    reasons = (REASON_SEND_BACK_FAILED, REASON_SEND_BACK_FALLBACK, RECONSUME_LATER, TIMEOUT)
    cases = [(rt, brt, reason) for rt in (0, 3) for brt in (0, 2, 5) for reason in reasons]
    frame = spark.createDataFrame(cases, "rt int, brt int, reason string")
    counted, kept = next_reconsume_columns(F.col("rt"), F.col("brt"), F.col("reason"))
    actual = frame.select("rt", "brt", "reason", counted.alias("next_rt"), kept.alias("next_brt"))
    policy = _policy("concurrently")
    return actual, [(*case, *reconsume_of(policy, *case)) for case in cases]


@pytest.mark.parametrize(
    "twins",
    [_next_step_twins, _consume_result_twins, _next_reconsume_twins],
    ids=["next step", "consume result", "next reconsume counts"],
)
def test_the_columns_give_what_the_compiled_rules_give(spark, twins):
    """The round engine's column rules against the event loop's compiled rules, case by case."""
    actual, expected_rows = twins(spark)
    expected = spark.createDataFrame(expected_rows, actual.schema)
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_concurrently_levels_clamp_to_a_short_table():
    policy = _policy("concurrently")  # 6-level table: levels 3, 4, 5, 6, 6, ...
    steps = [
        step_of(policy, n, n, RECONSUME_LATER, 0, 0, SEND_BACK_DONE, "orders", 0, 0, n + 1)
        for n in range(6)
    ]
    assert [step.delay_level for step in steps] == [3, 4, 5, 6, 6, 6]
    assert [step.next_ready_ms for step in steps] == [10_000, 30_000, 60_000, 120_000,
                                                      120_000, 120_000]  # fmt: skip
    assert delay_table_levels((1, 2), 3) == (2,)


def test_concurrently_timeout_goes_back_at_level_3_even_with_dlq_now():
    policy = _policy("concurrently-dlq-now")
    step = step_of(policy, 0, 0, TIMEOUT, 0, 900_000, SEND_BACK_DONE, "orders", 3, 0, 1)
    assert (step.result_state, step.delay_level, step.next_ready_ms) == ("WaitingRetry", 3,
                                                                          910_000)  # fmt: skip
    step = step_of(policy, 0, 0, EXCEPTION, 0, 5, SEND_BACK_DONE, "orders", 3, 0, 1)
    assert (step.result_state, step.end_reason) == ("DLQ", "delay_level_negative")


def test_after_backoff_leave_waits_one_more_interval():
    push = _policy("push")  # max 3 retries; retry 4 would wait 2 min
    step = step_of(push, 3, 3, RECONSUME_LATER, 1_000, 2_000, SEND_BACK_DONE, "%RETRY%g_g", 0, 0, 1)
    assert step.end_state == "WaitingRetry" and step.leave_state == "DLQ"
    assert step.settled_ms == 2_000 + 120_000


def test_simple_stays_inflight_until_visible_again():
    """The 5.x seed names no WaitingRetry for simple consumers: a message not acknowledged
    is invisible (Inflight) until start + invisible_duration and the open-source reviver's
    3 s, then Ready or gone."""
    simple = _policy("simple")  # invisible 30 s, no DLQ
    assert result_of(simple, 1_000, 200, EXCEPTION) == (EXCEPTION, 34_000)
    assert result_of(simple, 1_000, 200, CONSUME_SUCCESS) == (CONSUME_SUCCESS, 1_200)
    assert result_of(simple, 1_000, 40_000, CONSUME_SUCCESS) == (TIMEOUT, 34_000)
    step = step_of(simple, 3, 3, EXCEPTION, 1_000, 34_000, SEND_BACK_DONE, "t", 0, 0, 4)
    assert (step.result_state, step.end_state, step.next_ready_ms, step.next_reason) == (
        "Inflight", None, 34_000, "retry_due",
    )  # fmt: skip
    step = step_of(simple, 16, 16, TIMEOUT, 1_000, 34_000, SEND_BACK_DONE, "t", 0, 0, 17)
    assert (step.result_state, step.end_state, step.settled_ms) == ("Discard", "Discard", 34_000)


def test_exponential_intervals_round_half_up_and_cap():
    expected = (1_000, 1_500, 2_250, 3_375, 5_063, 7_594, 11_391, 17_086, 20_000)
    assert exponential_intervals(1_000, 20_000, 1.5, 16) == expected
    assert exponential_intervals(5_000, 7_200_000, 2.0, 2) == (5_000, 10_000, 20_000)


def test_send_back_failure_resubmits_locally_without_dlq_check():
    policy = _policy("concurrently")
    step = step_of(policy, 16, 16, RECONSUME_LATER, 0, 10, SEND_BACK_FAILED, "%RETRY%g", 0, 0, 1)
    assert (step.result_state, step.end_reason, step.next_ready_ms) == (
        "WaitingRetry", "send_back_failed", 5_010,
    )  # fmt: skip
    assert (step.next_topic, step.next_queue_id, step.next_reason) == ("%RETRY%g", 0,
                                                                       "local_retry")  # fmt: skip


def test_a_failed_send_back_does_not_use_up_a_broker_retry():
    """AbstractSendMessageProcessor.consumerSendMsgBack decides level and DLQ on the stored
    copy (looked up by the commit-log offset the request carries), not on the client's
    local reconsumeTimes + 1 after a resubmit; the new copy stores the stored count + 1."""
    policy = _policy("concurrently", max_reconsume_times=3)
    assert reconsume_of(policy, 0, 0, "send_back_failed") == (1, 0)
    step = step_of(policy, 1, 0, RECONSUME_LATER, 0, 10, SEND_BACK_DONE, "orders", 0, 0, 2)
    assert (step.result_state, step.delay_level, step.end_reason) == (
        "WaitingRetry", 3, RECONSUME_LATER,
    )  # fmt: skip
    assert reconsume_of(policy, 1, 0, RECONSUME_LATER) == (1, 1)
    # the client says 3 (= max), the broker's copy 2: retried, not dead-lettered
    step = step_of(policy, 3, 2, RECONSUME_LATER, 0, 10, SEND_BACK_DONE, "orders", 0, 0, 5)
    assert (step.result_state, step.delay_level) == ("WaitingRetry", 5)
    step = step_of(policy, 3, 3, RECONSUME_LATER, 0, 10, SEND_BACK_DONE, "orders", 0, 0, 6)
    assert (step.result_state, step.end_reason) == ("DLQ", "max_reconsume_times")


def test_the_producer_fallback_counts_locally_and_dead_letters_through_the_schedule_topic():
    """sendMessageBackAsNormalMessage: DELAY = 3 + the client's count, delayLevelWhenNextConsume
    ignored (here -1); a 4.9.7 broker (SendMessageProcessor.handleRetryAndDLQ) dead-letters
    when RECONSUME_TIME = count + 1 >= max, and the DELAY property it keeps sends the dead
    letter through SCHEDULE_TOPIC_XXXX first."""
    policy = _policy("concurrently-fallback")  # max 3, dlq now, 6-level table
    step = step_of(policy, 1, 0, EXCEPTION, 0, 10, SEND_BACK_FALLBACK, "orders", 0, 0, 2)
    assert (step.result_state, step.delay_level, step.next_ready_ms, step.end_reason) == (
        "WaitingRetry", 4, 30_010, "send_back_fallback",
    )  # fmt: skip
    assert (step.end_topic, step.end_queue_id) == ("SCHEDULE_TOPIC_XXXX", 3)
    assert reconsume_of(policy, 1, 0, "send_back_fallback") == (2, 2)
    step = step_of(policy, 2, 0, EXCEPTION, 0, 10, SEND_BACK_FALLBACK, "orders", 0, 0, 3)
    assert (step.result_state, step.end_state, step.end_topic, step.end_queue_id) == (
        "DLQ", "WaitingRetry", "SCHEDULE_TOPIC_XXXX", 4,
    )  # fmt: skip
    assert (step.delay_level, step.settled_ms, step.leave_topic) == (
        5,
        60_010,
        "%DLQ%concurrently-fallback",
    )
    # without the fallback the same failure is dead-lettered at once (level -1)
    step = step_of(policy, 2, 0, EXCEPTION, 0, 10, SEND_BACK_DONE, "orders", 0, 0, 3)
    assert (step.result_state, step.settled_ms) == ("DLQ", 10)


def test_eligible_time_rounds_up_to_the_pull_tick(spark):
    policy = _policy("concurrently", pull_interval="1s", behavior={"ready_wait": "250ms"})
    readies = [0, 1, 749, 750, 751, 999, 1_000, 1_751]
    expected = [1_000, 1_000, 1_000, 1_000, 2_000, 2_000, 2_000, 3_000]
    assert [policy.eligible_ms(r) for r in readies] == expected
    frame = spark.createDataFrame([(r,) for r in readies], "ready_ms long")
    got = [row[0] for row in frame.select(policy.eligible_col(F.col("ready_ms"))).collect()]
    assert got == expected


@pytest.mark.parametrize(
    ("changes", "may_fill"),
    [
        ({}, True),  # conf/conformance/sweep-4x.yaml's group: 40 threads, 125 s listeners
        ({"consumers": "unlimited"}, True),
        ({"consumers": {"instances": 2, "threads": 16}}, False),  # at most 16 a queue run
        ({"consume_message_batch_max_size": 2, "consumers": {"instances": 1, "threads": 9}}, True),
        ({"behavior": {"processing_time": "59s"}}, False),  # nothing outlasts the minute
        ({"consume_timeout_check": "exact"}, False),
        ({"flavor": "rocketmq4.broadcasting"}, True),
    ],
)
def test_the_cleaners_limit_binds_only_where_more_than_16_of_a_queue_can_expire(changes, may_fill):
    """Policy.cleaner_may_fill decides which 4.x groups the round engine leaves to the
    event loop: a periodic check (the default), more than 16 deliveries of a queue running
    at once, and a processing time that can outlast the timeout."""
    base = {
        "consume_timeout": "1m",
        "consumers": {"instances": 1, "threads": 40},
        "workload": {"messages": 40, "over": "4s", "queues": 1},
        "behavior": {"processing_time": "125s"},
    }
    built = scenario(group("g", **{**base, **changes}))
    g = built.groups[0]
    policy = policy_for(g, built.broker.message_delay_level)
    assert policy.cleaner_may_fill(longest_processing_ms(g.behavior)) is may_fill
