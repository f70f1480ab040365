#!/usr/bin/env bash
# Kill -9 chaos against the Kafka connectors: the example job of net/examples/kafka_enrich.rs
# (orders from a topic, enriched through the async operator, running totals per user,
# written to a topic exactly once) is killed with SIGKILL at random moments and started
# again each time with the same command (it resumes from its newest completed
# checkpoint, or starts fresh if none completed: some kills come before the first).
# The last run finishes, and the check counts every order's result in the committed
# transactions: each order exactly once, each user's running totals the sums of their
# orders. With --pause-broker, one run also sees the broker stop answering for a few
# seconds (SIGSTOP, then SIGCONT).
#
#   scripts/kafka-chaos.sh [--kills N] [--orders N] [--pause-broker] [--keep]
#
# Defaults: 10 kills, 200000 orders. A broker is started with scripts/kafka.sh unless
# WEIR_KAFKA_BROKERS names one. A failed check exits 1 and leaves the directory.
#
# What the broker cannot show: its read_committed fetches are not to be trusted, so the
# check reads every message and counts those of committed transactions, known by the
# tag each message carries and the commit log the sink appends to (see the example's
# docs); the broker's own hiding of aborted transactions is not tested here.
set -euo pipefail
cd "$(dirname "$0")/.."

kills=10
orders=200000
pause_broker=""
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kills) kills="$2"; shift 2 ;;
    --orders) orders="$2"; shift 2 ;;
    --pause-broker) pause_broker=yes; shift ;;
    --keep) keep=yes; shift ;;
    *) echo "scripts/kafka-chaos.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

started_broker=""
if [ -z "${WEIR_KAFKA_BROKERS:-}" ]; then
  already=""
  if scripts/kafka.sh status >/dev/null 2>&1; then
    already=yes
  fi
  eval "$(scripts/kafka.sh start)"
  [ -n "$already" ] || started_broker=yes
fi
cleanup() {
  if [ -n "$started_broker" ]; then scripts/kafka.sh stop || true; fi
}
trap cleanup EXIT

cargo build --release --quiet -p weir-net --example kafka_enrich
example=target/release/examples/kafka_enrich
dir=$(mktemp -d /tmp/weir-kafka-chaos.XXXXXX)
log="$dir/runs.log"
stamp=$(date +%s%N)
topics=(--brokers "$WEIR_KAFKA_BROKERS" --in "weir-chaos-orders-$stamp" --out "weir-chaos-enriched-$stamp")
# Throttled by the lookups (16 in flight per subtask, 1 ms each), so that the job runs
# for several seconds and every kill comes before it could finish.
job=(run "${topics[@]}" --checkpoints "$dir/chk" --commit-log "$dir/commits"
     --interval 200 --capacity 4 --latency-us 1000 --transactional-id-prefix "weir-chaos-$stamp")

"$example" produce "${topics[@]}" --orders "$orders" >>"$log" 2>&1

broker_pid=""
if [ -n "$pause_broker" ]; then
  broker_pid=$(cat "${TMPDIR:-/tmp}/weir-kafka-${WEIR_KAFKA_PORT:-19092}/tansu.pid" 2>/dev/null || true)
  [ -n "$broker_pid" ] || { echo "scripts/kafka-chaos.sh: --pause-broker needs a broker started by scripts/kafka.sh" >&2; exit 2; }
fi

killed=0
before_first=0
finished_early=0
paused=0
for round in $(seq "$kills"); do
  "$example" "${job[@]}" >>"$log" 2>&1 &
  pid=$!
  # 0.05 .. 1.65 s: some kills before the first checkpoint completes, some during a
  # checkpoint, some between a checkpoint's completion and its transactions' commit.
  sleep "$((RANDOM % 2)).$(printf '%03d' $((50 + RANDOM % 600)))"
  if [ -n "$pause_broker" ] && [ "$round" -eq 2 ]; then
    kill -STOP "$broker_pid"
    sleep 3
    kill -CONT "$broker_pid"
    paused=1
    sleep 0.5
  fi
  # Whether a checkpoint had completed yet (the restore point records it).
  completed_yet=""
  [ -f "$dir/chk/_completed" ] && completed_yet=yes
  if kill -9 "$pid" 2>/dev/null; then
    killed=$((killed + 1))
    [ -n "$completed_yet" ] || before_first=$((before_first + 1))
  else
    finished_early=$((finished_early + 1))
  fi
  wait "$pid" 2>/dev/null || true
done

# The last run, to the end of the input.
if ! timeout 600 "$example" "${job[@]}" >>"$log" 2>&1; then
  echo "scripts/kafka-chaos.sh: the last run failed; see $log" >&2
  tail -20 "$log" >&2
  exit 1
fi

if "$example" check "${topics[@]}" --commit-log "$dir/commits" >>"$log" 2>&1; then
  verdict=passed
else
  verdict=FAILED
fi
commits=$(wc -l <"$dir/commits" 2>/dev/null || echo 0)
echo "kafka chaos: $verdict: $orders orders, $killed kills ($before_first before the first checkpoint completed, $finished_early runs ended before their kill), broker paused $paused time(s), $commits commits logged"
# Copies of transactions a kill cut between pre-commit and commit (aborted, then sent
# again by the next attempt) show in the check's line as messages in aborted copies.
grep "kafka_enrich: .*exactly once\|FAILED" "$log" | tail -5
if [ "$verdict" != passed ]; then
  echo "scripts/kafka-chaos.sh: see $log" >&2
  exit 1
fi
if [ -z "$keep" ]; then
  rm -rf "$dir"
else
  echo "kept $dir"
fi
