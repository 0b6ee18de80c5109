#!/usr/bin/env bash
# Launcher: bootstraps .venv on first use, then runs the venv's spark-submit with the
# settings every retrysim job needs. Usage: ./spark-submit.sh [spark-submit options] jobs/simulate.py [job options]
#
# With a non-local master (spark-submit's --master or --conf spark.master=..., or the job's
# own --master option, which wins) the retrysim package is zipped and shipped to the
# executors with --py-files (added to any --py-files given), executors run PYSPARK_PYTHON
# (default: this venv's python, which must exist at the same path on every node), and a
# loopback master (spark://127.0.0.1 or localhost) makes the driver bind to 127.0.0.1 too.
# Local masters run exactly as without this logic. See docs/cluster.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$ROOT/scripts/bootstrap.sh"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$ROOT/.venv/bin/python}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$ROOT/.venv/bin/python}"
if [ -z "${SPARK_HOME:-}" ]; then # the venv's pyspark (found without importing it: 0.2 s)
  homes=("$ROOT"/.venv/lib/python3*/site-packages/pyspark/jars)
  SPARK_HOME="$(dirname "${homes[0]}")"
fi
export SPARK_HOME
cd "$ROOT"
# Split the arguments into spark-submit options, the application file and the job's options
# (spark-submit's own rule: the first argument that is neither an option nor an option's
# value is the application), noting the master and any --py-files on the way.
args=("$@")
submit=()
app=""
job=()
submit_master="${MASTER:-}"
py_files_at=-1
jars_at=-1
driver_path_at=-1
# a --conf spark.jars=... or spark.driver.extraClassPath=... (where the JARs are added when
# the flag is not given: spark-submit's flag would replace the setting)
conf_jars_at=-1
conf_path_at=-1
note_conf() { # the index in submit of a --conf value just added
  case "$1" in
    spark.master=*) submit_master="${1#spark.master=}" ;;
    spark.jars=*) conf_jars_at=$((${#submit[@]} - 1)) ;;
    spark.driver.extraClassPath=*) conf_path_at=$((${#submit[@]} - 1)) ;;
  esac
}
i=0
while [ "$i" -lt "${#args[@]}" ]; do
  arg="${args[$i]}"
  case "$arg" in
    -h | --help | -v | --verbose | --version | --supervise | --usage-error | --load-spark-defaults)
      submit+=("$arg") ;;
    --master=*) submit_master="${arg#--master=}"; submit+=("$arg") ;;
    --conf=*) submit+=("--conf" "${arg#--conf=}"); note_conf "${arg#--conf=}" ;;
    --py-files=*) submit+=("--py-files" "${arg#--py-files=}"); py_files_at=$((${#submit[@]} - 1)) ;;
    --jars=*) submit+=("--jars" "${arg#--jars=}"); jars_at=$((${#submit[@]} - 1)) ;;
    --driver-class-path=*)
      submit+=("--driver-class-path" "${arg#--driver-class-path=}")
      driver_path_at=$((${#submit[@]} - 1)) ;;
    -*=*) submit+=("$arg") ;;
    -*)
      value="${args[$((i + 1))]:-}"
      submit+=("$arg" "$value")
      case "$arg" in
        --master) submit_master="$value" ;;
        --conf | -c) note_conf "$value" ;;
      esac
      [ "$arg" != --py-files ] || py_files_at=$((${#submit[@]} - 1))
      [ "$arg" != --jars ] || jars_at=$((${#submit[@]} - 1))
      [ "$arg" != --driver-class-path ] || driver_path_at=$((${#submit[@]} - 1))
      i=$((i + 1))
      ;;
    *)
      app="$arg"
      job=("${args[@]:$((i + 1))}")
      break
      ;;
  esac
  i=$((i + 1))
done

# The job's input (its options, the scenario, the output folder) is checked before a JVM
# starts, by the job's own parser and checks, in Python without Spark (retrysim/cli/precheck.py):
# bad input is one line, exit code 2; --help and --dry-run are done there. On a go it names,
# on file descriptor 3, the file under the output folder the JVM's logs go to.
log_file=""
if [ -n "$app" ]; then
  export RETRYSIM_PROG="$0 $app" # what the user ran, for the job's usage and error lines
  exec 4>&1
  set +e
  log_file="$(RETRYSIM_PRECHECK_FD=3 "$ROOT/.venv/bin/python" -m retrysim.cli.precheck \
    "$app" ${job[@]+"${job[@]}"} 3>&1 1>&4)"
  checked=$?
  set -e
  exec 4>&-
  case "$checked" in
    0) ;;
    3) exit 0 ;; # done without Spark: --help, --dry-run
    *) exit "$checked" ;;
  esac
fi

# The Delta Lake JARs (scripts/delta-jars.sh: fetched once, then read from build/jars) on the
# driver's class path (where the JVM's class archive can hold their classes) and, through
# --jars, the executors', unless the command brings Delta itself (--packages
# io.delta:delta-spark_2.13:..., or its JARs in --jars).
if [ -n "$app" ] && [[ " ${submit[*]} " != *delta-spark* ]]; then
  delta_jars="$("$ROOT/scripts/delta-jars.sh")"
  if [ -n "$delta_jars" ]; then
    # the flag's value where both are given (spark-submit takes the flag's)
    [ "$jars_at" -ge 0 ] || jars_at=$conf_jars_at
    [ "$driver_path_at" -ge 0 ] || driver_path_at=$conf_path_at
    if [ "$jars_at" -ge 0 ]; then
      submit[$jars_at]="${submit[$jars_at]},$delta_jars"
    else
      submit+=(--jars "$delta_jars")
    fi
    if [ "$driver_path_at" -ge 0 ]; then
      submit[$driver_path_at]="${submit[$driver_path_at]}:${delta_jars//,/:}"
    else
      submit+=(--driver-class-path "${delta_jars//,/:}")
    fi
    set -- "${submit[@]}" "$app" "${job[@]}"
  fi
fi

# The job's --master wins over spark-submit's (the session builder sets it last).
master="$submit_master"
for ((j = 0; j < ${#job[@]}; j++)); do
  case "${job[$j]}" in
    --master) master="${job[$((j + 1))]:-}" ;;
    --master=*) master="${job[$j]#--master=}" ;;
  esac
done

# A master Spark cannot parse stops here, in one line, before a JVM starts (the job checks
# it again, and whether a spark:// master answers: retrysim.session.check_master, whose rule
# this is; tests/cli/test_bad_input.py holds the two to the same answers).
master_rule='^(local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?|local-cluster\[[1-9][0-9]*,[1-9][0-9]*,[1-9][0-9]*\]|spark://[^,:/@[:space:]]+:[0-9]+(,[^,:/@[:space:]]+:[0-9]+)*|yarn|k8s://[^[:space:]]+)$'
if [ -n "$app" ] && [ -n "$master" ] && ! [[ "$master" =~ $master_rule ]]; then
  echo "retrysim: error: --master: value '$master': use local, local[N], local[*], local[N,F]," \
    "local-cluster[N,C,M], spark://HOST:PORT[,HOST:PORT...], yarn or k8s://[https://]HOST[:PORT]" >&2
  exit 2
fi

# retrysim's Spark settings (conf/spark) go in as a properties file and a log4j file, with an
# empty SPARK_CONF_DIR: that folder is on the driver's class path, and the JVM's class
# archive (scripts/class-archive.sh) can only be used with no file-filled folder there. A
# SPARK_CONF_DIR of your own is used as it is, without the archive.
own_conf=""
if [ -z "${SPARK_CONF_DIR:-}" ]; then
  own_conf=1
  export SPARK_CONF_DIR="$ROOT/build/spark-conf"
  mkdir -p "$SPARK_CONF_DIR"
  SPARK_SUBMIT_OPTS="${SPARK_SUBMIT_OPTS:+$SPARK_SUBMIT_OPTS }\"-Dlog4j2.configurationFile=$ROOT/conf/spark/log4j2.properties\""
  if [ -n "$log_file" ]; then # the JVM's logs (and Python's warnings) to a file, not the console
    SPARK_SUBMIT_OPTS+=" \"-Dretrysim.log.file=$log_file\""
    export RETRYSIM_LOG_FILE="$log_file"
  fi
  if [ -n "${RETRYSIM_CLASS_ARCHIVE_RECORD:-}" ]; then
    SPARK_SUBMIT_OPTS+=" \"-XX:ArchiveClassesAtExit=$RETRYSIM_CLASS_ARCHIVE_RECORD\""
  else
    archive="$("$ROOT/scripts/class-archive.sh" || true)" # a failure: no archive, same run
    [ -z "$archive" ] || SPARK_SUBMIT_OPTS+=" \"-XX:SharedArchiveFile=$archive\" -Xlog:cds=off -Xlog:cds+dynamic=off"
  fi
  export SPARK_SUBMIT_OPTS
fi

if [ -n "$app" ] && [ -n "$master" ] && [[ "$master" != local* ]]; then
  # A zip of the package, named by a hash of its sources so concurrent launches of the same
  # code share one file (written to a temporary name and renamed into place).
  zip="$("$ROOT/.venv/bin/python" - "$ROOT" <<'PY'
import hashlib, os, sys, tempfile, zipfile
root = sys.argv[1]
files = sorted(
    os.path.relpath(os.path.join(folder, name), root)
    for folder, dirs, names in os.walk(os.path.join(root, "retrysim"))
    if "__pycache__" not in folder
    for name in names
    if not name.endswith((".pyc", ".pyo"))
)
digest = hashlib.sha256()
for name in files:
    with open(os.path.join(root, name), "rb") as handle:
        digest.update(name.encode() + b"\0" + handle.read() + b"\0")
target_dir = os.path.join(root, "build", "spark-submit")
os.makedirs(target_dir, exist_ok=True)
target = os.path.join(target_dir, f"retrysim-{digest.hexdigest()[:16]}.zip")
if not os.path.exists(target):
    fd, temp = tempfile.mkstemp(suffix=".zip.tmp", dir=target_dir)
    with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with open(os.path.join(root, name), "rb") as handle:
                archive.writestr(info, handle.read(), zipfile.ZIP_DEFLATED)
    os.replace(temp, target)
print(target)
PY
)"
  find "$ROOT/build/spark-submit" -name 'retrysim-*.zip' ! -path "$zip" -mmin +1440 -delete \
    2>/dev/null || true
  if [ "$py_files_at" -ge 0 ]; then
    submit[$py_files_at]="${submit[$py_files_at]},$zip"
  else
    submit+=(--py-files "$zip")
  fi
  # --py-files also puts the zip first on the driver's PYTHONPATH; the driver keeps importing
  # the source tree (as in local runs: paths such as conf/default.yaml are found from it)
  # through this wrapper, which puts the repository before the zip.
  wrapper="$ROOT/build/spark-submit/driver-python"
  if [ ! -x "$wrapper" ]; then
    temp="$(mktemp "$wrapper.XXXXXX")"
    printf '%s\n' '#!/bin/sh' \
      '# Written by spark-submit.sh: the driver imports retrysim from the source tree.' \
      'PYTHONPATH="$RETRYSIM_SOURCE_ROOT${PYTHONPATH:+:$PYTHONPATH}"' \
      'export PYTHONPATH' \
      'exec "$RETRYSIM_DRIVER_PYTHON" "$@"' >"$temp"
    chmod 755 "$temp"
    mv -f "$temp" "$wrapper"
  fi
  export RETRYSIM_SOURCE_ROOT="$ROOT" RETRYSIM_DRIVER_PYTHON="$PYSPARK_DRIVER_PYTHON"
  export PYSPARK_DRIVER_PYTHON="$wrapper"
  if [[ "$master" =~ ^spark://(127\.0\.0\.1|localhost)(:|$) ]]; then
    export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
  fi
  echo "retrysim: master $master: shipping the package to executors as ${zip#"$ROOT"/}" >&2
  set -- "${submit[@]}" "$app" "${job[@]}"
fi

# conf/spark/spark-defaults.conf, unless a --properties-file of your own replaces it
defaults=()
if [ -n "$own_conf" ] && [[ " ${submit[*]} " != *" --properties-file "* ]] &&
  [[ " ${submit[*]} " != *" --properties-file="* ]]; then
  defaults=(--properties-file "$ROOT/conf/spark/spark-defaults.conf")
fi

# The JVM's one warning that no setting turns off (Spark's launcher always adds the vector
# module, and the JVM then says it uses an incubator module) is left out of the console.
exec "$ROOT/.venv/bin/spark-submit" \
  --conf spark.ui.showConsoleProgress=false \
  ${defaults[@]+"${defaults[@]}"} \
  "$@" 2> >(grep --line-buffered -v '^WARNING: Using incubator modules' >&2)
