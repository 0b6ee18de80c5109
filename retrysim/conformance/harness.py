"""A scenario's group on a real RocketMQ broker: its inputs, the run, its records.

Each major has its harness (a Maven module under jvm/): ``broker4`` runs the clients of
4.9.7 and starts its namesrv and broker as child JVMs; ``broker5`` runs the gRPC push or
simple consumer and starts a 5.5.0 namesrv and proxy in local mode (which hosts the broker)
as child JVMs. A harness starts its broker on loopback with the scenario's delay table (5.x:
the group's retry policy as a customized list), creates the topic with its queues, starts the
group's instances x threads consumers and, once they hold their queues, publishes the
scenario's messages at their born times. Its listener does what retrysim draws for each
message and delivery (:func:`outcomes`): both sides see the same listener and differ only in
what the broker and the client do.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from retrysim.engine.event_key import KeySpec
from retrysim.engine.rounds import group_plans, key_specs
from retrysim.model import flavors
from retrysim.model.behavior import longest_processing_ms
from retrysim.model.policy import Policy
from retrysim.model.topology import BROADCAST
from retrysim.model.workload import messages_np
from retrysim.scenario.spec import Group, Scenario

PROJECT = Path(__file__).resolve().parents[2]
# Java 17 closes what 4.9.7's store reaches into (its mapped files' cleaner; apache/rocketmq
# #9887): the harness JVM opens it again, and passes the flags on to the broker's JVM.
JAVA_17_FLAGS = (
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    # the harness reads when the 4.x client's expired-message cleaner runs next
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-exports=java.base/jdk.internal.ref=ALL-UNNAMED",
)
# jvm/<module>: what each runs
HARNESSES = {"broker4": "RocketMQ 4.9.7", "broker5": "RocketMQ 5.5.0 (proxy in local mode)"}
# the harness JVM's heap: its clients and records (the brokers are its child JVMs)
HEAPS = {"broker4": "256m", "broker5": "512m"}
AWAIT_MS = 60_000  # at the horizon, how long the listeners still running may finish
DELIVERIES = ("msg_id", "delivery", "reconsume_times", "topic", "queue_id", "instance",
              "thread", "stored_ms", "start_ms", "end_ms", "outcome")  # fmt: skip


class UnsupportedScenario(ValueError):
    """A scenario the harness cannot run on a real broker, with the reason."""


class HarnessError(RuntimeError):
    """The harness could not run (no Java, no Maven build, a broker that did not come up):
    one line saying what failed."""


@dataclass(frozen=True)
class BrokerRun:
    """What the broker did with the messages it was sent (``msg_id``, ``queue_id``,
    ``born_ms``): every delivery, the DLQ's messages, the store's puts by topic, and when
    production began (t0, ms since the epoch; the records' times are ms from it)."""

    messages: pd.DataFrame
    deliveries: pd.DataFrame
    dead_letters: pd.DataFrame
    puts: dict[str, int]
    t0_ms: int | None = None


def group_spec(scenario: Scenario, name: str) -> tuple[Group, KeySpec]:
    """The scenario's group ``name`` and what the event loop simulates of it."""
    for group, spec in zip(
        scenario.groups, key_specs(scenario, group_plans(scenario)), strict=True
    ):
        if group.name == name:
            return group, spec
    raise UnsupportedScenario(f"no group {name} in scenario {scenario.name}")


def harness_of(group: Group) -> str | None:
    """The harness module that runs ``group``'s flavor on a real broker, if one does."""
    return group.flavor_record.harness


def refuse_unsupported(scenario: Scenario, group: Group, spec: KeySpec) -> None:
    """Raise :class:`UnsupportedScenario`, naming the reason, for what the harness cannot run
    on a real broker (yet)."""
    policy, behavior = spec.policy, spec.behavior
    harness = harness_of(group)
    why = None
    if harness is None:
        records = [r for f in flavors.CATALOGUE for r in (f, f.ordered) if r is not None]
        runs = sorted({record.label for record in records if record.harness})
        why = f"flavor {group.flavor_record.label}: the broker harness runs {', '.join(runs)}"
    elif policy.topology.threads is None:
        why = "consumers: unlimited has no real pool; give instances and threads"
    elif policy.topology.brokers != 1:
        why = "brokers: the harness starts one broker"
    elif harness == "broker4" and "client_version" in group.flavor_record.reads and (
        group.client_version != "4.9"
    ):  # fmt: skip
        why = "client_version: the 4.x harness runs rocketmq-client 4.9.7"
    elif behavior.downstream is not None:
        why = "downstream: a call's time and outcome depend on the calls in flight"
    elif behavior.send_back_failure_probability or behavior.send_back_fallback_probability:
        why = "send-back failures cannot be made to happen on a real broker"
    elif policy.batch_size > 1:
        why = "consume_message_batch_max_size > 1 is not in the harness yet"
    elif policy.replay is not None:
        why = "replay: the harness does not re-send dead letters yet"
    elif policy.topology.retry_queue_nums != 1:
        why = "retry_queue_nums: the harness's broker keeps %RETRY%<group> at one queue"
    elif policy.pull_interval_ms or policy.ready_wait_ms:
        why = "pull_interval and behavior.ready_wait are not in the harness yet"
    elif group.allocate != "averagely" and policy.topology.instances > 1:
        why = "allocate: the harness's client allocates averagely"
    elif spec.workload.messages > 100_000:
        why = f"{spec.workload.messages:,} messages: at most 100,000 on a real broker"
    elif not group.dlq_enabled:
        why = "dlq_enabled: false has no open-source broker (ApsaraMQ's discard)"
    else:
        why = (_refuse_4x if harness == "broker4" else _refuse_5x)(scenario, group, policy)
    if why:
        raise UnsupportedScenario(f"group {spec.group}: {why}")


def _refuse_4x(scenario: Scenario, group: Group, policy: Policy) -> str | None:
    if policy.topology.balancing == BROADCAST and policy.topology.instances > 1:
        return "broadcasting: retrysim simulates one instance's view; give one instance"
    if policy.timeout_ms is not None and policy.timeout_ms % 60_000:
        return "consume_timeout: the 4.x client takes whole minutes"
    if any(ms % 1_000 for ms in scenario.broker.message_delay_level):
        return "message_delay_level: a broker's levels are whole seconds here"
    return None


def _refuse_5x(scenario: Scenario, group: Group, policy: Policy) -> str | None:
    if group.deployment != "apache":
        return "deployment: apsaramq is a cloud service; the harness runs open-source RocketMQ 5"
    if group.consume_timeout is not None:
        return "consume_timeout: the open-source 5.x client has none (the proxy renews)"
    if any(ms % 1_000 or ms <= 0 for ms in policy.intervals_ms):
        return "retry_policy: the harness gives the group its intervals in whole seconds"
    return None


def _model(policy: Policy) -> str:
    """The 4.x harness's listener: concurrently, orderly (blocking) or broadcasting."""
    if policy.topology.balancing == BROADCAST:
        return "broadcasting"
    return "orderly" if policy.blocking else "concurrently"


def _consumer(policy: Policy) -> str:
    """The 5.x harness's consumer kind: a simple consumer's failure stays invisible, an
    ordered push consumer blocks its queue."""
    if policy.invisible_until_retry:
        return "simple"
    return "push_fifo" if policy.blocking else "push"


def outage_windows(spec: KeySpec) -> list[tuple[int, int]]:
    """The spans ``[start_ms, end_ms)`` between consecutive edges of the group's windows
    (outages and behavior profile pieces) with some window open: the listener's conditions
    are the same all through each (``event_rules._conditions``), so one draw at its start
    holds for every delivery starting in it."""
    windows = spec.behavior.windows
    edges = sorted({edge for w in windows for edge in (w.start, w.end)})
    return [
        (start, end)
        for start, end in itertools.pairwise(edges)
        if any(w.start <= start < w.end for w in windows)
    ]


def outcomes(spec: KeySpec, msg_ids: np.ndarray) -> pd.DataFrame:
    """Each message's outcome and processing time for deliveries 1 to the last the group
    allows, as retrysim's compiled listener draws them: for a delivery starting outside the
    outages (``outcome``, ``processing_ms``) and inside each of :func:`outage_windows`
    (``outcome_<i>``, ``processing_ms_<i>``, in order; the harness's listener takes the pair
    by the delivery's start). No downstream (:func:`refuse_unsupported`): nothing else
    depends on the start time."""
    from retrysim.engine.event_rules import Listener  # numba: no other path of the command needs it

    listen = Listener(spec.behavior, spec.seed, spec.group, client_time=False)
    poisoned = listen.poisoned(msg_ids)
    # outside every window: before the first opens (a profile's first piece opens at 0, and
    # then no delivery starts outside a window)
    starts = [-1, *(start for start, _ in outage_windows(spec))]
    # no more than fit before the horizon (an orderly group retries without end by default);
    # a message a 4.9 client sends back twice numbers its copies' deliveries together, as
    # many as fit before the horizon
    shortest = max(min(spec.policy.intervals_ms, default=1), 1)
    deliveries = spec.horizon_ms // shortest + 1
    if not spec.policy.may_send_back_twice(longest_processing_ms(spec.behavior)):
        deliveries = min(spec.policy.max_retries + 1, deliveries)
    rows = []
    for msg_id, poison in zip(msg_ids.tolist(), poisoned.tolist(), strict=True):
        for delivery in range(1, deliveries + 1):
            row = [msg_id, delivery]
            for start in starts:
                outcome, processing, _ = listen(msg_id, delivery, start, poison)
                row += [outcome, processing]
            rows.append(row)
    columns = ["msg_id", "delivery", "outcome", "processing_ms"]
    for i in range(1, len(starts)):
        columns += [f"outcome_{i}", f"processing_ms_{i}"]
    return pd.DataFrame(rows, columns=columns)


def _cleaner_period(policy: Policy, group: Group) -> int:
    """The period the harness aligns production to (0: none): the 4.x client's cleaner's,
    where retrysim checks timeouts periodically and a delivery can outlast the timeout."""
    aligned = policy.cleaner_may_send_back(longest_processing_ms(group.behavior))
    return policy.timeout_ms if aligned else 0


def _properties(
    scenario: Scenario, group: Group, spec: KeySpec, folder: Path, metrics: bool = False
) -> str:
    policy = spec.policy
    timeout_minutes = (policy.timeout_ms or 15 * 60_000) // 60_000
    # 4.x: the broker's delay table; 5.x: the group's retry policy, given as a customized list
    # (the gRPC client waits its entry attempt - 1, as retrysim's intervals are indexed)
    table = (scenario.broker.message_delay_level if harness_of(group) == "broker4"
             else policy.intervals_ms)  # fmt: skip
    delay_table = " ".join(f"{ms // 1_000}s" for ms in table)
    return "\n".join([
        f"topic={spec.topic}", f"group={spec.group}", f"queues={spec.queues}",
        f"instances={policy.topology.instances}", f"threads={policy.topology.threads}",
        f"max_reconsume_times={policy.max_retries}", f"consume_timeout_minutes={timeout_minutes}",
        f"delay_level_when_next_consume={group.delay_level_when_next_consume}",
        f"consumer={_consumer(policy)}", f"invisible_duration_ms={group.invisible_duration}",
        f"model={_model(policy)}", f"suspend_ms={group.suspend_current_queue_time}",
        f"await_ms={AWAIT_MS}", f"pull_threshold_for_queue={group.pull_threshold_for_queue}",
        f"max_cache_message_count={group.max_cache_message_count}",
        f"message_delay_level={delay_table}", f"horizon_ms={spec.horizon_ms}",
        f"cleaner_period_ms={_cleaner_period(policy, group)}",
        f"messages={folder / 'messages.csv'}", f"outcomes={folder / 'outcomes.csv'}",
        f"outages={','.join(f'{start}-{end}' for start, end in outage_windows(spec))}",
        f"metrics={str(metrics).lower()}", "",
    ])  # fmt: skip


def add_settings(properties: Path, settings: dict[str, str]) -> None:
    """Append ``settings`` to a harness's properties: what the run observes, not what the
    scenario is (``metrics_linger_ms``: how long the broker4 harness still serves its metrics
    after the run, retrysim.conformance.metrics)."""
    with open(properties, "a") as file:
        file.writelines(f"{key}={value}\n" for key, value in settings.items())


def class_path(harness: str) -> str:
    """The harness's class path, built once (scripts/broker-jars.sh)."""
    built = subprocess.run(
        [str(PROJECT / "scripts" / "broker-jars.sh"), harness],
        capture_output=True, text=True,
    )  # fmt: skip
    if built.returncode != 0 or not built.stdout.strip():
        raise HarnessError(built.stderr.strip().splitlines()[-1] if built.stderr else "no harness")
    return built.stdout.strip()


# metrics: the harness's Prometheus endpoints, ``name url`` a line, written once the broker
# is up; production waits for SCRAPE_READY beside it (5.x)
ENDPOINTS = "metrics-endpoints.txt"
SCRAPE_READY = "scrape-ready"

MetricsCallback = Callable[[dict[str, str]], None]


def run_on_broker(
    scenario: Scenario,
    name: str,
    folder: str | Path,
    metrics: MetricsCallback | None = None,
    settings: dict[str, str] | None = None,
) -> BrokerRun:
    """Run the scenario's group ``name`` on a real broker, its files under ``folder``;
    ``settings`` are further harness properties (:func:`add_settings`).

    ``metrics``: the 5.x broker exports its Prometheus metrics, and the harness the client's
    process-time histogram; the 4.x harness serves the RocketMQ exporter's series
    (docs/conformance.md, *Metrics*). Once they are up,
    ``metrics`` is called with the endpoints (name -> URL) from a thread of its own, and
    production starts when it returns (a scraper started in it sees the run from t0). If it
    raises, the harness is stopped and the exception raised here."""
    group, spec = group_spec(scenario, name)
    refuse_unsupported(scenario, group, spec)
    harness = harness_of(group)
    if shutil.which("java") is None:
        raise HarnessError("java not found: the harness needs Java 17")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    msg_ids, queue_ids, born = messages_np(spec.workload, spec.group, spec.seed)
    messages = pd.DataFrame({"msg_id": msg_ids, "queue_id": queue_ids, "born_ms": born})
    # the harness sends each line at its born time, in the file's order: a Poisson piece's
    # messages are numbered before they are timed, so the file is in time order
    in_time = messages.sort_values("born_ms", kind="stable")
    in_time.to_csv(folder / "messages.csv", header=False, index=False)
    outcomes(spec, msg_ids).to_csv(folder / "outcomes.csv", header=False, index=False)
    (folder / "harness.properties").write_text(
        _properties(scenario, group, spec, folder, metrics is not None)
    )
    add_settings(folder / "harness.properties", settings or {})
    command = ["java", f"-Xmx{HEAPS[harness]}", "-XX:+UseSerialGC", *JAVA_17_FLAGS,
               "-cp", class_path(harness), f"retrysim.{harness}.Harness",
               str(folder / "harness.properties"), str(folder / "out")]  # fmt: skip
    out = folder / "out"
    with open(folder / "harness.log", "w") as log:
        running = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        failed: list[BaseException] = []
        if metrics is not None:
            watcher = threading.Thread(
                target=_watch_endpoints, args=(out, running, metrics, failed), daemon=True
            )
            watcher.start()
        returncode = running.wait()
    if failed:
        raise failed[0]
    if returncode != 0:
        lines = (folder / "harness.log").read_text().strip().splitlines()
        said = [line for line in lines if line.startswith(f"retrysim {harness}:")]
        raise HarnessError((said or lines or ["the harness failed"])[-1])
    # what happened before the horizon, as retrysim counts it (the consumers' shutdown lets
    # the deliveries already queued run)
    horizon = spec.horizon_ms
    deliveries = _read(out / "deliveries.csv", list(DELIVERIES))
    deliveries = deliveries[deliveries["start_ms"] < horizon].reset_index(drop=True)
    dead = _read(out / "dlq.csv", ["msg_id", "dlq_at_ms"])
    dead = dead[dead["dlq_at_ms"] < horizon].reset_index(drop=True)
    messages = messages[messages["born_ms"] < horizon].reset_index(drop=True)
    puts = _read(out / "puts.csv", ["topic", "puts"])
    t0 = out / "t0-ms.txt"
    return BrokerRun(
        messages, deliveries, dead, dict(zip(puts["topic"], puts["puts"], strict=True)),
        int(t0.read_text()) if t0.exists() else None,
    )  # fmt: skip


def _watch_endpoints(
    out: Path, running: subprocess.Popen, metrics: MetricsCallback, failed: list[BaseException]
) -> None:
    """Wait for the harness's endpoints, hand them to ``metrics``, then let production start;
    if ``metrics`` raises, keep the exception and stop the harness (its hook stops the
    broker)."""
    endpoints = out / ENDPOINTS
    while not endpoints.exists():
        if running.poll() is not None:
            return
        time.sleep(0.05)
    urls = dict(line.split(" ", 1) for line in endpoints.read_text().splitlines() if line)
    try:
        metrics(urls)
    except BaseException as error:  # raised again by run_on_broker
        failed.append(error)
        running.terminate()
        return
    (out / SCRAPE_READY).touch()


def _read(path: Path, names: list[str]) -> pd.DataFrame:
    if path.stat().st_size == 0:
        return pd.DataFrame(columns=names)
    return pd.read_csv(path, names=names)
