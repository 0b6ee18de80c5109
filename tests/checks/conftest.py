"""The checks' shared run: one of every flavor, made once for the session."""

from __future__ import annotations

import pytest

import retrysim.runner
from retrysim.scenario.loading import build_scenario


@pytest.fixture(scope="session")
def real_run(spark, tmp_path_factory):
    """test_validate's scenario (every flavor, replays) run once, published as run "real"."""
    from test_validate import SCENARIO

    output = str(tmp_path_factory.mktemp("validate") / "out")
    retrysim.runner.simulate(spark, build_scenario(SCENARIO), output=output, run_id="real")
    return output
