"""spark-submit entrypoint: ``./spark-submit.sh jobs/conformance.py --scenario FILE``.

Thin on purpose: all logic lives in the retrysim package (retrysim/cli/conformance.py).
"""

from retrysim.cli.main import run_job

if __name__ == "__main__":
    run_job("conformance")
