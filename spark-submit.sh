#!/usr/bin/env bash
# Launcher: bootstraps .venv on first use, then runs the venv's spark-submit with the
# settings every retrysim job needs. Usage: ./spark-submit.sh [spark-submit options] jobs/simulate.py [job options]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$ROOT/scripts/bootstrap.sh"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$ROOT/.venv/bin/python}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$ROOT/.venv/bin/python}"
export SPARK_HOME="${SPARK_HOME:-$("$ROOT/.venv/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}"
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$ROOT/conf/spark}"
cd "$ROOT"
exec "$ROOT/.venv/bin/spark-submit" \
  --conf spark.ui.showConsoleProgress=false \
  "$@"
