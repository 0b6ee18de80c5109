"""spark-submit entrypoint: ``./spark-submit.sh jobs/simulate.py [--scenario ...] [--set k=v]``.

Thin on purpose: all logic lives in the retrysim package (retrysim/cli/simulate.py).
"""

import sys

from retrysim.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["simulate", *sys.argv[1:]]))
