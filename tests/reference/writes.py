"""Commit-log writes of a reference run, counted from the broker's source, not from retrysim's.

Each rule names the Java method whose ``putMessage`` it counts (apache/rocketmq: the 4.x
broker at tag ``rocketmq-all-4.9.7``, the 5.x broker and proxy at ``8fc57f1``; the gRPC push
client of apache/rocketmq-clients at ``da8271b``), and reads the reference simulator's
attempt rows and group settings, never retrysim's tables or code. The engine's load table
must count the same writes in the same buckets.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from reference.simulator import _group_config

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


ACK_TIME_INTERVAL = 1000  # PopAckConstants.ackTimeInterval


def timer_put(now: int, deliver_ms: int, put_at: int | None = None) -> list[int]:
    """``HookUtils.handleScheduleMessage``/``transformTimerMessage`` (line 195): a message
    whose ``TIMER_DELIVER_MS`` is still ahead goes to ``rmq_sys_wheel_timer`` now, and the
    timer wheel puts it on its real topic when it is due (``TimerMessageStore``); else it is
    put once, now. The wheel's 1 s slots are not modelled: the second put is taken at
    ``put_at`` (default: when it is due)."""
    return [now, deliver_ms if put_at is None else put_at] if deliver_ms > now else [now]


def checkpoint_put(now: int, revive_ms: int) -> list[int]:
    """``buildCkMsg`` (line 945) and ``ChangeInvisibleTimeProcessor`` (line 327): a checkpoint
    is due ``ackTimeInterval`` before its revive time; retrysim places its second put at the
    revive time."""
    return timer_put(now, revive_ms - ACK_TIME_INTERVAL, put_at=revive_ms)


def _pop_writes(cfg: Any, a: dict, steps: dict[str, tuple]) -> list[int]:
    """5.x unordered pop consumption with the broker's defaults (``enablePopBufferMerge =
    false``: every checkpoint and ack is a message in the revive topic)."""
    invisible = cfg.receive_invisible or cfg.timeout
    start, end = a["start_ms"], a["end_ms"]
    if start is None:
        return []
    end_state = steps["end"][0] if "end" in steps else None
    # PopMessageProcessor.appendCheckPoint -> buildCkMsg: revive when visible again
    writes = checkpoint_put(start, start + invisible)
    if end_state == "Commit":
        # AckMessageProcessor.appendAck: setDeliverTimeMs(popTime + invisibleTime)
        writes += timer_put(end, start + invisible)
    elif cfg.kind == "after_backoff" and end_state == "WaitingRetry" and a["outcome"] != "TIMEOUT":
        # the push client's nackMessage: changeInvisibleDuration(retryPolicy delay); the
        # broker's appendCheckPointThenAckOrigin: a checkpoint due after that delay, then
        # ackOrigin (due when the original would have been visible again)
        writes += checkpoint_put(end, end + cfg.interval_of(a["reconsume_times"] + 1))
        writes += timer_put(end, start + invisible)
    gone = [at for state, at, *_ in steps.values() if state in ("DLQ", "Discard")]
    if gone:
        # PopReviveService.reviveRetry copies the message to the retry topic (no DLQ test
        # there); the next pop (a checkpoint) gets it, the proxy's filter says TO_DLQ,
        # forwardMessageToDeadLetterQueue re-sends it (the DLQ put, counted by the caller)
        # and acks the popped copy
        moved = gone[0]
        writes += [moved, *checkpoint_put(moved, moved + invisible)]
        writes += timer_put(moved, moved + invisible)
    return writes


def delivery_writes(cfg: Any, a: dict, steps: dict[str, tuple]) -> list[int]:
    """The moments of one delivery's commit-log puts: ``a`` its attempt row, ``steps`` its
    transitions by step (ready, start, end, leave) as (state, at_ms, topic, reason)."""
    writes = []
    state, at, _, reason = steps["ready"]
    if reason in ("published", "replayed", "retry_due"):
        # SendMessageProcessor (a producer's send, a replay's re-send), the schedule
        # service's DeliverDelayedMessageTimerTask to %RETRY%, or PopReviveService.reviveRetry
        writes.append(at)
    for step in ("end", "leave"):
        if step not in steps:
            continue
        state, at, topic, reason = steps[step]
        if state == "WaitingRetry" and topic == SCHEDULE_TOPIC:
            # CommitLog.asyncPutMessage of a send-back (or a re-send) with a delay level
            writes.append(at)
        # the %DLQ% put, or the schedule service's put of an expired broadcast message to a
        # %RETRY% topic nobody subscribes (a failed one is dropped by the client: no put)
        expired = step == "leave" and state == "Discard" and reason == "broadcast_no_retry"
        if state == "DLQ" or expired:
            writes.append(at)
    if cfg.path == "revive" and cfg.kind in ("after_backoff", "invisible") and not cfg.blocking:
        writes += _pop_writes(cfg, a, steps)
    return writes


STEP_NAMES = {1: "ready", 2: "start", 3: "end", 4: "leave"}


def writes_per_bucket(
    scenario: dict, reference: dict[str, list[dict]], bucket_ms: int
) -> dict[tuple[str, int], int]:
    """(group, bucket start) -> commit-log writes before the horizon, for buckets with any,
    of a reference run (:func:`reference.simulator.simulate_scenario`)."""
    configs = {g["name"]: _group_config(scenario, g) for g in scenario["groups"]}
    steps: dict[tuple, dict[str, tuple]] = {}
    for t in reference["transitions"]:
        name = STEP_NAMES[(t["seq"] - 1) % 4 + 1]
        key = (t["group"], t["msg_id"], t["delivery"])
        steps.setdefault(key, {})[name] = (t["state"], t["at_ms"], t["topic"], t["reason"])
    counts: Counter = Counter()
    for a in reference["attempts"]:
        cfg = configs[a["group"]]
        key = (a["group"], a["msg_id"], a["delivery"])
        for t in delivery_writes(cfg, a, steps[key]):
            if t is not None and t < cfg.horizon:
                counts[(a["group"], t // bucket_ms * bucket_ms)] += 1
    return dict(counts)


def busiest_second(scenario: dict, reference: dict[str, list[dict]]) -> dict[str, int]:
    """group -> the most commit-log writes in one second before the horizon."""
    seconds = writes_per_bucket(scenario, reference, 1000)
    busiest: dict[str, int] = {}
    for (group, _), n in seconds.items():
        busiest[group] = max(busiest.get(group, 0), n)
    return busiest
