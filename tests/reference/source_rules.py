"""RocketMQ 4.x send-back, ported from the source, not from retrysim's docs.

Each function is one Java method of apache/rocketmq at tag ``rocketmq-all-4.9.7`` (the 4.x
client and broker), kept to its branches and its names, so a rule retrysim's spec got wrong
disagrees here. The reference simulator (``simulator.py``) calls these for
``rocketmq4.concurrently`` instead of its own spec-written rules.

Objects are the Java ones, reduced to the fields the rules read: :class:`MessageExt` is a
message as the client holds it (its ``reconsume_times`` the client may change locally) with
the commit-log copy it was pulled from (``stored``); :class:`Put` is one
``CommitLog.asyncPutMessage``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # TopicValidator.RMQ_SYS_SCHEDULE_TOPIC
CLEAN_EXPIRED_MSG_LOOP = 16  # ProcessQueue.cleanExpiredMsg: Math.min(msgTreeMap.size(), 16)
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"  # MixAll
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"


class SendFailed(Exception):
    """An exception out of an RPC or a producer send."""


@dataclass(frozen=True)
class Stored:
    """A message as the commit log holds it (what ``lookMessageByOffset`` returns)."""

    reconsume_times: int


@dataclass
class MessageExt:
    """A message in the client's process queue."""

    reconsume_times: int
    stored: Stored


@dataclass(frozen=True)
class Put:
    """One commit-log write: where it lands now, and where a delayed one lands later."""

    topic: str
    queue_id: int
    reconsume_times: int
    delay_level: int  # > 0: stored in the schedule topic, delivered to real_topic later
    real_topic: str | None = None


def commit_log_put(topic: str, reconsume_times: int, delay_level: int, max_level: int) -> Put:
    """``CommitLog.asyncPutMessage`` lines 633-648: a level > 0 goes to the schedule topic,
    queue ``level - 1``, clamped to the highest level; the real topic is kept."""
    if delay_level > 0:
        delay_level = min(delay_level, max_level)
        return Put(SCHEDULE_TOPIC, delay_level - 1, reconsume_times, delay_level, topic)
    return Put(topic, 0, reconsume_times, 0)


def consumer_send_msg_back(
    group: str, msg: MessageExt, delay_level: int, max_reconsume_times: int, max_level: int
) -> Put:
    """Broker: ``SendMessageProcessor.consumerSendMsgBack`` lines 168-226. The request carries
    the commit-log offset; level and DLQ are decided on the copy found there."""
    msg_ext = msg.stored  # lookMessageByOffset(requestHeader.getOffset())
    new_topic = RETRY_GROUP_TOPIC_PREFIX + group
    if msg_ext.reconsume_times >= max_reconsume_times or delay_level < 0:  # line 191
        new_topic = DLQ_GROUP_TOPIC_PREFIX + group
        delay_level = 0  # msgExt.setDelayTimeLevel(0)
    elif delay_level == 0:
        delay_level = 3 + msg_ext.reconsume_times  # line 208
    # msgInner.setReconsumeTimes(msgExt.getReconsumeTimes() + 1), line 226
    return commit_log_put(new_topic, msg_ext.reconsume_times + 1, delay_level, max_level)


def handle_retry_and_dlq_put(
    group: str, reconsume_times: int, delay_property: int, max_reconsume_times: int, max_level: int
) -> Put:
    """Broker: a plain send to ``%RETRY%<group>``, ``SendMessageProcessor.sendMessage`` with
    ``handleRetryAndDLQ`` lines 359-373: ``reconsumeTimes >= max`` sends it to the DLQ, and
    ``setDelayTimeLevel(0)`` there is undone by ``MessageAccessor.setProperties(msgInner,
    origProps)`` (line 296), so the request's DELAY property still delays it."""
    topic = RETRY_GROUP_TOPIC_PREFIX + group
    if reconsume_times >= max_reconsume_times:
        topic = DLQ_GROUP_TOPIC_PREFIX + group
    return commit_log_put(topic, reconsume_times, delay_property, max_level)


def send_message_back_as_normal_message(
    group: str, msg: MessageExt, max_reconsume_times: int, max_level: int
) -> Put:
    """Client: the fallback in ``DefaultMQPushConsumerImpl.sendMessageBack`` lines 532-545:
    RECONSUME_TIME = the client's count + 1, DELAY = 3 + the client's count."""
    return handle_retry_and_dlq_put(
        group, msg.reconsume_times + 1, 3 + msg.reconsume_times, max_reconsume_times, max_level
    )


def send_message_back(
    group: str,
    msg: MessageExt,
    delay_level: int,
    max_reconsume_times: int,
    max_level: int,
    rpc_fails: bool,
    fallback_fails: bool,
) -> Put:
    """Client: ``DefaultMQPushConsumerImpl.sendMessageBack`` lines 522-549: the
    CONSUMER_SEND_MSG_BACK RPC, and when it throws, the producer fallback; when that throws
    too, the exception reaches the caller."""
    try:
        if rpc_fails:
            raise SendFailed("consumerSendMessageBack")
        return consumer_send_msg_back(group, msg, delay_level, max_reconsume_times, max_level)
    except SendFailed:
        if fallback_fails:
            raise
        return send_message_back_as_normal_message(group, msg, max_reconsume_times, max_level)


def process_consume_result_member(
    group: str,
    msg: MessageExt,
    delay_level_when_next_consume: int,
    max_reconsume_times: int,
    max_level: int,
    rpc_fails: bool,
    fallback_fails: bool,
) -> Put | None:
    """Client: one member past ``ackIndex`` in ``ConsumeMessageConcurrentlyService.
    processConsumeResult`` (CLUSTERING, lines 277-292) with ``sendMessageBack`` (308-321):
    the broker's write, or None when the send-back failed and the client, having counted
    ``reconsumeTimes + 1`` locally, resubmits the message later (5 s)."""
    try:
        return send_message_back(
            group,
            msg,
            delay_level_when_next_consume,
            max_reconsume_times,
            max_level,
            rpc_fails,
            fallback_fails,
        )
    except SendFailed:
        msg.reconsume_times += 1  # line 283
        return None


def clean_expired_msg(group: str, msg: MessageExt, max_reconsume_times: int, max_level: int) -> Put:
    """Client: ``ProcessQueue.cleanExpiredMsg`` line 109, ``sendMessageBack(msg, 3)``. Only
    orderly consumers skip the cleaner (line 80): a broadcasting consumer's expired message
    is sent back too, to a ``%RETRY%<group>`` it does not read (``copySubscription``
    subscribes the retry topic for CLUSTERING only, ``DefaultMQPushConsumerImpl`` 857-860).

    Where the model differs: its send-back draws do not apply here (a failed cleaner
    send-back leaves the message in the process queue for the next sweep, 15 min later,
    which retrysim does not model), so the RPC is taken to succeed."""
    return consumer_send_msg_back(group, msg, 3, max_reconsume_times, max_level)


@dataclass(eq=False)
class ProcessQueue:
    """``ProcessQueue.msgTreeMap``: one MessageQueue's messages pulled and not yet removed
    (``putMessage`` when pulled, ``removeMessage`` when consumed or cleaned), sorted by queue
    offset; a heap of offsets whose removed ones are skipped. An offset is anything ordered;
    a message anything with a ``consume_start_time_stamp`` (``MessageAccessor.
    getConsumeStartTimeStamp``: None until its consume request runs)."""

    msg_tree_map: dict[Any, Any] = field(default_factory=dict)
    offsets: list = field(default_factory=list)  # heap of every offset put

    def put_message(self, offset: Any, msg: Any) -> None:
        assert offset not in self.msg_tree_map, offset
        self.msg_tree_map[offset] = msg
        heapq.heappush(self.offsets, offset)

    def remove_message(self, offset: Any) -> bool:
        return self.msg_tree_map.pop(offset, None) is not None

    def size(self) -> int:
        return len(self.msg_tree_map)

    def first_entry(self) -> tuple[Any, Any] | None:
        """``msgTreeMap.firstEntry()``: the lowest offset still in the tree."""
        while self.offsets and self.offsets[0] not in self.msg_tree_map:
            heapq.heappop(self.offsets)
        return (self.offsets[0], self.msg_tree_map[self.offsets[0]]) if self.offsets else None


def clean_expired_msg_sweep(
    process_queue: ProcessQueue,
    now: int,
    consume_timeout: int,
    send_message_back: Callable[[Any, int], None],
) -> None:
    """Client: ``ProcessQueue.cleanExpiredMsg`` lines 79-130, one run of the cleaner on one
    process queue (``consume_timeout`` in ms; the source's is in minutes). At most
    ``min(size, 16)`` times: the head (lowest offset) is taken if its consume started more
    than the timeout ago, sent back at level 3 (``sendMessageBack(msg, 3)``,
    ``clean_expired_msg``) and removed if it is still the head (``msg.getQueueOffset() ==
    msgTreeMap.firstKey()``); the first head not expired, or not started (no start
    timestamp), ends the run (``if (msg == null) break``). A send-back that throws leaves the
    head in place and the loop goes on (the exception is logged), trying it again.

    The orderly check (``isConsumeOrderly``) is the caller's: it runs this for concurrent
    consumers only. The listener of a message cleaned here is not interrupted; what its
    return does is the consume service's (``processConsumeResult``), not this method's."""
    loop = min(process_queue.size(), CLEAN_EXPIRED_MSG_LOOP)
    for _ in range(loop):
        msg, offset = None, None
        first = process_queue.first_entry()  # !msgTreeMap.isEmpty()
        if first is not None:
            offset, head = first
            start = head.consume_start_time_stamp
            if start is not None and now - start > consume_timeout:
                msg = head
        if msg is None:
            break
        try:
            send_message_back(msg, 3)
            first = process_queue.first_entry()
            if first is not None and first[0] == offset:  # msg.getQueueOffset() == firstKey()
                process_queue.remove_message(offset)
        except SendFailed:
            pass  # log.error("send expired msg exception", e)


def delivered_copy(put: Put) -> MessageExt:
    """Client: the next pull of the retry topic gets the copy the broker stored."""
    return MessageExt(put.reconsume_times, Stored(put.reconsume_times))


def orderly_send_message_back(
    group: str, msg: MessageExt, max_reconsume_times: int, max_level: int
) -> Put:
    """Client: ``ConsumeMessageOrderlyService.sendMessageBack`` lines 377-398, a producer send
    to ``%RETRY%<group>`` with RECONSUME_TIME = the count as it is (line 386) and DELAY =
    3 + the count (line 389), which ``handleRetryAndDLQ`` dead-letters (delayed)."""
    return handle_retry_and_dlq_put(
        group, msg.reconsume_times, 3 + msg.reconsume_times, max_reconsume_times, max_level
    )


def check_reconsume_times(
    group: str, msg: MessageExt, max_reconsume_times: float, max_level: int
) -> Put | None:
    """Client: ``ConsumeMessageOrderlyService.checkReconsumeTimes`` lines 358-375: an
    exhausted message is sent back and the queue moves on (the broker's write returned);
    otherwise the count goes up locally and the queue is suspended (None). A failed
    send-back of an exhausted message (suspend, count + 1) is not modelled."""
    if msg.reconsume_times >= max_reconsume_times:
        return orderly_send_message_back(group, msg, int(max_reconsume_times), max_level)
    msg.reconsume_times += 1
    return None
