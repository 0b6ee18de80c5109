"""The eight tables as the Delta sinks write them (retrysim.store.sinks): read back by
delta-rs and by Spark, a rerun replaces its run, and the counts of one run reconcile across
every table.

The scenario mixes a 4.x group that retries, times out, fails over to the DLQ and is cut by
the horizon with a broadcasting group that discards, so every end state is present. The
reconciliation is computed here with plain pandas from the tables as delta-rs reads them,
independently of the library's own aggregates.
"""

from __future__ import annotations

import deltalake
import pandas as pd
import pytest
from chispa import assert_df_equality
from support import group, scenario

from retrysim import simulate
from retrysim.store.sinks import DeltaSparkSink, delta_classes_available, read_table, run_rows
from retrysim.tables.schemas import SCHEMAS

RUN = "mixed"
SCENARIO = scenario(
    group(
        "orders",
        workload={"messages": 400, "over": "2m", "queues": 4},
        behavior={"fail_probability": 0.3, "poison_fraction": 0.05, "processing_time": "20ms",
                  "outages": [{"start": "30s", "end": "40s", "fail_probability": 1.0}]},
        max_reconsume_times=4,
        consume_timeout="1m",
    ),
    group(
        "audit",
        flavor="rocketmq4.broadcasting",
        workload={"messages": 100, "over": "1m"},
        behavior={"fail_probability": 0.2, "processing_time": "5ms"},
    ),
    horizon="4m",
    load_bucket="30s",
    seed=11,
)  # fmt: skip


@pytest.fixture(scope="module")
def output(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("delta")
    simulate(spark, SCENARIO, output=str(root), run_id=RUN)
    simulate(spark, SCENARIO, output=str(root), run_id="other", validate=False)
    return str(root)


def delta(output: str, table: str, run_id: str = RUN) -> pd.DataFrame:
    frame = deltalake.DeltaTable(f"{output}/{table}").to_pandas()
    return frame[frame["run_id"] == run_id].reset_index(drop=True)


@pytest.mark.parametrize("table", list(SCHEMAS))
def test_delta_rs_and_spark_read_the_same_rows(spark, output, table):
    by_spark = read_table(spark, output, table)
    assert by_spark.schema.fieldNames() == SCHEMAS[table].fieldNames()
    arrow = deltalake.DeltaTable(f"{output}/{table}").to_pyarrow_table()
    assert arrow.num_rows == by_spark.count() > 0
    assert set(arrow.column("run_id").to_pylist()) == {RUN, "other"}
    from_rs = spark.createDataFrame(arrow.select(by_spark.columns).to_pylist(), by_spark.schema)
    order = [c for c in by_spark.columns if c not in ("schedule_backlog", "config_json")]
    assert_df_equality(by_spark.orderBy(*order), from_rs.orderBy(*order), ignore_nullable=True)


def test_a_runs_summary_read_on_the_driver_is_sparks(spark, output):
    """What ``retrysim simulate`` prints: one run's summary rows by delta-rs, no Spark job."""
    by_spark = read_table(spark, output, "summary").where(f"run_id = '{RUN}'")
    rows = run_rows(output, "summary", RUN)
    assert {row["run_id"] for row in rows} == {RUN} and len(rows) == 2
    from_rs = spark.createDataFrame(rows, by_spark.schema)
    assert_df_equality(by_spark, from_rs, ignore_row_order=True, ignore_nullable=True)


def test_rerunning_a_run_id_replaces_its_rows(spark, output):
    before = {t: len(delta(output, t)) for t in SCHEMAS}
    simulate(spark, SCENARIO, output=output, run_id=RUN, validate=False)
    after = {t: len(delta(output, t)) for t in SCHEMAS}
    assert after == before
    attempts = delta(output, "attempts")
    assert not attempts.duplicated(["group", "msg_id", "delivery"]).any()
    assert delta(output, "runs")["status"].tolist() == ["complete"]


def test_every_message_ends_in_exactly_one_state(output):
    messages = delta(output, "messages")
    transitions = delta(output, "transitions").sort_values(["group", "msg_id", "seq"])
    last = transitions.groupby(["group", "msg_id"]).tail(1).set_index(["group", "msg_id"])
    assert len(last) == len(messages) == 500
    terminal = last["state"].isin(["Commit", "DLQ", "Discard"])
    # a message not in a terminal state is pending: Ready, Inflight or WaitingRetry at the end
    assert set(last.loc[~terminal, "state"]) <= {"Ready", "Inflight", "WaitingRetry"}
    finals = transitions[transitions["state"].isin(["Commit", "DLQ", "Discard"])]
    assert not finals.duplicated(["group", "msg_id"]).any()
    counts = last["state"].where(terminal, "pending").groupby(level="group").value_counts()
    assert counts["orders"].get("Commit", 0) > 0 and counts["orders"].get("DLQ", 0) > 0
    assert counts["orders"].get("pending", 0) > 0, "the horizon should leave some pending"
    assert counts["audit"].get("Discard", 0) > 0


def test_counts_reconcile_across_tables(output):
    attempts, transitions = delta(output, "attempts"), delta(output, "transitions")
    dead, load = delta(output, "dead_letters"), delta(output, "load")
    summary = delta(output, "summary").set_index("group")
    messages = delta(output, "messages").groupby("group").size()
    for name in ("orders", "audit"):
        a = attempts[attempts["group"] == name]
        t = transitions[transitions["group"] == name]
        row = summary.loc[name]
        started = a["start_ms"].notna()
        state_counts = t["state"].value_counts()
        assert row["messages"] == messages[name]
        assert row["deliveries"] == started.sum() == state_counts.get("Inflight", 0)
        assert row["retries"] == (started & (a["delivery"] > 1)).sum()
        assert row["commits"] == (a["result_state"] == "Commit").sum() == state_counts["Commit"]
        assert row["dlq"] == (a["result_state"] == "DLQ").sum() == state_counts.get("DLQ", 0)
        assert row["dlq"] == (dead["group"] == name).sum()
        assert row["discards"] == state_counts.get("Discard", 0)
        assert row["pending"] == row["messages"] - row["commits"] - row["dlq"] - row["discards"]
        assert state_counts["Ready"] == len(a), "one Ready per delivery"
        per_bucket = load[load["group"] == name]
        for column in ("deliveries", "retries", "commits", "dlq", "discards"):
            assert per_bucket[column].sum() == row[column], column
        assert per_bucket["commitlog_writes"].sum() == row["commitlog_writes"]


def test_delta_spark_sink_writes_a_readable_table(spark, output, tmp_path):
    """One table published by delta-spark alone (no runs table: read_table's filter on
    complete runs is left off) reads back whole, through Spark and delta-rs."""
    assert delta_classes_available(spark), "run-tests.sh fetches the Delta Lake JARs"
    staged = tmp_path / "staged"
    spark.read.parquet(*deltalake.DeltaTable(f"{output}/summary").file_uris()).drop(
        "run_id"
    ).write.parquet(str(staged))
    DeltaSparkSink().publish(spark, str(tmp_path), "summary", str(staged), "spark-run")
    assert read_table(spark, str(tmp_path), "summary", complete_only=False).count() == 4
    assert deltalake.DeltaTable(f"{tmp_path}/summary").to_pyarrow_table().num_rows == 4
