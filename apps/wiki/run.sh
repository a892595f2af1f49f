#!/usr/bin/env bash
# Runs the wiki. Builds Shoal and the wiki first (release, in the shared target
# directory), starts one local Shoal node unless a cluster is given, creates the schema
# and serves the wiki on the port it prints. Ctrl-C stops what it started.
#
#   apps/wiki/run.sh                                   # one local node, data in ./wiki-data
#   apps/wiki/run.sh --cluster 127.0.0.1:9042 --replication-factor 3
#   apps/wiki/run.sh --mariadb                         # the same wiki on a local MariaDB
#   apps/wiki/run.sh --port 8080
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}
cluster="" port=8080 replication_factor=1 use_mariadb=0
data=${WIKI_DATA:-$PWD/wiki-data}
while [ $# -gt 0 ]; do
  case "$1" in
    --cluster) cluster=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --replication-factor) replication_factor=$2; shift 2 ;;
    --mariadb) use_mariadb=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

cargo build --release --manifest-path "$repo/apps/wiki/Cargo.toml"
children=()
cleanup() {
  for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$use_mariadb" -eq 1 ]; then
  mariadb_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  children+=("$("$repo/apps/wiki/mariadb.sh" "$data/mariadb" "$mariadb_port" | tail -1)")
  store=(--mariadb "mysql://root@127.0.0.1:$mariadb_port/wiki")
elif [ -n "$cluster" ]; then
  store=(--shoal "$cluster" --replication-factor "$replication_factor")
else
  (cd "$repo" && scripts/build-deps.sh && cargo build --release --bin shoal)
  mkdir -p "$data"
  cql_port=${WIKI_SHOAL_PORT:-9042}
  "$CARGO_TARGET_DIR/release/shoal" server --data-dir "$data/shoal" --listen-address 127.0.0.1 \
    --cql-port "$cql_port" >"$data/shoal.log" 2>&1 &
  children+=("$!")
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$cql_port") 2>/dev/null; then break; fi
    if ! kill -0 "${children[-1]}" 2>/dev/null; then
      echo "Shoal did not start; its log:" >&2; tail -20 "$data/shoal.log" >&2; exit 1
    fi
    sleep 0.1
  done
  echo "Shoal on 127.0.0.1:$cql_port (log: $data/shoal.log)"
  store=(--shoal "127.0.0.1:$cql_port")
fi

"$CARGO_TARGET_DIR/release/shoal-wiki" "${store[@]}" --listen "127.0.0.1:$port" &
children+=("$!")
wait "${children[-1]}"
