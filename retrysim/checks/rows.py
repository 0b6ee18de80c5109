"""The row-by-row pass: exact violation counts and examples, when a digest disagrees.

One frame, :func:`message_union` (messages, attempts with their steps, and dead letters),
is shuffled by message once and grouped per delivery, then a window per message runs over
the delivery rows. What an attempt row shows on its own (:func:`_local_rules`) is checked
before the shuffle, as bits of one int, so the rows shuffled carry a dozen numbers:

* **path** -- a delivery's transitions are its steps Ready, Inflight, an end state and
  (after WaitingRetry) a leave, in time order, and its Ready follows the previous
  delivery's last state by a legal edge;
* **deliveries** -- every attempt's transitions end in its result at its times,
  ``reconsume_times`` counts from the first or replayed delivery, deliveries step by one, a
  retry is Ready when its predecessor said, each DLQ delivery has one dead letter;
* **messages** -- each message against its first delivery and the run's horizon.

The state machine: Ready -> Inflight -> Commit | WaitingRetry | DLQ | Discard;
WaitingRetry -> Ready (a retry) or DLQ | Discard (an after-backoff leave); DLQ -> Ready only
with reason ``replayed``; every path starts with Ready (``published``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import reduce
from itertools import pairwise

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from retrysim.checks.invariants import (
    DELIVERY,
    DELIVERY_CHECKS,
    END_STATES,
    GROUP,
    HASHED,
    MESSAGE_CHECKS,
    MSG,
    MSG_SORT,
    REASON_CODE,
    RETRY_REASONS,
    SRC_ATTEMPT,
    SRC_DEAD_LETTER,
    SRC_MESSAGE,
    STATE_CODE,
    STEPS,
    differs,
    flagged,
    is_before,
    off_dlq_topic,
    reason_code_of,
    reason_name_of,
    run_horizons,
    state_code,
    state_name,
    still_inflight,
    sum_of,
    transition_hash,
    why_text,
)
from retrysim.model.policy import next_reconsume_columns
from retrysim.model.states import (
    COMMIT,
    DISCARD,
    DLQ,
    INFLIGHT,
    READY,
    READY_PUBLISHED,
    READY_REPLAYED,
    READY_RETRY_DUE,
    WAITING_RETRY,
)
from retrysim.scenario import limits
from retrysim.tables.schemas import PARTITION_COLUMN
from retrysim.tables.transitions import lands_unread, parent_of, step_columns

# --------------------------------------------------------------------------- rows

_ATTEMPT_COLUMNS = ("reconsume_times", "broker_reconsume_times", "ready_ms", "start_ms",
                    "end_ms", "next_ready_ms", "settled_ms")  # fmt: skip
# What a delivery breaks that its attempt row alone shows, as bits of ``l_bad``: computed
# before the shuffle, so the rows shuffled, aggregated and sorted by message carry one int
# instead of the step columns the rules read.
_LOCAL_RULES = ("illegal", "off_step", "path_backwards", "mismatch", "attempt_backwards",
                "unrouted")  # fmt: skip
_BIT = {name: 1 << index for index, name in enumerate(_LOCAL_RULES)}
# What the message pass needs of an attempt row besides its keys (the step columns stay
# behind unless example texts are wanted).
_NARROW = ("src", "a_state", "a_reconsume_times", "a_broker_reconsume_times", "a_next_rt",
           "a_next_broker_rt", "a_ready_ms", "a_next_ready_ms", "a_settled_ms",
           "a_born_ms", "a_poison_fixed", "a_next_route", "a_parent_delivery", "a_copy_state",
           "a_copy_ms", "a_copy_ready_ms", "t_ready_ms", "t_ready_reason", "t_end_state",
           "t_last_state", "t_last_ms", "t_route", "l_bad")  # fmt: skip
# Where a delivery is Ready and where it routes its retry (readable, for example texts).
_ROUTE_TEXT = ("source_topic", "queue_id", "ready_reason", "next_topic", "next_queue_id",
               "next_reason")  # fmt: skip
# What the attempt rows count toward summary and load (sums per group, in the attempts scan
# of :func:`derived_digest`); the final states need the message's last delivery.
ATTEMPT_COUNTED = ("t_deliveries", "t_first_deliveries", "t_retries", "t_commits", "t_dlq",
                   "t_discards", "t_replays", "t_commitlog_writes",
                   "t_late_send_backs")  # fmt: skip
FINAL_COUNTED = ("final_commit", "final_dlq", "final_discard")


def attempt_steps(attempts: DataFrame, keep: tuple[str, ...] = ()) -> DataFrame:
    """Each attempt with its transitions (:func:`retrysim.tables.transitions.step_columns`, the
    derivation that writes the transitions table) as columns per step: present or not, state
    code (0 for a state the model does not know), time; what they count toward summary and
    load; and ``l_bad``, the rules its row alone breaks. One row per delivery instead of
    three or four. Projections in turn: each reads the one before's plain columns instead of
    re-deriving the steps in every expression. ``keep``: attempt columns to carry along."""
    c = F.col
    code, why = STATE_CODE, REASON_CODE
    names = list(STEPS.values())
    steps = dict(zip(names, step_columns(), strict=True))
    next_rt, next_broker_rt = next_reconsume_columns(
        c("reconsume_times"), c("broker_reconsume_times"), c("end_reason")
    )
    per_step = attempts.select(
        *DELIVERY,
        *keep,
        F.lit(SRC_ATTEMPT).alias("src"),
        state_code(c("result_state")).alias("a_state"),
        *[c(name).alias(f"a_{name}") for name in _ATTEMPT_COLUMNS],
        next_rt.alias("a_next_rt"),
        next_broker_rt.alias("a_next_broker_rt"),
        *[steps[n][0].cast("int").alias(f"t_n_{n}") for n in names],
        *[
            F.when(steps[n][0], F.coalesce(state_code(steps[n][1]["state"]), F.lit(0))).alias(
                f"t_{n}_state"
            )
            for n in names
        ],
        *[F.when(steps[n][0], steps[n][1]["at_ms"]).alias(f"t_{n}_ms") for n in names],
        reason_code_of(steps["ready"][1]["reason"]).alias("t_ready_reason"),
        (steps["end"][1]["topic"] == F.lit(limits.SCHEDULE_TOPIC)).alias("t_end_scheduled"),
        (steps["leave"][0] & lands_unread(steps["leave"][1]["state"], steps["leave"][1]["reason"]))
        .cast("int")
        .alias("t_leave_unread"),
        c("born_ms").alias("a_born_ms"),
        c("poison_fixed").cast("int").alias("a_poison_fixed"),
        c("copy_state").isNotNull().cast("int").alias("t_copied"),
        c("parent_delivery").alias("a_parent_delivery"),
        state_code(c("copy_state")).alias("a_copy_state"),
        c("copy_ms").alias("a_copy_ms"),
        c("copy_ready_ms").alias("a_copy_ready_ms"),
        _route("next_topic", "next_queue_id", "next_reason").alias("a_next_route"),
        _route("source_topic", "queue_id", "ready_reason").alias("t_route"),
        reduce(
            lambda a, b: a | b,
            [c(name).isNull() != c("next_ready_ms").isNull() for name in _ROUTE_TEXT[3:]],
        ).alias("t_unrouted"),
    )
    present = {n: c(f"t_n_{n}") == 1 for n in names}
    state = {n: c(f"t_{n}_state") for n in names}
    copied = c("t_copied") == 1
    # a 4.9 client's second send-back takes the leave step (docs/model.md §6): a copy of the
    # message, not the delivery's own last state
    own = [n for n in names if n != "leave"]
    expected = {
        "ready": [code[READY]],
        "start": [code[INFLIGHT]],
        "end": [code[s] for s in END_STATES],
        "leave": [code[DLQ], code[DISCARD]],
    }
    reason = c("t_ready_reason")

    def expected_of(step: str) -> list[Column]:
        """The states a step may enter; a second copy may wait in the schedule topic."""
        if step != "leave":
            return [F.lit(s) for s in expected[step]]
        copy_waits = F.when(copied, F.lit(code[WAITING_RETRY])).otherwise(F.lit(code[DLQ]))
        return [*[F.lit(s) for s in expected[step]], copy_waits]

    def count(condition: Callable[[str], Column]) -> Column:
        return sum_of([F.coalesce(condition(n), F.lit(False)).cast("int") for n in names])

    def in_state(wanted: str) -> Column:
        return count(lambda n: state[n] == code[wanted])

    scheduled = (state["end"] == code[WAITING_RETRY]) & c("t_end_scheduled")
    first_kind = F.coalesce(reason.isin(why[READY_PUBLISHED], why[READY_REPLAYED]), F.lit(False))
    summed = per_step.withColumns(
        {
            "t_n": sum_of([c(f"t_n_{n}") for n in names]),
            "t_first_step": F.least(*[F.when(present[n], k) for k, n in STEPS.items()]),
            "t_last_step": F.greatest(*[F.when(present[n], k) for k, n in STEPS.items()]),
            "t_last_state": F.when(
                copied, F.coalesce(*[state[n] for n in reversed(own)])
            ).otherwise(F.coalesce(*[state[n] for n in reversed(names)])),
            "t_last_ms": F.when(
                copied,
                F.coalesce(*[F.when(present[n], c(f"t_{n}_ms")) for n in reversed(own)]),
            ).otherwise(F.coalesce(*[F.when(present[n], c(f"t_{n}_ms")) for n in reversed(names)])),
            "t_off_step": count(lambda n: present[n] & ~state[n].isin(*expected_of(n))),
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
            + in_state(DLQ)
            + F.coalesce(c("t_leave_unread"), F.lit(0))
            # a second copy waiting in the schedule topic
            + F.coalesce(copied & (state["leave"] == code[WAITING_RETRY]), F.lit(False)).cast(
                "int"
            ),
            "t_late_send_backs": c("t_copied"),
        }
    ).drop("t_end_scheduled", "t_leave_unread")
    local = _local_rules()
    return summed.withColumn(
        "l_bad", sum_of([F.when(local[name], _BIT[name]).otherwise(0) for name in _LOCAL_RULES])
    )


def _local_rules() -> dict[str, Column]:
    """The rules one attempt row shows broken (true: broken), on :func:`attempt_steps`'
    columns: its path (Ready, Inflight, an end state, a leave only after WaitingRetry, each
    at its step, in time order) and its transitions against its own result and times."""
    c = F.col
    code = STATE_CODE
    state = {name: c(f"t_{name}_state") for name in STEPS.values()}
    ms = [c(f"t_{name}_ms") for name in STEPS.values()]
    result = c("a_state")
    copied = c("t_copied") == 1  # a second copy in the leave step, after the cleaner's
    legal = (
        (state["ready"] == code[READY])
        & (c("t_last_step") == c("t_n"))  # the steps present are 1 .. t_n
        & (c("t_off_step") == 0)
        & (
            state["leave"].isNull()
            | (~copied & (state["end"] == code[WAITING_RETRY]))
            | (copied & state["end"].isin(code[WAITING_RETRY], code[DLQ], code[DISCARD]))
        )
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
        (c("t_n") != expected_n + c("t_copied"))
        | differs(c("t_ready_ms"), c("a_ready_ms"))
        | differs(c("t_start_ms"), c("a_start_ms"))
        # a 5.x simple delivery Inflight until visible again has an end_ms, no end step
        | differs(c("t_end_ms"), F.when(result != code[INFLIGHT], c("a_end_ms")))
        | differs(c("t_last_state"), result)
        | (settled & differs(c("t_last_ms"), c("a_settled_ms")))
    )
    return {
        "illegal": flagged(~legal),
        "off_step": c("t_off_step") > 0,
        "path_backwards": (c("t_no_time") > 0)
        | reduce(lambda a, b: a | b, [is_before(y, x) for x, y in pairwise(ms)]),
        "mismatch": flagged(mismatch),
        "attempt_backwards": is_before(c("a_start_ms"), c("a_ready_ms"))
        | is_before(c("a_end_ms"), c("a_start_ms"))
        | is_before(c("a_settled_ms"), c("a_end_ms"))
        | is_before(c("a_next_ready_ms"), c("a_end_ms")),
        # next_topic, next_queue_id and next_reason are set exactly when a retry is due
        "unrouted": flagged(c("t_unrouted")),
    }


def _route(topic: str, queue_id: str, reason: str) -> Column:
    """A 64-bit hash of a place and reason of Ready with the row's poison_fixed: one number
    compares a retry's Ready with what its predecessor named."""
    return transition_hash([F.col(topic), F.col(queue_id), F.col(reason), F.col("poison_fixed")])


def _broke(rule: str) -> Column:
    """Whether a delivery's attempt row broke ``rule`` of :func:`_local_rules`."""
    return F.coalesce(F.col("l_bad").bitwiseAND(_BIT[rule]) != 0, F.lit(False))


def step_hash(fields: dict[str, Column]) -> Column:
    """:func:`transition_hash` of the transition a step gives (its columns: ``fields``; the keys
    ``msg_id`` and ``delivery`` are the attempt's own)."""
    return transition_hash([fields.get(name, F.col(name)) for name in HASHED])


# What the attempt rows give per delivery: the message pass takes the narrow ones as they
# are; the rest only when it writes the example texts of a broken invariant.
_STEP_COUNTS = ("t_off_step", "t_no_time")
_STEP_VALUES = ("t_ready_reason", "t_end_state", "t_last_state", "t_last_ms", "t_route")
_WIDE_VALUES = ("t_first_step", "t_last_step")


def message_union(tables: Mapping[str, DataFrame], explain: bool = False) -> DataFrame:
    """Messages, attempts (with their transitions as steps) and dead letters as rows of one
    frame, shuffled once by message: every pass below runs on it without another shuffle.
    A row carries only its own table's columns (the others null) and ``src``, which table
    it is from; a message row stands at delivery 1. The transitions table itself is not in
    it: :func:`transition_digest` shows it equals what the attempts give. An attempt row
    carries what the rules need across deliveries, or with ``explain`` all its step columns
    as well, for the example texts."""
    c = F.col
    messages = tables["messages"].select(
        *MSG, F.lit(1).alias("delivery"), F.lit(SRC_MESSAGE).alias("src"), "born_ms",
        "size_bytes",
    )  # fmt: skip
    dead = tables["dead_letters"].select(
        *MSG,
        c("deliveries").alias("delivery"),
        F.lit(SRC_DEAD_LETTER).alias("src"),
        "dlq_at_ms",
        "replayed_at_ms",
        off_dlq_topic().cast("int").alias("d_bad_topic"),
    )
    steps = attempt_steps(tables["attempts"], _ROUTE_TEXT if explain else ())
    attempts = steps if explain else steps.select(*DELIVERY, *_NARROW)
    frames = (messages, attempts, dead)
    union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    return union.repartition(*MSG_SORT)


# --------------------------------------------------------------------------- deliveries


def _per_delivery(union: DataFrame, explain: bool = False) -> DataFrame:
    """Per delivery: its message row (at delivery 1), attempt and dead letter side by side
    (numeric only). A hash aggregate within the union's partitions: no shuffle, and no sort
    of transitions (there are none: a path is a few steps, carried by the attempt row).
    Counts are sums over the delivery's attempts (one when all is well), the rules they
    broke or-ed; with ``explain``, the attempt's steps for the example texts as well."""
    c = F.col
    sources = {"m_n": SRC_MESSAGE, "a_n": SRC_ATTEMPT, "d_n": SRC_DEAD_LETTER}
    step_names = list(STEPS.values())
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
        F.min("dlq_at_ms").alias("d_first_ms"),
        F.max("replayed_at_ms").alias("d_replayed_at_ms"),
        F.max("d_bad_topic").alias("d_bad_topic"),
        *wide,
    )


def delivery_rows(
    tables: Mapping[str, DataFrame], ends: DataFrame, explain: bool = False
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
    replayed = c("t_ready_reason") == REASON_CODE[READY_REPLAYED]
    delivered = c("a_n") + c("d_n") > 0
    whole = Window.partitionBy(*MSG_SORT)
    per = _per_delivery(message_union(tables, explain), explain).withColumns(
        {
            "delivered": delivered,
            "parent": parent_of(c("delivery"), c("a_parent_delivery")),
            # a message a 4.9 client sent back twice: its deliveries follow parent links
            "copies": F.max(
                c("a_parent_delivery").isNotNull() | c("a_copy_state").isNotNull()
            ).over(whole),
            # else each follows the delivered row before it, as its number says
            # (a row of a message alone can only be the first; it is nobody's predecessor)
            "lag_delivery": F.lag(F.when(delivered, c("delivery"))).over(order),
            "lag_last_state": F.lag("t_last_state").over(order),
            "lag_last_ms": F.lag("t_last_ms").over(order),
            "lag_next_rt": F.lag("a_next_rt").over(order),
            "lag_next_ready_ms": F.lag("a_next_ready_ms").over(order),
            "lag_next_broker_rt": F.lag("a_next_broker_rt").over(order),
            "lead_ready_ms": F.lead("t_ready_ms").over(order),
            "lead_replayed": F.lead(replayed).over(order),
            "lead_is_last": F.lead("delivery").over(order).isNull(),
            "lead_route": F.lead("t_route").over(order),
            "last_replay": F.max(F.when(replayed, c("delivery"))).over(so_far),
            # the message row stands at delivery 1, before any later delivery
            "message_born_ms": F.max("born_ms").over(so_far),
        }
    )
    if explain:
        per = per.withColumns(
            {f"lead_{name}": F.lead(name).over(order) for name in _ROUTE_TEXT[:3]}
        )
    per = _with_neighbours(per, explain)
    checked = (
        per.join(F.broadcast(ends), GROUP, "left")
        .join(F.broadcast(horizons), PARTITION_COLUMN, "left")
        .withColumns(_delivery_flags())
        .withColumns(_message_flags())
        .withColumns(_final_counts())
    )
    return checked.withColumns(_why_texts()) if explain else checked


def _with_neighbours(per: DataFrame, explain: bool) -> DataFrame:
    """Each delivery with its predecessor's last state and the retry it offered (``prev_*``:
    the delivery ``parent`` names, or a 4.9 client's second copy of it, docs/model.md §6)
    and its successor's Ready (``next_*``: the retry or replay that follows it, not the
    second copy's; ``is_last`` when none does). A message row alone (born after the horizon)
    is nobody's predecessor."""
    c = F.col
    code = STATE_CODE
    keys = [*MSG_SORT]
    pred = per.where(c("delivered")).select(
        *keys,
        c("delivery").alias("parent"),
        F.lit(True).alias("p_found"),
        c("t_last_state").alias("p_last_state"),
        c("t_last_ms").alias("p_last_ms"),
        c("a_next_rt").alias("prev_next_rt"),
        c("a_next_broker_rt").alias("prev_next_broker_rt"),
        c("a_next_ready_ms").alias("p_next_ready_ms"),
        c("a_copy_state").alias("p_copy_state"),
        c("a_copy_ms").alias("p_copy_ms"),
        c("a_copy_ready_ms").alias("p_copy_ready_ms"),
    )
    copy_child = F.coalesce(
        (c("p_copy_state") == code[WAITING_RETRY]) & (c("t_ready_ms") == c("p_copy_ready_ms")),
        F.lit(False),
    )
    joined = per.join(pred, [*keys, "parent"], "left").withColumns(
        {
            "copy_child": copy_child,
            "prev_delivery": F.when(c("p_found"), c("parent")),
            "prev_last_state": F.when(copy_child, F.lit(code[WAITING_RETRY])).otherwise(
                c("p_last_state")
            ),
            "prev_last_ms": F.when(copy_child, c("p_copy_ms")).otherwise(c("p_last_ms")),
            "prev_next_ready_ms": F.when(copy_child, c("p_copy_ready_ms")).otherwise(
                c("p_next_ready_ms")
            ),
        }
    )
    replayed = c("t_ready_reason") == REASON_CODE[READY_REPLAYED]
    texts = [F.max(name).alias(f"n_{name}") for name in _ROUTE_TEXT[:3]] if explain else []
    kids = (
        joined.where(c("delivered") & ~c("copy_child") & c("prev_delivery").isNotNull())
        .groupBy(*keys, c("parent").alias("delivery"))
        .agg(
            F.max("t_ready_ms").alias("next_ready_ms"),
            F.max(replayed).alias("next_replayed"),
            F.max("t_route").alias("next_route"),
            *texts,
        )
        .withColumn("has_next", F.lit(True))
    )
    linked = joined.join(kids, [*keys, "delivery"], "left").withColumn(
        "is_last", c("has_next").isNull()
    )
    # a message without copies: the rows before and after it by number, as they always were
    copies = c("copies")
    pairs = {
        "prev_delivery": "lag_delivery", "prev_last_state": "lag_last_state",
        "prev_last_ms": "lag_last_ms", "prev_next_rt": "lag_next_rt",
        "prev_next_ready_ms": "lag_next_ready_ms", "prev_next_broker_rt": "lag_next_broker_rt",
        "next_ready_ms": "lead_ready_ms", "next_replayed": "lead_replayed",
        "is_last": "lead_is_last", "next_route": "lead_route",
        **({f"n_{name}": f"lead_{name}" for name in _ROUTE_TEXT[:3]} if explain else {}),
    }  # fmt: skip
    return linked.withColumns(
        {name: F.when(copies, c(name)).otherwise(c(lag)) for name, lag in pairs.items()}
    )


def _delivery_flags() -> dict[str, Column]:
    """The path rules (docs/model.md §9) and the delivery checks on a delivery's row: what
    its attempt row broke alone (:func:`_local_rules`) and what takes its neighbours: its
    Ready entered from the previous delivery's last state by a legal edge and not before
    it, the retry due when this delivery said, reconsume_times, the delivery numbers, its
    dead letter."""
    c = F.col
    code, why = STATE_CODE, REASON_CODE
    prev = c("prev_last_state")
    entered = (
        F.when(prev.isNull(), c("t_ready_reason") == why[READY_PUBLISHED])
        .when(
            (prev == code[WAITING_RETRY])
            | ((prev == code[INFLIGHT]) & c("prev_next_ready_ms").isNotNull()),
            c("t_ready_reason").isin(*[why[r] for r in RETRY_REASONS]),
        )
        .when(prev == code[DLQ], c("t_ready_reason") == why[READY_REPLAYED])
        .otherwise(F.lit(False))
    )
    result = c("a_state")
    replayed_next = F.coalesce(c("next_replayed"), F.lit(False))
    retried = c("next_ready_ms").isNotNull() & ~replayed_next
    late = retried & differs(c("next_ready_ms"), c("a_next_ready_ms"))
    is_dlq = F.coalesce(result == code[DLQ], F.lit(False))
    # a 4.9 client's second copy may be a dead letter of the same delivery (model.md §6)
    copy_dead = F.coalesce(c("a_copy_state") == code[DLQ], F.lit(False))
    own_at = F.when(is_dlq, c("a_settled_ms"))
    copy_at = F.when(copy_dead, c("a_copy_ms"))
    dead_wrong = (c("d_n") >= 1) & (
        differs(c("d_first_ms"), F.least(own_at, copy_at))
        | differs(c("d_at_ms"), F.greatest(own_at, copy_at))
        | (c("d_bad_topic") == 1)
        | differs(c("d_replayed_at_ms"), F.when(replayed_next, c("next_ready_ms")))
    )
    # a message sent back twice numbers its deliveries as they start: a later one
    step = F.when(c("prev_delivery").isNull(), c("delivery") == 1).otherwise(
        F.when(c("a_parent_delivery").isNotNull(), c("delivery") > c("prev_delivery")).otherwise(
            c("delivery") == c("prev_delivery") + 1
        )
    )
    after_backoff = c("t_end_state") == code[WAITING_RETRY]
    until = F.coalesce(c("a_next_ready_ms"), c("a_settled_ms"))
    copy_open = (c("a_copy_state") == code[WAITING_RETRY]) & (
        c("a_copy_ready_ms") >= c("load_end_ms")
    )
    has_path = c("a_n") > 0
    rt, broker_rt = _expected_counts()
    # time_order's part from the transitions; the attempt's own times are another part
    path_backwards = _broke("path_backwards") | is_before(c("t_ready_ms"), c("prev_last_ms"))
    flags = {
        "legal_path": has_path & (_broke("illegal") | flagged(~entered)),
        "seq_numbering": has_path & _broke("off_step"),
        "attempts_transitions": (c("a_n") != 1) | _broke("mismatch"),
        "time_order": _broke("attempt_backwards") | late | (has_path & path_backwards),
        "reconsume_times": (c("a_n") == 1)
        & (differs(c("a_reconsume_times"), rt) | differs(c("a_broker_reconsume_times"), broker_rt)),
        "deliveries_consecutive": flagged(~step),
        "dead_letters": (c("d_n") != is_dlq.cast("int") + copy_dead.cast("int"))
        | flagged(dead_wrong),
        "attempts_routing": _broke("unrouted")
        | (retried & differs(c("next_route"), c("a_next_route")))
        # (a message without its row is messages_attempts' finding)
        | flagged(
            (c("a_n") == 1)
            & c("message_born_ms").isNotNull()
            & differs(c("a_born_ms"), c("message_born_ms"))
        )
        | flagged((c("a_poison_fixed") == 1) & c("last_replay").isNull()),
    }
    return {
        **{f"bad_{name}": c("delivered") & flag for name, flag in flags.items()},
        "open_waiting_retry": F.coalesce(
            after_backoff & (until.isNull() | (until >= c("load_end_ms"))), F.lit(False)
        ).cast("int")
        + F.coalesce(copy_open, F.lit(False)).cast("int"),
    }


def _expected_counts() -> tuple[Column, Column]:
    """The reconsume_times and broker_reconsume_times a delivery should have: 0 for a first
    or replayed delivery, else what its predecessor's retry said
    (:func:`retrysim.model.policy.next_reconsume_columns`)."""
    c = F.col
    fresh = c("prev_delivery").isNull() | (c("t_ready_reason") == REASON_CODE[READY_REPLAYED])
    zero = F.lit(0)
    return (
        F.when(fresh, zero).otherwise(c("prev_next_rt")),
        F.when(fresh, zero).otherwise(c("prev_next_broker_rt")),
    )


def _path_text() -> Column:
    """A delivery's transitions after the previous delivery's last state, e.g. ``WaitingRetry
    -> Ready (reason retry_due) -> Inflight -> Commit``."""
    c = F.col
    ready = F.format_string(
        "%s (reason %s)", state_name(c("t_ready_state")), reason_name_of(c("t_ready_reason"))
    )
    steps = [state_name(c(f"t_{name}_state")) for name in list(STEPS.values())[1:]]
    ready = F.when(c("t_ready_state").isNotNull(), ready)
    return F.concat_ws(
        " -> ", F.coalesce(state_name(c("prev_last_state")), F.lit("start")), ready, *steps
    )


def _why_texts() -> dict[str, Column]:
    """The ``why_*`` text of each row check, on :func:`delivery_rows` with ``explain``."""
    c = F.col
    path = _path_text()
    ms = [c(f"t_{name}_ms") for name in STEPS.values()]
    path_times = F.concat(
        F.format_string("%s at %s ms", path, F.concat_ws(", ", *[x.cast("string") for x in ms])),
        F.when(
            c("prev_last_ms").isNotNull(), F.format_string(", after %s ms", c("prev_last_ms"))
        ).otherwise(F.lit("")),
    )
    result = state_name(c("a_state"))
    pairs = ("a_ready_ms", "t_ready_ms", "a_start_ms", "t_start_ms", "a_end_ms", "t_end_ms")
    times = ("a_ready_ms", "a_start_ms", "a_end_ms", "a_settled_ms", "a_next_ready_ms")
    return {
        "why_legal_path": path,
        "why_seq_numbering": why_text(
            "%s transition(s) at steps %s..%s (seq - 4*(delivery-1)): %s",
            *("t_n", "t_first_step", "t_last_step", path),
        ),
        "why_attempts_transitions": why_text(
            "%s attempt row(s) ending %s, %s transition(s) ending %s; ready %s/%s, start %s/%s, "
            "end %s/%s ms (attempt/transitions)",
            *("a_n", result, "t_n", state_name(c("t_last_state")), *pairs),
        ),
        "why_time_order": why_text(
            "%s; attempt ready %s, start %s, end %s, settled %s, next_ready %s ms; next "
            "delivery Ready at %s",
            *(path_times, *times, "next_ready_ms"),
        ),
        "why_reconsume_times": why_text(
            "reconsume_times %s (broker %s), expected %s (broker %s)",
            *("a_reconsume_times", "a_broker_reconsume_times", *_expected_counts()),
        ),
        "why_deliveries_consecutive": why_text(
            "delivery %s follows delivery %s", "delivery", "prev_delivery"
        ),
        "why_dead_letters": why_text(
            "%s dead letter(s) (dlq_at_ms %s, replayed_at_ms %s) for a delivery ending %s at %s",
            *("d_n", "d_at_ms", "d_replayed_at_ms", result, "a_settled_ms"),
        ),
        "why_attempts_routing": why_text(
            "born_ms %s (message born %s ms), poison_fixed %s after replay %s; routed its retry "
            "to %s queue %s (%s), next_ready %s ms; the next delivery is Ready on %s queue %s "
            "(%s)",
            *("a_born_ms", "message_born_ms", "a_poison_fixed", "last_replay", *_ROUTE_TEXT[3:]),
            *("a_next_ready_ms", *[f"n_{name}" for name in _ROUTE_TEXT[:3]]),
        ),
        "why_messages_attempts": why_text(
            "%s message row(s) born at %s ms (horizon %s ms), %s first delivery(ies) Ready "
            "at %s ms",
            *("m_n", "born_ms", "horizon_ms", "a_n", "a_ready_ms"),
        ),
    }


def _final_counts() -> dict[str, Column]:
    """On a message's last delivery, its final state (summary's commits, dlq, discards)."""
    c = F.col
    code = STATE_CODE
    last, copy = c("t_last_state"), c("a_copy_state")

    def ends(state: str) -> Column:  # a 4.9 client's second copy ends at once out of retries
        own = (c("is_last") & (last == code[state])).cast("int")
        return own + F.coalesce(copy == code[state], F.lit(False)).cast("int")

    return {
        "final_commit": (c("is_last") & (last == code[COMMIT])).cast("int"),
        "final_dlq": ends(DLQ),
        "final_discard": ends(DISCARD),
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
        | ((first_n == 1) & differs(c("a_ready_ms"), c("born_ms")))
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
        F.count_if(still_inflight()).alias("end_inflight"),
        F.count_if(c("a_state") == STATE_CODE[READY]).alias("end_ready_backlog"),
        F.sum("open_waiting_retry").alias("end_waiting_retry"),
        F.count_if(c("m_n") >= 1).alias("message_rows"),
        F.max("size_bytes").alias("size_bytes"),
    )
