"""Run leases (retrysim.store.lease): a run id being written is refused to a second writer,
and a writer is dead when its process is gone (or its pid reused) on this host, or when its
lease's heartbeat is stale from another host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from retrysim.scenario.errors import ScenarioError
from retrysim.store import lease as lease_module
from retrysim.store.lease import LEASE_TIMEOUT_S, Holder, acquire_lease, holders


def test_a_run_id_being_written_is_refused(tmp_path):
    lease = acquire_lease(str(tmp_path), "busy")
    try:
        with pytest.raises(ScenarioError, match=r"--run-id: run 'busy' is being written by pid"):
            acquire_lease(str(tmp_path), "busy")
        acquire_lease(str(tmp_path), "other").release()
    finally:
        lease.release()
    assert not (tmp_path / "_staging").exists()


def _holder(tmp_path: Path, **record) -> Holder:
    path = tmp_path / "_staging" / "x-1.lease"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"run_id": "x", "token": "1", **record}), encoding="utf-8")
    found = [h for h in holders(str(tmp_path)) if h.path == path]
    return found[0]


def test_a_writer_is_dead_when_its_process_is_gone_or_its_lease_is_stale(tmp_path):
    here = {"host": socket.gethostname(), "boot_id": lease_module._boot_id()}
    me = os.getpid()
    assert _holder(tmp_path, **here, pid=me, pid_start=lease_module._process_start(me)).alive
    assert not _holder(tmp_path, **here, pid=me, pid_start=-1).alive, "a reused pid"
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    assert not _holder(tmp_path, **here, pid=int(finished.stdout), pid_start=None).alive
    elsewhere = {"host": "another-host", "boot_id": "b", "pid": me, "pid_start": None}
    assert _holder(tmp_path, **elsewhere).alive, "a fresh heartbeat from another host"
    stale = time.time() - LEASE_TIMEOUT_S - 1
    path = tmp_path / "_staging" / "x-1.lease"
    os.utime(path, (stale, stale))
    assert not next(h for h in holders(str(tmp_path)) if h.path == path).alive
