"""The RocketMQ metric series retrysim reads and writes, and what each is in retrysim's terms.

Two families name the same quantities: RocketMQ 5.x's own metrics (the broker and proxy's
OpenTelemetry meters, and the 5.x client's ``rocketmq_process_time``) and the RocketMQ
exporter's for 4.x (``rocketmq-exporter``, which polls a 4.x broker's statistics). Each is
accepted as RocketMQ documents it and with the suffixes the OpenTelemetry Prometheus exporter
adds (``_total`` on a counter, the unit such as ``_milliseconds``), so a series is found by
its base name (:func:`base_name`).
"""

from __future__ import annotations

from dataclasses import dataclass

# the OpenTelemetry Prometheus exporter's unit suffixes (its counters also end in _total)
UNIT_SUFFIXES = ("_milliseconds", "_ms", "_seconds", "_messages", "_bytes")
# a histogram's series: the cumulative bucket counts by `le`, their sum and count
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

COUNTER = "counter"  # cumulative; retrysim reads its rate, and a reset is an error
GAUGE = "gauge"  # a level sampled at each scrape
RATE = "rate"  # a per-second rate the exporter already computed (4.x *_tps)
HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Series:
    """One RocketMQ series: its documented name, kind, the label naming the group (None: the
    series is per topic) and the quantity it gives in retrysim's terms (:data:`QUANTITIES`)."""

    name: str
    family: str  # "5.x" or "4.x"
    kind: str
    quantity: str
    group_label: str | None = "consumer_group"
    topic_label: str = "topic"
    filters: tuple[tuple[str, str], ...] = ()  # label values the series must have


# what retrysim compares and fits, by quantity: (description, unit)
QUANTITIES = {
    "published": ("messages published per second", "1/s"),
    "deliveries": ("deliveries started per second, first and retries", "1/s"),
    "first_deliveries": ("first deliveries per second", "1/s"),
    "retries": ("retries delivered per second", "1/s"),
    "dlq": ("messages moved to the DLQ per second", "1/s"),
    "lag": ("messages published and not yet consumed, as the broker counts them", "messages"),
    "inflight": ("messages delivered and not yet settled", "messages"),
    "queueing_latency": ("the oldest Ready message's age", "ms"),
    "process_time": ("the listener's processing time per delivery", "ms"),
    "busy_threads": ("consumer threads busy on average (processing ms per second)", "threads"),
}

FIVE = "5.x"
FOUR = "4.x"

SERIES = (
    # RocketMQ 5.x: BrokerMetricsConstant, ProxyMetricsConstant, ClientMetricsConstant
    Series("rocketmq_messages_in_total", FIVE, COUNTER, "published", group_label=None),
    Series("rocketmq_messages_out_total", FIVE, COUNTER, "first_deliveries",
           filters=(("is_retry", "false"),)),
    Series("rocketmq_messages_out_total", FIVE, COUNTER, "retries",
           filters=(("is_retry", "true"),)),
    Series("rocketmq_consumer_lag_messages", FIVE, GAUGE, "lag"),
    Series("rocketmq_consumer_inflight_messages", FIVE, GAUGE, "inflight"),
    Series("rocketmq_consumer_queueing_latency", FIVE, GAUGE, "queueing_latency"),
    Series("rocketmq_send_to_dlq_messages_total", FIVE, COUNTER, "dlq"),
    Series("rocketmq_process_time", FIVE, HISTOGRAM, "process_time"),
    # the RocketMQ exporter (4.x): MetricsCollectTask and RMQMetricsCollector. Where two
    # series give a quantity, the first listed is read: the offsets are exact counts, the
    # *_tps a minute's moving average
    Series("rocketmq_producer_offset", FOUR, COUNTER, "published", group_label=None),
    Series("rocketmq_producer_tps", FOUR, RATE, "published", group_label=None),
    # the committed offset: the group's first deliveries done (a failed one is sent back)
    Series("rocketmq_consumer_offset", FOUR, COUNTER, "first_deliveries", group_label="group"),
    # the exporter leaves %RETRY% topics out of consumer_tps: first deliveries only
    Series("rocketmq_consumer_tps", FOUR, RATE, "first_deliveries", group_label="group"),
    Series("rocketmq_group_diff", FOUR, GAUGE, "lag", group_label="group"),
    Series("rocketmq_group_retrydiff", FOUR, GAUGE, "lag", group_label="group"),
    Series("rocketmq_group_get_latency_by_storetime", FOUR, GAUGE, "queueing_latency",
           group_label="group"),
    # the retry topic's max offsets (topic %RETRY%<group>): their rise is the retries put there
    # when due; the DLQ's are labelled by group (the topic's name without %DLQ%)
    Series("rocketmq_topic_retry_offset", FOUR, COUNTER, "retries", group_label=None),
    Series("rocketmq_topic_dlq_offset", FOUR, COUNTER, "dlq", group_label="group"),
)  # fmt: skip

# the 5.x client's process-time histogram buckets (rocketmq-clients java-5.2.0,
# HistogramEnum.java lines 61-62), in ms
PROCESS_TIME_BUCKETS_MS = (1.0, 5.0, 10.0, 100.0, 1_000.0, 10_000.0, 60_000.0)

# The labels retrysim writes beside topic and consumer_group (retrysim export): RocketMQ
# 5.x's own. The cluster names the run; a consumer instance is the 5.x client's client_id
# (Prometheus sets ``instance`` on every series it scrapes).
CLUSTER_LABEL = "cluster"
IS_RETRY_LABEL = "is_retry"
INVOCATION_STATUS_LABEL = "invocation_status"
CLIENT_LABEL = "client_id"
SUCCESS, FAILURE = "success", "failure"  # the 5.x client's invocation_status values

# retrysim's own series, per consumer instance (instance_load): no RocketMQ series gives an
# instance's thread use
INSTANCE_UTILIZATION = "retrysim_instance_utilization"
INSTANCE_DELIVERIES = "retrysim_instance_deliveries_total"
INSTANCE_READY = "retrysim_instance_ready_messages"


def base_name(name: str) -> str:
    """``name`` without a histogram's part suffix and the exporter's unit and ``_total``
    suffixes, so that ``rocketmq_consumer_queueing_latency_milliseconds`` and
    ``rocketmq_consumer_queueing_latency`` are the same series, as are
    ``rocketmq_messages_in_total`` and ``rocketmq_messages_in``."""
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith("_total"):
        name = name[: -len("_total")]
    for suffix in UNIT_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in _BASES:
            return name[: -len(suffix)]
    return name


def _strip(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def family_name(name: str) -> str:
    """The OpenMetrics family of a sample name: a counter's without its ``_total``."""
    return _strip(name)


def five_x(quantity: str) -> Series:
    """RocketMQ 5.x's series of ``quantity`` (:data:`QUANTITIES`)."""
    (series,) = [s for s in SERIES if s.family == FIVE and s.quantity == quantity]
    return series


_BASES = {_strip(series.name) for series in SERIES}


def series_named(name: str) -> list[Series]:
    """The known series ``name`` (as exported, suffixes allowed) is, or none."""
    base = base_name(name)
    return [series for series in SERIES if _strip(series.name) == base]
