"""Self-contained HTML reports of a run and of a capacity plan (PNG plots inlined as base64).

matplotlib (:mod:`retrysim.reporting.plots`) is imported only when a report is drawn, so the command
line, which imports this module for its ``report`` subcommand, starts fast.

``retrysim report --output DIR --run-id ID`` (or ``--plan-id ID``) writes
``DIR/reports/<id>.html``; ``retrysim simulate`` and ``retrysim plan`` write theirs when they
finish. A report reads only aggregated data (:mod:`retrysim.reporting.analysis`): the run's ``runs``
row, ``summary`` and ``load`` rows and a per-level count of its retries, or the plan's rows
of the ``plan`` table. The file needs nothing else to open: no scripts, no external images.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import multiprocessing
import os
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from multiprocessing.connection import Connection
from types import ModuleType

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

from retrysim.planning.plan import read_plan
from retrysim.planning.targets import METRICS, show
from retrysim.reporting import analysis
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
img{max-width:100%;display:block;margin:.4em 0 1em}.note{color:#555;font-size:.9em}
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
# Section titles of a run report, per group (the tests look for them).
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

__all__ = [
    "RUN_SECTIONS",
    "draw_run_report",
    "plan_report_html",
    "report_path",
    "run_report_html",
    "write_plan_report",
    "write_run_report",
]


def _plots() -> ModuleType:
    """The figures (:mod:`retrysim.reporting.plots`), imported when a report is drawn: they
    load matplotlib, which a command's start should not pay."""
    from retrysim.reporting import plots  # matplotlib: only when a report is drawn

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


def _image(fig, alt: str) -> str:
    plots = _plots()

    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{plots.png_base64(fig)}">'


def _page(title: str, body: list[str]) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        + "\n".join(body)
        + f'<p class="note">written by retrysim at {stamp}</p></body></html>\n'
    )


def _write(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temp, path)
    return path


# --------------------------------------------------------------------------- run report


def run_report_html(data: analysis.RunData) -> str:
    """The HTML of one run's report: a summary table, then the plots of every group."""
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
        '<h2 id="summary">Summary per group</h2>',
        _summary_table(data, groups),
    ]
    for group in groups:
        body += _group_section(data, group)
    config = json.dumps(data.config, indent=2)
    body.append(
        f"<h2>Scenario</h2><details><summary>as run (JSON)</summary>"
        f"<pre>{html.escape(config)}</pre></details>"
    )
    return _page(f"retrysim run {data.run_id}", body)


def _summary_table(data: analysis.RunData, groups: list[str]) -> str:
    rows = []
    indexed = data.summary.set_index("group")
    for column, label, kind in _SUMMARY:
        rows.append([html.escape(label), *(_value(kind, indexed.at[g, column]) for g in groups)])
    flavors = ["flavor", *(html.escape(data.flavor(g)) for g in groups)]
    return _table(["", *groups], [flavors, *rows])


def _group_section(data: analysis.RunData, group: str) -> list[str]:
    plots = _plots()

    whole = analysis.active_span(data.load[data.load["group"] == group])
    outages = data.outages(group)
    zoom = analysis.busy_window(whole, outages)
    load = whole if zoom is None else zoom
    messages = int(data.summary.set_index("group").at[group, "messages"])
    retries = data.retries[data.retries["group"] == group]
    delays = data.delay_levels_ms
    # the schedule topic's long levels, the DLQ and the writes so far are tails: whole
    backlog = analysis.schedule_backlog(whole)
    over_time = _over_time(data, group, load)
    figures = [
        over_time["State counts over time"],
        (
            plots.settle_cdf_figure(QUANTILES, *_settled(data, group)),
            "The share of the messages committed (or moved to the DLQ) within a time of being "
            "published: their distribution, from the summary's quantiles (every 5 %, then "
            "99 %, 99.9 % and the last); 50, 95 and 99 % dotted.",
        ),
        over_time["Deliveries vs retries"],
        (
            plots.retries_by_level_figure(retries, delays, analysis.RETRY_NUMBER_CAP),
            "Failed deliveries sent to retry, by the delay level they wait on (4.x schedule "
            "topic), else by retry number.",
        ),
        (
            plots.schedule_backlog_figure(backlog, delays, outages=outages),
            "Messages waiting in SCHEDULE_TOPIC_XXXX per delay level (4.x consumers only; "
            "other flavors wait elsewhere).",
        ),
        (
            plots.dlq_figure(analysis.dlq_flow(whole), outages=outages),
            "Moves into %DLQ% per bucket, with the running totals of DLQ inflow and replays.",
        ),
        (
            plots.commitlog_figure(analysis.commitlog_writes(whole), messages, outages=outages),
            "Broker commitlog writes (publish, schedule copy, retry copy, DLQ, replay) per "
            "second, and writes so far per message.",
        ),
        over_time["Consumer utilization and oldest Ready age"],
        (
            plots.instances_figure(analysis.instance_utilization(data.instances, group, load)),
            "Each instance's busy thread time over its threads per bucket: a hot instance (the "
            "one holding a 4.x retry queue) shows as one dark row. Instances that rebalance "
            "gave no queue never get work and are not drawn: "
            f"{_idle_text(data, group)}.",
        ),
    ]

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
            + "; the schedule-topic backlog, the DLQ and the commitlog writes show the first "
            f"{span(whole)}, where their tails end (and so does the whole run at the end of "
            "this section)"
        )
    section = [
        f'<h2 id="group-{html.escape(group)}">Group {html.escape(group)} '
        f"({html.escape(data.flavor(group))})</h2>",
        f'<p class="note">The time axes show {where}; the <code>load</code> and '
        "<code>instance_load</code> tables hold every bucket.</p>",
    ]
    for title, (fig, note) in zip(RUN_SECTIONS, figures, strict=True):
        section.append(_figure(group, title, fig, note))
    if zoom is not None:
        section.append(
            f"<details><summary>The whole run: the first {span(whole)} (to the last activity)"
            "</summary>"
        )
        for title, (fig, note) in _over_time(data, group, whole).items():
            section.append(_figure(group, f"{title}, the whole run", fig, note))
        section.append("</details>")
    return section


def _figure(group: str, title: str, fig, note: str) -> str:
    """A figure of a group's section: its heading, its note and its image."""
    return f'<h3>{html.escape(title)}</h3><p class="note">{html.escape(note)}</p>' + _image(
        fig, f"{group}: {title}"
    )


def _over_time(data: analysis.RunData, group: str, load: pd.DataFrame) -> dict[str, tuple]:
    """The figures a planner reads over time, of ``load`` (drawn twice when zoomed)."""
    plots = _plots()

    outages = data.outages(group)
    return {
        "State counts over time": (
            plots.state_counts_figure(
                analysis.state_counts(load),
                outages=outages,
                pool=data.pool(group),
                downstream=data.downstream_capacity(group),
            ),
            "Ready backlog, WaitingRetry and Inflight at the end of each load bucket, each on "
            "its own axis (Inflight against the pool's threads, dotted, and the calls a "
            "downstream that answers to load serves at full speed; outages shaded).",
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
    it once the run is complete (and returns its path). The drawing (matplotlib, CPU-bound
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
        f"{plan['group'].nunique()} group(s).</p>"
    ]
    for group in dict.fromkeys(plan["group"]):
        rows = plan[plan["group"] == group]
        targets = rows["targets"].iloc[0] if len(rows) else {}
        body.append(f'<h2 id="group-{html.escape(group)}">Group {html.escape(group)}</h2>')
        body.append(f"<p>targets: {html.escape(_targets_text(targets))}</p>")
        body.append("<h3>Recommendation</h3>" + _recommendation_html(rows))
        body.append("<h3>Trade-off curves</h3>")
        body.append(_image(plots.tradeoff_figure(plan, group, targets), f"{group}: trade-offs"))
        body.append("<h3>Points</h3>" + _points_table(rows))
    if output:
        example = plan["point_run_id"].iloc[0]
        if plan["replications"].iloc[0] > 1:
            example += "-r1"
        body.append(
            f'<p class="note">A point\'s own report: <code>retrysim report --output '
            f"{html.escape(output)} --run-id {html.escape(example)}</code></p>"
        )
    return _page(f"retrysim capacity plan {plan_id}", body)


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
        body.append(
            [
                f"p{int(row['point'])}",
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
