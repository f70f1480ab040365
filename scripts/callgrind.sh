#!/usr/bin/env bash
# Instructions per record of the async operator, counted by valgrind's callgrind:
# repeatable whatever else the machine is doing. For every output mode (ordered,
# unordered, keyed-ordered), capacity 100, two ways a call completes:
#   - inline: inside `invoke` (latency 0, `weir compare async` "latency 0" rows);
#   - batched: later, on the operator's thread, the calls of a full operator together
#     ("completed in batches on the task's thread" rows: the path of calls that come
#     back through the completion queue, as an I/O client's do).
# Only the Weir workload function is counted (callgrind --toggle-collect), so the
# figure is the operator plus the workload's own loop (a counter sink; for batched, a
# Vec of pending handles).
# Writes results/<date>-async-callgrind-<sha>.txt; compare files over commits to see a
# regression.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build --release -p weir-bench
scale=0.05   # 2 M records × 0.05 = 100 000 inline; 1 M × 0.05 = 50 000 batched
sha=$(git rev-parse --short HEAD 2>/dev/null || echo nogit)
file="results/$(date -u +%Y-%m-%d)-async-callgrind-$sha.txt"
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# count EXPERIMENT FUNCTION RECORDS: prints instructions per record.
count() {
  valgrind --tool=callgrind --toggle-collect="*$2*" --callgrind-out-file="$out" \
    target/release/weir compare async --rounds 1 --scale "$scale" --only "$1" \
    --implementation weir >/dev/null 2>&1
  # awk reads to the end, so no stage dies of SIGPIPE under pipefail.
  local total
  total=$(callgrind_annotate "$out" | awk '/PROGRAM TOTALS/ && !found { gsub(",", "", $1); print $1; found = 1 }')
  echo $((total / $3))
}

{
  echo "command: scripts/callgrind.sh"
  echo "measured: valgrind --tool=callgrind --toggle-collect=<workload> target/release/weir compare async --rounds 1 --scale $scale --only <experiment> --implementation weir"
  echo
  echo "| mode | inline (latency 0) | batched (completed later on the task's thread) |"
  echo "|---|---:|---:|"
  for mode in ordered unordered keyed-ordered; do
    inline=$(count "latency 0, capacity 100, $mode" weir_immediate 100000)
    batched=$(count "completed in batches on the task's thread, capacity 100, $mode" weir_batched 50000)
    echo "| $mode | $inline | $batched |"
  done
  echo
  echo "instructions per record (workload function inclusive, divided by its records)"
} > "$file"
cat "$file"
echo "wrote $file" >&2
