"""The flavor catalogue: every record is consistent, and a new flavor is one record.

Pure Python: the scenario models and the plain-Python policy twin, no Spark.
"""

from __future__ import annotations

import pytest
from compiled_rules import step_of
from support import DEFAULT_TABLE_MS, group, scenario

from retrysim.model import flavors
from retrysim.model.behavior import RECONSUME_LATER, SEND_BACK_DONE
from retrysim.model.flavors import Flavor, policy_fields
from retrysim.model.policy import policy_for
from retrysim.model.states import DLQ, VISIBLE, WAITING_RETRY
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import build_scenario


def test_every_flavor_reads_only_keys_the_catalogue_names():
    for record in flavors.CATALOGUE:
        assert record.reads_any <= set(flavors.FLAVOR_KEYS), record.name
    read = set().union(*(record.reads_any for record in flavors.CATALOGUE))
    assert read == set(flavors.FLAVOR_KEYS), "a flavor key that no flavor reads"


def test_names_are_unique_and_listed_in_catalogue_order():
    assert tuple(record.name for record in flavors.CATALOGUE) == flavors.NAMES
    assert len(set(flavors.NAMES)) == len(flavors.NAMES)


@pytest.mark.parametrize("name", flavors.NAMES)
def test_every_flavor_builds_a_policy_from_its_defaults(name):
    built = scenario(group("g", flavor=name))
    policy = policy_for(built.groups[0], DEFAULT_TABLE_MS)
    record = flavors.get(name)
    assert policy.flavor == name
    assert policy.blocking == record.blocking
    assert policy.max_retries >= 0 and policy.intervals_ms
    # a flavor that puts messages in the schedule topic has the levels they wait at: its
    # retries' (concurrently), its late dead letters' (orderly) or its timeouts' (broadcast)
    schedule_levels = (policy.levels, policy.resend_levels, policy.timeout_level)
    assert any(levels is not None for levels in schedule_levels) == record.uses_delay_table


def test_the_ordered_variant_is_what_an_ordered_push_group_takes():
    ordered = scenario(group("g", flavor="rocketmq5.push", ordered=True)).groups[0]
    unordered = scenario(group("g", flavor="rocketmq5.push")).groups[0]
    assert ordered.blocking and not unordered.blocking
    assert (
        policy_for(ordered, DEFAULT_TABLE_MS).retry_path
        != policy_for(unordered, DEFAULT_TABLE_MS).retry_path
    )


def _acme(group, _table):
    return policy_fields(retry_path=VISIBLE, max_retries=2, intervals_ms=(7_000,), timeout_ms=None)


ACME = Flavor("acme.fixed", _acme, reads=frozenset({"pull_interval"}), has_dlq=True)


def test_a_new_flavor_is_one_record(monkeypatch):
    """Adding a record to the catalogue is all a flavor needs: its name validates, the keys
    it reads are accepted and others refused with its name, and its rules drive the policy."""
    monkeypatch.setattr(flavors, "CATALOGUE", (*flavors.CATALOGUE, ACME))
    built = scenario(group("g", flavor="acme.fixed", pull_interval="1s"))
    policy = policy_for(built.groups[0], DEFAULT_TABLE_MS)
    failed = step_of(policy, 0, 0, RECONSUME_LATER, 0, 10, SEND_BACK_DONE, "t", 0, 0, 1)
    assert (failed.result_state, failed.next_ready_ms) == (WAITING_RETRY, 7_010)
    assert (
        step_of(policy, 2, 2, RECONSUME_LATER, 0, 10, SEND_BACK_DONE, "t", 0, 0, 1).result_state
        == DLQ
    )
    with pytest.raises(ScenarioError, match=r"applies only to .*, not to acme\.fixed"):
        build_scenario({"groups": [{"name": "g", "flavor": "acme.fixed", "ack_index": 0}]})
    assert "acme.fixed" in flavors.readers("pull_interval")


def test_an_unknown_flavor_names_the_closest_one():
    with pytest.raises(ScenarioError, match=r"did you mean 'rocketmq5\.simple'"):
        build_scenario({"groups": [{"name": "g", "flavor": "rocketmq5.simpel"}]})
