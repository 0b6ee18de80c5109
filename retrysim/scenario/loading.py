"""Loading a scenario: a YAML file plus ``--set`` overrides, into one frozen Scenario.

Every failure becomes a :class:`ScenarioError` with the dotted field, the offending value
and what is allowed, because the user's next step is to fix one line of YAML.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from retrysim.model import flavors
from retrysim.scenario.errors import FieldRuleError, ScenarioError
from retrysim.scenario.spec import RETRY_POLICY_MODELS, Scenario
from retrysim.scenario.units import STORED

DEFAULT_SCENARIO_PATH = Path(__file__).resolve().parents[2] / "conf" / "default.yaml"


class _Loader(yaml.SafeLoader):
    """YAML without its timestamp type: a date stays text, so ``start_at`` is read (and a
    wrong one named) like every other field, not half-parsed by the YAML reader."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def parse_yaml(text: str) -> Any:
    """``text`` as plain data (:class:`_Loader`): what scenario files and ``--set`` values
    are read with."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: plain data only


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a scenario file into plain data, turning every failure into a ScenarioError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError("--scenario", f"cannot read {path}: {error.strerror}") from None
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ScenarioError("--scenario", f"{path} is not valid YAML{where}: {problem}") from None
    if data is None:
        raise ScenarioError(
            "--scenario", f"{path} is empty; a scenario is a mapping of keys ({_EXAMPLE})"
        )
    if not isinstance(data, dict):
        raise ScenarioError(
            "--scenario",
            f"{path} holds {_kind(data)}, not a mapping of keys; a scenario is one ({_EXAMPLE})",
        )
    return _files_beside(data, path.resolve().parent)


_EXAMPLE = "name, seed, horizon, groups, ...; conf/default.yaml is one"


def _kind(data: Any) -> str:
    """What a YAML document that is not a mapping holds, in words."""
    if isinstance(data, list):
        return f"a list of {len(data)} items"
    return f"a single value ({data!r})"


def _files_beside(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A traffic file named in the scenario is found beside it (``--set`` paths are taken
    from the working folder, as a shell gives them)."""
    groups = data.get("groups")
    for group in groups if isinstance(groups, list) else ():
        workload = group.get("workload") if isinstance(group, dict) else None
        name = workload.get("file") if isinstance(workload, dict) else None
        if isinstance(name, str) and name.strip() and not Path(name).is_absolute():
            workload["file"] = str(folder / name)
    return data


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``--set a.b.c=value`` overrides in order; list items by index or by group name.
    A ``null`` value (what ``--unset a.b.c`` passes) removes the key, so it takes its
    default again, the flavor's where the flavor decides it: that is how a key the file sets
    for one flavor is dropped before switching to another (no key takes null to mean
    anything but its default). A list item set to null is removed from its list."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError("--set", f"expected key=value, got {item!r}")
        try:
            value = parse_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        parts = key.strip().split(".")
        if value is None:
            _unset_path(data, parts, key.strip(), [])
        else:
            _set_path(data, parts, value, key.strip())
    return data


def _set_path(node: Any, parts: list[str], value: Any, full_key: str) -> None:
    head, rest = parts[0], parts[1:]
    if isinstance(node, list):
        index = _list_index(node, head, full_key)
        if not rest:
            node[index] = value
            return
        _set_path(node[index], rest, value, full_key)
        return
    if not isinstance(node, dict):
        raise ScenarioError("--set", f"{full_key}: {head!r} is inside a value, not a mapping")
    if not rest:
        node[head] = value
        return
    node.setdefault(head, {})
    _set_path(node[head], rest, value, full_key)


def _unset_path(node: Any, parts: list[str], full_key: str, seen: list[Any]) -> None:
    """Remove the key at ``parts``; a key the file does not set is left as it is, but only
    when the scenario knows it there (a misspelt key is named, with the nearest one)."""
    head, rest = parts[0], parts[1:]
    if isinstance(node, list):
        index = _list_index(node, head, full_key)
        if not rest:
            del node[index]
            return
        _unset_path(node[index], rest, full_key, [*seen, index])
        return
    if isinstance(node, dict) and head in node:
        if not rest:
            del node[head]
            return
        _unset_path(node[head], rest, full_key, [*seen, head])
        return
    if not isinstance(node, dict):
        raise ScenarioError("--set", f"{full_key}: {head!r} is inside a value, not a mapping")
    model = _model_at(tuple(seen))
    allowed = sorted(model.model_fields) if model is not None else []
    if head not in allowed:
        guess = difflib.get_close_matches(head, allowed, n=1)
        hint = f"; did you mean {guess[0]!r}?" if guess else ""
        raise ScenarioError("--set", f"{full_key}: unknown key {head!r}{hint}")


def _list_index(items: list[Any], head: str, full_key: str) -> int:
    if head.isdigit() and int(head) < len(items):
        return int(head)
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == head:
            return index
    names = [item.get("name") for item in items if isinstance(item, dict)]
    raise ScenarioError(
        "--set", f"{full_key}: no list item {head!r}; use an index 0..{len(items) - 1} or {names}"
    )


def build_scenario(data: Mapping[str, Any]) -> Scenario:
    """Validate plain data into a frozen Scenario, with one clear error if it is wrong."""
    try:
        return Scenario.model_validate(dict(data))
    except ValidationError as error:
        raise _friendly(error) from None


def scenario_json(scenario: Scenario) -> str:
    """The scenario with every default resolved and times in milliseconds: what the ``runs``
    table stores as ``config_json`` (readers take e.g. ``$.horizon`` from it)."""
    return scenario.model_dump_json()


def scenario_from_json(text: str) -> Scenario:
    """A stored ``config_json`` back into its Scenario. It was validated when it ran, so it is
    read as stored: milliseconds as plain numbers, and every key present whichever flavor
    reads it (the per-flavor key rules are for what authors write)."""
    try:
        return Scenario.model_validate_json(text, context={STORED: True})
    except ValidationError as error:
        raise _friendly(error) from None


def load_scenario(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Scenario:
    """The one entry: a YAML file (default: conf/default.yaml) plus ``--set`` overrides."""
    data = load_yaml(path or DEFAULT_SCENARIO_PATH)
    return build_scenario(apply_overrides(data, overrides))


_MISSING_HINTS = {
    "groups": ": a list of consumer groups, each with at least name and flavor",
    "flavor": f"; allowed: {', '.join(flavors.NAMES)}",
}


def _friendly(error: ValidationError) -> ScenarioError:
    """Turn pydantic's first error into one sentence that names the field and what is allowed."""
    errors = error.errors(include_url=False)
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = first["loc"]
    field = _dotted(loc)
    kind = first["type"]
    value = first.get("input")
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, FieldRuleError):
        return ScenarioError(f"{field}.{cause.key}" if field else cause.key, str(cause))
    if kind == "extra_forbidden":
        parent_model = _model_at(loc[:-1])
        allowed = sorted(parent_model.model_fields) if parent_model else []
        guess = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"; did you mean {guess[0]!r}?" if guess else ""
        return ScenarioError(field, f"unknown key{hint} Allowed keys: {', '.join(allowed)}")
    if kind == "missing":
        hint = _MISSING_HINTS.get(str(loc[-1]), "")
        return ScenarioError(field, f"is required{hint}")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        kinds = ", ".join(RETRY_POLICY_MODELS)
        shown = f"value {value.get('kind')!r}: " if isinstance(value, dict) else ""
        return ScenarioError(f"{field}.kind", f"{shown}must be one of {kinds}")
    message = first["msg"].removeprefix("Value error, ")
    if kind == "too_short":
        message = "must list at least one item"
    if kind == "literal_error":
        message = f"must be one of {first['ctx']['expected']}"
    shown = "" if isinstance(value, (dict, list)) or value is None else f"value {value!r}: "
    return ScenarioError(field, shown + message)


def _dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    previous = None
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif str(part).startswith(("function-", "constrained-")):
            continue
        elif previous == "retry_policy" and part in RETRY_POLICY_MODELS:
            continue  # the discriminated union's tag, not a key
        else:
            text += f".{part}" if text else str(part)
        previous = part
    return text or "scenario"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns a location, to list its keys in an 'unknown key' error."""
    model: Any = Scenario
    previous = None
    for part in loc:
        if isinstance(part, int) or str(part).startswith(("function-", "constrained-")):
            continue
        if previous == "retry_policy" and part in RETRY_POLICY_MODELS:
            model = RETRY_POLICY_MODELS[part]
            previous = part
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _model_type(field.annotation)
        if model is None:
            return None
        previous = part
    return model


def _model_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_type(arg)
        if found is not None:
            return found
    origin = getattr(annotation, "__origin__", None)
    metadata_base = getattr(annotation, "__metadata__", None)
    if metadata_base is not None and origin is not None:
        return _model_type(origin)
    return None
