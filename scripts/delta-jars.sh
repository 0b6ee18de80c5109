#!/usr/bin/env bash
# The Delta Lake JARs (delta-spark and delta-storage, at the version of the installed
# delta-spark Python package) and retrysim-delta.jar (the log store retrysim commits file:
# tables with, jvm/delta/src), fetched and built once with Maven from jvm/delta/pom.xml into
# build/jars/delta-<version>/ and printed as a comma-separated list for spark.jars. A change
# to jvm/delta builds the cache again.
#
#   scripts/delta-jars.sh     prints the JARs, fetching them first if they are not cached
#
# Later starts read the cache and ask no resolver. Maven uses the machine's own
# configuration (~/.m2/settings.xml, MAVEN_OPTS). Where the JARs cannot be fetched (no
# network, no mvn), it prints nothing, says why in one line on stderr, and retrysim commits
# with the delta-rs sink; it tries again after an hour (or at once: delete
# build/jars/delta-<version>.failed). RETRYSIM_JARS_DIR moves the cache.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RETRYSIM_JARS_DIR:-$ROOT/build/jars}"
RETRY_AFTER_MIN=60

metadata=("$ROOT"/.venv/lib/python3*/site-packages/delta_spark-*.dist-info/METADATA)
version="$(sed -n 's/^Version: //p' "${metadata[0]}" 2>/dev/null | head -n1)"
if [ -z "$version" ]; then
  echo "retrysim: the delta-spark Python package is not installed in .venv; committing with delta-rs" >&2
  exit 0
fi
dir="$CACHE/delta-$version"
failed="$CACHE/delta-$version.failed"
# what the cache was built from: a change to the pom or the log store's source rebuilds it
sources="$(cd "$ROOT/jvm/delta" && find pom.xml src -type f | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-12)"
hadoop_jar=("$ROOT"/.venv/lib/python3*/site-packages/pyspark/jars/hadoop-client-api-*.jar)
hadoop="${hadoop_jar[0]##*/hadoop-client-api-}"
hadoop="${hadoop%.jar}"

cached() { [ "$(cat "$dir/.complete" 2>/dev/null)" = "$sources" ]; }

print_jars() {
  local jars=("$dir"/*.jar)
  local IFS=,
  echo "${jars[*]}"
}

! cached || { print_jars; exit 0; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9 # one fetch at a time; a second launcher waits for it and then reads the cache
! cached || { print_jars; exit 0; }
if [ -f "$failed" ] && [ -z "$(find "$failed" -mmin +"$RETRY_AFTER_MIN")" ]; then
  echo "retrysim: no Delta Lake JARs ($(cat "$failed")); committing with delta-rs" >&2
  exit 0
fi

printf 'retrysim: fetching the Delta Lake JARs (delta-spark %s, once) with Maven...' "$version" >&2
scratch="$(mktemp -d "$CACHE/fetch.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
why=""
if ! command -v mvn >/dev/null 2>&1; then
  why="mvn not found"
elif ! mvn -B -q -Dstyle.color=never -f "$ROOT/jvm/delta/pom.xml" -Ddelta.version="$version" \
  -Dhadoop.version="$hadoop" -Dbuild.folder="$scratch/target" \
  package dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$scratch/jars" \
  >"$scratch/log" 2>&1; then
  # its first error, without colour codes or its "-> [Help 1]" pointer
  error="$(sed -e 's/\x1b\[[0-9;]*m//g' "$scratch/log" | grep -m1 '^\[ERROR\] [^ ]' |
    sed -e 's/^\[ERROR\] //' -e 's/ -> \[Help.*//' | cut -c1-300 || true)"
  why="mvn: ${error:-failed, see mvn -f jvm/delta/pom.xml package}"
elif ! ls "$scratch/jars"/delta-spark_*.jar "$scratch/jars"/delta-storage-*.jar >/dev/null 2>&1; then
  why="mvn fetched no delta-spark and delta-storage JARs"
elif ! mv "$scratch/target/retrysim-delta.jar" "$scratch/jars/"; then
  why="mvn built no retrysim-delta.jar"
fi
if [ -n "$why" ]; then
  echo "$why" >"$failed"
  echo " failed ($why); committing with delta-rs" >&2
  exit 0
fi
rm -rf "$dir" "$failed"
echo "$sources" >"$scratch/jars/.complete"
mv "$scratch/jars" "$dir"
echo " done" >&2
print_jars
