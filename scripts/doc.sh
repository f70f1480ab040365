#!/usr/bin/env bash
# The API documentation of every crate (rustdoc), warnings as errors: a broken link or
# a stale item name fails here, and in the test command, which runs this.
#
#   scripts/doc.sh [--open]
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --workspace --no-deps --quiet "$@"
echo "scripts/doc.sh: the API docs are in target/doc/weir_engine/index.html (and weir_net, weir_bench)"
