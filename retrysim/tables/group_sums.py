"""What the Spark passes of the run tables and the summers of the event-by-event stage
(:mod:`retrysim.tables.key_peaks`, :mod:`retrysim.tables.key_counts`) share: the gauges' and
rates' names, the load's levels and caps, the summary's quantiles, and :class:`GroupSums`, the
rows a task sums up of a whole group. A leaf of ``tables``: both sides import it, it imports
neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.accumulators import AccumulatorParam

# Threads busy are counted in units of 1/THREAD_UNITS of a thread, so that a batch member's
# share (1/batch_size of its request's thread) adds up exactly as an integer.
THREAD_UNITS = 10**12
GAUGES = ("ready_backlog", "inflight", "waiting_retry", "schedule", "threads_busy")
# The rates a bucket's busiest second is taken of.
RATE_COLUMNS = ("deliveries", "retries", "commitlog_writes")
# Rows of the schedule gauge per delay level have level >= 1; level 0 rows hold the rest.
ALL_LEVELS = 0
# Retries by retry number are counted up to this number; later ones share the last bar
# (an orderly poison message can retry thousands of times).
RETRY_NUMBER_CAP = 24
# The shares of the time to commit and to the DLQ each run keeps (the summary's quantile
# arrays: the distribution a report draws as a CDF): every 5 %, then the tail.
QUANTILES = (*(step / 20 for step in range(20)), 0.99, 0.999, 1.0)


# What a task sums up of a whole group (each over all of its rows): the peaks (the gauges,
# each instance's), the counts (the load's compact rows, the dead letters) and the rates
# (the busiest seconds, the times to settle). Where several tasks simulate the group, the
# first two take a share each, so neither waits for the other's work.
PEAKS, COUNTS, RATES = "peaks", "counts", "rates"
SHARES = frozenset({PEAKS, COUNTS, RATES})
# The peaks of two sets of buckets (a bucket's rows depend on its moments alone): two tasks
# that simulate the same group split the peaks' sort, the larger share. The first set is 5
# buckets of every 8: its task also sums up the rates, the other the counts, which cost
# more (docs/performance.md), so that neither task waits for the other.
PEAK_HALVES = ("peaks of the first buckets of 8", "peaks of the other buckets of 8")
FIRST_BUCKETS_OF_8 = 5


@dataclass(frozen=True)
class GroupSums:
    """One group's rows for staging, from the ``shares`` summed up so far: of PEAKS (or
    one of PEAK_HALVES: the rows of its buckets),
    ``gauges`` as the gauge half of ``bucket_changes`` (bucket, level, group, the GAUGES'
    totals, longest_wait, their rises) and ``instances`` as ``instance_changes`` (None
    unless asked for); of RATES, ``ttc``/``ttd`` as ``times_to_settle`` and ``busiest``
    (bucket -> the busiest seconds of the RATE_COLUMNS); of COUNTS, ``compact`` as the
    load's ``compact_attempts`` and how many of its attempts moved a message to the DLQ."""

    group: str
    shares: frozenset[str]
    gauges: tuple[tuple, ...] = ()
    instances: tuple[tuple, ...] | None = None
    ttc: list[float] | None = None
    ttd: list[float] | None = None
    busiest: tuple[tuple[int, tuple[int, ...]], ...] = ()
    compact: tuple[tuple, ...] = ()
    dead_letters: int = 0

    @property
    def complete(self) -> bool:
        return self.shares == SHARES

    @property
    def changes(self) -> list[tuple]:
        """``bucket_changes``' rows: the gauges' with the busiest seconds of their bucket
        (level 0 rows; null where no delivery started and nothing was written)."""
        busiest = dict(self.busiest)
        none = (None,) * len(RATE_COLUMNS)
        rows = [
            (*row, *(busiest.get(row[0], none) if row[1] == ALL_LEVELS else none))
            for row in self.gauges
        ]
        # buckets with writes and no gauge change (bucket_changes' full join)
        gauged = {row[0] for row in self.gauges if row[1] == ALL_LEVELS}
        gauges = len(GAUGES)
        rows += [
            (bucket, ALL_LEVELS, self.group, *(0,) * gauges, None, *(None,) * gauges, *rates)
            for bucket, rates in self.busiest
            if bucket not in gauged
        ]
        return rows

    def merged(self, other: GroupSums) -> GroupSums:
        """These sums with ``other``'s shares (the same group's, from another task; a
        retried task's share replaces its earlier attempt's)."""
        counts = other if COUNTS in other.shares else self
        rates = other if RATES in other.shares else self
        shares = self.shares | other.shares
        if PEAKS in shares or set(PEAK_HALVES) <= shares:
            shares = (shares - set(PEAK_HALVES)) | {PEAKS}
        gauges, instances = _peaks_of(self, other)
        return GroupSums(
            self.group,
            shares,
            gauges,
            instances,
            rates.ttc,
            rates.ttd,
            rates.busiest,
            counts.compact,
            counts.dead_letters,
        )


def _peaks_of(first: GroupSums, second: GroupSums) -> tuple[tuple, tuple | None]:
    """The gauges' and instances' rows of two shares of a group: the whole peaks of one, or
    both halves' rows in the order one task would give them."""
    for sums in (second, first):
        if PEAKS in sums.shares:
            return sums.gauges, sums.instances
    halves = (first.shares & set(PEAK_HALVES), second.shares & set(PEAK_HALVES))
    if all(halves) and halves[0] != halves[1]:
        gauges = tuple(sorted(first.gauges + second.gauges, key=_by_level))
        if first.instances is None:
            return gauges, None
        both = first.instances + (second.instances or ())
        return gauges, tuple(sorted(both, key=_by_instance))
    chosen = second if halves[1] else first
    return chosen.gauges, chosen.instances


def _by_level(row: tuple) -> tuple[int, int]:
    return row[1], row[0]  # (level, bucket): the order _Runs gives


def _by_instance(row: tuple) -> tuple[int, int]:
    return -1 if row[1] is None else row[1], row[0]


class GroupSumsParam(AccumulatorParam):
    """Accumulates {group: GroupSums}, merging the shares of a group's tasks (a retried
    task's sums replace its earlier attempt's, the same values)."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        for group, sums in value2.items():
            value1[group] = value1[group].merged(sums) if group in value1 else sums
        return value1
