"""A scenario on a real RocketMQ 4.9.7 namesrv and broker (jvm/broker4) against retrysim's
event loop on the same messages and the same listener: every exact figure of
docs/conformance.md must agree. Marked ``broker``: it starts a broker JVM."""

from __future__ import annotations

import pytest
from support import staged_frame

from retrysim.conformance.figures import exact_figures
from retrysim.conformance.harness import UnsupportedScenario, group_spec, run_on_broker
from retrysim.engine.event_key import simulate_key
from retrysim.model.workload import messages_np
from retrysim.scenario.loading import build_scenario

# 40 orders over 10 s on two queues, one instance of four threads; a compressed delay table
# (level n waits n seconds) keeps the ladder to seconds; three deliveries, then the DLQ.
LADDER = {
    "name": "ladder-4x", "seed": 5, "horizon": "30s",
    "broker": {"message_delay_level": " ".join(f"{level}s" for level in range(1, 19))},
    "groups": [{
        "name": "payments", "topic": "orders", "flavor": "rocketmq4.concurrently",
        "max_reconsume_times": 2, "consumers": {"instances": 1, "threads": 4},
        "workload": {"messages": 40, "over": "10s", "queues": 2},
        "behavior": {"fail_probability": 0.3, "poison_fraction": 0.1, "processing_time": "20ms"},
    }],
}  # fmt: skip


@pytest.mark.broker
def test_the_ladder_on_a_real_broker_gives_retrysims_exact_figures(tmp_path):
    scenario = build_scenario(LADDER)
    run = run_on_broker(scenario, "payments", tmp_path)
    _, spec = group_spec(scenario, "payments")
    staged = staged_frame(simulate_key(spec, *messages_np(spec.workload, spec.group, spec.seed)))
    figures = {figure.figure: figure for figure in exact_figures(staged, run)}
    assert [name for name, figure in figures.items() if not figure.within] == []
    assert figures["puts to %DLQ%payments"].broker > 0  # poison reached the DLQ
    assert figures["puts to SCHEDULE_TOPIC_XXXX"].broker > figures["puts to %DLQ%payments"].broker
    assert figures["messages"].broker == 40


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"flavor": "rocketmq5.push", "max_reconsume_times": 2}, "flavor rocketmq5.push"),
        ({"consumers": "unlimited"}, "consumers: unlimited"),
        ({"behavior": {"send_back_failure_probability": 0.1}}, "send-back failures"),
    ],
)
def test_what_the_harness_cannot_run_is_refused_in_one_line(change, named):
    group = {**LADDER["groups"][0], **change}
    scenario = build_scenario({**LADDER, "groups": [group]})
    with pytest.raises(UnsupportedScenario, match=named) as refused:
        run_on_broker(scenario, "payments", None)
    assert "\n" not in str(refused.value)
