"""One SparkSession for the whole test session, built by the library's own builder.

Tests that need a JVM are marked ``spark``: those that take the ``spark`` fixture are marked
here, those that start one in a subprocess (spark-submit) are marked where they are written.
``./run-tests.sh -m "not spark"`` then runs the pure-Python tier, and a test in it that
starts a JVM anyway fails (it is missing its mark).
"""

from __future__ import annotations

import pytest
from pyspark import SparkContext

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


_NO_SPARK = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the fixture's users before ``-m`` selects (pytest's own hook runs later)."""
    for item in items:
        brokers = item.get_closest_marker("broker") or item.get_closest_marker("conformance_suite")
        if "spark" in getattr(item, "fixturenames", ()) or brokers:
            item.add_marker(pytest.mark.spark)  # a broker is a JVM too


def pytest_collection_finish(session):
    selected = session.items
    session.config.stash[_NO_SPARK] = not any(i.get_closest_marker("spark") for i in selected)


@pytest.fixture(autouse=True)
def _no_jvm_in_the_pure_tier(request):
    """In a session without Spark tests, a test that starts a JVM is missing its mark."""
    yield
    if request.config.stash.get(_NO_SPARK, False) and SparkContext._gateway is not None:
        pytest.fail("this test starts a JVM: mark it pytest.mark.spark")
