"""The fits calibrate makes: piecewise-constant levels in a count series, and a processing
time distribution from a histogram's buckets.

Levels are found by bottom-up merging: every interval starts as its own piece, and the two
neighbours whose merge costs the least log-likelihood merge, until every remaining merge
would cost more than a penalty that grows with the number of intervals (a BIC). Counts are
Poisson (arrivals over exposure seconds) or binomial (failures among deliveries), so a level
changes where the data say it does, not where noise wanders. Merging is O(n log n): a day of
15-second samples (5,760 intervals) fits in well under a second.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

POISSON = "poisson"
BINOMIAL = "binomial"
SQRT2 = math.sqrt(2.0)
Z99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclass(frozen=True)
class Piece:
    """Intervals ``[first, last]`` (indices) at one level: ``events / exposure``."""

    first: int
    last: int
    events: float
    exposure: float

    @property
    def level(self) -> float:
        return self.events / self.exposure if self.exposure > 0 else 0.0


def _loglik(events: float, exposure: float, kind: str) -> float:
    """The maximized log-likelihood of one level (constants dropped)."""
    if exposure <= 0 or events <= 0:
        return 0.0
    rate = events / exposure
    if kind == POISSON:
        return events * math.log(rate) - events
    if events >= exposure:
        return 0.0
    return events * math.log(rate) + (exposure - events) * math.log(1.0 - rate)


def levels(
    events: np.ndarray, exposure: np.ndarray, kind: str, penalty: float | None = None
) -> list[Piece]:
    """Piecewise-constant levels of ``events / exposure`` (Poisson: exposure in seconds;
    binomial: exposure is the trials). ``penalty``: the log-likelihood a level change must
    gain (default: 1.5 ``log n``, at least 8: a BIC's ``log n`` per parameter, made stricter
    so that a change of level is one a planner would name)."""
    n = len(events)
    if n == 0:
        return []
    penalty = max(8.0, 1.5 * math.log(max(n, 2))) if penalty is None else penalty
    ev = [float(e) for e in events]
    ex = [float(x) for x in exposure]
    first, last = list(range(n)), list(range(n))
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
    alive = [True] * n
    ll = [_loglik(ev[i], ex[i], kind) for i in range(n)]
    version = [0] * n

    def cost(i: int) -> float:
        j = nxt[i]
        return ll[i] + ll[j] - _loglik(ev[i] + ev[j], ex[i] + ex[j], kind)

    heap = [(cost(i), i, 0, 0) for i in range(n - 1)]
    heapq.heapify(heap)
    while heap:
        c, i, vi, vj = heapq.heappop(heap)
        j = nxt[i] if i < n and alive[i] else n
        if j >= n or not alive[i] or version[i] != vi or version[j] != vj:
            continue
        if c > penalty:
            break
        ev[i] += ev[j]
        ex[i] += ex[j]
        last[i] = last[j]
        ll[i] = _loglik(ev[i], ex[i], kind)
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[i] < n:
            prv[nxt[i]] = i
        version[i] += 1
        if nxt[i] < n:
            heapq.heappush(heap, (cost(i), i, version[i], version[nxt[i]]))
        p = prv[i]
        if p >= 0:
            heapq.heappush(heap, (cost(p), p, version[p], version[i]))
    return [Piece(first[i], last[i], ev[i], ex[i]) for i in range(n) if alive[i]]


def _erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise (Abramowitz-Stegun 7.1.26 refined: |error| < 1.2e-7)."""
    t = 1.0 / (1.0 + 0.5 * np.abs(x))
    poly = -x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))  # fmt: skip
    y = 1.0 - t * np.exp(poly)
    return np.where(x >= 0, y, -y)


def lognormal_cdf(x: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """P(X <= x) for a lognormal (``mu``, ``sigma`` of its log), broadcast."""
    with np.errstate(divide="ignore"):
        z = (np.log(np.maximum(x, 1e-300)) - mu) / (sigma * SQRT2)
    return np.where(x > 0, 0.5 * (1.0 + _erf(z)), 0.0)


@dataclass(frozen=True)
class ProcessingFit:
    """A processing time fitted to bucket counts: ``dist`` with ``mean_ms`` and ``p99_ms``
    (lognormal) and, per bucket, the counts observed and expected under the fit."""

    dist: str
    mean_ms: float
    p99_ms: float
    bounds_ms: tuple[float, ...]
    observed: tuple[float, ...]
    expected: tuple[float, ...]

    @property
    def worst_bucket_error(self) -> float:
        """The largest |expected - observed| over all, as a share of the total count."""
        total = sum(self.observed) or 1.0
        return max(abs(e - o) for e, o in zip(self.expected, self.observed, strict=True)) / total


def fit_processing_time(
    bounds_ms: list[float], counts: list[float], mean_ms: float | None = None
) -> ProcessingFit:
    """The lognormal whose bucket probabilities best match ``counts`` (the increase of each
    ``le`` bucket, cumulative as Prometheus keeps them, +Inf last), by maximum likelihood
    over a grid refined around its best point; a constant where every delivery fell in one
    finite bucket. ``mean_ms``: the mean the histogram's sum over its count gives, which the
    fit keeps (the buckets alone cannot pin a mean between two bounds a decade apart), so
    only the spread is fitted; without it a constant takes its bucket's middle."""
    bounds = np.asarray(bounds_ms, float)
    cumulative = np.asarray(counts, float)
    per_bucket = np.diff(np.concatenate([[0.0], cumulative]))
    total = cumulative[-1]
    if total <= 0:
        raise ValueError("no deliveries in the histogram")
    finite = np.isfinite(bounds)
    occupied = np.flatnonzero(per_bucket > 0)
    if len(occupied) == 1 and finite[occupied[0]]:
        k = occupied[0]
        low = bounds[k - 1] if k else 0.0
        mean = (low + bounds[k]) / 2 if mean_ms is None else mean_ms
        observed = tuple(per_bucket.tolist())
        return ProcessingFit("constant", mean, mean, tuple(bounds), observed, observed)
    mu, sigma = _grid_fit(bounds, per_bucket, mean_ms)
    expected = _expected(bounds, mu, sigma) * total
    mean = math.exp(mu + sigma * sigma / 2)
    p99 = math.exp(mu + Z99 * sigma)
    return ProcessingFit(
        "lognormal", mean, p99, tuple(bounds), tuple(per_bucket.tolist()), tuple(expected)
    )


def _expected(bounds: np.ndarray, mu, sigma) -> np.ndarray:
    """Each bucket's probability under the lognormal(s), on the last axis."""
    mu, sigma = np.asarray(mu, float), np.asarray(sigma, float)
    cdf = lognormal_cdf(bounds[np.isfinite(bounds)], mu[..., None], sigma[..., None])
    cdf = np.concatenate([np.zeros((*cdf.shape[:-1], 1)), cdf, np.ones((*cdf.shape[:-1], 1))],
                         axis=-1)  # fmt: skip
    return np.diff(cdf, axis=-1)[..., : len(bounds)]


def _grid_fit(
    bounds: np.ndarray, per_bucket: np.ndarray, mean_ms: float | None
) -> tuple[float, float]:
    """Maximum likelihood of (mu, sigma) on a log grid, refined three times around the best
    (with ``mean_ms``, sigma alone: mu follows from the mean). The sigma stops where the
    scenario's lognormal does: p99 / mean is largest, 14.97, at sigma = z99 (2.33)."""
    finite = bounds[np.isfinite(bounds)]
    lo, hi = math.log(max(finite[0] / 100, 1e-3)), math.log(finite[-1] * 10)
    s_lo, s_hi = 0.01, Z99
    best = (0.0, 0.5)
    for _ in range(4):
        sigmas = np.linspace(s_lo, s_hi, 81)
        if mean_ms is None:
            mus = np.linspace(lo, hi, 121)
            mu, sigma = np.meshgrid(mus, sigmas, indexing="ij")
        else:
            sigma = sigmas[None, :]
            mu = math.log(mean_ms) - sigma * sigma / 2
        p = np.clip(_expected(bounds, mu, sigma), 1e-300, None)
        ll = (per_bucket * np.log(p)).sum(axis=-1)
        i, j = np.unravel_index(np.argmax(ll), ll.shape)
        best = (float(mu[i, j]), float(sigma[0 if mean_ms is not None else i, j]))
        dm, ds = (hi - lo) / 20, (s_hi - s_lo) / 20
        lo, hi = best[0] - dm, best[0] + dm
        s_lo, s_hi = max(0.005, best[1] - ds), min(Z99, best[1] + ds)
    return best
