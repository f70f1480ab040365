#!/usr/bin/env bash
# Instructions per record of the async operator at latency 0 (unordered, capacity 100),
# counted by valgrind's callgrind: repeatable whatever else the machine is doing.
# Writes results/<date>-async-callgrind-<sha>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
cargo build --release -p weir-bench
records=100000   # 2 M records × --scale 0.05, one round
out=$(mktemp)
valgrind --tool=callgrind --callgrind-out-file="$out" target/release/weir compare async \
  --rounds 1 --scale 0.05 --only "latency 0, capacity 100, unordered" >/dev/null 2>&1
# awk and sed read to the end, so no stage dies of SIGPIPE under pipefail.
weir=$(callgrind_annotate --inclusive=yes "$out" | awk '/weir_immediate \[/ && !found { gsub(",", "", $1); print $1; found = 1 }')
sha=$(git rev-parse --short HEAD 2>/dev/null || echo nogit)
file="results/$(date -u +%Y-%m-%d)-async-callgrind-$sha.txt"
{
  echo "command: scripts/callgrind.sh"
  echo "measured: valgrind --tool=callgrind target/release/weir compare async --rounds 1 --scale 0.05 --only \"latency 0, capacity 100, unordered\""
  echo "weir operator (inclusive, weir_immediate): $weir instructions for $records records"
  echo "per record: $((weir / records)) instructions"
  echo
  echo "top functions by own cost (Weir's and tokio's together):"
  callgrind_annotate "$out" | grep -E '^ *[0-9,]+ ' | sed -n 1,25p
} > "$file"
rm -f "$out"
echo "wrote $file" >&2
