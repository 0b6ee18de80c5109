"""Every port of Spark's xxhash64 draws (NumPy's, and numba's that the compiled loop runs)
must equal Spark's own, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import functions as F

from retrysim.model import xxh64
from retrysim.model.rng import key_prefix, uniform, uniform_np

KEYS = [
    (0, "g", "fail"),
    (42, "order-service", "time_a"),
    (2**63 - 1, "a-group-name-longer-than-thirty-two-bytes-for-the-word-loop", "kind"),
    (7, "ünïcode-grüppe", "poison"),
    (123456789, "%RETRY%x", "s" * 37),
]


def _numpy_draws(seed: int, group: str, stream: str, ids, deliveries) -> np.ndarray:
    return uniform_np(seed, group, stream, ids, deliveries)


def _compiled_draws(seed: int, group: str, stream: str, ids, deliveries) -> np.ndarray:
    prefix = np.uint64(key_prefix(seed, group, stream))
    return np.array(
        [
            xxh64.uniform(prefix, m, d)
            for m, d in zip(ids.tolist(), deliveries.tolist(), strict=True)
        ]
    )


@pytest.mark.parametrize("draws", [_numpy_draws, _compiled_draws], ids=["numpy", "numba"])
@pytest.mark.parametrize(("seed", "group", "stream"), KEYS)
def test_every_ports_draws_equal_sparks(spark, seed, group, stream, draws):
    frame = spark.range(0, 2000).select(
        (F.col("id") * F.lit(7_919) + F.lit(2**40)).alias("msg_id"),
        (F.col("id") % F.lit(23) - F.lit(1)).cast("int").alias("delivery"),
    )
    rows = frame.select(
        "msg_id", "delivery", uniform(seed, group, stream, F.col("msg_id"), F.col("delivery"))
    ).collect()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    deliveries = np.array([r[1] for r in rows], dtype=np.int64)
    expected = np.array([r[2] for r in rows])
    assert np.array_equal(draws(seed, group, stream, ids, deliveries), expected)


def test_draws_are_uniform_and_open_interval():
    draws = uniform_np(1, "g", "fail", np.arange(200_000), 1)
    assert draws.min() > 0.0 and draws.max() < 1.0
    assert abs(draws.mean() - 0.5) < 0.005
    counts, _ = np.histogram(draws, bins=10, range=(0, 1))
    assert counts.min() > 19_000 and counts.max() < 21_000


def test_each_key_part_changes_the_draw():
    base = uniform_np(1, "g", "fail", np.array([5]), 1)[0]
    assert uniform_np(2, "g", "fail", np.array([5]), 1)[0] != base
    assert uniform_np(1, "h", "fail", np.array([5]), 1)[0] != base
    assert uniform_np(1, "g", "kind", np.array([5]), 1)[0] != base
    assert uniform_np(1, "g", "fail", np.array([6]), 1)[0] != base
    assert uniform_np(1, "g", "fail", np.array([5]), 2)[0] != base
