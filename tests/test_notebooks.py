"""The notebooks run top to bottom (nbclient) on a small scenario, so they cannot rot.

Each notebook runs in its own kernel process, which starts its own local Spark session
(``retrysim.build_session``, local[2]) and writes to a temporary folder: the parameters
cell reads ``RETRYSIM_NOTEBOOK_SMALL`` and ``RETRYSIM_NOTEBOOK_OUTPUT``. The test session's
Spark is not used, so the two never clash.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT_S = 600
# As in test_determinism: a short-lived JVM runs faster with the C1 compiler alone.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _execute(name: str, output: Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("RETRYSIM_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("RETRYSIM_NOTEBOOK_OUTPUT", str(output))
    monkeypatch.setenv(
        "PYSPARK_SUBMIT_ARGS", f'--conf "spark.driver.extraJavaOptions={QUICK_JVM}" pyspark-shell'
    )
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()
    return notebook


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


def test_explore_run_notebook(tmp_path, monkeypatch):
    notebook = _execute("01_explore_run.ipynb", tmp_path / "out", monkeypatch)
    assert len(_outputs(notebook, "image/png")) >= 5  # states, rates, levels, backlog, DLQ
    text = _text(notebook)
    assert "deliveries, ends in" in text and "messages reached the DLQ" in text
    assert (tmp_path / "out" / "reports" / "explore.html").is_file()
    assert (tmp_path / "out" / "summary" / "_delta_log").is_dir()


def test_capacity_plan_notebook(tmp_path, monkeypatch):
    notebook = _execute("02_capacity_plan.ipynb", tmp_path / "out", monkeypatch)
    assert len(_outputs(notebook, "image/png")) >= 1  # the trade-off curves
    text = _text(notebook)
    assert "group checkout" in text and "consumer threads" in text
    assert (tmp_path / "out" / "reports" / "notebook-plan.html").is_file()
    assert (tmp_path / "out" / "plan" / "_delta_log").is_dir()
