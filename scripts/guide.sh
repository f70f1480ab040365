#!/usr/bin/env bash
# Builds the user guide (guide/, mdBook) into target/guide, installing mdBook with
# cargo if it is missing (the pinned release below); CI runs it after the tests. The guide's Rust blocks are compiled and run by the test
# command (doc tests of weir-net) and its links checked there; this makes the HTML.
#
#   scripts/guide.sh [--serve]
set -euo pipefail
cd "$(dirname "$0")/.."
# The mdBook release the guide is built and checked with.
version=0.5.4
if ! mdbook --version 2>/dev/null | grep -q "v$version"; then
  echo "scripts/guide.sh: installing mdbook $version (cargo install --locked mdbook)" >&2
  cargo install --locked --quiet mdbook --version "$version"
fi
dest="$PWD/target/guide"
if [ "${1:-}" = "--serve" ]; then
  exec mdbook serve guide --dest-dir "$dest"
fi
mdbook build guide --dest-dir "$dest" 2>&1 | tee target/guide.log
# mdBook reports a chapter it cannot render (a missing file, a bad include) as an error
# or a warning without failing: either fails here.
if grep -E "^\s*(\[?(ERROR|WARN)|.*(ERROR|WARN) )" target/guide.log; then
  echo "scripts/guide.sh: mdbook reported the problems above" >&2
  exit 1
fi
test -f "$dest/index.html"
echo "scripts/guide.sh: open target/guide/index.html"
