"""The harness's inputs and hand-over without a broker: the outcomes file with outages (a
pair per span between their edges, drawn as retrysim's listener draws for a start inside
it) and the metrics endpoints handed to a scraper before production."""

from __future__ import annotations

import subprocess

import yaml
from support import PROJECT

from retrysim.conformance.harness import (
    ENDPOINTS,
    SCRAPE_READY,
    _watch_endpoints,
    group_spec,
    outage_windows,
    outcomes,
)
from retrysim.engine.event_rules import Listener
from retrysim.model.workload import messages_np
from retrysim.scenario.loading import load_scenario

SUITE = PROJECT / "conf" / "conformance"


def test_each_span_between_the_outages_edges_has_the_draws_of_a_start_inside_it(tmp_path):
    """Two overlapping outages: three spans (the first alone, both, the second alone), each
    row's pair for a span equal to the listener's draw at the span's middle, the first pair
    to its draw outside every window."""
    data = yaml.safe_load((SUITE / "outage-5x.yaml").read_text())
    data["groups"][0]["behavior"]["outages"] = [
        {"start": "5s", "end": "15s", "fail_probability": 0.5},
        {"start": "10s", "end": "20s", "fail_probability": 0.9, "processing_time": "300ms"},
    ]
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    _, spec = group_spec(load_scenario(path), "payments")
    spans = outage_windows(spec)
    assert spans == [(5_000, 10_000), (10_000, 15_000), (15_000, 20_000)]
    msg_ids = messages_np(spec.workload, spec.group, spec.seed)[0]
    drawn = outcomes(spec, msg_ids)
    assert list(drawn.columns[2:]) == [
        "outcome", "processing_ms", "outcome_1", "processing_ms_1", "outcome_2",
        "processing_ms_2", "outcome_3", "processing_ms_3",
    ]  # fmt: skip
    listen = Listener(spec.behavior, spec.seed, spec.group, client_time=False)
    poisoned = dict(zip(msg_ids.tolist(), listen.poisoned(msg_ids).tolist(), strict=True))
    for row in drawn.itertuples(index=False):
        starts = [60_000, *((start + end) // 2 for start, end in spans)]
        for i, start in enumerate(starts):
            outcome, processing, _ = listen(row.msg_id, row.delivery, start, poisoned[row.msg_id])
            assert (row[2 + 2 * i], row[3 + 2 * i]) == (outcome, processing)
    assert (drawn["processing_ms_3"] == 300).all() and (drawn["processing_ms_1"] == 100).all()
    assert (drawn["outcome_2"] != "CONSUME_SUCCESS").mean() > (
        drawn["outcome_1"] != "CONSUME_SUCCESS"
    ).mean()  # the higher chance where both are open


def _harness_writing_endpoints(out):
    """A stand-in for the harness: writes the endpoints file, then waits to be stopped."""
    out.mkdir()
    (out / ENDPOINTS).write_text("broker http://127.0.0.1:1/metrics\nharness http://x/m\n")
    return subprocess.Popen(["sleep", "30"])


def test_the_endpoints_are_handed_over_and_production_let_start(tmp_path):
    running = _harness_writing_endpoints(tmp_path / "out")
    seen, failed = [], []
    try:
        _watch_endpoints(tmp_path / "out", running, seen.append, failed)
        assert seen == [{"broker": "http://127.0.0.1:1/metrics", "harness": "http://x/m"}]
        assert (tmp_path / "out" / SCRAPE_READY).exists() and not failed
    finally:
        running.kill()
        running.wait()


def test_a_scraper_that_fails_stops_the_harness_and_its_error_is_kept(tmp_path):
    running = _harness_writing_endpoints(tmp_path / "out")

    def fails(endpoints):
        raise RuntimeError("no prometheus")

    failed = []
    _watch_endpoints(tmp_path / "out", running, fails, failed)
    assert running.wait(timeout=10) != 0  # terminated
    assert [str(error) for error in failed] == ["no prometheus"]
    assert not (tmp_path / "out" / SCRAPE_READY).exists()
