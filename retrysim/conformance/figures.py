"""The figures compared exactly between retrysim and a broker (docs/conformance.md): per
message, the deliveries and the final state; the DLQ's messages; the commit-log puts by topic.

A per-message figure is one row: its mismatches (retrysim 0, the broker the count that
differs). The broker's side comes from the harness's records
(:class:`~retrysim.conformance.harness.BrokerRun`), retrysim's from the event loop's staged
rows of the same group and messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from retrysim.conformance.harness import BrokerRun
from retrysim.model.behavior import CONSUME_SUCCESS
from retrysim.model.states import COMMIT, DLQ, READY_PUBLISHED, READY_RETRY_DUE, WAITING_RETRY
from retrysim.scenario import limits

COMMITTED, DEAD, PENDING = "commit", "dlq", "pending"
# A retry's delay on the broker may exceed its level's by one pass of the schedule service's
# timer over an empty level (ScheduleMessageService.DELAY_FOR_A_WHILE, 100 ms in 4.9.7), and
# by the commit log's dispatch, the long poll's wake-up and the listener's call on loopback.
SCHEDULE_POLL_MS = 100
LOOPBACK_MS = 50
RETRY_DELAY_TOLERANCE_MS = SCHEDULE_POLL_MS + LOOPBACK_MS


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
    state = last["result_state"].map({COMMIT: COMMITTED, DLQ: DEAD}).fillna(PENDING)
    deliveries = started.groupby("msg_id")["delivery"].max()
    return pd.DataFrame({"deliveries": deliveries, "state": state}).fillna({"deliveries": 0})


def broker_messages(run: BrokerRun) -> pd.DataFrame:
    """Per message: the deliveries the broker made and where the message ended."""
    rows = run.deliveries.sort_values(["msg_id", "delivery"])
    last = rows.groupby("msg_id").tail(1).set_index("msg_id")
    state = (last["outcome"] == CONSUME_SUCCESS).map({True: COMMITTED, False: PENDING})
    state[state.index.isin(run.dead_letters["msg_id"])] = DEAD
    return pd.DataFrame({"deliveries": rows.groupby("msg_id").size(), "state": state})


def retrysim_puts(staged: pd.DataFrame) -> dict[str, int]:
    """The commit-log puts by topic that retrysim's rows make (docs/flavors.md, commit-log
    writes, 4.x concurrently): each copy Ready on a topic (published, or a retry the
    schedule topic delivered), each send-back into the schedule topic, each dead letter."""
    puts: dict[str, int] = {}

    def add(topics: pd.Series) -> None:
        for topic, count in topics.value_counts().items():
            puts[topic] = puts.get(topic, 0) + int(count)

    add(staged.loc[staged["ready_reason"].isin([READY_PUBLISHED, READY_RETRY_DUE]), "source_topic"])
    waiting = staged["end_state"] == WAITING_RETRY
    add(staged.loc[waiting & (staged["end_topic"] == limits.SCHEDULE_TOPIC), "end_topic"])
    add(staged.loc[staged["end_state"] == DLQ, "end_topic"])
    add(staged.loc[staged["leave_state"] == DLQ, "leave_topic"])
    return puts


def _retry_delays(rows: pd.DataFrame) -> pd.Series:
    """Each retry's delay, from the end of one delivery to the start of the next, by
    (msg_id, delivery)."""
    started = rows[rows["start_ms"].notna()].sort_values(["msg_id", "delivery"])
    before = started.groupby("msg_id")["end_ms"].shift()
    delays = (started["start_ms"] - before)[before.notna()]
    keys = started.loc[delays.index, ["msg_id", "delivery"]]
    return pd.Series(delays.to_numpy(float), index=pd.MultiIndex.from_frame(keys))


def timed_figures(staged: pd.DataFrame, run: BrokerRun) -> list[Figure]:
    """The figures compared within a tolerance (docs/conformance.md): so far each retry's
    delay, as the worst difference between the two sides over the retries both made."""
    mine, theirs = _retry_delays(staged), _retry_delays(run.deliveries)
    both = mine.to_frame("retrysim").join(theirs.to_frame("broker"), how="inner")
    worst = float((both["broker"] - both["retrysim"]).abs().max()) if len(both) else 0.0
    # never wider than 20 % of the smallest delay (so within half of it): a broker later than
    # that is a difference of the model, not of the tolerance
    smallest = float(mine.min()) if len(mine) else float("inf")
    tolerance = min(RETRY_DELAY_TOLERANCE_MS, 0.2 * smallest)
    return [Figure("retry delay, worst difference (ms)", 0, worst, tolerance)]


def exact_figures(staged: pd.DataFrame, run: BrokerRun) -> list[Figure]:
    """The exact figures of one group: mismatched messages, the DLQ, the puts by topic."""
    mine, theirs = retrysim_messages(staged), broker_messages(run)
    both = mine.join(theirs, how="outer", lsuffix="_retrysim", rsuffix="_broker")
    both = both.fillna({"deliveries_retrysim": 0, "deliveries_broker": 0})
    figures = [
        Figure("messages", len(mine), len(theirs)),
        Figure("deliveries per message (mismatches)", 0,
               int((both["deliveries_retrysim"] != both["deliveries_broker"]).sum())),
        Figure("final state per message (mismatches)", 0,
               int((both["state_retrysim"] != both["state_broker"]).sum())),
        Figure("DLQ messages (mismatches)", 0, len(
            set(mine.index[mine["state"] == DEAD]) ^ set(run.dead_letters["msg_id"]))),
    ]  # fmt: skip
    mine_puts = retrysim_puts(staged)
    for topic in sorted(set(mine_puts) | set(run.puts)):
        figures.append(Figure(f"puts to {topic}", mine_puts.get(topic, 0), run.puts.get(topic, 0)))
    return figures
