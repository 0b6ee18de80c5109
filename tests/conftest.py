"""One SparkSession for the whole test session, built by the library's own builder."""

from __future__ import annotations

import pytest

from retrysim.session import build_session

TEST_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
}


@pytest.fixture(scope="session")
def spark():
    session = build_session("retrysim-tests", master="local[2]", conf=TEST_CONF)
    yield session
    session.stop()
