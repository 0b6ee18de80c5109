"""RocketMQ 4.x rebalance and retry-queue routing, ported line by line from the source.

Written from apache/rocketmq (8fc57f1), not from retrysim's docs, so that the engine's closed
forms (retrysim.model.topology) are checked against what the client and broker do:

- ``client/.../rebalance/AllocateMessageQueueAveragely.java`` lines 37-46 and
  ``AllocateMessageQueueAveragelyByCircle.java`` lines 37-42: which queues an instance takes.
- ``client/.../impl/consumer/RebalanceImpl.java`` lines 305-306: ``mqAll`` and ``cidAll`` are
  sorted before allocating; ``MessageQueue.compareTo`` orders by topic, broker name, queue id.
- ``DefaultMQPushConsumerImpl.copySubscription`` (line 1212): a clustering consumer also
  subscribes ``%RETRY%group``, which rebalances like any topic.
- ``broker/.../AbstractSendMessageProcessor.java`` line 158: the send-back looks the message
  up in *this* broker's store, so the retry is stored on the broker that held the message;
  line 133: on one of that broker's ``retryQueueNums`` retry queues, picked at random
  (``SubscriptionGroupConfig.retryQueueNums`` = 1, line 36).
"""

from __future__ import annotations


def allocate_averagely(mq_all: list, cid_all: list, current_cid) -> list:
    index = cid_all.index(current_cid)
    mod = len(mq_all) % len(cid_all)
    if len(mq_all) <= len(cid_all):
        average_size = 1
    elif mod > 0 and index < mod:
        average_size = len(mq_all) // len(cid_all) + 1
    else:
        average_size = len(mq_all) // len(cid_all)
    start_index = index * average_size if (mod > 0 and index < mod) else index * average_size + mod
    range_ = min(average_size, len(mq_all) - start_index)
    return [mq_all[start_index + i] for i in range(range_)]


def allocate_averagely_by_circle(mq_all: list, cid_all: list, current_cid) -> list:
    index = cid_all.index(current_cid)
    return [mq_all[i] for i in range(index, len(mq_all)) if i % len(cid_all) == index]


STRATEGIES = {
    "averagely": allocate_averagely,
    "averagely_by_circle": allocate_averagely_by_circle,
}


def broker_name(broker: int) -> str:
    """Broker names that sort in broker order (compareTo sorts names as strings)."""
    return f"broker-{broker:04d}"


def topic_queues(topic: str, brokers: int, per_broker: int) -> list[tuple[str, str, int]]:
    """Every ``(topic, brokerName, queueId)`` of a topic with ``per_broker`` queues on each
    broker, sorted as ``Collections.sort(mqAll)`` leaves them."""
    return sorted((topic, broker_name(b), q) for b in range(brokers) for q in range(per_broker))


def owners(topic: str, brokers: int, per_broker: int, instances: int, strategy: str) -> dict:
    """``(topic, brokerName, queueId)`` -> the index (in sorted client ids) of the instance that
    takes it: every client runs the strategy for itself over the same sorted lists."""
    mq_all = topic_queues(topic, brokers, per_broker)
    cid_all = sorted(f"10.0.0.1@{i:06d}" for i in range(instances))
    taken = {}
    for index, cid in enumerate(cid_all):
        for mq in STRATEGIES[strategy](mq_all, cid_all, cid):
            assert mq not in taken, f"{mq} allocated twice"
            taken[mq] = index
    return taken
