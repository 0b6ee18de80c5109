"""The verdict's sentences from a run's aggregated rows (pure pandas, no Spark): each figure a
sentence states is the one of those rows, and the sentences say what the figures mean; and
``simulate --json`` (one run through Spark)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from retrysim import read_table
from retrysim.cli import simulate as simulate_cli
from retrysim.cli.main import main
from retrysim.reporting.verdict import group_verdict, verdicts
from retrysim.scenario.loading import load_scenario

MINUTE = 60_000


def _summary(**figures) -> dict:
    row = {
        "group": "order-service",
        "messages": 1000,
        "deliveries": 1200,
        "retries": 200,
        "commits": 1000,
        "dlq": 0,
        "replayed": 0,
        "discards": 0,
        "pending": 0,
        "p50_time_to_commit_ms": 40.0,
        "p99_time_to_commit_ms": 1_844_000.0,
        "p50_time_to_dlq_ms": None,
        "max_ready_backlog": 0,
        "max_oldest_ready_age_ms": 0,
        "idle_instances": 0,
    }
    return {**row, **figures}


def _load(peak_at: int, peak: int, buckets: int = 40) -> pd.DataFrame:
    starts = [b * MINUTE for b in range(buckets)]
    return pd.DataFrame(
        {
            "group": "order-service",
            "bucket_start_ms": starts,
            "bucket_ms": MINUTE,
            "ready_backlog_max": [peak if b == peak_at else peak // 2 for b in range(buckets)],
        }
    )


def _instances(hot: range, waiting: int, instances: int = 4, threads: int = 20) -> pd.DataFrame:
    """Instance 0 all busy with work waiting over the buckets of ``hot`` (one second of
    thread time a delivery; its backlog at a bucket's end grows by 600 a bucket to the
    middle of ``hot``, then falls), the others a quarter busy, and the last instance idle."""
    rows = []
    middle = hot.start + len(hot) // 2 if len(hot) else 0
    for i in range(instances):
        for b in range(40):
            busy = 1.0 if (i == 0 and b in hot) else (0.0 if i == instances - 1 else 0.25)
            backlog = 600 * (b - hot.start + 1 if b <= middle else middle - b + len(hot) // 2)
            rows.append(
                {
                    "group": "order-service",
                    "consumer_instance": i,
                    "bucket_start_ms": b * MINUTE,
                    "bucket_ms": MINUTE,
                    "deliveries": int(busy * threads * 60),
                    "busy_thread_ms": busy * threads * MINUTE,
                    "utilization": busy,
                    "utilization_max": 1.0 if busy == 1.0 else busy,
                    "ready_backlog": backlog if (i == 0 and b in hot) else 0,
                    "ready_backlog_max": waiting if (i == 0 and b in hot) else 0,
                }
            )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def scenario():
    return load_scenario(None, ["groups.0.behavior.outages=[]"])  # conf/default.yaml: 4 x 20


def test_a_saturated_retry_owner_is_named_with_its_window_threads_and_the_others(scenario):
    (group,) = scenario.groups
    summary = _summary(max_ready_backlog=12_721, max_oldest_ready_age_ms=1_230_000)
    verdict = group_verdict(
        scenario, group, summary, _load(12, 12_721), _instances(range(10, 31), 3)
    )
    text = "; ".join(verdict.lines)
    assert "instance 0 (the %RETRY% queue's: every retry) saturated from 10m to 31m" in text
    # 10m to the backlog's peak, at 21m: 11 minutes of 20 threads, and 6,600
    # waiting of a second each: 20 + 6,600 / 660 = 30 threads to keep up
    assert "(100% busy), wanting 30 of its 20 threads to keep up; the other 3 at 17%" in text
    assert "12,721 wait at the peak (12m-13m), the oldest 20m30s" in text
    assert "1 of 4 instances idle" in text
    assert verdict.figures["threads_to_keep_up"] == 30
    assert verdict.figures["threads_wanted_at_once"] == 20 + 3
    assert verdict.figures["idle_instance_ids"] == [3]
    assert verdict.figures["saturated_from_ms"] == 10 * MINUTE
    assert verdict.figures["max_ready_backlog_bucket_ms"] == [12 * MINUTE, 13 * MINUTE]


def test_moments_of_saturation_are_not_called_saturation_over_the_window(scenario):
    (group,) = scenario.groups
    instances = _instances(range(10, 31), 4)
    hot = (instances["consumer_instance"] == 0) & instances["bucket_start_ms"].between(
        10 * MINUTE, 30 * MINUTE
    )
    instances.loc[hot, "busy_thread_ms"] = 0.44 * 20 * MINUTE
    instances.loc[hot, "utilization"] = 0.44
    verdict = group_verdict(scenario, group, _summary(max_ready_backlog=4), _load(21, 4), instances)
    text = "; ".join(verdict.lines)
    assert "saturated at moments from 10m to 31m (44% busy), wanting up to 24 of its 20" in text


def test_dead_letters_and_replays_are_told_together_and_p99_counts_the_committed(scenario):
    (group,) = scenario.groups  # 4.x concurrently: 16 retries, so 17 deliveries a dead letter
    summary = _summary(
        commits=9_000,
        messages=10_000,
        dlq=0,
        replayed=967,
        pending=33,
        p50_time_to_dlq_ms=17_140_000.0,
    )
    verdict = group_verdict(scenario, group, summary, _load(0, 0), _instances(range(0), 0))
    first, second, third = verdict.lines[:3]
    assert first == (
        "9,000 of 10,000 committed, 967 dead-lettered after 17 deliveries each "
        "(p50 4h45m40s after publish), 967 replayed, 0 left, 33 pending at the horizon (6h)"
    )
    assert second == "p99 time to commit 30m44s (of the committed only)"
    assert third == "nothing waited for a thread"
    assert verdict.lines[3] == "never saturated: at most 5 of an instance's 20 threads busy"


def test_every_group_of_the_summary_gets_a_verdict_in_scenario_order():
    scenario = load_scenario("conf/retry-storm.yaml")
    names = [group.name for group in scenario.groups]
    summary = pd.DataFrame([_summary(group=name) for name in reversed(names)])
    empty = _instances(range(0), 0).iloc[:0]
    found = verdicts(scenario, summary, _load(0, 0).iloc[:0], empty)
    assert [verdict.group for verdict in found] == names


@pytest.mark.spark
def test_json_prints_the_verdict_and_the_run_figures_on_stdout(
    spark, tmp_path, capsys, monkeypatch
):
    """``simulate --json``: stdout is one JSON document (progress goes to stderr) whose
    figures are the run's summary row and whose verdict is the console's."""
    monkeypatch.setattr(simulate_cli, "stop_session", lambda _spark: None)  # the tests' session
    code = main(
        ["simulate", "--json", "--quiet", "--no-report", "--output", str(tmp_path),
         "--set", "groups.0.workload.messages=2000", "--set", "groups.0.max_reconsume_times=3",
         "--set", "groups.0.behavior.poison_fraction=0.01"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0
    (run,) = json.loads(out)["runs"]
    assert "finished in" in err and "verdict: " in err
    summary = read_table(spark, str(tmp_path), "summary").where(f"run_id = '{run['run_id']}'")
    (row,) = summary.collect()
    (group,) = run["groups"]
    for key in ("messages", "deliveries", "commits", "dlq", "pending", "max_ready_backlog"):
        assert group["figures"][key] == row[key], key
    assert group["figures"]["deliveries_per_dead_letter"] == 4
    said = next(line for line in err.splitlines() if "verdict: " in line)
    assert said.split("verdict: ", 1)[1] == "; ".join(group["verdict"])
