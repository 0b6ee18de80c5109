"""Finite consumer capacity against the exact discrete-event reference, through the planning
outputs: the engine's ``summary`` and ``load`` tables against the same figures computed here
from the rows of the independent reference simulator (tests/reference/simulator.py).

Four small scenarios, one group each, simulated in one Spark run (groups never share
consumers, so each group is its own scenario):

* ``steady``: a pool with room to spare -- the round engine, whose answer equals a finite
  pool's only while the pool is never full (retrysim/engine/capacity.py); the check must say so;
* ``burst``: a flash-sale overload -- orders arrive about twice as fast as the pool takes them,
  so time in Ready comes from queueing for a thread, with retries competing for the same
  threads;
* ``storm``: a downstream outage whose calls hang for 2 s -- the retry storm fills the pool,
  messages dead-letter, and the backlog drains after the outage;
* ``orderly``: rocketmq4.orderly with poison messages blocking their queues (head-of-line),
  the last ones still at the horizon, and fewer threads than queues, so lanes also wait for
  threads.

What is compared, per group: the time to commit at p50, p95 and p99, the DLQ count (with
messages, deliveries, commits and pending), and per load bucket the Ready backlog, the
WaitingRetry backlog, Inflight, the age of the oldest Ready message and the busy thread time
(consumer utilization). The reference side is computed from first principles: a message's
state at a bucket's end ``t`` is the state of its last transition before ``t`` (a Ready
message's age is ``t`` minus that transition's moment); a time to commit is the Commit moment
minus the publish time; the busy time is each request's ``[start, start + processing_ms)``
clipped to the bucket.

Tolerance: **zero** for every count and series value, and 1e-6 ms for the percentiles.
Both sides are exact simulations of the same rules (docs/model.md §5: first come first
served by ``(eligible_ms, msg_id, delivery)``, a thread held for the whole processing time,
the event order within a millisecond) on integer milliseconds with the same hash-based draws,
so there is no sampling or discretisation error to allow for. One message served out of
turn changes a time to commit and, when the change crosses a bucket's end, a backlog by 1;
any positive tolerance would hide exactly that kind of bug. (Serving last come first served
in the reference instead changes the burst's and the storm's figures; and this comparison
caught messages still Ready at the horizon missing from the engine's oldest Ready age.)
The percentiles are doubles: Spark's
exact ``percentile`` interpolates linearly between two integer samples, so its value differs
from the exact rational interpolation computed here only by the rounding of one double
multiplication (below 1e-8 ms for times under a day).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from fractions import Fraction

import pytest
from reference.simulator import simulate_scenario

from retrysim import simulate
from retrysim.scenario.loading import build_scenario

BUCKET_MS = 10_000
HORIZON_MS = 1_800_000
PERCENTILES = (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"))
PERCENTILE_TOLERANCE_MS = 1e-6
LOGNORMAL = {"dist": "lognormal", "mean": "50ms", "p99": "400ms"}
GROUPS = [
    {  # 400 messages over 20 min, ~50 ms each: a few requests at once on 8 threads
        "name": "steady",
        "flavor": "rocketmq4.concurrently",
        "max_reconsume_times": 3,
        "consumers": {"instances": 2, "threads": 4},
        "workload": {"messages": 400, "over": "20m", "queues": 4, "arrival": "poisson"},
        "behavior": {
            "fail_probability": 0.1,
            "poison_fraction": 0.01,
            "processing_time": LOGNORMAL,
        },
    },
    {  # 400 orders in 10 s (40/s) on 2 threads at ~100 ms (~20/s), 5 % retried
        "name": "burst",
        "flavor": "rocketmq4.concurrently",
        "consumers": {"instances": 1, "threads": 2},
        "workload": {"messages": 400, "over": "10s", "queues": 8, "arrival": "poisson"},
        "behavior": {
            "fail_probability": 0.05,
            "processing_time": {"dist": "lognormal", "mean": "100ms", "p99": "400ms"},
        },
    },
    {  # 600 messages over 20 min (0.5/s); from 5 to 12 min every call fails after 2 s,
        # so 2 threads take at most 1 delivery/s while first deliveries and retries pile up
        "name": "storm",
        "flavor": "rocketmq4.concurrently",
        "max_reconsume_times": 4,
        "consumers": {"instances": 1, "threads": 2},
        "workload": {"messages": 600, "over": "20m", "queues": 4},
        "behavior": {
            "fail_probability": 0.01,
            "processing_time": LOGNORMAL,
            "outages": [
                {"start": "5m", "end": "12m", "fail_probability": 1.0, "processing_time": "2s"}
            ],
        },
    },
    {  # ordered queues; a poison message blocks its queue for 480 local retries 1 s apart
        # (8 min): early ones reach the DLQ, later ones still block at the horizon
        "name": "orderly",
        "flavor": "rocketmq4.orderly",
        "max_reconsume_times": 480,
        "suspend_current_queue_time": "1s",
        "consumers": {"instances": 1, "threads": 2},
        "workload": {"messages": 400, "over": "25m", "queues": 4},
        "behavior": {
            "fail_probability": 0.05,
            "poison_fraction": 0.01,
            "processing_time": {"dist": "exponential", "mean": "300ms"},
        },
    },
]
SCENARIO = {
    "name": "capacity-validation",
    "seed": 11,
    "horizon": "30m",
    "load_bucket": "10s",
    "groups": GROUPS,
}
NAMES = [g["name"] for g in GROUPS]
POOL = {g["name"]: g["consumers"]["instances"] * g["consumers"]["threads"] for g in GROUPS}
ENGINE = {"steady": "rounds", "burst": "sequential", "storm": "sequential", "orderly": "sequential"}
BUCKETS = HORIZON_MS // BUCKET_MS
SERIES = {"Ready": "ready_backlog", "WaitingRetry": "waiting_retry", "Inflight": "inflight"}


# --------------------------------------------------------------------------- the reference side


def _percentile(values: list[int], share: str) -> Fraction | None:
    """Exact linear interpolation between the closest ranks (Spark's ``percentile``)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * Fraction(share)
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def _expected(reference: dict[str, list[dict]], group: str) -> dict:
    born = {m["msg_id"]: m["born_ms"] for m in reference["messages"] if m["group"] == group}
    steps: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for t in reference["transitions"]:
        if t["group"] == group:
            steps[t["msg_id"]].append((t["seq"], t["at_ms"], t["state"]))
    final = {}
    series = {state: [0] * BUCKETS for state in SERIES}
    oldest = [0] * BUCKETS
    for msg_id, rows in steps.items():
        rows.sort()
        final[msg_id] = rows[-1][2]
        # The state at time t is the one of the last transition before t (by seq on ties).
        by_time = sorted(rows, key=lambda r: (r[1], r[0]))
        times = [at for _, at, _ in by_time]
        for b in range(BUCKETS):
            end = (b + 1) * BUCKET_MS
            index = bisect.bisect_left(times, end) - 1
            if index >= 0 and by_time[index][2] in series:
                series[by_time[index][2]][b] += 1
            if index >= 0 and by_time[index][2] == "Ready":
                oldest[b] = max(oldest[b], end - by_time[index][1])
    commits = [
        t["at_ms"] - born[t["msg_id"]]
        for t in reference["transitions"]
        if t["group"] == group and t["state"] == "Commit"
    ]
    busy = [0] * BUCKETS
    attempts = [a for a in reference["attempts"] if a["group"] == group]
    for a in attempts:
        if a["start_ms"] is None:
            continue
        start, stop = a["start_ms"], a["start_ms"] + a["processing_ms"]
        for b in range(start // BUCKET_MS, min(BUCKETS, -(-stop // BUCKET_MS))):
            busy[b] += max(0, min(stop, (b + 1) * BUCKET_MS) - max(start, b * BUCKET_MS))
    states = list(final.values())
    return {
        "messages": len(born),
        "deliveries": sum(a["start_ms"] is not None for a in attempts),
        "commits": states.count("Commit"),
        "dlq": states.count("DLQ"),
        "pending": len(born) - states.count("Commit") - states.count("DLQ"),
        "percentiles": {label: _percentile(commits, share) for label, share in PERCENTILES},
        "series": series,
        "oldest": oldest,
        "busy": busy,
        "waited": sum(a["start_ms"] is None or a["start_ms"] > a["ready_ms"] for a in attempts),
    }


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def engine(spark, tmp_path_factory):
    """One engine run of the four groups, its summary and load rows on the driver (these
    are aggregates: one row per group, and per group and bucket). The run's own invariant
    check is skipped: the reference below is the stronger check."""
    result = simulate(
        spark,
        build_scenario(SCENARIO),
        output=str(tmp_path_factory.mktemp("capacity")),
        run_id="capacity",
        validate=False,
    )
    summary = {row["group"]: row.asDict() for row in result.summary.collect()}
    load: dict[str, list[dict]] = defaultdict(list)
    for row in result.load.orderBy("group", "bucket_start_ms").collect():
        load[row["group"]].append(row.asDict())
    return summary, load


@pytest.fixture(scope="module")
def reference():
    tables = simulate_scenario(SCENARIO)
    return {name: _expected(tables, name) for name in NAMES}


# --------------------------------------------------------------------------- the comparisons


@pytest.mark.parametrize("group", NAMES)
def test_counts_dlq_and_time_to_commit_percentiles(engine, reference, group):
    summary, _ = engine
    row, expected = summary[group], reference[group]
    assert row["engine"] == ENGINE[group]
    for column in ("messages", "deliveries", "commits", "dlq", "pending"):
        assert row[column] == expected[column], column
    for label, _ in PERCENTILES:
        want = expected["percentiles"][label]
        got = row[f"{label}_time_to_commit_ms"]
        assert want is not None and got is not None, label
        assert abs(got - float(want)) <= PERCENTILE_TOLERANCE_MS, (label, got, float(want))


@pytest.mark.parametrize("group", NAMES)
def test_ready_and_waiting_retry_backlogs_per_bucket(engine, reference, group):
    summary, load = engine
    rows, expected = load[group], reference[group]
    assert [r["bucket_start_ms"] for r in rows] == [b * BUCKET_MS for b in range(BUCKETS)]
    for state, column in SERIES.items():
        got = [r[column] for r in rows]
        want = expected["series"][state]
        differ = [(b, got[b], want[b]) for b in range(BUCKETS) if got[b] != want[b]]
        assert not differ, f"{state} (bucket, engine, reference): {differ[:10]}"
    assert summary[group]["max_ready_backlog"] == max(expected["series"]["Ready"])
    assert summary[group]["max_waiting_retry"] == max(expected["series"]["WaitingRetry"])
    assert [r["oldest_ready_age_ms"] for r in rows] == expected["oldest"]
    busy = [r["busy_thread_ms"] for r in rows]
    assert busy == [float(ms) for ms in expected["busy"]]
    utilization = [r["utilization"] for r in rows]
    assert utilization == [ms / (POOL[group] * BUCKET_MS) for ms in expected["busy"]]


def test_the_scenarios_show_what_they_are_about(engine, reference):
    """Guards against a comparison that passes because nothing happens."""
    summary, load = engine
    # steady: the pool is never full, so nothing waits for a thread; some messages retry
    assert 0 < summary["steady"]["peak_utilization"] < 0.5
    assert reference["steady"]["waited"] == 0 and summary["steady"]["max_ready_backlog"] == 0
    assert summary["steady"]["dlq"] > 0 and summary["steady"]["max_waiting_retry"] > 0
    # burst: queueing -- a Ready backlog far above the pool, the pool busy all the time
    assert summary["burst"]["max_ready_backlog"] > 20 * POOL["burst"]
    assert summary["burst"]["peak_utilization"] == pytest.approx(1.0)
    assert summary["burst"]["p99_time_to_commit_ms"] > 5_000
    # storm: the outage fills the pool, retries outnumber first deliveries, messages
    # dead-letter, and the backlogs drain after the outage
    storm = load["storm"]
    outage = [r for r in storm if 5 * 60_000 <= r["bucket_start_ms"] < 12 * 60_000]
    assert max(r["utilization"] for r in outage) == pytest.approx(1.0)
    assert sum(r["retries"] for r in outage) > sum(r["first_deliveries"] for r in outage)
    assert summary["storm"]["dlq"] > 0 and summary["storm"]["max_ready_backlog"] > 10
    assert storm[-1]["ready_backlog"] == storm[-1]["waiting_retry"] == 0
    # orderly: poison messages block their queues; the messages behind them wait in Ready,
    # some of them still at the horizon
    assert summary["orderly"]["dlq"] > 0 and summary["orderly"]["pending"] > 0
    assert load["orderly"][-1]["ready_backlog"] > 0
    assert summary["orderly"]["max_ready_backlog"] > 10 and reference["orderly"]["waited"] > 0
    assert load["orderly"][-1]["oldest_ready_age_ms"] > 60_000
