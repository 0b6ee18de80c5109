"""Named constants: RocketMQ defaults (with their source) and the simulator's own bounds."""

from __future__ import annotations

# store/.../config/MessageStoreConfig.messageDelayLevel
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
# DefaultMQPushConsumerImpl.getMaxReconsumeTimes: -1 means 16 for concurrent consumption.
DEFAULT_MAX_RECONSUME_TIMES_CONCURRENT = 16
# AbstractSendMessageProcessor.consumerSendMsgBack: delayLevel 0 => 3 + reconsumeTimes.
BROKER_FIRST_RETRY_LEVEL = 3
# ProcessQueue.cleanExpiredMsg sends an expired message back at this fixed level.
TIMEOUT_SEND_BACK_LEVEL = 3
# TopicValidator.RMQ_SYS_SCHEDULE_TOPIC, MixAll.RETRY_GROUP_TOPIC_PREFIX / DLQ_GROUP_TOPIC_PREFIX
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
# SubscriptionGroupConfig.retryQueueNums = 1 and MixAll.DLQ_NUMS_PER_GROUP = 1: one queue each.
RETRY_QUEUE_ID = 0
DLQ_QUEUE_ID = 0

FLAVORS = ("rocketmq4.concurrently",)
PLANNED_FLAVORS = (
    "rocketmq4.orderly",
    "rocketmq4.broadcasting",
    "rocketmq5.push",
    "rocketmq5.simple",
    "http.unordered",
    "http.ordered",
    "exponential",
    "customized",
)

# Simulator bounds: large enough for capacity planning, small enough to fail fast on typos.
MAX_DELAY_LEVELS = 64
MAX_RECONSUME_TIMES_4X = 10_000
MAX_FAIL_FIRST = 100_000
MAX_MESSAGES_PER_GROUP = 10_000_000_000
MAX_QUEUES = 65_536
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # broker maxMessageSize default 4 MiB
MAX_CONSUMER_INSTANCES = 100_000
MAX_CONSUMER_THREADS = 1_000
MAX_HORIZON_MS = 366 * 86_400_000
MAX_LOAD_BUCKETS = 1_000_000
DEFAULT_PROCESSING_MS = 10
# A lognormal with p99 above exp(z99^2 / 2) ~ 14.97 x its mean does not exist.
LOGNORMAL_MAX_P99_RATIO = 14.97
Z_99 = 2.3263478740408408
