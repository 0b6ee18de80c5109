"""What a job's input must pass before Spark starts, without Spark: the arguments (the
job's own parser), the scenario and the output folder. ``spark-submit.sh`` runs it
(``python -m retrysim.cli.precheck JOB [ARGS...]``) before spark-submit, so bad input is
one line and exit code 2 without a JVM start (about 2.5 s); the commands run the same
checks again, for the ways in that skip the launcher.

Its exit codes, for the launcher: 0, go on with spark-submit; 2, bad input (the line is
printed); :data:`EXIT_DONE`, done without Spark (``--help``, ``--dry-run``): exit 0. On a
go it writes the file the JVM's logs go to (OUTPUT/logs/COMMAND-TIME-PID.log) to the file
descriptor ``RETRYSIM_PRECHECK_FD`` names, where the launcher reads it.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from retrysim.cli.arguments import EXIT_BAD_INPUT, job_parser, stop
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import load_scenario

EXIT_GO, EXIT_DONE = 0, 3
# The jobs/ entrypoints and the command each runs (tests/cli hold them to jobs/*.py).
JOBS = {"simulate.py": "simulate", "capacity_plan.py": "plan", "conformance.py": "conformance"}
LOG_FOLDER = "logs"
LAUNCHER_FD = "RETRYSIM_PRECHECK_FD"  # the file descriptor spark-submit.sh reads, if it is set


def check_output_folder(output: str) -> str:
    """``--output`` as an absolute path, once it is known to be a folder the run can create
    and write: its nearest existing folder takes a new folder (made and removed at once),
    so a read-only or virtual file system (``/proc``) is named here, not later as a full
    disk or a failed write."""
    path = os.path.abspath(output)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ScenarioError("--output", f"{path} is a file; give a folder for the Delta tables")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ScenarioError("--output", f"{path}: {existing} is a file, not a folder")
    if os.statvfs(existing).f_blocks == 0:
        raise ScenarioError(
            "--output",
            f"{path}: {existing} is on a virtual file system that stores no files; give a "
            "folder on a disk",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ScenarioError("--output", f"{existing} is not a writable folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".retrysim-", dir=existing))
    except OSError as error:
        raise ScenarioError(
            "--output", f"{path}: cannot create a folder in {existing}: {error.strerror}"
        ) from None
    return path


def log_file(output: str, command: str) -> str:
    """Where the JVM's logs of one run of ``command`` go: under the output folder."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return os.path.join(output, LOG_FOLDER, f"{command}-{stamp}-{os.getpid()}.log")


def precheck(argv: Sequence[str]) -> int:
    """Check ``JOB ARGS...`` as the job will; the exit code for the launcher."""
    job, arguments = argv[0], list(argv[1:])
    command = JOBS.get(os.path.basename(job))
    if command is None:  # not one of retrysim's jobs: nothing to check
        return EXIT_GO
    prog = os.environ.get("RETRYSIM_PROG") or job
    try:
        args = job_parser(command, prog).parse_args(arguments)
    except SystemExit as end:  # --help (0), or an error line already printed (2)
        return EXIT_DONE if end.code == 0 else EXIT_BAD_INPUT
    try:
        load_scenario(args.scenario, args.overrides)
        output = check_output_folder(args.output)
    except ScenarioError as error:
        stop(str(error))
    if getattr(args, "dry_run", False):  # the job itself prints it, and starts no JVM
        code = subprocess.run([sys.executable, job, *arguments], check=False).returncode
        return EXIT_DONE if code == 0 else code
    descriptor = os.environ.get(LAUNCHER_FD, "")
    if descriptor.isdigit():  # the launcher reads the log file's name there
        with os.fdopen(int(descriptor), "w", encoding="utf-8") as launcher:
            launcher.write(log_file(output, command))
    return EXIT_GO


if __name__ == "__main__":
    sys.exit(precheck(sys.argv[1:]))
