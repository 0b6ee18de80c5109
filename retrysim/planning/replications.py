"""Replications: N independent seeds per scenario (or plan point) and each metric's interval.

A capacity answer from one seed is one sample. ``--replications N`` runs the same scenario
under N seeds: replication 1 under the scenario's own seed (so one replication is the plain
run, row for row), replication ``k > 1`` under :func:`replication_seed` ``(seed, k)``,
Spark's ``xxhash64`` of ``k`` with the seed as its hash seed, so the whole set follows from
the scenario file. Each replication is an ordinary run with its own ``runs`` row
(``replication_of``, ``point``, ``replication``) and its rows in every table.

Across replications each summary metric gets its mean and a 95 % Student-t interval for the
mean (``mean ± t(0.975, n - 1) · s / √n``, its low end at least 0, as every metric is a
count, a time or a share; none for one replication). A metric a
replication has no value for (no commit, so no time to commit) is left out of that metric's
mean and counted in ``missing``. The driver reads one summary row per group and replication,
never message-level rows.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.model.rng import hash_long
from retrysim.progress import Progress
from retrysim.runner import (
    RUN_ID_PATTERN,
    Result,
    RunRequest,
    check_run_id,
    default_run_id,
    simulate_runs,
)
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.limits import DEFAULT_CONFIDENCE, MAX_REPLICATIONS
from retrysim.scenario.spec import Scenario
from retrysim.store.sinks import read_table
from retrysim.tables.schemas import PARTITION_COLUMN, SUMMARY
from retrysim.tables.staging import RunLabel

INTERVAL_LEVEL = 0.95  # the level of every metric's interval
_SEED_MASK = 2**63 - 1
# the summary's numeric columns: the metrics an interval is given for
METRIC_COLUMNS = tuple(
    f.name
    for f in SUMMARY.fields
    if f.dataType.typeName() in ("long", "integer", "double") and f.name != "busiest_instance"
)

__all__ = [
    "DEFAULT_CONFIDENCE",
    "INTERVAL_LEVEL",
    "MAX_REPLICATIONS",
    "Interval",
    "Replications",
    "check_confidence",
    "check_replications",
    "interval",
    "intervals_frame",
    "replicate",
    "replication_run_id",
    "replication_seed",
    "t_quantile",
]


def replication_seed(seed: int, replication: int) -> int:
    """The seed of replication ``replication`` (1-based): the scenario's own for the first.

    >>> replication_seed(42, 1)
    42
    """
    if replication == 1:
        return seed
    return hash_long(replication, seed) & _SEED_MASK


def replication_run_id(run_id: str, replication: int, replications: int) -> str:
    """``<run_id>-r<k>`` when there are several replications, else the run id itself."""
    return run_id if replications == 1 else f"{run_id}-r{replication}"


def check_replications(replications: int, run_id: str | None = None, flag: str = "--run-id") -> int:
    """1..MAX_REPLICATIONS, and room in a run id for the ``-r<k>`` suffix."""
    if isinstance(replications, bool) or not isinstance(replications, int):
        raise ScenarioError("--replications", f"value {replications!r}: must be a whole number")
    if not 1 <= replications <= MAX_REPLICATIONS:
        raise ScenarioError(
            "--replications", f"value {replications}: must be within 1..{MAX_REPLICATIONS}"
        )
    if run_id is not None:
        longest = replication_run_id(run_id, replications, replications)
        if not RUN_ID_PATTERN.match(longest):
            raise ScenarioError(
                flag,
                f"value {run_id!r}: with {replications} replications its runs are named "
                f"{longest!r}, longer than a run id's 128 characters; give a shorter id",
            )
    return replications


def check_confidence(confidence: float) -> float:
    """A share of replications: 0 < confidence <= 1."""
    if not (isinstance(confidence, (int, float)) and 0 < confidence <= 1):
        raise ScenarioError(
            "--confidence", f"value {confidence!r}: must be within (0, 1], e.g. 0.95"
        )
    return float(confidence)


# --------------------------------------------------------------------------- intervals


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return result


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: int) -> float:
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0.5 < p < 1), by
    bisection on its CDF: the standard library has none, and SciPy is not a dependency.

    >>> round(t_quantile(0.975, 4), 4)
    2.7764
    """
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        low, high = high, high * 2
    for _ in range(200):
        middle = (low + high) / 2
        if _t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    """A metric across replications: how many had a value, their mean, standard deviation,
    the interval for the mean (None with fewer than two values), min and max."""

    n: int
    mean: float | None
    sd: float | None = None
    low: float | None = None
    high: float | None = None
    min: float | None = None
    max: float | None = None
    missing: int = 0

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2


def interval(values: Sequence[float | None], level: float = INTERVAL_LEVEL) -> Interval:
    """The mean of ``values`` (None and NaN left out) and its Student-t interval at ``level``,
    cut at 0 below (no metric is negative)."""
    if not 0 < level < 1:
        raise ValueError(f"level {level!r}: must be within (0, 1)")
    present = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    missing = len(values) - len(present)
    n = len(present)
    if n == 0:
        return Interval(0, None, missing=missing)
    mean = math.fsum(present) / n
    if n == 1:
        return Interval(1, mean, min=mean, max=mean, missing=missing)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in present) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return Interval(
        n, mean, sd, max(0.0, mean - half), mean + half, min(present), max(present), missing
    )


def intervals_frame(
    rows: Sequence[Mapping[str, Any]], level: float = INTERVAL_LEVEL
) -> pd.DataFrame:
    """Per group and summary metric, across the replications' summary ``rows``: replications,
    mean, sd, ci_low, ci_high, min, max, missing (the replications without a value)."""
    groups = dict.fromkeys(row["group"] for row in rows)
    records = []
    for group in groups:
        mine = [row for row in rows if row["group"] == group]
        for metric in METRIC_COLUMNS:
            found = interval([row.get(metric) for row in mine], level)
            records.append(
                {
                    "group": group,
                    "metric": metric,
                    "replications": len(mine),
                    "mean": found.mean,
                    "sd": found.sd,
                    "ci_low": found.low,
                    "ci_high": found.high,
                    "min": found.min,
                    "max": found.max,
                    "missing": found.missing,
                }
            )
    return pd.DataFrame.from_records(
        records,
        columns=["group", "metric", "replications", "mean", "sd", "ci_low", "ci_high", "min",
                 "max", "missing"],
    )  # fmt: skip


# --------------------------------------------------------------------------- running them


@dataclass
class Replications:
    """The runs of one scenario under N seeds, and each metric's interval across them."""

    spark: SparkSession
    output: str
    run_id: str  # the id the replications share (their runs' replication_of)
    results: list[Result]
    elapsed_s: float
    _rows: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def run_ids(self) -> list[str]:
        return [result.run_id for result in self.results]

    @property
    def summary(self) -> DataFrame:
        """Every replication's summary rows (one per run and group)."""
        return read_table(self.spark, self.output, "summary").where(
            F.col(PARTITION_COLUMN).isin(self.run_ids)
        )

    def summary_rows(self) -> list[dict[str, Any]]:
        """The summary rows on the driver, in replication order (a few per run)."""
        if self._rows is None:
            self._rows = summary_rows(self.spark, self.output, self.run_ids)
        return self._rows

    def intervals(self, level: float = INTERVAL_LEVEL) -> pd.DataFrame:
        """Per group and metric: mean and ``level`` interval across the replications."""
        return intervals_frame(self.summary_rows(), level)


def summary_rows(spark: SparkSession, output: str, run_ids: list[str]) -> list[dict[str, Any]]:
    """The runs' summary rows on the driver (a few per run), each with its plan ``point``,
    in the order of ``run_ids``, then by group."""
    order = {run_id: k for k, run_id in enumerate(run_ids)}
    points = (
        read_table(spark, output, "runs")
        .where(F.col(PARTITION_COLUMN).isin(run_ids))
        .select(PARTITION_COLUMN, "point")
    )
    summary = read_table(spark, output, "summary").where(F.col(PARTITION_COLUMN).isin(run_ids))
    rows = [row.asDict() for row in summary.join(points, PARTITION_COLUMN).collect()]
    return sorted(rows, key=lambda row: (order[row[PARTITION_COLUMN]], row["group"]))


def replicate(
    spark: SparkSession,
    scenario: Scenario,
    replications: int,
    output: str | None = None,
    run_id: str | None = None,
    progress: Progress | None = None,
    point: int | None = None,
    on_result: Callable[[int, Result], None] | None = None,
    **options: Any,
) -> Replications:
    """Run ``scenario`` ``replications`` times, each under its own seed, as runs
    ``<run_id>-r<k>`` (the run id itself for one replication), simulated together
    (:func:`retrysim.runner.simulate_runs`); ``options`` go to it (with ``report``, each
    replication draws its own). ``on_result(k, result)`` is called after each replication
    is published.

    >>> reps = replicate(spark, load_scenario("conf/flash-sale.yaml"), 5)  # doctest: +SKIP
    >>> reps.intervals().query("metric == 'p99_time_to_commit_ms'")  # doctest: +SKIP
    """
    base = check_run_id(run_id or default_run_id(scenario))
    check_replications(replications, base)
    output = os.path.abspath(output or tempfile.mkdtemp(prefix="retrysim-"))
    say = progress or (lambda _line: None)
    began = time.monotonic()
    requests = replication_requests(scenario, replications, base, point)
    if replications > 1:
        seeds = ", ".join(str(request.scenario.seed) for request in requests)
        say(f"{replications} replications (seeds {seeds}) ...")
    results = simulate_runs(
        spark,
        requests,
        output=output,
        progress=progress,
        on_result=None if on_result is None else lambda k, result: on_result(k + 1, result),
        **options,
    )
    return Replications(spark, output, base, results, time.monotonic() - began)


def replication_requests(
    scenario: Scenario, replications: int, run_id: str, point: int | None = None
) -> list[RunRequest]:
    """The runs of ``scenario``'s replications: ``<run_id>-r<k>`` under their seeds."""
    return [
        RunRequest(
            scenario.model_copy(update={"seed": replication_seed(scenario.seed, k)}),
            replication_run_id(run_id, k, replications),
            RunLabel(run_id, point, k),
        )
        for k in range(1, replications + 1)
    ]
