"""The consumer flavors: one record per flavor, holding everything that differs between them.

A record says which flavor-specific scenario keys the flavor reads, the retry_policy kinds it
takes, whether its ``max_reconsume_times`` is fixed, and its retry rules: the fields of its
:class:`retrysim.model.policy.Policy`, each rule with its source in docs/flavors.md. Adding a
flavor is one record in :data:`CATALOGUE`, its tests and its row in docs/flavors.md.

Interval tables are indexed by retry number ``n = reconsume_times + 1``:
``intervals_ms[min(n, len) - 1]``, so a table's last entry repeats (RocketMQ clamps a level
past the end of its delay table the same way).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from retrysim.model.states import (
    BROADCAST,
    BY_MESSAGE,
    BY_QUEUE,
    LOCAL,
    NO_RETRY,
    REVIVE,
    SCHEDULE,
    VISIBLE,
)
from retrysim.scenario import limits
from retrysim.scenario.units import parse_delay_levels


class _Behavior(Protocol):
    send_back_fallback_probability: float


class Group(Protocol):
    """What a flavor's rules read of a scenario's group (``retrysim.scenario.spec.Group``
    has it all): the scenario validates a group against the flavors, so the flavors name
    what they read instead of importing the scenario."""

    max_reconsume_times: int
    delay_level_when_next_consume: int
    consume_timeout: int | None
    suspend_current_queue_time: int
    invisible_duration: int
    pull_threshold_for_queue: int
    max_cache_message_count: int
    retry_policy: Any  # the scenario's RetryPolicy, or None
    behavior: _Behavior

    @property
    def policy_kind(self) -> str | None: ...


Rules = Callable[[Group, tuple[int, ...]], dict[str, object]]

# The scenario keys that only some flavors read, in the order their errors are reported;
# a key a flavor does not read is an error, not a silently ignored line.
FLAVOR_KEYS = (
    "delay_level_when_next_consume",
    "consume_timeout_check",
    "client_version",
    "consume_message_batch_max_size",
    "ack_index",
    "pull_interval",
    "pull_threshold_for_queue",
    "max_cache_message_count",
    "suspend_current_queue_time",
    "invisible_duration",
    "ordered",
    "consume_timeout",
    "deployment",
    "behavior.send_back_failure_probability",
    "behavior.send_back_fallback_probability",
)


@dataclass(frozen=True)
class Flavor:
    """One consumer flavor: what a scenario may set for it and how it retries."""

    name: str
    rules: Rules
    # flavor-specific keys (FLAVOR_KEYS) it reads
    reads: frozenset[str] = frozenset()
    # where its consume timeout is set when consume_timeout does not apply
    timeout_key: str | None = None
    # retry_policy kinds it takes, and the kind in force when none is given
    policy_kinds: tuple[str, ...] = ()
    default_policy_kind: str | None = None
    # why max_reconsume_times must stay -1 (None: it can be set, up to max_retries_limit)
    fixed_max_retries: str | None = None
    max_retries_limit: int = limits.MAX_RECONSUME_TIMES_4X
    # ordered consumption: one message of a queue at a time
    blocking: bool = False
    # how deliveries are spread over the instances (retrysim.model.topology)
    balancing: str = BY_MESSAGE
    # the broker's delay-level table times what it puts in SCHEDULE_TOPIC_XXXX
    uses_delay_table: bool = False
    # whether a dead-letter queue exists (DLQ replay needs one)
    has_dlq: bool = True
    # the record an ``ordered: true`` group takes instead, and how errors name it
    ordered: Flavor | None = None
    label: str = ""
    # the real-broker harness (jvm/<module>) that runs it for conformance, if one does
    harness: str | None = None
    # every key the flavor or its ordered variant reads
    reads_any: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        extra = self.ordered.reads if self.ordered else frozenset()
        object.__setattr__(self, "reads_any", self.reads | extra)
        object.__setattr__(self, "label", self.label or self.name)

    def variant(self, ordered: bool) -> Flavor:
        """The record in force for a group with ``ordered`` set as given."""
        return self.ordered if ordered and self.ordered is not None else self


# --------------------------------------------------------------------------- retry rules


def delay_table_levels(delay_table_ms: tuple[int, ...], first_level: int) -> tuple[int, ...]:
    """4.x broker levels of retries 1, 2, ...: ``first_level + rt``, clamped to the table."""
    last = len(delay_table_ms)
    return tuple(min(level, last) for level in range(first_level, max(first_level, last) + 1))


def exponential_intervals(initial: int, cap: int, multiplier: float, retries: int) -> tuple:
    """``min(cap, round_half_up(initial * multiplier^(n-1)))`` until it reaches the cap."""
    values: list[int] = []
    for n in range(1, retries + 2):
        value = min(cap, math.floor(initial * multiplier ** (n - 1) + 0.5))
        values.append(value)
        if value >= cap:
            break
    return tuple(values)


def retries_of(group: Group, default: int) -> int:
    """The group's max_reconsume_times, or the flavor's default for -1."""
    return default if group.max_reconsume_times == -1 else group.max_reconsume_times


def policy_fields(**overrides: object) -> dict[str, object]:
    """A rules function's result: the flavor's Policy fields over the common defaults."""
    base: dict[str, object] = {
        "levels": None,
        "from_start": False,
        "leave_after_backoff": True,
        "timeout_level": None,
        "timeout_interval_ms": None,
        "dlq_now": False,
        "null_dead_letters": False,
        "invisible_until_retry": False,
        "resend_levels": None,
        "resend_intervals_ms": None,
        "receive_invisible_ms": None,
        "revive_lag_ms": 0,
        "pull_threshold": None,
        "pop_cache": None,
        "pops_per_thread": False,
    }
    base.update(overrides)
    return base


def _concurrently(group: Group, table: tuple[int, ...]) -> dict[str, object]:
    asked = group.delay_level_when_next_consume
    levels = delay_table_levels(table, limits.BROKER_FIRST_RETRY_LEVEL)
    if asked > 0:
        levels = (min(asked, len(table)),)
    timeout_level = min(limits.TIMEOUT_SEND_BACK_LEVEL, len(table))
    falls_back = group.behavior.send_back_fallback_probability > 0
    return policy_fields(
        retry_path=SCHEDULE,
        max_retries=retries_of(group, limits.DEFAULT_MAX_RECONSUME_TIMES_CONCURRENT),
        intervals_ms=tuple(table[level - 1] for level in levels),
        levels=levels,
        leave_after_backoff=False,
        timeout_ms=group.consume_timeout or limits.DEFAULT_CONSUME_TIMEOUT_4X_MS,
        timeout_level=timeout_level,
        timeout_interval_ms=table[timeout_level - 1],
        dlq_now=asked < 0,
        pull_threshold=group.pull_threshold_for_queue,
        **(_resends(table) if falls_back else {}),
    )


def _resends(table: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """A 4.x client's plain send to %RETRY%<group> (the concurrent producer fallback, the
    orderly send of an exhausted message) carries DELAY = 3 + reconsumeTimes, whatever
    delayLevelWhenNextConsume asked."""
    levels = delay_table_levels(table, limits.BROKER_FIRST_RETRY_LEVEL)
    return {
        "resend_levels": levels,
        "resend_intervals_ms": tuple(table[level - 1] for level in levels),
    }


def _orderly(group: Group, table: tuple[int, ...]) -> dict[str, object]:
    return policy_fields(
        retry_path=LOCAL,
        max_retries=retries_of(group, limits.INTEGER_MAX_VALUE),
        intervals_ms=(group.suspend_current_queue_time,),
        leave_after_backoff=False,
        timeout_ms=None,
        **_resends(table),
    )


def _broadcasting(group: Group, table: tuple[int, ...]) -> dict[str, object]:
    timeout_level = min(limits.TIMEOUT_SEND_BACK_LEVEL, len(table))
    return policy_fields(
        retry_path=NO_RETRY,
        max_retries=0,
        intervals_ms=(0,),
        leave_after_backoff=False,
        timeout_ms=group.consume_timeout or limits.DEFAULT_CONSUME_TIMEOUT_4X_MS,
        # cleanExpiredMsg sends an expired message back, to a retry topic nobody reads
        timeout_level=timeout_level,
        timeout_interval_ms=table[timeout_level - 1],
        pull_threshold=group.pull_threshold_for_queue,
    )


def _http(interval_ms: int):
    def rules(group: Group, _table: tuple[int, ...]) -> dict[str, object]:
        return policy_fields(
            retry_path=VISIBLE,
            max_retries=limits.HTTP_MAX_RETRIES,
            intervals_ms=(interval_ms,),
            timeout_ms=group.consume_timeout or interval_ms,
        )

    return rules


def _five_intervals(group: Group, default: str) -> tuple[int, ...]:
    """The retry intervals of a 5.x group's retry policy; ``default`` without one."""
    policy = group.retry_policy
    kind = group.policy_kind
    max_retries = retries_of(group, limits.DEFAULT_MAX_RETRIES_5X)
    if kind == "exponential":
        initial = policy.initial if policy else limits.EXPONENTIAL_INITIAL_MS
        cap = policy.max if policy else limits.EXPONENTIAL_MAX_MS
        multiplier = policy.multiplier if policy else limits.EXPONENTIAL_MULTIPLIER
        return exponential_intervals(initial, cap, multiplier, max_retries)
    if kind == "customized" and policy is not None and policy.intervals is not None:
        return tuple(policy.intervals)
    if kind == "grpc_client":
        return parse_delay_levels(limits.GRPC_CLIENT_INTERVALS)
    return parse_delay_levels(default)


def _five_defaults(group: Group) -> dict[str, object]:
    """What a 5.x push group's deployment decides when the scenario does not: open-source
    Apache RocketMQ's client indexes the group's list from its first entry (1 s, 5 s, ...)
    and never times a listener out, the proxy renewing its 60 s invisibility up to 3 h;
    ApsaraMQ's document gives 10 s, 30 s, ... and a 1-minute consume timeout
    (docs/flavors.md, deployments)."""
    if group.deployment == "apsaramq":
        return {
            "intervals": limits.APSARAMQ_PUSH_INTERVALS,
            "timeout_ms": limits.DEFAULT_CONSUME_TIMEOUT_5X_MS,
            "receive_invisible_ms": None,
        }
    return {"intervals": limits.GRPC_CLIENT_INTERVALS,
            "timeout_ms": limits.apache_renewal_stop_ms(),
            "receive_invisible_ms": limits.APACHE_POP_INVISIBLE_MS}  # fmt: skip


def _revive_lag(group: Group) -> int:
    """How long after a retry is due the deployment's reviver writes it: the open-source
    broker's ``PopReviveService`` (limits.APACHE_REVIVE_LAG_MS, measured on 5.5.0); none
    for ApsaraMQ, whose service documents its intervals as the delays."""
    return limits.APACHE_REVIVE_LAG_MS if group.deployment == "apache" else 0


def _push(group: Group, _table: tuple[int, ...]) -> dict[str, object]:
    defaults = _five_defaults(group)
    return policy_fields(
        retry_path=REVIVE,
        max_retries=retries_of(group, limits.DEFAULT_MAX_RETRIES_5X),
        intervals_ms=_five_intervals(group, default=defaults["intervals"]),
        timeout_ms=group.consume_timeout or defaults["timeout_ms"],
        receive_invisible_ms=defaults["receive_invisible_ms"],
        revive_lag_ms=_revive_lag(group),
        pop_cache=group.max_cache_message_count,
    )


def _push_ordered(group: Group, _table: tuple[int, ...]) -> dict[str, object]:
    """FIFO: the client redelivers locally after its retry policy's next attempt delay
    (``ProcessQueueImpl.eraseFifoMessage``), indexed from the policy's first entry; the
    server's default policy is ``CustomizedRetryPolicy``'s list 1 s, 5 s, 10 s, ...; a null
    result is not a failure, so the client dead-letters it at once (rocketmq-clients
    java-5.2.0 ``ProcessQueueImpl.eraseFifoMessage`` lines 527-543)."""
    return policy_fields(
        retry_path=LOCAL,
        null_dead_letters=True,
        max_retries=retries_of(group, limits.DEFAULT_MAX_RETRIES_5X),
        intervals_ms=_five_intervals(group, default=limits.GRPC_CLIENT_INTERVALS),
        leave_after_backoff=False,
        timeout_ms=group.consume_timeout or _five_defaults(group)["timeout_ms"],
    )


def _simple(group: Group, _table: tuple[int, ...]) -> dict[str, object]:
    """A message not acknowledged stays invisible (Inflight, the 5.x seed's states: no
    WaitingRetry in simple mode) until its invisible duration ends, then the broker revives
    it as Ready, or moves it to the DLQ."""
    return policy_fields(
        retry_path=REVIVE,
        max_retries=retries_of(group, limits.DEFAULT_MAX_RETRIES_5X),
        intervals_ms=(group.invisible_duration,),
        from_start=True,
        leave_after_backoff=False,
        invisible_until_retry=True,
        pops_per_thread=True,
        timeout_ms=group.invisible_duration,
        revive_lag_ms=_revive_lag(group),
    )


def _sqs(group: Group, _table: tuple[int, ...]) -> dict[str, object]:
    policy = group.retry_policy
    visibility = policy.visibility_timeout if policy else limits.SQS_DEFAULT_VISIBILITY_MS
    receives = policy.max_receive_count if policy else limits.SQS_DEFAULT_MAX_RECEIVE
    return policy_fields(
        retry_path=VISIBLE,
        max_retries=receives - 1,
        intervals_ms=(visibility,),
        from_start=True,
        timeout_ms=visibility,
    )


def _pubsub(group: Group, _table: tuple[int, ...]) -> dict[str, object]:
    policy = group.retry_policy
    low = policy.minimum_backoff if policy else limits.PUBSUB_MIN_BACKOFF_MS
    high = policy.maximum_backoff if policy else limits.PUBSUB_MAX_BACKOFF_MS
    attempts = policy.max_delivery_attempts if policy else limits.PUBSUB_DEFAULT_ATTEMPTS
    deadline = policy.ack_deadline if policy else limits.PUBSUB_DEFAULT_ACK_DEADLINE_MS
    return policy_fields(
        retry_path=VISIBLE,
        max_retries=attempts - 1,
        intervals_ms=exponential_intervals(low, high, 2.0, attempts) if low else (0,),
        timeout_ms=deadline,
    )


# --------------------------------------------------------------------------- the catalogue

_HTTP_FIXED = "HTTP consumers retry a fixed 288 times (not configurable)"
_5X = {"max_retries_limit": limits.MAX_RETRIES_5X}
_PUSH_READS = frozenset({"ordered", "consume_timeout", "deployment"})

CATALOGUE: tuple[Flavor, ...] = (
    Flavor(
        "rocketmq4.concurrently",
        _concurrently,
        reads=frozenset(
            {
                "delay_level_when_next_consume",
                "consume_timeout_check",
                "client_version",
                "consume_message_batch_max_size",
                "ack_index",
                "pull_interval",
                "pull_threshold_for_queue",
                "consume_timeout",
                "behavior.send_back_failure_probability",
                "behavior.send_back_fallback_probability",
            }
        ),
        uses_delay_table=True,
        balancing=BY_QUEUE,
        harness="broker4",
    ),
    Flavor(
        "rocketmq4.orderly",
        _orderly,
        reads=frozenset({"suspend_current_queue_time"}),
        timeout_key="none: the orderly service never expires a message",
        harness="broker4",
        blocking=True,
        uses_delay_table=True,  # an exhausted message's dead letter waits in it (4.9.7)
        balancing=BY_QUEUE,
    ),
    Flavor(
        "rocketmq4.broadcasting",
        _broadcasting,
        reads=frozenset({"consume_timeout_check", "consume_timeout", "pull_threshold_for_queue"}),
        fixed_max_retries="broadcasting consumption never retries",
        uses_delay_table=True,  # an expired message waits in it (level 3)
        has_dlq=False,
        balancing=BROADCAST,
        harness="broker4",
    ),
    Flavor(
        "http.unordered",
        _http(limits.HTTP_UNORDERED_INTERVAL_MS),
        reads=frozenset({"consume_timeout"}),
        fixed_max_retries=_HTTP_FIXED,
    ),
    Flavor(
        "http.ordered",
        _http(limits.HTTP_ORDERED_INTERVAL_MS),
        reads=frozenset({"consume_timeout"}),
        fixed_max_retries=_HTTP_FIXED,
        blocking=True,
    ),
    Flavor(
        "rocketmq5.push",
        _push,
        reads=_PUSH_READS | {"max_cache_message_count"},
        policy_kinds=("exponential", "customized", "grpc_client"),
        ordered=Flavor(
            "rocketmq5.push",
            _push_ordered,
            reads=_PUSH_READS,
            policy_kinds=("exponential", "customized", "grpc_client"),
            blocking=True,
            label="ordered rocketmq5.push",
            harness="broker5",
            **_5X,
        ),
        harness="broker5",
        **_5X,
    ),
    Flavor(
        "rocketmq5.simple",
        _simple,
        reads=frozenset({"invisible_duration", "deployment"}),
        timeout_key="invisible_duration",
        harness="broker5",
        **_5X,
    ),
    Flavor(
        "exponential",
        _push,
        reads=frozenset({"consume_timeout", "deployment", "max_cache_message_count"}),
        policy_kinds=("exponential",),
        default_policy_kind="exponential",
        **_5X,
    ),
    Flavor(
        "customized",
        _push,
        reads=frozenset({"consume_timeout", "deployment", "max_cache_message_count"}),
        policy_kinds=("customized",),
        default_policy_kind="customized",
        **_5X,
    ),
    Flavor(
        "sqs",
        _sqs,
        timeout_key="retry_policy.visibility_timeout",
        policy_kinds=("sqs",),
        default_policy_kind="sqs",
        fixed_max_retries="set retry_policy.max_receive_count instead",
    ),
    Flavor(
        "pubsub",
        _pubsub,
        timeout_key="retry_policy.ack_deadline",
        policy_kinds=("pubsub",),
        default_policy_kind="pubsub",
        fixed_max_retries="set retry_policy.max_delivery_attempts instead",
    ),
)
NAMES = tuple(flavor.name for flavor in CATALOGUE)


def get(name: str) -> Flavor:
    """The record of a flavor named in a validated scenario."""
    return next(flavor for flavor in CATALOGUE if flavor.name == name)


def known(name: str) -> str:
    """A pydantic validator: the flavor exists, else an error that suggests the closest."""
    names = [flavor.name for flavor in CATALOGUE]
    if name not in names:
        guess = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        raise ValueError(f"unknown flavor; {hint}allowed: {', '.join(names)}")
    return name


def readers(key: str) -> list[str]:
    """The flavors that read a flavor-specific key, for the error that names them."""
    return [flavor.name for flavor in CATALOGUE if key in flavor.reads_any]
