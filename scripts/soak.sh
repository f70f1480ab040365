#!/usr/bin/env bash
# A soak run: the main job (`weir run`) at a constant open-loop rate for a long while,
# with the process's resident memory and open file descriptors sampled every second.
# Both must stay flat: a slope is a leak (memory) or a lost close (descriptors).
#
#   scripts/soak.sh [SECONDS] [RATE]      (default: 600 seconds at 500000 records/s,
#                                          about half of what the job saturates at here)
#
# Writes results/<date>-soak-<sha>.csv (second, RSS KiB, descriptors), and
# results/soak.md with the slopes (least squares over the run after its first
# tenth, the warm-up) plus results/plots/soak.svg, which `weir report` includes in
# results/REPORT.md. Run it with nothing else heavy on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
rate="${2:-500000}"
records=$((seconds * rate))
cargo build --release -p weir-bench >&2
sha=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
day=$(date +%Y-%m-%d)
csv="results/$day-soak-$sha.csv"
mkdir -p results/plots
json=$(mktemp)
command=(target/release/weir run --rate "$rate" --records "$records" --quiet --json "$json")
echo "soak: ${command[*]} (${seconds} s)" >&2
"${command[@]}" > /dev/null &
pid=$!
echo "second,rss_kib,fds" > "$csv"
start=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l || true)
  [[ -n "$rss" ]] && echo "$(( $(date +%s) - start )),$rss,$fds" >> "$csv"
  sleep 1
done
status=0
wait "$pid" || status=$?
python3 - "$csv" "$json" "$status" "${command[*]}" <<'PY'
import json, sys
csv, report, status, command = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [tuple(map(float, l.split(','))) for l in open(csv).read().split('\n')[1:] if l]
if len(rows) < 10:
    sys.exit("soak: too few samples (the run ended at once?)")
def slope(points):
    n = len(points); mx = sum(x for x, _ in points) / n; my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
steady = rows[len(rows) // 10:]
rss_slope = slope([(t, r) for t, r, _ in steady]) * 60      # KiB per minute
fd_slope = slope([(t, f) for t, _, f in steady]) * 60       # descriptors per minute
rss = [r for _, r, _ in steady]; fds = [f for _, _, f in steady]
try:
    job = json.load(open(report))
except Exception:
    job = {}
outcome = job.get('outcome', 'unknown')
rate = job.get('throughput_records_per_s')
throughput = f'{rate:,.0f} records/s' if isinstance(rate, (int, float)) else 'throughput not reported'
duration = rows[-1][0]
# The plot: two panels, RSS in MiB and descriptors, against seconds.
W, H, P = 720, 420, 50
def panel(values, top, height, label):
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9: lo, hi = lo - 1, hi + 1
    pad = (hi - lo) * 0.1; lo -= pad; hi += pad
    xs = [P + (t / max(duration, 1)) * (W - 2 * P) for t, _, _ in rows]
    ys = [top + height - (v - lo) / (hi - lo) * height for v in values]
    path = ' '.join(f'{x:.1f},{y:.1f}' for x, y in zip(xs, ys))
    return (f'<rect x="{P}" y="{top}" width="{W-2*P}" height="{height}" fill="none" stroke="#999"/>'
            f'<polyline points="{path}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
            f'<text x="{P}" y="{top-6}" font-size="12">{label}</text>'
            f'<text x="{P-4}" y="{top+10}" font-size="10" text-anchor="end">{hi:.1f}</text>'
            f'<text x="{P-4}" y="{top+height}" font-size="10" text-anchor="end">{lo:.1f}</text>')
rss_all = [r / 1024 for _, r, _ in rows]; fd_all = [f for _, _, f in rows]
svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">'
       f'<rect width="{W}" height="{H}" fill="white"/>'
       + panel(rss_all, 30, 150, f'resident memory, MiB (slope {rss_slope:+.1f} KiB/min after warm-up)')
       + panel(fd_all, 230, 150, f'open file descriptors (slope {fd_slope:+.3f}/min after warm-up)')
       + f'<text x="{W/2}" y="{H-8}" font-size="11" text-anchor="middle">seconds since start ({duration:.0f} s)</text></svg>')
open('results/plots/soak.svg', 'w').write(svg)
md = f"""Command: `scripts/soak.sh` (`{command.split(' --json')[0]}`), samples every second in `{csv}`.

| figure | value |
|---|---|
| run | {duration:.0f} s, outcome {outcome}, exit status {status}, {throughput} |
| resident memory after warm-up | {min(rss)/1024:.1f} to {max(rss)/1024:.1f} MiB, slope **{rss_slope:+.1f} KiB/min** |
| open file descriptors after warm-up | {min(fds):.0f} to {max(fds):.0f}, slope **{fd_slope:+.3f}/min** |

![soak](plots/soak.svg)
"""
open('results/soak.md', 'w').write(md)
print(md)
PY
rm -f "$json"
exit "$status"
