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
    assert under_load(processing, 0.1, concurrency, Downstream(capacity=4), 0.5) == (
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
    processing = under_load(100, 0.2, 8, Downstream(capacity=2, shed=0.5), u_fail)
    assert processing == ((0, True) if refused else (400, False))


def test_nothing_is_shed_within_capacity():
    assert under_load(100, 0.2, 2, Downstream(capacity=2, shed=1.0), 0.3) == (100, False)


def test_a_call_that_would_outlast_the_timeout_fails_when_it_runs_out():
    downstream = Downstream(capacity=2, timeout="300ms")
    assert under_load(200, 0.0, 3, downstream, 0.5) == (300, False)  # exactly the timeout
    assert under_load(200, 0.0, 4, downstream, 0.5) == (300, True)  # 400 ms: cut at 300
    assert under_load(500, 0.0, 1, downstream, 0.5) == (300, True)  # slow even alone


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
