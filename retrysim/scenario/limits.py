"""Named constants: RocketMQ defaults (with their source) and the simulator's own bounds."""

from __future__ import annotations

SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS

# store/.../config/MessageStoreConfig.messageDelayLevel
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
# DefaultMQPushConsumerImpl.getMaxReconsumeTimes: -1 means 16 for concurrent consumption.
DEFAULT_MAX_RECONSUME_TIMES_CONCURRENT = 16
# ConsumeMessageOrderlyService.getMaxReconsumeTimes: -1 means Integer.MAX_VALUE.
INTEGER_MAX_VALUE = 2**31 - 1
# AbstractSendMessageProcessor.consumerSendMsgBack: delayLevel 0 => 3 + reconsumeTimes.
BROKER_FIRST_RETRY_LEVEL = 3
# ProcessQueue.cleanExpiredMsg sends an expired message back at this fixed level.
TIMEOUT_SEND_BACK_LEVEL = 3
# DefaultMQPushConsumer.consumeTimeout: 15 minutes.
DEFAULT_CONSUME_TIMEOUT_4X_MS = 15 * MINUTE_MS
# ConsumeMessageConcurrentlyService.submitConsumeRequestLater: a failed send-back is resubmitted
# locally after 5 s.
SEND_BACK_RESUBMIT_MS = 5 * SECOND_MS
# ProcessQueue.cleanExpiredMsg (4.9.7 lines 84-98): one run of the 4.x client's
# expired-message cleaner sends back at most this many messages of a process queue, from
# its head, and stops at the first one not expired.
CLEANER_MESSAGES = 16
# DefaultMQPushConsumer.suspendCurrentQueueTimeMillis (1000) and its clamp in
# ConsumeMessageOrderlyService.submitConsumeRequestLater (10 .. 30000 ms).
DEFAULT_SUSPEND_MS = 1_000
MIN_SUSPEND_MS, MAX_SUSPEND_MS = 10, 30_000
# DefaultMQPushConsumerImpl.checkConfig: consumeMessageBatchMaxSize in [1, 1024].
MAX_CONSUME_BATCH = 1_024

# TopicValidator.RMQ_SYS_SCHEDULE_TOPIC, MixAll.RETRY_GROUP_TOPIC_PREFIX / DLQ_GROUP_TOPIC_PREFIX
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
# SubscriptionGroupConfig.retryQueueNums = 1 and MixAll.DLQ_NUMS_PER_GROUP = 1: one queue each
# (a 4.x group's retry queues per broker are the key retry_queue_nums).
RETRY_QUEUE_ID = 0
DLQ_QUEUE_ID = 0
DEFAULT_BROKERS, MAX_BROKERS = 1, 1_024
DEFAULT_RETRY_QUEUE_NUMS, MAX_RETRY_QUEUE_NUMS = 1, 1_024
# DefaultMQPushConsumer.pullThresholdForQueue: a 4.x push client pulls a queue only while it
# caches at most this many of its messages, pullBatchSize (32) a pull (checkConfig's range
# 1 .. 65535).
DEFAULT_PULL_THRESHOLD_FOR_QUEUE, MAX_PULL_THRESHOLD_FOR_QUEUE = 1_000, 65_535
PULL_BATCH = 32
# PushConsumerBuilderImpl.maxCacheMessageCount (rocketmq-clients java-5.2.0 line 41): a 5.x
# push client receives only while it caches fewer than this many messages over its
# assignments (an unordered group's one assignment: the topic); the proxy's receive batch,
# ProxyConfig.grpcClientConsumerLongPollingBatchSize (5.3.3 line 138); the broker's share of
# pops that read the retry topic first, BrokerConfig.popFromRetryProbability (5.3.3 line 240);
# and the client's pause before it receives again into a full cache
# (ProcessQueueImpl.RECEIVING_BACKOFF_DELAY_WHEN_CACHE_IS_FULL, line 87).
DEFAULT_MAX_CACHE_MESSAGE_COUNT, MAX_MAX_CACHE_MESSAGE_COUNT = 1_024, 65_535
POP_BATCH = 32
POP_FROM_RETRY_PROBABILITY = 0.2
CACHE_FULL_BACKOFF_MS = 1_000
# How long the broker holds a 5.x pop that finds nothing: the proxy's
# grpcClientConsumerMaxLongPollingTimeoutMillis (ProxyConfig, 5.3.3 line 137), which it sends
# the client in its settings and caps a receive at (ReceiveMessageActivity lines 69-80).
LONG_POLL_MS = 20_000

# ApsaraMQ 5.x (the consumption-retry document, docs/flavors.md): push-consumer retry intervals for
# unordered messages, 2 h after the 16th; default 16 and at most 1000 retries; the push
# consumer's consume timeout is 1 minute; simple-consumer invisible time 10 s .. 12 h.
APSARAMQ_PUSH_INTERVALS = "10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_RETRIES_5X = 16
MAX_RETRIES_5X = 1_000
DEFAULT_CONSUME_TIMEOUT_5X_MS = MINUTE_MS
MIN_INVISIBLE_MS, MAX_INVISIBLE_MS = 10 * SECOND_MS, 12 * HOUR_MS
DEFAULT_INVISIBLE_MS = 30 * SECOND_MS
# Open-source Apache RocketMQ 5.x (deployment: apache, the default; docs/flavors.md): the push
# client receives with autoRenew, so the proxy pops with defaultInvisibleTimeMills (60 s) and,
# scanning every 5 s, renews the invisibility renewAheadTimeMillis (10 s) before it ends by the
# next RenewStrategyPolicy step, until renewMaxTimeMillis (3 h) has passed since the receive;
# then it nacks the delivery (ProxyConfig lines 126 and 204-206, DefaultReceiptHandleManager
# lines 181-222). The client itself never times a listener out.
DEPLOYMENTS = ("apache", "apsaramq")
DEFAULT_DEPLOYMENT = "apache"
# The 4.x push client a rocketmq4.concurrently group runs: "4.9" (up to 5.0.x: a delivery the
# cleaner sent back is sent back again when its listener fails) or "5.1" (5.1.0 and later)
DEFAULT_CLIENT_VERSION = "4.9"
APACHE_POP_INVISIBLE_MS = MINUTE_MS
APACHE_RENEW_STEPS_MS = tuple(m * MINUTE_MS for m in (1, 3, 5, 10, 30, 60))
APACHE_RENEW_AHEAD_MS = 10 * SECOND_MS
APACHE_RENEW_MAX_MS = 3 * HOUR_MS
# The open-source broker's reviver writes a retry (or the copy it then dead-letters) after its
# checkpoint's revive time: PopReviveService.mergeAndRevive revives a checkpoint once the scan
# has read past reviveTime + ackTimeInterval + SECOND (2 s), and the scan thread comes round
# every reviveInterval (1 s), resting up to reviveMaxSlow (3) intervals when quiet
# (rocketmq-all-5.3.3 PopReviveService lines 307-439, 470-525, 627-684; BrokerConfig). retrysim
# puts the write at 2 s plus one interval; the brokers measured 2.0 to 5.0 s (docs/flavors.md).
REVIVE_ACK_WINDOW_MS = 2 * SECOND_MS
REVIVE_INTERVAL_MS = SECOND_MS
REVIVE_MAX_SLOW = 3
APACHE_REVIVE_LAG_MS = REVIVE_ACK_WINDOW_MS + REVIVE_INTERVAL_MS


def apache_renewal_stop_ms() -> int:
    """When, after a push delivery's start, the open-source proxy stops renewing it and nacks:
    the first renewal due at least ``renewMaxTimeMillis`` after the receive (13,710 s; each
    renewal taken at its earliest, the 5 s scan may make it up to 5 s later)."""
    expires, renewals = APACHE_POP_INVISIBLE_MS, 0
    while (due := expires - APACHE_RENEW_AHEAD_MS) < APACHE_RENEW_MAX_MS:
        expires = due + APACHE_RENEW_STEPS_MS[min(renewals, len(APACHE_RENEW_STEPS_MS) - 1)]
        renewals += 1
    return due


# CustomizedRetryPolicy.next (remoting/.../subscription): the open-source gRPC clients index
# it from its first entry (CustomizedBackoffRetryPolicy), docs/flavors.md.
GRPC_CLIENT_INTERVALS = DEFAULT_MESSAGE_DELAY_LEVEL
# ExponentialRetryPolicy defaults: initial 5 s, max 2 h, multiplier 2.
EXPONENTIAL_INITIAL_MS, EXPONENTIAL_MAX_MS, EXPONENTIAL_MULTIPLIER = 5_000, 2 * HOUR_MS, 2.0
# Alibaba Cloud MQ TCP/HTTP retry document (docs/flavors.md): HTTP retries every 5 min
# (unordered) or 1 min (ordered), at most 288 times, fixed by the service.
HTTP_UNORDERED_INTERVAL_MS, HTTP_ORDERED_INTERVAL_MS = 5 * MINUTE_MS, MINUTE_MS
HTTP_MAX_RETRIES = 288

# Comparison presets (AWS SQS and Google Pub/Sub documented limits and defaults).
SQS_DEFAULT_VISIBILITY_MS, SQS_MAX_VISIBILITY_MS = 30 * SECOND_MS, 12 * HOUR_MS
SQS_DEFAULT_MAX_RECEIVE, SQS_MAX_RECEIVE = 10, 1_000
PUBSUB_MIN_BACKOFF_MS, PUBSUB_MAX_BACKOFF_MS = 10 * SECOND_MS, 600 * SECOND_MS
PUBSUB_BACKOFF_LIMIT_MS = 600 * SECOND_MS
PUBSUB_DEFAULT_ATTEMPTS, PUBSUB_MIN_ATTEMPTS, PUBSUB_MAX_ATTEMPTS = 5, 5, 100
PUBSUB_DEFAULT_ACK_DEADLINE_MS = 10 * SECOND_MS
PUBSUB_MIN_ACK_DEADLINE_MS, PUBSUB_MAX_ACK_DEADLINE_MS = 10 * SECOND_MS, 600 * SECOND_MS

# DefaultMQPushConsumer.consumeThreadMin: 20 threads per instance.
DEFAULT_CONSUMER_THREADS = 20

# Simulator bounds: large enough for capacity planning, small enough to fail fast on typos.
MAX_DELAY_LEVELS = 64
MAX_RECONSUME_TIMES_4X = 10_000
MAX_FAIL_FIRST = 100_000
MAX_MESSAGES_PER_GROUP = 10_000_000_000
MAX_QUEUES = 65_536
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # broker maxMessageSize default 4 MiB
MAX_CONSUMER_INSTANCES = 100_000
MAX_CONSUMER_THREADS = 1_000
MAX_DOWNSTREAM_CAPACITY = 1_000_000  # concurrent calls a downstream serves at full speed
MAX_CLIENT_OVERHEAD_MS = 1_000  # the client's own time per delivery: a round trip at most
MAX_HORIZON_MS = 366 * 86_400_000
MAX_LOAD_BUCKETS = 1_000_000
MAX_CUSTOM_INTERVALS = 1_000
DEFAULT_PROCESSING_MS = 10
# A lognormal with p99 above exp(z99^2 / 2) ~ 14.97 x its mean does not exist.
LOGNORMAL_MAX_P99_RATIO = 14.97
Z_99 = 2.3263478740408408
# A frontier this thin is finished event by event in one stage (engine/rounds.frontier_attempts)
# rather than one Spark stage per remaining round: a round has a fixed cost however small its
# frontier, and a thin frontier is mostly poison messages that stay for every round (an
# always-failing HTTP message alone takes 289 rounds), so the event loop wins below a few
# thousand messages and loses well above (docs/performance.md).
TAIL_ROWS = 5_000
# Replications of a scenario or plan point (--replications), and runs in one plan.
MAX_REPLICATIONS = 100
MAX_PLAN_RUNS = 1_000
DEFAULT_CONFIDENCE = 0.95  # the share of replications a recommended pool must meet
# Traffic shapes: the highest rate of a profile piece, and the largest scale of a file.
MAX_PROFILE_RATE = 10_000_000.0
MAX_TRAFFIC_SCALE = 1_000.0
