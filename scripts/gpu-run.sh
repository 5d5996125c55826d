#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# One whole build-test-benchmark cycle on a GPU machine, sized for one call
# of at most 10 minutes: builds, runs the CUDA tests four at once five times
# over (they share the GPU as under `ctest -j4`), every other test, then
# the benchmarks, each step only while the time budget (BUDGET_S, default
# 540 s) holds it and cut to what is left; a step left out says so.
#
# Output: $OUT (default ./gpu-out) gets run.log (everything said here) and
# logs.tar.gz (each step's whole log and JSON), packed again after each
# step, so a run stopped at its limit still brings its logs back; two files,
# well inside what a device call returns (8 files, 16 MiB each).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # the steps run in the build folder too
exec > >(tee "$OUT/run.log") 2>&1
BUDGET_S=${BUDGET_S:-540}
L=$(mktemp -d /tmp/kvf-gpu-logs.XXXXXX)
pack() { tar czf "$OUT/logs.tar.gz" -C "$L" . 2>/dev/null; }
trap pack EXIT
left() { echo $((BUDGET_S - SECONDS)); }
# fits NEED WHAT: whether NEED seconds are left for WHAT (else says it is left out)
fits() {
    local need=$1
    shift
    [ "$(left)" -ge "$need" ] && return 0
    echo "left out: $* (needs ${need} s, $(left) s of ${BUDGET_S} left)"
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
# says its status and time
step() {
    local log=$1 t s0=$SECONDS rc
    t=$(cap "$2")
    shift 2
    timeout "$t" "$@" >"$L/$log" 2>&1
    rc=$?
    echo "$*: rc=$rc in $((SECONDS - s0)) s$([ $rc = 124 ] && echo " (stopped at its ${t} s limit)")"
    pack
    return $rc
}

date -u
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv || true
# the copy paths this tree builds (src/backend/cuda/cuda_paths.h)
grep -h '^#define KVF_CUDA_PATHS(' src/backend/cuda/cuda_paths.h || true
# Libraries this image lacks travel in .deps (scripts/fetch-gpu-deps.sh, run
# where Debian's apt works: liburing, hiredis, libxxhash, libyaml, cJSON, and
# redis-server for the remote tier's tests), unpacked from Debian's
# packages; used when present.
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
B=build-gpu
s0=$SECONDS
# the S3 store is left out: .deps maps pkg-config into its own root, where
# the image's libcurl is not, and nothing of it runs on the GPU
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON -DKVF_S3=OFF >"$L/configure.log" 2>&1 &&
    cmake --build $B -j"$(nproc)" >"$L/build.log" 2>&1
rc=$?
[ $rc -eq 0 ] || tail -n 30 "$L/configure.log"
echo "build: rc=$rc in $((SECONDS - s0)) s, $(grep -c 'warning: ' "$L/build.log") warning(s)"
grep -E "error|warning: " "$L/build.log" | grep -v 'Built target' | head -40
pack
[ $rc = 0 ] || exit 1
# BASE_DIR: the source of another revision (git archive REV | tar -x -C DIR,
# carried along), whose CLI is built too and timed against this one below
if [ -n "${BASE_DIR:-}" ]; then
    cmake -S "$BASE_DIR" -B "$BASE_DIR/build" -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON >/dev/null &&
        cmake --build "$BASE_DIR/build" -j"$(nproc)" --target kvferry_cli 2>&1 |
        grep -E "error|warning: " | head -20
fi
# the sysroot was for hiredis.pc only: the install test's pkg-config must not prepend it
unset PKG_CONFIG_SYSROOT_DIR

# The CUDA tests four at a time, each up to five times (until one fails), as
# `ctest -j4` runs them: each program shares the GPU, the driver and the
# host with three others (CUDA_REPEAT: other rounds; CTEST_REGEX: only the
# tests whose names match, here and below)
if fits 60 "the CUDA tests under ctest -j4"; then
    (cd $B && step ctest-cuda-j4.log 300 ctest -R "${CTEST_REGEX:-^test_cuda_}" -j4 \
        --repeat until-fail:"${CUDA_REPEAT:-5}" --output-on-failure) ||
        tail -n 40 "$L/ctest-cuda-j4.log"
    grep -E "Test +#.*(Passed|Failed|Timeout|Skipped)|tests passed" "$L/ctest-cuda-j4.log"
fi
# every other test, on all cores
if fits 60 "the other tests"; then
    (cd $B && step ctest-rest.log 240 ctest ${CTEST_REGEX:+-R "$CTEST_REGEX"} -E '^test_cuda_' \
        -j"$(nproc)" --output-on-failure) || tail -n 40 "$L/ctest-rest.log"
    sed -n '/tests passed/,$p' "$L/ctest-rest.log" | head -40
fi
$B/kvferry info | tee "$L/info.txt"

# the paths alone: GB/s of each, and the one AUTO took (bench/cuda_paths.c;
# PATHS_ARGS: its reps and scope, e.g. "7" for the full run of
# bench/results, "3 host" for whole blocks between host and device)
if [ -x $B/bench/cuda_paths ] && [ -z "${SKIP_PATHS:-}" ] && fits 60 "bench/cuda_paths"; then
    step cuda_paths.txt 150 $B/bench/cuda_paths ${PATHS_ARGS:-3}
    grep -E "^cuda_paths|auto=|VERIFY" "$L/cuda_paths.txt" | head -40
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
fi
# RUN_TTFT=1: time to first token with a cached prefix through the
# transformers adapter (bench/ttft.py; TTFT_ARGS: more options, e.g.
# "--quick" or "--lengths 2048,8192 --tiers host"; give it BUDGET_S and
# SKIP_* room); table in ttft.txt, JSON in ttft.json
if [ -n "${RUN_TTFT:-}" ] && fits 60 "bench/ttft.py"; then
    KVFERRY_LIBRARY=$B/libkvferry.so step ttft.txt "${TTFT_TIMEOUT:-540}" python3 bench/ttft.py \
        --json "$L/ttft.json" ${TTFT_ARGS:-}
    cat "$L/ttft.txt"
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
# SANITIZE: the tool:test pairs to run, in this order, each while the budget
# holds one (default: memcheck over the engine, cache and layer-wise tests,
# racecheck and synccheck over the layer-wise test and each
# test_cuda_backend_* program)
CUDA_BACKEND_TESTS="test_cuda_backend_paths test_cuda_backend_staged test_cuda_backend_sync test_cuda_backend_memory"
SANITIZE=${SANITIZE:-"memcheck:test_cuda_engine memcheck:test_cuda_cache memcheck:test_cuda_layers racecheck:test_cuda_layers synccheck:test_cuda_layers $(for t in $CUDA_BACKEND_TESTS; do echo racecheck:$t synccheck:$t; done)"}
if command -v compute-sanitizer >/dev/null && [ -z "${SKIP_SANITIZE:-}" ]; then
    for t in $SANITIZE; do
        set -- "${t%%:*}" "${t#*:}"
        fits 60 "compute-sanitizer $1 $2" || continue
        # cuFile's own driver open makes a failing cuMemFree (error 1, inside
        # libcufile) that memcheck reports: these runs leave cuFile out (the
        # GDS path is checked separately with --report-api-errors no)
        KVF_CUFILE_LIB=/nonexistent step "$1-$2.log" 150 compute-sanitizer --tool "$1" --error-exitcode 9 \
            $B/tests/"$2"
        echo "  $(tail -n 1 "$L/$1-$2.log")"
    done
fi
# BENCH_LOG: KVF_LOG for the latency probe and --compare (debug: the CUDA
# queues' full-ring waits at exit)
# where a batch's host time goes (bench/latency.c)
if [ -x $B/bench/latency ] && [ -z "${SKIP_LATENCY:-}" ] && fits 40 "bench/latency"; then
    KVF_LOG=${BENCH_LOG:-warn} step latency.txt 120 $B/bench/latency 7
    cat "$L/latency.txt"
fi
# A 16-block onboard idle, beside offload batches on other slots, and into
# slots being evicted (right after a 512-block offload batch whose first
# moves read them: 1 GiB at 2 MiB blocks), p50/p99 and their ratios beside
# raw cudaMemcpyAsync doing the same; every byte checked (about 30 s)
if [ -z "${SKIP_CONTEND:-}" ] && fits 45 "kvferry bench --mode contention"; then
    step contention.txt 150 $B/kvferry bench --backend cuda --mode contention --sizes 256K,2M \
        --json "$L/contention.json"
    cat "$L/contention.txt"
fi
# A/B against BASE_DIR's build: 4 KiB and 16 KiB blocks (256 MiB a batch;
# AB_HEAD_SIZES: other head sizes, 64 per 4 KiB) through the engine,
# alternating builds, AB_ROUNDS rounds (default 3);
# lines: build, block size, d2h, h2d, both (GB/s). The first round records
# each build's timeline (KVF_TIMELINE, where the revision has it): the
# medians of when a large submit's checks ended, its first part was handed
# to the GPU, it returned, and its last part completed.
if [ -n "${BASE_DIR:-}" ] && [ -x "$BASE_DIR/build/kvferry" ] && fits 90 "the A/B rounds"; then
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
    for f in "$L"/timeline-*.txt; do
        [ -s "$f" ] && echo "$(basename "$f" .txt): $(python3 bench/timeline.py "$f" --summary)"
    done
    pack
fi
# PyTorch's gather-then-copy path, the alternative users already have
if [ -z "${SKIP_TORCH:-}" ] && fits 40 "bench/torch_gather.py"; then
    step torch_gather.txt 120 python3 bench/torch_gather.py
    cat "$L/torch_gather.txt"
fi
# COMPARE_MODES: the KVF_CUDA_COPY values to run --compare under (auto first)
[ -n "${SKIP_COMPARE:-}" ] && COMPARE_MODES=" "
for m in ${COMPARE_MODES:-auto}; do
    sfx=$([ "$m" = auto ] && echo "" || echo "-$m")
    fits 90 "kvferry bench --compare (KVF_CUDA_COPY=$m)" || continue
    KVF_LOG=${BENCH_LOG:-warn} KVF_CUDA_COPY=$m step "compare$sfx.txt" 400 $B/kvferry bench --backend cuda \
        --compare --json "$L/compare$sfx.jsonl"
    sed -n '/--compare: GB/,$p' "$L/compare$sfx.txt"
done
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
echo "done in $SECONDS s of $BUDGET_S"
date -u
