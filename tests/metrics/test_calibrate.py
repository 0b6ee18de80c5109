"""``retrysim calibrate`` on series drawn from a known truth (tests/metrics/synthetic.py):
the fits recover it, both export formats and both spellings of the names read alike, and a
file it cannot use is one line naming the file and the series, exit 2, nothing written."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from metrics.synthetic import STEP, T0, Truth, series, write_grafana_csv, write_json

from retrysim.cli.common import EXIT_BAD_INPUT
from retrysim.cli.main import main
from retrysim.metrics.fitting import fit_processing_time
from retrysim.metrics.reading import observe, read_exports
from retrysim.scenario.loading import load_scenario
from retrysim.scenario.units import parse_duration

BASE = """
name: payments-incident
groups:
  - name: payments
    topic: orders
    flavor: rocketmq5.push
    max_reconsume_times: 3
    consumers: {instances: 1, threads: 8}
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metrics")
    result = series(Truth())
    (folder / "base.yaml").write_text(BASE)
    return (
        folder,
        write_json(folder / "m.json", result),
        write_grafana_csv(folder / "m.csv", result),
    )


def calibrated(folder, *files, extra=()) -> dict:
    out = folder / "calibrated.yaml"
    code = main(["calibrate", "--metrics", *map(str, files), "--group", "payments", "--scenario",
                 str(folder / "base.yaml"), "--output", str(out), *extra])  # fmt: skip
    assert code == 0
    return yaml.safe_load(out.read_text()) | {"_text": out.read_text(), "_path": out}


def test_the_fit_recovers_the_truth_from_a_range_query(exported):
    folder, json_file, _ = exported
    truth = Truth()
    scenario = calibrated(folder, json_file)
    group = scenario["groups"][0]
    assert scenario["start_at"] == "2026-11-18T11:06:40Z"  # T0
    assert parse_duration(scenario["load_bucket"]) == STEP * 1000
    pieces = group["workload"]["profile"]
    assert [parse_duration(p["until"]) / 1000 for p in pieces] == [u for u, _ in truth.pieces]
    for piece, (_, rate) in zip(pieces, truth.pieces, strict=True):
        assert piece["per_second"] == pytest.approx(rate, rel=0.10)
    behavior = group["behavior"]
    assert behavior["fail_probability"] == pytest.approx(truth.fail, rel=0.10)
    [outage] = behavior["outages"]
    assert outage["fail_probability"] == pytest.approx(truth.outage_fail, rel=0.10)
    assert abs(parse_duration(outage["start"]) / 1000 - truth.outage[0]) <= STEP
    assert abs(parse_duration(outage["end"]) / 1000 - truth.outage[1]) <= STEP
    assert behavior["processing_time"]["dist"] == "lognormal"
    # the kept keys: the flavor and its policy come from the base scenario
    assert group["flavor"] == "rocketmq5.push" and group["max_reconsume_times"] == 3
    assert group["consumers"] == {"instances": 1, "threads": 8}
    # every fitted value says where it came from
    text = scenario["_text"]
    assert '# from rocketmq_messages_in_total{topic="orders"}' in text
    assert text.count("rocketmq_process_time_milliseconds_bucket") == 2
    load_scenario(scenario["_path"])  # a scenario retrysim runs


def test_grafana_csv_and_the_documented_names_give_the_same_scenario(exported, tmp_path):
    folder, json_file, csv_file = exported
    from_json = calibrated(folder, json_file)["_text"]
    assert calibrated(folder, csv_file)["_text"] == from_json.replace("m.json", "m.csv")
    # the names as RocketMQ documents them, without the OpenTelemetry exporter's suffixes
    body = json.loads(json_file.read_text())
    for item in body["data"]["result"]:
        name = item["metric"]["__name__"].replace("_milliseconds", "")
        item["metric"]["__name__"] = name.removesuffix("_total") if "_in_" in name else name
    plain = tmp_path / "m.json"
    plain.write_text(json.dumps(body))
    (tmp_path / "base.yaml").write_text(BASE)
    plain_scenario = calibrated(tmp_path, plain)
    assert "rocketmq_messages_in{" in plain_scenario["_text"]
    assert "rocketmq_process_time_bucket" in plain_scenario["_text"]
    assert plain_scenario["groups"] == yaml.safe_load(from_json)["groups"]


def test_a_saturated_pool_is_read_from_the_busy_threads(tmp_path):
    """8 threads busy through a backlog: the processing time summed per second holds at 8
    while the lag grows, and calibrate takes the pool from it, not from the base."""
    result = series(Truth(threads=8))
    times = T0 + np.arange(len(result[0]["values"])) * STEP
    busy = np.where((times - T0 > 600) & (times - T0 <= 900), 8.0, 1.0)
    for item in result:
        name = item["metric"]["__name__"]
        if name.endswith("_sum"):
            total = 1000.0 + np.concatenate([[0], np.cumsum(busy[1:] * STEP * 1000)])
            item["values"] = [[t, f"{v:g}"] for t, v in zip(times, total, strict=True)]
        if name == "rocketmq_consumer_lag_messages":
            lag = np.where(busy == 8.0, 5_000 + (times - T0 - 600) * 30, 3)
            item["values"] = [[t, f"{v:g}"] for t, v in zip(times, lag, strict=True)]
    pool = "    consumers: {instances: 1, threads: 8}\n"
    (tmp_path / "base.yaml").write_text(
        BASE.replace(pool, pool.replace("1, threads: 8", "2, threads: 1"))
    )
    group = calibrated(tmp_path, write_json(tmp_path / "m.json", result))["groups"][0]
    assert group["consumers"] == {"instances": 2, "threads": 4}
    # no plateau (the truth's unsaturated series) and a base without a pool: a required flag
    (tmp_path / "base.yaml").write_text(
        BASE.replace("    consumers: {instances: 1, threads: 8}\n", "")
    )
    plain = write_json(tmp_path / "plain.json", series(Truth()))
    group = calibrated(tmp_path, plain, extra=["--consumers", "3x16"])["groups"][0]
    assert group["consumers"] == {"instances": 3, "threads": 16}


def test_the_processing_fit_matches_every_bucket():
    """A lognormal's bucket counts are matched in every bucket; one bucket is a constant."""
    rng = np.random.default_rng(3)
    drawn = np.exp(rng.normal(math.log(40), 0.6, 50_000))
    bounds = [1, 5, 10, 100, 10_000, 60_000, math.inf]
    fit = fit_processing_time(bounds, [int((drawn <= b).sum()) for b in bounds])
    assert fit.dist == "lognormal" and fit.worst_bucket_error < 0.01
    assert fit_processing_time(bounds, [0, 0, 0, 7, 7, 7, 7]).dist == "constant"


def _bad(tmp_path, capsys, files, group="payments"):
    (tmp_path / "base.yaml").write_text(BASE)
    out = tmp_path / "out.yaml"
    code = main(["calibrate", "--metrics", *map(str, files), "--group", group,
                 "--scenario", str(tmp_path / "base.yaml"), "--output", str(out)])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT and len(err) == 1 and not out.exists(), err
    return err[0]


def test_a_file_it_cannot_use_is_one_line_naming_it(tmp_path, capsys):
    good = series(Truth())
    text = tmp_path / "notes.txt"
    text.write_text("lag was high\n")
    assert "notes.txt: not a Grafana CSV" in _bad(tmp_path, capsys, [text])
    instant = tmp_path / "instant.json"
    instant.write_text(json.dumps({"status": "success", "data": {"resultType": "vector",
                                                                  "result": []}}))  # fmt: skip
    assert "instant.json: resultType 'vector'" in _bad(tmp_path, capsys, [instant])
    line = _bad(tmp_path, capsys, [write_json(tmp_path / "m.json", good)], group="billing")
    assert "m.json: no series for group billing (groups seen: payments)" in line
    short = [dict(item, values=item["values"][:2]) for item in good]
    line = _bad(tmp_path, capsys, [write_json(tmp_path / "short.json", short)])
    assert "short.json: rocketmq_" in line and "2 points; at least 3" in line
    reset = json.loads(json.dumps(good))
    reset[0]["values"][40][1] = "3"  # rocketmq_messages_in_total restarts from 3
    line = _bad(tmp_path, capsys, [write_json(tmp_path / "reset.json", reset)])
    assert 'reset.json: rocketmq_messages_in_total{topic="orders"}: the counter resets at' in line
    assert _bad(tmp_path, capsys, [tmp_path / "missing.json"]).endswith(
        "missing.json: no such file"
    )


def test_read_exports_sums_a_quantitys_series_per_time(exported):
    """Two brokers' lag series are one lag: their sum at each sample."""
    _, json_file, _ = exported
    raws = read_exports([json_file])
    [lag] = [raw for raw in raws if raw.name == "rocketmq_consumer_lag_messages"]
    twice = [
        *raws,
        type(lag)(lag.name, lag.labels | {"node_id": "broker-b"}, lag.file, lag.samples),
    ]
    observed = observe(twice, "payments")
    assert np.array_equal(observed.gauges["lag"].to_numpy(), 2 * lag.samples["value"].to_numpy())


def test_many_levels_go_to_a_traffic_file_beside_the_scenario(tmp_path):
    """Arrivals that change every few minutes over a day are more levels than a profile
    holds: the counts go to a traffic file beside the scenario, which loads with it."""
    pieces = tuple((300.0 * (k + 1), 5.0 + 20 * (k % 7)) for k in range(80))
    (tmp_path / "base.yaml").write_text(BASE)
    scenario = calibrated(tmp_path, write_json(tmp_path / "m.json", series(Truth(
        pieces=pieces, outage=(6000.0, 6300.0)))))  # fmt: skip
    workload = scenario["groups"][0]["workload"]
    assert workload["arrival"] == "file" and workload["file"] == "calibrated.traffic.csv"
    loaded = load_scenario(scenario["_path"])
    messages = loaded.groups[0].workload.messages
    assert messages == pytest.approx(sum(300 * rate for _, rate in pieces), rel=0.02)


def test_grafanas_series_as_rows_layout_reads_as_its_table_view(exported, tmp_path):
    *_, csv_file = exported
    wide = read_exports([csv_file])
    rows = []
    for raw in wide:
        selector = raw.name + "{" + ", ".join(f'{k}="{v}"' for k, v in raw.labels.items()) + "}"
        rows += [(selector, int(t * 1000), v) for t, v in raw.samples.itertuples(index=False)]
    long = tmp_path / "rows.csv"
    with long.open("w", newline="") as out:  # Grafana's older export: semicolons
        writer = csv.writer(out, delimiter=";")
        writer.writerow(["Series", "Time", "Value"])
        writer.writerows(rows)
    again = {raw.selector(): raw.samples for raw in read_exports([long])}
    assert len(again) == len(wide)
    for raw in wide:
        assert np.allclose(again[raw.selector()].to_numpy(), raw.samples.to_numpy())


def test_grafanas_excel_csv_reads_as_its_plain_one(exported, tmp_path):
    """Grafana's "for Excel" export: a ``sep=;`` line, semicolons, decimal commas."""
    *_, csv_file = exported
    frame = pd.read_csv(csv_file, dtype=str)
    frame.iloc[:, 1:] = frame.iloc[:, 1:].apply(lambda c: (c.astype(float) / 7).map(
        lambda v: f"{v:.6f}".replace(".", ",")))  # fmt: skip
    excel = tmp_path / "excel.csv"
    excel.write_text("sep=;\n" + frame.to_csv(sep=";", index=False))
    plain = {raw.selector(): raw.samples["value"].to_numpy() for raw in read_exports([csv_file])}
    for raw in read_exports([excel]):
        assert np.allclose(raw.samples["value"].to_numpy(), plain[raw.selector()] / 7, atol=1e-5)
