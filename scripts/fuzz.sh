#!/usr/bin/env bash
# Fuzzes the transport's frame decoder (net/fuzz) for a given time.
#
#   scripts/fuzz.sh [SECONDS]      (default 60)
#
# Needs the nightly toolchain (added with rustup if missing) and cargo-fuzz (installed
# from crates.io if missing). Starts from the committed seed corpus in
# net/fuzz/corpus/frame_decoder and adds what it finds to a copy under target/fuzz-corpus,
# so the committed seeds stay small. A crash leaves its input in net/fuzz/artifacts/.
set -euo pipefail
seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz
fi
work="$root/target/fuzz-corpus/frame_decoder"
mkdir -p "$work"
cp -n "$root"/net/fuzz/corpus/frame_decoder/* "$work"/ 2>/dev/null || true
cd "$root/net"
exec cargo +nightly fuzz run frame_decoder "$work" -- -max_total_time="$seconds" -max_len=4096
