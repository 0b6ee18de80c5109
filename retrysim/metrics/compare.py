"""A run laid over the observed series: each quantity retrysim and the broker both give,
on the run's clock, with its error.

The run's side comes from its load table (and the messages' birth times for the
published), turned into the broker's quantities by :func:`with_quantities`; the mapping is
docs/metrics.md's table. The observed side is :class:`~retrysim.metrics.reading.Observed`.
They meet where a sample's time is a bucket's end (``start_at + bucket_start + bucket``):
calibrate makes the load bucket the scrape interval and ``start_at`` the first sample, so
every sample has its bucket; otherwise a sample takes the bucket ending nearest to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.metrics.names import QUANTITIES
from retrysim.metrics.reading import MetricsError, Observed
from retrysim.scenario.loading import scenario_from_json
from retrysim.scenario.spec import Group, Scenario
from retrysim.store.sinks import STATUS_COMPLETE, read_table, run_rows
from retrysim.tables.schemas import PARTITION_COLUMN

# the quantities both sides give, in the order they are printed and drawn
COMPARED = ("lag", "deliveries", "first_deliveries", "retries", "dlq", "inflight",
            "queueing_latency", "published", "busy_threads")  # fmt: skip
PER_SECOND = ("published", "deliveries", "first_deliveries", "retries", "dlq")


def cache_ahead(group: Group) -> int:
    """The messages a group's clients may hold popped from the broker under a backlog (0:
    none): a 5.x push consumer's cache, ``instances x max_cache_message_count``."""
    if "max_cache_message_count" not in group.flavor_record.variant(group.ordered).reads:
        return 0
    return group.consumers.instances * group.max_cache_message_count


def lag_column(scenario: Scenario) -> Column:
    """The broker's lag from a load row, per group: the messages Ready or in consumption,
    less what the group's clients hold popped (:func:`cache_ahead`). A pop advances the
    group's offset at once, and the 5.5.0 broker's ConsumerLagCalculator counts a gRPC push
    group's lag from that offset (its un-acked pops only for a simple consumer's groups):
    the cache, the deliveries in it included, is not in it (docs/metrics.md)."""
    held = F.col("ready_backlog") + F.col("inflight")
    lag = held
    for group in scenario.groups:
        if cache_ahead(group):
            cached = F.greatest(F.lit(0), held - F.lit(cache_ahead(group)))
            lag = F.when(F.col("group") == group.name, cached).otherwise(lag)
    return lag


def with_quantities(scenario: Scenario) -> Callable[[DataFrame], DataFrame]:
    """A run's load rows (with ``published``, the messages born in the bucket) as the
    broker's quantities: the counts per second of the bucket, the gauges at its end.
    ``lag`` is what the broker's lag counts (:func:`lag_column`): published and neither
    popped, committed nor sent to a retry (a message waiting for its retry sits in the
    broker's timer, outside the lag, until it is due)."""

    def quantities(load: DataFrame) -> DataFrame:
        seconds = F.col("bucket_ms") / 1000.0
        counts = {
            # as the broker counts its puts to the topic: the replayed dead letters too
            "published": F.coalesce(F.col("published"), F.lit(0)) + F.col("replays"),
            "deliveries": F.col("first_deliveries") + F.col("retries"),
            "first_deliveries": F.col("first_deliveries"),
            "retries": F.col("retries"),
            "dlq": F.col("dlq"),
        }
        return load.select(
            "group", "bucket_start_ms", "bucket_ms",
            *((value / seconds).alias(name) for name, value in counts.items()),
            lag_column(scenario).alias("lag"),
            F.col("inflight"),
            F.col("oldest_ready_age_ms").alias("queueing_latency"),
            (F.col("busy_thread_ms") / F.col("bucket_ms")).alias("busy_threads"),
        )  # fmt: skip

    return quantities


def published_per_bucket(messages: DataFrame, bucket_ms: int) -> DataFrame:
    """The messages born in each bucket of ``bucket_ms``, per group."""
    start = F.floor(F.col("born_ms") / bucket_ms) * bucket_ms
    return messages.groupBy("group", start.cast("long").alias("bucket_start_ms")).agg(
        F.count(F.lit(1)).alias("published")
    )


def simulated(
    spark: SparkSession, output: str, run_id: str, scenario: Scenario, group: str
) -> pd.DataFrame:
    """The run's quantities for ``group``, a row per load bucket (a few thousand at most:
    the load table's rows, collected; no message-level row leaves Spark)."""
    of_run = (F.col(PARTITION_COLUMN) == run_id) & (F.col("group") == group)
    load = read_table(spark, output, "load").where(of_run)
    bucket_ms = load.select(F.max("bucket_ms")).first()[0]
    if bucket_ms is None:
        return pd.DataFrame(columns=["bucket_start_ms", "bucket_ms", *COMPARED])
    births = published_per_bucket(read_table(spark, output, "messages").where(of_run), bucket_ms)
    rows = load.join(births, ["group", "bucket_start_ms"], "left").transform(
        with_quantities(scenario)
    )
    return rows.orderBy("bucket_start_ms").toPandas()


@dataclass(frozen=True)
class SeriesError:
    """How far the run is from one observed quantity."""

    quantity: str
    series: str
    points: int
    nmae: float | None
    observed_peak: float
    simulated_peak: float
    observed_peak_at: pd.Timestamp
    simulated_peak_at: pd.Timestamp

    @property
    def peak_error(self) -> float | None:
        """The simulated peak's size against the observed, as a share of it."""
        if self.observed_peak == 0:
            return None
        return (self.simulated_peak - self.observed_peak) / abs(self.observed_peak)

    @property
    def peak_shift_s(self) -> float:
        """When the simulated peak came, after (+) or before (-) the observed one."""
        return (self.simulated_peak_at - self.observed_peak_at).total_seconds()


def aligned(observed: Observed, sim: pd.DataFrame, start_at: pd.Timestamp) -> pd.DataFrame:
    """Every observed sample beside the simulated bucket ending nearest it (within half a
    bucket): a row per quantity and sample, ``at`` (UTC), ``observed``, ``simulated``."""
    if sim.empty:
        return pd.DataFrame(columns=["quantity", "at", "bucket_start_ms", "observed", "simulated"])
    ends = start_at.timestamp() + (sim["bucket_start_ms"] + sim["bucket_ms"]) / 1000.0
    buckets = sim.assign(time_s=ends.astype(float)).sort_values("time_s")
    half = float(sim["bucket_ms"].max()) / 2000.0
    frames = []
    for quantity in COMPARED:
        series = observed.quantity(quantity)
        if series is None or quantity not in buckets:
            continue
        samples = pd.DataFrame({"time_s": series.index.to_numpy(float),
                                "observed": series.to_numpy(float)})  # fmt: skip
        met = pd.merge_asof(samples, buckets[["time_s", "bucket_start_ms", quantity]],
                            on="time_s", direction="nearest", tolerance=half)  # fmt: skip
        met = met.dropna(subset=["bucket_start_ms"])
        frames.append(pd.DataFrame({
            "quantity": quantity, "at": pd.to_datetime(met["time_s"], unit="s", utc=True),
            "bucket_start_ms": met["bucket_start_ms"].astype("int64"),
            "observed": met["observed"], "simulated": met[quantity].astype(float),
        }))  # fmt: skip
    if not frames:
        return pd.DataFrame(columns=["quantity", "at", "bucket_start_ms", "observed", "simulated"])
    return pd.concat(frames, ignore_index=True)


def errors(points: pd.DataFrame, observed: Observed) -> list[SeriesError]:
    """Per quantity: the normalized mean absolute error (the mean |simulated - observed|
    over the mean |observed|) and each side's peak, its size and time."""
    found = []
    for quantity, rows in points.groupby("quantity", sort=False):
        obs, sim = rows["observed"].to_numpy(), rows["simulated"].to_numpy()
        scale = np.abs(obs).mean()
        nmae = float(np.abs(sim - obs).mean() / scale) if scale > 0 else None
        i, j = int(np.argmax(obs)), int(np.argmax(sim))
        found.append(SeriesError(
            quantity, observed.sources.get(quantity, quantity), len(rows), nmae,
            float(obs[i]), float(sim[j]), rows["at"].iloc[i], rows["at"].iloc[j],
        ))  # fmt: skip
    order = {q: k for k, q in enumerate(COMPARED)}
    return sorted(found, key=lambda e: order[e.quantity])


def run_clock(output: str, run_id: str) -> tuple[pd.Timestamp, Scenario]:
    """The run's ``start_at`` and its scenario; a run without ``start_at`` cannot be laid
    over metrics (one line saying how to give it one)."""
    rows = [row for row in run_rows(output, "runs", run_id) if row["status"] == STATUS_COMPLETE]
    if not rows:
        raise MetricsError(f"no complete run {run_id!r} in {output}")
    start = rows[-1].get("start_at")
    if start is None:
        raise MetricsError(
            f"run {run_id} has no start_at: simulate its scenario with start_at set (calibrate "
            "writes it) to put it on the metrics' clock"
        )
    moment = pd.Timestamp(start)
    moment = moment.tz_localize("UTC") if moment.tzinfo is None else moment.tz_convert("UTC")
    return moment, scenario_from_json(rows[-1]["config_json"])


def describe(error: SeriesError) -> str:
    """One printed line: the quantity, its NMAE, the peaks and their shift."""
    unit = QUANTITIES[error.quantity][1]
    size = "-" if error.peak_error is None else f"{error.peak_error:+.1%}"
    nmae = "-" if error.nmae is None else f"{error.nmae:.1%}"
    peaks = f"{error.observed_peak:>10.4g} {error.simulated_peak:>10.4g}"
    return (f"{error.quantity:<17} {error.points:>6} {nmae:>7}  {peaks} {size:>8} "
            f"{error.peak_shift_s:>+8.0f}s  {unit}")  # fmt: skip


HEADER = (f"{'quantity':<17} {'points':>6} {'NMAE':>7}  {'obs. peak':>10} {'sim. peak':>10} "
          f"{'size':>8} {'when':>9}  unit")  # fmt: skip
