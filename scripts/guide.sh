#!/usr/bin/env bash
# Builds the user guide (guide/, mdBook) into target/guide, installing mdBook with
# cargo if it is missing. The guide's Rust blocks are compiled and run by the test
# command (doc tests of weir-net) and its links checked there; this makes the HTML.
#
#   scripts/guide.sh [--serve]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mdbook >/dev/null 2>&1; then
  echo "scripts/guide.sh: installing mdbook (cargo install --locked mdbook)" >&2
  cargo install --locked --quiet mdbook
fi
if [ "${1:-}" = "--serve" ]; then
  exec mdbook serve guide --dest-dir ../target/guide
fi
mdbook build guide --dest-dir ../target/guide
echo "scripts/guide.sh: open target/guide/index.html"
