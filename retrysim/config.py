"""Scenario files: parse, override, validate, freeze.

A scenario is validated once at the entrypoint and passed down as a frozen model, so every
later stage can trust its values. Errors are raised as :class:`ScenarioError` with the dotted
field, the offending value and what is allowed, because the user's next step is to fix one
line of YAML. Durations are integer milliseconds everywhere after this module.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from retrysim import limits

DEFAULT_SCENARIO_PATH = Path(__file__).resolve().parent.parent / "conf" / "default.yaml"

_DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
# RocketMQ's own messageDelayLevel units (ScheduleMessageService.parseDelayLevel): s m h d.
_DELAY_TOKEN_RE = re.compile(r"^(\d+)([smhd])$")


class ScenarioError(ValueError):
    """Bad scenario input: one message naming the field, the value and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


# --------------------------------------------------------------------------- value types


_STORED = "stored"


def _stored(info: ValidationInfo | None) -> bool:
    """Validating a stored scenario (scenario_from_json), not an author's file?"""
    return bool(info is not None and info.context and info.context.get(_STORED))


def parse_duration(value: Any, info: ValidationInfo | None = None) -> int:
    """``1500ms``, ``10s``, ``5m``, ``2h``, ``1d`` (or ``0``) to integer milliseconds; a stored
    scenario holds them as milliseconds already."""
    if _stored(info) and isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 10s, got {value!r}")
    if isinstance(value, int) and value == 0:
        return 0
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            return round(float(match.group(1)) * _DURATION_UNITS_MS[match.group(2)])
    raise ValueError(
        f"malformed duration {value!r}: use a number with a unit ms, s, m, h or d "
        "(e.g. 1500ms, 10s, 5m, 2h, 1d)"
    )


def parse_delay_levels(text: Any, info: ValidationInfo | None = None) -> tuple[int, ...]:
    """RocketMQ's ``messageDelayLevel`` string ("1s 5s 10s ...") to per-level milliseconds
    (a stored scenario holds the milliseconds)."""
    if _stored(info) and isinstance(text, (list, tuple)):
        return tuple(int(ms) for ms in text)
    if not isinstance(text, str) or not text.split():
        raise ValueError('expected space-separated delays such as "1s 5s 10s 30s 1m"')
    levels = []
    for position, token in enumerate(text.split(), start=1):
        match = _DELAY_TOKEN_RE.match(token)
        if not match:
            raise ValueError(
                f"level {position} token {token!r} is not a whole number followed by one of "
                "s, m, h, d (RocketMQ's messageDelayLevel format, e.g. 10s or 2h)"
            )
        levels.append(int(match.group(1)) * _DURATION_UNITS_MS[match.group(2)])
    if len(levels) > limits.MAX_DELAY_LEVELS:
        raise ValueError(f"{len(levels)} levels; at most {limits.MAX_DELAY_LEVELS} are allowed")
    return tuple(levels)


def format_duration(ms: int) -> str:
    """The shortest exact spelling of a millisecond count: 90000 -> 90s, 7200000 -> 2h."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _DURATION_UNITS_MS[unit] == 0:
            return f"{ms // _DURATION_UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def _in_range(low: float | None, high: float | None, duration: bool = False):
    def show(bound: float) -> str:
        if duration:
            return format_duration(int(bound))
        return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"

    def check(value: float) -> float:
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = (
                f"between {show(low)} and {show(high)}"
                if low is not None and high is not None
                else (f">= {show(low)}" if low is not None else f"<= {show(high)}")
            )
            raise ValueError(f"must be {bounds}")
        return value

    return AfterValidator(check)


def _duration_field(value: Any, info: ValidationInfo) -> int:
    return parse_duration(value, info)


def _delay_levels_field(value: Any, info: ValidationInfo) -> tuple[int, ...]:
    return parse_delay_levels(value, info)


Duration = Annotated[int, BeforeValidator(_duration_field)]
NonNegativeDuration = Annotated[Duration, _in_range(0, None, duration=True)]
PositiveDuration = Annotated[Duration, _in_range(1, None, duration=True)]
Probability = Annotated[float, _in_range(0.0, 1.0)]
StrictInt = Annotated[int, Field(strict=True)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- behavior


class ProcessingTime(_Model):
    """How long the listener runs. Lognormal is given by mean and p99, as people measure it."""

    dist: Literal["constant", "exponential", "lognormal"] = "constant"
    mean: NonNegativeDuration = 0
    p99: NonNegativeDuration | None = None

    @model_validator(mode="after")
    def _p99_fits(self) -> ProcessingTime:
        if self.dist == "lognormal":
            if self.p99 is None:
                raise ValueError("lognormal needs p99 as well as mean")
            if self.mean <= 0 or not self.mean < self.p99 <= limits.LOGNORMAL_MAX_P99_RATIO * (
                self.mean
            ):
                raise ValueError(
                    f"lognormal needs 0 < mean < p99 <= {limits.LOGNORMAL_MAX_P99_RATIO:.2f} x "
                    f"mean (got mean {self.mean} ms, p99 {self.p99} ms)"
                )
        elif self.p99 is not None:
            raise ValueError(f"p99 applies only to dist: lognormal, not {self.dist}")
        return self


def _processing_time(value: Any) -> Any:
    """A bare duration means a constant processing time."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return {"dist": "constant", "mean": value}
    return value


ProcessingTimeField = Annotated[ProcessingTime, BeforeValidator(_processing_time)]


class Outage(_Model):
    """A window of a failing downstream: its own failure chance, optionally slower calls."""

    start: NonNegativeDuration
    end: NonNegativeDuration
    fail_probability: Probability = 1.0
    processing_time: ProcessingTimeField | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Outage:
        if self.end <= self.start:
            raise ValueError(f"end ({self.end} ms) must be after start ({self.start} ms)")
        return self


class OutcomeMix(_Model):
    """Relative weights of the ways a failed delivery fails (all retried the same way in 4.x)."""

    reconsume_later: Annotated[float, _in_range(0.0, None)] = 1.0
    exception: Annotated[float, _in_range(0.0, None)] = 0.0
    null_return: Annotated[float, _in_range(0.0, None)] = 0.0

    @model_validator(mode="after")
    def _some_weight(self) -> OutcomeMix:
        if self.reconsume_later + self.exception + self.null_return <= 0:
            raise ValueError("weights must not all be 0")
        return self


class Behavior(_Model):
    """What makes a delivery fail and how long it runs (docs/model.md §3)."""

    fail_probability: Probability = 0.0
    poison_fraction: Probability = 0.0
    fail_first: Annotated[StrictInt, _in_range(0, limits.MAX_FAIL_FIRST)] = 0
    processing_time: ProcessingTimeField = ProcessingTime(mean=f"{limits.DEFAULT_PROCESSING_MS}ms")
    outages: tuple[Outage, ...] = ()
    outcome_mix: OutcomeMix = OutcomeMix()
    send_back_failure_probability: Probability = 0.0
    ready_wait: Annotated[Duration, _in_range(0, limits.HOUR_MS, duration=True)] = 0


class Workload(_Model):
    messages: Annotated[StrictInt, _in_range(1, limits.MAX_MESSAGES_PER_GROUP)] = 10_000
    over: NonNegativeDuration = 3_600_000
    arrival: Literal["uniform", "poisson"] = "uniform"
    queues: Annotated[StrictInt, _in_range(1, limits.MAX_QUEUES)] = 8
    size_bytes: Annotated[StrictInt, _in_range(1, limits.MAX_MESSAGE_BYTES)] = 1024


def _unlimited(value: Any) -> Any:
    """``consumers: unlimited`` is an infinite pool of consumer threads."""
    if value == "unlimited":
        return {"unlimited": True}
    if isinstance(value, str):
        raise ValueError("must be {instances, threads} or 'unlimited'")
    return value


class Consumers(_Model):
    """The consumer thread pool of a group: ``instances x threads`` threads (docs/model.md §5)."""

    instances: Annotated[StrictInt, _in_range(1, limits.MAX_CONSUMER_INSTANCES)] = 1
    threads: Annotated[StrictInt, _in_range(1, limits.MAX_CONSUMER_THREADS)] = (
        limits.DEFAULT_CONSUMER_THREADS
    )
    unlimited: bool = False

    @property
    def pool_size(self) -> int | None:
        """Threads in the pool, or None for an unlimited pool."""
        return None if self.unlimited else self.instances * self.threads


ConsumersField = Annotated[Consumers, BeforeValidator(_unlimited)]

# --------------------------------------------------------------------------- retry policies


class ExponentialPolicy(_Model):
    """RocketMQ 5 ExponentialRetryPolicy: ``min(max, initial * multiplier^(n-1))``."""

    kind: Literal["exponential"]
    initial: Annotated[Duration, _in_range(1, limits.MAX_INVISIBLE_MS, duration=True)] = (
        limits.EXPONENTIAL_INITIAL_MS
    )
    max: Annotated[Duration, _in_range(1, limits.MAX_INVISIBLE_MS, duration=True)] = (
        limits.EXPONENTIAL_MAX_MS
    )
    multiplier: Annotated[float, _in_range(1.0, 100.0)] = limits.EXPONENTIAL_MULTIPLIER

    @model_validator(mode="after")
    def _ordered(self) -> ExponentialPolicy:
        if self.max < self.initial:
            raise ValueError(f"max ({format_duration(self.max)}) must be >= initial")
        return self


class CustomizedPolicy(_Model):
    """RocketMQ 5 CustomizedRetryPolicy: retry n waits ``intervals[min(n, len) - 1]``."""

    kind: Literal["customized"]
    intervals: Annotated[
        tuple[Annotated[Duration, _in_range(0, limits.MAX_INVISIBLE_MS, duration=True)], ...],
        Field(min_length=1, max_length=limits.MAX_CUSTOM_INTERVALS),
    ] = tuple(parse_delay_levels(limits.APSARAMQ_PUSH_INTERVALS))


class GrpcClientPolicy(_Model):
    """The open-source gRPC clients' default: the 18 levels indexed from 1 s."""

    kind: Literal["grpc_client"]


class SqsPolicy(_Model):
    """AWS SQS: visibility timeout and a redrive policy's ``maxReceiveCount``."""

    kind: Literal["sqs"]
    visibility_timeout: Annotated[
        Duration, _in_range(0, limits.SQS_MAX_VISIBILITY_MS, duration=True)
    ] = limits.SQS_DEFAULT_VISIBILITY_MS
    max_receive_count: Annotated[StrictInt, _in_range(1, limits.SQS_MAX_RECEIVE)] = (
        limits.SQS_DEFAULT_MAX_RECEIVE
    )


class PubsubPolicy(_Model):
    """Google Pub/Sub: exponential retry backoff, dead-letter policy, ack deadline."""

    kind: Literal["pubsub"]
    minimum_backoff: Annotated[
        Duration, _in_range(0, limits.PUBSUB_BACKOFF_LIMIT_MS, duration=True)
    ] = limits.PUBSUB_MIN_BACKOFF_MS
    maximum_backoff: Annotated[
        Duration, _in_range(0, limits.PUBSUB_BACKOFF_LIMIT_MS, duration=True)
    ] = limits.PUBSUB_MAX_BACKOFF_MS
    max_delivery_attempts: Annotated[
        StrictInt, _in_range(limits.PUBSUB_MIN_ATTEMPTS, limits.PUBSUB_MAX_ATTEMPTS)
    ] = limits.PUBSUB_DEFAULT_ATTEMPTS
    ack_deadline: Annotated[
        Duration,
        _in_range(
            limits.PUBSUB_MIN_ACK_DEADLINE_MS, limits.PUBSUB_MAX_ACK_DEADLINE_MS, duration=True
        ),
    ] = limits.PUBSUB_DEFAULT_ACK_DEADLINE_MS

    @model_validator(mode="after")
    def _ordered(self) -> PubsubPolicy:
        if self.maximum_backoff < self.minimum_backoff:
            raise ValueError("maximum_backoff must be >= minimum_backoff")
        return self


RetryPolicy = Annotated[
    ExponentialPolicy | CustomizedPolicy | GrpcClientPolicy | SqsPolicy | PubsubPolicy,
    Field(discriminator="kind"),
]
RETRY_POLICY_MODELS: dict[str, type[BaseModel]] = {
    "exponential": ExponentialPolicy,
    "customized": CustomizedPolicy,
    "grpc_client": GrpcClientPolicy,
    "sqs": SqsPolicy,
    "pubsub": PubsubPolicy,
}

# --------------------------------------------------------------------------- replay

_RATE_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")
MAX_REPLAY_RATE_PER_S = 1_000_000.0


def parse_rate(value: Any) -> float:
    """``100/s``, ``6000/m``, ``1/h`` or a bare number (per second) to messages per second."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = float(value)
    elif isinstance(value, str) and _RATE_RE.match(value):
        match = _RATE_RE.match(value)
        rate = float(match.group(1)) / _RATE_UNITS_S[match.group(2)]
    else:
        raise ValueError(f"malformed rate {value!r}: use e.g. 100/s, 6000/m or 1/h")
    if not 0 < rate <= MAX_REPLAY_RATE_PER_S:
        raise ValueError(f"rate must be above 0 and at most {MAX_REPLAY_RATE_PER_S:,.0f}/s")
    return rate


class Replay(_Model):
    """DLQ replay what-if (docs/model.md §8): re-send dead letters after a fix."""

    at: NonNegativeDuration
    rate: Annotated[float, BeforeValidator(parse_rate)]
    poison_fixed: bool = True


# --------------------------------------------------------------------------- groups


def _known_flavor(flavor: str) -> str:
    if flavor not in limits.FLAVORS:
        guess = difflib.get_close_matches(flavor, limits.FLAVORS, n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        raise ValueError(f"unknown flavor; {hint}allowed: {', '.join(limits.FLAVORS)}")
    return flavor


class FieldRuleError(ValueError):
    """A cross-field rule broken by one key; carries the key so the message can name it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


# Keys that only some flavors read (docs/flavors.md); setting one elsewhere is an error.
_ONLY_FOR: dict[str, tuple[str, ...]] = {
    "delay_level_when_next_consume": ("rocketmq4.concurrently",),
    "consume_timeout_check": ("rocketmq4.concurrently", "rocketmq4.broadcasting"),
    "consume_message_batch_max_size": ("rocketmq4.concurrently",),
    "ack_index": ("rocketmq4.concurrently",),
    "pull_interval": ("rocketmq4.concurrently",),
    "suspend_current_queue_time": ("rocketmq4.orderly", "rocketmq5.push"),
    "invisible_duration": ("rocketmq5.simple",),
    "ordered": ("rocketmq5.push",),
    "consume_timeout": (
        "rocketmq4.concurrently",
        "rocketmq4.broadcasting",
        "http.unordered",
        "http.ordered",
        "rocketmq5.push",
        "exponential",
        "customized",
    ),
}
_TIMEOUT_KEY_OF = {
    "rocketmq4.orderly": "none: the orderly service never expires a message",
    "rocketmq5.simple": "invisible_duration",
    "sqs": "retry_policy.visibility_timeout",
    "pubsub": "retry_policy.ack_deadline",
}
# retry_policy kinds each flavor accepts; the first is its default.
_POLICY_KINDS: dict[str, tuple[str, ...]] = {
    "rocketmq5.push": ("exponential", "customized", "grpc_client"),
    "exponential": ("exponential",),
    "customized": ("customized",),
    "sqs": ("sqs",),
    "pubsub": ("pubsub",),
}
# max_reconsume_times: the flavors that fix it, and the 5.x maximum.
_FIXED_MAX_RETRIES = {
    "rocketmq4.broadcasting": "broadcasting consumption never retries",
    "http.unordered": "HTTP consumers retry a fixed 288 times (not configurable)",
    "http.ordered": "HTTP consumers retry a fixed 288 times (not configurable)",
    "sqs": "set retry_policy.max_receive_count instead",
    "pubsub": "set retry_policy.max_delivery_attempts instead",
}
FLAVORS_5X = ("rocketmq5.push", "rocketmq5.simple", "exponential", "customized")


class Group(_Model):
    """One consumer group: what it consumes, how it retries, how its listener behaves.

    Flavor-specific keys (docs/flavors.md) are checked against the flavor once the group is
    parsed, so ``suspend_current_queue_time`` on a concurrent consumer is an error, not a
    silently ignored line.
    """

    name: Annotated[str, Field(pattern=r"^[%|a-zA-Z0-9_-]{1,255}$")]
    flavor: Annotated[str, AfterValidator(_known_flavor)]
    topic: Annotated[str, Field(pattern=r"^[%|a-zA-Z0-9_-]{1,127}$")] | None = None
    ordered: bool = False
    max_reconsume_times: Annotated[StrictInt, _in_range(-1, limits.MAX_RECONSUME_TIMES_4X)] = -1
    delay_level_when_next_consume: Annotated[StrictInt, _in_range(-1, None)] = 0
    consume_timeout: Annotated[Duration, _in_range(1_000, 24 * 3_600_000, duration=True)] | None = (
        None
    )
    consume_timeout_check: Literal["exact", "periodic"] = "exact"
    dlq_enabled: bool = True
    suspend_current_queue_time: Annotated[
        Duration, _in_range(limits.MIN_SUSPEND_MS, limits.MAX_SUSPEND_MS, duration=True)
    ] = limits.DEFAULT_SUSPEND_MS
    invisible_duration: Annotated[
        Duration, _in_range(limits.MIN_INVISIBLE_MS, limits.MAX_INVISIBLE_MS, duration=True)
    ] = limits.DEFAULT_INVISIBLE_MS
    retry_policy: RetryPolicy | None = None
    consume_message_batch_max_size: Annotated[StrictInt, _in_range(1, limits.MAX_CONSUME_BATCH)] = 1
    ack_index: Annotated[StrictInt, _in_range(0, limits.MAX_CONSUME_BATCH - 1)] | None = None
    pull_interval: Annotated[Duration, _in_range(0, limits.HOUR_MS, duration=True)] = 0
    consumers: ConsumersField = Consumers()
    workload: Workload = Workload()
    behavior: Behavior = Behavior()
    replay: Replay | None = None

    @property
    def source_topic(self) -> str:
        return self.topic or self.name

    @property
    def blocking(self) -> bool:
        """Ordered consumption: one message of a queue at a time (head-of-line blocking)."""
        return self.flavor in ("rocketmq4.orderly", "http.ordered") or (
            self.flavor == "rocketmq5.push" and self.ordered
        )

    @property
    def policy_kind(self) -> str | None:
        """The retry_policy kind in force (the flavor's default when none is given)."""
        if self.retry_policy is not None:
            return self.retry_policy.kind
        kinds = _POLICY_KINDS.get(self.flavor, ())
        return kinds[0] if kinds and self.flavor != "rocketmq5.push" else None

    @model_validator(mode="after")
    def _flavor_rules(self, info: ValidationInfo) -> Group:
        if _stored(info):
            return self
        given = self.model_fields_set
        flavor = self.flavor
        for key, flavors in _ONLY_FOR.items():
            if key in given and flavor not in flavors:
                if key == "consume_timeout" and flavor in _TIMEOUT_KEY_OF:
                    raise FieldRuleError(
                        key,
                        f"does not apply to {flavor}; its timeout is {_TIMEOUT_KEY_OF[flavor]}",
                    )
                raise FieldRuleError(
                    key, f"applies only to {' and '.join(flavors)}, not to {flavor}"
                )
        if (
            flavor == "rocketmq5.push"
            and "suspend_current_queue_time" in given
            and not self.ordered
        ):
            raise FieldRuleError(
                "suspend_current_queue_time", "applies to rocketmq5.push only with ordered: true"
            )
        if "send_back_failure_probability" in self.behavior.model_fields_set and (
            flavor != "rocketmq4.concurrently"
        ):
            raise FieldRuleError(
                "behavior.send_back_failure_probability",
                f"applies only to rocketmq4.concurrently, not to {flavor}",
            )
        self._check_retry_policy()
        self._check_max_retries()
        if self.replay is not None and (not self.dlq_enabled or flavor == "rocketmq4.broadcasting"):
            raise FieldRuleError("replay", "needs a dead-letter queue (dlq_enabled: true)")
        return self

    def _check_retry_policy(self) -> None:
        allowed = _POLICY_KINDS.get(self.flavor, ())
        if self.flavor == "rocketmq5.push" and self.ordered:
            allowed = ()
        if self.retry_policy is not None and self.retry_policy.kind not in allowed:
            where = "ordered rocketmq5.push" if self.blocking else self.flavor
            kinds = f"allowed kinds: {', '.join(allowed)}" if allowed else "it takes none"
            raise FieldRuleError(
                "retry_policy",
                f"kind {self.retry_policy.kind!r} does not apply to {where}; {kinds}",
            )

    def _check_max_retries(self) -> None:
        if "max_reconsume_times" not in self.model_fields_set or self.max_reconsume_times == -1:
            return
        if self.flavor in _FIXED_MAX_RETRIES:
            raise FieldRuleError(
                "max_reconsume_times",
                f"value {self.max_reconsume_times}: must stay -1 for {self.flavor}; "
                f"{_FIXED_MAX_RETRIES[self.flavor]}",
            )
        if self.flavor in FLAVORS_5X and self.max_reconsume_times > limits.MAX_RETRIES_5X:
            raise FieldRuleError(
                "max_reconsume_times",
                f"value {self.max_reconsume_times}: must be between -1 and "
                f"{limits.MAX_RETRIES_5X:,} for {self.flavor} (the 5.x maximum)",
            )


class Broker(_Model):
    message_delay_level: Annotated[tuple[int, ...], BeforeValidator(_delay_levels_field)] = (
        parse_delay_levels(limits.DEFAULT_MESSAGE_DELAY_LEVEL)
    )


def _unique_names(groups: tuple[Group, ...]) -> tuple[Group, ...]:
    names = [group.name for group in groups]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"duplicate group names {duplicates}: each group needs its own name")
    return groups


class Scenario(_Model):
    """A whole scenario file; see DESIGN.md §6 for the contract of its keys."""

    name: Annotated[str, Field(min_length=1, max_length=200)] = "scenario"
    seed: Annotated[StrictInt, _in_range(0, 2**63 - 1)] = 42
    horizon: Annotated[Duration, _in_range(1, limits.MAX_HORIZON_MS, duration=True)] = 6 * 3_600_000
    load_bucket: Annotated[Duration, _in_range(100, None, duration=True)] = 60_000
    broker: Broker = Broker()
    groups: Annotated[tuple[Group, ...], Field(min_length=1), AfterValidator(_unique_names)]

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.horizon // self.load_bucket > limits.MAX_LOAD_BUCKETS:
            raise ValueError(
                f"horizon / load_bucket gives {self.horizon // self.load_bucket} buckets; at "
                f"most {limits.MAX_LOAD_BUCKETS} are allowed (use a larger load_bucket)"
            )
        return self


# --------------------------------------------------------------------------- loading


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a scenario file into plain data, turning every failure into a ScenarioError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ScenarioError("--scenario", f"cannot read {path}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ScenarioError("--scenario", f"{path} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ScenarioError("--scenario", f"{path} must hold a mapping of keys, not {data!r}")
    return data


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``--set a.b.c=value`` overrides; list items by index or by group name."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError("--set", f"expected key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        _set_path(data, key.strip().split("."), value, key.strip())
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
        return Scenario.model_validate_json(text, context={_STORED: True})
    except ValidationError as error:
        raise _friendly(error) from None


def load_scenario(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Scenario:
    """The one entry: a YAML file (default: conf/default.yaml) plus ``--set`` overrides."""
    data = load_yaml(path or DEFAULT_SCENARIO_PATH)
    return build_scenario(apply_overrides(data, overrides))


_MISSING_HINTS = {
    "groups": ": a list of consumer groups, each with at least name and flavor",
    "flavor": f"; allowed: {', '.join(limits.FLAVORS)}",
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
