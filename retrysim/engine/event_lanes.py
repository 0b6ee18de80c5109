"""The event loop for consume requests that take lanes: docs/model.md §4-§5, compiled.

A consume request takes deliveries from one lane, (topic, queue, instance): a batch takes up
to N deliveries of the same lane (``consume_message_batch_max_size``), and an ordered queue
serves one message at a time, releasing the next when the one before left it. This is
:mod:`retrysim.engine.event_loop`'s ``_run`` for those groups, with its helpers and its
turn's order; it runs whole groups only (no units, no imports).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import Dict, List

from retrysim.engine.event_heaps import (
    _before,
    _event_pop,
    _event_push,
    _grow,
    _head_pop,
    _head_push,
    _wait_pop,
    _wait_push,
)
from retrysim.engine.event_loop import (
    _ELIGIBLE_PHASE,
    _FREE_PHASE,
    _TURNS_PER_LOOK,
    _buffers,
    _first_delivery,
    _grow_slots,
    _pending,
    _pending_first,
    _push_eligible,
    _replay,
    _replay_order,
    _replayed,
    _row,
    _take_slot,
    _wider,
)
from retrysim.engine.event_rules import (
    CHUNK_ROWS,
    D_CAPACITY,
    D_PER_GROUP,
    D_REPLAY_RATE,
    DLQ,
    INFLIGHT,
    K_ACK_INDEX,
    K_HORIZON,
    K_INSTANCES,
    K_LATE_SEND_BACK,
    K_PERIODIC,
    K_REPLAY_AT,
    K_REPLAY_QUEUES,
    K_THREADS,
    K_TIMEOUT,
    NULL,
    PUBLISHED,
    S_DELIVERY,
    S_ELIGIBLE,
    S_FIELDS,
    S_FIXED,
    S_INDEX,
    S_MSG_ID,
    S_QUEUE,
    S_READY,
    S_REASON,
    S_TOPIC,
    S_WITHDRAWN,
    SUCCESS,
    T_SCHEDULE,
    T_SOURCE,
    TIMEOUT,
    WAITING_RETRY,
    _base_conditions,
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
)
from retrysim.numba_cache import cache_by_source

cache_by_source(__name__, __loader__, __file__)  # before the first @njit(cache=True)


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


# A consume request takes deliveries from one lane, (topic, queue, instance): batches of
# up to N from the same lane, and an ordered queue serves one message at a time. This loop
# keeps each lane's waits in a heap and each instance's lane heads in a heap of
# (eligible_ms, msg_id, delivery, lane) rows, stale rows skipped (a head that left in an
# earlier batch): docs/model.md §5's dispatch.


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
    # a message reaches the DLQ once before the replay, which is the only one (each copy of
    # one a 4.9 client sent back twice: the array grows then)
    dead = np.empty((4, max(len(msg_ids), 1) if replay_at != n else 0), np.int64)
    dead_count = 0
    swept = k[K_PERIODIC] == 1
    sweeps = _sweep_state(k)
    twice = k[K_LATE_SEND_BACK] == 1  # a 4.9 client's late send-back (event_loop._turns)
    forked = Dict.empty(key_type=types.int64, value_type=types.int64)
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
        # in instance order too where a message's copies may start together (numbered so)
        if (per_group or twice) and touched_count > 1:
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
                    msg_j = slots[S_MSG_ID, slot]
                    if twice and len(forked) > 0 and msg_j in forked:  # numbered as it starts
                        forked[msg_j] += 1
                        slots[S_DELIVERY, slot] = forked[msg_j]
                    outcome_j, processing_j, send_j = _listen(
                        k, d, prefixes, conditions, slots[S_MSG_ID, slot],
                        slots[S_DELIVERY, slot],
                        poisoned[slots[S_INDEX, slot]] and slots[S_FIXED, slot] == 0, concurrency,
                    )  # fmt: skip
                    outcomes[j], sends[j] = outcome_j, send_j
                    processing += processing_j
                    if failing == SUCCESS and outcome_j != SUCCESS:
                        failing = outcome_j
                request_outcome, request_end = _consume_result(k, now, processing, failing)
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
                    outcome, end = request_outcome, request_end
                    if swept and outcome == TIMEOUT:  # each member counts in the cleaner's run
                        outcome, end = _swept(sweeps, _lane(k, topic, queue_id), end, k[K_TIMEOUT],
                                              now + processing, failing)  # fmt: skip
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
                    if twice and outcome == TIMEOUT and (failing != SUCCESS or (
                        ack_index != n and j > ack_index
                    )) and now + processing < horizon:  # fmt: skip
                        if slots[S_MSG_ID, slot] not in forked:  # its first fork: the
                            forked[slots[S_MSG_ID, slot]] = slots[S_DELIVERY, slot]  # count
                        if spare_count == 0 and used == slots.shape[1]:
                            slots, spare = _grow_slots(slots), _grow(spare)
                        spare_count, used, copy = _take_slot(slots, spare, spare_count, used)
                        if _send_back_again(k, intervals, levels, resend_levels, resend_intervals,
                                            slots, slot, copy, failing, now + processing, out,
                                            rows):  # fmt: skip
                            if events == len(event_keys):
                                event_keys, event_values = _grow(event_keys), _grow(event_values)
                            events = _push_eligible(event_keys, event_values, events, slots, copy)
                        else:
                            spare[spare_count] = copy
                            spare_count += 1
                    rows += 1
                    if step[0] == DLQ and replay_at != n:  # a dead letter the replay may re-send
                        if dead_count == dead.shape[1]:  # a message sent back twice: its copies'
                            dead = _wider(dead)
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
    waiting = rows
    out, rows = _pending(
        out, rows, k, born, slots, event_keys, event_values, events, waits, wait_sizes
    )
    out, rows = _pending(out, rows, k, born, slots, event_keys, event_values, 0, replays,
                         replay_sizes)  # fmt: skip
    if len(forked) > 0:
        _number_waiting(out, waiting, rows, forked)
    scratch = np.empty((S_FIELDS, 1), np.int64)
    for lane in range(len(queue_ids_used)):
        for j in range(cursor[lane], queue_end[lane]):
            out, rows = _pending_first(out, rows, k, born, scratch, by_queue[j], msg_ids,
                                       queue_ids, eligible_of)  # fmt: skip
            if rows >= CHUNK_ROWS:
                yield out, rows, horizon, deliveries, first
                rows = 0
    for position in range(next_arrival, count):
        out, rows = _pending_first(out, rows, k, born, scratch, position, msg_ids, queue_ids,
                                   eligible_of)  # fmt: skip
        if rows >= CHUNK_ROWS:
            yield out, rows, horizon, deliveries, first
            rows = 0
    yield out, rows, horizon, deliveries, first
