"""``retrysim compare``: a calibrated run laid over the series it was fitted to. The tables
it keeps hold each sample beside its bucket, the errors are the ones printed, and the run's
report draws them; a run it cannot lay over metrics is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from metrics.synthetic import STEP, Truth, series, write_json
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from retrysim import load_scenario, simulate
from retrysim.cli.common import EXIT_BAD_INPUT
from retrysim.cli.main import main
from retrysim.reporting.report import OBSERVED_SECTION, write_run_report
from retrysim.session import full_jit
from retrysim.store.sinks import read_table, table_path

SMALL = Truth(pieces=((240, 4.0), (480, 12.0), (600, 4.0)), outage=(307.5, 397.5), threads=4)
BASE = """
name: small-incident
groups:
  - name: payments
    topic: orders
    flavor: rocketmq5.push
    max_reconsume_times: 2
    retry_policy: {kind: customized, intervals: [5s, 10s]}
    consumers: {instances: 1, threads: 4}
"""


@pytest.fixture(scope="module")
def compared(spark, tmp_path_factory):
    """The small truth's series, the scenario calibrated on them, its run, and compare's
    output (the commands on the tests' session, which they may not stop)."""
    folder = tmp_path_factory.mktemp("compare")
    metrics = write_json(folder / "m.json", series(SMALL))
    (folder / "base.yaml").write_text(BASE)
    scenario_file = folder / "calibrated.yaml"
    assert main(["calibrate", "--metrics", str(metrics), "--group", "payments", "--scenario",
                 str(folder / "base.yaml"), "--output", str(scenario_file)]) == 0  # fmt: skip
    output = str(folder / "out")
    simulate(spark, load_scenario(scenario_file), output=output, run_id="fitted", validate=False)
    plain = load_scenario(scenario_file, ["start_at=null"])
    simulate(spark, plain, output=output, run_id="no-clock", validate=False)
    stop = SparkSession.stop
    SparkSession.stop = lambda _self: None
    try:
        code = main(["compare", "--metrics", str(metrics), "--run", "fitted", "--output", output])
    finally:
        SparkSession.stop = stop
        full_jit(spark)
    assert code == 0
    return folder, metrics, output


def test_every_sample_meets_its_bucket_and_the_errors_are_kept(spark, compared, capsys):
    _, _, output = compared
    observed = read_table(spark, output, "observed").where(F.col("run_id") == "fitted")
    samples = int(600 / STEP)
    counts = {r["quantity"]: r["count"] for r in observed.groupBy("quantity").count().collect()}
    # every sample but the first (time 0, which ends no bucket) meets a bucket
    assert counts["published"] == samples and counts["lag"] == samples
    # a sample's simulated value is the run's own in the bucket that ends at it
    load = read_table(spark, output, "load").where(F.col("run_id") == "fitted")
    mine = observed.where(F.col("quantity") == "first_deliveries").select(
        "bucket_start_ms", (F.col("simulated") * STEP).cast("long").alias("first_deliveries")
    )
    theirs = load.join(mine.select("bucket_start_ms"), "bucket_start_ms").select(
        "bucket_start_ms", "first_deliveries"
    )
    assert_df_equality(
        mine, theirs, ignore_row_order=True, ignore_nullable=True, ignore_metadata=True
    )
    rows = {r.quantity: r for r in DeltaTable(table_path(output, "comparison")).to_pandas()
            .itertuples()}  # fmt: skip
    # the calibrated arrivals follow the observed ones; the errors are the printed ones
    assert rows["published"].nmae < 0.25
    assert abs(rows["published"].peak_error) < 0.15
    assert rows["published"].series.startswith('rocketmq_messages_in_total{topic="orders"}')


def test_the_run_report_draws_observed_against_simulated(spark, compared):
    _, _, output = compared
    page = Path(write_run_report(spark, output, "fitted")).read_text()
    assert OBSERVED_SECTION in page and "published NMAE" in page
    other = Path(write_run_report(spark, output, "no-clock")).read_text()
    assert OBSERVED_SECTION not in other


def test_a_run_it_cannot_lay_over_metrics_is_one_line(compared, capsys):
    _, metrics, output = compared
    for run, said in (("no-clock", "--run: run no-clock has no start_at"),
                      ("nope", "--run: no complete run 'nope' in")):  # fmt: skip
        code = main(["compare", "--metrics", str(metrics), "--run", run, "--output", output])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == EXIT_BAD_INPUT and len(err) == 1 and said in err[0], err
