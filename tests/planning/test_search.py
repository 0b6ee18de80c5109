"""``--search``: bisection for the smallest pool that meets the targets. The probes are
checked against a brute-force scan, the bad input against the one-line contract, and a
search end to end against the probes' own summary tables: the recommended value meets the
targets, the value below it was probed and misses them."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from support import PROJECT, SMALL_FLASH_SALE

from retrysim.planning.plan import format_plan, prepare_plan, run_plan
from retrysim.planning.search import parse_search, probes_at_most, smallest_meeting
from retrysim.scenario.errors import ScenarioError
from retrysim.store.sinks import read_table

ONE = {"groups": [{"name": "g", "flavor": "rocketmq4.concurrently"}]}


@pytest.mark.parametrize(("low", "high"), [(1, 64), (1, 2), (3, 17), (5, 6)])
def test_bisection_finds_what_a_scan_finds_within_its_probe_budget(low, high):
    axis = parse_search(f"consumers.instances={low}..{high}", ONE)
    for threshold in range(low - 1, high + 2):
        probed: list[int] = []

        def meets(value: int, threshold: int = threshold, probed: list = probed) -> bool:
            probed.append(value)
            return value >= threshold

        scan = next((v for v in range(low, high + 1) if v >= threshold), None)
        assert smallest_meeting(meets, low, high) == scan
        assert len(probed) <= probes_at_most(axis) and len(set(probed)) == len(probed)
        if scan is not None and scan > low:
            assert scan - 1 in probed  # the binding targets come from the value just below


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("consumers.instances", "expected key=LO..HI"),
        ("consumers.instances=8..2", "range 8..2: need 1 <= LO < HI"),
        ("consumers.instances=0..4", "range 0..4: need 1 <= LO < HI"),
        ("consumers.instances=1-4", "value '1-4': expected LO..HI"),
        ("workload.queues=1..8", "only a group's consumers.instances or consumers.threads"),
        ("horizon=1..8", "only a group's consumers.instances or consumers.threads"),
    ],
)
def test_bad_searches_name_the_flag(text, expect):
    with pytest.raises(ScenarioError, match=r"^--search") as raised:
        parse_search(text, ONE)
    assert expect in str(raised.value)


def test_a_search_needs_targets_and_its_own_pool_and_valid_ends():
    scenario = PROJECT / "conf" / "flash-sale.yaml"
    target = ["p99_time_to_commit=2s"]
    with pytest.raises(ScenarioError, match="give a --target that group checkout must meet"):
        prepare_plan(scenario, search="consumers.instances=1..8")
    with pytest.raises(ScenarioError, match="give a --target that group ledger-default must"):
        prepare_plan(PROJECT / "conf" / "orderly-blocking.yaml",
                     targets=["ledger-bounded.p99_time_to_commit=1m"],
                     search="groups.ledger-default.consumers.threads=1..8")  # fmt: skip
    with pytest.raises(ScenarioError, match="pool is unlimited; set consumers"):
        prepare_plan(scenario, ["groups.0.consumers=unlimited"], targets=target,
                     search="consumers.instances=1..8")  # fmt: skip
    with pytest.raises(
        ScenarioError, match=r"^--search: groups.nope.consumers.instances: no group"
    ):
        prepare_plan(scenario, targets=target, search="groups.nope.consumers.instances=1..8")
    with pytest.raises(ScenarioError, match="sets the same group's pool"):
        prepare_plan(scenario, sweeps=["consumers.threads=2,4"], targets=target,
                     search="consumers.instances=1..8")  # fmt: skip
    with pytest.raises(ScenarioError, match=r"^--search consumers.instances: value 100001"):
        prepare_plan(scenario, targets=target, search="consumers.instances=1..100001")
    spec = prepare_plan(scenario, sweeps=["behavior.fail_probability=0,0.1"], targets=target,
                        search="consumers.instances=1..64")  # fmt: skip
    assert spec.most_points == 2 * 8  # two cases, 2 + log2(63) probes each


def test_a_search_refuses_a_downstream_that_more_consumers_can_overload():
    """conf/metastable-storm.yaml's 4 threads meet targets its 20 miss (planning.md, "A
    storm that outlives its outage"): a bisection over threads would miss them, and so
    would one over instances calling one shared downstream; more instances of each one's
    own downstream spread the load, and are searched."""
    storm = PROJECT / "conf" / "metastable-storm.yaml"
    target = ["pending=1000"]
    with pytest.raises(
        ScenarioError, match=r"^--search: consumers.threads: group payments has a downstream"
    ):
        prepare_plan(storm, targets=target, search="consumers.threads=2..20")
    with pytest.raises(ScenarioError, match="sweep a grid instead"):
        prepare_plan(storm, ["groups.0.behavior.downstream.per=group"], targets=target,
                     search="consumers.instances=2..16")  # fmt: skip
    assert prepare_plan(storm, targets=target, search="consumers.instances=2..16").search


# The small flash sale (support.SMALL_FLASH_SALE): one instance misses both targets, two the
# backlog, four meet both: the answer lies between.
SMALL = SMALL_FLASH_SALE
TARGETS = ("p99_time_to_commit=2s", "max_ready_backlog=100")


def test_a_search_recommends_the_smallest_probe_that_meets_and_probes_the_one_below(
    spark, tmp_path
):
    spec = prepare_plan(PROJECT / "conf" / "flash-sale.yaml", SMALL, (), TARGETS,
                        search="consumers.instances=1..16")  # fmt: skip
    lines: list[str] = []
    result = run_plan(spark, spec, str(tmp_path / "out"), "s", lines.append, validate=False)
    rows = {r["point"]: r.asDict() for r in result.table.collect()}
    summary = {
        r["run_id"]: r.asDict()
        for r in read_table(spark, result.output, "summary").where(F.col("run_id") != "").collect()
    }
    meets = {}
    for point, row in rows.items():
        truth = summary[row["point_run_id"]]
        meets[row["instances"]] = (
            truth["p99_time_to_commit_ms"] <= 2_000 and truth["max_ready_backlog"] <= 100
        )
        assert row["meets_targets"] == meets[row["instances"]], point
    assert len(rows) <= probes_at_most(spec.search) and 16 in meets and 1 in meets
    (best,) = [row["instances"] for row in rows.values() if row["recommended"]]
    assert meets[best] and not meets[best - 1]
    assert all(not ok for value, ok in meets.items() if value < best)
    assert best not in (1, 2, 4, 8, 16)  # between the points a doubling grid would sweep
    text = format_plan(result)
    assert f"({best} instances x 4 threads" in text and "search: bisection" in text
    assert any(line.startswith("search consumers.instances for group checkout") for line in lines)
