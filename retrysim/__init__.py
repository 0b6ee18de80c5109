"""retrysim: a Spark-native batch simulator of RocketMQ consumer retry and dead-letter flow.

>>> from retrysim import build_session, load_scenario, simulate  # doctest: +SKIP
>>> result = simulate(build_session(), load_scenario())  # doctest: +SKIP
>>> result.summary.show()  # doctest: +SKIP
"""

from __future__ import annotations

from retrysim.runner import Result, simulate
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import load_scenario
from retrysim.scenario.spec import Scenario
from retrysim.session import build_session
from retrysim.store.sinks import read_table
from retrysim.store.views import register_views
from retrysim.tables.transitions import transitions_from_attempts
from retrysim.version import __version__

__all__ = [
    "Result",
    "Scenario",
    "ScenarioError",
    "__version__",
    "build_session",
    "load_scenario",
    "read_table",
    "register_views",
    "simulate",
    "transitions_from_attempts",
]
