"""The compiled event loop against the independent reference, row for row, without Spark.

The reference (tests/reference/simulator.py) was written from docs/model.md and the RocketMQ
source, never from the loop. Here the loop's staged rows of each group, and the transitions
the task derives from them, must be the reference's on random scenarios of every flavor
(replays, batches, ordered queues and a downstream among them), on a pool that stays full,
on an unlimited pool, on ordered queues and batches waiting for threads, and on 4.x
cleaner runs that find more than 16 of a queue expired. The rest holds the loop's own
contracts: chunks, progress, units and publish order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml
from compiled_rules import reconsume_of
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reference.simulator import simulate_scenario
from reference.strategies import scenarios
from support import staged_frame

from retrysim.engine.event_key import Heartbeat, as_batch, read_heartbeats, simulate_key, units_of
from retrysim.engine.event_rows import _publish_order
from retrysim.engine.event_rules import CHUNK_ROWS
from retrysim.engine.event_stage import MOST_OUTPUT_PARTS, in_units
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.model.workload import messages_np
from retrysim.scenario.loading import build_scenario
from retrysim.tables.commitlog_writes import pops_of
from retrysim.tables.key_peaks import GroupSummer
from retrysim.tables.message_tables import ARROW, transitions_of
from retrysim.tables.schemas import DERIVATION_COLUMNS, ROUTING_COLUMNS, STAGE, STAGE_ARROW

KEY = ["msg_id", "delivery"]
# The attempts columns the reference gives: the staged ones but the derivations (held through
# the transitions) and the routing the loop carries to a message's next delivery.
REFERENCE_ATTEMPTS = [
    name
    for name in STAGE.fieldNames()
    if name not in DERIVATION_COLUMNS and (name == "born_ms" or name not in ROUTING_COLUMNS)
]
TABLES = {
    "attempts": (REFERENCE_ATTEMPTS, ["group", *KEY]),
    "transitions": (ARROW["transitions"].names, ["group", "msg_id", "seq"]),
}


def _records(rows: list[dict], columns: list[str], key: list[str]) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=columns, dtype=object)
    return table.sort_values(key, ignore_index=True) if len(table) else table


def loop_rows_are_the_references(data: dict) -> pd.DataFrame:
    """Every group of scenario ``data`` through the compiled loop, on the messages the run
    makes: its attempts and their transitions equal the reference's. The loop's rows."""
    config = build_scenario(data)
    staged = pa.Table.from_batches(
        [
            batch
            for spec in key_specs(config, group_plans(config))
            for batch in simulate_key(spec, *messages_np(spec.workload, spec.group, spec.seed))
        ],
        schema=STAGE_ARROW,
    )
    mine = {
        "attempts": staged.select(REFERENCE_ATTEMPTS).to_pylist(),
        "transitions": [
            row for batch in staged.to_batches() for row in transitions_of(batch).to_pylist()
        ],
    }
    expected = simulate_scenario(data)
    for table, (columns, key) in TABLES.items():
        pd.testing.assert_frame_equal(
            _records(mine[table], columns, key), _records(expected[table], columns, key),
            obj=table,
        )  # fmt: skip
    return staged_frame(staged.to_batches())


def messages(spec, count: int, span_ms: int, seed: int):
    draws = np.random.default_rng(seed)
    msg_ids = np.arange(count, dtype=np.int64) * 7 + 3
    queue_ids = draws.integers(0, spec.policy.topology.queues, count).astype(np.int64)
    born = np.sort(draws.integers(0, max(span_ms, 1), count)).astype(np.int64)
    return msg_ids, queue_ids, born


# retries due at one moment into a full 5.x cache: the lowest (msg_id, delivery) first
TIED_RETRIES = {
    "name": "tied", "seed": 0, "horizon": "1m",
    "broker": {"message_delay_level": "1s 2s 5s 10s"},
    "groups": [{
        "name": "g1", "flavor": "rocketmq5.push", "max_cache_message_count": 2,
        "workload": {"messages": 29, "over": "10s", "arrival": "poisson", "queues": 1},
        "consumers": {"instances": 1, "threads": 1},
        "behavior": {"fail_first": 2, "processing_time": 0,
                     "outcome_mix": {"reconsume_later": 1, "exception": 1, "null_return": 1}},
    }],
}  # fmt: skip


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(groups=2, max_messages=40))
@example(data=TIED_RETRIES)
def test_the_compiled_loop_gives_the_references_rows(data):
    loop_rows_are_the_references(data)


SATURATED = {
    "name": "full-pool", "seed": 3, "horizon": "140s",
    "broker": {"message_delay_level": "1s 5s 10s 30s 1m"},
    "groups": [{
        "name": "busy", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 1,
        "consumers": {"instances": 3, "threads": 2}, "retry_queue_nums": 2,
        "pull_interval": "100ms", "consume_timeout": "1s",
        # a 5.1 client: a 4.9 client's late send-back runs a group whole (no units)
        "client_version": "5.1",
        "workload": {"messages": 6000, "over": "2m", "queues": 4},
        "behavior": {"fail_probability": 0.2, "poison_fraction": 0.01,
                     "processing_time": {"dist": "lognormal", "mean": "80ms", "p99": "900ms"},
                     "outages": [{"start": "30s", "end": "1m", "fail_probability": 0.9,
                                  "processing_time": "300ms"}],
                     "send_back_failure_probability": 0.1,
                     "send_back_fallback_probability": 0.1},
    }],
}  # fmt: skip


def with_group(**changes) -> dict:
    """SATURATED with its group changed (client_version only where the flavor reads it)."""
    group = {**SATURATED["groups"][0], **changes}
    if group["flavor"] != "rocketmq4.concurrently":
        del group["client_version"]
    return {**SATURATED, "groups": [group]}


def test_a_pool_that_stays_full_gives_the_references_rows():
    """Thousands waiting for six threads: first deliveries queue behind retries, timeouts,
    failed send-backs and the producer fallback, on three instances by queue."""
    rows = loop_rows_are_the_references(SATURATED)
    waited = rows["start_ms"] - rows["ready_ms"]
    assert waited.max() > 30_000  # the pool was full: half a minute and more in Ready
    assert set(rows["end_reason"].dropna()) >= {
        "TIMEOUT", "send_back_failed", "send_back_fallback", "max_reconsume_times",
    }  # fmt: skip
    assert (rows["result_state"] == "Ready").any()  # still waiting at the horizon


def test_a_small_cache_per_queue_gives_the_references_rows():
    """A 4.x client that caches 50 messages a queue (pullThresholdForQueue): what its
    queues hold beyond that waits on the broker, so a retry due on %RETRY% overtakes first
    deliveries that a bigger cache would have taken before it."""
    small = loop_rows_are_the_references(with_group(pull_threshold_for_queue=50))
    big = loop_rows_are_the_references(with_group(pull_threshold_for_queue=65_535))
    key = ["msg_id", "delivery"]
    both = small.merge(big, on=key, suffixes=("_small", "_big"))
    started = both.dropna(subset=["start_ms_small", "start_ms_big"])
    retries = started[started["delivery"] > 1]
    firsts = started[started["delivery"] == 1]
    assert (retries["start_ms_small"] < retries["start_ms_big"]).mean() > 0.5
    assert (firsts["start_ms_small"] > firsts["start_ms_big"]).any()


SWEEP = Path(__file__).parents[2] / "conf" / "conformance" / "sweep-4x.yaml"


def test_a_cleaner_run_sends_back_at_most_16_of_a_queue():
    """conf/conformance/sweep-4x.yaml: all 40 deliveries of one queue are expired at the 4.x
    cleaner's run at 120 s; it sends back the 16 at the head of the queue, and the other 24
    return at 125 to 129 s and commit. In batches of 3 on 14 threads: the 14 that started
    alone are sent back at 120 s; the other 26 start in batches as those threads free and
    run 375 s, and the run at 240 s sends back 16 of them, the other 10 waiting past the
    horizon for the next run."""
    data = yaml.safe_load(SWEEP.read_text())
    firsts = loop_rows_are_the_references(data).query("delivery == 1").sort_values("msg_id")
    swept = firsts[firsts["outcome"] == "TIMEOUT"]
    assert list(swept["msg_id"]) == list(firsts["msg_id"][:16])
    assert set(swept["end_ms"]) == {120_000}
    assert (firsts["result_state"] == "Commit").sum() == 24
    group = {**data["groups"][0], "consume_message_batch_max_size": 3,
             "consumers": {"instances": 1, "threads": 14}}  # fmt: skip
    rows = loop_rows_are_the_references({**data, "groups": [group]}).query("delivery == 1")
    assert rows.groupby("end_ms").size().to_dict() == {120_000: 14, 240_000: 16}
    assert rows["end_ms"].isna().sum() == 10 and (rows["batch_size"] > 1).sum() == 26


@st.composite
def crowded_cleaner_runs(draw) -> dict:
    """Random 4.x scenarios (every other key as the reference's strategies draw it) whose
    cleaner runs find more than 16 of a queue expired: many threads or an unlimited pool,
    messages arriving together on one or two queues, listeners past a short timeout."""
    cleaned = ("rocketmq4.concurrently", "rocketmq4.broadcasting")
    data = draw(
        scenarios(groups=1, max_messages=60).filter(lambda d: d["groups"][0]["flavor"] in cleaned)
    )
    group = data["groups"][0]
    group.pop("consume_timeout_check", None)  # the 4.x default: periodic
    group["consume_timeout"] = draw(st.sampled_from(["1s", "10s"]))
    group["consumers"] = draw(
        st.sampled_from(
            ["unlimited", {"instances": 1, "threads": 24}, {"instances": 2, "threads": 20}]
        )
    )
    group["workload"] = {
        **group["workload"],
        "messages": draw(st.integers(17, 60)),
        "over": draw(st.sampled_from(["1ms", "2s"])),
        "queues": draw(st.integers(1, 2)),
    }
    group["brokers"] = 1
    group["behavior"]["processing_time"] = draw(
        st.sampled_from(["5s", "25s", {"dist": "exponential", "mean": "20s"}])
    )
    return data  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(crowded_cleaner_runs())
def test_crowded_cleaner_runs_give_the_references_rows(data):
    """The cleaner's limit (docs/model.md §3) on random 4.x groups, with the failures, the
    send-backs, batches, downstreams and replays the reference's strategies draw: the
    loop's per-lane count and the reference's own cleaner give the same rows."""
    loop_rows_are_the_references(data)


SATURATED_5X = {
    "name": "full-pool-5x", "seed": 5, "horizon": "80s",
    "groups": [{
        "name": "busy", "flavor": "rocketmq5.push", "max_reconsume_times": 2,
        "retry_policy": {"kind": "customized", "intervals": ["5s", "10s", "20s"]},
        "consumers": {"instances": 2, "threads": 3},
        "workload": {"messages": 9000, "over": "1m", "queues": 4},
        "behavior": {"fail_probability": 0.2, "poison_fraction": 0.01,
                     "processing_time": {"dist": "lognormal", "mean": "50ms", "p99": "400ms"}},
        "replay": {"at": "62s", "rate": 40},
    }],
}  # fmt: skip


def with_5x_cache(count: int) -> dict:
    group = {**SATURATED_5X["groups"][0], "max_cache_message_count": count}
    return {**SATURATED_5X, "groups": [group]}


def test_a_5x_cache_gives_the_references_rows():
    """A 5.x push client caching 100 messages an instance, under a backlog: it receives 32 at
    a time while it has room, one pop in five reading the retry topic first, and a second
    after it finds the cache full. So a retry waits behind a cache and a receive, not the
    backlog; and a cache of 20 starves instances that consume 60 a second, each waiting a
    second for its next receive."""
    small = loop_rows_are_the_references(with_5x_cache(100))
    big = loop_rows_are_the_references(with_5x_cache(65_535))
    both = small.merge(big, on=["msg_id", "delivery"], suffixes=("_small", "_big"))
    started = both.dropna(subset=["start_ms_small", "start_ms_big"])
    retries = started[started["delivery"] > 1]
    assert (retries["start_ms_small"] < retries["start_ms_big"]).mean() > 0.5
    assert (small["result_state"] == "Ready").any()  # waiting on the broker at the horizon
    assert (small["ready_reason"] == "replayed").any()
    starved = loop_rows_are_the_references(with_5x_cache(20))
    assert starved["start_ms"].count() < 0.8 * big["start_ms"].count()


def test_a_5x_simple_consumer_pops_a_retry_ahead_of_the_backlog():
    """A 5.x simple consumer under a backlog: each thread pops one message when it frees,
    and one pop in five reads the retry topic first, so a retry overtakes first deliveries
    that were Ready before it; the loop's rows are the reference's."""
    group = {**SATURATED_5X["groups"][0], "flavor": "rocketmq5.simple",
             "invisible_duration": "10s"}  # fmt: skip
    del group["retry_policy"]
    rows = loop_rows_are_the_references({**SATURATED_5X, "groups": [group]})
    started = rows.dropna(subset=["start_ms"])
    firsts = started[started["delivery"] == 1].sort_values("ready_ms")
    retries = started[started["delivery"] > 1]
    # the latest start of a first delivery Ready before each retry
    latest = firsts["start_ms"].cummax().to_numpy()
    before = np.searchsorted(firsts["ready_ms"].to_numpy(), retries["ready_ms"].to_numpy()) - 1
    overtook = (before >= 0) & (latest[np.maximum(before, 0)] > retries["start_ms"].to_numpy())
    assert overtook.mean() > 0.5


def test_an_unlimited_pool_gives_the_references_rows():
    rows = loop_rows_are_the_references(with_group(consumers="unlimited"))
    waited = rows["start_ms"] - rows["ready_ms"]
    assert waited.max() < 100  # never more than to the next pull tick


def test_a_replay_on_a_full_pool_gives_the_references_rows():
    """docs/model.md §8: the dead letters re-sent at the replay's rate, into queues whose
    pool is still full, some of them fixed."""
    replay = {"at": "70s", "rate": "20/s", "poison_fixed": True}
    rows = loop_rows_are_the_references(with_group(replay=replay, max_reconsume_times=0))
    replayed = rows[rows["ready_reason"] == "replayed"]
    assert len(replayed) > 50 and (replayed["start_ms"] > replayed["ready_ms"]).any()


_STORMY = {
    "fail_probability": 0.2, "poison_fraction": 0.01,
    "processing_time": {"dist": "lognormal", "mean": "80ms", "p99": "900ms"},
    "outages": [{"start": "30s", "end": "1m", "fail_probability": 0.9,
                 "processing_time": "300ms"}],
}  # fmt: skip


@pytest.mark.parametrize(
    "group",
    [
        {"flavor": "rocketmq4.orderly", "consumers": {"instances": 3, "threads": 1}},
        {"flavor": "rocketmq5.push", "ordered": True, "consumers": {"instances": 2, "threads": 1}},
        {
            "consume_message_batch_max_size": 4,
            "ack_index": 1,
            "consume_timeout": "1s",
            "pull_interval": "100ms",
            "retry_queue_nums": 2,
        },
    ],
    ids=["orderly", "ordered-5.x", "batches"],
)
def test_ordered_queues_and_batches_on_a_full_pool_give_the_references_rows(group):
    """The lanes' loop (ordered queues one message at a time, batches of one lane) on a
    pool that stays full: head-of-line blocking and batches waiting for threads."""
    data = {**SATURATED["groups"][0], "max_reconsume_times": 3, **group,
            "workload": {"messages": 3000, "over": "2m", "queues": 4}}  # fmt: skip
    if "flavor" in group:  # the 4.x concurrent options do not apply to ordered flavors
        data = {key: value for key, value in data.items()
                if key not in ("retry_queue_nums", "pull_interval", "consume_timeout",
                               "client_version")}  # fmt: skip
        data["behavior"] = _STORMY
    rows = loop_rows_are_the_references({**SATURATED, "groups": [data]})
    waited = rows["start_ms"] - rows["ready_ms"]
    assert waited.max() > 15_000  # the pool (or the ordered queue) held them back
    assert rows["batch_size"].max() == data.get("consume_message_batch_max_size", 1)


def test_a_turn_bigger_than_a_chunk_grows_the_loops_arrays_first():
    """On an unlimited pool every message born in the same pull tick starts in one turn: more
    rows than a chunk's buffer holds, more slots and events than the loop starts with. The
    loop grows them before the turn (it never replaces an array inside its turns)."""
    config = build_scenario(with_group(consumers="unlimited"))
    spec = key_specs(config, group_plans(config))[0]
    count = CHUNK_ROWS + 5_000
    msg_ids, queue_ids, _ = messages(spec, count, 1, seed=2)
    born = np.zeros(count, np.int64)
    rows = staged_frame(simulate_key(spec, msg_ids, queue_ids, born))
    first = rows[rows["delivery"] == 1]
    assert len(first) == count and first["msg_id"].is_unique
    assert first["start_ms"].nunique() == 1  # one turn started them all
    pd.testing.assert_frame_equal(rows, staged_frame(simulate_key(spec, msg_ids, queue_ids, born)))


def test_the_compiled_loop_reports_progress_and_its_end(tmp_path):
    config = build_scenario(SATURATED)
    spec = key_specs(config, group_plans(config))[0]
    heartbeat = Heartbeat(str(tmp_path), 5, spec.horizon_ms)
    rows = staged_frame(simulate_key(spec, *messages(spec, 600, 60_000, 2), heartbeat))
    (beat,) = read_heartbeats(str(tmp_path))
    assert beat == {"sim_ms": spec.horizon_ms, "horizon_ms": spec.horizon_ms,
                    "deliveries": int(rows["start_ms"].notna().sum()), "first": 600,
                    "messages": 600}  # fmt: skip


@pytest.mark.parametrize(
    "flavor",
    ["rocketmq4.concurrently", "rocketmq4.broadcasting", "rocketmq5.push", "rocketmq5.simple"],
)
def test_the_sums_read_the_loops_chunks_as_their_record_batches(flavor):
    """The stage's tasks sum a group up from the loop's chunks (its longs and string codes)
    and write only their own chunks as record batches: every sum equals the one read from
    the record batches, which are the rows the loop gives without chunks, over chunks that
    hold nulls, DLQ moves, timeouts and pops; a chunk read after the loop went on fails
    rather than reading the next rows."""
    group = {
        "name": "busy", "flavor": flavor,
        "max_reconsume_times": -1 if flavor == "rocketmq4.broadcasting" else 1,
        "consumers": {"instances": 3, "threads": 8}, "behavior": _STORMY,
        "workload": {"messages": 40_000, "over": "2m", "queues": 4},
    }  # fmt: skip
    config = build_scenario({**SATURATED, "horizon": "10m", "groups": [group]})
    spec = key_specs(config, group_plans(config))[0]
    summers = [
        GroupSummer(spec.group, spec.horizon_ms, spec.load_bucket_ms, True, pops_of(spec.policy))
        for _ in range(2)
    ]
    data = messages(spec, 40_000, 120_000, seed=6)
    chunks, batches = [], []
    for chunk in simulate_key(spec, *data, chunks=True):
        summers[0].add(chunk)
        batches.append(summers[1].add(as_batch(chunk)))
        chunks.append(chunk)
    assert len(chunks) > 1 and not isinstance(chunks[0], pa.RecordBatch)
    by_chunks, by_batches = (summer.finish() for summer in summers)
    assert by_chunks == by_batches and by_chunks.complete
    assert by_chunks.compact and by_chunks.gauges and by_chunks.instances
    assert pa.Table.from_batches(batches).equals(pa.Table.from_batches(simulate_key(spec, *data)))
    with pytest.raises(TypeError):
        chunks[0].longs("msg_id")


def _in_units(spec, msg_ids, queue_ids, born) -> pd.DataFrame:
    """A group's rows as its units give them: each instance without a retry queue alone,
    then the retry owners fed the retries those rows send them (next_frontier's rule, in
    pandas)."""
    topology = spec.policy.topology
    units = topology.units()

    def rows(unit, imports=None) -> pd.DataFrame:
        return staged_frame(
            simulate_key(spec, msg_ids, queue_ids, born, unit=unit, imports=imports)
        )

    first = pd.concat([rows((runs, units.retry_owners)) for runs in units.first])
    due = first[first["next_topic"].notna() & (first["next_ready_ms"] < spec.horizon_ms)]
    counts = [
        reconsume_of(spec.policy, rt, broker_rt, reason)
        for rt, broker_rt, reason in zip(
            due["reconsume_times"], due["broker_reconsume_times"], due["end_reason"], strict=True
        )
    ]
    sent = pd.DataFrame({
        "msg_id": due["msg_id"], "delivery": due["delivery"] + 1,
        "reconsume_times": [c[0] for c in counts], "broker_reconsume_times": [c[1] for c in counts],
        "source_topic": due["next_topic"], "queue_id": due["next_queue_id"],
        "ready_ms": due["next_ready_ms"], "ready_reason": due["next_reason"],
    })  # fmt: skip
    where = sent[["source_topic", "queue_id", "msg_id", "delivery"]].itertuples(index=False)
    to = [topology.instance(*key) for key in where]
    sent = sent[np.isin(to, units.retry_owners)]
    assert len(sent) > 0
    owners = rows((units.retry_owners, ()), sent)
    return pd.concat([first, owners]).sort_values(KEY, ignore_index=True)


@pytest.mark.parametrize(
    "topology",
    [
        {"consumers": {"instances": 3, "threads": 2}, "retry_queue_nums": 2},
        {"consumers": {"instances": 4, "threads": 1}, "workload": {"queues": 8}},
        {
            "consumers": {"instances": 5, "threads": 2},
            "brokers": 2,
            "allocate": "averagely_by_circle",
            "workload": {"queues": 8},
        },
        {  # a downstream of each instance's own (model.md §3) keeps the units apart
            "consumers": {"instances": 3, "threads": 3},
            "behavior": {"downstream": {"capacity": 2, "per": "instance", "timeout": "2s"}},
        },
    ],
)
def test_a_group_in_units_gives_the_whole_groups_rows(topology):
    """docs/model.md §5, "Units": the instances without a retry queue simulated apart, the
    retry owners after them, fed those instances' retries, give the rows of the group
    simulated whole, on a full pool with timeouts, failed send-backs and the fallback."""
    group = {**SATURATED["groups"][0], **topology}
    for key in ("workload", "behavior"):
        group[key] = {**SATURATED["groups"][0][key], **topology.get(key, {})}
    config = build_scenario({**SATURATED, "groups": [group]})
    spec = key_specs(config, group_plans(config))[0]
    assert units_of(spec) is not None
    data = messages(spec, 6000, 120_000, seed=5)
    whole = staged_frame(simulate_key(spec, *data))
    units = _in_units(spec, *data)
    pd.testing.assert_frame_equal(units, whole.sort_values(KEY, ignore_index=True))
    assert units["consumer_instance"].nunique() == spec.policy.topology.assignable_instances


def test_a_retry_sent_outside_the_units_stops_the_loop():
    config = build_scenario(SATURATED)
    spec = key_specs(config, group_plans(config))[0]
    units = spec.policy.topology.units()
    lonely = (units.first[0], ())  # as if the retry owners were no unit
    with pytest.raises(ValueError, match="outside the units"):
        list(simulate_key(spec, *messages(spec, 600, 60_000, 2), unit=lonely))


def test_which_groups_run_in_units():
    """Forced (``unit_messages=0``) any group with a unit besides its retry owners';
    by default only those with more units than a whole group's tasks."""
    wide = {
        **SATURATED["groups"][0], "consumers": {"instances": 6, "threads": 1},
        "retry_queue_nums": 1, "workload": {"messages": 6000, "over": "2m", "queues": 6},
    }  # fmt: skip
    config = build_scenario(
        {**SATURATED, "groups": [SATURATED["groups"][0], {**wide, "name": "wide"}]}
    )
    specs = key_specs(config, group_plans(config))
    busy, in_five = (0, "busy"), (0, "wide")  # groups by KeySpec.key: (run, name)
    assert in_units(specs, set(), 0) == {busy, in_five}  # 1 unit and 5 units
    assert in_units(specs, set(), 0, MOST_OUTPUT_PARTS + 1) == {in_five}
    assert in_units(specs, set(), 6001) == set()  # too few messages
    assert in_units(specs, {in_five}, 0) == {busy}  # per lane: never
    # a downstream the instances share ties them together: never (model.md §3)
    shared = {**wide["behavior"], "downstream": {"capacity": 2}}
    config = build_scenario({**SATURATED, "groups": [{**wide, "behavior": shared}]})
    assert in_units(key_specs(config, group_plans(config)), set(), 0) == set()


@pytest.mark.parametrize("ids", ["ascending", "shuffled"])  # shuffled: the lexsort
def test_messages_take_publish_order(ids):
    rng = np.random.default_rng(9)
    born = rng.integers(0, 500, 5_000).astype(np.int64)  # many ties
    msg_ids = np.arange(5_000, dtype=np.int64) * 3
    if ids == "shuffled":
        msg_ids = rng.permutation(msg_ids)
    assert (_publish_order(born, msg_ids) == np.lexsort((msg_ids, born))).all()


def test_a_49_client_sends_a_timed_out_message_back_twice():
    """docs/model.md §6, the late send-back, on conf/conformance/timeout-4x.yaml: message 13's
    first listener outlives the cleaner's run at 120 s and fails at 150.5 s. The real 4.9.7
    broker delivered two copies with reconsumeTimes 1 (at 140.2 s and 153.5 s) and two with 2
    (177.1 s and 221.3 s), numbered as they started; the loop and the reference make the
    same. A 5.1 client skips the second send-back."""
    data = yaml.safe_load((SWEEP.parent / "timeout-4x.yaml").read_text())
    rows = loop_rows_are_the_references(data)
    message = rows[rows["msg_id"] == 13].sort_values("delivery")
    assert message["reconsume_times"].tolist() == [0, 1, 1, 2, 2]
    assert (message["start_ms"] // 100).tolist() == [425, 1401, 1535, 1770, 2212]
    first = message.iloc[0]
    sent_back = (first["outcome"], first["end_ms"], first["copy_state"])
    assert sent_back == ("TIMEOUT", 120_000, "WaitingRetry")
    assert message["parent_delivery"].tolist()[2:] == [1, 2, 3]
    group = {**data["groups"][0], "client_version": "5.1"}
    once = loop_rows_are_the_references({**data, "groups": [group]})
    assert once[once["msg_id"] == 13]["delivery"].max() == 3
    assert once["copy_state"].isna().all()


# a 5.x push group of two one-thread instances, its messages at the moments a test gives
POLLS = {
    "name": "polls", "seed": 1, "horizon": "1m",
    "groups": [{"name": "g", "flavor": "rocketmq5.push",
                "consumers": {"instances": 2, "threads": 1},
                "workload": {"messages": 7, "over": "1s", "queues": 1},
                "behavior": {"fail_probability": 0, "processing_time": "10ms"}}],
}  # fmt: skip


def test_a_5x_push_delivery_goes_to_the_long_poll_made_first():
    """docs/model.md §5, which instance's long poll: three messages at 0 go to the first
    instance's long poll, all three (its pop takes what is there), though the other instance
    idles; the next ones alternate, each answered instance asking again at the back of the
    line; a long poll left 20 s comes back and asks again, behind one that came back later,
    so at 21.5 s instance 0's poll (made at 2 s) goes first, and at 22.5 s instance 1's.
    The round robin by message would give 0, 1, 0, 1, 0, 1, 0."""
    config = build_scenario(POLLS)
    spec = key_specs(config, group_plans(config))[0]
    born = np.array([0, 0, 0, 1_000, 2_000, 21_500, 22_500], np.int64)
    ids = np.arange(len(born), dtype=np.int64)
    rows = staged_frame(simulate_key(spec, ids, ids * 0, born)).sort_values("msg_id")
    assert rows["consumer_instance"].tolist() == [0, 0, 0, 1, 0, 0, 1]
    assert rows["start_ms"].tolist() == [0, 10, 20, 1_000, 2_000, 21_500, 22_500]
