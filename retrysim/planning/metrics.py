"""The metrics a capacity plan's targets bound: each target's plan-table column and kind.

Here without Spark, so that the command line can list them before anything starts.
"""

from __future__ import annotations

DURATION, COUNT, FRACTION, RATIO = "duration", "count", "fraction", "ratio"

# Target name -> (plan table column, kind). Every one is an upper bound.
METRICS: dict[str, tuple[str, str]] = {
    "p50_time_to_commit": ("p50_time_to_commit_ms", DURATION),
    "p95_time_to_commit": ("p95_time_to_commit_ms", DURATION),
    "p99_time_to_commit": ("p99_time_to_commit_ms", DURATION),
    "max_ready_backlog": ("max_ready_backlog", COUNT),
    "max_waiting_retry": ("max_waiting_retry", COUNT),
    "max_oldest_ready_age": ("max_oldest_ready_age_ms", DURATION),
    "dlq": ("dlq", COUNT),
    "discards": ("discards", COUNT),
    "pending": ("pending", COUNT),
    "peak_utilization": ("peak_utilization", FRACTION),
    "amplification": ("amplification", RATIO),
    "write_amplification": ("write_amplification", RATIO),
}
