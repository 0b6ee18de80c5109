"""Traffic shapes: ``arrival: profile`` (pieces of constant rate) and ``arrival: file`` (a
recorded CSV or Parquet of per-interval counts). The counts per piece are checked against
the profile as written (not against our pieces), the file reader against hand-made files,
the bad input against the one-line contract (Spark's messages against NumPy's: test_workload),
and a run end to end: what it publishes and delivers minute by minute is the file's counts."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from chispa import assert_df_equality
from pyspark.sql import functions as F
from support import PROJECT

from retrysim import simulate
from retrysim.engine.capacity import offered_load
from retrysim.model.policy import policy_for
from retrysim.model.workload import messages_np
from retrysim.scenario.errors import ScenarioError
from retrysim.scenario.loading import load_scenario, scenario_from_json, scenario_json
from retrysim.scenario.traffic import TrafficFileError, read_counts

DEFAULT = PROJECT / "conf" / "default.yaml"
DAY = [(10, 50), (15, 800), (60, 0), (70, 10.5)]  # (until in minutes, per second)


def _profile(pieces=DAY, within: str = "uniform", extra: str = "") -> str:
    listed = ", ".join(f"{{until: {m}m, per_second: {r}}}" for m, r in pieces)
    return f"groups.0.workload={{arrival: profile, within: {within}, profile: [{listed}]{extra}}}"


@pytest.mark.parametrize("within", ["uniform", "poisson"])
def test_a_profile_publishes_each_pieces_rate_within_the_piece(within):
    workload = load_scenario(DEFAULT, [_profile(within=within)]).groups[0].workload
    edges, expected, start = [0], [], 0
    for minutes, rate in DAY:  # rate x length, from the profile as written
        expected.append(round(rate * (minutes - start) * 60))
        edges.append(minutes * 60_000)
        start = minutes
    assert workload.messages == sum(expected) and workload.over == 70 * 60_000
    ids, _, born = messages_np(workload, "g", 42)
    assert list(ids) == list(range(workload.messages))
    assert list(np.histogram(born, bins=edges)[0]) == expected
    assert born.max() < edges[-1]


def test_uniform_within_a_piece_spaces_its_messages_evenly():
    workload = load_scenario(DEFAULT, [_profile([(1, 10), (2, 1)])]).groups[0].workload
    _, _, born = messages_np(workload, "g", 42)
    assert list(born[:3]) == [0, 100, 200]  # 10 a second: every 100 ms
    assert list(born[600:603]) == [60_000, 61_000, 62_000]  # then one a second


def test_the_stored_scenario_reads_back_without_the_file(tmp_path):
    (tmp_path / "t.csv").write_text("offset,count\n0,5\n1m,7\n2m,3\n")
    shaped = load_scenario(
        DEFAULT, [f"groups.0.workload={{arrival: file, file: {tmp_path}/t.csv}}"]
    )
    (tmp_path / "t.csv").unlink()
    again = scenario_from_json(scenario_json(shaped))
    assert again == shaped and again.groups[0].workload.messages == 15
    profile = load_scenario(DEFAULT, [_profile()])
    assert scenario_from_json(scenario_json(profile)) == profile


@pytest.mark.parametrize(
    ("text", "rows"),
    [
        ("timestamp,count\n2026-11-26T09:00:00Z,10\n2026-11-26T09:01:00Z,20\n",
         [(60_000, 10), (120_000, 20)]),
        ("time,value\n2026-11-26 09:00:00,10\n2026-11-26 09:00:30,20\n2026-11-26 09:01:30,5\n",
         [(30_000, 10), (90_000, 20), (150_000, 5)]),
        ("offset,count\n0s,1\n90s,2\n", [(90_000, 1), (180_000, 2)]),
        ("seconds,count\n300,4\n360,6.4\n\n", [(60_000, 4), (120_000, 6)]),
    ],
)  # fmt: skip
def test_read_counts_intervals_run_to_the_next_row_and_the_last_as_long_as_the_one_before(
    tmp_path, text, rows
):
    path = tmp_path / "traffic.csv"
    path.write_text(text)
    assert read_counts(path) == rows


def test_a_file_that_is_not_utf8_text_is_named(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text("time,count\n0,5\n60,6\n", encoding="utf-16")
    with pytest.raises(TrafficFileError, match=f"cannot read {path} as a UTF-8 CSV"):
        read_counts(path)


def test_a_scenario_whose_groups_are_not_a_list_is_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ngroups: 3\n")
    with pytest.raises(ScenarioError, match=r"^groups: "):
        load_scenario(path)


def test_read_counts_scales_and_reads_parquet(tmp_path):
    path = tmp_path / "traffic.parquet"
    pq.write_table(pa.table({"offset_s": [0, 60, 120], "count": [10, 15, 0]}), path)
    assert read_counts(path, 1.5) == [(60_000, 15), (120_000, 22), (180_000, 0)]


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("", "0 data row(s); at least two"),
        ("time,count\n0,5\n", "1 data row(s); at least two"),
        ("time,count\n0,5\n60,x\n", "line 3: count 'x' is not a number >= 0"),
        ("time,count\n0,5\n60,-1\n", "line 3: count '-1' is not a number >= 0"),
        ("time,count\n60,5\n0,1\n", "line 3: time is not after the previous row's"),
        ("time,count\n0,5\nsoon,1\n", "line 3: time 'soon' is not a timestamp"),
        ("time,count\n0,5\n2026-11-26T09:00:00Z,1\n", "mix of timestamps and offsets"),
        ("time,count\n0\n", "line 2: expected two columns"),
    ],
)
def test_read_counts_names_the_file_and_the_line(tmp_path, text, expect):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TrafficFileError) as raised:
        read_counts(path)
    assert str(raised.value).startswith(str(path)) and expect in str(raised.value)


@pytest.mark.parametrize(
    ("workload", "expect"),
    [
        ("{arrival: profile}", "workload.profile: must list at least one"),
        ("{arrival: profile, profile: []}", "workload.profile: must list at least one"),
        ("{arrival: profile, profile: [{until: 10m, per_second: -1}]}",
         "workload.profile[0].per_second: value -1: must be between 0 and"),
        ("{arrival: profile, profile: [{until: 10m, per_second: fast}]}",
         "workload.profile[0].per_second: value 'fast'"),
        ("{arrival: profile, profile: [{until: 10m, per_second: 1}, {until: 5m, per_second: 1}]}",
         "workload.profile[1].until: value 5m: must be after the previous piece's end (10m)"),
        ("{arrival: profile, profile: [{until: 10m, per_second: 1}, {until: 10m, per_second: 2}]}",
         "workload.profile[1].until: value 10m: must be after"),
        ("{arrival: profile, profile: [{until: 10m}]}", "workload.profile[0]: needs per_second"),
        ("{arrival: profile, profile: [{until: 10m, per_second: 0}]}",
         "workload.profile: gives 0 messages"),
        ("{arrival: profile, messages: 5, profile: [{until: 1m, per_second: 1}]}",
         "workload.messages: follows from the profile; leave it out"),
        ("{arrival: uniform, within: poisson}", "workload.within: only with arrival: profile"),
        ("{arrival: poisson, profile: [{until: 1m, per_second: 1}]}",
         "workload.profile: only with arrival: profile or file"),
        ("{arrival: file}", "workload.file: is required with arrival: file"),
        ("{arrival: file, file: no-such.csv}", "workload.file: cannot read"),
        ("{arrival: file, file: x.csv, scale: 0}", "workload.scale: value 0: must be a number > 0"),
        ("{arrival: file, file: x.csv, scale: .inf}", "workload.scale: value inf: must be"),
        ("{arrival: rush}", "workload.arrival: value 'rush': must be one of"),
    ],
)  # fmt: skip
def test_bad_shapes_name_the_field(workload, expect):
    assert f"groups[0].{expect}" in _refusal(f"groups.0.workload={workload}")


def _refusal(setting: str) -> str:
    """The one-line error of the default scenario with ``setting``."""
    with pytest.raises(ScenarioError) as raised:
        load_scenario(DEFAULT, [setting])
    return str(raised.value)


def test_bad_shape_on_the_command_line_exits_2_with_one_line_and_writes_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "retrysim", "simulate", "--output", str(tmp_path / "out"),
         "--set", "groups.0.workload={arrival: file, file: missing.csv}"],
        cwd=PROJECT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("retrysim: error: groups[0].workload.file: cannot read")
    assert not (tmp_path / "out").exists()


def test_the_pool_check_offers_the_busiest_pieces_rate():
    flat = load_scenario(DEFAULT, ["groups.0.workload={messages: 1200, over: 2m}"])
    peaked = load_scenario(DEFAULT, [_profile([(1, 2), (2, 18)])])  # the same 1,200 messages
    assert peaked.groups[0].workload.messages == 1200
    loads = [
        offered_load(s.groups[0], policy_for(s.groups[0], s.broker.message_delay_level).topology)
        for s in (flat, peaked)
    ]
    assert loads[1] == pytest.approx(loads[0] * 18 / 10)


# --------------------------------------------------------------------------- through Spark


def test_a_recorded_file_is_published_and_delivered_minute_by_minute(spark, tmp_path):
    """conf/recorded-spike.yaml's CSV at a twentieth of its size: each minute publishes its
    row's count, and with threads to spare each is delivered in its minute, by rounds and
    event by event alike."""
    csv = PROJECT / "conf" / "traffic" / "spike.csv"
    counts = [round(int(line.split(",")[1]) * 0.05) for line in csv.read_text().split()[1:]]
    base = [
        "groups.0.workload.scale=0.05", "horizon=30m", "load_bucket=1m",
        "groups.0.behavior.fail_probability=0",
    ]  # fmt: skip
    pool = "groups.0.consumers={instances: 4, threads: 64}"
    runs = {
        "rounds": ([*base, "groups.0.consumers=unlimited"], {}),
        "events": ([*base, pool], {"small_group": 10**9}),
    }
    attempts = {}
    for name, (overrides, options) in runs.items():
        scenario = load_scenario(PROJECT / "conf" / "recorded-spike.yaml", overrides)
        result = simulate(spark, scenario, output=str(tmp_path / "out"), run_id=name,
                          validate=False, **options)  # fmt: skip
        published = (
            result.messages.groupBy((F.col("born_ms") / 60_000).cast("int").alias("minute"))
            .count()
            .orderBy("minute")
        )
        assert [r["count"] for r in published.collect()] == counts, name
        load = result.load.orderBy("bucket_start_ms").collect()
        assert [r["first_deliveries"] for r in load[: len(counts)]] == counts, name
        assert sum(r["first_deliveries"] for r in load) == sum(counts)
        attempts[name] = result.attempts.select("msg_id", "delivery", "start_ms", "end_ms")
    assert_df_equality(attempts["rounds"], attempts["events"], ignore_row_order=True)


def test_the_daily_profile_example_publishes_its_day_piece_by_piece():
    path = PROJECT / "conf" / "daily-profile.yaml"
    written = yaml.safe_load(path.read_text())["groups"][0]["workload"]["profile"]
    workload = load_scenario(path).groups[0].workload
    edges = [0] + [int(piece["until"].removesuffix("m")) * 60_000 for piece in written]
    expected = [
        round(piece["per_second"] * (end - start) / 1000)
        for piece, start, end in zip(written, edges, edges[1:], strict=False)
    ]
    _, _, born = messages_np(workload, "notifications", 42)
    assert list(np.histogram(born, bins=edges)[0]) == expected
    assert workload.messages == sum(expected) and workload.spread == "poisson"


@pytest.mark.parametrize(
    ("profile", "expect"),
    [
        ("[{until: 10m}]", "behavior.profile[0]: needs fail_probability, processing_time or both"),
        ("[{until: 10m, fail_probability: 0.1}, {until: 5m, fail_probability: 0.2}]",
         "behavior.profile[1].until: value 5m: must be after the previous piece's end (10m)"),
        ("[{until: 10m, fail_probability: 1.5}]", "behavior.profile[0].fail_probability"),
        ("[{until: 10m, processing_time: slow}]", "behavior.profile[0].processing_time"),
    ],
)  # fmt: skip
def test_bad_behavior_profiles_name_the_field(profile, expect):
    assert f"groups[0].{expect}" in _refusal(f"groups.0.behavior.profile={profile}")


def test_behavior_pieces_are_windows_before_the_outages():
    pieces = "[{until: 5m, processing_time: 1s}, {until: 9m, fail_probability: 0.5}]"
    scenario = load_scenario(DEFAULT, [f"groups.0.behavior.profile={pieces}"])
    behavior = scenario.groups[0].behavior
    windows = [(w.start, w.end, w.fail_probability) for w in behavior.windows]
    outage = behavior.outages[0]
    assert windows == [
        (0, 300_000, behavior.fail_probability),  # the group's chance where a piece gives none
        (300_000, 540_000, 0.5),
        (outage.start, outage.end, outage.fail_probability),
    ]
    assert behavior.windows[0].processing_time.mean == 1_000
    assert behavior.windows[1].processing_time is None
