"""Digests that prove a run's tables whole without a shuffle of every row.

The transitions table is checked against the attempts: :func:`transition_digest` and
:func:`derived_digest` count and hash its rows and the rows the attempts give, per run and
group. When they agree, the table *is* the attempts' transitions.

**Chains.** Every delivery's Ready takes a *link* offered by its predecessor (the delivery
before, or the one ``parent_delivery`` names): its message (delivery 1, published, when
born), the predecessor's WaitingRetry (its delivery number, the reconsume_times on client
and broker, next_ready_ms, the topic, queue and reason it named), a 4.9 client's second
copy of it (the same, Ready at copy_ready_ms) or its dead letter (replayed).
:func:`attempt_chain_digest`, :func:`message_chain_digest` and
:func:`dead_letter_chain_digest` hash the links each side gives, per run and group. When
the links taken equal the links offered (and no row breaks a rule alone, and no message is
listed twice), every path, delivery and message check holds.
Only when they disagree does validation run the row-by-row pass (a 64-bit digest misses a
broken chain with probability about 2^-64).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import reduce

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from retrysim.checks.invariants import (
    DELIVERY,
    GROUP,
    HASHED,
    LINK_FIRST,
    LINK_ODD,
    LINK_REPLAY,
    LINK_RETRY,
    MSG,
    REASON_CODE,
    RETRY_REASONS,
    STATE_CODE,
    STEPS,
    differs,
    flagged,
    is_before,
    off_dlq_topic,
    run_horizons,
    still_inflight,
    sum_of,
    transition_hash,
)
from retrysim.checks.rows import ATTEMPT_COUNTED, attempt_steps, step_hash
from retrysim.model.behavior import TIMEOUT
from retrysim.model.rng import hash_long_np
from retrysim.model.states import (
    COMMIT,
    DISCARD,
    DLQ,
    INFLIGHT,
    READY,
    READY_PUBLISHED,
    READY_REPLAYED,
    WAITING_RETRY,
)
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import scenario_from_json
from retrysim.tables.commitlog_writes import before, pop_settings, pop_write_times
from retrysim.tables.schemas import PARTITION_COLUMN, TRANSITIONS, select_schema
from retrysim.tables.transitions import parent_of, step_columns, transitions_from_attempts

# --------------------------------------------------------------------------- transitions


def _halves(value: Column) -> tuple[Column, Column]:
    """A hash as two 32-bit halves: sums of them cannot overflow a long."""
    return F.shiftrightunsigned(value, 32), value.bitwiseAND(F.lit(0xFFFFFFFF))


def _digest(rows: DataFrame, hashes: list[Column], prefix: str, *more: Column) -> DataFrame:
    """Per run and group: :func:`_digest_sums` of ``hashes``; ``more``: other aggregates of
    the same scan."""
    return rows.groupBy(*GROUP).agg(*_digest_sums(hashes, prefix), *more)


DIGESTED = ("rows", "hash_hi", "hash_lo")  # a digest's three aggregates (_digest_sums)


def _digest_sums(hashes: list[Column], prefix: str) -> list[Column]:
    """How many of ``hashes`` are not null, and their sum (a 64-bit digest of the multiset
    of rows they hash), as aggregates ``<prefix>_rows``, ``_hash_hi`` and ``_hash_lo``."""
    halves = [_halves(h) for h in hashes]
    total = [sum_of([F.coalesce(h[i], F.lit(0)) for h in halves]) for i in (0, 1)]
    present = sum_of([h.isNotNull().cast("int") for h in hashes])
    return [
        F.sum(present).alias(f"{prefix}_rows"),
        F.sum(total[0]).alias(f"{prefix}_hash_hi"),
        F.sum(total[1]).alias(f"{prefix}_hash_lo"),
    ]


def transition_digest(transitions: DataFrame) -> DataFrame:
    """The transitions table's rows and digest per run and group (``t_*``). One scan, no
    shuffle of the rows."""
    return _digest(transitions, [transition_hash([F.col(name) for name in HASHED])], "t")


def derived_digest(
    attempts: DataFrame, pops: DataFrame | None = None, hashed: bool = True
) -> DataFrame:
    """The same over the transitions the attempts give (``derived_*``), hashed from each
    attempt's step columns without exploding them into rows. The transitions table is
    exactly what the attempts give when rows and digest agree. The same scan sums what the
    attempts count toward summary and load (:data:`ATTEMPT_COUNTED`), with the 5.x pop
    writes of the groups in ``pops`` (:func:`pop_groups`). Without ``hashed`` (a lean run's
    transitions are this derivation itself) the digest is 0 and only the sums are taken:
    hashing every step of every attempt is most of this scan's cost."""
    hashed_names = [f"_hash_{k}" for k in STEPS] if hashed else []
    hashes = attempts.withColumns(
        {
            name: F.when(present, step_hash(fields))
            for name, (present, fields) in zip(hashed_names, step_columns(), strict=False)
        }
    )
    keep = tuple(hashed_names)
    if pops is not None:
        hashes = hashes.join(F.broadcast(pops), GROUP, "left")
        keep += (*POP_COLUMNS, "horizon_ms", "outcome")
    steps = attempt_steps(hashes, keep=keep)
    if pops is not None:
        steps = steps.withColumn(
            "t_commitlog_writes",
            F.col("t_commitlog_writes")
            + sum_of([t.isNotNull().cast("int") for t in _pop_writes()]),
        )
    counted = [F.sum(name).alias(name) for name in ATTEMPT_COUNTED]
    if not hashed:
        zero = [F.lit(0).cast("long").alias(f"derived_{key}") for key in DIGESTED]
        return steps.groupBy(*GROUP).agg(*counted, *zero)
    return _digest(steps, [F.col(name) for name in hashed_names], "derived", *counted)


POP_COLUMNS = ("pop_invisible_ms", "pop_nacks", "pop_nack_delays")
_POP_GROUPS = (
    "run_id string, group string, pop_invisible_ms long, pop_nacks boolean,"
    " pop_nack_delays array<long>, horizon_ms long"
)


def pop_groups(runs: DataFrame) -> DataFrame | None:
    """Per run and group whose deliveries are 5.x pops: its pop settings
    (:func:`retrysim.tables.commitlog_writes.pop_settings`) and the run's horizon, from each run's
    stored scenario (one small row per run reaches the driver); None if no group pops."""
    configs = runs.select(PARTITION_COLUMN, "config_json").distinct().collect()
    rows = pop_rows((run[PARTITION_COLUMN], run["config_json"]) for run in configs)
    return runs.sparkSession.createDataFrame(rows, _POP_GROUPS) if rows else None


def pop_rows(configs: Iterable[tuple[str, str | None]]) -> list[tuple]:
    """:func:`pop_groups`' rows from (run id, stored scenario) pairs."""
    rows = []
    for run, config in configs:
        try:
            scenario = scenario_from_json(config)
        except ScenarioError:
            continue  # no scenario, no pops: what the tables count is checked as it is
        for group, settings in pop_settings(scenario).items():
            invisible, nacks, delays = settings
            rows.append((run, group, invisible, nacks, list(delays), scenario.horizon))
    return rows


def _pop_writes() -> list[Column]:
    """An attempt's 5.x pop writes before its run's horizon, from its steps: the rule is
    :func:`retrysim.tables.commitlog_writes.pop_write_times`, shared (tests/reference/writes.py
    checks it against the source); what this checks is that the tables counted it over the
    right moments."""
    c, code = F.col, STATE_CODE
    end, leave = c("t_end_state"), c("t_leave_state")
    gone = (code[DLQ], code[DISCARD])
    times = pop_write_times(
        c("pop_invisible_ms"),
        c("t_start_ms"),
        c("t_end_ms"),
        committed=end == code[COMMIT],
        nacked=c("pop_nacks") & (end == code[WAITING_RETRY]) & (c("outcome") != TIMEOUT),
        nack_delay=F.element_at(
            c("pop_nack_delays"),
            F.least(c("a_broker_reconsume_times") + 1, F.size(c("pop_nack_delays"))).cast("int"),
        ),
        left_at=F.when(leave.isin(*gone), c("t_leave_ms")).when(end.isin(*gone), c("t_end_ms")),
    )
    return before(times, c("horizon_ms"))


def attempt_chain_digest(tables: Mapping[str, DataFrame], ends: DataFrame) -> DataFrame:
    """The attempts' side of the chain digests (:func:`_attempt_links`) per run and group.
    A scan of its own: in the scan of :func:`derived_digest` the generated code grew past
    what the JVM compiles, and the stage ran interpreted, far slower."""
    attempts = (
        tables["attempts"]
        .join(F.broadcast(run_horizons(tables["runs"])), PARTITION_COLUMN, "left")
        .join(F.broadcast(ends), GROUP, "left")
    )
    keep = ("horizon_ms", "load_end_ms", "parent_delivery", "copy_state", "copy_ms",
            "copy_ready_ms")  # fmt: skip
    links = attempt_steps(attempts, keep=keep).select(
        *GROUP, *[column.alias(name) for name, column in _attempt_links().items()]
    )
    return links.groupBy(*GROUP).agg(*_attempt_chain_sums())


# --------------------------------------------------------------------------- chains


def _counts(rt: Column, broker_rt: Column) -> Column:
    """A delivery's two reconsume counts as one long for a link (both 0: the number 0)."""
    return rt.cast("long") * F.lit(1 << 32) + broker_rt.cast("long")


def _link(
    kind: Column, parent: Column, rt: Column, ready: Column, born: Column, route: Column
) -> Column:
    """A 64-bit hash of a link of a message's chain of deliveries: what a predecessor (the
    message, a WaitingRetry attempt or its second copy, a replayed dead letter) offers and
    what the delivery's Ready takes, keyed by the predecessor (0: the message; else its
    delivery number). Both sides hash the same values when the chain is whole."""
    values = [kind.cast("int"), F.col("msg_id"), parent.cast("int"), rt.cast("long")]
    return transition_hash([*values, ready.cast("long"), born.cast("long"), route.cast("long")])


def _attempt_links() -> dict[str, Column]:
    """The attempts' side of the chain digests, as columns of :func:`attempt_steps` rows
    with their run's ``horizon_ms`` and ``load_end_ms``: every delivery takes a link
    (``link_take``); a WaitingRetry due before the horizon offers one to the next delivery
    (``link_offer``); a DLQ delivery gives one to its dead letter (``link_dlq``). Also what
    the row-by-row pass would count when the chains are whole: replayed deliveries, the
    last states, the gauges at the end."""
    c = F.col
    code, why = STATE_CODE, REASON_CODE
    reason = c("t_ready_reason")
    kind = (
        F.when(reason == why[READY_PUBLISHED], LINK_FIRST)
        .when(reason.isin(*[why[r] for r in RETRY_REASONS]), LINK_RETRY)
        .when(reason == why[READY_REPLAYED], LINK_REPLAY)
        .otherwise(LINK_ODD)
    )
    replayed = kind == LINK_REPLAY
    no_route = F.lit(0)
    take = _link(
        kind,
        parent_of(c("delivery"), c("parent_delivery")),
        _counts(c("a_reconsume_times"), c("a_broker_reconsume_times")),
        c("t_ready_ms"),
        F.when(~replayed, c("a_born_ms")).otherwise(no_route),
        F.when(~replayed, c("t_route")).otherwise(no_route),
    )
    offers = (
        c("t_last_state").isin(code[WAITING_RETRY], code[INFLIGHT])
        & c("a_next_ready_ms").isNotNull()
        & (c("a_next_ready_ms") < c("horizon_ms"))
    )

    def offered(ready: Column) -> Column:
        return _link(
            F.lit(LINK_RETRY),
            c("delivery"),
            _counts(c("a_next_rt"), c("a_next_broker_rt")),
            ready,
            c("a_born_ms"),
            c("a_next_route"),
        )

    dead = c("t_last_state") == code[DLQ]
    after_backoff = c("t_end_state") == code[WAITING_RETRY]
    until = F.coalesce(c("a_next_ready_ms"), c("a_settled_ms"))
    open_retry = after_backoff & (until.isNull() | (until >= c("load_end_ms")))
    # a 4.9 client's second copy (docs/model.md §6): a retry of its own, or a dead letter
    copy = c("copy_state")
    copy_waits = copy == F.lit(WAITING_RETRY)
    copy_offers = copy_waits & (c("copy_ready_ms") < c("horizon_ms"))
    copy_open = copy_waits & (c("copy_ready_ms") >= c("load_end_ms"))
    copy_dead = copy == F.lit(DLQ)
    return {
        "link_take": take,
        "link_offer": F.when(offers, offered(c("a_next_ready_ms"))),
        "link_copy": F.when(copy_offers, offered(c("copy_ready_ms"))),
        "link_dlq": F.when(dead, _dead_link(c("delivery"), c("a_settled_ms"))),
        "link_copy_dlq": F.when(copy_dead, _dead_link(c("delivery"), c("copy_ms"))),
        "c_replayed": replayed.cast("int"),
        "c_last_commit": (c("t_last_state") == code[COMMIT]).cast("int"),
        "c_last_dlq": dead.cast("int") + F.coalesce(copy_dead, F.lit(False)).cast("int"),
        "c_last_discard": (c("t_last_state") == code[DISCARD]).cast("int")
        + F.coalesce(copy == F.lit(DISCARD), F.lit(False)).cast("int"),
        "c_end_inflight": still_inflight().cast("int"),
        "c_end_ready_backlog": (c("a_state") == code[READY]).cast("int"),
        "c_end_waiting_retry": F.coalesce(open_retry, F.lit(False)).cast("int")
        + F.coalesce(copy_open, F.lit(False)).cast("int"),
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
        *_digest_sums([c("link_offer"), c("link_copy")], "offer"),
        *_digest_sums([c("link_dlq"), c("link_copy_dlq")], "dlq"),
        *[
            F.coalesce(F.sum(column), F.lit(0)).alias(name)
            for column, name in _CHAIN_COUNTS.items()
        ],
    ]


def _dead_link(delivery: Column, at_ms: Column) -> Column:
    """A hash of a DLQ delivery and its moment, as its attempt and its dead letter give it."""
    return transition_hash([F.col("msg_id"), delivery.cast("int"), at_ms.cast("long")])


def message_chain_digest(messages: DataFrame, runs: DataFrame) -> DataFrame:
    """The messages' side of the chain digests: each message born before its run's horizon
    offers delivery 1 its link (Ready when born, on its topic and queue, published, poison
    not fixed); the rows, and what shows a message listed twice without a shuffle: the
    smallest and largest id and a digest of the ids (``ids_*``, :func:`id_range_digest`).
    """
    c = F.col
    born = messages.join(F.broadcast(run_horizons(runs)), PARTITION_COLUMN, "left")
    route = transition_hash([c("topic"), c("queue_id"), F.lit(READY_PUBLISHED), F.lit(False)])
    first = _link(F.lit(LINK_FIRST), F.lit(0), F.lit(0), c("born_ms"), c("born_ms"), route)
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


RANGE_CHUNK = 1 << 18  # ids hashed at a time by range_digest: a chunk stays in the CPU cache


def range_digest(low: int, high: int, chunk: int = RANGE_CHUNK) -> dict[str, int]:
    """:func:`id_range_digest` of one group on the driver, in NumPy a chunk of ids at a
    time (no Spark job, no compiled code to load)."""
    sums = [0, 0]
    for start in range(low, high + 1, chunk):
        hashed = hash_long_np(np.arange(start, min(start + chunk, high + 1), dtype=np.int64))
        sums[0] += int((hashed >> np.uint64(32)).astype(np.int64).sum())
        sums[1] += int((hashed & np.uint64(0xFFFFFFFF)).astype(np.int64).sum())
    return {"range_rows": high - low + 1, "range_hash_hi": sums[0], "range_hash_lo": sums[1]}


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
    replay = _link(F.lit(LINK_REPLAY), c("deliveries"), F.lit(0), c("replayed_at_ms"), none, none)
    wrong = off_dlq_topic() | is_before(c("replayed_at_ms"), c("dlq_at_ms"))
    return dead_letters.groupBy(*GROUP).agg(
        *_digest_sums([_dead_link(c("deliveries"), c("dlq_at_ms"))], "dead"),
        *_digest_sums([F.when(c("replayed_at_ms").isNotNull(), replay)], "replay"),
        F.count_if(flagged(wrong)).alias("dead_bad"),
        F.count(F.lit(1)).alias("dead_letter_rows"),
        F.count_if(c("replayed_at_ms").isNotNull()).alias("dead_letters_replayed"),
    )


def replayed_born_mismatches(tables: Mapping[str, DataFrame]) -> DataFrame:
    """Replayed deliveries whose born_ms is not their message's, per run and group: the one
    link the dead letters cannot check (they do not carry born_ms). A join, run only when
    a group replays."""
    c = F.col
    replayed = tables["attempts"].where(c("ready_reason") == F.lit(READY_REPLAYED))
    messages = tables["messages"].select(*MSG, c("born_ms").alias("message_born_ms"))
    joined = replayed.select(*MSG, "born_ms").join(messages, MSG, "left")
    return joined.groupBy(*GROUP).agg(
        F.count_if(flagged(differs(c("born_ms"), c("message_born_ms")))).alias("replayed_born_bad")
    )


def transition_mismatches(tables: Mapping[str, DataFrame]) -> DataFrame:
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
