"""Atomic runs: writer leases, publish-or-nothing, and recovery after a crash.

A run's seven tables are seven Delta commits (DESIGN.md §4), so a driver that dies between
two of them would leave rows of a run that never finished. Three pieces make every run
visible completely or not at all:

* **The protocol** (:func:`publish_run`): the run first replaces its ``runs`` row with one
  whose status is ``publishing``, then replaces its partition of the six data tables, then
  replaces the ``runs`` row with the ``complete`` one. :func:`retrysim.sinks.read_table`
  shows only rows of complete runs, so a half-published run is never visible, and a re-run
  of an existing run id hides the old version before replacing it. When a step fails, the
  run's partitions are removed again at once (:func:`remove_runs`, best effort).
* **Leases** (:class:`Lease`): a writer holds ``<output>/_staging/<run_id>-<token>.lease``
  from before it stages anything until after its last commit; its staging folder is
  ``<output>/_staging/<run_id>-<token>/``. The lease is JSON (run id, host, boot id, pid and
  the process's start time); a daemon thread touches it every :data:`HEARTBEAT_S` seconds.
* **Recovery** (:func:`recover`), at the start of every run and of ``retrysim validate``:
  per table it removes, in one Delta commit, the partitions of run ids that are not
  complete in ``runs`` and have no live lease; then it deletes the staging folders and
  leases of dead writers. Readers never write: ``read_table`` only hides.

**When is a writer dead?** On the same host (same hostname and boot id), exactly when its
process is gone: no such pid, a zombie, or a pid reused by a later process (its start time
differs). A live process is never recovered, however long it has been quiet. On another
host, or after a reboot, the process cannot be asked; the writer is dead when its lease has
not been touched for :data:`LEASE_TIMEOUT_S` (a lease file's mtime is set by the file
system, so hosts' clocks need not agree). A staging folder without a lease is stale after
the same time.

**Why recovery never removes a live run.** For each table it loads a snapshot first, then
lists the live leases, then reads which runs are complete, and commits the removal of the
snapshot's files only (an overwrite derives its removes from the snapshot it was loaded
from; files committed later are untouched). A writer takes its lease before its first commit
and drops it after its last, so every partition in the snapshot belongs to a writer whose
lease is still listed, or to one that finished (the later read of ``runs`` says complete),
or to one that died.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from retrysim.config import ScenarioError
from retrysim.sinks import (
    Sink,
    arrow_schema,
    complete_run_ids,
    remove_tree,
    table_path,
    with_commit_retries,
)
from retrysim.tables import ALL_SCHEMAS, PARTITION_COLUMN, TABLE_ORDER

STAGING_DIR = "_staging"
LEASE_SUFFIX = ".lease"
HEARTBEAT_S = 10.0
# A lease untouched for this long belongs to a dead writer (other hosts only; 12 missed
# heartbeats, so a slow shared file system or a long pause does not kill a live run).
LEASE_TIMEOUT_S = 120.0
_BOOT_ID = "/proc/sys/kernel/random/boot_id"

Say = Callable[[str], None]


class LeaseLost(RuntimeError):
    """The lease file disappeared (someone judged this writer dead): do not publish."""


# --------------------------------------------------------------------------- processes


def _boot_id() -> str | None:
    try:
        return Path(_BOOT_ID).read_text(encoding="ascii").strip()
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is a running process (not a zombie) that started at ``started``."""
    if Path("/proc/self/stat").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            return False
        fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces
        if fields[0] in ("Z", "X"):  # zombie or dead: exited, not yet reaped
            return False
        return started is None or int(fields[19]) == started
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Holder:
    """Who holds a lease; ``age_s`` is the time since its last heartbeat."""

    path: Path
    run_id: str | None
    token: str
    host: str | None
    boot_id: str | None
    pid: int | None
    pid_start: int | None
    created_ns: int
    age_s: float

    @property
    def alive(self) -> bool:
        here = self.host == socket.gethostname() and self.boot_id == _boot_id()
        if here and self.pid is not None:
            return process_alive(self.pid, self.pid_start)
        return self.age_s < LEASE_TIMEOUT_S

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} (lease {self.path})"


def _read_holder(path: Path) -> Holder | None:
    try:
        age = time.time() - path.stat().st_mtime
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None  # released meanwhile
    try:
        data = json.loads(text)
    except ValueError:
        data = {}  # unreadable (it is written atomically, so never seen here): its age decides
    return Holder(
        path=path,
        run_id=data.get("run_id"),
        token=str(data.get("token", path.stem)),
        host=data.get("host"),
        boot_id=data.get("boot_id"),
        pid=data.get("pid"),
        pid_start=data.get("pid_start"),
        created_ns=int(data.get("created_ns", 0)),
        age_s=age,
    )


def holders(output: str) -> list[Holder]:
    """Every lease under ``<output>/_staging``."""
    folder = Path(output) / STAGING_DIR
    if not folder.is_dir():
        return []
    found = (_read_holder(path) for path in sorted(folder.glob(f"*{LEASE_SUFFIX}")))
    return [holder for holder in found if holder is not None]


def live_run_ids(output: str) -> set[str]:
    return {h.run_id for h in holders(output) if h.run_id is not None and h.alive}


# --------------------------------------------------------------------------- the lease


@dataclass
class Lease:
    """A writer's claim on its run id and staging folder; see the module docstring."""

    output: str
    run_id: str
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _lost: bool = field(default=False, repr=False)

    @property
    def stem(self) -> Path:
        return Path(self.output) / STAGING_DIR / f"{self.run_id}-{self.token}"

    @property
    def path(self) -> Path:
        return self.stem.with_name(self.stem.name + LEASE_SUFFIX)

    @property
    def staging(self) -> str:
        return str(self.stem)

    def _write(self) -> None:
        pid = os.getpid()
        record = {
            "run_id": self.run_id,
            "token": self.token,
            "host": socket.gethostname(),
            "boot_id": _boot_id(),
            "pid": pid,
            "pid_start": _process_start(pid),
            "created_ns": time.time_ns(),
            "heartbeat_s": HEARTBEAT_S,
        }
        for attempt in range(5):  # another writer may remove an empty _staging meanwhile
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                temporary = self.path.with_name(self.path.name + ".tmp")
                temporary.write_text(json.dumps(record), encoding="utf-8")
                os.replace(temporary, self.path)
                return
            except FileNotFoundError:
                if attempt == 4:
                    raise

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except FileNotFoundError:
                self._lost = True
                return
            except OSError:
                continue

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this lease is still on disk."""
        if self._lost or not self.path.exists():
            raise LeaseLost(
                f"the lease {self.path} of run {self.run_id!r} was removed while the run was "
                "in progress (was its heartbeat stopped for minutes?); nothing more is published"
            )

    def release(self) -> None:
        self._stop.set()
        remove_tree(self.staging)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()  # only when empty: other writers may be running


def acquire_lease(output: str, run_id: str) -> Lease:
    """Take a lease on ``run_id`` under ``output``; refuse when a live writer holds one.

    Two writers of the same run id starting together both see each other; the one with
    the earlier lease (creation time, then token) goes on and the other refuses."""
    lease = Lease(output, run_id)
    lease._write()
    mine = _read_holder(lease.path)
    assert mine is not None
    for other in holders(output):
        if other.run_id != run_id or other.path == lease.path or not other.alive:
            continue
        if (other.created_ns, other.token) < (mine.created_ns, mine.token):
            lease.path.unlink()
            raise ScenarioError(
                "--run-id",
                f"run {run_id!r} is being written by {other.describe()}; wait for it to "
                "finish or choose another run id",
            )
    os.makedirs(lease.staging, exist_ok=True)
    threading.Thread(target=lease._heartbeat, name=f"lease-{run_id}", daemon=True).start()
    return lease


# --------------------------------------------------------------------------- recovery


@dataclass
class Recovery:
    """What :func:`recover` removed: run ids per table, and stale staging entries."""

    removed: dict[str, list[str]] = field(default_factory=dict)
    cleaned: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[str]:
        return sorted({run for runs in self.removed.values() for run in runs})


def _drop_partitions(snapshot: DeltaTable, table: str, run_ids: list[str]) -> None:
    """One commit removing the snapshot's files of ``run_ids`` (an overwrite with no adds)."""
    snapshot.create_write_transaction(
        [],
        mode="overwrite",
        schema=arrow_schema(ALL_SCHEMAS[table]),
        partition_by=[PARTITION_COLUMN],
        partition_filters=[(PARTITION_COLUMN, "in", run_ids)],
    )


def _present(snapshot: DeltaTable) -> set[str]:
    return {part[PARTITION_COLUMN] for part in snapshot.partitions()}


def recover(output: str, say: Say | None = None) -> Recovery:
    """Remove every trace of runs whose writer died before completing them.

    Data tables first, ``runs`` last (as a run publishes), then stale staging folders."""
    report = Recovery()
    for table in TABLE_ORDER:
        path = table_path(output, table)
        if not DeltaTable.is_deltatable(path):
            continue

        def attempt(table: str = table, path: str = path) -> None:
            snapshot = DeltaTable(path)  # 1. snapshot, 2. leases, 3. complete runs
            present = _present(snapshot)
            if not present:
                return
            doomed = sorted(present - live_run_ids(output) - set(complete_run_ids(output)))
            if doomed:
                _drop_partitions(snapshot, table, doomed)
                report.removed[table] = doomed

        with_commit_retries(attempt)
    report.cleaned = _clean_staging(output)
    if say and report.runs:
        tables = ", ".join(sorted(report.removed))
        say(f"recovery: removed incomplete run(s) {', '.join(report.runs)} from {tables}")
    if say and report.cleaned:
        say(f"recovery: removed {len(report.cleaned)} stale staging entries of dead writers")
    return report


def _clean_staging(output: str) -> list[str]:
    folder = Path(output) / STAGING_DIR
    if not folder.is_dir():
        return []
    cleaned = []
    leases = {h.path.name[: -len(LEASE_SUFFIX)]: h for h in holders(output)}
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if name.endswith(LEASE_SUFFIX):
            holder = leases.get(name[: -len(LEASE_SUFFIX)])
            stale = holder is not None and not holder.alive
        elif name in leases:
            stale = not leases[name].alive
        else:  # a folder or temporary file without a lease
            try:
                stale = time.time() - entry.stat().st_mtime >= LEASE_TIMEOUT_S
            except FileNotFoundError:
                stale = False
        if stale:
            if entry.is_dir():
                remove_tree(str(entry))
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
            cleaned.append(name)
    return cleaned


def remove_runs(output: str, run_ids: list[str]) -> None:
    """Remove ``run_ids`` from every run table (a failed publish rolls itself back)."""
    for table in TABLE_ORDER:
        path = table_path(output, table)
        if not DeltaTable.is_deltatable(path):
            continue

        def attempt(table: str = table, path: str = path) -> None:
            snapshot = DeltaTable(path)
            doomed = sorted(_present(snapshot) & set(run_ids))
            if doomed:
                _drop_partitions(snapshot, table, doomed)

        with_commit_retries(attempt)


# --------------------------------------------------------------------------- publishing


def publish_run(
    sink: Sink,
    spark: SparkSession,
    output: str,
    staged: dict[str, str],
    marker: str,
    lease: Lease,
) -> None:
    """Publish a staged run: ``runs`` as publishing, the data tables, ``runs`` as complete.

    ``staged`` maps every table to its staged Parquet folder (``runs`` holds the complete
    row), ``marker`` is the staged ``runs`` row with status publishing. If anything fails
    after the marker is committed, the run's partitions are removed again (best effort; a
    later :func:`recover` finishes the job when this process cannot)."""
    lease.check()
    sink.publish(spark, output, "runs", marker, lease.run_id)
    try:
        for table in TABLE_ORDER:
            if table != "runs":
                sink.publish(spark, output, table, staged[table], lease.run_id)
        lease.check()
        sink.publish(spark, output, "runs", staged["runs"], lease.run_id)
    except BaseException:
        with contextlib.suppress(Exception):
            remove_runs(output, [lease.run_id])
        raise
