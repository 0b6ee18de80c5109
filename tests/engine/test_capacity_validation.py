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
(consumer utilization), each at the bucket's end and at its largest within the bucket, and
the run's peaks in the summary. The reference side is computed from first principles: a
message's state at a bucket's end ``t`` is the state of its last transition before ``t`` (a
Ready message's age is ``t`` minus that transition's moment); during a millisecond ``m`` it
is the state of its last transition at or before ``m``, so a gauge's largest value in a
bucket is found by walking every moment a message changes state; the oldest Ready age peaks
where a Ready spell ends or the bucket does; a time to commit is the Commit moment minus the
publish time; the busy time is each request's ``[start, start + processing_ms)`` clipped to
the bucket, and the threads busy at once are counted over the same intervals.

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
from retrysim.engine.capacity import CERTAINLY_FULL, offered_load
from retrysim.model.policy import policy_for
from retrysim.scenario.loading import build_scenario

BUCKET_MS = 10_000
HORIZON_MS = 1_800_000
PERCENTILES = (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99"))
# The distribution the summary keeps (time_to_commit_quantiles_ms), written out here: every
# 5 %, then 99 %, 99.9 % and the largest.
QUANTILE_SHARES = (*(f"{step}/20" for step in range(20)), "0.99", "0.999", "1")
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
    busy_at: dict[int, int] = defaultdict(int)
    for a in attempts:
        if a["start_ms"] is not None and a["processing_ms"] > 0:
            busy_at[a["start_ms"]] += 1
            busy_at[a["start_ms"] + a["processing_ms"]] -= 1
    states = list(final.values())
    return {
        "messages": len(born),
        "deliveries": sum(a["start_ms"] is not None for a in attempts),
        "commits": states.count("Commit"),
        "dlq": states.count("DLQ"),
        "pending": len(born) - states.count("Commit") - states.count("DLQ"),
        "percentiles": {label: _percentile(commits, share) for label, share in PERCENTILES},
        "quantiles": [_percentile(commits, share) for share in QUANTILE_SHARES],
        "series": series,
        "oldest": oldest,
        "busy": busy,
        "maxima": {state: _bucket_maxima(_state_changes(steps, state)) for state in SERIES},
        "oldest_max": _oldest_ready_maxima(steps),
        "threads_max": _bucket_maxima(busy_at),
        "per_second": _per_second(attempts),
        "waited": sum(a["start_ms"] is None or a["start_ms"] > a["ready_ms"] for a in attempts),
    }


def _spells(rows: list[tuple[int, int, str]]) -> list[tuple[str, int, int]]:
    """A message's states as (state, from, until) over whole milliseconds: the state of its
    last transition at each moment holds until its next moment (or the horizon)."""
    last_at: dict[int, str] = {}
    for _, at, state in sorted(rows, key=lambda r: (r[1], r[0])):
        last_at[at] = state
    moments = sorted(last_at)
    ends = [*moments[1:], HORIZON_MS]
    return [(last_at[m], m, end) for m, end in zip(moments, ends, strict=True) if m < end]


def _state_changes(steps: dict[int, list], state: str) -> dict[int, int]:
    changes: dict[int, int] = defaultdict(int)
    for rows in steps.values():
        for name, start, end in _spells(rows):
            if name == state:
                changes[start] += 1
                changes[end] -= 1
    return changes


def _bucket_maxima(changes: dict[int, int]) -> list[int]:
    """The largest value in each bucket of a count that changes by ``changes[m]`` at ``m``:
    the value it enters the bucket with holds until the bucket's first change."""
    maxima, value, moments = [], 0, sorted(changes)
    i = 0
    for b in range(BUCKETS):
        lo, hi = b * BUCKET_MS, (b + 1) * BUCKET_MS
        best = value if i == len(moments) or moments[i] > lo else None
        while i < len(moments) and moments[i] < hi:
            value += changes[moments[i]]
            best = value if best is None else max(best, value)
            i += 1
        maxima.append(best)
    return maxima


def _oldest_ready_maxima(steps: dict[int, list]) -> list[int]:
    """Per bucket, the oldest Ready message's largest age: a Ready spell ``[a, e)`` that
    overlaps the bucket ``[lo, hi)`` is ``min(e, hi) - a`` old at its oldest in it."""
    maxima = [0] * BUCKETS
    for rows in steps.values():
        for name, start, end in _spells(rows):
            if name != "Ready":
                continue
            for b in range(start // BUCKET_MS, -(-end // BUCKET_MS)):
                hi = (b + 1) * BUCKET_MS
                maxima[b] = max(maxima[b], min(end, hi) - start)
    return maxima


def _per_second(attempts: list[dict]) -> dict[str, int]:
    deliveries: dict[int, int] = defaultdict(int)
    retries: dict[int, int] = defaultdict(int)
    for a in attempts:
        if a["start_ms"] is not None:
            deliveries[a["start_ms"] // 1000] += 1
            retries[a["start_ms"] // 1000] += a["delivery"] > 1
    return {"deliveries": max(deliveries.values()), "retries": max(retries.values())}


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
        small_group=0,  # rounds first and the capacity check after, as for large groups
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
    got = list(row["time_to_commit_quantiles_ms"])
    assert len(got) == len(expected["quantiles"])
    for share, value, want in zip(QUANTILE_SHARES, got, expected["quantiles"], strict=True):
        assert abs(value - float(want)) <= PERCENTILE_TOLERANCE_MS, (share, value, float(want))


@pytest.mark.parametrize("group", NAMES)
def test_ready_and_waiting_retry_backlogs_per_bucket(engine, reference, group):
    _, load = engine
    rows, expected = load[group], reference[group]
    assert [r["bucket_start_ms"] for r in rows] == [b * BUCKET_MS for b in range(BUCKETS)]
    for state, column in SERIES.items():
        got = [r[column] for r in rows]
        want = expected["series"][state]
        differ = [(b, got[b], want[b]) for b in range(BUCKETS) if got[b] != want[b]]
        assert not differ, f"{state} (bucket, engine, reference): {differ[:10]}"
    assert [r["oldest_ready_age_ms"] for r in rows] == expected["oldest"]
    busy = [r["busy_thread_ms"] for r in rows]
    assert busy == [float(ms) for ms in expected["busy"]]
    utilization = [r["utilization"] for r in rows]
    assert utilization == [ms / (POOL[group] * BUCKET_MS) for ms in expected["busy"]]


MAXIMA = {"Ready": "ready_backlog_max", "WaitingRetry": "waiting_retry_max",
          "Inflight": "inflight_max"}  # fmt: skip


@pytest.mark.parametrize("group", NAMES)
def test_exact_peaks_within_buckets_and_over_the_run(engine, reference, group):
    summary, load = engine
    rows, expected, row = load[group], reference[group], summary[group]
    for state, column in MAXIMA.items():
        got, want = [r[column] for r in rows], expected["maxima"][state]
        differ = [(b, got[b], want[b]) for b in range(BUCKETS) if got[b] != want[b]]
        assert not differ, f"{state} max (bucket, engine, reference): {differ[:10]}"
    assert [r["oldest_ready_age_ms_max"] for r in rows] == expected["oldest_max"]
    assert [r["utilization_max"] for r in rows] == [
        n / POOL[group] for n in expected["threads_max"]
    ]
    assert row["max_ready_backlog"] == max(expected["maxima"]["Ready"])
    assert row["max_waiting_retry"] == max(expected["maxima"]["WaitingRetry"])
    assert row["max_inflight"] == max(expected["maxima"]["Inflight"])
    assert row["max_oldest_ready_age_ms"] == max(expected["oldest_max"])
    assert row["peak_utilization"] == max(expected["threads_max"]) / POOL[group]
    assert row["peak_deliveries_per_s"] == expected["per_second"]["deliveries"]
    assert row["peak_retries_per_s"] == expected["per_second"]["retries"]
    if group != "orderly":  # 4.x concurrent retries wait in the schedule topic, nowhere else
        assert row["max_schedule_backlog"] == row["max_waiting_retry"]


def test_peaks_inside_buckets_are_what_bucket_ends_miss(engine, reference):
    """The burst's Ready backlog peaks between two bucket ends: the bucket-end samples
    report less than its true peak, which the summary and the plan's targets read."""
    summary, load = engine
    ends = max(r["ready_backlog"] for r in load["burst"])
    assert summary["burst"]["max_ready_backlog"] > ends
    assert all(r["ready_backlog_max"] >= r["ready_backlog"] for g in NAMES for r in load[g])


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
    assert summary["orderly"]["pending"] > 0
    # its exhausted poison messages are re-sent at level 3 + 480 (clamped: 18, 2 h), so on a
    # 4.9.7 broker their dead letters are still in the schedule topic at 30 min
    assert summary["orderly"]["dlq"] == 0 < summary["orderly"]["max_schedule_backlog"]
    assert load["orderly"][-1]["ready_backlog"] > 0
    assert summary["orderly"]["max_ready_backlog"] > 10 and reference["orderly"]["waited"] > 0
    assert load["orderly"][-1]["oldest_ready_age_ms"] > 60_000


def test_a_pool_the_scenario_shows_full_skips_the_round_run():
    """Decided from the scenario alone: the burst offers its 2 threads about twice their
    time in first deliveries (400 x 100 ms in 10 s); the storm's pool fills only in its
    outage, which the check after the round run finds; an unlimited pool never fills."""
    scenario = build_scenario(SCENARIO)
    table = scenario.broker.message_delay_level
    load = {g.name: offered_load(g, policy_for(g, table).topology) for g in scenario.groups}
    assert load["burst"] == pytest.approx(400 * 100 / 10_000 / 2)
    assert load["burst"] >= CERTAINLY_FULL > load["storm"]
    assert load["steady"] == pytest.approx(0.5 * 400 * 50 / 1_200_000 / 4)  # 2 of 4 queues
    unlimited = build_scenario({**SCENARIO, "groups": [{**GROUPS[1], "consumers": "unlimited"}]})
    group = unlimited.groups[0]
    assert offered_load(group, policy_for(group, table).topology) is None
