"""Independent reference simulator of retrysim: every flavor, event by event, in plain Python.

Written from docs/model.md and docs/flavors.md (and the documents they cite), never from
the engine's code; the one piece of engine code used is ``retrysim.model.rng.uniform_np``, the
hash-based uniform draws (checked against Spark elsewhere). Everything else -- duration and
delay-table parsing, defaults, the listener model, the retry policies and the dispatch of
deliveries to consumer threads -- is re-derived here, so the engine can be checked against it
row by row. Where a rule can be checked against RocketMQ itself, the reference takes it from
ports of the source, not from the docs: the 4.x topology from ``rebalance.py`` and the 4.x
send-back, orderly dead letter and expired-message rules from ``source_rules.py`` (both
method by method from apache/rocketmq), so a rule the docs got wrong fails the comparison.

Usage::

    from tests.reference.simulator import simulate_scenario

    tables = simulate_scenario(yaml.safe_load(text))
    tables["messages"], tables["attempts"], tables["transitions"]

Each group is simulated on its own as a discrete-event simulation (model.md §5) with a
``heapq`` of events keyed by ``(time_ms, phase, counter)``. At one millisecond ``t`` the
simulator runs *passes* until nothing is left at ``t``: (1) phase-0 events -- threads freed,
deliveries ending (which settles messages, releases blocking lanes and schedules retries),
retries and publications becoming Ready, after-backoff leaves, the replay; then the 4.x
expired-message cleaner's run at ``t``, if one is due (after every phase-0 event of the
pass, so a listener that returns at ``t`` has left its process queue); then lane heads
are (re)chosen for blocking lanes; (2) phase-1 events -- deliveries becoming eligible;
(3) dispatch: while a thread is free, start the waiting delivery with the smallest
``(eligible_ms, msg_id, delivery)`` (plus up to ``N - 1`` more of its lane for batches).
Whatever a dispatch creates at ``t`` itself (a zero processing time, a zero delay) is
handled by the next pass of the same millisecond.

Interpretations (where the docs are silent or ambiguous, the reading chosen here):

 1. Which deliveries get an attempts row: every delivery whose Ready moment is before the
    horizon (model.md §9, "one per delivery that became Ready before the horizon"), even when
    it would only become *eligible* at or after the horizon (``ready_wait``, ``pull_interval``)
    or is never eligible because its blocking lane stays blocked (§7 says "eligible before the
    horizon"; flavors test expectations say blocked messages are Ready rows).
 2. The messages table lists all N published messages of a group, also those with
    ``born_ms >= horizon`` (which are never delivered). A replayed message keeps its single
    messages row (original queue and born_ms).
 3. ``batch_size`` is set from dispatch on, so an Inflight row keeps it; a Ready row has it
    null. (§9's "Inflight: everything after processing_ms is null" read literally would also
    null ``batch_size``, which is known at dispatch.)
 4. An after-backoff leave: the attempts row has ``next_ready_ms`` null (it is not a retry);
    ``result_state`` is DLQ/Discard with ``settled_ms`` = the leave moment, or WaitingRetry
    with ``settled_ms`` null when the leave is at or after the horizon. A retry due at or after
    the horizon keeps its ``next_ready_ms`` (and ``delay_level`` for 4.x).
 5. 4.x consume timeout: the expired-message cleaner sends back at the fixed level 3 (clamped
    to the table), whatever ``delay_level_when_next_consume`` is -- so a timeout with
    ``delay_level_when_next_consume: -1`` is retried at level 3, not dead-lettered (unless
    ``rt >= M``). ``consume_timeout_check: periodic`` applies to the 4.x flavors with a
    timeout (concurrently, broadcasting); every other flavor checks exactly (TIMEOUT at
    ``start + T`` when the processing is longer). Periodic is the 4.9.7 cleaner itself
    (``source_rules.clean_expired_msg_sweep``, ``ProcessQueue.cleanExpiredMsg``): it runs at
    ``k * T`` (k = 1, 2, ... before the horizon) on every process queue, a lane ``(topic,
    queue)``, whose deliveries are those pulled (accepted into the instance's waiting order,
    or released from the pull threshold's hold) whose listener has not returned and which
    were not cleaned. Each run sends back at most 16 of a process queue, head first, while
    the head started more than ``T`` ago; a head not started or not expired ends the run. A
    cleaned delivery ends at the run (TIMEOUT, level 3); its listener runs on and holds its
    thread until ``start + processing``, and its return does nothing (the 5.1.0+ client's
    ``processConsumeResult`` skips what the process queue lost). A delivery not cleaned
    ends with its listener's result at ``start + processing``; one whose listener returns at
    the run's moment itself is not cleaned. The queue offset a process queue is ordered by
    is the order the consume service takes its deliveries, ``(entered_ms, msg_id,
    delivery)`` (dispatch_on), so a queue's deliveries start in offset order and the sweep
    equals the per-delivery rule (TIMEOUT at the first ``k * T > start + T``, if the
    listener returns after it) except where more than 16 of one queue are expired at one
    run: the rest wait for a later run, or commit or fail by their listener's return if it
    comes first. The cleaner's removal does not free room under ``pull_threshold_for_queue``
    here: a delivery leaves the pull threshold's count when its listener returns, as for
    the exact check.
 6. The send-back draw (concurrently only: ``send_back_failure_probability`` and
    ``send_back_fallback_probability``) applies to every member the consume service sends
    back -- failures and ``beyond_ack_index`` members, not timeouts (the model takes the
    expired-message cleaner's send-back to succeed; source_rules.clean_expired_msg says
    why) -- and source_rules.py decides the rest: a failed send-back is a local retry
    (reason ``send_back_failed``) even when ``rt >= M`` or the level is negative.
 7. Reason precedence when both hold: ``max_reconsume_times`` over ``delay_level_negative``.
 8. Batches (``consume_message_batch_max_size > 1``, ``ack_index``) only for
    ``rocketmq4.concurrently`` (model.md §4); other flavors dispatch one delivery per request.
    ``ack_index`` is clamped to ``size - 1`` (RocketMQ); a negative value sends every member
    back.
 9. ``pull_interval`` applies to non-blocking flavors only (model.md §5 lists it there);
    blocking lanes use ``ready_wait`` and the release only.
10. Blocking lanes: the lane order is publish order ``(ready_ms, msg_id)`` of first
    deliveries; a replayed delivery is a new publication and joins the lane it is replayed
    to. "Local retries" of the head (``ready_ms + ready_wait``) means every later delivery of
    the head message, including ``http.ordered``'s ``visible_again`` redeliveries. A lane is
    released at the head's ``settled_ms`` (for ``http.ordered`` after its final backoff).
11. Consume timeouts: ``rocketmq5.push`` (also ``ordered: true``) and the ``exponential``/
    ``customized`` flavors use ``consume_timeout`` when given, else 1 min; ``http.unordered``
    5 min, ``http.ordered`` 1 min, 4.x 15 min; ``rocketmq5.simple`` uses
    ``invisible_duration``, ``sqs`` ``visibility_timeout``, ``pubsub`` ``ack_deadline``
    (``consume_timeout`` ignored for those three); ``rocketmq4.orderly`` has none.
12. ``retry_policy: {kind: grpc_client}`` indexes the fixed CustomizedRetryPolicy list
    ``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h`` (the broker's default
    policy), not ``broker.message_delay_level``: interval of retry n = ``list[min(n, 18) - 1]``.
13. ``exponential``: ``initial * multiplier^(n-1)`` computed exactly for an integer
    multiplier, else as a float (an overflow counts as infinite), then ``min`` with ``max``
    and rounded half up to whole ms. ``pubsub`` uses exact integer doubling.
14. ``max_reconsume_times`` is ignored by ``http.*`` (fixed 288), ``sqs``
    (``max_receive_count - 1``), ``pubsub`` (``max_delivery_attempts - 1``) and
    ``rocketmq4.broadcasting``; ``-1`` means 16 for concurrently and the 5.x flavors and
    infinite for ``rocketmq4.orderly``. The orderly suspend time is clamped to 10-30000 ms
    (RocketMQ). ``rocketmq5.push`` ordered retries locally after its retry policy's interval
    of retry n (``retry_policy`` as for the push interval; none: the ``grpc_client`` list).
15. Flavor names ``exponential`` and ``customized`` are accepted as ``rocketmq5.push`` with
    that retry policy (parameters from ``retry_policy``, defaults when absent); a
    ``retry_policy`` on ``rocketmq5.push`` selects the push interval rule.
16. ``fail_first`` compares the delivery number ``d`` (which keeps counting after a replay),
    as model.md §3 writes it. ``poison_fixed`` stops poison from failing deliveries created
    by the replay.
17. ``outcome_mix`` keys default one by one (``reconsume_later`` 1.0, the others 0).
18. Durations: ``<number><unit>`` with unit ms, s, m, h or d (decimals allowed, rounded half
    up to ms); a bare number is milliseconds (only 0 is expected). Replay ``rate``:
    ``"<n>/s"``, ``"<n>/m"``, ``"<n>/h"`` or a number per second; ``floor(k * 1000 / rate)``
    is computed exactly with fractions. Missing ``rate`` defaults to 100/s.
19. A group without ``flavor`` is ``rocketmq4.concurrently`` (conf/default.yaml's flavor).
20. Row order: messages by (group order, msg_id), attempts by (group, msg_id, delivery),
    transitions by (group, msg_id, seq).
21. ``behavior.downstream`` (model.md §3): a consume request's load is the requests running
    when it starts, on its instance (``per: instance``) or on every instance (``per:
    group``), plus itself; requests that start in one millisecond count those started
    before them, instances served in ascending order (a zero-time call makes a second pass
    in the same millisecond, which starts from the lowest instance again). Every member of
    a batch is one call at that load. The processing time is scaled exactly (fractions) and
    rounded half up; a shed call fails at once (0 ms).
22. ``behavior.client_overhead`` ``o`` (model.md §3, the client's own time): a decimal number
    of ms (or s), exact as a fraction; every delivery's processing time takes ``floor(o)``
    ms more, after the downstream's, and one ms more where its ``client_time`` draw is below
    ``o - floor(o)``.
23. The 4.x cleaner and a failed send-back (``send_back_failed``, ``local_retry``): the
    client keeps the message in its process queue and resubmits it 5 s later; here its
    listener's return takes it out of the cleaner's process queue and its re-run (the next
    delivery) enters again, as a new entry after those already there (offset ``(entered_ms,
    msg_id, delivery)``), so it is not swept while it waits the 5 s.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from retrysim.model.rng import uniform_np
from tests.reference import rebalance
from tests.reference import source_rules as source

__all__ = ["parse_duration_ms", "simulate_scenario"]

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
# ApsaraMQ 5.x push intervals, retry 1..16 (then 2 h).
APSARA_PUSH_INTERVALS = "10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
# RocketMQ's default CustomizedRetryPolicy list (indexed from its first entry by gRPC clients).
GRPC_CLIENT_INTERVALS = DEFAULT_DELAY_LEVELS
# The open-source 5.x reviver: a checkpoint is revived once the scan has read 2 s
# (ackTimeInterval + SECOND) past its revive time, the scan thread coming round every
# reviveInterval, 1 s (PopReviveService.mergeAndRevive, run); measured 2.0-5.0 s on 5.5.0.
OPEN_SOURCE_REVIVE_LAG = 2_000 + 1_000
Z99 = 2.3263478740408408
SUCCESS = "CONSUME_SUCCESS"
TIMEOUT = "TIMEOUT"
INF = float("inf")

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")


def _half_up(x: float | Fraction) -> int:
    return math.floor(x + Fraction(1, 2)) if isinstance(x, Fraction) else math.floor(x + 0.5)


def parse_duration_ms(value: Any) -> int:
    """``"10s"``, ``"1500ms"``, ``"2h"``, ``0`` -> whole milliseconds (half up)."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _half_up(value)
    m = _DURATION_RE.match(str(value))
    if not m:
        raise ValueError(f"not a duration: {value!r}")
    number = Fraction(m.group(1))
    unit = m.group(2) or "ms"
    return _half_up(number * _UNITS_MS[unit])


def _parse_fine_ms(value: Any) -> Fraction:
    """``"0.47ms"``, ``"1.5ms"``, ``0`` -> exact milliseconds, not rounded."""
    m = _DURATION_RE.match(str(value))
    if not m:
        raise ValueError(f"not a duration: {value!r}")
    return Fraction(m.group(1)) * _UNITS_MS[m.group(2) or "ms"]


def _parse_list(text: str) -> list[int]:
    return [parse_duration_ms(tok) for tok in str(text).split()]


def _parse_rate(value: Any) -> Fraction:
    """Replay rate in messages per second."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Fraction(str(value))
    text = str(value).strip()
    if "/" in text:
        number, unit = text.split("/", 1)
        per = {"s": 1, "m": 60, "h": 3600}[unit.strip()]
        return Fraction(number.strip()) / per
    return Fraction(text)


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class _Dist:
    kind: str  # constant | exponential | lognormal
    mean: int
    p99: int | None = None

    def sample(self, a: float, b: float) -> int:
        if self.mean == 0:
            return 0
        if self.kind == "constant":
            return self.mean
        if self.kind == "exponential":
            return _half_up(-self.mean * math.log(a))
        if self.kind == "lognormal":
            ln_mean = math.log(self.mean)
            sigma = Z99 - math.sqrt(Z99 * Z99 - 2.0 * (math.log(self.p99) - ln_mean))
            mu = ln_mean - sigma * sigma / 2.0
            z = math.sqrt(-2.0 * math.log(a)) * math.cos(2.0 * math.pi * b)
            return _half_up(math.exp(mu + sigma * z))
        raise ValueError(f"unknown processing-time dist {self.kind!r}")


def _traffic_pieces(wl: dict) -> list[tuple[int, int, int]] | None:
    """``arrival: profile``: each piece's (start, length, messages), a rate times its
    length rounded (scenario.md, Workload); None without a profile."""
    if wl.get("arrival") != "profile":
        return None
    pieces, start = [], 0
    for piece in wl["profile"]:
        until = parse_duration_ms(piece["until"])
        length = until - start
        count = (
            int(piece["count"])
            if "count" in piece
            else round(float(piece["per_second"]) * length / 1000)
        )
        pieces.append((start, length, count))
        start = until
    return pieces


def _behavior_pieces(bh: dict) -> list[_Outage]:
    """``behavior.profile``: consecutive windows, each piece's failure chance and processing
    time (the group's where it gives none), listed before the outages (model.md §3)."""
    windows, start = [], 0
    for piece in bh.get("profile") or []:
        until = parse_duration_ms(piece["until"])
        chance = piece.get("fail_probability", bh.get("fail_probability", 0) or 0)
        timing = piece.get("processing_time")
        windows.append(
            _Outage(
                start, until, float(chance), _parse_dist(timing) if timing is not None else None
            )
        )
        start = until
    return windows


def _parse_dist(value: Any) -> _Dist:
    if isinstance(value, dict):
        p99 = value.get("p99")
        return _Dist(
            str(value.get("dist", "constant")),
            parse_duration_ms(value.get("mean", "10ms")),
            None if p99 is None else parse_duration_ms(p99),
        )
    return _Dist("constant", parse_duration_ms(value))


@dataclass(frozen=True)
class _Outage:
    start: int
    end: int
    fail_probability: float
    processing: _Dist | None


@dataclass
class _Group:
    name: str
    topic: str
    seed: int
    horizon: int
    # flavor
    kind: str  # concurrently | broadcasting | after_backoff | local | invisible
    blocking: bool
    max_retries: float  # M; INF for never
    timeout: int | None  # T
    # a 5.x pop's invisible time when it is not T: the open-source proxy's 60 s, renewed
    receive_invisible: int | None
    # how long after its revive time the 5.x reviver writes a retry
    revive_lag: int
    # a 4.x push client's pullThresholdForQueue (None: no such cache)
    pull_threshold: int | None
    # a 5.x push client's maxCacheMessageCount over its one assignment (None: no such cache)
    pop_cache: int | None
    # a 5.x simple consumer: each thread pops one message when it is free
    pops_per_thread: bool
    periodic: bool
    # a 4.x concurrently client before 5.1.0: a delivery the cleaner sent back whose listener
    # then fails is sent back a second time (client_version 4.9)
    late_send_back: bool
    dlq_enabled: bool
    # 4.x concurrently
    levels: list[int]
    next_level: int  # delay_level_when_next_consume
    send_back_p: float
    fallback_p: float
    batch: int
    ack_index: int | None
    # local retries
    suspend: int
    # after-backoff flavors
    path: str  # revive | visible
    from_start: bool
    interval_of: Any  # n -> ms
    # dispatch
    pull: int
    ready_wait: int
    threads: float  # per instance, INF for unlimited
    instances: int
    balancing: str  # queue | message | broadcast
    brokers: int
    retry_queue_nums: int
    allocate: str
    # workload
    n: int
    over: int
    arrival: str
    # a traffic shape (scenario.md, Workload): (start_ms, length_ms, count) per piece
    pieces: list[tuple[int, int, int]] | None
    queues: int
    size_bytes: int
    # behavior
    fail_p: float
    poison_fraction: float
    fail_first: int
    processing: _Dist
    outages: list[_Outage]
    mix: tuple[float, float, float]
    # a downstream that answers to load: (capacity, shared by the instances, timeout, shed)
    downstream: tuple[int, bool, int | None, float] | None
    client_overhead: Fraction  # ms, exact
    # replay
    replay_at: int | None
    replay_rate: Fraction | None
    poison_fixed: bool

    @property
    def retry_topic_4x(self) -> str:
        return "%RETRY%" + self.name

    @property
    def retry_topic_5x(self) -> str:
        return f"%RETRY%{self.name}_{self.topic}"

    @property
    def dlq_topic(self) -> str:
        return "%DLQ%" + self.name


def _table_interval(table: list[int]):
    return lambda n: table[min(n, len(table)) - 1]


def _push_interval(policy: dict | None, listed: str = APSARA_PUSH_INTERVALS):
    """A 5.x push group's retry n interval; ``listed``: the list without a policy's own."""
    kind = (policy or {}).get("kind")
    if kind == "grpc_client":
        return _table_interval(_parse_list(GRPC_CLIENT_INTERVALS))
    if kind == "customized":
        raw = policy.get("intervals")
        table = [parse_duration_ms(x) for x in raw] if raw else _parse_list(listed)
        return _table_interval(table)
    if kind == "exponential":
        initial = parse_duration_ms(policy.get("initial", "5s"))
        maximum = parse_duration_ms(policy.get("max", "2h"))
        mult = policy.get("multiplier", 2)

        def exponential(n: int) -> int:
            if float(mult) == int(mult):
                return min(maximum, initial * int(mult) ** (n - 1))
            try:
                value = initial * float(mult) ** (n - 1)
            except OverflowError:
                value = INF
            return min(maximum, _half_up(min(float(maximum), value)))

        return exponential
    return _table_interval(_parse_list(listed))


def _open_source_renewal_stop() -> int:
    """The open-source proxy pops a push delivery invisible for 60 s and renews it 10 s
    before each end, by 1 m, 3 m, 5 m, 10 m, 30 m, then 1 h each time, until 3 h have
    passed since the receive: the renewal due then nacks it instead."""
    steps = [60_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000]
    end, moment, k = 60_000, 50_000, 0
    while moment < 3 * 3_600_000:
        end = moment + steps[min(k, 5)]
        moment, k = end - 10_000, k + 1
    return moment


def _max_retries(raw: Any, default: float) -> float:
    value = -1 if raw is None else int(raw)
    return default if value == -1 else value


def _group_config(scenario: dict, g: dict) -> _Group:
    horizon = parse_duration_ms(scenario.get("horizon", "6h"))
    broker = scenario.get("broker") or {}
    levels = _parse_list(broker.get("message_delay_level", DEFAULT_DELAY_LEVELS))
    name = str(g["name"])
    flavor = str(g.get("flavor", "rocketmq4.concurrently"))
    policy = g.get("retry_policy") or {}
    ct = g.get("consume_timeout")

    def timeout_or(default: str) -> int:
        return parse_duration_ms(ct if ct is not None else default)

    mrt = g.get("max_reconsume_times", -1)
    suspend_raw = g.get("suspend_current_queue_time")
    suspend = parse_duration_ms(suspend_raw if suspend_raw is not None else "1s")

    kind, blocking, periodic, late = "after_backoff", False, False, False
    receive_invisible, revive_lag = None, 0
    path, from_start, interval_of = "revive", False, None
    max_retries: float = 16
    timeout: int | None = None
    if flavor == "rocketmq4.concurrently":
        kind, max_retries, timeout = "concurrently", _max_retries(mrt, 16), timeout_or("15m")
        periodic = g.get("consume_timeout_check", "periodic") == "periodic"
        late = str(g.get("client_version", "4.9")) == "4.9"
    elif flavor == "rocketmq4.orderly":
        kind, blocking, max_retries = "local", True, _max_retries(mrt, INF)
        suspend = min(30_000, max(10, suspend))
    elif flavor == "rocketmq4.broadcasting":
        kind, timeout = "broadcasting", timeout_or("15m")
        periodic = g.get("consume_timeout_check", "periodic") == "periodic"
    elif flavor in ("http.unordered", "http.ordered"):
        ordered = flavor == "http.ordered"
        blocking, path, max_retries = ordered, "visible", 288
        step = 60_000 if ordered else 300_000
        interval_of = lambda n, step=step: step  # noqa: E731
        timeout = timeout_or("1m" if ordered else "5m")
    elif flavor in ("rocketmq5.push", "exponential", "customized"):
        # ApsaraMQ's document, or the open-source client and proxy (the default)
        apsaramq = g.get("deployment", "apache") == "apsaramq"
        max_retries = _max_retries(mrt, 16)
        timeout = (
            timeout_or("1m")
            if apsaramq
            else (parse_duration_ms(ct) if ct is not None else _open_source_renewal_stop())
        )
        listed = APSARA_PUSH_INTERVALS if apsaramq else GRPC_CLIENT_INTERVALS
        receive_invisible = None if apsaramq else 60_000
        revive_lag = 0 if apsaramq else OPEN_SOURCE_REVIVE_LAG
        if flavor == "rocketmq5.push" and g.get("ordered"):
            kind, blocking = "local", True
            interval_of = _push_interval(policy or {"kind": "grpc_client"}, GRPC_CLIENT_INTERVALS)
        else:
            if flavor != "rocketmq5.push":
                policy = {**policy, "kind": flavor}
            interval_of = _push_interval(policy, listed)
    elif flavor == "rocketmq5.simple":
        inv = parse_duration_ms(g.get("invisible_duration") or "30s")
        max_retries, timeout, from_start = _max_retries(mrt, 16), inv, True
        interval_of = lambda n, inv=inv: inv  # noqa: E731
        kind = "invisible"
        if g.get("deployment", "apache") == "apache":
            revive_lag = OPEN_SOURCE_REVIVE_LAG
    elif flavor == "sqs":
        vt = parse_duration_ms(policy.get("visibility_timeout", "30s"))
        path, from_start, timeout = "visible", True, vt
        max_retries = int(policy.get("max_receive_count", 10)) - 1
        interval_of = lambda n, vt=vt: vt  # noqa: E731
    elif flavor == "pubsub":
        lo = parse_duration_ms(policy.get("minimum_backoff", "10s"))
        hi = parse_duration_ms(policy.get("maximum_backoff", "600s"))
        path, timeout = "visible", parse_duration_ms(policy.get("ack_deadline", "10s"))
        max_retries = int(policy.get("max_delivery_attempts", 5)) - 1
        interval_of = lambda n, lo=lo, hi=hi: min(hi, lo * 2 ** (n - 1))  # noqa: E731
    else:
        raise ValueError(f"unknown flavor {flavor!r}")

    consumers = g.get("consumers", {}) or {}
    if consumers == "unlimited":
        threads: float = INF
        instances = 1
    else:
        threads = int(consumers.get("threads", 20))
        instances = int(consumers.get("instances", 1))
    if kind == "broadcasting":
        balancing = "broadcast"
    elif flavor in ("rocketmq4.concurrently", "rocketmq4.orderly"):
        balancing = "queue"
    else:
        balancing = "message"

    wl = g.get("workload") or {}
    bh = g.get("behavior") or {}
    mix = bh.get("outcome_mix") or {}
    outages = _behavior_pieces(bh) + [
        _Outage(
            parse_duration_ms(o["start"]),
            parse_duration_ms(o["end"]),
            float(o.get("fail_probability", 1.0)),
            _parse_dist(o["processing_time"]) if o.get("processing_time") is not None else None,
        )
        for o in bh.get("outages") or []
    ]
    pieces = _traffic_pieces(wl)
    replay = g.get("replay")
    batch = int(g.get("consume_message_batch_max_size", 1) or 1)
    ack = g.get("ack_index")
    return _Group(
        name=name,
        topic=str(g.get("topic") or name),
        seed=int(scenario.get("seed", 42)),
        horizon=horizon,
        kind=kind,
        blocking=blocking,
        max_retries=max_retries,
        timeout=timeout,
        receive_invisible=receive_invisible,
        revive_lag=revive_lag,
        pull_threshold=(
            int(g.get("pull_threshold_for_queue", 1000))
            if kind in ("concurrently", "broadcasting")
            else None
        ),
        pop_cache=(
            int(g.get("max_cache_message_count", 1024))
            if flavor in ("rocketmq5.push", "exponential", "customized") and not blocking
            else None
        ),
        pops_per_thread=flavor == "rocketmq5.simple",
        periodic=periodic,
        late_send_back=late,
        dlq_enabled=bool(g.get("dlq_enabled", True)),
        levels=levels,
        next_level=int(g.get("delay_level_when_next_consume", 0) or 0),
        send_back_p=float(bh.get("send_back_failure_probability", 0) or 0),
        fallback_p=float(bh.get("send_back_fallback_probability", 0) or 0),
        batch=batch if kind == "concurrently" else 1,
        ack_index=None if (ack is None or kind != "concurrently") else int(ack),
        suspend=suspend,
        path=path,
        from_start=from_start,
        interval_of=interval_of,
        pull=parse_duration_ms(g.get("pull_interval", 0) or 0),
        ready_wait=parse_duration_ms(bh.get("ready_wait", 0) or 0),
        threads=threads,
        instances=instances,
        balancing=balancing,
        brokers=int(g.get("brokers", 1)),
        retry_queue_nums=int(g.get("retry_queue_nums", 1)),
        allocate=str(g.get("allocate", "averagely")),
        n=int(wl.get("messages", 10_000)) if pieces is None else sum(p[2] for p in pieces),
        over=parse_duration_ms(wl.get("over", "1h")),
        arrival=str(wl.get("within", "uniform") if pieces else wl.get("arrival", "uniform")),
        pieces=pieces,
        queues=int(wl.get("queues", 8)),
        size_bytes=int(wl.get("size_bytes", 1024)),
        fail_p=float(bh.get("fail_probability", 0) or 0),
        poison_fraction=float(bh.get("poison_fraction", 0) or 0),
        fail_first=int(bh.get("fail_first", 0) or 0),
        processing=_parse_dist(bh.get("processing_time", "10ms")),
        outages=outages,
        mix=(
            float(mix.get("reconsume_later", 1.0)),
            float(mix.get("exception", 0.0)),
            float(mix.get("null_return", 0.0)),
        ),
        downstream=_downstream(bh.get("downstream")),
        client_overhead=_parse_fine_ms(bh.get("client_overhead", 0)),
        replay_at=parse_duration_ms(replay["at"]) if replay else None,
        replay_rate=_parse_rate(replay.get("rate", "100/s")) if replay else None,
        poison_fixed=bool(replay.get("poison_fixed", True)) if replay else True,
    )


def _downstream(raw: dict | None) -> tuple[int, bool, int | None, float] | None:
    if raw is None:
        return None
    timeout = raw.get("timeout")
    return (
        int(raw["capacity"]),
        raw.get("per", "group") == "group",
        None if timeout is None else parse_duration_ms(timeout),
        float(raw.get("shed", 0.0)),
    )


# --------------------------------------------------------------------------- draws


class _Uniforms:
    """``u(stream, msg_id, delivery)`` with the engine's hash, computed in vectorised blocks.

    Early deliveries (most draws) are computed for a block of message ids at once; late
    deliveries (a message retried hundreds of times) for a block of delivery numbers of one
    message at once. Both are cached.
    """

    ID_BLOCKED_DELIVERIES = 32
    DELIVERY_BLOCK = 256

    def __init__(self, seed: int, group: str, n: int):
        self.seed, self.group = seed, group
        self.block = 1 << max(4, min(10, max(1, n - 1).bit_length()))
        self.cache: dict[tuple, np.ndarray] = {}

    def __call__(self, stream: str, msg_id: int, delivery: int) -> float:
        if delivery > self.ID_BLOCKED_DELIVERIES:
            b, i = divmod(delivery, self.DELIVERY_BLOCK)
            key = (stream, "d", msg_id, b)
            arr = self.cache.get(key)
            if arr is None:
                first = b * self.DELIVERY_BLOCK
                ds = np.arange(first, first + self.DELIVERY_BLOCK, dtype=np.int64)
                ids = np.full(self.DELIVERY_BLOCK, msg_id, dtype=np.int64)
                arr = uniform_np(self.seed, self.group, stream, ids, ds)
                self.cache[key] = arr
            return float(arr[i])
        b, i = divmod(msg_id, self.block)
        key = (stream, delivery, b)
        arr = self.cache.get(key)
        if arr is None:
            ids = np.arange(b * self.block, (b + 1) * self.block, dtype=np.int64)
            arr = uniform_np(self.seed, self.group, stream, ids, delivery)
            self.cache[key] = arr
        return float(arr[i])


# --------------------------------------------------------------------------- state


@dataclass(eq=False)
class _Msg:
    msg_id: int
    queue_id: int
    born_ms: int
    poisoned: bool
    replayed: bool = False
    last_d: int = 0
    # sent back twice: its copies' deliveries are numbered as they start (model.md §6)
    forked: bool = False
    last_started: int = 0


@dataclass(eq=False)
class _Delivery:
    msg: _Msg
    d: int
    rt: int
    topic: str
    queue: int
    ready_ms: int
    reason: str
    lane_entry: bool  # a publication/replay: enters its lane at the back (blocking lanes)
    brt: int = 0  # the reconsume_times of the commit-log copy it was pulled from
    parent: int | None = None  # the delivery whose retry this is
    start_ms: int | None = None
    processing_ms: int | None = None
    end_ms: int | None = None
    outcome: str | None = None
    instance: int = 0
    cached: bool = False  # received into a 5.x client's cache, at ``instance``
    result_state: str = "Ready"
    delay_level: int | None = None
    next_ready_ms: int | None = None
    settled_ms: int | None = None
    batch_size: int | None = None
    started: bool = False
    ended: bool = False
    ends: list[tuple] = field(default_factory=list)  # (k, state, at, topic, queue, lvl, why)
    offset: tuple | None = None  # its place in its process queue (the 4.x cleaner's sweep)
    copy: tuple | None = None  # a second send-back: (state, at, topic, queue, level, ready)

    @property
    def lane(self) -> tuple[str, int]:
        return (self.topic, self.queue)

    @property
    def consume_start_time_stamp(self) -> int | None:
        """What ``ProcessQueue.cleanExpiredMsg`` reads: None until the consume starts."""
        return self.start_ms


@dataclass(eq=False)
class _Pop:
    """A 5.x push consumer instance: its cache and its receives, and what waits for them on
    the broker."""

    cached: int = 0
    cache: list = field(default_factory=list)  # in the order they start, from ``head``
    head: int = 0
    receive_at: int | str | None = None  # None: a long poll waits; "thread": when one frees
    receives: int = 0
    poll_at: int | None = None  # the moment of the long poll's entries at the cache's end
    poll_since: int = 0
    born: int = 0  # when its long poll was made: the broker answers the one made first
    topic: list = field(default_factory=list)  # heap of (eligible, msg_id, d, dv)
    retries: deque = field(default_factory=deque)


@dataclass(eq=False)
class _Lane:
    pending: list = field(default_factory=list)  # heap of (ready_ms, msg_id, counter, dv)
    head: _Msg | None = None
    release: int = 0


class _GroupSim:
    def __init__(self, cfg: _Group):
        self.cfg = cfg
        self.u = _Uniforms(cfg.seed, cfg.name, cfg.n)
        self.events: list = []
        self.counter = 0
        self.free = [cfg.threads] * cfg.instances  # per instance
        self.calls = [0] * cfg.instances  # consume requests running, per instance
        self.waiting: list[list] = [[] for _ in range(cfg.instances)]  # per instance
        per_broker = cfg.queues // cfg.brokers
        self.per_broker = per_broker
        if cfg.balancing == "queue":
            self.owner = rebalance.owners(
                cfg.topic, cfg.brokers, per_broker, cfg.instances, cfg.allocate
            )
            if cfg.kind == "concurrently":
                self.owner.update(
                    rebalance.owners(
                        cfg.retry_topic_4x,
                        cfg.brokers,
                        cfg.retry_queue_nums,
                        cfg.instances,
                        cfg.allocate,
                    )
                )
        self.lane_waiting: dict[tuple[str, int], list] = {}
        # the 4.x push client's process queues: deliveries cached, and those held back
        self.capped = (
            cfg.pull_threshold is not None and cfg.threads != INF and cfg.batch == 1
            and not cfg.blocking
        )  # fmt: skip
        self.cached: dict[tuple[str, int], int] = {}
        self.held: dict[tuple[str, int], deque] = {}
        # the 4.x expired-message cleaner (consume_timeout_check: periodic): each process
        # queue's deliveries in the queue's order, swept every T (interpretation 5)
        self.sweeping = cfg.periodic and cfg.timeout is not None
        self.process_queues: dict[tuple[str, int], source.ProcessQueue] = {}
        self.clean_due = False
        # the 5.x push client's cache per instance (rocketmq-clients ProcessQueueImpl)
        self.popped = (cfg.pop_cache is not None or cfg.pops_per_thread) and cfg.threads != INF
        # a simple consumer receives into its threads: its cache is its pool
        self.room = int(cfg.threads) if cfg.pops_per_thread and self.popped else cfg.pop_cache
        # each instance's first long poll made before the run, in instance order
        self.pops = [_Pop(born=i - cfg.instances) for i in range(cfg.instances)]
        # a 5.x push group's instances pop the topic together: what waits on the broker
        # waits for any of them (in pops[0]'s lists), and the broker picks who takes it
        self.shared = self.popped and not cfg.pops_per_thread and cfg.instances > 1
        self.receives_due: list[int] = []
        self.lanes: dict[tuple[str, int], _Lane] = {}
        self.touched: set[tuple[str, int]] = set()
        self.deliveries: list[_Delivery] = []
        self.dead_letters: list[tuple[int, int, int, _Msg]] = []
        self.messages: list[_Msg] = []
        ids = np.arange(cfg.n, dtype=np.int64)
        poison = uniform_np(cfg.seed, cfg.name, "poison", ids, 0) if cfg.n else np.empty(0)
        arrival = uniform_np(cfg.seed, cfg.name, "arrival", ids, 0) if cfg.n else []
        born = []
        first = 0
        # a workload without a shape is one piece (scenario.md, Workload; model.md §1)
        for start, length, count in cfg.pieces or [(0, cfg.over, cfg.n)]:
            for i in range(first, first + count):
                if cfg.arrival == "poisson":
                    born.append(start + math.floor(float(arrival[i]) * length))
                else:
                    born.append(start + ((i - first) * length) // count)
            first += count
        for i in range(cfg.n):
            msg = _Msg(i, i % cfg.queues, born[i], float(poison[i]) < cfg.poison_fraction)
            self.messages.append(msg)

    # -- topology (rebalance.py: from the source; by message and broadcast: docs/model.md §5)
    def message_queue(self, topic: str, queue: int) -> tuple[str, str, int]:
        """A global queue id as ``(topic, brokerName, queueId)``."""
        per = self.cfg.retry_queue_nums if topic == self.cfg.retry_topic_4x else self.per_broker
        return (topic, rebalance.broker_name(queue // per), queue % per)

    def instance_of(self, dv: _Delivery) -> int:
        cfg = self.cfg
        if cfg.balancing == "queue":
            return self.owner[self.message_queue(dv.topic, dv.queue)]
        if cfg.balancing == "message":
            return (dv.msg.msg_id + dv.d - 1) % cfg.instances
        return 0

    def retry_queue(self, dv: _Delivery) -> int:
        """The send-back stores the retry on the broker that held the message, on one of its
        retry queues: at random in the broker; here spread by message id and delivery."""
        cfg = self.cfg
        broker = int(self.message_queue(dv.topic, dv.queue)[1].split("-")[1])
        return broker * cfg.retry_queue_nums + (dv.msg.msg_id + dv.d) % cfg.retry_queue_nums

    # -- event plumbing
    def push(self, t: int, phase: int, kind: str, obj: Any = None) -> None:
        self.counter += 1
        heapq.heappush(self.events, (t, phase, self.counter, kind, obj))

    def schedule_ready(self, at: int, spec: tuple) -> None:
        if at < self.cfg.horizon:
            self.push(at, 0, "ready", spec)

    # -- the run
    def run(self) -> None:
        cfg = self.cfg
        for msg in self.messages:
            spec = (msg, 1, 0, cfg.topic, msg.queue_id, "published", 0)
            self.schedule_ready(msg.born_ms, spec)
        if cfg.replay_at is not None and cfg.replay_at < cfg.horizon:
            self.push(cfg.replay_at, 0, "replay")
        if self.sweeping and cfg.timeout < cfg.horizon:
            self.push(cfg.timeout, 0, "clean", 1)
        events = self.events
        while events and events[0][0] < cfg.horizon:
            t = events[0][0]
            while events and events[0][0] == t:
                while events and events[0][0] == t and events[0][1] == 0:
                    _, _, _, kind, obj = heapq.heappop(events)
                    getattr(self, "on_" + kind)(t, obj)
                if self.clean_due:  # after every phase-0 event of t: a listener back at t
                    self.clean_due = False  # has left its process queue
                    self.sweep(t)
                self.choose_heads(t)
                now = []
                while events and events[0][0] == t and events[0][1] == 1:
                    now.append(heapq.heappop(events)[4])
                # where a process queue has room for only some: first deliveries in publish
                # order, then the others by message
                now.sort(key=lambda dv: (dv.d > 1, dv.msg.born_ms if dv.d == 1 else 0,
                                         dv.msg.msg_id, dv.d))  # fmt: skip
                for dv in now:
                    self.make_waiting(t, dv)
                due, self.receives_due = self.receives_due, []
                for instance in sorted(due):  # the first takes what waits for them all
                    self.receive(t, instance)
                self.dispatch(t)

    # -- phase 0
    def on_receive(self, t: int, instance: int) -> None:
        self.receives_due.append(instance)  # after what becomes eligible at t

    def on_clean(self, t: int, k: int) -> None:
        """The cleaner's k-th run (scheduleAtFixedRate, initial delay and period T), swept
        after the other phase-0 events of t."""
        self.clean_due = True
        if (k + 1) * self.cfg.timeout < self.cfg.horizon:
            self.push((k + 1) * self.cfg.timeout, 0, "clean", k + 1)

    def on_free(self, t: int, obj: tuple[int, list[_Delivery]]) -> None:
        instance, members = obj
        self.free[instance] += 1
        self.calls[instance] -= 1
        dv = members[0]
        if self.popped:  # erased from the cache once acked or nacked
            pop = self.pops[instance]
            pop.cached -= 1
            if pop.receive_at == "thread":  # a simple consumer's freed thread receives
                pop.receive_at = "due"
                self.receives_due.append(instance)
        if self.sweeping:  # the listener is back: out of the cleaner's process queue (a
            for member in members:  # failed send-back's re-run enters it again)
                self.process_queues[member.lane].remove_message(member.offset)
        # the client removes a consumed message from its process queue, but keeps one whose
        # send-back failed (submitConsumeRequestLater)
        if self.capped and not (dv.ends and dv.ends[-1][6] == "send_back_failed"):
            self.cached[dv.lane] -= 1
            held = self.held.get(dv.lane)
            # DefaultMQPushConsumerImpl.pullMessage: the queue is pulled again once it caches
            # no more than pullThresholdForQueue, up to pullBatchSize (32) a pull
            while held and self.cached[dv.lane] <= self.cfg.pull_threshold:
                for _ in range(min(32, len(held))):
                    other = held.popleft()
                    self.cached[dv.lane] += 1
                    entry = (t, other.msg.msg_id, other.d, other)
                    heapq.heappush(self.waiting[other.instance], entry)
                    self.enter(other, entry)

    def on_ready(self, t: int, spec: tuple) -> None:
        msg, d, rt, topic, queue, reason, brt, *link = spec
        fresh = reason in ("published", "replayed")
        dv = _Delivery(msg, d, rt, topic, queue, t, reason, fresh, brt)
        dv.parent = link[0] if link else (d - 1 if d > 1 else None)
        msg.last_d = d
        self.deliveries.append(dv)
        cfg = self.cfg
        if cfg.blocking and dv.lane_entry:
            lane = self.lanes.setdefault(dv.lane, _Lane())
            self.counter += 1
            heapq.heappush(lane.pending, (t, msg.msg_id, self.counter, dv))
            self.touched.add(dv.lane)
            return
        eligible = t + cfg.ready_wait
        if cfg.pull > 0 and not cfg.blocking:
            eligible = -(-eligible // cfg.pull) * cfg.pull
        self.push(eligible, 1, "eligible", dv)

    def on_replay(self, t: int, obj: Any) -> None:
        cfg = self.cfg
        # (dlq_ms, msg_id, delivery, msg): a message sent back twice may have a dead letter
        # of each copy
        letters = sorted(letter for letter in self.dead_letters if letter[0] < t)
        for k, (_, _, d, msg) in enumerate(letters):
            msg.replayed = True
            at = t + math.floor(Fraction(k * 1000) / cfg.replay_rate)
            spec = (msg, d + 1, 0, cfg.topic, k % cfg.queues, "replayed", 0, d)
            self.schedule_ready(at, spec)

    def on_end(self, t: int, batch: tuple) -> None:
        members, outcome = batch
        cfg = self.cfg
        ack = cfg.ack_index
        for i, dv in enumerate(members):
            beyond = ack is not None and i > min(ack, len(members) - 1)
            if dv.ended:  # cleaned: its listener's return does nothing on a 5.1 client
                if cfg.late_send_back and (outcome != SUCCESS or beyond):
                    self.send_back_again(t, dv)  # (processConsumeResult skips what the
                continue  # process queue lost), and sends it back again before
            dv.ended = True
            dv.end_ms, dv.outcome = t, outcome
            if outcome == SUCCESS and (ack is None or i <= min(ack, len(members) - 1)):
                dv.result_state, dv.settled_ms = "Commit", t
                dv.ends.append((3, "Commit", t, dv.topic, dv.queue, None, SUCCESS))
                self.settled(t, dv)
            else:
                why = "beyond_ack_index" if outcome == SUCCESS else outcome
                self.after_failure(t, dv, outcome, why)

    def on_late(self, t: int, batch: tuple) -> None:
        """The listener of a delivery the exact check timed out returns at t."""
        members, outcome = batch
        ack = self.cfg.ack_index
        for i, dv in enumerate(members):
            if outcome != SUCCESS or (ack is not None and i > min(ack, len(members) - 1)):
                self.send_back_again(t, dv)

    def on_leave(self, t: int, spec: tuple) -> None:
        dv, why, *landed = spec
        self.leave(t, dv, why, k=4, discard=bool(landed), where=landed[0] if landed else None)

    # -- after a delivery (model.md §6, flavors.md)
    def after_failure(self, t: int, dv: _Delivery, outcome: str, why: str) -> None:
        """A failed (or beyond-ack_index) delivery ended at t: retry it, or let it leave."""
        cfg = self.cfg
        rt, here = dv.rt, (dv.topic, dv.queue)
        if cfg.kind == "broadcasting" and outcome == TIMEOUT:
            self.broadcast_expired(t, dv)
        elif cfg.kind == "broadcasting":
            self.leave(t, dv, "broadcast_no_retry", k=3, discard=True)
        elif cfg.kind == "concurrently":
            self.send_back(t, dv, outcome, why)
        elif cfg.kind == "invisible":
            # 5.x simple (the seed's states: no WaitingRetry): Inflight until visible again,
            # then Ready on the retry topic, or the DLQ
            if rt >= cfg.max_retries:
                self.leave(t, dv, "max_reconsume_times", k=3)
            else:
                dv.result_state, dv.next_ready_ms = "Inflight", t
                spec = (dv.msg, dv.d + 1, rt + 1, cfg.retry_topic_5x, 0, "retry_due", rt + 1)
                self.schedule_ready(t, spec)
        elif cfg.kind == "local" and cfg.interval_of is None:
            self.orderly(t, dv, why)
        elif cfg.kind == "local":
            if rt >= cfg.max_retries:
                self.leave(t, dv, "max_reconsume_times", k=3)
            elif outcome == "NULL_RETURN":  # the 5.x FIFO client retries a FAILURE only
                self.leave(t, dv, "null_result", k=3)
            else:
                wait = cfg.suspend if cfg.interval_of is None else cfg.interval_of(rt + 1)
                self.retry(t, dv, why, t + wait, here, None, here, "local_retry")
        else:  # after backoff: the interval of retry n = rt + 1
            base = dv.start_ms if cfg.from_start else t
            due = base + cfg.interval_of(rt + 1)
            if cfg.path == "revive":  # the reviver writes it after its revive time
                due += cfg.revive_lag
            if rt >= cfg.max_retries:
                dv.result_state = "WaitingRetry"
                dv.ends.append((3, "WaitingRetry", t, dv.topic, dv.queue, None, why))
                if due < cfg.horizon:
                    self.push(due, 0, "leave", (dv, "max_reconsume_times"))
            elif cfg.path == "revive":
                self.retry(t, dv, why, due, here, None, (cfg.retry_topic_5x, 0), "retry_due")
            else:
                self.retry(t, dv, why, due, here, None, here, "visible_again")

    def send_back(self, t: int, dv: _Delivery, outcome: str, why: str) -> None:
        """4.x concurrently: the send-back as the source does it (source_rules.py), and the
        broker's write read back as the message's next states."""
        cfg = self.cfg
        msg = source.MessageExt(dv.rt, source.Stored(dv.brt))
        max_level = len(cfg.levels)
        rpc_fails = fallback_fails = False
        if outcome == TIMEOUT:
            put = source.clean_expired_msg(cfg.name, msg, cfg.max_retries, max_level)
        else:
            if cfg.send_back_p + cfg.fallback_p > 0:
                u = self.u("send_back", dv.msg.msg_id, dv.d)
                rpc_fails = u < cfg.send_back_p + cfg.fallback_p
                fallback_fails = u < cfg.send_back_p
            put = source.process_consume_result_member(
                cfg.name, msg, cfg.next_level, cfg.max_retries, max_level, rpc_fails, fallback_fails
            )
        here = (dv.topic, dv.queue)
        if put is None:  # submitConsumeRequestLater: 5 s, the local count already raised
            self.retry(t, dv, "send_back_failed", t + 5000, here, None, here, "local_retry",
                       counts=(msg.reconsume_times, dv.brt))  # fmt: skip
            return
        why = "send_back_fallback" if rpc_fails else why
        target = put.real_topic or put.topic
        if target.startswith(source.DLQ_GROUP_TOPIC_PREFIX) and put.delay_level == 0:
            exhausted = msg.stored.reconsume_times >= cfg.max_retries
            self.leave(t, dv, "max_reconsume_times" if exhausted else "delay_level_negative", k=3)
            return
        level = put.delay_level
        assert put.topic == SCHEDULE_TOPIC and level > 0, put
        due = t + cfg.levels[level - 1]
        schedule = (put.topic, put.queue_id)
        if target.startswith(source.DLQ_GROUP_TOPIC_PREFIX):  # a 4.9.7 fallback's dead letter
            self.dead_letter_later(t, dv, put, why)
            return
        retry_queue = (cfg.retry_topic_4x, self.retry_queue(dv))
        copy = source.delivered_copy(put)
        self.retry(t, dv, why, due, schedule, level, retry_queue, "retry_due",
                   counts=(copy.reconsume_times, copy.stored.reconsume_times))  # fmt: skip

    def send_back_again(self, t: int, dv: _Delivery) -> None:
        """A 4.9 client: the listener of a delivery the cleaner already sent back failed at t,
        and ``processConsumeResult`` sends it back again (4.9.7 lines 277-292, which 5.1.0
        skips for a message its process queue lost): a second copy, through the schedule
        topic at the level the listener's context asks, or the DLQ. The RPC is taken to
        succeed, as the cleaner's is (source_rules.clean_expired_msg)."""
        cfg = self.cfg
        msg = source.MessageExt(dv.rt, source.Stored(dv.brt))
        put = source.process_consume_result_member(
            cfg.name, msg, cfg.next_level, cfg.max_retries, len(cfg.levels), False, False
        )
        dv.msg.forked = True
        target = put.real_topic or put.topic
        if target.startswith(source.DLQ_GROUP_TOPIC_PREFIX) and put.delay_level == 0:
            state, where = ("DLQ", (cfg.dlq_topic, 0)) if cfg.dlq_enabled else (
                "Discard", (dv.topic, dv.queue))  # fmt: skip
            dv.copy = (state, t, *where, None, None)
            dv.ends.append((4, state, t, *where, None, "late_send_back"))
            return
        level = put.delay_level
        assert put.topic == SCHEDULE_TOPIC and level > 0 and put.real_topic == cfg.retry_topic_4x
        due = t + cfg.levels[level - 1]
        dv.copy = ("WaitingRetry", t, put.topic, put.queue_id, level, due)
        dv.ends.append((4, "WaitingRetry", t, put.topic, put.queue_id, level, "late_send_back"))
        copy = source.delivered_copy(put)
        # ordered as d + 1 + COPY_ORDER until it starts, when it takes the message's next number
        spec = (dv.msg, dv.d + 1 + COPY_ORDER, copy.reconsume_times, cfg.retry_topic_4x,
                self.retry_queue(dv), "retry_due", copy.stored.reconsume_times, dv.d)  # fmt: skip
        self.schedule_ready(due, spec)

    def orderly(self, t: int, dv: _Delivery, why: str) -> None:
        """4.x orderly: ``checkReconsumeTimes`` as the source does it (source_rules.py)."""
        cfg = self.cfg
        msg = source.MessageExt(dv.rt, source.Stored(dv.brt))
        put = source.check_reconsume_times(cfg.name, msg, cfg.max_retries, len(cfg.levels))
        here = (dv.topic, dv.queue)
        if put is None:  # suspended: the same message again after suspendCurrentQueueTimeMillis
            counts = (msg.reconsume_times, msg.reconsume_times)
            self.retry(t, dv, why, t + cfg.suspend, here, None, here, "local_retry", counts=counts)
            return
        self.settled(t, dv)  # the queue moves on now, whenever the dead letter lands
        self.dead_letter_later(t, dv, put, why)

    def broadcast_expired(self, t: int, dv: _Delivery) -> None:
        """4.x broadcasting timeout: the cleaner sends the message back (source_rules.py);
        it waits in the schedule topic and lands, unread, in ``%RETRY%<group>``."""
        cfg = self.cfg
        msg = source.MessageExt(dv.rt, source.Stored(dv.brt))
        put = source.clean_expired_msg(cfg.name, msg, 16, len(cfg.levels))
        assert put.topic == SCHEDULE_TOPIC and put.real_topic == cfg.retry_topic_4x, put
        level = put.delay_level
        dv.result_state, dv.delay_level = "WaitingRetry", level
        dv.ends.append((3, "WaitingRetry", t, put.topic, put.queue_id, level, TIMEOUT))
        due = t + cfg.levels[level - 1]
        if due < cfg.horizon:
            landed = (cfg.retry_topic_4x, self.retry_queue(dv))
            self.push(due, 0, "leave", (dv, "broadcast_no_retry", landed))

    def dead_letter_later(self, t: int, dv: _Delivery, put: source.Put, why: str) -> None:
        """A 4.9.7 broker's delayed dead letter: WaitingRetry in the schedule topic at the
        put's level, then the DLQ when the delay ends."""
        cfg = self.cfg
        level = put.delay_level
        assert put.topic == SCHEDULE_TOPIC and put.real_topic.startswith("%DLQ%"), put
        dv.result_state, dv.delay_level = "WaitingRetry", level
        dv.ends.append((3, "WaitingRetry", t, put.topic, put.queue_id, level, why))
        due = t + cfg.levels[level - 1]
        if due < cfg.horizon:
            self.push(due, 0, "leave", (dv, "max_reconsume_times"))

    def retry(
        self,
        t: int,
        dv: _Delivery,
        why: str,
        due: int,
        wait_at: tuple[str, int],
        level: int | None,
        ready_at: tuple[str, int],
        reason: str,
        counts: tuple[int, int] | None = None,
    ) -> None:
        """WaitingRetry at t on ``wait_at``; delivery d + 1 Ready at ``due`` on ``ready_at``,
        with ``counts`` (client, broker) reconsume times (default: both one more)."""
        dv.result_state, dv.delay_level, dv.next_ready_ms = "WaitingRetry", level, due
        dv.ends.append((3, "WaitingRetry", t, *wait_at, level, why))
        rt, brt = counts or (dv.rt + 1, dv.rt + 1)
        self.schedule_ready(due, (dv.msg, dv.d + 1, rt, *ready_at, reason, brt, dv.d))

    def leave(
        self,
        t: int,
        dv: _Delivery,
        why: str,
        k: int,
        discard: bool = False,
        where: tuple[str, int] | None = None,
    ) -> None:
        """DLQ (or Discard) at t; a discarded message stays where it was unless ``where``."""
        cfg = self.cfg
        if discard or not cfg.dlq_enabled:
            dv.result_state = "Discard"
            dv.ends.append((k, "Discard", t, *(where or (dv.topic, dv.queue)), None, why))
        else:
            dv.result_state = "DLQ"
            dv.ends.append((k, "DLQ", t, cfg.dlq_topic, 0, None, why))
            if not dv.msg.replayed:
                self.dead_letters.append((t, dv.msg.msg_id, dv.d, dv.msg))
        dv.settled_ms = t
        self.settled(t, dv)

    def settled(self, t: int, dv: _Delivery) -> None:
        if self.cfg.blocking:
            lane = self.lanes[dv.lane]
            if lane.head is dv.msg:
                lane.head, lane.release = None, t
                self.touched.add(dv.lane)

    # -- blocking lanes
    def choose_heads(self, t: int) -> None:
        if not self.touched:
            return
        for key in sorted(self.touched):
            lane = self.lanes[key]
            if lane.head is None and lane.pending:
                dv = heapq.heappop(lane.pending)[3]
                lane.head = dv.msg
                eligible = max(dv.ready_ms + self.cfg.ready_wait, lane.release)
                self.push(eligible, 1, "eligible", dv)
        self.touched.clear()

    # -- the 5.x push client's cache and the broker's pop
    def cache(self, t: int, instance: int, dv: _Delivery, polled: bool) -> None:
        """Into the instance's cache, in the order the consume service gets them: a receive's
        in the order the pop read them, those one long poll answers at t by message."""
        pop = self.pops[instance]
        pop.cached += 1
        dv.instance, dv.cached = instance, True
        if not polled:
            pop.cache.append(dv)
            pop.poll_at = None
            return
        pop.born = t  # the client asks again at once
        if pop.poll_at != t:
            pop.poll_at, pop.poll_since = t, len(pop.cache)
        j = len(pop.cache)
        pop.cache.append(dv)
        key = (dv.msg.msg_id, dv.d)
        while j > max(pop.poll_since, pop.head):
            before = pop.cache[j - 1]
            if (before.msg.msg_id, before.d) <= key:
                break
            pop.cache[j], pop.cache[j - 1] = before, dv
            j -= 1
        self.back_off(t, instance)

    def back_off(self, t: int, instance: int) -> None:
        """ProcessQueueImpl.receiveMessage: a full cache receives again a second later; a simple
        consumer whose threads are all busy receives when one frees."""
        pop = self.pops[instance]
        if pop.cached >= self.room and self.cfg.pops_per_thread:
            pop.receive_at = "thread"
        elif pop.cached >= self.room:
            pop.receive_at = t + 1000
            self.push(t + 1000, 0, "receive", instance)

    def long_poll(self, t: int) -> int | None:
        """Which instance's long poll the broker answers with a delivery at t, where the
        instances pop together: PopLongPollingService wakes the waiting pop that expires
        first (PopRequest.COMPARATOR: born + poll time), and one answering at t takes what
        else comes at t, up to its batch of 32. The proxy polls 20 s at most
        (grpcClientConsumerMaxLongPollingTimeoutMillis); one not answered by then comes back
        empty and its client asks again at once."""
        best: tuple[int, int] | None = None
        for i, pop in enumerate(self.pops):
            if pop.receive_at is not None:
                continue
            if pop.poll_at == t and len(pop.cache) - pop.poll_since < 32:
                return i
            born = pop.born + (t - pop.born) // 20_000 * 20_000
            if best is None or born < best[0]:
                best = (born, i)
        return None if best is None else best[1]

    def receive(self, t: int, instance: int) -> None:
        """Pops of up to 32 (the proxy's batch) while the cache has room; each reads the retry
        topic first when the broker draws below popFromRetryProbability (20 of 100), else the
        topic first and the retry topic for the rest (PopMessageProcessor). One that finds
        fewer than it asked for leaves a long poll waiting."""
        pop, room = self.pops[instance], self.room
        broker = self.pops[0] if self.shared else pop
        while pop.cached < room:
            want = min(room - pop.cached, 1 if self.cfg.pops_per_thread else 32)
            ids = np.array([instance], dtype=np.int64)
            u = float(uniform_np(self.cfg.seed, self.cfg.name, "pop_receive", ids, pop.receives)[0])
            pop.receives += 1
            got = 0
            for from_retry in (True, False) if u < 0.2 else (False, True):
                while got < want:
                    if from_retry and broker.retries:
                        dv = broker.retries.popleft()
                    elif not from_retry and broker.topic:
                        dv = heapq.heappop(broker.topic)[3]
                    else:
                        break
                    self.cache(t, instance, dv, polled=False)
                    got += 1
            if got < want:
                pop.receive_at, pop.born = None, t
                return
        self.back_off(t, instance)

    # -- phase 1 and dispatch
    def make_waiting(self, t: int, dv: _Delivery) -> None:
        dv.instance = self.instance_of(dv)
        if self.popped:
            if self.shared:
                taker = self.long_poll(t)
            else:
                taker = dv.instance if self.pops[dv.instance].receive_at is None else None
            broker = self.pops[0 if self.shared else dv.instance]
            if taker is not None:  # a long poll answers it
                self.cache(t, taker, dv, polled=True)
            elif dv.topic == self.cfg.topic:
                heapq.heappush(broker.topic, (t, dv.msg.msg_id, dv.d, dv))
            else:
                broker.retries.append(dv)
            return
        # a 4.x push client pulls a queue only while it caches no more than its threshold: the
        # rest waits on the broker, and enters in queue order as cached ones are consumed
        if self.capped and dv.reason != "local_retry":
            if self.cached.get(dv.lane, 0) > self.cfg.pull_threshold:
                self.held.setdefault(dv.lane, deque()).append(dv)
                return
            self.cached[dv.lane] = self.cached.get(dv.lane, 0) + 1
        entry = (t, dv.msg.msg_id, dv.d, dv)
        heapq.heappush(self.waiting[dv.instance], entry)
        if self.cfg.batch > 1:
            heapq.heappush(self.lane_waiting.setdefault(dv.lane, []), entry)
        self.enter(dv, entry)

    # -- the 4.x expired-message cleaner (consume_timeout_check: periodic)
    def enter(self, dv: _Delivery, entry: tuple) -> None:
        """Pulled into its process queue (the MessageQueue it came from). Its place there,
        the queue offset, is its place in the order the consume service takes the queue's
        deliveries, ``(entered_ms, msg_id, delivery)`` (dispatch_on): after every delivery
        that entered before, and by message among those entering at one moment."""
        if self.sweeping:
            dv.offset = entry[:3]
            pq = self.process_queues.setdefault(dv.lane, source.ProcessQueue())
            pq.put_message(dv.offset, dv)

    def sweep(self, t: int) -> None:
        """A cleaner run at t: ``cleanExpiredMsg`` on every process queue (source_rules.py),
        each sending back at most 16 of its expired deliveries, head first. The listener of a
        cleaned delivery runs on; the cleaner's send-back is its end (TIMEOUT at t)."""

        def send_message_back(dv: _Delivery, level: int) -> None:
            assert level == 3 and not dv.ended, (level, dv)
            dv.ended = True
            dv.end_ms, dv.outcome = t, TIMEOUT
            self.after_failure(t, dv, TIMEOUT, TIMEOUT)

        for lane in sorted(self.process_queues):
            source.clean_expired_msg_sweep(
                self.process_queues[lane], t, self.cfg.timeout, send_message_back
            )

    def dispatch(self, t: int) -> None:
        for instance in range(self.cfg.instances):
            self.dispatch_on(t, instance)

    def dispatch_on(self, t: int, instance: int) -> None:
        cfg = self.cfg
        if self.popped:
            pop = self.pops[instance]
            while pop.head < len(pop.cache) and self.free[instance] > 0:
                pop.head += 1
                self.start(t, [pop.cache[pop.head - 1]])
            return
        waiting = self.waiting[instance]
        while waiting and self.free[instance] > 0:
            dv = heapq.heappop(waiting)[3]
            if dv.started:
                continue
            members = [dv]
            if cfg.batch > 1:
                lane_heap = self.lane_waiting[dv.lane]
                while lane_heap and len(members) < cfg.batch:
                    other = lane_heap[0][3]
                    if other.started or other is dv:
                        heapq.heappop(lane_heap)
                        continue
                    heapq.heappop(lane_heap)
                    members.append(other)
            self.start(t, members)

    def start(self, t: int, members: list[_Delivery]) -> None:
        cfg = self.cfg
        total, outcome = 0, SUCCESS
        instance = members[0].instance
        # the calls at the downstream when this request starts, its own included: the
        # instance's, or every instance's where they share it (model.md §3)
        shared = cfg.downstream is not None and cfg.downstream[1]
        load = (sum(self.calls) if shared else self.calls[instance]) + 1
        for dv in members:
            dv.started = True
            if dv.msg.forked:  # its copies' deliveries are numbered as they start
                dv.d = dv.msg.last_started + 1
            dv.msg.last_started = max(dv.msg.last_started, dv.d)
            kind, proc = self.listen(dv.msg, dv.d, t, load)
            total += proc
            if outcome == SUCCESS and kind != SUCCESS:
                outcome = kind
        end = t + total
        # periodic: the listener's end, unless a cleaner run sends it back first (sweep)
        if cfg.timeout is not None and total > cfg.timeout and not cfg.periodic:
            if cfg.late_send_back and t + total < cfg.horizon:
                self.push(t + total, 0, "late", (members, outcome))
            outcome, end = TIMEOUT, t + cfg.timeout
        if cfg.kind == "invisible" and outcome != SUCCESS:
            # not acknowledged: invisible until its duration ends and the reviver takes it
            end = t + cfg.timeout + cfg.revive_lag
        for dv in members:
            dv.start_ms, dv.processing_ms, dv.batch_size = t, total, len(members)
            dv.result_state = "Inflight"
        self.free[instance] -= 1
        self.calls[instance] += 1
        if end < cfg.horizon:  # before the free at the same moment: it decides the cache
            self.push(end, 0, "end", (members, outcome))
        self.push(t + total, 0, "free", (instance, members))

    def listen(self, msg: _Msg, d: int, start: int, load: int) -> tuple[str, int]:
        """model.md §3: the listener's result kind and processing_ms for delivery d at start,
        with ``load`` calls at the downstream."""
        cfg = self.cfg
        u, m = self.u, msg.msg_id
        p = cfg.fail_p
        dist = cfg.processing
        windows = [w for w in cfg.outages if w.start <= start < w.end]
        if windows:
            p = max(w.fail_probability for w in windows)
            for w in windows:
                if w.processing is not None:
                    dist = w.processing
        if dist.kind == "constant" or dist.mean == 0:
            proc = dist.mean
        else:
            proc = dist.sample(u("time_a", m, d), u("time_b", m, d))
        refused = False
        if cfg.downstream is not None:
            capacity, _, call_timeout, shed = cfg.downstream
            if load > capacity:
                # the downstream rejects at once a share of the calls the listener itself
                # would not fail: those whose fail draw lands above p, below the combined
                # chance; the others share C servers among `load` calls
                combined = 1.0 - (1.0 - p) * (1.0 - shed * (load - capacity) / load)
                if shed > 0 and p <= u("fail", m, d) < combined:
                    proc, refused = 0, True
                else:
                    proc = _half_up(Fraction(proc * load, capacity))
            if call_timeout is not None and proc > call_timeout:
                proc, refused = call_timeout, True
        whole = math.floor(cfg.client_overhead)
        proc += whole
        if cfg.client_overhead > whole and u("client_time", m, d) < cfg.client_overhead - whole:
            proc += 1
        poisoned = msg.poisoned and not (msg.replayed and cfg.poison_fixed)
        # u is in (0, 1): p <= 0 never fails, p >= 1 always does (no draw needed)
        fails = (
            poisoned
            or d <= cfg.fail_first
            or refused
            or (p > 0 and (p >= 1 or u("fail", m, d) < p))
        )
        kind = SUCCESS
        if fails:
            rl, ex, nr = cfg.mix
            total = rl + ex + nr
            k = u("kind", m, d)
            if k < rl / total:
                kind = "RECONSUME_LATER"
            elif k < (rl + ex) / total:
                kind = "EXCEPTION"
            else:
                kind = "NULL_RETURN"
        return kind, proc

    # -- rows
    def rows(self) -> tuple[list[dict], list[dict], list[dict]]:
        cfg = self.cfg
        g = cfg.name
        messages = [
            {
                "group": g,
                "topic": cfg.topic,
                "msg_id": m.msg_id,
                "queue_id": m.queue_id,
                "born_ms": m.born_ms,
                "size_bytes": cfg.size_bytes,
            }
            for m in self.messages
        ]
        attempts, transitions = [], []
        # a message sent back twice: its copies still Ready are numbered after those started
        waiting: dict[_Msg, list[_Delivery]] = {}
        for dv in self.deliveries:
            if dv.msg.forked and not dv.started:
                waiting.setdefault(dv.msg, []).append(dv)
        for msg, copies in waiting.items():
            for i, dv in enumerate(sorted(copies, key=lambda x: (x.ready_ms, x.d))):
                dv.d = msg.last_started + 1 + i
        for dv in sorted(self.deliveries, key=lambda x: (x.msg.msg_id, x.d)):
            finished = dv.ended
            attempts.append(
                {
                    "group": g,
                    "msg_id": dv.msg.msg_id,
                    "delivery": dv.d,
                    "reconsume_times": dv.rt,
                    "broker_reconsume_times": dv.brt,
                    "source_topic": dv.topic,
                    "queue_id": dv.queue,
                    # the instance whose cache a 5.x delivery entered (the broker's pick)
                    "consumer_instance": dv.instance if dv.cached else self.instance_of(dv),
                    "born_ms": dv.msg.born_ms,
                    "ready_ms": dv.ready_ms,
                    "start_ms": dv.start_ms,
                    "processing_ms": dv.processing_ms,
                    "end_ms": dv.end_ms if finished else None,
                    "outcome": dv.outcome if finished else None,
                    "result_state": dv.result_state,
                    "delay_level": dv.delay_level,
                    "next_ready_ms": dv.next_ready_ms,
                    "settled_ms": dv.settled_ms,
                    "batch_size": dv.batch_size,
                    "parent_delivery": dv.parent if dv.parent not in (None, dv.d - 1) else None,
                    **dict(zip(COPY_COLUMNS, dv.copy or (None,) * 6, strict=True)),
                }
            )
            steps = [(1, "Ready", dv.ready_ms, dv.topic, dv.queue, None, dv.reason)]
            if dv.started:
                steps.append((2, "Inflight", dv.start_ms, dv.topic, dv.queue, None, "delivered"))
            steps.extend(dv.ends)
            for k, state, at, topic, queue, level, why in steps:
                transitions.append(
                    {
                        "group": g,
                        "msg_id": dv.msg.msg_id,
                        "delivery": dv.d,
                        "seq": 4 * (dv.d - 1) + k,
                        "state": state,
                        "at_ms": at,
                        "topic": topic,
                        "queue_id": queue,
                        "delay_level": level,
                        "reason": why,
                    }
                )
        return messages, attempts, transitions


COPY_COLUMNS = (
    "copy_state",
    "copy_ms",
    "copy_topic",
    "copy_queue_id",
    "copy_delay_level",
    "copy_ready_ms",
)
COPY_ORDER = 1 << 20  # a second copy's first delivery, until it starts (model.md §6)


def simulate_scenario(scenario: dict) -> dict[str, list[dict]]:
    """A raw scenario mapping (as yaml.safe_load gives it; durations are strings like "10s",
    "1500ms", "2h" or the integer 0) -> {"messages": [...], "attempts": [...], "transitions": [...]}
    for all groups."""
    out: dict[str, list[dict]] = {"messages": [], "attempts": [], "transitions": []}
    for g in scenario.get("groups") or []:
        sim = _GroupSim(_group_config(scenario, g))
        sim.run()
        messages, attempts, transitions = sim.rows()
        out["messages"].extend(messages)
        out["attempts"].extend(attempts)
        out["transitions"].extend(transitions)
    return out
