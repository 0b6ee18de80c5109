#!/usr/bin/env bash
# Opens the notebooks in JupyterLab: installs the `notebook` extra into .venv on first use
# (pip install -e '.[notebook]'), then starts it on notebooks/. Arguments go to jupyter lab.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
if [ ! -x "$ROOT/.venv/bin/jupyter-lab" ]; then
  echo "retrysim: installing JupyterLab into .venv (first use only)..." >&2
  "$ROOT/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[notebook]" >&2
fi
exec "$ROOT/.venv/bin/jupyter-lab" --notebook-dir "$ROOT/notebooks" "$@"
