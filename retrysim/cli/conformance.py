"""``retrysim conformance`` (also ``jobs/conformance.py``): a scenario on a real RocketMQ broker
and in retrysim, one line per figure; exit 0 only when every figure is within tolerance.

The scenario is checked against what the broker harness can run before anything starts.
"""

from __future__ import annotations

import argparse
import sys

from retrysim.cli.common import EXIT_FAILED, EXIT_OK, check_output, logs_to_file, say
from retrysim.conformance.harness import HarnessError, UnsupportedScenario
from retrysim.conformance.run import check_runnable, run_conformance
from retrysim.runner import check_run_id, default_run_id
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import load_scenario
from retrysim.session import build_session, stop_session
from retrysim.store.sinks import choose_sink


def format_figures(results) -> str:
    """One line per group and figure: retrysim, broker, tolerance, within or not."""
    wide = max((len(f.figure) for result in results for f in result.figures), default=6)
    lines = [f"{'group':<14} {'figure':<{wide}} {'retrysim':>10} {'broker':>10} {'tolerance':>9}  "
             "within"]  # fmt: skip
    for result in results:
        for f in result.figures:
            within = "yes" if f.within else "NO"
            lines.append(f"{result.group:<14} {f.figure:<{wide}} {f.retrysim:>10g} "
                         f"{f.broker:>10g} {f.tolerance:>9g}  {within}")  # fmt: skip
    return "\n".join(lines)


def conformance_command(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario, args.overrides)
    output = check_output(args.output)
    run_id = check_run_id(args.run_id or default_run_id(scenario))
    try:
        simulated = check_runnable(scenario)
    except UnsupportedScenario as refused:
        raise ScenarioError("--scenario", str(refused)) from None
    log = logs_to_file(output, "conformance")
    spark = build_session(f"retrysim:conformance:{scenario.name}", args.master, log_file=log)
    try:
        results = run_conformance(
            spark, scenario, output, run_id, choose_sink(spark), say, simulated
        )
    except HarnessError as failed:
        print(f"retrysim: error: the broker harness: {failed}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        stop_session(spark)
    print(format_figures(results), flush=True)
    within = all(f.within for result in results for f in result.figures)
    say(f"conformance {run_id}: {'every figure within tolerance' if within else 'differences'}; "
        f"tables: {output}/{{conformance,broker_deliveries}}")  # fmt: skip
    return EXIT_OK if within else EXIT_FAILED
