"""Search, not only grids: bisection for the smallest pool that meets the targets.

``--search consumers.instances=1..64`` (or ``consumers.threads``, or either with the group
named) probes the key's largest value first (if it misses, nothing in the range meets), then
its smallest (if it meets, that is the answer), then halves the range between the largest
value known to miss and the smallest known to meet until they are neighbours: about
``2 + log2(HI - LO)`` probes instead of ``HI - LO + 1`` points, each probe with its
replications. It assumes what capacity plans rely on: more consumers never make a target
worse. The answer's next smaller value is always probed, so the binding targets are the ones
it misses, as in a grid. Pure Python: the plan runs the probes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from retrysim.planning.sweep import POOL_KEY, canonical_key
from retrysim.scenario.errors import ScenarioError

SEARCHABLE = ("instances", "threads")
_RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")

__all__ = ["SearchAxis", "parse_search", "probes_at_most", "smallest_meeting"]


@dataclass(frozen=True)
class SearchAxis:
    """One ``--search``: a canonical pool key of one group and the range searched."""

    key: str
    given: str
    group: str
    low: int
    high: int

    @property
    def field(self) -> str:
        return self.key.split(".", 2)[2]

    def __str__(self) -> str:
        return f"{self.key}={self.low}..{self.high}"


def parse_search(text: str, data: Mapping[str, Any]) -> SearchAxis:
    """``KEY=LO..HI`` -> SearchAxis; KEY must set a group's consumer instances or threads."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise ScenarioError(
            "--search", f"expected key=LO..HI such as consumers.instances=1..64, got {text!r}"
        )
    canonical, group = canonical_key(key, data, "--search")
    field = canonical.split(".", 2)[2] if group is not None else canonical
    if group is None or field not in (f"{POOL_KEY}.{name}" for name in SEARCHABLE):
        raise ScenarioError(
            "--search",
            f"{key}: only a group's consumers.instances or consumers.threads can be searched",
        )
    match = _RANGE.match(raw)
    if not match:
        raise ScenarioError(
            "--search", f"{key}: value {raw.strip()!r}: expected LO..HI, e.g. 1..64"
        )
    low, high = int(match.group(1)), int(match.group(2))
    if not 1 <= low < high:
        raise ScenarioError("--search", f"{key}: range {low}..{high}: need 1 <= LO < HI")
    return SearchAxis(canonical, key, group, low, high)


def probes_at_most(axis: SearchAxis) -> int:
    """The most probes a search of ``axis`` makes."""
    return 2 + math.ceil(math.log2(axis.high - axis.low)) if axis.high - axis.low > 1 else 2


def smallest_meeting(meets: Callable[[int], bool], low: int, high: int) -> int | None:
    """The smallest value in ``low..high`` for which ``meets`` holds, by bisection, assuming
    it holds from some value on; None when it does not hold at ``high``.

    >>> probed = []
    >>> smallest_meeting(lambda v: probed.append(v) or v >= 13, 1, 64), probed
    (13, [64, 1, 32, 16, 8, 12, 14, 13])
    """
    if not meets(high):
        return None
    if meets(low):
        return low
    missing, meeting = low, high
    while meeting - missing > 1:
        middle = (missing + meeting) // 2
        if meets(middle):
            meeting = middle
        else:
            missing = middle
    return meeting
