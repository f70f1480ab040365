#!/usr/bin/env bash
# Instructions per record of the rows the report's targets table compares, for Weir
# and for the peer or reference of each row, counted by valgrind's callgrind. Unlike
# time per record, an instruction count does not move with this VM's host, so it shows
# where a cost is even when the timings swing.
#
# Each row is one `weir compare` implementation run alone (`--only EXPERIMENT
# --implementation NAME --rounds 1`) under callgrind, twice, at two scales; its figure
# is the difference of the two totals over the difference of their records
# (`ops_per_turn` in the JSON), so start-up, thread spawning and teardown cancel out.
# Every thread of the process is counted: for a row whose work crosses cores (the
# exchange) that is the producer and the consumer together, the way a record costs
# both. Callgrind runs the threads one at a time, so a side that spins while the other
# is descheduled counts its spins too: the rows here are those whose sides park (a
# futex) rather than spin when they wait, and rows of spinning rings are left out.
#
# Writes results/report/instructions.json (read by `weir report` for its targets
# table) and results/<date>-instructions-<sha>.md.
#
# Usage: scripts/instructions.sh [--quick]   (--quick: smaller runs, for a look)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
small=0.02
if [[ "${1:-}" == "--quick" ]]; then small=0.005; fi
large=$(python3 -c "print($small * 2)")
bin=target/measure/weir
[[ -x "$bin" ]] || cargo build --profile measure -p weir-bench
# The commit counted; "-dirty" when the code differs from it (results/, which the report
# run rewrites before it comes here, does not count).
sha=$(git rev-parse --short HEAD 2>/dev/null || echo nogit)
if [[ "$sha" != nogit ]] && ! git diff --quiet HEAD -- . ':(exclude)results'; then
  sha="$sha-dirty"
fi
json=results/report/instructions.json
md="results/$(date -u +%Y-%m-%d)-instructions-$sha.md"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p results/report

# suite | experiment (as `--only` takes it) | implementation (exact name or unique part)
rows=(
  "async|async latency 0, capacity 100, ordered|weir ordered (inline"
  "async|async latency 0, capacity 100, ordered|weir ordered in runs"
  "async|async latency 0, capacity 100, ordered|weir ordered ready, one at a time"
  "async|async latency 0, capacity 100, ordered|weir ordered ready, in runs"
  "async|async latency 0, capacity 100, ordered|futures-buffered buffered_ordered"
  "async|async latency 0, capacity 100, ordered|value-or-future fast path, ordered"
  "async|async latency 0, capacity 100, unordered|weir unordered (inline"
  "async|async latency 0, capacity 100, unordered|weir unordered in runs"
  "async|async latency 0, capacity 100, unordered|weir unordered ready, one at a time"
  "async|async latency 0, capacity 100, unordered|weir unordered ready, in runs"
  "async|async latency 0, capacity 100, unordered|futures-buffered buffered_unordered"
  "async|async latency 0, capacity 100, unordered|value-or-future fast path, unordered"
  "exchange|exchange 1→1, 8-byte records, round robin, timeout 100 ms|weir exchange, runs"
  "exchange|exchange 1→1, 8-byte records, round robin, timeout 100 ms|wire-format reference: copy into segments, decode on the other core"
  "exchange|exchange 1→1, 100-byte records, round robin, timeout 100 ms|weir exchange, runs"
  "exchange|exchange 1→1, 100-byte records, round robin, timeout 100 ms|crossbeam_channel, Vec of 32 KiB per message"
  "exchange|exchange 1→1, 1000-byte records, round robin, timeout 100 ms|weir exchange, runs read in place"
  "exchange|exchange 1→1, 1000-byte records, round robin, timeout 100 ms|crossbeam_channel, Vec of 32 KiB per message"
  "lookup|lookup latency 0, 256 in flight|weir epoll"
  "lookup|lookup latency 0, 256 in flight|tokio pipelined loop"
)

# run SUITE EXPERIMENT IMPLEMENTATION SCALE TAG: prints "TOTAL OPS IMPLEMENTATION".
run() {
  local out="$work/$5.out" js="$work/$5.json"
  valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$bin" compare "$1" --rounds 1 --scale "$4" --only "$2" --implementation "$3" \
    --json "$js" >/dev/null 2>"$work/$5.err" || { cat "$work/$5.err" >&2; return 1; }
  # The out file's own totals line (every thread, every function).
  local total
  total=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
  python3 - "$js" "$total" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
assert len(rows) == 1, f"expected one row, got {[r['implementation'] for r in rows]}"
print(sys.argv[2], rows[0]["ops_per_turn"], rows[0]["implementation"], sep="\t")
EOF
}

results="$work/results.tsv"
: > "$results"
i=0
for row in "${rows[@]}"; do
  IFS='|' read -r suite experiment implementation <<<"$row"
  i=$((i + 1))
  IFS=$'\t' read -r total_a ops_a name < <(run "$suite" "$experiment" "$implementation" "$small" "$i-a")
  IFS=$'\t' read -r total_b ops_b _ < <(run "$suite" "$experiment" "$implementation" "$large" "$i-b")
  per=$(python3 -c "print(round(($total_b - $total_a) / ($ops_b - $ops_a), 1))")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$suite" "$experiment" "$name" "$per" \
    "$ops_a" "$ops_b" "$total_a" "$total_b" >> "$results"
  echo "$experiment | $name: $per instructions per record" >&2
done

python3 - "$results" "$json" "$md" "$sha" "$small" "$large" <<'EOF'
import json, sys
results, json_path, md_path, sha, small, large = sys.argv[1:]
rows = []
for line in open(results):
    suite, experiment, implementation, per, ops_a, ops_b, total_a, total_b = line.rstrip("\n").split("\t")
    rows.append({
        "suite": suite,
        "experiment": experiment,
        "implementation": implementation,
        "instructions_per_op": float(per),
        "ops": [int(ops_a), int(ops_b)],
        "instructions": [int(total_a), int(total_b)],
    })
command = "scripts/instructions.sh"
measured = (f"valgrind --tool=callgrind target/measure/weir compare <suite> --rounds 1 "
            f"--scale {small} and {large} --only <experiment> --implementation <name>; "
            "(total at the larger scale − total at the smaller) ÷ (records − records)")
json.dump({"command": command, "measured": measured, "commit": sha, "results": rows},
          open(json_path, "w"), indent=2, ensure_ascii=False)
with open(md_path, "w") as md:
    md.write(f"# Instructions per record (callgrind), commit {sha}\n\n")
    md.write(f"Command: `{command}`. Each row: {measured}. Every thread of the process counted.\n\n")
    md.write("| experiment | implementation | instructions per record |\n|---|---|---:|\n")
    for r in rows:
        md.write(f"| {r['experiment']} | {r['implementation']} | {r['instructions_per_op']} |\n")
print(open(md_path).read())
print(f"wrote {json_path} and {md_path}", file=sys.stderr)
EOF
