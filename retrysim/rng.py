"""Deterministic, partition-independent random draws.

Every draw is a pure function of ``(seed, group, msg_id, delivery, stream)`` hashed with
Spark's own ``xxhash64``, never ``rand()`` (whose values depend on how rows are split across
partitions) and never a Python generator (which would not exist on executors). So the same
scenario gives the same rows on ``local[1]``, ``local[*]`` and a cluster.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

_MANTISSA_BITS = 53
_SCALE = float(2**_MANTISSA_BITS)


def uniform(seed: int, group: str, msg_id: Column, delivery: Column | int, stream: str) -> Column:
    """A uniform double in the open interval (0, 1), one per key; 53 bits of the hash.

    The types of the hashed values are pinned (long seed, long msg_id, int delivery) because
    ``xxhash64`` hashes an int and a long of the same value differently.
    """
    delivery_col = delivery if isinstance(delivery, Column) else F.lit(delivery)
    hashed = F.xxhash64(
        F.lit(seed).cast("long"),
        F.lit(group),
        msg_id.cast("long"),
        delivery_col.cast("int"),
        F.lit(stream),
    )
    top_bits = F.shiftright(hashed, 64 - _MANTISSA_BITS).bitwiseAND(F.lit(2**_MANTISSA_BITS - 1))
    return (top_bits.cast("double") + F.lit(0.5)) / F.lit(_SCALE)
