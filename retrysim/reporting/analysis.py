"""Small pandas views of a run's tables, for notebooks, reports and plots.

Everything here reads *aggregated* data to the driver: the ``load`` table (one row per
group and time bucket), ``summary`` and ``plan`` (one row per group or point), the ``runs``
row, and Spark-side aggregates of ``attempts`` (a few rows per group). The only
message-level rows that ever reach the driver are one message's own transitions, in
:func:`message_timeline`. Functions take a Spark DataFrame or an already converted pandas
frame, so a notebook can convert once and slice many times.

>>> load = load_frame(result.load)  # doctest: +SKIP
>>> states = state_counts(load, "order-service")  # doctest: +SKIP
>>> states.plot(x="minute_end", y=["Ready", "Inflight", "WaitingRetry"])  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.model.policy import policy_for
from retrysim.scenario.loading import scenario_from_json
from retrysim.scenario.spec import Group, Scenario
from retrysim.scenario.units import human_ms
from retrysim.store.sinks import STATUS_COMPLETE, read_table, run_frame, run_rows
from retrysim.tables.group_sums import RETRY_NUMBER_CAP
from retrysim.tables.load import retries_by_level
from retrysim.tables.schemas import PARTITION_COLUMN, SCHEMAS, data_schema

MINUTE_MS = 60_000
STATE_COLUMNS = {"ready_backlog": "Ready", "inflight": "Inflight", "waiting_retry": "WaitingRetry"}

__all__ = [
    "RETRY_NUMBER_CAP",
    "RunData",
    "active_span",
    "busiest_message",
    "case_label",
    "commitlog_writes",
    "delivery_rates",
    "dlq_flow",
    "instance_busy_threads",
    "load_frame",
    "message_timeline",
    "plan_frame",
    "point_report_id",
    "retries_by_level",
    "run_data",
    "schedule_backlog",
    "state_counts",
    "summary_frame",
    "utilization",
    "write_breakdown",
]

Frame = DataFrame | pd.DataFrame


def _pandas(frame: Frame) -> pd.DataFrame:
    return frame.toPandas() if isinstance(frame, DataFrame) else frame


def load_frame(load: Frame) -> pd.DataFrame:
    """The load table as pandas, ordered by group and time, with ``minute`` (bucket start)
    and ``minute_end`` (bucket end: where the gauges are measured) in minutes."""
    pdf = _pandas(load).sort_values(["group", "bucket_start_ms"]).reset_index(drop=True)
    pdf["minute"] = pdf["bucket_start_ms"] / MINUTE_MS
    pdf["minute_end"] = (pdf["bucket_start_ms"] + pdf["bucket_ms"]) / MINUTE_MS
    return pdf


_ACTIVITY = (
    "deliveries",
    "commitlog_writes",
    "dlq",
    "discards",
    "replays",
    "inflight",
    "waiting_retry",
    "ready_backlog",
)


def active_span(load: Frame, margin: float = 0.1) -> pd.DataFrame:
    """The load rows up to the last bucket where anything happens (plus ``margin`` of that
    span, at least one bucket): a run with a long quiet tail plots its busy part."""
    pdf = _of(load, None)
    busy = pdf[(pdf[list(_ACTIVITY)] != 0).any(axis=1)]
    if busy.empty:
        return pdf
    last = float(busy["minute_end"].max())
    step = float(pdf["bucket_ms"].iloc[0]) / MINUTE_MS
    return pdf[pdf["minute"] < last + max(last * margin, step)].reset_index(drop=True)


# The share of a run's deliveries the zoomed time axes hold, and how much narrower than the
# active span they must be to zoom at all (a storm of 30 minutes in a 6-hour run).
BUSY_SHARE, ZOOM_BELOW = 0.99, 0.6


def busy_window(
    load: pd.DataFrame, outages: Sequence[tuple[float, float]] = ()
) -> pd.DataFrame | None:
    """The first buckets of ``load`` (an :func:`active_span`) holding :data:`BUSY_SHARE` of
    the deliveries and every outage (minutes), plus 10 % (at least one bucket): where a
    planner looks. None when that is not much narrower than the span (:data:`ZOOM_BELOW`),
    or nothing was delivered."""
    if load.empty or load["deliveries"].sum() == 0:
        return None
    share = load["deliveries"].cumsum() / load["deliveries"].sum()
    end = float(load.loc[share >= BUSY_SHARE, "minute_end"].iloc[0])
    end = max([end, *(stop for _, stop in outages)])
    step = float(load["bucket_ms"].iloc[0]) / MINUTE_MS
    end += max(end * 0.1, step)
    if end >= ZOOM_BELOW * float(load["minute_end"].max()):
        return None
    return load[load["minute"] < end].reset_index(drop=True)


def _of(load: Frame, group: str | None) -> pd.DataFrame:
    pdf = load if isinstance(load, pd.DataFrame) and "minute" in load else load_frame(load)
    return pdf if group is None else pdf[pdf["group"] == group].reset_index(drop=True)


def state_counts(load: Frame, group: str | None = None) -> pd.DataFrame:
    """Messages Ready (backlog), Inflight and WaitingRetry at each bucket's end, and each at
    its highest within the bucket (``Ready max``, ...)."""
    pdf = _of(load, group)
    highest = {f"{column}_max": f"{name} max" for column, name in STATE_COLUMNS.items()}
    columns = ["group", "minute", "minute_end", *STATE_COLUMNS, *highest]
    return pdf[columns].rename(columns={**STATE_COLUMNS, **highest})


def delivery_rates(load: Frame, group: str | None = None) -> pd.DataFrame:
    """First deliveries, retries and all deliveries per second, per bucket."""
    pdf = _of(load, group)
    seconds = pdf["bucket_ms"] / 1000
    return pd.DataFrame(
        {
            "group": pdf["group"],
            "minute": pdf["minute"],
            "minute_end": pdf["minute_end"],
            "first_per_s": pdf["first_deliveries"] / seconds,
            "retries_per_s": pdf["retries"] / seconds,
            "deliveries_per_s": pdf["deliveries"] / seconds,
        }
    )


def schedule_backlog(load: Frame, group: str | None = None) -> pd.DataFrame:
    """Messages waiting in SCHEDULE_TOPIC_XXXX per delay level at each bucket's end, one
    column per level that ever holds a message (``L3``, ``L4``, ...); empty for flavors
    without the schedule topic."""
    pdf = _of(load, group)
    levels = pdf["schedule_backlog"].apply(lambda a: list(a) if a is not None else [])
    width = int(levels.map(len).max()) if len(levels) else 0
    wide = pd.DataFrame(
        [row + [0] * (width - len(row)) for row in levels],
        columns=[f"L{level}" for level in range(1, width + 1)],
        index=pdf.index,
    )
    used = [column for column in wide if wide[column].sum() > 0]
    return pd.concat([pdf[["group", "minute_end"]], wide[used]], axis=1)


def dlq_flow(load: Frame, group: str | None = None) -> pd.DataFrame:
    """Moves into the DLQ and replays out of it per bucket, and their running totals."""
    pdf = _of(load, group)
    out = pdf[["group", "minute", "minute_end", "dlq", "replays", "discards"]].copy()
    by_group = out.groupby("group", sort=False)
    out["dlq_total"] = by_group["dlq"].cumsum()
    out["replayed_total"] = by_group["replays"].cumsum()
    return out


def commitlog_writes(load: Frame, group: str | None = None) -> pd.DataFrame:
    """Commitlog writes per second and their running total (publishes, schedule-topic
    copies, retry-topic copies, DLQ writes, replays: docs/model.md §9)."""
    pdf = _of(load, group)
    out = pdf[["group", "minute", "minute_end", "commitlog_writes", "commitlog_bytes"]].copy()
    out["writes_per_s"] = out["commitlog_writes"] / (pdf["bucket_ms"] / 1000)
    out["writes_total"] = out.groupby("group", sort=False)["commitlog_writes"].cumsum()
    return out


def utilization(load: Frame, group: str | None = None) -> pd.DataFrame:
    """Consumer pool utilization (busy thread time / pool time; empty for an unlimited pool)
    and the age of the oldest Ready message at each bucket's end, in seconds."""
    pdf = _of(load, group)
    return pd.DataFrame(
        {
            "group": pdf["group"],
            "minute": pdf["minute"],
            "minute_end": pdf["minute_end"],
            "utilization": pdf["utilization"],
            "oldest_ready_age_s": pdf["oldest_ready_age_ms"] / 1000,
        }
    )


def summary_frame(summary: Frame) -> pd.DataFrame:
    return _pandas(summary).sort_values("group").reset_index(drop=True)


def plan_frame(plan: Frame) -> pd.DataFrame:
    """The plan table as pandas, ordered by group and point, settings and targets decoded."""
    pdf = _pandas(plan).sort_values(["group", "point"]).reset_index(drop=True)
    pdf["settings"] = pdf["settings_json"].map(json.loads)
    pdf["targets"] = pdf["targets_json"].map(json.loads)
    return pdf


def case_label(settings: dict[str, Any], group: str) -> str:
    """A plan row's settings that do not set ``group``'s pool, as one label (its case)."""
    prefix = f"groups.{group}."
    return ", ".join(
        f"{key.removeprefix(prefix)}={value}"
        for key, value in settings.items()
        if not key.startswith(f"{prefix}consumers")
    )


def point_report_id(row: Mapping[str, Any]) -> str:
    """The run whose report stands for a plan row's point (its report is ``<id>.html``): the
    point's run, or its first replication's (``-r1``) when it has several."""
    suffix = "-r1" if int(row["replications"]) > 1 else ""
    return f"{row['point_run_id']}{suffix}"


def busiest_message(attempts: DataFrame, group: str) -> int | None:
    """The message of ``group`` with the most deliveries (lowest id on ties): a good one to
    follow with :func:`message_timeline`. One row reaches the driver."""
    row = (
        attempts.where(F.col("group") == F.lit(group))
        .groupBy("msg_id")
        .agg(F.max("delivery").alias("deliveries"))
        .orderBy(F.col("deliveries").desc(), "msg_id")
        .first()
    )
    return None if row is None else int(row["msg_id"])


def message_timeline(source: Any, group: str, msg_id: int) -> pd.DataFrame:
    """One message's state changes in order (``source``: a Result or its transitions
    DataFrame), with the time since the previous change."""
    transitions = source.transitions if hasattr(source, "transitions") else source
    pdf = (
        transitions.where((F.col("group") == F.lit(group)) & (F.col("msg_id") == F.lit(msg_id)))
        .select("delivery", "seq", "state", "at_ms", "topic", "queue_id", "delay_level", "reason")
        .orderBy("seq")
        .toPandas()
    )
    pdf["at"] = pdf["at_ms"].map(human_ms)
    pdf["since_previous"] = pdf["at_ms"].diff().fillna(0).map(human_ms)
    return pdf


@dataclass(frozen=True)
class RunData:
    """Everything a run's report shows, already on the driver (all aggregated): ``config``
    is the stored ``runs.config_json`` as a dict, ``scenario`` the Scenario it came from."""

    run_id: str
    run: dict[str, Any]
    config: dict[str, Any]
    scenario: Scenario
    summary: pd.DataFrame
    load: pd.DataFrame
    retries: pd.DataFrame
    instances: pd.DataFrame  # instance_load: utilization per group, instance and bucket
    # retrysim compare's tables for the run (empty where it was not compared)
    observed: pd.DataFrame = field(default_factory=pd.DataFrame)
    comparison: pd.DataFrame = field(default_factory=pd.DataFrame)

    def _group(self, name: str) -> Group | None:
        return next((group for group in self.scenario.groups if group.name == name), None)

    def flavor(self, group: str) -> str:
        found = self._group(group)
        return found.flavor if found else "?"

    @property
    def delay_levels_ms(self) -> list[int]:
        return list(self.scenario.broker.message_delay_level)

    def outages(self, group: str) -> list[tuple[float, float]]:
        """The group's outage windows, in minutes since the start."""
        found = self._group(group)
        windows = found.behavior.outages if found else ()
        return [(w.start / MINUTE_MS, w.end / MINUTE_MS) for w in windows]

    def retry_path(self, group: str) -> str:
        """Where the group's failed messages wait (``retrysim.model.states``: ``schedule``
        for the 4.x schedule topic, ``revive`` for 5.x invisible time, ``local``, ...)."""
        found = self._group(group)
        if found is None:
            return "?"
        return policy_for(found, self.scenario.broker.message_delay_level).retry_path

    def threads(self, group: str) -> int | None:
        """Each instance's consumer threads (None: unlimited)."""
        found = self._group(group)
        return None if found is None or found.consumers.unlimited else found.consumers.threads

    def pool(self, group: str) -> int | None:
        """The group's consumer threads (None: unlimited)."""
        found = self._group(group)
        return found.consumers.pool_size if found else None

    def downstream_capacity(self, group: str) -> int | None:
        """The calls the group's downstream serves at once at full speed, over all its
        instances (None: no downstream that answers to load)."""
        found = self._group(group)
        downstream = found.behavior.downstream if found else None
        if downstream is None:
            return None
        return downstream.capacity * (1 if downstream.shared else found.consumers.instances)


def run_data(
    spark: SparkSession, output: str, run_id: str, retries: pd.DataFrame | None = None
) -> RunData | None:
    """Read a run's aggregated data (None if there is no such complete run). ``retries``:
    the run's :func:`retries_by_level`, when the caller counted them while staging the run.
    The small tables are read by delta-rs on the driver (four Spark jobs would be planned
    and compiled on a new JVM at the end of a run, for a few rows); only the attempts, for
    the retries, go through Spark."""
    runs = [row for row in run_rows(output, "runs", run_id) if row["status"] == STATUS_COMPLETE]
    if not runs:
        return None
    if retries is None:
        attempts = read_table(spark, output, "attempts")
        retries = retries_by_level(attempts.where(F.col(PARTITION_COLUMN) == F.lit(run_id)))
    return _run_data(
        run_id,
        {key: value for key, value in runs[-1].items() if key != PARTITION_COLUMN},
        {table: run_frame(output, table, run_id) for table in (*_SMALL_TABLES, *_COMPARED)},
        retries,
    )


def staged_run_data(run_id: str, staged: Mapping[str, str], retries: pd.DataFrame) -> RunData:
    """:func:`run_data` from a run's staged tables (``staged``: each table's folder of
    Parquet files, the ``runs`` row's as it will be when complete), before they are
    published: a run's report is then drawn while the run is checked."""

    def read(table: str) -> pa.Table:
        return pq.read_table(staged[table], columns=data_schema(SCHEMAS[table]).fieldNames())

    (run,) = read("runs").to_pylist()
    frames = {table: read(table).to_pandas() for table in _SMALL_TABLES}
    return _run_data(run_id, run, frames, retries)


_SMALL_TABLES = ("summary", "load", "instance_load")
_COMPARED = ("observed", "comparison")  # retrysim compare's, once it has run
INSTANCE_COLUMNS = (
    "group",
    "consumer_instance",
    "bucket_start_ms",
    "bucket_ms",
    "deliveries",
    "busy_thread_ms",
    "utilization",
    "utilization_max",
    "ready_backlog",
    "ready_backlog_max",
)


def _run_data(
    run_id: str, run: dict[str, Any], frames: Mapping[str, pd.DataFrame], retries: pd.DataFrame
) -> RunData:
    instances = frames["instance_load"]
    return RunData(
        run_id=run_id,
        run=run,
        config=json.loads(run["config_json"]),
        scenario=scenario_from_json(run["config_json"]),
        summary=summary_frame(frames["summary"]),
        load=load_frame(frames["load"]),
        retries=retries,
        instances=instances[list(INSTANCE_COLUMNS)],
        **{table: frames[table] for table in _COMPARED if table in frames},
    )


def instance_utilization(instances: pd.DataFrame, group: str, span: pd.DataFrame) -> pd.DataFrame:
    """One group's utilization per instance (rows) and bucket start in minutes (columns),
    over the buckets of ``span`` (its :func:`active_span`)."""
    rows = instances[instances["group"] == group]
    rows = rows[rows["bucket_start_ms"] < (span["minute_end"].max() * MINUTE_MS)]
    return rows.assign(minute=rows["bucket_start_ms"] / MINUTE_MS).pivot_table(
        index="consumer_instance", columns="minute", values="utilization", dropna=False
    )


def instance_busy_threads(instances: pd.DataFrame, group: str, span: pd.DataFrame) -> pd.DataFrame:
    """One group's busy threads per instance (columns) and bucket start in minutes (index):
    each instance's thread time in the bucket over the bucket's length, its mean busy
    threads, over the buckets of ``span`` (an instance without a row in a bucket: 0)."""
    rows = instances[instances["group"] == group]
    rows = rows[rows["bucket_start_ms"] < (span["minute_end"].max() * MINUTE_MS)]
    busy = rows.assign(
        minute=rows["bucket_start_ms"] / MINUTE_MS,
        busy=rows["busy_thread_ms"] / rows["bucket_ms"],
    ).pivot_table(index="minute", columns="consumer_instance", values="busy", aggfunc="sum")
    return busy.reindex(pd.Index(span["minute"], name="minute"), fill_value=0.0).fillna(0.0)


def write_breakdown(
    load: pd.DataFrame, retries: pd.DataFrame, messages: int, retry_path: str
) -> list[tuple[str, int]]:
    """A group's commit-log writes by kind (docs/model.md §9, *commitlog writes*), from its
    whole ``load`` rows and its retries by level (:func:`retries_by_level`): publishes
    (``messages``), replays, the 4.x schedule-topic copies (the retries on a delay level),
    DLQ moves, and the rest, which is what the flavor writes per retry beyond those: the
    schedule topic's copies into ``%RETRY%`` (4.x), or the reviver's copies into
    ``%RETRY%`` with the pops' checkpoints and acks (5.x). The kinds add up to the load's
    writes exactly; the rest is their difference, not counted on its own."""
    total = int(load["commitlog_writes"].sum())
    known = [
        ("publishes", int(messages)),
        ("replays", int(load["replays"].sum())),
        ("schedule-topic copies", int(retries.dropna(subset=["delay_level"])["retries"].sum())),
        ("DLQ moves", int(load["dlq"].sum())),
    ]
    rest = {
        "schedule": "retry-topic copies (the schedule topic's deliveries to %RETRY%)",
        "revive": "the reviver's retry-topic copies, the pops' checkpoints and acks",
    }.get(retry_path, "other (retry-topic copies, broadcast copies)")
    parts = [*known, (rest, total - sum(count for _, count in known))]
    return [(name, count) for name, count in parts if count]


def observed_frames(data: RunData, group: str) -> dict[str, pd.DataFrame]:
    """The group's compared quantities as two frames, ``observed`` and ``simulated``, each
    with ``minute_end`` (the bucket's end, in minutes since the start) and a column per
    quantity: what the report overlays (empty where the run was not compared)."""
    rows = data.observed
    if rows.empty or group not in set(rows["group"]):
        return {}
    rows = rows[rows["group"] == group]
    minute_end = (rows["bucket_start_ms"] + data.scenario.load_bucket) / MINUTE_MS
    frames = {}
    for side in ("observed", "simulated"):
        wide = rows.assign(minute_end=minute_end).pivot_table(
            index="minute_end", columns="quantity", values=side, aggfunc="first"
        )
        frames[side] = wide.reset_index()
    return frames
