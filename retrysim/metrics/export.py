"""A run written back in RocketMQ 5.x's series, as OpenMetrics text (``retrysim export``,
docs/metrics.md).

Each series is a per-bucket column of the ``load`` or ``instance_load`` table, or a per-bucket
count of the messages or attempts, summed up in Spark; a sample's timestamp is the bucket's
end on the run's clock (``start_at`` + ``bucket_start_ms`` + ``bucket_ms``). Counters are
running sums over the buckets, gauges the value at the bucket's end. The driver collects the
samples alone (a few per group, bucket and series), never a message's row, and writes them
as one file through a temporary one, so a failed export leaves nothing half-written.

>>> export_openmetrics(spark, "out", "default-20261127T224004Z-ed94b7")  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType

from retrysim.metrics.compare import lag_column
from retrysim.metrics.names import (
    CLIENT_LABEL,
    CLUSTER_LABEL,
    COUNTER,
    FAILURE,
    GAUGE,
    HISTOGRAM,
    INSTANCE_DELIVERIES,
    INSTANCE_READY,
    INSTANCE_UTILIZATION,
    INVOCATION_STATUS_LABEL,
    IS_RETRY_LABEL,
    PROCESS_TIME_BUCKETS_MS,
    SUCCESS,
    family_name,
    five_x,
)
from retrysim.model.behavior import CONSUME_SUCCESS
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import scenario_from_json
from retrysim.scenario.spec import Scenario
from retrysim.store.sinks import STATUS_COMPLETE, run_rows
from retrysim.store.views import table
from retrysim.tables.schemas import PARTITION_COLUMN, literal_rows, nullable_schema, select_schema

# A Grafana dashboard of these series, shipped beside this module (package data)
DASHBOARD = Path(__file__).with_name("grafana-dashboard.json")
OPENMETRICS = "openmetrics"
FORMATS = (OPENMETRICS,)


@dataclass(frozen=True)
class Family:
    """One OpenMetrics metric family: its name (a counter's without ``_total``), its type
    and its help; its unit is the name's ``_messages`` suffix where it has one (OpenMetrics
    wants a unit to end the name: the milliseconds of the timings are said in the help)."""

    name: str
    kind: str
    help: str

    @property
    def unit(self) -> str:
        return "messages" if self.name.endswith("_messages") else ""

    @property
    def sample(self) -> str:
        """The name of its samples (a histogram's get their part's suffix)."""
        return f"{self.name}_total" if self.kind == COUNTER else self.name


def _family(name: str, kind: str, help_text: str) -> Family:
    return Family(family_name(name), kind, help_text)


# The families in the order the file gives them.
FAMILIES = (
    _family(five_x("published").name, COUNTER,
            "messages published to the topic, replayed dead letters included"),
    _family(five_x("first_deliveries").name, COUNTER,
            "deliveries started: first deliveries (is_retry false) and retries (true)"),
    _family(five_x("lag").name, GAUGE,
            "messages Ready or in consumption (ready_backlog + inflight) at the bucket's end"),
    _family(five_x("inflight").name, GAUGE,
            "deliveries started and not yet settled at the bucket's end"),
    _family(five_x("queueing_latency").name, GAUGE,
            "the age of the oldest Ready message at the bucket's end, in milliseconds"),
    _family(five_x("dlq").name, COUNTER, "messages moved to the dead-letter queue"),
    _family(five_x("process_time").name, HISTOGRAM,
            "deliveries by processing time (end_ms - start_ms), in milliseconds, by the "
            "bucket they ended in"),
    _family(INSTANCE_DELIVERIES, COUNTER, "retrysim: deliveries a consumer instance started"),
    _family(INSTANCE_READY, GAUGE,
            "retrysim: deliveries Ready for a consumer instance and not started, at the "
            "bucket's end"),
    _family(INSTANCE_UTILIZATION, GAUGE,
            "retrysim: a consumer instance's busy thread time over its threads x the bucket"),
)  # fmt: skip
_INDEX = {family.name: n for n, family in enumerate(FAMILIES)}
_LE = "le"
# A sample's labels, in the order a line gives them (null: the sample has no such label).
LABELS = (CLUSTER_LABEL, "topic", "consumer_group", IS_RETRY_LABEL, INVOCATION_STATUS_LABEL,
          CLIENT_LABEL, _LE)  # fmt: skip

SAMPLES = nullable_schema(
    ("family", IntegerType(), "the family's place in FAMILIES"),
    ("name", StringType(), "the sample's name"),
    *((label, StringType(), f"the {label} label; null: none") for label in LABELS),
    ("ts_ms", LongType(), "the bucket's end on the run's clock, in ms since the epoch"),
    ("part", IntegerType(), "the sample's place within its metric point (a histogram's)"),
    ("value", DoubleType(), "the sample's value"),
)
_TOPICS = nullable_schema(("group", StringType()), ("topic", StringType()))
_KEY = ("bucket_start_ms", "bucket_ms")


def _on_clock(start_ms: int) -> Callable[[DataFrame], DataFrame]:
    """Each bucket's end on the run's clock (``ts_ms``)."""

    def add(rows: DataFrame) -> DataFrame:
        end = F.col("bucket_start_ms") + F.col("bucket_ms")
        return rows.withColumn("ts_ms", F.lit(start_ms).cast("long") + end)

    return add


def _running(*columns: str, by: Sequence[str] = ("group",)) -> Callable[[DataFrame], DataFrame]:
    """``columns`` as running sums over the buckets (a counter's value at each bucket's end)."""
    window = (
        Window.partitionBy(*by)
        .orderBy("bucket_start_ms")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )

    def add(rows: DataFrame) -> DataFrame:
        return rows.withColumns({name: F.sum(name).over(window) for name in columns})

    return add


def _labelled(topics: DataFrame) -> Callable[[DataFrame], DataFrame]:
    """Each group's topic beside it, and the group as RocketMQ's ``consumer_group``."""

    def add(rows: DataFrame) -> DataFrame:
        return rows.join(F.broadcast(topics), "group").withColumnRenamed("group", "consumer_group")

    return add


@dataclass(frozen=True)
class Entry:
    """One sample each row makes: its family, its value, the labels it sets (beside the
    row's own columns of a label's name), its part of a metric point and its name's suffix
    (a histogram's ``bucket``, ``count``, ``sum``)."""

    family: str
    value: Column
    labels: tuple[tuple[str, str], ...] = ()
    part: int = 0
    suffix: str = ""

    @property
    def sample(self) -> str:
        found = FAMILIES[_INDEX[family_name(self.family)]]
        return f"{found.name}_{self.suffix}" if self.suffix else found.sample


def _as_samples(cluster: str, entries: Sequence[Entry]) -> Callable[[DataFrame], DataFrame]:
    """Each row's ``entries`` as rows of :data:`SAMPLES`: a label an entry does not set is
    the row's column of that name, or null."""

    def explode(rows: DataFrame) -> DataFrame:
        def label(name: str, entry: Entry) -> Column:
            given = dict(entry.labels)
            if name in given:
                return F.lit(given[name])
            if name == CLUSTER_LABEL:
                return F.lit(cluster)
            return F.col(name) if name in rows.columns else F.lit(None)

        structs = [
            F.struct(
                F.lit(_INDEX[family_name(entry.family)]).alias("family"),
                F.lit(entry.sample).alias("name"),
                *[label(name, entry).cast("string").alias(name) for name in LABELS],
                F.col("ts_ms").alias("ts_ms"),
                F.lit(entry.part).alias("part"),
                entry.value.cast("double").alias("value"),
            )
            for entry in entries
        ]
        exploded = rows.select(F.explode(F.array(*structs)).alias("s")).select("s.*")
        return select_schema(exploded, SAMPLES)

    return explode


def load_samples(
    load: DataFrame, topics: DataFrame, start_ms: int, cluster: str, scenario: Scenario
) -> DataFrame:
    """The broker's series from the ``load`` table: deliveries, dead letters, lag (as the
    broker counts it, :func:`~retrysim.metrics.compare.lag_column`), in flight and queueing
    latency per group and bucket."""
    out, dlq = five_x("first_deliveries").name, five_x("dlq").name
    entries = [
        Entry(out, F.col("first_deliveries"), ((IS_RETRY_LABEL, "false"),)),
        Entry(out, F.col("retries"), ((IS_RETRY_LABEL, "true"),)),
        Entry(five_x("lag").name, lag_column(scenario)),
        Entry(five_x("inflight").name, F.col("inflight")),
        Entry(five_x("queueing_latency").name, F.col("oldest_ready_age_ms")),
        Entry(dlq, F.col("dlq")),
    ]
    return (
        load.transform(_running("first_deliveries", "retries", "dlq"))
        .transform(_on_clock(start_ms))
        .transform(_labelled(topics))
        .transform(_as_samples(cluster, entries))
    )


def published_samples(
    messages: DataFrame, load: DataFrame, topics: DataFrame, start_ms: int, cluster: str
) -> DataFrame:
    """``rocketmq_messages_in_total`` per topic: the messages published by each bucket's end
    (``born_ms``), and the dead letters replays re-published, over the groups of the topic."""
    bucket = F.col("bucket_ms")
    sizes = load.select("group", "bucket_ms").distinct()
    born = (
        messages.join(F.broadcast(sizes), "group")
        .groupBy("group", (F.floor(F.col("born_ms") / bucket) * bucket).alias("bucket_start_ms"))
        .agg(F.count(F.lit(1)).alias("published"))
    )
    per_topic = (
        load.select("group", *_KEY, "replays")
        .join(born, ["group", "bucket_start_ms"], "left")
        .withColumn("messages_in", F.coalesce("published", F.lit(0)) + F.col("replays"))
        .transform(_running("messages_in"))
        .join(F.broadcast(topics), "group")
        .groupBy("topic", *_KEY)
        .agg(F.sum("messages_in").alias("messages_in"))
    )
    entries = [Entry(five_x("published").name, F.col("messages_in"))]
    return per_topic.transform(_on_clock(start_ms)).transform(_as_samples(cluster, entries))


def _ended(attempts: DataFrame, load: DataFrame, bounds: Sequence[str]) -> DataFrame:
    """Per group, bucket of ``end_ms`` and invocation status: the started deliveries within
    each of the 5.x client's bucket bounds (``bounds``: their columns), all of them and their
    summed processing time (``end_ms - start_ms``)."""
    sizes = load.select("group", "bucket_ms").distinct()
    status = F.when(F.col("outcome") == F.lit(CONSUME_SUCCESS), F.lit(SUCCESS))
    ended_in = F.floor(F.col("end_ms") / F.col("bucket_ms")) * F.col("bucket_ms")
    return (
        attempts.where(F.col("start_ms").isNotNull() & F.col("end_ms").isNotNull())
        .join(F.broadcast(sizes), "group")
        .select(
            "group",
            ended_in.alias("bucket_start_ms"),
            status.otherwise(F.lit(FAILURE)).alias(INVOCATION_STATUS_LABEL),
            (F.col("end_ms") - F.col("start_ms")).alias("took"),
        )
        .groupBy("group", "bucket_start_ms", INVOCATION_STATUS_LABEL)
        .agg(
            *[
                F.count(F.when(F.col("took") <= F.lit(le), 1)).alias(name)
                for name, le in zip(bounds, PROCESS_TIME_BUCKETS_MS, strict=True)
            ],
            F.count(F.lit(1)).alias("count"),
            F.sum("took").alias("sum"),
        )
    )


def process_time_samples(
    attempts: DataFrame, load: DataFrame, topics: DataFrame, start_ms: int, cluster: str
) -> DataFrame:
    """``rocketmq_process_time``: the deliveries that ended by each bucket's end, by
    ``end_ms - start_ms`` against the 5.x client's buckets, success or failure."""
    bounds = [f"le_{n}" for n in range(len(PROCESS_TIME_BUCKETS_MS))]
    sums = (*bounds, "count", "sum")
    statuses = F.explode(F.array(F.lit(SUCCESS), F.lit(FAILURE)))
    per_bucket = (
        load.select("group", *_KEY)
        .withColumn(INVOCATION_STATUS_LABEL, statuses)
        .join(_ended(attempts, load, bounds), ["group", "bucket_start_ms", INVOCATION_STATUS_LABEL],
              "left")
        .fillna(0, subset=list(sums))
        .transform(_running(*sums, by=("group", INVOCATION_STATUS_LABEL)))
    )  # fmt: skip
    return (
        per_bucket.transform(_on_clock(start_ms))
        .transform(_labelled(topics))
        .transform(_as_samples(cluster, _histogram_entries(bounds)))
    )


def _histogram_entries(bounds: Sequence[str]) -> list[Entry]:
    name = five_x("process_time").name
    entries = [
        Entry(name, F.col(column), ((_LE, le_text(le)),), n, "bucket")
        for n, (column, le) in enumerate(zip(bounds, PROCESS_TIME_BUCKETS_MS, strict=True))
    ]
    last = len(bounds)
    entries.append(Entry(name, F.col("count"), ((_LE, "+Inf"),), last, "bucket"))
    entries.append(Entry(name, F.col("count"), (), last + 1, "count"))
    entries.append(Entry(name, F.col("sum"), (), last + 2, "sum"))
    return entries


def le_text(bound: float) -> str:
    """A bucket's bound as OpenMetrics writes it: a float (``1.0``, ``60000.0``)."""
    return repr(float(bound))


def instance_samples(
    instance_load: DataFrame, topics: DataFrame, start_ms: int, cluster: str
) -> DataFrame:
    """retrysim's own per-instance series from ``instance_load`` (``client_id``: the
    instance's number); an unlimited pool has no utilization."""
    entries = [
        Entry(INSTANCE_DELIVERIES, F.col("deliveries")),
        Entry(INSTANCE_READY, F.col("ready_backlog")),
        Entry(INSTANCE_UTILIZATION, F.col("utilization")),
    ]
    return (
        instance_load.withColumn(CLIENT_LABEL, F.col("consumer_instance").cast("string"))
        .transform(_running("deliveries", by=("group", "consumer_instance")))
        .transform(_on_clock(start_ms))
        .transform(_labelled(topics))
        .transform(_as_samples(cluster, entries))
        .where(F.col("value").isNotNull())
    )


def run_samples(
    spark: SparkSession, output: str, run_id: str, start_ms: int, scenario: Scenario,
    cluster: str,
) -> DataFrame:  # fmt: skip
    """Every sample of the run's export (:data:`SAMPLES`), a few per group, bucket and
    series."""
    topics = literal_rows(spark, [(g.name, g.source_topic) for g in scenario.groups], _TOPICS)
    load = table(spark, output, "load", run_id).drop(PARTITION_COLUMN)
    parts = (
        load_samples(load, topics, start_ms, cluster, scenario),
        published_samples(
            table(spark, output, "messages", run_id), load, topics, start_ms, cluster
        ),
        process_time_samples(
            table(spark, output, "attempts", run_id), load, topics, start_ms, cluster
        ),
        instance_samples(table(spark, output, "instance_load", run_id), topics, start_ms, cluster),
    )
    samples = parts[0]
    for part in parts[1:]:
        samples = samples.unionByName(part)
    return samples


def _file_order(row: Row) -> tuple:
    """The order of the file: by family, series, moment and part of a metric point."""
    labels = tuple((row[name] is not None, row[name] or "") for name in LABELS if name != _LE)
    return (row["family"], labels, row["ts_ms"], row["part"])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number_text(value: float) -> str:
    """A value as OpenMetrics writes it: a whole number without a fraction."""
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def timestamp_text(ms: int) -> str:
    """Milliseconds since the epoch as OpenMetrics's seconds, exactly (``1764230460.000``)."""
    sign = "-" if ms < 0 else ""
    return f"{sign}{abs(ms) // 1000}.{abs(ms) % 1000:03d}"


def openmetrics_lines(samples: Iterable[Row]) -> Iterator[str]:
    """The OpenMetrics text of ``samples`` (rows of :data:`SAMPLES`, sorted by
    :func:`_file_order`): each family's ``# TYPE``, ``# UNIT`` (where its name
    carries one) and ``# HELP``, its samples, and ``# EOF``."""
    current = None
    for row in samples:
        if row["family"] != current:
            current = row["family"]
            family = FAMILIES[current]
            yield f"# TYPE {family.name} {family.kind}"
            if family.unit:
                yield f"# UNIT {family.name} {family.unit}"
            yield f"# HELP {family.name} {family.help}"
        labels = ",".join(
            f'{name}="{_escape(row[name])}"' for name in LABELS if row[name] is not None
        )
        yield (
            f"{row['name']}{{{labels}}} {number_text(row['value'])} {timestamp_text(row['ts_ms'])}"
        )
    yield "# EOF"


def write_atomically(path: str, lines: Iterable[str]) -> None:
    """``lines`` as the file ``path``, written beside it first and renamed into place: a
    failure leaves no file (and an older one as it was)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            for line in lines:
                out.write(line + "\n")
        os.chmod(temporary, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@dataclass(frozen=True)
class RunClock:
    """What an export needs of a run's ``runs`` row: its scenario and its time 0."""

    scenario: Scenario
    start_ms: int
    start_at: dt.datetime


def run_clock(output: str, run_id: str, start_at: dt.datetime | None = None) -> RunClock:
    """The complete run ``run_id`` of ``output`` (read by delta-rs, before Spark starts) on
    its clock: ``start_at`` when given, else its scenario's. Neither, or no such run: one
    line naming the option (:class:`ScenarioError`)."""
    runs = [row for row in run_rows(output, "runs", run_id) if row["status"] == STATUS_COMPLETE]
    if not runs:
        raise ScenarioError("--run-id", f"no run {run_id!r} in {os.path.abspath(output)}")
    moment = start_at or runs[-1]["start_at"]
    if moment is None:
        raise ScenarioError(
            "--start-at",
            f"run {run_id!r} has no start_at (its scenario gave none): give the moment its "
            "time 0 stands for, e.g. --start-at 2026-11-27T08:00:00Z",
        )
    if moment.tzinfo is None:  # Delta keeps UTC
        moment = moment.replace(tzinfo=dt.UTC)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    start_ms = (moment - epoch) // dt.timedelta(milliseconds=1)
    return RunClock(scenario_from_json(runs[-1]["config_json"]), start_ms, moment)


@dataclass(frozen=True)
class Exported:
    """What :func:`export_openmetrics` wrote: the file, its series and samples, the clock."""

    path: str
    series: int
    samples: int
    start_at: dt.datetime


def export_path(output: str, run_id: str) -> str:
    """Where a run's export goes unless told: ``<output>/exports/<run_id>.om.txt``."""
    return os.path.join(os.path.abspath(output), "exports", f"{run_id}.om.txt")


def export_openmetrics(
    spark: SparkSession,
    output: str,
    run_id: str,
    path: str | None = None,
    start_at: dt.datetime | None = None,
    cluster: str | None = None,
) -> Exported:
    """Write the run's series as OpenMetrics text to ``path`` (default :func:`export_path`),
    on the run's clock (``start_at`` overrides its scenario's), every series labelled
    ``cluster`` (default: the run id)."""
    clock = run_clock(output, run_id, start_at)
    rows = run_samples(spark, output, run_id, clock.start_ms, clock.scenario, cluster or run_id)
    samples = sorted(rows.collect(), key=_file_order)
    target = path or export_path(output, run_id)
    write_atomically(target, openmetrics_lines(samples))
    series = {(row["family"], *(row[name] for name in LABELS if name != _LE)) for row in samples}
    return Exported(target, len(series), len(samples), clock.start_at)
