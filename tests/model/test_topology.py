"""Which instance runs a delivery: the engine's closed forms against the client's algorithms.

``tests/reference/rebalance.py`` ports AllocateMessageQueueAveragely(ByCircle) and the
broker's retry-queue routing from the RocketMQ source; the closed forms in
``retrysim.model.topology`` must give every queue the same instance, and their Spark twins
the same as the Python.
"""

from __future__ import annotations

import itertools

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType
from reference import rebalance

from retrysim.model.policy import policy_for
from retrysim.model.topology import (
    ALLOCATE_STRATEGIES,
    BROADCAST,
    BY_MESSAGE,
    BY_QUEUE,
    Topology,
    Units,
    owner,
)
from retrysim.scenario.loading import build_scenario
from retrysim.scenario.spec import Group

RETRY = "%RETRY%g"


def topology(instances: int, queues: int, brokers: int = 1, retry_queue_nums: int = 1,
             allocate: str = "averagely", balancing: str = BY_QUEUE) -> Topology:  # fmt: skip
    return Topology(balancing, instances, 2, queues, brokers, retry_queue_nums, allocate, RETRY)


@pytest.mark.parametrize("strategy", ALLOCATE_STRATEGIES)
def test_the_closed_form_allocates_as_the_client_does(strategy):
    for queues, instances in itertools.product(range(1, 41), range(1, 13)):
        taken = rebalance.owners("t", 1, queues, instances, strategy)
        expected = [taken[("t", rebalance.broker_name(0), q)] for q in range(queues)]
        got = [owner(q, queues, instances, strategy) for q in range(queues)]
        assert got == expected, (queues, instances, strategy)


def test_queues_over_brokers_are_numbered_in_the_order_rebalance_sorts_them():
    # 3 brokers x 4 queues over 5 instances: the first two take 3 queues, the rest 2
    taken = rebalance.owners("t", 3, 4, 5, "averagely")
    ordered = sorted(taken.items())
    assert [instance for _, instance in ordered] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4]
    t = topology(instances=5, queues=12, brokers=3)
    assert [t.instance("t", q, 0, 1) for q in range(12)] == [i for _, i in ordered]


def test_more_instances_than_queues_leaves_the_rest_without_a_queue():
    t = topology(instances=8, queues=4)
    assert {t.instance("t", q, 0, 1) for q in range(4)} == {0, 1, 2, 3}
    assert t.assignable_instances == 4
    assert topology(instances=8, queues=4, retry_queue_nums=6).assignable_instances == 6


def test_every_retry_of_one_broker_lands_on_one_instance():
    t = topology(instances=8, queues=16)
    retry_queues = {
        t.retry_queue("t", q, m, d) for q in range(16) for m in range(50) for d in (1, 2)
    }
    assert retry_queues == {0}
    assert t.instance(RETRY, 0, 7, 3) == 0


def test_a_retry_stays_on_the_broker_that_stored_the_message():
    # 8 queues on 2 brokers, 3 retry queues each: broker 0 holds queues 0-3, retry queues 0-2
    t = topology(instances=4, queues=8, brokers=2, retry_queue_nums=3)
    for queue, msg_id, delivery in itertools.product(range(8), range(20), range(1, 4)):
        broker = queue // 4
        first = t.retry_queue("t", queue, msg_id, delivery)
        assert first // 3 == broker
        again = t.retry_queue(RETRY, first, msg_id, delivery + 1)
        assert again // 3 == broker
    spread = {t.retry_queue("t", 0, msg_id, 1) for msg_id in range(9)}
    assert spread == {0, 1, 2}


def test_by_message_deals_deliveries_round_the_instances():
    t = topology(instances=3, queues=2, balancing=BY_MESSAGE)
    assert [t.instance("t", 0, m, 1) for m in range(6)] == [0, 1, 2, 0, 1, 2]
    assert [t.instance("t", 0, 4, d) for d in range(1, 5)] == [1, 2, 0, 1]
    assert t.assignable_instances == 3
    assert topology(instances=5, queues=2, balancing=BROADCAST).instance("t", 1, 9, 3) == 0


@pytest.mark.parametrize(
    ("flavor", "balancing", "retry_topic"),
    [
        ("rocketmq4.concurrently", BY_QUEUE, RETRY),
        ("rocketmq4.orderly", BY_QUEUE, None),
        # an expired broadcast message is sent back to the broker's retry queues (unread)
        ("rocketmq4.broadcasting", BROADCAST, RETRY),
        ("rocketmq5.push", BY_MESSAGE, None),
        ("rocketmq5.simple", BY_MESSAGE, None),
        ("http.unordered", BY_MESSAGE, None),
    ],
)
def test_each_flavor_balances_as_its_client(flavor, balancing, retry_topic):
    group = Group(name="g", flavor=flavor, consumers={"instances": 3, "threads": 4})
    t = policy_for(group, (1000,) * 18).topology
    assert (t.balancing, t.retry_topic, t.threads, t.instances) == (balancing, retry_topic, 4, 3)


def test_queues_must_divide_over_brokers():
    with pytest.raises(ValueError, match="brokers"):
        build_scenario(
            {"groups": [{"name": "g", "flavor": "rocketmq4.concurrently", "brokers": 3}]}
        )


def test_the_columns_give_what_the_python_gives(spark):
    cases = [
        topology(instances=5, queues=12, brokers=3, retry_queue_nums=2),
        topology(instances=7, queues=4, allocate="averagely_by_circle", retry_queue_nums=3),
        topology(instances=3, queues=9, balancing=BY_MESSAGE),
    ]
    schema = StructType(
        [
            StructField("source_topic", StringType()),
            StructField("queue_id", IntegerType()),
            StructField("msg_id", LongType()),
            StructField("delivery", IntegerType()),
        ]
    )
    for t in cases:
        rows = [("t", q, m, d) for q in range(t.queues) for m in range(4) for d in (1, 2)]
        rows += [(RETRY, r, m, 3) for r in range(t.retry_queues) for m in range(4)]
        frame = spark.createDataFrame(rows, schema).select(
            "*",
            t.instance_col().alias("instance"),
            t.retry_queue_col().alias("retry_queue"),
        )
        got = {tuple(r[:4]): (r["instance"], r["retry_queue"]) for r in frame.collect()}
        expected = {row: (t.instance(*row), t.retry_queue(*row)) for row in rows}
        assert got == expected
        assert frame.where(F.col("instance").isNull()).count() == 0


def test_units_are_the_instances_without_a_retry_queue_then_the_retry_owners():
    # one broker: instance 0 owns the retry queue and takes every retry
    assert topology(instances=4, queues=8).units() == Units(((1,), (2,), (3,)), (0,))
    # 2 brokers x 1 retry queue over 4 instances: instances 0 and 1 own them
    assert topology(instances=4, queues=8, brokers=2).units() == Units(((2,), (3,)), (0, 1))
    # more instances than queues: those without a queue are no unit
    assert topology(instances=8, queues=3).units() == Units(((1,), (2,)), (0,))
    # every instance owns a retry queue, or one instance: the group is one unit
    assert topology(instances=2, queues=4, retry_queue_nums=2).units() is None
    assert topology(instances=1, queues=4).units() is None
    assert topology(instances=4, queues=8, balancing=BY_MESSAGE).units() is None


@pytest.mark.parametrize("strategy", ALLOCATE_STRATEGIES)
def test_no_retry_leaves_the_retry_owners_unit(strategy):
    """What the loop relies on: a retry of a retry lands on an instance that owns a retry
    queue, and a first delivery's retry does too (else it comes back to the same queue)."""
    for instances, queues, brokers, nums in itertools.product((2, 3, 5), (4, 6), (1, 2), (1, 3)):
        t = topology(instances, queues, brokers, nums, strategy)
        units = t.units()
        if units is None:
            continue
        owners = set(units.retry_owners)
        for queue, msg_id, delivery in itertools.product(range(queues), range(7), (1, 2, 5)):
            retry = t.retry_queue("t", queue, msg_id, delivery)
            assert t.instance(RETRY, retry, msg_id, delivery + 1) in owners
            again = t.retry_queue(RETRY, retry, msg_id, delivery + 1)
            assert t.instance(RETRY, again, msg_id, delivery + 2) in owners
