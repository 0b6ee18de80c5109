"""Interactive Plotly figures of a run and of a plan, from the pandas views of
``reporting.analysis``.

Every function returns a ``plotly.graph_objects.Figure``: hover shows each value, a drag
zooms, a double click resets, and every time series has a range slider under its time axis.
The report embeds them (:mod:`retrysim.reporting.report`) against one shared copy of the
charting library; a notebook shows them as Plotly's JSON output (:func:`use_in_notebooks`),
which carries the data and no library. Figures use no template (Plotly's default one adds
kilobytes of styling to every chart): the few styles below are set on each.

>>> fig = state_counts_figure(analysis.state_counts(load, "order-service"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs, get_plotlyjs_version
from plotly.subplots import make_subplots

from retrysim.planning.targets import METRICS
from retrysim.reporting.analysis import case_label, point_report_id

WIDTH, HEIGHT = 1000, 300  # px: one panel; a report's page is about 1100 px wide
HOURS_AFTER_MINUTES = 180
COLORS = {"Ready": "#d62728", "Inflight": "#1f77b4", "WaitingRetry": "#ff7f0e"}
POOL_COLOR = "#9467bd"  # the pool's threads, apart from the Inflight line they bound
OUTAGE_COLOR = "rgba(214, 39, 40, 0.08)"  # outages shaded behind every time plot
HOT_COLOR = "#c51b8a"  # the busiest instance; the others in INSTANCE_COLORS
INSTANCE_COLORS = ("#1f77b4", "#2ca02c", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#e377c2")
SHOWN_INSTANCES = 8  # beyond this many, the busiest are drawn and the rest as their mean
# One colour per delay level, no two alike (the 18 of the default table, then the same
# colours again for a longer custom table): the retries' bars and the schedule topic's areas.
LEVEL_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#e7ba52", "#843c39", "#31a354", "#fd8d3c", "#9e9ac8",
    "#636363", "#00cc96",
)  # fmt: skip
# Plan trade-off panels: (plan column, title, scale to the shown unit, unit).
TRADEOFFS = (
    ("p99_time_to_commit_ms", "p99 time to commit", 1 / 1000, "s"),
    ("max_ready_backlog", "max Ready backlog", 1, "messages"),
    ("dlq", "DLQ", 1, "messages"),
    ("peak_utilization", "peak consumer utilization", 100, "%"),
    ("max_oldest_ready_age_ms", "max oldest Ready age", 1 / 1000, "s"),
    ("pending", "pending at horizon", 1, "messages"),
)
DECADES_FOR_LOG = 2  # a plan panel whose positive values span this many decades is log-scaled

__all__ = [
    "commitlog_figure",
    "deliveries_figure",
    "dlq_figure",
    "instances_figure",
    "library_name",
    "library_text",
    "overlay_figure",
    "retries_by_level_figure",
    "revive_figure",
    "schedule_backlog_figure",
    "settle_cdf_figure",
    "state_counts_figure",
    "tradeoff_figure",
    "use_in_notebooks",
    "utilization_figure",
]


def use_in_notebooks() -> None:
    """Show figures in a notebook as Plotly's JSON output only: JupyterLab draws it with its
    Plotly extension, and a kept notebook stays small (the default renderer embeds the whole
    library, megabytes, in the first figure's output)."""
    pio.renderers.default = "plotly_mimetype"


def library_name() -> str:
    """The file a report loads the charting library from: ``plotly-<version>.min.js``."""
    return f"plotly-{get_plotlyjs_version()}.min.js"


def library_text() -> str:
    """The charting library (plotly.js, minified) as it ships with the Python package."""
    return get_plotlyjs()


def _time(minutes: pd.Series) -> tuple[pd.Series, str]:
    """Minutes, or hours for long runs, and the axis label."""
    if len(minutes) and float(minutes.max()) > HOURS_AFTER_MINUTES:
        return minutes / 60, "time since start (h)"
    return minutes, "time since start (min)"


def _hours(label: str) -> bool:
    return label.endswith("(h)")


def _style(fig: go.Figure, title: str, height: int) -> go.Figure:
    """The styles every figure shares (no template: see the module's docstring)."""
    fig.update_layout(
        template="none",
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        height=height,
        margin={"l": 70, "r": 20, "t": 50, "b": 40},
        plot_bgcolor="white",
        paper_bgcolor="white",
        font={"family": "system-ui, sans-serif", "size": 12, "color": "#222"},
        legend={"x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top", "font": {"size": 11}},
        hovermode="x unified",
    )
    fig.update_xaxes(gridcolor="#eee", zeroline=False, showline=True, linecolor="#999")
    fig.update_yaxes(gridcolor="#eee", zeroline=False, showline=True, linecolor="#999")
    return fig


def _time_axis(
    fig: go.Figure,
    label: str,
    outages: Sequence[tuple[float, float]] = (),
    row: int | None = None,
) -> None:
    """What every time plot shares: outage windows shaded (start and end in minutes, on the
    axis' unit), counts from zero, and a range slider under the (bottom) time axis."""
    scale = 60 if _hours(label) else 1
    for number, (start, end) in enumerate(outages):
        fig.add_vrect(
            x0=start / scale,
            x1=end / scale,
            fillcolor=OUTAGE_COLOR,
            line_width=0,
            layer="below",
            row="all",
            col="all",
            annotation_text="outage" if number == 0 else None,
            annotation_position="top left",
            annotation_font_color="#d62728",
        )
    fig.update_yaxes(rangemode="tozero")
    where = {} if row is None else {"row": row, "col": 1}
    fig.update_xaxes(title_text=label, rangeslider={"visible": True, "thickness": 0.06}, **where)


def _two_axes(
    fig: go.Figure,
    titles: tuple[str, str],
    label: str,
    outages: Sequence[tuple[float, float]],
    title: str,
) -> go.Figure:
    """A figure of a bucket's rate (left axis) and a running figure (right axis), finished:
    both axes titled, the time axis with its outages, the figure's style."""
    fig.update_yaxes(title_text=titles[0], secondary_y=False)
    fig.update_yaxes(title_text=titles[1], secondary_y=True, showgrid=False)
    _time_axis(fig, label, outages)
    return _style(fig, title, HEIGHT)


def settle_cdf_figure(
    shares: Sequence[float],
    commit: Sequence[float] | None,
    dlq: Sequence[float] | None,
    title: str = "",
) -> go.Figure:
    """The distribution of the time from publishing to commit and to the DLQ: the share of
    those messages settled within a time, on a log axis (a retry ladder's steps show as
    steps; times under a millisecond are drawn at 1 ms). ``commit`` and ``dlq`` are the
    times at ``shares`` (the summary's quantile arrays); None or empty: nobody got there."""
    fig = go.Figure()
    drawn: list[float] = []
    for label, values, color in (
        ("to commit", commit, "#2ca02c"),
        ("to the DLQ", dlq, "#7f7f7f"),
    ):
        if values is None or not len(values):
            continue
        seconds = [max(float(value), 1.0) / 1000 for value in values]
        fig.add_trace(
            go.Scatter(
                x=seconds,
                y=[share * 100 for share in shares],
                name=label,
                mode="lines+markers",
                line={"color": color},
                marker={"size": 4},
                hovertemplate="%{y:.1f} % within %{x:.3s}s<extra>" + label + "</extra>",
            )
        )
        drawn += seconds
    for level in (50, 95, 99):
        fig.add_hline(y=level, line={"color": "#999", "width": 0.6, "dash": "dot"})
    if drawn:
        ticks = [(s, n) for s, n in _TIME_TICKS if min(drawn) / 10 <= s <= max(drawn) * 10]
        fig.update_xaxes(type="log", tickvals=[s for s, _ in ticks], ticktext=[n for _, n in ticks])
    fig.update_xaxes(title_text="time since publishing (log scale)")
    fig.update_yaxes(title_text="% of those messages", range=[0, 100])
    _style(fig, title or "time to commit and to the DLQ", HEIGHT)
    fig.update_layout(hovermode="closest")
    return fig


_TIME_TICKS = tuple(
    zip(
        (0.001, 0.01, 0.1, 1, 10, 60, 600, 3600, 36_000, 360_000),
        ("1ms", "10ms", "100ms", "1s", "10s", "1m", "10m", "1h", "10h", "100h"),
        strict=True,
    )
)


def state_counts_figure(
    states: pd.DataFrame,
    title: str = "",
    outages: Sequence[tuple[float, float]] = (),
    pool: int | None = None,
    downstream: int | None = None,
    instances: pd.DataFrame | None = None,
    threads: int | None = None,
) -> go.Figure:
    """Ready backlog, WaitingRetry and Inflight, each on its own axis (one can be thousands
    of times another): lines at bucket ends, and faint steps at each bucket's highest, so a
    burst between two bucket ends still shows; Inflight against the pool's threads and the
    calls its downstream serves at full speed (beyond them, every call slows down). With
    ``instances`` (:func:`analysis.instance_busy_threads`) a fourth axis draws each
    instance's busy threads against its own pool (``threads``), so an instance that takes
    every retry shows at its line while the group's mean is far below."""
    panels = ["Ready", "WaitingRetry", "Inflight"]
    if instances is not None and not instances.empty:
        panels.insert(1, "instances")  # second: in view with the backlog it explains
    row_of = {panel: row for row, panel in enumerate(panels, start=1)}
    titles = {"Ready": "Ready backlog", "instances": "busy threads per instance"}
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[titles.get(panel, panel) for panel in panels],
    )
    x, label = _time(states["minute_end"])
    starts = states["minute"] / (60 if _hours(label) else 1)
    for state in ("Ready", "WaitingRetry", "Inflight"):
        color, where = COLORS[state], {"row": row_of[state], "col": 1}
        fig.add_trace(
            go.Scatter(
                x=x,
                y=states[state],
                name=state,
                line={"color": color, "width": 1.6},
                hovertemplate="%{y:,}",
            ),
            **where,
        )
        fig.add_trace(
            go.Scatter(
                x=starts,
                y=states[f"{state} max"],
                name=f"{state}, highest in bucket",
                line={"color": color, "width": 0.8, "dash": "dash", "shape": "hv"},
                opacity=0.4,
                legendgroup="highest",
                showlegend=False,
                hovertemplate="%{y:,}",
            ),
            **where,
        )
        top = float(max(states[state].max(), states[f"{state} max"].max(), 0) or 0)
        if top < 5:  # a quiet series: whole ticks 0, 1, ... (not 0, 0.5, 1 shown as 0, 1, 1)
            fig.update_yaxes(range=[0, max(top, 1) * 1.1], dtick=1, **where)
        fig.update_yaxes(tickformat=",d", **where)  # messages: whole numbers
    inflight = row_of["Inflight"]
    if pool is not None:
        _limit(fig, pool, f"pool: {pool:,} threads", POOL_COLOR, inflight)
    if downstream is not None:
        _limit(fig, downstream, f"downstream: {downstream:,} calls at full speed", "#d62728",
               inflight)  # fmt: skip
    if "instances" in row_of:
        _instance_lines(fig, instances, label, threads, row_of["instances"])
    _time_axis(fig, label, outages, row=len(panels))
    return _style(fig, title or "messages by state", 90 + 190 * len(panels))


def _limit(fig: go.Figure, value: float, name: str, color: str, row: int) -> None:
    """A dotted horizontal line at ``value`` on ``row``, in the legend (hover shows it)."""
    fig.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            name=name,
            mode="lines",
            line={"color": color, "dash": "dot", "width": 1.4},
            hoverinfo="skip",
        ),
        row=row,
        col=1,
    )
    fig.add_hline(y=value, line={"color": color, "dash": "dot", "width": 1.4}, row=row, col=1)


def _instance_lines(
    fig: go.Figure, busy: pd.DataFrame, label: str, threads: int | None, row: int
) -> None:
    """Each instance's busy threads per bucket (the busiest red, the others thin; beyond
    SHOWN_INSTANCES the rest as their mean) and the line of each instance's pool."""
    scale = 60 if _hours(label) else 1
    x = pd.Series(busy.index, dtype=float) / scale
    order = busy.sum().sort_values(ascending=False).index
    shown = list(order[: SHOWN_INSTANCES - 1]) if len(order) > SHOWN_INSTANCES else list(order)
    for rank, instance in enumerate(shown):
        color = HOT_COLOR if rank == 0 else INSTANCE_COLORS[(rank - 1) % len(INSTANCE_COLORS)]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=busy[instance],
                name=f"instance {instance}" + (" (busiest)" if rank == 0 else ""),
                line={"color": color, "width": 2 if rank == 0 else 1, "shape": "hv"},
                hovertemplate="%{y:.2f}",
            ),
            row=row,
            col=1,
        )
    rest = [instance for instance in order if instance not in shown]
    if rest:
        fig.add_trace(
            go.Scatter(
                x=x,
                y=busy[rest].mean(axis=1),
                name=f"mean of the other {len(rest)} instances",
                line={"color": "#999", "width": 1, "shape": "hv"},
                hovertemplate="%{y:.2f}",
            ),
            row=row,
            col=1,
        )
    if threads is not None:
        _limit(fig, threads, f"each instance's pool: {threads:,} threads", POOL_COLOR, row)


def deliveries_figure(
    rates: pd.DataFrame, title: str = "", outages: Sequence[tuple[float, float]] = ()
) -> go.Figure:
    """First deliveries and retries per second, stacked: the retry share of consumer load."""
    fig = go.Figure()
    x, label = _time(rates["minute"])
    for column, name, color in (
        ("first_per_s", "first deliveries/s", "#1f77b4"),
        ("retries_per_s", "retries/s", "#ff7f0e"),
    ):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=rates[column],
                name=name,
                stackgroup="deliveries",
                line={"color": color, "shape": "hv", "width": 0.5},
                hovertemplate="%{y:,.2f}",
            )
        )
    fig.update_yaxes(title_text="deliveries per second")
    _time_axis(fig, label, outages)
    return _style(fig, title or "deliveries vs retries", HEIGHT)


def _level_label(level: int, delays_ms: Sequence[int]) -> str:
    if 1 <= level <= len(delays_ms):
        return f"L{level} {_short_ms(delays_ms[level - 1])}"
    return f"L{level}"


def _short_ms(ms: float) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms >= size and ms % size == 0:
            return f"{int(ms // size)}{unit}"
    return f"{ms:g}ms"


def level_color(level: int) -> str:
    """The colour of a delay level (1-based), the same on every figure."""
    return LEVEL_COLORS[(level - 1) % len(LEVEL_COLORS)]


def retries_by_level_figure(
    retries: pd.DataFrame, delays_ms: Sequence[int] = (), cap: int = 0, title: str = ""
) -> go.Figure:
    """Retries scheduled per delay level (schedule-topic flavors) or per retry number."""
    fig = go.Figure()
    by_level = retries.dropna(subset=["delay_level"])
    if len(by_level):
        counts = by_level.groupby("delay_level")["retries"].sum().sort_index()
        labels = [_level_label(int(level), delays_ms) for level in counts.index]
        colors = [level_color(int(level)) for level in counts.index]
        axis = "delay level (wait in SCHEDULE_TOPIC_XXXX)"
    else:
        counts = retries.groupby("retry")["retries"].sum().sort_index()
        labels = [f"{int(n)}+" if cap and n >= cap else str(int(n)) for n in counts.index]
        colors = ["#ff7f0e"] * len(counts)
        axis = "retry number"
    fig.add_trace(
        go.Bar(
            x=labels,
            y=counts.to_numpy(),
            marker_color=colors,
            name="retries",
            hovertemplate="%{x}: %{y:,} retries<extra></extra>",
        )
    )
    if not len(counts):
        fig.add_annotation(text="no retries", showarrow=False, x=0.5, y=0.5, xref="paper",
                           yref="paper")  # fmt: skip
    fig.update_xaxes(title_text=axis, type="category")
    fig.update_yaxes(title_text="retries", rangemode="tozero")
    _style(fig, title or "retries by delay level", HEIGHT)
    fig.update_layout(hovermode="closest", showlegend=False)
    return fig


def schedule_backlog_figure(
    backlog: pd.DataFrame,
    delays_ms: Sequence[int] = (),
    title: str = "",
    outages: Sequence[tuple[float, float]] = (),
) -> go.Figure:
    """Messages waiting in SCHEDULE_TOPIC_XXXX per level over time, stacked, each level in
    its own colour."""
    fig = go.Figure()
    x, label = _time(backlog["minute_end"])
    for column in (c for c in backlog if c.startswith("L")):
        level = int(column[1:])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=backlog[column],
                name=_level_label(level, delays_ms),
                stackgroup="levels",
                line={"color": level_color(level), "width": 0.5},
                fillcolor=level_color(level),
                hovertemplate="%{y:,}",
            )
        )
    fig.update_yaxes(title_text="messages")
    _time_axis(fig, label, outages)
    return _style(fig, title or "schedule-topic backlog per level", HEIGHT)


def revive_figure(
    rates: pd.DataFrame,
    states: pd.DataFrame,
    title: str = "",
    outages: Sequence[tuple[float, float]] = (),
) -> go.Figure:
    """A 5.x group's retries, which need no schedule topic: each retry delivery is a copy
    the broker's reviver wrote into ``%RETRY%<group>_<topic>`` when the message's invisible
    time ended (per second, bars), and the messages waiting for that (WaitingRetry; a
    ``rocketmq5.simple`` message stays Inflight, invisible, until then)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x, label = _time(rates["minute"])
    fig.add_trace(
        go.Scatter(
            x=x,
            y=rates["retries_per_s"],
            name="revived into %RETRY% and delivered, per s",
            line={"color": "#ff7f0e", "shape": "hv"},
            fill="tozeroy",
            hovertemplate="%{y:,.2f}",
        ),
        secondary_y=False,
    )
    x_end, _ = _time(states["minute_end"])
    fig.add_trace(
        go.Scatter(
            x=x_end,
            y=states["WaitingRetry"],
            name="WaitingRetry (invisible, until revived)",
            line={"color": "#8c564b"},
            hovertemplate="%{y:,}",
        ),
        secondary_y=True,
    )
    return _two_axes(
        fig,
        ("retries per second", "messages waiting"),
        label,
        outages,
        title or "invisible-time retries and the reviver's copies",
    )


def dlq_figure(
    flow: pd.DataFrame, title: str = "", outages: Sequence[tuple[float, float]] = ()
) -> go.Figure:
    """Moves into the DLQ per bucket (bars) and running totals of DLQ inflow and replays."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x, label = _time(flow["minute"])
    width = float(x.iloc[1] - x.iloc[0]) if len(x) > 1 else 1.0
    fig.add_trace(
        go.Bar(
            x=x + width / 2,
            y=flow["dlq"],
            width=width,
            name="to DLQ per bucket",
            marker_color="#7f7f7f",
            hovertemplate="%{y:,}",
        ),
        secondary_y=False,
    )
    x_end, _ = _time(flow["minute_end"])
    fig.add_trace(
        go.Scatter(x=x_end, y=flow["dlq_total"], name="DLQ inflow, total",
                   line={"color": "#d62728"}, hovertemplate="%{y:,}"),
        secondary_y=True,
    )  # fmt: skip
    if flow["replays"].sum() > 0:
        fig.add_trace(
            go.Scatter(x=x_end, y=flow["replayed_total"], name="replayed, total",
                       line={"color": "#2ca02c"}, hovertemplate="%{y:,}"),
            secondary_y=True,
        )  # fmt: skip
    return _two_axes(
        fig,
        ("messages per bucket", "messages, running total"),
        label,
        outages,
        title or "DLQ inflow and replays",
    )


def commitlog_figure(
    writes: pd.DataFrame,
    messages: int,
    title: str = "",
    outages: Sequence[tuple[float, float]] = (),
) -> go.Figure:
    """Commitlog writes per second and the write amplification so far (writes / messages)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x, label = _time(writes["minute"])
    fig.add_trace(
        go.Scatter(x=x, y=writes["writes_per_s"], name="writes/s",
                   line={"color": "#9467bd", "shape": "hv"}, hovertemplate="%{y:,.2f}"),
        secondary_y=False,
    )  # fmt: skip
    x_end, _ = _time(writes["minute_end"])
    fig.add_trace(
        go.Scatter(x=x_end, y=writes["writes_total"] / max(messages, 1),
                   name="writes so far / messages", line={"color": "#8c564b"},
                   hovertemplate="x%{y:.3f}"),
        secondary_y=True,
    )  # fmt: skip
    return _two_axes(
        fig,
        ("commitlog writes per second", "write amplification so far"),
        label,
        outages,
        title or "broker commitlog writes (write amplification)",
    )


def utilization_figure(
    util: pd.DataFrame, title: str = "", outages: Sequence[tuple[float, float]] = ()
) -> go.Figure:
    """Pool utilization per bucket against the pool's capacity (100 %), and the oldest Ready
    message's age at each bucket's end."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x, label = _time(util["minute"])
    if util["utilization"].notna().any():
        fig.add_trace(
            go.Scatter(x=x, y=util["utilization"] * 100, name="utilization",
                       line={"color": "#1f77b4", "shape": "hv"}, hovertemplate="%{y:.1f} %"),
            secondary_y=False,
        )  # fmt: skip
        fig.add_hline(y=100, line={"color": "#1f77b4", "dash": "dot", "width": 1},
                      annotation_text="pool capacity", annotation_position="top left")  # fmt: skip
        top = max(100.0, float(util["utilization"].max() * 100)) * 1.05
        fig.update_yaxes(range=[0, top], secondary_y=False)
    else:
        fig.add_annotation(text="unlimited pool: no utilization", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")  # fmt: skip
    x_end, _ = _time(util["minute_end"])
    fig.add_trace(
        go.Scatter(x=x_end, y=util["oldest_ready_age_s"], name="oldest Ready age",
                   line={"color": "#d62728"}, hovertemplate="%{y:,.1f} s"),
        secondary_y=True,
    )  # fmt: skip
    return _two_axes(
        fig,
        ("utilization (%)", "oldest Ready age (s)"),
        label,
        outages,
        title or "consumer utilization and oldest Ready age",
    )


def instances_figure(util: pd.DataFrame, title: str = "") -> go.Figure:
    """Utilization per instance (rows) and bucket (columns) as a heat map."""
    height = int(min(HEIGHT * 2, 160 + 22 * max(1, len(util.index))))
    fig = go.Figure()
    if util.empty or util.isna().all().all():
        fig.add_annotation(text="unlimited pool: no utilization", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")  # fmt: skip
        return _style(fig, title or "utilization per consumer instance", height)
    minutes = pd.Series(util.columns, dtype=float)
    x, label = _time(minutes)
    fig.add_trace(
        go.Heatmap(
            z=util.to_numpy(dtype=float) * 100,
            x=x,
            y=[str(i) for i in util.index],
            zmin=0,
            zmax=100,
            colorscale="Viridis",
            colorbar={"title": {"text": "%"}},
            hovertemplate="instance %{y} at %{x}: %{z:.1f} %<extra></extra>",
        )
    )
    fig.update_yaxes(title_text="instance", autorange="reversed", type="category")
    fig.update_xaxes(title_text=label, rangeslider={"visible": True, "thickness": 0.06})
    _style(fig, title or "utilization per consumer instance", height)
    fig.update_layout(hovermode="closest")
    return fig


def overlay_figure(
    runs: Mapping[str, pd.DataFrame],
    columns: Sequence[tuple[str, str]],
    title: str = "",
    outages: Sequence[tuple[float, float]] = (),
) -> go.Figure:
    """Several runs' series overlaid, an axis per column (``(column, label)``): ``runs`` maps
    a run's name to its frame, with ``minute_end`` (bucket end) and the columns; solid for
    the first run, dashed for the others."""
    fig = make_subplots(
        rows=len(columns), cols=1, shared_xaxes=True, vertical_spacing=0.06,
        subplot_titles=[label for _, label in columns],
    )  # fmt: skip
    longest = max((frame["minute_end"].max() for frame in runs.values()), default=0.0)
    _, label = _time(pd.Series([longest], dtype=float))
    scale = 60 if _hours(label) else 1
    for number, (name, frame) in enumerate(runs.items()):
        for row, (column, _) in enumerate(columns, start=1):
            fig.add_trace(
                go.Scatter(
                    x=frame["minute_end"] / scale,
                    y=frame[column],
                    name=name,
                    legendgroup=name,
                    showlegend=row == 1,
                    line={
                        "color": LEVEL_COLORS[number % len(LEVEL_COLORS)],
                        "dash": "solid" if number == 0 else "dash",
                    },
                    hovertemplate="%{y:,.2f}",
                ),
                row=row,
                col=1,
            )
    _time_axis(fig, label, outages, row=len(columns))
    return _style(fig, title or "runs compared", int(HEIGHT * (0.8 * len(columns) + 0.4)))


def tradeoff_figure(
    plan: pd.DataFrame, group: str, targets: Mapping[str, float] | None = None, title: str = ""
) -> go.Figure:
    """Pool size vs the plan's metrics for one group: a line per case (the settings that do
    not set the pool) with its 95 % band across replications, target limits dashed, the
    recommended points starred. Each point is labelled with its point and links to its run's
    report (``<run id>.html`` in the same folder); a panel whose values span
    ``DECADES_FOR_LOG`` decades or more has a log axis, as does the pool axis."""
    rows = plan[(plan["group"] == group) & plan["pool"].notna()].copy()
    targets = targets or {}
    fig = make_subplots(
        rows=2, cols=3, subplot_titles=[name for _, name, _, _ in TRADEOFFS],
        horizontal_spacing=0.08, vertical_spacing=0.16,
    )  # fmt: skip
    rows["case"] = rows["settings"].map(lambda settings: case_label(settings, group))
    pools = sorted(rows["pool"].dropna().unique())
    for index, (column, _name, scale, unit) in enumerate(TRADEOFFS):
        where = {"row": index // 3 + 1, "col": index % 3 + 1}
        for number, (case, part) in enumerate(rows.groupby("case", sort=False)):
            _tradeoff_case(fig, part.sort_values("pool"), column, scale, case, number, where)
        if column in targets:
            fig.add_hline(y=targets[column] * scale, line={"color": "#d62728", "dash": "dash",
                          "width": 1}, annotation_text="target", **where)  # fmt: skip
        fig.update_xaxes(type="log", tickvals=pools, ticktext=[f"{int(p):,}" for p in pools],
                         title_text="consumer threads", **where)  # fmt: skip
        shown = rows[[c for c in (column, f"{column}_ci_low", f"{column}_ci_high") if c in rows]]
        values = shown.astype(float).to_numpy().ravel() * scale
        positive = values[values > 0]
        if len(positive) and positive.max() / positive.min() >= 10**DECADES_FOR_LOG:
            fig.update_yaxes(type="log", title_text=f"{unit} (log scale)", **where)
        else:
            top = max(float(pd.Series(values).max()) if len(values) else 0.0,
                      targets.get(column, 0) * scale, 1.0)  # fmt: skip
            fig.update_yaxes(range=[0, top * 1.15], title_text=unit, **where)
    runs = int(rows["replications"].max()) if "replications" in rows and len(rows) else 1
    bands = f"; means of {runs} replications, 95 % bands" if runs > 1 else ""
    _style(fig, title or f"{group}: trade-offs (★ recommended{bands})", int(HEIGHT * 2.4))
    fig.update_layout(hovermode="closest", legend={"y": -0.12, "yanchor": "top", "x": 0.5,
                                                   "xanchor": "center"})  # fmt: skip
    return fig


def _tradeoff_case(
    fig: go.Figure,
    part: pd.DataFrame,
    column: str,
    scale: float,
    case: str,
    number: int,
    where: dict,
) -> None:
    """One case's line on one trade-off panel: its band, its points (linked to their runs'
    reports) and its recommended point."""
    color = LEVEL_COLORS[number % len(LEVEL_COLORS)]
    first = where == {"row": 1, "col": 1}
    high, low = f"{column}_ci_high", f"{column}_ci_low"
    if high in part and part[high].notna().any():  # replications: the 95 % band
        fig.add_trace(
            go.Scatter(
                x=[*part["pool"], *part["pool"][::-1]],
                y=[*(part[high].astype(float) * scale), *(part[low].astype(float) * scale)[::-1]],
                fill="toself",
                fillcolor=color,
                opacity=0.2,
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
                name="95 % band",
            ),
            **where,
        )
    links = [
        f'<a href="{point_report_id(row)}.html">p{int(row["point"])}</a>'
        for _, row in part.iterrows()
    ]
    fig.add_trace(
        go.Scatter(
            x=part["pool"],
            y=part[column] * scale,
            mode="lines+markers+text",
            text=links,
            textposition="top center",
            textfont={"size": 10},
            name=case or "mean",
            legendgroup=case,
            showlegend=first,
            line={"color": color},
            customdata=[point_report_id(row) for _, row in part.iterrows()],
            hovertemplate="%{x} threads: %{y:,.3~f}<br>run %{customdata}<extra></extra>",
        ),
        **where,
    )
    best = part[part["recommended"].fillna(False).astype(bool)]
    if len(best):
        fig.add_trace(
            go.Scatter(
                x=best["pool"],
                y=best[column] * scale,
                mode="markers",
                name="recommended",
                marker={"symbol": "star", "size": 16, "color": "#d62728"},
                showlegend=first and number == 0,
                legendgroup="recommended",
                hovertemplate="recommended: %{x} threads<extra></extra>",
            ),
            **where,
        )


def metric_kind(column: str) -> str:
    """The kind of a plan column's values (duration, count, fraction, ratio)."""
    return next((kind for col, kind in METRICS.values() if col == column), "count")
