"""Consumer topology: which instance runs a delivery, and which retry queue a retry lands on.

A group's instances each have their own ``threads`` (docs/model.md §5); what differs between
flavors is how deliveries are spread over them (docs/flavors.md, "Topology"):

- **By queue** (RocketMQ 4.x push, concurrently and orderly): rebalance sorts a topic's
  queues (broker, then queue id) and the group's client ids, and each instance takes the
  queues its allocation strategy gives it (``AllocateMessageQueueAveragely`` by default) and
  works on those only. ``%RETRY%group`` has ``retry_queue_nums`` queues on every broker
  (``SubscriptionGroupConfig``, default 1) and is allocated the same way, so with one broker
  a single instance consumes every retry of the group.
- **By message** (5.x push and simple, HTTP, SQS, Pub/Sub): consumers pop, so any instance
  can take any message. The broker hands deliveries out in turn: delivery ``d`` of message
  ``m`` goes to instance ``(m + d - 1) mod instances``, which spreads a message's retries
  too, and a delivery waits for a thread of its instance (a push client's local cache).
- **Broadcast** (4.x broadcasting): every instance consumes every message with its own
  threads; the tables follow one instance (instance 0).

Queue ids are numbered across brokers in that sorted order: broker ``b`` of ``B`` holds the
topic's queues ``[b Q/B, (b+1) Q/B)`` and the retry queues ``[b R, (b+1) R)``, ``R`` =
``retry_queue_nums``. The allocation is a closed form here; the tests check it against the
client's algorithm written from its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from retrysim.model.states import BROADCAST, BY_MESSAGE, BY_QUEUE

AVERAGELY, AVERAGELY_BY_CIRCLE = "averagely", "averagely_by_circle"
ALLOCATE_STRATEGIES = (AVERAGELY, AVERAGELY_BY_CIRCLE)


def owner(position: int, queues: int, instances: int, strategy: str) -> int:
    """The instance that ``strategy`` gives the queue at ``position`` of ``queues`` sorted
    queues (every queue has one; an instance may have none)."""
    if strategy == AVERAGELY_BY_CIRCLE or queues <= instances:
        return position % instances
    size, bigger = divmod(queues, instances)  # the first `bigger` instances take size + 1
    if position < bigger * (size + 1):
        return position // (size + 1)
    return bigger + (position - bigger * (size + 1)) // size


def owner_col(position: Column, queues: int, instances: int, strategy: str) -> Column:
    """The column twin of :func:`owner`."""
    if strategy == AVERAGELY_BY_CIRCLE or queues <= instances:
        return (position % F.lit(instances)).cast("int")
    size, bigger = divmod(queues, instances)
    split = bigger * (size + 1)
    return (
        F.when(position < F.lit(split), F.floor(position / F.lit(size + 1)))
        .otherwise(F.lit(bigger) + F.floor((position - F.lit(split)) / F.lit(size)))
        .cast("int")
    )


@dataclass(frozen=True)
class Units:
    """A group's independent units (:meth:`Topology.units`): ``first`` run side by side,
    each exporting the retries it sends to ``retry_owners``, which run after them."""

    first: tuple[tuple[int, ...], ...]
    retry_owners: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    """How one group's deliveries are spread over its instances (see the module text)."""

    balancing: str
    instances: int
    threads: int | None  # per instance; None: unlimited
    queues: int
    brokers: int
    retry_queue_nums: int
    allocate: str
    retry_topic: str | None  # the topic whose queues are the retry queues (by queue only)

    @property
    def retry_queues(self) -> int:
        return self.brokers * self.retry_queue_nums

    @property
    def assignable_instances(self) -> int:
        """How many instances can get work: by queue, those that own a queue they consume
        (both strategies give queues to the lowest-numbered instances first); broadcasting's
        tables follow one."""
        if self.balancing == BROADCAST:
            return 1
        if self.balancing == BY_MESSAGE:
            return self.instances
        retry_queues = self.retry_queues if self.retry_topic is not None else 0
        return min(self.instances, max(self.queues, retry_queues))

    @property
    def shared(self) -> bool:
        """Whether more than one instance can get the group's work (its ``load`` is then
        not one instance's, and ``instance_load`` needs each instance's own peaks)."""
        return self.assignable_instances > 1

    def units(self) -> Units | None:
        """The group split into units that can be simulated apart (docs/model.md §5,
        "Units"), or None when it is one unit. By queue, an instance that owns no retry
        queue runs its own queues' deliveries and nothing else: what fails there goes to a
        retry queue, whose owner takes it, or comes back to it (a failed send-back) -- so
        it depends on no other instance. The retry queues' owners take every such retry
        too, so they are simulated after the others, together, fed the retries those
        sent them. By message and broadcast, the group is one unit."""
        if self.balancing != BY_QUEUE or self.retry_topic is None:
            return None
        retry_owners = {
            owner(queue, self.retry_queues, self.instances, self.allocate)
            for queue in range(self.retry_queues)
        }
        alone = sorted(
            {
                owner(queue, self.queues, self.instances, self.allocate)
                for queue in range(self.queues)
            }
            - retry_owners
        )
        if not alone:
            return None
        return Units(tuple((instance,) for instance in alone), tuple(sorted(retry_owners)))

    @property
    def most_lanes_per_instance(self) -> int:
        """The most of the topic's queues whose deliveries one instance may run at once: by
        queue, either strategy gives an instance at most ``ceil(queues / instances)``."""
        if self.balancing != BY_QUEUE:
            return self.queues
        return -(-self.queues // self.instances)

    # ----------------------------------------------------------------- plain Python

    def instance(self, topic: str, queue_id: int, msg_id: int, delivery: int) -> int:
        """The instance that runs delivery ``delivery`` of ``msg_id`` from ``queue_id`` of
        ``topic``."""
        if self.balancing == BY_QUEUE:
            on_retry = topic == self.retry_topic
            queues = self.retry_queues if on_retry else self.queues
            return owner(queue_id, queues, self.instances, self.allocate)
        if self.balancing == BY_MESSAGE:
            return (msg_id + delivery - 1) % self.instances
        return 0

    def retry_queue(self, topic: str, queue_id: int, msg_id: int, delivery: int) -> int:
        """The retry queue a failed delivery is sent back to: one of the ``retry_queue_nums``
        queues of the broker that stored the message (the broker picks one at random; here
        the message id and delivery spread them). Only 4.x balances by queue; elsewhere the
        retry topic has one queue."""
        if self.retry_topic is None:
            return 0
        if topic == self.retry_topic:
            broker = queue_id // self.retry_queue_nums
        else:
            broker = queue_id // (self.queues // self.brokers)
        return broker * self.retry_queue_nums + (msg_id + delivery) % self.retry_queue_nums

    # ----------------------------------------------------------------- Spark columns

    def instance_col(self) -> Column:
        """The column twin of :meth:`instance` over an attempt row."""
        queue, msg_id, delivery = F.col("queue_id"), F.col("msg_id"), F.col("delivery")
        if self.balancing == BY_QUEUE:
            main = owner_col(queue, self.queues, self.instances, self.allocate)
            if self.retry_topic is None:
                return main
            retry = owner_col(queue, self.retry_queues, self.instances, self.allocate)
            return F.when(F.col("source_topic") == F.lit(self.retry_topic), retry).otherwise(main)
        if self.balancing == BY_MESSAGE:
            return ((msg_id + delivery - F.lit(1)) % F.lit(self.instances)).cast("int")
        return F.lit(0)

    def retry_queue_col(self) -> Column:
        """The column twin of :meth:`retry_queue` over an attempt row."""
        if self.retry_topic is None:
            return F.lit(0)
        queue = F.col("queue_id")
        per_broker = F.lit(self.retry_queue_nums)
        broker = F.when(
            F.col("source_topic") == F.lit(self.retry_topic), F.floor(queue / per_broker)
        ).otherwise(F.floor(queue / F.lit(self.queues // self.brokers)))
        spread = (F.col("msg_id") + F.col("delivery")) % per_broker
        return (broker * per_broker + spread).cast("int")
