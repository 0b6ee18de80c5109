"""spark-submit entrypoint: ``./spark-submit.sh jobs/simulate.py [--scenario ...] [--set k=v]``.

Thin on purpose: all logic lives in the retrysim package (retrysim/cli/simulate.py).
"""

from retrysim.cli.main import run_job

if __name__ == "__main__":
    run_job("simulate")
