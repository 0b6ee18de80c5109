"""Prometheus and Grafana exports read into one group's observed series.

Two formats: the Prometheus HTTP API's range-query answer (JSON, a ``matrix``: each series'
labels and ``[time, "value"]`` pairs) and Grafana's table-view CSV (a header row, the time in
the first column, a column per series named ``name{label="value", ...}``; or Grafana's
series-as-rows layout, ``Series,Time,Value``). The series are known by their base names
(:mod:`retrysim.metrics.names`), so both families and the OpenTelemetry exporter's suffixes
are read alike. Exports are small (a day of 15-second samples is 5,760 points a series):
they are read on the driver with pandas.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from retrysim.metrics.names import (
    COUNTER,
    HISTOGRAM,
    RATE,
    SERIES,
    Series,
    base_name,
    series_named,
)

SCRAPE_LABELS = {"job", "instance"}  # what Prometheus adds to every series it scrapes
MIN_POINTS = 3  # fewer samples than this cannot give a rate and its change
# Grafana's header cell: name{label="value", ...}, {__name__="name", ...} or a bare name
_SELECTOR = re.compile(r"^\s*([A-Za-z_:][\w:]*)?\s*(?:\{(.*)\})?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class MetricsError(ValueError):
    """An export retrysim cannot use: one line naming the file and the series."""


@dataclass(frozen=True)
class Raw:
    """One exported series as read: its name as exported, labels, file, and its samples
    (``time_s`` seconds since the epoch, ``value``), in time order."""

    name: str
    labels: dict[str, str]
    file: str
    samples: pd.DataFrame = field(repr=False)

    def selector(self) -> str:
        labels = ", ".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        return f"{self.name}{{{labels}}}"


def read_exports(paths: list[str | Path]) -> list[Raw]:
    """Every series of every file, by its format (JSON: a range query; else CSV)."""
    raws: list[Raw] = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise MetricsError(f"{path}: no such file")
        text = path.read_text(errors="replace")
        read = _read_json if text.lstrip().startswith("{") else _read_csv
        found = read(text, str(path))
        if not found:
            raise MetricsError(f"{path}: no series in it")
        raws.extend(found)
    return raws


def _samples(times: list[float], values: list[float]) -> pd.DataFrame:
    frame = pd.DataFrame({"time_s": np.asarray(times, float), "value": np.asarray(values, float)})
    return frame.dropna().sort_values("time_s", kind="stable").reset_index(drop=True)


def _read_json(text: str, file: str) -> list[Raw]:
    try:
        body = json.loads(text)
    except json.JSONDecodeError as error:
        raise MetricsError(f"{file}: not JSON ({error.msg}, line {error.lineno})") from None
    data = body.get("data", body) if isinstance(body, dict) else None
    if body.get("status", "success") != "success" or not isinstance(data, dict):
        raise MetricsError(f"{file}: not a Prometheus query answer (status, data)")
    if data.get("resultType") != "matrix":
        raise MetricsError(
            f"{file}: resultType {data.get('resultType')!r}: export a range query "
            "(/api/v1/query_range), a matrix"
        )
    raws = []
    for result in data.get("result", []):
        labels = dict(result.get("metric", {}))
        name = labels.pop("__name__", "")
        values = result.get("values", [])
        raws.append(Raw(name, labels, file, _samples(
            [float(t) for t, _ in values], [float(v) for _, v in values])))  # fmt: skip
    return raws


def _parse_selector(cell: str, file: str) -> tuple[str, dict[str, str]]:
    match = _SELECTOR.match(cell)
    if match is None:
        raise MetricsError(f'{file}: column {cell!r} is not a series (name{{label="value"}})')
    labels = {k: v.replace('\\"', '"') for k, v in _LABEL.findall(match.group(2) or "")}
    name = labels.pop("__name__", match.group(1) or "")
    return name, labels


def _times(column: pd.Series, file: str) -> list[float]:
    numeric = pd.to_numeric(column, errors="coerce")
    if numeric.notna().all():  # epoch ms (Grafana's raw time) or seconds
        return (numeric / (1000.0 if numeric.abs().max() > 1e11 else 1.0)).tolist()
    parsed = pd.to_datetime(column, utc=True, errors="coerce", format="mixed")
    if parsed.isna().any():
        bad = column[parsed.isna()].iloc[0]
        raise MetricsError(f"{file}: time {bad!r} is not a timestamp or epoch milliseconds")
    return ((parsed - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).tolist()


def _delimiter(header: str) -> str:
    """The CSV's delimiter from its header line, counting only outside quotes (a series'
    selector holds commas)."""
    counts = {";": 0, ",": 0, "\t": 0}
    quoted = False
    for char in header:
        if char == '"':
            quoted = not quoted
        elif not quoted and char in counts:
            counts[char] += 1
    return max(counts, key=counts.get)


def _read_csv(text: str, file: str) -> list[Raw]:
    lines = text.lstrip("\ufeff").splitlines()
    if lines and lines[0].lower().startswith("sep=") and len(lines[0]) == 5:  # Grafana's Excel
        delimiter, text = lines[0][4], "\n".join(lines[1:])
    else:
        delimiter = _delimiter(lines[0] if lines else "")
    try:
        frame = pd.read_csv(io.StringIO(text), sep=delimiter, dtype=str, quoting=csv.QUOTE_MINIMAL)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise MetricsError(f"{file}: not a JSON range query nor a CSV ({error})") from None
    if frame.shape[1] < 2:
        raise MetricsError(f"{file}: not a Grafana CSV (a time column, then a column per series)")
    columns = [c.strip().strip('"') for c in frame.columns]
    # with semicolons between the cells, a comma is the decimal mark (Grafana "for Excel")
    decimal = "," if delimiter == ";" else "."
    if [c.lower() for c in columns[:3]] == ["series", "time", "value"]:  # series as rows
        return [
            _csv_series(name, rows.iloc[:, 1], rows.iloc[:, 2], file, decimal)
            for name, rows in frame.groupby(frame.columns[0], sort=False)
        ]
    return [_csv_series(columns[k], frame.iloc[:, 0], frame.iloc[:, k], file, decimal)
            for k in range(1, frame.shape[1])]  # fmt: skip


def _csv_series(cell: str, times: pd.Series, values: pd.Series, file: str, decimal: str) -> Raw:
    name, labels = _parse_selector(cell, file)
    cells = values.str.strip()
    cells = cells.str.replace(",", ".", regex=False) if decimal == "," else cells.str.replace(
        ",", "", regex=False)  # fmt: skip
    numbers = pd.to_numeric(cells, errors="coerce")
    return Raw(name, labels, file, _samples(_times(times, file), numbers.tolist()))


@dataclass
class Observed:
    """One group's observed quantities on a common clock.

    ``rates`` and ``gauges``: per quantity, a series indexed by the sample time (seconds
    since the epoch); a rate is over the interval that ends at its index. ``histogram``:
    the process-time histogram's increase per interval by bucket bound and status.
    ``sources``: per quantity, the series (and file) it was read from."""

    group: str
    topic: str | None
    family: str
    times: np.ndarray  # the one clock every series was put on
    step_s: float  # its spacing: the scrape interval (the samples' most common spacing)
    rates: dict[str, pd.Series]
    gauges: dict[str, pd.Series]
    histogram: pd.DataFrame | None
    spent_ms: pd.Series | None  # the histogram's sum: processing ms ended in each interval
    sources: dict[str, str]

    def quantity(self, name: str) -> pd.Series | None:
        return self.rates.get(name, self.gauges.get(name))


def _matches(
    raw: Raw, series: Series, group: str, topics: set[str], only_topic: str | None = None
) -> bool:
    """Whether ``raw`` is one of ``group``'s series: its group label, or for a per-topic
    series its topic (the group's, or its retry and DLQ topics). ``only_topic`` (the user's
    ``--topic``): a group's series of its other topics are left out too."""
    if any(raw.labels.get(k) != v for k, v in series.filters):
        return False
    if series.group_label is not None:
        topic = raw.labels.get(series.topic_label)
        if series.quantity == "first_deliveries" and _system(topic):
            return False  # a 4.x group's offsets on its %RETRY% topic: its retries
        if only_topic and topic is not None and not _system(topic) and topic != only_topic:
            return False
        return raw.labels.get(series.group_label) == group
    topic = raw.labels.get(series.topic_label)
    if series.quantity == "retries":
        return topic in (f"%RETRY%{group}",)
    if series.quantity == "dlq":
        return topic in (f"%DLQ%{group}",)
    return topic in topics


def _preferred(chosen: list[tuple[Raw, Series]]) -> list[tuple[Raw, Series]]:
    """Per quantity, only the series of the first name :data:`SERIES` lists for it that the
    exports hold (the 4.x exporter's offsets before its moving averages): two names of one
    quantity are not added up. ``lag``'s names are parts of it (the topic's and the retry
    topic's), all kept."""
    rank = {(s.name, s.quantity): k for k, s in enumerate(SERIES)}
    first: dict[str, int] = {}
    for _raw, s in chosen:
        first[s.quantity] = min(first.get(s.quantity, len(rank)), rank[(s.name, s.quantity)])
    return [(raw, s) for raw, s in chosen
            if s.quantity == "lag" or rank[(s.name, s.quantity)] == first[s.quantity]]  # fmt: skip


def _system(topic: str | None) -> bool:
    return topic is not None and topic.startswith(("%RETRY%", "%DLQ%"))


def _no_reset(raw: Raw) -> None:
    """A counter only rises over an export: a reset (a restarted broker or client) is an
    error naming the series and when."""
    steps = np.diff(raw.samples["value"].to_numpy())
    if (steps < 0).any():
        at = raw.samples["time_s"].iloc[int(np.argmax(steps < 0)) + 1]
        when = pd.Timestamp(at, unit="s", tz="UTC").isoformat()
        raise MetricsError(
            f"{raw.file}: {raw.selector()}: the counter resets at {when}; export "
            f"{raw.name} without a restart in the span, or cut the span there"
        )


def observe(raws: list[Raw], group: str, topic: str | None = None) -> Observed:
    """The group's quantities from ``raws``: the series naming the group, and the per-topic
    ones of its topic (``topic``, else the topic its group series name). Several series of a
    quantity (brokers, queues, nodes) are summed at each time. Raises :class:`MetricsError`
    where a file holds none of the group's series, or a series too few points or a reset."""
    known = [(raw, s) for raw in raws for s in series_named(raw.name)]
    if not known:
        files = sorted({raw.file for raw in raws})
        raise MetricsError(f"{files[0]}: no RocketMQ series in it (rocketmq_consumer_lag_"
                           "messages, rocketmq_group_diff, ...: docs/metrics.md)")  # fmt: skip
    grouped = [(raw, s) for raw, s in known if s.group_label and raw.labels.get(s.group_label)]
    topics = {topic} if topic else {
        raw.labels[s.topic_label] for raw, s in grouped
        if raw.labels.get(s.group_label) == group and s.topic_label in raw.labels
        and not _system(raw.labels[s.topic_label])
    }  # fmt: skip
    chosen = _preferred([(raw, s) for raw, s in known if _matches(raw, s, group, topics, topic)])
    if not [c for c in chosen if c[1].group_label]:
        groups = sorted({raw.labels[s.group_label] for raw, s in grouped})
        files = sorted({raw.file for raw, _ in known})
        raise MetricsError(
            f"{', '.join(files)}: no series for group {group} (groups seen: "
            f"{', '.join(groups) or 'none'})"
        )
    for raw, s in chosen:
        if s.kind in (COUNTER, HISTOGRAM):
            _no_reset(raw)  # it may appear late: its first increment is then its value
        elif len(raw.samples) < MIN_POINTS:
            raise MetricsError(f"{raw.file}: {raw.selector()}: {len(raw.samples)} points; "
                               f"at least {MIN_POINTS} are needed")  # fmt: skip
    return _assemble(chosen, group, sorted(topics)[0] if topics else None)


def _grid(raws: list[Raw]) -> tuple[np.ndarray, float]:
    """One clock for every series: the samples' most common spacing (the scrape interval or
    the query's step), from the earliest sample to the latest."""
    gaps = np.concatenate([np.diff(raw.samples["time_s"].to_numpy()) for raw in raws])
    gaps = np.round(gaps[gaps > 0], 3)
    values, counts = np.unique(gaps, return_counts=True)
    step = float(values[np.argmax(counts)]) if len(values) else 1.0
    start = min(float(raw.samples["time_s"].iloc[0]) for raw in raws)
    end = max(float(raw.samples["time_s"].iloc[-1]) for raw in raws)
    return start + step * np.arange(round((end - start) / step) + 1), step


def _on_grid(raw: Raw, grid: np.ndarray, step: float, counter: bool) -> np.ndarray:
    """``raw``'s values at the grid's times, each sample at its nearest one. A gauge keeps
    its last value over one missed sample; a counter its total over any gap, and a counter
    that appears after the grid's first time was 0 the sample before (an OpenTelemetry
    counter is created at its first increment)."""
    at = np.clip(np.round((raw.samples["time_s"].to_numpy() - grid[0]) / step).astype(int),
                 0, len(grid) - 1)  # fmt: skip
    values = pd.Series(np.nan, index=range(len(grid)))
    values.iloc[at] = raw.samples["value"].to_numpy()
    if not counter:
        return values.ffill(limit=1).to_numpy()
    first, last = int(at.min()), int(at.max())
    if first > 0:
        values.iloc[first - 1] = 0.0
        first -= 1
    values.iloc[first : last + 1] = values.iloc[first : last + 1].ffill()
    return values.to_numpy()


def _assemble(chosen: list[tuple[Raw, Series]], group: str, topic: str | None) -> Observed:
    grid, step = _grid([raw for raw, _ in chosen])
    ends = grid[1:]  # a counter's increase is over the interval ending here
    rates: dict[str, list[np.ndarray]] = {}
    gauges: dict[str, list[np.ndarray]] = {}
    sources: dict[str, list[Raw]] = {}
    buckets, sums = [], []
    for raw, s in chosen:
        if s.kind == HISTOGRAM and not raw.name.endswith(("_bucket", "_sum")):
            continue  # the _count is the +Inf bucket's
        sources.setdefault(s.quantity, []).append(raw)
        if s.kind in (COUNTER, HISTOGRAM):
            increase = np.diff(_on_grid(raw, grid, step, counter=True))
        if s.kind == HISTOGRAM:
            if raw.name.endswith("_bucket") and "le" in raw.labels:
                buckets.append(pd.DataFrame({
                    "time_s": ends, "count": increase, "le": float(raw.labels["le"]),
                    "status": raw.labels.get("invocation_status", ""),
                }).dropna())  # fmt: skip
            elif raw.name.endswith("_sum"):  # ms of processing a second: the threads busy
                sums.append(increase)
                rates.setdefault("busy_threads", []).append(increase / step / 1e3)
                sources.setdefault("busy_threads", []).append(sources[s.quantity].pop())
        elif s.kind == COUNTER:
            rates.setdefault(s.quantity, []).append(increase / step)
        else:  # a gauge, or a rate the exporter computed: its value at each time
            values = _on_grid(raw, grid, step, counter=False)
            (rates if s.kind == RATE else gauges).setdefault(s.quantity, []).append(
                values[1:] if s.kind == RATE else values
            )
    total = {q: _combine(q, parts, ends) for q, parts in rates.items()}
    total |= {q: _combine(q, parts, grid) for q, parts in gauges.items()}
    if "deliveries" not in total and "first_deliveries" in total:
        parts = [total["first_deliveries"], total.get("retries")]
        total["deliveries"] = pd.concat([p for p in parts if p is not None], axis=1).sum(
            axis=1, min_count=1
        )
        rates["deliveries"] = []
        sources["deliveries"] = sources["first_deliveries"] + sources.get("retries", [])
    for quantity, series in total.items():
        if series.notna().sum() < MIN_POINTS - 1:
            raise MetricsError(f"{_describe(sources.get(quantity, []))}: "
                               f"{int(series.notna().sum())} samples of {quantity}; at least "
                               f"{MIN_POINTS} points are needed")  # fmt: skip
    histogram = None
    if buckets:
        histogram = pd.concat(buckets).groupby(["time_s", "le", "status"], as_index=False).sum()
    family = "5.x" if any(s.family == "5.x" for _, s in chosen) else "4.x"
    spent = pd.Series(np.nansum(sums, axis=0), index=ends) if sums else None
    return Observed(
        group, topic, family, grid, step,
        {q: total[q].dropna() for q in rates}, {q: total[q].dropna() for q in gauges},
        histogram, spent, {q: _describe(v) for q, v in sources.items()},
    )  # fmt: skip


def _combine(quantity: str, parts: list[np.ndarray], times: np.ndarray) -> pd.Series:
    """A quantity's series from its parts at each time: their sum (brokers, queues, nodes),
    or for an age the oldest (the queueing latency of two brokers is the larger)."""
    stacked = np.vstack(parts)
    present = ~np.isnan(stacked).all(axis=0)
    if quantity == "queueing_latency":
        values = np.nanmax(np.where(np.isnan(stacked), -np.inf, stacked), axis=0)
    else:
        values = np.nansum(stacked, axis=0)
    return pd.Series(np.where(present, values, np.nan), index=times)


def _describe(raws: list[Raw]) -> str:
    """The series a quantity came from, in a few words: each name with the labels its
    series share, the labels they differ by, and the files."""
    parts = []
    for name in dict.fromkeys(raw.name for raw in raws):
        same = [raw for raw in raws if raw.name == name]
        keys = sorted({k for raw in same for k in raw.labels} - SCRAPE_LABELS)
        shared = {
            k: same[0].labels[k] for k in keys
            if k in same[0].labels and len({raw.labels.get(k) for raw in same}) == 1
        }  # fmt: skip
        varying = [k for k in keys if k not in shared]
        labels = ", ".join(f'{k}="{v}"' for k, v in shared.items())
        text = f"{name}{{{labels}}}" + (f" by {', '.join(varying)}" if varying else "")
        files = ", ".join(sorted({Path(raw.file).name for raw in same}))
        parts.append(f"{text} ({files})")
    return "; ".join(parts)


__all__ = ["MetricsError", "Observed", "Raw", "base_name", "observe", "read_exports"]
