"""The grouping under the NumPy twin of the load's compact rows (retrysim.tables.key_counts):
exact whether or not two kinds of row hash alike."""

from __future__ import annotations

import numpy as np
import pytest

from retrysim.tables import key_counts


def _kinds(matrix: np.ndarray) -> set[tuple[tuple[int, ...], int]]:
    """Each kind of row with how many rows it has, from the grouping."""
    first, kind = key_counts._unique_rows(matrix)
    counts = np.bincount(kind, minlength=len(first))
    return {(tuple(matrix[i].tolist()), int(c)) for i, c in zip(first, counts, strict=True)}


@pytest.fixture
def rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    matrix = rng.integers(-2, 3, size=(5000, 6)).astype(np.int64)
    matrix[:, 2] = np.where(matrix[:, 2] > 0, key_counts.NULL, matrix[:, 2])
    return matrix


def test_rows_group_by_their_values(rows):
    expected: dict[tuple[int, ...], int] = {}
    for row in rows.tolist():
        expected[tuple(row)] = expected.get(tuple(row), 0) + 1
    assert _kinds(rows) == set(expected.items())
    assert len(expected) > 100


def test_rows_that_hash_alike_are_still_told_apart(rows, monkeypatch):
    expected = _kinds(rows)
    monkeypatch.setattr(key_counts, "_MIX", np.uint64(0))  # every row hashes to 0
    assert _kinds(rows) == expected


def test_equal_keys_add_up_their_counts_and_sums():
    matrix = np.array([[1, 2], [1, 2], [3, key_counts.NULL]], dtype=np.int64)
    ones = np.ones(3, dtype=np.int64)
    ready = np.array([50, 20, key_counts._MISSING], dtype=np.int64)
    keys, n, start_sum, busy, end_sum, lowest = key_counts._grouped(
        matrix, ones, np.array([10, 30, 0]), np.array([1, 1, 0]), np.array([15, 40, 0]), ready
    )
    by_key = {tuple(k): (a, b, c, d, e) for k, a, b, c, d, e in zip(
        keys.tolist(), n, start_sum, busy, end_sum, lowest, strict=True)}  # fmt: skip
    assert by_key == {
        (1, 2): (2, 40, 2, 55, 20),
        (3, key_counts.NULL): (1, 0, 0, 0, key_counts._MISSING),
    }


@pytest.mark.parametrize("keys", [4, 1 << 12])  # the second does not fit in 63 bits: argsort
def test_moments_order_as_a_stable_argsort(keys):
    from retrysim.tables.key_peaks import _T_BITS, _order_by

    rng = np.random.default_rng(5)
    key = rng.integers(0, keys, 20_000).astype(np.int64)
    t = rng.integers(0, 50, 20_000).astype(np.int64) * ((1 << (_T_BITS - 1)) // 50)
    expected = np.argsort((key << _T_BITS) | t, kind="stable")
    assert (_order_by(key, t) == expected).all()
