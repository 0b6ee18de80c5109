"""A conformance run: every group of a scenario on a real broker and in retrysim, compared
figure by figure, published as the Delta tables ``conformance`` and ``broker_deliveries``.

Every group is checked against what the harness can run before any broker starts, so a
scenario it cannot run is refused in one line and nothing is written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from retrysim.conformance.figures import Figure, exact_figures, latest_settle, timed_figures
from retrysim.conformance.harness import (
    DELIVERIES,
    HARNESSES,
    BrokerRun,
    HarnessError,
    UnsupportedScenario,
    group_spec,
    harness_of,
    refuse_unsupported,
    run_on_broker,
)
from retrysim.engine.event_key import KeySpec, simulate_key
from retrysim.model.behavior import client_ms
from retrysim.model.workload import messages_np
from retrysim.progress import Progress
from retrysim.scenario.spec import Scenario
from retrysim.scenario.units import format_duration, human_ms
from retrysim.store.sinks import Sink
from retrysim.tables.schemas import (
    BROKER_DELIVERIES,
    CONFORMANCE,
    STAGE_ARROW,
    data_schema,
    write_rows,
)

TABLES = ("broker_deliveries", "conformance")  # publication order: the figures last


@dataclass(frozen=True)
class GroupFigures:
    """One group's figures and the broker's records they came from."""

    group: str
    figures: list[Figure]
    broker: BrokerRun


# Each group as retrysim simulates it: its spec and staged rows (pandas: at most 100,000
# messages, the harness's limit), by group name.
Simulated = dict[str, tuple[KeySpec, pd.DataFrame]]


def check_runnable(scenario: Scenario) -> Simulated:
    """Refuse, in one line, a scenario with a group the harness cannot run, or whose horizon
    ends before the broker may settle a message retrysim settles (:func:`latest_settle`).
    Returns each group's simulation, which the comparison takes."""
    for group in scenario.groups:
        refuse_unsupported(scenario, *group_spec(scenario, group.name))
    simulated = {}
    for group in scenario.groups:
        spec, staged = simulated[group.name] = _simulated(scenario, group.name)
        mine, latest = latest_settle(staged, spec.policy)
        if latest >= scenario.horizon:
            raise UnsupportedScenario(
                f"horizon: {format_duration(scenario.horizon)} ends before the broker may "
                f"settle group {group.name}'s last message (retrysim at {human_ms(mine)}, the "
                f"broker up to {human_ms(latest - mine)} later); give at least "
                f"{format_duration(1000 * (int(latest) // 1000 + 1))}"
            )
    return simulated


def _simulated(scenario: Scenario, name: str) -> tuple[KeySpec, pd.DataFrame]:
    """Group ``name`` through the event loop: its spec and staged rows, with ``listener_ms``:
    the processing time without the client's own, as the harness's listener runs it (its
    real client adds its own)."""
    _, spec = group_spec(scenario, name)
    rows = simulate_key(spec, *messages_np(spec.workload, spec.group, spec.seed))
    staged = pa.Table.from_batches(list(rows), schema=STAGE_ARROW).to_pandas()
    started = staged["start_ms"].notna()
    staged["listener_ms"] = staged["processing_ms"]
    staged.loc[started, "listener_ms"] -= client_ms(
        spec.behavior, spec.seed, spec.group, staged.loc[started, "msg_id"].to_numpy(np.int64),
        staged.loc[started, "delivery"].to_numpy(np.int64),
    )  # fmt: skip
    return spec, staged


def compare_group(
    scenario: Scenario, name: str, folder: str, spec: KeySpec, staged: pd.DataFrame
) -> GroupFigures:
    """Group ``name`` on the broker (its files under ``folder``) against its simulation."""
    run = run_on_broker(scenario, name, folder)
    figures = [*exact_figures(staged, run, spec.policy), *timed_figures(staged, run, spec.policy)]
    return GroupFigures(name, figures, run)


def run_conformance(
    spark: SparkSession,
    scenario: Scenario,
    output: str,
    run_id: str,
    sink: Sink,
    say: Progress,
    simulated: Simulated | None = None,
) -> list[GroupFigures]:
    """Compare every group of ``scenario`` and publish the two tables under ``output``;
    ``simulated``: what :func:`check_runnable` returned, if it ran already."""
    simulated = simulated if simulated is not None else check_runnable(scenario)
    staging = os.path.join(output, "_staging", f"conformance-{run_id}-{uuid.uuid4().hex[:8]}")
    work = tempfile.mkdtemp(prefix=f"retrysim-conformance-{run_id}-")  # the broker's files
    kept = False
    try:
        results = []
        for group in scenario.groups:
            where = HARNESSES[harness_of(group)]
            say(f"group {group.name}: on a real {where} broker and in retrysim ...")
            folder = os.path.join(work, group.name)
            try:
                results.append(compare_group(scenario, group.name, folder, *simulated[group.name]))
            except HarnessError as failed:
                kept = True  # its log says more
                raise HarnessError(f"{failed} (its files: {folder})") from None
        figures = [
            (scenario.name, result.group, f.figure, float(f.retrysim), float(f.broker),
             float(f.tolerance), f.within)
            for result in results for f in result.figures
        ]  # fmt: skip
        deliveries = [
            (result.group, *row)
            for result in results
            for row in result.broker.deliveries[list(DELIVERIES)]
            .astype(object)
            .itertuples(index=False)
        ]
        for table, rows, schema in (("broker_deliveries", deliveries, BROKER_DELIVERIES),
                                    ("conformance", figures, CONFORMANCE)):  # fmt: skip
            staged = write_rows(rows, data_schema(schema), os.path.join(staging, "tables", table))
            sink.publish(spark, output, table, staged, run_id)
        return results
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(staging))  # _staging, if nothing else is in it
        if not kept:
            shutil.rmtree(work, ignore_errors=True)
