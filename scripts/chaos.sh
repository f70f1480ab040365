#!/usr/bin/env bash
# Kill -9 chaos: runs the main job with exactly-once part files (--output) and
# checkpoints every 200 ms, kills it with SIGKILL at random moments (during a
# checkpoint write as well as between them), restarts it from its checkpoint directory
# each time (`--restore`, the newest complete and valid checkpoint), lets the last
# run finish, and checks that the committed files hold every record id exactly once.
#
#   scripts/chaos.sh [--kills N] [--records N] [--rate R] [--unaligned] [--processes 2] [--keep]
#
# Defaults: 20 kills, 1000000 records at 100000 records/s over 2 workers (about 10 s of
# work, so that every kill comes before the job could finish). With --processes 2 the
# job runs over two processes under `weir run --processes 2`, which supervises them: each
# kill hits one of the two (at random), and the launcher restarts both from the latest
# checkpoint. The test command runs it with a few kills; a failed check exits 1 and
# leaves the directory.
set -euo pipefail
cd "$(dirname "$0")/.."

kills=20
records=1000000
rate=100000
alignment=()
processes=1
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kills) kills="$2"; shift 2 ;;
    --records) records="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --unaligned) alignment=(--unaligned); shift ;;
    --processes) processes="$2"; shift 2 ;;
    --keep) keep=yes; shift ;;
    *) echo "scripts/chaos.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

weir=target/release/weir
cargo build --release --quiet --bin weir
dir=$(mktemp -d /tmp/weir-chaos.XXXXXX)
log="$dir/runs.log"
job=(run --records "$records" --rate "$rate" --quiet
     --checkpoint-interval 200ms --checkpoint-dir "$dir/chk" "${alignment[@]}"
     --output "$dir/out")

# A random pause of 50..650 ms: some kills land while a checkpoint is written (every
# 200 ms).
pause() {
  sleep "0.$(printf '%03d' $((50 + RANDOM % 600)))"
}

killed=0
restores=0
finished_early=0
if [ "$processes" -eq 1 ]; then
  job+=(--cores 2 --oversubscribe --no-pin)
  # A run from the newest checkpoint if one completed, else from the start.
  start_run() {
    if compgen -G "$dir/chk/chk-*/_metadata" >/dev/null; then
      restores=$((restores + 1))
      "$weir" "${job[@]}" --restore "$dir/chk" >>"$log" 2>&1 &
    else
      "$weir" "${job[@]}" >>"$log" 2>&1 &
    fi
    pid=$!
  }
  for ((k = 1; k <= kills; k++)); do
    echo "== run $k" >>"$log"
    start_run
    pause
    if kill -9 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || true
      killed=$((killed + 1))
    else
      # It finished first: start over from scratch on the next round.
      wait "$pid" || { echo "scripts/chaos.sh: run $k failed; see $log" >&2; exit 1; }
      finished_early=$((finished_early + 1))
      rm -rf "$dir/chk" "$dir/out"
    fi
  done
  echo "== last run, to the end" >>"$log"
  start_run
  if ! wait "$pid"; then
    echo "scripts/chaos.sh: the last run failed; see $log" >&2
    exit 1
  fi
else
  # One launcher for the whole run: it restarts its processes after each kill.
  "$weir" "${job[@]}" --processes "$processes" --restart-strategy "fixed-delay:$((kills + 10)):0s" \
    >>"$log" 2>&1 &
  launcher=$!
  for ((k = 1; k <= kills; k++)); do
    pause
    # The launcher's children: the job's processes of the current attempt.
    mapfile -t children < <(pgrep -P "$launcher" || true)
    if [ "${#children[@]}" -eq 0 ]; then
      break
    fi
    victim=${children[$((RANDOM % ${#children[@]}))]}
    if kill -9 "$victim" 2>/dev/null; then
      killed=$((killed + 1))
      echo "== killed process $victim (kill $k)" >>"$log"
    fi
    # Let the launcher notice and start the next attempt.
    sleep 0.2
  done
  if ! wait "$launcher"; then
    echo "scripts/chaos.sh: the job failed; see $log" >&2
    exit 1
  fi
  restores=$(grep -c "restart [0-9]* of every process in .* from checkpoint" "$log" || true)
fi

# Committed files only (no .pending or .inprogress suffix): every id once.
committed=$(find "$dir/out" -type f -name 'part-*' ! -name '*.*' | sort)
lines=$(cat $committed /dev/null | wc -l)
unique=$(cat $committed /dev/null | awk '{print $1}' | sort -n -u | wc -l)
in_range=$(cat $committed /dev/null | awk -v n="$records" '$1 >= 0 && $1 < n' | wc -l)
echo "scripts/chaos.sh: $processes process(es), $killed kills (-9), $finished_early runs finished before their kill, $restores restarts from a checkpoint; committed $lines lines, $unique distinct ids of $records"
if [ "$lines" -ne "$records" ] || [ "$unique" -ne "$records" ] || [ "$in_range" -ne "$records" ]; then
  echo "scripts/chaos.sh: FAILED: the committed output does not hold every id exactly once; see $dir" >&2
  exit 1
fi
if [ -z "$keep" ]; then
  rm -rf "$dir"
else
  echo "scripts/chaos.sh: kept $dir"
fi
echo "scripts/chaos.sh: passed: every record exactly once"
