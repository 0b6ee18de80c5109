"""The benchmark: retrysim end to end, beside a NumPy and a SimPy baseline, on one scenario.

One command runs, on bench/scenario.yaml and in this process tree:

1. retrysim at each size: ``./spark-submit.sh --conf spark.driver.memory=M jobs/simulate.py
   ... --master local[2]`` as a subprocess into a fresh folder under bench/out/;
2. bench/baseline_numpy.py at each size (the vectorised lower bound, one Parquet file);
3. bench/baseline_simpy.py once, on a subsample of the largest size (default 100k
   messages), its rate extrapolated to every size.

For retrysim it measures:

* wall time of the whole job, and the simulation time the job reports
  ("retrysim: run <id> finished in <X>s over <N> rounds": rounds, staging and Delta commits);
* where the time goes: every stdout line is time-stamped on arrival, giving the phases
  (JVM start + imports, Spark session, round 1, later rounds, staging the tables as Parquet,
  Delta publish, summary read-back, shutdown) and each round's own seconds; with
  --event-log, also every Spark SQL execution's start and duration;
* CPU seconds used by the job, and by everything else on the host meanwhile (plus steal),
  to tell a slow run from a busy machine;
* simulated deliveries (sum of ``summary.deliveries``, read with the ``deltalake`` package)
  and deliveries per second of simulation time and of wall time;
* active files per Delta table (``len(DeltaTable(path).file_uris())``) and their bytes;
* peak RSS of the process tree, polled every 0.2 s: the driver JVM (SparkSubmit), the Python
  driver, and any other Python processes (PySpark workers) separately, plus the tree total;
  and the JVM heap setting in use (-Xmx of the driver JVM);
* peak executor memory as Spark itself reports it: the job runs with the event log on and
  ``spark.eventLog.logStageExecutorMetrics=true`` (metrics polled every 500 ms), and the
  maximum of every metric over the stage and task executor-metrics events is taken (JVM
  heap and off-heap used, execution and storage memory, direct pool, GC). In local mode the
  only executor, ``driver``, lives in the driver JVM.

For each baseline: wall time, its own timing (compute and Parquet write), deliveries per
second, peak RSS; and per size the delivery count of retrysim against the NumPy baseline
(same draws, so they must be equal) and the ratio of retrysim's rate to each baseline's.

Results are printed as tables and written to the configuration's one file in bench/results/,
``<tables>[-novalidate]-<sizes>.json`` (``full-10M.json``, ``lean-novalidate-100M.json``;
``simpy-10M.json`` when only a baseline runs), rewritten after each size and overwritten by
the next run of the same configuration (``--results`` names another file). Output folders are
removed afterwards unless --keep (or the run failed).

    .venv/bin/python bench/run_bench.py --quick            # 1M messages only, a few minutes
    .venv/bin/python bench/run_bench.py                    # 1M, 10M and 50M
    .venv/bin/python bench/run_bench.py --sizes 100k       # a smoke run (~1 min)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
TABLES = ("runs", "messages", "attempts", "transitions", "dead_letters", "load", "summary")
PUBLISH_ORDER = ("messages", "attempts", "transitions", "dead_letters", "load", "summary", "runs")
POLL_S = 0.2
EXECUTOR_POLL = "500ms"  # spark.executor.metrics.pollingInterval for the peak executor memory
MIB = 1024 * 1024

FINISHED_RE = re.compile(r"retrysim: run (\S+) finished in ([0-9.]+)s over (\d+) rounds")
ROUND_RE = re.compile(
    r"retrysim: round (\d+): ([\d,]+) deliveries, ([\d,]+) to retry, ([0-9.]+)s elapsed"
)


# --------------------------------------------------------------------------- process tree


def _children_map() -> dict[int, list[int]]:
    """ppid -> pids, from /proc/*/stat (the comm field may hold spaces and parentheses)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _descendants(root: int) -> list[int]:
    children = _children_map()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return 0  # a zombie has no VmRSS line


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def _kind(cmd: list[str]) -> str:
    """jvm (the driver JVM), launcher (spark-class's short-lived command builder JVM),
    driver (the Python driver running jobs/simulate.py), python (other Python: workers),
    other (bash wrappers and helpers)."""
    if not cmd:
        return "other"
    exe = os.path.basename(cmd[0])
    if exe == "java":
        if "org.apache.spark.launcher.Main" in cmd:
            return "launcher"
        return "jvm"
    if exe.startswith("python"):
        return "driver" if any(arg.endswith("jobs/simulate.py") for arg in cmd) else "python"
    return "other"


@dataclass
class MemorySampler:
    """Polls the RSS of a process tree every POLL_S seconds on a background thread."""

    root: int
    began: float
    peaks: dict[str, int] = field(default_factory=dict)
    peak_at: dict[str, float] = field(default_factory=dict)
    jvm_cmd: list[str] = field(default_factory=list)
    python_cmds: set[str] = field(default_factory=set)
    samples: int = 0
    cpu_s: float = 0.0
    delta_logs: dict[str, float] = field(default_factory=dict)
    watch: Path | None = None
    _cmds: dict[int, list[str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> MemorySampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(POLL_S)
        self.cpu_s = time.thread_time()

    def sample(self) -> None:
        now = time.monotonic() - self.began
        totals = {"jvm": 0, "driver": 0, "python": 0, "tree": 0}
        for pid in _descendants(self.root):
            rss = _rss_bytes(pid)
            if rss is None:
                continue
            if pid not in self._cmds:
                cmd = _cmdline(pid)
                if not cmd:
                    continue  # exiting, or not exec'd yet; look again next poll
                self._cmds[pid] = cmd
            cmd = self._cmds[pid]
            kind = _kind(cmd)
            # the root bash process exec's into the driver JVM: refresh its command line
            if kind in ("other", "launcher") and pid == self.root:
                cmd = self._cmds[pid] = _cmdline(pid) or cmd
                kind = _kind(cmd)
            if kind == "jvm" and not self.jvm_cmd:
                self.jvm_cmd = cmd
            if kind == "python":
                self.python_cmds.add(" ".join(cmd[:4])[:160])
            if kind in totals:
                totals[kind] += rss
            totals["tree"] += rss
        for kind, value in totals.items():
            if value > self.peaks.get(kind, -1):
                self.peaks[kind], self.peak_at[kind] = value, now
        self.samples += 1
        if self.watch is not None:
            for table in TABLES:
                if (
                    table not in self.delta_logs
                    and (self.watch / table / "_delta_log" / f"{0:020d}.json").exists()
                ):
                    self.delta_logs[table] = time.monotonic() - self.began


def _host_cpu() -> dict[str, float]:
    """Machine-wide CPU seconds from /proc/stat: busy (user..softirq), steal, idle (+iowait)."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = values
    return {
        "busy": (user + nice + system + irq + softirq) / tick,
        "steal": steal / tick,
        "idle": (idle + iowait) / tick,
    }


def _xmx(cmd: list[str]) -> str | None:
    for arg in cmd:
        if arg.startswith("-Xmx"):
            return arg[4:]
    return None


# --------------------------------------------------------------------------- one run


@dataclass
class Line:
    t: float
    text: str


def run_size(args: argparse.Namespace, size: int) -> dict:
    label = f"size-{size}" + ("-lean" if args.tables == "lean" else "")
    folder = Path(args.out_dir) / label
    output = folder / "tables"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    run_id = f"bench-{size}"
    spark_opts = ["--conf", f"spark.driver.memory={args.driver_memory}"]
    events = folder / "eventlog"
    if args.executor_metrics or args.event_log:
        # Spark's event log, with each stage's peak executor memory (local mode: the one
        # executor "driver" lives in the driver JVM), polled every EXECUTOR_POLL
        events.mkdir()
        for item in (
            "spark.eventLog.enabled=true",
            f"spark.eventLog.dir={events}",
            "spark.eventLog.compress=false",
            "spark.eventLog.logStageExecutorMetrics=true",
            f"spark.executor.metrics.pollingInterval={EXECUTOR_POLL}",
            "spark.executor.processTreeMetrics.enabled=true",
        ):
            spark_opts += ["--conf", item]
    for item in args.conf:
        spark_opts += ["--conf", item]
    overrides = [f"groups.0.workload.messages={size}", *args.set]
    if getattr(args, "pool", False):  # the arrival span that keeps --rate, and its horizon
        overrides.append(f"groups.0.workload.over={_over_s(args, size)}s")
        overrides.append(f"horizon={_horizon_s(args, size)}s")
    command = [
        str(ROOT / "spark-submit.sh"),
        *spark_opts,
        "jobs/simulate.py",
        "--scenario",
        str(Path(args.scenario).resolve()),
        "--output",
        str(output),
        "--run-id",
        run_id,
        "--master",
        args.master,
        "--tables",
        args.tables,
        *([] if args.validate else ["--no-validate"]),
        "--delta-sink",
        args.delta_sink,
    ]
    for item in overrides:
        command += ["--set", item]
    print(f"\n== {size:,} messages: {' '.join(command)}", flush=True)

    lines: list[Line] = []
    host_before, usage_before = _host_cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
    began, began_epoch = time.monotonic(), time.time()
    with (
        open(folder / "stdout.log", "w") as out_log,
        open(folder / "stderr.log", "w") as err_log,
    ):
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err_log,
            text=True,
            bufsize=1,
        )
        sampler = MemorySampler(process.pid, began, watch=output).start()
        assert process.stdout is not None
        for text in process.stdout:
            now = time.monotonic() - began
            lines.append(Line(now, text.rstrip("\n")))
            out_log.write(f"{now:9.2f} {text}")
            out_log.flush()
            if args.echo:
                print(f"  {now:8.1f}s | {text.rstrip()}", flush=True)
        returncode = process.wait()
        wall_s = time.monotonic() - began
        sampler.stop()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    host = {k: v - host_before[k] for k, v in _host_cpu().items()}
    job_cpu = (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime)

    result: dict = {
        "size": size,
        "run_id": run_id,
        "returncode": returncode,
        "wall_s": round(wall_s, 2),
        "command": command,
        # CPU seconds of the whole job (JVM, Python driver and workers), and what else used
        # the machine meanwhile: noise indicators for a shared or virtual host.
        "cpu": {
            "job_user_s": round(usage.ru_utime - usage_before.ru_utime, 1),
            "job_sys_s": round(usage.ru_stime - usage_before.ru_stime, 1),
            "host_busy_s": round(host["busy"], 1),
            "host_other_s": round(max(host["busy"] - job_cpu - sampler.cpu_s, 0.0), 1),
            "host_steal_s": round(host["steal"], 1),
            "host_idle_s": round(host["idle"], 1),
            "sampler_s": round(sampler.cpu_s, 2),
        },
    }
    result.update(_memory_report(sampler, args.driver_memory))
    result.update(_timeline(lines, sampler, wall_s))
    if args.event_log:
        result["sql_executions"] = _sql_executions(events, began_epoch)
    if args.executor_metrics:
        result["executor_memory"] = _executor_metrics(events)
    if returncode != 0:
        print(f"!! job failed with exit code {returncode}; logs kept in {folder}", flush=True)
        tail = (folder / "stderr.log").read_text(errors="replace").splitlines()[-30:]
        print("\n".join(f"   {line}" for line in tail), flush=True)
        result["stderr_tail"] = tail
        return result
    result.update(_tables_report(output, run_id))
    sim_s = result.get("sim_s")
    deliveries = result.get("deliveries")
    if deliveries is not None:
        result["deliveries_per_sim_s"] = round(deliveries / sim_s) if sim_s else None
        result["deliveries_per_wall_s"] = round(deliveries / wall_s)
    if args.keep:
        result["kept"] = str(folder)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def _memory_report(sampler: MemorySampler, driver_memory: str) -> dict:
    peaks = {kind: round(value / MIB, 1) for kind, value in sampler.peaks.items()}
    return {
        "driver_memory_conf": driver_memory,
        "driver_jvm_xmx": _xmx(sampler.jvm_cmd),
        "peak_rss_mib": peaks,
        "peak_rss_at_s": {kind: round(t, 1) for kind, t in sampler.peak_at.items()},
        "memory_samples": sampler.samples,
        "other_python_processes": sorted(sampler.python_cmds),
    }


def _timeline(lines: list[Line], sampler: MemorySampler, wall_s: float) -> dict:
    """Phases from the arrival times of the job's progress lines."""
    report: dict = {}
    first = next((line.t for line in lines if line.text.startswith("retrysim:")), None)
    rounds = []
    staging = committed = finished = validating = validated = None
    event_start = event_end = previous = None
    for line in lines:
        if line.text.startswith("retrysim:   ... "):
            continue  # runner.never_quiet's reminder names the phase, but does not start it
        match = ROUND_RE.search(line.text)
        if match:
            elapsed = float(match.group(4))
            rounds.append(
                {
                    "round": int(match.group(1)),
                    "deliveries": int(match.group(2).replace(",", "")),
                    "to_retry": int(match.group(3).replace(",", "")),
                    "elapsed_s": elapsed,
                    "round_s": round(elapsed - (previous or 0.0), 2),
                    "at_s": round(line.t, 2),
                }
            )
            previous = elapsed
        elif "event-by-event simulation of" in line.text:
            event_start = line.t
        elif "event-by-event:" in line.text:
            event_end = line.t
        elif "staging tables" in line.text:
            staging = line.t
        elif "validating the staged run" in line.text:
            validating = line.t
        elif "validated:" in line.text:
            validated = line.t
        elif "committed" in line.text and "tables with the" in line.text:
            committed = line.t
            report["sink"] = line.text.rsplit("with the ", 1)[-1].split(" sink")[0]
        match = FINISHED_RE.search(line.text)
        if match:
            finished = line.t
            report["sim_s"] = float(match.group(2))
            report["rounds"] = int(match.group(3))
    report["round_times"] = rounds
    # simulate() starts once the session is up and prints "committed ..." just before it
    # returns, so it started about that line's time minus the reported simulation seconds.
    sim_start = committed - report["sim_s"] if committed and "sim_s" in report else None
    first_round = rounds[0]["at_s"] if rounds else None
    last_round = rounds[-1]["at_s"] if rounds else None
    publish = _first_commit(sampler)
    marks = [
        ("jvm_start_and_imports", 0.0, first),
        ("spark_session", first, sim_start),
        ("round_1", sim_start, first_round),
        ("rounds_2_on", first_round, last_round),
        ("event_by_event", event_start, event_end),
        ("stage_tables", staging, validating or publish),
        ("validate", validating, validated),
        ("publish_delta", publish, committed),
        ("summary_readback", committed, finished),
        ("shutdown", finished, wall_s),
    ]
    phases = {}
    for name, start, end in marks:
        if start is not None and end is not None:
            phases[name] = round(max(end - start, 0.0), 2)
    report["phases_s"] = phases
    report["delta_first_commit_at_s"] = {k: round(v, 1) for k, v in sampler.delta_logs.items()}
    return report


def _sql_executions(events: Path, began_epoch: float) -> list[dict]:
    """Every Spark SQL execution (one per DataFrame action) from the event log: when it
    started (seconds since launch), how long it ran, and its description (call site)."""
    starts: dict[int, dict] = {}
    for log in sorted(p for p in events.rglob("*") if p.is_file()):
        with open(log, errors="replace") as handle:
            for text in handle:
                if "SQLExecution" not in text[:120]:
                    continue
                event = json.loads(text)
                kind = event.get("Event", "").rsplit(".", 1)[-1]
                if kind == "SparkListenerSQLExecutionStart":
                    starts[event["executionId"]] = {
                        "id": event["executionId"],
                        "at_s": round(event["time"] / 1000 - began_epoch, 2),
                        "description": event.get("description", "")[:120],
                        "_t0": event["time"],
                    }
                elif kind == "SparkListenerSQLExecutionEnd" and event["executionId"] in starts:
                    entry = starts[event["executionId"]]
                    entry["seconds"] = round((event["time"] - entry.pop("_t0")) / 1000, 2)
    return [e for e in sorted(starts.values(), key=lambda e: e["id"]) if "seconds" in e]


# Executor metrics (org.apache.spark.metrics.ExecutorMetricType) reported in MiB; the GC
# counters and times are cumulative, so their maximum is the run's total.
MEMORY_METRICS = {
    "JVMHeapMemory": "jvm_heap",
    "JVMOffHeapMemory": "jvm_off_heap",
    "OnHeapExecutionMemory": "on_heap_execution",
    "OffHeapExecutionMemory": "off_heap_execution",
    "OnHeapStorageMemory": "on_heap_storage",
    "OffHeapStorageMemory": "off_heap_storage",
    "OnHeapUnifiedMemory": "on_heap_unified",
    "DirectPoolMemory": "direct_pool",
    "MappedPoolMemory": "mapped_pool",
    "ProcessTreeJVMRSSMemory": "process_tree_jvm_rss",
    "ProcessTreePythonRSSMemory": "process_tree_python_rss",
}
GC_METRICS = {
    "MinorGCCount": "minor_gc_count",
    "MinorGCTime": "minor_gc_ms",
    "MajorGCCount": "major_gc_count",
    "MajorGCTime": "major_gc_ms",
    "TotalGCTime": "total_gc_ms",
}


def _executor_metrics(events: Path) -> dict:
    """Peak executor memory from the event log: the maximum, over every stage's
    ``SparkListenerStageExecutorMetrics`` and every task's ``Task Executor Metrics``, of each
    metric, per executor (in local mode only ``driver``)."""
    peaks: dict[str, dict[str, int]] = {}
    for log in sorted(p for p in events.rglob("*") if p.is_file()):
        with open(log, errors="replace") as handle:
            for text in handle:
                head = text[:80]
                if "StageExecutorMetrics" in head:
                    event = json.loads(text)
                    executor, metrics = event.get("Executor ID"), event.get("Executor Metrics")
                elif "SparkListenerTaskEnd" in head:
                    event = json.loads(text)
                    executor = event.get("Task Info", {}).get("Executor ID")
                    metrics = event.get("Task Executor Metrics")
                else:
                    continue
                if not metrics:
                    continue
                seen = peaks.setdefault(str(executor), {})
                for key, value in metrics.items():
                    if isinstance(value, (int, float)) and value > seen.get(key, -1):
                        seen[key] = value
    report: dict = {"source": "event log", "executors": {}}
    for executor, seen in peaks.items():
        entry = {
            f"{name}_mib": round(seen[key] / MIB, 1) for key, name in MEMORY_METRICS.items()
            if key in seen
        }  # fmt: skip
        entry |= {name: int(seen[key]) for key, name in GC_METRICS.items() if key in seen}
        report["executors"][executor] = entry
    if peaks:
        report["peak_jvm_heap_mib"] = max(
            e.get("jvm_heap_mib", 0) for e in report["executors"].values()
        )
        report["peak_jvm_off_heap_mib"] = max(
            e.get("jvm_off_heap_mib", 0) for e in report["executors"].values()
        )
    return report


def _first_commit(sampler: MemorySampler) -> float | None:
    """When the first table appeared: staging ends and publishing begins (±0.2 s)."""
    return min((t for t in sampler.delta_logs.values() if t is not None), default=None)


def _tables_report(output: Path, run_id: str) -> dict:
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    files, sizes = {}, {}
    for table in TABLES:
        if not DeltaTable.is_deltatable(str(output / table)):  # a lean run skips two tables
            files[table], sizes[table] = 0, 0.0
            continue
        uris = DeltaTable(str(output / table)).file_uris()
        files[table] = len(uris)
        sizes[table] = round(sum(os.path.getsize(uri) for uri in uris) / MIB, 2)
    summary = DeltaTable(str(output / "summary")).to_pyarrow_table()
    summary = summary.filter(pc.equal(summary["run_id"], run_id))

    def total(column: str) -> int | None:
        return int(pc.sum(summary[column]).as_py() or 0) if column in summary.column_names else None

    return {
        "messages": total("messages"),
        "deliveries": total("deliveries"),
        "dlq": total("dlq"),
        "pending": total("pending"),
        "p99_time_to_commit_s": (
            round(pc.max(summary["p99_time_to_commit_ms"]).as_py() / 1000, 3)
            if summary.num_rows and pc.max(summary["p99_time_to_commit_ms"]).as_py() is not None
            else None
        ),
        "files_per_table": files,
        "mib_per_table": sizes,
    }


# --------------------------------------------------------------------------- formatting


def _fmt_int(value) -> str:
    return "-" if value is None else f"{value:,}"


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- baselines


def _run_child(command: list[str], label: str) -> dict:
    """Run a baseline script as a child process: its wall time, the peak RSS of its process
    tree (same sampler as for spark-submit) and the JSON line it prints last."""
    print(f"\n== {label}: {' '.join(command)}", flush=True)
    began = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    sampler = MemorySampler(process.pid, began).start()
    stdout, _ = process.communicate()
    wall_s = time.monotonic() - began
    sampler.stop()
    report: dict = {"returncode": process.returncode, "wall_s": round(wall_s, 2)}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if lines:
        report.update(json.loads(lines[-1]))
    report["peak_rss_mib"] = round(sampler.peaks.get("tree", 0) / MIB, 1)
    report["command"] = command
    if process.returncode != 0:
        print(f"!! {label} exited with code {process.returncode}", flush=True)
    return report


def _scenario_args(args: argparse.Namespace) -> list[str]:
    extra = ["--scenario", str(Path(args.scenario).resolve())]
    for item in args.set:
        extra += ["--set", item]
    return extra


def run_numpy(args: argparse.Namespace, size: int) -> dict:
    """bench/baseline_numpy.py at the full size, writing its one Parquet file."""
    folder = Path(args.out_dir) / f"numpy-{size}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = [
        sys.executable,
        str(BENCH / "baseline_numpy.py"),
        *_scenario_args(args),
        "--messages",
        str(size),
        "--output",
        str(folder / "attempts.parquet"),
        "--json",
    ]
    report = _run_child(command, f"NumPy baseline, {size:,} messages")
    if report.get("deliveries"):
        report["deliveries_per_wall_s"] = round(report["deliveries"] / report["wall_s"])
    if args.keep:
        report["kept"] = str(folder)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return report


def run_simpy(args: argparse.Namespace, size: int) -> dict:
    """bench/baseline_simpy.py on a subsample of ``size`` messages (its own NumPy check)."""
    folder = Path(args.out_dir) / "simpy"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = [
        sys.executable,
        str(BENCH / "baseline_simpy.py"),
        *_scenario_args(args),
        "--messages",
        str(size),
        "--sample",
        str(args.simpy_sample),
        "--output",
        str(folder / "attempts.parquet"),
        "--json",
    ]
    report = _run_child(command, f"SimPy baseline, {args.simpy_sample:,} of {size:,} messages")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return report


def _over_s(args: argparse.Namespace, size: int) -> int:
    """--pool: the arrival span that keeps the scenario's rate (``--rate`` a second)."""
    return max(1, round(size / args.rate))


POOL_HORIZON_S = 6 * 3600  # saturated.yaml's horizon: room for 300k and 3M to drain


def _horizon_s(args: argparse.Namespace, size: int) -> int:
    """--pool: a horizon that lets the pool drain what arrives: the scenario's 6 h, or
    twice the arrival span when that is longer (32 threads at 100 ms take 320 messages a
    second of the 500 that arrive, so a backlog takes about as long again to drain)."""
    return max(POOL_HORIZON_S, 2 * _over_s(args, size))


def run_pool(args: argparse.Namespace, size: int) -> dict:
    """--pool: the SimPy finite-pool model (bench/baseline_simpy_pool.py) at the full size,
    and the compiled engine alone outside Spark (bench/engine_alone.py), same rate."""
    over = f"{_over_s(args, size)}s"
    sizes = ["--messages", str(size), "--over", over, "--horizon",
             f"{_horizon_s(args, size)}s", "--json"]  # fmt: skip
    pool = _run_child(
        [sys.executable, str(BENCH / "baseline_simpy_pool.py"), *sizes],
        f"SimPy finite-pool model, {size:,} messages",
    )
    engine = _run_child(
        [sys.executable, str(BENCH / "engine_alone.py"), *sizes],
        f"compiled engine alone, {size:,} messages",
    )
    return {"simpy_pool": pool, "engine_alone": engine}


def compare_pool(entry: dict) -> None:
    """--pool ratios, each retrysim's rate over the SimPy model's (above 1: retrysim is
    faster): ``engine`` the compiled engine alone, ``wall`` retrysim end to end (launch to
    exit), and both p99 times to commit (they agree statistically, not row by row)."""
    pool = entry.get("simpy_pool") or {}
    engine = entry.get("engine_alone") or {}
    rate = pool.get("deliveries_per_s")
    if not rate:
        return
    ratios = {"engine": round(engine["deliveries_per_s"] / rate, 2)} if engine.get(
        "deliveries_per_s") else {}  # fmt: skip
    if entry.get("deliveries_per_wall_s"):
        ratios["wall"] = round(entry["deliveries_per_wall_s"] / rate, 3)
        ratios["wall_s"] = {"retrysim": entry.get("wall_s"), "simpy_pool": pool.get("simulate_s")}
    ratios["p99_time_to_commit_s"] = {
        "retrysim": entry.get("p99_time_to_commit_s"),
        "engine_alone": engine.get("p99_time_to_commit_s"),
        "simpy_pool": pool.get("p99_time_to_commit_s"),
    }
    entry["ratios"] = {"simpy_pool": ratios}


def compare(entry: dict, simpy: dict | None) -> None:
    """Delivery-count check and the ratios of retrysim's rates to each baseline's.

    A ratio is retrysim's deliveries per second divided by the baseline's (below 1: retrysim
    is slower): ``wall`` uses retrysim's launch-to-exit time, ``sim`` its simulate() time.
    The NumPy rate is its in-process time (``run_s``: compute + Parquet write); the SimPy rate
    is the subsample's simulation time, which extrapolates linearly.
    """
    engine = entry.get("deliveries")
    numpy = entry.get("numpy") or {}
    if engine is not None and numpy.get("deliveries") is not None:
        entry["delivery_check"] = {
            "retrysim": engine,
            "numpy": numpy["deliveries"],
            "match": engine == numpy["deliveries"],
        }
    deliveries = engine if engine is not None else numpy.get("deliveries")
    if simpy and simpy.get("deliveries_per_s"):
        rate = simpy["deliveries_per_s"]
        entry["simpy"] = {
            "deliveries_per_s": rate,
            "extrapolated_s": round(deliveries / rate, 1) if deliveries else None,
        }
    ratios: dict = {}
    for name, rate in (
        ("numpy", numpy.get("deliveries_per_s")),
        ("simpy", (simpy or {}).get("deliveries_per_s")),
    ):
        if rate and entry.get("deliveries_per_wall_s"):
            ratios[name] = {
                "wall": round(entry["deliveries_per_wall_s"] / rate, 4),
                "sim": round((entry.get("deliveries_per_sim_s") or 0) / rate, 4),
            }
    entry["ratios"] = ratios


# --------------------------------------------------------------------------- report


def _mib(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value) -> str:
    """retrysim rate / baseline rate, as 1/N when retrysim is N times slower."""
    if not value:
        return "-"
    return f"1/{1 / value:,.0f}" if value < 1 else f"{value:,.2f}"


def print_report(results: list[dict], simpy: dict | None) -> None:
    print("\n== throughput (deliveries per second; ratio = retrysim rate / baseline rate)")
    rows = []
    for r in results:
        numpy, ratios = r.get("numpy") or {}, r.get("ratios") or {}
        check = r.get("delivery_check")
        rows.append(
            [
                _fmt_int(r["size"]),
                _fmt_int(r.get("deliveries", numpy.get("deliveries"))),
                "-" if check is None else ("yes" if check["match"] else "NO"),
                _fmt(r.get("wall_s")),
                _fmt(r.get("sim_s")),
                _fmt_int(r.get("deliveries_per_wall_s")),
                _fmt_int(r.get("deliveries_per_sim_s")),
                _fmt(numpy.get("run_s"), 2),
                _fmt(numpy.get("write_s"), 2),
                _fmt_int(numpy.get("deliveries_per_s")),
                _fmt_int((r.get("simpy") or {}).get("deliveries_per_s")),
                _fmt((r.get("simpy") or {}).get("extrapolated_s"), 0),
                _ratio(ratios.get("numpy", {}).get("wall")),
                _ratio(ratios.get("numpy", {}).get("sim")),
                _ratio(ratios.get("simpy", {}).get("wall")),
                _ratio(ratios.get("simpy", {}).get("sim")),
            ]
        )
    print(
        _table(
            ["messages", "deliveries", "count=", "rsim wall s", "rsim sim s", "rsim/s wall",
             "rsim/s sim", "numpy s", "np write s", "numpy/s", "simpy/s", "simpy est s",
             "vs numpy wall", "vs numpy sim", "vs simpy wall", "vs simpy sim"],
            rows,
        )
    )  # fmt: skip
    print("\n== memory (MiB) and files")
    rows = []
    for r in results:
        numpy, executor = r.get("numpy") or {}, r.get("executor_memory") or {}
        driver = (executor.get("executors") or {}).get("driver", {})
        files, rss = r.get("files_per_table"), r.get("peak_rss_mib") or {}
        rows.append(
            [
                _fmt_int(r["size"]),
                _mib(rss.get("tree")),
                _mib(rss.get("jvm")),
                _mib(executor.get("peak_jvm_heap_mib")),
                _mib(executor.get("peak_jvm_off_heap_mib")),
                _mib(driver.get("on_heap_execution_mib")),
                _mib(driver.get("on_heap_storage_mib")),
                _fmt_int(driver.get("total_gc_ms")),
                _mib(numpy.get("peak_rss_mib")),
                "-" if not files else " ".join(str(files[t]) for t in TABLES),
                _fmt(numpy.get("parquet_mib")),
            ]
        )
    print(
        _table(
            ["messages", "rsim tree RSS", "driver JVM RSS", "exec heap", "exec off-heap",
             "exec execution", "exec storage", "GC ms", "numpy RSS",
             "files: " + " ".join(t[:3] for t in TABLES), "numpy parquet"],
            rows,
        )
    )  # fmt: skip
    if simpy:
        print(
            f"\nSimPy: {simpy.get('sample_messages', 0):,} of {simpy.get('of_messages', 0):,} "
            f"messages (every {simpy.get('stride')}th), {_fmt_int(simpy.get('deliveries'))} "
            f"deliveries in {_fmt(simpy.get('sim_s'), 2)} s = "
            f"{_fmt_int(simpy.get('deliveries_per_s'))}/s (with its Parquet write "
            f"{_fmt_int(simpy.get('deliveries_per_s_with_write'))}/s); same deliveries as "
            f"NumPy on those ids: {simpy.get('delivery_count_match')}, rows differing in: "
            f"{simpy.get('rows_differ') or 'none'}"
        )
    for r in results:
        check = r.get("delivery_check")
        if check and not check["match"]:
            print(
                f"\n!! DELIVERY COUNT MISMATCH at {r['size']:,} messages: retrysim "
                f"{check['retrysim']:,}, NumPy baseline {check['numpy']:,}. The engine and "
                "docs/model.md disagree (draw streams or order, or a rule); compare rows with "
                "bench/baseline_numpy.py --compare-delta."
            )
    print_details(results)


def print_details(results: list[dict]) -> None:
    """The retrysim runs in detail: memory, CPU, files, phases and rounds."""
    results = [r for r in results if "returncode" in r]
    if not results:
        return
    print("\n== retrysim in detail")
    heap = sorted(
        {
            f"{r['driver_memory_conf']} (JVM -Xmx{r['driver_jvm_xmx'] or ' not seen'})"
            for r in results
        }
    )
    print(f"driver JVM heap: spark.driver.memory={', '.join(heap)}")
    rows = []
    for r in results:
        peak = r.get("peak_rss_mib", {})
        rows.append(
            [
                _fmt_int(r["size"]),
                "ok" if r["returncode"] == 0 else f"rc={r['returncode']}",
                _fmt(r["wall_s"]),
                _fmt(r.get("sim_s")),
                _fmt_int(r.get("rounds")),
                _fmt_int(r.get("deliveries")),
                _fmt_int(r.get("deliveries_per_sim_s")),
                _fmt_int(r.get("deliveries_per_wall_s")),
                _fmt(peak.get("jvm"), 0),
                _fmt(peak.get("driver"), 0),
                _fmt(peak.get("python"), 0),
                _fmt(peak.get("tree"), 0),
                _fmt(r["cpu"]["job_user_s"] + r["cpu"]["job_sys_s"]),
                _fmt(r["cpu"]["host_other_s"] + r["cpu"]["host_steal_s"]),
            ]
        )
    print(
        _table(
            ["messages", "status", "wall s", "sim s", "rounds", "deliveries", "deliv/sim s",
             "deliv/wall s", "JVM MiB", "py drv MiB", "py wrk MiB", "tree MiB", "job CPU s",
             "other+steal s"],
            rows,
        )
    )  # fmt: skip
    ok = [r for r in results if "files_per_table" in r]
    if ok:
        print("\nactive files per table (MiB):")
        print(
            _table(
                ["messages", *TABLES],
                [
                    [_fmt_int(r["size"])]
                    + [f"{r['files_per_table'][t]} ({r['mib_per_table'][t]:g})" for t in TABLES]
                    for r in ok
                ],
            )
        )
    names = [
        "jvm_start_and_imports",
        "spark_session",
        "round_1",
        "rounds_2_on",
        "event_by_event",
        "stage_tables",
        "validate",
        "publish_delta",
        "summary_readback",
        "shutdown",
    ]
    print("\nwhere the wall time goes (s):")
    print(
        _table(
            ["messages", *names],
            [[_fmt_int(r["size"])] + [_fmt(r["phases_s"].get(n)) for n in names] for r in results],
        )
    )
    for r in results:
        if r.get("round_times"):
            cells = ", ".join(
                f"{x['round']}:{x['round_s']:.1f}s/{x['deliveries']:,}" for x in r["round_times"]
            )
            print(f"\nround seconds/deliveries at {r['size']:,}: {cells}")
        if r.get("sql_executions"):
            print(f"\nSpark SQL executions at {r['size']:,} (started at s, seconds, call site):")
            for e in r["sql_executions"]:
                print(f"  #{e['id']:<3} {e['at_s']:8.1f} {e['seconds']:7.2f}  {e['description']}")


def write_json(
    path: Path, args: argparse.Namespace, results: list[dict], simpy: dict | None
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "mem_total_gib": _mem_total_gib(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "config": {
            "scenario": os.path.relpath(Path(args.scenario).resolve(), ROOT),
            "master": args.master,
            "driver_memory": args.driver_memory,
            "extra_conf": args.conf,
            "overrides": args.set,
            "poll_s": POLL_S,
            "executor_metrics_poll": EXECUTOR_POLL if args.executor_metrics else None,
            "simpy_sample": args.simpy_sample,
            "skip": sorted(args.skip),
            "tables": args.tables,
            "delta_sink": args.delta_sink,
            "validate": args.validate,
        },
        "results": results,
        "simpy": simpy,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, path)
    print(f"\nwrote {path}")


def _mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _sizes(text: str) -> list[int]:
    """1M,10M,50M (also 100M, 100k, 1000000, 1_000_000)."""
    sizes = []
    for item in text.split(","):
        item = item.strip().replace("_", "").lower()
        scale = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(item[-1:], 1)
        number = item[:-1] if scale > 1 else item
        if not number.isdigit() or int(number) <= 0:
            raise argparse.ArgumentTypeError(f"bad size {item!r}: use e.g. 1M, 10M or 1000000")
        sizes.append(int(number) * scale)
    return sizes


PARTS = ("retrysim", "numpy", "simpy")


def _parts(text: str) -> set[str]:
    parts = {item.strip() for item in text.split(",") if item.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {sorted(unknown)}; choose from {PARTS}")
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=_sizes("1M,10M,50M"),
        help="message counts, comma-separated: 1M,10M,50M (default), 100M, 100k, 1000000",
    )
    parser.add_argument("--quick", action="store_true", help="1M messages only")
    parser.add_argument(
        "--pool",
        action="store_true",
        help="a saturated pool (use with --scenario bench/saturated.yaml): each size against "
        "the SimPy finite-pool model and the compiled engine alone, at --rate messages a second",
    )
    parser.add_argument(
        "--rate", type=float, default=500.0, help="--pool: arrivals a second (default 500)"
    )
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
    parser.add_argument("--master", default="local[2]", help="job's --master (default local[2])")
    parser.add_argument("--scenario", default=str(BENCH / "scenario.yaml"), help="scenario YAML")
    parser.add_argument("--conf", action="append", default=[], help="extra spark-submit --conf")
    parser.add_argument("--set", action="append", default=[], help="extra scenario override")
    parser.add_argument("--out-dir", default=str(BENCH / "out"), help="default bench/out")
    parser.add_argument(
        "--results",
        help="JSON results file (default: the configuration's own, e.g. "
        "bench/results/full-10M.json or lean-novalidate-100M.json)",
    )
    parser.add_argument("--keep", action="store_true", help="keep each size's output folder")
    parser.add_argument(
        "--simpy-sample",
        type=_sizes_one,
        default=100_000,
        help="messages in the SimPy subsample (default 100k)",
    )
    parser.add_argument(
        "--skip", type=_parts, default=set(), help="leave out parts: retrysim,numpy,simpy"
    )
    parser.add_argument(
        "--no-executor-metrics",
        dest="executor_metrics",
        action="store_false",
        help="no Spark event log, so no peak executor memory",
    )
    parser.add_argument(
        "--event-log",
        action="store_true",
        help="diagnostic: also report each Spark SQL execution's time from the event log",
    )
    parser.add_argument("--no-echo", dest="echo", action="store_false", help="hide job output")
    parser.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="run retrysim without its invariant check before publishing",
    )
    parser.add_argument(
        "--tables",
        choices=("full", "lean"),
        default="full",
        help="retrysim's output: all seven tables (default) or lean (no transitions, messages)",
    )
    parser.add_argument(
        "--delta-sink",
        choices=("auto", "delta-rs", "delta-spark"),
        default="auto",
        help="the job's --delta-sink (default auto: delta-spark with its JARs); not auto: in "
        "the results file's name, e.g. lean-delta-rs-10M.json",
    )
    args = parser.parse_args(argv)
    sizes = [1_000_000] if args.quick else args.sizes
    name = results_name(args.tables, args.validate, sizes, args.skip, args.delta_sink)
    results_path = (
        Path(args.results)
        if args.results
        else RESULTS / (f"saturated-{name}" if args.pool else name)
    )

    if args.pool:
        args.skip |= {"numpy", "simpy"}  # the unsaturated baselines do not model a pool
    simpy = None
    if "simpy" not in args.skip:
        # one subsample of the largest size; its rate is extrapolated to every size
        simpy = run_simpy(args, max(sizes))
    results: list[dict] = []
    for size in sizes:
        entry = run_size(args, size) if "retrysim" not in args.skip else {"size": size}
        if "numpy" not in args.skip:
            entry["numpy"] = run_numpy(args, size)
        compare(entry, simpy)
        if args.pool:
            entry.update(run_pool(args, size))
            compare_pool(entry)
        results.append(entry)
        write_json(results_path, args, results, simpy)  # after each size: partial results survive
    print_report(results, simpy)
    if not args.keep:
        _remove_if_empty(Path(args.out_dir))
    failed = [r for r in results if r.get("returncode", 0) != 0]
    failed += [r for r in results if (r.get("numpy") or {}).get("returncode", 0) != 0]
    mismatch = [r for r in results if not r.get("delivery_check", {}).get("match", True)]
    simpy_bad = simpy is not None and (
        simpy.get("returncode") != 0 or not simpy.get("delivery_count_match", False)
    )
    return 1 if failed or mismatch or simpy_bad else 0


def size_label(size: int) -> str:
    """A message count as result files name it: 10000000 -> 10M, 100000 -> 100k."""
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def results_name(
    tables: str, validate: bool, sizes: list[int], skip: set[str] | frozenset[str] = frozenset(),
    sink: str = "auto",
) -> str:  # fmt: skip
    """The one results file of a bench configuration, overwritten by its next run:
    ``full-10M.json``, ``lean-novalidate-100M.json``, ``lean-delta-rs-10M.json``,
    ``full-1M-10M-50M.json``, or the baselines run alone, ``simpy-10M.json``. (--set,
    --conf, --scenario, --master and --driver-memory are not in the name: give such a run
    its own --results.)"""
    if "retrysim" in skip:
        what = "-".join(part for part in ("numpy", "simpy") if part not in skip) or "nothing"
    else:
        what = tables if validate else f"{tables}-novalidate"
        what += "" if sink == "auto" else f"-{sink}"
    return f"{what}-{'-'.join(size_label(size) for size in sizes)}.json"


def _sizes_one(text: str) -> int:
    (size,) = _sizes(text)
    return size


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


if __name__ == "__main__":
    sys.exit(main())
