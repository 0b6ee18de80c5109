"""``retrysim calibrate`` on a day of 15-second samples (5,760 a series), launch to exit:
the 5.x family's series of one group (arrivals in 24 hourly levels, a one-hour outage, the
client's process-time histogram by status: 19 series, 109,000 samples) exported as a range
query's JSON and as Grafana's CSV; the target is under 10 s.

    .venv/bin/python bench/calibrate_day.py [--runs 3] [--results FILE]

It prints each run's time and writes them as JSON (default
bench/results/calibrate-day.json); exit code 1 when a median is 10 s or more.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' series drawn from a known truth

from metrics.synthetic import Truth, series, write_grafana_csv, write_json  # noqa: E402

TARGET_S = 10.0
BASE = """name: day
groups:
  - {name: payments, topic: orders, flavor: rocketmq5.push, consumers: {instances: 2, threads: 20}}
"""


def day() -> Truth:
    """A daily curve: 24 hourly levels between 20 and 120 messages a second, an outage from
    13:07:30 to 14:07:30 at 60 % failures."""
    hours = [20 + 100 * max(0.0, 1 - abs(h - 13) / 8) for h in range(24)]
    pieces = tuple(((h + 1) * 3600.0, round(rate, 1)) for h, rate in enumerate(hours))
    return Truth(pieces=pieces, outage=(13 * 3600 + 450.0, 14 * 3600 + 450.0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--results", default=str(BENCH / "results" / "calibrate-day.json"))
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="retrysim-calibrate-day-"))
    drawn = series(day())
    files = {"json": write_json(folder / "day.json", drawn),
             "csv": write_grafana_csv(folder / "day.csv", drawn)}  # fmt: skip
    (folder / "base.yaml").write_text(BASE)
    rows = {}
    for kind, path in files.items():
        walls = []
        for _ in range(args.runs):
            command = [sys.executable, "-m", "retrysim", "calibrate", "--metrics", str(path),
                       "--group", "payments", "--scenario", str(folder / "base.yaml"),
                       "--output", str(folder / f"{kind}.yaml")]  # fmt: skip
            began = time.monotonic()
            subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
            walls.append(round(time.monotonic() - began, 3))
            print(f"{kind}: {walls[-1]:.2f} s")
        rows[kind] = {"file_mb": round(path.stat().st_size / 1e6, 1), "walls_s": walls,
                      "median_s": statistics.median(walls)}  # fmt: skip
    result = {
        "bench": "calibrate-day", "samples_per_series": 5_760, "series": len(drawn),
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                 "load_1m": round(os.getloadavg()[0], 2)},
        "target_s": TARGET_S, **rows,
    }  # fmt: skip
    Path(args.results).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(row["median_s"] < TARGET_S for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
