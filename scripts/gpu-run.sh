#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# One whole build-test-benchmark cycle on a GPU machine, sized for one call
# of at most 10 minutes. In the order of what a run is worth:
#   1. the build (CUDA on, S3 off);
#   2. the CUDA tests four at once, in up to CUDA_REPEAT (5) rounds;
#   3. compute-sanitizer memcheck over the engine, cache, layer-wise and
#      backend tests, then racecheck and synccheck over the backend's;
#   4. bench/cuda_paths over partial copies (the paths alone);
#   5. partial copies through the engine, AUTO and each path forced, and
#      BASE_DIR's build beside this one;
#   6. the onboard beside offloads and into slots being evicted
#      (`kvferry bench --mode contention`, 256 KiB and 2 MiB, raw copies
#      in the same run);
#   7. LMCache's transfer kernel beside kvferry (bench/lmcache_compare.py);
#   8. whatever else fits: BASE_DIR's build through the contention bench,
#      `kvferry bench --compare`, the whole-block A/B
#      against BASE_DIR, the latency probe, torch's gather, the file tier
#      (POSIX and GDS), replay, the Python GPU tests and every other test;
#      TTFT and the planner's bench on request (RUN_TTFT, RUN_PLAN), and
#      layer-wise arrival from disk (RUN_DISK_ARRIVAL) and from a remote
#      Redis (RUN_REMOTE_ARRIVAL).
# Each step runs only while the time budget (BUDGET_S, default 540 s)
# holds it, cut to what is left; a step left out says so. SKIP_<STEP>=1
# leaves one out: SKIP_SANITIZE, SKIP_PATHS, SKIP_PARTIAL, SKIP_CONTEND,
# SKIP_LMCACHE, SKIP_COMPARE, SKIP_LATENCY, SKIP_TORCH, SKIP_FILE,
# SKIP_GDS, SKIP_REPLAY, SKIP_PYTEST, SKIP_REST. CONTEND_ARGS: more options
# for the contention bench (e.g. "--reps 1000": its p99 of the default 200
# onboards is the second worst).
#
# Output: $OUT (default ./gpu-out) gets run.log (everything said here,
# a summary at its end), logs.tar.gz (each step's whole log and JSON) and
# results.tar.gz (the raw results, named as bench/results/ names them,
# h100-*/h200-*: `tar xzf results.tar.gz -C bench/results`), packed again
# after each step, so a run stopped at its limit still brings them back.
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # the steps run in the build folder too
exec > >(tee "$OUT/run.log") 2>&1
BUDGET_S=${BUDGET_S:-540}
L=$(mktemp -d /tmp/kvf-gpu-logs.XXXXXX)
R=$(mktemp -d /tmp/kvf-gpu-results.XXXXXX)
SUMMARY=$L/summary.txt
: >"$SUMMARY"
pack() {
    tar czf "$OUT/logs.tar.gz" -C "$L" . 2>/dev/null
    tar czf "$OUT/results.tar.gz" -C "$R" . 2>/dev/null
}
summary() {
    echo
    echo "==== summary ($SECONDS s of $BUDGET_S)"
    cat "$SUMMARY"
    pack
}
trap summary EXIT
note() { echo "$*" >>"$SUMMARY"; }
left() { echo $((BUDGET_S - SECONDS)); }
# fits NEED WHAT: whether NEED seconds are left for WHAT (else says it is left out)
fits() {
    local need=$1
    shift
    [ "$(left)" -ge "$need" ] && return 0
    echo "left out: $* (needs ${need} s, $(left) s of ${BUDGET_S} left)"
    note "left out: $* (needs ${need} s, $(left) s left)"
    return 1
}
# cap T: T seconds, or what is left less 15 s for packing, if that is less
cap() {
    local t=$1 l=$(($(left) - 15))
    [ "$l" -lt "$t" ] && t=$l
    [ "$t" -lt 5 ] && t=5
    echo "$t"
}
# step LOG T CMD...: CMD under a limit of T seconds (capped), its output in $L/LOG;
# says its status and time, and notes them in the summary
step() {
    local log=$1 t s0=$SECONDS rc
    t=$(cap "$2")
    shift 2
    timeout "$t" "$@" >"$L/$log" 2>&1
    rc=$?
    local said
    said="$log: rc=$rc in $((SECONDS - s0)) s$([ $rc = 124 ] && echo " (stopped at its ${t} s limit)")"
    echo "$said"
    note "$said"
    pack
    return $rc
}
# keep LOG...: the step logs (or JSON) as raw results, named $GPU-LOG
keep() {
    local f
    for f in "$@"; do
        [ -s "$L/$f" ] && cp "$L/$f" "$R/$GPU-$f"
    done
    pack
}

date -u
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv || true
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 |
    grep -oiE 'h100|h200|a100|l40s|b200' | head -n 1 | tr 'A-Z' 'a-z')
GPU=${GPU:-gpu}
note "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) ($GPU)"
# the copy paths this tree builds (src/backend/cuda/cuda_paths.h)
grep -h '^#define KVF_CUDA_PATHS(' src/backend/cuda/cuda_paths.h || true
# Libraries this image lacks travel in .deps (scripts/fetch-gpu-deps.sh, run
# where Debian's apt works: liburing, hiredis, libxxhash, libyaml, cJSON, and
# redis-server for the remote tier's tests; LMCache's module for step 7),
# unpacked from Debian's packages; used when present.
if [ -d .deps/root ]; then
    D=$PWD/.deps
    export CMAKE_PREFIX_PATH=$D/root/usr
    export PKG_CONFIG_PATH=$D/root/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D/root
    export LD_LIBRARY_PATH=$D/root/usr/lib/x86_64-linux-gnu:$D/redis/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PATH=$D/redis/bin:$PATH
    # the code includes <hiredis/hiredis.h> and <liburing.h>; hiredis.pc names .../include/hiredis
    export CPATH=$D/root/usr/include LIBRARY_PATH=$D/root/usr/lib/x86_64-linux-gnu
else
    echo "no .deps: the build uses what this image has (scripts/fetch-gpu-deps.sh makes .deps)"
fi
B=${GPU_BUILD:-build-gpu}
s0=$SECONDS
# 1. the build. The S3 store is left out: .deps maps pkg-config into its
# own root, where the image's libcurl is not, and nothing of it runs on the GPU
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON -DKVF_S3=OFF >"$L/configure.log" 2>&1 &&
    cmake --build $B -j"$(nproc)" >"$L/build.log" 2>&1
rc=$?
[ $rc -eq 0 ] || tail -n 30 "$L/configure.log"
echo "build: rc=$rc in $((SECONDS - s0)) s, $(grep -c 'warning: ' "$L/build.log") warning(s)"
note "build: rc=$rc in $((SECONDS - s0)) s, $(grep -c 'warning: ' "$L/build.log") warning(s)"
grep -E "error|warning: " "$L/build.log" | grep -v 'Built target' | head -40
pack
[ $rc = 0 ] || exit 1
# BASE_DIR: the source of another revision (git archive REV | tar -x -C DIR,
# carried along), whose CLI is built in the background while the tests
# run (on the cores they leave) and timed against this one below
BASE_PID=
if [ -n "${BASE_DIR:-}" ]; then
    (cmake -S "$BASE_DIR" -B "$BASE_DIR/build" -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON -DKVF_S3=OFF &&
        nice -n 19 cmake --build "$BASE_DIR/build" -j"$(nproc)" --target kvferry_cli) \
        >"$L/base-build.log" 2>&1 &
    BASE_PID=$!
fi
# base_ready: whether BASE_DIR's CLI is built (waits for its build)
base_ready() {
    [ -n "$BASE_PID" ] && wait "$BASE_PID" 2>/dev/null
    BASE_PID=
    [ -n "${BASE_DIR:-}" ] && [ -x "$BASE_DIR/build/kvferry" ]
}
# the sysroot was for hiredis.pc only: the install test's pkg-config must not prepend it
unset PKG_CONFIG_SYSROOT_DIR

# 2. The CUDA tests four at a time, in up to CUDA_REPEAT (5) rounds while
# CUDA_TESTS_S (120 s) holds the next one, until a round fails, as `ctest
# -j4` runs them: each program shares the GPU, the driver and the host with
# three others (CTEST_REGEX: only the tests whose names match, here and
# below)
if fits 60 "the CUDA tests under ctest -j4"; then
    cuda_end=$((SECONDS + ${CUDA_TESTS_S:-120}))
    round_s=0 rounds=0
    for i in $(seq "${CUDA_REPEAT:-5}"); do
        if [ "$i" -gt 1 ] && [ $((cuda_end - SECONDS)) -lt $((round_s + 5)) ]; then
            note "  CUDA tests: rounds $i.. left out (CUDA_TESTS_S)"
            break
        fi
        r0=$SECONDS
        if ! (cd $B && step "ctest-cuda-$i.log" $((cuda_end - SECONDS)) ctest -R "${CTEST_REGEX:-^test_cuda_}" \
            -j4 --output-on-failure); then
            tail -n 40 "$L/ctest-cuda-$i.log"
            grep -E "Test +#.*(Failed|Timeout)" "$L/ctest-cuda-$i.log" | sed 's/^/  /' >>"$SUMMARY"
            break
        fi
        round_s=$((SECONDS - r0))
        rounds=$i
    done
    grep -hE "Test +#.*(Passed|Failed|Timeout|Skipped)|tests passed" "$L"/ctest-cuda-1.log
    note "  CUDA tests: $rounds round(s) passed, $(grep -h 'tests passed' "$L/ctest-cuda-1.log")"
fi

# what follows needs a GPU: without one (a trial of this script on a
# machine without, say) it ends here
if ! nvidia-smi -L >/dev/null 2>&1; then
    note "no GPU (nvidia-smi -L fails): the sanitizers and benchmarks are left out"
    exit 0
fi

# 3. compute-sanitizer. SANITIZE: the tool:test pairs to run, in this
# order, each while the budget holds one and SANITIZE_S (default 100 s)
# of the budget is not spent on them. memcheck first, where a wrong
# descriptor or range shows as an access out of bounds: the engine, cache
# and layer-wise tests (each a few seconds), then the backend's tests,
# the path tests last (the longest); then racecheck and synccheck over
# the backend's tests, which report only shared-memory hazards and
# barrier misuse: the copy kernel and the tests' kernels use neither
# (only the GDS checksum kernel does), so these come after everything
# memcheck can find (racecheck of the path tests alone took 38 s on an
# H200, its synccheck 13 s)
CUDA_BACKEND_TESTS="test_cuda_backend_sync test_cuda_backend_memory test_cuda_backend_staged test_cuda_backend_paths"
SANITIZE=${SANITIZE:-"memcheck:test_cuda_engine memcheck:test_cuda_cache memcheck:test_cuda_layers $(for t in $CUDA_BACKEND_TESTS; do echo memcheck:$t; done) $(for t in $CUDA_BACKEND_TESTS; do echo racecheck:$t synccheck:$t; done)"}
if command -v compute-sanitizer >/dev/null && [ -z "${SKIP_SANITIZE:-}" ]; then
    san_end=$((SECONDS + ${SANITIZE_S:-100}))
    for t in $SANITIZE; do
        set -- "${t%%:*}" "${t#*:}"
        fits 60 "compute-sanitizer $1 $2" || continue
        [ $SECONDS -lt $san_end ] || {
            note "left out: compute-sanitizer $1 $2 (SANITIZE_S spent)"
            continue
        }
        # cuFile's own driver open makes a failing cuMemFree (error 1, inside
        # libcufile) that memcheck reports: these runs leave cuFile out (the
        # GDS path is checked separately with --report-api-errors no)
        KVF_CUFILE_LIB=/nonexistent step "$1-$2.log" $((san_end - SECONDS > 90 ? 90 : san_end - SECONDS + 5)) \
            compute-sanitizer --tool "$1" --error-exitcode 9 $B/tests/"$2"
        echo "  $(tail -n 1 "$L/$1-$2.log")"
        note "  $(tail -n 1 "$L/$1-$2.log")"
    done
elif [ -z "${SKIP_SANITIZE:-}" ]; then
    note "left out: compute-sanitizer (not on this machine)"
fi
$B/kvferry info >"$L/info.txt" 2>&1

# 4. the paths alone over partial copies: GB/s of each beside the ceiling,
# the path AUTO took, and AUTO handed the batch in the engine's 4 MiB calls
# (bench/cuda_paths.c; PATHS_ARGS: its reps and scope, e.g. "7" for the
# full run of bench/results, "3 host" for whole blocks)
if [ -x $B/bench/cuda_paths ] && [ -z "${SKIP_PATHS:-}" ] && fits 60 "bench/cuda_paths"; then
    step cuda_paths.txt 90 $B/bench/cuda_paths ${PATHS_ARGS:-3 partial}
    grep -E "^cuda_paths|^what|auto=|VERIFY" "$L/cuda_paths.txt" | head -60
    cp "$L/cuda_paths.txt" "$L/cuda-paths-partial.txt" 2>/dev/null
    keep cuda-paths-partial.txt
    grep -E "^(p|kv)-(h2d|d2h) " "$L/cuda_paths.txt" |
        awk '{printf "  paths %s %s: auto %s, calls %s (x ceil)\n", $1, $2, $(NF-7), $(NF-4)}' >>"$SUMMARY"
    grep -E "VERIFY|all bytes" "$L/cuda_paths.txt" | sed 's/^/  /' >>"$SUMMARY"
fi

# 5. partial copies through the engine (the first 8 of 32 tokens of K and
# V, head-major, as `kvferry bench --compare` moves them; 256 MiB of
# blocks): AUTO, then each path forced, then BASE_DIR's build under AUTO;
# lines: build/mode, block, d2h and h2d as a fraction of the ceiling
PARTIAL_MODES=${PARTIAL_MODES:-"auto kernel staged dma"}
if [ -z "${SKIP_PARTIAL:-}" ] && fits 40 "partial copies through the engine"; then
    for kib in ${PARTIAL_SIZES:-16 64 256}; do
        # a mode may be MODE@BYTES: KVF_DEVICE_CALL_BYTES for that run;
        # PARTIAL_SMS: the kernel's thread blocks (KVF_CUDA_COPY_SMS) to
        # run AUTO under once more each, as modes sms<N>
        for mc in $PARTIAL_MODES $(for v in ${PARTIAL_SMS:-}; do echo "sms$v"; done) base; do
            m=${mc%@*}
            cb=$([ "$m" = "$mc" ] && echo "" || echo "${mc#*@}")
            sms=
            case $m in sms*) sms=${m#sms} m=auto ;; esac
            K=$B/kvferry
            if [ $m = base ]; then
                base_ready || continue
                K=$BASE_DIR/build/kvferry
            fi
            [ "$(left)" -lt 25 ] && continue
            hs=$((kib * 1024 / 128))
            blocks=$((262144 / kib))
            # AUTO's runs record their timeline: when each call reached the
            # GPU and ended (bench/timeline.py --gpu), in the logs
            tl=$([ $mc = auto ] && echo "$L/timeline-partial-${kib}k.txt" || echo "")
            f="$L/partial-$m${cb:+-calls$cb}${sms:+-sms$sms}-${kib}k.txt"
            KVF_TIMELINE=$tl KVF_DEVICE_CALL_BYTES=$cb KVF_CUDA_COPY_SMS=$sms \
                KVF_CUDA_COPY=$([ $m = base ] && echo auto || echo $m) \
                timeout "$(cap 40)" "$K" bench \
                --backend cuda --layers 1 --kv 2 --heads 1 --tokens-per-block 32 --head-size $hs \
                --tokens 8 --blocks $blocks --iters 5 >"$f" 2>&1
            rc=$?
            # the ratio to the ceiling timed by CUDA events, then to the
            # same copy timed on the host as kvferry is
            awk -v m=$mc -v k=${kib}KiB '/kvferry \/ ceiling timed on the host/{h=" host-timed d2h " $8 " h2d " $9}
                /kvferry \/ ceiling +[0-9]/{r=m " " k " d2h " $4 " h2d " $5}
                END{if (r != "") print r h}' "$f"
            [ $rc = 0 ] || echo "$mc $kib KiB: rc=$rc: $(tail -n 2 "$f" | tr '\n' ' ')"
        done
    done | tee "$L/partial-engine.txt"
    sed 's/^/  partial /' "$L/partial-engine.txt" >>"$SUMMARY"
    for f in "$L"/timeline-partial-*.txt; do
        [ -s "$f" ] || continue
        # the first round's submits (the first of each queue makes its
        # upload stream), then two of the third round
        python3 bench/timeline.py "$f" --gpu --min-moves 1000 --limit 2 >"${f%.txt}-gpu.txt" 2>&1
        python3 bench/timeline.py "$f" --gpu --min-moves 1000 --limit 2 --skip 6 >"${f%.txt}-gpu-later.txt" 2>&1
        echo "$(basename "$f" .txt): $(python3 bench/timeline.py "$f" --summary --min-moves 1000 2>&1 | tail -n 1)"
    done
    keep partial-engine.txt
fi

# 6. A 16-block onboard idle, beside offload batches on other slots, and
# into slots being evicted (right after a 512-block offload batch whose
# first moves read them: 128 MiB at 256 KiB, 1 GiB at 2 MiB blocks),
# p50/p99 and their ratios beside raw cudaMemcpyAsync doing the same
# (the raw ratio: D2H of the slots, then H2D); every byte checked
# (about 30 s); then BASE_DIR's build the same way where it is built
# CONTEND_CALL_BYTES: KVF_DEVICE_CALL_BYTES values to run it under once
# each after the first (whose files keep their names), e.g. "16M"
if [ -z "${SKIP_CONTEND:-}" ] && fits 45 "kvferry bench --mode contention"; then
    step contention.txt 150 $B/kvferry bench --backend cuda --mode contention --sizes 256K,2M ${CONTEND_ARGS:-} \
        --json "$L/contention.json"
    cat "$L/contention.txt"
    cp "$L/contention.txt" "$L/contention-evicting.txt" 2>/dev/null
    cp "$L/contention.json" "$L/contention-evicting.json" 2>/dev/null
    keep contention-evicting.txt contention-evicting.json
    grep -E "blocks:|/ idle|target|verified" "$L/contention.txt" | sed 's/^/  /' >>"$SUMMARY"
    for cb in ${CONTEND_CALL_BYTES:-}; do
        fits 45 "the contention bench with KVF_DEVICE_CALL_BYTES=$cb" || break
        KVF_DEVICE_CALL_BYTES=$cb step "contention-evicting-calls$cb.txt" 150 $B/kvferry bench --backend cuda \
            --mode contention --sizes 256K,2M ${CONTEND_ARGS:-} --json "$L/contention-evicting-calls$cb.json"
        cat "$L/contention-evicting-calls$cb.txt"
        keep "contention-evicting-calls$cb.txt" "contention-evicting-calls$cb.json"
        echo "  KVF_DEVICE_CALL_BYTES=$cb:" >>"$SUMMARY"
        grep -E "blocks:|/ idle|target|verified" "$L/contention-evicting-calls$cb.txt" | sed 's/^/  /' >>"$SUMMARY"
    done
    # CONTEND_TIMELINE=ARGS: once more with these options (e.g. "--sizes 2M
    # --pools 64 --reps 100") and the timeline on, kept gzipped in the logs;
    # bench/timeline.py --waits says where each onboard into evicted slots
    # waited
    if [ -n "${CONTEND_TIMELINE:-}" ] && fits 45 "the contention bench's timeline"; then
        KVF_TIMELINE="$L/timeline-contention.txt" step contention-timeline.txt 120 $B/kvferry bench \
            --backend cuda --mode contention $CONTEND_TIMELINE
        python3 bench/timeline.py "$L/timeline-contention.txt" --waits >"$L/timeline-contention-waits.txt" 2>&1
        tail -n 20 "$L/timeline-contention-waits.txt"
        gzip -f "$L/timeline-contention.txt"
        pack
    fi
fi

# 7. LMCache's multi_layer_kv_transfer beside kvferry and the ceiling on
# vLLM's layout (bench/lmcache_compare.py; LMCache's module comes gzipped
# in .deps/lmcache, scripts/fetch-lmcache.sh)
if [ -z "${SKIP_LMCACHE:-}" ] && fits 60 "bench/lmcache_compare.py"; then
    # the newest release first: the bench takes the first that loads
    OPS=()
    for z in $(ls -d .deps/lmcache/*/*.so.gz 2>/dev/null | sort -rV); do
        v=$(basename "$(dirname "$z")")
        mkdir -p "/tmp/kvf-lmcache/$v" && gzip -dc "$z" >"/tmp/kvf-lmcache/$v/$(basename "$z" .gz)" &&
            OPS+=(--ops "/tmp/kvf-lmcache/$v/$(basename "$z" .gz)")
    done
    # LMCACHE_MODES: the KVF_CUDA_COPY values to run it under (auto first;
    # each other's files carry its name), each optionally MODE@BYTES, the
    # KVF_DEVICE_CALL_BYTES to run it with (auto@16M); AUTO's first run
    # records its timeline (when each call reached the GPU and ended:
    # bench/timeline.py)
    for mc in ${LMCACHE_MODES:-auto}; do
        m=${mc%@*}
        cb=$([ "$m" = "$mc" ] && echo "" || echo "${mc#*@}")
        sfx=$([ "$mc" = auto ] && echo "" || echo "-$m${cb:+-calls$cb}")
        fits 60 "bench/lmcache_compare.py (KVF_CUDA_COPY=$m${cb:+ KVF_DEVICE_CALL_BYTES=$cb})" || break
        tl=$([ "$mc" = auto ] && echo "$L/timeline-lmcache.txt" || echo "")
        PYTHONUNBUFFERED=1 KVF_TIMELINE=$tl KVF_CUDA_COPY=$m KVF_DEVICE_CALL_BYTES=$cb KVFERRY_LIBRARY=$B/libkvferry.so \
            step "lmcache$sfx.txt" 150 python3 bench/lmcache_compare.py \
            "${OPS[@]}" --json "$L/lmcache$sfx.json" ${LMCACHE_ARGS:-}
        cat "$L/lmcache$sfx.txt"
        keep "lmcache$sfx.txt" "lmcache$sfx.json"
        echo "  KVF_CUDA_COPY=$m${cb:+ KVF_DEVICE_CALL_BYTES=$cb}:" >>"$SUMMARY"
        grep -vE "^lmcache_compare: [A-Z]" "$L/lmcache$sfx.txt" | tail -n 12 | sed 's/^/  /' >>"$SUMMARY"
        if [ -s "$tl" ]; then
            python3 bench/timeline.py "$tl" --summary --min-moves 256 >"$L/timeline-lmcache-summary.txt" 2>&1
            python3 bench/timeline.py "$tl" --gpu --min-moves 256 --limit 2 >"$L/timeline-lmcache-gpu.txt" 2>&1
            tail -n 3 "$L/timeline-lmcache-summary.txt" | sed 's/^/  timeline: /' >>"$SUMMARY"
            keep timeline-lmcache-summary.txt timeline-lmcache-gpu.txt
        fi
    done
fi

# 8. whatever else fits.
# BASE_DIR's build through the contention bench at 256 KiB, the size
# whose onboard into evicted slots the call size rule changed
if [ -z "${SKIP_CONTEND:-}" ] && base_ready && fits 45 "BASE_DIR's contention bench"; then
    step contention-base.txt 60 "$BASE_DIR/build/kvferry" bench --backend cuda --mode contention \
        --sizes 256K ${CONTEND_ARGS:-} --json "$L/contention-base.json"
    grep -E "blocks:|/ idle|target" "$L/contention-base.txt" | sed 's/^/  base: /' >>"$SUMMARY"
fi
# COMPARE_MODES: the KVF_CUDA_COPY values to run --compare under (auto first)
[ -n "${SKIP_COMPARE:-}" ] && COMPARE_MODES=" "
for m in ${COMPARE_MODES:-auto}; do
    sfx=$([ "$m" = auto ] && echo "" || echo "-$m")
    fits 150 "kvferry bench --compare (KVF_CUDA_COPY=$m)" || continue
    KVF_LOG=${BENCH_LOG:-warn} KVF_CUDA_COPY=$m step "compare$sfx.txt" 400 $B/kvferry bench --backend cuda \
        --compare --json "$L/compare$sfx.jsonl"
    sed -n '/--compare: GB/,$p' "$L/compare$sfx.txt"
    keep "compare$sfx.txt" "compare$sfx.jsonl"
    sed -n '/--compare: GB/,$p' "$L/compare$sfx.txt" | grep "8/32" | sed 's/^/  compare /' >>"$SUMMARY"
done
# A/B against BASE_DIR's build: 4 KiB and 16 KiB blocks (256 MiB a batch;
# AB_HEAD_SIZES: other head sizes, 64 per 4 KiB) through the engine,
# alternating builds, AB_ROUNDS rounds (default 3);
# lines: build, block size, d2h, h2d, both (GB/s). The first round records
# each build's timeline (KVF_TIMELINE, where the revision has it): the
# medians of when a large submit's checks ended, its first part was handed
# to the GPU, it returned, and its last part completed.
if base_ready && fits 90 "the A/B rounds"; then
    for r in $(seq "${AB_ROUNDS:-3}"); do
        for v in base this; do
            K=$B/kvferry
            [ $v = base ] && K=$BASE_DIR/build/kvferry
            for hs in ${AB_HEAD_SIZES:-64 256}; do
                [ "$(left)" -lt 30 ] && continue
                tl=$([ "$r" = 1 ] && echo "$L/timeline-$v-$((hs / 16))k.txt" || echo "")
                KVF_TIMELINE=$tl timeout "$(cap 60)" "$K" bench --backend cuda --layers 1 --kv 1 --heads 1 \
                    --tokens-per-block 32 --head-size $hs --blocks $((4194304 / hs)) --iters 7 2>&1 |
                    awk -v v=$v -v kib=$((hs / 16)) '/^  kvferry  /{print v, kib "KiB", $2, $4, $6}'
            done
        done
    done | tee "$L/ab.txt"
    # this step's timelines only: the others' derived listings are no timelines
    for f in "$L"/timeline-base-*.txt "$L"/timeline-this-*.txt; do
        [ -s "$f" ] && echo "$(basename "$f" .txt): $(python3 bench/timeline.py "$f" --summary)"
    done
    pack
fi
# BENCH_LOG: KVF_LOG for the latency probe and --compare (debug: the CUDA
# queues' full-ring waits at exit)
# where a batch's host time goes (bench/latency.c)
if [ -x $B/bench/latency ] && [ -z "${SKIP_LATENCY:-}" ] && fits 40 "bench/latency"; then
    KVF_LOG=${BENCH_LOG:-warn} step latency.txt 120 $B/bench/latency 7
    cat "$L/latency.txt"
fi
# PyTorch's gather-then-copy path, the alternative users already have
if [ -z "${SKIP_TORCH:-}" ] && fits 40 "bench/torch_gather.py"; then
    step torch_gather.txt 120 python3 bench/torch_gather.py
    cat "$L/torch_gather.txt"
fi
if [ -z "${SKIP_FILE:-}" ]; then
    for be in cuda host; do
        fits 30 "kvferry bench --backend $be --mode posix" || continue
        step "file-posix-$be.txt" 120 $B/kvferry bench --backend $be --mode posix --layers 8 --tokens-per-block 32 --blocks 256 --iters 3 \
            --json "$L/file-posix-$be.json"
        tail -n 12 "$L/file-posix-$be.txt"
    done
fi
if [ -z "${SKIP_REPLAY:-}" ] && $B/kvferry replay --help >/dev/null 2>&1; then
    if fits 30 "kvferry replay --backend cuda"; then
        rm -rf /tmp/kvf-replay-gpu
        step replay-cuda.txt 120 $B/kvferry replay --backend cuda --gen mixed --requests 400 \
            --disk /tmp/kvf-replay-gpu --disk-blocks 4096
        tail -n 30 "$L/replay-cuda.txt"
    fi
    # the cache owning the GPU blocks, three clients sharing prefixes at once
    if fits 30 "kvferry replay --backend cuda --gpu-tier --clients 3"; then
        rm -rf /tmp/kvf-replay-gpu2
        step replay-cuda-gpu-tier.txt 120 $B/kvferry replay --backend cuda --gen mixed --requests 300 \
            --gpu-tier --gpu-blocks 256 --host-blocks 512 --clients 3 --disk /tmp/kvf-replay-gpu2 \
            --disk-blocks 4096
        tail -n 14 "$L/replay-cuda-gpu-tier.txt"
    fi
fi
# the GDS path: test_gds with cuFile's own log, then the file tier's
# bench through GDS (its raw-disk ceiling beside it); sh scripts/gds-gpu.sh
# does more
if [ -z "${SKIP_GDS:-}" ] && [ -x $B/tests/test_gds ] && fits 60 "the GDS path"; then
    KVF_LOG=info step test_gds.log 60 $B/tests/test_gds
    grep -E '^(ok|FAIL|skip)|FAILED' "$L/test_gds.log" | head -20
    [ -x $B/tests/test_gds_probe ] && step test_gds_probe.log 30 $B/tests/test_gds_probe
    fits 30 "kvferry bench --mode gds" &&
        step file-gds.txt 60 $B/kvferry bench --backend cuda --mode gds --layers 8 --tokens-per-block 32 \
            --blocks 256 --iters 3 --json "$L/file-gds.json" &&
        tail -n 12 "$L/file-gds.txt"
fi
# the Python GPU tests (PyTorch CUDA tensors) by name: skipped ones say why
# (SKIP_PYTEST=1: not run)
if [ -z "${SKIP_PYTEST:-}" ] && fits 45 "the Python GPU tests"; then
    KVFERRY_LIBRARY=$B/libkvferry.so step pytest.log 150 python3 -m pytest -v -rs -p no:cacheprovider \
        python/tests/test_gpu.py python/tests/test_gpu_cache.py python/tests/test_gpu_plan.py \
        python/tests/test_transformers.py python/tests/test_transformers_plan.py \
        python/tests/test_transformers_sliding.py python/tests/test_transformers_gpu.py \
        python/tests/test_serving_gpu.py
    tail -n 30 "$L/pytest.log"
    note "  $(tail -n 1 "$L/pytest.log")"
fi
# every other test, on all cores
if [ -z "${SKIP_REST:-}" ] && fits 60 "the other tests"; then
    (cd $B && step ctest-rest.log 240 ctest ${CTEST_REGEX:+-R "$CTEST_REGEX"} -E '^test_cuda_' \
        -j"$(nproc)" --output-on-failure) || tail -n 40 "$L/ctest-rest.log"
    sed -n '/tests passed/,$p' "$L/ctest-rest.log" | head -40
    note "  $(grep -E 'tests passed' "$L/ctest-rest.log")"
fi
# RUN_TTFT=1: time to first token with a cached prefix through the
# transformers adapter (bench/ttft.py; TTFT_ARGS: more options, e.g.
# "--quick" or "--lengths 2048,8192 --tiers host"; give it BUDGET_S and
# SKIP_* room); table in ttft.txt, JSON in ttft.json. TTFT_ARGS2: a
# second run after it with these options (e.g. "--costs learnt" beside
# "--costs held"), in ttft-2.txt and ttft-2.json
if [ -n "${RUN_TTFT:-}" ] && fits 60 "bench/ttft.py"; then
    KVFERRY_LIBRARY=$B/libkvferry.so step ttft.txt "${TTFT_TIMEOUT:-540}" python3 bench/ttft.py \
        --json "$L/ttft.json" ${TTFT_ARGS:-}
    cat "$L/ttft.txt"
    keep ttft.txt ttft.json
    if [ -n "${TTFT_ARGS2:-}" ] && fits 60 "bench/ttft.py $TTFT_ARGS2"; then
        KVFERRY_LIBRARY=$B/libkvferry.so step ttft-2.txt "${TTFT_TIMEOUT:-540}" python3 bench/ttft.py \
            --json "$L/ttft-2.json" $TTFT_ARGS2
        cat "$L/ttft-2.txt"
        keep ttft-2.txt ttft-2.json
    fi
fi
# RUN_PLAN=1: the planner's split measured against recompute and load-all on
# a Llama-3-8B-shaped decoder, each beside its prediction (bench/plan_ttft.py,
# about 3 minutes; PLAN_ARGS: more options, e.g. "--quick" for a smoke run
# under a minute, or "--tokens 2048,8192 --tiers disk"); table in plan.txt,
# JSON in plan.json
if [ -n "${RUN_PLAN:-}" ] && fits 60 "bench/plan_ttft.py"; then
    KVFERRY_LIBRARY=$B/libkvferry.so step plan.txt "${PLAN_TIMEOUT:-540}" python3 bench/plan_ttft.py \
        --disk "${PLAN_DISK:-/var/tmp/kvf-plan}" --json "$L/plan.json" ${PLAN_ARGS:-}
    cat "$L/plan.txt"
    keep plan.txt plan.json
    # the disk's ceiling in the same run: raw O_DIRECT reads of 2 MiB blocks
    # (the bench's) at the engine's queue depth, beside the tier's own
    D=${PLAN_DISK:-/var/tmp/kvf-plan}/ceiling
    fits 30 "the plan's disk ceiling" &&
        step plan-disk-ceiling.txt 120 $B/kvferry bench --backend cuda --mode posix --dir "$D" \
            --layers 32 --kv 2 --heads 8 --tokens-per-block 16 --head-size 128 --dtype bf16 --order token \
            --blocks 480 --iters 3 --fsync none --json "$L/plan-disk-ceiling.json" &&
        tail -n 12 "$L/plan-disk-ceiling.txt"
    rm -rf "$D"
fi
# RUN_DISK_ARRIVAL=1: layer-wise arrival from the disk tier on the GPU:
# bench/disk_arrival (512 blocks of a Llama-3-8B-shaped layout, a pool per
# layer, into device slots; the first pool's arrival against the whole
# batch, every byte checked through the host tier), POSIX then GDS; then
# the layer-wise TTFT from disk through the transformers adapter
# (bench/ttft.py --tiers disk: layerwise beside whole, load and compute;
# ARRIVAL_TTFT_ARGS: more options, e.g. "--lengths 8192,32768").
# Tables in disk-arrival-*.txt and ttft-disk.txt, JSON in ttft-disk.json
if [ -n "${RUN_DISK_ARRIVAL:-}" ] && [ -x $B/bench/disk_arrival ] && fits 60 "bench/disk_arrival"; then
    D=${ARRIVAL_DIR:-/var/tmp/kvf-arrival}
    for io in posix gds; do
        fits 30 "bench/disk_arrival ($io)" || continue
        rm -rf "$D"
        KVF_FILE_IO=$io step "disk-arrival-$io.txt" 120 $B/bench/disk_arrival "$D" 512 5 cuda
        cat "$L/disk-arrival-$io.txt"
        keep "disk-arrival-$io.txt"
    done
    rm -rf "$D"
    if fits 90 "bench/ttft.py --tiers disk"; then
        KVFERRY_LIBRARY=$B/libkvferry.so step ttft-disk.txt "${TTFT_TIMEOUT:-300}" python3 bench/ttft.py \
            --tiers disk --json "$L/ttft-disk.json" ${ARRIVAL_TTFT_ARGS:-}
        cat "$L/ttft-disk.txt"
        keep ttft-disk.txt ttft-disk.json
    fi
fi
# RUN_REMOTE_ARRIVAL=1: layer-wise arrival from the remote tier into device
# slots: bench/remote_arrival against a redis-server of its own on
# loopback (from .deps), 64 blocks of 2 MiB, every byte checked through
# the host tier; table in remote-arrival-redis.txt
if [ -n "${RUN_REMOTE_ARRIVAL:-}" ] && [ -x $B/bench/remote_arrival ] && command -v redis-server >/dev/null &&
    fits 40 "bench/remote_arrival"; then
    RD=$(mktemp -d /tmp/kvf-redis.XXXXXX)
    redis-server --port 6391 --bind 127.0.0.1 --save "" --appendonly no --dir "$RD" --daemonize yes \
        --pidfile "$RD/pid" --logfile "$RD/log" && sleep 1
    step remote-arrival-redis.txt 90 $B/bench/remote_arrival redis://127.0.0.1:6391 64 5 16 cuda
    cat "$L/remote-arrival-redis.txt"
    keep remote-arrival-redis.txt
    sed 's/^/  /' "$L/remote-arrival-redis.txt" | head -n 4 >>"$SUMMARY"
    [ -s "$RD/pid" ] && kill "$(cat "$RD/pid")" 2>/dev/null
    rm -rf "$RD"
fi
[ -n "$BASE_PID" ] && kill "$BASE_PID" 2>/dev/null
echo "done in $SECONDS s of $BUDGET_S"
date -u
