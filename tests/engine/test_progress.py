"""Progress: each event-by-event key's heartbeat file and the driver's line, and the line
that names a phase gone quiet."""

from __future__ import annotations

import time

from retrysim.engine.event_key import Heartbeat, read_heartbeats
from retrysim.engine.event_stage import heartbeat_line
from retrysim.runner import never_quiet


def test_a_heartbeat_is_read_back_and_a_finished_key_reports_its_horizon(tmp_path):
    folder = str(tmp_path / "beats")
    beat = Heartbeat(folder, 7, horizon_ms=600_000)
    beat.beat(150_000, 1_234, first=1_000, messages=1_500)  # the first: written at once
    assert read_heartbeats(folder) == [
        {"sim_ms": 150_000, "horizon_ms": 600_000, "deliveries": 1_234, "first": 1_000,
         "messages": 1_500}
    ]  # fmt: skip
    beat.beat(160_000, 1_300, 1_050, 1_500)  # within HEARTBEAT_S of the last: not written
    assert read_heartbeats(folder)[0]["sim_ms"] == 150_000
    beat.beat(170_000, 2_000, 1_400, 1_500, done=True)
    assert read_heartbeats(folder) == [
        {"sim_ms": 600_000, "horizon_ms": 600_000, "deliveries": 2_000, "first": 1_500,
         "messages": 1_500}
    ]  # fmt: skip


def test_a_folder_that_cannot_be_written_silences_the_heartbeat(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    beat = Heartbeat(str(blocker / "beats"), 1, horizon_ms=1_000)
    beat.beat(500, 3, 3, 3, done=True)  # no error: the simulation must not fail for progress
    assert beat.path is None
    assert read_heartbeats(str(tmp_path / "missing")) == []


def test_the_line_gives_simulated_time_deliveries_and_time_left():
    one = [{"sim_ms": 900_000, "horizon_ms": 3_600_000, "deliveries": 150_000, "first": 100_000,
            "messages": 400_000}]  # fmt: skip
    assert heartbeat_line(one, keys=1, elapsed_s=30) == (
        "event by event: simulated 15m00s of 1h00m00s, 150,000 deliveries, 25% of the "
        "messages delivered once, 30s elapsed, about 1m30s left"
    )
    # four keys, one heard from and done: a quarter of the work, the rest not started
    done = [{"sim_ms": 60_000, "horizon_ms": 60_000, "deliveries": 10, "first": 8,
             "messages": 8}]  # fmt: skip
    assert heartbeat_line(done, keys=4, elapsed_s=10) == (
        "event by event: simulated 1m00s of 1m00s, 10 deliveries, 25% of the messages "
        "delivered once, 10s elapsed, about 30.0s left"
    )
    assert heartbeat_line([], keys=2, elapsed_s=5) is None


def test_a_quiet_phase_gets_a_line_naming_it():
    """No phase of a run with progress goes silent: after ``every_s`` without a line, the
    watcher says which phase is still running and since when; a line resets it."""
    lines: list[str] = []
    with never_quiet(lines.append, every_s=0.2) as say:
        say("staging tables ...")
        time.sleep(0.5)
        say("  staged load (0.5s)")
        quiet_since = len(lines)
        time.sleep(0.1)  # shorter than every_s: nothing more
        assert len(lines) == quiet_since
    assert lines[0] == "staging tables ..."
    assert lines[1].startswith("  ... staging tables: still running, ")
    assert len(lines) == quiet_since  # the watcher stopped with the run
