"""The notebooks run top to bottom (nbclient) on a small scenario, so they cannot rot.

Both notebooks run in one kernel process, one after the other, so a single JVM starts and
warms up (each notebook's ``build_session`` gets the kernel's local[2] session); the second
notebook starts with ``%reset -f``, so it cannot lean on a name the first one defined. The
kernel writes to a temporary folder: the parameters cell reads ``RETRYSIM_NOTEBOOK_SMALL``
and ``RETRYSIM_NOTEBOOK_OUTPUT``. The test session's Spark is not used, so the two never
clash.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from support import PROJECT, QUICK_JVM

pytestmark = pytest.mark.spark  # spark-submit runs, each in its own JVM

NOTEBOOKS = PROJECT / "notebooks"
ORDER = ("01_explore_run.ipynb", "02_capacity_plan.ipynb")
CELL_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[dict[str, nbformat.NotebookNode], Path]:
    output = tmp_path_factory.mktemp("notebooks") / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RETRYSIM_NOTEBOOK_SMALL", "1")
        patch.setenv("RETRYSIM_NOTEBOOK_OUTPUT", str(output))
        patch.setenv(
            "PYSPARK_SUBMIT_ARGS",
            f'--conf "spark.driver.extraJavaOptions={QUICK_JVM}" pyspark-shell',
        )
        kernel = KernelManager(kernel_name="python3")
        kernel.start_kernel(cwd=str(NOTEBOOKS))
    notebooks = {}
    try:
        for index, name in enumerate(ORDER):
            notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
            if index:
                notebook.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))
            NotebookClient(notebook, km=kernel, timeout=CELL_TIMEOUT_S).execute()
            notebooks[name] = notebook
    finally:
        kernel.shutdown_kernel(now=True)
    return notebooks, output


def _outputs(notebook: nbformat.NotebookNode, kind: str) -> list:
    return [
        out.get("data", {})
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if kind in out.get("data", {})
    ]


def _text(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for cell in notebook.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            parts.append(out.get("text", "") + str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def test_explore_run_notebook(executed):
    notebooks, output = executed
    notebook = notebooks["01_explore_run.ipynb"]
    assert len(_outputs(notebook, "image/png")) >= 5  # states, rates, levels, backlog, DLQ
    text = _text(notebook)
    assert "deliveries, ends in" in text and "messages reached the DLQ" in text
    assert (output / "reports" / "explore.html").is_file()
    assert (output / "summary" / "_delta_log").is_dir()


def test_capacity_plan_notebook(executed):
    notebooks, output = executed
    notebook = notebooks["02_capacity_plan.ipynb"]
    assert len(_outputs(notebook, "image/png")) >= 1  # the trade-off curves
    text = _text(notebook)
    # 300 orders in 1.5 s: 4 threads leave a Ready backlog above 100, 16 threads do not.
    assert "group checkout: 16 consumer threads" in text
    assert "binding: max_ready_backlog" in text
    assert (output / "reports" / "notebook-plan.html").is_file()
    assert (output / "plan" / "_delta_log").is_dir()
