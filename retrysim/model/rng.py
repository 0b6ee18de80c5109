"""Deterministic, partition-independent random draws, in Spark and in NumPy.

Every draw is a pure function of ``(seed, group, stream, msg_id, delivery)`` hashed with
Spark's own ``xxhash64``, never ``rand()`` (whose values depend on how rows are split across
partitions) and never a Python generator (which would not exist on executors). So the same
scenario gives the same rows on ``local[1]``, ``local[*]`` and a cluster.

The sequential engine (orderly queues, finite consumer pools) runs inside pandas UDFs where
Spark's functions are not available, so this module also carries a NumPy port of Spark's
``XXH64`` (``org.apache.spark.sql.catalyst.expressions.XXH64``): :func:`uniform_np` returns
bit-for-bit the same doubles as :func:`uniform` for the same keys (tests/model/test_rng.py checks
it against Spark). The constant keys come first in the hash so that the NumPy side hashes
only two machine words per draw.
"""

from __future__ import annotations

import struct

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

_MANTISSA_BITS = 53
_SCALE = float(2**_MANTISSA_BITS)
_SPARK_HASH_SEED = 42  # XxHash64's default seed in Spark SQL
_MASK64 = 2**64 - 1

_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def uniform(
    seed: int | Column, group: str, stream: str, msg_id: Column, delivery: Column | int = 0
) -> Column:
    """A uniform double in the open interval (0, 1), one per key; 53 bits of the hash (the
    seed a column where rows of several runs share the expression).

    The types of the hashed values are pinned (long seed, long msg_id, int delivery) because
    ``xxhash64`` hashes an int and a long of the same value differently.
    """
    delivery_col = delivery if isinstance(delivery, Column) else F.lit(delivery)
    hashed = F.xxhash64(
        F.lit(seed).cast("long"),
        F.lit(group),
        F.lit(stream),
        msg_id.cast("long"),
        delivery_col.cast("int"),
    )
    top_bits = F.shiftright(hashed, 64 - _MANTISSA_BITS).bitwiseAND(F.lit(2**_MANTISSA_BITS - 1))
    return (top_bits.cast("double") + F.lit(0.5)) / F.lit(_SCALE)


# --------------------------------------------------------------------------- NumPy port


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK64


def _fmix(value: int) -> int:
    value ^= value >> 33
    value = (value * _P2) & _MASK64
    value ^= value >> 29
    value = (value * _P3) & _MASK64
    return value ^ (value >> 32)


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _MASK64, 31) * _P1) & _MASK64


def _hash_long(value: int, seed: int) -> int:
    acc = (seed + _P5 + 8) & _MASK64
    acc ^= (_rotl((value * _P2) & _MASK64, 31) * _P1) & _MASK64
    return _fmix((_rotl(acc, 27) * _P1 + _P4) & _MASK64)


def hash_long(value: int, seed: int) -> int:
    """Spark's ``xxhash64`` of one long under ``seed``, as an unsigned 64-bit integer."""
    return _hash_long(value & _MASK64, seed & _MASK64)


def _hash_bytes(data: bytes, seed: int) -> int:
    """XXH64.hashUnsafeBytes: Spark's hash of a UTF8String (little-endian words)."""
    length, offset = len(data), 0
    if length >= 32:
        v1, v2 = (seed + _P1 + _P2) & _MASK64, (seed + _P2) & _MASK64
        v3, v4 = seed, (seed - _P1) & _MASK64
        while offset <= length - 32:
            lanes = struct.unpack_from("<4Q", data, offset)
            v1, v2 = _round(v1, lanes[0]), _round(v2, lanes[1])
            v3, v4 = _round(v3, lanes[2]), _round(v4, lanes[3])
            offset += 32
        acc = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK64
        for lane in (v1, v2, v3, v4):
            acc ^= _round(0, lane)
            acc = (acc * _P1 + _P4) & _MASK64
    else:
        acc = (seed + _P5) & _MASK64
    acc = (acc + length) & _MASK64
    while offset <= length - 8:
        (word,) = struct.unpack_from("<Q", data, offset)
        acc ^= _round(0, word)
        acc = (_rotl(acc, 27) * _P1 + _P4) & _MASK64
        offset += 8
    if offset + 4 <= length:
        (word,) = struct.unpack_from("<I", data, offset)
        acc ^= (word * _P1) & _MASK64
        acc = (_rotl(acc, 23) * _P2 + _P3) & _MASK64
        offset += 4
    while offset < length:
        acc ^= (data[offset] * _P5) & _MASK64
        acc = (_rotl(acc, 11) * _P1) & _MASK64
        offset += 1
    return _fmix(acc)


def key_prefix(seed: int, group: str, stream: str) -> int:
    """The running hash after the constant keys ``(seed, group, stream)``."""
    acc = _hash_long(seed & _MASK64, _SPARK_HASH_SEED)
    acc = _hash_bytes(group.encode("utf-8"), acc)
    return _hash_bytes(stream.encode("utf-8"), acc)


def _np_rotl(values: np.ndarray, bits: int) -> np.ndarray:
    return (values << np.uint64(bits)) | (values >> np.uint64(64 - bits))


def _np_fmix(values: np.ndarray) -> np.ndarray:
    values = values ^ (values >> np.uint64(33))
    values = values * np.uint64(_P2)
    values = values ^ (values >> np.uint64(29))
    values = values * np.uint64(_P3)
    return values ^ (values >> np.uint64(32))


def hash_long_np(values: np.ndarray, seed: int = _SPARK_HASH_SEED) -> np.ndarray:
    """Spark's ``xxhash64`` of one long column (``XXH64.hashLong``) as uint64 bits, with
    ``seed`` the running hash of the columns before it (Spark SQL's 42 for the first)."""
    with np.errstate(over="ignore"):
        acc = np.uint64((seed + _P5 + 8) & _MASK64)
        acc = acc ^ (_np_rotl(values.astype(np.uint64) * np.uint64(_P2), 31) * np.uint64(_P1))
        return _np_fmix(_np_rotl(acc, 27) * np.uint64(_P1) + np.uint64(_P4))


def uniform_np(
    seed: int, group: str, stream: str, msg_ids: np.ndarray, deliveries: np.ndarray | int = 0
) -> np.ndarray:
    """:func:`uniform` in NumPy: the same doubles for the same keys, vectorised."""
    ids = np.asarray(msg_ids, dtype=np.int64)
    rounds = np.broadcast_to(np.asarray(deliveries, dtype=np.int64), ids.shape)
    acc = hash_long_np(ids, key_prefix(seed, group, stream))
    with np.errstate(over="ignore"):
        # hashInt(delivery, acc): the int's 32 bits, zero-extended
        words = rounds.astype(np.uint32).astype(np.uint64)
        acc = acc + np.uint64(_P5 + 4)
        acc = acc ^ (words * np.uint64(_P1))
        acc = _np_fmix(_np_rotl(acc, 23) * np.uint64(_P2) + np.uint64(_P3))
    top_bits = (acc >> np.uint64(64 - _MANTISSA_BITS)).astype(np.float64)
    return (top_bits + 0.5) / _SCALE
