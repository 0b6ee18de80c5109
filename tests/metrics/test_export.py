"""``retrysim export`` (docs/metrics.md): a small run with an outage and dead letters, written
as OpenMetrics text under RocketMQ 5.x's names, holds the run's tables series by series:
read back by a parser here, and (marked ``prometheus``) backfilled with promtool into a real
Prometheus and queried through its HTTP API, every panel of the shipped Grafana dashboard
included, and read back by ``retrysim compare`` as equal to the run. Bad input is one line
and exit 2, and a failed export leaves no file."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections import defaultdict

import pandas as pd
import pytest
from pyspark.sql import functions as F

from retrysim import load_scenario, simulate
from retrysim.cli.main import main
from retrysim.metrics import export
from retrysim.metrics.compare import COMPARED, aligned, errors, run_clock, simulated
from retrysim.metrics.export import DASHBOARD, FAMILIES, SAMPLES, export_openmetrics
from retrysim.metrics.names import PROCESS_TIME_BUCKETS_MS
from retrysim.metrics.prometheus import Prometheus, backfill_openmetrics, binaries
from retrysim.metrics.reading import observe, read_exports
from retrysim.model.behavior import CONSUME_SUCCESS
from retrysim.store.sinks import read_table, run_frame

RUN, PLAIN = "exported", "no-clock"
START = dt.datetime(2026, 11, 27, 8, 0, tzinfo=dt.UTC)
START_MS = int(START.timestamp() * 1000)
GROUP, TOPIC = "order-service", "orders"
BUCKET_MS = 10_000
# conf/default.yaml, tiny: 600 orders over 2 minutes on 2 x 2 threads at ~500 ms each, every
# call failing from 1m to 2m, two retries before the DLQ, 10-second load buckets over 20 min
OVERRIDES = (
    f"start_at={START.isoformat()}",
    "horizon=20m",
    "load_bucket=10s",
    "groups.0.workload.messages=600",
    "groups.0.workload.over=2m",
    "groups.0.consumers.instances=2",
    "groups.0.consumers.threads=2",
    "groups.0.behavior.processing_time.mean=500ms",
    "groups.0.behavior.processing_time.p99=2s",
    "groups.0.max_reconsume_times=2",
    "groups.0.behavior.outages.0.start=1m",
    "groups.0.behavior.outages.0.end=2m",
)
Key = tuple[str, frozenset]  # a series: its sample name and its labels
Series = dict[Key, list[tuple[int, float]]]  # each series' (ms since the epoch, value)


@pytest.fixture(scope="module")
def exported(spark, tmp_path_factory):
    """The run exported (and one without start_at beside it), and the columns of every frame
    the export collected to the driver."""
    folder = tmp_path_factory.mktemp("export") / "out"
    simulate(spark, load_scenario(overrides=list(OVERRIDES)), output=str(folder), run_id=RUN,
             validate=False)  # fmt: skip
    plain = load_scenario(overrides=["groups.0.workload.messages=20", "horizon=1m"])
    simulate(spark, plain, output=str(folder), run_id=PLAIN, validate=False)
    frame = type(spark.range(1))  # the session's concrete DataFrame class
    collected, real_collect = [], frame.collect

    def collect(self):
        collected.append(tuple(self.columns))
        return real_collect(self)

    frame.collect = collect
    try:
        done = export_openmetrics(spark, str(folder), RUN)
    finally:
        frame.collect = real_collect
    return folder, done, collected


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+) (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse_openmetrics(text: str) -> Series:
    """The samples of an OpenMetrics text, checked as the format wants them: each family
    announced once by its TYPE and HELP (a UNIT only as its name's suffix) before its
    samples, whose names are its own; each series' timestamps rising; ``# EOF`` last."""
    lines = text.split("\n")
    assert lines[-2:] == ["# EOF", ""], lines[-3:]
    series: Series = defaultdict(list)
    families: dict[str, str] = {}
    current = None
    for line in lines[:-2]:
        if line.startswith("# "):
            kind, name, rest = line[2:].split(" ", 2)
            if kind == "TYPE":
                assert name not in families, f"family {name} announced twice"
                families[name], current = rest, name
            assert name == current, line
            if kind == "UNIT":
                assert name.endswith(f"_{rest}"), line
            continue
        name, labels, value, ts = _SAMPLE.match(line).groups()
        suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count",
                                                                            "_sum")}  # fmt: skip
        assert name in {current + s for s in suffixes[families[current]]}, line
        pairs = frozenset(_LABEL.findall(labels))
        seconds, millis = ts.split(".")
        moment = int(seconds) * 1000 + int(millis)
        points = series[(name, pairs)]
        assert not points or points[-1][0] < moment, f"{line}: not after {points[-1]}"
        points.append((moment, float(value)))
    assert list(families) == [family.name for family in FAMILIES][: len(families)]
    return dict(series)


def _labels(**labels: str) -> frozenset:
    return frozenset({"cluster": RUN, "topic": TOPIC, **labels}.items())


def expected_series(spark, output: str) -> Series:
    """The run's series as the tables give them, computed here apart from the export: sums
    over the load rows in pandas, and the process-time histogram over the attempts'
    (end_ms, end_ms - start_ms, outcome), a few hundred rows."""
    load = run_frame(output, "load", RUN).sort_values("bucket_start_ms")
    ends = (START_MS + load["bucket_start_ms"] + load["bucket_ms"]).tolist()
    group = {"consumer_group": GROUP}
    out = "rocketmq_messages_out_total"
    columns = {
        (out, _labels(**group, is_retry="false")): load["first_deliveries"].cumsum(),
        (out, _labels(**group, is_retry="true")): load["retries"].cumsum(),
        ("rocketmq_consumer_lag_messages", _labels(**group)):
            load["ready_backlog"] + load["inflight"],
        ("rocketmq_consumer_inflight_messages", _labels(**group)): load["inflight"],
        ("rocketmq_consumer_queueing_latency", _labels(**group)): load["oldest_ready_age_ms"],
        ("rocketmq_send_to_dlq_messages_total", _labels(**group)): load["dlq"].cumsum(),
    }  # fmt: skip
    messages = read_table(spark, output, "messages").where(F.col("run_id") == RUN)
    born = [row["born_ms"] for row in messages.select("born_ms").collect()]
    published = [sum(b < end - START_MS for b in born) for end in ends]
    columns[("rocketmq_messages_in_total", _labels())] = pd.Series(published) + load[
        "replays"
    ].cumsum().reset_index(drop=True)
    series = {
        key: list(zip(ends, map(float, values), strict=True)) for key, values in columns.items()
    }
    series.update(_process_time(spark, output, ends, group))
    series.update(_instances(output))
    return series


def _process_time(spark, output: str, ends: list[int], group: dict) -> Series:
    attempts = read_table(spark, output, "attempts").where(
        (F.col("run_id") == RUN) & F.col("start_ms").isNotNull()
    )
    rows = attempts.select("end_ms", (F.col("end_ms") - F.col("start_ms")).alias("took"),
                           "outcome").collect()  # fmt: skip
    series: Series = {}
    for status in ("success", "failure"):
        mine = [r for r in rows if (r["outcome"] == CONSUME_SUCCESS) == (status == "success")]
        labels = {**group, "invocation_status": status}
        bounds = [*(repr(b) for b in PROCESS_TIME_BUCKETS_MS), "+Inf"]
        for bound in bounds:
            within = [r for r in mine if bound == "+Inf" or r["took"] <= float(bound)]
            series[("rocketmq_process_time_bucket", _labels(**labels, le=bound))] = [
                (end, float(sum(r["end_ms"] < end - START_MS for r in within))) for end in ends
            ]
        for part, of in (("count", lambda r: 1), ("sum", lambda r: r["took"])):
            series[(f"rocketmq_process_time_{part}", _labels(**labels))] = [
                (end, float(sum(of(r) for r in mine if r["end_ms"] < end - START_MS)))
                for end in ends
            ]
    return series


def _instances(output: str) -> Series:
    frame = run_frame(output, "instance_load", RUN)
    series: Series = {}
    for instance, rows in frame.sort_values("bucket_start_ms").groupby("consumer_instance"):
        labels = _labels(consumer_group=GROUP, client_id=str(instance))
        ends = (START_MS + rows["bucket_start_ms"] + rows["bucket_ms"]).tolist()
        for name, values in (
            ("retrysim_instance_deliveries_total", rows["deliveries"].cumsum()),
            ("retrysim_instance_ready_messages", rows["ready_backlog"]),
            ("retrysim_instance_utilization", rows["utilization"]),
        ):
            series[(name, labels)] = list(zip(ends, map(float, values), strict=True))
    return series


def _frame(series: Series) -> pd.DataFrame:
    """One row per sample: the series (name and sorted labels), the moment, the value."""
    rows = [
        (name, ",".join(f"{k}={v}" for k, v in sorted(labels)), moment, value)
        for (name, labels), points in series.items()
        for moment, value in points
    ]
    frame = pd.DataFrame(rows, columns=["name", "labels", "ts_ms", "value"])
    return frame.sort_values(["name", "labels", "ts_ms"]).reset_index(drop=True)


def test_the_file_holds_the_runs_series_under_rocketmqs_names(spark, exported):
    output, done, collected = exported
    # no message-level row reaches the driver: the samples (and the lean runs' ids)
    assert tuple(SAMPLES.fieldNames()) in collected
    assert not [columns for columns in collected if "msg_id" in columns], collected
    with open(done.path, encoding="utf-8") as file:
        text = file.read()
    parsed = parse_openmetrics(text)
    expected = expected_series(spark, str(output))
    pd.testing.assert_frame_equal(_frame(parsed), _frame(expected), check_exact=True)
    families = {
        (re.sub(r"_(total|bucket|count|sum)$", "", name), labels - {("le", dict(labels).get("le"))})
        for name, labels in parsed
    }
    assert done.series == len(families)
    assert done.samples == sum(len(points) for points in parsed.values())
    # the run's story is in it: dead letters, retries, a lag and a failing listener
    last = {key: points[-1][1] for key, points in parsed.items()}
    assert last[("rocketmq_send_to_dlq_messages_total", _labels(consumer_group=GROUP))] > 0
    assert last[("rocketmq_messages_out_total", _labels(consumer_group=GROUP, is_retry="true"))]
    assert max(v for _, v in parsed[("rocketmq_consumer_lag_messages",
                                     _labels(consumer_group=GROUP))]) > 0  # fmt: skip
    assert last[("rocketmq_messages_in_total", _labels())] == 600
    first = min(points[0][0] for points in parsed.values())
    assert first == START_MS + BUCKET_MS and text.count("# TYPE") == len(FAMILIES)


def test_bad_input_is_one_line_and_a_failed_export_leaves_no_file(
    spark, exported, monkeypatch, capsys, tmp_path
):
    output, _, _ = exported
    monkeypatch.setattr(type(spark), "stop", lambda self: None)  # the test session stays
    for argv, line in (
        (["--run-id", "nope"], f"retrysim: error: --run-id: no run 'nope' in {output}"),
        (["--run", PLAIN], f"retrysim: error: --start-at: run '{PLAIN}' has no start_at"),
        (["--run", RUN, "--start-at", "soon"], "retrysim: error: --start-at: value 'soon'"),
    ):
        assert main(["export", "--output", str(output), *argv]) == 2
        said = capsys.readouterr().err.strip()
        assert said.startswith(line) and "\n" not in said, said
    assert not (output / "exports" / f"{PLAIN}.om.txt").exists()

    target = tmp_path / "later.om.txt"
    argv = ["export", "--output", str(output), "--run", PLAIN, "--file", str(target),
            "--start-at", "2026-11-27T09:00:00+01:00", "--cluster", "staging"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("retrysim: ")
    first = target.read_text().split("\n")[2]  # on the clock given, labelled as told
    assert first.startswith('rocketmq_messages_in_total{cluster="staging",topic="orders"}')
    assert first.endswith(f" {START_MS // 1000 + 60}.000"), first  # 1-minute buckets

    def broken(samples):
        yield "# TYPE rocketmq_messages_in counter"
        raise OSError("disk full")

    monkeypatch.setattr(export, "openmetrics_lines", broken)
    with pytest.raises(OSError, match="disk full"):
        export_openmetrics(spark, str(output), PLAIN, str(target), START)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["later.om.txt"]  # as it was
    assert target.read_text().split("\n")[2] == first


needs_prometheus = pytest.mark.skipif(
    binaries() is None,
    reason="no prometheus and promtool on PATH (scripts/prometheus.sh installs Debian's)",
)


@pytest.fixture(scope="module")
def prometheus(exported, tmp_path_factory):
    _, done, _ = exported
    folder = tmp_path_factory.mktemp("prometheus")
    backfill_openmetrics(done.path, folder / "tsdb")
    with Prometheus(folder) as server:
        yield server


def _span(series: Series) -> tuple[float, float]:
    moments = [moment for points in series.values() for moment, _ in points]
    return min(moments) / 1000, max(moments) / 1000


@pytest.mark.prometheus
@needs_prometheus
def test_prometheus_answers_each_series_with_the_runs_values(spark, exported, prometheus):
    output, _, _ = exported
    expected = expected_series(spark, str(output))
    start, end = _span(expected)
    for (name, labels), points in expected.items():
        selector = ",".join(f'{key}="{value}"' for key, value in sorted(labels))
        answer = prometheus.query_range(f"{name}{{{selector}}}", start, end, BUCKET_MS / 1000)
        (result,) = answer["data"]["result"]
        got = [(round(float(t) * 1000), float(v)) for t, v in result["values"]]
        assert got == points, name


def _substituted(expr: str) -> str:
    values = {"$consumer_group": GROUP, "$cluster": RUN, "$window": "1m"}
    for variable, value in values.items():
        expr = expr.replace(variable, value)
    return expr


@pytest.mark.prometheus
@needs_prometheus
def test_every_dashboard_panel_shows_the_runs_group(spark, exported, prometheus):
    dashboard = json.loads(DASHBOARD.read_text())
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "cluster", "consumer_group", "window"]
    start, end = START_MS / 1000, START_MS / 1000 + 20 * 60
    match = {"match[]": f'rocketmq_messages_out_total{{cluster="{RUN}"}}'}
    found = prometheus.api("label/consumer_group/values", start=start, end=end, **match)
    assert found["data"] == [GROUP]
    queried = 0
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = _substituted(target["expr"])
            assert "$" not in expr, expr
            result = prometheus.query_range(expr, start, end, BUCKET_MS / 1000)["data"]["result"]
            assert result, f"{panel['title']}: {expr} gives nothing"
            for series in result:
                labels = series["metric"]
                assert labels.get("consumer_group", GROUP) == GROUP, (panel["title"], labels)
                assert labels.get("topic", TOPIC) == TOPIC, (panel["title"], labels)
                values = [float(v) for _, v in series["values"]]
                assert any(math.isfinite(v) and v > 0 for v in values), (panel["title"], expr)
            queried += 1
    assert queried == sum(len(panel["targets"]) for panel in dashboard["panels"]) >= 9


@pytest.mark.prometheus
@needs_prometheus
def test_compare_finds_the_runs_own_export_equal_to_the_run(spark, exported, prometheus, tmp_path):
    """The export, queried back from Prometheus as a user records it (range-query JSON), is
    what ``retrysim compare`` reads: every quantity of the run lies on it, with no error; the
    busy threads alone differ a little (the process-time histogram counts a delivery in the
    bucket it ends in, the load splits its thread time across the buckets it spans)."""
    output, _, _ = exported
    start, end = _span(expected_series(spark, str(output)))
    recorded = prometheus.record(tmp_path / "recorded.json", start, end, BUCKET_MS / 1000)
    observed = observe(read_exports([recorded]), GROUP)
    start_at, scenario = run_clock(str(output), RUN)
    points = aligned(observed, simulated(spark, str(output), RUN, scenario, GROUP), start_at)
    found = {error.quantity: error for error in errors(points, observed)}
    assert set(found) == set(COMPARED)
    for quantity, error in found.items():
        assert error.points >= 119 and error.peak_shift_s == 0, error
        assert error.nmae < (0.1 if quantity == "busy_threads" else 1e-9), error
