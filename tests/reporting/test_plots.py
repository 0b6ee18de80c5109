"""What a planner looks for in the run report's figures (retrysim.reporting.plots), on the
Plotly figure objects themselves: each state on an axis of its own, the pool's threads (and
a downstream's capacity) against Inflight, each instance against its own pool, the outage
windows shaded and a range slider on every time plot, a colour per delay level, and the
plan's trade-offs with their bands, log axes and links to the points' reports."""

from __future__ import annotations

import pandas as pd

from retrysim.reporting import analysis, plots

MINUTES = [0.0, 1.0, 2.0, 3.0]
OUTAGES = [(1.0, 2.5)]


def _states(ready: list[int]) -> pd.DataFrame:
    frame = {"minute": MINUTES, "minute_end": [m + 1 for m in MINUTES]}
    for state, values in (("Ready", ready), ("Inflight", [1, 4, 4, 2]),
                          ("WaitingRetry", [0, 9, 3, 0])):  # fmt: skip
        frame[state] = values
        frame[f"{state} max"] = [v + 1 for v in values]
    return pd.DataFrame(frame)


def _shaded(fig) -> set[tuple[float, float]]:
    """The figure's shaded spans (add_vrect's rectangles), as (start, end) in x units."""
    return {(s.x0, s.x1) for s in fig.layout.shapes if s.type == "rect"}


def _hlines(fig, axis: str) -> set[float]:
    """The y of the horizontal lines drawn on the y axis ``axis`` ("y", "y2", ...)."""
    return {s.y0 for s in fig.layout.shapes if s.type == "line" and s.yref == axis}


def _trace(fig, name: str):
    (found,) = [t for t in fig.data if t.name == name]
    return found


def test_each_state_has_its_own_axis_and_each_instance_runs_against_its_own_pool():
    busy = pd.DataFrame({0: [0.5, 4.0, 4.0, 1.0], 1: [0.5, 0.2, 0.1, 0.0]}, index=MINUTES)
    fig = plots.state_counts_figure(
        _states([0, 5000, 20000, 0]), outages=OUTAGES, pool=16, downstream=3, instances=busy,
        threads=4,
    )  # fmt: skip
    axes = {name: _trace(fig, name).yaxis for name in ("Ready", "WaitingRetry", "Inflight")}
    hot = _trace(fig, "instance 0 (busiest)")
    assert len({*axes.values(), hot.yaxis}) == 4  # four axes: one per state, the instances
    assert hot.yaxis == "y2"  # second, in view under the backlog it explains
    assert list(hot.y) == [0.5, 4.0, 4.0, 1.0] and _trace(fig, "instance 1").yaxis == "y2"
    assert _hlines(fig, "y2") == {4} and _hlines(fig, axes["Inflight"]) == {16, 3}
    assert "each instance's pool: 4 threads" in {t.name for t in fig.data}
    assert _shaded(fig) == set(OUTAGES)
    assert fig.layout[f"xaxis{len(axes) + 1}"].rangeslider.visible  # on the bottom axis
    quiet = plots.state_counts_figure(_states([0, 0, 0, 0]))
    assert quiet.layout.yaxis.dtick == 1 and quiet.layout.yaxis.range[1] >= 1  # not 0, 1, 1
    assert len({t.yaxis for t in quiet.data}) == 3  # no instances: three axes


def test_every_time_plot_shades_the_outages_has_a_range_slider_and_counts_from_zero():
    load = pd.DataFrame({"group": "g", "minute": MINUTES, "minute_end": [m + 1 for m in MINUTES],
                         "bucket_ms": 60_000,
                         "first_deliveries": [60, 0, 0, 0], "retries": [0, 120, 60, 0],
                         "deliveries": [60, 120, 60, 0]})  # fmt: skip
    rates = analysis.delivery_rates(load)
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
        plots.revive_figure(rates, _states([0, 0, 0, 0]), outages=OUTAGES),
    ]
    for fig in figures:
        title = fig.layout.title.text
        assert _shaded(fig) == set(OUTAGES), title
        assert fig.layout.xaxis.rangeslider.visible, title
        assert fig.layout.yaxis.rangemode == "tozero" or fig.layout.yaxis.range[0] == 0, title
    assert list(_trace(figures[0], "retries/s").y) == [0.0, 2.0, 1.0, 0.0]
    assert _hlines(figures[3], "y") == {100}  # the pool's capacity
    assert list(_trace(figures[5], "revived into %RETRY% and delivered, per s").y) == [
        0.0, 2.0, 1.0, 0.0
    ]  # fmt: skip


def test_every_delay_level_has_a_colour_of_its_own():
    assert len({plots.level_color(level) for level in range(1, 19)}) == 18
    assert plots.level_color(3) != plots.level_color(13)
    backlog = pd.DataFrame({"minute_end": [1.0], **{f"L{n}": [n] for n in range(1, 19)}})
    fig = plots.schedule_backlog_figure(backlog, [1000 * n for n in range(1, 19)])
    assert len({trace.line.color for trace in fig.data}) == 18
    assert fig.data[2].name == "L3 3s"
    retries = pd.DataFrame({"delay_level": [3.0, 13.0], "retry": [1, 11], "retries": [5, 2]})
    (bars,) = plots.retries_by_level_figure(retries, [1000 * n for n in range(1, 19)]).data
    assert list(bars.marker.color) == [plots.level_color(3), plots.level_color(13)]


def _plan(replications: int, p99: list[float]) -> pd.DataFrame:
    plan = pd.DataFrame(
        {
            "group": ["g"] * 3,
            "point": [1, 2, 3],
            "point_run_id": ["cap-p1", "cap-p2", "cap-p3"],
            "pool": [4, 8, 16],
            "settings": [{"groups.g.consumers.instances": i} for i in (1, 2, 4)],
            "recommended": [False, True, False],
            "replications": [replications] * 3,
        }
    )
    for column, *_ in plots.TRADEOFFS:
        plan[column] = [300.0, 200.0, 100.0]
        plan[f"{column}_ci_low"] = [250.0, 150.0, 50.0]
        plan[f"{column}_ci_high"] = [350.0, 250.0, 150.0]
    plan["p99_time_to_commit_ms"] = p99
    return plan


def test_tradeoffs_draw_bands_link_each_point_to_its_run_and_log_scale_decades():
    fig = plots.tradeoff_figure(_plan(5, [300_000.0, 2_000.0, 100.0]), "g")
    bands = [t for t in fig.data if t.name == "95 % band"]
    assert len(bands) == len(plots.TRADEOFFS)
    backlog_band = next(t for t in bands if t.yaxis == "y2")
    assert min(backlog_band.y) == 50.0 and max(backlog_band.y) == 350.0
    lines = [t for t in fig.data if t.mode == "lines+markers+text"]
    assert list(lines[0].text) == [
        f'<a href="cap-p{n}-r1.html">p{n}</a>' for n in (1, 2, 3)
    ]  # replications: the first one's report
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [4, 8, 16]
    assert fig.layout.yaxis.type == "log"  # p99 from 0.1 s to 300 s: decades
    assert fig.layout.yaxis2.type != "log"  # 50 to 350 messages: linear
    assert "means of 5 replications" in fig.layout.title.text
    one = plots.tradeoff_figure(_plan(1, [300.0, 200.0, 100.0]), "g")
    assert '<a href="cap-p1.html">p1</a>' in next(t for t in one.data if t.text).text


def test_the_time_to_settle_is_drawn_as_a_distribution_on_a_log_axis():
    shares = [0.0, 0.5, 0.99, 1.0]
    fig = plots.settle_cdf_figure(shares, [0.0, 40.0, 10_000.0, 20_000.0], [17_140_000.0] * 4)
    commit, dlq = fig.data
    assert list(commit.x) == [0.001, 0.04, 10.0, 20.0]  # s; 0 ms drawn at 1 ms
    assert list(commit.y) == [0.0, 50.0, 99.0, 100.0]
    assert set(dlq.x) == {17_140.0}
    assert fig.layout.xaxis.type == "log" and tuple(fig.layout.yaxis.range) == (0, 100)
    assert "1s" in fig.layout.xaxis.ticktext and "1h" in fig.layout.xaxis.ticktext
    assert not plots.settle_cdf_figure(shares, None, []).data  # no commit, no dead letter


def test_the_writes_by_kind_add_up_to_the_commitlog_writes():
    load = pd.DataFrame({"commitlog_writes": [500, 300], "replays": [0, 10], "dlq": [0, 7]})
    retries = pd.DataFrame({"delay_level": [3.0, 4.0, None], "retry": [1, 2, 3],
                            "retries": [100, 50, 9]})  # fmt: skip
    parts = dict(analysis.write_breakdown(load, retries, 400, "schedule"))
    assert sum(parts.values()) == 800
    assert parts["publishes"] == 400 and parts["schedule-topic copies"] == 150
    assert parts["replays"] == 10 and parts["DLQ moves"] == 7
    assert parts["retry-topic copies (the schedule topic's deliveries to %RETRY%)"] == 233
