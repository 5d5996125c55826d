#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs `kvferry bench --mode remote` against a redis-server of its own: a
# free loopback port, a temp dir, nothing saved to disk, stopped on exit
# (even when the bench fails or is interrupted).
#   scripts/redis-bench.sh [path/to/kvferry] [bench options...]
set -eu
KVFERRY=${1:-build/kvferry}
[ $# -gt 0 ] && shift
command -v redis-server >/dev/null || { echo "redis-bench: redis-server not installed" >&2; exit 77; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvferry-redis-bench-XXXXXX")
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM

# Tries ports until a server starts on one (a taken port makes it exit).
start_server() {
    redis-server --port "$1" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
        --daemonize no --logfile "$dir/redis.log" &
    pid=$!
    i=0
    until redis-cli -p "$1" ping 2>/dev/null | grep -q PONG; do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; pid=; return 1; }
        i=$((i + 1))
        [ $i -lt 400 ] || return 1
        sleep 0.05
    done
}
port=
for p in $(seq $((26379 + $$ % 2000)) $((26399 + $$ % 2000))); do
    if start_server "$p"; then port=$p; break; fi
done
[ -n "$port" ] || { echo "redis-bench: no server started" >&2; cat "$dir/redis.log" >&2; exit 1; }
echo "redis-bench: $(redis-server --version | cut -d' ' -f1-3) on 127.0.0.1:$port"
"$KVFERRY" bench --mode remote --remote-url "redis://127.0.0.1:$port" "$@"
