"""Reports, and the conf/ scenarios they describe.

Each planning scenario in conf/ runs small (``--set``-style overrides shrink it) through the
engine with the test session (flash-sale runs as the points of test_plan's end-to-end plan),
and its run report is written: every section and image is there for every group, the file
is self-contained, and only aggregated rows reach the driver (no collected frame has a
``msg_id`` column; only runs, summary, load and a per-level count of attempts are read). A
plan report is written from plan rows made here, and once through ``retrysim report``.
"""

from __future__ import annotations

import functools
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import PROJECT, SMALL_RETRY_STORM

from retrysim import load_scenario, simulate
from retrysim.cli.main import main
from retrysim.planning import plan
from retrysim.planning.plan import write_plan_table
from retrysim.reporting import analysis, report
from retrysim.reporting.report import (
    REVIVE_SECTION,
    RUN_SECTIONS,
    draw_run_report,
    library_name,
    report_path,
    write_compare_report,
    write_plan_report,
    write_run_report,
)
from retrysim.reporting.verdict import run_verdicts
from retrysim.store.sinks import DeltaRsSink, run_rows
from retrysim.tables.schemas import PLAN, data_schema

CONF = PROJECT / "conf"
# Each scenario of issue 5, shrunk: fewer messages, shorter horizons and, where the ladder is
# long, fewer retries (poison-burst replays its dead letters at 30 min instead of 5 h).
# conf/flash-sale.yaml runs as the three points of test_plan's end-to-end plan.
SCENARIOS = {
    "downstream-outage": [
        "groups.0.workload.messages=300",
        "groups.0.max_reconsume_times=3",
        "groups.0.consumers.threads=2",
        "horizon=2h",
    ],
    "poison-burst": [
        "groups.0.workload.messages=300",
        "groups.0.max_reconsume_times=2",
        "groups.0.replay.at=30m",
        "horizon=1h",
    ],
    "orderly-blocking": [f"groups.{i}.workload.messages=200" for i in (0, 1)] + ["horizon=20m"],
    "retry-storm": list(SMALL_RETRY_STORM),
}
_CHART = re.compile(r'<div class="chart" data-chart="([^"]+)"><div[^>]*>\s*<div id="([^"]+)"')
_NOTE = re.compile(r'<h3>([^<]+)</h3><p class="empty">')
# Charted in every group's section, whatever its flavor and story.
ALWAYS = set(RUN_SECTIONS) - {"Retries by delay level", "Schedule-topic backlog per level",
                              "DLQ inflow and replays"}  # fmt: skip


@pytest.fixture
def driver_reads(spark, monkeypatch):
    """Records every table the report reads and the columns of every frame it collects (or
    reads on the driver by delta-rs)."""
    tables: list[str] = []
    collected: list[tuple[str, ...]] = []
    frame = type(spark.range(1))  # the session's concrete DataFrame class
    real_read, real_collect, real_pandas = analysis.read_table, frame.collect, frame.toPandas

    def read(spark, output, table):
        tables.append(table)
        return real_read(spark, output, table)

    def collect(self):
        collected.append(tuple(self.columns))
        return real_collect(self)

    def to_pandas(self):
        collected.append(tuple(self.columns))
        return real_pandas(self)

    def on_driver(real):
        """A small table read by delta-rs on the driver: recorded with its columns."""

        def read_small(output, table, run_id):
            tables.append(table)
            found = real(output, table, run_id)
            columns = found.columns if hasattr(found, "columns") else found[0] if found else ()
            collected.append(tuple(columns))
            return found

        return read_small

    monkeypatch.setattr(analysis, "read_table", read)
    monkeypatch.setattr(analysis, "run_rows", on_driver(analysis.run_rows))
    monkeypatch.setattr(analysis, "run_frame", on_driver(analysis.run_frame))
    monkeypatch.setattr(plan, "read_table", read)
    monkeypatch.setattr(frame, "collect", collect)
    monkeypatch.setattr(frame, "toPandas", to_pandas)
    return tables, collected


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_runs_and_its_report_has_every_section(spark, tmp_path, name, driver_reads):
    scenario = load_scenario(CONF / f"{name}.yaml", SCENARIOS[name])
    result = simulate(spark, scenario, output=str(tmp_path), run_id=name, validate=False)
    summary = {row["group"]: row for row in result.summary.collect()}
    assert set(summary) == {g.name for g in scenario.groups}
    tables, collected = driver_reads
    tables.clear(), collected.clear()

    path = write_run_report(spark, str(tmp_path), name)

    assert path == report_path(str(tmp_path), name) and Path(path).is_file()
    # the run's small tables, and retrysim compare's where it has laid the run over metrics
    assert set(tables) == {"runs", "summary", "load", "instance_load", "attempts", "observed",
                           "comparison"}  # fmt: skip
    assert collected and not [columns for columns in collected if "msg_id" in columns]
    text = Path(path).read_text()
    # offline: the one script file is the library beside it, shared by the folder's reports
    assert re.findall(r"<script src=\"([^\"]+)\"", text) == [library_name()]
    assert (Path(path).parent / library_name()).is_file()
    assert "http://" not in text and "https://" not in text
    # the zoom, said: to the activity, or to the busy part with the whole run after it
    zoomed = text.count("<summary>The whole run: the first ")
    assert text.count("horizon, where the activity is") + zoomed == len(summary)
    charts = [name for name, _ in _CHART.findall(text)]
    notes = _NOTE.findall(text)
    # every section is a chart, or a one-line note where it has nothing to show
    assert len(charts) + len(notes) == len(RUN_SECTIONS) * len(summary) + 3 * zoomed
    assert len({div for _, div in _CHART.findall(text)}) == len(charts)  # one id each
    # the verdict on top: the console's sentences, before the first chart
    assert text.index('<section id="verdict"') < text.index('class="chart"')
    for found in run_verdicts(str(tmp_path), name):
        for line in found.lines:
            assert f"<span>{html.escape(line)}</span>" in text
    for group in summary:
        assert f'id="group-{group}"' in text
        assert {f"{group}: {section}" for section in ALWAYS} <= set(charts)
        if summary[group]["dlq"] == 0 and summary[group]["replayed"] == 0:
            assert "No message reached the DLQ." in text
        else:
            assert f"{group}: DLQ inflow and replays" in charts
    assert not [chart for chart in charts if REVIVE_SECTION in chart]  # no 5.x group here
    assert "all commitlog writes" in text  # the writes by kind
    assert (
        "Summary per group" in text and f"{summary[scenario.groups[0].name]['messages']:,}" in text
    )
    _check_story(name, summary)

    # a run just simulated hands its report the retries it counted while staging: the report
    # reads no attempt, and the counts are those of the attempts, counted here in Python
    tables.clear()
    write_run_report(spark, str(tmp_path), name, retries=result.retries)
    assert "attempts" not in tables
    expected = _python_retries(result.attempts.collect())
    assert _retries(result.retries) == expected
    if name != "orderly-blocking":  # its retries are local: no WaitingRetry
        assert sum(expected.values()) > 0


def _retries(retries) -> dict[tuple, int]:
    return {
        (row.group, None if row.delay_level != row.delay_level else int(row.delay_level),
         int(row.retry)): int(row.retries)
        for row in retries.itertuples()
    }  # fmt: skip


def _python_retries(attempts: list) -> dict[tuple, int]:
    """Retries by group, delay level and retry number (capped), from the attempt rows."""
    counts: dict[tuple, int] = {}
    for row in attempts:
        if row["result_state"] == "WaitingRetry":
            key = (row["group"], row["delay_level"], min(row["reconsume_times"] + 1, 24))
            counts[key] = counts.get(key, 0) + 1
    return counts


def _check_story(name: str, summary: dict) -> None:
    """What each scenario is about shows in its small run too."""
    if name == "downstream-outage":
        assert summary["order-service"]["retries"] > 0
    elif name == "poison-burst":
        assert summary["inventory-sync"]["replayed"] > 0
    elif name == "orderly-blocking":
        assert summary["ledger-default"]["engine"] == "sequential"
    elif name == "retry-storm":  # instance 0 holds the one retry queue
        storm = summary["order-service"]
        assert storm["busiest_instance"] == 0 and storm["idle_instances"] == 0
        assert storm["busiest_instance_utilization"] == 1.0 > storm["peak_utilization"]


def _without_stamp(text: str) -> str:
    return re.sub(r"written by retrysim at [^<]+", "", text)


def test_a_report_drawn_while_the_run_is_checked_is_the_one_its_published_tables_give(
    spark, tmp_path, monkeypatch
):
    """simulate(report=...) draws the report from the staged tables in a forked process
    during the check and writes it once the run is published: the same report, byte for
    byte but its time stamp, as the one drawn from the published tables afterwards. A
    drawing that fails raises, naming the run, after the run is published."""
    name = "retry-storm"
    scenario = load_scenario(CONF / f"{name}.yaml", SCENARIOS[name])
    output = str(tmp_path / "out")
    draw = functools.partial(draw_run_report, output)
    result = simulate(spark, scenario, output=output, run_id=name, report=draw)

    assert result.report == report_path(output, name)
    again = write_run_report(spark, output, name, path=str(tmp_path / "again.html"))
    drawn = Path(result.report).read_text()
    zoomed = drawn.count("<summary>The whole run: the first ")
    notes = len(_NOTE.findall(drawn))
    assert len(_CHART.findall(drawn)) + notes == len(RUN_SECTIONS) + 3 * zoomed
    assert _without_stamp(drawn) == _without_stamp(Path(again).read_text())
    assert [p.name for p in Path(output, "reports").glob("plotly-*")] == [library_name()]

    def broken(data):
        raise ValueError("no figure today")

    monkeypatch.setattr(report, "run_report_html", broken)  # the forked process inherits it
    with pytest.raises(RuntimeError, match=r"(?s)report of run broken .*no figure today"):
        simulate(spark, scenario, output=output, run_id="broken", report=draw)
    assert [row["status"] for row in run_rows(output, "runs", "broken")] == ["complete"]
    assert not Path(report_path(output, "broken")).exists()

    # two runs compared: each series of both on the same axes, one legend entry per run
    compared = Path(write_compare_report(spark, output, name, "broken")).read_text()
    assert Path(report_path(output, f"compare-{name}-broken")).is_file()
    charts = [chart for chart, _ in _CHART.findall(compared)]
    assert charts == [f"order-service: {title}" for title, *_ in report._COMPARED]
    assert compared.count('"name":"retry-storm"') == compared.count('"name":"broken"') > 0


# --------------------------------------------------------------------------- plan report


def _plan_rows() -> list[tuple]:
    """Three points of one group with three replications each, as the plan table stores
    them (no run needed): means, their intervals and the share that met every target."""
    targets = json.dumps({"p99_time_to_commit_ms": 60_000.0, "max_ready_backlog": 1000.0})
    names = data_schema(PLAN).fieldNames()
    rows = []
    for point, (instances, p99, backlog, share) in enumerate(
        [(1, 400_000.0, 9000, 0.0), (2, 50_000.0, 800, 1.0), (4, 2_000.0, 10, 1.0)], start=1
    ):
        misses = [
            n
            for n, bad in (
                ("p99_time_to_commit", p99 > 60_000),
                ("max_ready_backlog", backlog > 1000),
            )
            if bad
        ]
        metrics = {
            "messages": 1000, "deliveries": 1100, "commits": 1000, "dlq": 0, "discards": 0,
            "pending": 0, "amplification": 1.1, "write_amplification": 1.2,
            "p50_time_to_commit_ms": 10.0, "p95_time_to_commit_ms": 20.0,
            "p99_time_to_commit_ms": p99, "max_ready_backlog": backlog, "max_waiting_retry": 5,
            "max_oldest_ready_age_ms": backlog * 10, "peak_utilization": 0.9,
            "busiest_instance_utilization": 0.95, "idle_instances": 0,
        }  # fmt: skip
        values = {
            "point": point,
            "point_run_id": f"cap-p{point}",
            "group": "svc",
            "settings_json": json.dumps({"groups.svc.consumers.instances": instances}),
            "instances": instances,
            "threads": 4,
            "pool": instances * 4,
            **{name: float(value) for name, value in metrics.items()},
            "targets_json": targets,
            "replications": 3,
            "confidence": 0.9,
            "meets_targets_share": share,
            "meets_targets": not misses,
            "failed_targets": ",".join(misses) or None,
            "recommended": point == 2,
            "binding_target": "p99_time_to_commit,max_ready_backlog" if point == 2 else None,
            "p99_time_to_commit_ms_ci_low": p99 * 0.9,
            "p99_time_to_commit_ms_ci_high": p99 * 1.1,
            "max_ready_backlog_ci_low": backlog * 0.8,
            "max_ready_backlog_ci_high": backlog * 1.2,
        }
        rows.append(tuple(values.get(name) for name in names))
    return rows


@pytest.fixture(scope="module")
def plan_output(spark, tmp_path_factory):
    output = tmp_path_factory.mktemp("plan-report")
    write_plan_table(spark, str(output), "cap", _plan_rows(), DeltaRsSink())
    return output


def test_plan_report_shows_the_recommendation_and_the_tradeoffs(spark, plan_output, driver_reads):
    tables, collected = driver_reads
    path = write_plan_report(spark, str(plan_output), "cap")
    assert set(tables) == {"plan"}
    assert not [columns for columns in collected if "msg_id" in columns]
    text = Path(path).read_text()
    assert Path(path) == plan_output / "reports" / "cap.html"
    assert "Trade-off curves" in text and "Recommendation" in text
    assert "<b>8 consumer threads</b> (2 instances x 4 threads, point p2" in text
    assert "meeting every target in 100% of its 3 replications (confidence 90%)" in text
    assert "50.0s [45.0s, 55.0s]" in text and "800 [640, 960]" in text  # mean [95 % interval]
    assert "binding target: <b>p99_time_to_commit,max_ready_backlog</b>" in text
    assert text.count('<tr class="recommended">') == 1
    assert [chart for chart, _ in _CHART.findall(text)] == ["svc: trade-offs"]
    # each point links to its (first replication's) run report, in the table and the chart
    assert '<a href="cap-p2-r1.html" title="run cap-p2-r1">p2</a>' in text
    assert '\\u003ca href=\\"cap-p2-r1.html\\"\\u003ep2\\u003c\\u002fa\\u003e' in text
    # on top, each target met or missed by the recommended pool
    top = text[text.index('id="verdict"') : text.index("Trade-off curves")]
    assert "recommended: 8 threads (2 x 4) (point p2)" in top
    assert top.count('class="met"') == 2 and 'class="missed"' not in top


def test_report_command_line(spark, plan_output, monkeypatch, capsys):
    """``retrysim report`` in this process: its session is the test session, which the
    command's ``stop()`` must not end here. Bad input exits 2 before any Spark starts."""
    monkeypatch.setattr(type(spark), "stop", lambda self: None)
    assert main(["report", "--output", str(plan_output), "--plan-id", "cap"]) == 0
    assert capsys.readouterr().out.strip() == str(plan_output / "reports" / "cap.html")
    missing = subprocess.run(
        [sys.executable, "-m", "retrysim", "report", "--output", str(plan_output / "nothing"),
         "--run-id", "x"],
        capture_output=True,
        text=True,
        cwd=PROJECT,
        timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.startswith("retrysim: error: --output: no retrysim tables in")
    assert not (plan_output / "nothing").exists()
