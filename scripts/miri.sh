#!/usr/bin/env bash
# Runs the engine's tests that exercise its unsafe modules under Miri, which checks every
# pointer access, aliasing rule and data race: the mail ring (ring.rs), the segment pool
# and its buffers (exchange/pool.rs, exchange/buffer.rs: builders and consumers sharing a
# segment), the async operator's result futures (async_io/future.rs), and the slab.
# The other `unsafe` blocks in the workspace are system calls (io_uring, setsockopt,
# prctl, process spawning in net/ and runtime/), which Miri cannot execute; the tests
# run them against the real kernel.
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
cargo +nightly miri test -p weir-engine --lib -- ring slab exchange async_io
cargo +nightly miri test -p weir-engine --test ring_model --test slab_model --test pool_recycle \
  --test mailbox_wakeup --test exchange_roundtrip --test exchange_read_while_written \
  --test exchange_fan_out --test async_scenarios --test async_properties
