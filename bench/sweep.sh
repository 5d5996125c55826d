#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs `kvferry bench` over block sizes from 4 KiB to 4 MiB and writes one
# JSON line per run to $2 (default sweep.jsonl). $1: the kvferry binary.
# Extra arguments after the first two go to every run (e.g. --mode posix).
# Block size is set by head_size on a [1][2][1][16][head] fp16 block, so a
# partial run (--tokens) moves 2 strided rows.
set -eu
bin=${1:-build/kvferry}
out=${2:-sweep.jsonl}
shift 2 || true
: >"$out"
for head in 64 256 1024 4096 16384 65536; do
    bytes=$((head * 64))
    blocks=$((256 * 1024 * 1024 / bytes))
    [ "$blocks" -gt 65536 ] && blocks=65536
    [ "$blocks" -lt 64 ] && blocks=64
    tmp=$(mktemp)
    "$bin" bench --layers 1 --kv 2 --heads 1 --tokens-per-block 16 --head-size "$head" \
        --blocks "$blocks" --json "$tmp" "$@"
    cat "$tmp" | tr -d '\n' >>"$out"
    echo >>"$out"
    rm -f "$tmp"
done
