#!/usr/bin/env bash
# Point read/write benchmark for one Shoal node (issue 2's target: reads and writes of
# 100-byte values over 1M keys, 64 requests in flight, client on the same machine).
# Starts a node in a temporary directory, loads the keys, measures writes then reads,
# prints ops/s and latency percentiles, and stops the node even on failure.
#
#   bench/point.sh [--duration-seconds N] [--records N] [--commitlog-sync periodic|group]
set -euo pipefail
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}
cd "$(dirname "$0")/.."

duration=30
records=1000000
sync=periodic
while [ $# -gt 0 ]; do
  case "$1" in
    --duration-seconds) duration=$2; shift 2 ;;
    --records) records=$2; shift 2 ;;
    --commitlog-sync) sync=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --bin shoal >/dev/null
shoal="$CARGO_TARGET_DIR/release/shoal"
data=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$shoal" server --data-dir "$data" --listen-address 127.0.0.1 --cql-port "$port" --commitlog-sync "$sync" >"$data.log" 2>&1 &
node=$!
cleanup() { kill "$node" 2>/dev/null || true; wait "$node" 2>/dev/null || true; rm -rf "$data" "$data.log"; }
trap cleanup EXIT
for _ in $(seq 1 100); do
  (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break
  sleep 0.1
done

echo "machine: $(nproc) cores, $(uname -sr), commitlog_sync=$sync"
"$shoal" bench point --contact "127.0.0.1:$port" --records "$records" --value-bytes 100 --concurrency 64 \
  --load --operation write --duration-seconds "$duration" --warmup-seconds 5
"$shoal" bench point --contact "127.0.0.1:$port" --records "$records" --value-bytes 100 --concurrency 64 \
  --operation read --duration-seconds "$duration" --warmup-seconds 5
