"""retrysim: a Spark-native batch simulator of RocketMQ consumer retry and dead-letter flow.

>>> from retrysim import build_session, load_scenario, simulate  # doctest: +SKIP
>>> result = simulate(build_session(), load_scenario())  # doctest: +SKIP
>>> result.summary.show()  # doctest: +SKIP
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from retrysim.version import __version__

# The public names, imported when first used: a Spark task's Python worker imports a module
# of the package (the engine, the check's passes) and, through this file, would otherwise
# import the whole library with pandas and the runner, which no task uses.
_PUBLIC = {
    "Result": "retrysim.runner",
    "simulate": "retrysim.runner",
    "ScenarioError": "retrysim.scenario.errors",
    "load_scenario": "retrysim.scenario.loading",
    "Scenario": "retrysim.scenario.spec",
    "build_session": "retrysim.session",
    "read_table": "retrysim.store.sinks",
    "on_clock": "retrysim.store.clock",
    "complete_files": "retrysim.store.sinks",
    "published_versions": "retrysim.store.sinks",
    "register_views": "retrysim.store.views",
    "transitions_from_attempts": "retrysim.tables.transitions",
}

if TYPE_CHECKING:
    from retrysim.runner import Result, simulate
    from retrysim.scenario.errors import ScenarioError
    from retrysim.scenario.loading import load_scenario
    from retrysim.scenario.spec import Scenario
    from retrysim.session import build_session
    from retrysim.store.clock import on_clock
    from retrysim.store.sinks import complete_files, published_versions, read_table
    from retrysim.store.views import register_views
    from retrysim.tables.transitions import transitions_from_attempts


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'retrysim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = [
    "Result",
    "Scenario",
    "ScenarioError",
    "__version__",
    "build_session",
    "complete_files",
    "load_scenario",
    "on_clock",
    "published_versions",
    "read_table",
    "register_views",
    "simulate",
    "transitions_from_attempts",
]
