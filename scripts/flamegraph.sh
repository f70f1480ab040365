#!/usr/bin/env bash
# SVG flamegraphs of the main configurations into flamegraphs/, with the in-process
# sampling profiler (pprof), which works where perf is not permitted.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p weir-bench
mkdir -p flamegraphs
for target in main-job async exchange; do
  target/release/weir profile "$target" --out "flamegraphs/$target.svg"
done
