#!/usr/bin/env bash
# Point read/write benchmark against a local three-node Shoal cluster (issue 3's target):
# keyspace RF=3, every request at QUORUM, 100-byte values, 64 requests in flight, the
# client on the same machine. Starts the cluster in a temporary directory with
# `shoal cluster start`, loads the keys, measures writes then reads, prints ops/s and
# latency percentiles, and stops every node even on failure.
#
# With --shoal-before, an earlier binary is measured too: in each of --rounds rounds,
# each binary in turn (the order alternating) gets a fresh cluster, loaded and measured
# the same way. The machine's speed drifts within minutes; alternating exposes both
# binaries to the same drift. The last lines sum each binary's rounds up (median).
#
# --pause-seconds leaves the cluster idle between the writes and the reads (what reads
# meet once writes have stopped for a while, as in a read-mostly hour).
#
#   bench/cluster.sh [--duration-seconds N] [--records N] [--nodes N] [--pause-seconds N]
#                    [--shoal-binary PATH] [--shoal-before PATH] [--rounds N]
set -euo pipefail
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}
cd "$(dirname "$0")/.."

duration=30
records=200000
nodes=3
rounds=1
pause=0
shoal=""
before=""
while [ $# -gt 0 ]; do
  case "$1" in
    --duration-seconds) duration=$2; shift 2 ;;
    --records) records=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --pause-seconds) pause=$2; shift 2 ;;
    --shoal-binary) shoal=$2; shift 2 ;;
    --shoal-before) before=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

if [ -z "$shoal" ]; then
  cargo build --release --bin shoal >/dev/null
  shoal="$CARGO_TARGET_DIR/release/shoal"
fi
binaries=("$shoal")
labels=("shoal")
if [ -n "$before" ]; then
  binaries+=("$before")
  labels+=("before")
fi

dir=""
running=""
stop_cluster() {
  if [ -n "$dir" ]; then
    "$running" cluster stop --dir "$dir" >/dev/null 2>&1 || true
    rm -rf "$dir"
    dir=""
  fi
}
trap stop_cluster EXIT

# ops/s of one `shoal bench point` output line ("  write:  12345 ops/s ...").
ops_per_second() { awk '{ print $2 }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

echo "machine: $(nproc) cores, $(uname -sr); $nodes nodes on 127.0.0.1-$nodes, RF=3, QUORUM"
declare -A writes reads
for round in $(seq 1 "$rounds"); do
  for turn in $(seq 0 $((${#binaries[@]} - 1))); do
    # Alternate which binary goes first from round to round.
    index=$(((turn + round - 1) % ${#binaries[@]}))
    running=${binaries[$index]}
    label=${labels[$index]}
    dir=$(mktemp -d)
    "$running" cluster start --nodes "$nodes" --dir "$dir" --detach >/dev/null
    if [ "$rounds" -eq 1 ] && [ ${#binaries[@]} -eq 1 ]; then
      "$running" admin status
    fi
    write=$("$running" bench point --contact 127.0.0.1:9042 --replication-factor 3 --consistency QUORUM \
      --records "$records" --value-bytes 100 --concurrency 64 \
      --load --operation write --duration-seconds "$duration" --warmup-seconds 5 | grep -E '^ *write:')
    sleep "$pause"
    read=$("$running" bench point --contact 127.0.0.1:9042 --replication-factor 3 --consistency QUORUM \
      --records "$records" --value-bytes 100 --concurrency 64 \
      --operation read --duration-seconds "$duration" --warmup-seconds 5 | grep -E '^ *read:')
    echo "round $round, $label:"
    echo "$write"
    echo "$read"
    writes[$label]+="$(echo "$write" | ops_per_second) "
    reads[$label]+="$(echo "$read" | ops_per_second) "
    stop_cluster
  done
done
if [ "$rounds" -gt 1 ] || [ ${#binaries[@]} -gt 1 ]; then
  for label in "${labels[@]}"; do
    echo "$label: writes/s median $(echo "${writes[$label]}" | tr ' ' '\n' | grep . | median) (rounds: ${writes[$label]% }), reads/s median $(echo "${reads[$label]}" | tr ' ' '\n' | grep . | median) (rounds: ${reads[$label]% })"
  done
fi
