"""The plans under an output folder: which runs are a plan's, and the plans listed, shown,
deleted and replaced (``retrysim plans``, ``retrysim plan --replace``).

A plan's points run as ``<plan-id>-p<k>`` (``-r<j>`` for each replication); a plan run again
in place of its earlier execution (``--replace``) names its runs ``<plan-id>-p<k>-e<n>``, its
n-th execution, so that the new runs are published beside the old ones, and readers see the
old plan until the new one is there: the ``plan`` table's rows are replaced in one commit,
then the earlier runs are removed, one commit a table. A run id tells whose plan it is, with
no doubt (the suffix is read from the end: ``-r<j>``, then ``-e<n>``, then ``-p<k>``; no
other plan id gives the same name), and its ``runs`` row's ``point`` says it is a plan's: a
``simulate`` run with such a name is not.

Listing reads with delta-rs on the driver, no Spark; a delete commits through delta-spark
when given a session, else with delta-rs (:func:`retrysim.store.runs.delete_runs`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import SparkSession

from retrysim.planning.replications import replication_run_id
from retrysim.scenario.errors import ScenarioError
from retrysim.store.recovery import remove_runs
from retrysim.store.runs import STATUS_WRITING, RunInfo, delete_runs, list_runs
from retrysim.store.sinks import STATUS_COMPLETE, table_rows
from retrysim.tables.schemas import PARTITION_COLUMN

Say = Callable[[str], None]

# <plan-id>-p<k>[-e<n>][-r<j>]: point k of the plan's n-th execution (none: the first), and
# replication j when the point ran several
PLAN_RUN_ID = re.compile(
    r"^(?P<plan>.+)-p(?P<point>[1-9][0-9]*)(?:-e(?P<execution>[1-9][0-9]*))?"
    r"(?:-r(?P<replication>[1-9][0-9]*))?$"
)
# A plan's status in ``retrysim plans list``
PLAN_COMPLETE = "complete"  # its plan rows, and every run they name complete; no other runs
PLAN_RUNNING = "running"  # a live writer holds one of its runs
PLAN_UNFINISHED = "unfinished"  # runs but no plan rows: its execution failed or was killed
PLAN_INCOMPLETE = "incomplete"  # a run its plan rows name is missing or not complete
PLAN_STALE = "stale"  # runs of an earlier execution beside the current one's


def point_run_id(plan_id: str, number: int, execution: int = 1) -> str:
    """The run id of point ``number`` of the plan's ``execution`` (``-e<n>`` after the first)."""
    return f"{plan_id}-p{number}" + (f"-e{execution}" if execution > 1 else "")


def plan_of(run: RunInfo) -> tuple[str, int] | None:
    """(plan id, execution) of a plan's run, else None. A run being written has no row yet:
    its name alone says it."""
    found = PLAN_RUN_ID.match(run.run_id)
    if found is None:
        return None
    if run.status != STATUS_WRITING and run.point != int(found["point"]):
        return None
    return found["plan"], int(found["execution"] or 1)


@dataclass(frozen=True)
class PlanInfo:
    """One plan in a folder: its runs (every execution's), the runs its plan rows name (the
    current execution's), and what ``retrysim plans list`` shows."""

    plan_id: str
    status: str
    scenario: str | None
    points: int
    runs: tuple[RunInfo, ...]
    named: tuple[str, ...]
    execution: int  # the latest execution among its runs (1 when it has none)
    started_at: object = None  # when the earliest run of its current execution started

    @property
    def run_ids(self) -> list[str]:
        return [run.run_id for run in self.runs]


def list_plans(output: str) -> list[PlanInfo]:
    """Every plan under ``output``: each plan id of the ``plan`` table, and of runs whose
    plan has no rows there (an execution that failed, or is running), oldest first."""
    rows: dict[str, list[dict]] = {}
    for row in table_rows(output, "plan", ["point", "point_run_id", "replications"]):
        rows.setdefault(row[PARTITION_COLUMN], []).append(row)
    runs: dict[str, list[tuple[RunInfo, int]]] = {}
    for run in list_runs(output):
        found = plan_of(run)
        if found is not None:
            runs.setdefault(found[0], []).append((run, found[1]))
    plans = [plan_info(plan_id, rows.get(plan_id, []), runs.get(plan_id, [])) for plan_id in
             sorted(set(rows) | set(runs))]  # fmt: skip
    return sorted(plans, key=lambda plan: (str(plan.started_at), plan.plan_id))


def plan_info(plan_id: str, rows: list[dict], runs: list[tuple[RunInfo, int]]) -> PlanInfo:
    """A plan from its plan rows (point, point_run_id, replications) and its runs with their
    executions: the runs the rows name, and its status."""
    named = tuple(
        replication_run_id(row["point_run_id"], j, row["replications"] or 1)
        for row in sorted(rows, key=lambda row: row["point"])
        for j in range(1, (row["replications"] or 1) + 1)
    )
    named = tuple(dict.fromkeys(named))  # a row per point and group
    status_of = {run.run_id: run.status for run, _ in runs}
    if any(status == STATUS_WRITING for status in status_of.values()):
        status = PLAN_RUNNING
    elif not rows:
        status = PLAN_UNFINISHED
    elif any(status_of.get(run_id) != STATUS_COMPLETE for run_id in named):
        status = PLAN_INCOMPLETE
    elif set(status_of) - set(named):
        status = PLAN_STALE
    else:
        status = PLAN_COMPLETE
    current = [run for run, _ in runs if run.run_id in named] or [run for run, _ in runs]
    points = {row["point"] for row in rows} or {run.point for run, _ in runs}
    started = min((run.started_at for run in current if run.started_at), default=None)
    return PlanInfo(
        plan_id,
        status,
        next((run.scenario for run in current if run.scenario), None),
        len(points - {None}),
        tuple(run for run, _ in runs),
        named,
        max((execution for _, execution in runs), default=1),
        started,
    )


def existing_plan(output: str, plan_id: str) -> PlanInfo | None:
    return next((plan for plan in list_plans(output) if plan.plan_id == plan_id), None)


def find_plan(output: str, plan_id: str) -> PlanInfo:
    found = existing_plan(output, plan_id)
    if found is None:
        raise ScenarioError(
            "--plan-id", f"no plan {plan_id!r} in {output} (retrysim plans list shows them)"
        )
    return found


def plan_rows(output: str, plan_id: str) -> list[dict]:
    """The plan's rows of the ``plan`` table (every column), by point and group."""
    rows = [row for row in table_rows(output, "plan") if row[PARTITION_COLUMN] == plan_id]
    return sorted(rows, key=lambda row: (row["point"], row["group"]))


def next_execution(output: str, plan_id: str, replace: bool) -> int:
    """The execution number a new run of ``plan_id`` takes: 1 for a new plan. A plan already
    in ``output`` is refused unless ``replace`` (then one after its latest execution, so its
    new runs are named apart from the old ones); a plan being written is refused."""
    plan = existing_plan(output, plan_id)
    if plan is None:
        return 1
    if plan.status == PLAN_RUNNING:
        raise ScenarioError(
            "--plan-id",
            f"plan {plan_id!r} is being written by a live writer in {output}; wait for it to "
            "finish or choose another plan id",
        )
    if not replace:
        raise ScenarioError(
            "--plan-id",
            f"plan {plan_id!r} already exists in {output} ({len(plan.runs)} runs): add "
            f"--replace to run it again in their place, or delete it first (retrysim plans "
            f"delete --output {output} --plan-id {plan_id})",
        )
    return plan.execution + 1


def remove_earlier_runs(
    output: str, plan_id: str, keep: list[str], say: Say = lambda _line: None,
    spark: SparkSession | None = None,
) -> list[str]:  # fmt: skip
    """After a replacing execution published its runs (``keep``) and its plan rows: remove
    the plan's other runs, one commit a table, ``runs`` first. Returns their ids."""
    plan = existing_plan(output, plan_id)
    earlier = [] if plan is None else sorted(set(plan.run_ids) - set(keep))
    if earlier:
        delete_runs(output, earlier, spark=spark)
        say(f"plan {plan_id}: {len(earlier)} runs of its earlier execution removed")
    return earlier


def delete_plan(
    output: str, plan_id: str, say: Say = lambda _line: None, spark: SparkSession | None = None
) -> list[str]:
    """Delete the plan: its ``plan`` rows first (one commit), then every run of it together
    (:func:`retrysim.store.runs.delete_runs`: one commit a table, ``runs`` first). Refused
    while a live writer holds one of its runs. Returns the tables it was removed from."""
    plan = find_plan(output, plan_id)

    def plan_rows_first() -> list[str]:
        removed = remove_runs(output, [plan_id], ("plan",), spark)
        if removed:
            say(f"plan {plan_id}: its plan rows are gone")
        return removed

    return delete_runs(output, plan.run_ids, say, spark, first=plan_rows_first)
