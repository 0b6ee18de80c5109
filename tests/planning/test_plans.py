"""A folder's plans (retrysim.planning.plans): which runs are a plan's, a plan id run again
(refused, or with ``--replace`` in place of its earlier runs, which readers see until the
new ones are published), ``retrysim plans list | show | delete`` and ``runs list --plan-id``.

The names and the statuses are pure Python; one tiny plan (10 messages, two points) runs
through Spark and is replaced twice, once by an execution that fails. Its commits go through
delta-rs: the delta-spark removals are the same code as ``runs delete``'s
(tests/store/test_runs_admin.py), and each of its ``DELETE``s is a Spark job."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from retrysim.cli.main import main
from retrysim.planning import plan as plan_module
from retrysim.planning.plan import prepare_plan, read_plan, run_plan
from retrysim.planning.plans import (
    PLAN_COMPLETE,
    PLAN_INCOMPLETE,
    PLAN_RUNNING,
    PLAN_STALE,
    PLAN_UNFINISHED,
    list_plans,
    plan_info,
    plan_of,
    point_run_id,
)
from retrysim.planning.replications import replication_run_id
from retrysim.runner import RUN_ID_PATTERN, simulate
from retrysim.scenario.errors import ScenarioError
from retrysim.store.runs import STATUS_WRITING, RunInfo
from retrysim.store.sinks import STATUS_COMPLETE, STATUS_PUBLISHING, complete_run_ids, table_path
from retrysim.tables.schemas import PARTITION_COLUMN, TABLE_ORDER

# --------------------------------------------------------------------------- names


def test_a_run_id_names_its_plan_and_execution_without_doubt():
    """Plan ids that look like other plans' runs still give every run a name of its own,
    read back as its plan, point and execution."""
    plans = ("a", "a-p1", "a-p1-e2", "a-p1-r2", "b-r5", "c-e3", "d.p1")
    names = {}
    for plan_id, point, execution, (replication, replications) in itertools.product(
        plans, (1, 2, 12), (1, 2, 10), ((1, 1), (1, 3), (3, 3))
    ):
        run_id = replication_run_id(point_run_id(plan_id, point, execution), replication,
                                    replications)  # fmt: skip
        assert RUN_ID_PATTERN.match(run_id)
        assert names.setdefault(run_id, (plan_id, execution)) == (plan_id, execution), run_id
        run = RunInfo(run_id, STATUS_COMPLETE, point=point)
        assert plan_of(run) == (plan_id, execution), run_id
    assert point_run_id("a", 3) == "a-p3" and point_run_id("a", 3, 2) == "a-p3-e2"
    # a simulate run's row has no point, so a name like a plan's is not one; a run being
    # written has no row yet, and its name says it
    assert plan_of(RunInfo("a-p3", STATUS_COMPLETE, point=None)) is None
    assert plan_of(RunInfo("a-p3", STATUS_COMPLETE, point=4)) is None
    assert plan_of(RunInfo("a-p3-e2", STATUS_WRITING)) == ("a", 2)
    assert plan_of(RunInfo("solo", STATUS_COMPLETE)) is None


def _run(run_id: str, status: str = STATUS_COMPLETE) -> tuple[RunInfo, int]:
    found = plan_of(RunInfo(run_id, STATUS_WRITING))
    assert found is not None
    return RunInfo(run_id, status, point=int(run_id.split("-p")[1].split("-")[0])), found[1]


def _rows(*point_run_ids: str, replications: int = 1) -> list[dict]:
    return [
        {"point": k, "point_run_id": run_id, "replications": replications}
        for k, run_id in enumerate(point_run_ids, 1)
    ]


@pytest.mark.parametrize(
    ("rows", "runs", "status", "named"),
    [
        (_rows("p-p1", "p-p2"), ["p-p1", "p-p2"], PLAN_COMPLETE, ("p-p1", "p-p2")),
        (_rows("p-p1", replications=2), ["p-p1-r1", "p-p1-r2"], PLAN_COMPLETE,
         ("p-p1-r1", "p-p1-r2")),
        (_rows("p-p1-e2"), ["p-p1", "p-p2", "p-p1-e2"], PLAN_STALE, ("p-p1-e2",)),
        (_rows("p-p1", "p-p2"), ["p-p1"], PLAN_INCOMPLETE, ("p-p1", "p-p2")),
        ([], ["p-p1", "p-p2"], PLAN_UNFINISHED, ()),
    ],
)  # fmt: skip
def test_a_plans_status_says_whether_its_rows_and_runs_agree(rows, runs, status, named):
    plan = plan_info("p", rows, [_run(run_id) for run_id in runs])
    assert (plan.status, plan.named, plan.run_ids) == (status, named, runs)
    assert plan.execution == max(_run(run_id)[1] for run_id in runs)


def test_a_run_not_yet_complete_or_being_written_shows_in_the_status():
    publishing = plan_info("p", _rows("p-p1"), [_run("p-p1", STATUS_PUBLISHING)])
    assert publishing.status == PLAN_INCOMPLETE
    writing = plan_info("p", _rows("p-p1"), [_run("p-p1"), _run("p-p1-e2", STATUS_WRITING)])
    assert writing.status == PLAN_RUNNING


# --------------------------------------------------------------------------- end to end


def _scenario_file(folder: Path) -> str:
    data = {
        "name": "tidy",
        "horizon": "1h",
        "groups": [
            {
                "name": "g",
                "flavor": "rocketmq4.concurrently",
                "consumers": {"instances": 1, "threads": 2},
                "workload": {"messages": 10, "over": "1s"},
            }
        ],
    }
    path = folder / "tidy.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _versions(output: str) -> dict[str, int]:
    return {
        table: DeltaTable(table_path(output, table)).version()
        for table in (*TABLE_ORDER, "plan")
        if DeltaTable.is_deltatable(table_path(output, table))
    }


def _partitions(output: str) -> set[str]:
    return {
        part[PARTITION_COLUMN]
        for table in TABLE_ORDER
        for part in DeltaTable(table_path(output, table)).partitions()
    }


def _complete_at(output: str, version: int) -> set[str]:
    """The complete runs the runs table listed at ``version``."""
    rows = DeltaTable(table_path(output, "runs"), version=version).to_pyarrow_table(
        columns=["run_id", "status"]
    )
    return {r["run_id"] for r in rows.to_pylist() if r["status"] == STATUS_COMPLETE}


def test_a_plan_run_again_is_refused_replaced_listed_shown_and_deleted(
    spark, tmp_path, monkeypatch, capsys
):
    scenario = _scenario_file(tmp_path)
    output = str(tmp_path / "out")
    targets = ["p99_time_to_commit=1h"]
    two = prepare_plan(scenario, sweeps=["consumers.threads=1,2"], targets=targets)
    one = prepare_plan(scenario, sweeps=["consumers.threads=2"], targets=targets)
    run_plan(spark, two, output, "tidy", validate=False, sink="delta-rs")
    simulate(
        spark, two.base, output=output, run_id="tidy-p7", validate=False, sink="delta-rs"
    )  # no plan's
    assert complete_run_ids(output) == ["tidy-p1", "tidy-p2", "tidy-p7"]

    # run again without --replace: one line, exit 2, nothing written
    before = _versions(output)
    with pytest.raises(ScenarioError, match=r"plan 'tidy' already exists .*\(2 runs\).*--replace"):
        run_plan(spark, one, output, "tidy", validate=False, sink="delta-rs")
    args = ["plan", "--scenario", scenario, "--sweep", "consumers.threads=2", "--output",
            output, "--plan-id", "tidy", "--master", "local[1]"]  # fmt: skip
    assert main(args) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("retrysim: error: --plan-id: plan 'tidy' already exists")
    assert "--replace" in line and "retrysim plans delete" in line
    assert _versions(output) == before

    # a replacing execution that fails leaves the plan as it was
    def fails(*_args, **_kwargs):
        raise OSError("the plan table could not be written")

    monkeypatch.setattr(plan_module, "write_plan_table", fails)
    with pytest.raises(OSError, match="could not be written"):
        run_plan(spark, one, output, "tidy", validate=False, replace=True, sink="delta-rs")
    monkeypatch.undo()
    assert _partitions(output) == {"tidy-p1", "tidy-p2", "tidy-p7"}
    assert [p.status for p in list_plans(output)] == [PLAN_COMPLETE]

    # replaced: the new runs are published, then the old ones removed; at no version of the
    # runs table is the plan without complete runs
    first = DeltaTable(table_path(output, "runs")).version()
    result = run_plan(spark, one, output, "tidy", validate=False, replace=True, sink="delta-rs")
    assert result.execution == 2
    assert complete_run_ids(output) == ["tidy-p1-e2", "tidy-p7"]
    assert _partitions(output) == {"tidy-p1-e2", "tidy-p7"}
    last = DeltaTable(table_path(output, "runs")).version()
    for version in range(first, last + 1):
        assert _complete_at(output, version) & {"tidy-p1", "tidy-p2", "tidy-p1-e2"}, version
    rows = read_plan(spark, output, "tidy").collect()
    assert [(r["point"], r["point_run_id"], r["recommended"]) for r in rows] == [
        (1, "tidy-p1-e2", True)
    ]
    (plan,) = list_plans(output)
    assert (plan.plan_id, plan.status, plan.scenario, plan.points, plan.run_ids) == (
        "tidy", PLAN_COMPLETE, "tidy", 1, ["tidy-p1-e2"],
    )  # fmt: skip

    # listed, shown, its runs filtered
    assert main(["plans", "list", "--output", output]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["plan_id", "scenario", "points", "runs", "started_at", "status"]
    assert lines[1].split()[:4] == ["tidy", "tidy", "1", "1"] and lines[1].endswith("complete")
    assert main(["plans", "show", "--output", output, "--plan-id", "tidy"]) == 0
    shown = capsys.readouterr().out
    assert "status: complete" in shown and "execution: 2" in shown
    assert "group g: point p1 (1x2=2), run tidy-p1-e2, binding none" in shown
    assert main(["runs", "list", "--output", output, "--plan-id", "tidy"]) == 0
    listed = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[0] for line in listed] == ["tidy-p1-e2"]

    # deleted: its plan rows and its runs, one commit a table; the other run stays
    before = _versions(output)
    delete = ["plans", "delete", "--output", output, "--plan-id", "tidy", "--delta-sink"]
    assert main([*delete, "delta-rs"]) == 0  # delta-spark's removals: test_runs_admin.py
    after = _versions(output)
    assert {table: after[table] - before[table] for table in after} == dict.fromkeys(after, 1)
    assert complete_run_ids(output) == ["tidy-p7"] and _partitions(output) == {"tidy-p7"}
    assert list_plans(output) == [] and read_plan(spark, output, "tidy").count() == 0
    assert main([*delete, "delta-rs"]) == 2
    assert "no plan 'tidy'" in capsys.readouterr().err
