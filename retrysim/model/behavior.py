"""What makes a delivery fail and how long the listener runs (docs/model.md §2-§3).

A delivery's listener result depends only on the message, the delivery number and the time
it starts (outages are time windows). The round engine computes it as Spark column
expressions inside the round's stage; the compiled event loop computes it in numba at
dispatch from the same hashed uniforms and :class:`ListenerModel`'s parameters, so both give
the same result for the same delivery started at the same time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from retrysim.model.rng import uniform, uniform_np
from retrysim.scenario import limits
from retrysim.scenario.spec import Behavior, ProcessingTime

CONSUME_SUCCESS = "CONSUME_SUCCESS"
RECONSUME_LATER = "RECONSUME_LATER"
EXCEPTION = "EXCEPTION"
NULL_RETURN = "NULL_RETURN"
TIMEOUT = "TIMEOUT"
OUTCOMES = (CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION, NULL_RETURN, TIMEOUT)

# Streams keep the draws of one delivery independent of each other.
POISON, FAIL, KIND, TIME_A, TIME_B, SEND_BACK, CLIENT_TIME = (
    "poison",
    "fail",
    "kind",
    "time_a",
    "time_b",
    "send_back",
    "client_time",
)
DELIVERY_STREAMS = (FAIL, KIND, TIME_A, TIME_B, SEND_BACK, CLIENT_TIME)
# How a 4.x send-back goes (DefaultMQPushConsumerImpl.sendMessageBack): the
# CONSUMER_SEND_MSG_BACK RPC does it; the RPC fails and the producer fallback
# (sendMessageBackAsNormalMessage) does it; or both fail and the client resubmits locally.
SEND_BACK_DONE, SEND_BACK_FALLBACK, SEND_BACK_FAILED = 0, 1, 2


def lognormal_params(mean_ms: float, p99_ms: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 99th percentile (smaller sigma root)."""
    gap = math.log(p99_ms) - math.log(mean_ms)
    sigma = limits.Z_99 - math.sqrt(max(limits.Z_99**2 - 2.0 * gap, 0.0))
    return math.log(mean_ms) - sigma**2 / 2.0, sigma


def _kind_thresholds(behavior: Behavior) -> tuple[float, float]:
    mix = behavior.outcome_mix
    total = mix.reconsume_later + mix.exception + mix.null_return
    return mix.reconsume_later / total, (mix.reconsume_later + mix.exception) / total


# How a failure fails and how a send-back goes are each one uniform cut at two thresholds.
_KINDS = (RECONSUME_LATER, EXCEPTION, NULL_RETURN)
_SEND_BACKS = (SEND_BACK_FAILED, SEND_BACK_FALLBACK, SEND_BACK_DONE)


def _band_col(u: Column, thresholds: tuple[float, float], values: tuple) -> Column:
    first, second = thresholds
    return (
        F.when(u < F.lit(first), F.lit(values[0]))
        .when(u < F.lit(second), F.lit(values[1]))
        .otherwise(F.lit(values[2]))
    )


# --------------------------------------------------------------------------- Spark columns


def processing_ms(spec: ProcessingTime, u_a: Column, u_b: Column) -> Column:
    """Milliseconds the listener runs, drawn from ``spec`` with two independent uniforms."""
    if spec.dist == "constant" or spec.mean == 0:
        value = F.lit(float(spec.mean))
    elif spec.dist == "exponential":
        value = -F.lit(float(spec.mean)) * F.log(u_a)
    else:
        mu, sigma = lognormal_params(spec.mean, spec.p99)
        # Box-Muller: a standard normal from two uniforms with built-in functions only.
        normal = F.sqrt(F.lit(-2.0) * F.log(u_a)) * F.cos(F.lit(2.0 * math.pi) * u_b)
        value = F.exp(F.lit(mu) + F.lit(sigma) * normal)
    return F.round(value).cast("long")


# The largest standard exponential and normal the draws can give: a uniform is at least
# 2**-53 (its 53 bits), so -ln(u) is at most 53 ln 2, and Box-Muller's radius its double's root.
_MOST_EXPONENTIAL = 53 * math.log(2.0)
_MOST_NORMAL = math.sqrt(2.0 * _MOST_EXPONENTIAL)


def _longest_ms(spec: ProcessingTime) -> float:
    if spec.dist == "constant" or spec.mean == 0:
        return float(spec.mean)
    if spec.dist == "exponential":
        return spec.mean * _MOST_EXPONENTIAL
    mu, sigma = lognormal_params(spec.mean, spec.p99)
    return math.exp(mu + sigma * _MOST_NORMAL)


def longest_processing_ms(behavior: Behavior) -> float:
    """The longest processing time any delivery can draw: each window's distribution at its
    most extreme draw, and the client's time rounded up. A downstream's load stretches a
    call without bound, or up to its timeout."""
    specs = [behavior.processing_time]
    specs += [w.processing_time for w in behavior.windows if w.processing_time is not None]
    drawn = max(_longest_ms(spec) for spec in specs)
    downstream = behavior.downstream
    if downstream is not None:
        drawn = math.inf if downstream.timeout is None else max(drawn, downstream.timeout)
    return drawn + 1 + math.ceil(behavior.client_overhead)


def _in_window(start_ms: Column, outage_start: int, outage_end: int) -> Column:
    return (start_ms >= F.lit(outage_start)) & (start_ms < F.lit(outage_end))


def with_listener_draws(df: DataFrame, behavior: Behavior, seed: int, group: str) -> DataFrame:
    """Add ``processing_ms``, ``listener_outcome`` and ``send_back`` for deliveries
    starting at ``start_ms`` (needs ``msg_id``, ``delivery`` and ``poison_fixed``)."""
    return df.withColumns(listener_draw_columns(behavior, seed, group))


def client_time_parts(overhead_ms: float) -> tuple[int, float]:
    """The client's own time per delivery in whole milliseconds (docs/model.md §3): every
    delivery holds its thread ``whole`` ms more, and one more where its draw falls below
    ``part``, so that the mean is the overhead: a cost of 0.4 ms a delivery, too fine for
    millisecond times, still slows a saturated pool by its share."""
    whole = math.floor(overhead_ms)
    return whole, round(overhead_ms - whole, 6)  # 2.4 ms: 0.4, not 0.3999999999999999


def client_ms(
    behavior: Behavior, seed: int, group: str, msg_ids: np.ndarray, deliveries: np.ndarray
) -> np.ndarray:
    """The client's own time of each delivery, whole ms (:func:`client_time_parts`): the
    NumPy twin of the draw in :func:`listener_draw_columns`, which the conformance figures
    take off a delivery's processing time to compare the listener's alone."""
    whole, part = client_time_parts(behavior.client_overhead)
    extra = np.full(len(msg_ids), whole, dtype=np.int64)
    if part > 0 and len(msg_ids):
        extra += uniform_np(seed, group, CLIENT_TIME, msg_ids, deliveries) < part
    return extra


def send_back_thresholds(behavior: Behavior) -> tuple[float, float]:
    """One draw decides how a send-back goes: below the first threshold the RPC and its
    fallback both fail, below the second only the RPC does (docs/model.md §3)."""
    failed = behavior.send_back_failure_probability
    return failed, failed + behavior.send_back_fallback_probability


def listener_draw_columns(behavior: Behavior, seed: int | Column, group: str) -> dict[str, Column]:
    """The columns :func:`with_listener_draws` adds, as expressions (the round engine
    builds them once per run and applies them every round)."""
    if behavior.downstream is not None:  # its calls depend on each other: events only
        raise ValueError(
            f"group {group}: a downstream that answers to load is simulated event by event; "
            "the round engine declines it"
        )
    msg_id, delivery, start = F.col("msg_id"), F.col("delivery"), F.col("start_ms")

    def u(stream: str) -> Column:
        return uniform(seed, group, stream, msg_id, delivery)

    u_a, u_b = u(TIME_A), u(TIME_B)
    time_ms: Column = processing_ms(behavior.processing_time, u_a, u_b)
    for outage in behavior.windows:
        if outage.processing_time is not None:
            slow = processing_ms(outage.processing_time, u_a, u_b)
            time_ms = F.when(_in_window(start, outage.start, outage.end), slow).otherwise(time_ms)
    probability: Column = F.lit(behavior.fail_probability)
    for outage in sorted(behavior.windows, key=lambda window: window.fail_probability):
        inside = _in_window(start, outage.start, outage.end)
        probability = F.when(inside, F.lit(outage.fail_probability)).otherwise(probability)
    poisoned = (uniform(seed, group, POISON, msg_id) < F.lit(behavior.poison_fraction)) & ~F.col(
        "poison_fixed"
    )
    fails = poisoned | (delivery <= F.lit(behavior.fail_first)) | (u(FAIL) < probability)
    failure = _band_col(u(KIND), _kind_thresholds(behavior), _KINDS)
    thresholds = send_back_thresholds(behavior)
    send_back: Column = F.lit(SEND_BACK_DONE)
    if thresholds[1] > 0:
        send_back = _band_col(u(SEND_BACK), thresholds, _SEND_BACKS)
    whole, part = client_time_parts(behavior.client_overhead)
    if whole or part:
        time_ms = time_ms + F.lit(whole) + (u(CLIENT_TIME) < F.lit(part)).cast("long")
    return {
        "processing_ms": time_ms,
        "listener_outcome": F.when(fails, failure).otherwise(F.lit(CONSUME_SUCCESS)),
        "send_back": send_back,
    }


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class _Dist:
    kind: str
    mean: float
    mu: float = 0.0
    sigma: float = 0.0

    @classmethod
    def of(cls, spec: ProcessingTime) -> _Dist:
        if spec.dist == "constant" or spec.mean == 0:
            return cls("constant", float(spec.mean))
        if spec.dist == "exponential":
            return cls("exponential", float(spec.mean))
        mu, sigma = lognormal_params(spec.mean, spec.p99)
        return cls("lognormal", float(spec.mean), mu, sigma)


class ListenerModel:
    """A group's listener parameters, for the compiled event loop (``event_rules._doubles``
    makes them its arrays; ``event_rules._listen`` runs them): the twin of
    :func:`with_listener_draws`."""

    def __init__(self, behavior: Behavior) -> None:
        self.fail_first = behavior.fail_first
        self.base_probability = behavior.fail_probability
        self.windows = tuple(
            (o.start, o.end, o.fail_probability, _Dist.of(o.processing_time) if
             o.processing_time is not None else None)
            for o in behavior.windows
        )  # fmt: skip
        self.base_dist = _Dist.of(behavior.processing_time)
        self.kind_thresholds = _kind_thresholds(behavior)
        self.send_back_thresholds = send_back_thresholds(behavior)
        self.downstream = behavior.downstream
        self.client_time = client_time_parts(behavior.client_overhead)


def poisoned(seed: int, group: str, msg_ids: np.ndarray, poison_fraction: float) -> np.ndarray:
    """Which of ``msg_ids`` are poison messages (the NumPy twin of the poison draw in
    :func:`listener_draw_columns`)."""
    if poison_fraction <= 0:
        return np.zeros(len(msg_ids), dtype=bool)
    return uniform_np(seed, group, POISON, msg_ids) < poison_fraction
