"""The event rules compiled: docs/model.md §2-§7 as numba functions the event loops call.

The rules of a :class:`Policy` (whose Spark columns the round engine runs), of a
:class:`ListenerModel` and of the topology, with their strings as small integer codes
(:data:`NAMES`, then a key's topics: :func:`key_names`) and a policy's and a listener's
settings as two arrays (:func:`_scalars`, :func:`_doubles`), so that a loop passes them as
values. Each rule is a function of the delivery it decides; the loops
(:mod:`retrysim.engine.event_loop`) decide when it runs.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from retrysim.model import behavior as listener
from retrysim.model import rng, states
from retrysim.model.behavior import ListenerModel, _Dist
from retrysim.model.policy import Policy
from retrysim.model.topology import AVERAGELY_BY_CIRCLE, BY_MESSAGE, BY_QUEUE
from retrysim.model.xxh64 import uniform
from retrysim.numba_cache import cache_by_source
from retrysim.scenario import limits
from retrysim.tables.schemas import STAGE

cache_by_source(__name__, __loader__, __file__)  # before the first @njit(cache=True)

# --------------------------------------------------------------------------- string codes

# Every string a staged row can hold, as a code; a key's topics follow (TOPICS).
NAMES = (
    states.COMMIT, states.WAITING_RETRY, states.DLQ, states.DISCARD, states.INFLIGHT,
    states.READY, listener.CONSUME_SUCCESS, listener.RECONSUME_LATER, listener.EXCEPTION,
    listener.NULL_RETURN, listener.TIMEOUT, states.REASON_MAX_RECONSUME,
    states.REASON_NEGATIVE_LEVEL, states.REASON_BROADCAST, states.REASON_SEND_BACK_FAILED,
    states.REASON_SEND_BACK_FALLBACK, states.REASON_BEYOND_ACK, states.READY_PUBLISHED,
    states.READY_RETRY_DUE, states.READY_LOCAL, states.READY_VISIBLE, states.READY_REPLAYED,
    states.REASON_NULL_RESULT,
)  # fmt: skip
(COMMIT, WAITING_RETRY, DLQ, DISCARD, INFLIGHT, READY, SUCCESS, LATER, EXCEPTION, NULL_RETURN,
 TIMEOUT, MAX_RECONSUME, NEGATIVE_LEVEL, BROADCAST, SEND_BACK_FAILED_REASON, FALLBACK_REASON,
 BEYOND_ACK, PUBLISHED, RETRY_DUE, LOCAL_RETRY, VISIBLE_AGAIN,
 REPLAYED, NULL_RESULT) = range(len(NAMES))  # fmt: skip
# a key's topics: its source topic, the policy's retry topic, the schedule topic, its DLQ
# topic and the topology's retry topic (whose queues 4.x allocates to instances)
T_SOURCE, T_RETRY, T_SCHEDULE, T_DLQ, T_TOPOLOGY_RETRY = range(len(NAMES), len(NAMES) + 5)
NULL = np.iinfo(np.int64).min

_PATHS = (states.SCHEDULE, states.REVIVE, states.VISIBLE, states.LOCAL, states.NO_RETRY)
P_SCHEDULE, P_REVIVE, P_VISIBLE, P_LOCAL, P_NONE = range(len(_PATHS))
_BALANCING = {BY_QUEUE: 0, BY_MESSAGE: 1}  # anything else: broadcast, instance 0
_DISTS = {"constant": 0, "exponential": 1, "lognormal": 2}
_SEND_BACK_DONE, _SEND_BACK_FALLBACK, _SEND_BACK_FAILED = (
    listener.SEND_BACK_DONE,
    listener.SEND_BACK_FALLBACK,
    listener.SEND_BACK_FAILED,
)

# The policy's scalars, as one int64 array (index names below).
(K_PATH, K_MAX_RETRIES, K_FROM_START, K_AFTER_BACKOFF, K_TIMEOUT, K_PERIODIC, K_TIMEOUT_LEVEL,
 K_TIMEOUT_INTERVAL, K_DLQ_NOW, K_INVISIBLE, K_DLQ_ENABLED, K_HAS_LEVELS, K_HAS_RESEND,
 K_ACK_INDEX, K_PULL, K_READY_WAIT, K_BALANCING, K_INSTANCES, K_THREADS, K_QUEUES, K_BROKERS,
 K_RETRY_QUEUE_NUMS, K_BY_CIRCLE, K_HAS_TOPOLOGY_RETRY, K_RETRY_IS_TOPOLOGY, K_FAIL_FIRST,
 K_HORIZON, K_REPLAY_AT, K_REPLAY_FIXED, K_REPLAY_QUEUES, K_NULL_DLQ, K_REVIVE_LAG,
 K_PULL_THRESHOLD, K_POP_CACHE, K_POP_THREADS, K_LATE_SEND_BACK, K_SIZE) = range(37)  # fmt: skip
# The listener's doubles: base probability, kind and send-back thresholds, base distribution.
# A downstream that answers to load: its capacity (0: none), whether the group's instances
# share it, its timeout (-1: none) and how much of the load beyond capacity it sheds.
(D_PROBABILITY, D_KIND_1, D_KIND_2, D_SEND_BACK_1, D_SEND_BACK_2, D_DIST, D_MEAN, D_MU,
 D_SIGMA, D_CAPACITY, D_PER_GROUP, D_CALL_TIMEOUT, D_SHED, D_REPLAY_RATE, D_CLIENT_WHOLE,
 D_CLIENT_PART, D_SIZE) = range(17)  # fmt: skip
# Output columns: STAGE's, without group and poison_fixed (the row after them, _FIXED_ROW).
_OUT = STAGE.fieldNames()[1:-1]
_WIDTH = len(_OUT)
_FIXED_ROW = _WIDTH  # out's last row: poison_fixed, 0 or 1
_STRING_COLUMNS = {name for name in _OUT if STAGE[name].dataType.simpleString() == "string"}
CHUNK_ROWS = 100_000

# A delivery's fields, one column of the slots array per retry in flight (field-major, so
# that the waiting heaps compare contiguous values).
(S_INDEX, S_DELIVERY, S_RT, S_BROKER_RT, S_TOPIC, S_QUEUE, S_READY, S_REASON, S_ELIGIBLE,
 S_MSG_ID, S_FIXED, S_WITHDRAWN, S_PARENT, S_FIELDS) = range(14)  # fmt: skip
# A message sent back twice numbers its deliveries as they start; until then the first
# delivery of its second copy is ordered as parent + 1 + COPY_ORDER (docs/model.md §6)
COPY_ORDER = 1 << 20

# --------------------------------------------------------------------------- hashed draws

# Spark's XXH64 over (seed, group, stream, msg_id, delivery): retrysim.model.xxh64.uniform


# --------------------------------------------------------------------------- the rules


@njit(cache=True, inline="always")
def _eligible(k, ready):
    due = ready + k[K_READY_WAIT]
    pull = k[K_PULL]
    return due if pull <= 0 else -(-due // pull) * pull


@njit(cache=True)
def _owner(position, queues, instances, by_circle):
    if by_circle or queues <= instances:
        return position % instances
    size = queues // instances
    bigger = queues % instances
    if position < bigger * (size + 1):
        return position // (size + 1)
    return bigger + (position - bigger * (size + 1)) // size


@njit(cache=True, inline="always")
def _on_topology_retry(k, topic):
    """Whether ``topic`` is the topology's retry topic (4.x: %RETRY%<group>)."""
    if k[K_HAS_TOPOLOGY_RETRY] == 0:
        return False
    return topic == T_TOPOLOGY_RETRY or (topic == T_RETRY and k[K_RETRY_IS_TOPOLOGY] == 1)


@njit(cache=True, inline="always")
def _instance(k, topic, queue_id, msg_id, delivery):
    """Topology.instance."""
    if k[K_BALANCING] == 0:
        on_retry = _on_topology_retry(k, topic)
        queues = k[K_BROKERS] * k[K_RETRY_QUEUE_NUMS] if on_retry else k[K_QUEUES]
        return _owner(queue_id, queues, k[K_INSTANCES], k[K_BY_CIRCLE] == 1)
    if k[K_BALANCING] == 1:
        return (msg_id + delivery - 1) % k[K_INSTANCES]
    return 0


@njit(cache=True, inline="always")
def _lane(k, topic, queue_id):
    """The client's process queue a delivery is pulled into, counted against the pull
    threshold (docs/model.md §5): its source queue, or ``K_QUEUES`` + its %RETRY% queue."""
    if _on_topology_retry(k, topic):
        return k[K_QUEUES] + queue_id
    return queue_id


@njit(cache=True)
def lanes(k):
    """How many process queues :func:`_lane` numbers."""
    retry = k[K_BROKERS] * k[K_RETRY_QUEUE_NUMS] if k[K_HAS_TOPOLOGY_RETRY] == 1 else 0
    return k[K_QUEUES] + retry


@njit(cache=True, inline="always")
def _retry_queue(k, topic, queue_id, msg_id, delivery):
    """Topology.retry_queue."""
    if k[K_HAS_TOPOLOGY_RETRY] == 0:
        return 0
    per_broker = k[K_RETRY_QUEUE_NUMS]
    if _on_topology_retry(k, topic):
        broker = queue_id // per_broker
    else:
        broker = queue_id // (k[K_QUEUES] // k[K_BROKERS])
    return broker * per_broker + (msg_id + delivery) % per_broker


@njit(cache=True)
def _sample(kind, mean, mu, sigma, u_a, u_b):
    if kind == 0:
        value = mean
    elif kind == 1:
        value = -mean * math.log(u_a)
    else:
        normal = math.sqrt(-2.0 * math.log(u_a)) * math.cos(2.0 * math.pi * u_b)
        value = math.exp(mu + sigma * normal)
    return np.int64(math.floor(value + 0.5))


@njit(cache=True, inline="always")
def _base_conditions(d):
    """The listener's failure probability and processing distribution outside outages:
    (probability, kind, mean, mu, sigma)."""
    return d[D_PROBABILITY], d[D_DIST], d[D_MEAN], d[D_MU], d[D_SIGMA]


@njit(cache=True)
def _conditions(windows, d, start):
    """:func:`_base_conditions` at ``start`` with the outage ``windows``: the highest
    probability of the windows open then, the last open window's distribution. The loops
    call it once a turn, and only where there are windows (an array a helper takes costs
    a reference count at every call)."""
    found = False
    probability = 0.0
    kind, mean, mu, sigma = d[D_DIST], d[D_MEAN], d[D_MU], d[D_SIGMA]
    for w in range(windows.shape[0]):
        if windows[w, 0] <= start < windows[w, 1]:
            if not found or windows[w, 2] > probability:
                probability = windows[w, 2]
                found = True
            if windows[w, 3] >= 0:
                kind, mean, mu, sigma = windows[w, 3], windows[w, 4], windows[w, 5], windows[w, 6]
    if not found:
        probability = d[D_PROBABILITY]
    return probability, kind, mean, mu, sigma


@njit(cache=True, inline="always")
def _under_load(processing, probability, concurrency, u_fail, capacity, shed, timeout):
    """A call under load (docs/model.md §3): ``(processing_ms, refused)`` for one that would
    take ``processing`` alone, fail on its own with ``probability`` (``u_fail`` its draw)
    and starts with ``concurrency`` calls in flight at the downstream, itself included.
    Beyond the ``capacity`` C, the downstream sheds ``shed x (c - C) / c`` of the calls the
    listener would not fail itself, at once (0 ms), and the others run c / C times longer
    (C calls served at full speed, shared among c: rounded half up in integers); a call
    that would outlast the ``timeout`` (-1: none) fails when it runs out. ``refused``: shed
    or timed out."""
    if concurrency > capacity:
        if shed > 0 and u_fail >= probability:
            excess = shed * (concurrency - capacity) / concurrency
            if u_fail < 1.0 - (1.0 - probability) * (1.0 - excess):
                return np.int64(0), True  # shed at once
        processing = (2 * processing * concurrency + capacity) // (2 * capacity)
    if timeout >= 0 and processing > timeout:
        return np.int64(timeout), True
    return np.int64(processing), False


@njit(cache=True, inline="always")
def _listen(k, d, prefixes, conditions, msg_id, delivery, poisoned, concurrency):
    """What the listener does (docs/model.md §2-§3): (outcome, processing_ms, send_back),
    under ``conditions`` (:func:`_conditions` at the delivery's start) with ``concurrency``
    calls in flight at the downstream, its own included (:func:`_under_load`); the twin
    of the round engine's ``behavior.listener_draw_columns``."""
    probability, kind, mean, mu, sigma = conditions
    u_fail = uniform(prefixes[0], msg_id, delivery)
    u_a = uniform(prefixes[2], msg_id, delivery)
    u_b = uniform(prefixes[3], msg_id, delivery)
    processing = _sample(int(kind), mean, mu, sigma, u_a, u_b)
    refused = False
    capacity = np.int64(d[D_CAPACITY])
    if capacity > 0:
        timeout = np.int64(d[D_CALL_TIMEOUT])
        processing, refused = _under_load(
            processing, probability, concurrency, u_fail, capacity, d[D_SHED], timeout
        )
    fails = poisoned or delivery <= k[K_FAIL_FIRST] or refused or u_fail < probability
    outcome = SUCCESS
    if fails:
        u_kind = uniform(prefixes[1], msg_id, delivery)
        outcome = (
            LATER if u_kind < d[D_KIND_1] else EXCEPTION if u_kind < d[D_KIND_2] else NULL_RETURN
        )
    # the client's own time (behavior.client_time_parts): the thread's, not the call's
    processing += np.int64(d[D_CLIENT_WHOLE])
    if d[D_CLIENT_PART] > 0 and uniform(prefixes[5], msg_id, delivery) < d[D_CLIENT_PART]:
        processing += 1
    send_back = _SEND_BACK_DONE
    if d[D_SEND_BACK_2] > 0:
        u_send_back = uniform(prefixes[4], msg_id, delivery)
        if u_send_back < d[D_SEND_BACK_1]:
            send_back = _SEND_BACK_FAILED
        elif u_send_back < d[D_SEND_BACK_2]:
            send_back = _SEND_BACK_FALLBACK
    return outcome, processing, send_back


@njit(cache=True, inline="always")
def _consume_result(k, start, processing, outcome):
    """The consume result, (outcome, end_ms): the twin of Policy.consume_result_columns."""
    timeout = k[K_TIMEOUT]
    if timeout != NULL:
        if k[K_PERIODIC] == 1:
            leave = timeout * ((start + timeout) // timeout + 1) if timeout else start
        else:
            leave = start + timeout
        if k[K_INVISIBLE] == 1:  # a copy not acked in time stays invisible until revived
            if start + processing > leave:
                return TIMEOUT, leave + k[K_REVIVE_LAG]
            if outcome != SUCCESS:
                return outcome, leave + k[K_REVIVE_LAG]
        if start + processing > leave:
            return TIMEOUT, leave
    return outcome, start + processing


@njit(cache=True)
def _swept(sweeps, lane, leave, timeout, listener_end, listened):
    """A periodic timeout's (outcome, end_ms) under the 4.x cleaner's limit (docs/model.md
    §3): a run sends back at most CLEANER_MESSAGES messages of a process queue, head first, so
    a delivery past that number waits for the next run and is not sent back if its listener
    returns first. ``sweeps[:, lane]`` holds the latest run that sent back some of
    ``lane``'s deliveries and how many; the runs before it that still had them running are
    full (deliveries reach here in the order they started, the queue's order, and a run's
    moment grows with the start). The twin of the reference's cleaner runs."""
    latest, count = sweeps[0, lane], sweeps[1, lane]
    if leave > latest:
        sweeps[0, lane], sweeps[1, lane] = leave, 1
        return TIMEOUT, leave
    if listener_end <= latest:
        return listened, listener_end
    if count < limits.CLEANER_MESSAGES:
        sweeps[1, lane] = count + 1
        return TIMEOUT, latest
    later = latest + timeout
    if listener_end <= later:
        return listened, listener_end
    sweeps[0, lane], sweeps[1, lane] = later, 1
    return TIMEOUT, later


@njit(cache=True)
def _sweep_state(k):
    """:func:`_swept`'s ``sweeps`` for a key: no run yet on any process queue (none where
    the key's timeout is not checked periodically)."""
    return np.full((2, lanes(k) if k[K_PERIODIC] == 1 else 0), -1, np.int64)


@njit(cache=True, inline="always")
def _committed(end, topic, queue_id):
    """_next_step of a success (most deliveries: the loops take it without the rest
    of the rules, whose arrays would cost reference counts at every delivery)."""
    n = NULL
    return (COMMIT, n, n, end, COMMIT, topic, queue_id, SUCCESS, n, n, n, n, n, n, n)


@njit(cache=True, inline="always")
def _next_step(k, intervals, levels, resend_levels, resend_intervals, rt, broker_rt, outcome,
               start, end, send_back, topic, queue_id, msg_id, delivery):  # fmt: skip
    """What follows a settled delivery (docs/model.md §6, docs/flavors.md): Step's 15 fields
    as a tuple (NULL for None), the twin of Policy.next_step_columns."""
    if outcome == SUCCESS:
        return _committed(end, topic, queue_id)
    n = NULL
    timed_out = outcome == TIMEOUT
    path = k[K_PATH]
    unread = path == P_NONE and k[K_TIMEOUT_LEVEL] != NULL
    if path == P_NONE and timed_out and unread:
        level = k[K_TIMEOUT_LEVEL]
        due = end + k[K_TIMEOUT_INTERVAL]
        landed = _retry_queue(k, topic, queue_id, msg_id, delivery)
        return (DISCARD, level, n, due, WAITING_RETRY, T_SCHEDULE, level - 1, outcome, DISCARD,
                T_TOPOLOGY_RETRY, landed, BROADCAST, n, n, n)  # fmt: skip
    if path == P_NONE:
        return (DISCARD, n, n, end, DISCARD, topic, queue_id, BROADCAST, n, n, n, n, n, n, n)
    if send_back == _SEND_BACK_FAILED and not timed_out:
        due = end + limits.SEND_BACK_RESUBMIT_MS
        return (WAITING_RETRY, n, due, n, WAITING_RETRY, topic, queue_id,
                SEND_BACK_FAILED_REASON, n, n, n, n, topic, queue_id, LOCAL_RETRY)  # fmt: skip
    has_resend = k[K_HAS_RESEND] == 1
    fallback = send_back == _SEND_BACK_FALLBACK and not timed_out and has_resend and (
        path == P_SCHEDULE)  # fmt: skip
    if fallback:
        exhausted = rt + 1 >= k[K_MAX_RETRIES]
        reason_now = FALLBACK_REASON
    else:
        exhausted = broker_rt >= k[K_MAX_RETRIES]
        reason_now = outcome
    resent = fallback or (exhausted and has_resend and path == P_LOCAL)
    if resent:
        index = min(rt + 1, len(resend_levels)) - 1
        level, interval = resend_levels[index], resend_intervals[index]
    elif timed_out and k[K_TIMEOUT_INTERVAL] != NULL:
        interval, level = k[K_TIMEOUT_INTERVAL], k[K_TIMEOUT_LEVEL]
    else:
        interval = intervals[min(broker_rt + 1, len(intervals)) - 1]
        level = levels[min(broker_rt + 1, len(levels)) - 1] if k[K_HAS_LEVELS] == 1 else n
    # a 5.x reviver writes the retry (or the copy it dead-letters) after its revive time
    due = (start if k[K_FROM_START] == 1 else end) + interval + k[K_REVIVE_LAG]
    nulled = k[K_NULL_DLQ] == 1 and outcome == NULL_RETURN
    negative = (k[K_DLQ_NOW] == 1 or nulled) and not timed_out and not fallback
    if exhausted or negative:
        reason = MAX_RECONSUME if exhausted else NULL_RESULT if nulled else NEGATIVE_LEVEL
        if k[K_DLQ_ENABLED] == 1:
            state, where_topic, where_queue = DLQ, T_DLQ, limits.DLQ_QUEUE_ID
        else:
            state, where_topic, where_queue = DISCARD, topic, queue_id
        if resent:
            return (state, level, n, due, WAITING_RETRY, T_SCHEDULE, level - 1, reason_now, state,
                    where_topic, where_queue, reason, n, n, n)  # fmt: skip
        if k[K_AFTER_BACKOFF] == 1 and not negative:
            return (state, n, n, due, WAITING_RETRY, topic, queue_id, outcome, state, where_topic,
                    where_queue, reason, n, n, n)  # fmt: skip
        return (state, n, n, end, state, where_topic, where_queue, reason, n, n, n, n, n, n, n)
    if path == P_SCHEDULE:
        wait_topic, wait_queue = T_SCHEDULE, level - 1 if level != n else n
        back_topic = T_RETRY
        back_queue = _retry_queue(k, topic, queue_id, msg_id, delivery)
    elif path == P_REVIVE:
        wait_topic, wait_queue = topic, queue_id
        back_topic, back_queue = T_RETRY, limits.RETRY_QUEUE_ID
    else:
        wait_topic, wait_queue, back_topic, back_queue = topic, queue_id, topic, queue_id
    if k[K_INVISIBLE] == 1:
        return (INFLIGHT, n, due, n, n, n, n, n, n, n, n, n, back_topic, back_queue, RETRY_DUE)
    back_reason = (
        RETRY_DUE if path in (P_SCHEDULE, P_REVIVE)
        else VISIBLE_AGAIN if path == P_VISIBLE else LOCAL_RETRY
    )  # fmt: skip
    return (WAITING_RETRY, level, due, n, WAITING_RETRY, wait_topic, wait_queue, reason_now,
            n, n, n, n, back_topic, back_queue, back_reason)  # fmt: skip


@njit(cache=True, inline="always")
def _settled_step(k, intervals, levels, resend_levels, resend_intervals, slots, slot, outcome,
                  beyond_ack, start, end, send_back):  # fmt: skip
    """The step of the delivery in ``slot`` that ended with ``outcome`` before the horizon:
    :func:`_next_step`, a success beyond ``ack_index`` retried as RECONSUME_LATER with its
    own reason, and a leave after the horizon kept as WaitingRetry (docs/model.md §7)."""
    n = NULL
    step = _next_step(
        k, intervals, levels, resend_levels, resend_intervals, slots[S_RT, slot],
        slots[S_BROKER_RT, slot], LATER if beyond_ack else outcome, start, end, send_back,
        slots[S_TOPIC, slot], slots[S_QUEUE, slot], slots[S_MSG_ID, slot],
        slots[S_DELIVERY, slot],
    )  # fmt: skip
    if beyond_ack and step[7] == LATER:
        step = step[:7] + (BEYOND_ACK,) + step[8:]  # noqa: RUF005 (numba: no * here)
    if step[8] != n and step[3] >= k[K_HORIZON]:  # leaves after the horizon
        kept = (WAITING_RETRY, step[1], step[2], n)
        step = kept + step[4:8] + (n, n, n, n) + step[12:]
    return step


@njit(cache=True, inline="always")
def _next_delivery(k, slots, slot, step):
    """Turn ``slot`` into the delivery its retry ``step`` leads to (the reconsume counts as
    :func:`retrysim.model.policy.next_reconsume_columns` gives them)."""
    rt, broker_rt = slots[S_RT, slot], slots[S_BROKER_RT, slot]
    reason = step[7]
    if reason == SEND_BACK_FAILED_REASON:
        rt, broker_rt = rt + 1, broker_rt
    elif reason == FALLBACK_REASON:
        rt, broker_rt = rt + 1, rt + 1
    else:
        rt, broker_rt = broker_rt + 1, broker_rt + 1
    due = step[2]
    slots[S_PARENT, slot] = slots[S_DELIVERY, slot]
    slots[S_DELIVERY, slot] += 1
    slots[S_RT, slot], slots[S_BROKER_RT, slot] = rt, broker_rt
    slots[S_TOPIC, slot], slots[S_QUEUE, slot] = step[12], step[13]
    slots[S_READY, slot], slots[S_REASON, slot] = due, step[14]
    slots[S_ELIGIBLE, slot] = _eligible(k, due)


# --------------------------------------------------------------------------- second copies


@njit(cache=True)
def _number_waiting(out, first, last, forked):
    """Number the deliveries of messages sent back twice that rows ``first`` to ``last``
    of ``out`` show Ready at the horizon: after the message's last started, in the order
    they became Ready (then as they were ordered), as the reference does."""
    picked = np.empty(last - first, np.int64)
    m = 0
    for r in range(first, last):
        if out[0, r] in forked:
            picked[m] = r
            m += 1
    if m == 0:
        return
    picked = picked[:m]
    for key in (1, 8, 0):  # by (msg_id, ready_ms, delivery): stable sorts, the last key first
        picked = picked[np.argsort(out[key][picked], kind="mergesort")]
    for r in picked:
        parent = out[30, r] if out[30, r] != NULL else out[1, r] - 1
        delivery = forked[out[0, r]] + 1
        forked[out[0, r]] = delivery
        out[1, r] = delivery
        out[30, r] = parent if parent != delivery - 1 else NULL


@njit(cache=True)
def _send_back_again(k, intervals, levels, resend_levels, resend_intervals, slots, slot, copy,
                     listened, at, out, row):  # fmt: skip
    """A 4.9 client's second send-back (docs/model.md §6): the listener of the delivery in
    ``slot``, which the cleaner sent back, returned ``listened`` at ``at``, and
    ``processConsumeResult`` sends the message back again, as a failure's send-back (its RPC
    taken to succeed, as the cleaner's is). Writes the copy's columns into row ``row`` of
    ``out``; where the copy is retried before the horizon, fills ``copy`` with its delivery
    and returns True."""
    n = NULL
    step = _next_step(
        k, intervals, levels, resend_levels, resend_intervals, slots[S_RT, slot],
        slots[S_BROKER_RT, slot], LATER if listened == SUCCESS else listened, at, at,
        _SEND_BACK_DONE, slots[S_TOPIC, slot], slots[S_QUEUE, slot], slots[S_MSG_ID, slot],
        slots[S_DELIVERY, slot],
    )  # fmt: skip
    waits = step[0] == WAITING_RETRY
    out[31, row], out[32, row], out[33, row], out[34, row] = step[0], at, step[5], step[6]
    out[35, row], out[36, row] = step[1], step[2] if waits else n
    if not waits or step[2] >= k[K_HORIZON]:
        return False
    slots[:, copy] = slots[:, slot]
    _next_delivery(k, slots, copy, step)
    slots[S_DELIVERY, copy] += COPY_ORDER
    return True


# --------------------------------------------------------------------------- the Python side


def key_names(policy: Policy) -> list[str]:
    """The strings of a key's rows by their codes: :data:`NAMES`, then its topics
    (``T_SOURCE`` to ``T_TOPOLOGY_RETRY``). A string that is two topics has two codes; a
    string read in takes the first."""
    return [*NAMES, policy.topic, policy.retry_topic, limits.SCHEDULE_TOPIC, policy.dlq_topic,
            policy.topology.retry_topic]  # fmt: skip


# The stream of a 5.x instance's receives: whether the broker's pop reads the retry topic
# first, drawn over (instance, receive number) (docs/model.md §5).
POP_STREAM = "pop_receive"


def key_prefixes(seed: int, group: str) -> np.ndarray:
    """The hashed draws' key prefixes of a group's delivery streams (DELIVERY_STREAMS order),
    as :func:`_listen` takes them, then the receives' (:data:`POP_STREAM`)."""
    streams = (*listener.DELIVERY_STREAMS, POP_STREAM)
    return np.array([rng.key_prefix(seed, group, s) for s in streams], dtype=np.uint64)


class Listener:
    """A group's compiled listener called from Python, one delivery at a time: what
    :func:`_listen` decides with the loop's own hashed draws, the outcome by name (the
    conformance harness's outcome file; the tests)."""

    def __init__(self, behavior, seed: int, group: str, client_time: bool = True) -> None:
        """``client_time=False``: the listener's own time alone, without the client's
        (``behavior.client_overhead``): a real client adds its own."""
        self.d, self.windows = _doubles(ListenerModel(behavior))
        if not client_time:
            self.d[D_CLIENT_WHOLE] = self.d[D_CLIENT_PART] = 0.0
        self.k = np.full(K_SIZE, NULL, np.int64)
        self.k[K_FAIL_FIRST] = behavior.fail_first
        self.prefixes = key_prefixes(seed, group)
        self.key = (seed, group, behavior.poison_fraction)

    def poisoned(self, msg_ids: np.ndarray) -> np.ndarray:
        """Which of ``msg_ids`` are the group's poison messages."""
        return listener.poisoned(*self.key[:2], msg_ids, self.key[2])

    def __call__(
        self, msg_id: int, delivery: int, start_ms: int, poisoned: bool, concurrency: int = 1
    ) -> tuple[str, int, int]:
        """(outcome, processing_ms, send_back) of a delivery started at ``start_ms`` with
        ``concurrency`` calls in flight at the downstream."""
        conditions = _conditions(self.windows, self.d, start_ms)
        outcome, processing, send_back = _listen(
            self.k, self.d, self.prefixes, conditions, msg_id, delivery, poisoned, concurrency
        )
        return NAMES[outcome], int(processing), int(send_back)


def _scalars(policy: Policy, behavior, horizon_ms: int) -> np.ndarray:
    topology = policy.topology
    k = np.full(K_SIZE, NULL, np.int64)

    def given(value):
        return NULL if value is None else int(value)

    k[K_PATH] = _PATHS.index(policy.retry_path)
    k[K_MAX_RETRIES] = policy.max_retries
    k[K_FROM_START] = policy.from_start
    k[K_AFTER_BACKOFF] = policy.leave_after_backoff
    k[K_TIMEOUT] = given(policy.timeout_ms)
    k[K_PERIODIC] = policy.periodic_timeout
    k[K_LATE_SEND_BACK] = policy.may_send_back_twice(listener.longest_processing_ms(behavior))
    k[K_TIMEOUT_LEVEL] = given(policy.timeout_level)
    k[K_TIMEOUT_INTERVAL] = given(policy.timeout_interval_ms)
    k[K_DLQ_NOW] = policy.dlq_now
    k[K_NULL_DLQ] = policy.null_dead_letters
    k[K_INVISIBLE] = policy.invisible_until_retry
    k[K_REVIVE_LAG] = policy.revive_lag_ms
    # the client's cache per queue binds only where deliveries can wait for a thread
    capped = policy.pull_threshold is not None and topology.threads is not None
    k[K_PULL_THRESHOLD] = policy.pull_threshold if capped else NULL
    # a 5.x client's receives: a push instance's into its cache; a simple consumer's one a
    # thread, so its cache is its threads
    finite = topology.threads is not None
    k[K_POP_THREADS] = policy.pops_per_thread
    k[K_POP_CACHE] = NULL
    if finite and policy.pops_per_thread:
        k[K_POP_CACHE] = topology.threads
    elif finite and policy.pop_cache is not None:
        k[K_POP_CACHE] = policy.pop_cache
    k[K_DLQ_ENABLED] = policy.dlq_enabled
    k[K_HAS_LEVELS] = policy.levels is not None
    k[K_HAS_RESEND] = policy.resend_levels is not None
    k[K_ACK_INDEX] = given(policy.ack_index)
    k[K_PULL] = policy.pull_interval_ms
    k[K_READY_WAIT] = policy.ready_wait_ms
    k[K_BALANCING] = _BALANCING.get(topology.balancing, 2)
    k[K_INSTANCES] = topology.instances
    k[K_THREADS] = given(topology.threads)
    k[K_QUEUES] = topology.queues
    k[K_BROKERS] = topology.brokers
    k[K_RETRY_QUEUE_NUMS] = topology.retry_queue_nums
    k[K_BY_CIRCLE] = topology.allocate == AVERAGELY_BY_CIRCLE
    k[K_HAS_TOPOLOGY_RETRY] = topology.retry_topic is not None
    k[K_RETRY_IS_TOPOLOGY] = policy.retry_topic == topology.retry_topic
    k[K_FAIL_FIRST] = behavior.fail_first
    k[K_HORIZON] = horizon_ms
    return k


def _dist_row(dist: _Dist) -> tuple[float, float, float, float]:
    return float(_DISTS[dist.kind]), dist.mean, dist.mu, dist.sigma


def _doubles(model: ListenerModel) -> tuple[np.ndarray, np.ndarray]:
    d = np.zeros(D_SIZE)
    d[D_PROBABILITY] = model.base_probability
    d[D_KIND_1], d[D_KIND_2] = model.kind_thresholds
    d[D_SEND_BACK_1], d[D_SEND_BACK_2] = model.send_back_thresholds
    d[D_DIST : D_SIGMA + 1] = _dist_row(model.base_dist)
    d[D_CLIENT_WHOLE], d[D_CLIENT_PART] = model.client_time
    downstream = model.downstream
    if downstream is not None:
        d[D_CAPACITY] = downstream.capacity
        d[D_PER_GROUP] = downstream.shared
        d[D_CALL_TIMEOUT] = -1 if downstream.timeout is None else downstream.timeout
        d[D_SHED] = downstream.shed
    windows = np.full((len(model.windows), 7), -1.0)
    for row, (start, end, probability, dist) in enumerate(model.windows):
        windows[row, :3] = start, end, probability
        if dist is not None:
            windows[row, 3:] = _dist_row(dist)
    return d, windows


def _table(values) -> np.ndarray:
    return np.asarray(values if values is not None else (0,), dtype=np.int64)
