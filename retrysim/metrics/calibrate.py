"""A scenario fitted to one group's production metrics.

What the series tell is fitted (:func:`calibrate`): the clock (``start_at``, the horizon and
the load bucket from the samples), the arrival profile, the failure probability over time
with its outage windows, the processing time and, where the series show it, the consumer
pool. What they cannot tell (the flavor, its retry policy, the delay table, the pool when no
series shows it) comes from a base scenario. Every fitted value carries a comment naming the
series it came from and how well the fit matches them.
"""

from __future__ import annotations

import math
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from retrysim.engine.rounds import group_plans, key_specs
from retrysim.metrics.fitting import (
    BINOMIAL,
    POISSON,
    ProcessingFit,
    fit_processing_time,
    levels,
)
from retrysim.metrics.reading import MetricsError, Observed
from retrysim.scenario.loading import build_scenario
from retrysim.scenario.units import format_duration

MAX_PROFILE_PIECES = 60  # more levels than this go to a traffic file beside the scenario
SATURATED_SAMPLES = 3  # a pool plateau holds for at least this many samples
SATURATED_SHARE = 0.95  # ... each within this share of the busiest one
OUTAGE_MIN_RISE = 0.02  # an outage's failure probability is at least this above the baseline
OUTAGE_SLOWDOWN = 0.25  # an outage has its own processing time where its mean differs more
MIN_DELIVERIES = 50  # fewer deliveries than this in a histogram fit nothing
LOGNORMAL_P99_CAP = 14.97  # the scenario's lognormal: p99 at most this times the mean


@dataclass
class Fitted:
    """What calibrate found: scenario keys (as YAML values) and a comment for each."""

    values: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    traffic: pd.DataFrame | None = None  # the arrivals' counts, where a file holds them

    def set(self, key: str, value: Any, note: str) -> None:
        self.values[key] = value
        self.notes[key] = note


def _nmae(fitted: np.ndarray, observed: np.ndarray) -> float:
    scale = np.abs(observed).mean()
    return float(np.abs(fitted - observed).mean() / scale) if scale > 0 else 0.0


def _seconds(ms: float) -> str:
    """A duration as the scenario writes it: whole units where exact, else seconds to the ms."""
    ms = round(ms)
    return format_duration(ms) if ms % 1000 == 0 else f"{ms / 1000:g}s"


def _moment(seconds: float) -> str:
    """A time as ``start_at`` takes it: UTC, to the millisecond where it has a fraction."""
    moment = pd.Timestamp(round(seconds * 1000), unit="ms", tz="UTC")
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{moment.microsecond // 1000:03d}Z" if moment.microsecond else "Z")


def _rate(value: float) -> float:
    return float(f"{value:.4g}")


def _intervals(series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A rate series' interval ends and lengths (the first sample opens the first one)."""
    ends = series.index.to_numpy(float)
    starts = np.concatenate([[ends[0] - np.median(np.diff(ends))], ends[:-1]])
    return ends, ends - starts


def fit_arrivals(observed: Observed, t0: float, fitted: Fitted, traffic: Path) -> None:
    """The arrival profile: levels of the published rate (Poisson), as profile pieces, or a
    traffic file beside the scenario when there are more than :data:`MAX_PROFILE_PIECES`."""
    series, source = observed.rates.get("published"), observed.sources.get("published")
    if series is None:
        series = observed.rates.get("first_deliveries")
        source = f"{observed.sources.get('first_deliveries')}, first deliveries standing in for "
        source += "the published (no rocketmq_messages_in or rocketmq_producer_tps series)"
    if series is None:
        raise MetricsError(
            "no series gives the group's arrivals: export rocketmq_messages_in_total "
            "(5.x) or rocketmq_producer_tps (4.x) for its topic"
        )
    ends, lengths = _intervals(series)
    counts = series.to_numpy() * lengths
    pieces = levels(np.round(counts), lengths, POISSON)
    fitted_rate = np.concatenate([np.full(p.last - p.first + 1, p.level) for p in pieces])
    quality = f"{len(pieces)} levels, NMAE {_nmae(fitted_rate, series.to_numpy()):.1%} per sample"
    until = [(ends[p.last] - t0) * 1000 for p in pieces]
    if len(pieces) <= MAX_PROFILE_PIECES:
        profile = [{"until": _seconds(u), "per_second": _rate(p.level)}
                   for u, p in zip(until, pieces, strict=True)]  # fmt: skip
        workload = {"arrival": "profile", "within": "poisson", "profile": profile}
    else:
        opens = [_seconds((e - n - t0) * 1000) for e, n in zip(ends, lengths, strict=True)]
        rows = pd.DataFrame({"time": opens, "count": counts})
        fitted.traffic = rows
        workload = {"arrival": "file", "within": "poisson", "file": traffic.name}
        quality = f"{len(counts)} samples as they are (more than {MAX_PROFILE_PIECES} levels)"
    fitted.set("workload", workload, f"from {source}: {quality}")


def _failures(observed: Observed, first_retry_ms: int) -> tuple[pd.Series, pd.Series, str]:
    """Per interval, the failed deliveries and the deliveries: from the client histogram's
    status where it is exported; else each failed delivery is a retry put one first retry
    interval later (most retries are first retries where failures are rare) or a dead letter
    put at once, against the deliveries."""
    hist = observed.histogram
    if hist is not None and (hist["status"] != "").any():
        top = hist[np.isinf(hist["le"])]
        if top.empty:
            raise MetricsError(f"{observed.sources['process_time']}: no le=\"+Inf\" bucket: "
                               "export every bucket of the histogram")  # fmt: skip
        trials = top.groupby("time_s")["count"].sum()
        failed = top[top["status"] != "success"].groupby("time_s")["count"].sum()
        failed = failed.reindex(trials.index, fill_value=0.0)
        return failed, trials, observed.sources["process_time"]
    deliveries, retries = observed.rates.get("deliveries"), observed.rates.get("retries")
    if deliveries is None or retries is None:
        raise MetricsError(
            "no series gives the failures: export rocketmq_process_time (with its "
            "invocation_status), or the deliveries and the retries"
        )
    _, lengths = _intervals(deliveries)
    shift = round(first_retry_ms / 1000 / np.median(lengths))
    later = retries.reindex(deliveries.index).shift(-shift).fillna(0.0)
    dead = observed.rates.get("dlq")
    dead = 0.0 if dead is None else dead.reindex(deliveries.index).fillna(0.0)
    failed = (later + dead) * lengths
    trials = deliveries * lengths
    sources = [observed.sources["retries"] + f" {shift} samples later"]
    sources += [observed.sources["dlq"]] if "dlq" in observed.sources else []
    note = f"{' and '.join(sources)}, over {observed.sources['deliveries']}"
    return failed, trials.clip(lower=failed), note


def _windows(pieces: list, p0: float, rise: float) -> list[list]:
    """Runs of neighbouring levels above ``p0 + rise``: each an outage, its boundary
    intervals (levels between the baseline and the outage's) among them."""
    runs: list[list] = []
    for piece in pieces:
        if piece.level <= p0 + rise:
            continue
        if runs and runs[-1][-1].last + 1 == piece.first:
            runs[-1].append(piece)
        else:
            runs.append([piece])
    return runs


def fit_failures(observed: Observed, t0: float, first_retry_ms: int, fitted: Fitted) -> list:
    """The baseline failure probability and the outage windows: levels of failures among
    deliveries (binomial). The baseline is the level held longest (with those near it), an
    outage a run of levels above it by more than :data:`OUTAGE_MIN_RISE`, at its longest
    level's probability; each edge is placed inside its boundary interval by how far that
    interval's failure rate lies between the baseline's and the outage's. Returns the
    outages as (start_s, end_s) since ``t0``."""
    failed, trials, source = _failures(observed, first_retry_ms)
    ends, lengths = _intervals(trials)
    f, n = np.round(failed.to_numpy()), np.round(trials.to_numpy())
    pieces = levels(f, n, BINOMIAL)
    base = max(pieces, key=lambda p: p.last - p.first)
    calm = [p for p in pieces if p.level <= base.level + OUTAGE_MIN_RISE]
    p0 = sum(p.events for p in calm) / max(sum(p.exposure for p in calm), 1.0)
    rate = f / np.maximum(n, 1.0)
    outages, windows, predicted = [], [], np.full(len(rate), p0)
    for run in _windows(pieces, p0, OUTAGE_MIN_RISE):
        core = max(run, key=lambda p: p.exposure)
        inside = np.clip((rate - p0) / (core.level - p0), 0.0, 1.0)
        before = range(max(run[0].first - 1, 0), core.first)
        after = range(core.last + 1, min(run[-1].last + 2, len(rate)))
        start = ends[core.first] - lengths[core.first] - sum(inside[i] * lengths[i] for i in before)
        end = ends[core.last] + sum(inside[i] * lengths[i] for i in after)
        predicted[core.first : core.last + 1] = core.level
        for i in (*before, *after):
            predicted[i] = p0 + inside[i] * (core.level - p0)
        windows.append((start - t0, end - t0))
        outages.append({"start": _seconds((start - t0) * 1000), "end": _seconds((end - t0) * 1000),
                        "fail_probability": _rate(core.level)})  # fmt: skip
    quality = f"NMAE {_nmae(predicted * n, f):.1%} of the failures per sample"
    fitted.set("fail_probability", _rate(p0), f"from {source}: outside the outages; {quality}")
    fitted.set("outages", outages, f"runs of levels above {p0:.3g} by {OUTAGE_MIN_RISE} or more, "
               "their edges inside the boundary samples" if outages else
               "no level above the baseline")  # fmt: skip
    return windows


def _processing_value(fit: ProcessingFit) -> Any:
    """The fit as the scenario writes it, in whole milliseconds: a lognormal needs
    ``0 < mean < p99``; where rounding leaves no room between them, a constant."""
    mean = max(1, round(fit.mean_ms))
    p99 = min(round(fit.p99_ms), int(mean * LOGNORMAL_P99_CAP))
    if fit.dist == "constant" or p99 <= mean:
        return f"{mean}ms"
    return {"dist": "lognormal", "mean": f"{mean}ms", "p99": f"{p99}ms"}


def _fit_buckets(rows: pd.DataFrame, spent_ms: pd.Series | None) -> ProcessingFit | None:
    """The processing time of the deliveries ``rows`` (histogram rows) hold, its mean from
    the histogram's sum over those intervals where it was exported."""
    cumulative = rows.groupby("le")["count"].sum().sort_index()
    if cumulative.empty or cumulative.iloc[-1] < MIN_DELIVERIES:
        return None
    mean = None
    if spent_ms is not None:
        mean = float(spent_ms.reindex(rows["time_s"].unique()).sum()) / cumulative.iloc[-1]
    return fit_processing_time(cumulative.index.tolist(), cumulative.tolist(), mean or None)


def fit_processing(
    observed: Observed, t0: float, windows: list, outages: list[dict], fitted: Fitted
) -> None:
    """The processing time from the client's histogram buckets: outside the outages (the
    samples whose interval meets none), and in each outage whose samples inside it differ
    (their mean by more than :data:`OUTAGE_SLOWDOWN`), a lognormal by mean and p99 (or a
    constant where one bucket holds every delivery). ``outages`` (the fitted windows'
    entries) gain the processing time where it differs."""
    hist = observed.histogram
    if hist is None:
        return
    ends = hist["time_s"].to_numpy() - t0
    opens = ends - observed.step_s
    meets = np.zeros(len(hist), bool)
    for start, end in windows:
        meets |= (ends > start) & (opens < end)
    fit = _fit_buckets(hist[~meets], observed.spent_ms) or _fit_buckets(hist, observed.spent_ms)
    if fit is None:
        return
    bounds = ", ".join(f"{b:g}" for b in fit.bounds_ms if math.isfinite(b))
    slower = []
    for (start, end), outage in zip(windows, outages, strict=True):
        within = hist[(opens >= start - 1e-9) & (ends <= end + 1e-9)]
        inside = _fit_buckets(within, observed.spent_ms)
        if inside is not None and abs(inside.mean_ms / fit.mean_ms - 1) > OUTAGE_SLOWDOWN:
            outage["processing_time"] = _processing_value(inside)
            share, count = inside.worst_bucket_error, sum(inside.observed)
            slower.append(f"{outage['start']}-{outage['end']}: every bucket within {share:.1%} "
                          f"of its {count:,.0f}")  # fmt: skip
    fitted.set("processing_time", _processing_value(fit),
               f"from {observed.sources['process_time']} outside the outages, buckets "
               f"{bounds} ms: every bucket within {fit.worst_bucket_error:.1%} of the "
               f"{sum(fit.observed):,.0f} deliveries")  # fmt: skip
    if slower:
        fitted.notes["outages"] += "; their own processing time, from the samples inside " + (
            "; ".join(slower))  # fmt: skip


def fit_pool(observed: Observed, instances: int, fitted: Fitted) -> int | None:
    """The pool where the series show it: the threads busy at once (the client histogram's
    processing time summed per second), or the in-flight gauge, holding a plateau for
    :data:`SATURATED_SAMPLES` samples while more than a sample's deliveries wait (the lag).
    None where they do not (the pool then comes from ``--consumers`` or the base scenario)."""
    lag, deliveries = observed.gauges.get("lag"), observed.rates.get("deliveries")
    if lag is None or deliveries is None:
        return None
    for name in ("busy_threads", "inflight"):
        series = observed.quantity(name)
        if series is None or series.max() <= 0:
            continue
        top = series.max()
        _, lengths = _intervals(deliveries)
        backlog = pd.Series(deliveries.to_numpy() * lengths, deliveries.index)
        waiting = lag.reindex(series.index, method="nearest") > np.maximum(
            backlog.reindex(series.index, method="nearest"), top
        )
        held = (series >= SATURATED_SHARE * top) & waiting
        if held.sum() >= SATURATED_SAMPLES:
            pool = round(series[held].median())
            threads = max(1, math.ceil(pool / instances))
            fitted.set("consumers", {"instances": instances, "threads": threads},
                       f"from {observed.sources.get(name, name)}: a plateau at {pool} over "
                       f"{int(held.sum())} samples while more than a sample's deliveries "
                       "waited")  # fmt: skip
            return pool
    return None


def calibrate(
    observed: Observed,
    base: dict[str, Any],
    group_name: str,
    output: Path,
    consumers: dict[str, int] | None = None,
) -> tuple[str, pd.DataFrame | None]:
    """The scenario YAML (text, with its comments) fitted to ``observed`` on ``base``'s
    group ``group_name`` (or its first group, renamed), every key it does not fit kept, and
    the traffic file's rows where the arrivals need one (:func:`traffic_path`); both are
    validated, neither is written here."""
    group = _base_group(base, group_name)
    if observed.topic:
        group["topic"] = observed.topic
    t0 = float(observed.times[0])
    step = observed.step_s
    fitted = Fitted()
    fitted.set("start_at", _moment(t0), "the first sample's time")
    fitted.set("horizon", _seconds((observed.times[-1] - t0) * 1000), "the samples' span")
    fitted.set("load_bucket", _seconds(step * 1000), "the scrape interval, so the load "
               "table's buckets fall on the samples")  # fmt: skip
    traffic = traffic_path(output)
    fit_arrivals(observed, t0, fitted, traffic)
    spec_base = build_scenario({**base, "groups": [_runnable(group)]})
    first_retry = spec_policy_first_retry(spec_base)
    windows = fit_failures(observed, t0, first_retry, fitted)
    fit_processing(observed, t0, windows, fitted.values["outages"], fitted)
    instances = int((group.get("consumers") or {}).get("instances", 1)) if isinstance(
        group.get("consumers"), dict) else 1  # fmt: skip
    if consumers is not None:
        fitted.set("consumers", consumers, "given with --consumers")
    elif fit_pool(observed, instances, fitted) is None and "consumers" not in group:
        raise MetricsError(
            "no series shows the consumer pool (no in-flight or busy-thread plateau while "
            "work waited): give --consumers INSTANCESxTHREADS, or a --scenario that sets "
            f"groups[{group_name}].consumers"
        )
    text = render(base, group, fitted)
    with tempfile.TemporaryDirectory() as folder:  # the traffic file, to validate with it
        check = text
        if fitted.traffic is not None:
            beside = Path(folder) / traffic.name
            fitted.traffic.to_csv(beside, index=False)
            check = text.replace(f"file: {traffic.name}", f"file: {beside}")
        build_scenario(yaml.safe_load(check))  # fails here, not when it is run
    return text, fitted.traffic


def spec_policy_first_retry(scenario) -> int:
    """The first retry interval of the scenario's only group, in ms (what a failure waits
    before its retry is delivered)."""
    spec = key_specs(scenario, group_plans(scenario))[0]
    return int(spec.policy.intervals_ms[0]) if spec.policy.intervals_ms else 0


def _base_group(base: dict[str, Any], name: str) -> dict[str, Any]:
    groups = base.get("groups") or []
    if not isinstance(groups, list) or not groups or not isinstance(groups[0], dict):
        raise MetricsError("the base scenario (--scenario) has no group to take the flavor from")
    for group in groups:
        if isinstance(group, dict) and group.get("name") == name:
            return dict(group)
    return dict(groups[0]) | {"name": name}


def _runnable(group: dict[str, Any]) -> dict[str, Any]:
    """The base group, made small, to learn its policy before the fit is done."""
    workload = {k: v for k, v in (group.get("workload") or {}).items()
                if k in ("queues", "size_bytes")} | {"messages": 1}  # fmt: skip
    return {**group, "workload": workload}


def traffic_path(output: Path) -> Path:
    """Where a calibrated scenario's traffic file goes: beside it, named after it."""
    return output.with_suffix(".traffic.csv")


def _comment(text: str, indent: str) -> list[str]:
    """A comment, wrapped to lines of about 100 characters."""
    return textwrap.wrap(text, 100 - len(indent) - 2, initial_indent=f"{indent}# ",
                         subsequent_indent=f"{indent}#   ", break_on_hyphens=False)  # fmt: skip


def _flow(value: Any) -> str:
    """``value`` as one line of YAML (a scalar without the document end a dump adds)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    return text.removesuffix("\n...\n").strip()


BEHAVIOR_FITS = ("fail_probability", "outages", "processing_time")
TOP_FITS = ("start_at", "horizon", "load_bucket")


def render(base: dict[str, Any], group: dict[str, Any], fitted: Fitted) -> str:
    """The scenario as YAML, each fitted key with its comment, the base's keys after."""
    lines = [f"# {group['name']} fitted by retrysim calibrate; what the metrics cannot tell",
             "# (flavor, retry policy, delay table) is the base scenario's."]  # fmt: skip
    values, notes = fitted.values, fitted.notes
    for key in ("name", "seed"):
        if key in base:
            lines.append(f"{key}: {_flow(base[key])}")
    for key in TOP_FITS:
        lines += [*_comment(notes[key], ""), f"{key}: {_flow(values[key])}"]
    for key, value in base.items():
        if key not in ("name", "seed", "groups", *TOP_FITS):
            lines.append(f"{key}: {_flow(value)}")
    lines += ["groups:", f"  - name: {_flow(group['name'])}"]
    behavior = dict(group.get("behavior") or {})
    for key, value in group.items():
        if key in ("name", "workload", "behavior", "consumers"):
            continue
        lines.append(f"    {key}: {_flow(value)}")
    consumers = values.get("consumers", group.get("consumers"))
    if consumers is not None:
        note = notes.get("consumers", "from the base scenario: no series shows the pool")
        lines += [*_comment(note, "    "), f"    consumers: {_flow(consumers)}"]
    lines += [*_comment(notes["workload"], "    "),
              f"    workload: {_flow(_workload(group, values))}", "    behavior:"]  # fmt: skip
    for key in BEHAVIOR_FITS:
        if key not in values:
            continue  # the base's, below (no histogram: the processing time)
        behavior.pop(key, None)
        lines += [*_comment(notes[key], "      "), f"      {key}: {_flow(values[key])}"]
    for key, value in behavior.items():
        if key == "processing_time":
            lines.append(
                "      # from the base scenario: the metrics hold no process-time histogram"
            )
        if key not in ("profile", "poison_fraction", "fail_first", "downstream"):
            lines.append(f"      {key}: {_flow(value)}")
    return "\n".join(lines) + "\n"


def _workload(group: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in (group.get("workload") or {}).items()
            if k in ("queues", "size_bytes")}  # fmt: skip
    return values["workload"] | kept
