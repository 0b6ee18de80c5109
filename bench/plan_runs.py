"""A plan's many runs against one run of one point, launch to exit: what a sweep with
replications costs over the single run it is made of.

    .venv/bin/python bench/plan_runs.py                 # flash sale at 20,000: 4 points x 5
    .venv/bin/python bench/plan_runs.py --scenario conf/default.yaml --messages 100000 \\
        --sweep consumers.threads=10,20,40,80 --replications 25 --point consumers.threads=20

Both are the console script in a new process each (``retrysim simulate`` of the one point,
then ``retrysim plan``), reports drawn, as a user runs them. It prints and writes (JSON) the
two wall times, the plan's own elapsed time and the ratio.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
RETRYSIM = [sys.executable, "-m", "retrysim"]


def _timed(command: list[str]) -> tuple[float, str]:
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    return wall, done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="conf/flash-sale.yaml")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--over", help="workload.over (default: the scenario's)", default="100s")
    parser.add_argument("--sweep", default="consumers.instances=2,4,8,16")
    parser.add_argument("--replications", type=int, default=5)
    parser.add_argument("--point", default="consumers.instances=8", help="the one run's setting")
    parser.add_argument(
        "--target", action="append", help="a plan target (default p99_time_to_commit=1m)"
    )
    parser.add_argument("--results", help="JSON file (default bench/results/plan-<name>.json)")
    args = parser.parse_args(argv)
    args.target = args.target or ["p99_time_to_commit=1m"]
    sets = [f"groups.0.workload.messages={args.messages}"]
    if args.over:
        sets.append(f"groups.0.workload.over={args.over}")
    flags = [flag for value in sets for flag in ("--set", value)]
    points = len(args.sweep.split("=", 1)[1].split(","))
    runs = points * args.replications
    output = tempfile.mkdtemp(prefix="retrysim-plan-bench-")
    try:
        one, said = _timed(
            [*RETRYSIM, "simulate", "--scenario", args.scenario, *flags, "--set",
             f"groups.0.{args.point}", "--output", f"{output}/one", "--quiet"]
        )  # fmt: skip
        run_s = float(re.search(r"finished in ([\d.]+)s", said).group(1))
        targets = [flag for value in args.target for flag in ("--target", value)]
        plan, said = _timed(
            [*RETRYSIM, "plan", "--scenario", args.scenario, *flags, "--sweep", args.sweep,
             "--replications", str(args.replications), *targets, "--output", f"{output}/plan",
             "--quiet"]
        )  # fmt: skip
        plan_s = float(re.search(r"^plan \S+: .* in (\d+)s$", said, re.MULTILINE).group(1))
    finally:
        shutil.rmtree(output, ignore_errors=True)
    name = Path(args.scenario).stem
    document = {
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "config": {
            "scenario": args.scenario,
            "messages": args.messages,
            "over": args.over,
            "sweep": args.sweep,
            "replications": args.replications,
            "runs": runs,
            "point": args.point,
            "targets": args.target,
        },
        "one_run": {"wall_s": round(one, 2), "simulate_s": run_s},
        "plan": {"wall_s": round(plan, 2), "plan_s": plan_s, "per_run_s": round(plan_s / runs, 2)},
        "ratio_wall": round(plan / one, 2),
    }
    default = f"plan-{name}-{args.messages}-{points}x{args.replications}.json"
    path = Path(args.results) if args.results else RESULTS / default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(
        f"one run: {one:.1f}s wall ({run_s:.1f}s simulate); plan of {runs} runs: {plan:.1f}s "
        f"wall ({plan_s:.0f}s in the plan, {plan_s / runs:.2f}s a run): {plan / one:.2f}x\n"
        f"wrote {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
