#!/usr/bin/env bash
# The driver JVM's class archive (JDK class data sharing): a snapshot of the ~15,000 classes
# a retrysim run loads (Spark SQL, Parquet, Janino, Hadoop), parsed and verified once, which
# later JVMs map instead of loading each class from its jar again. It saves about 2 s of a
# cold start and 8 CPU-seconds of a run (docs/performance.md).
#
#   scripts/class-archive.sh          prints the archive's path for this JVM and venv,
#                                     recording it first (a small run, ~40 s, once) if missing
#
# Called by spark-submit.sh, which passes the path to the driver JVM, and by run-tests.sh.
# The archive is keyed by everything it depends on (the java binary Spark runs and its
# version, the Spark jars, the Delta Lake JARs, the configuration folder on the class path,
# this script), so a
# new JDK or pyspark records a new one. A JVM that cannot use it (another class path, a
# changed jar) runs as without it, and so does a launch when this script fails. A recording
# that fails is not retried for that key (build/jvm/<key>.failed; delete it to retry).
# RETRYSIM_CLASS_ARCHIVE=off turns the archive off.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "${RETRYSIM_CLASS_ARCHIVE:-}" != off ] || exit 0
[ -z "${RETRYSIM_CLASS_ARCHIVE_RECORD:-}" ] || exit 0 # this is the recording run itself
command -v java >/dev/null 2>&1 || exit 0
if [ -z "${SPARK_HOME:-}" ]; then
  homes=("$ROOT"/.venv/lib/python3*/site-packages/pyspark/jars)
  SPARK_HOME="$(dirname "${homes[0]}")"
fi
DIR="$ROOT/build/jvm"
key="$(
  {
    java="$(readlink -f "$(command -v "${JAVA_HOME:+$JAVA_HOME/bin/}java")")" # spark-class's
    # which JDK, without starting it (java -version: a JVM at every launch)
    echo "$java"
    stat -c '%s %Y' "$java"
    cat "$(dirname "$(dirname "$java")")/release" 2>/dev/null || true
    cat "${BASH_SOURCE[0]}"
    echo "$SPARK_HOME" "$ROOT/build/spark-conf"
    ls -l --time-style=+%s "$SPARK_HOME/jars"
    "$ROOT/scripts/delta-jars.sh" 2>/dev/null # on the driver's class path too (spark-submit.sh)
  } | sha256sum | cut -c1-16
)"
archive="$DIR/spark-$key.jsa"
if [ ! -f "$archive" ] && [ ! -f "$DIR/spark-$key.failed" ]; then
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  if flock -n 9 && [ ! -f "$archive" ]; then
    echo "retrysim: recording the JVM's class archive for faster starts (once, ~40 s)..." >&2
    scratch="$(mktemp -d "$DIR/record.XXXXXX")"
    # the launcher's own settings (the archive is for them: an empty SPARK_CONF_DIR, which a
    # calling spark-submit.sh has exported already)
    if env -u SPARK_CONF_DIR -u MASTER RETRYSIM_CLASS_ARCHIVE_RECORD="$scratch/classes.jsa" \
      "$ROOT/spark-submit.sh" jobs/simulate.py --master 'local[*]' --output "$scratch/out" \
      --set groups.0.workload.messages=5000 \
      >"$scratch/log" 2>&1 && [ -s "$scratch/classes.jsa" ]; then
      mv -f "$scratch/classes.jsa" "$archive"
      find "$DIR" -name 'spark-*.jsa' ! -path "$archive" -delete
    else
      cp "$scratch/log" "$DIR/spark-$key.failed"
      echo "retrysim: the class archive could not be recorded (log: $DIR/spark-$key.failed);" \
        "runs start without it" >&2
    fi
    rm -rf "$scratch"
  fi
  exec 9>&-
fi
[ ! -f "$archive" ] || echo "$archive"
