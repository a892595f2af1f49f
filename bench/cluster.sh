#!/usr/bin/env bash
# Point read/write benchmark against a local three-node Shoal cluster (issue 3's target):
# keyspace RF=3, every request at QUORUM, 100-byte values, 64 requests in flight, the
# client on the same machine. Starts the cluster in a temporary directory with
# `shoal cluster start`, loads the keys, measures writes then reads, prints ops/s and
# latency percentiles, and stops every node even on failure.
#
#   bench/cluster.sh [--duration-seconds N] [--records N] [--nodes N]
set -euo pipefail
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}
cd "$(dirname "$0")/.."

duration=30
records=200000
nodes=3
while [ $# -gt 0 ]; do
  case "$1" in
    --duration-seconds) duration=$2; shift 2 ;;
    --records) records=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cargo build --release --bin shoal >/dev/null
shoal="$CARGO_TARGET_DIR/release/shoal"
dir=$(mktemp -d)
cleanup() { "$shoal" cluster stop --dir "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
"$shoal" cluster start --nodes "$nodes" --dir "$dir" --detach >/dev/null
"$shoal" admin status

echo "machine: $(nproc) cores, $(uname -sr); $nodes nodes on 127.0.0.1-$nodes, RF=3, QUORUM"
"$shoal" bench point --contact 127.0.0.1:9042 --replication-factor 3 --consistency QUORUM \
  --records "$records" --value-bytes 100 --concurrency 64 \
  --load --operation write --duration-seconds "$duration" --warmup-seconds 5
"$shoal" bench point --contact 127.0.0.1:9042 --replication-factor 3 --consistency QUORUM \
  --records "$records" --value-bytes 100 --concurrency 64 \
  --operation read --duration-seconds "$duration" --warmup-seconds 5
