"""The ``retrysim`` command: argparse and dispatch; each subcommand lives in its own module.

Bad input exits with code 2 and one line naming the field and what is allowed; a broken
invariant exits with code 1.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from retrysim.checks.validate import ValidationError
from retrysim.cli import (
    calibrate,
    compare,
    conformance,
    digest,
    export,
    plan,
    plans,
    report,
    runs,
    simulate,
    validate,
)
from retrysim.cli.arguments import Parser, add_scenario_command, job_parser
from retrysim.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    claim_process,
    stderr_to_the_launcher,
)
from retrysim.scenario.errors import ScenarioError

# Each command's parser and its run, looked up when called (so a test can replace one).
COMMANDS = {
    "simulate": (
        functools.partial(add_scenario_command, name="simulate"),
        lambda args: simulate.simulate_command(args),
    ),
    "digest": (digest.add_digest_command, lambda args: digest.digest_command(args)),
    "validate": (validate.add_validate_command, lambda args: validate.validate_command(args)),
    "plan": (
        functools.partial(add_scenario_command, name="plan"),
        lambda args: plan.plan_command(args),
    ),
    "plans": (plans.add_plans_command, lambda args: plans.plans_command(args)),
    "report": (report.add_report_command, lambda args: report.report_command(args)),
    "runs": (runs.add_runs_command, lambda args: runs.runs_command(args)),
    "conformance": (
        functools.partial(add_scenario_command, name="conformance"),
        lambda args: conformance.conformance_command(args),
    ),
    "calibrate": (
        calibrate.add_calibrate_command,
        lambda args: calibrate.calibrate_command(args),
    ),
    "compare": (compare.add_compare_command, lambda args: compare.compare_command(args)),
    "export": (export.add_export_command, lambda args: export.export_command(args)),
}


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="retrysim", description="Simulate RocketMQ consumer retry and dead-letter flow."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for add, _run in COMMANDS.values():
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None, job: str | None = None) -> int:
    """Run ``retrysim COMMAND ARGS`` (``argv``), or with ``job`` the job that runs that
    command alone (``jobs/simulate.py ARGS``), under the program name the user ran."""
    stderr_to_the_launcher()
    if job is None:
        args = _parser().parse_args(argv)
    else:
        prog = os.environ.get("RETRYSIM_PROG") or sys.argv[0]
        args = job_parser(job, prog).parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except ScenarioError as error:
        print(f"retrysim: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValidationError as error:
        print(f"retrysim: error: {error}", file=sys.stderr)
        return EXIT_FAILED


def run_script(argv: Sequence[str] | None = None) -> int:
    """The ``retrysim`` script's run of a command: :func:`main`, in a process of its own."""
    claim_process()
    return main(argv)


def run_job(command: str) -> NoReturn:
    """A jobs/ entrypoint: ``command`` with this process's arguments (:func:`run_process`)."""
    run_process(sys.argv[1:], job=command)


def run_process(argv: Sequence[str] | None = None, job: str | None = None) -> NoReturn:
    """Run a command as the whole work of this process, then end it with the command's exit
    code. What a normal exit does that matters still happens (other threads finish, exit
    handlers run, output is flushed); the interpreter's teardown of its modules (numba,
    pyarrow, pandas, PySpark: work spent on memory the operating system frees at once
    anyway) is skipped. An exception or argparse's exit ends the process as ever."""
    claim_process()
    code = main(argv, job)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run_process()
