"""Where the run report's time axes look (retrysim.reporting.analysis.busy_window): a storm
of half an hour in a six-hour run is drawn on its own, the whole run below it."""

from __future__ import annotations

import pandas as pd

from retrysim.reporting.analysis import busy_window


def _load(deliveries: list[int], bucket_minutes: int = 1) -> pd.DataFrame:
    minutes = [float(m * bucket_minutes) for m in range(len(deliveries))]
    return pd.DataFrame(
        {
            "minute": minutes,
            "minute_end": [m + bucket_minutes for m in minutes],
            "bucket_ms": [bucket_minutes * 60_000] * len(deliveries),
            "deliveries": deliveries,
        }
    )


def test_a_short_storm_in_a_long_run_is_zoomed_to_its_deliveries_and_outages():
    # 30 busy minutes, then a trickle of retries (one an hour) to 6 h
    deliveries = [1000] * 30 + [0] * 330
    for hour in range(1, 6):
        deliveries[hour * 60] = 1
    window = busy_window(_load(deliveries))
    assert window is not None and window["minute_end"].max() == 30 + 3  # + 10 %
    with_outage = busy_window(_load(deliveries), outages=[(10.0, 45.0)])
    assert with_outage["minute_end"].max() == 45 + 5  # the outage's end, + 10 %


def test_a_run_busy_throughout_is_not_zoomed():
    assert busy_window(_load([100] * 60)) is None
    assert busy_window(_load([0] * 60)) is None  # nothing delivered
    assert busy_window(_load([100] * 30 + [1] * 20)) is None  # 99 % takes most of the span
