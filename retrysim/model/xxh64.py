"""Spark's ``xxhash64`` (XXH64 as Spark's ``XXH64`` class runs it) in numba: the one compiled
form of the hash, for the compiled event loop's draws (:func:`uniform`) and the check's row
hashes over staged files (:mod:`retrysim.checks.spark_hash`). :mod:`retrysim.model.rng` holds
the same hash in Python integers and NumPy, and Spark's own expression is the reference the
tests hold both to. Every function is inlined into its caller.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from retrysim.model import rng
from retrysim.numba_cache import cache_by_source

cache_by_source(__name__, __loader__, __file__)  # before the first @njit(cache=True)

P1, P2, P3 = np.uint64(rng._P1), np.uint64(rng._P2), np.uint64(rng._P3)
P4, P5 = np.uint64(rng._P4), np.uint64(rng._P5)
LONG_SEED_ADD = np.uint64((rng._P5 + 8) & rng._MASK64)
INT_SEED_ADD = np.uint64((rng._P5 + 4) & rng._MASK64)
LOW32 = np.uint64(0xFFFFFFFF)
SCALE = rng._SCALE  # a draw's double from the hash's top bits


@njit(cache=True, inline="always")
def rotl(value, bits):
    return (value << np.uint64(bits)) | (value >> np.uint64(64 - bits))


@njit(cache=True, inline="always")
def fmix(value):
    value ^= value >> np.uint64(33)
    value *= P2
    value ^= value >> np.uint64(29)
    value *= P3
    return value ^ (value >> np.uint64(32))


@njit(cache=True, inline="always")
def round_lane(acc, lane):
    return rotl(acc + lane * P2, 31) * P1


@njit(cache=True, inline="always")
def hash_long(acc, value):
    """XXH64.hashLong of ``value`` (uint64 bits) with the running hash ``acc`` as seed."""
    h = acc + LONG_SEED_ADD
    h ^= rotl(value * P2, 31) * P1
    return fmix(rotl(h, 27) * P1 + P4)


@njit(cache=True, inline="always")
def hash_int(acc, value):
    """XXH64.hashInt: the int's 32 bits (of ``value``, uint64), zero-extended."""
    h = acc + INT_SEED_ADD
    h ^= (value & LOW32) * P1
    return fmix(rotl(h, 23) * P2 + P3)


@njit(cache=True, inline="always")
def word(data, at, width):
    """The little-endian word of ``width`` bytes of ``data`` at ``at``."""
    value = np.uint64(0)
    for j in range(width):
        value |= np.uint64(data[at + j]) << np.uint64(8 * j)
    return value


@njit(cache=True)
def hash_bytes(seed, data, start, end):
    """XXH64.hashUnsafeBytes of ``data[start:end]`` (a UTF8String's bytes)."""
    length = end - start
    at = start
    if length >= 32:
        v1 = seed + P1 + P2
        v2 = seed + P2
        v3 = seed
        v4 = seed - P1
        while at <= end - 32:
            v1 = round_lane(v1, word(data, at, 8))
            v2 = round_lane(v2, word(data, at + 8, 8))
            v3 = round_lane(v3, word(data, at + 16, 8))
            v4 = round_lane(v4, word(data, at + 24, 8))
            at += 32
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18)
        for lane in (v1, v2, v3, v4):
            h ^= round_lane(np.uint64(0), lane)
            h = h * P1 + P4
    else:
        h = seed + P5
    h += np.uint64(length)
    while at <= end - 8:
        h ^= round_lane(np.uint64(0), word(data, at, 8))
        h = rotl(h, 27) * P1 + P4
        at += 8
    if at + 4 <= end:
        h ^= word(data, at, 4) * P1
        h = rotl(h, 23) * P2 + P3
        at += 4
    while at < end:
        h ^= np.uint64(data[at]) * P5
        h = rotl(h, 11) * P1
        at += 1
    return fmix(h)


@njit(cache=True, inline="always")
def uniform(prefix, msg_id, delivery):
    """:func:`retrysim.model.rng.uniform_np` of one key (``prefix``: the running hash of its
    constant keys): ``xxhash64(.., msg_id, delivery)``'s top 53 bits as a double in (0, 1),
    bit for bit."""
    acc = hash_int(hash_long(prefix, np.uint64(msg_id)), np.uint64(np.uint32(delivery)))
    return (float(acc >> np.uint64(11)) + 0.5) / SCALE
