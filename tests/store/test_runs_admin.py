"""``retrysim runs list | show | delete | vacuum`` on real runs (retrysim.store.runs).

* list and show give each run's status, scenario, sizes (the summary's) and files; list
  filters by scenario and status, and show prints every column of the runs row in order;
* delete removes the run from every table, its ``runs`` row first: a deleter that fails
  after that commit leaves rows no reader sees, and the next recovery removes them; a run
  a live writer holds is refused, and so is a run that is not there;
* vacuum refuses a retention under the tables' own unless forced, and then leaves on disk
  exactly the files the tables' current versions reference (a run published twice, and a
  deleted one, no longer double or linger for a plain Parquet reader).
"""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

import pytest
from deltalake import DeltaTable
from support import retrying_scenario

from retrysim.cli.main import main
from retrysim.runner import simulate
from retrysim.scenario.errors import ScenarioError
from retrysim.store import recovery
from retrysim.store.lease import acquire_lease
from retrysim.store.recovery import recover
from retrysim.store.runs import delete_run, list_runs, run_rows_by_id
from retrysim.store.sinks import complete_run_ids, read_table, table_path
from retrysim.tables.schemas import PARTITION_COLUMN, RUNS, TABLE_ORDER

SCENARIO = retrying_scenario("admin", seed=5, messages=120)


def _run(spark, output: Path, run_id: str) -> None:
    simulate(spark, SCENARIO, output=str(output), run_id=run_id, validate=False)


def _partitions(output: Path) -> dict[str, set[str]]:
    tables = {table: DeltaTable(table_path(str(output), table)) for table in TABLE_ORDER}
    return {
        table: {part[PARTITION_COLUMN] for part in delta.partitions()}
        for table, delta in tables.items()
    }


def _files_on_disk(output: Path) -> set[str]:
    return {str(path.relative_to(output)) for path in output.glob("*/run_id=*/*.parquet")}


def _files_referenced(output: Path) -> set[str]:
    return {
        str(Path(uri.removeprefix("file://")).relative_to(output))
        for table in TABLE_ORDER
        for uri in DeltaTable(table_path(str(output), table)).file_uris()
    }


@pytest.fixture
def two_runs(spark, tmp_path):
    output = tmp_path / "out"
    _run(spark, output, "first")
    _run(spark, output, "second")
    return output


def test_list_and_show_give_each_runs_status_sizes_and_files(two_runs, spark, capsys):
    found = {run.run_id: run for run in list_runs(str(two_runs))}
    summary = {
        row["run_id"]: row
        for row in read_table(spark, str(two_runs), "summary").collect()
    }  # fmt: skip
    assert set(found) == {"first", "second"}
    for run_id, run in found.items():
        assert (run.status, run.scenario, run.tables, run.groups) == (
            "complete",
            "admin",
            "full",
            1,
        )
        assert (run.messages, run.deliveries) == (120, summary[run_id]["deliveries"])
        files = [path for path in _files_referenced(two_runs) if f"run_id={run_id}/" in path]
        assert run.files == len(files) >= len(TABLE_ORDER)
        assert run.bytes > 0

    assert main(["runs", "list", "--output", str(two_runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run_id", "status", "scenario"]
    assert [line.split()[:2] for line in lines[1:]] == [
        ["first", "complete"],
        ["second", "complete"],
    ]
    listing = ["runs", "list", "--output", str(two_runs)]
    assert main([*listing, "--scenario", "admin", "--status", "complete"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]] == [
        "first",
        "second",
    ]
    for other in (["--scenario", "other"], ["--status", "publishing"], ["--plan-id", "first"]):
        assert main([*listing, *other]) == 0
        assert capsys.readouterr().out.strip() == f"no runs in {two_runs} that match"

    assert main(["runs", "show", "--output", str(two_runs), "--run-id", "second"]) == 0
    shown = capsys.readouterr().out
    assert "status: complete" in shown and f"deliveries: {found['second'].deliveries:,}" in shown
    # every column of the runs row, in the schema's order, then the sizes; the scenario as
    # indented JSON
    lines = shown.splitlines()
    fields = [line.split(":")[0] for line in lines if not line.startswith(" ")]
    sizes = ["groups", "messages", "deliveries", "dlq", "files", "bytes"]
    assert fields == [*RUNS.fieldNames(), *sizes]
    row = run_rows_by_id(str(two_runs))["second"]
    start = lines.index("config_json:") + 1
    block = list(itertools.takewhile(lambda line: line.startswith("  "), lines[start:]))
    assert json.loads(textwrap.dedent("\n".join(block))) == json.loads(row["config_json"])
    assert len(block) > 10  # one key a line
    for name in ("seed", "engine_version", "replication_of", "replication", "point"):
        assert f"{name}: {'-' if row[name] is None else row[name]}" in lines


def test_delete_removes_a_run_from_every_table_its_runs_row_first(two_runs, monkeypatch, capsys):
    assert main(["runs", "delete", "--output", str(two_runs), "--run-id", "first"]) == 0
    assert complete_run_ids(str(two_runs)) == ["second"]
    assert all(parts == {"second"} for parts in _partitions(two_runs).values())
    assert main(["runs", "delete", "--output", str(two_runs), "--run-id", "first"]) == 2
    assert "no run 'first'" in capsys.readouterr().err

    # a deleter that dies after the runs row: readers see nothing of the run, recovery
    # removes what is left
    real = recovery.drop_partitions
    calls = []

    def dies_after_the_runs_row(snapshot, table, run_ids):
        calls.append(table)
        if len(calls) > 1:
            raise OSError("the deleter died")
        real(snapshot, table, run_ids)

    monkeypatch.setattr(recovery, "drop_partitions", dies_after_the_runs_row)
    with pytest.raises(OSError, match="died"):
        delete_run(str(two_runs), "second")
    assert calls[0] == "runs" and complete_run_ids(str(two_runs)) == []
    assert not list_runs(str(two_runs))
    monkeypatch.undo()
    recover(str(two_runs))
    assert all(not parts for parts in _partitions(two_runs).values())


def test_delete_refuses_a_run_a_live_writer_holds(two_runs):
    lease = acquire_lease(str(two_runs), "second")
    try:
        with pytest.raises(ScenarioError, match="being written"):
            delete_run(str(two_runs), "second")
    finally:
        lease.release()
    assert complete_run_ids(str(two_runs)) == ["first", "second"]


def test_vacuum_keeps_exactly_what_the_tables_reference_and_guards_the_retention(
    two_runs, spark, capsys
):
    _run(spark, two_runs, "second")  # published again: its older files stay on disk
    delete_run(str(two_runs), "first")
    assert _files_on_disk(two_runs) > _files_referenced(two_runs)

    assert main(["runs", "vacuum", "--output", str(two_runs), "--retention", "0h"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        line.startswith("retrysim: error: --retention: value 0h is shorter") and "--force" in line
    )
    before = _files_on_disk(two_runs)
    args = ["runs", "vacuum", "--output", str(two_runs), "--retention", "0h", "--force"]
    assert main([*args, "--dry-run"]) == 0 and _files_on_disk(two_runs) == before
    assert main(args) == 0
    assert _files_on_disk(two_runs) == _files_referenced(two_runs)
    assert not any("run_id=first" in path for path in _files_on_disk(two_runs))
    assert complete_run_ids(str(two_runs)) == ["second"]
