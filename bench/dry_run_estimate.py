"""``simulate --dry-run``'s time estimate against the real run, on every scenario of conf/
(the top-level ``conf/*.yaml``): each is estimated (``--dry-run``), then run for real through
``./spark-submit.sh`` launch to exit, reports drawn, as a user runs it; the estimate must be
within 2x of the real time either way.

    .venv/bin/python bench/dry_run_estimate.py [--master local[2]] [--results FILE]

It prints one line per scenario (estimate, real time, ratio) and writes them as JSON
(default bench/results/dry-run-estimate.json); exit code 1 when one is off by more than 2x.
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
WITHIN = 2.0
# the estimate for the machine as it is now where it is busy, else the quiet one
_ESTIMATE = re.compile(r"about (\d+) s (?:now|launch to exit on a quiet 2-core machine$)")


def _run(command: list[str]) -> tuple[float, str]:
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    return wall, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--results", default=str(RESULTS / "dry-run-estimate.json"))
    args = parser.parse_args(argv)
    rows = []
    for scenario in sorted((ROOT / "conf").glob("*.yaml")):
        folder = tempfile.mkdtemp(prefix="retrysim-dry-run-")
        try:
            job = ["jobs/simulate.py", "--scenario", str(scenario), "--output", folder]
            job += ["--master", args.master]
            _, printed = _run([sys.executable, *job, "--dry-run"])
            line = printed.strip().splitlines()[-1]
            estimate = float(_ESTIMATE.findall(line)[-1])
            real, _ = _run([str(ROOT / "spark-submit.sh"), *job])
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        ratio = estimate / real
        within = 1 / WITHIN <= ratio <= WITHIN
        rows.append(
            {"scenario": scenario.name, "estimate_s": estimate, "real_s": round(real, 2),
             "ratio": round(ratio, 3), "within": within, "dry_run": line}
        )  # fmt: skip
        print(f"{scenario.name:<24} estimate {estimate:5.0f} s  real {real:6.1f} s  x{ratio:.2f}  "
              f"({line.split('; ')[-1] if 'now' in line else 'quiet'})", flush=True)  # fmt: skip
    result = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {"cores": os.cpu_count(), "python": platform.python_version()},
        "load_average": os.getloadavg(),
        "master": args.master,
        "runs": rows,
        "all_within_2x": all(row["within"] for row in rows),
    }
    Path(args.results).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"all within {WITHIN:g}x: {result['all_within_2x']} ({args.results})")
    return 0 if result["all_within_2x"] else 1


if __name__ == "__main__":
    sys.exit(main())
