"""Validation of a run's tables: every invariant (:mod:`retrysim.checks.invariants`), reported.

Every run is validated on its staged tables before anything of it is published
(:func:`check_staged`, called by :func:`retrysim.runner.simulate`): a broken invariant
raises :class:`ValidationError`, which names the invariant and a few example keys, and the
run publishes nothing (its ``runs`` row is not written either: the tables stay as they
were, including an earlier version of the same run id). ``retrysim validate --output DIR
[--run-id ID]`` checks complete runs already written (:func:`validate_output`).

The driver collects one row per run and group from each pass, compares the counts (summary
and load against the rows) and the chain digests (each delivery entered exactly as its
predecessor offered), and only when those disagree checks row by row; it fetches example
rows only for an invariant that broke.

>>> report = validate_output(spark, "out")  # doctest: +SKIP
>>> print(report.format())  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from types import ModuleType
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from retrysim.checks import chain_digests as digests
from retrysim.checks import counts, invariants
from retrysim.checks import rows as row_checks
from retrysim.checks.invariants import INVARIANTS, Invariant
from retrysim.store import views
from retrysim.store.sinks import STATUS_COMPLETE
from retrysim.tables.schemas import PARTITION_COLUMN, SCHEMAS, data_schema, without_comments
from retrysim.tables.staging import run_together

__all__ = ["INVARIANTS", "Finding", "Report", "ValidationError", "check_staged",
           "validate_output", "validate_tables"]  # fmt: skip

EXAMPLES = 3
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Finding:
    """One invariant over the checked runs: violations per run, a few examples per run."""

    invariant: Invariant
    violations: int
    examples: tuple[str, ...] = ()
    by_run: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Report:
    """Per-invariant results over ``runs``; ``ok`` when no invariant is broken."""

    runs: tuple[str, ...]
    findings: tuple[Finding, ...]
    # the chain digests disagreed (or a row broke a rule), so every delivery was checked
    # row by row with its neighbours, for the counts and examples
    row_by_row: bool = False

    @property
    def ok(self) -> bool:
        return not self.broken

    @property
    def broken(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.violations]

    def broken_by_run(self) -> dict[str, set[str]]:
        """Run id -> names of the invariants it breaks (runs that break none are left out)."""
        found: dict[str, set[str]] = {}
        for finding in self.broken:
            for run, count in finding.by_run:
                if count:
                    found.setdefault(run, set()).add(finding.invariant.name)
        return found

    def format(self) -> str:
        """One line per invariant, ``ok`` or ``FAIL`` with examples, for the terminal."""
        width = max(len(invariant.name) for invariant in INVARIANTS)
        lines = []
        for finding in self.findings:
            rule, name = finding.invariant.rule, finding.invariant.name
            if not finding.violations:
                lines.append(f"  ok    {name:<{width}}  {rule}")
                continue
            runs = ", ".join(f"{run}: {count:,}" for run, count in finding.by_run if count)
            lines.append(
                f"  FAIL  {name:<{width}}  {rule}: {finding.violations:,} violation(s) ({runs})"
            )
            lines += [f"        {'':<{width}}  e.g. {example}" for example in finding.examples]
        return "\n".join(lines)

    def failure(self) -> str:
        """The broken invariants, their counts and examples, on one line."""
        return " | ".join(
            f"{f.invariant.name} ({f.invariant.rule}): {f.violations:,} violation(s), e.g. "
            + "; ".join(f.examples[:EXAMPLES])
            for f in self.broken
        )


class ValidationError(RuntimeError):
    """A run broke an invariant; raised before anything of it is published."""

    def __init__(self, run_id: str, report: Report) -> None:
        super().__init__(f"run {run_id} failed validation, nothing published: {report.failure()}")
        self.run_id = run_id
        self.report = report


# --------------------------------------------------------------------------- comparisons


def _zeroed(values: dict[str, Any]) -> defaultdict[str, Any]:
    """A group's collected values, 0 for any a pass did not give (or gave as null)."""
    return defaultdict(int, {key: value for key, value in values.items() if value is not None})


def _group_problems(values: dict[str, Any]) -> dict[str, list[str]]:
    """Counts of one run and group that must agree: invariant -> mismatches."""
    v = _zeroed(values)
    messages, final = v["message_rows"], (v["final_commit"], v["final_dlq"], v["final_discard"])
    summed = v["s_commits"] + v["s_dlq"] + v["s_discards"] + v["s_pending"]
    # a message a 4.9 client sent back twice ends once per copy (docs/model.md §6)
    copies = messages + v["t_late_send_backs"]
    summary = [
        ("summary rows", v["summary_rows"], 1),
        ("summary.messages", v["s_messages"], messages),
        ("summary.late_send_backs", v["s_late_send_backs"], v["t_late_send_backs"]),
        ("summary.commits (final Commit states)", v["s_commits"], final[0]),
        ("summary.dlq (final DLQ states)", v["s_dlq"], final[1]),
        ("summary.discards (final Discard states)", v["s_discards"], final[2]),
        ("summary.pending (copies not settled)", v["s_pending"], copies - sum(final)),
        ("commits + dlq + discards + pending", summed, v["s_messages"] + v["s_late_send_backs"]),
        ("summary.deliveries", v["s_deliveries"], v["t_deliveries"]),
        ("summary.retries", v["s_retries"], v["t_retries"]),
        ("summary.replayed", v["s_replayed"], v["t_replays"]),
        ("summary.dlq (dead_letters - replays)", v["s_dlq"],
         v["dead_letter_rows"] - v["dead_letters_replayed"]),
        ("summary.commitlog_writes", v["s_commitlog_writes"], v["t_commitlog_writes"]),
    ]  # fmt: skip
    amplification = v["t_deliveries"] / messages if messages else 0.0
    if abs(v["s_amplification"] - amplification) > _TOLERANCE:
        summary.append(("summary.amplification", v["s_amplification"], amplification))
    totals = [(f"load.{name}", v[f"load_{name}"], v[f"t_{name}"]) for name in counts.LOAD_SUMS[:-1]]
    bytes_ = v["load_commitlog_writes"] * v["size_bytes"]
    totals.append(("load.commitlog_bytes", v["load_commitlog_bytes"], bytes_))
    if "instance_deliveries" in values:
        totals.append(("instance_load.deliveries", v["instance_deliveries"], v["load_deliveries"]))
        busy, want = v["instance_busy_thread_ms"], v["load_busy_thread_ms"]
        # each row's thread time is rounded to a millionth of a millisecond
        rounding = 1e-6 * (v["instance_rows"] + v["load_rows"]) + _TOLERANCE * abs(want)
        if abs(busy - want) > rounding:
            totals.append(("instance_load.busy_thread_ms", busy, want))
    bucket = v["bucket_ms"] or 1
    gauges = [
        ("load rows (distinct buckets)", v["load_rows"], v["load_buckets"]),
        ("first bucket_start_ms", v["load_first_ms"], 0),
        ("smallest bucket_ms (largest)", v["bucket_ms_min"], v["bucket_ms"]),
        ("load buckets (up to the last)", v["load_buckets"], v["load_end_ms"] // bucket),
        *[(f"final {gauge}", v[f"load_end_{gauge}"], v[f"end_{gauge}"]) for gauge in counts.GAUGES],
        *[(f"buckets whose {gauge}_max is below {gauge}", v[f"load_under_{gauge}"], 0)
          for gauge in counts.GAUGES],
        *[(f"summary.{peak} (largest load.{gauge}_max)", v[f"s_{peak}"], v[f"load_peak_{gauge}"])
          for gauge, peak in counts.PEAKS.items()],
    ]  # fmt: skip
    checks = {"summary_counts": summary, "load_totals": totals, "load_gauges": gauges,
              "attempts_transitions": _digest_pairs(v)}  # fmt: skip
    return {name: _mismatches(pairs) for name, pairs in checks.items()}


def _mismatches(pairs: list[tuple[str, Any, Any]]) -> list[str]:
    return [f"{label} = {got}, expected {want}" for label, got, want in pairs if got != want]


_DIGESTED = digests.DIGESTED


def _digest_pairs(values: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The transitions table's rows and digest against those of the attempts' transitions."""
    v = _zeroed(values)
    return [
        ("transitions rows (derived from the attempts)", v["t_rows"], v["derived_rows"]),
        ("transitions digest (derived from the attempts)", (v["t_hash_hi"], v["t_hash_lo"]),
         (v["derived_hash_hi"], v["derived_hash_lo"])),
    ]  # fmt: skip


def _examples(frame: DataFrame, names: list[str], limit: int) -> dict[str, list[str]]:
    """Up to ``limit`` violations per run of each of ``names`` in ``frame``, smallest keys
    first, in one pass over ``frame``."""
    keys = [column for column in invariants.DELIVERY if column in frame.columns]
    text = F.concat_ws(" ", *[F.concat(F.lit(f"{k}="), F.col(k).cast("string")) for k in keys])
    flagged = [
        F.when(
            F.col(f"bad_{name}"),
            F.struct(F.lit(name).alias("name"), F.col(f"why_{name}").alias("why")),
        )
        for name in names
    ]
    found = F.explode(F.filter(F.array(*flagged), lambda item: item.isNotNull()))
    first = Window.partitionBy(PARTITION_COLUMN, "name").orderBy(*keys)
    rows = (
        frame.where(reduce(lambda a, b: a | b, [F.col(f"bad_{name}") for name in names]))
        .select(*keys, text.alias("where"), found.alias("found"))
        .select(*keys, "found.name", F.concat("where", F.lit(": "), "found.why").alias("example"))
        .withColumn("rank", F.row_number().over(first))
        .where(F.col("rank") <= F.lit(limit))
        .orderBy("name", *keys)
    )
    examples: dict[str, list[str]] = {name: [] for name in names}
    for row in rows.collect():
        examples[row["name"]].append(row["example"])
    return examples


# --------------------------------------------------------------------------- entry points


def validate_tables(
    tables: Mapping[str, DataFrame],
    transitions_derived: bool = False,
    files: dict[str, dict[str, str]] | None = None,
) -> Report:
    """Check every invariant over ``tables`` (the eight tables, each with its ``run_id``
    column, any number of runs). Scans without a shuffle of the rows, run at once,
    reduce them to a few rows per run and group (digests and counts); only when a chain
    digest disagrees does a second pass check every delivery against its neighbours
    (:func:`retrysim.checks.rows.delivery_rows`), for the exact counts; examples are fetched
    only for a broken invariant. ``transitions_derived``: the
    transitions are the attempts' own derivation (a lean run's), equal to it by
    construction, so their digest is not computed (it would explode the attempts to prove
    nothing). ``files``: the tables as staged Parquet folders (run -> table -> folder), whose
    passes then run in Python tasks (:mod:`retrysim.checks.file_passes`)."""
    groups, runs = _fast_counts(tables, transitions_derived, files)
    row_by_row = not all(_chains_whole(values) for values in groups.values())
    if row_by_row:
        # a chain is broken somewhere: check every delivery against its neighbours
        checked = row_checks.checked_counts(row_checks.delivery_rows(tables, load_ends(tables)))
        _collect_parts({"checked": lambda: checked}, groups, runs)
    else:
        for values in groups.values():
            values.update(_whole_chain_counts(values))
    if transitions_derived:
        for values in groups.values():
            values.update({f"t_{key}": values.get(f"derived_{key}") for key in _DIGESTED})
    counts, examples = _tally(groups, runs)
    broken = {
        prefix: [n for n in names if any(counts[n].values())] for prefix, names in _ROW_CHECKS
    }
    if any(broken.values()):
        # the same rows with the texts, which take every step column: only now
        explained = row_checks.delivery_rows(tables, load_ends(tables), explain=True)
        rows = {"delivery": explained, "message": row_checks.message_rows(explained)}
        for prefix, names in broken.items():
            if names:
                for name, found in _examples(rows[prefix], names, EXAMPLES).items():
                    examples[name] += found
    if any(_mismatches(_digest_pairs(values)) for values in groups.values()):
        mismatches = digests.transition_mismatches(tables)
        examples["attempts_transitions"] += _examples(
            mismatches, ["attempts_transitions"], EXAMPLES
        )["attempts_transitions"]
    findings = tuple(
        Finding(
            invariant,
            sum(counts[invariant.name].values()),
            tuple(examples[invariant.name]),
            tuple(sorted(counts[invariant.name].items())),
        )
        for invariant in INVARIANTS
    )
    return Report(tuple(sorted({run for run, _ in groups} | set(runs))), findings, row_by_row)


def _fast_counts(
    tables: Mapping[str, DataFrame],
    transitions_derived: bool = False,
    files: dict[str, dict[str, str]] | None = None,
) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, dict[str, Any]]]:
    """Per run and group, every count of the passes that shuffle no rows: the digests, the
    sums summary and load must match, the chain digests; per run, its runs rows. ``files``
    (run -> table -> staged folder): the passes over those tables run in Python tasks
    instead (:mod:`retrysim.checks.file_passes`), with the same results."""
    file_passes = _file_passes()
    parts: dict[str, Callable[[], DataFrame]] = {
        "load": lambda: counts.load_counts(tables["load"]),
        "summary": lambda: counts.summary_counts(tables["summary"]),
        "derived": lambda: digests.derived_digest(
            tables["attempts"], digests.pop_groups(tables["runs"]), hashed=not transitions_derived
        ),
        "chains": lambda: digests.attempt_chain_digest(tables, load_ends(tables)),
        "messages": lambda: digests.message_chain_digest(tables["messages"], tables["runs"]),
        "dead": lambda: digests.dead_letter_chain_digest(tables["dead_letters"]),
        "runs": lambda: counts.runs_counts(tables["runs"], STATUS_COMPLETE),
    }
    if "instance_load" in tables:
        parts["instances"] = lambda: counts.instance_counts(tables["instance_load"])
    if not transitions_derived:
        parts["transitions"] = lambda: digests.transition_digest(tables["transitions"])
    from_files = _from_files(files, parts) if files else set()
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    _collect_parts(
        {name: build for name, build in parts.items() if name not in from_files},
        groups,
        runs,
        in_tasks=(
            lambda: file_passes.file_counts(
                SparkSession.active(),
                files,
                from_files,
                {run: not transitions_derived for run in files},
            )
        )
        if from_files
        else None,
    )
    later: dict[str, Callable[[], DataFrame]] = {}
    if any(values.get("replayed_takes") for values in groups.values()):
        later["born"] = lambda: digests.replayed_born_mismatches(tables)
    ranges = _id_ranges(groups)
    if ranges and files:
        for key, (low, high) in ranges.items():
            groups[key].update(digests.range_digest(low, high))
    elif ranges:
        later["range"] = lambda: digests.id_range_digest(SparkSession.active(), ranges)
    _collect_parts(later, groups, runs)
    for values in groups.values():
        if _ids_once(values):
            values["distinct_messages"] = values.get("message_rows", 0)
    if not all("distinct_messages" in values for values in groups.values()):
        # ids that are not one range: the exact count, a shuffle of the message keys
        _collect_parts({"ids": lambda: digests.message_ids(tables["messages"])}, groups, runs)
    return groups, runs


def _file_passes() -> ModuleType:
    """The passes over staged files (:mod:`retrysim.checks.file_passes`), imported when a check
    reads files: they load numba, which a command that only reads tables never needs."""
    from retrysim.checks import file_passes  # numba: only a check from staged files needs it

    return file_passes


def load_ends(tables: Mapping[str, DataFrame]) -> DataFrame:
    """Each group's load end (``load_end_ms``), which the chains and row-by-row passes read."""
    return counts.load_counts(tables["load"]).select(*invariants.GROUP, "load_end_ms")


def _from_files(files: dict[str, dict[str, str]], parts: dict[str, Any]) -> set[str]:
    """The passes of ``parts`` whose table every run has as staged files, but the attempts'
    transitions of a run with 5.x pops (their commit-log writes are Spark's rule alone)."""
    file_passes = _file_passes()
    covered = {
        name
        for name in parts
        if name in file_passes.PASS_TABLES
        and all(file_passes.PASS_TABLES[name] in tables for tables in files.values())
    }
    configs = file_passes.run_configs(files)
    if digests.pop_rows((run, config) for run, found in configs.items() for config in found):
        covered.discard("derived")
    return covered


def _id_ranges(
    groups: dict[tuple[str, str], dict[str, Any]],
) -> dict[tuple[str, str], tuple[int, int]]:
    """The groups whose message ids may be one whole range, each id once (as many rows as
    ids from the smallest to the largest): their range, whose digest tells."""
    return {
        key: (v["min_msg_id"], v["max_msg_id"])
        for key, v in groups.items()
        if v.get("message_rows") and v["max_msg_id"] - v["min_msg_id"] + 1 == v["message_rows"]
    }


def _ids_once(values: dict[str, Any]) -> bool:
    """Whether the fast passes show that a group lists each message once: it has no
    messages, or its ids are one whole range (:func:`_id_ranges`) with the range's digest."""
    v = _zeroed(values)
    return v["message_rows"] == 0 or _digest_of(v, "ids") == _digest_of(v, "range")


def _collect_parts(
    parts: dict[str, Callable[[], DataFrame]],
    groups: dict[tuple[str, str], dict[str, Any]],
    runs: dict[str, dict[str, Any]],
    in_tasks: Callable[[], list[tuple[str, str, Any, dict[str, Any]]]] | None = None,
) -> None:
    """Collect the per-group (and per-run) rows of ``parts`` (each built by its function)
    into ``groups`` and ``runs``, each part built and run as a job of its own in a thread,
    all at once: each is analysed and planned while the others run (on a new JVM, planning
    is slow, and one union of them all, or the parts built one after another before any
    ran, left the cores idle until every plan was made), and a core one part leaves idle
    takes another's tasks. ``in_tasks``: one more job, whose rows are (pass, run, group,
    values) (:func:`retrysim.checks.file_passes.file_counts`)."""
    work = [lambda build=build: build().collect() for build in parts.values()]
    if in_tasks is not None:
        work.append(in_tasks)
    if not work:
        return
    collected = run_together(work)
    found = [
        (name, row[PARTITION_COLUMN], row["group"] if name != "runs" else None, row.asDict())
        for name, rows in zip(parts, collected[: len(parts)], strict=True)
        for row in rows
    ]
    if in_tasks is not None:
        found += [
            (name, run, group, {PARTITION_COLUMN: run, "group": group, **values})
            for name, run, group, values in collected[-1]
        ]
    for name, run, group, values in found:
        values = {key: value for key, value in values.items() if value is not None}
        if name == "runs":
            runs[run] = values
        else:
            groups.setdefault((run, group), {}).update(values)


def _digest_of(v: dict[str, Any], *prefixes: str) -> tuple[int, int, int]:
    """The sum of the digests ``prefixes`` (rows, hash halves): the digest of their union."""
    return tuple(sum(v[f"{p}_{key}"] for p in prefixes) for key in _DIGESTED)


def whole_chains(tables: Mapping[str, DataFrame]) -> dict[tuple[str, str], bool]:
    """Per run and group, whether its chains are whole (:func:`_chains_whole`): when all
    are, :func:`validate_tables` needs no row-by-row pass."""
    groups, _ = _fast_counts(tables)
    return {key: _chains_whole(values) for key, values in groups.items()}


def _chains_whole(values: dict[str, Any]) -> bool:
    """Whether a group's deliveries take exactly the links their predecessors offer (the
    messages, WaitingRetry attempts, replayed dead letters), its DLQ deliveries and dead
    letters match one to one, and no row breaks a rule on its own. Then every delivery
    check holds: each delivery is entered by a legal edge from the one before, at the time,
    place, delivery number and reconsume_times it was offered (retrysim.checks.invariants)."""
    v = _zeroed(values)
    return (
        _digest_of(v, "take") == _digest_of(v, "first", "offer", "replay")
        and _digest_of(v, "dlq") == _digest_of(v, "dead")
        and v["rows_bad"] == v["dead_bad"] == v["replayed_born_bad"] == 0
        and v["message_rows"] == v["distinct_messages"]
    )


def _whole_chain_counts(values: dict[str, Any]) -> dict[str, int]:
    """What the row-by-row pass would count for a group whose chains are whole besides its
    violations (none; :func:`_tally` counts a missing one as 0): each message's final state
    is its last delivery's (a DLQ one only when its dead letter is not replayed)."""
    v = _zeroed(values)
    return {
        "final_commit": v["last_commit"],
        "final_dlq": v["last_dlq"] - v["replayed_takes"],
        "final_discard": v["last_discard"],
    }


_ROW_CHECKS = (
    ("delivery", invariants.DELIVERY_CHECKS),
    ("message", invariants.MESSAGE_CHECKS),
)


def _tally(
    groups: dict[tuple[str, str], dict[str, Any]], runs: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    """Violations per invariant and run, with examples of the group-level ones (at most
    :data:`EXAMPLES` per run)."""
    counts: dict[str, dict[str, int]] = {invariant.name: {} for invariant in INVARIANTS}
    examples: dict[str, list[str]] = {invariant.name: [] for invariant in INVARIANTS}
    shown: dict[tuple[str, str], int] = defaultdict(int)

    def add(name: str, run: str, count: int, found: list[str]) -> None:
        counts[name][run] = counts[name].get(run, 0) + count
        room = EXAMPLES - shown[name, run]
        examples[name] += found[:room]
        shown[name, run] += len(found[:room])

    for (run, group), values in sorted(groups.items()):
        for prefix, names in _ROW_CHECKS:
            for name in names:
                add(name, run, values.get(f"{prefix}_{name}", 0), [])
        for name, problems in _group_problems(values).items():
            add(name, run, len(problems), [f"run_id={run} group={group}: {p}" for p in problems])
    for run in sorted({run for run, _ in groups} | set(runs)):
        found = runs.get(run, {})
        rows, complete = found.get("rows", 0), found.get("complete", 0)
        bad = rows != 1 or complete != 1
        why = [f"run_id={run}: {rows} runs row(s), {complete} complete"] if bad else []
        add("runs_row", run, int(bad), why)
    return counts, examples


class _Lazy(Mapping[str, DataFrame]):
    """Tables built when first read: a check whose passes all run from the files never
    plans a Spark read (planning one is slow on a cold driver)."""

    def __init__(self, builders: dict[str, Callable[[], DataFrame]]) -> None:
        self._builders = builders
        self._built: dict[str, DataFrame] = {}

    def __getitem__(self, name: str) -> DataFrame:
        if name not in self._built:
            self._built[name] = self._builders[name]()
        return self._built[name]

    def __contains__(self, name: object) -> bool:
        return name in self._builders  # without building it (Mapping's would)

    def __iter__(self) -> Iterator[str]:
        return iter(self._builders)

    def __len__(self) -> int:
        return len(self._builders)


def staged_tables(
    spark: SparkSession,
    staged: dict[str, str],
    run_id: str,
    derived: dict[str, Callable[[], DataFrame]] | None = None,
) -> Mapping[str, DataFrame]:
    """A run's staged Parquet tables (without run_id inside) as frames with their run_id,
    each read when first used; ``derived`` builds the frames of tables a lean run does not
    stage."""
    builders = dict(derived or {})
    for name, schema in SCHEMAS.items():
        if name in staged:
            builders[name] = lambda path=staged[name], schema=schema: spark.read.schema(
                without_comments(data_schema(schema))
            ).parquet(path)
    return _Lazy(
        {
            name: lambda build=builders[name]: build().withColumn(PARTITION_COLUMN, F.lit(run_id))
            for name in SCHEMAS
        }
    )


def check_staged(
    spark: SparkSession,
    staged: dict[str, str],
    run_id: str,
    say: Callable[[str], None] = lambda _line: None,
    derived: dict[str, Callable[[], DataFrame]] | None = None,
) -> Report:
    """Validate a staged run; raise :class:`ValidationError` naming what broke."""
    return check_staged_runs(spark, [StagedRun(run_id, staged, derived)], say)


@dataclass(frozen=True)
class StagedRun:
    """A run's staged tables (table -> Parquet folder) and the builders of those a lean run
    derives."""

    run_id: str
    staged: dict[str, str]
    derived: dict[str, Callable[[], DataFrame]] | None = None


def check_staged_runs(
    spark: SparkSession, runs: Sequence[StagedRun], say: Callable[[str], None] = lambda _line: None
) -> Report:
    """Validate staged runs at once (a plan's: one pass of Spark jobs for all of them);
    raise :class:`ValidationError` naming the runs that broke an invariant, and what."""
    began = time.monotonic()
    each = [staged_tables(spark, run.staged, run.run_id, run.derived) for run in runs]
    tables = _Lazy(
        {
            name: lambda name=name: reduce(DataFrame.unionByName, [mine[name] for mine in each])
            for name in SCHEMAS
        }
    )
    generated = _file_passes().GENERATED
    files = {}
    for run in runs:
        files[run.run_id] = dict(run.staged)
        if "messages" in (run.derived or {}):
            files[run.run_id]["messages"] = generated
    lean = any("transitions" in (run.derived or {}) for run in runs)
    report = validate_tables(tables, transitions_derived=lean, files=files)
    if not report.ok:
        raise ValidationError(", ".join(sorted(report.broken_by_run())), report)
    how = " (row by row: the chain digests disagreed)" if report.row_by_row else ""
    which = f" in {len(runs)} runs" if len(runs) > 1 else ""
    took = f"{time.monotonic() - began:.1f}s"
    say(f"validated: {len(INVARIANTS)} invariants hold{which} ({took}){how}")
    return report


def published_tables(
    spark: SparkSession, output: str, run_id: str | None = None
) -> dict[str, DataFrame]:
    """The complete runs' tables under ``output`` (one run when ``run_id`` is given), with a
    lean run's transitions and messages derived as readers see them."""
    return {name: views.table(spark, output, name, run_id) for name in SCHEMAS}


def validate_output(spark: SparkSession, output: str, run_id: str | None = None) -> Report:
    """Validate the complete runs under ``output`` (or only ``run_id``)."""
    return validate_tables(published_tables(spark, output, run_id))
