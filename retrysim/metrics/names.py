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
    "lag": ("messages published and not yet committed (Ready, in flight, cached)", "messages"),
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
    # the RocketMQ exporter (4.x): MetricCollectService and RMQMetricsCollector
    Series("rocketmq_producer_tps", FOUR, RATE, "published", group_label=None),
    Series("rocketmq_consumer_tps", FOUR, RATE, "deliveries", group_label="group"),
    Series("rocketmq_group_diff", FOUR, GAUGE, "lag", group_label="group"),
    Series("rocketmq_group_get_latency_by_storetime", FOUR, GAUGE, "queueing_latency",
           group_label="group"),
    # the retry and DLQ topics' max offsets: their rise is the messages put there
    Series("rocketmq_topic_retry_offset", FOUR, COUNTER, "retries", group_label=None),
    Series("rocketmq_topic_dlq_offset", FOUR, COUNTER, "dlq", group_label=None),
)  # fmt: skip

# the 5.x client's process-time histogram buckets (ClientMeterManager), in ms
PROCESS_TIME_BUCKETS_MS = (1.0, 5.0, 10.0, 100.0, 10_000.0, 60_000.0)


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


_BASES = {_strip(series.name) for series in SERIES}


def series_named(name: str) -> list[Series]:
    """The known series ``name`` (as exported, suffixes allowed) is, or none."""
    base = base_name(name)
    return [series for series in SERIES if _strip(series.name) == base]
