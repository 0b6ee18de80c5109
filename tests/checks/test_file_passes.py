"""retrysim.checks.file_passes: the check's fast passes over staged files give Spark's results.

Each pass over Parquet files in Python tasks is held to the Spark pass it replaces
(retrysim.checks.chain_digests and counts), value for value: on a real run of every flavor, on the
hand-made broken runs of test_validate, and on attempts, messages and dead letters with
cells nulled and changed at random (what the null handling and the rules must get right).
The validation of a staged run then reports what the Spark passes report.
"""

from __future__ import annotations

import math
import os

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from test_validate import RUNS, frames

from retrysim.checks import chain_digests as digests
from retrysim.checks import counts, file_passes
from retrysim.checks.validate import published_tables, validate_tables
from retrysim.model.states import DLQ, INFLIGHT, READY_REPLAYED, WAITING_RETRY
from retrysim.store.sinks import STATUS_COMPLETE
from retrysim.tables.schemas import PARTITION_COLUMN, SCHEMAS

PASSES = set(file_passes.PASS_TABLES)


def stage(tables: dict[str, DataFrame], root: str) -> dict[str, dict[str, str]]:
    """Each run's tables as staged Parquet folders (data columns only): run -> table -> folder.
    Two files a table, so that a pass sums across tasks."""
    arrow = {name: frame.toArrow() for name, frame in tables.items()}
    runs = set(arrow["runs"].column(PARTITION_COLUMN).to_pylist())
    runs |= set(arrow["attempts"].column(PARTITION_COLUMN).to_pylist())
    staged: dict[str, dict[str, str]] = {}
    for run in sorted(runs):
        staged[run] = {}
        for name, table in arrow.items():
            rows = table.filter(pc.equal(table.column(PARTITION_COLUMN), run))
            rows = rows.drop_columns([PARTITION_COLUMN])
            folder = os.path.join(root, run, name)
            os.makedirs(folder)
            half = rows.num_rows // 2
            for part, share in enumerate((rows.slice(0, half), rows.slice(half))):
                pq.write_table(share, os.path.join(folder, f"part-{part}.parquet"))
            staged[run][name] = folder
    return staged


def spark_passes(tables: dict[str, DataFrame], hashed: bool = True) -> dict[str, DataFrame]:
    load = counts.load_counts(tables["load"])
    ends = load.select(PARTITION_COLUMN, "group", "load_end_ms")
    return {
        "load": load,
        "summary": counts.summary_counts(tables["summary"]),
        "derived": digests.derived_digest(tables["attempts"], None, hashed=hashed),
        "chains": digests.attempt_chain_digest(tables, ends),
        "messages": digests.message_chain_digest(tables["messages"], tables["runs"]),
        "dead": digests.dead_letter_chain_digest(tables["dead_letters"]),
        "runs": counts.runs_counts(tables["runs"], STATUS_COMPLETE),
        "instances": counts.instance_counts(tables["instance_load"]),
        "transitions": digests.transition_digest(tables["transitions"]),
    }


def differences(spark, tables, staged, passes=PASSES, hashed=True) -> list[str]:
    """What the file passes give that the Spark passes do not, value by value."""
    rows = file_passes.file_counts(spark, staged, passes, {run: hashed for run in staged})
    mine = {(name, run, group): values for name, run, group, values in rows}
    found = []
    for name, frame in spark_passes(tables, hashed).items():
        if name not in passes:
            continue
        for row in frame.collect():
            want = row.asDict()
            key = (name, want.pop(PARTITION_COLUMN), want.pop("group", None))
            got = mine.pop(key, {})
            want = {k: v for k, v in want.items() if v is not None}
            for column in sorted(set(want) | set(got)):
                a, b = want.get(column), got.get(column)
                same = (a == b) if not isinstance(a, float) else math.isclose(a, b or 0.0)
                if not same:
                    found.append(f"{key} {column}: Spark {a}, files {b}")
    found += [f"{key}: only from files" for key in mine]
    return found


@pytest.fixture(scope="module")
def real(spark, real_run, tmp_path_factory):
    """A run of every flavor (test_validate's scenario, with replays), its tables staged."""
    tables = published_tables(spark, real_run)
    return tables, stage(tables, str(tmp_path_factory.mktemp("files")))


@pytest.fixture(scope="module")
def hand(spark, tmp_path_factory):
    """test_validate's hand-made runs, each with one thing broken, staged."""
    tables = frames(spark, {run: case.tables for run, case in RUNS.items()})
    return tables, stage(tables, str(tmp_path_factory.mktemp("hand")))


def test_every_pass_gives_sparks_values_on_a_real_run(spark, real):
    tables, staged = real
    assert differences(spark, tables, staged) == []
    lean = differences(spark, tables, staged, {"derived"}, hashed=False)
    assert lean == []


def test_a_lean_runs_messages_made_again_give_sparks_values(spark, real):
    """A lean run stages no messages: the tasks make them from the run's scenario."""
    tables, staged = real
    lean = {run: {**found, "messages": file_passes.GENERATED} for run, found in staged.items()}
    assert differences(spark, tables, lean, {"messages"}) == []


def test_the_hand_made_broken_runs_give_sparks_values(spark, hand):
    assert differences(spark, *hand) == []


def test_validation_from_files_reports_what_spark_reports(hand):
    """A run whose chains are whole (the digests decide) and one whose chains are broken
    (row by row), each validated on its own from frames and from its staged files."""
    tables, staged = hand
    for run in ("load", "gap"):
        alone = {
            name: frame.where(F.col(PARTITION_COLUMN) == run) for name, frame in tables.items()
        }
        by_spark, by_files = (
            validate_tables(alone),
            validate_tables(alone, files={run: staged[run]}),
        )
        assert by_files.broken_by_run() == by_spark.broken_by_run() != {}
        assert by_files.row_by_row == by_spark.row_by_row == (run == "gap")
        assert [f.examples for f in by_files.findings] == [f.examples for f in by_spark.findings]


def _mutated(
    frame: DataFrame, salt: int, states: dict[str, list[str]], keep: tuple[str, ...] = ()
) -> DataFrame:
    """``frame`` with about one cell in sixteen nulled, and as many changed: a number moved
    by one either way, a string swapped for another the column may hold (``keep``: columns
    left alone)."""
    changed = {}
    for field in frame.schema.fields:
        if field.name in (PARTITION_COLUMN, *keep):
            continue
        pick = F.abs(F.xxhash64(*[F.col(c) for c in frame.columns], F.lit(f"{salt}{field.name}")))
        column = F.col(field.name)
        kind = field.dataType.simpleString()
        if kind == "string":
            words = states.get(field.name, ["x"])
            other = F.element_at(
                F.array(*[F.lit(w) for w in words]), (pick % len(words) + 1).cast("int")
            )
        elif kind in ("int", "bigint"):
            other = column + F.when(pick % 2 == 0, 1).otherwise(-1)
        elif kind == "boolean":
            other = ~column
        else:
            continue
        changed[field.name] = (
            F.when(pick % 16 == 0, F.lit(None).cast(field.dataType))
            .when(pick % 16 == 1, other.cast(field.dataType))
            .otherwise(column)
        )
    return frame.withColumns(changed)


WORDS = {
    "result_state": [DLQ, INFLIGHT, WAITING_RETRY, "Commit", "Ready", "Bogus"],
    "end_state": [DLQ, WAITING_RETRY, "Commit", "Discard", INFLIGHT],
    "leave_state": [DLQ, "Discard", WAITING_RETRY],
    "ready_reason": ["published", "retry_due", READY_REPLAYED, "local", "visible", "odd"],
    "end_reason": ["send_back_failed", "send_back_fallback", "max_reconsume_times"],
    "leave_reason": ["broadcast_no_retry", "max_reconsume_times"],
    "end_topic": ["SCHEDULE_TOPIC_XXXX", "%RETRY%conc", "%DLQ%conc"],
    "dlq_topic": ["%DLQ%conc", "%DLQ%fifo", "elsewhere"],
    "group": ["conc", "fifo", "simple"],
}


def test_cells_nulled_and_changed_give_sparks_values(spark, real, tmp_path, salt=1):
    tables, _ = real
    broken = dict(tables)
    for name in ("attempts", "messages", "dead_letters", "transitions", "summary"):
        broken[name] = _mutated(tables[name], salt, WORDS)
    # the load's last bucket per group must stay one row (max_by picks any of a tie)
    broken["load"] = _mutated(tables["load"], salt, WORDS, keep=("group", "bucket_start_ms"))
    staged = stage(broken, str(tmp_path))
    assert differences(spark, broken, staged) == []


def test_schemas_cover_what_the_passes_read():
    kinds = {name: file_passes._kinds(SCHEMAS[name]) for name in SCHEMAS}
    assert set(file_passes.ATTEMPT_COLUMNS) <= set(kinds["attempts"])
    assert kinds["attempts"]["poison_fixed"] == "int"  # a boolean hashes as an int


@pytest.mark.parametrize("chunk", [digests.RANGE_CHUNK, 100])
def test_the_range_digest_is_sparks(spark, chunk):
    """The driver's NumPy digest of a range of ids, whole or a hundred ids at a time."""
    frame = digests.id_range_digest(spark, {("r", "g"): (-3, 1000)}).collect()[0].asDict()
    assert digests.range_digest(-3, 1000, chunk) == {
        key: frame[key] for key in ("range_rows", "range_hash_hi", "range_hash_lo")
    }


def test_a_group_without_a_name_and_deliveries_without_numbers_give_sparks_values(
    spark, real, tmp_path
):
    """A null group (Spark's join on it matches no load end) and a group whose deliveries
    are all null (its first deliveries sum to null)."""
    tables, _ = real
    unnamed = F.when(F.col("group") == "fifo", F.lit(None)).otherwise(F.col("group"))
    broken = {name: frame.withColumn("group", unnamed) for name, frame in tables.items()
              if "group" in frame.columns}  # fmt: skip
    broken["runs"] = tables["runs"]
    no_number = F.when(F.col("group") == "cast", F.lit(None)).otherwise(F.col("delivery"))
    broken["attempts"] = broken["attempts"].withColumn("delivery", no_number.cast("int"))
    assert differences(spark, broken, stage(broken, str(tmp_path))) == []
