#!/usr/bin/env bash
# Builds Shoal and runs a local node you can connect to (cqlsh 127.0.0.1 9042).
# Data lives in ./data (override with SHOAL_DATA_DIR). Ctrl-C stops it cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}
scripts/build-deps.sh
cargo build --release --bin shoal
exec "$CARGO_TARGET_DIR/release/shoal" server --config conf/shoal.toml \
  --data-dir "${SHOAL_DATA_DIR:-data}" --listen-address "${SHOAL_ADDRESS:-127.0.0.1}" "$@"
