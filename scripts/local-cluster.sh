#!/usr/bin/env bash
# A real Spark standalone cluster on loopback, for trying cluster runs on one machine:
# one master and two workers, each a separate JVM started with the spark-class launcher that
# the venv's pyspark package ships. Pid files, logs and work dirs live under .cluster/.
#
#   scripts/local-cluster.sh start    start master + workers, wait until every worker is ALIVE
#   scripts/local-cluster.sh status   master URL, web UI and workers (exit 0 running, 3 stopped)
#   scripts/local-cluster.sh stop     stop exactly the processes recorded in the pid files
#
# Then: ./spark-submit.sh --master spark://127.0.0.1:7077 jobs/simulate.py ...
#
# Settings (environment; defaults in brackets):
#   RETRYSIM_CLUSTER_HOST [127.0.0.1]        address every daemon binds to (SPARK_LOCAL_IP)
#   RETRYSIM_MASTER_PORT [7077]              master RPC port (the spark:// URL)
#   RETRYSIM_MASTER_UI_PORT [8080]           master web UI; /json/ is polled for readiness
#   RETRYSIM_WORKERS [2]                     number of workers
#   RETRYSIM_WORKER_CORES [1]                --cores of each worker
#   RETRYSIM_WORKER_MEMORY [2g]              --memory of each worker (executors fit inside)
#   RETRYSIM_WORKER_UI_PORT [8081]           web UI of worker 1, worker n gets +n-1; 0 = any
#   RETRYSIM_DAEMON_MEMORY [512m]            heap of each master/worker daemon JVM
#   RETRYSIM_CLUSTER_DIR [<repo>/.cluster]   pid files, logs, work and scratch dirs
#   RETRYSIM_CLUSTER_TIMEOUT [90]            seconds to wait for the workers to be ALIVE
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
PY="$ROOT/.venv/bin/python"

HOST="${RETRYSIM_CLUSTER_HOST:-127.0.0.1}"
MASTER_PORT="${RETRYSIM_MASTER_PORT:-7077}"
MASTER_UI_PORT="${RETRYSIM_MASTER_UI_PORT:-8080}"
WORKERS="${RETRYSIM_WORKERS:-2}"
WORKER_CORES="${RETRYSIM_WORKER_CORES:-1}"
WORKER_MEMORY="${RETRYSIM_WORKER_MEMORY:-2g}"
WORKER_UI_PORT="${RETRYSIM_WORKER_UI_PORT:-8081}"
DAEMON_MEMORY="${RETRYSIM_DAEMON_MEMORY:-512m}"
STATE="${RETRYSIM_CLUSTER_DIR:-$ROOT/.cluster}"
TIMEOUT="${RETRYSIM_CLUSTER_TIMEOUT:-90}"
STOP_TIMEOUT=30

MASTER_URL="spark://$HOST:$MASTER_PORT"
UI_URL="http://$HOST:$MASTER_UI_PORT"
PIDS="$STATE/pids"
LOGS="$STATE/logs"

say() { echo "local-cluster: $*"; }
die() { echo "local-cluster: error: $*" >&2; exit 1; }

spark_home() {
  if [ -n "${SPARK_HOME:-}" ]; then echo "$SPARK_HOME"; return; fi
  "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

# Every daemon reads its settings from this file, named on its command line. The path marks
# the process as ours, before and after spark-class execs java, so a pid is only treated as
# ours while the process behind it is still the daemon we started (pids get reused).
DAEMON_CONF="$STATE/daemon.conf"

# pid from a pid file, printed only if that process is alive and is our daemon.
our_pid() {
  local file="$1" pid args
  [ -f "$file" ] || return 1
  pid="$(cat "$file" 2>/dev/null)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  args="$(ps -o args= -p "$pid" 2>/dev/null)" || return 1
  [[ "$args" == *"--properties-file $DAEMON_CONF"* && "$args" == *org.apache.spark.deploy.* ]] ||
    return 1
  echo "$pid"
}

pid_files() {
  # workers first, master last (stop order); nothing when there are none
  local files=()
  shopt -s nullglob
  files=("$PIDS"/worker-*.pid)
  shopt -u nullglob
  [ -f "$PIDS/master.pid" ] && files+=("$PIDS/master.pid")
  [ "${#files[@]}" -eq 0 ] || printf '%s\n' "${files[@]}"
}

port_free() {
  "$PY" - "$1" "$2" <<'PY'
import socket, sys
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((sys.argv[1], int(sys.argv[2])))
    except OSError:
        sys.exit(1)
PY
}

# The master's /json/ as "status alive_workers expected_workers_alive(yes/no)"; fails when the
# master does not answer.
master_state() {
  "$PY" - "$UI_URL/json/" "$WORKERS" <<'PY'
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as reply:
        info = json.load(reply)
except Exception:
    sys.exit(1)
alive = [w for w in info.get("workers", []) if w.get("state") == "ALIVE"]
print(info.get("status", "?"), len(alive))
PY
}

log_tails() {
  local log
  for log in "$LOGS"/*.log; do
    [ -f "$log" ] || continue
    echo "----- last lines of $log" >&2
    tail -n 15 "$log" >&2
  done
}

launch() {
  # launch NAME CLASS ARGS... : one daemon in the background, detached from our stdio, with
  # its pid (the JVM's: spark-class execs java) in $PIDS/NAME.pid
  local name="$1" class="$2"
  shift 2
  nohup "$SPARK_HOME_DIR/bin/spark-class" "$class" "$@" \
    </dev/null >>"$LOGS/$name.log" 2>&1 &
  echo $! >"$PIDS/$name.pid"
}

stop_pid_files() {
  # stop every daemon recorded in a pid file: SIGTERM, wait, SIGKILL after STOP_TIMEOUT
  local file pid name waited stopped=0
  while IFS= read -r file; do
    [ -n "$file" ] || continue
    name="$(basename "$file" .pid)"
    if pid="$(our_pid "$file")"; then
      kill -TERM "$pid" 2>/dev/null || true
      waited=0
      while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $((STOP_TIMEOUT * 5)) ]; do
        sleep 0.2
        waited=$((waited + 1))
      done
      if kill -0 "$pid" 2>/dev/null; then
        say "$name (pid $pid) did not exit in ${STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
      fi
      say "stopped $name (pid $pid)"
      stopped=$((stopped + 1))
    else
      say "$name: not running (stale pid file removed)"
    fi
    rm -f "$file"
  done < <(pid_files)
  return 0
}

cmd_start() {
  mkdir -p "$PIDS" "$LOGS" "$STATE/work" "$STATE/local"
  # the whole folder is scratch: keep it out of git even where .gitignore does not list it
  [ -f "$STATE/.gitignore" ] || echo '*' >"$STATE/.gitignore"

  local running=0 total=0 file
  while IFS= read -r file; do
    [ -n "$file" ] || continue
    total=$((total + 1))
    if our_pid "$file" >/dev/null; then running=$((running + 1)); fi
  done < <(pid_files)
  if [ "$running" -gt 0 ]; then
    if [ "$running" -eq "$total" ] && [ "$total" -eq $((WORKERS + 1)) ]; then
      say "already running ($running daemons); nothing started"
      cmd_status
      return 0
    fi
    die "a partial cluster is running ($running of $total recorded daemons alive); run '$0 stop' first"
  fi
  # leftovers of a cluster that died: its pid files point at nothing of ours
  rm -f "$PIDS"/*.pid

  local port
  for port in "$MASTER_PORT" "$MASTER_UI_PORT"; do
    port_free "$HOST" "$port" ||
      die "port $port on $HOST is in use; pick free ones with RETRYSIM_MASTER_PORT / RETRYSIM_MASTER_UI_PORT"
  done

  SPARK_HOME_DIR="$(spark_home)"
  [ -x "$SPARK_HOME_DIR/bin/spark-class" ] || die "no spark-class under $SPARK_HOME_DIR/bin"
  export SPARK_HOME="$SPARK_HOME_DIR"
  export SPARK_LOCAL_IP="$HOST"
  export SPARK_LOCAL_DIRS="$STATE/local"
  export SPARK_DAEMON_MEMORY="$DAEMON_MEMORY"
  # the master fails instead of silently moving to the next port when its port is taken, and
  # runs no REST submission server (port 6066)
  printf '%s\n' "# written by scripts/local-cluster.sh start" \
    "spark.port.maxRetries 0" "spark.master.rest.enabled false" >"$DAEMON_CONF"
  # executors run the application's Python: PYSPARK_PYTHON of the driver (spark-submit.sh)

  say "starting master $MASTER_URL (web UI $UI_URL), logs in $LOGS"
  launch master org.apache.spark.deploy.master.Master --properties-file "$DAEMON_CONF" \
    --host "$HOST" --port "$MASTER_PORT" --webui-port "$MASTER_UI_PORT"

  local n ui
  for n in $(seq 1 "$WORKERS"); do
    ui=0
    [ "$WORKER_UI_PORT" = 0 ] || ui=$((WORKER_UI_PORT + n - 1))
    mkdir -p "$STATE/work/worker-$n"
    launch "worker-$n" org.apache.spark.deploy.worker.Worker --properties-file "$DAEMON_CONF" \
      --host "$HOST" --cores "$WORKER_CORES" --memory "$WORKER_MEMORY" \
      --webui-port "$ui" --work-dir "$STATE/work/worker-$n" "$MASTER_URL"
  done

  local deadline=$((SECONDS + TIMEOUT)) state="" status alive
  while :; do
    for file in "$PIDS"/*.pid; do
      if ! our_pid "$file" >/dev/null; then
        log_tails
        stop_pid_files >/dev/null
        die "$(basename "$file" .pid) exited during start-up (see the log lines above)"
      fi
    done
    if state="$(master_state)"; then
      read -r status alive <<<"$state"
      if [ "$status" = ALIVE ] && [ "$alive" -ge "$WORKERS" ]; then break; fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      log_tails
      stop_pid_files >/dev/null
      die "timed out after ${TIMEOUT}s waiting for $WORKERS ALIVE workers at $UI_URL/json/ (last: ${state:-no answer}); the cluster was stopped"
    fi
    sleep 1
  done
  say "ready: $MASTER_URL with $WORKERS workers ALIVE"
  cmd_status
}

cmd_status() {
  local file pid any=0
  while IFS= read -r file; do
    [ -n "$file" ] || continue
    if pid="$(our_pid "$file")"; then
      any=$((any + 1))
      say "$(basename "$file" .pid): running, pid $pid"
    else
      say "$(basename "$file" .pid): NOT running (stale pid file)"
    fi
  done < <(pid_files)
  if [ "$any" -eq 0 ]; then
    say "not running (state in $STATE)"
    return 3
  fi
  say "master: $MASTER_URL   web UI: $UI_URL"
  "$PY" - "$UI_URL/json/" <<'PY' || { say "master web UI not answering at $UI_URL/json/"; return 1; }
import json, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as reply:
        info = json.load(reply)
except Exception:
    sys.exit(1)
print(f"local-cluster: master status {info.get('status')}, "
      f"{info.get('aliveworkers', '?')} alive workers, {info.get('cores')} cores")
for w in info.get("workers", []):
    print(f"local-cluster:   worker {w['id']} {w['state']} {w['host']}:{w['port']} "
          f"cores {w['coresused']}/{w['cores']} memory {w['memoryused']}/{w['memory']} MB")
for a in info.get("activeapps", []):
    print(f"local-cluster:   running app {a['id']} {a['name']}")
PY
}

cmd_stop() {
  if [ -z "$(pid_files)" ]; then
    say "not running (no pid files in $PIDS)"
    return 0
  fi
  stop_pid_files
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 start|stop|status   (settings: see the top of this script)" >&2
    exit 2
    ;;
esac
