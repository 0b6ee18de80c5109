"""SimPy baseline: the same model as a conventional discrete-event simulation, on a subsample.

A source process publishes each sampled message at its ``born_ms`` and starts one SimPy
process per message. That process makes delivery after delivery: it opens the attempt row
at the start (Inflight), holds for the processing time, closes the row with the outcome
and the ``rocketmq4.concurrently`` rule, and holds for the retry delay before the next
delivery, until Commit or DLQ. ``env.run(until=horizon)`` stops the clock: a delivery still
running then stays Inflight and a retry due at or after the horizon is never delivered,
exactly docs/model.md §7 (SimPy handles the stop before any other event at the horizon).

The draws are the engine's (docs/model.md §2): the same xxhash64 as ``retrysim.model.rng``, in
plain Python integers, one call per draw, as a DES would make them. They are checked
against ``retrysim.model.rng.uniform_np`` at start-up, and the delivery count (and every row) is
checked against the NumPy baseline for the same message ids.

The subsample is every ``N // n``-th message id of the full size ``N``, so its publish
times are those of the full run (``born_ms`` depends on ``N``) and spread over the whole
window. Its deliveries per second are extrapolated linearly to the full size; SimPy's event
queue only holds the live messages, a fraction ``n / N`` of the full run's, so the real
full-size run would be a little slower still (a heap is O(log size)).

    .venv/bin/python bench/baseline_simpy.py --messages 10M --sample 100k
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np
import simpy

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline_numpy beside this file

import baseline_numpy as bn

from retrysim.model.rng import key_prefix, uniform_np

_M = 2**64 - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_SCALE = float(2**53)


def scalar_uniform(seed: int, group: str, stream: str):
    """``u(stream, msg_id, delivery)`` for one key at a time, in Python integers."""
    base = (key_prefix(seed, group, stream) + _P5 + 8) & _M

    def u(msg_id: int, delivery: int) -> float:
        # hashLong(msg_id, prefix)
        x = ((msg_id & _M) * _P2) & _M
        acc = base ^ ((((x << 31) | (x >> 33)) & _M) * _P1 & _M)
        acc = ((((acc << 27) | (acc >> 37)) & _M) * _P1 + _P4) & _M
        acc ^= acc >> 33
        acc = (acc * _P2) & _M
        acc ^= acc >> 29
        acc = (acc * _P3) & _M
        acc ^= acc >> 32
        # hashInt(delivery, acc)
        acc = (acc + _P5 + 4) & _M
        acc ^= ((delivery & 0xFFFFFFFF) * _P1) & _M
        acc = ((((acc << 23) | (acc >> 41)) & _M) * _P2 + _P3) & _M
        acc ^= acc >> 33
        acc = (acc * _P2) & _M
        acc ^= acc >> 29
        acc = (acc * _P3) & _M
        acc ^= acc >> 32
        return ((acc >> 11) + 0.5) / _SCALE

    return u


def _check_draws(m: bn.Model) -> None:
    ids = np.array([0, 1, 7, 12345, 2**40 + 3, 10**9 + 7], dtype=np.int64)
    for stream in ("poison", "fail", "kind"):
        u = scalar_uniform(m.seed, m.group, stream)
        for d in (0, 1, 2, 17):
            want = uniform_np(m.seed, m.group, stream, ids, d)
            got = [u(int(i), d) for i in ids]
            if list(want) != got:
                raise AssertionError(f"scalar draws differ from uniform_np ({stream}, d={d})")


def _round_half_up(x: float) -> int:
    whole = math.floor(x)
    return int(whole + (x - whole >= 0.5))


class Simulation:
    """One SimPy environment over a list of message ids; rows are plain Python lists."""

    def __init__(self, m: bn.Model, ids: np.ndarray) -> None:
        self.m = m
        self.ids = [int(i) for i in ids]
        self.born = [int(b) for b in bn.born_ms(m, np.asarray(ids, dtype=np.int64))]
        self.env = simpy.Environment()
        self.rows: list[list] = []
        draw = {s: scalar_uniform(m.seed, m.group, s) for s in bn.STREAMS}
        self.u_poison, self.u_fail, self.u_kind = draw["poison"], draw["fail"], draw["kind"]
        self.u_a, self.u_b = draw["time_a"], draw["time_b"]
        self.table = m.delay_table_ms
        self.outages_by_p = sorted(m.outages, key=lambda o: o[2])

    # -- listener draws (docs/model.md §3), one delivery at a time
    def _processing(self, spec: bn.Processing, mid: int, d: int) -> int:
        if spec.dist == "constant":
            return spec.mean
        a = self.u_a(mid, d)
        if spec.dist == "exponential":
            return _round_half_up(-float(spec.mean) * math.log(a))
        normal = math.sqrt(-2.0 * math.log(a)) * math.cos(2.0 * math.pi * self.u_b(mid, d))
        return _round_half_up(math.exp(spec.mu + spec.sigma * normal))

    def _listener(self, mid: int, d: int, start: int, poisoned: bool) -> tuple[int, int]:
        m = self.m
        p = m.fail_probability
        for o_start, o_end, o_p, _ in self.outages_by_p:
            if o_start <= start < o_end:
                p = o_p
        fails = poisoned or d <= m.fail_first or self.u_fail(mid, d) < p
        outcome = bn.SUCCESS
        if fails:
            if m.mix[0] >= 1.0:
                outcome = bn.RECONSUME_LATER
            else:
                k = self.u_kind(mid, d)
                outcome = (
                    bn.RECONSUME_LATER
                    if k < m.mix[0]
                    else bn.EXCEPTION
                    if k < m.mix[1]
                    else bn.NULL_RETURN
                )
        spec = m.processing
        for o_start, o_end, _, o_spec in m.outages:
            if o_spec is not None and o_start <= start < o_end:
                spec = o_spec
        return outcome, self._processing(spec, mid, d)

    # -- processes
    def source(self):
        env = self.env
        order = sorted(range(len(self.ids)), key=lambda i: self.born[i])
        for i in order:
            wait = self.born[i] - env.now
            if wait > 0:
                yield env.timeout(wait)
            env.process(self.message(self.ids[i]))

    def message(self, mid: int):
        m, env, rows = self.m, self.env, self.rows
        timeout = m.consume_timeout_ms
        poisoned = m.poison_fraction > 0 and self.u_poison(mid, 0) < m.poison_fraction
        d = 0
        while True:
            d += 1
            rt = d - 1
            start = ready = env.now
            # msg_id, delivery, rt, ready, start, end, outcome, state, level, next_ready
            row = [mid, d, rt, ready, start, None, None, bn.INFLIGHT, None, None]
            rows.append(row)
            outcome, processing = self._listener(mid, d, start, poisoned)
            if m.timeout_check == "exact":
                leave = start + timeout
            else:
                leave = ((start + timeout) // timeout + 1) * timeout
            if start + processing > leave:
                outcome, end = bn.TIMEOUT, leave
            else:
                end = start + processing
            # the consume result is known at end_ms; the run stops first if end >= horizon
            yield env.timeout(end - start)
            row[5], row[6] = end, outcome
            if outcome == bn.SUCCESS:
                row[7] = bn.COMMIT
                return
            if outcome == bn.TIMEOUT:
                requested = bn.TIMEOUT_SEND_BACK_LEVEL
            elif m.delay_level_when_next_consume == 0:
                requested = bn.BROKER_FIRST_RETRY_LEVEL + rt
            else:
                requested = m.delay_level_when_next_consume
            if rt >= m.max_reconsume_times or requested < 0:
                row[7] = bn.DLQ if m.dlq_enabled else bn.DISCARD
                return
            level = min(requested, len(self.table))
            row[7], row[8] = bn.WAITING_RETRY, level
            row[9] = end + self.table[level - 1]
            yield env.timeout(self.table[level - 1])

    def run(self) -> None:
        self.env.process(self.source())
        self.env.run(until=self.m.horizon_ms)


def sample_ids(messages: int, sample: int) -> np.ndarray:
    """Every (messages // sample)-th id: the full run's publish times, the whole window."""
    sample = min(sample, messages)
    return np.arange(sample, dtype=np.int64) * (messages // sample)


def _rows_to_columns(rows: list[list]) -> dict[str, np.ndarray]:
    def col(i: int, dtype, fill=0) -> np.ndarray:
        return np.array([fill if r[i] is None else r[i] for r in rows], dtype=dtype)

    return {
        "msg_id": col(0, np.int64),
        "delivery": col(1, np.int32),
        "reconsume_times": col(2, np.int32),
        "ready_ms": col(3, np.int64),
        "start_ms": col(4, np.int64),
        "end_ms": col(5, np.int64),
        "end_valid": np.array([r[5] is not None for r in rows], dtype=bool),
        "outcome": col(6, np.int8),
        "result_state": col(7, np.int8),
        "delay_level": col(8, np.int32),
        "next_ready_ms": col(9, np.int64),
        "retry": np.array([r[9] is not None for r in rows], dtype=bool),
    }


def compare_rows(sim: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> list[str]:
    """Column names that differ between two row sets (sorted by msg_id, delivery)."""
    if len(sim["msg_id"]) != len(ref["msg_id"]):
        return ["row count"]
    order_a = np.lexsort((sim["delivery"], sim["msg_id"]))
    order_b = np.lexsort((ref["delivery"], ref["msg_id"]))
    bad = []
    masks = {"end_ms": "end_valid", "outcome": "end_valid"}
    masks |= {"delay_level": "retry", "next_ready_ms": "retry"}
    for name in sim:
        a, b = sim[name][order_a], ref[name][order_b]
        if name in masks:
            valid = ref[masks[name]][order_b]
            a, b = np.where(valid, a, 0), np.where(valid, b, 0)
        if not np.array_equal(a, b):
            bad.append(name)
    return bad


def run(m: bn.Model, sample: int, output: str | Path | None = None, check: bool = True) -> dict:
    """Simulate the subsample with SimPy; time it, extrapolate, check against NumPy."""
    _check_draws(m)
    ids = sample_ids(m.messages, sample)
    t0 = time.perf_counter()
    simulation = Simulation(m, ids)
    simulation.run()
    sim_s = time.perf_counter() - t0
    rows = simulation.rows
    deliveries = len(rows)
    write_s = None
    columns = _rows_to_columns(rows) if (output or check) else None
    if output:
        import pyarrow.parquet as pq

        t1 = time.perf_counter()
        with pq.ParquetWriter(str(output), bn.SCHEMA, **bn.PARQUET_OPTIONS) as writer:
            writer.write_table(bn.to_arrow(m, dict(columns)))
        write_s = time.perf_counter() - t1
    rate = deliveries / sim_s if sim_s else None
    result = {
        "sample_messages": len(ids),
        "of_messages": m.messages,
        "stride": int(m.messages // max(len(ids), 1)),
        "deliveries": deliveries,
        "sim_s": round(sim_s, 3),
        "deliveries_per_s": round(rate) if rate else None,
        "write_s": None if write_s is None else round(write_s, 3),
        "deliveries_per_s_with_write": (
            round(deliveries / (sim_s + write_s)) if write_s is not None else None
        ),
        # linear extrapolation to the full size, deliveries per message as in the sample
        "extrapolated_deliveries": round(deliveries * m.messages / max(len(ids), 1)),
        "extrapolated_s": round(sim_s * m.messages / max(len(ids), 1), 1),
    }
    if check:
        reference = bn.timelines(m, ids)
        result["numpy_deliveries"] = len(reference["msg_id"])
        result["delivery_count_match"] = result["numpy_deliveries"] == deliveries
        result["rows_differ"] = compare_rows(columns, reference)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default=str(bn.DEFAULT_SCENARIO), help="scenario YAML")
    parser.add_argument("--messages", type=bn.parse_count, help="full size N (1M, 10M, ...)")
    parser.add_argument("--sample", type=bn.parse_count, default=100_000, help="default 100k")
    parser.add_argument("--set", action="append", default=[], help="scenario override k=v")
    parser.add_argument("--output", help="also write the sample's attempts to this Parquet file")
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip NumPy check")
    parser.add_argument("--json", action="store_true", help="print one JSON line as the result")
    args = parser.parse_args(argv)
    try:
        model = bn.load_model(args.scenario, args.messages, args.set)
    except (bn.Unsupported, bn.ScenarioError) as error:
        print(f"baseline_simpy: unsupported scenario: {error}", file=sys.stderr)
        return 2
    result = run(model, args.sample, args.output, args.check)
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    if args.check and (not result["delivery_count_match"] or result["rows_differ"]):
        print(
            f"baseline_simpy: MISMATCH with the NumPy baseline: {result['rows_differ']}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
