"""The notebooks run top to bottom (nbclient) on a small scenario, so they cannot rot.

Both notebooks run in one kernel process, one after the other, so a single JVM starts and
warms up (each notebook's ``build_session`` gets the kernel's local[2] session); the second
notebook starts with ``%reset -f``, so it cannot lean on a name the first one defined. The
kernel writes to a temporary folder: the parameters cell reads ``RETRYSIM_NOTEBOOK_SMALL``
and ``RETRYSIM_NOTEBOOK_OUTPUT``. The test session's Spark is not used, so the two never
clash.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import nbformat
import pytest
from support import PROJECT, QUICK_JVM

from retrysim.tables.schemas import ATTEMPTS

pytestmark = pytest.mark.spark  # spark-submit runs, each in its own JVM
PLOTLY = "application/vnd.plotly.v1+json"  # a figure's JSON, without the library
KEPT_AT_MOST = 1_000_000  # bytes of a kept notebook

_spec = importlib.util.spec_from_file_location(
    "refresh_notebooks", PROJECT / "scripts" / "refresh_notebooks.py"
)
refresh_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refresh_notebooks)


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[dict[str, nbformat.NotebookNode], Path]:
    output = tmp_path_factory.mktemp("notebooks") / "out"
    environment = {
        "RETRYSIM_NOTEBOOK_SMALL": "1",
        "RETRYSIM_NOTEBOOK_OUTPUT": str(output),
        "PYSPARK_SUBMIT_ARGS": f'--conf "spark.driver.extraJavaOptions={QUICK_JVM}" pyspark-shell',
    }
    return refresh_notebooks.execute(environment), output


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
    assert len(_outputs(notebook, PLOTLY)) >= 5  # states, rates, levels, backlog, DLQ
    text = _text(notebook)
    assert "deliveries, ends in" in text and "messages reached the DLQ" in text
    assert " days " not in text  # durations as the report writes them: 11m40s
    # the first figure is the report's: the outage shaded, the pool's lines, the instances
    (states, *_) = _outputs(notebook, PLOTLY)
    layout, names = states[PLOTLY]["layout"], {t.get("name") for t in states[PLOTLY]["data"]}
    assert [s for s in layout["shapes"] if s["type"] == "rect"]  # the outage
    assert {"pool: 80 threads", "each instance's pool: 20 threads"} <= names
    assert (output / "reports" / "explore.html").is_file()
    assert (output / "summary" / "_delta_log").is_dir()
    # DESCRIBE TABLE explains the columns, DESCRIBE HISTORY names the run its commit published
    assert ATTEMPTS["delivery"].metadata["comment"][:30] in text
    assert '{"step":"publish","run_ids":["explore"]}'[:40] in text


def test_capacity_plan_notebook(executed):
    notebooks, output = executed
    notebook = notebooks["02_capacity_plan.ipynb"]
    assert len(_outputs(notebook, PLOTLY)) >= 1  # the trade-off curves
    text = _text(notebook)
    # 300 orders in 1.5 s: 4 threads leave a Ready backlog above 100, 16 threads do not.
    assert "group checkout: 16 consumer threads" in text
    assert "binding: max_ready_backlog" in text
    # three replications per point, the recommendation judged on their share
    assert "2 points x 3 replications" in text and "of 3 replications (confidence 80%)" in text
    assert (output / "reports" / "notebook-plan.html").is_file()
    assert (output / "plan" / "_delta_log").is_dir()


def test_the_kept_notebooks_are_small_and_hold_no_jvm_noise_or_machine_paths():
    """What scripts/refresh-notebooks.sh keeps (refresh_notebooks.without_noise): no Spark
    WARN lines, no path of the machine that ran them, no copy of the charting library."""
    for name in refresh_notebooks.ORDER:
        path = refresh_notebooks.NOTEBOOKS / name
        assert path.stat().st_size < KEPT_AT_MOST, name
        kept = nbformat.read(path, as_version=4)
        outputs = json.dumps([cell.get("outputs", []) for cell in kept.cells])
        assert " WARN " not in outputs and "log4j" not in outputs, name
        assert "/work/" not in outputs and "/tmp/" not in outputs, name
        assert "plotly.min.js" not in outputs and "Plotly.newPlot" not in outputs, name


def _kinds(cell: nbformat.NotebookNode) -> list[tuple[str, ...]]:
    """A cell's results and displays (text streams split as the kernel flushes them)."""
    outputs = [out for out in cell.get("outputs", []) if out["output_type"] != "stream"]
    return [(out["output_type"], *sorted(out.get("data", {}))) for out in outputs]


def test_the_notebooks_are_kept_with_the_outputs_of_their_small_run(executed):
    """scripts/refresh-notebooks.sh keeps the outputs of the run the tests make: every code
    cell holds the same results and displays (tables, images) as here, in order."""
    notebooks, _ = executed
    for name in refresh_notebooks.ORDER:
        kept = nbformat.read(refresh_notebooks.NOTEBOOKS / name, as_version=4)
        run = notebooks[name]
        kept_cells = [cell for cell in kept.cells if cell.cell_type == "code"]
        run_cells = [cell for cell in run.cells if cell.cell_type == "code"]
        assert [cell.source for cell in kept_cells] == [cell.source for cell in run_cells]
        assert [_kinds(cell) for cell in kept_cells] == [_kinds(cell) for cell in run_cells], name
        assert all(cell.execution_count for cell in kept_cells), f"{name}: a cell never ran"
