#!/usr/bin/env bash
# Builds Shoal and runs a local three-node cluster you can connect to
# (cqlsh 127.0.0.1 9042; the nodes are 127.0.0.1, 127.0.0.2 and 127.0.0.3).
# Data and logs live in ./shoal-cluster/node<i> (override with SHOAL_CLUSTER_DIR);
# SHOAL_NODES sets the node count. Ctrl-C stops every node cleanly; running it again
# restarts the same cluster with its data.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}
scripts/build-deps.sh
cargo build --release --bin shoal
exec "$CARGO_TARGET_DIR/release/shoal" cluster start --nodes "${SHOAL_NODES:-3}" \
  --dir "${SHOAL_CLUSTER_DIR:-shoal-cluster}" "$@"
