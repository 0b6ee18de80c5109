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
  "$VENV/bin/python" -c "from retrysim.engine.compiled import warm_up; warm_up()
from retrysim.checks.spark_hash import warm_up; warm_up()" >&2
  echo "$want" > "$STAMP"
  echo "retrysim: environment ready." >&2
fi
command -v java >/dev/null 2>&1 || { echo "retrysim: java not found; Spark needs Java 17 (JAVA_HOME or PATH)" >&2; exit 2; }
