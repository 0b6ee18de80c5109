"""Per-instance output end to end: the traps a 4.x topology sets, as a user sees them.

More instances than queues leaves the extra ones idle and changes nothing else; a retry
storm lands on the instance holding the one retry queue, and the same scenario on
rocketmq5.push spreads it; instance_load adds up to load, also when the last bucket runs past
the horizon.
"""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import functions as F

from retrysim import simulate
from retrysim.scenario.loading import build_scenario

SAME = ["deliveries", "commits", "max_ready_backlog", "p99_time_to_commit_ms", "pending"]


def billing(instances: int) -> dict:
    return {
        "name": "idle",
        "seed": 3,
        "horizon": "30m",
        "load_bucket": "1m",
        "groups": [
            {
                "name": "billing",
                "flavor": "rocketmq4.concurrently",
                "consumers": {"instances": instances, "threads": 2},
                "workload": {"messages": 1500, "over": "1m", "queues": 4},
                "behavior": {"fail_probability": 0.02, "processing_time": "400ms"},
            }
        ],
    }


def storm(flavor: str) -> dict:
    return {
        "name": "storm",
        "seed": 4,
        "horizon": "40m",
        "groups": [
            {
                "name": "orders",
                "flavor": flavor,
                "consumers": {"instances": 4, "threads": 2},
                "workload": {"messages": 2000, "over": "5m", "queues": 8},
                "behavior": {
                    "processing_time": "100ms",
                    "outages": [
                        {"start": "1m", "end": "3m", "fail_probability": 0.6,
                         "processing_time": "400ms"}
                    ],
                },
            }
        ],
    }  # fmt: skip


def run(spark, tmp_path, scenario: dict, name: str):
    return simulate(spark, build_scenario(scenario), output=str(tmp_path / name), run_id=name)


def test_instances_beyond_the_queues_idle_and_change_nothing(spark, tmp_path):
    four, eight = (
        run(spark, tmp_path, billing(4), "four"),
        run(spark, tmp_path, billing(8), "eight"),
    )
    summary = {r.run_id: r for r in (four.summary.first(), eight.summary.first())}
    assert summary["four"]["idle_instances"] == 0 and summary["eight"]["idle_instances"] == 4
    assert summary["four"]["max_ready_backlog"] > 100  # 4 x 2 threads fall behind
    assert [summary["eight"][c] for c in SAME] == [summary["four"][c] for c in SAME]
    columns = ["msg_id", "delivery", "start_ms", "end_ms", "consumer_instance"]
    assert_df_equality(
        eight.attempts.select(*columns), four.attempts.select(*columns), ignore_row_order=True
    )
    # the idle instances get no instance_load rows: rebalance gave them no queue
    assert {r[0] for r in eight.table("instance_load").select("consumer_instance").collect()} == {
        0, 1, 2, 3
    }  # fmt: skip


def _work(result) -> dict[int, int]:
    rows = result.table("instance_load").groupBy("consumer_instance").agg(F.sum("deliveries"))
    return dict(rows.collect())


def test_a_retry_storm_lands_on_the_retry_queue_instance_and_5x_spreads_it(spark, tmp_path):
    four = run(spark, tmp_path, storm("rocketmq4.concurrently"), "storm4")
    retries = four.attempts.where(F.col("source_topic") == "%RETRY%orders")
    assert retries.count() > 500
    assert {r[0] for r in retries.select("consumer_instance").distinct().collect()} == {0}
    summary = four.summary.first()
    assert summary["busiest_instance"] == 0
    assert summary["busiest_instance_utilization"] == 1.0 > summary["peak_utilization"]
    work = _work(four)
    assert work[0] > 1.5 * max(work[i] for i in (1, 2, 3))

    five = run(spark, tmp_path, storm("rocketmq5.push"), "storm5")
    work = _work(five)
    assert max(work.values()) < 1.1 * min(work.values())
    assert five.summary.first()["max_ready_backlog"] < summary["max_ready_backlog"]


def test_instance_load_adds_up_to_load_past_the_horizon(spark, tmp_path):
    """Requests still running when a 90 s horizon cuts the 1-min bucket: both tables count
    their threads until they end (validation holds them equal)."""
    scenario = {
        "name": "cut",
        "horizon": "90s",
        "load_bucket": "1m",
        "groups": [
            {
                "name": "g",
                "flavor": "rocketmq5.push",
                "consumers": {"instances": 3, "threads": 1},
                "workload": {"messages": 12, "over": "85s", "queues": 3},
                "behavior": {"processing_time": "20s"},
            }
        ],
    }
    result = run(spark, tmp_path, scenario, "cut")
    load = result.load.agg(F.sum("busy_thread_ms"), F.sum("deliveries")).first()
    instances = result.table("instance_load").agg(F.sum("busy_thread_ms"), F.sum("deliveries"))
    assert tuple(instances.first()) == tuple(load)
    assert result.attempts.where(F.col("result_state") == "Inflight").count() > 0
