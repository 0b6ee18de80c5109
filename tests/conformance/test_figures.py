"""The timed figures' tolerances (docs/conformance.md), without a broker: retrysim's own rows
of a suite scenario stand for the broker's, moved the way the broker moves them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support import PROJECT

from retrysim.conformance.figures import batch_order_ms, timed_figures
from retrysim.conformance.harness import BrokerRun
from retrysim.conformance.run import check_runnable
from retrysim.model.behavior import CONSUME_SUCCESS, RECONSUME_LATER
from retrysim.model.states import READY_PUBLISHED
from retrysim.scenario.loading import load_scenario

SUITE = PROJECT / "conf" / "conformance"


def simulated(name: str):
    """A suite scenario's one group: its spec and staged rows, as the comparison takes them."""
    (spec, staged), = check_runnable(load_scenario(SUITE / f"{name}.yaml")).values()  # fmt: skip
    return spec, staged


def as_broker(staged: pd.DataFrame) -> BrokerRun:
    """retrysim's rows as the harness records a broker's: every delivery that started."""
    rows = staged[staged["start_ms"].notna()]
    deliveries = pd.DataFrame({
        "msg_id": rows["msg_id"], "delivery": rows["delivery"],
        "reconsume_times": rows["delivery"] - 1, "topic": rows["source_topic"],
        "queue_id": rows["queue_id"], "instance": rows["consumer_instance"], "thread": "t",
        "stored_ms": rows["ready_ms"], "start_ms": rows["start_ms"],
        "end_ms": rows["start_ms"] + rows["listener_ms"],
        "outcome": np.where(rows["result_state"] == "Commit", CONSUME_SUCCESS, RECONSUME_LATER),
    }).reset_index(drop=True)  # fmt: skip
    first = staged[staged["ready_reason"] == READY_PUBLISHED]
    dead = staged[staged["result_state"] == "DLQ"]
    return BrokerRun(
        messages=pd.DataFrame({"msg_id": first["msg_id"], "born_ms": first["born_ms"]}),
        deliveries=deliveries,
        dead_letters=pd.DataFrame({"msg_id": dead["msg_id"], "dlq_at_ms": dead["settled_ms"]}),
        puts={},
    )


def figure(figures, name: str):
    (found,) = [f for f in figures if f.figure == name]
    return found


def test_the_brokers_order_counts_only_where_a_backlog_fills_the_clients():
    """One batch of 32 of each of the instance's four other queues (its topic's four and
    %RETRY%: five), at 10 ms over four threads: 320 ms in saturated-4x, whose backlog holds
    thousands; nothing in the ladder or push-5x, whose pools keep up, nor for a simple
    consumer (a thread pops when it frees); a second in saturated-5x, whose cache fills."""
    spec, staged = simulated("saturated-4x")
    assert batch_order_ms(staged, spec.policy) == pytest.approx(32 * 4 * 10 / 4, rel=0.02)
    for quiet in ("ladder-4x", "push-5x", "saturated-simple-5x"):
        spec, staged = simulated(quiet)
        assert batch_order_ms(staged, spec.policy) == 0, quiet
    # a 5.x push client's full cache: one receive (a second), whatever the threads
    spec, staged = simulated("saturated-5x")
    assert batch_order_ms(staged, spec.policy) == 1_000


def test_a_retry_moved_by_the_batches_order_is_within_and_one_moved_further_is_not():
    spec, staged = simulated("saturated-4x")
    run = as_broker(staged)
    retry = run.deliveries.index[run.deliveries["delivery"] == 2][100]
    limit = figure(timed_figures(staged, run, spec.policy), "retry delay, worst difference (ms)")
    assert limit.tolerance == pytest.approx(100 + 50 + 320, rel=0.02) and limit.within
    run.deliveries.loc[retry, ["start_ms", "end_ms"]] += 0.9 * limit.tolerance
    assert figure(timed_figures(staged, run, spec.policy), limit.figure).within
    run.deliveries.loc[retry, ["start_ms", "end_ms"]] += 0.2 * limit.tolerance
    assert not figure(timed_figures(staged, run, spec.policy), limit.figure).within


def test_a_5x_instance_may_gain_or_lose_its_revived_retries_a_4x_one_nothing():
    """instances-5x: two instances popping the topic and the retry topic. An instance may
    differ by its retries the reviver wrote (the pops a pass of the reviver wakes race for
    them), up to a fifth of its deliveries; instances-4x's queues decide every delivery."""
    names = ("deliveries per instance, worst difference",
             "busy time per instance, worst difference (ms)")  # fmt: skip

    def moved(scenario: str, count: int) -> list:
        spec, staged = simulated(scenario)
        run = as_broker(staged)
        retries = run.deliveries.index[
            (run.deliveries["delivery"] > 1) & (run.deliveries["instance"] == 0)
        ]  # fmt: skip
        run.deliveries.loc[retries[:count], "instance"] = 1
        figures = timed_figures(staged, run, spec.policy)
        return [figure(figures, name) for name in names]

    assert all(f.within for f in moved("instances-5x", 0))
    assert all(f.within and f.broker == 300 * (f.figure == names[1]) + 3 * (f.figure == names[0])
               for f in moved("instances-5x", 3))  # fmt: skip
    assert not any(f.within for f in moved("instances-5x", 10))  # beyond a fifth
    assert all(f.within for f in moved("instances-4x", 0))
    assert not any(f.within for f in moved("instances-4x", 1))
