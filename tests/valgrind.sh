#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Memcheck over the CLI's paths that touch the most code: bench (host
# backend, a few blocks, every mode; a batch large enough to be split), replay (a short generated trace
# through the host and disk tiers) and fsck (a directory holding good,
# corrupt, torn and foreign files). Any memcheck error or definite leak
# fails the run. Usage: tests/valgrind.sh path/to/kvferry
# (`make valgrind` builds a plain Debug CLI for it; docs/testing.md).
set -eu
kvf=$1
command -v valgrind >/dev/null || { echo "valgrind.sh: valgrind not installed" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# memcheck's own exit code, apart from the CLI's (fsck exits 1 on purpose)
VG_ERR=97
vg() { # expected-exit-code command...
    want=$1
    shift
    echo "valgrind: kvferry $*"
    rc=0
    valgrind --quiet --error-exitcode=$VG_ERR --leak-check=full \
        --show-leak-kinds=definite --errors-for-leak-kinds=definite \
        --track-origins=yes "$kvf" "$@" >"$tmp/out" 2>&1 || rc=$?
    if [ "$rc" -ne "$want" ]; then
        cat "$tmp/out"
        [ "$rc" -eq $VG_ERR ] && echo "valgrind.sh: memcheck errors in: kvferry $*" >&2 ||
            echo "valgrind.sh: kvferry $* exited $rc, expected $want" >&2
        exit 1
    fi
}

geo="--layers 2 --kv 2 --heads 2 --tokens-per-block 16 --head-size 32"
for mode in dram posix gds; do
    vg 0 bench --backend host --mode $mode --blocks 8 --iters 1 --tokens 5 --dir "$tmp/files"
done
# a batch over 4096 moves is queued as parts of a group, whose own arrays
# hold statuses but no moves: tiny blocks, so that memcheck stays quick
vg 0 bench --backend host --mode dram --blocks 5000 --iters 1 --tokens 5 --layers 1 --kv 1 \
    --heads 1 --tokens-per-block 16 --head-size 8
vg 0 replay --gen mixed --requests 24 --seed 5 $geo --gpu-blocks 32 --host-blocks 48 \
    --disk "$tmp/disk" --disk-blocks 256

# fsck: bench's blocks are good; then one flipped byte (corrupt), a
# leftover temporary file (torn), a block moved into another namespace
# (foreign: its header names the first) and a file that is no block
vg 0 fsck "$tmp/files"
set -- "$tmp"/files/bench/*.kvf
printf '\377' | dd of="$1" bs=1 seek=200 conv=notrunc 2>/dev/null
: >"$tmp/files/bench/.0000000000000000000000000000abcd.999999999.1.tmp"
mkdir "$tmp/files/other"
mv "$2" "$tmp/files/other/"
echo "not a block" >"$tmp/files/bench/notes.txt"
vg 1 fsck "$tmp/files" -v
grep -q "1 corrupt, 1 torn, 1 other layout" "$tmp/out" || { cat "$tmp/out"; exit 1; }
echo "valgrind: bench, replay, fsck: no errors, no definite leaks"
