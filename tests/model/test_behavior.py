"""The listener under load (docs/model.md §3): the event loop's compiled arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from chispa import assert_df_equality
from compiled_rules import GROUP, SEED, listen_of, load_of
from pyspark.sql import functions as F

from retrysim.engine.event_rules import Listener, _sample
from retrysim.model.behavior import (
    CONSUME_SUCCESS,
    _Dist,
    client_ms,
    listener_draw_columns,
    longest_processing_ms,
)
from retrysim.scenario.spec import Behavior, Downstream


@pytest.mark.parametrize(
    ("processing", "concurrency", "expected"),
    [
        (100, 1, 100),  # alone
        (100, 4, 100),  # at capacity: full speed
        (100, 5, 125),  # 5 calls share 4 servers
        (101, 6, 152),  # 151.5 rounds half up
        (3, 7, 5),  # 5.25
        (0, 100, 0),
    ],
)
def test_beyond_capacity_a_call_runs_concurrency_over_capacity_times_longer(
    processing, concurrency, expected
):
    assert load_of(processing, 0.1, concurrency, Downstream(capacity=4), 0.5) == (
        expected,
        False,
    )


@pytest.mark.parametrize(
    ("u_fail", "refused"),
    [
        (0.1, False),  # below 0.2: the listener's own failure (the caller decides it)
        (0.2, True),  # from 0.2 up to 1 - 0.8 x (1 - 0.5 x 6/8) = 0.5: shed
        (0.49, True),
        (0.51, False),  # above: served, slowly
    ],
)
def test_the_shed_share_of_the_excess_is_refused_at_once(u_fail, refused):
    """8 calls, 6 beyond a capacity of 2: the downstream sheds 0.5 x 6/8 of the calls the
    listener (failing 0.2 on its own) would not fail itself."""
    processing = load_of(100, 0.2, 8, Downstream(capacity=2, shed=0.5), u_fail)
    assert processing == ((0, True) if refused else (400, False))


def test_nothing_is_shed_within_capacity():
    assert load_of(100, 0.2, 2, Downstream(capacity=2, shed=1.0), 0.3) == (100, False)


def test_a_call_that_would_outlast_the_timeout_fails_when_it_runs_out():
    downstream = Downstream(capacity=2, timeout="300ms")
    assert load_of(200, 0.0, 3, downstream, 0.5) == (300, False)  # exactly the timeout
    assert load_of(200, 0.0, 4, downstream, 0.5) == (300, True)  # 400 ms: cut at 300
    assert load_of(500, 0.0, 1, downstream, 0.5) == (300, True)  # slow even alone


def test_a_timed_out_call_fails_as_the_listener_fails():
    behavior = Behavior(
        fail_probability=0,
        processing_time="200ms",
        outcome_mix={"reconsume_later": 0, "exception": 1},
        downstream={"capacity": 1, "timeout": "300ms"},
    )
    # the listener itself never fails (fail_probability 0)
    assert listen_of(behavior, 7, 1, 0, concurrency=1) == (CONSUME_SUCCESS, 200, 0)
    assert listen_of(behavior, 7, 1, 0, concurrency=2) == ("EXCEPTION", 300, 0)


def test_the_clients_own_time_adds_its_whole_ms_and_one_more_at_its_fraction():
    """0.4 ms a delivery: 0 or 1 more ms, 1 for about 40 % of the deliveries; 2.4 ms: 2 or 3;
    after a downstream's timeout (the thread's time, not the call's); none for the harness's
    listener, whose real client adds its own."""
    extra = {}
    for overhead in ("0.4ms", "2.4ms"):
        behavior = Behavior(processing_time="10ms", client_overhead=overhead)
        extra[overhead] = [listen_of(behavior, m, 1, 0)[1] - 10 for m in range(2_000)]
    assert set(extra["0.4ms"]) == {0, 1} and 0.37 < sum(extra["0.4ms"]) / 2_000 < 0.43
    assert set(extra["2.4ms"]) == {2, 3} and 2.37 < sum(extra["2.4ms"]) / 2_000 < 2.43
    slow = Behavior(processing_time="200ms", client_overhead="2ms",
                    downstream={"capacity": 1, "timeout": "300ms"})  # fmt: skip
    assert listen_of(slow, 7, 1, 0, concurrency=2)[1] == 302
    alone = Listener(Behavior(client_overhead="2.4ms"), SEED, GROUP, client_time=False)
    assert {alone(m, 1, 0, False)[1] for m in range(100)} == {10}


def test_the_numpy_client_time_is_the_compiled_listeners():
    """behavior.client_ms (the conformance figures take it off retrysim's processing time)
    against the compiled listener with and without the client's time, delivery by delivery."""
    behavior = Behavior(processing_time={"dist": "exponential", "mean": "20ms"},
                        client_overhead="1.3ms")  # fmt: skip
    msg_ids = np.repeat(np.arange(300, dtype=np.int64), 3)
    deliveries = np.tile(np.array([1, 2, 7], dtype=np.int64), 300)
    full = Listener(behavior, SEED, GROUP)
    alone = Listener(behavior, SEED, GROUP, client_time=False)
    expected = [full(m, d, 0, False)[1] - alone(m, d, 0, False)[1]
                for m, d in zip(msg_ids.tolist(), deliveries.tolist(), strict=True)]  # fmt: skip
    actual = client_ms(behavior, SEED, GROUP, msg_ids, deliveries)
    assert actual.tolist() == expected and set(expected) == {1, 2}


def test_the_round_engine_declines_a_downstream_under_load():
    behavior = Behavior(downstream={"capacity": 4})
    with pytest.raises(ValueError, match="event by event"):
        listener_draw_columns(behavior, 1, "payments")


STORMY = Behavior(
    fail_probability=0.2, poison_fraction=0.05, fail_first=1,
    processing_time={"dist": "lognormal", "mean": "80ms", "p99": "900ms"},
    outcome_mix={"reconsume_later": 0.5, "exception": 0.3, "null_return": 0.2},
    send_back_failure_probability=0.1, send_back_fallback_probability=0.2,
    client_overhead="1.4ms",
    outages=[{"start": "10s", "end": "20s", "fail_probability": 0.9, "processing_time": "3s"},
             {"start": "15s", "end": "30s", "fail_probability": 0.5,
              "processing_time": {"dist": "exponential", "mean": "1s"}}],
)  # fmt: skip


def test_the_columns_draw_what_the_compiled_listener_draws(spark):
    """The round engine's listener columns against the event loop's compiled listener,
    delivery by delivery: poison, the first failures, two overlapping outages, every
    outcome and every send-back, each distribution."""
    cases = [(m, d, t) for m in range(200) for d in (1, 2, 5) for t in (0, 12_000, 17_000, 25_000)]
    frame = spark.createDataFrame(cases, "msg_id long, delivery int, start_ms long").withColumn(
        "poison_fixed", F.lit(False)
    )
    actual = frame.withColumns(listener_draw_columns(STORMY, SEED, GROUP)).select(
        "msg_id", "delivery", "start_ms", "listener_outcome", "processing_ms", "send_back"
    )
    rows = [(m, d, t, *listen_of(STORMY, m, d, t)) for m, d, t in cases]
    expected = spark.createDataFrame(rows, actual.schema)
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
    assert {row[3] for row in rows} == {CONSUME_SUCCESS, "RECONSUME_LATER", "EXCEPTION",
                                        "NULL_RETURN"}  # fmt: skip
    assert {row[5] for row in rows} == {0, 1, 2}


# the processing times the engine choice bounds: one of each distribution
LONGEST_CASES = [
    {"processing_time": "125s"},
    {"processing_time": {"dist": "exponential", "mean": "30s"}},
    {"processing_time": {"dist": "lognormal", "mean": "30s", "p99": "150s"},
     "client_overhead": "0.4ms"},
    {"processing_time": "50ms",
     "outages": [{"start": "1m", "end": "2m", "processing_time": "20m"}]},
]  # fmt: skip


@pytest.mark.parametrize("raw", LONGEST_CASES)
def test_the_longest_processing_time_bounds_every_draw(raw):
    """longest_processing_ms lets the round engine keep a 4.x group whose deliveries cannot
    outlast the timeout (the cleaner's limit never binds there): at the most extreme draw
    the uniforms can give (2**-53; Box-Muller's cosine at 1) each window's distribution
    stays within it, by no more than a millisecond and the client's time."""
    behavior = Behavior.model_validate(raw)
    longest = longest_processing_ms(behavior)
    specs = [behavior.processing_time] + [w.processing_time for w in behavior.windows]
    extremes = []
    for spec in specs:
        if spec is None:
            continue
        dist = _Dist.of(spec)
        kind = {"constant": 0, "exponential": 1, "lognormal": 2}[dist.kind]
        extremes.append(_sample(kind, dist.mean, dist.mu, dist.sigma, 2.0**-53, 1.0))
    overhead = int(np.ceil(behavior.client_overhead))
    assert max(extremes) + overhead <= longest <= max(extremes) + overhead + 1.5
