"""Sweep grids for capacity plans: ``--sweep key=v1,v2,...`` axes and their cartesian points.

A sweep key is a scenario key as ``--set`` takes it (``horizon``,
``groups.order-service.consumers.instances``, ``groups.0.behavior.fail_probability``).
With exactly one group, a group key may leave the group out (``consumers.instances``), the
shorthand of issue 5. Keys are stored in a canonical form that names the group
(``groups.<name>.<key>``), so a plan's settings read the same whichever spelling was used.

Every point is validated here, before Spark starts: each axis value on its own first, so
an error names the one ``--sweep`` key and value at fault, then every combination.
"""

from __future__ import annotations

import copy
import difflib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import apply_overrides, build_scenario, parse_yaml
from retrysim.scenario.spec import Group, Scenario

MAX_POINTS = 100
SCENARIO_KEYS = frozenset(Scenario.model_fields)
# Keys of a group that are not also top-level keys (``name`` is both; top level wins).
GROUP_KEYS = frozenset(Group.model_fields) - SCENARIO_KEYS
POOL_KEY = "consumers"

__all__ = [
    "MAX_POINTS",
    "PlanPoint",
    "SweepAxis",
    "grid",
    "parse_sweep",
    "plan_points",
    "point_scenario",
]


@dataclass(frozen=True)
class SweepAxis:
    """One ``--sweep``: a canonical key, the group it belongs to (if any), its raw values."""

    key: str
    given: str
    group: str | None
    values: tuple[str, ...]

    @property
    def field(self) -> str:
        """The key inside its group (``consumers.instances``), or the whole key."""
        return self.key.split(".", 2)[2] if self.group is not None else self.key

    def touches_pool(self, group: str) -> bool:
        """Whether this axis sets ``group``'s consumer pool."""
        return self.group == group and self.field.split(".")[0] == POOL_KEY


@dataclass(frozen=True)
class PlanPoint:
    """A point of the grid: its number (1-based), settings (key -> raw value), scenario."""

    number: int
    settings: dict[str, str]
    scenario: Scenario

    def setting_values(self) -> dict[str, Any]:
        """The settings with YAML-parsed values (``0.05`` -> 0.05), for tables and JSON."""
        return {key: _parse_value(raw) for key, raw in self.settings.items()}


def _parse_value(raw: str) -> Any:
    try:
        return parse_yaml(raw)
    except yaml.YAMLError:
        return raw


def _group_names(data: Mapping[str, Any]) -> list[str]:
    groups = data.get("groups")
    if not isinstance(groups, list):
        return []
    return [str(item.get("name")) for item in groups if isinstance(item, dict)]


def _resolve_group(
    token: str, names: list[str], given: str, flag: str = "--sweep"
) -> tuple[str, str]:
    """(group name, canonical token) of ``groups.<token>``: an index or a name."""
    if token.isdigit() and int(token) < len(names):
        name = names[int(token)]
    elif token in names:
        name = token
    else:
        raise ScenarioError(
            flag,
            f"{given}: no group {token!r}; use an index 0..{len(names) - 1} or one of {names}",
        )
    # A group whose name is all digits keeps the index spelling (``--set`` reads digits as one).
    return name, (str(names.index(name)) if name.isdigit() else name)


def canonical_key(
    key: str, data: Mapping[str, Any], flag: str = "--sweep"
) -> tuple[str, str | None]:
    """The canonical spelling of a scenario key and the group it belongs to (None: top level).

    >>> canonical_key("consumers.instances", {"groups": [{"name": "g"}]})
    ('groups.g.consumers.instances', 'g')
    """
    parts = key.split(".")
    if not key or any(not part for part in parts):
        raise ScenarioError(flag, f"{key!r} is not a scenario key such as consumers.instances")
    names = _group_names(data)
    head = parts[0]
    if head == "groups":
        if len(parts) < 3:
            raise ScenarioError(flag, f"{key}: name a key inside the group, e.g. {key}.consumers")
        name, token = _resolve_group(parts[1], names, key, flag)
        return ".".join(["groups", token, *parts[2:]]), name
    if head in GROUP_KEYS:
        if len(names) != 1:
            raise ScenarioError(
                flag,
                f"{key}: the scenario has {len(names)} groups {names}; name the group, "
                f"e.g. groups.{names[0] if names else '<name>'}.{key}",
            )
        return f"groups.{names[0]}.{key}", names[0]
    if head not in SCENARIO_KEYS:
        allowed = sorted(SCENARIO_KEYS | GROUP_KEYS)
        near = difflib.get_close_matches(head, allowed, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ScenarioError(
            flag,
            f"{key}: unknown key {head!r}; {hint}allowed: a scenario key "
            f"({', '.join(sorted(SCENARIO_KEYS))}), groups.<name or index>.<group key>, or a "
            f"group key alone when there is one group ({', '.join(sorted(GROUP_KEYS))})",
        )
    return key, None


def parse_sweep(text: str, data: Mapping[str, Any]) -> SweepAxis:
    """``key=v1,v2,...`` -> a SweepAxis (values are kept as written, YAML-parsed later)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise ScenarioError("--sweep", f"expected key=v1,v2,..., got {text!r}")
    values = tuple(value.strip() for value in raw.split(","))
    if any(not value for value in values):
        raise ScenarioError("--sweep", f"{key}: empty value in {raw!r}")
    seen = [value for value in values if values.count(value) > 1]
    if seen:
        raise ScenarioError("--sweep", f"{key}: value {seen[0]!r} is listed twice")
    canonical, group = canonical_key(key, data)
    return SweepAxis(key=canonical, given=key, group=group, values=values)


def grid(axes: Sequence[SweepAxis]) -> list[dict[str, str]]:
    """The cartesian product of the axes, first axis slowest: one settings dict per point."""
    keys = [axis.key for axis in axes]
    if len(set(keys)) != len(keys):
        duplicate = next(key for key in keys if keys.count(key) > 1)
        raise ScenarioError("--sweep", f"{duplicate} is swept twice; give its values once")
    size = 1
    for axis in axes:
        size *= len(axis.values)
    if size > MAX_POINTS:
        raise ScenarioError(
            "--sweep", f"the grid has {size:,} points; at most {MAX_POINTS} are allowed"
        )
    return [
        dict(zip(keys, combo, strict=True))
        for combo in itertools.product(*[axis.values for axis in axes])
    ]


def point_scenario(data: Mapping[str, Any], settings: Mapping[str, str]) -> Scenario:
    """The scenario of ``data`` with ``settings`` (key -> raw value) applied, validated."""
    return build_scenario(
        apply_overrides(copy.deepcopy(dict(data)), [f"{k}={v}" for k, v in settings.items()])
    )


def plan_points(data: Mapping[str, Any], axes: Sequence[SweepAxis]) -> list[PlanPoint]:
    """Validate and build every point's scenario from ``data`` (overrides already applied).

    Each axis value is checked alone first, so a bad value is reported by its own key;
    then each combination (a value can be fine alone and wrong with another).
    """
    for axis in axes:
        for value in axis.values:
            try:
                point_scenario(data, {axis.key: value})
            except ScenarioError as error:
                raise ScenarioError(f"--sweep {axis.given}", f"value {value!r}: {error}") from None
    points = []
    for number, settings in enumerate(grid(axes), start=1):
        try:
            points.append(PlanPoint(number, settings, point_scenario(data, settings)))
        except ScenarioError as error:
            shown = ", ".join(f"{key}={value}" for key, value in settings.items())
            raise ScenarioError("--sweep", f"point {number} ({shown}): {error}") from None
    return points
