#!/usr/bin/env bash
# The RocketMQ conformance harness of one major (jvm/broker4: namesrv, broker and client at
# 4.9.7; jvm/broker5: namesrv, broker and local-mode proxy at 5.5.0, gRPC client 5.2.0), built
# once with Maven from jvm/<module>/pom.xml into build/jars/<module>/ with its dependencies, and
# printed as a class path. A change to jvm/<module> or jvm/common builds it again.
#
#   scripts/broker-jars.sh broker4     prints the class path, building it first if needed
#   scripts/broker-jars.sh broker5     the same for the 5.x harness
#
# Maven uses the machine's own configuration (~/.m2/settings.xml, MAVEN_OPTS). Where the
# harness cannot be built (no network, no mvn), it prints nothing, says why in one line on
# stderr and exits 1. RETRYSIM_JARS_DIR moves the cache.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RETRYSIM_JARS_DIR:-$ROOT/build/jars}"
module="${1:?usage: scripts/broker-jars.sh broker4}"
[ -f "$ROOT/jvm/$module/pom.xml" ] || { echo "retrysim: no harness jvm/$module" >&2; exit 1; }
dir="$CACHE/$module"
# the module's sources and jvm/common's, which its pom.xml compiles in
sources="$(cd "$ROOT/jvm" && find "$module/pom.xml" "$module/src" common/src -type f | LC_ALL=C sort |
  xargs sha1sum | sha1sum | cut -c1-12)"

cached() { [ "$(cat "$dir/.complete" 2>/dev/null)" = "$sources" ]; }
print_path() { echo "$dir/*"; }

! cached || { print_path; exit 0; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-$module"
flock 9 # one build at a time; a second caller waits for it and then reads the cache
! cached || { print_path; exit 0; }
printf 'retrysim: building the RocketMQ harness %s (once) with Maven...' "$module" >&2
scratch="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
if ! command -v mvn >/dev/null 2>&1; then
  echo " failed (mvn not found)" >&2
  exit 1
fi
if ! mvn -B -q -Dstyle.color=never -f "$ROOT/jvm/$module/pom.xml" -Dbuild.folder="$scratch/target" \
  package dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$scratch/jars" \
  >"$scratch/log" 2>&1 || ! mv "$scratch/target/retrysim-$module.jar" "$scratch/jars/"; then
  error="$(sed -e 's/\x1b\[[0-9;]*m//g' "$scratch/log" | grep -m1 '^\[ERROR\] [^ ]' |
    sed -e 's/^\[ERROR\] //' -e 's/ -> \[Help.*//' | cut -c1-300 || true)"
  echo " failed (mvn: ${error:-see mvn -f jvm/$module/pom.xml package})" >&2
  exit 1
fi
rm -rf "$dir"
echo "$sources" >"$scratch/jars/.complete"
mv "$scratch/jars" "$dir"
echo " done" >&2
print_path
