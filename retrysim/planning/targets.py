"""Capacity targets and the recommendation: the smallest consumer pool that meets them all.

A target is an upper bound on one metric of a group's run (``--target p99_time_to_commit=5m``,
or ``--target order-service.dlq=0`` for one group). Every metric is "smaller is better", so a
point meets a target when its value is at most the limit; a missing value (no message was
committed, so there is no time to commit) misses it.

The recommendation is made per group and per *case*: the settings of every swept key that
does not set that group's pool (``behavior.fail_probability=0.05``, say). Within a case the
points are ordered by pool size (``instances x threads``); the recommended point is the
smallest pool that meets every target, and the *binding* targets are those the next smaller
pool swept fails -- the constraint that decided the answer. When the smallest pool swept
already meets everything, nothing is binding. With replications (``--replications N``) a
point meets the targets when at least ``--confidence`` of its replications meet every one,
and its metrics are their means. Pure Python: no Spark here.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from retrysim.model.topology import BY_QUEUE, Topology
from retrysim.planning.metrics import COUNT, DURATION, FRACTION, METRICS, RATIO
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.units import human_ms, parse_duration

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")

__all__ = [
    "METRICS",
    "Outcome",
    "Recommendation",
    "Target",
    "aligned",
    "evaluate",
    "judge",
    "overall_pool",
    "parse_target",
    "recommend",
]


@dataclass(frozen=True)
class Target:
    """``metric <= limit`` for one group, or for every group when ``group`` is None."""

    metric: str
    limit: float
    group: str | None = None

    @property
    def column(self) -> str:
        return METRICS[self.metric][0]

    @property
    def kind(self) -> str:
        return METRICS[self.metric][1]

    def applies_to(self, group: str) -> bool:
        return self.group is None or self.group == group

    def show_value(self, value: float | None) -> str:
        return show(self.kind, value)

    def __str__(self) -> str:
        where = f"{self.group}." if self.group else ""
        return f"{where}{self.metric} <= {self.show_value(self.limit)}"


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of text cells as indented lines, every column padded to its widest cell but the
    last (free text, such as a verdict)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]


def show(kind: str, value: float | None) -> str:
    """A metric value as people read it: 4m05s, 12,345, 87%, x1.32."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == DURATION:
        return human_ms(value)
    if kind == COUNT:
        return f"{round(value):,}"
    if kind == FRACTION:
        return f"{value * 100:.0f}%"
    return f"x{value:.2f}"


def _limit(metric: str, kind: str, raw: str) -> float:
    raw = raw.strip()
    try:
        if kind == DURATION:
            return float(parse_duration(raw))
        if kind == FRACTION:
            match = _PERCENT.match(raw)
            value = float(match.group(1)) / 100 if match else float(raw)
            if not 0 <= value <= 1:
                raise ValueError
            return value
        value = float(raw.replace("_", ""))
        if kind == COUNT and (value < 0 or value != int(value)):
            raise ValueError
        if value < 0 or math.isnan(value):
            raise ValueError
        return value
    except ValueError:
        wanted = {
            DURATION: "a duration such as 90s, 5m or 2h",
            COUNT: "a whole number >= 0",
            FRACTION: "a fraction 0..1 or a percentage such as 80%",
            RATIO: "a number >= 0",
        }[kind]
        raise ScenarioError("--target", f"{metric}: value {raw!r}: must be {wanted}") from None


def parse_target(text: str, groups: Sequence[str]) -> Target:
    """``[group.]metric=value`` -> Target; the group must be one of ``groups``."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise ScenarioError("--target", f"expected metric=value, got {text!r}")
    group, dot, metric = key.rpartition(".")
    if metric not in METRICS:
        raise ScenarioError("--target", f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    if dot and group not in groups:
        raise ScenarioError("--target", f"{key}: no group {group!r}; groups: {list(groups)}")
    return Target(metric, _limit(metric, METRICS[metric][1], raw), group if dot else None)


def check_targets(targets: Sequence[Target]) -> None:
    """Each (group, metric) at most once."""
    seen: set[tuple[str | None, str]] = set()
    for target in targets:
        key = (target.group, target.metric)
        if key in seen:
            where = f"{target.group}." if target.group else ""
            raise ScenarioError("--target", f"{where}{target.metric} is given twice")
        seen.add(key)


def _effective(targets: Iterable[Target], group: str) -> list[Target]:
    """The targets of ``group``: a group's own target wins over the all-groups one."""
    own = {t.metric: t for t in targets if t.group == group}
    common = [t for t in targets if t.group is None and t.metric not in own]
    return [*common, *own.values()]


def _severity(value: float | None, limit: float) -> float:
    if value is None or math.isnan(value):
        return math.inf
    return value / limit if limit > 0 else math.inf


def evaluate(
    metrics: Mapping[str, float | None], targets: Iterable[Target], group: str
) -> list[Target]:
    """The targets of ``group`` that ``metrics`` (plan columns -> values) misses, worst first."""
    failed = []
    for target in _effective(targets, group):
        value = metrics.get(target.column)
        if value is None or math.isnan(value) or value > target.limit:
            failed.append((target, _severity(value, target.limit)))
    return [target for target, _ in sorted(failed, key=lambda item: -item[1])]


def judge(
    runs: Sequence[Mapping[str, float | None]], targets: Iterable[Target], group: str
) -> tuple[tuple[Target, ...], dict[str, int], float]:
    """Over the replications' metrics ``runs``: the targets some replication misses (most
    often missed first, then worst), how many replications miss each (by metric), and the
    share of replications that meet every target."""
    targets = list(targets)
    per_run = [evaluate(metrics, targets, group) for metrics in runs]
    misses = Counter(target.metric for missed in per_run for target in missed)
    seen = dict.fromkeys(target for missed in per_run for target in missed)
    failed = sorted(seen, key=lambda target: -misses[target.metric])
    share = sum(not missed for missed in per_run) / len(runs) if runs else 0.0
    return tuple(failed), dict(misses), share


@dataclass(frozen=True)
class Outcome:
    """One point's result for one group: its case, pool and metrics (the mean across its
    replications), the targets a replication misses, and whether it meets them: in at least
    ``confidence`` of its replications."""

    point: int
    group: str
    case: tuple[tuple[str, str], ...]
    instances: int | None
    threads: int | None
    pool: int | None  # None: unlimited
    metrics: Mapping[str, float | None]
    failed: tuple[Target, ...] = ()
    topology: Topology | None = None  # how the point spreads the group over its instances
    replications: int = 1
    met_share: float | None = None  # of replications meeting every target; None: judge by failed
    confidence: float = 1.0
    misses: Mapping[str, int] = field(default_factory=dict)  # metric -> replications missing it
    # column -> (low, high) of the mean's interval across replications (absent for one)
    intervals: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)

    @property
    def meets(self) -> bool:
        if self.met_share is None:
            return not self.failed
        return self.met_share >= self.confidence - 1e-12

    def missed(self, target: Target, compare: str = " > ") -> str:
        """How this point misses ``target``: its value against the limit, and with
        replications how many of them missed it."""
        value, limit = (
            target.show_value(self.metrics.get(target.column)),
            target.show_value(target.limit),
        )
        if self.replications == 1:
            return f"{value}{compare}{limit}"
        return (
            f"missed by {self.misses.get(target.metric, 0)}/{self.replications} replications; "
            f"mean {value}, limit {limit}"
        )


@dataclass(frozen=True)
class Recommendation:
    """The answer for one group and case."""

    group: str
    case: tuple[tuple[str, str], ...]
    point: int | None
    pool: int | None
    instances: int | None = None
    threads: int | None = None
    binding: tuple[Target, ...] = ()
    smaller: Outcome | None = None  # the next smaller pool swept, which misses ``binding``
    larger_failing: tuple[int, ...] = field(default=())  # points above ``pool`` that miss
    closest: Outcome | None = None  # when nothing meets: the largest finite pool swept
    chosen: Outcome | None = None  # the recommended point's outcome

    @property
    def found(self) -> bool:
        return self.point is not None


def recommend(outcomes: Sequence[Outcome]) -> list[Recommendation]:
    """One Recommendation per (group, case), in the order the cases first appear."""
    cases: dict[tuple[str, tuple], list[Outcome]] = {}
    for outcome in outcomes:
        cases.setdefault((outcome.group, outcome.case), []).append(outcome)
    return [_recommend_case(group, case, items) for (group, case), items in cases.items()]


def _recommend_case(group: str, case: tuple, items: list[Outcome]) -> Recommendation:
    finite = sorted((o for o in items if o.pool is not None), key=lambda o: (o.pool, o.point))
    meeting = [o for o in finite if o.meets]
    if not meeting:
        closest = finite[-1] if finite else None
        return Recommendation(group, case, None, None, closest=closest)
    best = meeting[0]
    smaller = [o for o in finite if o.pool < best.pool]
    next_smaller = smaller[-1] if smaller else None
    larger_failing = tuple(o.point for o in finite if o.pool > best.pool and not o.meets)
    return Recommendation(
        group,
        case,
        best.point,
        best.pool,
        best.instances,
        best.threads,
        binding=next_smaller.failed if next_smaller else (),
        smaller=next_smaller,
        larger_failing=larger_failing,
        chosen=best,
    )


def overall_pool(outcomes: Sequence[Outcome], group: str) -> int | None:
    """The smallest pool that meets every target in every case of ``group`` (pools swept in
    every case only); None when there is no such pool."""
    items = [o for o in outcomes if o.group == group and o.pool is not None]
    cases = {o.case for o in items}
    pools = sorted({o.pool for o in items})
    for pool in pools:
        at_pool = [o for o in items if o.pool == pool]
        if {o.case for o in at_pool} == cases and all(o.meets for o in at_pool):
            return pool
    return None


# An instance this busy over a whole load bucket while the group's threads never were.
SATURATED = 0.95
GROUP_NOT_FULL = 0.9


def topology_note(outcome: Outcome | None) -> str:
    """What the instances of a point say that the pool size does not: instances that ran
    nothing (4.x rebalance gives each queue to one instance), or one instance saturated while
    the group's threads were not (its queues bind: with one retry queue per broker, one
    instance takes every retry). Empty when neither."""
    if outcome is None:
        return ""
    m, topology = outcome.metrics, outcome.topology
    by_queue = topology is None or topology.balancing == BY_QUEUE
    idle = round(m.get("idle_instances") or 0)
    if idle and outcome.instances and by_queue:
        return (
            f" {idle} of {outcome.instances} instances ran no delivery at point "
            f"p{outcome.point}: a 4.x queue goes to one instance, so instances beyond the "
            "queues idle; add queues, not instances."
        )
    busy, peak = m.get("busiest_instance_utilization"), m.get("peak_utilization")
    if (
        busy is not None
        and busy >= SATURATED
        and peak is not None
        and peak < GROUP_NOT_FULL
        and (outcome.instances or 1) > 1
    ):
        retries = topology is None or topology.retry_topic is not None
        return (
            f" At point p{outcome.point} instance {m.get('busiest_instance')} ran at "
            f"{busy:.0%} of its threads while the group's never passed {peak:.0%} at once: "
            "one instance's work binds, not the pool"
            + (
                " (with one retry queue per broker one instance takes every retry: raise "
                "retry_queue_nums)."
                if retries and by_queue
                else "."
            )
        )
    return ""


def describe(recommendation: Recommendation) -> str:
    """One sentence: the recommended pool and the binding target, or why there is none."""
    r = recommendation
    case = f" [{', '.join(f'{k}={v}' for k, v in r.case)}]" if r.case else ""
    if not r.found:
        if r.closest is None:
            return f"group {r.group}{case}: no finite consumer pool was swept"
        missed = ", ".join(f"{t.metric} {r.closest.missed(t)}" for t in r.closest.failed)
        return (
            f"group {r.group}{case}: no point meets the targets; the largest pool swept "
            f"({r.closest.pool:,} threads, point p{r.closest.point}) misses {missed}. "
            "Sweep larger pools or relax a target." + topology_note(r.closest)
        )
    text = (
        f"group {r.group}{case}: {r.pool:,} consumer threads "
        f"({r.instances} instances x {r.threads} threads, point p{r.point})"
    )
    if r.chosen is not None and r.chosen.replications > 1:
        text += (
            f", meeting every target in {r.chosen.met_share:.0%} of "
            f"{r.chosen.replications} replications (confidence {r.chosen.confidence:.0%})"
        )
    if r.smaller is None:
        text += "; no target is binding: the smallest pool swept already meets them all"
    else:
        missed = ", ".join(f"{t.metric} ({r.smaller.missed(t)})" for t in r.binding)
        text += f"; binding: {missed} at the next smaller pool ({r.smaller.pool:,} threads)"
    if r.larger_failing:
        points = ", ".join(f"p{p}" for p in r.larger_failing)
        text += f". Note: larger pools miss a target too ({points})"
    note = topology_note(r.chosen) or topology_note(r.smaller)
    return text + ("." + note if note and not text.endswith(".") else note)
