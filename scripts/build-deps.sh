#!/usr/bin/env bash
# Installs what building Shoal needs beyond Rust: clang and libclang for RocksDB's
# bindings, OpenSSL's headers and command line for the driver TLS tests (the test
# certificates are made with `openssl`). Skips apt when they are already there.
set -euo pipefail
if ! dpkg -s clang libclang-dev libssl-dev pkg-config openssl >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq clang libclang-dev libssl-dev pkg-config openssl >/dev/null
fi
