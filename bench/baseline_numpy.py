"""Vectorised NumPy baseline: the same per-message timelines as retrysim, in closed form.

This is the single-machine lower bound of the benchmark. It reads the same scenario (through
``retrysim.scenario.spec``, overrides included), makes the same hash-based draws
(``retrysim.model.rng.uniform_np``, bit for bit those of the Spark engine, docs/model.md §2-§3)
and writes the attempts (one row per delivery) to ONE Parquet file with pyarrow.

The model it covers is the one the benchmark needs, with unlimited consumer capacity
(docs/model.md §5: every delivery starts when it is Ready):

* messages ``0 .. N-1``, ``born_ms = floor(msg_id * W / N)`` (or the ``arrival`` draw for
  ``poisson``); only ``born_ms < horizon`` is delivered;
* delivery ``d`` of the still-failing set, ``rt = d - 1``: ``fails = poisoned or d <=
  fail_first or u("fail", m, d) < p(start)`` with ``poisoned = u("poison", m, 0) <
  poison_fraction`` and ``p(start)`` the outage-aware failure chance; the kind from
  ``u("kind", m, d)``; the processing time (constant, exponential or lognormal, from
  ``u("time_a")``/``u("time_b")``, rounded half up); the consume timeout (exact: the
  periodic check is refused, since which deliveries a run of the cleaner sends back, at
  most 16 of a queue, depends on the order they started);
* the ``rocketmq4.concurrently`` rule (docs/flavors.md): DLQ (or Discard) at the failure when
  ``rt >= max_reconsume_times`` or the requested level is negative, else WaitingRetry with
  level ``min(3 + rt, L)`` (a fixed ``delay_level_when_next_consume``, level 3 after a
  timeout) and ``next_ready_ms = end_ms + delay(level)``;
* the horizon (§7): a delivery with ``end_ms >= horizon`` is Inflight (no end, no outcome),
  a retry due at or after the horizon is not delivered.

Draws a scenario cannot need are skipped (a constant processing time needs no time draws,
a pure ``reconsume_later`` mix no kind draw, ``poison_fraction: 0`` no poison draw): the
result is the same because each draw is a pure function of its key.

Anything outside that model (other flavors, batches, send-back failures, DLQ replay) is
refused with a message rather than simulated wrongly. The ``consumers`` key is not read:
the baseline always assumes ``consumers: unlimited`` (the engine in this branch ignores
capacity too).

Messages are processed in chunks of ``--chunk`` ids; each chunk is one Parquet row group,
and the next chunk is computed on a second thread while the current one is written
(NumPy and the Parquet writer both release the GIL), so both cores are used.

    .venv/bin/python bench/baseline_numpy.py --messages 1M --output /tmp/attempts.parquet
    .venv/bin/python bench/baseline_numpy.py --messages 100k --compare-delta bench/out/x/tables
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from retrysim.model.rng import uniform_np  # noqa: E402
from retrysim.scenario.errors import ScenarioError  # noqa: E402
from retrysim.scenario.loading import load_scenario  # noqa: E402

DEFAULT_SCENARIO = ROOT / "bench" / "scenario.yaml"
DEFAULT_CHUNK = 500_000
FLAVOR = "rocketmq4.concurrently"
BROKER_FIRST_RETRY_LEVEL = 3  # AbstractSendMessageProcessor.consumerSendMsgBack: 3 + rt
TIMEOUT_SEND_BACK_LEVEL = 3  # ProcessQueue.cleanExpiredMsg
DEFAULT_MAX_RECONSUME_TIMES = 16  # -1 means 16 for concurrent consumption
Z_99 = 2.3263478740408408
STREAMS = ("poison", "fail", "kind", "time_a", "time_b")  # docs/model.md §2 (listener draws)

# Outcome and state codes; the strings are the dictionaries of the Parquet columns.
OUTCOMES = ("CONSUME_SUCCESS", "RECONSUME_LATER", "EXCEPTION", "NULL_RETURN", "TIMEOUT")
SUCCESS, RECONSUME_LATER, EXCEPTION, NULL_RETURN, TIMEOUT = range(5)
STATES = ("Commit", "WaitingRetry", "DLQ", "Discard", "Inflight")
COMMIT, WAITING_RETRY, DLQ, DISCARD, INFLIGHT = range(5)

SCHEMA = pa.schema(
    [
        ("group", pa.dictionary(pa.int8(), pa.string())),
        ("msg_id", pa.int64()),
        ("delivery", pa.int32()),
        ("reconsume_times", pa.int32()),
        ("ready_ms", pa.int64()),
        ("start_ms", pa.int64()),
        ("end_ms", pa.int64()),
        ("outcome", pa.dictionary(pa.int8(), pa.string())),
        ("result_state", pa.dictionary(pa.int8(), pa.string())),
        ("delay_level", pa.int32()),
        ("next_ready_ms", pa.int64()),
    ]
)


# Snappy as Spark writes; dictionary pages only where values repeat (the int64 times and ids
# would only fill a dictionary and fall back to plain encoding); statistics on, as Spark.
PARQUET_OPTIONS = {
    "compression": "snappy",
    "use_dictionary": [
        "group",
        "delivery",
        "reconsume_times",
        "outcome",
        "result_state",
        "delay_level",
    ],
}
pa.array(np.zeros(1))  # pyarrow's one-off NumPy set-up (~0.2 s), outside the timed part


class Unsupported(ValueError):
    """The scenario needs a part of the model this baseline does not implement."""


@dataclass(frozen=True)
class Processing:
    dist: str
    mean: int
    mu: float = 0.0
    sigma: float = 0.0


@dataclass(frozen=True)
class Model:
    """What the baseline needs of one ``rocketmq4.concurrently`` group, as plain numbers."""

    seed: int
    group: str
    messages: int
    over_ms: int
    arrival: str
    horizon_ms: int
    delay_table_ms: tuple[int, ...]
    max_reconsume_times: int
    delay_level_when_next_consume: int
    consume_timeout_ms: int
    dlq_enabled: bool
    fail_probability: float
    poison_fraction: float
    fail_first: int
    processing: Processing
    # (start, end, fail_probability, Processing or None), in the order listed
    outages: tuple[tuple[int, int, float, Processing | None], ...]
    mix: tuple[float, float]  # cumulative weights of RECONSUME_LATER, EXCEPTION

    @classmethod
    def from_scenario(cls, scenario, group_index: int = 0) -> Model:
        if len(scenario.groups) != 1:
            raise Unsupported(f"{len(scenario.groups)} groups; the baseline simulates one")
        group = scenario.groups[group_index]
        if group.flavor != FLAVOR:
            raise Unsupported(f"flavor {group.flavor!r}; the baseline simulates {FLAVOR}")
        behavior = group.behavior
        if getattr(group, "consume_message_batch_max_size", 1) != 1:
            raise Unsupported("batch consumption")
        if getattr(behavior, "send_back_failure_probability", 0.0):
            raise Unsupported("send_back_failure_probability > 0")
        for key in ("ready_wait", "pull_interval", "client_overhead"):
            if getattr(behavior, key, 0) or getattr(group, key, 0):
                raise Unsupported(f"{key} > 0")
        if getattr(group, "replay", None):
            raise Unsupported("DLQ replay")
        if group.consume_timeout_check == "periodic":
            raise Unsupported("consume_timeout_check: periodic (the cleaner's limit of 16 a run)")
        mix = behavior.outcome_mix
        total = mix.reconsume_later + mix.exception + mix.null_return
        max_times = group.max_reconsume_times
        return cls(
            seed=scenario.seed,
            group=group.name,
            messages=group.workload.messages,
            over_ms=group.workload.over,
            arrival=group.workload.arrival,
            horizon_ms=scenario.horizon,
            delay_table_ms=tuple(scenario.broker.message_delay_level),
            max_reconsume_times=DEFAULT_MAX_RECONSUME_TIMES if max_times == -1 else max_times,
            delay_level_when_next_consume=group.delay_level_when_next_consume,
            consume_timeout_ms=group.consume_timeout,
            dlq_enabled=group.dlq_enabled,
            fail_probability=behavior.fail_probability,
            poison_fraction=behavior.poison_fraction,
            fail_first=behavior.fail_first,
            processing=_processing(behavior.processing_time),
            outages=tuple(
                (
                    o.start,
                    o.end,
                    o.fail_probability,
                    None if o.processing_time is None else _processing(o.processing_time),
                )
                for o in behavior.outages
            ),
            mix=(mix.reconsume_later / total, (mix.reconsume_later + mix.exception) / total),
        )


def _processing(spec) -> Processing:
    if spec.dist == "lognormal" and spec.mean > 0:
        gap = math.log(spec.p99) - math.log(spec.mean)
        sigma = Z_99 - math.sqrt(max(Z_99**2 - 2.0 * gap, 0.0))
        return Processing("lognormal", spec.mean, math.log(spec.mean) - sigma**2 / 2.0, sigma)
    return Processing("constant" if spec.mean == 0 else spec.dist, spec.mean)


def load_model(scenario: str | Path, messages: int | None, overrides: list[str]) -> Model:
    extra = [f"groups.0.workload.messages={messages}"] if messages else []
    return Model.from_scenario(load_scenario(str(scenario), [*overrides, *extra]))


# --------------------------------------------------------------------------- the model


def _round_half_up(values: np.ndarray) -> np.ndarray:
    """Spark's ``round`` (HALF_UP) of non-negative doubles, exactly: ``x - floor(x)`` is exact."""
    whole = np.floor(values)
    return (whole + (values - whole >= 0.5)).astype(np.int64)


def _processing_ms(m: Model, spec: Processing, ids: np.ndarray, d: int) -> np.ndarray | int:
    if spec.dist == "constant":
        return spec.mean
    u_a = uniform_np(m.seed, m.group, "time_a", ids, d)
    if spec.dist == "exponential":
        return _round_half_up(-float(spec.mean) * np.log(u_a))
    u_b = uniform_np(m.seed, m.group, "time_b", ids, d)
    normal = np.sqrt(-2.0 * np.log(u_a)) * np.cos(2.0 * math.pi * u_b)
    return _round_half_up(np.exp(spec.mu + spec.sigma * normal))


def born_ms(m: Model, ids: np.ndarray) -> np.ndarray:
    if m.arrival == "uniform":
        # floor(id * W / N); exact in int64 up to id * W < 2^63
        return ids * np.int64(m.over_ms) // np.int64(m.messages)
    return np.floor(uniform_np(m.seed, m.group, "arrival", ids, 0) * m.over_ms).astype(np.int64)


def timelines(m: Model, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Every delivery of the messages ``ids`` (int64), grouped by delivery number.

    Returns the attempt columns as arrays; ``end_ms``, ``outcome``, ``delay_level`` and
    ``next_ready_ms`` come with boolean ``*_valid`` masks (False where the value is null).
    """
    ids = np.asarray(ids, dtype=np.int64)
    born = born_ms(m, ids)
    keep = born < m.horizon_ms
    ids, ready = ids[keep], born[keep]
    if m.poison_fraction > 0:
        poisoned = uniform_np(m.seed, m.group, "poison", ids, 0) < m.poison_fraction
    else:
        poisoned = np.zeros(ids.shape, dtype=bool)
    table = np.asarray(m.delay_table_ms, dtype=np.int64)
    levels = len(table)
    timeout = m.consume_timeout_ms
    parts: list[dict[str, np.ndarray]] = []
    d = 0
    while ids.size:
        d += 1
        rt = d - 1  # no replay, no local resubmit: reconsume_times = delivery - 1
        n = ids.size
        start = ready  # unlimited consumers, no ready_wait: a delivery starts when Ready

        # listener draws (docs/model.md §3)
        p: np.ndarray | float = m.fail_probability
        for o_start, o_end, o_p, _ in sorted(m.outages, key=lambda o: o[2]):
            p = np.where((start >= o_start) & (start < o_end), o_p, p)
        if m.fail_first >= d:
            fails = np.ones(n, dtype=bool)
        else:
            fails = poisoned | (uniform_np(m.seed, m.group, "fail", ids, d) < p)
        if m.mix[0] >= 1.0:  # u < 1 always: every failure is RECONSUME_LATER
            kind = np.int8(RECONSUME_LATER)
        else:
            k = uniform_np(m.seed, m.group, "kind", ids, d)
            kind = np.where(
                k < m.mix[0], RECONSUME_LATER, np.where(k < m.mix[1], EXCEPTION, NULL_RETURN)
            ).astype(np.int8)
        outcome = np.where(fails, kind, np.int8(SUCCESS)).astype(np.int8)
        processing = _processing_ms(m, m.processing, ids, d)
        for o_start, o_end, _, spec in m.outages:  # the last listed window wins
            if spec is not None:
                inside = (start >= o_start) & (start < o_end)
                processing = np.where(inside, _processing_ms(m, spec, ids, d), processing)

        # consume timeout (flavors.md, rocketmq4.concurrently)
        leave = start + timeout  # exact (the periodic check is refused)
        if np.ndim(processing) == 0 and processing <= timeout:
            end = start + processing  # constant and below the timeout: nothing times out
        else:
            timed_out = start + processing > leave
            end = np.where(timed_out, leave, start + processing)
            outcome = np.where(timed_out, np.int8(TIMEOUT), outcome).astype(np.int8)

        # next step
        if m.delay_level_when_next_consume == 0:
            asked = BROKER_FIRST_RETRY_LEVEL + rt
        else:
            asked = m.delay_level_when_next_consume
        requested = np.where(outcome == TIMEOUT, TIMEOUT_SEND_BACK_LEVEL, asked)
        level = np.minimum(requested, levels).astype(np.int32)
        success = outcome == SUCCESS
        leaves = (rt >= m.max_reconsume_times) | (requested < 0)
        retry = ~success & ~leaves
        state = np.where(
            success, np.int8(COMMIT), np.where(leaves, np.int8(DLQ if m.dlq_enabled else DISCARD),
                                               np.int8(WAITING_RETRY))
        ).astype(np.int8)  # fmt: skip
        next_ready = end + table[np.clip(level, 1, levels) - 1]

        # the horizon (§7): still running at the horizon -> Inflight, nothing known after
        ended = end < m.horizon_ms
        state = np.where(ended, state, np.int8(INFLIGHT)).astype(np.int8)
        retry &= ended
        parts.append(
            {
                "msg_id": ids,
                "delivery": np.full(n, d, dtype=np.int32),
                "reconsume_times": np.full(n, rt, dtype=np.int32),
                "ready_ms": ready,
                "start_ms": start,
                "end_ms": end,
                "end_valid": ended,
                "outcome": outcome,
                "result_state": state,
                "delay_level": level,
                "next_ready_ms": next_ready,
                "retry": retry,
            }
        )
        go_on = retry & (next_ready < m.horizon_ms)
        ids, ready, poisoned = ids[go_on], next_ready[go_on], poisoned[go_on]
    if not parts:
        return {key: np.empty(0) for key in SCHEMA.names[1:]} | {"end_valid": np.empty(0, bool)}
    columns = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    return columns


def _masked(values: np.ndarray, valid: np.ndarray, kind: pa.DataType) -> pa.Array:
    """An Arrow array over ``values`` (no copy) with ``valid`` as its validity bitmap."""
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(kind, len(values), [bitmap, pa.py_buffer(values)])


def _dictionary(codes: np.ndarray, values: tuple[str, ...], valid=None) -> pa.Array:
    indices = pa.array(codes, type=pa.int8()) if valid is None else _masked(codes, valid, pa.int8())
    return pa.DictionaryArray.from_arrays(indices, pa.array(values, pa.string()))


def to_arrow(m: Model, c: dict[str, np.ndarray]) -> pa.Table:
    n = len(c["msg_id"])
    retry, ended = c["retry"], c["end_valid"]
    return pa.Table.from_arrays(
        [
            _dictionary(np.zeros(n, dtype=np.int8), (m.group,)),
            pa.array(c["msg_id"]),
            pa.array(c["delivery"]),
            pa.array(c["reconsume_times"]),
            pa.array(c["ready_ms"]),
            pa.array(c["start_ms"]),
            _masked(c["end_ms"], ended, pa.int64()),
            _dictionary(c["outcome"], OUTCOMES, ended),
            _dictionary(c["result_state"], STATES),
            _masked(c["delay_level"], retry, pa.int32()),
            _masked(c["next_ready_ms"], retry, pa.int64()),
        ],
        schema=SCHEMA,
    )


@dataclass
class Counts:
    horizon_ms: int
    deliveries: int = 0
    messages: int = 0
    published: int = 0  # published before the horizon (the others are pending, undelivered)
    commits: int = 0
    dlq: int = 0
    discards: int = 0
    inflight: int = 0
    waiting: int = 0  # last delivery WaitingRetry: a retry due at or after the horizon

    def add(self, c: dict[str, np.ndarray], messages: int) -> None:
        state = c["result_state"]
        self.deliveries += len(state)
        self.messages += messages
        self.published += int(np.count_nonzero(c["delivery"] == 1))
        self.commits += int(np.count_nonzero(state == COMMIT))
        self.dlq += int(np.count_nonzero(state == DLQ))
        self.discards += int(np.count_nonzero(state == DISCARD))
        self.inflight += int(np.count_nonzero(state == INFLIGHT))
        # every WaitingRetry row is followed by a delivery unless its retry is past the horizon
        self.waiting += int(
            np.count_nonzero((state == WAITING_RETRY) & (c["next_ready_ms"] >= self.horizon_ms))
        )

    @property
    def pending(self) -> int:
        """As the engine's summary counts it: Inflight, WaitingRetry, never published."""
        return self.inflight + self.waiting + self.messages - self.published


def run(
    m: Model,
    output: str | Path | None,
    chunk: int = DEFAULT_CHUNK,
    ids: np.ndarray | None = None,
    overlap: bool = True,
) -> dict:
    """Simulate all messages (or ``ids``) chunk by chunk and write one Parquet file.

    Returns the counts and the timings: ``compute_s`` (NumPy, summed over chunks),
    ``write_s`` (Arrow conversion + Parquet write, summed) and ``run_s`` (the whole call).
    """
    began = time.perf_counter()
    total = m.messages if ids is None else len(ids)
    bounds = [(lo, min(lo + chunk, total)) for lo in range(0, total, chunk)]
    counts = Counts(m.horizon_ms)
    timing = {"compute_s": 0.0, "write_s": 0.0}
    writer = None
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        writer = pq.ParquetWriter(str(output), SCHEMA, **PARQUET_OPTIONS)

    def compute(lo: int, hi: int) -> tuple[dict[str, np.ndarray], int, float]:
        t0 = time.perf_counter()
        chunk_ids = np.arange(lo, hi, dtype=np.int64) if ids is None else ids[lo:hi]
        columns = timelines(m, chunk_ids)
        return columns, hi - lo, time.perf_counter() - t0

    def consume(columns: dict[str, np.ndarray], messages: int, seconds: float) -> None:
        timing["compute_s"] += seconds
        counts.add(columns, messages)
        if writer is not None:
            t0 = time.perf_counter()
            writer.write_table(to_arrow(m, columns), row_group_size=len(columns["msg_id"]))
            timing["write_s"] += time.perf_counter() - t0

    try:
        if overlap and len(bounds) > 1:
            # compute chunk k+1 on a second thread while chunk k is written
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                pending = pool.submit(compute, *bounds[0])
                for nxt in [*bounds[1:], None]:
                    done = pending.result()
                    if nxt is not None:
                        pending = pool.submit(compute, *nxt)
                    consume(*done)
                    del done
        else:
            for lo, hi in bounds:
                consume(*compute(lo, hi))
    finally:
        if writer is not None:
            t0 = time.perf_counter()
            writer.close()
            timing["write_s"] += time.perf_counter() - t0
    run_s = time.perf_counter() - began
    size = os.path.getsize(output) if output is not None else None
    return {
        "messages": counts.messages,
        "published": counts.published,
        "deliveries": counts.deliveries,
        "commits": counts.commits,
        "dlq": counts.dlq,
        "discards": counts.discards,
        "pending": counts.pending,
        "run_s": round(run_s, 3),
        "compute_s": round(timing["compute_s"], 3),
        "write_s": round(timing["write_s"], 3),
        "deliveries_per_s": round(counts.deliveries / run_s) if run_s else None,
        "parquet_files": 0 if output is None else 1,
        "parquet_mib": None if size is None else round(size / 2**20, 2),
        "chunk": chunk,
        "chunks": len(bounds),
        "overlap": overlap and len(bounds) > 1,
    }


# --------------------------------------------------------------------------- checking


def compare_with_engine(m: Model, parquet: Path, tables: Path, run_id: str | None) -> dict:
    """Row-by-row comparison of the baseline's attempts with the engine's ``attempts`` table."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    columns = [name for name in SCHEMA.names]
    engine = DeltaTable(str(tables / "attempts")).to_pyarrow_table()
    if run_id is not None:
        engine = engine.filter(pc.equal(engine["run_id"], run_id))
    engine = engine.select(columns).sort_by([("msg_id", "ascending"), ("delivery", "ascending")])
    ours = pq.read_table(parquet).sort_by([("msg_id", "ascending"), ("delivery", "ascending")])
    report = {"engine_rows": engine.num_rows, "baseline_rows": ours.num_rows, "mismatches": {}}
    if engine.num_rows != ours.num_rows:
        return report
    for name in columns:
        a = (
            ours[name].cast(pa.string())
            if name in ("group", "outcome", "result_state")
            else ours[name]
        )
        b = engine[name].cast(a.type)
        same = pc.fill_null(pc.equal(a, b), False)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        bad = ours.num_rows - pc.sum(pc.or_(same, both_null).cast(pa.int64())).as_py()
        if bad:
            report["mismatches"][name] = bad
    return report


# --------------------------------------------------------------------------- command line


def parse_count(text: str) -> int:
    """1000000, 1_000_000, 1M, 100k, 1.5M."""
    item = text.strip().replace("_", "").lower()
    scale = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000, "b": 1_000_000_000}.get(item[-1:], 1)
    number = item[:-1] if scale > 1 else item
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad count {text!r}: use e.g. 1000000 or 1M") from None
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"bad count {text!r}: a positive whole number")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default=str(DEFAULT_SCENARIO), help="scenario YAML")
    parser.add_argument("--messages", type=parse_count, help="message count (1M, 10M, ...)")
    parser.add_argument("--set", action="append", default=[], help="scenario override k=v")
    parser.add_argument("--output", help="Parquet file to write (default: no file, compute only)")
    parser.add_argument("--chunk", type=parse_count, default=DEFAULT_CHUNK, help="ids per chunk")
    parser.add_argument(
        "--no-overlap", dest="overlap", action="store_false", help="one thread: no compute-ahead"
    )
    parser.add_argument("--compare-delta", help="engine output dir: compare its attempts rows")
    parser.add_argument("--run-id", help="the engine run to compare with (default: all rows)")
    parser.add_argument("--json", action="store_true", help="print one JSON line as the result")
    args = parser.parse_args(argv)
    try:
        model = load_model(args.scenario, args.messages, args.set)
    except (Unsupported, ScenarioError) as error:
        print(f"baseline_numpy: unsupported scenario: {error}", file=sys.stderr)
        return 2
    output = args.output
    if args.compare_delta and not output:
        output = str(Path(args.compare_delta) / "_baseline_attempts.parquet")
    result = run(model, output, chunk=args.chunk, overlap=args.overlap)
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if args.compare_delta:
        result["compare"] = compare_with_engine(
            model, Path(output), Path(args.compare_delta), args.run_id
        )
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>18}: {value}")
    if args.compare_delta:
        cmp = result["compare"]
        if cmp["engine_rows"] != cmp["baseline_rows"] or cmp["mismatches"]:
            print("baseline_numpy: MISMATCH with the engine's attempts", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
