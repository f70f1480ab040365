#!/usr/bin/env bash
# Operator faults against exactly-once, in one process and over two:
#
#   1. A damaged newest checkpoint (a flipped byte, a truncated file, a deleted state
#      file, a deleted _metadata): `weir run --restore` must refuse it, naming the file,
#      start nothing, commit nothing, never start over from the beginning; the undamaged
#      checkpoint then restores and the committed output holds every id exactly once.
#      Asked for (--restore-fallback), the older retained checkpoint is restored only
#      where no output was committed after it: the file sink refuses, naming a part file.
#   2. The launcher of `weir run --processes 2` killed alone (kill -9, as an OOM kill
#      does): no process of the job may outlive it by more than the heartbeat timeout,
#      and while the job ran its checkpoint directory held no more than the retained
#      checkpoint plus the ones in flight.
#
#   scripts/faults.sh [--records N] [--keep]
#
# A failed check exits 1 and leaves its directory.
set -euo pipefail
cd "$(dirname "$0")/.."

records=2000000
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --records) records="$2"; shift 2 ;;
    --keep) keep=yes; shift ;;
    *) echo "scripts/faults.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

weir=target/release/weir
cargo build --release --quiet --bin weir
dir=$(mktemp -d /tmp/weir-faults.XXXXXX)
fail() {
  echo "scripts/faults.sh: FAILED: $*; see $dir" >&2
  exit 1
}
# The transport's idle timeout (a peer silent this long is gone), and a margin.
heartbeat_timeout=10

committed_lines() {
  find "$1" -type f -name 'part-*' ! -name '*.*' -exec cat {} + 2>/dev/null | wc -l
}

# Checks the committed output under $1: every id of 0..records exactly once.
exactly_once() {
  local out=$1 lines unique
  lines=$(committed_lines "$out")
  unique=$(find "$out" -type f -name 'part-*' ! -name '*.*' -exec cat {} + | awk '{print $1}' |
    sort -n -u | awk -v n="$records" '$1 >= 0 && $1 < n' | wc -l)
  [ "$lines" -eq "$records" ] && [ "$unique" -eq "$records" ]
}

# The job's arguments into `args`: $1 processes, $2 where, $3 rate, then extra flags.
job_args() {
  local processes=$1 at=$2 rate=$3
  shift 3
  args=(run --records "$records" --rate "$rate" --quiet --checkpoint-interval 150ms
        --checkpoint-dir "$at/chk" --checkpoints-retained 3 --output "$at/out" "$@")
  if [ "$processes" -gt 1 ]; then
    args+=(--processes "$processes")
  else
    args+=(--cores 2 --oversubscribe --no-pin)
  fi
}

# A run killed (-9) once it has completed a few checkpoints, leaving checkpoints and
# committed output to restore from. $1: processes; $2: where.
crashed_run() {
  local processes=$1 at=$2 pid args
  job_args "$processes" "$at" 400000
  setsid "$weir" "${args[@]}" >"$at/crashed.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    sleep 0.1
    if [ "$(grep -c 'checkpoint [0-9]* complete' "$at/crashed.log" || true)" -ge 4 ]; then
      break
    fi
  done
  # The whole process group: the launcher and its processes.
  kill -9 -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  compgen -G "$at/chk/chk-*/_metadata" >/dev/null || fail "no checkpoint completed in $at"
}

# The restore of $2 (processes $1) must be refused naming $3, committing nothing.
refused() {
  local processes=$1 at=$2 names=$3 before after code args
  before=$(committed_lines "$at/out")
  job_args "$processes" "$at" 400000 --restore "$at/chk"
  code=0
  timeout 60 "$weir" "${args[@]}" >"$at/refused.log" 2>&1 || code=$?
  [ "$code" -eq 2 ] || fail "restore of a damaged checkpoint in $at exited $code, not 2 (refused)"
  grep -q "$names" "$at/refused.log" || fail "the refusal in $at does not name $names"
  grep -q "cannot be restored" "$at/refused.log" || fail "the refusal in $at does not say why"
  if grep -q "starting from the beginning\|restart 1 of" "$at/refused.log"; then
    fail "a damaged checkpoint in $at led to a fresh start or a restart"
  fi
  after=$(committed_lines "$at/out")
  [ "$before" -eq "$after" ] || fail "the refused restore in $at committed output ($before -> $after lines)"
  [ -d "$at/chk/$newest_name" ] || fail "the refused restore removed $newest_name in $at"
}

# Restores $2 (processes $1) whole and checks the committed output: one process as a
# supervisor starts it (--resume), two with --restore.
restores() {
  local processes=$1 at=$2 args
  if [ "$processes" -eq 1 ]; then
    job_args "$processes" "$at" 2000000 --resume
  else
    job_args "$processes" "$at" 2000000 --restore "$at/chk"
  fi
  timeout 120 "$weir" "${args[@]}" >"$at/restored.log" 2>&1 || fail "the restore of $at failed"
  grep -q "committed output .*0 lost / 0 duplicated" "$at/restored.log" ||
    fail "the summary of $at does not report the committed output whole"
  exactly_once "$at/out" || fail "the committed output of $at is not every id exactly once"
}

for processes in 1 2; do
  base="$dir/p$processes"
  mkdir -p "$base"
  crashed_run "$processes" "$base"
  newest=$(find "$base/chk" -maxdepth 2 -name _metadata | sort -V | tail -1 | xargs dirname)
  newest_name=$(basename "$newest")
  state=$(find "$newest" -name 's0-0-of-*.state' | head -1)
  [ -n "$state" ] || fail "no source state file in $newest"
  for damage in flip truncate delete metadata; do
    at="$base-$damage"
    cp -a "$base" "$at"
    target="${state/$base/$at}"
    case "$damage" in
      flip)
        size=$(stat -c %s "$target")
        printf '\xff' | dd of="$target" bs=1 seek=$((size / 2)) conv=notrunc status=none
        names=$(basename "$target") ;;
      truncate)
        truncate -s -5 "$target"
        names=$(basename "$target") ;;
      delete)
        rm "$target"
        names=$(basename "$target") ;;
      metadata)
        rm "$(dirname "$target")/_metadata"
        names=_metadata ;;
    esac
    refused "$processes" "$at" "$names"
    echo "scripts/faults.sh: $processes process(es): a $damage of the newest checkpoint is refused by name, nothing committed"
  done
  if [ "$processes" -eq 1 ]; then
    # Asked to fall back past the damaged newest checkpoint, the older one's restore
    # would write again the part files the newest committed: the file sink refuses,
    # naming one; nothing committed is removed, the damaged checkpoint is kept.
    at="$base-fallback"
    cp -a "$base" "$at"
    target="${state/$base/$at}"
    size=$(stat -c %s "$target")
    printf '\xff' | dd of="$target" bs=1 seek=$((size / 2)) conv=notrunc status=none
    before=$(committed_lines "$at/out")
    job_args 1 "$at" 400000 --resume --restore-fallback
    code=0
    timeout 60 "$weir" "${args[@]}" >"$at/fallback.log" 2>&1 || code=$?
    [ "$code" -ne 0 ] || fail "a fallback over output committed after it succeeded in $at"
    grep -q "passing over .*$newest_name" "$at/fallback.log" ||
      fail "the fallback in $at does not name the checkpoint it passed over"
    grep -q "part-[0-9]*-[0-9]* is corrupt: it was committed by a checkpoint newer" "$at/fallback.log" ||
      fail "the fallback in $at was not refused naming a part file committed after it"
    [ "$(committed_lines "$at/out")" -eq "$before" ] || fail "the refused fallback in $at changed the committed output"
    [ -d "$at/chk/$newest_name" ] || fail "the fallback in $at removed $newest_name"
    echo "scripts/faults.sh: 1 process: a fallback past the damaged newest checkpoint is refused, naming a part file it would write again"
  fi
  restores "$processes" "$base"
  echo "scripts/faults.sh: $processes process(es): the undamaged checkpoint restores; committed output exactly once"
done

# The launcher killed alone.
at="$dir/launcher"
mkdir -p "$at"
"$weir" run --processes 2 --records 100000000 --rate 400000 --quiet --checkpoint-interval 100ms \
  --checkpoint-dir "$at/chk" --output "$at/out" >"$at/run.log" 2>&1 &
launcher=$!
most=0
for _ in $(seq 1 40); do
  sleep 0.05
  n=$(find "$at/chk" -maxdepth 1 -name 'chk-*' -type d 2>/dev/null | wc -l)
  [ "$n" -gt "$most" ] && most=$n
done
mapfile -t children < <(pgrep -P "$launcher" || true)
[ "${#children[@]}" -eq 2 ] || fail "the launcher has ${#children[@]} processes, not 2"
kill -9 "$launcher"
{ wait "$launcher"; } 2>/dev/null || true
gone=""
for _ in $(seq 1 $((heartbeat_timeout * 10))); do
  alive=0
  for child in "${children[@]}"; do
    kill -0 "$child" 2>/dev/null && alive=$((alive + 1))
  done
  if [ "$alive" -eq 0 ]; then
    gone=yes
    break
  fi
  sleep 0.1
done
[ -n "$gone" ] || fail "processes of the job outlived their launcher by ${heartbeat_timeout} s"
# Retained (1), the one in flight, and the one being completed while the next starts.
[ "$most" -le 3 ] || fail "the checkpoint directory held $most checkpoints at once (at most 3)"
after=$(find "$at/chk" -maxdepth 1 -name 'chk-*' -type d | wc -l)
sleep 1
later=$(find "$at/chk" -maxdepth 1 -name 'chk-*' -type d | wc -l)
[ "$after" -eq "$later" ] || fail "checkpoints were still written after the processes were gone"
echo "scripts/faults.sh: the launcher killed alone: its processes are gone; at most $most checkpoint directories at once"

if [ -z "$keep" ]; then
  rm -rf "$dir"
else
  echo "scripts/faults.sh: kept $dir"
fi
echo "scripts/faults.sh: passed"
