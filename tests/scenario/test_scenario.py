"""The scenario without Spark: value parsers, --set overrides, loading, defaults, freezing."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from support import PROJECT

from retrysim.scenario import limits
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import (
    DEFAULT_SCENARIO_PATH,
    apply_overrides,
    build_scenario,
    load_scenario,
    scenario_from_json,
    scenario_json,
)
from retrysim.scenario.spec import Outage, ProcessingTime, Scenario
from retrysim.scenario.units import format_duration, parse_delay_levels, parse_duration

ROCKETMQ_DEFAULT_TABLE_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip

MINIMAL: dict[str, Any] = {"groups": [{"name": "g", "flavor": "rocketmq4.concurrently"}]}


def minimal(**group: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL)
    data["groups"][0].update(group)
    return data


# --------------------------------------------------------------------------- parse_duration


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1500ms", 1_500),
        ("10s", 10_000),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        (0, 0),
        ("0s", 0),
        ("0ms", 0),
        ("1.5s", 1_500),
        ("0.5m", 30_000),
        (" 10s ", 10_000),
        ("10 s", 10_000),
    ],
)
def test_parse_duration(text, ms):
    assert parse_duration(text) == ms


MALFORMED_DURATIONS = [
    *("10x", "5 parsecs", "", "s", "10", "-5s", "1e3s", "10S", "1,5s", "ten seconds", "10s5"),
    *(10, 1.5, None, True, False, [], {}),
]


@pytest.mark.parametrize("bad", MALFORMED_DURATIONS)
def test_parse_duration_rejects_malformed(bad):
    with pytest.raises(ValueError, match=r"ms, s, m, h or d|expected a duration"):
        parse_duration(bad)


def test_parse_duration_message_names_value_and_units():
    with pytest.raises(ValueError) as info:
        parse_duration("10x")
    message = str(info.value)
    assert "'10x'" in message
    assert "ms, s, m, h or d" in message


# --------------------------------------------------------------------------- delay levels


def test_parse_delay_levels_rocketmq_default():
    levels = parse_delay_levels(limits.DEFAULT_MESSAGE_DELAY_LEVEL)
    assert len(levels) == 18
    assert levels[0] == 1_000
    assert levels[-1] == 7_200_000
    assert levels == ROCKETMQ_DEFAULT_TABLE_MS


def test_parse_delay_levels_custom():
    assert parse_delay_levels("1s 2s 3s 4s 5s") == (1_000, 2_000, 3_000, 4_000, 5_000)


def test_parse_delay_levels_day_unit_and_extra_spaces():
    assert parse_delay_levels("  1d   2m\t3h ") == (86_400_000, 120_000, 10_800_000)


@pytest.mark.parametrize(
    ("text", "token", "position"),
    [
        ("5q", "'5q'", "level 1"),
        ("1s 5q", "'5q'", "level 2"),
        ("1.5s", "'1.5s'", "level 1"),
        ("1s 2s 500ms", "'500ms'", "level 3"),
        ("1S", "'1S'", "level 1"),
        ("s", "'s'", "level 1"),
        ("1s -5s", "'-5s'", "level 2"),
    ],
)
def test_parse_delay_levels_names_bad_token(text, token, position):
    with pytest.raises(ValueError) as info:
        parse_delay_levels(text)
    message = str(info.value)
    assert token in message
    assert position in message
    assert "s, m, h, d" in message


@pytest.mark.parametrize("bad", ["", "   ", None, 5, ["1s"]])
def test_parse_delay_levels_rejects_empty_or_not_text(bad):
    with pytest.raises(ValueError, match="space-separated delays"):
        parse_delay_levels(bad)


def test_parse_delay_levels_bounded():
    assert len(parse_delay_levels(" ".join(["1s"] * limits.MAX_DELAY_LEVELS))) == 64
    with pytest.raises(ValueError, match=f"at most {limits.MAX_DELAY_LEVELS}"):
        parse_delay_levels(" ".join(["1s"] * (limits.MAX_DELAY_LEVELS + 1)))


# --------------------------------------------------------------------------- format_duration


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (1, "1ms"),
        (1_500, "1500ms"),
        (1_000, "1s"),
        (90_000, "90s"),
        (60_000, "1m"),
        (900_000, "15m"),
        (7_200_000, "2h"),
        (5_400_000, "90m"),
        (86_400_000, "1d"),
        (366 * 86_400_000, "366d"),
    ],
)
def test_format_duration(ms, text):
    assert format_duration(ms) == text


@given(st.integers(min_value=0, max_value=10**13))
def test_format_duration_round_trips(ms):
    assert parse_duration(format_duration(ms)) == ms


# --------------------------------------------------------------------------- --set overrides


def test_apply_overrides_dotted_path_and_created_parents():
    data = {"name": "x", "groups": []}
    result = apply_overrides(data, ["name=renamed", "broker.message_delay_level=1s 2s"])
    assert result is data
    assert data["name"] == "renamed"
    assert data["broker"] == {"message_delay_level": "1s 2s"}


def test_apply_overrides_list_by_index_and_by_group_name():
    data = {"groups": [{"name": "a", "behavior": {}}, {"name": "b", "behavior": {}}]}
    apply_overrides(
        data,
        ["groups.1.behavior.fail_probability=0.25", "groups.a.behavior.poison_fraction=0.5"],
    )
    assert data["groups"][0]["behavior"] == {"poison_fraction": 0.5}
    assert data["groups"][1]["behavior"] == {"fail_probability": 0.25}


def test_apply_overrides_numeric_group_name_index_wins_when_in_range():
    data = {"groups": [{"name": "1"}, {"name": "0"}]}
    apply_overrides(data, ["groups.0.topic=t0", "groups.1.topic=t1"])
    assert data["groups"] == [{"name": "1", "topic": "t0"}, {"name": "0", "topic": "t1"}]


def test_apply_overrides_replaces_whole_list_item():
    data = {"groups": [{"name": "a"}]}
    apply_overrides(data, ["groups.0={name: b, flavor: rocketmq4.concurrently}"])
    assert data["groups"] == [{"name": "b", "flavor": "rocketmq4.concurrently"}]


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("0.05", 0.05),
        ("42", 42),
        ("-1", -1),
        ("true", True),
        ("false", False),
        ("10s", "10s"),
        ("rocketmq4.concurrently", "rocketmq4.concurrently"),
        ("[1, 2]", [1, 2]),
        ("{a: 1}", {"a": 1}),
        ("'007'", "007"),
        ("", ""),
        ("  ", ""),
        ("a=b", "a=b"),
        ("[1", "[1"),  # not valid YAML: kept as the raw text, validation reports it later
    ],
)
def test_apply_overrides_values_are_yaml_typed(raw, value):
    data: dict[str, Any] = {}
    apply_overrides(data, [f"key={raw}"])
    assert data["key"] == value
    assert type(data["key"]) is type(value)


@pytest.mark.parametrize("raw", ["null", "~", "Null"])
def test_apply_overrides_null_removes_the_key_so_it_takes_its_default(raw):
    data: dict[str, Any] = {"horizon": "1h", "groups": [{"name": "g", "topic": "t"}]}
    apply_overrides(data, [f"horizon={raw}", f"groups.g.topic={raw}"])
    assert data == {"groups": [{"name": "g"}]}


def test_apply_overrides_strips_key_whitespace():
    data: dict[str, Any] = {}
    apply_overrides(data, [" seed =7"])
    assert data == {"seed": 7}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("foo", "expected key=value, got 'foo'"),
        ("=5", "expected key=value, got '=5'"),
        ("  =5", "expected key=value"),
        ("groups.nosuch.flavor=x", "no list item 'nosuch'; use an index 0..1 or ['a', 'b']"),
        ("groups.7.flavor=x", "no list item '7'"),
        ("groups.-1.flavor=x", "no list item '-1'"),
        ("name.first=x", "'first' is inside a value, not a mapping"),
    ],
)
def test_apply_overrides_bad_strings_name_set(override, expected):
    data = {"name": "n", "groups": [{"name": "a"}, {"name": "b"}]}
    with pytest.raises(ScenarioError) as info:
        apply_overrides(data, [override])
    assert info.value.field == "--set"
    assert str(info.value).startswith("--set: ")
    assert expected in str(info.value)


# --------------------------------------------------------------------------- loading


def test_load_default_scenario_file():
    scenario = load_scenario(DEFAULT_SCENARIO_PATH)
    assert scenario == load_scenario()
    assert scenario.name == "default"
    assert scenario.seed == 42
    assert scenario.horizon == 6 * 3_600_000
    assert scenario.load_bucket == 60_000
    assert scenario.broker.message_delay_level == ROCKETMQ_DEFAULT_TABLE_MS

    (group,) = scenario.groups
    assert group.name == "order-service"
    assert group.topic == "orders"
    assert group.source_topic == "orders"
    assert group.flavor == "rocketmq4.concurrently"
    assert group.max_reconsume_times == -1
    assert group.consume_timeout == 900_000
    assert group.dlq_enabled is True
    assert (group.consumers.instances, group.consumers.threads) == (4, 20)

    workload = group.workload
    assert workload.messages == 100_000
    assert workload.over == 3_600_000
    assert workload.arrival == "uniform"
    assert workload.queues == 8
    assert workload.size_bytes == 1_024

    behavior = group.behavior
    assert behavior.fail_probability == 0.05
    assert behavior.poison_fraction == 0.001
    assert behavior.fail_first == 0
    assert behavior.send_back_failure_probability == 0.0
    assert behavior.processing_time == ProcessingTime(dist="lognormal", mean="50ms", p99="400ms")
    mix = behavior.outcome_mix
    assert (mix.reconsume_later, mix.exception, mix.null_return) == (0.8, 0.15, 0.05)
    assert behavior.outages == (Outage(start="10m", end="25m", fail_probability=1.0),)


def test_load_scenario_applies_overrides():
    scenario = load_scenario(
        None,
        [
            "groups.order-service.behavior.fail_probability=0.2",
            "groups.0.workload.messages=10",
            "horizon=90m",
        ],
    )
    assert scenario.groups[0].behavior.fail_probability == 0.2
    assert scenario.groups[0].workload.messages == 10
    assert scenario.horizon == 5_400_000


def test_load_scenario_from_custom_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: custom\nbroker: {message_delay_level: '1s 2s 3s 4s 5s'}\n"
        "groups: [{name: a, flavor: rocketmq4.concurrently}]\n",
        encoding="utf-8",
    )
    scenario = load_scenario(path)
    assert scenario.name == "custom"
    assert scenario.broker.message_delay_level == (1_000, 2_000, 3_000, 4_000, 5_000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("groups: [\n  {name: a\n", "is not valid YAML at line"),
        ("- a\n- b\n", "holds a list of 2 items, not a mapping of keys"),
        ("", "is empty; a scenario is a mapping of keys"),
        ("just text\n", "holds a single value ('just text'), not a mapping of keys"),
    ],
)
def test_load_scenario_bad_files(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert info.value.field == "--scenario"
    assert expected in str(info.value)


def test_load_scenario_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match=r"cannot read .*No such file") as info:
        load_scenario(tmp_path / "absent.yaml")
    assert info.value.field == "--scenario"


# --------------------------------------------------------------------------- defaults


def test_group_defaults():
    scenario = build_scenario(MINIMAL)
    assert scenario.name == "scenario"
    assert scenario.seed == 42
    assert scenario.horizon == 6 * 3_600_000
    assert scenario.broker.message_delay_level == ROCKETMQ_DEFAULT_TABLE_MS

    (group,) = scenario.groups
    assert group.max_reconsume_times == -1
    assert group.consume_timeout is None  # the flavor's default (15 min for 4.x)
    assert group.consumers.pool_size == limits.DEFAULT_CONSUMER_THREADS
    assert group.delay_level_when_next_consume == 0
    assert group.dlq_enabled is True
    assert group.topic is None
    assert group.source_topic == "g"
    assert group.consume_message_batch_max_size == 1
    assert group.behavior.fail_probability == 0.0
    assert group.behavior.poison_fraction == 0.0
    assert group.behavior.outages == ()
    assert group.behavior.processing_time == ProcessingTime(
        dist="constant", mean=f"{limits.DEFAULT_PROCESSING_MS}ms"
    )
    assert group.workload.arrival == "uniform"


def test_bare_duration_is_constant_processing_time():
    scenario = build_scenario(minimal(behavior={"processing_time": "250ms"}))
    assert scenario.groups[0].behavior.processing_time == ProcessingTime(
        dist="constant", mean="250ms"
    )


def test_bare_numbers_other_than_zero_are_not_durations():
    with pytest.raises(ScenarioError, match="malformed duration 50"):
        build_scenario(minimal(consume_timeout=50))


def test_durations_in_models_are_milliseconds():
    scenario = build_scenario(minimal(consume_timeout="1.5s", workload={"over": "2h"}))
    assert scenario.groups[0].consume_timeout == 1_500
    assert scenario.groups[0].workload.over == 7_200_000


# --------------------------------------------------------------------------- frozen models


def test_models_are_frozen():
    scenario = build_scenario(MINIMAL)
    with pytest.raises(ValidationError, match="frozen"):
        scenario.seed = 1
    with pytest.raises(ValidationError, match="frozen"):
        scenario.groups[0].name = "other"
    with pytest.raises(ValidationError, match="frozen"):
        scenario.groups[0].behavior.fail_probability = 1.0
    with pytest.raises(TypeError):
        scenario.groups[0] = scenario.groups[0]  # type: ignore[index]
    assert isinstance(scenario.groups, tuple)
    assert isinstance(scenario.broker.message_delay_level, tuple)


def test_equal_scenarios_hash_equal():
    assert hash(build_scenario(MINIMAL)) == hash(build_scenario(copy.deepcopy(MINIMAL)))


def test_unknown_keys_are_rejected_with_suggestion():
    with pytest.raises(ScenarioError) as info:
        build_scenario({**MINIMAL, "seeds": 1})
    assert info.value.field == "seeds"
    assert "did you mean 'seed'?" in str(info.value)
    assert "Allowed keys: broker, groups, horizon, load_bucket, name, seed" in str(info.value)


def test_scenario_error_is_a_value_error():
    assert issubclass(ScenarioError, ValueError)
    error = ScenarioError("horizon", "must be positive")
    assert str(error) == "horizon: must be positive"
    assert error.field == "horizon"
    assert str(ScenarioError("", "plain")) == "plain"


# --------------------------------------------------------------------------- lognormal


@pytest.mark.parametrize(
    ("mean", "p99"),
    [("50ms", "400ms"), ("1ms", "2ms"), ("100ms", "1497ms"), ("1s", "14s"), ("10ms", "149ms")],
)
def test_lognormal_accepts_feasible_mean_and_p99(mean, p99):
    model = ProcessingTime(dist="lognormal", mean=mean, p99=p99)
    assert 0 < model.mean < model.p99 <= limits.LOGNORMAL_MAX_P99_RATIO * model.mean


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"dist": "lognormal", "mean": "50ms"}, "lognormal needs p99 as well as mean"),
        ({"dist": "lognormal", "mean": "400ms", "p99": "50ms"}, "0 < mean < p99 <= 14.97 x mean"),
        ({"dist": "lognormal", "mean": "50ms", "p99": "50ms"}, "0 < mean < p99"),
        ({"dist": "lognormal", "mean": 0, "p99": "50ms"}, "0 < mean < p99"),
        ({"dist": "lognormal", "mean": "100ms", "p99": "1498ms"}, "p99 <= 14.97 x mean"),
        (
            {"dist": "constant", "mean": "50ms", "p99": "400ms"},
            "p99 applies only to dist: lognormal",
        ),
        ({"dist": "exponential", "mean": "50ms", "p99": "400ms"}, "not exponential"),
    ],
)
def test_lognormal_validation(fields, expected):
    with pytest.raises(ValidationError, match=re.escape(expected)):
        ProcessingTime(**fields)


def test_lognormal_error_through_scenario_names_field():
    data = minimal(behavior={"processing_time": {"dist": "lognormal", "mean": "1s", "p99": "1ms"}})
    with pytest.raises(ScenarioError) as info:
        build_scenario(data)
    assert info.value.field == "groups[0].behavior.processing_time"
    assert "got mean 1000 ms, p99 1 ms" in str(info.value)


# --------------------------------------------------------------------------- friendly errors


@pytest.mark.parametrize(
    ("data", "field", "expected"),
    [
        (minimal(workload={"messages": 0}), "groups[0].workload.messages", "10,000,000,000"),
        ({"seed": -1, **MINIMAL}, "seed", "between 0 and 9,223,372,036,854,775,807"),
        (
            {"groups": [MINIMAL["groups"][0], MINIMAL["groups"][0]]},
            "groups",
            "duplicate group names ['g']",
        ),
        ({"groups": [{"name": "g"}]}, "groups[0].flavor", "is required; allowed: rocketmq4."),
        ({"name": "x"}, "groups", "is required: a list of consumer groups"),
        ({"groups": []}, "groups", "must list at least one item"),
        (minimal(behavior={"fail_probability": 1.5}), "groups[0].behavior.fail_probability", "1"),
        (
            minimal(behavior={"outages": [{"start": "5m", "end": "1m"}]}),
            "groups[0].behavior.outages[0]",
            "must be after start",
        ),
        ({**MINIMAL, "horizon": "2d", "load_bucket": "100ms"}, "scenario", "buckets; at most"),
    ],
)
def test_friendly_errors_name_field_and_allowed(data, field, expected):
    with pytest.raises(ScenarioError) as info:
        build_scenario(data)
    assert info.value.field == field
    assert expected in str(info.value)


def test_build_scenario_returns_scenario():
    assert isinstance(build_scenario(MINIMAL), Scenario)


@pytest.mark.parametrize("path", sorted((PROJECT / "conf").rglob("*.yaml")), ids=lambda p: p.stem)
def test_stored_scenario_loads_back_exactly(path):
    """runs.config_json (every default resolved, times in ms) gives back the same Scenario,
    which is how a lean run's messages are regenerated."""
    scenario = load_scenario(path)
    stored = scenario_json(scenario)
    assert json.loads(stored)["horizon"] == scenario.horizon
    assert scenario_from_json(stored) == scenario


@pytest.mark.parametrize(("given", "kept"), [(4.9, "4.9"), ("4.9", "4.9"), (5.1, "5.1")])
def test_client_version_takes_the_number_yaml_reads(given, kept):
    """``client_version: 4.9`` unquoted is a YAML number: it names the 4.9 client."""
    scenario = build_scenario(minimal(client_version=given))
    assert scenario.groups[0].client_version == kept


def test_client_version_names_the_field_and_the_values():
    with pytest.raises(ScenarioError) as info:
        build_scenario(minimal(client_version="5.0"))
    assert info.value.field == "groups[0].client_version"
    assert "must be one of '4.9' or '5.1'" in str(info.value)
