"""The listener under load (docs/model.md §3): the arithmetic every event loop shares."""

from __future__ import annotations

import pytest

from retrysim.model.behavior import (
    CONSUME_SUCCESS,
    ListenerModel,
    listener_draw_columns,
    under_load,
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
    assert under_load(processing, 0.1, concurrency, Downstream(capacity=4)) == (
        expected,
        0.1,
        False,
    )


def test_the_shed_share_of_the_excess_fails_on_top_of_the_listeners_own_failures():
    downstream = Downstream(capacity=2, shed=0.5)
    assert under_load(10, 0.2, 2, downstream)[1] == 0.2  # nothing beyond capacity
    # 8 calls, 6 beyond capacity: 0.5 x 6/8 = 0.375 shed, and 0.2 of the listener's own
    assert under_load(10, 0.2, 8, downstream)[1] == pytest.approx(1 - 0.8 * 0.625)
    assert under_load(10, 0.0, 8, Downstream(capacity=2, shed=1.0))[1] == pytest.approx(0.75)


def test_a_call_that_would_outlast_the_timeout_fails_when_it_runs_out():
    downstream = Downstream(capacity=2, timeout="300ms")
    assert under_load(200, 0.0, 3, downstream) == (300, 0.0, False)  # exactly the timeout
    assert under_load(200, 0.0, 4, downstream) == (300, 0.0, True)  # 400 ms: cut at 300
    assert under_load(500, 0.0, 1, downstream) == (300, 0.0, True)  # slow even alone


def test_a_timed_out_call_fails_as_the_listener_fails():
    behavior = Behavior(
        processing_time="200ms",
        outcome_mix={"reconsume_later": 0, "exception": 1},
        downstream={"capacity": 1, "timeout": "300ms"},
    )
    model = ListenerModel(behavior)
    draws = (0.99, 0.5, 0.5, 0.5, 0.5)  # the listener itself would succeed
    assert model.result(draws, 1, 0, False, concurrency=1) == (CONSUME_SUCCESS, 200, 0)
    assert model.result(draws, 1, 0, False, concurrency=2) == ("EXCEPTION", 300, 0)


def test_the_round_engine_declines_a_downstream_under_load():
    behavior = Behavior(downstream={"capacity": 4})
    with pytest.raises(ValueError, match="event by event"):
        listener_draw_columns(behavior, 1, "payments")
