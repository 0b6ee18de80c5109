"""The command line: argparse and printing only; the work is the library's.

The commands (``retrysim.cli.main``) are imported when the ``retrysim`` script runs one, not
with this package, so that ``retrysim.cli.precheck`` checks a job's input without their
imports (Spark, pandas).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import import_module


def main(argv: Sequence[str] | None = None) -> int:
    """The ``retrysim`` script's entry: :func:`retrysim.cli.main.run_script`. (Once that
    module is imported, ``retrysim.cli.main`` names it, as a submodule does; the script
    holds this function.)"""
    return import_module("retrysim.cli.main").run_script(argv)


__all__ = ["main"]
