"""The invariants of a run's tables (docs/model.md §9): their catalogue and shared columns.

Each check turns tables into rows carrying, per invariant, a ``bad_<name>`` flag (and, asked
with ``explain``, a ``why_<name>`` text), reduced to one row per run and group, so nothing
message-level reaches the driver. Two ways check them: digests that prove whole chains of
deliveries at once (:mod:`retrysim.checks.chain_digests`), and, only when a digest disagrees, the
row-by-row pass that counts and shows each violation (:mod:`retrysim.checks.rows`).

States and Ready reasons are compared as small integer codes: the rows Spark shuffles and
sorts stay narrow, and it aggregates them with a hash aggregate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from retrysim.model.states import (
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
from retrysim.scenario import limits
from retrysim.tables.schemas import PARTITION_COLUMN, TRANSITIONS


@dataclass(frozen=True)
class Invariant:
    name: str
    rule: str


INVARIANTS = (
    Invariant("legal_path", "each message's transitions are a legal path of the state machine"),
    Invariant("seq_numbering", "seq = 4*(delivery-1)+k, k by state (1 Ready ... 4 leave), unique"),
    Invariant("deliveries_consecutive", "deliveries run 1, 2, 3, ... per message, no gap"),
    Invariant("time_order", "times never go backwards along a message's path"),
    Invariant(
        "reconsume_times",
        "reconsume_times (client and broker) follow from the previous delivery; 0 when "
        "first or replayed",
    ),
    Invariant(
        "attempts_transitions",
        "the transitions are exactly those the attempts give, ending in their results",
    ),
    Invariant("dead_letters", "one dead letter per DLQ delivery, at its time, with its replay"),
    Invariant(
        "attempts_routing",
        "an attempt carries its message's born_ms, and a retry is Ready on the topic and queue "
        "and for the reason its predecessor named (next_*), with its poison_fixed",
    ),
    Invariant("messages_attempts", "every message born before the horizon is delivered first"),
    Invariant("summary_counts", "summary = counts of the rows; messages = settled + pending"),
    Invariant(
        "load_totals",
        "load's counts sum to the counts of the transitions, and instance_load's to load's",
    ),
    Invariant(
        "load_gauges",
        "load's buckets are complete, its final gauges match, no peak is below its gauge, and "
        "the summary's peaks are the load's",
    ),
    Invariant("runs_row", "every run has one runs row, with status complete"),
)
DELIVERY_CHECKS = ("legal_path", "seq_numbering", "deliveries_consecutive", "time_order",
                   "reconsume_times", "attempts_transitions", "dead_letters",
                   "attempts_routing")  # fmt: skip
MESSAGE_CHECKS = ("messages_attempts",)
MSG = [PARTITION_COLUMN, "group", "msg_id"]
DELIVERY = [*MSG, "delivery"]
GROUP = [PARTITION_COLUMN, "group"]
# MSG in the order windows sort by: msg_id first, because Spark's sort compares a prefix of
# the first key before the whole row, and run_id and group are the same on nearly every row.
MSG_SORT = ["msg_id", PARTITION_COLUMN, "group"]

STATES = (READY, INFLIGHT, COMMIT, WAITING_RETRY, DLQ, DISCARD)
STATE_CODE = {state: index + 1 for index, state in enumerate(STATES)}
END_STATES = (COMMIT, WAITING_RETRY, DLQ, DISCARD)
# The Ready reasons the path rules tell apart; any other reason is code 0.
REASONS = (READY_PUBLISHED, READY_REPLAYED, READY_RETRY_DUE, READY_LOCAL, READY_VISIBLE)
REASON_CODE = {reason: index + 1 for index, reason in enumerate(REASONS)}
SRC_MESSAGE, SRC_ATTEMPT, SRC_DEAD_LETTER = range(3)
RETRY_REASONS = (READY_RETRY_DUE, READY_LOCAL, READY_VISIBLE)
# The kinds of link into a delivery's Ready (retrysim.checks.chain_digests): from its message
# (published), from the previous delivery's WaitingRetry (a retry) or from its dead letter
# (replayed); any other reason is odd.
LINK_FIRST, LINK_RETRY, LINK_REPLAY, LINK_ODD = 1, 2, 3, 0
# A delivery's steps: k = seq - 4*(delivery-1) of its Ready, Inflight, end and leave.
STEPS = {1: "ready", 2: "start", 3: "end", 4: "leave"}


def flagged(condition: Column) -> Column:
    """A violation flag: a null condition (a value missing) counts as a violation."""
    return F.coalesce(condition, F.lit(True))


def differs(left: Column, right: Column) -> Column:
    return ~left.eqNullSafe(right)


def is_before(late: Column, early: Column) -> Column:
    return F.coalesce(late < early, F.lit(False))


def lookup(mapping: dict, key: Column) -> Column:
    """``mapping[key]`` for each row (null for a key it does not hold)."""
    return F.create_map(*[F.lit(x) for item in mapping.items() for x in item])[key]


def state_code(state: Column) -> Column:
    return lookup(STATE_CODE, state)


def state_name(code: Column) -> Column:
    return F.coalesce(lookup({n: s for s, n in STATE_CODE.items()}, code), code.cast("string"))


def reason_code_of(reason: Column) -> Column:
    return F.coalesce(lookup(REASON_CODE, reason), F.lit(0))


def reason_name_of(code: Column) -> Column:
    return F.coalesce(lookup({n: r for r, n in REASON_CODE.items()}, code), F.lit("other"))


def sum_of(columns: list[Column]) -> Column:
    """The sum of ``columns``, row by row."""
    return reduce(lambda a, b: a + b, columns)


def why_text(template: str, *parts: str | Column) -> Column:
    """A ``why_*`` text: ``template`` filled with columns (by name) or expressions."""
    return F.format_string(template, *[F.col(p) if isinstance(p, str) else p for p in parts])


# The transition columns a row's hash covers (run_id and group are the digest's keys).
HASHED = tuple(name for name in TRANSITIONS.fieldNames() if name not in GROUP)


def transition_hash(values: list[Column]) -> Column:
    """A transition row's 64-bit hash (``values`` in :data:`HASHED` order); the null mask
    keeps ``(null, x)`` and ``(x, null)`` apart, which the hash alone would not."""
    nulls = sum_of(
        [F.when(value.isNull(), 1 << bit).otherwise(0) for bit, value in enumerate(values)]
    )
    return F.xxhash64(*values, nulls)


def run_horizons(runs: DataFrame) -> DataFrame:
    """Each run's horizon (``horizon_ms``), from its resolved scenario."""
    horizon = F.get_json_object(F.col("config_json"), "$.horizon").cast("long")
    return runs.select(PARTITION_COLUMN, horizon.alias("horizon_ms"))


def off_dlq_topic() -> Column:
    """Whether a dead letter is not on its group's DLQ topic (``%DLQ%<group>``)."""
    expected = F.concat(F.lit(limits.DLQ_TOPIC_PREFIX), F.col("group"))
    return differs(F.col("dlq_topic"), expected)


def still_inflight() -> Column:
    """An attempt row Inflight at the horizon (a 5.x simple delivery Inflight until it was
    visible again has its next delivery's time instead)."""
    return (F.col("a_state") == STATE_CODE[INFLIGHT]) & F.col("a_next_ready_ms").isNull()
