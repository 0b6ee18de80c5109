"""The verdict: each group's answer in a few plain sentences, from the run's own figures.

The console prints it after a run's figures, the report puts it on top, and ``--json`` gives
the same figures to scripts. Every number in a sentence is a figure of that run (its
``summary``, ``load`` and ``instance_load`` rows and its scenario): the verdict reads the
aggregated tables only, so it costs the driver a few thousand rows whatever the run's size.

What it says, per group:

- **the outcome:** committed, dead-lettered (with the replayed ones beside them) and pending
  at the horizon;
- **time to commit:** p50 and p99, and that they count the committed messages only;
- **the wait:** the peak Ready backlog, the load bucket it fell in, and the oldest Ready age;
- **the instances** (a finite pool): the busiest instance, when its threads were all busy
  while work waited for them (*saturated*), how many threads it wanted at once against its
  own, which instance owns the retry queue where one does (4.x), the others' mean
  utilization meanwhile, and the idle instances.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from retrysim.model.policy import policy_for
from retrysim.model.topology import BY_QUEUE, Topology, owner
from retrysim.scenario.loading import scenario_from_json
from retrysim.scenario.spec import Group, Scenario
from retrysim.scenario.units import human_ms
from retrysim.store.sinks import run_frame, run_rows

# An instance whose threads were all busy with work waiting is *saturated* over the buckets
# where it was busy this share of its thread time; at moments, where it was less.
SATURATED = 0.95
# The tables a verdict reads, all aggregated (one row per group, bucket or instance).
VERDICT_TABLES = ("summary", "load", "instance_load")


@dataclass(frozen=True)
class GroupVerdict:
    """One group's verdict: ``lines`` to print, ``figures`` for scripts (``--json``)."""

    group: str
    lines: list[str]
    figures: dict[str, Any] = field(default_factory=dict)


def run_verdicts(
    output: str, run_id: str, read: Callable[[str], pd.DataFrame] | None = None
) -> list[GroupVerdict]:
    """Every group's verdict of run ``run_id`` under ``output``, in group order. ``read``
    gives one of :data:`VERDICT_TABLES` as the run's rows (default: delta-rs on the
    driver)."""
    (run,) = run_rows(output, "runs", run_id)[-1:]
    frames = {table: (read or _reader(output, run_id))(table) for table in VERDICT_TABLES}
    return verdicts(
        scenario_from_json(run["config_json"]),
        frames["summary"],
        frames["load"],
        frames["instance_load"],
    )


def _reader(output: str, run_id: str) -> Callable[[str], pd.DataFrame]:
    return lambda table: run_frame(output, table, run_id)


def verdicts(
    scenario: Scenario, summary: pd.DataFrame, load: pd.DataFrame, instances: pd.DataFrame
) -> list[GroupVerdict]:
    """The verdicts of a run's groups from its aggregated rows (pure pandas)."""
    rows = {row["group"]: row for row in summary.to_dict("records")}
    return [
        group_verdict(
            scenario,
            group,
            rows[group.name],
            load[load["group"] == group.name],
            instances[instances["group"] == group.name],
        )
        for group in scenario.groups
        if group.name in rows
    ]


def group_verdict(
    scenario: Scenario,
    group: Group,
    summary: dict[str, Any],
    load: pd.DataFrame,
    instances: pd.DataFrame,
) -> GroupVerdict:
    """One group's sentences and figures (see the module text)."""
    figures: dict[str, Any] = {
        key: _plain(summary[key])
        for key in (
            "messages",
            "deliveries",
            "retries",
            "commits",
            "dlq",
            "replayed",
            "discards",
            "pending",
            "p50_time_to_commit_ms",
            "p99_time_to_commit_ms",
            "p50_time_to_dlq_ms",
            "max_ready_backlog",
            "max_oldest_ready_age_ms",
            "idle_instances",
        )
    }
    figures["horizon_ms"] = scenario.horizon
    policy = policy_for(group, scenario.broker.message_delay_level)
    topology = policy.topology
    lines = [
        _outcome(summary, scenario.horizon, policy.max_retries, figures),
        _time_to_commit(summary),
        _wait(summary, load, figures),
    ]
    if topology.threads is not None and topology.balancing != "broadcast":
        lines.extend(_instances(topology, instances, figures))
    return GroupVerdict(group.name, [line for line in lines if line], figures)


def _plain(value: Any) -> Any:
    """A summary value as JSON takes it (numpy scalars to Python, NaN to None)."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _outcome(summary: dict, horizon_ms: int, max_retries: int, figures: dict) -> str:
    """Committed, dead-lettered with the replayed beside them, discarded, pending."""
    dead = int(summary["dlq"]) + int(summary["replayed"])
    parts = [f"{int(summary['commits']):,} of {int(summary['messages']):,} committed"]
    if dead:
        text = f"{dead:,} dead-lettered"
        if max_retries >= 0:
            text += f" after {max_retries + 1} deliveries each"
            figures["deliveries_per_dead_letter"] = max_retries + 1
        if not _missing(summary["p50_time_to_dlq_ms"]):
            text += f" (p50 {human_ms(summary['p50_time_to_dlq_ms'])} after publish)"
        if int(summary["replayed"]):
            text += f", {int(summary['replayed']):,} replayed, {int(summary['dlq']):,} left"
        parts.append(text)
    else:
        parts.append("0 DLQ")
    if int(summary["discards"]):
        parts.append(f"{int(summary['discards']):,} discarded")
    parts.append(f"{int(summary['pending']):,} pending at the horizon ({_moment(horizon_ms)})")
    return ", ".join(parts)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _time_to_commit(summary: dict) -> str:
    """p99 time to commit, and whom it counts when not every message committed."""
    p99 = summary["p99_time_to_commit_ms"]
    if _missing(p99):
        return "no message committed, so no time to commit"
    text = f"p99 time to commit {human_ms(p99)}"
    if int(summary["commits"]) < int(summary["messages"]) or int(summary["pending"]):
        text += " (of the committed only)"
    return text


def _wait(summary: dict, load: pd.DataFrame, figures: dict) -> str:
    """The peak Ready backlog, the bucket it fell in, the oldest Ready age."""
    peak = int(summary["max_ready_backlog"])
    if peak == 0:
        return "nothing waited for a thread"
    text = f"{peak:,} wait at the peak"
    at = load[load["ready_backlog_max"] == peak].sort_values("bucket_start_ms")
    if len(at):
        start = int(at["bucket_start_ms"].iloc[0])
        end = start + int(at["bucket_ms"].iloc[0])
        figures["max_ready_backlog_bucket_ms"] = [start, end]
        text += f" ({_moment(start)}-{_moment(end)})"
    if not _missing(summary["max_oldest_ready_age_ms"]):
        text += f", the oldest {human_ms(summary['max_oldest_ready_age_ms'])}"
    return text


def _moment(ms: int) -> str:
    """A moment of the run to the second, as short as it is exact: 0s, 21m, 4m50s, 1h05m."""
    if ms % 1000:
        return human_ms(ms)
    hours, rest = divmod(ms // 1000, 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{hours}h" if hours else ""
    if minutes or (hours and seconds):
        text += f"{minutes:02d}m" if hours else f"{minutes}m"
    if seconds or not text:
        text += f"{seconds:02d}s" if text else f"{seconds}s"
    return text


def _instances(topology: Topology, instances: pd.DataFrame, figures: dict) -> list[str]:
    """The busiest instance, its saturation and wanted threads, the others, the idle."""
    threads = int(topology.threads or 0)
    count = topology.instances
    if instances.empty or threads == 0:
        return []
    per = instances.groupby("consumer_instance").agg(
        deliveries=("deliveries", "sum"),
        busy=("busy_thread_ms", "sum"),
        most_busy=("utilization_max", "max"),
        most_waiting=("ready_backlog_max", "max"),
    )
    per = per.reindex(range(count), fill_value=0)
    busiest = int(per["busy"].idxmax())
    rows = instances[instances["consumer_instance"] == busiest]
    full = rows[(rows["utilization_max"] >= 1.0) & (rows["ready_backlog_max"] > 0)]
    sustained = full[full["utilization"] >= SATURATED]
    name = f"instance {busiest}"
    owned = _retry_owners(topology)
    if owned == [busiest]:
        name += " (the %RETRY% queue's: every retry)"
    elif busiest in owned:
        name += " (a %RETRY% queue's)"
    figures.update(busiest_instance=busiest, threads_per_instance=threads)
    lines = []
    if len(full):
        window = _saturated_run(sustained) if len(sustained) else full
        start = int(window["bucket_start_ms"].min())
        end = int((window["bucket_start_ms"] + window["bucket_ms"]).max())
        busy_share = float(window["busy_thread_ms"].sum() / (threads * (end - start)))
        at_once = threads + int(window["ready_backlog_max"].max())
        to_keep_up = _threads_to_keep_up(window)
        figures.update(
            saturated_from_ms=start,
            saturated_to_ms=end,
            busiest_utilization_while_saturated=round(busy_share, 4),
            threads_wanted_at_once=at_once,
            threads_to_keep_up=to_keep_up,
        )
        when = f"{_moment(start)} to {_moment(end)}"
        if len(sustained):
            text = f"{name} saturated from {when} ({busy_share:.0%} busy)"
            text += f", wanting {to_keep_up:,} of its {threads} threads to keep up"
        else:
            text = f"{name} saturated at moments from {when} ({busy_share:.0%} busy)"
            text += f", wanting up to {at_once:,} of its {threads} threads at once"
        if count > 1:
            others = instances[
                (instances["consumer_instance"] != busiest)
                & (instances["bucket_start_ms"] >= start)
                & (instances["bucket_start_ms"] < end)
            ]
            share = float(others["busy_thread_ms"].sum() / ((count - 1) * threads * (end - start)))
            figures["others_utilization_while_saturated"] = round(share, 4)
            text += f"; the other{f' {count - 1}' if count > 2 else ''} at {share:.0%}"
        lines.append(text)
    else:
        most = round(float(per.loc[busiest, "most_busy"]) * threads)
        lines.append(f"never saturated: at most {most:,} of an instance's {threads} threads busy")
    idle = [int(i) for i in per.index if per.loc[i, "deliveries"] == 0]
    figures["idle_instance_ids"] = idle
    if count > 1:
        lines.append(f"{len(idle)} of {count} instances idle")
    return lines


def _saturated_run(saturated: pd.DataFrame) -> pd.DataFrame:
    """The buckets of the one unbroken run of saturated buckets that holds the instance's
    largest backlog: a run split by a quiet spell tells of two episodes, and the verdict
    speaks of the worse one."""
    ordered = saturated.sort_values("bucket_start_ms")
    starts = ordered["bucket_start_ms"].to_numpy()
    breaks = (starts[1:] != starts[:-1] + ordered["bucket_ms"].to_numpy()[:-1]).cumsum()
    runs = pd.Series([0, *breaks], index=ordered.index)
    worst = runs[ordered["ready_backlog_max"].idxmax()]
    return ordered[runs == worst]


def _threads_to_keep_up(window: pd.DataFrame) -> int:
    """The threads an instance would have needed to keep up with its work from the start of
    ``window`` (its buckets) to the end of the bucket where its backlog peaked: the thread
    time it spent there plus that backlog's, at its mean thread time per delivery there,
    over that time. Rounded up: a thread is whole."""
    peak = window.loc[window["ready_backlog"].idxmax()]
    upto = window[window["bucket_start_ms"] <= peak["bucket_start_ms"]]
    span = float(peak["bucket_start_ms"] + peak["bucket_ms"] - upto["bucket_start_ms"].min())
    busy, deliveries = float(upto["busy_thread_ms"].sum()), float(upto["deliveries"].sum())
    per_delivery = busy / deliveries if deliveries else 0.0
    return math.ceil((busy + float(peak["ready_backlog"]) * per_delivery) / span - 1e-9)


def _retry_owners(topology: Topology) -> list[int]:
    """The instances that own a retry queue (4.x: ``%RETRY%<group>`` is one more queue)."""
    if topology.balancing != BY_QUEUE or topology.retry_topic is None:
        return []
    return sorted(
        {
            owner(queue, topology.retry_queues, topology.instances, topology.allocate)
            for queue in range(topology.retry_queues)
        }
    )
