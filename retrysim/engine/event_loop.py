"""The event loop compiled: docs/model.md §5-§8, one key event by event, in numba.

A full consumer pool is the regime capacity planning exists for, and simulating it is a
loop over single deliveries. This module runs that loop as compiled code inside the Spark
task: the same hashed draws as the round engine's columns (Spark's XXH64 over ``(seed,
group, stream, msg_id, delivery)``) and the rules of :mod:`retrysim.engine.event_rules`. The
tests hold it to the reference written from the RocketMQ source, row for row.

It covers every group: every flavor's rules, every topology, outages, poison and a replay.
``_run`` takes one message per consume request, with a fast path for first deliveries, runs
a group's units (docs/model.md §5) and finishes a round run's frontier; ``_run_lanes``
(:mod:`retrysim.engine.event_lanes`) takes batches of one lane and ordered queues, one
message at a time per queue, where a replayed delivery waits for its queue and takes back a
later first delivery the queue released but that is not eligible yet. A loop is a
generator: a key's rows leave in chunks, and between chunks it reports how far it got for
the heartbeat. numba caches the compiled code on disk,
keyed by the source (:mod:`retrysim.numba_cache`), so only the first run on a machine pays
the compilation (setup does it).

Each loop's turn is one function: numba counts a reference on every array passed to a
helper or returned from one, so the hot paths stay inline in ``_turns`` and ``_run_lanes``
(folding even a few lines into a helper that takes the slot arrays cost 12 % of a saturated
run); the rules, the heaps and the row writes that take scalars are helpers inlined by numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.np.unsafe.ndarray import to_fixed_tuple
from numba.typed import Dict, List

from retrysim.engine.event_heaps import (
    _ELIGIBLE_PHASE,
    _FREE_PHASE,
    _KEY_SPAN,
    _event_pop,
    _event_push,
    _fifo_push,
    _grow,
    _wait_pop,
    _wait_push,
)
from retrysim.engine.event_pops import (
    _CACHE_HEAD,
    _CACHE_TAIL,
    _DUE,
    _DUE_NOW,
    _ON_FREE,
    _RECEIVE_AT,
    _backoff,
    _cache_push,
    _pop_state,
    _receive,
    _shared_polls,
    _taker,
)
from retrysim.engine.event_rules import (
    _FIXED_ROW,
    _SEND_BACK_FAILED,
    _WIDTH,
    CHUNK_ROWS,
    D_CAPACITY,
    D_PER_GROUP,
    D_REPLAY_RATE,
    D_SIZE,
    DLQ,
    INFLIGHT,
    K_ACK_INDEX,
    K_HORIZON,
    K_INSTANCES,
    K_LATE_SEND_BACK,
    K_PERIODIC,
    K_POP_CACHE,
    K_PULL_THRESHOLD,
    K_QUEUES,
    K_REPLAY_AT,
    K_REPLAY_FIXED,
    K_REPLAY_QUEUES,
    K_SIZE,
    K_THREADS,
    K_TIMEOUT,
    LOCAL_RETRY,
    NULL,
    PUBLISHED,
    READY,
    REPLAYED,
    S_BROKER_RT,
    S_DELIVERY,
    S_ELIGIBLE,
    S_FIELDS,
    S_FIXED,
    S_INDEX,
    S_MSG_ID,
    S_PARENT,
    S_QUEUE,
    S_READY,
    S_REASON,
    S_RT,
    S_TOPIC,
    S_WITHDRAWN,
    SUCCESS,
    T_SOURCE,
    TIMEOUT,
    WAITING_RETRY,
    _base_conditions,
    _committed,
    _conditions,
    _consume_result,
    _eligible,
    _instance,
    _lane,
    _listen,
    _next_delivery,
    _number_waiting,
    _send_back_again,
    _settled_step,
    _sweep_state,
    _swept,
    lanes,
)
from retrysim.numba_cache import cache_by_source
from retrysim.scenario.limits import PULL_BATCH

cache_by_source(__name__, __loader__, __file__)  # before the first @njit(cache=True)

_TURNS_PER_LOOK = 1 << 15  # loop turns between reports to the heartbeat

# --------------------------------------------------------------------------- the loop


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
    parent = slots[S_PARENT, slot]
    out[30, n] = parent if parent != slots[S_DELIVERY, slot] - 1 else NULL
    out[31, n], out[32, n], out[33, n], out[34, n] = NULL, NULL, NULL, NULL
    out[35, n], out[36, n] = NULL, NULL
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
def _first_delivery(slots, slot, position, msg_ids, queue_ids, born, eligible):
    """Fill ``slot`` with the first delivery of the message at ``position``."""
    slots[S_INDEX, slot], slots[S_DELIVERY, slot] = position, 1
    slots[S_PARENT, slot] = 0
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
    shared = _shared_polls(k)  # one queue on the broker, whichever instance takes them
    for p in range(count):
        instance[p] = 0 if shared else _instance(k, T_SOURCE, queue_ids[p], msg_ids[p], 1)
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
def _pending_first(out, rows, k, born, scratch, position, msg_ids, queue_ids, eligible):
    """Row ``rows`` (``out`` grown if full): the first delivery of ``position``, Ready at the
    horizon. Returns (out, rows + 1)."""
    if rows == out.shape[1]:
        out = _wider(out)
    _first_delivery(scratch, 0, position, msg_ids, queue_ids, born, eligible[position])
    _row(out, rows, k, born, scratch, 0, NULL, NULL, NULL, NULL, _PENDING, NULL)
    return out, rows + 1


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
    slots[S_PARENT, slot] = dead[3, i]
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
def _turns(k_array, d_array, windows, prefix_array, intervals, levels, resend_levels,
           resend_intervals, msg_ids, queue_ids, born, poisoned, count, member, eligible,
           first_instance, order, taken, arrived, free, busy, touched, touched_list, heaps,
           sizes, slots, spare, event_keys, event_values, out, state, dead, cached, overflow,
           fifo_ends, lane_pos, lane_wait, lane_next, entered, ring, entry, held, pop,
           caches, sweeps, forked):  # fmt: skip
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
    replay (docs/model.md §8), as (reaches the DLQ, msg_id, position, delivery) columns.

    With a pull threshold (``K_PULL_THRESHOLD``), ``cached`` counts each process queue's
    deliveries pulled and not yet done (:func:`_lane`); a delivery eligible while its queue
    holds more than the threshold waits on the broker until, one of them done, the queue
    holds no more than that, and then enters its instance's order with up to 31 more of the
    queue's waiting (a pull's batch). A first delivery waits in its queue's run of ``lane_pos`` (the
    positions by queue, in publish order: those from ``lane_wait`` to ``lane_next``, the
    queue's next arrival), and enters its instance's FIFO, a ring in ``entered`` (``ring``:
    each one's offset, size, head and length, :data:`_RING`); a retry waits in its queue's
    FIFO of ``overflow`` (``fifo_ends``), and enters the heap. ``entry`` holds a first
    delivery's moment of entry (NULL: at its eligible moment, -1: still waiting). ``held``
    (as long as the event heap) takes the deliveries eligible at one moment, so that where
    a queue has room for only some of them, the lowest (msg_id, delivery) take it.

    With a 5.x cache (``K_POP_CACHE``), ``cached`` counts each instance's deliveries
    received and not yet done, ``caches`` holds each one's FIFO of them in the order they
    start, and ``pop`` its receives (:data:`_RECEIVE_AT` ...); a delivery eligible while its
    instance's long poll waits enters at once, else it waits on the broker (:func:`_receive`).
    A receive due is an event of the free phase whose value is -1 - the instance.

    With the 4.x cleaner's periodic check (``K_PERIODIC``), ``sweeps`` holds each process
    queue's latest cleaner run and how many it sent back (:func:`_swept`).

    With a 4.9 client's late send-back (``K_LATE_SEND_BACK``), a timed-out delivery whose
    listener fails sends a second copy of its message (:func:`_send_back_again`);
    ``forked`` maps each such message to the last delivery number it started: its copies'
    deliveries are numbered as they start, the number their draws take."""
    n = NULL
    k = to_fixed_tuple(k_array, K_SIZE)
    d = to_fixed_tuple(d_array, D_SIZE)
    prefixes = to_fixed_tuple(prefix_array, 7)
    horizon = k[K_HORIZON]
    threads = k[K_THREADS]
    ack_index = k[K_ACK_INDEX]
    acked_later = ack_index != n and ack_index < 0  # a success is retried (docs/model.md §7)
    swept = k[K_PERIODIC] == 1
    twice = k[K_LATE_SEND_BACK] == 1
    threshold = k[K_PULL_THRESHOLD]
    capped = threshold != n
    popped = k[K_POP_CACHE] != n
    shared = _shared_polls(k)  # the broker's pops answer whichever instance's long poll
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
        if popped:  # each instance's receive an event
            most += k[K_INSTANCES]
        if twice:  # each delivery may send a second copy: a slot and an event more
            most *= 2
        if (rows + most > out.shape[1] or events + 2 * most > len(event_keys)
                or spare_count + slots.shape[1] - used < most
                or (replay_at != n and dead_count + most > dead.shape[1])):  # fmt: skip
            status = _ROOM
            state[_MOST] = most
            break
        conditions = base if windows.shape[0] == 0 else _conditions(windows, d, now)
        due = 0
        while events > 0 and event_keys[0] == 2 * now + _FREE_PHASE:
            value = _event_pop(event_keys, event_values, events)
            events -= 1
            if value < 0:  # a receive, after the threads freed now
                pop[_DUE, due] = -1 - value
                due += 1
                continue
            instance, lane = value % everyone, value // everyone - 1
            if lane >= 0 and popped:  # it leaves its instance's cache
                cached[lane] -= 1
                if pop[_RECEIVE_AT, lane] == _ON_FREE:  # a simple consumer's thread receives
                    pop[_RECEIVE_AT, lane] = _DUE_NOW
                    pop[_DUE, due] = lane
                    due += 1
            elif lane >= 0:  # its process queue has room: the next delivery waiting enters
                cached[lane] -= 1
                pulled = PULL_BATCH  # a pull takes up to 32, while the queue caches <= T
                while cached[lane] <= threshold or pulled < PULL_BATCH:
                    position = (
                        lane_pos[lane_wait[lane]] if lane_wait[lane] < lane_next[lane] else -1
                    )
                    slot = overflow[lane][fifo_ends[0, lane]] if (
                        fifo_ends[0, lane] < fifo_ends[1, lane]) else -1  # fmt: skip
                    if position < 0 and slot < 0:
                        break
                    pulled = 1 if pulled == PULL_BATCH else pulled + 1
                    cached[lane] += 1
                    # in queue order: a first delivery before a retry eligible with it
                    if position >= 0 and (
                        slot < 0 or eligible[position] <= slots[S_ELIGIBLE, slot]
                    ):
                        lane_wait[lane] += 1
                        entry[position] = now
                        offset, size = ring[_OFFSET, instance], ring[_SIZE, instance]
                        j = ring[_HEAD, instance] + ring[_LENGTH, instance]
                        j = offset + (j if j < size else j - size)
                        entered[j] = position
                        ring[_LENGTH, instance] += 1
                        # those entering together go by msg_id
                        for _ in range(ring[_LENGTH, instance] - 1):
                            before = j - 1 if j > offset else offset + size - 1
                            if entry[entered[before]] != now or (
                                    msg_ids[entered[before]] < msg_ids[entered[j]]):  # fmt: skip
                                break
                            entered[before], entered[j] = entered[j], entered[before]
                            j = before
                    else:
                        fifo_ends[0, lane] += 1
                        slots[S_ELIGIBLE, slot] = now
                        heaps[instance] = _wait_push(
                            heaps[instance], sizes[instance], slot, slots[S_ELIGIBLE],
                            slots[S_MSG_ID], slots[S_DELIVERY],
                        )  # fmt: skip
                        sizes[instance] += 1
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
            position = next_arrival
            instance = first_instance[position]
            next_arrival += 1
            if member[instance] != MEMBER:
                continue  # another unit's
            arrived[instance] += 1
            if capped:
                lane = queue_ids[position]
                lane_next[lane] += 1
                if cached[lane] <= threshold:
                    cached[lane] += 1
                    lane_wait[lane] = lane_next[lane]
                else:  # its queue's cache is full: it waits on the broker
                    entry[position] = -1
            taker = _taker(k, pop, instance, now, shared) if popped else -1
            if taker >= 0:  # a long poll answers it
                taken[instance] += 1
                _cache_push(caches, pop, cached, taker, position, now, True, msg_ids, slots)
                events = _backoff(k, pop, taker, now, cached, event_keys, event_values, events)
                instance = taker
            if not touched[instance]:
                touched[instance] = True
                touched_list[touched_count] = instance
                touched_count += 1
        for again in range(2):  # again: the replayed deliveries eligible at once
            eligible_now = 0
            while events > 0 and event_keys[0] == 2 * now + _ELIGIBLE_PHASE:
                held[eligible_now] = _event_pop(event_keys, event_values, events)
                events -= 1
                eligible_now += 1
            if (capped or popped) and eligible_now > 1:  # who takes the last room: by message
                ids = (
                    slots[S_MSG_ID, held[:eligible_now]] * _KEY_SPAN
                    + slots[S_DELIVERY, held[:eligible_now]]
                )
                held[:eligible_now] = held[:eligible_now][np.argsort(ids)]
            for e in range(eligible_now):
                slot = held[e]
                instance = _instance(k, slots[S_TOPIC, slot], slots[S_QUEUE, slot],
                                     slots[S_MSG_ID, slot], slots[S_DELIVERY, slot])  # fmt: skip
                if popped:  # a long poll answers it, or it waits on the broker
                    taker = _taker(k, pop, instance, now, shared)
                    if taker >= 0:
                        _cache_push(caches, pop, cached, taker, -1 - slot, now, True, msg_ids,
                                    slots)  # fmt: skip
                        events = _backoff(k, pop, taker, now, cached, event_keys,
                                          event_values, events)  # fmt: skip
                        instance = taker
                    else:
                        lane = 2 * (0 if shared else instance) + (slots[S_TOPIC, slot] == T_SOURCE)
                        overflow[lane], fifo_ends[0, lane], fifo_ends[1, lane] = _fifo_push(
                            overflow[lane], fifo_ends[0, lane], fifo_ends[1, lane], slot
                        )
                    if not touched[instance]:
                        touched[instance] = True
                        touched_list[touched_count] = instance
                        touched_count += 1
                    continue
                # a local resubmit never left its process queue
                if capped and slots[S_REASON, slot] != LOCAL_RETRY:
                    lane = _lane(k, slots[S_TOPIC, slot], slots[S_QUEUE, slot])
                    if cached[lane] > threshold:  # it waits on the broker
                        overflow[lane], fifo_ends[0, lane], fifo_ends[1, lane] = _fifo_push(
                            overflow[lane], fifo_ends[0, lane], fifo_ends[1, lane], slot
                        )
                        continue
                    cached[lane] += 1
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
        if due > 1:  # in instance order: where they share the broker's line, the first takes
            pop[_DUE, :due].sort()  # what waits
        for r in range(due):  # the receives due, after what became eligible now
            instance = pop[_DUE, r]
            events = _receive(
                k, prefixes[6], instance, 0 if shared else instance, now, cached, pop, caches,
                overflow, fifo_ends, order, taken, arrived, eligible, msg_ids, slots, event_keys,
                event_values, events,
            )  # fmt: skip
            if not touched[instance]:
                touched[instance] = True
                touched_list[touched_count] = instance
                touched_count += 1
        # dispatch: each touched instance starts what waits while it has a free thread, in
        # (eligible_ms, msg_id, delivery) order over its queue of first deliveries and its
        # heap of retries; in instance order where they share a downstream (each call
        # counts the ones started before it) or a message's copies may start together (they
        # are numbered as they start, in the reference's instance order)
        if (per_group or twice) and touched_count > 1:
            touched_list[:touched_count].sort()
        for t in range(touched_count):
            instance = touched_list[t]
            touched[instance] = False
            while free[instance] > 0:
                if popped:  # the head of its cache
                    head = pop[_CACHE_HEAD, instance]
                    if head == pop[_CACHE_TAIL, instance]:
                        break
                    value = caches[instance][head]
                    pop[_CACHE_HEAD, instance] = head + 1
                    if value < 0:
                        slot = -1 - value
                    else:
                        spare_count, used, slot = _take_slot(slots, spare, spare_count, used)
                        _first_delivery(slots, slot, value, msg_ids, queue_ids, born,
                                        eligible[value])  # fmt: skip
                else:
                    # the first delivery due: the queue's head, or (capped) the FIFO's of those
                    # that waited on the broker; those that wait are skipped in the queue
                    position, at, late = -1, n, False
                    if capped:
                        while (
                            taken[instance] < arrived[instance]
                            and entry[order[taken[instance]]] != n
                        ):
                            taken[instance] += 1
                    if taken[instance] < arrived[instance]:
                        position = order[taken[instance]]
                        at = eligible[position]
                    if capped and ring[_LENGTH, instance] > 0:
                        other = entered[ring[_OFFSET, instance] + ring[_HEAD, instance]]
                        if position < 0 or entry[other] < at or (
                            entry[other] == at and msg_ids[other] < msg_ids[position]
                        ):  # fmt: skip
                            position, at, late = other, entry[other], True
                    if position < 0 and sizes[instance] == 0:
                        break
                    heap = heaps[instance]
                    queued = position >= 0
                    if queued and sizes[instance] > 0:
                        top = heap[0]
                        queued = at < slots[S_ELIGIBLE, top] or (
                            at == slots[S_ELIGIBLE, top]
                            and msg_ids[position] < slots[S_MSG_ID, top]
                        )  # fmt: skip
                    if queued:
                        if late:
                            ring[_HEAD, instance] += 1
                            ring[_LENGTH, instance] -= 1
                            if ring[_HEAD, instance] == ring[_SIZE, instance]:
                                ring[_HEAD, instance] = 0
                        else:
                            taken[instance] += 1
                        spare_count, used, slot = _take_slot(slots, spare, spare_count, used)
                        _first_delivery(slots, slot, position, msg_ids, queue_ids, born, at)
                    else:
                        slot = _wait_pop(heap, sizes[instance], slots[S_ELIGIBLE], slots[S_MSG_ID],
                                         slots[S_DELIVERY])  # fmt: skip
                        sizes[instance] -= 1
                index = slots[S_INDEX, slot]
                msg_id, delivery = slots[S_MSG_ID, slot], slots[S_DELIVERY, slot]
                if twice and len(forked) > 0 and msg_id in forked:  # numbered as it starts
                    delivery = forked[msg_id] + 1
                    forked[msg_id] = delivery
                    slots[S_DELIVERY, slot] = delivery
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
                listened = outcome
                outcome, end = _consume_result(k, now, processing, outcome)
                if swept and outcome == TIMEOUT:  # the cleaner's run may be full
                    outcome, end = _swept(
                        sweeps, _lane(k, slots[S_TOPIC, slot], slots[S_QUEUE, slot]), end,
                        k[K_TIMEOUT], now + processing, listened,
                    )  # fmt: skip
                deliveries += 1
                if delivery == 1:
                    first += 1
                if threads != n:
                    free[instance] -= 1
                if loaded:
                    busy[instance] += 1
                    busy[everyone] += 1
                if threads != n or loaded:
                    # the thread frees, and (capped) the delivery leaves its process queue
                    # unless a failed send-back resubmits it there
                    lane = -1
                    failed = outcome != SUCCESS or acked_later
                    kept = failed and outcome != TIMEOUT and send_back == _SEND_BACK_FAILED
                    if capped and not kept:
                        lane = _lane(k, slots[S_TOPIC, slot], slots[S_QUEUE, slot])
                    elif popped:
                        lane = instance
                    _event_push(
                        event_keys,
                        event_values,
                        events,
                        2 * (now + processing) + _FREE_PHASE,
                        instance + everyone * (lane + 1),
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
                if twice and outcome == TIMEOUT and (listened != SUCCESS or acked_later) and (
                    now + processing < horizon
                ):  # fmt: skip
                    if msg_id not in forked:  # its first fork: from now on it counts
                        forked[msg_id] = delivery
                    spare_count, used, copy = _take_slot(slots, spare, spare_count, used)
                    if _send_back_again(
                        k,
                        intervals,
                        levels,
                        resend_levels,
                        resend_intervals,
                        slots,
                        slot,
                        copy,
                        listened,
                        now + processing,
                        out,
                        rows,
                    ):
                        events = _push_eligible(event_keys, event_values, events, slots, copy)
                    else:
                        spare[spare_count] = copy
                        spare_count += 1
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


@njit(cache=True)
def _pending_waits(out, rows, k, born, slots, overflow, fifo_ends):
    """Rows ``rows`` on of the deliveries waiting on the broker in ``overflow``'s FIFOs (for a
    4.x process queue or a 5.x cache). Returns (out, rows)."""
    n = NULL
    for lane in range(fifo_ends.shape[1]):
        for f in range(fifo_ends[0, lane], fifo_ends[1, lane]):
            if rows == out.shape[1]:
                out = _wider(out)
            _row(out, rows, k, born, slots, overflow[lane][f], n, n, n, n, _PENDING, n)
            rows += 1
    return out, rows


@njit(cache=True)
def _pending_cached(out, rows, k, born, scratch, slots, pop, caches, msg_ids, queue_ids,
                    eligible):  # fmt: skip
    """Rows ``rows`` on of the deliveries received into a 5.x cache and never started, each
    at the instance whose cache holds it. Returns (out, rows)."""
    for instance in range(len(caches)):
        fifo = caches[instance]
        for w in range(pop[_CACHE_HEAD, instance], pop[_CACHE_TAIL, instance]):
            if rows == out.shape[1]:
                out = _wider(out)
            if fifo[w] >= 0:  # a first delivery: its slot made up in scratch
                _first_delivery(scratch, 0, fifo[w], msg_ids, queue_ids, born, eligible[fifo[w]])
                _row_at(out, rows, instance, born, scratch, 0, NULL, NULL, NULL, NULL, _PENDING,
                        NULL)  # fmt: skip
            else:
                _row_at(out, rows, instance, born, slots, -1 - fifo[w], NULL, NULL, NULL, NULL,
                        _PENDING, NULL)  # fmt: skip
            rows += 1
    return out, rows


# _turns' scalars between calls, and what it returns for
(_NEXT_ARRIVAL, _DELIVERIES, _FIRST, _TURNS, _EVENTS, _SPARE_COUNT, _USED, _ROWS, _MOST,
 _DEAD, _REPLAYED, _STATE) = range(12)  # fmt: skip
_CHUNK, _DONE, _ROOM = range(3)
# an instance's ring of first deliveries that entered late: its offset, size, head, length
_OFFSET, _SIZE, _HEAD, _LENGTH, _RING = range(5)


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
    # the client's process queues, where a pull threshold applies (_turns' docstring)
    capped = k[K_PULL_THRESHOLD] != n
    queues = lanes(k) if capped else 0
    cached = np.zeros(queues, np.int64)
    overflow = List()
    for _ in range(queues):
        overflow.append(np.empty(16, np.int64))
    fifo_ends = np.zeros((2, queues), np.int64)
    lane_pos = np.argsort(queue_ids[:count], kind="mergesort") if capped else np.empty(0, np.int64)
    lane_wait = np.full(queues, count, np.int64)  # a retry queue has no first deliveries
    lane_wait[: k[K_QUEUES] if capped else 0] = np.searchsorted(
        queue_ids[:count][lane_pos], np.arange(k[K_QUEUES] if capped else 0)
    )
    lane_next = lane_wait.copy()
    # each instance's FIFO of first deliveries that entered late: at most its queues' caches
    # (a pull may take a queue past its threshold by a batch), and at most its messages
    ring = np.zeros((_RING, instances), np.int64)
    if capped:
        for q in range(k[K_QUEUES]):
            ring[_SIZE, _instance(k, T_SOURCE, q, 0, 1)] += k[K_PULL_THRESHOLD] + PULL_BATCH
        for i in range(instances):
            ring[_SIZE, i] = min(ring[_SIZE, i], starts[i + 1] - starts[i]) + 1
        ring[_OFFSET, 1:] = np.cumsum(ring[_SIZE])[:-1]
    entered = np.empty(ring[_SIZE].sum(), np.int64)
    entry = np.full(count if capped else 0, n, np.int64)
    held = np.empty(len(event_keys), np.int64)
    # a 5.x client's cache per instance, where it applies (_turns' docstring): each instance
    # counts in ``cached``, and waits on the broker in two FIFOs of ``overflow``
    pop, caches = _pop_state(instances if k[K_POP_CACHE] != n else 0)
    if len(caches) > 0:
        cached = np.zeros(instances, np.int64)
        for _ in range(2 * instances):
            overflow.append(np.empty(16, np.int64))
        fifo_ends = np.zeros((2, 2 * instances), np.int64)
    # a message reaches the DLQ once before the replay, which is the only one (each copy of
    # one a 4.9 client sent back twice: the array grows then)
    dead = np.empty((4, max(len(msg_ids), 1) if k[K_REPLAY_AT] != n else 0), np.int64)
    sweeps = _sweep_state(k)
    forked = Dict.empty(key_type=types.int64, value_type=types.int64)
    while True:
        now, status = _turns(
            k, d, windows, prefixes, intervals, levels, resend_levels, resend_intervals,
            msg_ids, queue_ids, born, poisoned, count, member, eligible, first_instance, order,
            taken, arrived, free, busy, touched, touched_list, heaps, sizes, slots, spare,
            event_keys, event_values, out, state, dead, cached, overflow, fifo_ends, lane_pos,
            lane_wait, lane_next, entered, ring, entry, held, pop, caches, sweeps, forked,
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
            if len(held) < len(event_keys):
                held = np.empty(len(event_keys), np.int64)
            while dead.shape[1] and state[_DEAD] + most > dead.shape[1]:  # copies' dead letters
                dead = _wider(dead)
            continue
        yield out, state[_ROWS], now, state[_DELIVERIES], state[_FIRST]
        state[_ROWS] = 0
    rows, events = state[_ROWS], state[_EVENTS]
    deliveries, first = state[_DELIVERIES], state[_FIRST]
    # what is Ready before the horizon and never started (docs/model.md §7)
    waiting = rows
    out, rows = _pending(out, rows, k, born, slots, event_keys, event_values, events, heaps, sizes)
    scratch = np.empty((S_FIELDS, 1), np.int64)
    # and those waiting on the broker for a process queue or a 5.x cache, or in a 5.x cache
    out, rows = _pending_waits(out, rows, k, born, slots, overflow, fifo_ends)
    if len(forked) > 0:
        _number_waiting(out, waiting, rows, forked)
    out, rows = _pending_cached(out, rows, k, born, scratch, slots, pop, caches, msg_ids,
                                queue_ids, eligible)  # fmt: skip
    # and the first deliveries that waited on the broker, or entered their instance's FIFO
    for lane in range(queues):
        for w in range(lane_wait[lane], lane_next[lane]):
            out, rows = _pending_first(out, rows, k, born, scratch, lane_pos[w], msg_ids,
                                       queue_ids, eligible)  # fmt: skip
    for instance in range(instances if capped else 0):
        for w in range(ring[_LENGTH, instance]):
            at = (ring[_HEAD, instance] + w) % ring[_SIZE, instance]
            out, rows = _pending_first(out, rows, k, born, scratch,
                                       entered[ring[_OFFSET, instance] + at], msg_ids, queue_ids,
                                       eligible)  # fmt: skip
    for instance in range(instances):
        if member[instance] != MEMBER:
            continue
        for j in range(taken[instance], starts[instance + 1]):
            position = order[j]
            if capped and entry[position] != n:
                continue  # it waited on the broker: started since, or written above
            out, rows = _pending_first(out, rows, k, born, scratch, position, msg_ids, queue_ids,
                                       eligible)  # fmt: skip
            if rows >= CHUNK_ROWS:
                yield out, rows, horizon, deliveries, first
                rows = 0
    yield out, rows, horizon, deliveries, first
