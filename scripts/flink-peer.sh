#!/usr/bin/env bash
# Apache Flink as a peer of `weir compare async`, `weir compare exchange` and
# `weir compare remote`, of Weir's checkpoints and of Weir's main job (`weir run`):
# installs what is missing (Java 17 from the Debian packages, Flink's jars from the PyPI
# package apache-flink-libraries into target/flink-venv), compiles
# bench/flink/WeirFlinkPeer.java and runs the same configurations as Flink jobs on an
# in-process MiniCluster (for remote: 2 task managers, the producers on one and the
# consumers on the other), start-up excluded and reported apart. Writes the same JSON as `weir compare --json`:
#
#   results/report/flink-async.json, flink-exchange.json, flink-remote.json,
#   flink-checkpoints.json, flink-keyed.json, flink-mainjob.json
#
# keyed: Weir's keyed state snapshot (checkpoint-bench's "keyed state snapshot") as a
# Flink job: 10 MB, 100 MB and 1 GB (--quick: 10 and 100 MB) of keyed state in one
# subtask (a ValueState<byte[92]> per Long key, HashMapStateBackend), filled, then 1% of
# the keys written a second while aligned checkpoints come every 1 s; per checkpoint of
# the whole state, the subtask's synchronous part (its pause), asynchronous part and the
# end-to-end duration, from the job's checkpoint statistics.
#
# checkpoints: the job DataGeneratorSource (64-byte records, parallelism 2) → keyBy →
# counting sink (parallelism 2) without checkpoints and with aligned or unaligned
# checkpoints every 1 s (throughput, "checkpoint overhead"), and with a sink that
# busy-waits 20 µs per record, aligned, unaligned and aligned with buffer debloating
# ("checkpoints under back-pressure"); HashMapStateBackend, file:// storage in a fresh
# temp directory per run, EXACTLY_ONCE, 1 concurrent checkpoint. Each row has the
# completed and failed checkpoints and their durations, start delays, alignment times,
# persisted in-flight data and state size, from the finished job's checkpoint
# statistics. --quick checkpoints every 100 ms instead, and says so in the JSON.
#
# mainjob (only when named: it needs a running lookup service): the job of `weir run`,
# DataGeneratorSource (records {id, key, created_ns}, keys uniform over 1,000,000,
# unthrottled, parallelism 2) → AsyncDataStream.unorderedWait(timeout 1 s, capacity C)
# with a RichAsyncFunction that looks each key up in Weir's lookup service over one
# pipelined TCP connection per subtask (writes batched on one NIO I/O thread) → keyBy(key)
# → a sink (parallelism 2) that counts, checks every id arrives once (a bitset) and
# records each record's latency; buffer timeout 1 ms (Flink sets it in whole
# milliseconds: compare with `weir run --buffer-timeout 1ms`). 2 JVM warm-up runs
# (at least 1,000,000 records each), then per round one warm-up run (a fifth of the
# records) and one measured run of 2,000,000 records: throughput, latency
# p50/p90/p99/p99.9/max, process CPU per record, unique/duplicated/lost; and the medians
# over the rounds. Compare it with `weir run --lookup-addr` against the same service (the
# service's CPU is then outside both). Start the service first, e.g.
#
#   target/measure/weir serve-lookup --addr 127.0.0.1:7979 --latency fixed:1ms --value-size 32 &
#   scripts/flink-peer.sh --quick mainjob
#
# FLINK_LOOKUP_ADDR=host:port (default 127.0.0.1:7979) is where it listens,
# FLINK_CAPACITY=C the async capacity per subtask (default 1000), FLINK_RECORDS=N the
# records per measured run (default 2,000,000, times 0.15 with --quick) and
# FLINK_LOOKUP_LATENCY the service's --latency (default fixed:1ms; it names the row and
# gives Little's limit, 2 × C ÷ latency). Where nothing listens there the suite fails at
# once (exit 1, the JSON says why), as it does when the service goes away mid-run.
#
#   scripts/flink-peer.sh                  async, exchange, remote, checkpoints and keyed at full
#                                          size, 7 rounds
#   scripts/flink-peer.sh --quick          3 rounds at 0.15 of the size
#   scripts/flink-peer.sh [--quick] remote only the named suites (async, exchange,
#                                          remote, checkpoints, keyed, mainjob)
#
# FLINK_ONLY=TEXT runs only the cases whose "experiment / implementation" contains TEXT
# (e.g. FLINK_ONLY=back-pressure scripts/flink-peer.sh checkpoints); such a partial run
# writes to target/flink-peer-only/ (or FLINK_PEER_DATA), never over the report's files.
# FLINK_PEER_DATA=DIR writes elsewhere. Where Java or Flink cannot be installed, each
# JSON says why ("unavailable") so that `weir report` states it instead of leaving the
# rows out, and the script exits 0; a failed Flink job is reported the same way and
# exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.3.0
rounds=7
scale=1
quick=""
if [ "${1:-}" = "--quick" ]; then
  rounds=3
  scale=0.15
  quick=" --quick"
  shift
fi
# FLINK_ROUNDS=N overrides the rounds (e.g. 1, for a script that interleaves Flink's
# rounds with Weir's own runs).
rounds=${FLINK_ROUNDS:-$rounds}
suites=("$@")
if [ ${#suites[@]} -eq 0 ]; then
  suites=(async exchange remote checkpoints keyed)
fi
for suite in "${suites[@]}"; do
  case "$suite" in
    async | exchange | remote | checkpoints | keyed | mainjob) ;;
    *)
      echo "flink-peer: unknown suite $suite (async, exchange, remote, checkpoints, keyed, mainjob)" >&2
      exit 2
      ;;
  esac
done
if [ "${suites[*]}" != "async exchange remote checkpoints keyed" ]; then
  quick="$quick ${suites[*]}"
fi
if [ -n "${FLINK_ONLY:-}" ]; then
  data=${FLINK_PEER_DATA:-target/flink-peer-only}
else
  data=${FLINK_PEER_DATA:-results/report}
fi
venv=target/flink-venv
build=target/flink-peer
mkdir -p "$data" "$build"

# Writes the "unavailable" JSON for every suite asked for.
mark_unavailable() {
  local reason
  reason=$(printf '%s' "$1" | tr -d '"\\' | tr '\n\t' '  ')
  for suite in "${suites[@]}"; do
    printf '{\n  "peer": "Apache Flink",\n  "command": "scripts/flink-peer.sh%s",\n  "unavailable": "%s",\n  "results": []\n}\n' \
      "$quick" "$reason" > "$data/flink-$suite.json"
  done
  echo "flink-peer: $1" >&2
}

# The major version of a java binary, or 0.
java_major() {
  "$1" -version 2>&1 | awk -F'"' '/version/ { split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit }' || echo 0
}

# Java 17 or later: JAVA_HOME, the PATH, an installed JDK 17, or the Debian package.
find_jdk() {
  local candidate
  for candidate in "${JAVA_HOME:+$JAVA_HOME/bin}" "$(dirname "$(command -v javac 2>/dev/null || echo /nonexistent/javac)")" /usr/lib/jvm/java-17-openjdk-*/bin /usr/lib/jvm/java-*-openjdk-*/bin; do
    if [ -n "$candidate" ] && [ -x "$candidate/java" ] && [ -x "$candidate/javac" ] \
      && [ "$(java_major "$candidate/java")" -ge 17 ] 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

jdk=$(find_jdk || true)
if [ -z "$jdk" ]; then
  echo "flink-peer: no Java 17 found; installing openjdk-17-jdk-headless" >&2
  if command -v apt-get > /dev/null && [ "$(id -u)" = 0 ] \
    && apt-get update -qq > /dev/null 2>&1 \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jdk-headless > /dev/null 2>&1; then
    jdk=$(find_jdk || true)
  fi
fi
if [ -z "$jdk" ]; then
  mark_unavailable "Java 17 is not installed and could not be installed here (apt-get install openjdk-17-jdk-headless failed or is not available)"
  exit 0
fi

# Flink's jars, from the PyPI package that PyFlink uses.
find_lib() {
  local jar
  jar=$(find "$venv" -path "*/pyflink/lib/flink-dist-$version.jar" 2>/dev/null | head -n 1)
  [ -n "$jar" ] && dirname "$jar"
}
lib=$(find_lib || true)
if [ -z "$lib" ]; then
  echo "flink-peer: installing apache-flink-libraries==$version into $venv" >&2
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" > /dev/null 2>&1 || {
      # Debian's python3 without ensurepip: the venv module comes in its own package.
      command -v apt-get > /dev/null && [ "$(id -u)" = 0 ] \
        && apt-get update -qq > /dev/null 2>&1 \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv > /dev/null 2>&1 \
        && python3 -m venv "$venv" > /dev/null 2>&1
    } || true
  fi
  if [ -x "$venv/bin/python" ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "apache-flink-libraries==$version" >&2 || true
  fi
  lib=$(find_lib || true)
fi
if [ -z "$lib" ]; then
  mark_unavailable "Flink $version could not be installed (python3 -m venv $venv and pip install apache-flink-libraries==$version failed)"
  exit 0
fi

echo "flink-peer: Flink $version from $lib, Java $("$jdk/java" -version 2>&1 | head -n 1)" >&2
classes=$build/classes
rm -rf "$classes"
mkdir -p "$classes"
"$jdk/javac" -encoding UTF-8 -cp "$lib/*" -d "$classes" bench/flink/WeirFlinkPeer.java
# Flink finds metric reporter factories as services: the one that reads the sinks' input
# queue sizes (bytes in flight) is named here.
mkdir -p "$classes/META-INF/services"
echo 'WeirFlinkPeer$InFlightReporterFactory' > "$classes/META-INF/services/org.apache.flink.metrics.reporter.MetricReporterFactory"

# What Flink's own config.yaml passes to its JVMs on Java 17.
opens=()
for module in java.lang java.lang.reflect java.io java.net java.nio java.text java.time java.util java.util.concurrent java.util.concurrent.atomic java.util.concurrent.locks sun.nio.ch; do
  opens+=("--add-opens=java.base/$module=ALL-UNNAMED")
done

status=0
for suite in "${suites[@]}"; do
  echo "== flink $suite" >&2
  json=$data/flink-$suite.json
  rm -f "$json"
  extra=()
  if [ -n "${FLINK_ONLY:-}" ]; then
    extra+=(--only "$FLINK_ONLY")
  fi
  if [ "$suite" = mainjob ]; then
    extra+=(--lookup-addr "${FLINK_LOOKUP_ADDR:-127.0.0.1:7979}" --capacity "${FLINK_CAPACITY:-1000}"
      --records "${FLINK_RECORDS:-2000000}" --lookup-latency "${FLINK_LOOKUP_LATENCY:-fixed:1ms}")
  fi
  command="scripts/flink-peer.sh$quick (WeirFlinkPeer --suite $suite --rounds $rounds --scale $scale${extra[*]:+ ${extra[*]}})"
  # The keyed suite holds up to 1 GB of keyed state as Java objects (about twice that
  # on the heap), and copies of what is written while a snapshot is written out: its
  # heap is sized once, at its maximum, so that no heap growth lands in a checkpoint.
  heap=(-Xms1g -Xmx1g)
  [ "$suite" = keyed ] && heap=(-Xms10g -Xmx10g)
  if ! "$jdk/java" "${heap[@]}" "${opens[@]}" \
    -Dlog4j.configurationFile=bench/flink/log4j2.properties \
    -cp "$classes:$lib/*" WeirFlinkPeer \
    --suite "$suite" --rounds "$rounds" --scale "$scale" "${extra[@]}" --json "$json" --command "$command" \
    2>&1 | tee "$data/flink-$suite.txt" >&2; then
    reason="the Flink job failed: $(grep -v WARN "$data/flink-$suite.txt" | tail -n 3)"
    printf '{\n  "peer": "Apache Flink",\n  "command": "%s",\n  "unavailable": "%s",\n  "results": []\n}\n' \
      "$command" "$(printf '%s' "$reason" | tr -d '"\\' | tr '\n\t' '  ')" > "$json"
    echo "flink-peer: $suite failed (see $data/flink-$suite.txt)" >&2
    status=1
  fi
done
exit "$status"
