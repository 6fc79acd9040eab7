#!/usr/bin/env bash
# Installs redis-server (and redis-cli) from Debian's `redis-server` package, for the Redis
# backend's tests (tests/redis/, features `redis` and `test-util`), which start their own servers on free
# loopback ports. Idempotent: does nothing when both are already on PATH.
#
#   ./scripts/install-redis.sh
#
# Needs apt-get, and root (or passwordless sudo). Quiet on success; on failure it prints
# apt's output and exits non-zero.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-redis.sh: redis-server is missing and apt-get is not available;" >&2
    echo "install Redis (redis-server and redis-cli, version 6 or later) by other means." >&2
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "install-redis.sh: redis-server is missing; installing it needs root:" >&2
    echo "  sudo apt-get install -y redis-server" >&2
    exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! { "${sudo[@]}" apt-get update -q && "${sudo[@]}" apt-get install -y -q --no-install-recommends redis-server; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-redis.sh: apt-get install redis-server FAILED" >&2
    exit 1
fi

# The package may start a system service; the tests never use it (they start their own
# servers on free ports), so it is left as the package set it up.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "install-redis.sh: redis-server or redis-cli still not on PATH after installing" >&2
    exit 1
fi
echo "install-redis.sh: installed $(redis-server --version | head -n1)"
