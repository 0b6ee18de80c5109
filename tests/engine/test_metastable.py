"""conf/metastable-storm.yaml does what its comment says (docs/planning.md, "A storm that
outlives its outage"): after a 3-minute outage the retries drive each instance's calls
beyond its downstream's capacity, calls time out, every failure is one more retry, and the
group stays degraded to the end of the run; more instances, or fewer threads, recover.

The compiled event loop runs the whole scenario (192,000 messages, 586,019 deliveries)
without Spark in a few seconds; the loop's rows are those the run's tables hold
(test_engine_vs_reference holds the downstream's tables to the reference)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support import PROJECT, staged_frame

from retrysim import load_scenario
from retrysim.engine.event_key import simulate_key
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.engine.sizing import estimate
from retrysim.model.workload import messages_np

STORM = PROJECT / "conf" / "metastable-storm.yaml"
MINUTE = 60_000


def failing_share_per_minute(*overrides: str) -> pd.Series:
    scenario = load_scenario(STORM, list(overrides))
    (group,) = scenario.groups
    spec = key_specs(scenario, group_plans(scenario))[0]
    rows = staged_frame(simulate_key(spec, *messages_np(group.workload, group.name, scenario.seed)))
    started = rows[rows["start_ms"].notna()]
    minute = (started["start_ms"] // MINUTE).astype(np.int64)
    return (started["outcome"] != "CONSUME_SUCCESS").groupby(minute).mean()


@pytest.fixture(scope="module")
def as_given() -> pd.Series:
    return failing_share_per_minute()


def test_the_storm_outlives_its_outage(as_given):
    outage = load_scenario(STORM).groups[0].behavior.outages[0]
    assert (as_given[: outage.start // MINUTE] < 0.01).all()  # healthy before
    assert (as_given[outage.start // MINUTE : outage.end // MINUTE] == 1.0).all()
    after = as_given[outage.end // MINUTE + 1 :]
    assert len(after) > 25 and (after > 0.5).all()  # the API is back; the calls are not


@pytest.mark.parametrize(
    "remedy",
    ["groups.0.consumers.instances=8", "groups.0.consumers.threads=4"],
    ids=["more instances", "fewer threads"],
)
def test_a_pool_that_recovers(remedy):
    share = failing_share_per_minute(remedy)
    assert (share[5:8] == 1.0).all()  # the same outage
    assert (share[12:] < 0.01).all()  # recovered within 4 minutes of its end


def test_the_size_guard_counts_a_storm_that_may_not_end():
    """A downstream whose calls fail under load may keep every message failing: the guard
    counts every delivery that fits, above what the storm made (586,019 deliveries) and
    above its estimate for the same scenario without the downstream."""
    (storm,) = estimate(load_scenario(STORM))
    assert storm.sequential and storm.deliveries >= 586_058
    calm = load_scenario(STORM)
    group = calm.groups[0]
    without = group.model_copy(
        update={"behavior": group.behavior.model_copy(update={"downstream": None})}
    )
    (plain,) = estimate(calm.model_copy(update={"groups": (without,)}))
    assert plain.deliveries < storm.deliveries
