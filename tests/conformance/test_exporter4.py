"""The RocketMQ exporter's 4.x series over an incident on a real 4.9.7 broker, scraped by a
real Prometheus (retrysim.conformance.metrics): conf/metrics/exporter-4x.yaml, 1,800
messages over 60 s, 20 % failures and an outage failing 80 % from 20 s to 35 s, two retries
on a compressed delay table. The series are emulated: the broker's own statistics as the
exporter computes them (it is not on Maven Central); each is checked against what the run
did, so that a wrong name, label, formula or admin call shows, and ``retrysim calibrate``
must recover the incident from them as from a 4.x deployment's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from support import PROJECT

from retrysim.cli.main import main
from retrysim.conformance.harness import ENDPOINTS
from retrysim.conformance.metrics import record_broker_metrics
from retrysim.metrics.prometheus import binaries
from retrysim.scenario.loading import load_scenario
from retrysim.scenario.units import parse_duration

SCENARIO = PROJECT / "conf" / "metrics" / "exporter-4x.yaml"
RATE = 1800 / 60  # messages a second, as the scenario publishes them
STEP = 2.0  # the scrape interval, s
LABELS = {"cluster": "DefaultCluster", "broker": "broker-a"}


def series(result: list[dict], name: str, **labels: str) -> list[tuple[float, float]]:
    """The samples of every series ``name`` with ``labels`` (others may differ, such as
    ``countOfOnlineConsumers`` when the consumers stop), merged in time order."""
    rows = [
        r for r in result
        if r["metric"]["__name__"] == name
        and all(r["metric"].get(k) == v for k, v in labels.items())
    ]  # fmt: skip
    assert rows, f"no {name} {labels}"
    return sorted((float(t), float(v)) for row in rows for t, v in row["values"])


@pytest.mark.broker
@pytest.mark.prometheus
@pytest.mark.conformance_suite  # 100 s; the suite's calibration on a real broker is the 5.x one
@pytest.mark.skipif(binaries() is None, reason="prometheus and promtool are not on PATH")
def test_the_exporters_series_follow_the_4x_brokers_run(tmp_path):
    recorded = record_broker_metrics(load_scenario(SCENARIO), "payments", tmp_path, STEP)
    run = recorded.run
    assert (tmp_path / "broker" / "out" / ENDPOINTS).read_text().startswith("rocketmq-exporter ")
    answer = json.loads(recorded.metrics.read_text())
    assert answer["status"] == "success" and answer["data"]["resultType"] == "matrix"
    result = answer["data"]["result"]
    dead, retried = run.puts["%DLQ%payments"], run.puts["%RETRY%payments"]
    assert run.puts["orders"] == 1800 and len(run.dead_letters) == dead > 0 and retried > dead

    # the topic's minute tps (the broker's StatsItem, sampled every 10 s): after 60 s of a
    # steady 30 a second its window holds 50 to 60 s of them, so the peak is 5/6 to all of it
    produced = series(result, "rocketmq_producer_tps", topic="orders", **LABELS)
    assert 0.75 * RATE <= max(v for _, v in produced) <= 1.1 * RATE, produced
    # the group's pulls from the topic: each message once; its retries are pulled from
    # %RETRY%payments, which the exporter leaves out of rocketmq_consumer_tps
    pulled = series(result, "rocketmq_consumer_tps", topic="orders", group="payments", **LABELS)
    assert 0.75 * RATE <= max(v for _, v in pulled) <= 1.1 * RATE, pulled

    # the topics' max offsets only rise, and end at the store's puts
    for name, labels, final in (
        ("rocketmq_producer_offset", {"topic": "orders"}, 1800),
        ("rocketmq_topic_retry_offset", {"topic": "%RETRY%payments"}, retried),
        ("rocketmq_topic_dlq_offset", {"group": "payments"}, dead),  # the topic less %DLQ%
    ):
        values = [v for _, v in series(result, name, **labels, **LABELS)]
        assert values == sorted(values) and values[-1] == final, (name, values)
        assert values[0] < final, (name, values)  # recorded from before the run's puts
    # the send-backs of the last minute: each retry and each dead letter is one
    sent_back = series(result, "rocketmq_send_back_nums", topic="orders", group="payments")
    assert 0 < max(v for _, v in sent_back) <= retried + dead, sent_back

    # the group's backlog and its age: some while messages come, none once all are consumed
    for name in ("rocketmq_group_diff", "rocketmq_group_retrydiff"):
        diff = series(result, name, group="payments", msgModel="1")  # 1: CLUSTERING
        assert diff[-1][1] == 0 and max(v for _, v in diff) < 300, (name, diff)
    online = series(result, "rocketmq_group_diff", group="payments", countOfOnlineConsumers="1")
    assert len(online) > 10  # scraped while the consumer ran, then it stopped (0 online)
    age = series(result, "rocketmq_group_get_latency_by_storetime", topic="orders",
                 group="payments", **LABELS)  # fmt: skip
    assert age[-1][1] == 0 and max(v for _, v in age) < 10_000, age
    assert recorded.end - recorded.start < 120

    # calibrate reads the 4.x family as a user's export of it: the arrivals, the failures
    # outside and inside the outage (the retries put when due and the dead letters, over the
    # deliveries) and the outage's edges
    fitted_path = tmp_path / "calibrated.yaml"
    assert main(["calibrate", "--metrics", str(recorded.metrics), "--group", "payments",
                 "--scenario", str(SCENARIO), "--output", str(fitted_path)]) == 0  # fmt: skip
    fitted = yaml.safe_load(fitted_path.read_text())["groups"][0]
    start = np.datetime64(yaml.safe_load(fitted_path.read_text())["start_at"].rstrip("Z"), "ms")
    offset = start.astype(float) / 1000 - recorded.start
    assert 0 <= offset <= STEP
    pieces = fitted["workload"]["profile"]
    busy = [p["per_second"] for p in pieces if parse_duration(p["until"]) / 1000 + offset <= 60]
    assert busy and all(rate == pytest.approx(RATE, rel=0.10) for rate in busy), pieces
    behavior = fitted["behavior"]
    assert behavior["fail_probability"] == pytest.approx(0.2, rel=0.10)
    [outage] = behavior["outages"]
    assert outage["fail_probability"] == pytest.approx(0.8, rel=0.10)
    assert abs(parse_duration(outage["start"]) / 1000 + offset - 20) <= STEP
    assert abs(parse_duration(outage["end"]) / 1000 + offset - 35) <= STEP
