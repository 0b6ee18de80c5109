"""The figures compared exactly between retrysim and a broker (docs/conformance.md): per
message, the deliveries and the final state; the DLQ's messages; the commit-log puts by topic.

A per-message figure is one row: its mismatches (retrysim 0, the broker the count that
differs). The broker's side comes from the harness's records
(:class:`~retrysim.conformance.harness.BrokerRun`), retrysim's from the event loop's staged
rows of the same group and messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from retrysim.conformance.harness import BrokerRun
from retrysim.model.behavior import CONSUME_SUCCESS, TIMEOUT
from retrysim.model.policy import Policy
from retrysim.model.states import (
    COMMIT,
    DISCARD,
    DLQ,
    NO_RETRY,
    READY_PUBLISHED,
    READY_RETRY_DUE,
    REVIVE,
    WAITING_RETRY,
)
from retrysim.scenario import limits

COMMITTED, DEAD, DROPPED, PENDING = "commit", "dlq", "discard", "pending"
# A retry's delay on the broker may exceed its level's by one pass of the schedule service's
# timer, which reads a level again 100 ms after it finds its head not yet due or the level
# empty (ScheduleMessageService.DELAY_FOR_A_WHILE in 4.9.7), and
# by the commit log's dispatch, the long poll's wake-up and the listener's call on loopback.
SCHEDULE_POLL_MS = 100
LOOPBACK_MS = 50
RETRY_DELAY_TOLERANCE_MS = SCHEDULE_POLL_MS + LOOPBACK_MS
# The open-source 5.x reviver writes a retry from 2 s after it is due (the scan's window) to
# that plus the scan thread's longest rest, one interval and reviveMaxSlow more when quiet,
# plus the timer wheel's precision (timerPrecisionMs, 1 s), which puts the checkpoint in the
# revive topic (7 s): retrysim's lag (limits.APACHE_REVIVE_LAG_MS, 3 s) may be short by 4 s.
TIMER_PRECISION_MS = 1_000
REVIVE_LATEST_MS = (
    limits.REVIVE_ACK_WINDOW_MS
    + (1 + limits.REVIVE_MAX_SLOW) * limits.REVIVE_INTERVAL_MS
    + TIMER_PRECISION_MS
)
REVIVE_TOLERANCE_MS = REVIVE_LATEST_MS - limits.APACHE_REVIVE_LAG_MS + LOOPBACK_MS
# A listener's time on the broker may exceed the processing time by Thread.sleep's overshoot
# and the call itself.
SLEEP_MS = 2


@dataclass(frozen=True)
class Figure:
    """One compared figure: retrysim's value, the broker's, and whether they agree."""

    figure: str
    retrysim: float
    broker: float
    tolerance: float = 0.0

    @property
    def within(self) -> bool:
        return abs(self.retrysim - self.broker) <= self.tolerance


def retrysim_messages(staged: pd.DataFrame) -> pd.DataFrame:
    """Per message (by ``msg_id``): its deliveries started and its final state."""
    started = staged[staged["start_ms"].notna()]
    last = staged.sort_values("delivery").groupby("msg_id").tail(1).set_index("msg_id")
    state = last["result_state"].map({COMMIT: COMMITTED, DLQ: DEAD, DISCARD: DROPPED})
    state = state.fillna(PENDING)
    # as the broker's side: a message with a dead letter is in the DLQ, whichever of its
    # copies (a 4.9 client's second send-back, docs/model.md §6) put it there
    dead = staged.loc[(staged["result_state"] == DLQ) | (staged["copy_state"] == DLQ), "msg_id"]
    state[state.index.isin(dead)] = DEAD
    deliveries = started.groupby("msg_id")["delivery"].max()
    return pd.DataFrame({"deliveries": deliveries, "state": state}).fillna({"deliveries": 0})


def broker_messages(run: BrokerRun, policy: Policy) -> pd.DataFrame:
    """Per message: the deliveries the broker made and where the message ended (a failure
    of a consumer that never retries, 4.x broadcasting, is dropped)."""
    rows = run.deliveries.sort_values(["msg_id", "delivery"])
    last = rows.groupby("msg_id").tail(1).set_index("msg_id")
    failed = DROPPED if policy.retry_path == NO_RETRY else PENDING
    state = (last["outcome"] == CONSUME_SUCCESS).map({True: COMMITTED, False: failed})
    state[state.index.isin(run.dead_letters["msg_id"])] = DEAD
    messages = pd.DataFrame({"deliveries": rows.groupby("msg_id").size(), "state": state})
    # a message sent and never delivered is pending, as retrysim's Ready row says
    return messages.reindex(run.messages["msg_id"]).fillna({"deliveries": 0, "state": PENDING})


def retrysim_puts(staged: pd.DataFrame, policy: Policy) -> dict[str, int]:
    """The commit-log puts by topic that retrysim's rows make (docs/flavors.md, commit-log
    writes): each copy Ready on a topic (published, or a retry the schedule topic delivered
    or the 5.x reviver copied), each send-back into the schedule topic, each dead letter, and
    for 5.x the reviver's copy of a message it then finds over the limit (5.x pop writes)."""
    puts: dict[str, int] = {}

    def add(topics: pd.Series) -> None:
        for topic, count in topics.value_counts().items():
            puts[topic] = puts.get(topic, 0) + int(count)

    add(staged.loc[staged["ready_reason"].isin([READY_PUBLISHED, READY_RETRY_DUE]), "source_topic"])
    waiting = staged["end_state"] == WAITING_RETRY
    add(staged.loc[waiting & (staged["end_topic"] == limits.SCHEDULE_TOPIC), "end_topic"])
    add(staged.loc[staged["end_state"] == DLQ, "end_topic"])
    add(staged.loc[staged["leave_state"] == DLQ, "leave_topic"])
    # a 4.9 client's second send-back: into the schedule topic, or a dead letter
    add(staged.loc[staged["copy_state"].isin([WAITING_RETRY, DLQ]), "copy_topic"])
    dead = staged["result_state"] == DLQ
    if policy.retry_path == REVIVE and dead.any():
        add(pd.Series(policy.retry_topic, index=staged.index[dead]))
    return puts


# the 5.x broker's own topics for a pop's checkpoints and acks: the timer wheel's and the
# revive service's (rmq_sys_wheel_timer, rmq_sys_REVIVE_LOG_<cluster>)
SYSTEM_TOPIC_PREFIX = "rmq_sys_"


def pop_bookkeeping(puts: dict[str, int]) -> dict[str, int]:
    """The broker's puts to its pop bookkeeping topics. Not compared: the broker writes one
    checkpoint per receive, which may hold several messages (retrysim writes one per
    delivery, an upper bound), and two runs of one scenario differ by a write or two."""
    return {topic: n for topic, n in puts.items() if topic.startswith(SYSTEM_TOPIC_PREFIX)}


def listener_ends(rows: pd.DataFrame) -> pd.Series:
    """When each delivery's listener returned: retrysim's ``start + listener_ms``, its
    processing time without the client's own (its ``end_ms`` is when the delivery left
    Inflight, which for a 5.x simple consumer's failure is the end of its invisible time),
    the broker's recorded end."""
    if "listener_ms" in rows:
        return rows["start_ms"] + rows["listener_ms"]
    return rows["end_ms"]


def _retry_delays(rows: pd.DataFrame, ends: pd.Series | None = None) -> pd.Series:
    """Each retry's delay, from the end of one delivery's listener (or ``ends``, by row) to
    the start of the next, by (msg_id, delivery)."""
    started = rows[rows["start_ms"].notna()].sort_values(["msg_id", "delivery"])
    ends = listener_ends(started) if ends is None else ends.loc[started.index]
    before = ends.groupby(started["msg_id"]).shift()
    delays = (started["start_ms"] - before)[before.notna()]
    keys = started.loc[delays.index, ["msg_id", "delivery"]]
    return pd.Series(delays.to_numpy(float), index=pd.MultiIndex.from_frame(keys))


def retry_tolerance(policy: Policy) -> int:
    """How far a retry's delay on the broker may be from retrysim's: one schedule pass and the
    loopback, or the open-source 5.x reviver's rests."""
    return REVIVE_TOLERANCE_MS if policy.revive_lag_ms else RETRY_DELAY_TOLERANCE_MS


def batch_order_ms(staged: pd.DataFrame, policy: Policy) -> float:
    """How far the broker's own order may move a retry that waits in a client under a
    backlog (docs/conformance.md, ``B``). A 4.x pool: one batch of each of the instance's
    other queues, at the pool's pace. Once a queue caches more than its pull threshold, the
    client's one pull thread takes it 32 at a time as its flow control lets it, and its pool
    runs the batches in the order the pulls returned, which round trips and 50 ms timers
    decide. A 5.x push client whose cache fills: one receive, a second, since the broker
    draws at random which pop reads the retry topic first. Two broker runs of one scenario
    differ by that much. 0 where retrysim never has more waiting than the caches hold (the
    clients then take each message as it comes)."""
    topology = policy.topology
    if topology.threads is None or (policy.pull_threshold is None and policy.pop_cache is None):
        return 0.0
    started = staged[staged["ready_ms"].notna()]
    waiting, _ = _backlog_peak(started["ready_ms"].to_numpy(float),
                               started["start_ms"].to_numpy(float))  # fmt: skip
    if policy.pop_cache is not None:
        full = waiting > policy.pop_cache * topology.instances
        return float(limits.CACHE_FULL_BACKOFF_MS) if full else 0.0
    if waiting <= policy.pull_threshold:
        return 0.0
    queues = -(-topology.queues // topology.instances) + topology.retry_queue_nums
    listener = listener_ends(started) - started["start_ms"]
    return limits.PULL_BATCH * (queues - 1) * float(listener.mean()) / topology.threads


def _late_by(retries: int, per_retry: float) -> float:
    """How far from retrysim's the broker may settle a message after ``retries`` retries
    (each within ``per_retry``): the loopback once, and each retry's tolerance."""
    return LOOPBACK_MS + per_retry * max(retries, 0)


def _capped(tolerance: float, figure: float) -> float:
    """A tolerance never wider than 20 % of the figure it checks: a broker beyond that is a
    difference of the model."""
    return min(tolerance, 0.2 * abs(figure))


def _worst(mine: pd.Series, theirs: pd.Series) -> float:
    both = mine.to_frame("retrysim").join(theirs.to_frame("broker"), how="inner")
    return float((both["broker"] - both["retrysim"]).abs().max()) if len(both) else 0.0


def _backlog_peak(ready: np.ndarray, start: np.ndarray) -> tuple[int, float]:
    """The most copies Ready at once (from ``ready`` until ``start``, NaN: never started),
    and when."""
    if not len(ready):
        return 0, 0.0
    times = np.concatenate([ready, np.where(np.isnan(start), np.inf, start)])
    steps = np.concatenate([np.ones(len(ready)), -np.ones(len(start))])
    order = np.lexsort((steps, times))  # a start before a copy Ready at the same moment
    depth = np.cumsum(steps[order])
    at = int(np.argmax(depth))
    return int(depth[at]), float(times[order][at])


def _ready_backlog(staged: pd.DataFrame, run: BrokerRun, per_retry: int) -> Figure:
    """The peak Ready backlog. On the broker a copy is Ready from its store time (a retry:
    when the schedule topic put it on %RETRY%) plus the loopback to the client, until its
    listener starts; a message never delivered is Ready from its send to the end."""
    ready = staged["ready_ms"].to_numpy(float)
    start = staged["start_ms"].to_numpy(float)
    mine, at = _backlog_peak(ready[~np.isnan(ready)], start[~np.isnan(ready)])
    delivered = run.deliveries.sort_values(["msg_id", "delivery"])
    # a copy delivered again by the client (an ordered local retry) waits its backoff, not
    # in Ready: Ready from its start
    again = delivered["stored_ms"] == delivered.groupby("msg_id")["stored_ms"].shift()
    stored = delivered["stored_ms"].where(~again, delivered["start_ms"] - LOOPBACK_MS)
    never = run.messages[~run.messages["msg_id"].isin(delivered["msg_id"])]
    # a copy that starts within the loopback was never waiting
    starts = delivered["start_ms"].to_numpy(float)
    ready_at = np.minimum(stored.to_numpy(float) + LOOPBACK_MS, starts)
    theirs, _ = _backlog_peak(
        np.concatenate([ready_at,
                        never["born_ms"].to_numpy(float)]),
        np.concatenate([delivered["start_ms"].to_numpy(float), np.full(len(never), np.nan)]),
    )  # fmt: skip
    # the broker's timers move each copy's Ready and start by up to a retry's tolerance: the
    # peak may differ by the copies retrysim moves in or out of Ready that near its peak
    near = np.abs(np.concatenate([ready, start]) - at) <= per_retry
    return Figure("peak Ready backlog", mine, theirs, _capped(float(near.sum()), mine))


def _settle_times(staged: pd.DataFrame, state: str) -> pd.DataFrame:
    rows = staged[staged["result_state"] == {COMMITTED: COMMIT, DEAD: DLQ}[state]]
    return pd.DataFrame({"age": (rows["settled_ms"] - rows["born_ms"]).to_numpy(float),
                         "deliveries": rows["delivery"].to_numpy()},
                        index=rows["msg_id"].to_numpy())  # fmt: skip


def latest_settle(staged: pd.DataFrame, policy: Policy) -> tuple[float, float]:
    """retrysim's last commit or dead letter (ms), and the latest the broker may settle the
    messages within tolerance: each one's settle plus the loopback and each retry's
    tolerance (a 5.x dead letter one retry more). A horizon between the two cuts off a
    message the broker settles later than retrysim, within tolerance, and its final state
    then differs."""
    settled = staged[staged["result_state"].isin([COMMIT, DLQ])]
    if settled.empty:
        return 0.0, 0.0
    revived = int(policy.retry_path == REVIVE) * (settled["result_state"] == DLQ)
    retries = (settled["delivery"] - 1 + revived).clip(lower=0)
    at = settled["settled_ms"].astype(float)
    latest = at + LOOPBACK_MS + retry_tolerance(policy) * retries
    return float(at.max()), float(latest.max())


def _broker_ages(run: BrokerRun, rows: pd.DataFrame, at: str) -> pd.Series:
    """Each of the broker's ``rows``' time from its message's send to its ``at`` column, by
    msg_id."""
    born = run.messages.set_index("msg_id")["born_ms"]
    ages = rows[at].to_numpy(float) - born.loc[rows["msg_id"]].to_numpy(float)
    return pd.Series(ages, index=rows["msg_id"].to_numpy())


def _smallest_delay(staged: pd.DataFrame) -> float:
    """retrysim's smallest retry delay, which caps the tolerance of every retry's: from the
    end of the listener, or, after a timeout, from the send-back (the 4.x cleaner's, whose
    listener runs on: its retry may wait for that thread and start as it frees)."""
    ends = staged["end_ms"].where(staged["outcome"] == TIMEOUT, listener_ends(staged))
    delays = _retry_delays(staged, ends)
    return float(delays.min()) if len(delays) else float("inf")


def _time_to_commit(
    staged: pd.DataFrame, run: BrokerRun, per_retry: float, committed: pd.Index
) -> list[Figure]:
    """p50 and p99 of the committed messages' time from their send to their commit: on the
    broker, the last delivery of each message in ``committed`` (a success the cleaner had
    already sent back is no commit)."""
    rows = run.deliveries.sort_values(["msg_id", "delivery"]).groupby("msg_id").tail(1)
    commits = rows[rows["msg_id"].isin(committed)]
    mine, theirs = _settle_times(staged, COMMITTED), _broker_ages(run, commits, "end_ms")
    if mine.empty or theirs.empty:
        return [Figure("committed messages", len(mine), len(theirs))]
    late = _late_by(int(mine["deliveries"].max()) - 1, per_retry)
    figures = []
    for q in (50, 99):
        mine_q = float(np.percentile(mine["age"], q, method="lower"))
        theirs_q = float(np.percentile(theirs, q, method="lower"))
        figures.append(Figure(f"p{q} time to commit (ms)", mine_q, theirs_q,
                              _capped(late, mine_q)))  # fmt: skip
    return figures


def _dlq_times(staged: pd.DataFrame, run: BrokerRun, policy: Policy, per_retry: float) -> Figure:
    """Each dead letter's time from its send to the DLQ, the worst difference, each retry
    within ``per_retry`` (a 5.x dead letter is the reviver's copy too: one retry's tolerance
    more)."""
    copies = staged[staged["copy_state"] == DLQ]  # a 4.9 client's second copy's dead letter
    mine = pd.concat([
        _settle_times(staged, DEAD),
        pd.DataFrame({"age": (copies["copy_ms"] - copies["born_ms"]).to_numpy(float),
                      "deliveries": copies["delivery"].to_numpy()},
                     index=copies["msg_id"].to_numpy()),
    ])  # fmt: skip
    theirs = _broker_ages(run, run.dead_letters, "dlq_at_ms")
    youngest = float(mine["age"].min()) if len(mine) else 0.0
    revived = int(policy.retry_path == REVIVE)
    retries = int(mine["deliveries"].max()) - 1 + revived if len(mine) else 0
    late = _late_by(retries, per_retry) if len(mine) else 0.0
    return Figure("DLQ time, worst difference (ms)", 0,
                  _worst(_in_order(mine["age"]), _in_order(theirs)),
                  _capped(late, youngest))  # fmt: skip


def _in_order(ages: pd.Series) -> pd.Series:
    """``ages`` by (msg_id, k): a message's k-th dead letter in time, so that two copies'
    dead letters pair up in order."""
    ages = ages.sort_values(kind="stable")
    k = ages.groupby(level=0).cumcount().to_numpy()
    return pd.Series(ages.to_numpy(), index=pd.MultiIndex.from_arrays([ages.index, k]))


def _instances(staged: pd.DataFrame, run: BrokerRun, policy: Policy) -> list[Figure]:
    """Each instance's deliveries and busy time (each delivery's listener time; Thread.sleep
    and the call may add a millisecond or two), each instance against its own tolerance: the
    figure is the instance furthest beyond it (or, all within, closest to it). Its queues
    decide a 4.x instance's deliveries: exact. A 5.x retry goes to the instance whose long
    poll the broker wakes when the reviver writes it, a moment retrysim knows within the
    reviver's window, and the pops one pass of the reviver wakes race for the copies it
    writes together: an instance may gain or lose its revived retries."""

    def work(rows: pd.DataFrame, instance: str) -> pd.DataFrame:
        rows = rows[rows["start_ms"].notna()]
        busy = listener_ends(rows) - rows["start_ms"]
        return pd.DataFrame({"deliveries": 1, "busy": busy}).groupby(rows[instance]).sum()

    revived = staged[staged["ready_reason"] == READY_RETRY_DUE]
    if policy.retry_path != REVIVE or policy.topology.instances == 1:
        revived = revived.iloc[:0]
    both = (
        work(staged, "consumer_instance")
        .join(work(revived, "consumer_instance").add_suffix("_revived"), how="left")
        .join(work(run.deliveries, "instance"), how="outer", suffixes=("_retrysim", "_broker"))
        .fillna(0)
    )  # fmt: skip
    if both.empty:
        return [Figure("deliveries per instance, worst difference", 0, 0),
                Figure("busy time per instance, worst difference (ms)", 0, 0)]  # fmt: skip
    figures = []
    for name, column, own in (
        ("deliveries per instance, worst difference", "deliveries", 0),
        ("busy time per instance, worst difference (ms)", "busy", SLEEP_MS),
    ):
        differences = (both[f"{column}_broker"] - both[f"{column}_retrysim"]).abs()
        allowed = pd.Series([
            _capped(own * n + moved, figure) for n, moved, figure in zip(
                both["deliveries_retrysim"], both[f"{column}_revived"],
                both[f"{column}_retrysim"], strict=True)
        ], index=both.index)  # fmt: skip
        worst = (differences - allowed).idxmax()
        figures.append(Figure(name, 0, float(differences[worst]), float(allowed[worst])))
    return figures


def duplicates(deliveries: pd.DataFrame) -> int:
    """Deliveries made again with a reconsumeTimes their message had already been delivered
    with: a 4.9 client's second copy (docs/model.md §6), or any the client makes anyway."""
    started = deliveries[deliveries["start_ms"].notna()]
    return int(started.duplicated(["msg_id", "reconsume_times"]).sum())


def timed_figures(staged: pd.DataFrame, run: BrokerRun, policy: Policy) -> list[Figure]:
    """The figures compared within a tolerance (docs/conformance.md): each retry's delay
    (the worst difference over the retries both sides made), the times to commit, the peak
    Ready backlog, the DLQ times and each instance's work."""
    mine = _retry_delays(staged)
    per_retry = retry_tolerance(policy)
    # a retry that waits in a client under a backlog may move by the broker's order too
    moved = per_retry + batch_order_ms(staged, policy)
    theirs = broker_messages(run, policy)
    return [
        Figure("retry delay, worst difference (ms)", 0, _worst(mine, _retry_delays(run.deliveries)),
               _capped(moved, _smallest_delay(staged))),
        *_time_to_commit(staged, run, moved, theirs.index[theirs["state"] == COMMITTED]),
        _ready_backlog(staged, run, per_retry),
        _dlq_times(staged, run, policy, moved),
        *_instances(staged, run, policy),
    ]  # fmt: skip


def exact_figures(staged: pd.DataFrame, run: BrokerRun, policy: Policy) -> list[Figure]:
    """The exact figures of one group: mismatched messages, the DLQ, the puts by topic."""
    mine, theirs = retrysim_messages(staged), broker_messages(run, policy)
    both = mine.join(theirs, how="outer", suffixes=("_retrysim", "_broker"))
    both = both.fillna({"deliveries_retrysim": 0, "deliveries_broker": 0})
    figures = [
        Figure("messages", len(mine), len(theirs)),
        Figure("deliveries per message (mismatches)", 0,
               int((both["deliveries_retrysim"] != both["deliveries_broker"]).sum())),
        Figure("final state per message (mismatches)", 0,
               int((both["state_retrysim"] != both["state_broker"]).sum())),
        Figure("DLQ messages (mismatches)", 0, len(
            set(mine.index[mine["state"] == DEAD]) ^ set(run.dead_letters["msg_id"]))),
        Figure("duplicate deliveries", duplicates(staged), duplicates(run.deliveries)),
    ]  # fmt: skip
    mine_puts = retrysim_puts(staged, policy)
    for topic in sorted((set(mine_puts) | set(run.puts)) - set(pop_bookkeeping(run.puts))):
        figures.append(Figure(f"puts to {topic}", mine_puts.get(topic, 0), run.puts.get(topic, 0)))
    return figures
