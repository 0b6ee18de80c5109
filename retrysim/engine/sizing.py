"""Size guard: a run's disk and memory needs, estimated from the scenario before Spark starts.

A scenario may ask for far more than the machine has (``messages: 10000000000`` is valid
input). Rather than fill the disk or lose a Python worker to the OOM killer hours in,
:func:`check_size` estimates per group the deliveries, the Parquet bytes at ``--output``
(with a :data:`SAFETY` margin) and the memory of the sequential engine's largest key, and
refuses (exit 2) when either does not fit, warns above half, and only warns with ``force``.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass

from retrysim.engine.choice import needs_events
from retrysim.engine.event_stage import lanes_are_independent
from retrysim.engine.rounds import GroupPlan, group_plans
from retrysim.model.policy import Policy
from retrysim.model.workload import peak_rate_per_ms
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.spec import Group, Scenario

# Parquet bytes per row measured on the default scenario (50k messages, 121k deliveries):
# staged attempts 32, attempts 23, transitions 6.3 (3.0 per delivery), messages 8.7.
STAGED_ROW_BYTES, ATTEMPT_ROW_BYTES, TRANSITION_ROW_BYTES, MESSAGE_ROW_BYTES = 32, 23, 7, 9
TRANSITIONS_PER_DELIVERY = 3.2  # Ready, Inflight, the end, sometimes an after-backoff leave
SAFETY = 1.5  # less compressible data: random times, many groups, small files
SEQUENTIAL_BYTES_PER_MESSAGE = 60  # ids, queue, birth, draws and their sort order (40-60 B)
PEAK_TO_MEAN = 2.0  # a pool may fill up when twice its mean load reaches it (Little's law)
DEFAULT_EXECUTOR_MEMORY = "1g"
_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}

Warn = Callable[[str], None]


@dataclass(frozen=True)
class GroupEstimate:
    index: int
    name: str
    messages: int
    per_message: float
    sequential: bool
    key_messages: int
    downstream: bool = False  # a downstream that answers to load: a costlier delivery

    @property
    def deliveries(self) -> float:
        return self.messages * self.per_message

    @property
    def disk_bytes(self) -> float:
        per_delivery = (
            STAGED_ROW_BYTES + ATTEMPT_ROW_BYTES + TRANSITIONS_PER_DELIVERY * TRANSITION_ROW_BYTES
        )
        return SAFETY * (self.deliveries * per_delivery + self.messages * MESSAGE_ROW_BYTES)

    @property
    def key_bytes(self) -> float:
        return self.key_messages * SEQUENTIAL_BYTES_PER_MESSAGE if self.sequential else 0.0


# --------------------------------------------------------------------------- estimates


def _retries_within(policy: Policy, span_ms: float) -> int:
    """How many retries fit in ``span_ms`` (at most the flavor's max retries)."""
    if policy.max_retries <= 0 or not policy.intervals_ms:
        return 0
    table = [max(1, interval) for interval in policy.intervals_ms]
    total, count = 0, 0
    for interval in table[:-1]:
        if count >= policy.max_retries or total + interval > span_ms:
            return count
        total, count = total + interval, count + 1
    more = max(0, math.floor((span_ms - total) / table[-1]))
    return min(policy.max_retries, count + more)


def _expected(fail: float, limit: int, fail_first: int = 0) -> float:
    """Expected deliveries when each fails with ``fail`` (the first ``fail_first`` always),
    at most ``limit`` deliveries: a truncated geometric series."""
    forced = min(fail_first, limit)
    left = limit - forced
    if fail >= 1.0:
        return float(limit)
    return forced + (1.0 - fail**left) / (1.0 - fail)


def _share(start: int, end: int, over: int) -> float:
    """The share of messages first delivered in [start, end): publishing is uniform."""
    if over <= 0:
        return 1.0 if start <= 0 < end else 0.0
    return max(0, min(end, over) - max(start, 0)) / over


def deliveries_per_message(group: Group, policy: Policy, horizon_ms: int) -> float:
    """Expected deliveries per message: poison messages use every delivery that fits; the
    others fail with the group's chance; a message first delivered during an outage keeps
    failing with the outage's chance for the retries that fit in half the outage. A
    downstream that answers to load can keep every message failing long after its trigger
    (its calls slowed past a timeout, its own or the consume timeout, or shed; docs/
    planning.md, "A storm that outlives its outage"): there, every delivery that fits."""
    behavior = group.behavior
    cap = 1 + _retries_within(policy, horizon_ms)
    if behavior.downstream is not None:
        return float(cap) * (2 if policy.replay is not None else 1)
    normal = min(cap, _expected(behavior.fail_probability, cap, behavior.fail_first))
    extra = 0.0
    for outage in behavior.windows:
        if outage.fail_probability <= behavior.fail_probability:
            continue
        within = 1 + _retries_within(policy, (outage.end - outage.start) / 2)
        during = min(cap, _expected(outage.fail_probability, min(cap, within)) + normal)
        extra += _share(outage.start, outage.end, group.workload.over) * (during - normal)
    poison = behavior.poison_fraction
    per_message = poison * cap + (1 - poison) * min(cap, normal + extra)
    if policy.replay is not None:  # dead letters come back: at most once more
        per_message += poison * cap
    return per_message


def _mean_processing_ms(group: Group) -> float:
    times = [group.behavior.processing_time] + [
        outage.processing_time for outage in group.behavior.windows if outage.processing_time
    ]
    return float(max(processing.mean for processing in times)) + group.behavior.client_overhead


def estimate(scenario: Scenario) -> list[GroupEstimate]:
    """Every group's expected deliveries and where the sequential engine would hold it."""

    found = []
    for index, plan in enumerate(group_plans(scenario)):
        group, policy = plan.group, plan.policy
        workload = group.workload
        published = workload.messages * min(1.0, scenario.horizon / max(1, workload.over))
        per_message = deliveries_per_message(group, policy, scenario.horizon)
        found.append(
            GroupEstimate(
                index=index,
                name=plan.name,
                messages=workload.messages,
                per_message=per_message * published / workload.messages,
                sequential=needs_events(plan) or _may_fill(plan, published * per_message),
                key_messages=(
                    math.ceil(workload.messages / workload.queues)
                    if lanes_are_independent(plan)
                    else workload.messages
                ),
                downstream=group.behavior.downstream is not None,
            )
        )
    return found


def _may_fill(plan: GroupPlan, deliveries: float) -> bool:
    """Whether an instance's threads may fill: its share of the mean load, twice over."""
    topology = plan.policy.topology
    if topology.threads is None:
        return False
    workload = plan.group.workload
    rate = deliveries / workload.messages * min(peak_rate_per_ms(workload), workload.messages)
    busy = rate * _mean_processing_ms(plan.group)
    return PEAK_TO_MEAN * busy / topology.assignable_instances >= topology.threads


# --------------------------------------------------------------------------- the machine


def _size(text: str) -> int:
    text = text.strip().lower().rstrip("b")
    unit = _UNITS.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in _UNITS else text) * unit)


def memory_budget(master: str | None) -> tuple[int, str]:
    """(bytes, what they are): where one Python task of the sequential engine must fit."""
    if master is None or master.startswith("local"):
        try:
            with open("/proc/meminfo", encoding="ascii") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024, "memory available on this machine"
        except OSError:
            pass
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return pages, "memory available on this machine"
    memory = os.environ.get("SPARK_EXECUTOR_MEMORY", DEFAULT_EXECUTOR_MEMORY)
    return _size(memory), f"executor memory ({memory})"


def free_disk(output: str) -> int:
    existing = os.path.abspath(output)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return shutil.disk_usage(existing).free


def human_bytes(count: float) -> str:
    """A byte count as people read it: 1,024 B, 16.8 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def check_size(
    scenario: Scenario,
    output: str,
    master: str | None = None,
    force: bool = False,
    warn: Warn | None = None,
    runs: int = 1,
) -> list[GroupEstimate]:
    """Refuse (:class:`ScenarioError`) a run that cannot fit; warn above half the space.
    ``runs``: the scenario's replications, whose tables all stay (one at a time in memory)."""
    warn = warn or (lambda line: print(f"retrysim: warning: {line}", file=sys.stderr, flush=True))
    groups = estimate(scenario)
    disk, free = runs * sum(g.disk_bytes for g in groups), free_disk(output)
    biggest = max(groups, key=lambda g: g.disk_bytes)
    widest = max(groups, key=lambda g: g.key_bytes)
    budget, budget_name = memory_budget(master)
    needs, refuse = [], False
    if disk > free / 2:
        refuse |= disk > free
        needs.append(f"about {human_bytes(disk)} of disk at {output} ({human_bytes(free)} free)")
    if widest.key_bytes > budget / 2:
        refuse |= widest.key_bytes > budget
        needs.append(
            f"about {human_bytes(widest.key_bytes)} of memory in one Python task for group "
            f"{widest.name} ({widest.key_messages:,} messages in one key of the sequential "
            f"engine; {human_bytes(budget)} {budget_name})"
        )
    if not needs:
        return groups
    total = sum(g.deliveries for g in groups)
    who = f"its {runs} replications need" if runs > 1 else "the run needs"
    message = (
        f"{who} {' and '.join(needs)}: group {biggest.name} has "
        f"{biggest.messages:,} messages x ~{biggest.per_message:.2f} deliveries each, "
        f"{total:,.0f} deliveries in all"
    )
    field = f"groups[{(biggest if disk > free / 2 else widest).index}].workload.messages"
    if refuse and not force:
        raise ScenarioError(
            field, f"{message}; lower workload.messages or horizon, or pass --force to run anyway"
        )
    warn(f"{field}: {message}" + ("; running anyway (--force)" if refuse else ""))
    return groups


# --------------------------------------------------------------------------- time

# A run's time launch to exit through spark-submit.sh on 2 cores, as fixed costs and costs
# per delivery (bench/dry_run_estimate.py fits and checks them on the scenarios of conf/;
# docs/performance.md): the JVM, the session and exit; a Spark stage's start; a delivery
# simulated event by event, staged and checked; a round of the round engine and a delivery
# of it; the report, drawn beside the check. A downstream that answers to load costs more a
# delivery (each call scores the calls in flight), though fewer happen than estimated.
RUN_FIXED_S = 4.0
STAGE_START_S = 1.5
EVENT_DELIVERY_S = 12e-6
DOWNSTREAM_DELIVERY_S = 24e-6
# Staging's Spark passes over the rows (transitions, dead letters, load, the summary), when a
# group is not simulated whole in one task, which sums its rows up itself: by rounds, or by
# key (ordered queues, a batch per queue; conf/orderly-blocking.yaml: 21 s of 28 s).
SPARK_STAGING_S = 15.0
ROUND_S = 0.8
ROUND_DELIVERY_S = 8e-6
REPORT_S = 1.0
MOST_ROUNDS = 18


def estimate_seconds(
    groups: list[GroupEstimate],
    engines: dict[str, str],
    report: bool = True,
    runs: int = 1,
    fixed: bool = True,
) -> float:
    """A rough time for the run, launch to exit, from its groups' expected deliveries and
    engines (:func:`retrysim.engine.choice.planned_engines`): for ``--dry-run``; within 2x
    on the scenarios of conf/ on the machine docs/performance.md names. A cluster's cores
    divide the per-delivery terms. ``fixed=False``: without the JVM's and session's start
    and exit (a plan pays them once for all its points)."""
    seconds = 0.0
    by_rounds = [g for g in groups if engines.get(g.name) == "rounds"]
    if len(by_rounds) < len(groups):
        seconds += STAGE_START_S
    if by_rounds or any(g.key_messages < g.messages for g in groups):
        seconds += SPARK_STAGING_S
    for group in groups:
        if group in by_rounds:  # its retries take a round each (the bench's 17)
            rounds = MOST_ROUNDS - 1 if group.per_message > 1 else 1
            seconds += ROUND_S * rounds + ROUND_DELIVERY_S * group.deliveries
        else:
            each = DOWNSTREAM_DELIVERY_S if group.downstream else EVENT_DELIVERY_S
            seconds += each * group.deliveries
    return (RUN_FIXED_S if fixed else 0.0) + runs * (seconds + (REPORT_S if report else 0.0))


def slowdown(master: str | None) -> tuple[float, float]:
    """(how many times slower than on a quiet machine a local run is now, the 1-minute
    load average): the load over twice the cores, plus the run's own two, at least 1. On a
    shared 2-core machine runs took 3-4x their quiet time at a load of 9-11, which this
    gives (bench/dry_run_estimate.py). A cluster's load is not known here: 1."""
    if master is not None and not master.startswith("local"):
        return 1.0, 0.0
    load = os.getloadavg()[0]
    return max(1.0, (load + 2) / (2 * (os.cpu_count() or 1))), load
