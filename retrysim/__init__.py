"""retrysim: a Spark-native batch simulator of RocketMQ consumer retry and dead-letter flow.

>>> from retrysim import build_session, load_scenario, simulate  # doctest: +SKIP
>>> result = simulate(build_session(), load_scenario())  # doctest: +SKIP
>>> result.summary.show()  # doctest: +SKIP
"""

from __future__ import annotations

__version__ = "0.1.0"

from retrysim.config import Scenario, ScenarioError, load_scenario
from retrysim.runner import Result, simulate
from retrysim.session import build_session
from retrysim.sinks import read_table
from retrysim.transitions import transitions_from_attempts
from retrysim.views import register_views

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
