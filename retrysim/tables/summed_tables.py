"""A run's small tables on the driver, from the sums of groups each simulated whole in a task.

When every group of a run was summed up where it was simulated
(:mod:`retrysim.tables.key_peaks`), the Spark passes that build ``load``, ``instance_load``
and ``summary`` read nothing but those sums: a few rows per bucket and kind of delivery. On
a new JVM their forty-odd small jobs spend far longer on planning and code generation than
on their work, and staging waits for them. This module is their twin in Python integers,
the same rows column for column
(:func:`retrysim.tables.load.load_from_attempts`,
:func:`retrysim.tables.instances.instance_load_from`,
:func:`retrysim.tables.summary.summary_from` and
:func:`retrysim.tables.load.retries_by_level`; tests/tables/test_summed_tables.py holds them
equal), written as Parquet by pyarrow.

It declines a run it cannot make exactly (:func:`small_tables` returns None): a group not
summed up whole, a shared group without its instances' rows, or a batch (a member's share of
its thread's time is a fraction, which Spark sums in its own order).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import NamedTuple

import pandas as pd

from retrysim.model.policy import policy_for
from retrysim.model.states import COMMIT, DISCARD, DLQ, WAITING_RETRY
from retrysim.model.topology import BROADCAST
from retrysim.scenario.spec import Scenario
from retrysim.tables.group_sums import (
    ALL_LEVELS,
    GAUGES,
    QUANTILES,
    RATE_COLUMNS,
    THREAD_UNITS,
    GroupSums,
)
from retrysim.tables.groups import GROUPS, group_rows
from retrysim.tables.instances import shared_groups
from retrysim.tables.load import LOAD_COUNTS, LOAD_GAUGES
from retrysim.tables.schemas import INSTANCE_LOAD, LOAD, SUMMARY, data_schema, write_rows
from retrysim.tables.summary import PERCENTILES

_SETTLED = {COMMIT: "commits", DLQ: "dlq", DISCARD: "discards"}


class _Compact(NamedTuple):
    """A compact row (:func:`retrysim.tables.load._compact`'s columns)."""

    group: str
    started: bool | None
    first: bool | None
    retry: bool | None
    replayed: bool | None
    state: str | None
    ended: bool | None
    waits_retry: bool | None
    b_writes: list[int | None]
    level: int | None
    b_ready: int | None
    b_start: int | None
    b_end: int | None
    b_settled: int | None
    b_wr_until: int | None
    b_busy_last: int | None
    batch_size: int | None
    retry_level: int | None
    retry_number: int | None
    copy_state: str | None
    b_copy: int | None
    b_copy_until: int | None
    copy_level: int | None
    n: int
    busy_start_sum: int | None
    busy_end_sum: int | None
    min_waited_ready: int | None


# bucket_changes' columns (GroupSums.changes) and instance_changes' (GroupSums.instances)
_CHANGES = ("bucket", "level", "group", *[f"{g}_total" for g in GAUGES], "longest_wait",
            *[f"{g}_rise" for g in GAUGES], *[f"{r}_busiest" for r in RATE_COLUMNS])  # fmt: skip
_INSTANCE_CHANGES = ("bucket", "consumer_instance", "group", "ready_backlog_total",
                     "threads_busy_total", "deliveries", "threads_busy_area",
                     "ready_backlog_rise", "threads_busy_rise")  # fmt: skip


@dataclass(frozen=True)
class SmallTables:
    """The rows of ``load``, ``instance_load`` and ``summary`` (each a dict per row, by
    column), and the run's retries by level as ``retries_by_level`` gives them."""

    load: list[dict]
    instance_load: list[dict]
    summary: list[dict]
    retries: pd.DataFrame

    def write(self, paths: dict[str, str]) -> None:
        """Each table as one Parquet file in its staging folder, as Spark would stage it."""
        for name, rows, schema in (
            ("load", self.load, LOAD),
            ("instance_load", self.instance_load, INSTANCE_LOAD),
            ("summary", self.summary, SUMMARY),
        ):
            columns = data_schema(schema)
            write_rows(
                [tuple(r[c] for c in columns.fieldNames()) for r in rows], columns, paths[name]
            )


def small_tables(
    scenario: Scenario, engines: dict[str, str], known: dict[str, GroupSums] | None
) -> SmallTables | None:
    """The run's small tables from ``known``, or None when they cannot be made exactly
    here (see the module text): then Spark makes them."""
    known = known or {}
    names = [group.name for group in scenario.groups]
    if not all(name in known and known[name].complete for name in names):
        return None
    compact = {name: [_Compact(*row) for row in known[name].compact] for name in names}
    busy_rows = (row for rows in compact.values() for row in rows if row.b_busy_last is not None)
    if any(row.batch_size != 1 for row in busy_rows):
        return None
    shared = set(shared_groups(scenario))
    if any(known[name].instances is None for name in shared):
        return None
    groups = {
        row[0]: dict(zip(GROUPS.fieldNames(), row, strict=True)) for row in group_rows(scenario)
    }
    load, instance_load, summary = [], [], []
    for name in names:
        group, sums = groups[name], known[name]
        changes = [dict(zip(_CHANGES, row, strict=True)) for row in sums.changes]
        rows = _load_rows(scenario, group, compact[name], changes)
        instances = (
            _instance_rows(scenario, group, sums.instances) if name in shared else _alone(rows)
        )
        load += rows
        instance_load += instances
        summary.append(
            _summary_row(scenario, group, engines, sums, compact[name], changes, rows, instances)
        )
    return SmallTables(load, instance_load, summary, _retries(compact))


def _load_rows(
    scenario: Scenario, group: dict, compact: list[_Compact], changes: list[dict]
) -> list[dict]:
    """load_from_attempts of one group."""
    bucket_ms = scenario.load_bucket
    buckets = -(-scenario.horizon // bucket_ms)
    per_bucket = {name: [0] * buckets for name in (*LOAD_COUNTS, *LOAD_GAUGES)}
    schedule: dict[tuple[int, int], int] = defaultdict(int)  # (level, bucket) -> change
    busy_ms = [0] * buckets  # integers: every busy row is a single message's request
    first_ready: dict[int, int] = {}  # bucket before the start -> the earliest waited Ready

    def add(kind: str, bucket: int | None, amount: int) -> None:
        if bucket is not None and 0 <= bucket < buckets:
            per_bucket[kind][bucket] += amount

    def add_scheduled(level: int, bucket: int | None, amount: int) -> None:
        if bucket is not None and 0 <= bucket < buckets:
            schedule[level, bucket] += amount

    for row in compact:  # _events
        n = row.n
        if row.started:
            add("deliveries", row.b_start, n)
            add("inflight", row.b_start, n)
            add("ready_backlog", row.b_start, -n)
        if row.first:
            add("first_deliveries", row.b_start, n)
        if row.retry:
            add("retries", row.b_start, n)
        if row.replayed:
            add("replays", row.b_ready, n)
        if row.state in _SETTLED:
            add(_SETTLED[row.state], row.b_settled, n)
        if row.ended:
            add("inflight", row.b_end, -n)
        if row.waits_retry:
            add("waiting_retry", row.b_end, n)
            add("waiting_retry", row.b_wr_until, -n)
        add("ready_backlog", row.b_ready, n)
        if row.level is not None:
            add_scheduled(row.level, row.b_end, n)
            add_scheduled(row.level, row.b_wr_until, -n)
        if row.copy_state in _SETTLED:  # a 4.9 client's second copy
            add(_SETTLED[row.copy_state], row.b_copy, n)
        if row.copy_state == WAITING_RETRY:
            add("waiting_retry", row.b_copy, n)
            add("waiting_retry", row.b_copy_until, -n)
            add_scheduled(row.copy_level, row.b_copy, n)
            add_scheduled(row.copy_level, row.b_copy_until, -n)
        for bucket in row.b_writes:
            add("commitlog_writes", bucket, n)
        if row.b_busy_last is not None:  # _busy_ms
            first, last = row.b_start, row.b_busy_last
            for bucket in range(max(first, 0), min(last, buckets - 1) + 1):
                if first == last:
                    busy = row.busy_end_sum - row.busy_start_sum
                elif bucket == first:
                    busy = n * (first + 1) * bucket_ms - row.busy_start_sum
                elif bucket == last:
                    busy = row.busy_end_sum - n * last * bucket_ms
                else:
                    busy = n * bucket_ms
                busy_ms[bucket] += busy
        if row.min_waited_ready is not None:  # _oldest_ready
            before = (row.b_start if row.b_start is not None else buckets) - 1
            if 0 <= before < buckets:
                ready = row.min_waited_ready
                first_ready[before] = min(first_ready.get(before, ready), ready)

    peaks = {c["bucket"]: c for c in changes if c["level"] == ALL_LEVELS}
    backlogs = _schedule_backlog(group["levels"], buckets, schedule, changes)
    pool = group["pool"]
    ends = dict.fromkeys((*LOAD_GAUGES, "threads_busy"), 0)
    oldest = [None] * buckets  # the suffix minimum of first_ready
    for bucket in reversed(range(buckets)):
        candidates = [first_ready.get(bucket), oldest[bucket + 1] if bucket + 1 < buckets else None]
        oldest[bucket] = _smallest(candidates)
    rows = []
    for bucket in range(buckets):
        peak = peaks.get(bucket, {})
        for gauge in LOAD_GAUGES:
            ends[gauge] += per_bucket[gauge][bucket]
        ends["threads_busy"] += peak.get("threads_busy_total") or 0
        end_ms = (bucket + 1) * bucket_ms
        busy = float(busy_ms[bucket])
        age = (
            end_ms - oldest[bucket] if oldest[bucket] is not None and oldest[bucket] < end_ms else 0
        )
        highest = {g: _bucket_maximum(ends[g], peak, g) for g in (*LOAD_GAUGES, "threads_busy")}
        threads_busy_max = _round6(highest["threads_busy"] / float(THREAD_UNITS))
        writes = per_bucket["commitlog_writes"][bucket]
        rows.append(
            {
                "group": group["group"],
                "bucket_start_ms": bucket * bucket_ms,
                "bucket_ms": bucket_ms,
                **{name: per_bucket[name][bucket] for name in LOAD_COUNTS},
                **{gauge: ends[gauge] for gauge in LOAD_GAUGES},
                "commitlog_bytes": writes * group["size_bytes"],
                "schedule_backlog": backlogs[bucket][0],
                "busy_thread_ms": busy,
                "utilization": None if pool is None else busy / (pool * bucket_ms),
                "oldest_ready_age_ms": age,
                **{f"{gauge}_max": highest[gauge] for gauge in LOAD_GAUGES},
                "schedule_backlog_max": backlogs[bucket][1],
                "utilization_max": None if pool is None else threads_busy_max / pool,
                "oldest_ready_age_ms_max": max(age, peak.get("longest_wait") or 0),
            }
        )
    return rows


def _bucket_maximum(end: int, change: dict, gauge: str) -> int:
    """peaks.bucket_maximum: the value it entered with (end - total) plus its rise."""
    rise = change.get(f"{gauge}_rise")
    return end if rise is None else end - change[f"{gauge}_total"] + rise


def _schedule_backlog(
    levels: int, buckets: int, deltas: dict[tuple[int, int], int], changes: list[dict]
) -> list[tuple[list[int], list[int]]]:
    """load._schedule_backlog: per bucket, each delay level's backlog at its end and at
    most within it (empty for a group that does not use the delay table)."""
    per_level = {(c["level"], c["bucket"]): c for c in changes if c["level"] > ALL_LEVELS}
    ends: list[list[int]] = [[] for _ in range(buckets)]
    highest: list[list[int]] = [[] for _ in range(buckets)]
    for level in range(1, levels + 1):
        backlog = 0
        for bucket in range(buckets):
            backlog += deltas.get((level, bucket), 0)
            ends[bucket].append(backlog)
            highest[bucket].append(
                _bucket_maximum(backlog, per_level.get((level, bucket), {}), "schedule")
            )
    return list(zip(ends, highest, strict=True))


def _alone(load: list[dict]) -> list[dict]:
    """instances._from_load: a group with one instance that can get work has the load's rows."""
    columns = [c for c in data_schema(INSTANCE_LOAD).fieldNames() if c != "consumer_instance"]
    return [{"consumer_instance": 0, **{c: row[c] for c in columns}} for row in load]


def _instance_rows(scenario: Scenario, group: dict, changes: tuple[tuple, ...]) -> list[dict]:
    """instances._from_changes of one group: each instance that can get work, per bucket."""
    bucket_ms = scenario.load_bucket
    buckets = -(-scenario.horizon // bucket_ms)
    by_key = {}
    for row in changes:
        change = dict(zip(_INSTANCE_CHANGES, row, strict=True))
        by_key[change["consumer_instance"], change["bucket"]] = change
    threads = group["threads"]
    rows = []
    for instance in range(group["assignable_instances"]):
        ready = threads_busy = 0
        for bucket in range(buckets):
            change = by_key.get((instance, bucket), {})
            threads_total = change.get("threads_busy_total") or 0
            ready += change.get("ready_backlog_total") or 0
            threads_busy += threads_total
            entered = threads_busy - threads_total
            area = entered * bucket_ms + int(change.get("threads_busy_area") or 0)
            busy = _round6(_thread_ms(area))
            highest = _bucket_maximum(threads_busy, change, "threads_busy")
            highest = _round6(highest / float(THREAD_UNITS))
            rows.append(
                {
                    "group": group["group"],
                    "consumer_instance": instance,
                    "bucket_start_ms": bucket * bucket_ms,
                    "bucket_ms": bucket_ms,
                    "deliveries": change.get("deliveries") or 0,
                    "ready_backlog": ready,
                    "ready_backlog_max": _bucket_maximum(ready, change, "ready_backlog"),
                    "busy_thread_ms": busy,
                    "utilization": None if threads is None else busy / (threads * bucket_ms),
                    "utilization_max": None if threads is None else highest / threads,
                }
            )
    return rows


_MICRO = Decimal("0.000001")


def _thread_ms(area: int) -> float:
    """Thread-milliseconds of an area in THREAD_UNITS, as Spark divides two decimal(38, 0):
    a decimal(38, 6) rounded half up, then a double."""
    with localcontext() as exact:
        exact.prec = 60
        return float((Decimal(area) / THREAD_UNITS).quantize(_MICRO, ROUND_HALF_UP))


def _round6(value: float) -> float:
    """Spark's ``round(value, 6)`` of a double: its decimal text, rounded half up."""
    return float(Decimal(repr(value)).quantize(_MICRO, ROUND_HALF_UP))


def _summary_row(
    scenario: Scenario,
    group: dict,
    engines: dict[str, str],
    sums: GroupSums,
    compact: list[_Compact],
    changes: list[dict],
    load: list[dict],
    instances: list[dict],
) -> dict:
    """summary_from of one group."""
    name, messages = group["group"], group["messages"]

    def total(kept) -> int:
        return sum(row.n for row in compact if kept(row))

    replayed = total(lambda r: r.replayed)
    counted = {
        "deliveries": total(lambda r: r.started),
        "retries": total(lambda r: r.retry),
        "commits": total(lambda r: r.state == COMMIT),
        "dlq": total(lambda r: r.state == DLQ) + total(lambda r: r.copy_state == DLQ) - replayed,
        "discards": total(lambda r: r.state == DISCARD) + total(lambda r: r.copy_state == DISCARD),
        "replayed": replayed,
        "late_send_backs": total(lambda r: r.copy_state is not None),
    }
    writes = sum(row["commitlog_writes"] for row in load)
    row = {
        "group": name,
        "messages": messages,
        **counted,
        "pending": messages
        + counted["late_send_backs"]
        - counted["commits"]
        - counted["dlq"]
        - counted["discards"],
        "amplification": counted["deliveries"] / messages,
        "commitlog_writes": writes,
        "write_amplification": writes / messages,
        "max_ready_backlog": max(r["ready_backlog_max"] for r in load),
        "max_waiting_retry": max(r["waiting_retry_max"] for r in load),
        "max_inflight": max(r["inflight_max"] for r in load),
        "peak_utilization": _largest(r["utilization_max"] for r in load),
        "max_oldest_ready_age_ms": max(r["oldest_ready_age_ms_max"] for r in load),
        "engine": engines.get(name),
        **_run_maxima(changes),
        **_instance_extremes(scenario, name, instances),
    }
    for share in PERCENTILES:
        label, index = f"p{round(share * 100)}", QUANTILES.index(share)
        row[f"{label}_time_to_commit_ms"] = sums.ttc[index] if sums.ttc else None
        row[f"{label}_time_to_dlq_ms"] = sums.ttd[index] if sums.ttd else None
    row["time_to_commit_quantiles_ms"] = list(sums.ttc) if sums.ttc else None
    row["time_to_dlq_quantiles_ms"] = list(sums.ttd) if sums.ttd else None
    return row


def _largest(values) -> float | int | None:
    """SQL's max: nulls skipped, null when there is nothing else."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _smallest(values) -> int | None:
    """SQL's min: nulls skipped, null when there is nothing else."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _run_maxima(changes: list[dict]) -> dict:
    """peaks.run_maxima of one group, as the summary's columns (0 where it has none)."""
    rows = sorted((c for c in changes if c["level"] == ALL_LEVELS), key=lambda c: c["bucket"])
    ends = dict.fromkeys(GAUGES, 0)
    schedule = []
    for change in rows:
        ends["schedule"] += change["schedule_total"]
        schedule.append(_bucket_maximum(ends["schedule"], change, "schedule"))
    return {
        "max_schedule_backlog": max(schedule, default=0),
        **{
            f"peak_{rate}_per_s": _largest(c[f"{rate}_busiest"] for c in rows) or 0
            for rate in RATE_COLUMNS
        },
    }


def _instance_extremes(scenario: Scenario, name: str, instances: list[dict]) -> dict:
    """instances.instance_extremes of one group."""
    top = min(
        instances,
        key=lambda r: (-r["busy_thread_ms"], r["consumer_instance"], r["bucket_start_ms"]),
    )
    delivered: dict[int, int] = defaultdict(int)
    for row in instances:
        delivered[row["consumer_instance"]] += row["deliveries"]
    working = sum(1 for count in delivered.values() if count > 0)
    spec = next(g for g in scenario.groups if g.name == name)
    topology = policy_for(spec, scenario.broker.message_delay_level).topology
    if topology.balancing == BROADCAST and working > 0:
        working = topology.instances  # every instance does what instance 0 does
    return {
        "busiest_instance": top["consumer_instance"],
        "busiest_instance_utilization": top["utilization"],
        "idle_instances": topology.instances - working,
    }


def _retries(compact: dict[str, list[_Compact]]) -> pd.DataFrame:
    """load.retries_by_level, with the dtypes Spark's toPandas gives."""
    counted: dict[tuple, int] = defaultdict(int)
    for rows in compact.values():
        for row in rows:
            if row.retry_number is not None:
                counted[row.group, row.retry_level, row.retry_number] += row.n
                if row.copy_state == WAITING_RETRY:  # a 4.9 client's second copy
                    counted[row.group, row.copy_level, row.retry_number] += row.n
    keys = sorted(counted, key=lambda k: (k[0], k[2], k[1] is not None, k[1] or 0))  # nulls first
    frame = pd.DataFrame(
        [(*key, counted[key]) for key in keys],
        columns=["group", "delay_level", "retry", "retries"],
    )
    levels = frame["delay_level"]
    return frame.astype(
        {
            "delay_level": "float64" if levels.isna().any() else "int32",
            "retry": "int32",
            "retries": "int64",
        }
    )
