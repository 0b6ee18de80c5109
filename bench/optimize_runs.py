"""What ``retrysim runs optimize`` buys the usual filters: a folder of several runs, each
filter timed through delta-spark before and after compaction with Z-order on group and
msg_id (and after compaction alone, in a copy), writing
``bench/results/optimize-<runs>x<messages>.json``.

    .venv/bin/python bench/optimize_runs.py                 # 4 runs of 1M messages
    .venv/bin/python bench/optimize_runs.py --runs 2 --messages 200k

The filters are a planner's: one message's deliveries in one run (``msg_id = k``), one
group's attempts of one run counted, and the DLQ moves of one run. Each is run ``--repeat``
times in one warm session; the median counts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltalake import DeltaTable  # noqa: E402

from retrysim import build_session, load_scenario, read_table, simulate  # noqa: E402
from retrysim.store.runs import optimize  # noqa: E402
from retrysim.store.sinks import table_path  # noqa: E402

BENCH = ROOT / "bench"
GROUP = "bench-consumer"  # bench/scenario.yaml's one group


def _count(text: str) -> int:
    text = text.lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1], 1)
    return int(float(text.rstrip("km")) * scale)


def filters(spark, output: str, run_id: str, msg_id: int) -> dict[str, callable]:
    attempts = f"delta.`{table_path(output, 'attempts')}`"
    dead = f"delta.`{table_path(output, 'dead_letters')}`"
    return {
        "one message's deliveries": lambda: spark.sql(
            f"SELECT * FROM {attempts} WHERE run_id = '{run_id}' AND msg_id = {msg_id}"
        ).collect(),
        "one group's attempts counted": lambda: spark.sql(
            f"SELECT count(*) FROM {attempts} WHERE run_id = '{run_id}' AND `group` = '{GROUP}'"
        ).collect(),
        "one run's DLQ moves": lambda: spark.sql(
            f"SELECT count(*) FROM {dead} WHERE run_id = '{run_id}'"
        ).collect(),
    }


def timed(spark, output: str, run_id: str, msg_id: int, repeat: int) -> dict[str, float]:
    medians = {}
    for name, query in filters(spark, output, run_id, msg_id).items():
        seconds = []
        for _ in range(repeat):
            began = time.perf_counter()
            query()
            seconds.append(time.perf_counter() - began)
        medians[name] = round(statistics.median(seconds), 3)
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--messages", type=_count, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out-dir", default=str(BENCH / "out" / "optimize"))
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    shutil.rmtree(out, ignore_errors=True)
    spark = build_session("retrysim-optimize-bench", master="local[2]",
                          conf={"spark.driver.memory": "4g"})  # fmt: skip
    scenario = load_scenario(
        BENCH / "scenario.yaml", [f"groups.0.workload.messages={args.messages}"]
    )
    base = str(out / "runs")
    for k in range(args.runs):
        simulate(spark, scenario, output=base, run_id=f"r{k}", tables="lean", validate=False)
    compacted = str(out / "compacted")
    shutil.copytree(base, compacted)
    run_id, msg_id = f"r{args.runs // 2}", args.messages // 3
    files = {}
    results = {"before": timed(spark, base, run_id, msg_id, args.repeat)}
    files["before"] = len(DeltaTable(table_path(base, "attempts")).file_uris())
    began = time.perf_counter()
    optimize(base, zorder=True, spark=spark)
    results["optimize_zorder_s"] = round(time.perf_counter() - began, 1)
    began = time.perf_counter()
    optimize(compacted, zorder=False, spark=spark)
    results["optimize_compact_s"] = round(time.perf_counter() - began, 1)
    results["after_zorder"] = timed(spark, base, run_id, msg_id, args.repeat)
    results["after_compaction_only"] = timed(spark, compacted, run_id, msg_id, args.repeat)
    files["after"] = len(DeltaTable(table_path(base, "attempts")).file_uris())
    rows = read_table(spark, base, "attempts").where(f"run_id = '{run_id}'").count()
    report = {
        "config": {"runs": args.runs, "messages": args.messages, "repeat": args.repeat,
                   "scenario": "bench/scenario.yaml", "tables": "lean", "sink": "delta-spark"},
        "host": {"cpus": os.cpu_count()},
        "attempts_rows_per_run": rows,
        "attempts_files": files,
        "median_s": results,
    }  # fmt: skip
    label = f"{args.runs}x{args.messages // 1_000_000}M" if args.messages >= 1_000_000 else (
        f"{args.runs}x{args.messages // 1_000}k")  # fmt: skip
    path = BENCH / "results" / f"optimize-{label}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
