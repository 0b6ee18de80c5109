"""The heaps the compiled event loops order by (numba): waiting deliveries by (eligible_ms,
msg_id, delivery), events by (time, phase), and the lanes' heads by (eligible_ms, msg_id,
delivery, lane). Arrays in, no objects: a loop keeps its heaps as plain int64 arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from retrysim.numba_cache import cache_by_source

cache_by_source(__name__, __loader__, __file__)  # before the first @njit(cache=True)

# an event's phase within its millisecond: threads free before deliveries become eligible
_FREE_PHASE, _ELIGIBLE_PHASE = 0, 1
_KEY_SPAN = 1 << 21  # above any message's deliveries: (msg_id, delivery) as one key

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


# --------------------------------------------------------------------------- FIFOs


@njit(cache=True)
def _fifo_push(fifo, head, tail, value):
    """Append ``value`` to the FIFO held in ``fifo[head:tail]``; returns (fifo, head, tail),
    the array compacted to its front, or grown, when its end is reached."""
    if tail == len(fifo):
        live = tail - head
        bigger = np.empty(2 * len(fifo) if 2 * live > len(fifo) else len(fifo), np.int64)
        bigger[:live] = fifo[head:tail]
        fifo, head, tail = bigger, 0, live
    fifo[tail] = value
    return fifo, head, tail + 1
