"""The scenario's models: every key, its type, default and range, frozen once validated.

A scenario is validated once at the entrypoint and passed down frozen, so every later stage
can trust its values. Flavor-specific keys are checked against the flavor's record
(:mod:`retrysim.model.flavors`), so a key the flavor does not read is an error, not a line
silently ignored.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    model_validator,
)

from retrysim.model import flavors
from retrysim.scenario import limits
from retrysim.scenario.errors import FieldRuleError
from retrysim.scenario.traffic import TrafficFileError, read_counts
from retrysim.scenario.units import (
    DelayLevels,
    Duration,
    FineDuration,
    NonNegativeDuration,
    Probability,
    StrictInt,
    format_duration,
    in_range,
    is_stored,
    parse_delay_levels,
    parse_rate,
)


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

    reconsume_later: Annotated[float, in_range(0.0, None)] = 1.0
    exception: Annotated[float, in_range(0.0, None)] = 0.0
    null_return: Annotated[float, in_range(0.0, None)] = 0.0

    @model_validator(mode="after")
    def _some_weight(self) -> OutcomeMix:
        if self.reconsume_later + self.exception + self.null_return <= 0:
            raise ValueError("weights must not all be 0")
        return self


def _check_in_order(profile: tuple[ProfilePiece | BehaviorPiece, ...]) -> int:
    """Pieces listed in order, each ending after the one before; returns the last end."""
    previous = 0
    for index, piece in enumerate(profile):
        if piece.until <= previous:
            raise FieldRuleError(
                f"profile[{index}].until",
                f"value {format_duration(piece.until)}: must be after the previous piece's "
                f"end ({format_duration(previous)}); pieces are listed in order and do not "
                "overlap",
            )
        previous = piece.until
    return previous


class BehaviorPiece(_Model):
    """One piece of a behavior profile: from the previous piece's end until ``until``, the
    listener fails with ``fail_probability`` and runs ``processing_time`` (each, when left
    out, the group's own)."""

    until: Annotated[Duration, in_range(1, limits.MAX_HORIZON_MS, duration=True)]
    fail_probability: Probability | None = None
    processing_time: ProcessingTimeField | None = None

    @model_validator(mode="after")
    def _sets_something(self) -> BehaviorPiece:
        if self.fail_probability is None and self.processing_time is None:
            raise ValueError("needs fail_probability, processing_time or both")
        return self


class Downstream(_Model):
    """What the listener's calls share, answering to load (docs/model.md §3, "A downstream
    that answers to load"): beyond ``capacity`` calls at once, every call runs
    ``load / capacity`` times longer, ``shed`` of the share beyond capacity is refused at
    once, and a call that would outlast ``timeout`` fails then. ``per: group`` is one
    service every instance calls; ``per: instance`` a resource of each instance's own (its
    cores)."""

    capacity: Annotated[StrictInt, in_range(1, limits.MAX_DOWNSTREAM_CAPACITY)]
    per: Literal["group", "instance"] = "group"
    timeout: Annotated[Duration, in_range(1, limits.HOUR_MS, duration=True)] | None = None
    shed: Probability = 0.0

    @property
    def shared(self) -> bool:
        """Whether the group's instances share it: their calls count together."""
        return self.per == "group"


ClientOverhead = Annotated[FineDuration, in_range(0, limits.MAX_CLIENT_OVERHEAD_MS, duration=True)]


class Behavior(_Model):
    """What makes a delivery fail and how long it runs (docs/model.md §3)."""

    fail_probability: Probability = 0.0
    poison_fraction: Probability = 0.0
    fail_first: Annotated[StrictInt, in_range(0, limits.MAX_FAIL_FIRST)] = 0
    processing_time: ProcessingTimeField = ProcessingTime(mean=f"{limits.DEFAULT_PROCESSING_MS}ms")
    outages: tuple[Outage, ...] = ()
    outcome_mix: OutcomeMix = OutcomeMix()
    send_back_failure_probability: Probability = 0.0
    send_back_fallback_probability: Probability = 0.0
    ready_wait: Annotated[Duration, in_range(0, limits.HOUR_MS, duration=True)] = 0
    # the listener over time: consecutive pieces, each a window of its own (docs/model.md §3)
    profile: tuple[BehaviorPiece, ...] = ()
    downstream: Downstream | None = None
    # the consumer client's own time on the consume thread per delivery, besides the
    # listener's (docs/model.md §3, "The client's own time")
    client_overhead: ClientOverhead = 0.0

    @property
    def windows(self) -> tuple[Outage, ...]:
        """The time windows with their own failure chance or processing time: the profile's
        pieces first, then the outages (so an outage's processing time wins where they
        overlap, and the higher failure chance)."""
        pieces, start = [], 0
        for piece in self.profile:
            pieces.append(
                Outage.model_construct(
                    start=start,
                    end=piece.until,
                    fail_probability=(
                        self.fail_probability
                        if piece.fail_probability is None
                        else piece.fail_probability
                    ),
                    processing_time=piece.processing_time,
                )
            )
            start = piece.until
        return (*pieces, *self.outages)

    @model_validator(mode="after")
    def _profile_in_order(self) -> Behavior:
        _check_in_order(self.profile)
        return self

    @model_validator(mode="after")
    def _send_back_shares(self) -> Behavior:
        # one draw decides a send-back: failed both ways, fallen back, or done by the RPC
        if self.send_back_failure_probability + self.send_back_fallback_probability > 1:
            raise FieldRuleError(
                "send_back_fallback_probability",
                f"value {self.send_back_fallback_probability}: must be between 0 and "
                f"{1 - self.send_back_failure_probability:g} (1 - send_back_failure_probability)",
            )
        return self


class ProfilePiece(_Model):
    """One piece of a traffic profile: messages arrive at ``per_second`` (or ``count`` of
    them in all, as a recorded file gives them) from the previous piece's end until ``until``."""

    until: Annotated[Duration, in_range(1, limits.MAX_HORIZON_MS, duration=True)]
    per_second: Annotated[float, in_range(0.0, limits.MAX_PROFILE_RATE)] | None = None
    count: Annotated[StrictInt, in_range(0, limits.MAX_MESSAGES_PER_GROUP)] | None = None

    @model_validator(mode="after")
    def _one_rate(self) -> ProfilePiece:
        if (self.per_second is None) == (self.count is None):
            raise ValueError("needs per_second (or count, as a recorded file gives), not both")
        return self


# A workload's arrivals as pieces: (start_ms, length_ms, first msg_id, messages).
Piece = tuple[int, int, int, int]


class Workload(_Model):
    """What is published: ``messages`` spread ``uniform``ly or as a ``poisson`` process over
    ``over``, or a traffic shape whose pieces give the count (docs/scenario.md, Workload)."""

    messages: Annotated[StrictInt, in_range(1, limits.MAX_MESSAGES_PER_GROUP)] = 10_000
    over: NonNegativeDuration = 3_600_000
    arrival: Literal["uniform", "poisson", "profile", "file"] = "uniform"
    queues: Annotated[StrictInt, in_range(1, limits.MAX_QUEUES)] = 8
    size_bytes: Annotated[StrictInt, in_range(1, limits.MAX_MESSAGE_BYTES)] = 1024
    # traffic shapes: arrival profile (the pieces) or file (read into the pieces), and how
    # messages arrive within a piece
    profile: tuple[ProfilePiece, ...] | None = None
    within: Literal["uniform", "poisson"] = "uniform"
    file: str | None = None
    scale: Annotated[float, in_range(0.0, limits.MAX_TRAFFIC_SCALE)] = 1.0

    @model_validator(mode="before")
    @classmethod
    def _read_file(cls, data: Any, info: ValidationInfo) -> Any:
        """``arrival: file``: the file's counts become the profile (a stored scenario holds
        them already, so it never needs the file again)."""
        if is_stored(info) or not isinstance(data, dict) or data.get("arrival") != "file":
            return data
        if data.get("profile") is not None:
            raise FieldRuleError("profile", "not with arrival: file (the file gives the pieces)")
        if not isinstance(data.get("file"), str) or not data["file"].strip():
            raise FieldRuleError("file", "is required with arrival: file (a CSV or Parquet path)")
        scale = data.get("scale", 1.0)
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not 0 < scale <= limits.MAX_TRAFFIC_SCALE
        ):
            raise FieldRuleError(
                "scale",
                f"value {scale!r}: must be a number > 0 and <= {limits.MAX_TRAFFIC_SCALE:g}",
            )
        try:
            counts = read_counts(data["file"], float(scale))
        except TrafficFileError as error:
            raise FieldRuleError("file", str(error)) from None
        return {**data, "profile": [{"until": f"{u}ms", "count": c} for u, c in counts]}

    @model_validator(mode="after")
    def _shape(self, info: ValidationInfo) -> Workload:
        shaped = self.arrival in ("profile", "file")
        if not shaped:
            for key in ("profile", "file"):
                if getattr(self, key) is not None:
                    raise FieldRuleError(key, "only with arrival: profile or file")
            for key in ("within", "scale"):
                if key in self.model_fields_set and not is_stored(info):
                    raise FieldRuleError(key, "only with arrival: profile or file")
            return self
        if self.arrival == "profile" and self.file is not None:
            raise FieldRuleError("file", "only with arrival: file")
        if self.arrival == "profile" and "scale" in self.model_fields_set and not is_stored(info):
            raise FieldRuleError("scale", "only with arrival: file")
        if not self.profile:
            raise FieldRuleError("profile", "must list at least one {until, per_second} piece")
        if not is_stored(info):
            for key in ("messages", "over"):
                if key in self.model_fields_set:
                    raise FieldRuleError(
                        key, f"follows from the {self.arrival}; leave it out of the workload"
                    )
        previous = _check_in_order(self.profile)
        total = sum(count for *_, count in _pieces(self.profile))
        if not 1 <= total <= limits.MAX_MESSAGES_PER_GROUP:
            raise FieldRuleError(
                "profile",
                f"gives {total:,} messages; it must give between 1 and "
                f"{limits.MAX_MESSAGES_PER_GROUP:,}",
            )
        object.__setattr__(self, "messages", total)  # derived, as documented
        object.__setattr__(self, "over", previous)
        return self

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """The arrivals as ``(start_ms, length_ms, first msg_id, messages)`` pieces, those
        with no message left out: one piece over ``over`` for uniform and poisson arrivals."""
        if self.profile is None:
            return ((0, self.over, 0, self.messages),)
        return tuple(piece for piece in _pieces(self.profile) if piece[3] > 0)

    @property
    def spread(self) -> str:
        """How messages arrive within a piece: uniform or poisson."""
        return self.arrival if self.profile is None else self.within


def _pieces(profile: tuple[ProfilePiece, ...]) -> list[Piece]:
    """A profile's pieces with their first ids: a rate gives ``round(rate x length)``."""
    pieces, start, first = [], 0, 0
    for piece in profile:
        length = piece.until - start
        count = piece.count if piece.count is not None else round(piece.per_second * length / 1000)
        pieces.append((start, length, first, count))
        start, first = piece.until, first + count
    return pieces


def _unlimited(value: Any) -> Any:
    """``consumers: unlimited`` is an infinite pool of consumer threads."""
    if value == "unlimited":
        return {"unlimited": True}
    if isinstance(value, str):
        raise ValueError("must be {instances, threads} or 'unlimited'")
    return value


class Consumers(_Model):
    """The consumer thread pool of a group: ``instances x threads`` threads (docs/model.md §5)."""

    instances: Annotated[StrictInt, in_range(1, limits.MAX_CONSUMER_INSTANCES)] = 1
    threads: Annotated[StrictInt, in_range(1, limits.MAX_CONSUMER_THREADS)] = (
        limits.DEFAULT_CONSUMER_THREADS
    )
    unlimited: bool = False

    @property
    def pool_size(self) -> int | None:
        """Threads in the pool, or None for an unlimited pool."""
        return None if self.unlimited else self.instances * self.threads


ConsumersField = Annotated[Consumers, BeforeValidator(_unlimited)]


def _version_text(value: Any) -> Any:
    """``client_version: 4.9`` as YAML reads it (a number) is the version "4.9"."""
    return str(value) if isinstance(value, float) else value


ClientVersion = Annotated[Literal["4.9", "5.1"], BeforeValidator(_version_text)]

# --------------------------------------------------------------------------- retry policies


class ExponentialPolicy(_Model):
    """RocketMQ 5 ExponentialRetryPolicy: ``min(max, initial * multiplier^(n-1))``."""

    kind: Literal["exponential"]
    initial: Annotated[Duration, in_range(1, limits.MAX_INVISIBLE_MS, duration=True)] = (
        limits.EXPONENTIAL_INITIAL_MS
    )
    max: Annotated[Duration, in_range(1, limits.MAX_INVISIBLE_MS, duration=True)] = (
        limits.EXPONENTIAL_MAX_MS
    )
    multiplier: Annotated[float, in_range(1.0, 100.0)] = limits.EXPONENTIAL_MULTIPLIER

    @model_validator(mode="after")
    def _ordered(self) -> ExponentialPolicy:
        if self.max < self.initial:
            raise ValueError(f"max ({format_duration(self.max)}) must be >= initial")
        return self


class CustomizedPolicy(_Model):
    """RocketMQ 5 CustomizedRetryPolicy: retry n waits ``intervals[min(n, len) - 1]``;
    without ``intervals``, the group's deployment's list (docs/flavors.md)."""

    kind: Literal["customized"]
    intervals: (
        Annotated[
            tuple[Annotated[Duration, in_range(0, limits.MAX_INVISIBLE_MS, duration=True)], ...],
            Field(min_length=1, max_length=limits.MAX_CUSTOM_INTERVALS),
        ]
        | None
    ) = None


class GrpcClientPolicy(_Model):
    """The open-source gRPC clients' default: the 18 levels indexed from 1 s."""

    kind: Literal["grpc_client"]


class SqsPolicy(_Model):
    """AWS SQS: visibility timeout and a redrive policy's ``maxReceiveCount``."""

    kind: Literal["sqs"]
    visibility_timeout: Annotated[
        Duration, in_range(0, limits.SQS_MAX_VISIBILITY_MS, duration=True)
    ] = limits.SQS_DEFAULT_VISIBILITY_MS
    max_receive_count: Annotated[StrictInt, in_range(1, limits.SQS_MAX_RECEIVE)] = (
        limits.SQS_DEFAULT_MAX_RECEIVE
    )


class PubsubPolicy(_Model):
    """Google Pub/Sub: exponential retry backoff, dead-letter policy, ack deadline."""

    kind: Literal["pubsub"]
    minimum_backoff: Annotated[
        Duration, in_range(0, limits.PUBSUB_BACKOFF_LIMIT_MS, duration=True)
    ] = limits.PUBSUB_MIN_BACKOFF_MS
    maximum_backoff: Annotated[
        Duration, in_range(0, limits.PUBSUB_BACKOFF_LIMIT_MS, duration=True)
    ] = limits.PUBSUB_MAX_BACKOFF_MS
    max_delivery_attempts: Annotated[
        StrictInt, in_range(limits.PUBSUB_MIN_ATTEMPTS, limits.PUBSUB_MAX_ATTEMPTS)
    ] = limits.PUBSUB_DEFAULT_ATTEMPTS
    ack_deadline: Annotated[
        Duration,
        in_range(
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
class Replay(_Model):
    """DLQ replay what-if (docs/model.md §8): re-send dead letters after a fix."""

    at: NonNegativeDuration
    rate: Annotated[float, BeforeValidator(parse_rate)]
    poison_fixed: bool = True


# --------------------------------------------------------------------------- groups


class Group(_Model):
    """One consumer group: what it consumes, how it retries, how its listener behaves.

    Flavor-specific keys (docs/flavors.md) are checked against the flavor once the group is
    parsed, so ``suspend_current_queue_time`` on a concurrent consumer is an error, not a
    silently ignored line.
    """

    name: Annotated[str, Field(pattern=r"^[%|a-zA-Z0-9_-]{1,255}$")]
    flavor: Annotated[str, AfterValidator(flavors.known)]
    topic: Annotated[str, Field(pattern=r"^[%|a-zA-Z0-9_-]{1,127}$")] | None = None
    ordered: bool = False
    max_reconsume_times: Annotated[StrictInt, in_range(-1, limits.MAX_RECONSUME_TIMES_4X)] = -1
    delay_level_when_next_consume: Annotated[StrictInt, in_range(-1, None)] = 0
    consume_timeout: Annotated[Duration, in_range(1_000, 24 * 3_600_000, duration=True)] | None = (
        None
    )
    consume_timeout_check: Literal["exact", "periodic"] = "periodic"
    client_version: ClientVersion = limits.DEFAULT_CLIENT_VERSION
    deployment: Literal["apache", "apsaramq"] = limits.DEFAULT_DEPLOYMENT
    dlq_enabled: bool = True
    suspend_current_queue_time: Annotated[
        Duration, in_range(limits.MIN_SUSPEND_MS, limits.MAX_SUSPEND_MS, duration=True)
    ] = limits.DEFAULT_SUSPEND_MS
    invisible_duration: Annotated[
        Duration, in_range(limits.MIN_INVISIBLE_MS, limits.MAX_INVISIBLE_MS, duration=True)
    ] = limits.DEFAULT_INVISIBLE_MS
    retry_policy: RetryPolicy | None = None
    consume_message_batch_max_size: Annotated[StrictInt, in_range(1, limits.MAX_CONSUME_BATCH)] = 1
    ack_index: Annotated[StrictInt, in_range(0, limits.MAX_CONSUME_BATCH - 1)] | None = None
    pull_interval: Annotated[Duration, in_range(0, limits.HOUR_MS, duration=True)] = 0
    pull_threshold_for_queue: Annotated[
        StrictInt, in_range(1, limits.MAX_PULL_THRESHOLD_FOR_QUEUE)
    ] = limits.DEFAULT_PULL_THRESHOLD_FOR_QUEUE
    max_cache_message_count: Annotated[
        StrictInt, in_range(1, limits.MAX_MAX_CACHE_MESSAGE_COUNT)
    ] = limits.DEFAULT_MAX_CACHE_MESSAGE_COUNT
    brokers: Annotated[StrictInt, in_range(1, limits.MAX_BROKERS)] = limits.DEFAULT_BROKERS
    retry_queue_nums: Annotated[StrictInt, in_range(1, limits.MAX_RETRY_QUEUE_NUMS)] = (
        limits.DEFAULT_RETRY_QUEUE_NUMS
    )
    allocate: Literal["averagely", "averagely_by_circle"] = "averagely"
    consumers: ConsumersField = Consumers()
    workload: Workload = Workload()
    behavior: Behavior = Behavior()
    replay: Replay | None = None

    @property
    def source_topic(self) -> str:
        return self.topic or self.name

    @property
    def flavor_record(self) -> flavors.Flavor:
        """The flavor's record in force: an ``ordered: true`` rocketmq5.push group's is the
        ordered variant."""
        return flavors.get(self.flavor).variant(self.ordered)

    @property
    def blocking(self) -> bool:
        """Ordered consumption: one message of a queue at a time (head-of-line blocking)."""
        return self.flavor_record.blocking

    @property
    def policy_kind(self) -> str | None:
        """The retry_policy kind in force (the flavor's default when none is given)."""
        if self.retry_policy is not None:
            return self.retry_policy.kind
        return flavors.get(self.flavor).default_policy_kind

    @model_validator(mode="after")
    def _flavor_rules(self, info: ValidationInfo) -> Group:
        if is_stored(info):
            return self
        flavor = flavors.get(self.flavor)
        given = self.model_fields_set | {
            f"behavior.{key}" for key in self.behavior.model_fields_set
        }
        for key in flavors.FLAVOR_KEYS:
            if key in given and key not in flavor.reads_any:
                if key == "consume_timeout" and flavor.timeout_key is not None:
                    raise FieldRuleError(
                        key, f"does not apply to {flavor.name}; its timeout is {flavor.timeout_key}"
                    )
                readers = " and ".join(flavors.readers(key))
                raise FieldRuleError(key, f"applies only to {readers}, not to {flavor.name}")
        record = self.flavor_record
        for key in sorted(given & flavor.reads_any - record.reads):
            raise FieldRuleError(key, f"applies to {flavor.name} only with ordered: true")
        self._check_retry_policy(record)
        self._check_max_retries(flavor)
        if self.replay is not None and (not self.dlq_enabled or not flavor.has_dlq):
            raise FieldRuleError("replay", "needs a dead-letter queue (dlq_enabled: true)")
        downstream = self.behavior.downstream
        shared = downstream is not None and downstream.shared
        if shared and record.balancing == flavors.BROADCAST and self.consumers.instances > 1:
            raise FieldRuleError(
                "behavior.downstream.per",
                f"value 'group': {flavor.name} follows one instance (each consumes every "
                f"message), so the calls of its {self.consumers.instances} instances at a "
                "shared downstream are not simulated; use per: instance (each instance's own) "
                "or 1 instance",
            )
        if self.workload.queues % self.brokers:
            raise FieldRuleError(
                "brokers",
                f"value {self.brokers}: workload.queues ({self.workload.queues}) must be a "
                "multiple of brokers (every broker holds the same number of the topic's queues)",
            )
        return self

    def _check_retry_policy(self, record: flavors.Flavor) -> None:
        allowed = record.policy_kinds
        if self.retry_policy is not None and self.retry_policy.kind not in allowed:
            kinds = f"allowed kinds: {', '.join(allowed)}" if allowed else "it takes none"
            raise FieldRuleError(
                "retry_policy",
                f"kind {self.retry_policy.kind!r} does not apply to {record.label}; {kinds}",
            )

    def _check_max_retries(self, flavor: flavors.Flavor) -> None:
        if "max_reconsume_times" not in self.model_fields_set or self.max_reconsume_times == -1:
            return
        if flavor.fixed_max_retries is not None:
            raise FieldRuleError(
                "max_reconsume_times",
                f"value {self.max_reconsume_times}: must stay -1 for {flavor.name}; "
                f"{flavor.fixed_max_retries}",
            )
        if self.max_reconsume_times > flavor.max_retries_limit:
            raise FieldRuleError(
                "max_reconsume_times",
                f"value {self.max_reconsume_times}: must be between -1 and "
                f"{flavor.max_retries_limit:,} for {flavor.name} (the 5.x maximum)",
            )


class Broker(_Model):
    message_delay_level: DelayLevels = parse_delay_levels(limits.DEFAULT_MESSAGE_DELAY_LEVEL)


def _timestamp(value: Any) -> dt.datetime:
    """An ISO 8601 date and time (text; a number is no timestamp here) on UTC: a timestamp
    without a zone is UTC, as metrics systems export them; a date alone is its midnight."""
    expected = "expected an ISO 8601 date and time such as 2026-11-27T08:00:00Z"
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value.strip())
        except ValueError as error:  # the reason, as Python gives it ('day is out of range')
            reason = str(error).removeprefix("Invalid isoformat string: ")
            raise ValueError(f"{expected} ({reason})" if "range" in reason else expected) from None
    else:
        raise ValueError(expected)
    try:
        if moment.tzinfo is None:
            return moment.replace(tzinfo=dt.UTC)
        return moment.astimezone(dt.UTC)
    except (OverflowError, ValueError):
        raise ValueError(f"{expected}, within years 1-9999 on UTC") from None


StartAt = Annotated[dt.datetime, BeforeValidator(_timestamp)]


def _unique_names(groups: tuple[Group, ...]) -> tuple[Group, ...]:
    names = [group.name for group in groups]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"duplicate group names {duplicates}: each group needs its own name")
    return groups


class Scenario(_Model):
    """A whole scenario file; docs/scenario.md lists every key with its range."""

    name: Annotated[str, Field(min_length=1, max_length=200)] = "scenario"
    seed: Annotated[StrictInt, in_range(0, 2**63 - 1)] = 42
    horizon: Annotated[Duration, in_range(1, limits.MAX_HORIZON_MS, duration=True)] = 6 * 3_600_000
    load_bucket: Annotated[Duration, in_range(100, None, duration=True)] = 60_000
    broker: Broker = Broker()
    groups: Annotated[tuple[Group, ...], Field(min_length=1), AfterValidator(_unique_names)]
    # the real moment simulated time 0 stands for: readers add a clock column beside every
    # time in milliseconds (docs/scenario.md, "start_at")
    start_at: StartAt | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.horizon // self.load_bucket > limits.MAX_LOAD_BUCKETS:
            raise ValueError(
                f"horizon / load_bucket gives {self.horizon // self.load_bucket} buckets; at "
                f"most {limits.MAX_LOAD_BUCKETS} are allowed (use a larger load_bucket)"
            )
        return self
