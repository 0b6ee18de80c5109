"""The messages, transitions and dead letters of a group simulated whole in a task, made by
that task beside its attempts (pyarrow), instead of by three Spark jobs in staging.

On a new JVM those jobs spend far longer on planning, code generation and JIT than on
their work, which is, per row, a few column copies. Each is a twin of the Spark derivation,
and each is checked by the invariant check as the Spark tables were: the transitions'
digest against the attempts' own derivation, the messages' and dead letters' links against
the attempts' chains (retrysim.checks.chain_digests), so a twin that differs fails the run rather
than publishing a wrong table.
``tests/tables/test_message_tables.py`` holds them equal to the Spark derivations.

- :func:`transitions_of`: :func:`retrysim.tables.transitions.transitions_from_attempts`;
- :func:`messages_of`: :func:`retrysim.model.workload.messages_df` (through
  :func:`~retrysim.model.workload.messages_np`, bit for bit);
- :func:`dead_letters_of`: :func:`retrysim.tables.dead_letters.dead_letters_from_attempts`
  for a group that replays nothing (a replay's row may be in another task's share).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema

from retrysim.model.states import DLQ, INFLIGHT, READY, REASON_LATE_SEND_BACK, WAITING_RETRY
from retrysim.tables.schemas import SCHEMAS, data_schema
from retrysim.tables.transitions import REASON_DELIVERED, SEQ_PER_DELIVERY

TASK_TABLES = ("messages", "transitions", "dead_letters")
TASK_TABLES_DIR = "task_tables"  # under a run's staging folder: <table>/<files>
ARROW = {table: to_arrow_schema(data_schema(SCHEMAS[table])) for table in TASK_TABLES}


def _filled(value, rows: int, kind: pa.DataType) -> pa.Array:
    return pa.nulls(rows, kind) if value is None else pa.array(np.full(rows, value), kind)


def transitions_of(attempts: pa.RecordBatch) -> pa.Table:
    """A batch of staged attempts' transitions (the table's data columns): per attempt its
    Ready, its Inflight when it started, its end state when it ended, its leave after a
    WaitingRetry when it left; ``seq = 4 * (delivery - 1) + k``."""
    schema = ARROW["transitions"]
    column = attempts.column
    rows = attempts.num_rows
    delivery = column("delivery").to_numpy(zero_copy_only=False)
    first_seq = (delivery.astype(np.int32) - 1) * SEQ_PER_DELIVERY
    no_level = pa.nulls(rows, pa.int32())
    waiting = pc.equal(column("end_state"), WAITING_RETRY)
    left = pc.is_valid(column("leave_state"))
    copied = pc.is_valid(column("copy_state"))
    steps = [
        (None, 1, _filled(READY, rows, pa.string()), "ready_ms", "source_topic", "queue_id",
         no_level, column("ready_reason")),
        (column("start_ms"), 2, _filled(INFLIGHT, rows, pa.string()), "start_ms",
         "source_topic", "queue_id", no_level, _filled(REASON_DELIVERED, rows, pa.string())),
        (column("end_state"), 3, column("end_state"), "end_ms", "end_topic", "end_queue_id",
         pc.if_else(waiting, column("delay_level"), no_level), column("end_reason")),
        (pc.or_(left, copied), 4, pc.coalesce(column("leave_state"), column("copy_state")),
         pc.if_else(left, column("settled_ms"), column("copy_ms")),
         pc.if_else(left, column("leave_topic"), column("copy_topic")),
         pc.if_else(left, column("leave_queue_id"), column("copy_queue_id")),
         pc.if_else(left, no_level, column("copy_delay_level")),
         pc.if_else(left, column("leave_reason"),
                    _filled(REASON_LATE_SEND_BACK, rows, pa.string()))),
    ]  # fmt: skip
    parts = []
    for present, k, state, at_ms, topic, queue_id, level, reason in steps:
        step = pa.table(
            [
                column("group"),
                column("msg_id"),
                column("delivery"),
                pa.array(first_seq + k, pa.int32()),
                state,
                _column(attempts, at_ms),
                _column(attempts, topic),
                _column(attempts, queue_id),
                level,
                reason,
            ],
            schema=schema,
        )
        if present is not None and present.type != pa.bool_():
            present = pc.is_valid(present)
        parts.append(step if present is None else step.filter(present))
    return pa.concat_tables(parts)


def _column(attempts: pa.RecordBatch, value: str | pa.Array) -> pa.Array:
    """A column of ``attempts`` by name, or a derived one as it is."""
    return attempts.column(value) if isinstance(value, str) else value


def dead_letters_of(attempts: pa.RecordBatch, origin_topic: str) -> pa.Table:
    """A batch of staged attempts' dead letters (one per delivery that moved its message to
    the DLQ), of a group that replays nothing."""
    table = pa.Table.from_batches([attempts])
    dead = table.filter(pc.equal(attempts.column("result_state"), DLQ))
    # a 4.9 client's second copy sent to the DLQ: a dead letter of its own
    copies = table.filter(pc.equal(attempts.column("copy_state"), DLQ))
    parts = []
    sides = (
        (dead, pc.coalesce(dead.column("leave_topic"), dead.column("end_topic")),
         dead.column("settled_ms")),
        (copies, copies.column("copy_topic"), copies.column("copy_ms")),
    )  # fmt: skip
    for rows, topic, at in sides:
        parts.append(
            pa.table(
                [
                    rows.column("group"),
                    rows.column("msg_id"),
                    topic,
                    at,
                    rows.column("delivery"),
                    _filled(origin_topic, rows.num_rows, pa.string()),
                    pa.nulls(rows.num_rows, pa.int64()),
                ],
                schema=ARROW["dead_letters"],
            )
        )
    return pa.concat_tables(parts)


def messages_of(
    messages: tuple[np.ndarray, np.ndarray, np.ndarray],
    group: str,
    topic: str,
    size_bytes: int,
    part: int = 0,
    parts: int = 1,
) -> pa.Table:
    """Share ``part`` of ``parts`` (a contiguous range of ids) of a group's ``messages``, the
    ``msg_id``, ``queue_id`` and ``born_ms`` that :func:`~retrysim.model.workload.messages_np`
    made for its simulation."""
    msg_ids, queue_ids, born = messages
    low, high = (len(msg_ids) * part) // parts, (len(msg_ids) * (part + 1)) // parts
    rows = high - low
    return pa.table(
        [
            _filled(group, rows, pa.string()),
            _filled(topic, rows, pa.string()),
            pa.array(msg_ids[low:high], pa.int64()),
            pa.array(queue_ids[low:high], pa.int32()),
            pa.array(born[low:high], pa.int64()),
            _filled(size_bytes, rows, pa.int32()),
        ],
        schema=ARROW["messages"],
    )


def parquet_writer(path: str, schema: pa.Schema) -> pq.ParquetWriter:
    """A task's Parquet writer (snappy, as Spark's), with dictionaries for the string
    columns only: a dictionary of timestamps and ids, nearly all distinct, costs their
    encoding time for nothing and makes a bigger file. Statistics stay on every column, for
    Delta's per-file stats."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    strings = [field.name for field in schema if pa.types.is_string(field.type)]
    return pq.ParquetWriter(path, schema, compression="snappy", use_dictionary=strings)


class TaskTableWriter:
    """One task's files of the :data:`TASK_TABLES` in ``tables`` (a table each), under
    ``folder/<table>/<name>``: opened on their first rows, closed by :meth:`close`, which
    returns (table, path, rows) of each file written."""

    def __init__(self, folder: str, name: str, tables: tuple[str, ...] = TASK_TABLES) -> None:
        self._paths = {table: os.path.join(folder, table, name) for table in tables}
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._rows = dict.fromkeys(tables, 0)

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(self._paths)

    def write(self, table: str, rows: pa.Table) -> None:
        if table not in self._paths or not rows.num_rows:
            return
        if table not in self._writers:
            self._writers[table] = parquet_writer(self._paths[table], ARROW[table])
        self._writers[table].write_table(rows)
        self._rows[table] += rows.num_rows

    def add_attempts(self, batch: pa.RecordBatch, origin_topic: str) -> None:
        """The transitions and dead letters of a batch of a whole group's attempts."""
        if "transitions" in self._paths:
            self.write("transitions", transitions_of(batch))
        if "dead_letters" in self._paths:
            self.write("dead_letters", dead_letters_of(batch, origin_topic))

    def close(self) -> list[tuple[str, str, int]]:
        for writer in self._writers.values():
            writer.close()
        return [(table, self._paths[table], self._rows[table]) for table in self._writers]
