#!/usr/bin/env bash
# Interleaved Weir-vs-peer comparisons, repeated over several processes, written to
# results/<date>-<suite>-<sha>.{md,json} with the machine and the exact command.
#
#   scripts/bench.sh                 ring, pool, async and exchange, 3 processes × 7 rounds each
#   scripts/bench.sh pool            one suite
#   PROCESSES=5 ROUNDS=9 scripts/bench.sh
#
# Run it with nothing else heavy on the machine: cross-core figures on a VM swing 3-5x.
set -euo pipefail
cd "$(dirname "$0")/.."
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(ring pool async exchange)
processes="${PROCESSES:-3}"
rounds="${ROUNDS:-7}"
scale="${SCALE:-1}"
cargo build --release -p weir-bench
date=$(date -u +%Y-%m-%d)
sha=$(git rev-parse --short HEAD 2>/dev/null || echo nogit)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)
[ -z "$dirty" ] || sha="$sha-dirty"
mkdir -p results
for suite in "${suites[@]}"; do
  out="results/$date-$suite-$sha"
  {
    echo "# weir compare $suite"
    echo
    echo "- command: \`PROCESSES=$processes ROUNDS=$rounds SCALE=$scale scripts/bench.sh $suite\`"
    echo "- each process: \`target/release/weir compare $suite --rounds $rounds --scale $scale\`"
    echo "- date: $date, commit: $sha"
    echo "- cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), cores: $(nproc), kernel: $(uname -r)"
  } > "$out.md"
  for p in $(seq 1 "$processes"); do
    echo "== $suite, process $p of $processes" >&2
    {
      echo
      echo "## process $p of $processes"
      target/release/weir compare "$suite" --rounds "$rounds" --scale "$scale" --json "$out-p$p.json" 2>/dev/null
    } >> "$out.md"
  done
  echo "wrote $out.md" >&2
done
