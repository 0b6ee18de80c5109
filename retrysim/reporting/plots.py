"""Matplotlib figures of a run and of a plan, from the pandas views of ``reporting.analysis``.

Figures are built as ``matplotlib.figure.Figure`` objects, never through ``pyplot``: no
global state, no backend switch (a notebook keeps its inline backend; the report renders
PNGs with Agg through :func:`png_base64`), nothing left open.

>>> fig = state_counts_figure(analysis.state_counts(load, "order-service"))  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from retrysim.planning.targets import METRICS
from retrysim.reporting.analysis import case_label

WIDTH, HEIGHT, DPI = 9.0, 3.2, 96
HOURS_AFTER_MINUTES = 180
COLORS = {"Ready": "#d62728", "Inflight": "#1f77b4", "WaitingRetry": "#ff7f0e"}
POOL_COLOR = "#9467bd"  # the pool's threads, apart from the Inflight line they bound
# Plan trade-off panels: (plan column, title, scale to the shown unit, unit).
TRADEOFFS = (
    ("p99_time_to_commit_ms", "p99 time to commit", 1 / 1000, "s"),
    ("max_ready_backlog", "max Ready backlog", 1, "messages"),
    ("dlq", "DLQ", 1, "messages"),
    ("peak_utilization", "peak consumer utilization", 100, "%"),
    ("max_oldest_ready_age_ms", "max oldest Ready age", 1 / 1000, "s"),
    ("pending", "pending at horizon", 1, "messages"),
)

__all__ = [
    "commitlog_figure",
    "deliveries_figure",
    "dlq_figure",
    "instances_figure",
    "png_base64",
    "retries_by_level_figure",
    "schedule_backlog_figure",
    "settle_cdf_figure",
    "state_counts_figure",
    "tradeoff_figure",
    "utilization_figure",
]


def _figure(rows: int = 1, cols: int = 1, height: float = HEIGHT) -> tuple[Figure, list]:
    fig = Figure(figsize=(WIDTH, height * rows), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _time(minutes: pd.Series) -> tuple[pd.Series, str]:
    """Minutes, or hours for long runs, and the axis label."""
    if len(minutes) and float(minutes.max()) > HOURS_AFTER_MINUTES:
        return minutes / 60, "time since start (h)"
    return minutes, "time since start (min)"


def _hours(label: str) -> bool:
    return label.endswith("(h)")


def _decorate(ax, label: str, outages: Sequence[tuple[float, float]] = ()) -> None:
    """What every time plot shares: outage windows shaded (start and end in minutes, on the
    axis' unit), counts from zero (an empty series drew negative ticks), a grid."""
    scale = 60 if _hours(label) else 1
    for number, (start, end) in enumerate(outages):
        ax.axvspan(start / scale, end / scale, color="#d62728", alpha=0.08, lw=0,
                   label="outage" if number == 0 else None)  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def _twin_legend(fig: Figure, ax, twin) -> None:
    """One legend for an axis and its twin, above the plot where it hides no line."""
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = twin.get_legend_handles_labels()
    fig.legend(
        handles + more_handles,
        labels + more_labels,
        loc="outside upper right",
        ncol=len(labels + more_labels),
        fontsize=8,
        frameon=False,
    )


def png_base64(fig: Figure) -> str:
    """The figure as a base64 PNG (Agg), for ``<img src="data:image/png;base64,...">``."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


_TIME_TICKS = tuple(
    zip(
        (0.001, 0.01, 0.1, 1, 10, 60, 600, 3600, 36_000, 360_000),
        ("1ms", "10ms", "100ms", "1s", "10s", "1m", "10m", "1h", "10h", "100h"),
        strict=True,
    )
)


def settle_cdf_figure(
    shares: Sequence[float],
    commit: Sequence[float] | None,
    dlq: Sequence[float] | None,
    title: str = "",
) -> Figure:
    """The distribution of the time from publishing to commit and to the DLQ: the share of
    those messages settled within a time, on a log axis (a retry ladder's steps show as
    steps; times under a millisecond are drawn at 1 ms). ``commit`` and ``dlq`` are the
    times at ``shares`` (the summary's quantile arrays); None or empty: nobody got there."""
    fig, (ax,) = _figure()
    drawn: list[float] = []
    for label, values, color in (
        ("to commit", commit, "#2ca02c"),
        ("to the DLQ", dlq, "#7f7f7f"),
    ):
        if values is None or not len(values):
            continue
        seconds = [max(float(value), 1.0) / 1000 for value in values]
        ax.plot(seconds, [share * 100 for share in shares], marker=".", color=color, label=label)
        drawn += seconds
    if drawn:
        ax.set_xscale("log")
        ticks = [(s, n) for s, n in _TIME_TICKS if min(drawn) / 10 <= s <= max(drawn) * 10]
        ax.set_xticks([s for s, _ in ticks], [n for _, n in ticks])
        ax.legend(loc="lower right", fontsize=8)
    for level in (50, 95, 99):
        ax.axhline(level, color="#999999", linewidth=0.6, linestyle=":")
    ax.set(xlabel="time since publishing (log scale)", ylabel="% of those messages")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3, which="both")
    if title:
        ax.set_title(title)
    return fig


def state_counts_figure(
    states: pd.DataFrame,
    title: str = "",
    outages: Sequence[tuple[float, float]] = (),
    pool: int | None = None,
    downstream: int | None = None,
) -> Figure:
    """Ready backlog, WaitingRetry and Inflight, each on its own axis (one can be thousands
    of times another): lines at bucket ends, and faint steps at each bucket's highest, so a
    burst between two bucket ends still shows; Inflight against the pool's threads and the
    calls its downstream serves at full speed (beyond them, every call slows down)."""
    fig = Figure(figsize=(WIDTH, HEIGHT * 2.2), dpi=DPI, layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    x, label = _time(states["minute_end"])
    starts = states["minute"] / (60 if _hours(label) else 1)
    for ax, state in zip(axes, ("Ready", "WaitingRetry", "Inflight"), strict=True):
        color = COLORS[state]
        ax.plot(x, states[state], label=state, color=color, linewidth=1.2)
        ax.step(starts, states[f"{state} max"], where="post", color=color, linewidth=0.8,
                alpha=0.35, linestyle="--")  # fmt: skip
    inflight_ax = axes[2]
    if pool is not None:
        inflight_ax.axhline(pool, color=POOL_COLOR, linestyle=":", linewidth=1.2,
                            label=f"pool: {pool:,} threads")  # fmt: skip
    if downstream is not None:
        inflight_ax.axhline(downstream, color="#d62728", linestyle=":", linewidth=1,
                            label=f"downstream: {downstream:,} calls at full speed")  # fmt: skip
    inflight_ax.plot([], [], color="gray", linestyle="--", alpha=0.5,
                     label="highest within a bucket")  # fmt: skip
    for ax in axes:  # after every line: fixing the bottom stops the axis growing for more
        _decorate(ax, label, outages)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # messages: whole numbers
        ax.set_ylim(top=max(ax.get_ylim()[1], 1.0))  # an empty series shows 0 and 1
    axes[0].set(ylabel="Ready backlog", title=title or "messages by state")
    axes[1].set(ylabel="WaitingRetry")
    inflight_ax.set(xlabel=label, ylabel="Inflight")
    for ax in axes:
        ax.legend(loc="best", fontsize=8)  # a pool held full draws its line at the top
    return fig


def deliveries_figure(
    rates: pd.DataFrame, title: str = "", outages: Sequence[tuple[float, float]] = ()
) -> Figure:
    """First deliveries and retries per second, stacked: the retry share of consumer load."""
    fig, (ax,) = _figure()
    x, label = _time(rates["minute"])
    ax.stackplot(
        x,
        rates["first_per_s"],
        rates["retries_per_s"],
        labels=["first deliveries/s", "retries/s"],
        colors=["#1f77b4", "#ff7f0e"],
        alpha=0.8,
        step="post",
    )
    ax.set(xlabel=label, ylabel="deliveries per second", title=title or "deliveries vs retries")
    _decorate(ax, label, outages)
    ax.legend(loc="upper right")
    return fig


def _level_label(level: int, delays_ms: Sequence[int]) -> str:
    if 1 <= level <= len(delays_ms):
        return f"L{level}\n{_short_ms(delays_ms[level - 1])}"
    return f"L{level}"


def _short_ms(ms: float) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms >= size and ms % size == 0:
            return f"{int(ms // size)}{unit}"
    return f"{ms:g}ms"


def retries_by_level_figure(
    retries: pd.DataFrame, delays_ms: Sequence[int] = (), cap: int = 0, title: str = ""
) -> Figure:
    """Retries scheduled per delay level (schedule-topic flavors) or per retry number."""
    fig, (ax,) = _figure()
    by_level = retries.dropna(subset=["delay_level"])
    if len(by_level):
        counts = by_level.groupby("delay_level")["retries"].sum().sort_index()
        labels = [_level_label(int(level), delays_ms) for level in counts.index]
        ax.set(xlabel="delay level (wait in SCHEDULE_TOPIC_XXXX)")
    else:
        counts = retries.groupby("retry")["retries"].sum().sort_index()
        labels = [f"{int(n)}+" if cap and n >= cap else str(int(n)) for n in counts.index]
        ax.set(xlabel="retry number")
    ax.bar(range(len(counts)), counts.to_numpy(), color="#ff7f0e")
    ax.set_xticks(range(len(counts)), labels, fontsize=8)
    ax.set(ylabel="retries", title=title or "retries by delay level")
    ax.grid(alpha=0.3, axis="y")
    if not len(counts):
        ax.text(0.5, 0.5, "no retries", transform=ax.transAxes, ha="center")
    return fig


def schedule_backlog_figure(
    backlog: pd.DataFrame,
    delays_ms: Sequence[int] = (),
    title: str = "",
    outages: Sequence[tuple[float, float]] = (),
) -> Figure:
    """Messages waiting in SCHEDULE_TOPIC_XXXX per level over time, stacked."""
    fig, (ax,) = _figure()
    x, label = _time(backlog["minute_end"])
    levels = [column for column in backlog if column.startswith("L")]
    if levels:
        names = [_level_label(int(c[1:]), delays_ms).replace("\n", " ") for c in levels]
        ax.stackplot(x, *[backlog[c] for c in levels], labels=names, alpha=0.85)
        ax.legend(loc="upper right", fontsize=7, ncol=max(1, math.ceil(len(levels) / 6)))
    else:
        ax.text(0.5, 0.5, "no schedule-topic backlog", transform=ax.transAxes, ha="center")
    ax.set(xlabel=label, ylabel="messages", title=title or "schedule-topic backlog per level")
    _decorate(ax, label, outages)
    return fig


def dlq_figure(
    flow: pd.DataFrame, title: str = "", outages: Sequence[tuple[float, float]] = ()
) -> Figure:
    """Moves into the DLQ per bucket (bars) and running totals of DLQ inflow and replays."""
    fig, (ax,) = _figure()
    x, label = _time(flow["minute"])
    width = float(x.iloc[1] - x.iloc[0]) if len(x) > 1 else 1.0
    ax.bar(x, flow["dlq"], width=width, align="edge", color="#7f7f7f", label="to DLQ per bucket")
    ax.set(xlabel=label, ylabel="messages per bucket", title=title or "DLQ inflow and replays")
    total = ax.twinx()
    x_end, _ = _time(flow["minute_end"])
    total.plot(x_end, flow["dlq_total"], color="#d62728", label="DLQ inflow, total")
    if flow["replays"].sum() > 0:
        total.plot(x_end, flow["replayed_total"], color="#2ca02c", label="replayed, total")
    total.set_ylabel("messages, running total")
    total.set_ylim(bottom=0)
    _decorate(ax, label, outages)
    _twin_legend(fig, ax, total)
    return fig


def commitlog_figure(
    writes: pd.DataFrame,
    messages: int,
    title: str = "",
    outages: Sequence[tuple[float, float]] = (),
) -> Figure:
    """Commitlog writes per second and the write amplification so far (writes / messages)."""
    fig, (ax,) = _figure()
    x, label = _time(writes["minute"])
    ax.step(x, writes["writes_per_s"], where="post", color="#9467bd", label="writes/s")
    ax.set(
        xlabel=label,
        ylabel="commitlog writes per second",
        title=title or "broker commitlog writes (write amplification)",
    )
    amp = ax.twinx()
    x_end, _ = _time(writes["minute_end"])
    amp.plot(
        x_end,
        writes["writes_total"] / max(messages, 1),
        color="#8c564b",
        label="writes so far / messages",
    )
    amp.set_ylabel("write amplification so far")
    amp.set_ylim(bottom=0)
    _decorate(ax, label, outages)
    _twin_legend(fig, ax, amp)
    return fig


def utilization_figure(
    util: pd.DataFrame, title: str = "", outages: Sequence[tuple[float, float]] = ()
) -> Figure:
    """Pool utilization per bucket against the pool's capacity (100 %), and the oldest Ready
    message's age at each bucket's end."""
    fig, (ax,) = _figure()
    x, label = _time(util["minute"])
    _decorate(ax, label, outages)
    if util["utilization"].notna().any():
        ax.step(x, util["utilization"] * 100, where="post", color="#1f77b4", label="utilization")
        ax.axhline(100, color="#1f77b4", linestyle=":", linewidth=1, label="pool capacity")
        ax.set_ylim(0, max(100.0, float(util["utilization"].max() * 100)) * 1.05)
    else:
        ax.text(0.5, 0.5, "unlimited pool: no utilization", transform=ax.transAxes, ha="center")
    ax.set(
        xlabel=label,
        ylabel="utilization (%)",
        title=title or "consumer utilization and oldest Ready age",
    )
    age = ax.twinx()
    x_end, _ = _time(util["minute_end"])
    age.plot(x_end, util["oldest_ready_age_s"], color="#d62728", label="oldest Ready age")
    age.set_ylabel("oldest Ready age (s)")
    age.set_ylim(bottom=0)
    _twin_legend(fig, ax, age)
    return fig


def instances_figure(util: pd.DataFrame, title: str = "") -> Figure:
    """Utilization per instance (rows) and bucket (columns) as a heat map."""
    fig, (ax,) = _figure(height=min(HEIGHT * 2, 1.2 + 0.25 * max(1, len(util.index))))
    if util.empty or util.isna().all().all():
        ax.text(0.5, 0.5, "unlimited pool: no utilization", transform=ax.transAxes, ha="center")
        ax.set_axis_off()
        return fig
    minutes = pd.Series(util.columns, dtype=float)
    x, label = _time(minutes)
    step = float(x.iloc[1] - x.iloc[0]) if len(x) > 1 else 1.0
    image = ax.imshow(
        util.to_numpy(dtype=float) * 100,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        vmin=0,
        vmax=100,
        extent=(float(x.iloc[0]), float(x.iloc[-1]) + step, len(util.index) - 0.5, -0.5),
    )
    ax.set(xlabel=label, ylabel="instance", title=title or "utilization per consumer instance")
    if len(util.index) <= 32:
        ax.set_yticks(range(len(util.index)), [str(i) for i in util.index])
    fig.colorbar(image, ax=ax, label="utilization (%)")
    return fig


def tradeoff_figure(
    plan: pd.DataFrame, group: str, targets: Mapping[str, float] | None = None, title: str = ""
) -> Figure:
    """Pool size vs the plan's metrics for one group: a line per case (the settings that do
    not set the pool) with its 95 % band across replications, target limits dashed, the
    recommended points starred."""
    rows = plan[(plan["group"] == group) & plan["pool"].notna()].copy()
    targets = targets or {}
    fig, axes = _figure(2, 3, height=3.0)
    rows["case"] = rows["settings"].map(lambda settings: case_label(settings, group))
    for ax, (column, name, scale, unit) in zip(axes, TRADEOFFS, strict=True):
        for case, part in rows.groupby("case", sort=False):
            part = part.sort_values("pool")
            (line,) = ax.plot(part["pool"], part[column] * scale, marker="o", label=case or None)
            low, high = f"{column}_ci_low", f"{column}_ci_high"
            if high in part and part[high].notna().any():  # replications: the 95 % band
                ax.fill_between(
                    part["pool"],
                    part[low].astype(float) * scale,
                    part[high].astype(float) * scale,
                    color=line.get_color(),
                    alpha=0.2,
                    linewidth=0,
                )
            best = part[part["recommended"].fillna(False).astype(bool)]
            ax.scatter(
                best["pool"], best[column] * scale, marker="*", s=220, color="#d62728", zorder=5
            )
        if column in targets:
            ax.axhline(
                targets[column] * scale,
                color="#d62728",
                linestyle="--",
                linewidth=1,
                label="target",
            )
        ax.set(title=name, xlabel="consumer threads", ylabel=unit)
        _pool_axis(ax, sorted(rows["pool"].dropna().unique()))
        shown = rows[[c for c in (column, f"{column}_ci_high") if c in rows]].astype(float)
        top = float(shown.max().max() * scale) if shown.notna().any().any() else 0.0
        ax.set_ylim(0, max(top, targets.get(column, 0) * scale, 1.0) * 1.1)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if labels:
        fig.legend(
            handles, labels, loc="outside lower center", ncol=min(4, len(labels)), fontsize=8
        )
    runs = int(rows["replications"].max()) if "replications" in rows and len(rows) else 1
    bands = f"; means of {runs} replications, 95 % bands" if runs > 1 else ""
    fig.suptitle(title or f"{group}: trade-offs (★ recommended{bands})")
    return fig


def _pool_axis(ax, pools: list) -> None:
    """A log-2 axis of pool sizes, ticked at the pools swept, in plain numbers."""
    ax.set_xscale("log", base=2)
    if pools:
        ax.set_xticks(pools, [f"{int(p):,}" for p in pools])
        ax.minorticks_off()


def metric_kind(column: str) -> str:
    """The kind of a plan column's values (duration, count, fraction, ratio)."""
    return next((kind for col, kind in METRICS.values() if col == column), "count")
