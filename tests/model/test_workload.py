"""A task that simulates a group event by event makes the group's messages itself
(workload.messages_np): they must be the messages table's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from retrysim.model.workload import messages_df, messages_np
from retrysim.scenario.loading import build_scenario


@pytest.mark.parametrize("arrival", ["uniform", "poisson"])
def test_a_task_makes_the_messages_the_table_holds(spark, arrival):
    config = build_scenario({
        "seed": 11,
        "groups": [{"name": "payments_1", "flavor": "rocketmq4.concurrently",
                    "workload": {"messages": 5003, "over": "17m", "arrival": arrival,
                                 "queues": 7}}],
    })  # fmt: skip
    group = config.groups[0]
    table = messages_df(spark, group, config.seed).orderBy("msg_id").toPandas()
    whole = messages_np(group.workload, group.name, config.seed)
    for column, values in zip(("msg_id", "queue_id", "born_ms"), whole, strict=True):
        np.testing.assert_array_equal(values, table[column].to_numpy(np.int64))
    assert len(np.unique(whole[2])) > 4000  # spread over the window, not one instant
    for lane in (0, 6):
        part = table[table["queue_id"] == lane]
        mine = messages_np(group.workload, group.name, config.seed, lane)
        np.testing.assert_array_equal(mine[0], part["msg_id"].to_numpy(np.int64))
        np.testing.assert_array_equal(mine[2], part["born_ms"].to_numpy(np.int64))
