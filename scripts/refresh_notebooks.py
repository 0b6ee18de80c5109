"""Run the notebooks top to bottom on their small scenario and keep their outputs.

    ./scripts/refresh-notebooks.sh        # rewrites notebooks/*.ipynb with fresh outputs

Both notebooks run in one kernel, one after the other (one JVM starts and warms up); the
second starts with ``%reset -f``, so it cannot lean on a name the first defined. The tests
run them the same way (tests/test_notebooks.py) and hold the kept outputs to theirs.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
ORDER = ("01_explore_run.ipynb", "02_capacity_plan.ipynb")
CELL_TIMEOUT_S = 600


def execute(environment: Mapping[str, str]) -> dict[str, nbformat.NotebookNode]:
    """Each notebook of ORDER, executed in one kernel started with ``environment`` added."""
    kernel = KernelManager(kernel_name="python3")
    kernel.start_kernel(cwd=str(NOTEBOOKS), env={**os.environ, **environment})
    executed = {}
    try:
        for index, name in enumerate(ORDER):
            notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
            if index:
                notebook.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))
            NotebookClient(notebook, km=kernel, timeout=CELL_TIMEOUT_S).execute()
            if index:
                notebook.cells.pop(0)
            executed[name] = notebook
    finally:
        kernel.shutdown_kernel(now=True)
    return executed


# The JVM's own lines on the kernel's stderr (log4j's start, WARN lines, the JDK's notice):
# noise in a kept notebook, and they name the machine.
_JVM_NOISE = re.compile(
    r"^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN .*|WARNING: Using incubator modules.*"
    r"|Using Spark's default log4j profile.*|Setting default log level to .*"
    r"|To adjust logging level use .*)$\n?",
    re.MULTILINE,
)


def without_noise(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``notebook`` with the JVM's lines taken out of its text streams (a stream left empty
    goes) and the cells' timings dropped: what is kept is what the library printed."""
    for cell in notebook.cells:
        cell.get("metadata", {}).pop("execution", None)  # timings: noise in a diff
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                out["text"] = _JVM_NOISE.sub("", out["text"])
        cell.outputs = [
            out for out in cell.outputs if out["output_type"] != "stream" or out["text"]
        ]
    return notebook


def main() -> int:
    for name, notebook in execute({"RETRYSIM_NOTEBOOK_SMALL": "1"}).items():
        without_noise(notebook)
        nbformat.write(notebook, NOTEBOOKS / name)
        print(f"retrysim: {name}: outputs kept", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
