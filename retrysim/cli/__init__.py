"""The command line: argparse and printing only; the work is the library's."""

from retrysim.cli.main import main

__all__ = ["main"]
