#!/usr/bin/env bash
# The test command: unit, integration and property tests of every crate, each
# benchmark run once (so benches never rot), then the loom models.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
WEIR_BENCH_QUICK=1 cargo test -p weir-bench --benches
scripts/loom.sh
