#!/usr/bin/env bash
# Regenerates results/REPORT.md and results/plots/ end to end: every comparison suite
# (Weir and its peers, interleaved), Redis against redis-rs and fred when a redis-server
# can be started (scripts/redis.sh install), Apache Flink on the async, exchange and remote
# suites (scripts/flink-peer.sh), the main job, and an open-loop latency sweep, each
# written as JSON to results/report/ first.
#
#   scripts/report.sh           full run (about 20 minutes on 2 cores: Redis 3, Flink 4, the main job beside Flink 1.5, the stream benchmark 1.5)
#   scripts/report.sh --quick   fewer rounds and less work per turn (about four minutes: the
#                               main job beside Flink starts three JVMs whatever the size)
#
# Run it with nothing else heavy on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=7
scale=1
seconds=2
quick=""
if [ "${1:-}" = "--quick" ]; then
  rounds=3
  scale=0.15
  seconds=0.5
  quick=--quick
fi
# The measure profile: fat LTO and one codegen unit, as the criterion benches are built.
cargo build --profile measure -p weir-bench
weir=target/measure/weir
data=results/report
mkdir -p "$data"
rm -f "$data"/*.json "$data"/*.md "$data"/*.txt
for suite in ring pool async exchange lookup remote; do
  echo "== $suite" >&2
  "$weir" compare "$suite" --rounds "$rounds" --scale "$scale" --json "$data/$suite.json" > "$data/$suite.md" 2>/dev/null
done
echo "== instructions per record (callgrind)" >&2
# The targets table quotes them beside the times; without valgrind it says they were
# not counted.
if command -v valgrind >/dev/null; then
  scripts/instructions.sh $quick >/dev/null || echo "scripts/instructions.sh failed; the targets table says so" >&2
else
  echo "no valgrind here (apt-get install valgrind); the targets table says the instructions were not counted" >&2
fi
echo "== checkpoints" >&2
"$weir" checkpoint-bench $([ -n "$quick" ] && echo "--rounds 2 --scale 0.3") --json "$data/checkpoints.json" > "$data/checkpoints.md"
echo "== debloat" >&2
"$weir" debloat --json "$data/debloat.json" > "$data/debloat.md" 2>/dev/null
echo "== redis" >&2
# It starts its own redis-server, pinned to the second core; without one the report
# says the suite was not measured.
if scripts/redis.sh install >/dev/null 2>&1 && command -v redis-benchmark >/dev/null; then
  "$weir" compare redis --rounds "$rounds" --scale "$scale" --json "$data/redis.json" > "$data/redis.md" 2>/dev/null ||
    echo "the redis suite failed; the report leaves it out" >&2
else
  echo "no redis-server here (scripts/redis.sh install failed); the redis suite is skipped" >&2
fi
echo "== Apache Flink (async, exchange and remote)" >&2
# Its own step: installs Java 17 and Flink if missing, and writes flink-*.json even when
# it cannot run, so the report says why; a failed Flink job does not stop the report.
scripts/flink-peer.sh $quick || echo "scripts/flink-peer.sh failed; the report says so" >&2
echo "== main job" >&2
# Three runs on its defaults (job.json, job-1.json, job-2.json): the targets take their
# medians.
job_records=$(awk "BEGIN { printf \"%d\", 1000000 * $seconds }")
for i in 0 1 2; do
  name=job
  [ "$i" -gt 0 ] && name=job-$i
  "$weir" run --records "$job_records" --quiet --json "$data/$name.json" > "$data/$name.txt" 2>&1 ||
    echo "the main job failed (run $i); the report says so" >&2
done
echo "== lookup batch requests" >&2
# The main job with a request per record and with batch requests (--lookup-batch 256),
# alternating, on its defaults and with lookups answered at once (latency 0, capacity
# 256 a subtask, where the per-request cost weighs most).
for i in 0 1 2; do
  for side in off on; do
    batch=""
    [ "$side" = on ] && batch="--lookup-batch 256"
    "$weir" run --records "$job_records" $batch --quiet \
      --json "$data/batch-1ms-$side-$i.json" > "$data/batch-1ms-$side-$i.txt" 2>&1 ||
      echo "a lookup batch run failed; the report leaves it out" >&2
    "$weir" run --records "$job_records" --latency fixed:0ms --capacity 256 $batch --quiet \
      --json "$data/batch-0-$side-$i.json" > "$data/batch-0-$side-$i.txt" 2>&1 ||
      echo "a lookup batch run failed; the report leaves it out" >&2
  done
done
echo "== main job beside Apache Flink's" >&2
# The same job in Flink (scripts/flink-peer.sh mainjob) and `weir run --lookup-addr`,
# against one external lookup service (1 ms, 32-byte values), so that neither process's
# CPU includes the service's; a Weir run and a Flink round in turn, 3 times.
service_log=$data/mainjob-service.txt
"$weir" serve-lookup --addr 127.0.0.1:0 --latency fixed:1ms --value-size 32 > "$service_log" 2>&1 &
service=$!
trap 'kill "$service" 2>/dev/null || true' EXIT
service_addr=""
for _ in $(seq 50); do
  service_addr=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$service_log")
  [ -n "$service_addr" ] && break
  sleep 0.1
done
if [ -n "$service_addr" ]; then
  for i in 0 1 2; do
    # Flink's parallelism: 2 subtasks a stage.
    "$weir" run --lookup-addr "$service_addr" --latency fixed:1ms --cores 2 --oversubscribe \
      --buffer-timeout 1ms --records "$job_records" --quiet \
      --json "$data/mainjob-weir-$i.json" > "$data/mainjob-weir-$i.txt" 2>&1 ||
      echo "weir run against the external service failed (round $i)" >&2
    FLINK_ROUNDS=1 FLINK_RECORDS=$job_records FLINK_LOOKUP_ADDR=$service_addr \
      scripts/flink-peer.sh mainjob || echo "the Flink main job failed (round $i); the report says so" >&2
    mv -f "$data/flink-mainjob.json" "$data/flink-mainjob-$i.json" 2>/dev/null || true
    mv -f "$data/flink-mainjob.txt" "$data/flink-mainjob-$i.txt" 2>/dev/null || true
  done
else
  echo "the lookup service did not start; the main job is not measured beside Flink" >&2
fi
kill "$service" 2>/dev/null || true
wait "$service" 2>/dev/null || true
trap - EXIT
echo "== latency vs load" >&2
# ... and at half the closed-loop run's throughput, where the engine's added latency
# under load is read (the report's "half the closed-loop run" line).
half=$(python3 -c "import json; print(int(json.load(open('$data/job.json'))['throughput_records_per_s'] / 2000) * 1000)" 2>/dev/null || echo 0)
rates="50000 100000 200000 400000"
if [ "$half" -gt 0 ]; then rates="$rates $half"; fi
for rate in $rates; do
  records=$(awk "BEGIN { printf \"%d\", $rate * $seconds }")
  "$weir" run --rate "$rate" --records "$records" --quiet --json "$data/load-$rate.json" > "$data/load-$rate.txt" 2>&1
done
echo "== timer slack at low load" >&2
# What a wake-up and a timer cost a thread on this machine: the yardstick of the rows
# below.
"$weir" wake-cost $([ -n "$quick" ] && echo "--sleeps 2000 --round-trips 5000") \
  --json "$data/wake-cost.json" > "$data/wake-cost.txt" 2>&1 ||
  echo "weir wake-cost failed; the report leaves it out" >&2
# 50 k records/s with the workers' timer slack at 0, the default (50 µs) and longer:
# CPU per record and wake-ups against the latency each adds.
records=$(awk "BEGIN { printf \"%d\", 50000 * $seconds }")
for slack in 0 50 100 200 500 1000; do
  "$weir" run --rate 50000 --records "$records" --timer-slack "${slack}us" --quiet \
    --json "$data/slack-$slack.json" > "$data/slack-$slack.txt" 2>&1
done
# ... and with the embedded lookup service answering at one timer expiry what comes due
# within the same slack.
for slack in 200 1000; do
  "$weir" run --rate 50000 --records "$records" --timer-slack "${slack}us" \
    --service-timer-slack "${slack}us" --quiet \
    --json "$data/service-slack-$slack.json" > "$data/service-slack-$slack.txt" 2>&1
done
echo "== lookup cache" >&2
# The main job with Zipf keys, without and with a cache, alternating.
for i in 0 1 2; do
  for side in off on; do
    cache=""
    [ "$side" = on ] && cache="--cache rows=10000"
    "$weir" run --records "$(awk "BEGIN { printf \"%d\", 1000000 * $seconds }")" --key-distribution zipf:1.1 $cache \
      --quiet --json "$data/cache-$side-$i.json" > "$data/cache-$side-$i.txt" 2>&1
  done
done
echo "== redis streams" >&2
# Its own redis-server; without one the report says the section was not measured.
if scripts/redis.sh install >/dev/null 2>&1; then
  "$weir" stream-bench $([ -n "$quick" ] && echo "--rounds 2 --scale 0.2") --json "$data/streams.json" > "$data/streams.md" ||
    echo "the stream benchmark failed; the report leaves it out" >&2
fi
echo "== kafka" >&2
# Its own broker (scripts/kafka.sh); without one the report says the section was not
# measured.
kafka_ours=yes
scripts/kafka.sh status >/dev/null 2>&1 && kafka_ours=""
if kafka_env=$(scripts/kafka.sh start 2>/dev/null); then
  eval "$kafka_env"
  "$weir" kafka-bench --brokers "$WEIR_KAFKA_BROKERS" $([ -n "$quick" ] && echo "--records 100000 --latency-records 10000 --rounds 2") \
    --json "$data/kafka.json" > "$data/kafka.md" || echo "the Kafka benchmark failed; the report leaves it out" >&2
  [ -n "$kafka_ours" ] && { scripts/kafka.sh stop 2>/dev/null || true; }
else
  echo "no Kafka broker (scripts/kafka.sh start failed); the Kafka section is skipped" >&2
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
"$weir" report --data "$data" --out results --commit "$commit"
