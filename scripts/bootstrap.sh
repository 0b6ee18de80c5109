#!/usr/bin/env bash
# Creates .venv on first use and reinstalls when pyproject.toml changes.
# Sourced by spark-submit.sh and run-tests.sh; prints progress to stderr only.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.retrysim-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  PY="$(command -v python3.11 || command -v python3)"
  echo "retrysim: setting up $VENV with $($PY --version) (first run only, ~1-2 min)..." >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[test,bench]" >&2
  echo "retrysim: compiling the event engine and the check's hashes (numba, cached in ~/.cache/numba; ~40 s once)..." >&2
  "$VENV/bin/python" -c "from retrysim.engine.event_rows import warm_up; warm_up()
from retrysim.checks.spark_hash import warm_up; warm_up()" >&2
  echo "$want" > "$STAMP"
  echo "retrysim: environment ready." >&2
fi
# Spark puts its own pyspark.zip (SPARK_HOME/python/lib) first on the path of every Python
# process it starts: a driver under spark-submit, a worker daemon and its workers. For the
# installed pyspark that zip is the same code as site-packages/pyspark, without compiled
# bytecode, so each of those processes compiled pyspark's modules again: 0.4 s before a
# daemon forked its first worker, 0.4 s of a driver's imports. This file puts this venv's
# pyspark's zips after site-packages at each interpreter's start (another SPARK_HOME's
# zips stay first: they may be other code).
packages=("$VENV"/lib/python3*/site-packages)
pth="${packages[0]}/retrysim-pyspark-zip-last.pth"
zips="${packages[0]}/pyspark/python/lib"
line="import os, sys; sys.path.sort(key=lambda entry: os.path.realpath(entry).startswith(os.path.realpath('$zips') + os.sep))"
current=""
[ ! -f "$pth" ] || read -r current <"$pth" || true
[ "$current" = "$line" ] || printf '%s\n' "$line" >"$pth"
command -v java >/dev/null 2>&1 || { echo "retrysim: java not found; Spark needs Java 17 (JAVA_HOME or PATH)" >&2; exit 2; }
