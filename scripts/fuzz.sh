#!/usr/bin/env bash
# Fuzzes the decoders that read bytes from outside the process (net/fuzz):
#
#   frame_decoder     the transport's frames (a peer process's bytes)
#   exchange_gate     an input gate over arbitrary channel bytes: record framing, events,
#                     records spanning buffers, the record codec
#   lookup_response   the lookup client's response decoder (the lookup service's bytes)
#   redis_reply       Redis replies as the client reads them, RESP2 and RESP3 (the
#                     nesting check, then the protocol's decoder)
#
#   scripts/fuzz.sh [all|TARGET] [SECONDS]      (default: all, 60 seconds each)
#   scripts/fuzz.sh SECONDS                     (all targets, SECONDS each)
#
# Needs the nightly toolchain (added with rustup if missing) and cargo-fuzz (installed
# from crates.io if missing). Each target starts from its committed seed corpus in
# net/fuzz/corpus/TARGET and adds what it finds to a copy under target/fuzz-corpus, so
# the committed seeds stay small. A crash leaves its input in net/fuzz/artifacts/TARGET/
# and stops the script with a non-zero status.
set -euo pipefail
targets_all=(frame_decoder exchange_gate lookup_response redis_reply)
which="${1:-all}"
seconds="${2:-60}"
if [[ "$which" =~ ^[0-9]+$ ]]; then
    seconds="$which"
    which=all
fi
if [[ "$which" == all ]]; then
    targets=("${targets_all[@]}")
else
    targets=("$which")
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cd "$root/net"
for target in "${targets[@]}"; do
    if [[ ! -d "$root/net/fuzz/corpus/$target" ]]; then
        echo "scripts/fuzz.sh: no target '$target' (one of: ${targets_all[*]}, all)" >&2
        exit 2
    fi
    work="$root/target/fuzz-corpus/$target"
    mkdir -p "$work"
    cp -n "$root"/net/fuzz/corpus/"$target"/* "$work"/ 2>/dev/null || true
    echo "== $target for ${seconds}s" >&2
    cargo +nightly fuzz run "$target" "$work" -- -max_total_time="$seconds" -max_len=4096
done
