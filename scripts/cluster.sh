#!/usr/bin/env bash
# Runs the main job over N processes, each in its own network namespace joined to the
# others by veth pairs on a bridge, as hosts on a LAN would be (optionally with a
# `tc netem` delay on every link), then sums up their reports.
#
#   scripts/cluster.sh [-n N] [-d DELAY] [-x SECONDS] [-o DIR] [-- weir run options...]
#
#   -n N       processes (default 2)
#   -d DELAY   one-way delay added to every host's link with tc netem (e.g. 200us, 1ms)
#   -x SECONDS after SECONDS, cut the last host off the network: its link leaves the
#              bridge, so every packet to and from it is dropped, as by a failed switch
#              port (nothing is reset or refused). The other processes must then fail
#              within the transport's idle timeout (10 s), naming the silent peer; the
#              script checks that they do, and exits 0 only if so.
#   -o DIR     where the per-process JSON reports and the summary go
#              (default results/cluster)
#
# Needs root (ip netns, tc). Each process runs `weir run --process I --peers ...` with
# its share of the cores and its own embedded lookup service; the summary is
# `weir summarize`. Namespaces, links and the bridge are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

processes=2
delay=""
out=results/cluster
cut=""
while getopts "n:d:x:o:h" opt; do
  case "$opt" in
    n) processes=$OPTARG ;;
    d) delay=$OPTARG ;;
    x) cut=$OPTARG ;;
    o) out=$OPTARG ;;
    h) sed -n '2,21p' "$0"; exit 0 ;;
    *) sed -n '2,21p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ "${1:-}" == "--" ]] && shift

if [[ $(id -u) -ne 0 ]]; then
  echo "error: scripts/cluster.sh needs root for network namespaces (run it with sudo)" >&2
  exit 2
fi
if ! [[ "$processes" =~ ^[0-9]+$ ]] || (( processes < 2 || processes > 200 )); then
  echo "error: -n takes a number of processes from 2 to 200" >&2
  exit 2
fi
for tool in ip tc; do
  command -v "$tool" >/dev/null || { echo "error: '$tool' is missing (apt-get install -y iproute2)" >&2; exit 2; }
done

cargo build --release -p weir-bench >&2
weir="$PWD/target/release/weir"
mkdir -p "$out"
rm -f "$out"/process-*.json

tag="weir$$"
bridge="${tag}br"
cleanup() {
  for ((i = 0; i < processes; i++)); do
    ip netns del "${tag}h$i" 2>/dev/null || true
    ip link del "${tag}v$i" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}
trap cleanup EXIT

ip link add "$bridge" type bridge
ip link set "$bridge" up
peers=""
for ((i = 0; i < processes; i++)); do
  ns="${tag}h$i"
  ip netns add "$ns"
  ip link add "${tag}v$i" type veth peer name eth0 netns "$ns"
  ip link set "${tag}v$i" master "$bridge" up
  ip -n "$ns" addr add "10.77.$((i / 250)).$((i % 250 + 1))/16" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  if [[ -n "$delay" ]]; then
    if ! tc -n "$ns" qdisc add dev eth0 root netem delay "$delay" 2>/dev/null; then
      echo "error: tc netem is not available in this kernel (module sch_netem); run without -d" >&2
      exit 2
    fi
  fi
  peers+="${peers:+,}10.77.$((i / 250)).$((i % 250 + 1)):7700"
done

# Each process gets an equal share of the cores (a core id list, trailing comma).
mapfile -t cores < <(nproc --all | xargs seq 0 | head -n "$(nproc)")
per=$(( ${#cores[@]} / processes )); (( per >= 1 )) || per=1
echo "cluster: $processes processes, peers $peers${delay:+, netem delay $delay per link}" >&2
# The cluster secret the processes prove to each other that they hold (readable by
# this user only).
secret="$out/secret"
rm -f "$secret"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret")
pids=()
for ((i = 0; i < processes; i++)); do
  share=""
  for ((k = 0; k < per; k++)); do share+="${cores[$(( (i * per + k) % ${#cores[@]} ))]},"; done
  ip netns exec "${tag}h$i" "$weir" run --process "$i" --peers "$peers" \
    --cores "$share" --oversubscribe --quiet --json "$out/process-$i.json" \
    --secret-file "$secret" "$@" \
    > "$out/process-$i.txt" 2> >(sed "s/^/[process $i] /" >&2) &
  pids+=($!)
done
if [[ -n "$cut" ]]; then
  last=$((processes - 1))
  sleep "$cut"
  echo "cluster: cutting process $last off the network (its link leaves the bridge)" >&2
  cut_at=$(date +%s)
  ip link set "${tag}v$last" nomaster
  status=0
  for ((i = 0; i < last; i++)); do
    if wait "${pids[$i]}"; then
      echo "cluster: process $i completed although process $last went silent" >&2
      status=1
    elif ! grep -q "not even a heartbeat" "$out/process-$i.txt" "$out/process-$i.json" 2>/dev/null \
        && ! grep -rq "process $last" "$out/process-$i.json" 2>/dev/null; then
      echo "cluster: process $i failed, but not naming the silent process $last" >&2
      status=1
    fi
  done
  echo "cluster: the others stopped $(( $(date +%s) - cut_at )) s after the cut" >&2
  kill "${pids[$last]}" 2>/dev/null || true
  wait "${pids[$last]}" 2>/dev/null || true
  exit $status
fi
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
"$weir" summarize "$out"/process-*.json --json "$out/summary.json" || status=1
exit $status
