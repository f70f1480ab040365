#!/usr/bin/env bash
# A Redis server for the integration tests and for `weir run --store`: on a loopback
# port, with no persistence (no RDB snapshots, no AOF), as a daemon of its own.
#
#   scripts/redis.sh install       installs redis-server (Debian package) if it is missing
#   scripts/redis.sh start [PORT]  installs if needed, starts one (default port
#                                  $WEIR_REDIS_PORT or 6399) pinned to $WEIR_REDIS_CORE if
#                                  set, and prints WEIR_REDIS_URL=redis://127.0.0.1:PORT
#   scripts/redis.sh stop [PORT]   stops it
#   scripts/redis.sh status [PORT] says whether it answers
#
# Usage in a shell: eval "$(scripts/redis.sh start)"; ...; scripts/redis.sh stop
set -euo pipefail

command=${1:-}
port=${2:-${WEIR_REDIS_PORT:-6399}}
dir=${TMPDIR:-/tmp}/weir-redis-$port

die() {
  echo "scripts/redis.sh: $*" >&2
  exit 1
}

case "$port" in
  '' | *[!0-9]*) die "port must be a number, got '$port'" ;;
esac

install() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    return 0
  fi
  command -v apt-get >/dev/null 2>&1 ||
    die "redis-server is missing and there is no apt-get here; install Redis 6 or later by hand"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "installing redis-server needs root (or sudo)"
    sudo="sudo -n"
  fi
  echo "scripts/redis.sh: installing redis-server (Debian package)" >&2
  $sudo apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >&2 ||
    die "apt-get install redis-server failed"
  # The package may start a system instance on 6379; it is not ours, leave it be.
  command -v redis-server >/dev/null 2>&1 || die "redis-server still missing after install"
}

answers() {
  redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG
}

case "$command" in
  install)
    install
    redis-server --version >&2
    ;;
  start)
    install
    if answers; then
      echo "scripts/redis.sh: a server already answers on port $port" >&2
    else
      mkdir -p "$dir"
      pin=()
      if [ -n "${WEIR_REDIS_CORE:-}" ]; then
        pin=(taskset -c "$WEIR_REDIS_CORE")
      fi
      "${pin[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --daemonize yes --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
        >&2 || die "redis-server did not start; see $dir/redis.log"
      for _ in $(seq 100); do
        answers && break
        sleep 0.05
      done
      answers || die "redis-server on port $port does not answer; see $dir/redis.log"
      echo "scripts/redis.sh: redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$port" >&2
    fi
    echo "WEIR_REDIS_URL=redis://127.0.0.1:$port"
    echo "export WEIR_REDIS_URL"
    ;;
  stop)
    if answers; then
      redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
    fi
    if [ -f "$dir/redis.pid" ]; then
      pid=$(cat "$dir/redis.pid")
      for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
      done
      rm -f "$dir/redis.pid"
    fi
    echo "scripts/redis.sh: stopped the server on port $port" >&2
    ;;
  status)
    if answers; then
      echo "running on 127.0.0.1:$port"
    else
      echo "not running on 127.0.0.1:$port"
      exit 1
    fi
    ;;
  *)
    sed -n '2,12p' "$0" >&2
    exit 2
    ;;
esac
