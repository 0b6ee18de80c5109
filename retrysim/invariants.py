"""The invariants of a run's tables (docs/model.md §9) as Spark passes over the tables.

Each pass turns tables into rows carrying, per invariant it checks, a ``bad_<name>`` flag
(and, asked with ``explain``, a ``why_<name>`` text), and reduces them to one row per run
and group (:func:`checked_counts` and the small ones below). Nothing message-level reaches
the driver: :mod:`retrysim.validate` collects those per-group rows and, only when an
invariant breaks, a few example rows, built again with their texts.

The transitions table is checked against the attempts first: :func:`transition_digest`
and :func:`derived_digest` count and hash its rows and the rows the attempts give (the
derivation that wrote them, :func:`retrysim.transitions.step_columns`), per run and group,
with a scan of each and no shuffle. When they agree, the table *is* the attempts'
transitions, so the message-level checks read each delivery's transitions from its
attempt row (its steps) instead of shuffling three or four rows per delivery. When they
differ, :func:`transition_mismatches` finds the rows, for the report.

**Chains.** Every delivery's Ready takes a *link* offered by its predecessor: its message
(delivery 1, published, when born), the previous delivery's WaitingRetry (due before the
horizon: the next delivery number, reconsume_times + 1, next_ready_ms, the topic, queue and
reason it named) or its dead letter (replayed). :func:`attempt_chain_digest`,
:func:`message_chain_digest` and :func:`dead_letter_chain_digest` hash the links each side
gives, per run and group, in the scans they make anyway; when the links taken equal the
links offered (and DLQ deliveries their dead letters, and no row breaks a rule alone, and no
message is listed twice), every path, delivery and message check holds: a path starts at
its message and each step is a legal edge at the offered time, place and numbers. Only when
they disagree does validation run the row-by-row pass below, for exact counts and examples
(a violation is counted there per delivery; a 64-bit digest misses a broken chain with
probability about 2^-64).

The row-by-row checks run on one frame, :func:`message_union` (messages, attempts with
their steps, and dead letters, shuffled by message once), grouped per delivery by a hash
aggregate, then a window per message over the delivery rows. What an attempt row shows on
its own (:func:`_local_rules`) is checked before the shuffle, as bits of one int, so the
rows shuffled and sorted carry a dozen numbers rather than every step:

* **path** -- a delivery's transitions are its steps Ready, Inflight, an end state and
  (after WaitingRetry) a leave, each at its step, in time order, and its Ready follows the
  previous delivery's last state by a legal edge;
* **deliveries** -- every attempt's transitions end in its result at its times,
  ``reconsume_times`` counts from the first or replayed delivery, deliveries step by one, a
  retry is Ready when its predecessor said, each DLQ delivery has one dead letter;
* **messages** -- each message against its first delivery and the run's horizon;
* **load**, **summary** -- small per-group aggregates, compared on the driver.

The state machine: Ready -> Inflight -> Commit | WaitingRetry | DLQ | Discard;
WaitingRetry -> Ready (a retry) or DLQ | Discard (an after-backoff leave, ``k = 4``);
DLQ -> Ready only with reason ``replayed``; every path starts with Ready (``published``).
States and Ready reasons are compared as small integer codes: the rows Spark shuffles and
sorts stay narrow, and it aggregates them with a hash aggregate (strings would force a
sort-based one). A violation is counted once per delivery (or message, or group).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from itertools import pairwise

from pyspark.sql import Column, DataFrame, SparkSession, Window
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
from retrysim.tables import PARTITION_COLUMN, TRANSITIONS, select_schema
from retrysim.transitions import step_columns, transitions_from_attempts


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
    Invariant("load_totals", "load's counts sum to the counts of the transitions"),
    Invariant("load_gauges", "load's buckets are complete and its final gauges match"),
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

_STATES = (READY, INFLIGHT, COMMIT, WAITING_RETRY, DLQ, DISCARD)
_CODE = {state: index + 1 for index, state in enumerate(_STATES)}
_END_STATES = (COMMIT, WAITING_RETRY, DLQ, DISCARD)
# The Ready reasons the path rules tell apart; any other reason is code 0.
_REASONS = (READY_PUBLISHED, READY_REPLAYED, READY_RETRY_DUE, READY_LOCAL, READY_VISIBLE)
_REASON_CODE = {reason: index + 1 for index, reason in enumerate(_REASONS)}
_SRC_MESSAGE, _SRC_ATTEMPT, _SRC_DEAD_LETTER = range(3)
_RETRY_REASONS = (READY_RETRY_DUE, READY_LOCAL, READY_VISIBLE)
# A delivery's steps: k = seq - 4*(delivery-1) of its Ready, Inflight, end and leave.
_STEPS = {1: "ready", 2: "start", 3: "end", 4: "leave"}


def _flag(condition: Column) -> Column:
    """A violation flag: a null condition (a value missing) counts as a violation."""
    return F.coalesce(condition, F.lit(True))


def _differs(left: Column, right: Column) -> Column:
    return ~left.eqNullSafe(right)


def _before(late: Column, early: Column) -> Column:
    return F.coalesce(late < early, F.lit(False))


def _lookup(mapping: dict, key: Column) -> Column:
    """``mapping[key]`` for each row (null for a key it does not hold)."""
    return F.create_map(*[F.lit(x) for item in mapping.items() for x in item])[key]


def _code(state: Column) -> Column:
    return _lookup(_CODE, state)


def _name(code: Column) -> Column:
    return F.coalesce(_lookup({n: s for s, n in _CODE.items()}, code), code.cast("string"))


def _reason_code(reason: Column) -> Column:
    return F.coalesce(_lookup(_REASON_CODE, reason), F.lit(0))


def _reason_name(code: Column) -> Column:
    return F.coalesce(_lookup({n: r for r, n in _REASON_CODE.items()}, code), F.lit("other"))


def _total(columns: list[Column]) -> Column:
    """The sum of ``columns``, row by row."""
    return reduce(lambda a, b: a + b, columns)


def _text(template: str, *parts: str | Column) -> Column:
    """A ``why_*`` text: ``template`` filled with columns (by name) or expressions."""
    return F.format_string(template, *[F.col(p) if isinstance(p, str) else p for p in parts])


# --------------------------------------------------------------------------- rows

_ATTEMPT_COLUMNS = ("reconsume_times", "ready_ms", "start_ms", "end_ms", "next_ready_ms",
                    "settled_ms")  # fmt: skip
# What a delivery breaks that its attempt row alone shows, as bits of ``l_bad``: computed
# before the shuffle, so the rows shuffled, aggregated and sorted by message carry one int
# instead of the step columns the rules read.
_LOCAL_RULES = ("illegal", "off_step", "path_backwards", "mismatch", "attempt_backwards",
                "unrouted")  # fmt: skip
_BIT = {name: 1 << index for index, name in enumerate(_LOCAL_RULES)}
# What the message pass needs of an attempt row besides its keys (the step columns stay
# behind unless example texts are wanted).
_NARROW = ("src", "a_state", "a_reconsume_times", "a_ready_ms", "a_next_ready_ms", "a_settled_ms",
           "a_born_ms", "a_poison_fixed", "a_next_route", "t_ready_ms", "t_ready_reason",
           "t_end_state", "t_last_state", "t_last_ms", "t_route", "l_bad")  # fmt: skip
# Where a delivery is Ready and where it routes its retry (readable, for example texts).
_ROUTE_TEXT = ("source_topic", "queue_id", "ready_reason", "next_topic", "next_queue_id",
               "next_reason")  # fmt: skip
# What the attempt rows count toward summary and load (sums per group, in the attempts scan
# of :func:`derived_digest`); the final states need the message's last delivery.
ATTEMPT_COUNTED = ("t_deliveries", "t_first_deliveries", "t_retries", "t_commits", "t_dlq",
                   "t_discards", "t_replays", "t_commitlog_writes")  # fmt: skip
FINAL_COUNTED = ("final_commit", "final_dlq", "final_discard")


def _attempt_steps(attempts: DataFrame, keep: tuple[str, ...] = ()) -> DataFrame:
    """Each attempt with its transitions (:func:`retrysim.transitions.step_columns`, the
    derivation that writes the transitions table) as columns per step: present or not, state
    code (0 for a state the model does not know), time; what they count toward summary and
    load; and ``l_bad``, the rules its row alone breaks. One row per delivery instead of
    three or four. Projections in turn: each reads the one before's plain columns instead of
    re-deriving the steps in every expression. ``keep``: attempt columns to carry along."""
    c = F.col
    code, why = _CODE, _REASON_CODE
    names = list(_STEPS.values())
    steps = dict(zip(names, step_columns(), strict=True))
    per_step = attempts.select(
        *DELIVERY,
        *keep,
        F.lit(_SRC_ATTEMPT).alias("src"),
        _code(c("result_state")).alias("a_state"),
        *[c(name).alias(f"a_{name}") for name in _ATTEMPT_COLUMNS],
        *[steps[n][0].cast("int").alias(f"t_n_{n}") for n in names],
        *[
            F.when(steps[n][0], F.coalesce(_code(steps[n][1]["state"]), F.lit(0))).alias(
                f"t_{n}_state"
            )
            for n in names
        ],
        *[F.when(steps[n][0], steps[n][1]["at_ms"]).alias(f"t_{n}_ms") for n in names],
        _reason_code(steps["ready"][1]["reason"]).alias("t_ready_reason"),
        (steps["end"][1]["topic"] == F.lit(limits.SCHEDULE_TOPIC)).alias("t_end_scheduled"),
        c("born_ms").alias("a_born_ms"),
        c("poison_fixed").cast("int").alias("a_poison_fixed"),
        _route("next_topic", "next_queue_id", "next_reason").alias("a_next_route"),
        _route("source_topic", "queue_id", "ready_reason").alias("t_route"),
        reduce(
            lambda a, b: a | b,
            [c(name).isNull() != c("next_ready_ms").isNull() for name in _ROUTE_TEXT[3:]],
        ).alias("t_unrouted"),
    )
    present = {n: c(f"t_n_{n}") == 1 for n in names}
    state = {n: c(f"t_{n}_state") for n in names}
    expected = {
        "ready": [code[READY]],
        "start": [code[INFLIGHT]],
        "end": [code[s] for s in _END_STATES],
        "leave": [code[DLQ], code[DISCARD]],
    }
    reason = c("t_ready_reason")

    def count(condition: Callable[[str], Column]) -> Column:
        return _total([F.coalesce(condition(n), F.lit(False)).cast("int") for n in names])

    def in_state(wanted: str) -> Column:
        return count(lambda n: state[n] == code[wanted])

    scheduled = (state["end"] == code[WAITING_RETRY]) & c("t_end_scheduled")
    first_kind = F.coalesce(reason.isin(why[READY_PUBLISHED], why[READY_REPLAYED]), F.lit(False))
    summed = per_step.withColumns(
        {
            "t_n": _total([c(f"t_n_{n}") for n in names]),
            "t_first_step": F.least(*[F.when(present[n], k) for k, n in _STEPS.items()]),
            "t_last_step": F.greatest(*[F.when(present[n], k) for k, n in _STEPS.items()]),
            "t_last_state": F.coalesce(*[state[n] for n in reversed(names)]),
            "t_last_ms": F.coalesce(*[F.when(present[n], c(f"t_{n}_ms")) for n in reversed(names)]),
            "t_off_step": count(lambda n: present[n] & ~state[n].isin(*expected[n])),
            "t_no_time": count(lambda n: present[n] & c(f"t_{n}_ms").isNull()),
            "t_deliveries": in_state(INFLIGHT),
            "t_first_deliveries": in_state(INFLIGHT) * (c("delivery") == 1).cast("int"),
            "t_retries": F.when(first_kind, 0).otherwise(in_state(INFLIGHT)),
            "t_commits": in_state(COMMIT),
            "t_dlq": in_state(DLQ),
            "t_discards": in_state(DISCARD),
            "t_replays": (reason == why[READY_REPLAYED]).cast("int"),
            "t_commitlog_writes": reason.isin(
                why[READY_PUBLISHED], why[READY_REPLAYED], why[READY_RETRY_DUE]
            ).cast("int")
            + F.coalesce(scheduled, F.lit(False)).cast("int")
            + in_state(DLQ),
        }
    ).drop("t_end_scheduled")
    local = _local_rules()
    return summed.withColumn(
        "l_bad", _total([F.when(local[name], _BIT[name]).otherwise(0) for name in _LOCAL_RULES])
    )


def _local_rules() -> dict[str, Column]:
    """The rules one attempt row shows broken (true: broken), on :func:`_attempt_steps`'
    columns: its path (Ready, Inflight, an end state, a leave only after WaitingRetry, each
    at its step, in time order) and its transitions against its own result and times."""
    c = F.col
    code = _CODE
    state = {name: c(f"t_{name}_state") for name in _STEPS.values()}
    ms = [c(f"t_{name}_ms") for name in _STEPS.values()]
    result = c("a_state")
    legal = (
        (state["ready"] == code[READY])
        & (c("t_last_step") == c("t_n"))  # the steps present are 1 .. t_n
        & (c("t_off_step") == 0)
        & (state["leave"].isNull() | (state["end"] == code[WAITING_RETRY]))
    )
    settled = result.isin(code[COMMIT], code[DLQ], code[DISCARD])
    after_backoff = state["end"] == code[WAITING_RETRY]
    expected_n = (
        F.when(result == code[READY], 1)
        .when(result == code[INFLIGHT], 2)
        .when(result.isin(code[COMMIT], code[WAITING_RETRY]), 3)
        .when(result.isin(code[DLQ], code[DISCARD]), F.when(after_backoff, 4).otherwise(3))
    )
    mismatch = (
        (c("t_n") != expected_n)
        | _differs(c("t_ready_ms"), c("a_ready_ms"))
        | _differs(c("t_start_ms"), c("a_start_ms"))
        | _differs(c("t_end_ms"), c("a_end_ms"))
        | _differs(c("t_last_state"), result)
        | (settled & _differs(c("t_last_ms"), c("a_settled_ms")))
    )
    return {
        "illegal": _flag(~legal),
        "off_step": c("t_off_step") > 0,
        "path_backwards": (c("t_no_time") > 0)
        | reduce(lambda a, b: a | b, [_before(y, x) for x, y in pairwise(ms)]),
        "mismatch": _flag(mismatch),
        "attempt_backwards": _before(c("a_start_ms"), c("a_ready_ms"))
        | _before(c("a_end_ms"), c("a_start_ms"))
        | _before(c("a_settled_ms"), c("a_end_ms"))
        | _before(c("a_next_ready_ms"), c("a_end_ms")),
        # next_topic, next_queue_id and next_reason are set exactly when a retry is due
        "unrouted": _flag(c("t_unrouted")),
    }


def _route(topic: str, queue_id: str, reason: str) -> Column:
    """A 64-bit hash of a place and reason of Ready with the row's poison_fixed: one number
    compares a retry's Ready with what its predecessor named."""
    return _row_hash([F.col(topic), F.col(queue_id), F.col(reason), F.col("poison_fixed")])


def _broke(rule: str) -> Column:
    """Whether a delivery's attempt row broke ``rule`` of :func:`_local_rules`."""
    return F.coalesce(F.col("l_bad").bitwiseAND(_BIT[rule]) != 0, F.lit(False))


def _step_hash(fields: dict[str, Column]) -> Column:
    """:func:`_row_hash` of the transition a step gives (its columns: ``fields``; the keys
    ``msg_id`` and ``delivery`` are the attempt's own)."""
    return _row_hash([fields.get(name, F.col(name)) for name in _HASHED])


# What the attempt rows give per delivery: the message pass takes the narrow ones as they
# are; the rest only when it writes the example texts of a broken invariant.
_STEP_COUNTS = ("t_off_step", "t_no_time")
_STEP_VALUES = ("t_ready_reason", "t_end_state", "t_last_state", "t_last_ms", "t_route")
_WIDE_VALUES = ("t_first_step", "t_last_step")


def message_union(tables: dict[str, DataFrame], explain: bool = False) -> DataFrame:
    """Messages, attempts (with their transitions as steps) and dead letters as rows of one
    frame, shuffled once by message: every pass below runs on it without another shuffle.
    A row carries only its own table's columns (the others null) and ``src``, which table
    it is from; a message row stands at delivery 1. The transitions table itself is not in
    it: :func:`transition_digest` shows it equals what the attempts give. An attempt row
    carries what the rules need across deliveries, or with ``explain`` all its step columns
    as well, for the example texts."""
    c = F.col
    messages = tables["messages"].select(
        *MSG, F.lit(1).alias("delivery"), F.lit(_SRC_MESSAGE).alias("src"), "born_ms",
        "size_bytes",
    )  # fmt: skip
    dead = tables["dead_letters"].select(
        *MSG,
        c("deliveries").alias("delivery"),
        F.lit(_SRC_DEAD_LETTER).alias("src"),
        "dlq_at_ms",
        "replayed_at_ms",
        _off_dlq_topic().cast("int").alias("d_bad_topic"),
    )
    steps = _attempt_steps(tables["attempts"], _ROUTE_TEXT if explain else ())
    attempts = steps if explain else steps.select(*DELIVERY, *_NARROW)
    frames = (messages, attempts, dead)
    union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    return union.repartition(*MSG_SORT)


# --------------------------------------------------------------------------- transitions


# The transition columns a row's hash covers (run_id and group are the digest's keys).
_HASHED = tuple(name for name in TRANSITIONS.fieldNames() if name not in GROUP)


def _row_hash(values: list[Column]) -> Column:
    """A transition row's 64-bit hash (``values`` in :data:`_HASHED` order); the null mask
    keeps ``(null, x)`` and ``(x, null)`` apart, which the hash alone would not."""
    nulls = _total(
        [F.when(value.isNull(), 1 << bit).otherwise(0) for bit, value in enumerate(values)]
    )
    return F.xxhash64(*values, nulls)


def _halves(row_hash: Column) -> tuple[Column, Column]:
    """A hash as two 32-bit halves: sums of them cannot overflow a long."""
    return F.shiftrightunsigned(row_hash, 32), row_hash.bitwiseAND(F.lit(0xFFFFFFFF))


def _digest(rows: DataFrame, hashes: list[Column], prefix: str, *more: Column) -> DataFrame:
    """Per run and group: :func:`_digest_sums` of ``hashes``; ``more``: other aggregates of
    the same scan."""
    return rows.groupBy(*GROUP).agg(*_digest_sums(hashes, prefix), *more)


def _digest_sums(hashes: list[Column], prefix: str) -> list[Column]:
    """How many of ``hashes`` are not null, and their sum (a 64-bit digest of the multiset
    of rows they hash), as aggregates ``<prefix>_rows``, ``_hash_hi`` and ``_hash_lo``."""
    halves = [_halves(h) for h in hashes]
    total = [_total([F.coalesce(h[i], F.lit(0)) for h in halves]) for i in (0, 1)]
    present = _total([h.isNotNull().cast("int") for h in hashes])
    return [
        F.sum(present).alias(f"{prefix}_rows"),
        F.sum(total[0]).alias(f"{prefix}_hash_hi"),
        F.sum(total[1]).alias(f"{prefix}_hash_lo"),
    ]


def transition_digest(transitions: DataFrame) -> DataFrame:
    """The transitions table's rows and digest per run and group (``t_*``). One scan, no
    shuffle of the rows."""
    return _digest(transitions, [_row_hash([F.col(name) for name in _HASHED])], "t")


def derived_digest(attempts: DataFrame) -> DataFrame:
    """The same over the transitions the attempts give (``derived_*``), hashed from each
    attempt's step columns without exploding them into rows. The transitions table is
    exactly what the attempts give when rows and digest agree. The same scan sums what the
    attempts count toward summary and load (:data:`ATTEMPT_COUNTED`)."""
    hashed = [f"_hash_{k}" for k in _STEPS]
    hashes = attempts.withColumns(
        {
            name: F.when(present, _step_hash(fields))
            for name, (present, fields) in zip(hashed, step_columns(), strict=True)
        }
    )
    return _digest(
        _attempt_steps(hashes, keep=tuple(hashed)),
        [F.col(name) for name in hashed],
        "derived",
        *[F.sum(name).alias(name) for name in ATTEMPT_COUNTED],
    )


def attempt_chain_digest(tables: dict[str, DataFrame], ends: DataFrame) -> DataFrame:
    """The attempts' side of the chain digests (:func:`_attempt_links`) per run and group.
    A scan of its own: in the scan of :func:`derived_digest` the generated code grew past
    what the JVM compiles and Spark ran the stage ten times slower."""
    attempts = (
        tables["attempts"]
        .join(F.broadcast(run_horizons(tables["runs"])), PARTITION_COLUMN, "left")
        .join(F.broadcast(ends), GROUP, "left")
    )
    links = _attempt_steps(attempts, keep=("horizon_ms", "load_end_ms")).select(
        *GROUP, *[column.alias(name) for name, column in _attempt_links().items()]
    )
    return links.groupBy(*GROUP).agg(*_attempt_chain_sums())


def run_horizons(runs: DataFrame) -> DataFrame:
    """Each run's horizon (``horizon_ms``), from its resolved scenario."""
    horizon = F.get_json_object(F.col("config_json"), "$.horizon").cast("long")
    return runs.select(PARTITION_COLUMN, horizon.alias("horizon_ms"))


# --------------------------------------------------------------------------- chains

# The kinds of link into a delivery's Ready: from its message (published), from the
# previous delivery's WaitingRetry (a retry) or from its dead letter (replayed).
_FIRST, _RETRY, _REPLAY, _ODD = 1, 2, 3, 0


def _link(
    kind: Column, delivery: Column, rt: Column, ready: Column, born: Column, route: Column
) -> Column:
    """A 64-bit hash of a link of a message's chain of deliveries: what a predecessor (the
    message, a WaitingRetry attempt, a replayed dead letter) offers and what the delivery's
    Ready takes. Both sides hash the same values when the chain is whole."""
    values = [kind.cast("int"), F.col("msg_id"), delivery.cast("int"), rt.cast("int")]
    return _row_hash([*values, ready.cast("long"), born.cast("long"), route.cast("long")])


def _attempt_links() -> dict[str, Column]:
    """The attempts' side of the chain digests, as columns of :func:`_attempt_steps` rows
    with their run's ``horizon_ms`` and ``load_end_ms``: every delivery takes a link
    (``link_take``); a WaitingRetry due before the horizon offers one to the next delivery
    (``link_offer``); a DLQ delivery gives one to its dead letter (``link_dlq``). Also what
    the row-by-row pass would count when the chains are whole: replayed deliveries, the
    last states, the gauges at the end."""
    c = F.col
    code, why = _CODE, _REASON_CODE
    reason = c("t_ready_reason")
    kind = (
        F.when(reason == why[READY_PUBLISHED], _FIRST)
        .when(reason.isin(*[why[r] for r in _RETRY_REASONS]), _RETRY)
        .when(reason == why[READY_REPLAYED], _REPLAY)
        .otherwise(_ODD)
    )
    replayed = kind == _REPLAY
    no_route = F.lit(0)
    take = _link(
        kind,
        c("delivery"),
        c("a_reconsume_times"),
        c("t_ready_ms"),
        F.when(~replayed, c("a_born_ms")).otherwise(no_route),
        F.when(~replayed, c("t_route")).otherwise(no_route),
    )
    offers = (
        (c("t_last_state") == code[WAITING_RETRY])
        & c("a_next_ready_ms").isNotNull()
        & (c("a_next_ready_ms") < c("horizon_ms"))
    )
    offer = _link(
        F.lit(_RETRY),
        c("delivery") + 1,
        c("a_reconsume_times") + 1,
        c("a_next_ready_ms"),
        c("a_born_ms"),
        c("a_next_route"),
    )
    dead = c("t_last_state") == code[DLQ]
    after_backoff = c("t_end_state") == code[WAITING_RETRY]
    until = F.coalesce(c("a_next_ready_ms"), c("a_settled_ms"))
    open_retry = after_backoff & (until.isNull() | (until >= c("load_end_ms")))
    return {
        "link_take": take,
        "link_offer": F.when(offers, offer),
        "link_dlq": F.when(dead, _dead_link(c("delivery"), c("a_settled_ms"))),
        "c_replayed": replayed.cast("int"),
        "c_last_commit": (c("t_last_state") == code[COMMIT]).cast("int"),
        "c_last_dlq": dead.cast("int"),
        "c_last_discard": (c("t_last_state") == code[DISCARD]).cast("int"),
        "c_end_inflight": (c("a_state") == code[INFLIGHT]).cast("int"),
        "c_end_ready_backlog": (c("a_state") == code[READY]).cast("int"),
        "c_end_waiting_retry": F.coalesce(open_retry, F.lit(False)).cast("int"),
        "c_rows_bad": (c("l_bad") != 0).cast("int"),
    }


# What :func:`_attempt_links` counts, summed per group under these names.
_CHAIN_COUNTS = {"c_replayed": "replayed_takes", "c_last_commit": "last_commit",
                 "c_last_dlq": "last_dlq", "c_last_discard": "last_discard",
                 "c_end_inflight": "end_inflight", "c_end_ready_backlog": "end_ready_backlog",
                 "c_end_waiting_retry": "end_waiting_retry",
                 "c_rows_bad": "rows_bad"}  # fmt: skip


def _attempt_chain_sums() -> list[Column]:
    """The sums of :func:`_attempt_links` per run and group."""
    c = F.col
    return [
        *_digest_sums([c("link_take")], "take"),
        *_digest_sums([c("link_offer")], "offer"),
        *_digest_sums([c("link_dlq")], "dlq"),
        *[
            F.coalesce(F.sum(column), F.lit(0)).alias(name)
            for column, name in _CHAIN_COUNTS.items()
        ],
    ]


def _off_dlq_topic() -> Column:
    """Whether a dead letter is not on its group's DLQ topic (``%DLQ%<group>``)."""
    expected = F.concat(F.lit(limits.DLQ_TOPIC_PREFIX), F.col("group"))
    return _differs(F.col("dlq_topic"), expected)


def _dead_link(delivery: Column, at_ms: Column) -> Column:
    """A hash of a DLQ delivery and its moment, as its attempt and its dead letter give it."""
    return _row_hash([F.col("msg_id"), delivery.cast("int"), at_ms.cast("long")])


def message_chain_digest(messages: DataFrame, runs: DataFrame) -> DataFrame:
    """The messages' side of the chain digests: each message born before its run's horizon
    offers delivery 1 its link (Ready when born, on its topic and queue, published, poison
    not fixed); the rows, and what shows a message listed twice without a shuffle: the
    smallest and largest id and a digest of the ids (``ids_*``, :func:`id_range_digest`).
    """
    c = F.col
    born = messages.join(F.broadcast(run_horizons(runs)), PARTITION_COLUMN, "left")
    route = _row_hash([c("topic"), c("queue_id"), F.lit(READY_PUBLISHED), F.lit(False)])
    first = _link(F.lit(_FIRST), F.lit(1), F.lit(0), c("born_ms"), c("born_ms"), route)
    return born.groupBy(*GROUP).agg(
        *_digest_sums([F.when(c("born_ms") < c("horizon_ms"), first)], "first"),
        *_digest_sums([F.xxhash64(c("msg_id"))], "ids"),
        F.min("msg_id").alias("min_msg_id"),
        F.max("msg_id").alias("max_msg_id"),
        F.count(F.lit(1)).alias("message_rows"),
        F.max("size_bytes").alias("size_bytes"),
    )


def id_range_digest(
    spark: SparkSession, ranges: dict[tuple[str, str], tuple[int, int]]
) -> DataFrame:
    """Per run and group, the ``ids_*`` digest of every id from its smallest to its largest
    once (``range_*``). A group with as many message rows as ids in that range and the same
    digest lists each id once (a listed-twice message leaves an id of the range out, and
    the digests then differ but with probability about 2^-64); retrysim's ids are 0..n-1, so
    this replaces a shuffle of every message key (:func:`message_ids`) by a generated range."""
    frames = [
        spark.range(low, high + 1).select(
            F.lit(run).alias(PARTITION_COLUMN), F.lit(group).alias("group"), F.col("id")
        )
        for (run, group), (low, high) in sorted(ranges.items())
    ]
    ids = reduce(DataFrame.unionByName, frames)
    return _digest(ids, [F.xxhash64(F.col("id"))], "range")


def message_ids(messages: DataFrame) -> DataFrame:
    """Distinct messages per run and group (a message listed twice makes them fewer than the
    rows): a shuffle of the message keys alone, for ids that are not one whole range."""
    return (
        messages.select(*MSG)
        .distinct()
        .groupBy(*GROUP)
        .agg(F.count(F.lit(1)).alias("distinct_messages"))
    )


def dead_letter_chain_digest(dead_letters: DataFrame) -> DataFrame:
    """The dead letters' side of the chain digests: each gives its DLQ delivery's link
    (``dead_*``) and, replayed, the replayed delivery's (``replay_*``: the next delivery,
    Ready when replayed, reconsume_times 0); rows on the wrong topic or replayed before they
    reached the DLQ."""
    c = F.col
    none = F.lit(0)
    replay = _link(F.lit(_REPLAY), c("deliveries") + 1, F.lit(0), c("replayed_at_ms"), none, none)
    wrong = _off_dlq_topic() | _before(c("replayed_at_ms"), c("dlq_at_ms"))
    return dead_letters.groupBy(*GROUP).agg(
        *_digest_sums([_dead_link(c("deliveries"), c("dlq_at_ms"))], "dead"),
        *_digest_sums([F.when(c("replayed_at_ms").isNotNull(), replay)], "replay"),
        F.count_if(_flag(wrong)).alias("dead_bad"),
        F.count(F.lit(1)).alias("dead_letter_rows"),
        F.count_if(c("replayed_at_ms").isNotNull()).alias("dead_letters_replayed"),
    )


def replayed_born_mismatches(tables: dict[str, DataFrame]) -> DataFrame:
    """Replayed deliveries whose born_ms is not their message's, per run and group: the one
    link the dead letters cannot check (they do not carry born_ms). A join, run only when
    a group replays."""
    c = F.col
    replayed = tables["attempts"].where(c("ready_reason") == F.lit(READY_REPLAYED))
    messages = tables["messages"].select(*MSG, c("born_ms").alias("message_born_ms"))
    joined = replayed.select(*MSG, "born_ms").join(messages, MSG, "left")
    return joined.groupBy(*GROUP).agg(
        F.count_if(_flag(_differs(c("born_ms"), c("message_born_ms")))).alias("replayed_born_bad")
    )


def transition_mismatches(tables: dict[str, DataFrame]) -> DataFrame:
    """The transitions that differ from the attempts' derivation, as delivery rows with an
    ``attempts_transitions`` flag: rows the table has and the attempts do not give, and the
    other way round. Two shuffles: only run when :func:`transition_digest` disagreed."""
    table = select_schema(tables["transitions"], TRANSITIONS)
    derived = transitions_from_attempts(tables["attempts"])
    shown = F.format_string(
        "seq %s %s at %s ms (topic %s, queue %s, delay level %s, reason %s)",
        *[F.col(n) for n in ("seq", "state", "at_ms", "topic", "queue_id", "delay_level",
                             "reason")],
    )  # fmt: skip
    sides = (
        (table.exceptAll(derived), "transition %s is not one the attempts give"),
        (derived.exceptAll(table), "transition %s that the attempt gives is missing"),
    )
    return reduce(
        lambda a, b: a.unionByName(b),
        [
            rows.select(
                *DELIVERY,
                F.lit(True).alias("bad_attempts_transitions"),
                F.format_string(text, shown).alias("why_attempts_transitions"),
            )
            for rows, text in sides
        ],
    )


# --------------------------------------------------------------------------- deliveries


def _per_delivery(union: DataFrame, explain: bool = False) -> DataFrame:
    """Per delivery: its message row (at delivery 1), attempt and dead letter side by side
    (numeric only). A hash aggregate within the union's partitions: no shuffle, and no sort
    of transitions (there are none: a path is a few steps, carried by the attempt row).
    Counts are sums over the delivery's attempts (one when all is well), the rules they
    broke or-ed; with ``explain``, the attempt's steps for the example texts as well."""
    c = F.col
    sources = {"m_n": _SRC_MESSAGE, "a_n": _SRC_ATTEMPT, "d_n": _SRC_DEAD_LETTER}
    step_names = list(_STEPS.values())
    attempt = [name for name in _NARROW if name.startswith("a_")]
    wide = []
    if explain:
        attempt += [f"a_{name}" for name in ("start_ms", "end_ms")]
        wide = [
            *[F.coalesce(F.sum(f"t_n_{n}"), F.lit(0)).alias(f"t_n_{n}") for n in step_names],
            *[F.max(f"t_{n}_state").alias(f"t_{n}_state") for n in step_names if n != "end"],
            *[F.min(f"t_{n}_ms").alias(f"t_{n}_ms") for n in step_names[1:]],
            *[F.max(name).alias(name) for name in _WIDE_VALUES],
            *[F.coalesce(F.sum(name), F.lit(0)).alias(name) for name in _STEP_COUNTS],
            F.coalesce(F.sum("t_n"), F.lit(0)).alias("t_n"),
            *[F.max(name).alias(name) for name in _ROUTE_TEXT],
        ]
    return union.groupBy(*DELIVERY).agg(
        *[F.count_if(c("src") == value).cast("int").alias(n) for n, value in sources.items()],
        F.max("born_ms").alias("born_ms"),
        F.max("size_bytes").alias("size_bytes"),
        *[F.max(name).alias(name) for name in attempt],
        F.min("t_ready_ms").alias("t_ready_ms"),
        *[F.max(name).alias(name) for name in _STEP_VALUES],
        F.bit_or("l_bad").alias("l_bad"),
        F.max("dlq_at_ms").alias("d_at_ms"),
        F.max("replayed_at_ms").alias("d_replayed_at_ms"),
        F.max("d_bad_topic").alias("d_bad_topic"),
        *wide,
    )


def delivery_rows(
    tables: dict[str, DataFrame], ends: DataFrame, explain: bool = False
) -> DataFrame:
    """One row per delivery (and per message born after the horizon, at delivery 1) with
    the previous delivery's last transition, the next one's Ready, the last replay so far,
    its run's horizon, the end of the run's load buckets (``ends``: run_id, group,
    load_end_ms), the ``bad_*`` flags of the path, delivery and message checks and the final
    states summary must agree with (:func:`checked_counts` sums them). With ``explain``,
    the ``why_*`` texts too: the rows then carry every step column, so only a broken
    invariant's examples ask for them."""
    c = F.col
    horizons = run_horizons(tables["runs"])
    order = Window.partitionBy(*MSG_SORT).orderBy("delivery")
    so_far = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    replayed = c("t_ready_reason") == _REASON_CODE[READY_REPLAYED]
    delivered = c("a_n") + c("d_n") > 0
    per = _per_delivery(message_union(tables, explain), explain).withColumns(
        {
            "delivered": delivered,
            # a row of a message alone can only be the first; it is nobody's predecessor
            "prev_delivery": F.lag(F.when(delivered, c("delivery"))).over(order),
            "prev_last_state": F.lag("t_last_state").over(order),
            "prev_last_ms": F.lag("t_last_ms").over(order),
            "next_ready_ms": F.lead("t_ready_ms").over(order),
            "next_replayed": F.lead(replayed).over(order),
            "is_last": F.lead("delivery").over(order).isNull(),
            "last_replay": F.max(F.when(replayed, c("delivery"))).over(so_far),
            "next_route": F.lead("t_route").over(order),
            # the message row stands at delivery 1, before any later delivery
            "message_born_ms": F.max("born_ms").over(so_far),
        }
    )
    if explain:
        per = per.withColumns({f"n_{name}": F.lead(name).over(order) for name in _ROUTE_TEXT[:3]})
    checked = (
        per.join(F.broadcast(ends), GROUP, "left")
        .join(F.broadcast(horizons), PARTITION_COLUMN, "left")
        .withColumns(_delivery_flags())
        .withColumns(_message_flags())
        .withColumns(_final_counts())
    )
    return checked.withColumns(_why_texts()) if explain else checked


def _delivery_flags() -> dict[str, Column]:
    """The path rules (docs/model.md §9) and the delivery checks on a delivery's row: what
    its attempt row broke alone (:func:`_local_rules`) and what takes its neighbours: its
    Ready entered from the previous delivery's last state by a legal edge and not before
    it, the retry due when this delivery said, reconsume_times, the delivery numbers, its
    dead letter."""
    c = F.col
    code, why = _CODE, _REASON_CODE
    prev = c("prev_last_state")
    entered = (
        F.when(prev.isNull(), c("t_ready_reason") == why[READY_PUBLISHED])
        .when(
            prev == code[WAITING_RETRY], c("t_ready_reason").isin(*[why[r] for r in _RETRY_REASONS])
        )
        .when(prev == code[DLQ], c("t_ready_reason") == why[READY_REPLAYED])
        .otherwise(F.lit(False))
    )
    result = c("a_state")
    replayed_next = F.coalesce(c("next_replayed"), F.lit(False))
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
    after_backoff = c("t_end_state") == code[WAITING_RETRY]
    until = F.coalesce(c("a_next_ready_ms"), c("a_settled_ms"))
    has_path = c("a_n") > 0
    # time_order's part from the transitions; the attempt's own times are another part
    path_backwards = _broke("path_backwards") | _before(c("t_ready_ms"), c("prev_last_ms"))
    flags = {
        "legal_path": has_path & (_broke("illegal") | _flag(~entered)),
        "seq_numbering": has_path & _broke("off_step"),
        "attempts_transitions": (c("a_n") != 1) | _broke("mismatch"),
        "time_order": _broke("attempt_backwards") | late | (has_path & path_backwards),
        "reconsume_times": (c("a_n") == 1) & _differs(c("a_reconsume_times"), _since_replay()),
        "deliveries_consecutive": _flag(~step),
        "dead_letters": (is_dlq != (c("d_n") >= 1)) | (c("d_n") > 1) | _flag(dead_wrong),
        "attempts_routing": _broke("unrouted")
        | (retried & _differs(c("next_route"), c("a_next_route")))
        # (a message without its row is messages_attempts' finding)
        | _flag(
            (c("a_n") == 1)
            & c("message_born_ms").isNotNull()
            & _differs(c("a_born_ms"), c("message_born_ms"))
        )
        | _flag((c("a_poison_fixed") == 1) & c("last_replay").isNull()),
    }
    return {
        **{f"bad_{name}": c("delivered") & flag for name, flag in flags.items()},
        "open_waiting_retry": after_backoff & (until.isNull() | (until >= c("load_end_ms"))),
    }


def _since_replay() -> Column:
    """The reconsume_times a delivery should have: deliveries since the first or the last
    replayed one."""
    return F.col("delivery") - F.coalesce(F.col("last_replay"), F.lit(1))


def _path_text() -> Column:
    """A delivery's transitions after the previous delivery's last state, e.g. ``WaitingRetry
    -> Ready (reason retry_due) -> Inflight -> Commit``."""
    c = F.col
    ready = F.format_string(
        "%s (reason %s)", _name(c("t_ready_state")), _reason_name(c("t_ready_reason"))
    )
    steps = [_name(c(f"t_{name}_state")) for name in list(_STEPS.values())[1:]]
    ready = F.when(c("t_ready_state").isNotNull(), ready)
    return F.concat_ws(
        " -> ", F.coalesce(_name(c("prev_last_state")), F.lit("start")), ready, *steps
    )


def _why_texts() -> dict[str, Column]:
    """The ``why_*`` text of each row check, on :func:`delivery_rows` with ``explain``."""
    c = F.col
    path = _path_text()
    ms = [c(f"t_{name}_ms") for name in _STEPS.values()]
    path_times = F.concat(
        F.format_string("%s at %s ms", path, F.concat_ws(", ", *[x.cast("string") for x in ms])),
        F.when(
            c("prev_last_ms").isNotNull(), F.format_string(", after %s ms", c("prev_last_ms"))
        ).otherwise(F.lit("")),
    )
    result = _name(c("a_state"))
    pairs = ("a_ready_ms", "t_ready_ms", "a_start_ms", "t_start_ms", "a_end_ms", "t_end_ms")
    times = ("a_ready_ms", "a_start_ms", "a_end_ms", "a_settled_ms", "a_next_ready_ms")
    return {
        "why_legal_path": path,
        "why_seq_numbering": _text(
            "%s transition(s) at steps %s..%s (seq - 4*(delivery-1)): %s",
            *("t_n", "t_first_step", "t_last_step", path),
        ),
        "why_attempts_transitions": _text(
            "%s attempt row(s) ending %s, %s transition(s) ending %s; ready %s/%s, start %s/%s, "
            "end %s/%s ms (attempt/transitions)",
            *("a_n", result, "t_n", _name(c("t_last_state")), *pairs),
        ),
        "why_time_order": _text(
            "%s; attempt ready %s, start %s, end %s, settled %s, next_ready %s ms; next "
            "delivery Ready at %s",
            *(path_times, *times, "next_ready_ms"),
        ),
        "why_reconsume_times": _text(
            "reconsume_times %s, expected %s", "a_reconsume_times", _since_replay()
        ),
        "why_deliveries_consecutive": _text(
            "delivery %s follows delivery %s", "delivery", "prev_delivery"
        ),
        "why_dead_letters": _text(
            "%s dead letter(s) (dlq_at_ms %s, replayed_at_ms %s) for a delivery ending %s at %s",
            *("d_n", "d_at_ms", "d_replayed_at_ms", result, "a_settled_ms"),
        ),
        "why_attempts_routing": _text(
            "born_ms %s (message born %s ms), poison_fixed %s after replay %s; routed its retry "
            "to %s queue %s (%s), next_ready %s ms; the next delivery is Ready on %s queue %s "
            "(%s)",
            *("a_born_ms", "message_born_ms", "a_poison_fixed", "last_replay", *_ROUTE_TEXT[3:]),
            *("a_next_ready_ms", *[f"n_{name}" for name in _ROUTE_TEXT[:3]]),
        ),
        "why_messages_attempts": _text(
            "%s message row(s) born at %s ms (horizon %s ms), %s first delivery(ies) Ready "
            "at %s ms",
            *("m_n", "born_ms", "horizon_ms", "a_n", "a_ready_ms"),
        ),
    }


def _final_counts() -> dict[str, Column]:
    """On a message's last delivery, its final state (summary's commits, dlq, discards)."""
    c = F.col
    code = _CODE
    last = c("t_last_state")
    return {
        "final_commit": (c("is_last") & (last == code[COMMIT])).cast("int"),
        "final_dlq": (c("is_last") & (last == code[DLQ])).cast("int"),
        "final_discard": (c("is_last") & (last == code[DISCARD])).cast("int"),
    }


# --------------------------------------------------------------------------- messages


def _message_flags() -> dict[str, Column]:
    """Each message against its first delivery and its run's horizon, on delivery 1's row
    (``a_n`` there is the number of first deliveries)."""
    c = F.col
    first, first_n = c("delivery") == 1, c("a_n")
    published = c("born_ms") < c("horizon_ms")
    bad = (
        (c("m_n") != 1)
        | (first_n > 1)
        | F.coalesce(published != (first_n == 1), F.lit(False))
        | ((first_n == 1) & _differs(c("a_ready_ms"), c("born_ms")))
    )
    return {"bad_messages_attempts": first & bad}


def message_rows(checked: DataFrame) -> DataFrame:
    """The rows of :func:`delivery_rows` the message check is about, keyed by message."""
    return checked.where(F.col("delivery") == 1).drop("delivery")


def checked_counts(checked: DataFrame) -> DataFrame:
    """Per run and group, from :func:`delivery_rows`: violations of the path, delivery and
    message checks, and the counts summary and load must agree with."""
    c = F.col
    return checked.groupBy(*GROUP).agg(
        *[F.sum(name).alias(name) for name in FINAL_COUNTED],
        *[F.count_if(c(f"bad_{name}")).alias(f"delivery_{name}") for name in DELIVERY_CHECKS],
        *[F.count_if(c(f"bad_{name}")).alias(f"message_{name}") for name in MESSAGE_CHECKS],
        F.sum("d_n").alias("dead_letter_rows"),
        F.count_if((c("d_n") >= 1) & c("d_replayed_at_ms").isNotNull()).alias(
            "dead_letters_replayed"
        ),
        F.count_if(c("a_state") == _CODE[INFLIGHT]).alias("end_inflight"),
        F.count_if(c("a_state") == _CODE[READY]).alias("end_ready_backlog"),
        F.count_if(c("open_waiting_retry")).alias("end_waiting_retry"),
        F.count_if(c("m_n") >= 1).alias("message_rows"),
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
