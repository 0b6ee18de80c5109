"""Writer leases: who is writing which run under an output folder, and whether it still lives.

A writer holds ``<output>/_staging/<run_id>-<token>.lease`` from before it stages anything
until after its last commit; its staging folder is ``<output>/_staging/<run_id>-<token>/``.
The lease is JSON (run id, host, boot id, pid and the process's start time); a daemon thread
touches it every :data:`HEARTBEAT_S` seconds. :mod:`retrysim.store.recovery` uses leases to tell a
run still being written from the leftovers of a writer that died.

**When is a writer dead?** On the same host (same hostname and boot id), exactly when its
process is gone: no such pid, a zombie, or a pid reused by a later process (its start time
differs). A live process is never judged dead, however long it has been quiet. On another
host, or after a reboot, the process cannot be asked; the writer is dead when its lease has
not been touched for :data:`LEASE_TIMEOUT_S` (a lease file's mtime is set by the file
system, so hosts' clocks need not agree). A staging folder without a lease is stale after
the same time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from retrysim.scenario.errors import ScenarioError

STAGING_DIR = "_staging"
LEASE_SUFFIX = ".lease"
HEARTBEAT_S = 10.0
# A lease untouched for this long belongs to a dead writer (other hosts only; 12 missed
# heartbeats, so a slow shared file system or a long pause does not kill a live run).
LEASE_TIMEOUT_S = 120.0
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


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
        shutil.rmtree(self.staging, ignore_errors=True)
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


# --------------------------------------------------------------------------- cleaning


def clean_staging(output: str) -> list[str]:
    """Remove the staging folders and leases of dead writers; returns the names removed."""
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
                shutil.rmtree(str(entry), ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
            cleaned.append(name)
    return cleaned
