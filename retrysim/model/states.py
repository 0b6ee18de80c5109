"""The names a run's tables use: states, end and Ready reasons, and the retry paths."""

from __future__ import annotations

# How a flavor's instances share a topic's messages (model/topology.py): here, without
# Spark, so that reading a scenario (the flavor catalogue) needs no pyspark.
BY_QUEUE, BY_MESSAGE, BROADCAST = "queue", "message", "broadcast"

COMMIT, WAITING_RETRY, DLQ, DISCARD, INFLIGHT, READY = (
    "Commit",
    "WaitingRetry",
    "DLQ",
    "Discard",
    "Inflight",
    "Ready",
)
REASON_MAX_RECONSUME = "max_reconsume_times"
REASON_NEGATIVE_LEVEL = "delay_level_negative"
REASON_BROADCAST = "broadcast_no_retry"
REASON_SEND_BACK_FAILED = "send_back_failed"
# the send-back RPC failed and its producer fallback re-sent the message to %RETRY%<group>
REASON_SEND_BACK_FALLBACK = "send_back_fallback"
REASON_BEYOND_ACK = "beyond_ack_index"
# a 5.x FIFO push listener returned null: the client dead-letters it at once (only a
# failure is retried)
REASON_NULL_RESULT = "null_result"
# a 4.9 client sent a delivery the cleaner had sent back again, when its listener failed: a
# second copy of the message, through the schedule topic or to the DLQ
REASON_LATE_SEND_BACK = "late_send_back"
READY_PUBLISHED, READY_RETRY_DUE, READY_LOCAL, READY_VISIBLE, READY_REPLAYED = (
    "published",
    "retry_due",
    "local_retry",
    "visible_again",
    "replayed",
)
# Retry paths (docs/flavors.md): where a retried message waits and where it comes back.
SCHEDULE, REVIVE, VISIBLE, LOCAL, NO_RETRY = "schedule", "revive", "visible", "local", "none"
