#!/bin/sh
# The kvferry CLI end to end: info, bench in each mode (verified, JSON),
# fsck on what bench stored, then fsck after damage behind its back.
set -eu
kvf=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$kvf" info | grep -q "host   available"
"$kvf" version | grep -q kvferry
# info --config: each setting's value and source, as text and JSON; a bad value fails
KVF_BACKEND=Host "$kvf" info --config | grep -q "^backend  *host  *environment  *KVF_BACKEND\$"
KVF_BACKEND=Host "$kvf" info --config --json | grep -q '"value": "host", "source": "environment"'
if KVF_BACKEND=gpu "$kvf" info --config 2>"$tmp/err"; then exit 1; fi
grep -q "KVF_BACKEND=\"gpu\"" "$tmp/err"
for mode in dram posix gds; do
    "$kvf" bench --backend host --mode $mode --blocks 16 --iters 1 --tokens 5 \
        --json "$tmp/$mode.json" --dir "$tmp/files" >"$tmp/$mode.out"
    grep -q '"verified": true' "$tmp/$mode.json"
    grep -q "verified: every byte" "$tmp/$mode.out"
done
"$kvf" bench --backend host --dtype int4 --order token --pools 3 --blocks 8 --iters 1 >/dev/null
# bad options are refused with a usage hint, not a crash
if "$kvf" bench --dtype fp5 2>/dev/null; then exit 1; fi
if "$kvf" bench --blocks 0 2>/dev/null; then exit 1; fi
if "$kvf" nonsense 2>/dev/null; then exit 1; fi
# the blocks bench stored in posix and gds modes: all good
"$kvf" fsck "$tmp/files" | tee "$tmp/fsck1" | tail -n 1
grep -q " 16 good, 0 corrupt, 0 torn" "$tmp/fsck1"
# flip one byte of one block, leave a torn temporary file: fsck fails
f=$(ls "$tmp"/files/bench/*.kvf | head -n 1)
printf '\377' | dd of="$f" bs=1 seek=100 conv=notrunc 2>/dev/null
: >"$tmp/files/bench/.000000000000abcd.999999999.1.tmp"
if "$kvf" fsck "$tmp/files" >"$tmp/fsck2"; then cat "$tmp/fsck2"; exit 1; fi
grep -q "15 good, 1 corrupt, 1 torn" "$tmp/fsck2"
if "$kvf" fsck "$tmp/nowhere" 2>/dev/null; then exit 1; fi
# a FIFO under a block's name: reported as foreign, not waited on, left
mkfifo "$tmp/files/bench/0000000000000001.kvf"
if timeout 30 "$kvf" fsck "$tmp/files" >"$tmp/fsck3"; then cat "$tmp/fsck3"; exit 1; fi
grep -q "1 foreign" "$tmp/fsck3"
[ -p "$tmp/files/bench/0000000000000001.kvf" ]
# the event timeline: every part of a large batch registered and completed
KVF_TIMELINE="$tmp/timeline.txt" "$kvf" bench --backend host --layers 1 --kv 1 --heads 1 \
    --tokens-per-block 32 --head-size 1 --blocks 10000 --iters 1 >/dev/null
grep -q " submit 0 10000\$" "$tmp/timeline.txt"
parts=$(grep -c " part " "$tmp/timeline.txt")
[ "$parts" -ge 5 ]
[ "$(grep -c " complete " "$tmp/timeline.txt")" -ge "$parts" ]
echo "cli: info, bench (3 modes), fsck, timeline: ok"
