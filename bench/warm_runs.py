"""The same scenario simulated several times in one Spark session: what a sweep's later
points and a notebook's reruns cost once the JVM is warm.

A new JVM spends about a third of a 10M-message lean run's CPU compiling Spark's own code
(its JIT threads' CPU, docs/performance.md); ``retrysim plan --sweep`` and a notebook pay that
once per session. ``run_bench.py`` measures the new-JVM case through ``spark-submit``; this
measures the rest, with the library's own ``simulate()`` on bench/scenario.yaml:

    .venv/bin/python bench/warm_runs.py --size 10M --runs 3
    .venv/bin/python bench/warm_runs.py --size 10M --tables lean --no-validate
    .venv/bin/python bench/warm_runs.py --scenario conf/default.yaml   # as it is: 100k

It prints each run's simulation seconds (rounds, staging, the check, Delta commits; the
session is up before the first) and deliveries per second, and writes a JSON file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
from pathlib import Path

from pyspark.sql import functions as F
from run_bench import RESULTS, _sizes_one, results_name

from retrysim.runner import simulate
from retrysim.scenario.loading import load_scenario
from retrysim.session import build_session

BENCH = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenario", help="scenario YAML (default bench/scenario.yaml at --size messages)"
    )
    parser.add_argument(
        "--size", type=_sizes_one, help="messages (default 10M; another --scenario: its own)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs in the one session (3)")
    parser.add_argument("--tables", choices=("full", "lean"), default="full")
    parser.add_argument("--no-validate", dest="validate", action="store_false")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument(
        "--results",
        help="JSON results file (default: the configuration's own, "
        "bench/results/warm-<tables>[-novalidate]-<size>.json)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: use 1 or more")
    path = Path(args.scenario) if args.scenario else BENCH / "scenario.yaml"
    if args.size is None and not args.scenario:
        args.size = 10_000_000
    sets = [] if args.size is None else [f"groups.0.workload.messages={args.size}"]
    scenario = load_scenario(path, sets)
    size = sum(group.workload.messages for group in scenario.groups)
    prefix = "warm-" if not args.scenario else f"warm-{path.stem}-"
    results = (
        Path(args.results)
        if args.results
        else RESULTS / f"{prefix}{results_name(args.tables, args.validate, [size])}"
    )

    spark = build_session(
        "retrysim-warm-runs", args.master, {"spark.driver.memory": args.driver_memory}
    )
    output = tempfile.mkdtemp(prefix="retrysim-warm-")
    runs = []
    try:
        for number in range(1, args.runs + 1):
            result = simulate(
                spark,
                scenario,
                output=output,
                run_id=f"warm-{number}",
                tables=args.tables,
                validate=args.validate,
            )
            deliveries = result.summary.agg(F.sum("deliveries")).first()[0]
            runs.append(
                {
                    "run": number,
                    "sim_s": round(result.elapsed_s, 2),
                    "deliveries": deliveries,
                    "deliveries_per_s": round(deliveries / result.elapsed_s),
                }
            )
            print(
                f"run {number}/{args.runs}: {result.elapsed_s:.1f}s, {deliveries:,} deliveries, "
                f"{deliveries / result.elapsed_s:,.0f}/s",
                flush=True,
            )
    finally:
        spark.stop()
        shutil.rmtree(output, ignore_errors=True)
    report = {
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": {
            "scenario": str(path),
            "size": size,
            "tables": args.tables,
            "validate": args.validate,
            "master": args.master,
            "driver_memory": args.driver_memory,
        },
        "runs": runs,
    }
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
