#!/usr/bin/env bash
# Explores every loom model in loom-tests/ (ring, mailbox, doorbell, pool, shared
# buffer, buffer consumer, ...).
# The preemption bound keeps a full run within a few minutes on 2 cores; raise it with
# LOOM_MAX_PREEMPTIONS=3 for a deeper (much longer) search.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg loom -C debug-assertions"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
# A separate target dir: the cfg changes every crate's build.
exec cargo test -p weir-loom-tests --release --target-dir target/loom "$@"
