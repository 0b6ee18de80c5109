"""Spark's ``xxhash64`` in numba (:mod:`retrysim.model.xxh64`), bit for bit, over columns
of a batch.

The check's passes over staged files (:mod:`retrysim.checks.file_passes`) hash the same values as
its Spark expressions, and the digests of both sides must agree: a row's hash is
``F.xxhash64`` of its values in order, a null value skipped (XXH64.hashLong, hashInt and
hashUnsafeBytes, as Spark runs them; a boolean is hashed as the int 0 or 1), with
:func:`retrysim.checks.invariants.transition_hash`'s null mask as a last int.
tests/checks/test_file_passes.py holds every pass built on it to Spark's results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numba import njit

from retrysim.model import xxh64
from retrysim.numba_cache import cache_by_source

cache_by_source(__name__, __loader__, __file__)  # before the first @njit(cache=True)

_SPARK_SEED = 42  # xxhash64's seed in Spark


@njit(cache=True)
def _mix_longs(acc, values, valid):
    """XXH64.hashLong of each valid value into its row's running hash (``values``: uint64)."""
    for i in range(acc.size):
        if valid[i]:
            acc[i] = xxh64.hash_long(acc[i], values[i])


@njit(cache=True)
def _mix_ints(acc, values, valid):
    """XXH64.hashInt (the int's 32 bits, zero-extended; ``values``: uint64)."""
    for i in range(acc.size):
        if valid[i]:
            acc[i] = xxh64.hash_int(acc[i], values[i])


@njit(cache=True)
def _mix_strings(acc, offsets, data, valid):
    for i in range(acc.size):
        if valid[i]:
            acc[i] = xxh64.hash_bytes(acc[i], data, offsets[i], offsets[i + 1])


@njit(cache=True)
def _mix_string(acc, data, valid):
    """The same string (``data``) into every valid row."""
    for i in range(acc.size):
        if valid[i]:
            acc[i] = xxh64.hash_bytes(acc[i], data, 0, data.size)


# --------------------------------------------------------------------------- values


@dataclass
class Value:
    """A column as Spark sees it in an expression: its type (``long``, ``int`` or ``str``),
    its values (uint64 bits; for a string, Arrow's offsets and bytes, or one constant's bytes)
    and which rows are not null."""

    kind: str
    valid: np.ndarray
    bits: np.ndarray | None = None
    offsets: np.ndarray | None = None
    data: np.ndarray | None = None
    constant: bool = False

    def __post_init__(self) -> None:
        # read-only views: Arrow's zero-copy arrays are read-only, and numba compiles a
        # kernel for each combination of flags it is called with; one combination, warmed up
        for name in ("valid", "bits", "offsets", "data"):
            array = getattr(self, name)
            if array is not None and array.flags.writeable:
                array = array.view()
                array.flags.writeable = False
                setattr(self, name, array)

    def mix_into(self, acc: np.ndarray) -> None:
        if self.kind == "long":
            _mix_longs(acc, self.bits, self.valid)
        elif self.kind == "int":
            _mix_ints(acc, self.bits, self.valid)
        elif self.constant:
            _mix_string(acc, self.data, self.valid)
        else:
            _mix_strings(acc, self.offsets, self.data, self.valid)

    def where(self, condition: np.ndarray) -> Value:
        """``F.when(condition, value)``: null where ``condition`` is not true."""
        return Value(self.kind, self.valid & condition, self.bits, self.offsets, self.data,
                     self.constant)  # fmt: skip


def number(kind: str, values: np.ndarray, valid: np.ndarray | None = None) -> Value:
    values = np.asarray(values, dtype=np.int64)
    present = np.ones(values.size, bool) if valid is None else valid
    return Value(kind, present, bits=values.view(np.uint64))


def constant(kind: str, value, rows: int, valid: np.ndarray | None = None) -> Value:
    present = np.ones(rows, bool) if valid is None else valid
    if kind == "str":
        data = np.frombuffer(value.encode("utf-8"), dtype=np.uint8)
        return Value("str", present, data=data, constant=True)
    return number(kind, np.full(rows, int(value), dtype=np.int64), present)


def null(kind: str, rows: int) -> Value:
    return Value(kind, np.zeros(rows, bool), bits=np.zeros(rows, np.uint64),
                 offsets=np.zeros(rows + 1, np.int32), data=np.zeros(0, np.uint8))  # fmt: skip


def spark_hash(values: list[Value], rows: int, null_mask: bool = True) -> np.ndarray:
    """``F.xxhash64(*values)`` (with :func:`retrysim.checks.invariants.transition_hash`'s null
    mask as a last int when ``null_mask``), as uint64 bits."""
    acc = np.full(rows, _SPARK_SEED, dtype=np.uint64)
    mask = np.zeros(rows, dtype=np.int64)
    for bit, value in enumerate(values):
        value.mix_into(acc)
        mask |= (~value.valid).astype(np.int64) << bit
    if null_mask:
        number("int", mask).mix_into(acc)
    return acc


def warm_up() -> None:
    """Compile the kernels (or load them from numba's cache on disk) on a few values of each
    kind: setup runs it once, so that no Spark task pays the compilation."""
    rows = 3
    values = [number("long", np.arange(rows)), number("int", np.arange(rows)),
              constant("str", "warm", rows), null("str", rows)]  # fmt: skip
    strings = pa.array(["a", None, "b" * 40])
    buffers = strings.buffers()
    valid = strings.is_valid().to_numpy(zero_copy_only=False)
    offsets, data = np.frombuffer(buffers[1], np.int32), np.frombuffer(buffers[2], np.uint8)
    values.append(Value("str", valid, offsets=offsets, data=data))
    spark_hash(values, rows)
