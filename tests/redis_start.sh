# SPDX-License-Identifier: Apache-2.0
# Sourced by the CLI's shell tests: start_redis SALT starts a redis-server
# on a free loopback port (a few tries), its pid in $rpid and its port in
# $port, files under $tmp; exits 1 when none starts. The caller's trap
# kills $rpid.
start_redis() {
    for try in 1 2 3 4 5; do
        port=$((20000 + ($$ * $1 + try * 997) % 40000))
        redis-server --port $port --bind 127.0.0.1 --save "" --appendonly no --dir "$tmp" \
            >"$tmp/redis.log" 2>&1 &
        rpid=$!
        for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
            redis-cli -p $port ping >/dev/null 2>&1 && break
            sleep 0.1
        done
        if redis-cli -p $port ping >/dev/null 2>&1; then return 0; fi
        kill $rpid 2>/dev/null || true
        rpid=
    done
    echo "no redis-server could start" >&2
    exit 1
}
