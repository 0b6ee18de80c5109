"""The event loop's compiled rules called from Python with the round engine's values:
strings in and out, as the columns take and give them, so a test can hold the two
implementations of a rule to each other case by case (no Spark here)."""

from __future__ import annotations

import numpy as np

from retrysim.engine.event_loop import _next_delivery
from retrysim.engine.event_rules import (
    NULL,
    S_BROKER_RT,
    S_FIELDS,
    S_RT,
    Listener,
    _consume_result,
    _next_step,
    _scalars,
    _table,
    _under_load,
    key_names,
)
from retrysim.model.policy import Policy, Step
from retrysim.scenario.spec import Behavior, Downstream

# Step's fields that hold a string (as a code in the compiled rule's tuple).
_STRINGS = {"result_state", "end_state", "end_topic", "end_reason", "leave_state",
            "leave_topic", "leave_reason", "next_topic", "next_reason"}  # fmt: skip
_HORIZON_MS = 1 << 60  # _next_step never reads it
SEED, GROUP = 42, "g"  # listen_of's draws: those of group GROUP in a scenario of seed SEED


def _codes(policy: Policy) -> tuple[list[str], dict[str, int]]:
    names = key_names(policy)
    return names, {name: code for code, name in reversed(list(enumerate(names)))}


def _value(names: list[str], field: str, value: int) -> str | int | None:
    if value == NULL:
        return None
    return names[value] if field in _STRINGS else int(value)


def step_of(policy: Policy, *case: int | str) -> Step:
    """What follows a settled delivery by the compiled rule (``event_rules._next_step``):
    ``case`` is (rt, broker_rt, outcome, start_ms, end_ms, send_back, topic, queue_id,
    msg_id, delivery)."""
    rt, broker_rt, outcome, start_ms, end_ms, send_back, topic, queue_id, msg_id, delivery = case
    names, code = _codes(policy)
    if topic not in code:  # another group's topic: the rule carries it as it is
        code[topic] = len(names)
        names.append(topic)
    k = _scalars(policy, Behavior(), _HORIZON_MS)
    tables = (_table(policy.intervals_ms), _table(policy.levels), _table(policy.resend_levels),
              _table(policy.resend_intervals_ms))  # fmt: skip
    step = _next_step(k, *tables, rt, broker_rt, code[outcome], start_ms, end_ms,
                      np.int64(send_back), code[topic], queue_id, msg_id, delivery)  # fmt: skip
    return Step(
        *(_value(names, field, value) for field, value in zip(Step._fields, step, strict=True))
    )


def result_of(policy: Policy, start_ms: int, processing_ms: int, outcome: str) -> tuple[str, int]:
    """(outcome, end_ms) by the compiled rule (``event_rules._consume_result``)."""
    names, code = _codes(policy)
    k = _scalars(policy, Behavior(), _HORIZON_MS)
    settled, end = _consume_result(k, start_ms, processing_ms, code[outcome])
    return names[settled], int(end)


def reconsume_of(policy: Policy, rt: int, broker_rt: int, end_reason: str) -> tuple[int, int]:
    """(reconsume_times, broker_reconsume_times) of the delivery a retry with ``end_reason``
    leads to, by the compiled loop's rule (``event_loop._next_delivery``)."""
    _, code = _codes(policy)
    slots = np.zeros((S_FIELDS, 1), np.int64)
    slots[S_RT, 0], slots[S_BROKER_RT, 0] = rt, broker_rt
    step = tuple(np.int64(code[end_reason] if field == 7 else 0) for field in range(15))
    _next_delivery(_scalars(policy, Behavior(), _HORIZON_MS), slots, 0, step)
    return int(slots[S_RT, 0]), int(slots[S_BROKER_RT, 0])


def load_of(processing_ms: int, probability: float, concurrency: int, downstream: Downstream,
            u_fail: float) -> tuple[int, bool]:  # fmt: skip
    """(processing_ms, refused) of a call under load (``event_rules._under_load``)."""
    timeout = -1 if downstream.timeout is None else downstream.timeout
    processing, refused = _under_load(
        processing_ms, probability, concurrency, u_fail, downstream.capacity, downstream.shed,
        timeout,
    )  # fmt: skip
    return int(processing), bool(refused)


def listen_of(
    behavior: Behavior, msg_id: int, delivery: int, start_ms: int, concurrency: int = 1
) -> tuple[str, int, int]:
    """(outcome, processing_ms, send_back) of one delivery of a group whose listener does
    ``behavior`` (``event_rules._listen``, with the hashed draws of the loop)."""
    listen = Listener(behavior, SEED, GROUP)
    poisoned = bool(listen.poisoned(np.array([msg_id]))[0])
    return listen(msg_id, delivery, start_ms, poisoned, concurrency)
