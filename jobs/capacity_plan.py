"""spark-submit entrypoint: ``./spark-submit.sh jobs/capacity_plan.py --sweep key=a,b ...``.

Thin on purpose: all logic lives in the retrysim package (retrysim/cli/plan.py).
"""

from retrysim.cli.main import run_job

if __name__ == "__main__":
    run_job("plan")
