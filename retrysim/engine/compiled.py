"""The event engine compiled: docs/model.md §5-§7, in numba.

A full consumer pool is the regime capacity planning exists for, and simulating it is a
loop over single deliveries that Python runs at about 15k a second. This module runs the
same loop as compiled code inside the Spark task: the same events, the same hashed draws
(Spark's XXH64 over ``(seed, group, stream, msg_id, delivery)``), the same rules
(:meth:`Policy.next_step`, :class:`ListenerModel` and the topology, with their strings as
small integer codes), so it gives the rows of the plain-Python loop
(:class:`~retrysim.engine.sequential._Simulation`), which the tests hold it to with zero
tolerance, and both are compared with the reference written from the RocketMQ source.

It covers every group: every flavor's rules, every topology, outages, poison and a replay.
``_run`` takes one message per consume request, with a fast path for first deliveries, runs
a group's units (docs/model.md §5) and finishes a round run's frontier; ``_run_lanes`` takes
batches of one lane and ordered queues, one message at a time per queue, where a replayed
delivery waits for its queue and takes back a later first delivery the queue released but
that is not eligible yet (the Python loop's rule). A loop is a
generator: a key's rows leave in chunks, and between chunks it reports how far it got for
the heartbeat. numba caches the compiled code on disk, keyed by the source
(:mod:`retrysim.numba_cache`), so only the first run on a machine pays the compilation (setup
does it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit, types
from numba.np.unsafe.ndarray import to_fixed_tuple
from numba.typed import Dict, List

from retrysim.model import behavior as listener
from retrysim.model import rng, states
from retrysim.model.behavior import ListenerModel, _Dist
from retrysim.model.policy import Policy, policy_for
from retrysim.model.topology import AVERAGELY_BY_CIRCLE, BY_MESSAGE, BY_QUEUE
from retrysim.model.xxh64 import uniform
from retrysim.numba_cache import cache_by_source
from retrysim.scenario import limits
from retrysim.scenario.loading import load_scenario
from retrysim.tables.schemas import STAGE, STAGE_ARROW

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
)  # fmt: skip
(COMMIT, WAITING_RETRY, DLQ, DISCARD, INFLIGHT, READY, SUCCESS, LATER, EXCEPTION, NULL_RETURN,
 TIMEOUT, MAX_RECONSUME, NEGATIVE_LEVEL, BROADCAST, SEND_BACK_FAILED_REASON, FALLBACK_REASON,
 BEYOND_ACK, PUBLISHED, RETRY_DUE, LOCAL_RETRY, VISIBLE_AGAIN,
 REPLAYED) = range(len(NAMES))  # fmt: skip
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
 K_HORIZON, K_REPLAY_AT, K_REPLAY_FIXED, K_REPLAY_QUEUES, K_SIZE) = range(31)  # fmt: skip
# The listener's doubles: base probability, kind and send-back thresholds, base distribution.
# A downstream that answers to load: its capacity (0: none), whether the group's instances
# share it, its timeout (-1: none) and how much of the load beyond capacity it sheds.
(D_PROBABILITY, D_KIND_1, D_KIND_2, D_SEND_BACK_1, D_SEND_BACK_2, D_DIST, D_MEAN, D_MU,
 D_SIGMA, D_CAPACITY, D_PER_GROUP, D_CALL_TIMEOUT, D_SHED, D_REPLAY_RATE,
 D_SIZE) = range(15)  # fmt: skip
# Output columns: STAGE's, without group and poison_fixed (the row after them, _FIXED_ROW).
_OUT = STAGE.fieldNames()[1:-1]
_WIDTH = len(_OUT)
_FIXED_ROW = _WIDTH  # out's last row: poison_fixed, 0 or 1
_STRING_COLUMNS = {name for name in _OUT if STAGE[name].dataType.simpleString() == "string"}
CHUNK_ROWS = 100_000
_TURNS_PER_LOOK = 1 << 15  # loop turns between reports to the heartbeat

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
def _listen(k, d, prefixes, conditions, msg_id, delivery, poisoned, concurrency):
    """ListenerModel.result: (outcome, processing_ms, send_back), under ``conditions``
    (:func:`_conditions` at the delivery's start) with ``concurrency`` calls in flight at
    the downstream, its own included (behavior.under_load, the same arithmetic)."""
    probability, kind, mean, mu, sigma = conditions
    u_fail = uniform(prefixes[0], msg_id, delivery)
    u_a = uniform(prefixes[2], msg_id, delivery)
    u_b = uniform(prefixes[3], msg_id, delivery)
    processing = _sample(int(kind), mean, mu, sigma, u_a, u_b)
    refused = False
    capacity = np.int64(d[D_CAPACITY])
    if capacity > 0:
        if concurrency > capacity:
            if d[D_SHED] > 0 and u_fail >= probability:
                excess = d[D_SHED] * (concurrency - capacity) / concurrency
                if u_fail < 1.0 - (1.0 - probability) * (1.0 - excess):
                    processing, refused = 0, True  # shed at once
            if not refused:
                processing = (2 * processing * concurrency + capacity) // (2 * capacity)
        timeout = np.int64(d[D_CALL_TIMEOUT])
        if timeout >= 0 and processing > timeout:
            processing, refused = timeout, True
    fails = poisoned or delivery <= k[K_FAIL_FIRST] or refused or u_fail < probability
    outcome = SUCCESS
    if fails:
        u_kind = uniform(prefixes[1], msg_id, delivery)
        outcome = (
            LATER if u_kind < d[D_KIND_1] else EXCEPTION if u_kind < d[D_KIND_2] else NULL_RETURN
        )
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
    """Policy.consume_result: (outcome, end_ms)."""
    timeout = k[K_TIMEOUT]
    if timeout != NULL:
        if k[K_PERIODIC] == 1:
            leave = timeout * ((start + timeout) // timeout + 1) if timeout else start
        else:
            leave = start + timeout
        if start + processing > leave:
            return TIMEOUT, leave
        if k[K_INVISIBLE] == 1 and outcome != SUCCESS:
            return outcome, leave
    return outcome, start + processing


@njit(cache=True, inline="always")
def _committed(end, topic, queue_id):
    """Policy.next_step of a success (most deliveries: the loops take it without the rest
    of the rules, whose arrays would cost reference counts at every delivery)."""
    n = NULL
    return (COMMIT, n, n, end, COMMIT, topic, queue_id, SUCCESS, n, n, n, n, n, n, n)


@njit(cache=True, inline="always")
def _next_step(k, intervals, levels, resend_levels, resend_intervals, rt, broker_rt, outcome,
               start, end, send_back, topic, queue_id, msg_id, delivery):  # fmt: skip
    """Policy.next_step, as a tuple of Step's 15 fields (NULL for None)."""
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
    due = (start if k[K_FROM_START] == 1 else end) + interval
    negative = k[K_DLQ_NOW] == 1 and not timed_out and not fallback
    if exhausted or negative:
        reason = MAX_RECONSUME if exhausted else NEGATIVE_LEVEL
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


# --------------------------------------------------------------------------- heaps


@njit(cache=True, inline="always")
def _before(a, b, eligible, order_id, delivery):
    """Whether waiting slot a starts before slot b: (eligible_ms, msg_id, delivery)."""
    if eligible[a] != eligible[b]:
        return eligible[a] < eligible[b]
    if order_id[a] != order_id[b]:
        return order_id[a] < order_id[b]
    return delivery[a] < delivery[b]


@njit(cache=True, inline="always")
def _wait_push(heap, size, slot, eligible, order_id, delivery):
    if size == len(heap):
        bigger = np.empty(2 * len(heap), np.int64)
        bigger[:size] = heap[:size]
        heap = bigger
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if not _before(slot, heap[parent], eligible, order_id, delivery):
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = slot
    return heap


@njit(cache=True, inline="always")
def _wait_pop(heap, size, eligible, order_id, delivery):
    top = heap[0]
    size -= 1
    last = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _before(heap[child + 1], heap[child], eligible, order_id, delivery):
            child += 1
        if not _before(heap[child], last, eligible, order_id, delivery):
            break
        heap[i] = heap[child]
        i = child
    if size > 0:
        heap[i] = last
    return top


@njit(cache=True, inline="always")
def _event_push(keys, values, size, key, value):
    """Push (key, value) on the event heap, which has room (returning no array: numba
    counts a reference each time an array is returned and assigned, an atomic operation)."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if keys[parent] <= key:
            break
        keys[i], values[i] = keys[parent], values[parent]
        i = parent
    keys[i], values[i] = key, value


@njit(cache=True, inline="always")
def _event_pop(keys, values, size):
    value = values[0]
    size -= 1
    last_key, last_value = keys[size], values[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and keys[child + 1] < keys[child]:
            child += 1
        if keys[child] >= last_key:
            break
        keys[i], values[i] = keys[child], values[child]
        i = child
    if size > 0:
        keys[i], values[i] = last_key, last_value
    return value


@njit(cache=True)
def _grow(array):
    bigger = np.empty((2 * array.shape[0], *array.shape[1:]), array.dtype)
    bigger[: array.shape[0]] = array
    return bigger


# --------------------------------------------------------------------------- the loop

# A delivery's fields, one column of the slots array per retry in flight (field-major, so
# that the waiting heaps compare contiguous values).
(S_INDEX, S_DELIVERY, S_RT, S_BROKER_RT, S_TOPIC, S_QUEUE, S_READY, S_REASON, S_ELIGIBLE,
 S_MSG_ID, S_FIXED, S_WITHDRAWN, S_FIELDS) = range(13)  # fmt: skip
_FREE_PHASE, _ELIGIBLE_PHASE = 0, 1
# An instance in a unit's loop: run by it, run by the retry owners' unit (a retry due
# there is exported), or by any other (a retry due there breaks the partition).
MEMBER, EXPORTED, ELSEWHERE = 1, 0, -1


@njit(cache=True)
def _wider(out):
    """``out`` with twice the rows' room (a turn can write more than the chunk's slack)."""
    bigger = np.empty((out.shape[0], 2 * out.shape[1]), np.int64)
    bigger[:, : out.shape[1]] = out
    return bigger


@njit(cache=True)
def _buffers():
    """A loop's growing arrays at their first sizes: the slots, the spare slots, the event
    heap's keys and values, and a chunk's rows."""
    return (
        np.empty((S_FIELDS, 1024), np.int64),
        np.empty(1024, np.int64),
        np.empty(1024, np.int64),
        np.empty(1024, np.int64),
        np.empty((_WIDTH + 1, CHUNK_ROWS + 1024), np.int64),
    )


@njit(cache=True)
def _grow_slots(slots):
    bigger = np.empty((S_FIELDS, 2 * slots.shape[1]), np.int64)
    bigger[:, : slots.shape[1]] = slots
    return bigger


@njit(cache=True, inline="always")
def _row(out, n, k, born, slots, slot, start, processing, end, outcome, step, batch):
    """Write staged row ``n`` (STAGE's columns but group and poison_fixed, one row of
    ``out`` per column, so that each becomes a frame's column without a copy); ``out`` has
    room for it (the callers grow it with :func:`_wider`, so that no array is returned on
    the way of every row)."""
    instance = _instance(k, slots[S_TOPIC, slot], slots[S_QUEUE, slot], slots[S_MSG_ID, slot],
                         slots[S_DELIVERY, slot])  # fmt: skip
    _row_at(out, n, instance, born, slots, slot, start, processing, end, outcome, step, batch)


@njit(cache=True, inline="always")
def _row_at(out, n, instance, born, slots, slot, start, processing, end, outcome, step, batch):
    """:func:`_row` of a delivery that ``instance`` runs: straight-line code, so that numba
    drops the reference counts of its arrays (it pairs them within a block)."""
    out[0, n], out[1, n] = slots[S_MSG_ID, slot], slots[S_DELIVERY, slot]
    out[2, n], out[3, n] = slots[S_RT, slot], slots[S_BROKER_RT, slot]
    out[4, n], out[5, n] = slots[S_TOPIC, slot], slots[S_QUEUE, slot]
    out[6, n] = instance
    out[7, n], out[8, n] = born[slots[S_INDEX, slot]], slots[S_READY, slot]
    out[9, n], out[10, n], out[11, n] = slots[S_REASON, slot], start, processing
    out[12, n], out[13, n], out[18, n] = end, outcome, batch
    out[14, n], out[15, n], out[16, n], out[17, n] = step[0], step[1], step[2], step[3]
    out[19, n], out[20, n], out[21, n], out[22, n] = step[4], step[5], step[6], step[7]
    out[23, n], out[24, n], out[25, n], out[26, n] = step[8], step[9], step[10], step[11]
    out[27, n], out[28, n], out[29, n] = step[12], step[13], step[14]
    out[_FIXED_ROW, n] = slots[S_FIXED, slot]


@njit(cache=True, inline="always")
def _push_eligible(keys, values, size, slots, slot):
    """The event of ``slot``'s delivery becoming eligible (the heap has room); returns the
    heap's new size."""
    _event_push(keys, values, size, 2 * slots[S_ELIGIBLE, slot] + _ELIGIBLE_PHASE, slot)
    return size + 1


@njit(cache=True, inline="always")
def _take_slot(slots, spare, spare_count, used):
    """A free slot: a spare one, else the next unused (the callers grow the arrays when
    both are used up); returns (spare_count, used, slot)."""
    if spare_count > 0:
        return spare_count - 1, used, spare[spare_count - 1]
    return spare_count, used + 1, used


@njit(cache=True, inline="always")
def _next_delivery(k, slots, slot, step):
    """Turn ``slot`` into the delivery its retry ``step`` leads to (the reconsume counts as
    :func:`retrysim.model.policy.next_reconsume_times` gives them)."""
    rt, broker_rt = slots[S_RT, slot], slots[S_BROKER_RT, slot]
    reason = step[7]
    if reason == SEND_BACK_FAILED_REASON:
        rt, broker_rt = rt + 1, broker_rt
    elif reason == FALLBACK_REASON:
        rt, broker_rt = rt + 1, rt + 1
    else:
        rt, broker_rt = broker_rt + 1, broker_rt + 1
    due = step[2]
    slots[S_DELIVERY, slot] += 1
    slots[S_RT, slot], slots[S_BROKER_RT, slot] = rt, broker_rt
    slots[S_TOPIC, slot], slots[S_QUEUE, slot] = step[12], step[13]
    slots[S_READY, slot], slots[S_REASON, slot] = due, step[14]
    slots[S_ELIGIBLE, slot] = _eligible(k, due)


@njit(cache=True, inline="always")
def _first_delivery(slots, slot, position, msg_ids, queue_ids, born, eligible):
    """Fill ``slot`` with the first delivery of the message at ``position``."""
    slots[S_INDEX, slot], slots[S_DELIVERY, slot] = position, 1
    slots[S_RT, slot], slots[S_BROKER_RT, slot] = 0, 0
    slots[S_TOPIC, slot], slots[S_QUEUE, slot] = T_SOURCE, queue_ids[position]
    slots[S_READY, slot], slots[S_REASON, slot] = born[position], PUBLISHED
    slots[S_ELIGIBLE, slot], slots[S_MSG_ID, slot] = eligible, msg_ids[position]
    slots[S_FIXED, slot], slots[S_WITHDRAWN, slot] = 0, 0


@njit(cache=True)
def _arrivals(k, msg_ids, queue_ids, born, count):
    """First deliveries per instance in the order they start: (eligible_ms, instance) of
    each position, positions grouped by instance (each group in (eligible_ms, msg_id)
    order) and where each instance's group begins. First deliveries are most of the work
    and arrive in that order, so they wait in a queue, not in the heap."""
    instance = np.empty(count, np.int64)
    eligible = np.empty(count, np.int64)
    for p in range(count):
        instance[p] = _instance(k, T_SOURCE, queue_ids[p], msg_ids[p], 1)
        eligible[p] = _eligible(k, born[p])
    order = np.arange(count)
    p = 0
    while p < count:  # one pull tick makes messages born apart eligible together
        q = p + 1
        while q < count and eligible[q] == eligible[p]:
            q += 1
        if q - p > 1:
            run = order[p:q].copy()
            order[p:q] = run[np.argsort(msg_ids[run], kind="mergesort")]
        p = q
    starts = np.zeros(k[K_INSTANCES] + 1, np.int64)
    for p in range(count):
        starts[instance[p] + 1] += 1
    starts = np.cumsum(starts)
    # grouped by instance, each group in the order above: a counting sort (stable, linear)
    grouped = np.empty(count, np.int64)
    fill = starts[:-1].copy()
    for p in order:
        grouped[fill[instance[p]]] = p
        fill[instance[p]] += 1
    return eligible, instance, grouped, starts


_PENDING = (READY,) + (NULL,) * 14


@njit(cache=True)
def _pending(out, rows, k, born, slots, event_keys, event_values, events, heaps, sizes):
    """Rows of the deliveries Ready before the horizon that never started: those whose
    eligible moment is still an event, and those waiting in ``heaps`` (docs/model.md §7)."""
    n = NULL
    for e in range(events):
        slot = event_values[e]
        if (event_keys[e] & 1 == _ELIGIBLE_PHASE and slots[S_READY, slot] < k[K_HORIZON]
                and slots[S_WITHDRAWN, slot] == 0):  # fmt: skip
            if rows == out.shape[1]:
                out = _wider(out)
            _row(out, rows, k, born, slots, slot, n, n, n, n, _PENDING, n)
            rows += 1
    for which in range(len(heaps)):
        heap = heaps[which]
        for h in range(sizes[which]):
            if rows == out.shape[1]:
                out = _wider(out)
            _row(out, rows, k, born, slots, heap[h], n, n, n, n, _PENDING, n)
            rows += 1
    return out, rows


@njit(cache=True)
def _replay_order(now, dead, dead_count):
    """docs/model.md §8: the dead letters a replay at ``now`` re-publishes, those already in
    the DLQ, in the order they reached it (then by msg_id), as columns of ``dead``."""
    chosen = np.empty(dead_count, np.int64)
    m = 0
    for i in range(dead_count):
        if dead[0, i] < now:
            chosen[m] = i
            m += 1
    chosen = chosen[:m]
    chosen = chosen[np.argsort(dead[1][chosen], kind="mergesort")]
    return chosen[np.argsort(dead[0][chosen], kind="mergesort")]


@njit(cache=True, inline="always")
def _replayed(k, ready, rank, dead, i, slots, slot):
    """Fill ``slot`` with the replay's ``rank``-th delivery (of the dead letter ``i``): the
    next delivery of its message on the source topic, queue ``rank % queues``, Ready at
    ``ready``; the poison fixed where the replay says so."""
    slots[S_INDEX, slot], slots[S_DELIVERY, slot] = dead[2, i], dead[3, i] + 1
    slots[S_RT, slot], slots[S_BROKER_RT, slot] = 0, 0
    slots[S_TOPIC, slot], slots[S_QUEUE, slot] = T_SOURCE, rank % k[K_REPLAY_QUEUES]
    slots[S_READY, slot], slots[S_REASON, slot] = ready, REPLAYED
    slots[S_ELIGIBLE, slot], slots[S_MSG_ID, slot] = _eligible(k, ready), dead[1, i]
    slots[S_FIXED, slot], slots[S_WITHDRAWN, slot] = k[K_REPLAY_FIXED], 0


@njit(cache=True)
def _replay(k, d, now, dead, dead_count, slots, spare, spare_count, used, event_keys,
            event_values, events):  # fmt: skip
    """The replay at ``now`` (:func:`_replay_order`) where deliveries need no lane: each
    replayed delivery an eligible event, ``rate`` a second. The caller made room for a slot
    and an event each. Returns (events, spare_count, used)."""
    chosen = _replay_order(now, dead, dead_count)
    for rank in range(len(chosen)):
        ready = now + np.int64(rank * 1000.0 / d[D_REPLAY_RATE])
        if ready >= k[K_HORIZON]:
            break
        spare_count, used, slot = _take_slot(slots, spare, spare_count, used)
        _replayed(k, ready, rank, dead, chosen[rank], slots, slot)
        events = _push_eligible(event_keys, event_values, events, slots, slot)
    return events, spare_count, used


@njit(cache=True)
def _release(k, now, lane, cursor, queue_end, by_queue, eligible_of, msg_ids, queue_ids, born,
             replays, replay_sizes, lane_busy, released, slots, spare, spare_count, used,
             event_keys, event_values, events):  # fmt: skip
    """An ordered queue (``lane``) is free at ``now``: the smaller of its next message in
    publish order (born_ms, msg_id) and its first replayed delivery (ready_ms, msg_id)
    becomes eligible, or the queue is idle. The caller made room for a slot and an event.
    Returns (events, spare_count, used)."""
    original = cursor[lane] < queue_end[lane]
    replayed = replay_sizes[lane] > 0
    if replayed and original:
        top, position = replays[lane][0], by_queue[cursor[lane]]
        replayed = slots[S_READY, top] < born[position] or (
            slots[S_READY, top] == born[position] and slots[S_MSG_ID, top] < msg_ids[position]
        )  # fmt: skip
    if replayed:
        slot = _wait_pop(replays[lane], replay_sizes[lane], slots[S_READY], slots[S_MSG_ID],
                         slots[S_DELIVERY])  # fmt: skip
        replay_sizes[lane] -= 1
        slots[S_ELIGIBLE, slot] = max(_eligible(k, slots[S_READY, slot]), now)
    elif original:
        position = by_queue[cursor[lane]]
        cursor[lane] += 1
        spare_count, used, slot = _take_slot(slots, spare, spare_count, used)
        _first_delivery(slots, slot, position, msg_ids, queue_ids, born,
                        max(eligible_of[position], now))  # fmt: skip
    else:
        lane_busy[lane] = False
        return events, spare_count, used
    lane_busy[lane] = True
    released[lane] = slot
    events = _push_eligible(event_keys, event_values, events, slots, slot)
    return events, spare_count, used


@njit(cache=True)
def _turns(k_array, d_array, windows, prefix_array, intervals, levels, resend_levels,
           resend_intervals, msg_ids, queue_ids, born, poisoned, count, member, eligible,
           first_instance, order, taken, arrived, free, busy, touched, touched_list, heaps,
           sizes, slots, spare, event_keys, event_values, out, state, dead):  # fmt: skip
    """:func:`_run`'s turns, until a chunk is full, every so many turns, the end, or a turn
    that might not fit its arrays; returns (the simulated moment, _CHUNK, _DONE or _ROOM).
    No array is replaced in here: numba counts references (atomic operations) to an array
    variable at every merge of the loop's paths where it may have been replaced; with the
    arrays grown inside the loop, those counts were most of its time. It counts
    them too for each array a helper takes across blocks (inlined or not), so the rules
    come as tuples and the per-delivery helpers are straight-line code or take scalars;
    the retries' rules, the waiting heaps and the event heap still take arrays. The caller
    grows the arrays on _ROOM and calls again; ``state`` holds the scalars between calls
    (:data:`_STATE`); ``busy`` the calls in flight per instance and in all (the last),
    counted for a downstream that answers to load; ``dead`` the moves to the DLQ before the
    replay (docs/model.md §8), as (reaches the DLQ, msg_id, position, delivery) columns."""
    n = NULL
    k = to_fixed_tuple(k_array, K_SIZE)
    d = to_fixed_tuple(d_array, D_SIZE)
    prefixes = to_fixed_tuple(prefix_array, 5)
    horizon = k[K_HORIZON]
    threads = k[K_THREADS]
    ack_index = k[K_ACK_INDEX]
    acked_later = ack_index != n and ack_index < 0  # a success is retried (docs/model.md §7)
    base = _base_conditions(d)
    loaded = d[D_CAPACITY] > 0
    per_group = d[D_PER_GROUP] > 0
    everyone = k[K_INSTANCES]  # busy's entry for the whole group
    next_arrival, deliveries, first = state[_NEXT_ARRIVAL], state[_DELIVERIES], state[_FIRST]
    turns, events, spare_count = state[_TURNS], state[_EVENTS], state[_SPARE_COUNT]
    used, rows = state[_USED], state[_ROWS]
    dead_count = state[_DEAD]
    replay_at = k[K_REPLAY_AT] if state[_REPLAYED] == 0 else n
    touched_count = 0
    now = horizon
    status = _CHUNK
    pool = k[K_INSTANCES] * threads if threads != n else n
    while True:
        arrival = eligible[next_arrival] if next_arrival < count else n
        event = event_keys[0] >> 1 if events > 0 else n
        if arrival == n and event == n and replay_at == n:
            status = _DONE
            break
        now = horizon
        for moment in (arrival, event, replay_at):
            if moment != n and moment < now:
                now = moment
        if now >= horizon:
            status = _DONE
            break
        replaying = now == replay_at
        # the most deliveries this turn can start: the pool, or on an unlimited one what
        # becomes eligible now (nothing waits past a turn there); each takes a slot, writes
        # a row and pushes two events at most. The turn runs only with room for that, so
        # that no array is replaced inside the loop (_turns' docstring)
        most = pool
        if most == n:
            p = next_arrival
            while p < count and eligible[p] == now:
                p += 1
            # the events of deliveries (a loaded group's calls in flight are events too)
            most = events - (busy[everyone] if loaded else 0) + p - next_arrival
        if replaying:  # each dead letter a slot and an event, and started this turn
            most += 2 * dead_count
        if (rows + most > out.shape[1] or events + 2 * most > len(event_keys)
                or spare_count + slots.shape[1] - used < most):  # fmt: skip
            status = _ROOM
            state[_MOST] = most
            break
        conditions = base if windows.shape[0] == 0 else _conditions(windows, d, now)
        while events > 0 and event_keys[0] == 2 * now + _FREE_PHASE:
            instance = _event_pop(event_keys, event_values, events)
            events -= 1
            if threads != n:
                free[instance] += 1
            if loaded:
                busy[instance] -= 1
                busy[everyone] -= 1
            if not touched[instance]:
                touched[instance] = True
                touched_list[touched_count] = instance
                touched_count += 1
        while next_arrival < count and eligible[next_arrival] == now:
            instance = first_instance[next_arrival]
            next_arrival += 1
            if member[instance] != MEMBER:
                continue  # another unit's
            arrived[instance] += 1
            if not touched[instance]:
                touched[instance] = True
                touched_list[touched_count] = instance
                touched_count += 1
        for again in range(2):  # again: the replayed deliveries eligible at once
            while events > 0 and event_keys[0] == 2 * now + _ELIGIBLE_PHASE:
                slot = _event_pop(event_keys, event_values, events)
                events -= 1
                instance = _instance(k, slots[S_TOPIC, slot], slots[S_QUEUE, slot],
                                     slots[S_MSG_ID, slot], slots[S_DELIVERY, slot])  # fmt: skip
                heaps[instance] = _wait_push(
                    heaps[instance], sizes[instance], slot, slots[S_ELIGIBLE], slots[S_MSG_ID],
                    slots[S_DELIVERY],
                )  # fmt: skip
                sizes[instance] += 1
                if not touched[instance]:
                    touched[instance] = True
                    touched_list[touched_count] = instance
                    touched_count += 1
            if again or not replaying:
                break
            events, spare_count, used = _replay(
                k, d, now, dead, dead_count, slots, spare, spare_count, used, event_keys,
                event_values, events,
            )  # fmt: skip
            dead_count, replay_at, replaying = 0, n, False
            state[_REPLAYED] = 1
        # dispatch: each touched instance starts what waits while it has a free thread, in
        # (eligible_ms, msg_id, delivery) order over its queue of first deliveries and its
        # heap of retries; in instance order where they share a downstream (each call
        # counts the ones started before it)
        if per_group and touched_count > 1:
            touched_list[:touched_count].sort()
        for t in range(touched_count):
            instance = touched_list[t]
            touched[instance] = False
            heap = heaps[instance]
            while free[instance] > 0:
                queued = taken[instance] < arrived[instance]
                if not queued and sizes[instance] == 0:
                    break
                if queued and sizes[instance] > 0:
                    position, top = order[taken[instance]], heap[0]
                    queued = eligible[position] < slots[S_ELIGIBLE, top] or (
                        eligible[position] == slots[S_ELIGIBLE, top]
                        and msg_ids[position] < slots[S_MSG_ID, top]
                    )  # fmt: skip
                if queued:
                    position = order[taken[instance]]
                    taken[instance] += 1
                    spare_count, used, slot = _take_slot(slots, spare, spare_count, used)
                    _first_delivery(slots, slot, position, msg_ids, queue_ids, born,
                                    eligible[position])  # fmt: skip
                else:
                    slot = _wait_pop(heap, sizes[instance], slots[S_ELIGIBLE], slots[S_MSG_ID],
                                     slots[S_DELIVERY])  # fmt: skip
                    sizes[instance] -= 1
                index = slots[S_INDEX, slot]
                msg_id, delivery = slots[S_MSG_ID, slot], slots[S_DELIVERY, slot]
                concurrency = (busy[everyone] if per_group else busy[instance]) + 1
                outcome, processing, send_back = _listen(
                    k,
                    d,
                    prefixes,
                    conditions,
                    msg_id,
                    delivery,
                    poisoned[index] and slots[S_FIXED, slot] == 0,
                    concurrency,
                )
                outcome, end = _consume_result(k, now, processing, outcome)
                deliveries += 1
                if delivery == 1:
                    first += 1
                if threads != n:
                    free[instance] -= 1
                if loaded:
                    busy[instance] += 1
                    busy[everyone] += 1
                if threads != n or loaded:
                    _event_push(
                        event_keys,
                        event_values,
                        events,
                        2 * (now + processing) + _FREE_PHASE,
                        instance,
                    )
                    events += 1
                if end >= horizon:
                    step = (INFLIGHT, n, n, n, n, n, n, n, n, n, n, n, n, n, n)
                    _row_at(out, rows, instance, born, slots, slot, now, processing, n, n, step, 1)
                    rows += 1
                    spare[spare_count] = slot
                    spare_count += 1
                    continue
                if outcome == SUCCESS and not acked_later:
                    step = _committed(end, slots[S_TOPIC, slot], slots[S_QUEUE, slot])
                else:
                    beyond_ack = outcome == SUCCESS and acked_later
                    step = _settled_step(
                        k, intervals, levels, resend_levels, resend_intervals, slots, slot,
                        outcome, beyond_ack, now, end, send_back,
                    )  # fmt: skip
                _row_at(
                    out, rows, instance, born, slots, slot, now, processing, end, outcome, step, 1
                )
                rows += 1
                if step[0] == DLQ and replay_at != n:  # a dead letter the replay may re-send
                    dead[0, dead_count], dead[1, dead_count] = step[3], msg_id
                    dead[2, dead_count], dead[3, dead_count] = index, delivery
                    dead_count += 1
                due = step[2]
                if (step[0] == WAITING_RETRY or step[0] == INFLIGHT) and due != n and due < horizon:
                    _next_delivery(k, slots, slot, step)  # the slot carries it
                    goes_to = member[_instance(k, step[12], step[13], msg_id, delivery + 1)]
                    if goes_to != MEMBER:
                        if goes_to != EXPORTED:
                            raise ValueError("a retry went to an instance outside the units")
                        spare[spare_count] = slot  # the retry owners' unit takes it
                        spare_count += 1
                        continue
                    events = _push_eligible(event_keys, event_values, events, slots, slot)
                else:
                    spare[spare_count] = slot
                    spare_count += 1
        touched_count = 0
        turns += 1
        if rows >= CHUNK_ROWS or turns % _TURNS_PER_LOOK == 0:
            break
    state[_NEXT_ARRIVAL], state[_DELIVERIES], state[_FIRST] = next_arrival, deliveries, first
    state[_TURNS], state[_EVENTS], state[_SPARE_COUNT] = turns, events, spare_count
    state[_USED], state[_ROWS], state[_DEAD] = used, rows, dead_count
    return now, status


# _turns' scalars between calls, and what it returns for
(_NEXT_ARRIVAL, _DELIVERIES, _FIRST, _TURNS, _EVENTS, _SPARE_COUNT, _USED, _ROWS, _MOST,
 _DEAD, _REPLAYED, _STATE) = range(12)  # fmt: skip
_CHUNK, _DONE, _ROOM = range(3)


@njit(cache=True)
def _run(k, d, windows, prefixes, intervals, levels, resend_levels, resend_intervals, msg_ids,
         queue_ids, born, poisoned, count, member, imports):  # fmt: skip
    """One key's event loop; yields (rows, row count, simulated ms, deliveries, first
    deliveries) when a chunk is full and every so many turns (for the heartbeat).

    ``member`` (per instance) makes it a unit's loop (docs/model.md §5, "Units"): only the
    instances marked MEMBER run; a retry due at an EXPORTED one leaves the unit (its row
    says where it went, and the retry owners' unit takes it from there); one due anywhere
    else is a broken partition and stops the loop. ``imports`` (S_FIELDS x retries) are
    the retries other units sent this one, Ready from their ``S_READY``."""
    n = NULL
    horizon = k[K_HORIZON]
    instances = k[K_INSTANCES]
    threads = k[K_THREADS]
    eligible, first_instance, order, starts = _arrivals(k, msg_ids, queue_ids, born, count)
    taken = starts[:-1].copy()  # per instance: its next first delivery to start
    arrived = starts[:-1].copy()  # and the end of those eligible so far
    free = np.full(instances, threads if threads != n else np.iinfo(np.int64).max, np.int64)
    busy = np.zeros(instances + 1, np.int64)
    touched = np.zeros(instances, np.bool_)
    touched_list = np.empty(instances, np.int64)
    heaps = List()  # per instance: retries waiting for a thread
    sizes = np.zeros(instances, np.int64)
    for _ in range(instances):
        heaps.append(np.empty(16, np.int64))
    slots, spare, event_keys, event_values, out = _buffers()
    spare_count, used, events, rows = 0, 0, 0, 0
    for i in range(imports.shape[1]):
        if spare_count == 0 and used == slots.shape[1]:
            slots, spare = _grow_slots(slots), _grow(spare)
        spare_count, used, slot = _take_slot(slots, spare, spare_count, used)
        slots[:, slot] = imports[:, i]
        instance = _instance(k, slots[S_TOPIC, slot], slots[S_QUEUE, slot],
                             slots[S_MSG_ID, slot], slots[S_DELIVERY, slot])  # fmt: skip
        if member[instance] != MEMBER:
            raise ValueError("a retry was sent to a unit that does not run its instance")
        if events == len(event_keys):
            event_keys, event_values = _grow(event_keys), _grow(event_values)
        events = _push_eligible(event_keys, event_values, events, slots, slot)
    state = np.zeros(_STATE, np.int64)
    state[_EVENTS], state[_SPARE_COUNT], state[_USED] = events, spare_count, used
    # a message reaches the DLQ at most once before the replay, which is the only one
    dead = np.empty((4, len(msg_ids) if k[K_REPLAY_AT] != n else 0), np.int64)
    while True:
        now, status = _turns(
            k, d, windows, prefixes, intervals, levels, resend_levels, resend_intervals,
            msg_ids, queue_ids, born, poisoned, count, member, eligible, first_instance, order,
            taken, arrived, free, busy, touched, touched_list, heaps, sizes, slots, spare,
            event_keys, event_values, out, state, dead,
        )  # fmt: skip
        if status == _DONE:
            break
        if status == _ROOM:  # grow what the next turn might not fit
            most = state[_MOST]
            while state[_ROWS] + most > out.shape[1]:
                out = _wider(out)
            while state[_SPARE_COUNT] + slots.shape[1] - state[_USED] < most:
                slots, spare = _grow_slots(slots), _grow(spare)
            while state[_EVENTS] + 2 * most > len(event_keys):
                event_keys, event_values = _grow(event_keys), _grow(event_values)
            continue
        yield out, state[_ROWS], now, state[_DELIVERIES], state[_FIRST]
        state[_ROWS] = 0
    rows, events = state[_ROWS], state[_EVENTS]
    deliveries, first = state[_DELIVERIES], state[_FIRST]
    # what is Ready before the horizon and never started (docs/model.md §7)
    out, rows = _pending(out, rows, k, born, slots, event_keys, event_values, events, heaps, sizes)
    scratch = np.empty((S_FIELDS, 1), np.int64)
    for instance in range(instances):
        if member[instance] != MEMBER:
            continue
        for j in range(taken[instance], starts[instance + 1]):
            position = order[j]
            _first_delivery(scratch, 0, position, msg_ids, queue_ids, born, eligible[position])
            if rows == out.shape[1]:
                out = _wider(out)
            _row(out, rows, k, born, scratch, 0, n, n, n, n, _PENDING, n)
            rows += 1
            if rows >= CHUNK_ROWS:
                yield out, rows, horizon, deliveries, first
                rows = 0
    yield out, rows, horizon, deliveries, first


# --------------------------------------------------------------------------- lanes

# A consume request takes deliveries from one lane, (topic, queue, instance): batches of
# up to N from the same lane, and an ordered queue serves one message at a time. This loop
# keeps each lane's waits in a heap and each instance's lane heads in a heap of
# (eligible_ms, msg_id, delivery, lane) rows, stale rows skipped (a head that left in an
# earlier batch): :class:`retrysim.engine.sequential._Simulation`'s dispatch, compiled.


@njit(cache=True)
def _head_before(heads, a, b):
    for column in range(3):
        if heads[a, column] != heads[b, column]:
            return heads[a, column] < heads[b, column]
    return heads[a, 3] < heads[b, 3]


@njit(cache=True)
def _head_push(heads, size, eligible, msg_id, delivery, lane):
    if size == heads.shape[0]:
        bigger = np.empty((2 * size, 4), np.int64)
        bigger[:size] = heads
        heads = bigger
    heads[size, 0], heads[size, 1], heads[size, 2], heads[size, 3] = (
        eligible, msg_id, delivery, lane,
    )  # fmt: skip
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if not _head_before(heads, i, parent):
            break
        for column in range(4):
            heads[i, column], heads[parent, column] = heads[parent, column], heads[i, column]
        i = parent
    return heads


@njit(cache=True)
def _head_pop(heads, size):
    """Remove the smallest row (to the caller: read row 0 first)."""
    size -= 1
    for column in range(4):
        heads[0, column] = heads[size, column]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _head_before(heads, child + 1, child):
            child += 1
        if not _head_before(heads, child, i):
            break
        for column in range(4):
            heads[i, column], heads[child, column] = heads[child, column], heads[i, column]
        i = child


@njit(cache=True)
def _lane_key(topic, queue_id, instance):
    """(topic, queue, instance) as one int64: topic codes below 32, queue ids below 2**38,
    instances below 2**20 (limits: at most 100,000 instances)."""
    return (topic << 58) | (queue_id << 20) | instance


@njit(cache=True)
def _run_lanes(k, d, windows, prefixes, intervals, levels, resend_levels, resend_intervals,
               msg_ids, queue_ids, born, poisoned, count, batch_size, blocking):  # fmt: skip
    """:func:`_run` for consume requests that take up to ``batch_size`` deliveries of one
    lane, and for ordered queues (``blocking``: a queue releases its next message, in
    publish order or a replayed one, when the one before left it). Yields as :func:`_run`."""
    n = NULL
    horizon = k[K_HORIZON]
    instances = k[K_INSTANCES]
    threads = k[K_THREADS]
    ack_index = k[K_ACK_INDEX]
    base = _base_conditions(d)
    loaded = d[D_CAPACITY] > 0
    per_group = d[D_PER_GROUP] > 0
    free = np.full(instances, threads if threads != n else np.iinfo(np.int64).max, np.int64)
    busy = np.zeros(instances, np.int64)  # calls in flight, for a downstream under load
    busy_all = 0
    touched = np.zeros(instances, np.bool_)
    touched_list = np.empty(instances, np.int64)
    touched_count = 0
    heads = List()
    head_sizes = np.zeros(instances, np.int64)
    for _ in range(instances):
        heads.append(np.empty((16, 4), np.int64))
    wait_ids = Dict.empty(key_type=types.int64, value_type=types.int64)
    waits = List()
    wait_sizes = np.zeros(16, np.int64)
    slots, spare, event_keys, event_values, out = _buffers()
    spare_count, used, events, rows = 0, 0, 0, 0
    deliveries = 0
    first = 0
    turns = 0
    eligible_of = np.empty(count, np.int64)
    for p in range(count):
        eligible_of[p] = _eligible(k, born[p])
    # ordered queues: each source queue's messages in publish order, released one by one
    queue_ids_used = np.unique(queue_ids[:count]) if blocking else np.empty(0, np.int64)
    if blocking and k[K_REPLAY_AT] != n:  # a replay re-publishes to any of the queues
        every = np.arange(k[K_REPLAY_QUEUES], dtype=np.int64)
        queue_ids_used = np.unique(np.concatenate((queue_ids_used, every)))
    order_ids = Dict.empty(key_type=types.int64, value_type=types.int64)
    by_queue = (
        np.argsort(queue_ids[:count], kind="mergesort") if blocking else np.empty(0, np.int64)
    )
    queue_start = np.searchsorted(queue_ids[:count][by_queue], queue_ids_used)
    queue_end = np.append(queue_start[1:], len(by_queue))
    cursor = queue_start.copy()
    for lane in range(len(queue_ids_used)):
        order_ids[(T_SOURCE << 40) | queue_ids_used[lane]] = lane
    # per ordered queue: its replayed deliveries waiting for it (by ready_ms, msg_id), whether
    # it holds a released message, and the slot it released last
    replays = List()
    for _ in range(len(queue_ids_used)):
        replays.append(np.empty(4, np.int64))
    replay_sizes = np.zeros(len(queue_ids_used), np.int64)
    lane_busy = np.zeros(len(queue_ids_used), np.bool_)
    released = np.full(len(queue_ids_used), -1, np.int64)
    batch = np.empty(max(batch_size, 1), np.int64)
    outcomes = np.empty(max(batch_size, 1), np.int64)
    sends = np.empty(max(batch_size, 1), np.int64)
    next_arrival = 0 if not blocking else count
    replay_at = k[K_REPLAY_AT]
    # a message reaches the DLQ at most once before the replay, which is the only one
    dead = np.empty((4, len(msg_ids) if replay_at != n else 0), np.int64)
    dead_count = 0
    for lane in range(len(queue_ids_used)):  # every ordered queue is free at 0
        if events == len(event_keys):
            event_keys, event_values = _grow(event_keys), _grow(event_values)
        _event_push(event_keys, event_values, events, _FREE_PHASE, lane)
        events += 1
    while True:
        arrival = eligible_of[next_arrival] if next_arrival < count else n
        event = event_keys[0] >> 1 if events > 0 else n
        if arrival == n and event == n and replay_at == n:
            break
        now = horizon
        for moment in (arrival, event, replay_at):
            if moment != n and moment < now:
                now = moment
        if now >= horizon:
            break
        replaying = now == replay_at
        conditions = base if windows.shape[0] == 0 else _conditions(windows, d, now)
        while events > 0 and event_keys[0] == 2 * now + _FREE_PHASE:
            payload = _event_pop(event_keys, event_values, events)
            events -= 1
            if payload < 0:
                instance = -1 - payload
                if threads != n:
                    free[instance] += 1
                if loaded:
                    busy[instance] -= 1
                    busy_all -= 1
                if not touched[instance]:
                    touched[instance] = True
                    touched_list[touched_count] = instance
                    touched_count += 1
                continue
            # an ordered queue is free: its next message becomes eligible
            if spare_count == 0 and used == slots.shape[1]:
                slots, spare = _grow_slots(slots), _grow(spare)
            if events == len(event_keys):
                event_keys, event_values = _grow(event_keys), _grow(event_values)
            events, spare_count, used = _release(
                k, now, payload, cursor, queue_end, by_queue, eligible_of, msg_ids, queue_ids,
                born, replays, replay_sizes, lane_busy, released, slots, spare, spare_count,
                used, event_keys, event_values, events,
            )  # fmt: skip
        # what becomes eligible now waits in its lane: first deliveries (unordered), then
        # the events; at the replay's moment, then the replayed deliveries eligible at once
        while True:
            slot = -1
            if replaying and not (
                (next_arrival < count and eligible_of[next_arrival] == now)
                or (events > 0 and event_keys[0] == 2 * now + _ELIGIBLE_PHASE)
            ):
                while events + dead_count > len(event_keys):
                    event_keys, event_values = _grow(event_keys), _grow(event_values)
                while spare_count + slots.shape[1] - used < 2 * dead_count:
                    slots, spare = _grow_slots(slots), _grow(spare)
                if not blocking:
                    events, spare_count, used = _replay(
                        k, d, now, dead, dead_count, slots, spare, spare_count, used,
                        event_keys, event_values, events,
                    )  # fmt: skip
                else:  # each replayed delivery waits for its ordered queue
                    chosen = _replay_order(now, dead, dead_count)
                    for rank in range(len(chosen)):
                        ready = now + np.int64(rank * 1000.0 / d[D_REPLAY_RATE])
                        if ready >= horizon:
                            break
                        spare_count, used, slot = _take_slot(slots, spare, spare_count, used)
                        _replayed(k, ready, rank, dead, chosen[rank], slots, slot)
                        lane = order_ids[(T_SOURCE << 40) | slots[S_QUEUE, slot]]
                        replays[lane] = _wait_push(
                            replays[lane], replay_sizes[lane], slot, slots[S_READY],
                            slots[S_MSG_ID], slots[S_DELIVERY],
                        )  # fmt: skip
                        replay_sizes[lane] += 1
                        # a first delivery the queue released but not eligible yet, published
                        # after this one, is taken back: the queue serves Ready order
                        r = released[lane]
                        later = r >= 0 and (
                            slots[S_READY, r] > ready
                            or (slots[S_READY, r] == ready
                                and slots[S_MSG_ID, r] > slots[S_MSG_ID, slot])
                        )  # fmt: skip
                        if (later and lane_busy[lane] and slots[S_REASON, r] == PUBLISHED
                                and slots[S_ELIGIBLE, r] > now):  # fmt: skip
                            slots[S_WITHDRAWN, r] = 1
                            cursor[lane] -= 1
                            lane_busy[lane] = False
                            released[lane] = -1
                        if not lane_busy[lane]:
                            events, spare_count, used = _release(
                                k, now, lane, cursor, queue_end, by_queue, eligible_of,
                                msg_ids, queue_ids, born, replays, replay_sizes, lane_busy,
                                released, slots, spare, spare_count, used, event_keys,
                                event_values, events,
                            )  # fmt: skip
                dead_count, replay_at, replaying = 0, n, False
                continue
            if next_arrival < count and eligible_of[next_arrival] == now:
                if spare_count == 0 and used == slots.shape[1]:
                    slots, spare = _grow_slots(slots), _grow(spare)
                spare_count, used, slot = _take_slot(slots, spare, spare_count, used)
                _first_delivery(slots, slot, next_arrival, msg_ids, queue_ids, born, now)
                next_arrival += 1
            elif events > 0 and event_keys[0] == 2 * now + _ELIGIBLE_PHASE:
                slot = _event_pop(event_keys, event_values, events)
                events -= 1
                if slots[S_WITHDRAWN, slot]:  # taken back by a replay: released again later
                    spare[spare_count] = slot
                    spare_count += 1
                    continue
            else:
                break
            instance = _instance(k, slots[S_TOPIC, slot], slots[S_QUEUE, slot],
                                 slots[S_MSG_ID, slot], slots[S_DELIVERY, slot])  # fmt: skip
            key = _lane_key(slots[S_TOPIC, slot], slots[S_QUEUE, slot], instance)
            if key in wait_ids:
                wait = wait_ids[key]
            else:
                wait = len(waits)
                wait_ids[key] = wait
                waits.append(np.empty(4, np.int64))
                if wait == len(wait_sizes):
                    wait_sizes = np.concatenate((wait_sizes, np.zeros(wait, np.int64)))
            heap = waits[wait]
            size = wait_sizes[wait]
            top = heap[0] if size > 0 else -1
            new_head = size == 0 or _before(slot, top, slots[S_ELIGIBLE], slots[S_MSG_ID],
                                            slots[S_DELIVERY])  # fmt: skip
            waits[wait] = _wait_push(heap, size, slot, slots[S_ELIGIBLE], slots[S_MSG_ID],
                                     slots[S_DELIVERY])  # fmt: skip
            wait_sizes[wait] = size + 1
            if new_head:
                heads[instance] = _head_push(
                    heads[instance], head_sizes[instance], slots[S_ELIGIBLE, slot],
                    slots[S_MSG_ID, slot], slots[S_DELIVERY, slot], wait,
                )  # fmt: skip
                head_sizes[instance] += 1
                if not touched[instance]:
                    touched[instance] = True
                    touched_list[touched_count] = instance
                    touched_count += 1
        # dispatch: each touched instance starts the lane with the smallest head while it
        # has a free thread, a batch of that lane's waits in order (in instance order where
        # they share a downstream)
        if per_group and touched_count > 1:
            touched_list[:touched_count].sort()
        for t in range(touched_count):
            instance = touched_list[t]
            touched[instance] = False
            while head_sizes[instance] > 0 and free[instance] > 0:
                own = heads[instance]
                key_e, key_m, key_d, wait = own[0, 0], own[0, 1], own[0, 2], own[0, 3]
                _head_pop(own, head_sizes[instance])
                head_sizes[instance] -= 1
                heap = waits[wait]
                size = wait_sizes[wait]
                if size == 0:
                    continue
                top = heap[0]
                if (slots[S_ELIGIBLE, top] != key_e or slots[S_MSG_ID, top] != key_m
                        or slots[S_DELIVERY, top] != key_d):  # fmt: skip
                    continue  # a stale head: that delivery left in an earlier batch
                taken = min(batch_size, size)
                for j in range(taken):
                    batch[j] = _wait_pop(heap, size, slots[S_ELIGIBLE], slots[S_MSG_ID],
                                         slots[S_DELIVERY])  # fmt: skip
                    size -= 1
                wait_sizes[wait] = size
                if size > 0:
                    top = heap[0]
                    heads[instance] = _head_push(
                        heads[instance], head_sizes[instance], slots[S_ELIGIBLE, top],
                        slots[S_MSG_ID, top], slots[S_DELIVERY, top], wait,
                    )  # fmt: skip
                    head_sizes[instance] += 1
                # the consume request: each member's listener, one processing time
                processing = 0
                failing = SUCCESS
                concurrency = (busy_all if per_group else busy[instance]) + 1
                for j in range(taken):
                    slot = batch[j]
                    outcome_j, processing_j, send_j = _listen(
                        k, d, prefixes, conditions, slots[S_MSG_ID, slot],
                        slots[S_DELIVERY, slot],
                        poisoned[slots[S_INDEX, slot]] and slots[S_FIXED, slot] == 0, concurrency,
                    )  # fmt: skip
                    outcomes[j], sends[j] = outcome_j, send_j
                    processing += processing_j
                    if failing == SUCCESS and outcome_j != SUCCESS:
                        failing = outcome_j
                outcome, end = _consume_result(k, now, processing, failing)
                deliveries += taken
                for j in range(taken):
                    if slots[S_DELIVERY, batch[j]] == 1:
                        first += 1
                if threads != n:
                    free[instance] -= 1
                if loaded:
                    busy[instance] += 1
                    busy_all += 1
                if threads != n or loaded:
                    if events == len(event_keys):
                        event_keys, event_values = _grow(event_keys), _grow(event_values)
                    _event_push(
                        event_keys, event_values, events, 2 * (now + processing) + _FREE_PHASE,
                        -1 - instance,
                    )  # fmt: skip
                    events += 1
                for j in range(taken):
                    slot = batch[j]
                    topic, queue_id = slots[S_TOPIC, slot], slots[S_QUEUE, slot]
                    if end >= horizon:
                        step = (INFLIGHT, n, n, n, n, n, n, n, n, n, n, n, n, n, n)
                        if rows == out.shape[1]:
                            out = _wider(out)
                        _row(out, rows, k, born, slots, slot, now, processing, n, n, step,
                             taken)  # fmt: skip
                        rows += 1
                        spare[spare_count] = slot
                        spare_count += 1
                        continue
                    beyond_ack = outcome == SUCCESS and ack_index != n and j > ack_index
                    step = _settled_step(
                        k, intervals, levels, resend_levels, resend_intervals, slots, slot,
                        outcome, beyond_ack, now, end, sends[j],
                    )  # fmt: skip
                    if rows == out.shape[1]:
                        out = _wider(out)
                    _row(out, rows, k, born, slots, slot, now, processing, end, outcome,
                         step, taken)  # fmt: skip
                    rows += 1
                    if step[0] == DLQ and replay_at != n:  # a dead letter the replay may re-send
                        dead[0, dead_count], dead[1, dead_count] = step[3], slots[S_MSG_ID, slot]
                        dead[2, dead_count] = slots[S_INDEX, slot]
                        dead[3, dead_count] = slots[S_DELIVERY, slot]
                        dead_count += 1
                    if blocking:
                        order_key = (topic << 40) | queue_id
                        release_at = n
                        if step[2] == n and step[5] == T_SCHEDULE:
                            release_at = end  # re-sent to the broker: the queue moves on
                        elif step[0] != WAITING_RETRY:
                            release_at = step[3]
                        if release_at != n and order_key in order_ids:
                            if events == len(event_keys):
                                event_keys, event_values = _grow(event_keys), _grow(event_values)
                            _event_push(
                                event_keys, event_values, events, 2 * release_at + _FREE_PHASE,
                                order_ids[order_key],
                            )  # fmt: skip
                            events += 1
                    due = step[2]
                    if (step[0] == WAITING_RETRY or step[0] == INFLIGHT) and due != n and (
                            due < horizon):  # fmt: skip
                        _next_delivery(k, slots, slot, step)  # the slot carries it
                        if events == len(event_keys):
                            event_keys, event_values = _grow(event_keys), _grow(event_values)
                        events = _push_eligible(event_keys, event_values, events, slots, slot)
                    else:
                        spare[spare_count] = slot
                        spare_count += 1
        touched_count = 0
        turns += 1
        if rows >= CHUNK_ROWS or turns % _TURNS_PER_LOOK == 0:
            yield out, rows, now, deliveries, first
            rows = 0
    # what is Ready before the horizon and never started (docs/model.md §7)
    out, rows = _pending(
        out, rows, k, born, slots, event_keys, event_values, events, waits, wait_sizes
    )
    out, rows = _pending(out, rows, k, born, slots, event_keys, event_values, 0, replays,
                         replay_sizes)  # fmt: skip
    scratch = np.empty((S_FIELDS, 1), np.int64)
    for lane in range(len(queue_ids_used)):
        for j in range(cursor[lane], queue_end[lane]):
            position = by_queue[j]
            _first_delivery(scratch, 0, position, msg_ids, queue_ids, born, eligible_of[position])
            if rows == out.shape[1]:
                out = _wider(out)
            _row(out, rows, k, born, scratch, 0, n, n, n, n, _PENDING, n)
            rows += 1
            if rows >= CHUNK_ROWS:
                yield out, rows, horizon, deliveries, first
                rows = 0
    for position in range(next_arrival, count):
        _first_delivery(scratch, 0, position, msg_ids, queue_ids, born, eligible_of[position])
        if rows == out.shape[1]:
            out = _wider(out)
        _row(out, rows, k, born, scratch, 0, n, n, n, n, _PENDING, n)
        rows += 1
        if rows >= CHUNK_ROWS:
            yield out, rows, horizon, deliveries, first
            rows = 0
    yield out, rows, horizon, deliveries, first


# --------------------------------------------------------------------------- the Python side


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
    k[K_TIMEOUT_LEVEL] = given(policy.timeout_level)
    k[K_TIMEOUT_INTERVAL] = given(policy.timeout_interval_ms)
    k[K_DLQ_NOW] = policy.dlq_now
    k[K_INVISIBLE] = policy.invisible_until_retry
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


@njit(cache=True)
def _typed_columns(out, rows, positions, values, bitmaps, nulls):
    """Columns ``positions`` of ``out``'s first ``rows`` into ``values`` (their Arrow width)
    and ``bitmaps`` (Arrow's validity bits, zeroed before), their null counts into
    ``nulls``: one pass where a copy, a mask and a cast took three."""
    for c in range(len(positions)):
        row = out[positions[c]]
        count = 0
        for i in range(rows):
            value = row[i]
            if value == NULL:
                values[c, i] = 0
                count += 1
            else:
                values[c, i] = value
                bitmaps[c, i >> 3] |= np.uint8(1 << (i & 7))
        nulls[c] = count


# The output columns by the width of their Arrow arrays: the longs, and the ints with the
# strings' codes (the indices their strings are taken by).
_LONGS = np.array([i for i, n in enumerate(_OUT) if STAGE_ARROW.field(n).type == pa.int64()])
_NARROW = np.array([i for i in range(_WIDTH) if i not in set(_LONGS.tolist())])
assert all(STAGE_ARROW.field(_OUT[i]).type in (pa.int32(), pa.string()) for i in _NARROW), (
    "a staged column of another width"
)
_POSITION = {name: position for position, name in enumerate(_OUT)}


def _batch(out: np.ndarray, rows: int, group: str, names: pa.Array) -> pa.RecordBatch:
    """A chunk of rows as a record batch in STAGE_ARROW's shape: the string columns taken
    from ``names`` by code in Arrow (no Python string objects), NULL to missing."""
    columns: list[pa.Array | None] = [None] * _WIDTH
    for positions, dtype in ((_LONGS, np.int64), (_NARROW, np.int32)):
        kind = pa.from_numpy_dtype(dtype)
        values = np.empty((len(positions), rows), dtype)
        bitmaps = np.zeros((len(positions), (rows + 7) // 8), np.uint8)
        nulls = np.empty(len(positions), np.int64)
        _typed_columns(out, rows, positions, values, bitmaps, nulls)
        for c, position in enumerate(positions.tolist()):
            null_count = int(nulls[c])
            array = pa.Array.from_buffers(
                kind,
                rows,
                [pa.py_buffer(bitmaps[c]) if null_count else None, pa.py_buffer(values[c])],
                null_count=null_count,
            )
            name = _OUT[position]
            columns[position] = pc.take(names, array) if name in _STRING_COLUMNS else array
    group_column = pc.take(pa.array([group]), pa.array(np.zeros(rows, np.int32)))
    poison_fixed = pa.array(out[_FIXED_ROW, :rows] != 0)
    return pa.RecordBatch.from_arrays([group_column, *columns, poison_fixed], schema=STAGE_ARROW)


class Chunk:
    """A chunk of the loop's rows before it becomes a record batch: the
    :class:`~retrysim.tables.key_counts.Columns` the sums read, answered from the loop's
    own longs and string codes (not every column of every batch converted), and the record
    batch, made only for the rows a task writes.
    Valid until the loop goes on (it reuses its buffer): the loop then empties it."""

    def __init__(self, out: np.ndarray, rows: int, group: str, names: pa.Array, codes: dict):
        self.out, self.rows, self.group, self.names, self.codes = out, rows, group, names, codes

    @property
    def num_rows(self) -> int:
        return self.rows

    def longs(self, name: str) -> np.ndarray:
        return self.out[_POSITION[name], : self.rows]

    def isin(self, name: str, *values: str) -> np.ndarray:
        codes = self.longs(name)
        found = np.isin(codes, [c for value in values for c in self.codes.get(value, ())])
        return np.where(codes == NULL, np.int8(-1), found.astype(np.int8))

    def index_in(self, name: str, values: tuple[str, ...]) -> np.ndarray:
        codes = self.longs(name)
        table = np.full(len(self.names), -2, np.int64)  # -2: none of them
        for position, value in enumerate(values):
            table[list(self.codes.get(value, ()))] = position
        index = np.where(codes == NULL, -1, table[np.where(codes == NULL, 0, codes)])
        if (index == -2).any():
            raise ValueError(f"a {name} outside {values}")
        return index

    def arrow(self) -> pa.RecordBatch:
        return _batch(self.out, self.rows, self.group, self.names)


def simulate_compiled(
    spec, msg_ids, queue_ids, born, heartbeat=None, unit=None, imports=None, chunks=False,
    publish=True,
) -> Iterator[pa.RecordBatch] | Iterator[Chunk]:  # fmt: skip
    """The rows :func:`~retrysim.engine.sequential.simulate_key` gives, from the compiled
    loop (``spec`` is a :class:`~retrysim.engine.sequential.KeySpec` it covers), as the
    record batches the Spark stage hands on. With ``unit`` (the instances it runs, the
    instances it sends retries to), those of one unit of the group (docs/model.md §5,
    "Units"), fed the retries ``imports`` (a frame of the deliveries other units' rows
    lead to, as :func:`retrysim.engine.rounds.next_frontier` gives them). Without
    ``publish``, the messages are not published: the loop starts from ``imports`` alone (a
    round run's frontier, whose ``poison_fixed`` column, where there is one, says which
    messages a replay fixed). With ``chunks``, :class:`Chunk` s instead of record
    batches."""
    policy, behavior = spec.policy, spec.behavior
    order = _publish_order(born, msg_ids)
    msg_ids, queue_ids, born = msg_ids[order], queue_ids[order], born[order]
    count = int(np.searchsorted(born, spec.horizon_ms)) if publish else 0
    model = ListenerModel(behavior)
    d, windows = _doubles(model)
    prefixes = np.array(
        [rng.key_prefix(spec.seed, spec.group, s) for s in listener.DELIVERY_STREAMS],
        dtype=np.uint64,
    )
    poisoned = listener.poisoned(spec.seed, spec.group, msg_ids, behavior.poison_fraction)
    topology = policy.topology
    names = pa.array(
        [*NAMES, policy.topic, policy.retry_topic, limits.SCHEDULE_TOPIC, policy.dlq_topic,
         topology.retry_topic], type=pa.string(),
    )  # fmt: skip
    k = _scalars(policy, behavior, spec.horizon_ms)
    replay = policy.replay
    if replay is not None and replay.at < spec.horizon_ms and count:
        k[K_REPLAY_AT], k[K_REPLAY_FIXED] = replay.at, replay.poison_fixed
        k[K_REPLAY_QUEUES] = spec.queues
        d[D_REPLAY_RATE] = replay.rate
    member = np.full(topology.instances, MEMBER, np.int64)
    own = count
    if unit is not None:
        runs, exported = unit
        member[:] = ELSEWHERE
        member[list(exported)] = EXPORTED
        member[list(runs)] = MEMBER
        first = np.array([topology.instance(policy.topic, q, 0, 1) for q in range(topology.queues)])
        own = int(np.isin(first[queue_ids[:count]], runs).sum())
    rules = (
        k, d, windows, prefixes, _table(policy.intervals_ms), _table(policy.levels),
        _table(policy.resend_levels), _table(policy.resend_intervals_ms), msg_ids, queue_ids,
        born, poisoned, count,
    )  # fmt: skip
    if policy.batch_size > 1 or policy.blocking:
        if unit is not None or imports is not None:
            raise ValueError(f"group {spec.group}: batches and ordered queues run whole")
        loop = _run_lanes(*rules, policy.batch_size, policy.blocking)
    else:
        loop = _run(*rules, member, _import_slots(policy, imports, msg_ids, names))
    codes: dict[str, list[int]] = {}
    for code, name in enumerate(names.to_pylist()):
        codes.setdefault(name, []).append(code)
    for out, rows, now, deliveries, first in loop:
        if heartbeat is not None:
            heartbeat.beat(int(now), int(deliveries), int(first), own)
        if rows and chunks:
            chunk = Chunk(out, rows, spec.group, names, codes)
            yield chunk
            chunk.out = None  # the loop reuses the buffer
        elif rows:
            yield _batch(out, rows, spec.group, names)
    if heartbeat is not None:
        heartbeat.beat(spec.horizon_ms, int(deliveries), own, own, done=True)


def _publish_order(born: np.ndarray, msg_ids: np.ndarray) -> np.ndarray:
    """The messages' positions in (born_ms, msg_id) order. Where the ids ascend already (as
    messages_np makes them), a sort of each born time with its position packed into the
    low bits, more than twice as fast as a lexsort at 30M messages."""
    count = len(born)
    index_bits = max(1, (count - 1).bit_length())
    ascending = count < 2 or bool((np.diff(msg_ids) > 0).all())
    if (
        not ascending
        or not count
        or born.min() < 0
        or int(born.max()).bit_length() + index_bits > 63
    ):
        return np.lexsort((msg_ids, born))
    packed = np.sort((born << index_bits) | np.arange(count, dtype=np.int64))
    return packed & ((1 << index_bits) - 1)


def _import_slots(policy: Policy, imports, msg_ids: np.ndarray, names: pa.Array) -> np.ndarray:
    """The retries ``imports`` (a frame of :data:`retrysim.engine.sequential.IMPORTED`) as
    the loop's slots: the
    strings as their codes (a name that is two topics takes the first code, as the loop
    does), each message by its position in ``msg_ids``."""
    slots = np.empty((S_FIELDS, 0 if imports is None else len(imports)), np.int64)
    if not slots.shape[1]:
        return slots
    code = {name: c for c, name in reversed(list(enumerate(names.to_pylist())))}
    by_id = np.argsort(msg_ids, kind="stable")
    wanted = imports["msg_id"].to_numpy(np.int64)
    slots[S_INDEX] = by_id[np.searchsorted(msg_ids, wanted, sorter=by_id)]
    slots[S_MSG_ID] = wanted
    for field, column in ((S_DELIVERY, "delivery"), (S_RT, "reconsume_times"),
                          (S_BROKER_RT, "broker_reconsume_times"), (S_QUEUE, "queue_id"),
                          (S_READY, "ready_ms")):  # fmt: skip
        slots[field] = imports[column].to_numpy(np.int64)
    slots[S_TOPIC] = imports["source_topic"].map(code).to_numpy(np.int64)
    slots[S_REASON] = imports["ready_reason"].map(code).to_numpy(np.int64)
    slots[S_ELIGIBLE] = policy.eligible_ms(slots[S_READY])  # NumPy arrays take it as it is
    fixed = imports.get("poison_fixed", None)
    slots[S_FIXED] = 0 if fixed is None else fixed.to_numpy(bool)
    slots[S_WITHDRAWN] = 0
    return slots


def warm_up() -> None:
    """Compile both loops (or load them from numba's cache on disk) on two messages of the
    embedded default scenario's first unordered group, one message per consume request and
    in batches: setup runs it once, so that no Spark task pays the compilation."""
    scenario = load_scenario()
    delay_table = scenario.broker.message_delay_level
    group = next(g for g in scenario.groups if not policy_for(g, delay_table).blocking)
    policy = policy_for(group, delay_table)
    ids = np.arange(2, dtype=np.int64)
    for batch_size in (1, 2):
        spec = SimpleNamespace(
            group=group.name, policy=dataclasses.replace(policy, batch_size=batch_size),
            behavior=group.behavior, seed=scenario.seed, horizon_ms=scenario.horizon,
        )  # fmt: skip
        for _ in simulate_compiled(spec, ids, ids, ids):
            pass
