"""``retrysim calibrate``: a scenario fitted to a group's Prometheus or Grafana exports."""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

from retrysim.cli.common import add_metrics_arguments
from retrysim.metrics.calibrate import calibrate, traffic_path
from retrysim.metrics.reading import MetricsError, observe, read_exports
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import DEFAULT_SCENARIO_PATH, load_yaml

_POOL = re.compile(r"^\s*(\d+)\s*[xX*:]\s*(\d+)\s*$")


def add_calibrate_command(commands: argparse._SubParsersAction) -> None:
    """``retrysim calibrate --metrics FILE... --group G [--scenario BASE] --output OUT.yaml``."""
    command = commands.add_parser(
        "calibrate",
        help="fit a scenario to a group's Prometheus or Grafana metric exports",
        description="Fit the group's arrival profile, failure probability with its outage "
        "windows, processing time and (where the series show it) consumer pool to RocketMQ "
        "metrics exported from Prometheus (a range query's JSON) or Grafana (table-view CSV), "
        "both 5.x and exporter (4.x) names. The flavor, its retry policy and the delay table "
        "come from --scenario (default: the embedded default scenario). Writes OUT.yaml, each "
        "fitted value commented with its series and fit.",
    )
    add_metrics_arguments(command, "the consumer group to fit", group_required=True)
    command.add_argument("--scenario", help="the base scenario (default: conf/default.yaml)")
    command.add_argument("--consumers", metavar="INSTANCESxTHREADS",
                         help="the pool, over what the series show (e.g. 4x20)")  # fmt: skip
    command.add_argument("--output", required=True, help="the scenario YAML to write")


def _pool(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    match = _POOL.match(text)
    if (
        not match
        or not 1 <= int(match.group(1)) <= 100_000
        or not 1 <= int(match.group(2)) <= 1_000
    ):
        raise ScenarioError(
            "--consumers", f"value {text!r}: INSTANCESxTHREADS, instances 1-100000, threads 1-1000"
        )
    return {"instances": int(match.group(1)), "threads": int(match.group(2))}


def _write(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: beside it first, then renamed."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)


def calibrate_command(args: argparse.Namespace) -> int:
    began = time.perf_counter()
    output = Path(args.output)
    if output.suffix not in (".yaml", ".yml"):
        raise ScenarioError("--output", f"value {args.output!r}: a .yaml file to write")
    if not output.parent.is_dir():
        raise ScenarioError("--output", f"{output.parent}: no such folder")
    consumers = _pool(args.consumers)
    base = load_yaml(args.scenario or DEFAULT_SCENARIO_PATH)
    try:
        observed = observe(read_exports(args.metrics), args.group, args.topic)
        text, traffic = calibrate(observed, base, args.group, output, consumers)
    except MetricsError as error:
        raise ScenarioError("--metrics", str(error)) from None
    if traffic is not None:  # written first: the scenario names it
        _write(traffic_path(output), traffic.to_csv(index=False))
    _write(output, text)
    print(f"retrysim: calibrated {args.group} from {len(args.metrics)} file(s) "
          f"in {time.perf_counter() - began:.1f}s: {output}")  # fmt: skip
    print(text, end="")
    return 0
