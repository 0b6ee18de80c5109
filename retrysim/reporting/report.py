"""HTML reports of a run, of two runs compared and of a capacity plan, with interactive charts.

Plotly (:mod:`retrysim.reporting.plots`) is imported only when a report is drawn, so the
command line, which imports this module for its ``report`` subcommand, starts fast.

``retrysim report --output DIR --run-id ID`` (or ``--plan-id ID``, or ``--compare A B``)
writes ``DIR/reports/<id>.html``; ``retrysim simulate`` and ``retrysim plan`` write theirs
when they finish. A report reads only aggregated data (:mod:`retrysim.reporting.analysis`):
the run's ``runs`` row, ``summary``, ``load`` and ``instance_load`` rows and a per-level
count of its retries, or the plan's rows of the ``plan`` table. The page opens offline: its
charts load one file beside it, ``plotly-<version>.min.js`` (:func:`library_name`), which
every report in the folder shares, and nothing from the network.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import multiprocessing
import os
import re
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from multiprocessing.connection import Connection
from types import ModuleType

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from retrysim.model.states import REVIVE, SCHEDULE
from retrysim.planning.plan import read_plan
from retrysim.planning.targets import METRICS, show
from retrysim.reporting import analysis, verdict
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.units import format_duration
from retrysim.tables.group_sums import QUANTILES

REPORTS_DIR = "reports"
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.25em .5em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.chart{margin:.4em 0 1em}.note{color:#555;font-size:.9em}.empty{color:#555;font-style:italic}
.verdict{background:#fffbe6;border:1px solid #f0e0a0;padding:.4em 1em;margin:.8em 0}
.verdict p{margin:.3em 0}
.met{color:#2e7d32;font-weight:600}.missed{color:#c62828;font-weight:600}
tr.recommended td{background:#e8f5e9;font-weight:600}.wide{overflow-x:auto;max-width:100%}
pre{background:#f7f7f7;padding:.6em;
overflow-x:auto;font-size:.8em}
"""
# Summary columns shown per group: (column, label, kind).
_SUMMARY = (
    ("messages", "messages", "count"),
    ("deliveries", "deliveries", "count"),
    ("retries", "retries", "count"),
    ("commits", "commits", "count"),
    ("dlq", "DLQ", "count"),
    ("discards", "discards", "count"),
    ("pending", "pending at horizon", "count"),
    ("replayed", "replayed", "count"),
    ("amplification", "deliveries / message", "ratio"),
    ("write_amplification", "commitlog writes / message", "ratio"),
    ("p50_time_to_commit_ms", "p50 time to commit", "duration"),
    ("p95_time_to_commit_ms", "p95 time to commit", "duration"),
    ("p99_time_to_commit_ms", "p99 time to commit", "duration"),
    ("p50_time_to_dlq_ms", "p50 time to DLQ", "duration"),
    ("p99_time_to_dlq_ms", "p99 time to DLQ", "duration"),
    ("max_ready_backlog", "max Ready backlog", "count"),
    ("max_waiting_retry", "max WaitingRetry", "count"),
    ("max_schedule_backlog", "max schedule-topic backlog", "count"),
    ("max_inflight", "max Inflight", "count"),
    ("peak_utilization", "peak utilization", "fraction"),
    ("max_oldest_ready_age_ms", "max oldest Ready age", "duration"),
    ("peak_deliveries_per_s", "peak deliveries / s", "count"),
    ("peak_retries_per_s", "peak retries / s", "count"),
    ("peak_commitlog_writes_per_s", "peak commitlog writes / s", "count"),
    ("busiest_instance", "busiest instance", "count"),
    ("busiest_instance_utilization", "its utilization (busiest bucket)", "fraction"),
    ("idle_instances", "idle instances", "count"),
    ("engine", "engine", "text"),
)
_PLAN = (
    ("p99_time_to_commit_ms", "p99 commit", "duration"),
    ("p95_time_to_commit_ms", "p95 commit", "duration"),
    ("max_ready_backlog", "max Ready", "count"),
    ("max_oldest_ready_age_ms", "oldest Ready", "duration"),
    ("dlq", "DLQ", "count"),
    ("pending", "pending", "count"),
    ("peak_utilization", "peak util", "fraction"),
    ("write_amplification", "writes/msg", "ratio"),
)
# Section titles of a run report, per group, in order (the tests look for them); a 5.x group
# shows REVIVE_SECTION in place of the schedule topic's, and a section with nothing to show
# is a one-line note.
REVIVE_SECTION = "Invisible-time retries and the reviver's copies"
RUN_SECTIONS = (
    "State counts over time",
    "Time to commit and to the DLQ",
    "Deliveries vs retries",
    "Retries by delay level",
    "Schedule-topic backlog per level",
    "DLQ inflow and replays",
    "Write amplification",
    "Consumer utilization and oldest Ready age",
    "Utilization per consumer instance",
)
# drawn first in a group's section once retrysim compare has laid the run over metrics
OBSERVED_SECTION = "Observed against simulated"

__all__ = [
    "OBSERVED_SECTION",
    "REVIVE_SECTION",
    "RUN_SECTIONS",
    "compare_report_html",
    "draw_run_report",
    "library_name",
    "over_time_figures",
    "plan_report_html",
    "report_path",
    "run_report_html",
    "verdict_html",
    "write_compare_report",
    "write_plan_report",
    "write_run_report",
]


def _plots() -> ModuleType:
    """The figures (:mod:`retrysim.reporting.plots`), imported when a report is drawn: they
    load Plotly, which a command's start should not pay."""
    from retrysim.reporting import plots  # Plotly: only when a report is drawn

    return plots


def report_path(output: str, report_id: str) -> str:
    return os.path.join(os.path.abspath(output), REPORTS_DIR, f"{report_id}.html")


def _value(kind: str, value: object) -> str:
    if kind == "text":
        return html.escape(str(value))
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    return html.escape(show(kind, float(value)))


def _plan_value(row: pd.Series, column: str, kind: str) -> str:
    """A plan metric: the mean, and its 95 % interval across replications when there is one."""
    value, high = _value(kind, row[column]), row.get(f"{column}_ci_high")
    if high is None or pd.isna(high) or high == row[f"{column}_ci_low"]:
        return value
    return f"{value} [{_value(kind, row[f'{column}_ci_low'])}, {_value(kind, high)}]"


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], classes: Sequence[str] = ()
) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for index, row in enumerate(rows):
        css = f' class="{classes[index]}"' if index < len(classes) and classes[index] else ""
        body.append(f"<tr{css}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    return f'<div class="wide"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def _chart(fig, name: str) -> str:
    """A figure as an interactive chart: a ``div`` Plotly draws from the figure's JSON with
    the page's shared library (:func:`library_name`). Its id follows ``name`` (the group and
    title), so a report drawn twice from the same data is the same text."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
    chart = fig.to_html(
        full_html=False, include_plotlyjs=False, div_id=f"chart-{slug}", config=_CHART_CONFIG
    )
    return f'<div class="chart" data-chart="{html.escape(name)}">{chart}</div>'


# No logo (a link to Plotly's site), no cloud editing: the page stays offline.
_CHART_CONFIG = {"displaylogo": False, "responsive": True, "showLink": False}


def library_name() -> str:
    """The file name of the charting library a report loads from its own folder:
    ``plotly-<plotly.js version>.min.js``, written once per folder by :func:`_write` and
    shared by every report there (a plan's hundred runs write one copy, not a hundred)."""
    return _plots().library_name()


def _write_library(folder: str) -> None:
    """Put the charting library in ``folder`` unless it is there (atomically: two reports
    written at once leave one whole copy)."""
    path = os.path.join(folder, library_name())
    if os.path.isfile(path):
        return
    temp = f"{path}.{os.getpid()}.tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(_plots().library_text())
    os.replace(temp, path)


def _page(title: str, body: list[str]) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f'<script src="{library_name()}" charset="utf-8"></script></head><body>'
        f"<h1>{html.escape(title)}</h1>"
        + "\n".join(body)
        + f'<p class="note">written by retrysim at {stamp}</p></body></html>\n'
    )


def _write(path: str, text: str) -> str:
    """Write a report and, beside it, the library its charts load."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    _write_library(folder)
    temp = f"{path}.tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temp, path)
    return path


# --------------------------------------------------------------------------- verdict


def verdict_html(data: analysis.RunData) -> str:
    """The verdict, at the top of a run report: per group, the sentences the console prints
    after the run's figures (:mod:`retrysim.reporting.verdict`), from the same rows."""
    found = verdict.verdicts(data.scenario, data.summary, data.load, data.instances)
    if not found:
        return ""
    items = "".join(
        f"<p><b>{html.escape(v.group)}</b>: "
        + "; ".join(f"<span>{html.escape(line)}</span>" for line in v.lines)
        + "</p>"
        for v in found
    )
    return f'<section id="verdict" class="verdict"><b>Verdict</b>{items}</section>'


# --------------------------------------------------------------------------- run report


def run_report_html(data: analysis.RunData) -> str:
    """The HTML of one run's report: the verdict (:func:`verdict_html`), a line per group,
    then the charts of every group, the summary table and the scenario."""
    run = data.run
    groups = list(data.summary["group"])
    start_at = data.scenario.start_at
    clock = "" if start_at is None else f" from {start_at:%Y-%m-%d %H:%M:%S} UTC (time 0)"
    body = [
        f"<p>run <b>{html.escape(data.run_id)}</b> of scenario "
        f"<b>{html.escape(str(run.get('scenario')))}</b>, seed {run.get('seed')}, "
        f"horizon {format_duration(data.scenario.horizon)}{clock}, "
        f"load bucket {format_duration(data.scenario.load_bucket)}; "
        f"Spark {html.escape(str(run.get('spark_master')))}, retrysim "
        f"{html.escape(str(run.get('engine_version')))}, {run.get('rounds')} rounds.</p>",
        verdict_html(data),
        _headlines(data, groups),
    ]
    for group in groups:
        body += _group_section(data, group)
    config = json.dumps(data.config, indent=2)
    body += [
        '<h2 id="summary">Summary per group</h2>',
        _summary_table(data, groups),
        f"<h2>Scenario</h2><details><summary>as run (JSON)</summary>"
        f"<pre>{html.escape(config)}</pre></details>",
    ]
    return _page(f"retrysim run {data.run_id}", body)


def _headlines(data: analysis.RunData, groups: list[str]) -> str:
    """One line per group, linking to its section: what the summary table says first."""
    indexed = data.summary.set_index("group")
    items = []
    for group in groups:
        row = indexed.loc[group]
        items.append(
            f'<li><a href="#group-{html.escape(group)}">{html.escape(group)}</a> '
            f"({html.escape(data.flavor(group))}): {_value('count', row['messages'])} messages, "
            f"{_value('count', row['deliveries'])} deliveries "
            f"({_value('count', row['retries'])} retries), "
            f"{_value('count', row['dlq'])} DLQ, p99 time to commit "
            f"{_value('duration', row['p99_time_to_commit_ms'])}, commitlog writes / message "
            f"{_value('ratio', row['write_amplification'])}</li>"
        )
    return (
        f'<ul class="headlines">{"".join(items)}</ul><p class="note">The whole '
        'summary table is <a href="#summary">below the charts</a>. Every chart: hover for '
        "values, drag to zoom (double click resets), the slider under a time axis to pick "
        "a range, a legend entry to hide its line.</p>"
    )


def _summary_table(data: analysis.RunData, groups: list[str]) -> str:
    rows = []
    indexed = data.summary.set_index("group")
    for column, label, kind in _SUMMARY:
        rows.append([html.escape(label), *(_value(kind, indexed.at[g, column]) for g in groups)])
    flavors = ["flavor", *(html.escape(data.flavor(g)) for g in groups)]
    return _table(["", *groups], [flavors, *rows])


def _observed_figure(
    data: analysis.RunData, group: str, outages: list[tuple[float, float]]
) -> dict[str, tuple]:
    """The run laid over the metrics it was compared with (retrysim compare): a panel per
    quantity, observed solid and simulated dashed, and each quantity's error."""
    frames = analysis.observed_frames(data, group)
    if not frames:
        return {}
    from retrysim.metrics.names import QUANTITIES

    compared = data.comparison[data.comparison["group"] == group]
    columns = [(q, f"{q}: {QUANTITIES[q][0]} ({QUANTITIES[q][1]})")
               for q in compared["quantity"] if q in frames["observed"]]  # fmt: skip
    errors = "; ".join(
        f"{row.quantity} NMAE {row.nmae:.1%}, peak {row.peak_error:+.1%} {row.peak_shift_s:+.0f} s"
        for row in compared.itertuples()
        if pd.notna(row.nmae) and pd.notna(row.peak_error)
    )
    figure = _plots().overlay_figure(frames, columns, OBSERVED_SECTION, outages)
    caption = ("The run (dashed) over the production series it was compared with (solid), "
               f"on the run's clock. {errors}.")  # fmt: skip
    return {OBSERVED_SECTION: (figure, caption)}


def _group_section(data: analysis.RunData, group: str) -> list[str]:
    """A group's charts, in RUN_SECTIONS order; a chart with nothing to show (no
    schedule topic, no dead letter) is a one-line note instead, and a 5.x group shows its
    invisible-time retries where a 4.x group shows its schedule topic."""
    plots = _plots()

    whole = analysis.active_span(data.load[data.load["group"] == group])
    outages = data.outages(group)
    zoom = analysis.busy_window(whole, outages)
    load = whole if zoom is None else zoom
    row = data.summary.set_index("group").loc[group]
    retries = data.retries[data.retries["group"] == group]
    delays = data.delay_levels_ms
    path = data.retry_path(group)
    # the schedule topic's long levels, the DLQ and the writes so far are tails: whole
    backlog = analysis.schedule_backlog(whole)
    over_time = over_time_figures(data, group, load)
    figures: dict[str, tuple | str] = _observed_figure(data, group, outages)
    figures |= {
        "State counts over time": over_time["State counts over time"],
        "Time to commit and to the DLQ": (
            plots.settle_cdf_figure(QUANTILES, *_settled(data, group)),
            "The share of the messages committed (or moved to the DLQ) within a time of being "
            "published: their distribution, from the summary's quantiles (every 5 %, then "
            "99 %, 99.9 % and the last); 50, 95 and 99 % dotted.",
        ),
        "Deliveries vs retries": over_time["Deliveries vs retries"],
        "Retries by delay level": (
            plots.retries_by_level_figure(retries, delays, analysis.RETRY_NUMBER_CAP),
            "Failed deliveries sent to retry, by the delay level they wait on (4.x schedule "
            "topic; each level in its own colour), else by retry number.",
        )
        if retries["retries"].sum() > 0
        else "No delivery failed into a retry.",
    }
    if path == REVIVE:
        figures[REVIVE_SECTION] = (
            plots.revive_figure(
                analysis.delivery_rates(whole), analysis.state_counts(whole), outages=outages
            ),
            "A 5.x group has no schedule topic: a failed message stays invisible until its "
            "retry is due, then the broker's reviver writes a copy into %RETRY%<group>_<topic> "
            "(one commitlog write) and it is delivered again. Retries per second, and the "
            "messages waiting for their revival.",
        )
    elif len(backlog.columns) > 2:  # a level column beside group and minute_end
        figures["Schedule-topic backlog per level"] = (
            plots.schedule_backlog_figure(backlog, delays, outages=outages),
            "Messages waiting in SCHEDULE_TOPIC_XXXX per delay level, stacked, each level "
            "in its own colour.",
        )
    else:
        figures["Schedule-topic backlog per level"] = "No message waited in SCHEDULE_TOPIC_XXXX" + (
            "." if path == SCHEDULE else f" (a {data.flavor(group)} group retries elsewhere)."
        )
    figures["DLQ inflow and replays"] = (
        (
            plots.dlq_figure(analysis.dlq_flow(whole), outages=outages),
            "Moves into %DLQ% per bucket, with the running totals of DLQ inflow and replays.",
        )
        if int(whole["dlq"].sum()) or int(whole["replays"].sum())
        else "No message reached the DLQ."
    )
    figures["Write amplification"] = (
        plots.commitlog_figure(
            analysis.commitlog_writes(whole), int(row["messages"]), outages=outages
        ),
        "Broker commitlog writes per second, and writes so far per message; which writes "
        "they are, below.",
    )
    figures["Consumer utilization and oldest Ready age"] = over_time[
        "Consumer utilization and oldest Ready age"
    ]
    figures["Utilization per consumer instance"] = (
        plots.instances_figure(analysis.instance_utilization(data.instances, group, load)),
        "Each instance's busy thread time over its threads per bucket: a hot instance (the "
        "one holding a 4.x retry queue) shows as one bright row. Instances that rebalance "
        "gave no queue never get work and are not drawn: "
        f"{_idle_text(data, group)}.",
    )

    def span(frame: pd.DataFrame) -> str:
        end = float(frame["minute_end"].max()) * analysis.MINUTE_MS if len(frame) else 0.0
        return format_duration(int(end))

    horizon = format_duration(data.scenario.horizon)
    if zoom is None:
        where = f"the first {span(whole)} of the {horizon} horizon, where the activity is"
    else:
        where = (
            f"the first {span(load)} of the {horizon} horizon, "
            f"{analysis.BUSY_SHARE:.0%} of the deliveries"
            + (" and the outages" if outages else "")
            + "; the schedule-topic backlog (or a 5.x group's revived retries), the DLQ and the "
            "commitlog writes show the first "
            f"{span(whole)}, where their tails end (and so does the whole run at the end of "
            "this section)"
        )
    section = [
        f'<h2 id="group-{html.escape(group)}">Group {html.escape(group)} '
        f"({html.escape(data.flavor(group))})</h2>",
        f'<p class="note">The time axes show {where}; the <code>load</code> and '
        "<code>instance_load</code> tables hold every bucket.</p>",
    ]
    for title, shown in figures.items():
        if isinstance(shown, str):
            section.append(
                f'<h3>{html.escape(title)}</h3><p class="empty">{html.escape(shown)}</p>'
            )
            continue
        section.append(_figure(group, title, *shown))
        if title == "Write amplification":
            section.append(_writes_table(data, group, whole, retries, path))
    if zoom is not None:
        section.append(
            f"<details><summary>The whole run: the first {span(whole)} (to the last activity)"
            "</summary>"
        )
        for title, (fig, note) in over_time_figures(data, group, whole).items():
            section.append(_figure(group, f"{title}, the whole run", fig, note))
        section.append("</details>")
    return section


def _writes_table(
    data: analysis.RunData,
    group: str,
    whole: pd.DataFrame,
    retries: pd.DataFrame,
    path: str,
) -> str:
    """Which commitlog writes make the write amplification: each kind's writes, per message
    and per delivery (:func:`analysis.write_breakdown`)."""
    row = data.summary.set_index("group").loc[group]
    messages, deliveries = max(int(row["messages"]), 1), max(int(row["deliveries"]), 1)
    parts = analysis.write_breakdown(whole, retries, int(row["messages"]), path)
    total = sum(count for _, count in parts)
    rows = [
        [html.escape(name), f"{count:,}", f"{count / messages:.3f}", f"{count / deliveries:.3f}"]
        for name, count in parts
    ]
    rows.append(
        ["<b>all commitlog writes</b>", f"<b>{total:,}</b>",
         f"<b>x{total / messages:.3f}</b>", f"<b>{total / deliveries:.3f}</b>"]
    )  # fmt: skip
    return (
        '<p class="note">The writes by kind (docs/model.md §9): publishes, replays and DLQ '
        "moves are counted, schedule-topic copies are the retries on a delay level, and the "
        "last line is the rest of the writes.</p>"
        + _table(["write", "writes", "per message", "per delivery"], rows)
    )


def _figure(group: str, title: str, fig, note: str) -> str:
    """A chart of a group's section: its heading, its note and the chart."""
    return f'<h3>{html.escape(title)}</h3><p class="note">{html.escape(note)}</p>' + _chart(
        fig, f"{group}: {title}"
    )


def over_time_figures(
    data: analysis.RunData, group: str, load: pd.DataFrame | None = None
) -> dict[str, tuple]:
    """The figures a planner reads over time, as the report draws them (outages shaded, the
    pool's lines, each instance against its own pool), each with its note: title -> (figure,
    note). ``load``: the group's load rows to draw (default: its :func:`analysis.active_span`;
    the report draws its zoom, then the whole run). Notebooks call this too."""
    if load is None:
        load = analysis.active_span(data.load[data.load["group"] == group])
    plots = _plots()

    outages = data.outages(group)
    return {
        "State counts over time": (
            plots.state_counts_figure(
                analysis.state_counts(load),
                outages=outages,
                pool=data.pool(group),
                downstream=data.downstream_capacity(group),
                instances=analysis.instance_busy_threads(data.instances, group, load),
                threads=data.threads(group),
            ),
            "Ready backlog, WaitingRetry and Inflight at the end of each load bucket, each on "
            "its own axis (Inflight against the pool's threads, dotted, and the calls a "
            "downstream that answers to load serves at full speed; outages shaded), and each "
            "instance's busy threads against its own pool: an instance that takes every "
            "retry runs at its line while the others idle.",
        ),
        "Deliveries vs retries": (
            plots.deliveries_figure(analysis.delivery_rates(load), outages=outages),
            "First deliveries and retries per second: the share of consumer work spent on retries.",
        ),
        "Consumer utilization and oldest Ready age": (
            plots.utilization_figure(analysis.utilization(load), outages=outages),
            "Busy thread time over pool time per bucket (the pool's capacity dotted), and the "
            "age of the oldest Ready message.",
        ),
    }


def _settled(data: analysis.RunData, group: str) -> tuple:
    """The group's time to commit and to the DLQ at QUANTILES (None: no such message)."""
    row = data.summary.set_index("group").loc[group]
    return tuple(
        None if not isinstance(row.get(column), (list, tuple, np.ndarray)) else row[column]
        for column in ("time_to_commit_quantiles_ms", "time_to_dlq_quantiles_ms")
    )


def _idle_text(data: analysis.RunData, group: str) -> str:
    idle = data.summary.set_index("group").at[group, "idle_instances"]
    return "none idled" if not idle else f"{int(idle)} instance(s) ran no delivery"


# --------------------------------------------------------------------------- two runs compared

# The series two runs are compared on: (figure title, frame maker, [(column, label)]).
_COMPARED = (
    ("Messages by state", analysis.state_counts,
     (("Ready", "Ready backlog"), ("WaitingRetry", "WaitingRetry"), ("Inflight", "Inflight"))),
    ("Deliveries and retries per second", analysis.delivery_rates,
     (("deliveries_per_s", "deliveries/s"), ("retries_per_s", "retries/s"))),
    ("Utilization and oldest Ready age", analysis.utilization,
     (("utilization", "utilization (busy / pool)"),
      ("oldest_ready_age_s", "oldest Ready age (s)"))),
    ("Commitlog writes", analysis.commitlog_writes,
     (("writes_per_s", "writes/s"), ("writes_total", "writes so far"))),
)  # fmt: skip


def compare_report_html(first: analysis.RunData, second: analysis.RunData) -> str:
    """Two runs in one report: their summaries side by side, then per group they share
    each series of both runs overlaid on the same axes (the first run solid)."""
    plots = _plots()

    runs = (first, second)
    names = [run.run_id for run in runs]
    shared = [g for g in first.summary["group"] if g in set(second.summary["group"])]
    body = [
        f"<p>run <b>{html.escape(names[0])}</b> (solid) against <b>{html.escape(names[1])}"
        f"</b> (dashed); their own reports: "
        + ", ".join(f'<a href="{html.escape(n)}.html">{html.escape(n)}</a>' for n in names)
        + f"; groups in both: {html.escape(', '.join(shared) or 'none')}.</p>"
    ]
    for group in shared:
        body.append(f'<h2 id="group-{html.escape(group)}">Group {html.escape(group)}</h2>')
        rows = [
            [html.escape(label), *(_value(kind, run.summary.set_index("group").at[group, column])
                                   for run in runs)]
            for column, label, kind in _SUMMARY
        ]  # fmt: skip
        body.append(_table(["", *names], rows))
        spans = [analysis.active_span(run.load[run.load["group"] == group]) for run in runs]
        for title, frame_of, columns in _COMPARED:
            frames = {name: frame_of(span) for name, span in zip(names, spans, strict=True)}
            fig = plots.overlay_figure(frames, columns, title, outages=first.outages(group))
            body.append(f"<h3>{html.escape(title)}</h3>" + _chart(fig, f"{group}: {title}"))
    return _page(f"retrysim runs {names[0]} and {names[1]} compared", body)


def write_compare_report(
    spark: SparkSession, output: str, first: str, second: str, path: str | None = None
) -> str:
    """Write ``<output>/reports/compare-<first>-<second>.html`` (or ``path``), the two runs'
    series overlaid, and return its path."""
    data = []
    for run_id in (first, second):
        found = analysis.run_data(spark, output, run_id)
        if found is None:
            raise ScenarioError("--compare", f"no run {run_id!r} in {os.path.abspath(output)}")
        data.append(found)
    target = path or report_path(output, f"compare-{first}-{second}")
    return _write(target, compare_report_html(*data))


def write_run_report(
    spark: SparkSession,
    output: str,
    run_id: str,
    path: str | None = None,
    retries: pd.DataFrame | None = None,
) -> str:
    """Write ``<output>/reports/<run_id>.html`` (or ``path``) and return its path.
    ``retries``: the run's retries by level when the caller has them (a run just simulated),
    else counted from its attempts."""
    data = analysis.run_data(spark, output, run_id, retries)
    if data is None:
        raise ScenarioError("--run-id", f"no run {run_id!r} in {os.path.abspath(output)}")
    return _write(path or report_path(output, run_id), run_report_html(data))


def draw_run_report(
    output: str, run_id: str, staged: Mapping[str, str], retries: pd.DataFrame
) -> Callable[[], str]:
    """Start drawing a run's report from its staged tables (``staged``: each table's folder,
    as :func:`retrysim.runner.simulate` hands them over) and return the function that writes
    it once the run is complete (and returns its path). The drawing (Plotly, CPU-bound
    Python) runs in a forked process while the run is checked, beside the check's tasks: a
    thread competed for the driver's interpreter with the check's own Python and saved
    less. The tables are read here, before publishing moves their files."""
    data = analysis.staged_run_data(run_id, staged, retries)
    path = report_path(output, run_id)
    if "fork" not in multiprocessing.get_all_start_methods():
        return lambda: _write(path, run_report_html(data))
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    drawing = context.Process(
        target=_draw_into, args=(data, send), name="retrysim-report", daemon=True
    )
    drawing.start()
    send.close()

    def write() -> str:
        try:
            kind, text = receive.recv()
        except EOFError:
            kind, text = "error", f"its process ended with exit code {drawing.exitcode}"
        drawing.join()
        if kind == "error":
            raise RuntimeError(f"the report of run {run_id} was not drawn: {text}")
        return _write(path, text)

    return write


def _draw_into(data: analysis.RunData, send: Connection) -> None:
    """The forked process's work: the report's HTML, or the error, through ``send``."""
    try:
        send.send(("html", run_report_html(data)))
    except BaseException:  # the parent raises it
        send.send(("error", traceback.format_exc()))


# --------------------------------------------------------------------------- plan report


def plan_report_html(plan: pd.DataFrame, plan_id: str, output: str = "") -> str:
    """The HTML of a plan's report: recommendations, trade-off curves and the points."""
    plots = _plots()

    body = [
        f"<p>plan <b>{html.escape(plan_id)}</b>: {plan['point'].nunique()} points, "
        f"{plan['group'].nunique()} group(s).</p>",
        _targets_verdict(plan),
    ]
    for group in dict.fromkeys(plan["group"]):
        rows = plan[plan["group"] == group]
        targets = rows["targets"].iloc[0] if len(rows) else {}
        body.append(f'<h2 id="group-{html.escape(group)}">Group {html.escape(group)}</h2>')
        body.append(f"<p>targets: {html.escape(_targets_text(targets))}</p>")
        body.append("<h3>Recommendation</h3>" + _recommendation_html(rows))
        body.append("<h3>Trade-off curves</h3>")
        body.append(
            '<p class="note">Each point is labelled with its name and links to its run\'s '
            "report; hover for its values.</p>"
            + _chart(plots.tradeoff_figure(plan, group, targets), f"{group}: trade-offs")
        )
        body.append("<h3>Points</h3>" + _points_table(rows))
    if output:
        example = analysis.point_report_id(plan.iloc[0])
        body.append(
            f'<p class="note">A point\'s own report: <code>retrysim report --output '
            f"{html.escape(output)} --run-id {html.escape(example)}</code></p>"
        )
    return _page(f"retrysim capacity plan {plan_id}", body)


def _targets_verdict(plan: pd.DataFrame) -> str:
    """At the top of a plan's report: per group and case, each target met or missed by the
    recommended pool, or, when no pool meets them all, by the largest pool swept."""
    names = {column: name for name, (column, _) in METRICS.items()}
    kinds = {column: kind for column, kind in METRICS.values()}
    items = []
    for group in dict.fromkeys(plan["group"]):
        rows = plan[plan["group"] == group]
        targets = rows["targets"].iloc[0] if len(rows) else {}
        if not targets:
            items.append(f"<li>{html.escape(group)}: no targets were given.</li>")
            continue
        for case, part in rows.groupby(rows.apply(_case, axis=1), sort=False):
            chosen = part[part["recommended"].fillna(False).astype(bool)]
            sized = part[part["pool"].notna()].sort_values("pool")
            if len(chosen):
                row, who = chosen.iloc[0], "recommended"
            elif len(sized):
                row, who = sized.iloc[-1], "no pool meets every target; the largest"
            else:
                continue
            missed = set(str(row["failed_targets"] or "").split(","))
            judged = [
                f"{html.escape(names[column])} &lt;= {html.escape(show(kinds[column], limit))}: "
                + (
                    f'<span class="missed">missed</span> ({_value(kinds[column], row[column])})'
                    if names[column] in missed
                    else f'<span class="met">met</span> ({_value(kinds[column], row[column])})'
                )
                for column, limit in targets.items()
            ]
            items.append(
                f"<li>{html.escape(group)} {html.escape(case)}{who}: "
                f"{_pool_text(row)} (point p{int(row['point'])}): {'; '.join(judged)}</li>"
            )
    return (
        f'<section id="verdict" class="verdict"><h2>Targets</h2><ul>{"".join(items)}</ul></section>'
    )


def _pool_text(row: pd.Series) -> str:
    if pd.isna(row["pool"]):
        return "an unlimited pool"
    return f"{int(row['pool']):,} threads ({int(row['instances'])} x {int(row['threads'])})"


def _targets_text(targets: dict[str, float]) -> str:
    kinds = {column: kind for column, kind in METRICS.values()}
    names = {column: name for name, (column, _) in METRICS.items()}
    return "; ".join(f"{names[c]} <= {show(kinds[c], v)}" for c, v in targets.items()) or "none"


def _recommendation_html(rows: pd.DataFrame) -> str:
    chosen = rows[rows["recommended"].fillna(False).astype(bool)]
    if not rows["targets"].iloc[0]:
        return "<p>No targets were given, so there is no recommendation.</p>"
    items = []
    for _, row in chosen.iterrows():
        case = _case(row)
        binding = row["binding_target"]
        why = (
            "no target is binding: the smallest pool swept already meets them all"
            if binding == "none"
            else f"binding target: <b>{html.escape(binding)}</b> (missed by the next smaller pool)"
        )
        items.append(
            f"<li>{html.escape(case)}<b>{int(row['pool']):,} consumer threads</b> "
            f"({int(row['instances'])} instances x {int(row['threads'])} threads, point "
            f"p{int(row['point'])}, run {html.escape(row['point_run_id'])}){_share(row)}; "
            f"{why}</li>"
        )
    cases = rows.apply(_case, axis=1)
    missing = sorted(set(cases) - set(chosen.apply(_case, axis=1)) if len(chosen) else set(cases))
    for case in missing:
        items.append(
            f"<li>{html.escape(case)}<b>no point meets the targets</b>; sweep larger "
            "pools or relax a target.</li>"
        )
    return f"<ul>{''.join(items)}</ul>"


def _share(row: pd.Series) -> str:
    if row["replications"] <= 1:
        return ""
    return (
        f", meeting every target in {row['meets_targets_share']:.0%} of its "
        f"{int(row['replications'])} replications (confidence {row['confidence']:.0%})"
    )


def _case(row: pd.Series) -> str:
    label = analysis.case_label(row["settings"], row["group"])
    return f"[{label}] " if label else ""


def _points_table(rows: pd.DataFrame) -> str:
    runs = int(rows["replications"].max()) if len(rows) else 1
    shares = ["meet all"] if runs > 1 else []
    headers = ["point", "settings", "pool", *(label for _, label, _ in _PLAN), *shares]
    headers.append("missed targets")
    body, classes = [], []
    for _, row in rows.iterrows():
        pool = (
            "unlimited"
            if pd.isna(row["pool"])
            else f"{int(row['instances'])}x{int(row['threads'])}={int(row['pool'])}"
        )
        settings = ", ".join(f"{k}={v}" for k, v in row["settings"].items())
        missed = row["failed_targets"] if isinstance(row["failed_targets"], str) else "-"
        run = html.escape(analysis.point_report_id(row))
        body.append(
            [
                f'<a href="{run}.html" title="run {run}">p{int(row["point"])}</a>',
                html.escape(settings),
                pool,
                *(_plan_value(row, col, kind) for col, _, kind in _PLAN),
                *([_value("fraction", row["meets_targets_share"])] if shares else []),
                html.escape(missed),
            ]
        )
        classes.append("recommended" if row["recommended"] else "")
    return _table(headers, body, classes)


def write_plan_report(
    spark: SparkSession, output: str, plan_id: str, path: str | None = None
) -> str:
    """Write ``<output>/reports/<plan_id>.html`` (or ``path``) and return its path."""

    plan = analysis.plan_frame(read_plan(spark, output, plan_id))
    if plan.empty:
        raise ScenarioError("--plan-id", f"no plan {plan_id!r} in {os.path.abspath(output)}")
    return _write(path or report_path(output, plan_id), plan_report_html(plan, plan_id, output))
