"""Hypothesis strategies of small scenarios for every flavor, valid for retrysim's config.

Shared by the reference's own property test and the engine-vs-reference property test.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

FLAVORS = [
    ("rocketmq4.concurrently", False),
    ("rocketmq4.orderly", True),
    ("rocketmq4.broadcasting", False),
    ("http.unordered", False),
    ("http.ordered", True),
    ("rocketmq5.push", False),
    ("rocketmq5.push+ordered", True),
    ("rocketmq5.simple", False),
    ("exponential", False),
    ("customized", False),
    ("sqs", False),
    ("pubsub", False),
]
# An ordered rocketmq5.push group's retry policy: the server's default (the gRPC client's
# list from 1 s), short customized intervals, or an exponential backoff.
ORDERED_POLICIES = [
    None,
    {"kind": "customized", "intervals": ["10ms", "1s", "5s"]},
    {"kind": "exponential", "initial": "100ms", "max": "3s", "multiplier": 3},
]
CONSUMERS = [
    "unlimited",
    {"instances": 1, "threads": 1},
    {"instances": 1, "threads": 2},
    {"instances": 2, "threads": 2},
    {"instances": 3, "threads": 1},
    {"instances": 5, "threads": 2},
]


@st.composite
def group_configs(draw, name: str = "g", max_messages: int = 12) -> tuple[dict[str, Any], bool]:
    """(group mapping, whether its flavor is blocking)."""
    flavor, blocking = draw(st.sampled_from(FLAVORS))
    proc = draw(
        st.one_of(
            st.sampled_from([0, "5ms", "300ms", "2s", "20s", "70s"]),
            st.builds(
                lambda d, m: {"dist": d, "mean": m},
                st.just("exponential"),
                st.sampled_from(["10ms", "1s", "30s"]),
            ),
            st.just({"dist": "lognormal", "mean": "500ms", "p99": "5s"}),
        )
    )
    behavior: dict[str, Any] = {
        "fail_probability": draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])),
        "poison_fraction": draw(st.sampled_from([0.0, 0.2])),
        "fail_first": draw(st.integers(0, 3)),
        "processing_time": proc,
        "ready_wait": draw(st.sampled_from([0, "100ms", "3s"])),
        "client_overhead": draw(st.sampled_from([0, 0, "0.4ms", "2.5ms"])),
        "outcome_mix": {"reconsume_later": 1, "exception": 1, "null_return": 1},
    }
    if draw(st.booleans()):
        start = draw(st.sampled_from(["0s", "5s", "1m"]))
        behavior["outages"] = [
            {"start": start, "end": "3m", "fail_probability": draw(st.sampled_from([0.5, 1.0]))}
        ]
    if draw(st.booleans()):  # a downstream that answers to load (model.md §3)
        behavior["downstream"] = {
            "capacity": draw(st.integers(1, 3)),
            # broadcasting follows one instance: a shared downstream is refused there
            "per": draw(st.sampled_from(["group", "instance"]))
            if flavor != "rocketmq4.broadcasting"
            else "instance",
            "shed": draw(st.sampled_from([0.0, 0.0, 0.5, 1.0])),
        }
        timeout = draw(st.sampled_from([None, "50ms", "1s", "10s"]))
        if timeout is not None:
            behavior["downstream"]["timeout"] = timeout
    g: dict[str, Any] = {
        "name": name,
        "flavor": flavor.split("+")[0],
        "workload": {
            "messages": draw(st.integers(1, max_messages)),
            "over": draw(st.sampled_from(["1ms", "10s", "5m"])),
            "arrival": draw(st.sampled_from(["uniform", "poisson"])),
            "queues": draw(st.integers(1, 4)),
        },
        "consumers": draw(st.sampled_from(CONSUMERS)),
        "behavior": behavior,
    }
    queues = g["workload"]["queues"]
    g["brokers"] = draw(st.sampled_from([b for b in (1, 2, 4) if queues % b == 0]))
    g["retry_queue_nums"] = draw(st.integers(1, 3))
    g["allocate"] = draw(st.sampled_from(["averagely", "averagely_by_circle"]))
    if "+ordered" in flavor:
        g["ordered"] = True
    if flavor == "rocketmq4.orderly":
        g["suspend_current_queue_time"] = draw(st.sampled_from(["10ms", "1s", "5s"]))
    if flavor == "rocketmq5.push+ordered":
        policy = draw(st.sampled_from(ORDERED_POLICIES))
        if policy is not None:
            g["retry_policy"] = policy
    if not flavor.startswith("http") and flavor not in ("sqs", "pubsub", "rocketmq4.broadcasting"):
        g["max_reconsume_times"] = draw(st.sampled_from([-1, 0, 1, 3]))
        if g.get("suspend_current_queue_time") == "10ms" and g["max_reconsume_times"] == -1:
            # an orderly poison message retried every 10 ms for an hour: too slow for a test
            g["max_reconsume_times"] = 200
    if flavor == "rocketmq4.concurrently":
        g["consume_message_batch_max_size"] = draw(st.sampled_from([1, 1, 3]))
        ack_index = draw(st.sampled_from([None, 0, 1]))
        if ack_index is not None:
            g["ack_index"] = ack_index
        g["pull_interval"] = draw(st.sampled_from([0, 0, "500ms"]))
        g["delay_level_when_next_consume"] = draw(st.sampled_from([0, 0, 1, -1]))
        g["consume_timeout_check"] = draw(st.sampled_from(["exact", "periodic"]))
        behavior["send_back_failure_probability"] = draw(st.sampled_from([0.0, 0.3]))
        behavior["send_back_fallback_probability"] = draw(st.sampled_from([0.0, 0.3]))
    if flavor.startswith(("rocketmq4.c", "rocketmq4.b")):
        g["consume_timeout"] = draw(st.sampled_from(["15m", "1s", "10s"]))
        # a cache of a few messages per queue: the pull threshold binds in small scenarios
        g["pull_threshold_for_queue"] = draw(st.sampled_from([1_000, 2, 5]))
    if flavor in ("rocketmq5.push", "exponential", "customized"):
        # a cache of a few messages per instance: receives and their backoff bind
        g["max_cache_message_count"] = draw(st.sampled_from([1_024, 2, 5]))
    if flavor == "rocketmq5.simple":
        g["invisible_duration"] = draw(st.sampled_from(["10s", "30s"]))
    if flavor == "sqs":
        g["retry_policy"] = {
            "kind": "sqs",
            "visibility_timeout": draw(st.sampled_from([0, "1s", "30s"])),
            "max_receive_count": draw(st.integers(1, 4)),
        }
    if flavor == "pubsub":
        g["retry_policy"] = {
            "kind": "pubsub",
            "minimum_backoff": draw(st.sampled_from([0, "1s", "10s"])),
            "max_delivery_attempts": 5,
        }
    if flavor == "exponential":
        g["retry_policy"] = {"kind": "exponential", "initial": "1s", "max": "20s"}
    if flavor == "customized":
        # 0 and 1 s: a nack's checkpoint already due is written once, not through the timer;
        # without intervals, the deployment's list
        g["retry_policy"] = draw(
            st.sampled_from(
                [{"kind": "customized", "intervals": ["0ms", "1s", "3s"]}, {"kind": "customized"}]
            )
        )
    if flavor == "rocketmq5.push" and draw(st.booleans()):
        g["retry_policy"] = {"kind": "grpc_client"}
    if flavor.startswith(("rocketmq5", "exponential", "customized")):
        g["deployment"] = draw(st.sampled_from(["apache", "apsaramq"]))
    if flavor != "rocketmq4.broadcasting" and draw(st.booleans()):
        g["dlq_enabled"] = False
    elif flavor != "rocketmq4.broadcasting" and draw(st.booleans()):
        g["replay"] = {
            "at": draw(st.sampled_from(["30s", "5m"])),
            "rate": draw(st.sampled_from(["1/s", 1000, "60/m"])),
            "poison_fixed": draw(st.booleans()),
        }
    return g, blocking


def pool_size(group: dict[str, Any]) -> int | None:
    consumers = group["consumers"]
    return None if consumers == "unlimited" else consumers["instances"] * consumers["threads"]


@st.composite
def scenarios(draw, groups: int = 1, max_messages: int = 12) -> dict[str, Any]:
    """A scenario of ``groups`` random groups named g0, g1, ..."""
    return {
        "name": "p",
        "seed": draw(st.integers(0, 5)),
        "horizon": draw(st.sampled_from(["1m", "10m", "1h"])),
        "broker": {"message_delay_level": "1s 2s 5s 10s"},
        "groups": [draw(group_configs(f"g{index}", max_messages))[0] for index in range(groups)],
    }
