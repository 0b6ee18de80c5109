"""What makes a delivery fail and how long the listener runs, as Spark column expressions.

A delivery's listener outcome depends only on the message, the delivery number and the
time it starts (outages are time windows), so it is computed inside the round's stage from
hashed uniforms (see :mod:`retrysim.rng`) without any Python UDF.
"""

from __future__ import annotations

import math

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from retrysim import limits
from retrysim.config import Behavior, ProcessingTime
from retrysim.rng import uniform

CONSUME_SUCCESS = "CONSUME_SUCCESS"
RECONSUME_LATER = "RECONSUME_LATER"
EXCEPTION = "EXCEPTION"
NULL_RETURN = "NULL_RETURN"
TIMEOUT = "TIMEOUT"
OUTCOMES = (CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION, NULL_RETURN, TIMEOUT)

# Streams keep the draws of one delivery independent of each other.
_POISON, _FAIL, _KIND, _TIME_A, _TIME_B = "poison", "fail", "kind", "time_a", "time_b"


def lognormal_params(mean_ms: float, p99_ms: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 99th percentile (smaller sigma root)."""
    gap = math.log(p99_ms) - math.log(mean_ms)
    sigma = limits.Z_99 - math.sqrt(max(limits.Z_99**2 - 2.0 * gap, 0.0))
    return math.log(mean_ms) - sigma**2 / 2.0, sigma


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


def _in_window(start_ms: Column, outage_start: int, outage_end: int) -> Column:
    return (start_ms >= F.lit(outage_start)) & (start_ms < F.lit(outage_end))


def with_listener_draws(
    df: DataFrame, behavior: Behavior, seed: int, group: str, start_col: str = "start_ms"
) -> DataFrame:
    """Add ``processing_ms`` and ``listener_outcome``: what the listener does, before timeouts.

    Failure is certain for poison messages and for the first ``fail_first`` deliveries;
    otherwise it happens with ``fail_probability``, replaced inside an outage window by that
    window's probability (the highest one where windows overlap).
    """
    msg_id, delivery, start = F.col("msg_id"), F.col("delivery"), F.col(start_col)
    u_a = uniform(seed, group, _TIME_A, msg_id, delivery)
    u_b = uniform(seed, group, _TIME_B, msg_id, delivery)

    time_ms: Column = processing_ms(behavior.processing_time, u_a, u_b)
    probability = _outage_probability(behavior, start)
    for outage in behavior.outages:
        if outage.processing_time is not None:
            slow = processing_ms(outage.processing_time, u_a, u_b)
            time_ms = F.when(_in_window(start, outage.start, outage.end), slow).otherwise(time_ms)

    poisoned = uniform(seed, group, _POISON, msg_id) < F.lit(behavior.poison_fraction)
    fails = (
        poisoned
        | (delivery <= F.lit(behavior.fail_first))
        | (uniform(seed, group, _FAIL, msg_id, delivery) < probability)
    )
    return df.withColumn("processing_ms", time_ms).withColumn(
        "listener_outcome",
        F.when(
            fails, _failure_kind(behavior, uniform(seed, group, _KIND, msg_id, delivery))
        ).otherwise(F.lit(CONSUME_SUCCESS)),
    )


def _outage_probability(behavior: Behavior, start: Column) -> Column:
    """The failure chance at ``start``: an outage window's own chance replaces the base one
    (the highest window's where windows overlap)."""
    probability: Column = F.lit(behavior.fail_probability)
    for outage in sorted(behavior.outages, key=lambda window: window.fail_probability):
        inside = _in_window(start, outage.start, outage.end)
        probability = F.when(inside, F.lit(outage.fail_probability)).otherwise(probability)
    return probability


def _failure_kind(behavior: Behavior, u: Column) -> Column:
    """How a failed delivery fails, by the weights of ``outcome_mix``."""
    mix = behavior.outcome_mix
    total = mix.reconsume_later + mix.exception + mix.null_return
    first, second = mix.reconsume_later / total, (mix.reconsume_later + mix.exception) / total
    return (
        F.when(u < F.lit(first), F.lit(RECONSUME_LATER))
        .when(u < F.lit(second), F.lit(EXCEPTION))
        .otherwise(F.lit(NULL_RETURN))
    )
