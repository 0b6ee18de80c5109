"""The compiled event loop against its plain-Python twin, row for row, without Spark.

Both loops are held to the reference written from the RocketMQ source through the engine
(test_engine_vs_reference.py); here the compiled one must give exactly the Python loop's
rows on random scenarios of every unordered flavor, on a pool that stays full, and must draw
Spark's hashed uniforms bit for bit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference.strategies import scenarios

from retrysim.engine.choice import in_units
from retrysim.engine.compiled import CHUNK_ROWS, _publish_order
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.engine.sequential import (
    MOST_OUTPUT_PARTS,
    Heartbeat,
    as_batch,
    read_heartbeats,
    simulate_key,
    units_of,
)
from retrysim.model.policy import next_reconsume_times
from retrysim.scenario.loading import build_scenario
from retrysim.tables.commitlog_writes import pops_of
from retrysim.tables.key_peaks import GroupSummer
from retrysim.tables.schemas import STAGE_ARROW

KEY = ["msg_id", "delivery"]


def both_loops(spec, msg_ids, queue_ids, born) -> tuple:
    def rows(frames) -> pd.DataFrame | None:
        frames = list(frames)
        if not frames:  # nothing published before the horizon
            return None
        frame = pd.concat(frames, ignore_index=True).sort_values(KEY, ignore_index=True)
        strings = frame.select_dtypes(object).columns  # None or NaN: both are null to Spark
        return frame.astype({name: object for name in strings}).where(frame.notna(), None)

    python = rows(simulate_key(spec, msg_ids, queue_ids, born, compiled=False))
    compiled = rows(simulate_key(spec, msg_ids, queue_ids, born))
    return python, compiled


def messages(spec, count: int, span_ms: int, seed: int):
    draws = np.random.default_rng(seed)
    msg_ids = np.arange(count, dtype=np.int64) * 7 + 3
    queue_ids = draws.integers(0, spec.policy.topology.queues, count).astype(np.int64)
    born = np.sort(draws.integers(0, max(span_ms, 1), count)).astype(np.int64)
    return msg_ids, queue_ids, born


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(max_messages=40), st.integers(0, 3))
def test_the_compiled_loop_gives_the_python_loops_rows(data, seed):
    config = build_scenario(data)
    spec = key_specs(config, group_plans(config))[0]
    span = config.groups[0].workload.over
    python, compiled = both_loops(spec, *messages(spec, config.groups[0].workload.messages,
                                                  span, seed))  # fmt: skip
    if python is None or compiled is None:
        assert python is compiled
    else:
        pd.testing.assert_frame_equal(compiled, python)


SATURATED = {
    "name": "full-pool", "seed": 3, "horizon": "140s",
    "broker": {"message_delay_level": "1s 5s 10s 30s 1m"},
    "groups": [{
        "name": "busy", "flavor": "rocketmq4.concurrently", "max_reconsume_times": 1,
        "consumers": {"instances": 3, "threads": 2}, "retry_queue_nums": 2,
        "pull_interval": "100ms", "consume_timeout": "1s",
        "workload": {"messages": 6000, "over": "2m", "queues": 4},
        "behavior": {"fail_probability": 0.2, "poison_fraction": 0.01,
                     "processing_time": {"dist": "lognormal", "mean": "80ms", "p99": "900ms"},
                     "outages": [{"start": "30s", "end": "1m", "fail_probability": 0.9,
                                  "processing_time": "300ms"}],
                     "send_back_failure_probability": 0.1,
                     "send_back_fallback_probability": 0.1},
    }],
}  # fmt: skip


def test_a_pool_that_stays_full_gives_the_same_rows():
    """Thousands waiting for six threads: first deliveries queue behind retries, timeouts,
    failed send-backs and the producer fallback, on three instances by queue."""
    config = build_scenario(SATURATED)
    spec = key_specs(config, group_plans(config))[0]
    python, compiled = both_loops(spec, *messages(spec, 6000, 120_000, seed=5))
    pd.testing.assert_frame_equal(compiled, python)
    waited = compiled["start_ms"] - compiled["ready_ms"]
    assert waited.max() > 30_000  # the pool was full: half a minute and more in Ready
    assert set(compiled["end_reason"].dropna()) >= {
        "TIMEOUT", "send_back_failed", "send_back_fallback", "max_reconsume_times",
    }  # fmt: skip
    assert (compiled["result_state"] == "Ready").any()  # still waiting at the horizon


def test_an_unlimited_pool_is_covered_too():
    data = {**SATURATED, "groups": [{**SATURATED["groups"][0], "consumers": "unlimited"}]}
    config = build_scenario(data)
    spec = key_specs(config, group_plans(config))[0]
    python, compiled = both_loops(spec, *messages(spec, 2000, 120_000, seed=1))
    pd.testing.assert_frame_equal(compiled, python)
    waited = compiled["start_ms"] - compiled["ready_ms"]
    assert waited.max() < 100  # never more than to the next pull tick


def test_a_turn_bigger_than_a_chunk_grows_the_loops_arrays_first():
    """On an unlimited pool every message born in the same pull tick starts in one turn: more
    rows than a chunk's buffer holds, more slots and events than the loop starts with. The
    loop grows them before the turn (it never replaces an array inside its turns)."""
    data = {**SATURATED, "groups": [{**SATURATED["groups"][0], "consumers": "unlimited"}]}
    config = build_scenario(data)
    spec = key_specs(config, group_plans(config))[0]
    count = CHUNK_ROWS + 5_000
    msg_ids, queue_ids, _ = messages(spec, count, 1, seed=2)
    born = np.zeros(count, np.int64)
    rows = pd.concat(simulate_key(spec, msg_ids, queue_ids, born), ignore_index=True)
    first = rows[rows["delivery"] == 1]
    assert len(first) == count and first["msg_id"].is_unique
    assert first["start_ms"].nunique() == 1  # one turn started them all
    again = pd.concat(simulate_key(spec, msg_ids, queue_ids, born), ignore_index=True)
    pd.testing.assert_frame_equal(rows, again)


def test_the_compiled_loop_reports_progress_and_its_end(tmp_path):
    config = build_scenario(SATURATED)
    spec = key_specs(config, group_plans(config))[0]
    heartbeat = Heartbeat(str(tmp_path), 5, spec.horizon_ms)
    rows = pd.concat(simulate_key(spec, *messages(spec, 600, 60_000, 2), heartbeat))
    (beat,) = read_heartbeats(str(tmp_path))
    assert beat == {"sim_ms": spec.horizon_ms, "horizon_ms": spec.horizon_ms,
                    "deliveries": int(rows["start_ms"].notna().sum()), "first": 600,
                    "messages": 600}  # fmt: skip


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
def test_ordered_queues_and_batches_on_a_full_pool_give_the_python_loops_rows(group):
    """The lanes' loop (ordered queues one message at a time, batches of one lane) on a
    pool that stays full: head-of-line blocking and batches waiting for threads."""
    data = {**SATURATED["groups"][0], "max_reconsume_times": 3, **group}
    if "flavor" in group:  # the 4.x concurrent options do not apply to ordered flavors
        data = {key: value for key, value in data.items()
                if key not in ("retry_queue_nums", "pull_interval", "consume_timeout")}  # fmt: skip
        data["behavior"] = _STORMY
    config = build_scenario({**SATURATED, "groups": [data]})
    spec = key_specs(config, group_plans(config))[0]
    python, compiled = both_loops(spec, *messages(spec, 3000, 120_000, seed=5))
    pd.testing.assert_frame_equal(compiled, python)
    waited = compiled["start_ms"] - compiled["ready_ms"]
    assert waited.max() > 15_000  # the pool (or the ordered queue) held them back
    assert compiled["batch_size"].max() == spec.policy.batch_size


@pytest.mark.parametrize("compiled", [True, False])
def test_record_batches_hold_the_frames_rows(compiled):
    """What the Spark stage gets (Arrow, built from the loop's codes without pandas) is the
    frames' rows, from either loop."""
    config = build_scenario(SATURATED)
    spec = key_specs(config, group_plans(config))[0]
    data = messages(spec, 3000, 120_000, seed=4)
    frames = pd.concat(simulate_key(spec, *data, compiled=compiled), ignore_index=True)
    batches = list(simulate_key(spec, *data, compiled=compiled, arrow=True))
    assert all(batch.schema.equals(STAGE_ARROW) for batch in batches)
    table = pa.Table.from_batches(batches).to_pandas()
    for name in frames.columns:
        assert frames[name].astype(object).where(frames[name].notna(), None).tolist() == (
            table[name].astype(object).where(table[name].notna(), None).tolist()
        ), name


@pytest.mark.parametrize(
    "flavor",
    ["rocketmq4.concurrently", "rocketmq4.broadcasting", "rocketmq5.push", "rocketmq5.simple"],
)
def test_the_sums_read_the_loops_chunks_as_their_record_batches(flavor):
    """The stage's tasks sum a group up from the loop's chunks (its longs and string codes)
    and write only their own chunks as record batches: every sum equals the one read from
    the record batches, over chunks that hold nulls, DLQ moves, timeouts and pops; a chunk
    read after the loop went on fails rather than reading the next rows."""
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
    chunks = []
    for chunk in simulate_key(
        spec, *messages(spec, 40_000, 120_000, seed=6), arrow=True, chunks=True
    ):
        summers[0].add(chunk)
        summers[1].add(as_batch(chunk))
        chunks.append(chunk)
    assert len(chunks) > 1 and not isinstance(chunks[0], pa.RecordBatch)
    by_chunks, by_batches = (summer.finish() for summer in summers)
    assert by_chunks == by_batches and by_chunks.complete
    assert by_chunks.compact and by_chunks.gauges and by_chunks.instances
    with pytest.raises(TypeError):
        chunks[0].longs("msg_id")


def _in_units(spec, msg_ids, queue_ids, born) -> pd.DataFrame:
    """A group's rows as its units give them: each instance without a retry queue alone,
    then the retry owners fed the retries those rows send them (next_frontier's rule, in
    pandas)."""
    topology = spec.policy.topology
    units = topology.units()

    def rows(unit, imports=None) -> pd.DataFrame:
        batches = simulate_key(spec, msg_ids, queue_ids, born, unit=unit, imports=imports)
        return pd.concat(list(batches), ignore_index=True)

    first = pd.concat([rows((runs, units.retry_owners)) for runs in units.first])
    due = first[first["next_topic"].notna() & (first["next_ready_ms"] < spec.horizon_ms)]
    counts = [
        next_reconsume_times(rt, broker_rt, reason)
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
    whole = pd.concat(simulate_key(spec, *data), ignore_index=True)
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
