#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# kvferry replay end to end over the cache: generated shared-prefix traces
# replayed host only, host+disk and disk only (every block got back is
# checked byte for byte by replay itself, which exits 1 on any mismatch);
# hits where prefixes are shared; a written trace replays to the same
# report; a restart finds the disk tier again; damaged files are refused and
# recomputed, never served; malformed lines fail with their line number;
# kvferry stats reports the blocks left on disk; with --prefill-cost the
# plan is followed: hits it loads are got and checked, the others
# recomputed, each counted per tier, and its predicted time is never above
# either pure policy's.
set -eu
kvf=$1
. "$(dirname "$0")/redis_start.sh"
tmp=$(mktemp -d)
rpid=
trap 'if [ -n "$rpid" ]; then kill "$rpid" 2>/dev/null; fi; rm -rf "$tmp"' EXIT
# 8 KiB blocks: fast under the sanitizers on a 2-core box
geo="--layers 2 --kv 2 --heads 2 --tokens-per-block 16 --head-size 32"

# the value of a JSON field of a replay report: field NAME FILE [SECTION]
field() {
    python3 -c 'import json, sys
d = json.load(open(sys.argv[2]))
d = d[sys.argv[3]] if len(sys.argv) > 3 else d
v = d[sys.argv[1]]
print(str(v).lower() if isinstance(v, bool) else v)' "$@"
}
positive() { # name value
    case "$2" in
    "" | 0 | 0.0*) echo "expected $1 > 0, got '$2'" >&2; exit 1 ;;
    esac
}
zero() {
    [ "$2" = 0 ] || { echo "expected $1 = 0, got '$2'" >&2; exit 1; }
}
# the report without the lines that differ between runs (source, timings)
stable() {
    sed -e 's/^kvferry replay: \([0-9]*\) requests ([^)]*)/kvferry replay: \1 requests/' \
        -e '/^  time:/d' "$1"
}

# ---- each workload alone shares prefixes: host tier only
for gen in system-prompt multi-turn few-shot; do
    "$kvf" replay --gen $gen --requests 40 --seed 2 $geo --gpu-blocks 64 --host-blocks 1024 \
        --json "$tmp/$gen.json" >"$tmp/$gen.out"
    positive "$gen host hits" "$(field host "$tmp/$gen.json" hits)"
    grep -q "every byte right" "$tmp/$gen.out"
done

# ---- mixed, host only, with a host tier small enough to evict
"$kvf" replay --gen mixed --requests 80 --seed 3 $geo --gpu-blocks 48 --host-blocks 256 \
    --json "$tmp/host.json" --write-trace "$tmp/mixed.jsonl" >"$tmp/host.out"
cat "$tmp/host.out"
positive "host hits" "$(field host "$tmp/host.json" hits)"
zero "disk hits" "$(field disk "$tmp/host.json" hits)"
positive "host evictions" "$(field evictions "$tmp/host.json" host)"
positive "prefill saved" "$(field prefill_tokens_saved "$tmp/host.json")"
zero "errors" "$(field errors "$tmp/host.json")"
[ "$(field verified "$tmp/host.json")" = true ]
[ "$(wc -l <"$tmp/mixed.jsonl")" -eq 80 ]

# the written trace replays to the same report
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 256 >"$tmp/host2.out"
stable "$tmp/host.out" >"$tmp/a"
stable "$tmp/host2.out" >"$tmp/b"
diff "$tmp/a" "$tmp/b"

# ---- host + disk: host victims move down to disk and are hit there
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/d1" \
    --disk-blocks 4096 --json "$tmp/both.json" --prometheus >"$tmp/both.out"
positive "host hits" "$(field host "$tmp/both.json" hits)"
positive "disk hits" "$(field disk "$tmp/both.json" hits)"
positive "disk bytes in" "$(field bytes_in "$tmp/both.json" disk)"
positive "disk bytes out" "$(field bytes_out "$tmp/both.json" disk)"
zero "errors" "$(field errors "$tmp/both.json")"
grep -q "^kvferry_cache_" "$tmp/both.out"
left=$(field blocks "$tmp/both.json" disk)
positive "blocks left on disk" "$left"

# kvferry stats on the finished replay's directory: the blocks left there
"$kvf" stats "$tmp/d1" --ns replay $geo >"$tmp/stats.out"
cat "$tmp/stats.out" | head -n 3
grep -q "^# kvferry stats .*: $left stored blocks, $left of this layout" "$tmp/stats.out"
grep "^kvferry_cache_" "$tmp/stats.out" | grep 'disk' | grep -q " $left\$"
# another geometry finds none of them, and says so
"$kvf" stats "$tmp/d1" --ns replay --layers 3 2>"$tmp/stats.err" >/dev/null
grep -q "have another layout" "$tmp/stats.err"
if "$kvf" stats "$tmp/nowhere" 2>/dev/null; then exit 1; fi

# a restart finds the disk tier: the same trace again hits more on disk
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/d1" \
    --disk-blocks 4096 --json "$tmp/again.json" >/dev/null
first=$(field disk "$tmp/both.json" hits)
again=$(field disk "$tmp/again.json" hits)
[ "$again" -gt "$first" ] || { echo "restart: disk hits $again, not above $first" >&2; exit 1; }

# ---- 4 clients at once (threads sharing the cache, each with its own primary
# slots): the same checks hold, only the figures vary from run to run
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/d3" \
    --disk-blocks 512 --clients 4 --json "$tmp/clients.json" >/dev/null
positive "hits with 4 clients" "$(field disk "$tmp/clients.json" hits)"
zero "errors with 4 clients" "$(field errors "$tmp/clients.json")"
[ "$(field verified "$tmp/clients.json")" = true ]
[ "$(field clients "$tmp/clients.json")" = 4 ]
if "$kvf" replay --clients 9 --gpu-blocks 8 2>/dev/null; then exit 1; fi

# ---- the cache owns the GPU blocks (--gpu-tier: acquire, alloc, commit,
# unpin); one client, then three sharing prefixes at once (which found a
# cache bug: an acquire in place not waiting for another's copy up)
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --gpu-tier --host-blocks 64 \
    --disk "$tmp/d5" --disk-blocks 512 --json "$tmp/gpu.json" >/dev/null
positive "gpu hits" "$(field gpu "$tmp/gpu.json" hits)"
positive "disk hits under a gpu tier" "$(field disk "$tmp/gpu.json" hits)"
zero "gpu tier errors" "$(field errors "$tmp/gpu.json")"
[ "$(field verified "$tmp/gpu.json")" = true ]
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 96 --gpu-tier --host-blocks 128 \
    --disk "$tmp/d6" --disk-blocks 1024 --clients 3 --json "$tmp/gpu3.json" >/dev/null
zero "gpu tier errors, 3 clients" "$(field errors "$tmp/gpu3.json")"
[ "$(field verified "$tmp/gpu3.json")" = true ]

# ---- disk only
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 0 --disk "$tmp/d2" \
    --disk-blocks 1024 --json "$tmp/disk.json" >"$tmp/disk.out"
zero "host hits" "$(field host "$tmp/disk.json" hits)"
positive "disk hits" "$(field disk "$tmp/disk.json" hits)"
zero "errors" "$(field errors "$tmp/disk.json")"
[ "$(field verified "$tmp/disk.json")" = true ]

# damage every stored block behind the cache's back: each get of one is
# refused (checksum), counted as a failure and recomputed, never served
for f in "$tmp"/d2/replay/*.kvf; do
    printf '\377' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
done
if KVF_LOG=error "$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 0 \
    --disk "$tmp/d2" --disk-blocks 1024 --json "$tmp/corrupt.json" >/dev/null 2>"$tmp/corrupt.err"; then
    echo "a replay over corrupt blocks passed" >&2
    exit 1
fi
grep -q "get failed: stored block is corrupt; recomputed" "$tmp/corrupt.err"
if grep -q "WRONG DATA" "$tmp/corrupt.err"; then exit 1; fi
[ "$(field verified "$tmp/corrupt.json")" = true ]
positive "failures" "$(field failures "$tmp/corrupt.json")"
# the recomputed blocks were stored again: the next replay meets fewer
KVF_LOG=error "$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 0 \
    --disk "$tmp/d2" --disk-blocks 1024 --json "$tmp/healed.json" >/dev/null 2>&1 || true
[ "$(field verified "$tmp/healed.json")" = true ]
[ "$(field failures "$tmp/healed.json")" -lt "$(field failures "$tmp/corrupt.json")" ]

# ---- the remote tier, where redis-server is installed: one replay writes
# through to it, a second one (another machine: no disk, an empty host tier)
# finds the blocks there
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null &&
    "$kvf" info | grep -q "remote.*built"; then
    start_redis 7
    url=redis://127.0.0.1:$port
    "$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/d4" \
        --disk-blocks 256 --remote $url --json "$tmp/wt.json" >/dev/null
    zero "write-through errors" "$(field errors "$tmp/wt.json")"
    positive "remote bytes in" "$(field bytes_in "$tmp/wt.json" remote)"
    "$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --remote $url \
        --remote-mode read --clients 2 --json "$tmp/rd.json" >/dev/null
    positive "remote hits" "$(field remote "$tmp/rd.json" hits)"
    zero "remote errors" "$(field remote_errors "$tmp/rd.json")"
    [ "$(field verified "$tmp/rd.json")" = true ]
    kill $rpid
    wait $rpid 2>/dev/null || true # gone for certain before the next replay starts
    rpid=
    # the store gone: lookups miss, gets are never wrong
    KVF_LOG=error "$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 \
        --remote $url --remote-mode read --json "$tmp/gone.json" >/dev/null 2>&1 || true
    [ "$(field verified "$tmp/gone.json")" = true ]
    positive "remote errors, store gone" "$(field remote_errors "$tmp/gone.json")"
fi
if "$kvf" replay --remote-mode read 2>/dev/null; then exit 1; fi

# ---- traces written by hand: block keys given directly, salts, priorities
cat >"$tmp/hand.jsonl" <<'EOF'
{"id": "a", "arrival": 0.5, "blocks": ["0x10", "0x11", "0x12"], "priority": 90}

{"id": "b", "arrival": 0.75, "blocks": ["0x10", "0x11", 19], "note": {"any": ["value", 1]}}
{"id": "c", "arrival": 1.0, "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], "salt": "lora"}
{"id": "d", "arrival": 1.5, "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "salt": "lora"}
{"id": "e", "arrival": 2.0, "tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}
EOF
"$kvf" replay "$tmp/hand.jsonl" $geo --gpu-blocks 8 --host-blocks 16 --json "$tmp/hand.json" \
    >/dev/null
# b hits 0x10, 0x11; d hits c's block (same salt); e has no salt: a miss
[ "$(field host "$tmp/hand.json" hits)" = 3 ]
[ "$(field requests "$tmp/hand.json")" = 5 ]

# a request with no blocks, one naming a block twice (valid input), with
# and without the GPU tier: replayed without errors, under UBSan too
cat >"$tmp/odd.jsonl" <<'EOF'
{"id": "none", "blocks": []}
{"id": "twice", "blocks": ["0x21", "0x22", "0x21"]}
{"id": "again", "blocks": ["0x21", "0x22", "0x21", "0x23", "0x23"]}
{"id": "notokens", "tokens": []}
EOF
for tier in "" --gpu-tier; do
    "$kvf" replay "$tmp/odd.jsonl" $geo --gpu-blocks 8 --host-blocks 16 $tier \
        --json "$tmp/odd.json" >/dev/null
    zero "errors, repeated keys $tier" "$(field errors "$tmp/odd.json")"
    [ "$(field verified "$tmp/odd.json")" = true ]
done

# ---- the planner: tier costs held, so the plans are the same on every run
plan_check() { # report.json: loaded + recomputed = hits, gets = loaded, ttft plan <= both
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); p = d["plan"]
tiers = ("host", "disk", "remote", "gpu")
assert all(p["loaded"][t] + p["recomputed"][t] == d["hits"][t] for t in tiers), p
assert d["verified_blocks"] == sum(p["loaded"].values()), (d["verified_blocks"], p)
t = p["ttft_s"]
assert t["plan"] <= min(t["recompute_all"], t["load_all"]) * (1 + 1e-9), t
assert p["requests"] == d["requests"] and d["verified"] and d["errors"] == 0' "$1"
}
prefill="--prefill-cost 2048:0.06,8192:0.255,32768:1.4 --plan-layers 32"
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/p1" \
    $prefill --tier-cost host=1e-5:2e10 --tier-cost disk=2e-4:2e9 --json "$tmp/pfast.json" \
    >"$tmp/pfast.out"
grep "plan:" "$tmp/pfast.out"
plan_check "$tmp/pfast.json"
positive "disk blocks the plan loaded" "$(field disk "$tmp/pfast.json" hits)"
python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["plan"]
assert p["loaded"]["disk"] > 0 and p["costs"]["disk"]["held"], p' "$tmp/pfast.json"
# a disk slower than computing its blocks: the leading disk hits are
# recomputed, but the back of a prefix loads while its front is computed
# (the front shape), and the blocks it got are checked
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/p2" \
    $prefill --tier-cost host=1e-5:2e10 --tier-cost disk=2e-4:2e6 --json "$tmp/pslow.json" \
    >"$tmp/pslow.out"
grep "plan shapes" "$tmp/pslow.out"
plan_check "$tmp/pslow.json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); p = d["plan"]
assert p["shapes"]["front"]["disk"] > 0 and p["loaded"]["disk"] > 0, p
assert p["recomputed"]["disk"] > p["loaded"]["disk"], p
assert p["ttft_s"]["plan"] < p["ttft_s"]["recompute_all"], p' "$tmp/pslow.json"
# a disk whose every read takes longer than the whole prefill: every disk hit recomputed
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/p4" \
    $prefill --tier-cost host=1e-5:2e10 --tier-cost disk=10:2e6 --json "$tmp/pnever.json" \
    >/dev/null
plan_check "$tmp/pnever.json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); p = d["plan"]
assert p["loaded"]["disk"] == 0 and p["recomputed"]["disk"] == d["hits"]["disk"] > 0, p
assert p["shapes"]["front"]["disk"] == 0, p' "$tmp/pnever.json"
# the slow disk again for an engine that computes only after its loads: no
# front, and the disk hits that the front shape loaded are recomputed
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/p5" \
    $prefill --tier-cost host=1e-5:2e10 --tier-cost disk=2e-4:2e6 --plan-leading-only \
    --json "$tmp/plead.json" >/dev/null
plan_check "$tmp/plead.json"
python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["plan"]
assert all(n == 0 for n in p["shapes"]["front"].values()), p
assert p["loaded"]["disk"] == 0 and p["recomputed"]["disk"] > 0, p' "$tmp/plead.json"
# the same options again: the same plans
rm -rf "$tmp/p2"
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/p2" \
    $prefill --tier-cost host=1e-5:2e10 --tier-cost disk=2e-4:2e6 >"$tmp/pslow2.out"
[ "$(grep -E 'plan:|plan shapes|predicted' "$tmp/pslow.out")" = \
    "$(grep -E 'plan:|plan shapes|predicted' "$tmp/pslow2.out")" ]
# costs learnt as the replay runs (nothing held): still consistent
"$kvf" replay "$tmp/mixed.jsonl" $geo --gpu-blocks 48 --host-blocks 64 --disk "$tmp/p3" \
    $prefill --plan-overlap --json "$tmp/plearn.json" >/dev/null
plan_check "$tmp/plearn.json"
for bad in "--prefill-cost 16:-1" "--prefill-cost 32:1,16:2" "--prefill-cost x" \
    "--tier-cost disk=1:2" "--prefill-cost 16:1 --tier-cost dsk=1:2" \
    "--prefill-cost 16:1 --tier-cost disk=-1:2" "--prefill-cost 16:1 --gpu-tier" \
    "--prefill-cost 16:1 --plan-min-gain 1" "--prefill-cost 16:1 --plan-min-gain x" "--plan-min-gain 0.1" \
    "--plan-leading-only"; do
    if "$kvf" replay $bad 2>/dev/null; then echo "replay took $bad" >&2; exit 1; fi
done

# ---- progress: a bar on standard error when it is a terminal, nothing
# when it is not
"$kvf" replay --gen mixed --requests 60 $geo --host-blocks 64 >/dev/null 2>"$tmp/quiet.err"
if grep -q "requests \[" "$tmp/quiet.err"; then
    echo "a progress bar on a standard error that is no terminal" >&2
    exit 1
fi
if command -v script >/dev/null; then
    TERM=xterm script -qc "'$kvf' replay --gen mixed --requests 60 $geo --host-blocks 64 \
        >/dev/null" /dev/null >"$tmp/tty.out" 2>&1
    grep -q "kvferry replay: requests \[#*" "$tmp/tty.out"
    grep -q "60/60 (100%)" "$tmp/tty.out"
fi

# ---- malformed lines: exit 2, the file and line named
printf '%s\n' '{"id": "ok", "tokens": [1, 2]}' '' '{"id": "bad", "tokens": [1, 2,]}' \
    >"$tmp/bad.jsonl"
if "$kvf" replay "$tmp/bad.jsonl" --host-blocks 8 2>"$tmp/bad.err"; then exit 1; fi
grep -q "bad.jsonl:3: column" "$tmp/bad.err"
printf '{"tokens": [1]}\n{"blocks": ["0x0"]}\n' >"$tmp/bad2.jsonl"
if "$kvf" replay "$tmp/bad2.jsonl" 2>"$tmp/bad2.err"; then exit 1; fi
grep -q "bad2.jsonl:2: .*key 0" "$tmp/bad2.err"
# strict JSON: invalid UTF-8 in a string is refused with its line
printf '{"tokens": [1]}\n{"id": "caf\351", "tokens": [1]}\n' >"$tmp/latin1.jsonl"
if "$kvf" replay "$tmp/latin1.jsonl" 2>"$tmp/latin1.err"; then exit 1; fi
grep -q "latin1.jsonl:2: column 12: invalid UTF-8 (byte 0xe9)" "$tmp/latin1.err"
# bad options
if "$kvf" replay --gen bogus 2>/dev/null; then exit 1; fi
if "$kvf" replay --host-blocks 0 2>/dev/null; then exit 1; fi
if "$kvf" replay --disk-blocks 5 2>/dev/null; then exit 1; fi
if "$kvf" replay "$tmp/missing.jsonl" 2>/dev/null; then exit 1; fi
if "$kvf" replay --heads 0 2>/dev/null; then exit 1; fi
echo "replay: 3 workloads, host / host+disk / disk, 4 clients, gpu tier, remote, trace round trip, restart, damaged files, stats, plans: ok"
