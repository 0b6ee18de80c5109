"""spark-submit entrypoint: ``./spark-submit.sh jobs/simulate.py [--scenario ...] [--set k=v]``.

Thin on purpose: all logic lives in the retrysim package (retrysim/cli/simulate.py).
"""

import sys

from retrysim.cli.main import run_process

if __name__ == "__main__":
    run_process(["simulate", *sys.argv[1:]])
