#!/usr/bin/env bash
# Installs what the tests need and runs the whole suite: formatting, clippy (warnings
# denied), Rust unit and integration tests (including the scylla driver), the Java driver
# tests (Maven), then the Python suite (cassandra-driver, cqlsh) against real shoal
# processes, including the nemesis (kills, pauses and nftables partitions) and a real
# Prometheus server scraping a cluster, and the wiki (apps/wiki, its own Cargo workspace)
# in headless Chromium on Shoal and on MariaDB.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}
venv=${SHOAL_VENV:-$HOME/.cache/shoal/venv}

# One target directory serves every clone; drop the builds no clone uses any more.
python3 scripts/prune-target.py "$CARGO_TARGET_DIR"
scripts/build-deps.sh
# The nemesis test cuts nodes off with nftables rules on loopback; a test cluster that
# does not come up has its nodes' thread stacks written next to their logs with gdb.
if ! command -v nft >/dev/null 2>&1 || ! command -v gdb >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq nftables gdb >/dev/null
fi
# The metrics test scrapes a cluster with a real Prometheus server (Debian's package).
if ! command -v prometheus >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# The wiki's browser tests run Debian's Chromium through its ChromeDriver, and the same
# wiki on a private MariaDB server.
if ! command -v chromedriver >/dev/null 2>&1 || ! command -v mariadb-install-db >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium chromium-driver mariadb-server >/dev/null
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check -r tests/python/requirements.txt

wiki=apps/wiki/Cargo.toml
echo "== cargo fmt"
cargo fmt --all -- --check
cargo fmt --manifest-path $wiki -- --check
echo "== cargo clippy"
cargo clippy --release --all-targets -- -D warnings
cargo clippy --release --manifest-path $wiki --all-targets -- -D warnings
echo "== cargo test"
cargo test --release
cargo test --release --manifest-path $wiki
cargo build --release --bin shoal
cargo build --release --manifest-path $wiki
echo "== java driver tests"
mvn -q -B -f tests/java/pom.xml test -Dshoal.bin="$CARGO_TARGET_DIR/release/shoal"
echo "== python tests"
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q tests/python
