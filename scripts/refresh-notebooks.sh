#!/usr/bin/env bash
# Runs notebooks/*.ipynb top to bottom on their small scenario and keeps their outputs
# (scripts/refresh_notebooks.py); their tables go to out/notebooks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
exec "$ROOT/.venv/bin/python" "$ROOT/scripts/refresh_notebooks.py"
