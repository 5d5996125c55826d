#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The kvferry CLI end to end: info, bench in each mode (verified, JSON),
# fsck on what bench stored, then fsck after damage behind its back; and
# for every subcommand the same conventions: --help exits 0, an unknown
# option exits 2 naming it, --json - writes parseable JSON alone on
# standard output, an unwritable --json path fails, an out-of-range number
# and a bad choice are refused with what is valid; one exit code per kind
# of failure, one default per option in every command, a warning for an
# unknown KVF_* variable, the spread of a benchmark's rounds, and words a
# user knows in every row.
set -eu
kvf=$1
. "$(dirname "$0")/redis_start.sh"
tmp=$(mktemp -d)
rpid=
trap 'if [ -n "$rpid" ]; then kill "$rpid" 2>/dev/null; fi; rm -rf "$tmp"' EXIT
fail() {
    echo "test_cli: $*" >&2
    exit 1
}
# runs a command, expecting exit status $1: expect RC CMD...
expect() {
    want=$1
    shift
    set +e
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    set -e
    [ "$rc" -eq "$want" ] || { cat "$tmp/err" >&2; fail "'$*' exited $rc, not $want"; }
}
# the error message of the last expect holds $1
said() {
    grep -q -- "$1" "$tmp/err" || { cat "$tmp/err" >&2; fail "no '$1' in the message"; }
}
# the JSON written by CMD --json - parses, and is all of standard output
json_ok() {
    expect 0 "$@" --json -
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/out" ||
        fail "'$* --json -' wrote no valid JSON on stdout"
    cp "$tmp/out" "$tmp/last.json"
}
# --help, an unknown option and unwritable --json paths: conventions CMD...
conventions() {
    expect 0 "$@" --help
    grep -q "usage: kvferry" "$tmp/out" || fail "'$* --help': no usage on stdout"
    expect 2 "$@" --no-such-option
    said "unknown option '--no-such-option'"
    said "kvferry .* --help lists the options"
    expect 2 "$@" -Z
    said "unknown option '-Z'"
}
unwritable() {
    if "$@" --json "$tmp/no/such/dir/x.json" >/dev/null 2>"$tmp/err"; then
        fail "'$*' with an unwritable --json passed"
    fi
    said "no/such/dir/x.json"
    if "$@" --json /dev/full >/dev/null 2>"$tmp/err"; then
        fail "'$*' with --json /dev/full passed"
    fi
    said "/dev/full"
}

"$kvf" info | grep -q "host   available"
"$kvf" version | grep -q kvferry
# the S3 store is listed, built or saying what it needs; an s3:// URL's
# secret is in no listing
"$kvf" info | grep -q "^  s3  *s3://"
KVF_REMOTE_URL="s3://key:verysecret@bucket/p" "$kvf" info --config >"$tmp/s3cfg" 2>&1 || true
grep -q "s3://key:\*\*\*@bucket/p" "$tmp/s3cfg"
if grep -q verysecret "$tmp/s3cfg"; then fail "kvferry info --config printed an s3:// secret"; fi
# info --config: each setting's value and source, as text and JSON; a bad value fails
KVF_BACKEND=Host "$kvf" info --config | grep -q "^backend  *host  *environment  *KVF_BACKEND\$"
KVF_BACKEND=Host "$kvf" info --config --json - | python3 -c 'import json, sys
d = {s["name"]: s for s in json.load(sys.stdin)}
assert d["backend"]["value"] == "host" and d["backend"]["source"] == "environment", d["backend"]'
# the stores, each with its schemes; a URL's password in no output of info
"$kvf" info | grep -q "^  mem    mem://: "
"$kvf" info --json - | python3 -c 'import json, sys
d = json.load(sys.stdin)
assert {s["name"] for s in d["stores"]} >= {"file", "mem", "redis"}, d["stores"]'
for args in "" "--config" "--json -" "--config --json -"; do
    KVF_REMOTE_URL="redis://alice:pw-8c1f3e9a@127.0.0.1:1/0" "$kvf" info $args >"$tmp/info" 2>&1 || true
    if grep -q "pw-8c1f3e9a" "$tmp/info"; then fail "kvferry info $args shows the password"; fi
done
KVF_REMOTE_URL="redis://alice:pw-8c1f3e9a@127.0.0.1:1/0" "$kvf" info --config | grep -q "alice:\*\*\*@"
if KVF_BACKEND=gpu "$kvf" info --config 2>"$tmp/err"; then exit 1; fi
grep -q "KVF_BACKEND=\"gpu\"" "$tmp/err"
for mode in dram posix gds; do
    "$kvf" bench --backend host --mode $mode --blocks 16 --iters 1 --tokens 5 \
        --json "$tmp/$mode.json" --dir "$tmp/files" >"$tmp/$mode.out"
    python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["verified"] is True' \
        "$tmp/$mode.json"
    grep -q "verified: every byte" "$tmp/$mode.out"
done
"$kvf" bench --backend host --dtype int4 --order token --pools 3 --blocks 8 --iters 1 >/dev/null
if "$kvf" nonsense 2>/dev/null; then exit 1; fi
# the blocks bench stored in posix and gds modes: all good
"$kvf" fsck "$tmp/files" | tee "$tmp/fsck1" | tail -n 1
grep -q " 16 good, 0 corrupt, 0 torn" "$tmp/fsck1"

# ---- the conventions, subcommand by subcommand
expect 0 "$kvf" --help
expect 2 "$kvf"
for cmd in info version; do
    conventions "$kvf" $cmd
    json_ok "$kvf" $cmd
    unwritable "$kvf" $cmd
done
python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["version"]' "$tmp/last.json"

small="--backend host --blocks 4 --iters 1 --heads 1 --layers 1"
conventions "$kvf" bench
json_ok "$kvf" bench $small
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["verified"] is True
assert d["ceiling"]["what"] and d["per_block"]["what"]
assert d["rounds"] == 1 and d["spread"] == -1 and "load_average" in d, d' "$tmp/last.json"
unwritable "$kvf" bench $small
expect 2 "$kvf" bench --blocks 0
said "kvferry bench: --blocks: 0 is out of range (1..4294967295)"
expect 2 "$kvf" bench --layers 4294967296
said "\-\-layers: 4294967296 is out of range"
expect 2 "$kvf" bench --iters -1
said "\-\-iters: -1 is out of range"
expect 2 "$kvf" bench --blocks 12x
said "\-\-blocks: '12x' is not a number"
expect 2 "$kvf" bench --dtype fp5
said "\-\-dtype: 'fp5' is not one of: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8, int4, fp4"
expect 2 "$kvf" bench --backend gpu
said "\-\-backend: 'gpu' is not one of: auto, host, cuda"
expect 2 "$kvf" bench --mode tape
said "\-\-mode: 'tape' is not one of: dram, posix, gds, remote, contention"
expect 2 "$kvf" bench --blocks
said "\-\-blocks needs a value"
expect 2 "$kvf" bench --plot "$tmp/p.png"
said "add --compare"

# the contention bench: onboard latency under offloads, every byte checked
cb="bench --mode contention --backend host --sizes 4K,16K --reps 10 --load-blocks 16 --load-ms 50"
conventions "$kvf" bench --mode contention
json_ok "$kvf" $cb
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert d["mode"] == "contention" and d["backend"] == "host", d
assert d["verified"] is True and d["bad_blocks"] == 0 and d["reps"] == 10, d
assert d["pools"] == 1, d
assert [s["block_bytes"] for s in d["sizes"]] == [4096, 16384], d["sizes"]
assert [s["pool_block_bytes"] for s in d["sizes"]] == [4096, 16384], d["sizes"]
for s in d["sizes"]:
    for p in (s["idle"], s["loaded"], s["evicting"], s["raw"]["idle"], s["raw"]["loaded"],
              s["raw"]["evicting"]):
        assert 0 < p["p50_ms"] <= p["p99_ms"], s
    assert s["ratio_p50"] > 0 and s["raw"]["ratio_p50"] > 0 and s["allowed_ratio_p50"] >= 1.2, s
    assert s["evicting_ratio_p50"] > 0 and s["raw"]["evicting_ratio_p99"] > 0, s
    assert s["evicting_allowed_ratio_p99"] >= 1.2 and s["bad_evictions"] == 0, s
    assert s["offload_alone_gbs"] > 0 and s["offload_loaded_gbs"] > 0 and s["offload_ratio"] > 0, s
    assert s["raw"]["load_alone_gbs"] > 0 and s["bad_blocks"] == 0, s' "$tmp/last.json"
unwritable "$kvf" $cb
expect 2 "$kvf" bench --mode contention --sizes 4K,1000
said "\-\-sizes: 1000 is not a multiple of 128 bytes"
expect 2 "$kvf" bench --mode=contention --reps 0
said "\-\-reps: 0 is out of range"
# --pools: each block split over pools as vLLM and SGLang keep them (a pool
# per layer, K and V apart), every byte of every pool checked
cp="bench --mode contention --backend host --sizes 32K --pools 8 --reps 5 --load-blocks 64 --load-ms 50"
expect 0 "$kvf" $cp
grep -q "each block split over 8 pools" "$tmp/out" || fail "'$cp': no pool count in the header"
grep -q "32 KiB blocks: 8 pools of 4 KiB each, 16-block onboards" "$tmp/out" || fail "'$cp': no pool block size"
grep -q "verified: every byte (240 onboarded blocks)" "$tmp/out" || fail "'$cp': not verified"
json_ok "$kvf" $cp
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert d["pools"] == 8 and d["verified"] is True and d["bad_blocks"] == 0, d
[s] = d["sizes"]
assert s["block_bytes"] == 32768 and s["pool_block_bytes"] == 4096, s
assert s["bad_evictions"] == 0 and s["evicting"]["p50_ms"] > 0 and s["raw"]["idle"]["p50_ms"] > 0, s' \
    "$tmp/last.json"
expect 2 "$kvf" bench --mode contention --backend host --sizes 32K --pools 0
said "\-\-pools: 0 is out of range (1..1024)"
expect 2 "$kvf" bench --mode contention --backend host --sizes 32K --pools 1025
said "\-\-pools: 1025 is out of range (1..1024)"
expect 2 "$kvf" bench --mode contention --backend host --sizes 32K,4K --pools 64
said "\-\-pools 64: \-\-sizes 4096 is not a multiple of 64 x 128 bytes (8192)"
expect 2 "$kvf" bench --mode contention --pools 3
said "\-\-pools 3: \-\-sizes 262144 is not a multiple of 3 x 128 bytes (384)"

conventions "$kvf" bench --mode remote
expect 2 "$kvf" bench --mode remote --remote-url redis://127.0.0.1:1 --iters 0
said "\-\-iters: 0 is out of range (1..1000000)"
expect 2 "$kvf" bench --mode remote --remote-url redis://127.0.0.1:1 --sizes 4K,512M
said "\-\-sizes: 512M is out of range (1..256M)"
expect 2 "$kvf" bench --mode remote --remote-url redis://127.0.0.1:1 --sizes 4Q
said "\-\-sizes: '4Q' is not a size"

conventions "$kvf" fsck
json_ok "$kvf" fsck "$tmp/files"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["good"] == 16
assert d["clean"] is True' "$tmp/last.json"
unwritable "$kvf" fsck "$tmp/files"
expect 0 "$kvf" fsck "$tmp/files" --namespace bench -v
grep -q ": ok" "$tmp/out"
expect 2 "$kvf" fsck
said "which directory"

# ---- fsck after damage: flip one byte of one block's payload, leave a
# torn temporary file: fsck fails, naming the damaged pool
f=$(ls "$tmp"/files/bench/*.kvf | head -n 1)
printf '\377' | dd of="$f" bs=1 seek=5000 conv=notrunc 2>/dev/null
: >"$tmp/files/bench/.0000000000000000000000000000abcd.999999999.1.tmp"
if "$kvf" fsck "$tmp/files" >"$tmp/fsck2"; then cat "$tmp/fsck2"; exit 1; fi
grep -q "15 good, 1 corrupt, 1 torn" "$tmp/fsck2"
grep -q "pool [0-9]*: checksum mismatch" "$tmp/fsck2"
expect 1 "$kvf" fsck "$tmp/files" --json -
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["corrupt"] == 1
assert d["clean"] is False' "$tmp/out"
if "$kvf" fsck "$tmp/nowhere" 2>/dev/null; then exit 1; fi
# a FIFO under a block's name: reported as foreign, not waited on, left
mkfifo "$tmp/files/bench/00000000000000000000000000000001.kvf"
if timeout 30 "$kvf" fsck "$tmp/files" >"$tmp/fsck3"; then cat "$tmp/fsck3"; exit 1; fi
grep -q "1 foreign" "$tmp/fsck3"
[ -p "$tmp/files/bench/00000000000000000000000000000001.kvf" ]

# a block of format version 1 (64-bit keys), written in that layout:
# reported as old format (exit 1), rewritten by --upgrade under its
# 32-digit name, then clean
mkdir -p "$tmp/v1/ns"
python3 - "$tmp/v1/ns" <<'PY'
import struct, sys
T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    T.append(c)
def crc(b):
    c = 0xffffffff
    for x in b:
        c = T[(c ^ x) & 0xff] ^ (c >> 8)
    return c ^ 0xffffffff
ns = 0xcbf29ce484222325
for ch in b"ns":
    ns = ((ns ^ ch) * 0x100000001b3) % 2**64
pay = bytes(range(256)) * 4
h = bytearray(b"KVFBLK\r\n" + struct.pack("<IIQQQIIQI", 1, 64, 0, ns, 0xabc, 16, 1, len(pay), crc(pay)))
h += struct.pack("<I", crc(bytes(h)))
open(sys.argv[1] + "/0000000000000abc.kvf", "wb").write(bytes(h) + pay)
# and one of format version 2 (128-byte header, one payload checksum)
h = bytearray(b"KVFBLK\r\n" + struct.pack("<IIQQQQIIQI", 2, 128, 0, ns, 0, 0xdef, 16, 1, len(pay), crc(pay)))
h += bytes(124 - len(h))
h += struct.pack("<I", crc(bytes(h)))
open(sys.argv[1] + "/00000000000000000000000000000def.kvf", "wb").write(bytes(h) + pay)
PY
expect 1 "$kvf" fsck "$tmp/v1"
grep -q "2 old format" "$tmp/out"
grep -q "fsck --upgrade" "$tmp/out"
expect 0 "$kvf" fsck "$tmp/v1" --upgrade
grep -q "2 good, .* 0 old format, 2 upgraded" "$tmp/out"
[ -f "$tmp/v1/ns/00000000000000000000000000000abc.kvf" ] && [ ! -e "$tmp/v1/ns/0000000000000abc.kvf" ]
expect 0 "$kvf" fsck "$tmp/v1"

geo="--layers 1 --kv 2 --heads 1 --tokens-per-block 16 --head-size 32"
conventions "$kvf" replay
json_ok "$kvf" replay --gen few-shot --requests 20 $geo --host-blocks 0 --disk "$tmp/rd" \
    --disk-blocks 64
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["verified"] is True
assert d["requests"] == 20 and d["cache"]["puts"] > 0' "$tmp/last.json"
unwritable "$kvf" replay --gen few-shot --requests 5 $geo
expect 2 "$kvf" replay --clients 5000
said "\-\-clients: 5000 is out of range (1..1024)"
expect 2 "$kvf" replay --offload-min-priority 101
said "\-\-offload-min-priority: 101 is out of range (0..100)"
expect 2 "$kvf" replay --gen bogus
said "\-\-gen: 'bogus' is not one of: system-prompt, multi-turn, few-shot, mixed"
expect 2 "$kvf" replay --remote-mode sometimes
said "\-\-remote-mode: 'sometimes' is not one of: off, write-through, read"
# the older spellings still work: --ns and --remote
expect 0 "$kvf" replay --gen few-shot --requests 5 $geo --disk "$tmp/rd2" --ns old
[ -d "$tmp/rd2/old" ] || fail "--ns did not name the namespace"
expect 0 "$kvf" replay --gen few-shot --requests 5 $geo --disk "$tmp/rd2" --namespace new
[ -d "$tmp/rd2/new" ] || fail "--namespace did not name the namespace"
expect 2 "$kvf" replay --remote-mode read
said "\-\-remote-mode needs --remote-url"

conventions "$kvf" stats
json_ok "$kvf" stats "$tmp/rd" --namespace replay $geo
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["stored_blocks"] > 0
assert d["layout_blocks"] == d["stored_blocks"]' "$tmp/last.json"
unwritable "$kvf" stats "$tmp/rd" $geo
expect 2 "$kvf" stats "$tmp/rd" --pools 0
said "\-\-pools: 0 is out of range (1..1024)"
expect 2 "$kvf" stats "$tmp/rd" --order diagonal
said "\-\-order: 'diagonal' is not one of: head, token"

# ---- words a user knows: the bench's rows name what they measure
for mode in dram posix; do
    "$kvf" bench --backend host --mode $mode $small --dir "$tmp/words" >"$tmp/words.out"
    if grep -Ei "reference|seed" "$tmp/words.out"; then fail "bench --mode $mode: a row says reference or seed"; fi
done
grep -q "kvferry / per-block files" "$tmp/words.out" || fail "no per-block files row"
"$kvf" bench $small >"$tmp/words.out"
grep -q "kvferry / per-block copy" "$tmp/words.out" || fail "no per-block copy row"
for cmd in "" bench replay; do
    "$kvf" $cmd --help >"$tmp/help.out"
    if grep -Ei "reference|seed[']s|seed (POSIX|transfer)" "$tmp/help.out"; then fail "kvferry $cmd --help: reference or seed"; fi
done

# ---- no NVIDIA driver: said plainly, not as CUDA's "driver version is insufficient"
"$kvf" info >"$tmp/info.out"
if grep -q "no usable GPU" "$tmp/info.out" && grep -qi "insufficient" "$tmp/info.out"; then
    cat "$tmp/info.out" >&2
    fail "kvferry info: no GPU reported as an insufficient driver"
fi

# ---- the spread of the rounds: measured from 3, a warning past 20 %
"$kvf" bench $small --iters 3 --json "$tmp/spread.json" >"$tmp/spread.out"
grep -q "spread: the middle half of each figure's 3 rounds lies within [0-9]* % of its median (load average" \
    "$tmp/spread.out" || { cat "$tmp/spread.out" >&2; fail "no spread line"; }
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); w = "WARNING" in open(sys.argv[2]).read()
assert d["rounds"] == 3 and d["spread"] >= 0 and d["load_average"] >= 0, d
assert w == (d["spread"] > 0.20), (w, d["spread"])' "$tmp/spread.json" "$tmp/spread.out"
"$kvf" bench $small >"$tmp/spread.out"
grep -q "spread: not known from 1 round(s): take --iters 3" "$tmp/spread.out" || fail "no spread hint"

# ---- --compare on the host backend: no column that only a GPU fills
"$kvf" bench --compare --backend host --blocks 4 --iters 1 --json "$tmp/cmp.jsonl" >"$tmp/cmp.out"
grep -q "^block  *part  *dir  *ceiling  *blk  *kvferry  *x ceil  *x blk  *spread\$" "$tmp/cmp.out" ||
    { cat "$tmp/cmp.out" >&2; fail "--compare's table on the host backend"; }
if grep -q "batch\|bat" "$tmp/cmp.out"; then fail "--compare on the host: a cudaMemcpyBatchAsync column"; fi
[ "$(grep -c '"block_bytes"' "$tmp/cmp.jsonl")" -eq 12 ] || fail "--compare --json: not 12 runs"

# ---- one exit code per kind of failure: 3 where what is named is not there
expect 3 "$kvf" fsck "$tmp/nowhere"
said "not a directory"
expect 3 "$kvf" fsck "$tmp/files" --namespace nosuch
said "nosuch: no such namespace"
expect 3 "$kvf" stats "$tmp/files" --namespace nosuch
said "nosuch: no such namespace"
expect 3 "$kvf" replay "$tmp/no-trace.jsonl"
said "no-trace.jsonl"
expect 3 "$kvf" info --config "$tmp/no-config.yaml"
said "no-config.yaml"
if "$kvf" info | grep -q "cuda   \(not built\|built.*no usable GPU\)"; then
    expect 3 "$kvf" bench --backend cuda --blocks 2 --iters 1
    said "kvferry bench: engine: "
    expect 3 "$kvf" replay --backend cuda --gen few-shot --requests 2
    said "kvferry replay: engine: "
    expect 3 "$kvf" bench --mode contention --backend cuda --sizes 4K --reps 2
    said "kvferry bench: engine: "
fi
KVF_BACKEND=gpu expect 2 "$kvf" bench --blocks 2 --iters 1
said "KVF_BACKEND=\"gpu\""
printf '{"bad json\n' >"$tmp/bad-trace.jsonl"
expect 2 "$kvf" replay "$tmp/bad-trace.jsonl"
for cmd in "" bench replay fsck stats info; do
    "$kvf" $cmd --help >"$tmp/help.out" || true
    grep -q "3 a directory, namespace, file" "$tmp/help.out" ||
        fail "kvferry $cmd --help: no exit codes"
done

# ---- info --config FILE: that file's settings, as $KVF_CONFIG would name it
printf 'backend: host\n' >"$tmp/kvf.yaml"
if "$kvf" info --config "$tmp/kvf.yaml" >"$tmp/cfg.out" 2>"$tmp/err"; then
    grep -q "^backend  *host  *file " "$tmp/cfg.out" || { cat "$tmp/cfg.out" >&2; fail "info --config FILE"; }
else
    said "yaml" # a build without libyaml says so
fi

# ---- an unknown KVF_* variable: a warning naming it; known ones: none
KVF_BAKEND=host "$kvf" version 2>"$tmp/err" >/dev/null
said "warning: KVF_BAKEND is not a kvferry setting"
KVF_BACKEND=host KVF_LOG=warn "$kvf" version 2>"$tmp/err" >/dev/null
if grep -q warning "$tmp/err"; then cat "$tmp/err" >&2; fail "a warning for a known variable"; fi

# ---- one default per option: bench and replay move the same blocks, fsync the same
"$kvf" bench --backend host --blocks 2 --iters 1 --json "$tmp/g1.json" >/dev/null
"$kvf" replay --gen few-shot --requests 3 --json "$tmp/g2.json" >/dev/null
python3 -c 'import json, sys; b, r = (json.load(open(p)) for p in sys.argv[1:])
assert b["block_bytes"] == r["block_bytes"] == 262144, (b["block_bytes"], r.get("block_bytes"))' \
    "$tmp/g1.json" "$tmp/g2.json"
for cmd in bench replay; do
    "$kvf" $cmd --help | grep -q -- "--fsync none|batch|block .*default batch" ||
        fail "kvferry $cmd --help: --fsync's default is not batch"
done

# ---- stats: what is not 0, unless --all
"$kvf" stats "$tmp/rd" $geo >"$tmp/st1"
"$kvf" stats "$tmp/rd" $geo --all >"$tmp/st2"
if grep -v '^#' "$tmp/st1" | grep -q ' 0$'; then cat "$tmp/st1" >&2; fail "stats printed a 0"; fi
grep -v '^#' "$tmp/st2" | grep -q ' 0$' || fail "stats --all left out the zeros"
grep -q "metric(s) at 0 not shown (--all shows them)" "$tmp/st1" || fail "stats: no line on what it left out"
[ "$(grep -vc '^#' "$tmp/st1")" -gt 0 ] || fail "stats printed nothing"

# ---- replay: every remote operation failing is a failure
if "$kvf" info | grep -q "remote tier: redis built"; then
    expect 1 "$kvf" replay --gen few-shot --requests 5 $geo --remote-url redis://127.0.0.1:1 \
        --remote-mode write-through
    said "every remote operation failed"
fi

# ---- bench --compare --plot: what the plot needs is checked before the
# sweep (exit 3 at once, nothing run); a python3 without matplotlib (-S: no
# site packages) stands in for one where it is missing
mkdir "$tmp/nompl"
printf '#!/bin/sh\nexec %s -S "$@"\n' "$(command -v python3)" >"$tmp/nompl/python3"
chmod +x "$tmp/nompl/python3"
PATH="$tmp/nompl:$PATH" expect 3 "$kvf" bench --compare --backend host --plot "$tmp/p.png"
said "matplotlib is not installed"
said "PEP 668"
said "nothing was run"
[ ! -s "$tmp/out" ] || { cat "$tmp/out" >&2; fail "--plot without matplotlib ran the sweep"; }
KVF_PLOT_SCRIPT="$tmp/no-plot.py" expect 3 "$kvf" bench --compare --backend host --plot "$tmp/p.png"
said "plot_compare.py not found"
if python3 -c 'import matplotlib' 2>/dev/null; then
    :
else
    printf '{"block_bytes": 4096, "tokens": 0, "offload_gbs": 1, "onboard_gbs": 1, "both_gbs": 1, "ceiling": {"offload_gbs": 2}, "reference": {}}\n' >"$tmp/c.jsonl"
    if python3 "$(dirname "$0")/../bench/plot_compare.py" "$tmp/c.jsonl" "$tmp/c.png" \
        2>"$tmp/err"; then
        fail "plot_compare.py passed without matplotlib"
    fi
    said "matplotlib is not installed"
fi

# ---- the remote bench's JSON, where redis-server is installed
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null &&
    "$kvf" info | grep -q "^  redis .*hiredis"; then
    start_redis 11
    rb="bench --mode remote --remote-url redis://127.0.0.1:$port --sizes 4K --iters 2 --batch-bytes 16K"
    json_ok "$kvf" $rb
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["verified"] is True
assert len(d["rows"]) == 3' "$tmp/last.json"
    unwritable "$kvf" $rb
    kill $rpid
    wait $rpid 2>/dev/null || true
    rpid=
fi

# the event timeline: every part of a large batch registered and completed
KVF_TIMELINE="$tmp/timeline.txt" "$kvf" bench --backend host --layers 1 --kv 1 --heads 1 \
    --tokens-per-block 32 --head-size 1 --blocks 10000 --iters 1 >/dev/null
grep -q " submit 0 10000\$" "$tmp/timeline.txt"
parts=$(grep -c " part " "$tmp/timeline.txt")
[ "$parts" -ge 5 ]
[ "$(grep -c " complete " "$tmp/timeline.txt")" -ge "$parts" ]
echo "cli: info, version, bench (3 modes, remote), fsck, replay, stats: conventions, JSON, timeline: ok"
