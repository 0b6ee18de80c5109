"""What a planner looks for in the run report's figures (retrysim.reporting.plots), on the
figure objects themselves: each state on an axis of its own, the pool's threads (and a
downstream's capacity) against Inflight and the pool's capacity against utilization, the
outage windows shaded on every time plot, and counts from zero (an all-zero series drew
negative ticks)."""

from __future__ import annotations

import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.patches import Rectangle

from retrysim.reporting import plots

MINUTES = [0.0, 1.0, 2.0, 3.0]
OUTAGES = [(1.0, 2.5)]


def _states(ready: list[int]) -> pd.DataFrame:
    frame = {"minute": MINUTES, "minute_end": [m + 1 for m in MINUTES]}
    for state, values in (("Ready", ready), ("Inflight", [1, 4, 4, 2]),
                          ("WaitingRetry", [0, 9, 3, 0])):  # fmt: skip
        frame[state] = values
        frame[f"{state} max"] = [v + 1 for v in values]
    return pd.DataFrame(frame)


def _shaded(ax) -> list[tuple[float, float]]:
    """The axis' shaded spans (axvspan's rectangles), as (start, end) in its x units."""
    spans = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_label() != "_nolegend_"]
    return [(p.get_x(), p.get_x() + p.get_width()) for p in spans if p.get_alpha() == 0.08]


def test_each_state_has_its_own_axis_and_inflight_is_drawn_against_the_pool():
    fig = plots.state_counts_figure(
        _states([0, 5000, 20000, 0]), outages=OUTAGES, pool=16, downstream=3
    )
    ready_ax, waiting_ax, inflight_ax = fig.axes
    for ax, state in ((ready_ax, "Ready"), (waiting_ax, "WaitingRetry"), (inflight_ax, "Inflight")):
        assert ax.get_lines()[0].get_label() == state
    assert ready_ax.get_ylim()[1] > 20000 > waiting_ax.get_ylim()[1]  # not squeezed together
    assert inflight_ax.get_ylim()[1] < 20  # 4 in flight is not a sliver under 9 retries
    lines = {line.get_label(): set(line.get_ydata()) for line in inflight_ax.get_lines()}
    assert lines["pool: 16 threads"] == {16} and lines["downstream: 3 calls at full speed"] == {3}
    assert inflight_ax.get_ylim()[1] > 16  # the pool line is in view
    for ax in fig.axes:
        assert _shaded(ax) == OUTAGES and ax.get_ylim()[0] == 0
        assert all(tick == int(tick) for tick in ax.get_yticks())  # counts: whole numbers
    quiet = plots.state_counts_figure(_states([0, 0, 0, 0])).axes[0]  # at most 1 Ready
    assert quiet.get_ylim()[1] >= 1 and {0, 1} <= set(quiet.get_yticks())  # not 0.01, 0.02


def test_every_time_plot_shades_the_outages_and_counts_from_zero():
    rates = pd.DataFrame({"minute": MINUTES, "first_per_s": [0.0] * 4, "retries_per_s": [0.0] * 4})
    flow = pd.DataFrame({"minute": MINUTES, "minute_end": [m + 1 for m in MINUTES],
                         "dlq": [0] * 4, "dlq_total": [0] * 4, "replays": [0] * 4,
                         "replayed_total": [0] * 4})  # fmt: skip
    writes = pd.DataFrame({"minute": MINUTES, "minute_end": [m + 1 for m in MINUTES],
                           "writes_per_s": [0.0] * 4, "writes_total": [0] * 4})  # fmt: skip
    util = pd.DataFrame({"minute": MINUTES, "minute_end": [m + 1 for m in MINUTES],
                         "utilization": [0.1, 1.0, 0.5, 0.0],
                         "oldest_ready_age_s": [0.0] * 4})  # fmt: skip
    backlog = pd.DataFrame({"minute_end": [m + 1 for m in MINUTES], "L3": [0, 2, 1, 0]})
    figures = [
        plots.deliveries_figure(rates, outages=OUTAGES),
        plots.dlq_figure(flow, outages=OUTAGES),
        plots.commitlog_figure(writes, 10, outages=OUTAGES),
        plots.utilization_figure(util, outages=OUTAGES),
        plots.schedule_backlog_figure(backlog, (1000, 5000, 10000), outages=OUTAGES),
    ]
    for fig in figures:
        main_ax = fig.axes[0]
        assert _shaded(main_ax) == OUTAGES, fig.axes[0].get_title()
        for ax in fig.axes:  # all-zero series included: no tick below zero
            assert ax.get_ylim()[0] == 0 and min(ax.get_yticks()) >= 0, ax.get_title()
    capacity = [
        line for line in figures[3].axes[0].get_lines() if line.get_label() == "pool capacity"
    ]
    assert capacity and set(capacity[0].get_ydata()) == {100}


def test_tradeoffs_draw_each_metrics_interval_as_a_band_around_its_mean():
    plan = pd.DataFrame(
        {
            "group": ["g"] * 3,
            "point": [1, 2, 3],
            "pool": [4, 8, 16],
            "settings": [{"groups.g.consumers.instances": i} for i in (1, 2, 4)],
            "recommended": [False, True, False],
            "replications": [5] * 3,
        }
    )
    for column, *_ in plots.TRADEOFFS:
        plan[column] = [300.0, 200.0, 100.0]
        plan[f"{column}_ci_low"] = [250.0, 150.0, 50.0]
        plan[f"{column}_ci_high"] = [350.0, 250.0, 150.0]
    fig = plots.tradeoff_figure(plan, "g")
    for ax, (_, _, scale, _) in zip(fig.axes, plots.TRADEOFFS, strict=False):
        (band,) = _bands(ax)
        ys = band.get_paths()[0].vertices[:, 1]
        assert min(ys) == 50.0 * scale and max(ys) == 350.0 * scale
        assert ax.get_ylim()[1] >= 350.0 * scale  # the band's top is in view
    assert "means of 5 replications" in fig.texts[0].get_text()
    one = plan.assign(replications=1, **{f"{c}_ci_high": None for c, *_ in plots.TRADEOFFS})
    assert not any(_bands(ax) for ax in plots.tradeoff_figure(one, "g").axes)


def _bands(ax) -> list[PolyCollection]:
    """The axis' filled bands (fill_between's polygons; the starred point is a scatter)."""
    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_the_time_to_settle_is_drawn_as_a_distribution_on_a_log_axis():
    shares = [0.0, 0.5, 0.99, 1.0]
    fig = plots.settle_cdf_figure(shares, [0.0, 40.0, 10_000.0, 20_000.0], [17_140_000.0] * 4)
    (ax,) = fig.axes
    commit, dlq = ax.get_lines()[:2]
    assert list(commit.get_xdata()) == [0.001, 0.04, 10.0, 20.0]  # s; 0 ms drawn at 1 ms
    assert list(commit.get_ydata()) == [0.0, 50.0, 99.0, 100.0]
    assert set(dlq.get_xdata()) == {17_140.0}
    assert ax.get_xscale() == "log" and ax.get_ylim() == (0, 100)
    labels = [tick.get_text() for tick in ax.get_xticklabels()]
    assert "1s" in labels and "1h" in labels
    nothing = plots.settle_cdf_figure(shares, None, [])  # no commit and no dead letter
    assert not [line for line in nothing.axes[0].get_lines() if line.get_label() in
                ("to commit", "to the DLQ")]  # fmt: skip
