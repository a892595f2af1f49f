#!/usr/bin/env bash
# Starts a private MariaDB server for the wiki (Debian's mariadb-server package), in the
# background, with its files in DIR, listening on 127.0.0.1:PORT only, and creates the
# `wiki` database. Prints the server's pid on the last line; stop it with `kill PID`.
#
#   apps/wiki/mariadb.sh DIR PORT
#
# The settings are a fair match for Shoal's defaults: InnoDB flushes its log about once a
# second (innodb_flush_log_at_trx_commit=2), as Shoal syncs its commit log periodically,
# and the buffer pool holds the whole benchmark.
set -euo pipefail
dir=${1:?usage: mariadb.sh DIR PORT}
port=${2:?usage: mariadb.sh DIR PORT}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
  echo "mariadbd not found: install Debian's mariadb-server package" >&2
  exit 1
fi
user_args=()
[ "$(id -u)" -eq 0 ] && user_args=(--user=root)
if [ ! -d "$dir/data/mysql" ]; then
  mariadb-install-db --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal \
    --skip-test-db "${user_args[@]}" >"$dir/install.log" 2>&1
fi
/usr/sbin/mariadbd --no-defaults --datadir="$dir/data" --socket="$dir/mariadb.sock" \
  --pid-file="$dir/mariadb.pid" --bind-address=127.0.0.1 --port="$port" --skip-name-resolve \
  --innodb-buffer-pool-size=1G --innodb-flush-log-at-trx-commit=2 --max-connections=500 \
  --log-error="$dir/error.log" "${user_args[@]}" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  if mariadb --no-defaults --socket="$dir/mariadb.sock" -uroot -e "CREATE DATABASE IF NOT EXISTS wiki" 2>/dev/null; then
    echo "$pid"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "MariaDB did not start:" >&2
    tail -20 "$dir/error.log" >&2 || true
    exit 1
  fi
  sleep 0.1
done
kill "$pid" 2>/dev/null || true
echo "MariaDB did not answer within 30 s" >&2
exit 1
