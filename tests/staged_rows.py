"""Staged attempt rows written by hand, for tests of the DataFrame -> DataFrame steps: a
committed delivery, a 4.x retry through the schedule topic, a 5.x after-backoff move to the
DLQ; each row as docs/model.md says the engine writes it, not as the engine does."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession

from retrysim.tables.schemas import STAGE

SCHED = "SCHEDULE_TOPIC_XXXX"
RETRY = "%RETRY%g"
DLQ_TOPIC = "%DLQ%g"


def stage(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    """Staged attempts of group ``g`` on topic ``T`` queue 0; unnamed columns are null."""
    base = {
        "group": "g",
        "source_topic": "T",
        "queue_id": 0,
        "consumer_instance": 0,
        "born_ms": 0,
        "batch_size": 1,
        "reconsume_times": 0,
        "poison_fixed": False,
    }
    names = [f.name for f in STAGE.fields]
    rows = [{**base, **row} for row in rows]
    for row in rows:  # the broker's count is the client's unless a row says otherwise
        row.setdefault("broker_reconsume_times", row["reconsume_times"])
    return spark.createDataFrame([tuple(row.get(name) for name in names) for row in rows], STAGE)


def committed(msg_id: int, ready: int, start: int, processing: int) -> dict[str, Any]:
    end = start + processing
    return {
        "msg_id": msg_id,
        "delivery": 1,
        "ready_ms": ready,
        "ready_reason": "published",
        "start_ms": start,
        "processing_ms": processing,
        "end_ms": end,
        "outcome": "CONSUME_SUCCESS",
        "result_state": "Commit",
        "settled_ms": end,
        "end_state": "Commit",
        "end_topic": "T",
        "end_queue_id": 0,
        "end_reason": "CONSUME_SUCCESS",
    }


def retried(
    msg_id: int, delivery: int, ready: int, start: int, processing: int, level: int, wait: int
) -> dict[str, Any]:
    """A 4.x concurrent failure: sent back to the schedule topic at ``level``."""
    end = start + processing
    return {
        "msg_id": msg_id,
        "delivery": delivery,
        "reconsume_times": delivery - 1,
        "source_topic": "T" if delivery == 1 else RETRY,
        "ready_ms": ready,
        "ready_reason": "published" if delivery == 1 else "retry_due",
        "start_ms": start,
        "processing_ms": processing,
        "end_ms": end,
        "outcome": "RECONSUME_LATER",
        "result_state": "WaitingRetry",
        "delay_level": level,
        "next_ready_ms": end + wait,
        "settled_ms": end,
        "end_state": "WaitingRetry",
        "end_topic": SCHED,
        "end_queue_id": level - 1,
        "end_reason": "RECONSUME_LATER",
        "next_topic": RETRY,
        "next_queue_id": 0,
        "next_reason": "retry_due",
    }


def dead_after_backoff(msg_id: int, start: int, processing: int, backoff: int) -> dict[str, Any]:
    """A 5.x push failure past the max: WaitingRetry, then DLQ one backoff later."""
    end = start + processing
    return {
        "msg_id": msg_id,
        "delivery": 1,
        "ready_ms": start,
        "ready_reason": "published",
        "start_ms": start,
        "processing_ms": processing,
        "end_ms": end,
        "outcome": "EXCEPTION",
        "result_state": "DLQ",
        "settled_ms": end + backoff,
        "end_state": "WaitingRetry",
        "end_topic": RETRY,
        "end_queue_id": 0,
        "end_reason": "EXCEPTION",
        "leave_state": "DLQ",
        "leave_topic": DLQ_TOPIC,
        "leave_queue_id": 0,
        "leave_reason": "max_reconsume_times",
    }


def sort(df: DataFrame) -> DataFrame:
    return df.orderBy(*df.columns)
