"""The 5.x client's receives in the compiled event loop (docs/model.md §5, the 5.x client's
cache per instance): each instance's cache, its receives and long poll, and which waiting
long poll the broker answers. Plain int64 arrays in, as the loop keeps them.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from retrysim.engine.event_heaps import _FREE_PHASE, _KEY_SPAN, _event_push, _fifo_push
from retrysim.engine.event_rules import (
    K_INSTANCES,
    K_POP_CACHE,
    K_POP_THREADS,
    NULL,
    S_DELIVERY,
    S_ELIGIBLE,
    S_MSG_ID,
)
from retrysim.model.xxh64 import uniform
from retrysim.numba_cache import cache_by_source
from retrysim.scenario.limits import (
    CACHE_FULL_BACKOFF_MS,
    LONG_POLL_MS,
    POP_BATCH,
    POP_FROM_RETRY_PROBABILITY,
)

cache_by_source(__name__, __loader__, __file__)  # before the first @njit(cache=True)

# An instance's state under a 5.x push client's cache (docs/model.md §5), one column per
# instance: its next receive (NULL: a long poll waits for the next delivery), receives so far,
# the moment and start of the cache's run of deliveries the long poll answered together, its
# cache's FIFO ends, the instances whose receives are due this turn, and when its long poll
# was made (its born time: the broker answers the one made first).
(_RECEIVE_AT, _RECEIVES, _POLL_AT, _POLL_SINCE, _CACHE_HEAD, _CACHE_TAIL, _DUE, _BORN,
 _POP_FIELDS) = range(9)  # fmt: skip
# _RECEIVE_AT of a simple consumer whose threads are all busy: its next receive is when one
# frees; and of one whose receive is due this turn
_ON_FREE, _DUE_NOW = -1, -2


@njit(cache=True, inline="always")
def _entry_key(value, msg_ids, slots):
    """(msg_id, delivery) as one key of a cache entry: a first delivery's position, or -1 -
    the slot of any other delivery."""
    if value >= 0:
        return msg_ids[value] * _KEY_SPAN + 1
    return slots[S_MSG_ID, -1 - value] * _KEY_SPAN + slots[S_DELIVERY, -1 - value]


@njit(cache=True)
def _cache_push(caches, pop, cached, instance, value, now, polled, msg_ids, slots):
    """Append the entry ``value`` (:func:`_entry_key`) to ``instance``'s cache, counted in
    ``cached``: a receive's
    entries in the order it took them; those a long poll answered at one moment among
    themselves by (msg_id, delivery), the order they became eligible in."""
    cached[instance] += 1
    head, tail = pop[_CACHE_HEAD, instance], pop[_CACHE_TAIL, instance]
    fifo, moved, tail = _fifo_push(caches[instance], head, tail, value)
    caches[instance] = fifo
    pop[_POLL_SINCE, instance] -= head - moved
    pop[_CACHE_HEAD, instance], pop[_CACHE_TAIL, instance] = moved, tail
    if not polled:
        pop[_POLL_AT, instance] = NULL
        return
    pop[_BORN, instance] = now  # answered: its client asks again at once
    if pop[_POLL_AT, instance] != now:
        pop[_POLL_AT, instance], pop[_POLL_SINCE, instance] = now, tail - 1
    key = _entry_key(value, msg_ids, slots)
    j = tail - 1
    while (
        j > max(pop[_POLL_SINCE, instance], moved) and _entry_key(fifo[j - 1], msg_ids, slots) > key
    ):
        fifo[j] = fifo[j - 1]
        j -= 1
    fifo[j] = value


@njit(cache=True)
def _backoff(k, pop, instance, now, cached, event_keys, event_values, events):
    """``instance``'s receive after it found its cache full: a second later
    (``ProcessQueueImpl.receiveMessage``), or a simple consumer's when a thread frees.
    Returns the event heap's size."""
    if cached[instance] < k[K_POP_CACHE]:
        return events
    if k[K_POP_THREADS] == 1:
        pop[_RECEIVE_AT, instance] = _ON_FREE
        return events
    at = now + CACHE_FULL_BACKOFF_MS
    pop[_RECEIVE_AT, instance] = at
    _event_push(event_keys, event_values, events, 2 * at + _FREE_PHASE, -1 - instance)
    return events + 1


@njit(cache=True)
def _receive(k, prefix, instance, source, now, cached, pop, caches, overflow, fifo_ends,
             order, taken, arrived, eligible, msg_ids, slots, event_keys, event_values,
             events):  # fmt: skip
    """``instance``'s receives at ``now`` (docs/model.md §5): while its cache has room, a pop
    of up to the batch (a simple consumer's thread: one), from the retry topic first one time
    in five and else from the topic first; a pop that finds fewer leaves a long poll waiting;
    a full cache receives again a second later (a simple consumer: when a thread frees).
    What waits on the broker for it (``source``: its own, or 0 where the instances share the
    broker's, :func:`_long_poll`): the first deliveries in ``order[taken:arrived]`` of
    ``source``, its retries in ``overflow[2 * source]`` and its other deliveries of the topic
    (a replay) in ``overflow[2 * source + 1]``. Returns the event heap's size."""
    threshold = k[K_POP_CACHE]
    batch = 1 if k[K_POP_THREADS] == 1 else POP_BATCH
    while cached[instance] < threshold:
        want = min(threshold - cached[instance], batch)
        draw = uniform(prefix, instance, pop[_RECEIVES, instance])
        pop[_RECEIVES, instance] += 1
        retry_first = draw < POP_FROM_RETRY_PROBABILITY
        got = 0
        for side in range(2):
            retries = 2 * source
            topic = retries + 1
            from_retry = (side == 0) == retry_first
            while got < want:
                if from_retry:
                    if fifo_ends[0, retries] == fifo_ends[1, retries]:
                        break
                    value = -1 - overflow[retries][fifo_ends[0, retries]]
                    fifo_ends[0, retries] += 1
                else:  # the topic: its first deliveries and a replay's, in eligible order
                    position = order[taken[source]] if taken[source] < arrived[source] else -1
                    slot = overflow[topic][fifo_ends[0, topic]] if (
                        fifo_ends[0, topic] < fifo_ends[1, topic]) else -1  # fmt: skip
                    if position < 0 and slot < 0:
                        break
                    first = position >= 0 and slot < 0
                    if position >= 0 and slot >= 0:
                        at, other = eligible[position], slots[S_ELIGIBLE, slot]
                        first = at < other or (
                            at == other and msg_ids[position] < slots[S_MSG_ID, slot]
                        )  # fmt: skip
                    if first:
                        value = position
                        taken[source] += 1
                    else:
                        value = -1 - slot
                        fifo_ends[0, topic] += 1
                _cache_push(caches, pop, cached, instance, value, now, False, msg_ids, slots)
                got += 1
        if got < want:  # the broker had no more: a long poll waits
            pop[_RECEIVE_AT, instance], pop[_BORN, instance] = NULL, now
            return events
    return _backoff(k, pop, instance, now, cached, event_keys, event_values, events)


@njit(cache=True)
def _pop_state(instances):
    """``instances`` 5.x instances' receives (:data:`_RECEIVE_AT` ...: each one's long poll
    waiting) and their empty caches."""
    pop = np.zeros((_POP_FIELDS, instances), np.int64)
    pop[_RECEIVE_AT], pop[_POLL_AT] = NULL, NULL  # each one's long poll waits,
    pop[_BORN] = np.arange(instances) - instances  # made before the run, in instance order
    caches = List()
    for _ in range(instances):
        caches.append(np.empty(16, np.int64))
    return pop, caches


@njit(cache=True, inline="always")
def _shared_polls(k):
    """Whether the group's instances pop the topic together, so that the broker picks which
    instance takes a delivery (:func:`_long_poll`): a 5.x push group of several instances.
    A simple consumer's instances keep the round robin of docs/model.md §5."""
    return k[K_POP_CACHE] != NULL and k[K_POP_THREADS] == 0 and k[K_INSTANCES] > 1


@njit(cache=True, inline="always")
def _taker(k, pop, instance, now, shared):
    """The instance whose waiting long poll takes a delivery of ``instance`` that becomes
    eligible at ``now``, or -1 (it waits on the broker): its own, or where the instances
    share the broker's line the one :func:`_long_poll` picks."""
    if shared:
        return _long_poll(k, pop, now)
    return instance if pop[_RECEIVE_AT, instance] == NULL else -1


@njit(cache=True)
def _long_poll(k, pop, now):
    """The instance whose long poll the broker answers with a delivery that becomes eligible
    at ``now``, or -1 if none waits, where the instances pop the topic together (a 5.x push
    group of several instances, docs/model.md §5). The broker wakes the waiting poll that
    expires first, its born time plus the poll time (``PopLongPollingService`` polls the
    first of its set, ``PopRequest.COMPARATOR``), and that pop takes what is there, up to
    its batch: one answering at ``now`` takes the others that come now. A poll not answered
    within the poll time comes back empty and the client asks again at once: its born time
    moves on by whole poll times."""
    best, earliest = -1, NULL
    for i in range(pop.shape[1]):
        if pop[_RECEIVE_AT, i] != NULL:
            continue
        if pop[_POLL_AT, i] == now and pop[_CACHE_TAIL, i] - pop[_POLL_SINCE, i] < POP_BATCH:
            return i
        born = pop[_BORN, i] + (now - pop[_BORN, i]) // LONG_POLL_MS * LONG_POLL_MS
        if best < 0 or born < earliest:
            best, earliest = i, born
    return best
