"""The one SparkSession builder: jobs, notebooks and the test fixture all call it.

It sets what every run needs (UTC, microsecond Parquet timestamps that delta-rs reads, no
console progress bars) and, only when Delta Lake JARs are configured, Delta's session
extension and catalog. It never creates a session at import time.
"""

from __future__ import annotations

import glob
import os
import sys

from pyspark import SparkConf
from pyspark.sql import SparkSession

# The JVM does not JIT-compile a method of more than 8,000 bytes of bytecode; the code Spark
# generates for retrysim's wide projections (a round's CASE columns, the invariant check's
# step columns) is larger, and ran interpreted, several times slower. spark-submit.sh passes
# the same through conf/spark.
JVM_OPTIONS = "-XX:-DontCompileHugeMethods"
JVM_OPTION_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
BASE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.parquet.summary.metadata.level": "NONE",
}
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_jars_configured(conf: SparkConf) -> bool:
    """Whether this session will have Delta Lake on its classpath (packages, jars, or
    delta-spark JARs dropped into SPARK_HOME/jars)."""
    wanted = f"{conf.get('spark.jars.packages', '')},{conf.get('spark.jars', '')}".lower()
    spark_home = os.environ.get("SPARK_HOME", "")
    bundled = spark_home and glob.glob(os.path.join(spark_home, "jars", "delta-spark*.jar"))
    return "delta-spark" in wanted or bool(bundled)


def build_session(
    app_name: str = "retrysim",
    master: str | None = None,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Get or create the session with retrysim's settings; ``conf`` entries win."""
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = dict(BASE_CONF)
    if delta_jars_configured(SparkConf()):
        settings.update(DELTA_CONF)
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        # the JVM starts with this session (a notebook, the tests). Under spark-submit it is
        # running already and conf/spark passed the options, where a user's --conf wins.
        settings.update({key: JVM_OPTIONS for key in JVM_OPTION_KEYS})
    if not os.environ.get("PYSPARK_PYTHON"):
        # Python workers (the sequential engine's pandas UDFs) need this interpreter's
        # packages. spark-submit.sh sets PYSPARK_PYTHON; a notebook or a script may not, and
        # PySpark reads the worker's interpreter from the environment only.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop a command's session without waiting on PySpark's accumulator server.

    Its request handler polls its socket once a second, so ``SparkContext.stop`` waits up to
    a second for it (0.9 s measured at the end of a run). The server's thread is a daemon
    thread and a command's process exits right after, so it is told to stop and left behind.
    Notebooks keep ``spark.stop()``.
    """
    context = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.server_shutdown = True
        context._accumulatorServer = None
    spark.stop()
