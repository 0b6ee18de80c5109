"""The compiled event engine alone, outside Spark: one key of bench/saturated.yaml.

The issue's first target is the engine's own rate on one core against the SimPy model's
(bench/baseline_simpy_pool.py): this runs ``retrysim.engine.event_rows.simulate_compiled`` on
the scenario's group with ``--messages`` Poisson arrivals over ``--over`` and prints its
deliveries, its time (the loop and its rows as the Arrow record batches Spark gets, each
dropped once read, as the stage's writer drops it) and the p99 time to commit.

    .venv/bin/python bench/engine_alone.py --messages 3000000 --over 6000s --json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from retrysim.engine.event_rows import simulate_compiled, warm_up
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.scenario.loading import load_scenario

SCENARIO = Path(__file__).resolve().parent / "saturated.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--over", default="10m", help="arrival span, as in the scenario: 600s")
    parser.add_argument("--horizon", default="6h", help="the scenario's horizon: 6h, 120000s")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    scenario = load_scenario(
        SCENARIO,
        [f"groups.0.workload.messages={args.messages}", f"groups.0.workload.over={args.over}",
         f"horizon={args.horizon}"],
    )  # fmt: skip
    spec = key_specs(scenario, group_plans(scenario))[0]
    draws = np.random.default_rng(scenario.seed)
    msg_ids = np.arange(args.messages, dtype=np.int64)
    born = np.sort(draws.integers(0, scenario.groups[0].workload.over, args.messages))
    queue_ids = msg_ids % spec.policy.topology.queues
    warm_up()  # loads the compiled code from numba's cache: not the engine's time
    began = time.perf_counter()
    deliveries, waited, measured = 0, [], 0.0
    for batch in simulate_compiled(spec, msg_ids, queue_ids, born):
        # each batch is handed on and dropped, as the Spark stage's writer does; what the
        # bench reads of it is not the engine's time
        taken = time.perf_counter()
        deliveries += batch.num_rows - batch.column("start_ms").null_count
        commits = batch.filter(pc.equal(batch.column("result_state"), "Commit"))
        waited.append(pc.subtract(commits["settled_ms"], commits["born_ms"]).to_numpy())
        measured += time.perf_counter() - taken
    seconds = time.perf_counter() - began - measured
    waits = np.concatenate(waited) / 1000
    result = {
        "model": "retrysim-compiled-engine",
        "messages": args.messages,
        "deliveries": deliveries,
        "p50_time_to_commit_s": round(float(np.quantile(waits, 0.5)), 3),
        "p99_time_to_commit_s": round(float(np.quantile(waits, 0.99)), 3),
        "simulate_s": round(seconds, 2),
        "deliveries_per_s": round(deliveries / seconds),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
