"""Reference model of RocketMQ 4.x concurrent push-consumer retry, one message at a time.

Written independently from the engine (nothing in ``retrysim/`` is read or imported), from
the rules in ../shared/ROCKETMQ_SEMANTICS.md §2 (concurrent consumer) and §3 (broker
send-back). It walks each message event by event in plain Python and emits the same flat
attempt and transition rows as the Spark engine, so the engine can be checked row by row.

Example::

    cfg = RefGroup("g", "T", horizon_ms=86_400_000, delay_table_ms=(1000, 5000, 10000),
                   max_reconsume_times=16)
    attempts, transitions = simulate_message(
        cfg, RefMessage(msg_id=1, queue_id=0, born_ms=0), {1: ("CONSUME_SUCCESS", 5)}
    )
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["RefGroup", "RefMessage", "simulate_all", "simulate_message"]

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
# 4.x expired-message cleaner sends a timed-out message back at this fixed delay level.
TIMEOUT_DELAY_LEVEL = 3
# With delayLevelWhenNextConsume == 0 the broker uses level 3 + reconsume_times.
BASE_DELAY_LEVEL = 3
TIMEOUT = "TIMEOUT"
SUCCESS = "CONSUME_SUCCESS"
FAILURES = frozenset({"RECONSUME_LATER", "EXCEPTION", "NULL_RETURN", TIMEOUT})

Draw = tuple[str | None, int]  # (listener_outcome, processing_ms)
Draws = Mapping[int, Draw]


@dataclass(frozen=True)
class RefGroup:
    group: str
    topic: str
    horizon_ms: int
    delay_table_ms: tuple[int, ...]  # broker delay levels, level 1 = index 0
    max_reconsume_times: int  # already resolved (-1 mapped to 16 by the caller)
    delay_level_when_next_consume: int = 0
    consume_timeout_ms: int = 15 * 60_000
    timeout_check: str = "exact"  # "exact" | "periodic"
    dlq_enabled: bool = True


@dataclass(frozen=True)
class RefMessage:
    msg_id: int
    queue_id: int
    born_ms: int


def _timeout_leave_ms(cfg: RefGroup, start_ms: int, p: int) -> int | None:
    """Time the delivery is abandoned as expired, or None if it finishes in time."""
    t = cfg.consume_timeout_ms
    if cfg.timeout_check == "exact":
        return start_ms + t if p > t else None
    if cfg.timeout_check == "periodic":
        check = t * ((start_ms + t) // t + 1)  # first multiple of T strictly after start + T
        return check if start_ms + p > check else None
    raise ValueError(f"timeout_check={cfg.timeout_check!r}; allowed: 'exact', 'periodic'")


def _requested_level(cfg: RefGroup, outcome: str, rt: int) -> int:
    """Delay level asked for by the send-back (§2/§3); may be negative."""
    if outcome == TIMEOUT:
        return TIMEOUT_DELAY_LEVEL
    if cfg.delay_level_when_next_consume == 0:
        return BASE_DELAY_LEVEL + rt
    return cfg.delay_level_when_next_consume


def _outcome_and_end(cfg: RefGroup, msg: RefMessage, d: int, start_ms: int, draw: Draw) -> tuple:
    """(outcome, end_ms), deciding timeout from processing_ms and checking the caller's view."""
    listener, p = draw
    leave_ms = _timeout_leave_ms(cfg, start_ms, p)
    where = f"msg {msg.msg_id} delivery {d}: outcome {listener!r} with processing_ms={p}"
    rule = f"({cfg.timeout_check} check, consume_timeout_ms={cfg.consume_timeout_ms})"
    if leave_ms is not None:
        if listener not in (None, TIMEOUT):
            raise AssertionError(f"{where} times out {rule}; expected TIMEOUT")
        return TIMEOUT, leave_ms
    if listener == TIMEOUT:
        raise AssertionError(f"{where} does not time out {rule}")
    return listener, start_ms + p


def _settle(
    cfg: RefGroup, msg: RefMessage, d: int, outcome: str | None, end_ms: int, topic: str, q: int
) -> tuple:
    """(result_state, delay_level, next_ready_ms, end transition) of a finished delivery."""
    rt = d - 1
    if outcome == SUCCESS:
        return "Commit", None, None, ("Commit", end_ms, topic, q, None, SUCCESS)
    if outcome not in FAILURES:
        raise ValueError(f"msg {msg.msg_id} delivery {d}: unknown outcome {outcome!r}")
    requested = _requested_level(cfg, outcome, rt)
    if rt >= cfg.max_reconsume_times or requested < 0:
        reason = "max_reconsume_times" if rt >= cfg.max_reconsume_times else "delay_level_negative"
        if cfg.dlq_enabled:
            return "DLQ", None, None, ("DLQ", end_ms, DLQ_PREFIX + cfg.group, 0, None, reason)
        return "Discard", None, None, ("Discard", end_ms, topic, q, None, reason)
    level = min(requested, len(cfg.delay_table_ms))
    next_ready_ms = end_ms + cfg.delay_table_ms[level - 1]
    end = ("WaitingRetry", end_ms, SCHEDULE_TOPIC, level - 1, level, outcome)
    return "WaitingRetry", level, next_ready_ms, end


def simulate_message(cfg: RefGroup, msg: RefMessage, draws: Draws) -> tuple[list[dict], list[dict]]:
    """Attempt and transition rows for one message.

    ``draws[d] = (listener_outcome, processing_ms)`` for delivery ``d`` (1-based); the
    outcome may be None when the delivery is cut by the horizon.  A missing draw for a
    delivery that happens raises KeyError.
    """
    attempts: list[dict] = []
    transitions: list[dict] = []
    retry_topic = RETRY_PREFIX + cfg.group
    d, topic, queue_id, ready_ms = 1, cfg.topic, msg.queue_id, msg.born_ms
    while ready_ms < cfg.horizon_ms:
        rt, start_ms = d - 1, ready_ms  # unlimited capacity: starts as soon as ready
        draw = draws[d]
        row = {
            "group": cfg.group,
            "msg_id": msg.msg_id,
            "delivery": d,
            "reconsume_times": rt,
            "source_topic": topic,
            "queue_id": queue_id,
            "ready_ms": ready_ms,
            "start_ms": start_ms,
            "processing_ms": draw[1],
            "end_ms": None,
            "outcome": None,
            "result_state": "Inflight",
            "delay_level": None,
            "next_ready_ms": None,
        }
        attempts.append(row)
        first = "published" if d == 1 else "retry_due"
        steps = [
            ("Ready", ready_ms, topic, queue_id, None, first),
            ("Inflight", start_ms, topic, queue_id, None, "delivered"),
        ]
        outcome, end_ms = _outcome_and_end(cfg, msg, d, start_ms, draw)
        next_ready_ms = None
        if end_ms < cfg.horizon_ms:  # else still in flight at the horizon: stop here
            state, level, next_ready_ms, end = _settle(
                cfg, msg, d, outcome, end_ms, topic, queue_id
            )
            row.update(outcome=outcome, end_ms=end_ms, result_state=state)
            row.update(delay_level=level, next_ready_ms=next_ready_ms)
            steps.append(end)
        for i, (state_, at_ms, tp, q, lvl, reason_) in enumerate(steps, start=1):
            transitions.append(
                {
                    "group": cfg.group,
                    "msg_id": msg.msg_id,
                    "delivery": d,
                    "seq": 3 * (d - 1) + i,
                    "state": state_,
                    "at_ms": at_ms,
                    "topic": tp,
                    "queue_id": q,
                    "delay_level": lvl,
                    "reason": reason_,
                }
            )
        if next_ready_ms is None:
            break  # committed, dead-lettered, discarded or cut by the horizon
        d, topic, queue_id, ready_ms = d + 1, retry_topic, 0, next_ready_ms
    return attempts, transitions


def simulate_all(
    cfg: RefGroup, messages: Iterable[RefMessage], draws_by_msg: Mapping[int, Draws]
) -> tuple[list[dict], list[dict]]:
    """Concatenated rows of :func:`simulate_message` over ``messages``."""
    attempts: list[dict] = []
    transitions: list[dict] = []
    for msg in messages:
        a, t = simulate_message(cfg, msg, draws_by_msg.get(msg.msg_id, {}))
        attempts.extend(a)
        transitions.extend(t)
    return attempts, transitions
