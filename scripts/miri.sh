#!/usr/bin/env bash
# Runs the engine's tests that exercise its unsafe modules (ring, slab, segment pool, exchange)
# under Miri, which checks every pointer access, aliasing rule and data race.
# Needs the nightly toolchain with the miri component (installed here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  rustup component add miri rust-src --toolchain nightly
fi
# Property tests shrink their case counts under Miri; stress tests size themselves with
# cfg!(miri).
export PROPTEST_CASES="${PROPTEST_CASES:-8}"
# Isolation off: proptest reads the working directory, the mailbox test reads the clock.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-strict-provenance -Zmiri-disable-isolation}"
cargo +nightly miri test -p weir-engine --lib -- ring slab exchange
cargo +nightly miri test -p weir-engine --test ring_model --test slab_model --test pool_recycle --test mailbox_wakeup --test exchange_roundtrip --test exchange_read_while_written
