"""The invariants of a run's tables (docs/model.md §9) as Spark passes over the tables.

Each pass turns tables into rows carrying, per invariant it checks, a ``bad_<name>`` flag
and a ``why_<name>`` text, and reduces them to one row per run and group
(:func:`group_counts`). Nothing message-level reaches the driver: :mod:`retrysim.validate`
collects those per-group rows and, only when an invariant breaks, a few example rows.

* **path** -- transitions per message in ``seq`` order (one window): each step is an edge of
  the state machine, ``seq`` matches delivery and state, deliveries step by one, time never
  goes back;
* **deliveries** -- attempts, transitions and dead letters per delivery (one grouping of
  their union, shuffled by message so the window that follows needs no second shuffle):
  every attempt has its transitions at its times, ``reconsume_times`` counts from the
  first or replayed delivery, a retry is Ready when its predecessor said, each DLQ delivery
  has one dead letter;
* **messages** -- each message against its first delivery and the run's horizon;
* **load**, **summary** -- small per-group aggregates, compared on the driver.

The state machine: Ready -> Inflight -> Commit | WaitingRetry | DLQ | Discard;
WaitingRetry -> Ready (a retry) or DLQ | Discard (an after-backoff leave, ``k = 4``);
DLQ -> Ready only with reason ``replayed``; every path starts with Ready (``published``).
States are compared as small integer codes in the deliveries pass, so Spark aggregates them
with a hash aggregate (strings would force a sort-based one).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from retrysim import limits
from retrysim.policy import (
    COMMIT,
    DISCARD,
    DLQ,
    INFLIGHT,
    READY,
    READY_LOCAL,
    READY_PUBLISHED,
    READY_REPLAYED,
    READY_RETRY_DUE,
    READY_VISIBLE,
    WAITING_RETRY,
)
from retrysim.tables import PARTITION_COLUMN
from retrysim.transitions import SEQ_PER_DELIVERY


@dataclass(frozen=True)
class Invariant:
    name: str
    rule: str


INVARIANTS = (
    Invariant("legal_path", "each message's transitions are a legal path of the state machine"),
    Invariant("seq_numbering", "seq = 4*(delivery-1)+k, k by state (1 Ready ... 4 leave), unique"),
    Invariant("deliveries_consecutive", "deliveries run 1, 2, 3, ... per message, no gap"),
    Invariant("time_order", "times never go backwards along a message's path"),
    Invariant("reconsume_times", "reconsume_times = deliveries since the first or replayed one"),
    Invariant("attempts_transitions", "each attempt has its transitions, at its times and state"),
    Invariant("dead_letters", "one dead letter per DLQ delivery, at its time, with its replay"),
    Invariant("messages_attempts", "every message born before the horizon is delivered first"),
    Invariant("summary_counts", "summary = counts of the rows; messages = settled + pending"),
    Invariant("load_totals", "load's counts sum to the counts of the transitions"),
    Invariant("load_gauges", "load's buckets are complete and its final gauges match"),
    Invariant("runs_row", "every run has one runs row, with status complete"),
)
PATH_CHECKS = ("legal_path", "seq_numbering", "deliveries_consecutive", "time_order")
DELIVERY_CHECKS = ("attempts_transitions", "time_order", "reconsume_times",
                   "deliveries_consecutive", "dead_letters")  # fmt: skip
MESSAGE_CHECKS = ("messages_attempts",)
MSG = [PARTITION_COLUMN, "group", "msg_id"]
DELIVERY = [*MSG, "delivery"]
GROUP = [PARTITION_COLUMN, "group"]
# MSG in the order windows sort by: msg_id first, because Spark's sort compares a prefix of
# the first key before the whole row, and run_id and group are the same on nearly every row.
MSG_SORT = ["msg_id", PARTITION_COLUMN, "group"]

_STATES = (READY, INFLIGHT, COMMIT, WAITING_RETRY, DLQ, DISCARD)
_CODE = {state: index + 1 for index, state in enumerate(_STATES)}
_END_STATES = (COMMIT, WAITING_RETRY, DLQ, DISCARD)
_RETRY_REASONS = (READY_RETRY_DUE, READY_LOCAL, READY_VISIBLE)
_LEAVE_K, _END_K = 4, 3


def _flag(condition: Column) -> Column:
    """A violation flag: a null condition (a value missing) counts as a violation."""
    return F.coalesce(condition, F.lit(True))


def _differs(left: Column, right: Column) -> Column:
    return ~left.eqNullSafe(right)


def _before(late: Column, early: Column) -> Column:
    return F.coalesce(late < early, F.lit(False))


def _code(state: Column) -> Column:
    return F.create_map(*[x for s, n in _CODE.items() for x in (F.lit(s), F.lit(n))])[state]


def _name(code: Column) -> Column:
    return F.coalesce(F.element_at(F.array(*map(F.lit, _STATES)), code), code.cast("string"))


def _text(template: str, *parts: str | Column) -> Column:
    """A ``why_*`` text: ``template`` filled with columns (by name) or expressions."""
    return F.format_string(template, *[F.col(p) if isinstance(p, str) else p for p in parts])


def _k(seq: Column, delivery: Column) -> Column:
    return seq - (delivery - 1) * F.lit(SEQ_PER_DELIVERY)


# --------------------------------------------------------------------------- path


def path_rows(transitions: DataFrame) -> DataFrame:
    """Transitions in seq order per message, each with its predecessor and its flags."""
    order = Window.partitionBy(*MSG_SORT).orderBy("seq")
    rows = transitions.select(*DELIVERY, "seq", "state", "at_ms", "reason", "topic").withColumns(
        {
            **{f"prev_{c}": F.lag(c).over(order) for c in ("state", "delivery", "seq", "at_ms")},
            "prev_reason": F.lag("reason").over(order),
            "last": F.lead("seq").over(order).isNull(),
        }
    )
    c = F.col
    state, prev, reason = c("state"), c("prev_state"), c("reason")
    ready = state == F.lit(READY)
    legal = (
        F.when(prev.isNull(), ready & (reason == F.lit(READY_PUBLISHED)))
        .when(prev == F.lit(READY), state == F.lit(INFLIGHT))
        .when(prev == F.lit(INFLIGHT), state.isin(*_END_STATES))
        .when(
            prev == F.lit(WAITING_RETRY),
            (ready & reason.isin(*_RETRY_REASONS)) | state.isin(DLQ, DISCARD),
        )
        .when(prev == F.lit(DLQ), ready & (reason == F.lit(READY_REPLAYED)))
        .otherwise(F.lit(False))
    )
    same_delivery = c("prev_delivery") == c("delivery")
    leave_k = F.when((prev == F.lit(WAITING_RETRY)) & same_delivery, _LEAVE_K).otherwise(_END_K)
    expected_k = (
        F.when(ready, 1)
        .when(state == F.lit(INFLIGHT), 2)
        .when(state.isin(COMMIT, WAITING_RETRY), _END_K)
        .when(state.isin(DLQ, DISCARD), leave_k)
    )
    step = (
        F.when(prev.isNull(), c("delivery") == 1)
        .when(ready, c("delivery") == c("prev_delivery") + 1)
        .otherwise(same_delivery)
    )
    edge = F.concat_ws(" -> ", F.coalesce(prev, F.lit("start")), state)
    at = F.format_string("at seq %s (delivery %s)", c("seq"), c("delivery"))
    return rows.withColumns(
        {
            "bad_legal_path": _flag(~legal),
            "why_legal_path": F.format_string("%s (reason %s) %s", edge, reason, at),
            "bad_seq_numbering": _flag(_k(c("seq"), c("delivery")) != expected_k)
            | _before(c("seq"), c("prev_seq") + 1),
            "why_seq_numbering": F.format_string("%s %s after seq %s", state, at, c("prev_seq")),
            "bad_deliveries_consecutive": _flag(~step),
            "why_deliveries_consecutive": F.format_string(
                "%s %s after delivery %s", edge, at, c("prev_delivery")
            ),
            "bad_time_order": c("at_ms").isNull() | _before(c("at_ms"), c("prev_at_ms")),
            "why_time_order": F.format_string(
                "%s %s at %s ms, after %s ms", edge, at, c("at_ms"), c("prev_at_ms")
            ),
        }
    )


def path_counts(path: DataFrame) -> DataFrame:
    """Per run and group: violations, and the counts summary and load must agree with."""
    c = F.col
    state, reason, last = c("state"), c("reason"), c("last")
    inflight = state == F.lit(INFLIGHT)
    ready = state == F.lit(READY)
    writes = (
        (ready & reason.isin(READY_PUBLISHED, READY_REPLAYED, READY_RETRY_DUE))
        | ((state == F.lit(WAITING_RETRY)) & (c("topic") == F.lit(limits.SCHEDULE_TOPIC)))
        | (state == F.lit(DLQ))
    )
    first_kind = c("prev_reason").isin(READY_PUBLISHED, READY_REPLAYED)
    return path.groupBy(*GROUP).agg(
        *[F.count_if(c(f"bad_{name}")).alias(f"path_{name}") for name in PATH_CHECKS],
        F.count_if(last & (state == F.lit(COMMIT))).alias("final_commit"),
        F.count_if(last & (state == F.lit(DLQ))).alias("final_dlq"),
        F.count_if(last & (state == F.lit(DISCARD))).alias("final_discard"),
        F.count_if(inflight).alias("t_deliveries"),
        F.count_if(inflight & (c("delivery") == 1)).alias("t_first_deliveries"),
        F.count_if(inflight & ~F.coalesce(first_kind, F.lit(False))).alias("t_retries"),
        F.count_if(state == F.lit(COMMIT)).alias("t_commits"),
        F.count_if(state == F.lit(DLQ)).alias("t_dlq"),
        F.count_if(state == F.lit(DISCARD)).alias("t_discards"),
        F.count_if(ready & (reason == F.lit(READY_REPLAYED))).alias("t_replays"),
        F.count_if(writes).alias("t_commitlog_writes"),
    )


# --------------------------------------------------------------------------- deliveries

_ATTEMPT_COLUMNS = ("reconsume_times", "ready_ms", "start_ms", "end_ms", "next_ready_ms",
                    "settled_ms")  # fmt: skip


def _per_delivery(tables: dict[str, DataFrame]) -> DataFrame:
    """Attempt, transitions and dead letter of each delivery, side by side (numeric only)."""
    c = F.col
    attempts = tables["attempts"].select(
        *DELIVERY,
        F.lit(1).alias("a_n"),
        _code(c("result_state")).alias("a_state"),
        *[c(name).alias(f"a_{name}") for name in _ATTEMPT_COLUMNS],
    )
    transitions = tables["transitions"].select(
        *DELIVERY,
        F.lit(1).alias("t_n"),
        "seq",
        "at_ms",
        _code(c("state")).alias("t_state"),
        (c("reason") == F.lit(READY_REPLAYED)).cast("int").alias("t_replayed"),
        _k(c("seq"), c("delivery")).alias("k"),
    )
    dead = tables["dead_letters"].select(
        *MSG,
        c("deliveries").alias("delivery"),
        F.lit(1).alias("d_n"),
        "dlq_at_ms",
        "replayed_at_ms",
        _differs(c("dlq_topic"), F.concat(F.lit(limits.DLQ_TOPIC_PREFIX), c("group")))
        .cast("int")
        .alias("d_bad_topic"),
    )
    k, state, at = c("k"), c("t_state"), c("at_ms")
    return (
        attempts.unionByName(transitions, allowMissingColumns=True)
        .unionByName(dead, allowMissingColumns=True)
        .repartition(*MSG_SORT)  # one shuffle serves the grouping and the window below
        .groupBy(*DELIVERY)
        .agg(
            *[F.coalesce(F.sum(n), F.lit(0)).alias(n) for n in ("a_n", "t_n", "d_n")],
            F.max("a_state").alias("a_state"),
            *[F.max(f"a_{name}").alias(f"a_{name}") for name in _ATTEMPT_COLUMNS],
            F.min(F.when(k == 1, at)).alias("t_ready_ms"),
            F.max(F.when(k == 1, c("t_replayed"))).alias("t_replayed"),
            F.min(F.when(k == 2, at)).alias("t_start_ms"),
            F.min(F.when(k == _END_K, at)).alias("t_end_ms"),
            F.max(F.when(k == _END_K, state)).alias("t_end_state"),
            F.max_by(state, c("seq")).alias("t_last_state"),
            F.max_by(at, c("seq")).alias("t_last_ms"),
            F.max("dlq_at_ms").alias("d_at_ms"),
            F.max("replayed_at_ms").alias("d_replayed_at_ms"),
            F.max("d_bad_topic").alias("d_bad_topic"),
        )
    )


def delivery_rows(tables: dict[str, DataFrame], ends: DataFrame) -> DataFrame:
    """One row per delivery with the next one's Ready, the last replay so far, the end of
    the run's load buckets (``ends``: run_id, group, load_end_ms) and the flags."""
    order = Window.partitionBy(*MSG_SORT).orderBy("delivery")
    so_far = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    replay = F.when(F.col("t_replayed") == 1, F.col("delivery"))
    per = _per_delivery(tables).withColumns(
        {
            "prev_delivery": F.lag("delivery").over(order),
            "next_ready_ms": F.lead("t_ready_ms").over(order),
            "next_replayed": F.lead("t_replayed").over(order),
            "last_replay": F.max(replay).over(so_far),
        }
    )
    return per.join(F.broadcast(ends), GROUP, "left").withColumns(_delivery_flags())


def _delivery_flags() -> dict[str, Column]:
    c = F.col
    result, code = c("a_state"), _CODE
    settled = result.isin(code[COMMIT], code[DLQ], code[DISCARD])
    after_backoff = c("t_end_state") == code[WAITING_RETRY]
    expected_n = (
        F.when(result == code[READY], 1)
        .when(result == code[INFLIGHT], 2)
        .when(result.isin(code[COMMIT], code[WAITING_RETRY]), 3)
        .when(result.isin(code[DLQ], code[DISCARD]), F.when(after_backoff, 4).otherwise(3))
    )
    mismatch = (
        (c("a_n") != 1)
        | (c("t_n") != expected_n)
        | _differs(c("t_ready_ms"), c("a_ready_ms"))
        | _differs(c("t_start_ms"), c("a_start_ms"))
        | _differs(c("t_end_ms"), c("a_end_ms"))
        | _differs(c("t_last_state"), result)
        | (settled & _differs(c("t_last_ms"), c("a_settled_ms")))
    )
    backwards = (
        _before(c("a_start_ms"), c("a_ready_ms"))
        | _before(c("a_end_ms"), c("a_start_ms"))
        | _before(c("a_settled_ms"), c("a_end_ms"))
        | _before(c("a_next_ready_ms"), c("a_end_ms"))
    )
    replayed_next = F.coalesce(c("next_replayed") == 1, F.lit(False))
    retried = c("next_ready_ms").isNotNull() & ~replayed_next
    late = retried & _differs(c("next_ready_ms"), c("a_next_ready_ms"))
    is_dlq = F.coalesce(result == code[DLQ], F.lit(False))
    dead_wrong = (c("d_n") == 1) & (
        _differs(c("d_at_ms"), c("a_settled_ms"))
        | (c("d_bad_topic") == 1)
        | _differs(c("d_replayed_at_ms"), F.when(replayed_next, c("next_ready_ms")))
    )
    step = F.when(c("prev_delivery").isNull(), c("delivery") == 1).otherwise(
        c("delivery") == c("prev_delivery") + 1
    )
    since = c("delivery") - F.coalesce(c("last_replay"), F.lit(1))
    until = F.coalesce(c("a_next_ready_ms"), c("a_settled_ms"))
    pairs = ("a_ready_ms", "t_ready_ms", "a_start_ms", "t_start_ms", "a_end_ms", "t_end_ms")
    times = ("a_ready_ms", "a_start_ms", "a_end_ms", "a_settled_ms", "a_next_ready_ms")
    return {
        "bad_attempts_transitions": _flag(mismatch),
        "why_attempts_transitions": _text(
            "%s attempt row(s) ending %s, %s transition(s) ending %s; ready %s/%s, start %s/%s, "
            "end %s/%s ms (attempt/transitions)",
            *("a_n", _name(result), "t_n", _name(c("t_last_state")), *pairs),
        ),
        "bad_time_order": backwards | late,
        "why_time_order": _text(
            "ready %s, start %s, end %s, settled %s, next_ready %s ms; next delivery Ready at %s",
            *(*times, "next_ready_ms"),
        ),
        "bad_reconsume_times": (c("a_n") == 1) & _differs(c("a_reconsume_times"), since),
        "why_reconsume_times": _text("reconsume_times %s, expected %s", "a_reconsume_times", since),
        "bad_deliveries_consecutive": _flag(~step),
        "why_deliveries_consecutive": _text(
            "delivery %s follows delivery %s", "delivery", "prev_delivery"
        ),
        "bad_dead_letters": (is_dlq != (c("d_n") >= 1)) | (c("d_n") > 1) | _flag(dead_wrong),
        "why_dead_letters": _text(
            "%s dead letter(s) (dlq_at_ms %s, replayed_at_ms %s) for a delivery ending %s at %s",
            *("d_n", "d_at_ms", "d_replayed_at_ms", _name(result), "a_settled_ms"),
        ),
        "open_waiting_retry": after_backoff & (until.isNull() | (until >= c("load_end_ms"))),
    }


def delivery_counts(per: DataFrame) -> DataFrame:
    c = F.col
    return per.groupBy(*GROUP).agg(
        *[F.count_if(c(f"bad_{name}")).alias(f"delivery_{name}") for name in DELIVERY_CHECKS],
        F.sum("d_n").alias("dead_letter_rows"),
        F.count_if((c("d_n") >= 1) & c("d_replayed_at_ms").isNotNull()).alias(
            "dead_letters_replayed"
        ),
        F.count_if(c("a_state") == _CODE[INFLIGHT]).alias("end_inflight"),
        F.count_if(c("a_state") == _CODE[READY]).alias("end_ready_backlog"),
        F.count_if(c("open_waiting_retry")).alias("end_waiting_retry"),
    )


# --------------------------------------------------------------------------- messages


def message_rows(tables: dict[str, DataFrame]) -> DataFrame:
    """Each message with its first delivery and its run's horizon (from config_json)."""
    c = F.col
    horizon = F.get_json_object(c("config_json"), "$.horizon").cast("long")
    horizons = tables["runs"].select(PARTITION_COLUMN, horizon.alias("horizon_ms"))
    messages = tables["messages"].select(*MSG, "born_ms", "size_bytes", F.lit(1).alias("m_n"))
    first = (
        tables["attempts"]
        .where(c("delivery") == 1)
        .select(*MSG, c("ready_ms"), F.lit(1).alias("f_n"))
    )
    rows = (
        messages.unionByName(first, allowMissingColumns=True)
        .groupBy(*MSG)
        .agg(
            *[F.coalesce(F.sum(n), F.lit(0)).alias(n) for n in ("m_n", "f_n")],
            *[F.max(name).alias(name) for name in ("born_ms", "size_bytes", "ready_ms")],
        )
        .join(F.broadcast(horizons), PARTITION_COLUMN, "left")
    )
    published = c("born_ms") < c("horizon_ms")
    bad = (
        (c("m_n") != 1)
        | (c("f_n") > 1)
        | F.coalesce(published != (c("f_n") == 1), F.lit(False))
        | ((c("f_n") == 1) & _differs(c("ready_ms"), c("born_ms")))
    )
    return rows.withColumns(
        {
            "bad_messages_attempts": bad,
            "why_messages_attempts": _text(
                "%s message row(s) born at %s ms (horizon %s ms), %s first delivery(ies) Ready "
                "at %s ms",
                *("m_n", "born_ms", "horizon_ms", "f_n", "ready_ms"),
            ),
        }
    )


def message_counts(rows: DataFrame) -> DataFrame:
    return rows.groupBy(*GROUP).agg(
        F.count_if(F.col("bad_messages_attempts")).alias("message_messages_attempts"),
        F.count_if(F.col("m_n") >= 1).alias("message_rows"),
        F.max("size_bytes").alias("size_bytes"),
    )


# --------------------------------------------------------------------------- load, summary

LOAD_SUMS = ("deliveries", "first_deliveries", "retries", "commits", "dlq", "discards",
             "replays", "commitlog_writes", "commitlog_bytes")  # fmt: skip
GAUGES = ("inflight", "ready_backlog", "waiting_retry")
SUMMARY_COLUMNS = ("messages", "deliveries", "retries", "commits", "dlq", "discards",
                   "pending", "replayed", "amplification", "commitlog_writes")  # fmt: skip


def load_counts(load: DataFrame) -> DataFrame:
    return load.groupBy(*GROUP).agg(
        F.count(F.lit(1)).alias("load_rows"),
        F.count_distinct("bucket_start_ms").alias("load_buckets"),
        F.min("bucket_start_ms").alias("load_first_ms"),
        (F.max("bucket_start_ms") + F.max("bucket_ms")).alias("load_end_ms"),
        F.min("bucket_ms").alias("bucket_ms_min"),
        F.max("bucket_ms").alias("bucket_ms"),
        *[F.sum(name).alias(f"load_{name}") for name in LOAD_SUMS],
        *[F.max_by(name, "bucket_start_ms").alias(f"load_end_{name}") for name in GAUGES],
    )


def summary_counts(summary: DataFrame) -> DataFrame:
    return summary.groupBy(*GROUP).agg(
        F.count(F.lit(1)).alias("summary_rows"),
        *[F.max(name).alias(f"s_{name}") for name in SUMMARY_COLUMNS],
    )


def runs_counts(runs: DataFrame, complete: str) -> DataFrame:
    return runs.groupBy(PARTITION_COLUMN).agg(
        F.count(F.lit(1)).alias("rows"),
        F.count_if(F.col("status") == F.lit(complete)).alias("complete"),
    )
