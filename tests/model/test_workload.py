"""A task that simulates a group event by event makes the group's messages itself
(workload.messages_np): they must be the messages table's, bit for bit, for every arrival
shape (uniform, Poisson, a traffic profile uniform or Poisson within its pieces)."""

from __future__ import annotations

import numpy as np
import pytest
from chispa import assert_df_equality

from retrysim.model.workload import messages_df, messages_np
from retrysim.scenario.loading import build_scenario

PROFILE = [{"until": "1m", "per_second": 30}, {"until": "2m", "per_second": 0},
           {"until": "3m", "per_second": 7.5}]  # fmt: skip


@pytest.mark.parametrize(
    "workload",
    [
        {"messages": 5003, "over": "17m", "arrival": "uniform", "queues": 7},
        {"messages": 5003, "over": "17m", "arrival": "poisson", "queues": 7},
        {"arrival": "profile", "within": "uniform", "profile": PROFILE, "queues": 7},
        {"arrival": "profile", "within": "poisson", "profile": PROFILE, "queues": 7},
    ],
    ids=["uniform", "poisson", "profile-uniform", "profile-poisson"],
)
def test_a_task_makes_the_messages_the_table_holds(spark, workload):
    """Spark's messages table (messages_df) and a task's (messages_np), bit for bit, for the
    whole group and for a queue of it (a per-lane key makes its queue's alone)."""
    config = build_scenario({
        "seed": 11,
        "groups": [{"name": "payments_1", "flavor": "rocketmq4.concurrently",
                    "workload": workload}],
    })  # fmt: skip
    group = config.groups[0]
    made = messages_df(spark, group, config.seed).select("msg_id", "queue_id", "born_ms")
    whole = messages_np(group.workload, group.name, config.seed)
    expected = spark.createDataFrame(
        [tuple(map(int, row)) for row in zip(*whole, strict=True)],
        "msg_id long, queue_id int, born_ms long",
    )
    assert_df_equality(made, expected, ignore_row_order=True, ignore_nullable=True)
    assert len(np.unique(whole[2])) > 1000  # spread over the window, not one instant
    for lane in (0, 6):
        mine = messages_np(group.workload, group.name, config.seed, lane)
        assert (mine[1] == lane).all() and len(mine[0]) > 0
        in_lane = whole[1] == lane
        np.testing.assert_array_equal(mine[0], whole[0][in_lane])
        np.testing.assert_array_equal(mine[2], whole[2][in_lane])
