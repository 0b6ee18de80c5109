"""The one SparkSession builder: jobs, notebooks and the test fixture all call it.

It sets what every run needs (UTC, microsecond Parquet timestamps that delta-rs reads, no
console progress bars) and, when Delta Lake's JARs are there, Delta's session extension and
catalog. The JARs come from the cache ``scripts/delta-jars.sh`` fills once with Maven
(``build/jars/delta-<version>``, at the installed delta-spark package's version), or from
the session's own ``spark.jars``/``spark.jars.packages``. It never creates a session at
import time.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from retrysim.scenario.errors import ScenarioError

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
# Delta Lake's extension and catalog (DESCRIBE HISTORY, VERSION AS OF, OPTIMIZE on
# delta.`path`), and new tables at the protocol delta-rs, DuckDB and Polars read: no deletion
# vectors, no column mapping (retrysim.store.sinks.TABLE_PROPERTIES, set on creation too).
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    "spark.databricks.delta.properties.defaults.columnMapping.mode": "none",
    # a table's log is a few commits a run: its state in 2 tasks, not Delta's default 50
    "spark.databricks.delta.snapshotPartitions": "2",
    # the <version>.crc beside each commit stays (a new JVM reads a table's protocol and
    # metadata from it; without it, a Spark job over the log for every table), without the
    # list of the table's files: a commit collected the previous version's files with a
    # Spark query to keep it
    "spark.databricks.delta.allFilesInCrc.enabled": "false",
}

# The log store the cached JARs bring for file: tables (jvm/delta/src): a commit without
# Hadoop's processes, and a version's file created by exactly one writer. Delta writes each
# version's checksum through Spark's checkpoint file manager instead: its FileSystem form
# runs 2 of those processes where the FileContext form ran 6, so every commit is shorter.
LOG_STORE_JAR = "retrysim-delta.jar"
LOG_STORE_CONF = {
    "spark.delta.logStore.file.impl": "retrysim.delta.LocalFileLogStore",
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}


# Where scripts/delta-jars.sh caches the JARs: the checkout's build folder, or RETRYSIM_JARS_DIR.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def delta_jar_paths() -> list[str]:
    """The cached Delta Lake JARs for the installed delta-spark package, or none: a session
    started outside the launchers (a notebook, the tests) loads them from here, without
    asking a resolver (``scripts/delta-jars.sh`` fetched them)."""
    try:
        version = importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        return []
    cache = os.environ.get("RETRYSIM_JARS_DIR") or os.path.join(PROJECT_ROOT, "build", "jars")
    folder = os.path.join(cache, f"delta-{version}")
    if not os.path.exists(os.path.join(folder, ".complete")):
        return []
    return sorted(glob.glob(os.path.join(folder, "*.jar")))


def delta_jars_configured(conf: SparkConf) -> bool:
    """Whether this session will have Delta Lake on its classpath (packages, jars, the
    cached JARs, or delta-spark JARs dropped into SPARK_HOME/jars)."""
    wanted = f"{conf.get('spark.jars.packages', '')},{conf.get('spark.jars', '')}".lower()
    spark_home = os.environ.get("SPARK_HOME", "")
    bundled = spark_home and glob.glob(os.path.join(spark_home, "jars", "delta-spark*.jar"))
    return "delta-spark" in wanted or bool(bundled) or bool(delta_jar_paths())


def _brings_delta(given: SparkConf, conf: dict[str, str] | None) -> bool:
    """Whether the caller's own settings already name delta-spark (its packages or JARs)."""
    named = [given.get(key, "") for key in ("spark.jars", "spark.jars.packages")]
    named += [(conf or {}).get(key, "") for key in ("spark.jars", "spark.jars.packages")]
    return any("delta-spark" in value.lower() for value in named)


# The master URLs Spark 4 takes (SparkContext.createTaskScheduler), as spark-submit.sh also
# checks them before a JVM starts (tests/cli hold the two to the same answers).
MASTER_FORMS = (
    "local, local[N], local[*], local[N,F], local-cluster[N,C,M], spark://HOST:PORT[,HOST:PORT"
    "...], yarn or k8s://[https://]HOST[:PORT]"
)
_MASTER = re.compile(
    r"^(local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?|local-cluster\[[1-9][0-9]*,[1-9][0-9]*,"
    r"[1-9][0-9]*\]|spark://[^,:/@\s]+:[0-9]+(,[^,:/@\s]+:[0-9]+)*|yarn|k8s://\S+)$"
)
MASTER_TIMEOUT_S = 5.0  # how long a spark:// master has to answer before a run gives up


def check_master(master: str | None, timeout_s: float = MASTER_TIMEOUT_S) -> None:
    """A master Spark cannot parse, or a standalone master that nothing answers at within
    ``timeout_s``, as one :class:`ScenarioError` before Spark starts: Spark itself fails
    the first with a stack trace, and waits about 70 s on the second before it reports a
    stopped SparkContext."""
    if master is None:
        return
    if not _MASTER.match(master):
        raise ScenarioError("--master", f"value {master!r}: use {MASTER_FORMS}")
    if not master.startswith("spark://"):
        return
    addresses = [address.rpartition(":") for address in master[len("spark://") :].split(",")]
    for host, _, port in addresses:
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
            return
        except OSError:
            continue
    raise ScenarioError(
        "--master",
        f"value {master!r}: no Spark master answers at {master[len('spark://') :]} within "
        f"{timeout_s:g} s (is it running? scripts/local-cluster.sh starts one)",
    )


def submitted_master() -> str | None:
    """The master spark-submit was given (``--master``, ``--conf spark.master``), read from
    its running JVM without starting a SparkContext; None outside spark-submit."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    SparkContext._ensure_initialized()
    return SparkConf().get("spark.master", None)


def build_session(
    app_name: str = "retrysim",
    master: str | None = None,
    conf: dict[str, str] | None = None,
    light_jit: bool = False,
    log_file: str | None = None,
) -> SparkSession:
    """Get or create the session with retrysim's settings; ``conf`` entries win.
    ``light_jit``: the driver JVM compiles with C1 alone until a run asks for more
    (:func:`light_jit`); the commands that simulate ask for it. ``log_file``: where a driver
    JVM this session starts writes its logs (conf/spark/log4j2.properties: the console gets
    errors only), as spark-submit.sh does for the jobs; the commands give one."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        # spark-submit's JVM: connects, starts nothing; SparkConf() then reads its settings
        SparkContext._ensure_initialized()
        if light_jit:
            _compile_lightly(SparkContext._gateway)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    settings = dict(BASE_CONF)
    given = SparkConf()
    if delta_jars_configured(given):
        settings.update(DELTA_CONF)
    if not os.environ.get("PYSPARK_GATEWAY_PORT") and not _brings_delta(given, conf):
        # the JVM starts with this session: the cached JARs go on its class path (under
        # spark-submit, spark-submit.sh passed them as --jars)
        jars = delta_jar_paths()
        if jars:
            own = given.get("spark.jars", "")
            settings["spark.jars"] = ",".join([*([own] if own else []), *jars])
    if LOG_STORE_JAR in settings.get("spark.jars", given.get("spark.jars", "")):
        settings.update(LOG_STORE_CONF)
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        # the JVM starts with this session (a notebook, the tests). Under spark-submit it is
        # running already and conf/spark passed the options, where a user's --conf wins.
        settings.update({key: JVM_OPTIONS for key in JVM_OPTION_KEYS})
        if log_file:
            settings[JVM_OPTION_KEYS[0]] += f" {_log_options(log_file)}"
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
    if light_jit:
        _compile_lightly(spark.sparkContext._gateway)
    return spark


LOG4J_CONF = os.path.join(PROJECT_ROOT, "conf", "spark", "log4j2.properties")


def _log_options(log_file: str) -> str:
    """The driver JVM's options that send its logs to ``log_file`` (a path without spaces:
    Spark splits these options at them)."""
    if " " in log_file or " " in LOG4J_CONF:
        return ""
    return f"-Dlog4j2.configurationFile={LOG4J_CONF} -Dretrysim.log.file={log_file}"


# The JVM's JIT: HotSpot compiles hot code with C1 at once and again, optimised, with C2.
# Where the rows are simulated, hashed and written in Python tasks (a group event by event,
# the check from the staged files), the driver JVM only plans and schedules, and C2 takes
# CPU from the tasks on a small machine to optimise code whose speed matters little: C1
# alone makes such a run shorter (docs/performance.md). Rounds and Spark's scans of the
# rows want C2's code, so a run that has them asks for it back (full_jit). A directive
# (the JDK's `jcmd Compiler.directives_add`), through the platform's DiagnosticCommand MBean;
# a JVM without it runs as it is.
_NO_C2 = '[{ match: "*.*", c2: { Exclude: true } }]'
_jit = {"light": False}


def _diagnostic_command(gateway, command: str, *arguments: str) -> str | None:
    """Run a diagnostic command on the JVM (as ``jcmd`` would): the MBean server's class is
    not exported to py4j's reflection, so through its public interface's method."""
    jvm = gateway.jvm
    java_class = jvm.java.lang.Class
    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    types = gateway.new_array(java_class, 4)
    for i, name in enumerate(("javax.management.ObjectName", "java.lang.String",
                              "[Ljava.lang.Object;", "[Ljava.lang.String;")):  # fmt: skip
        types[i] = java_class.forName(name)
    invoke = java_class.forName("javax.management.MBeanServerConnection").getMethod("invoke", types)
    given = gateway.new_array(jvm.java.lang.String, len(arguments))
    for i, argument in enumerate(arguments):
        given[i] = argument
    parameters = gateway.new_array(jvm.java.lang.Object, 1 if arguments else 0)
    if arguments:
        parameters[0] = given
    signature = gateway.new_array(jvm.java.lang.String, 1 if arguments else 0)
    if arguments:
        signature[0] = "[Ljava.lang.String;"
    call = gateway.new_array(jvm.java.lang.Object, 4)
    call[0] = jvm.javax.management.ObjectName("com.sun.management:type=DiagnosticCommand")
    call[1], call[2], call[3] = command, parameters, signature
    return invoke.invoke(server, call)


def _compile_lightly(gateway) -> None:
    if _jit["light"]:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json") as directive:
        directive.write(_NO_C2)
        directive.flush()
        try:
            _diagnostic_command(gateway, "compilerDirectivesAdd", directive.name)
        except Exception:  # another JVM, or none of the MBean: it compiles as ever
            return
    _jit["light"] = True


def light_jit() -> bool:
    """Whether the driver JVM compiles with C1 alone (:func:`build_session`)."""
    return _jit["light"]


def full_jit(spark: SparkSession) -> None:
    """Let the driver JVM compile hot code with C2 again, from now on: a run whose rows go
    through Spark (rounds, staging's scans) calls it before them."""
    if not _jit["light"]:
        return
    try:
        _diagnostic_command(spark.sparkContext._gateway, "compilerDirectivesRemove")
    except Exception:  # as in _compile_lightly
        return
    _jit["light"] = False


@contextmanager
def python_tasks(spark: SparkSession) -> Iterator[None]:
    """For a query whose work is all in Python tasks (a range of task numbers mapped in
    Arrow): no whole-stage code generation. Compiling its range's generated Java (Janino)
    delayed the event-by-event stage of a new JVM between the query's start and its job's,
    for a handful of rows. Only for a query no other thread runs beside."""
    key = "spark.sql.codegen.wholeStage"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def stop_session(spark: SparkSession) -> None:
    """Stop a command's session without waiting on PySpark's accumulator server.

    Its request handler polls its socket once a second, so ``SparkContext.stop`` waits up to
    a second for it. The server's thread is a daemon thread and a command's process exits
    right after, so it is told to stop and left behind.
    Notebooks keep ``spark.stop()``.
    """
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:  # what stop() calls: told to stop, not waited for
        server.shutdown = lambda: setattr(server, "server_shutdown", True)
    spark.stop()
