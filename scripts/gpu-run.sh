#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# One whole build-test-benchmark cycle on a GPU machine, for the lent H200:
# builds, runs every test (the GPU ones included), then the benchmarks.
# Logs and JSON go to $OUT (default ./gpu-out).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv || true
# Libraries this image lacks travel in .deps (see docs: liburing, hiredis,
# and redis-server for the remote tier's tests), unpacked from Debian's
# packages; used when present.
if [ -d .deps/root ]; then
    D=$PWD/.deps
    export CMAKE_PREFIX_PATH=$D/root/usr
    export PKG_CONFIG_PATH=$D/root/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D/root
    export LD_LIBRARY_PATH=$D/root/usr/lib/x86_64-linux-gnu:$D/redis/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PATH=$D/redis/bin:$PATH
    # the code includes <hiredis/hiredis.h> and <liburing.h>; hiredis.pc names .../include/hiredis
    export CPATH=$D/root/usr/include LIBRARY_PATH=$D/root/usr/lib/x86_64-linux-gnu
fi
B=build-gpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON >/dev/null &&
    cmake --build $B -j"$(nproc)" 2>&1 | grep -E "error|warning: " | head -40
# BASE_DIR: the source of another revision (git archive REV | tar -x -C DIR,
# carried along), whose CLI is built too and timed against this one below
if [ -n "${BASE_DIR:-}" ]; then
    cmake -S "$BASE_DIR" -B "$BASE_DIR/build" -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON >/dev/null &&
        cmake --build "$BASE_DIR/build" -j"$(nproc)" --target kvferry_cli 2>&1 |
        grep -E "error|warning: " | head -20
fi
# the sysroot was for hiredis.pc only: the install test's pkg-config must not prepend it
unset PKG_CONFIG_SYSROOT_DIR
# CTEST_REGEX: only the tests whose names match (ctest -R)
(cd $B && ctest --output-on-failure ${CTEST_REGEX:+-R "$CTEST_REGEX"} 2>&1 | tail -40)
$B/kvferry info
# the Python GPU tests (PyTorch CUDA tensors) by name: skipped ones say why
# (SKIP_PYTEST=1: not run)
[ -z "${SKIP_PYTEST:-}" ] && KVFERRY_LIBRARY=$B/libkvferry.so python3 -m pytest -v -rs -p no:cacheprovider \
    python/tests/test_gpu.py python/tests/test_gpu_cache.py python/tests/test_gpu_plan.py \
    python/tests/test_transformers.py python/tests/test_transformers_plan.py python/tests/test_transformers_gpu.py \
    python/tests/test_serving_gpu.py 2>&1 | tail -n 30
# RUN_TTFT=1: time to first token with a cached prefix through the
# transformers adapter (bench/ttft.py; TTFT_ARGS: more options, e.g.
# "--quick" or "--lengths 2048,8192 --tiers host"); table in ttft.txt, JSON
# in ttft.json
if [ -n "${RUN_TTFT:-}" ]; then
    KVFERRY_LIBRARY=$B/libkvferry.so timeout "${TTFT_TIMEOUT:-540}" python3 bench/ttft.py \
        --json "$OUT/ttft.json" ${TTFT_ARGS:-} >"$OUT/ttft.txt" 2>&1
    echo "bench/ttft.py: rc=$?"
    cat "$OUT/ttft.txt"
fi
# RUN_PLAN=1: the planner's split measured against recompute and load-all on
# a Llama-3-8B-shaped decoder, each beside its prediction (bench/plan_ttft.py,
# about 3 minutes; PLAN_ARGS: more options, e.g. "--quick" for a smoke run
# under a minute, or "--tokens 2048,8192 --tiers disk"); table in plan.txt,
# JSON in plan.json
if [ -n "${RUN_PLAN:-}" ]; then
    KVFERRY_LIBRARY=$B/libkvferry.so timeout "${PLAN_TIMEOUT:-540}" python3 bench/plan_ttft.py \
        --disk "${PLAN_DISK:-/var/tmp/kvf-plan}" --json "$OUT/plan.json" ${PLAN_ARGS:-} >"$OUT/plan.txt" 2>&1
    echo "bench/plan_ttft.py: rc=$?"
    cat "$OUT/plan.txt"
    # the disk's ceiling in the same run: raw O_DIRECT reads of 2 MiB blocks
    # (the bench's) at the engine's queue depth, beside the tier's own
    D=${PLAN_DISK:-/var/tmp/kvf-plan}/ceiling
    timeout 120 $B/kvferry bench --backend cuda --mode posix --dir "$D" --layers 32 --kv 2 --heads 8 \
        --tokens-per-block 16 --head-size 128 --dtype bf16 --order token --blocks 480 --iters 3 \
        --fsync none --json "$OUT/plan-disk-ceiling.json" >"$OUT/plan-disk-ceiling.txt" 2>&1
    echo "kvferry bench --mode posix (2 MiB blocks, the plan's disk): rc=$?"
    tail -n 12 "$OUT/plan-disk-ceiling.txt"
    rm -rf "$D"
fi
# BENCH_LOG: KVF_LOG for the latency probe and --compare (debug: the CUDA
# queues' full-ring waits at exit)
# SANITIZE: the tool:test pairs to run (default: memcheck over the engine and
# cache, racecheck and synccheck over each test_cuda_backend_* program)
CUDA_BACKEND_TESTS="test_cuda_backend_paths test_cuda_backend_staged test_cuda_backend_sync test_cuda_backend_memory"
SANITIZE=${SANITIZE:-"memcheck:test_cuda_engine memcheck:test_cuda_cache memcheck:test_cuda_layers racecheck:test_cuda_layers synccheck:test_cuda_layers $(for t in $CUDA_BACKEND_TESTS; do echo racecheck:$t synccheck:$t; done)"}
if command -v compute-sanitizer >/dev/null && [ -z "${SKIP_SANITIZE:-}" ]; then
    for t in $SANITIZE; do
        set -- "${t%%:*}" "${t#*:}"
        # cuFile's own driver open makes a failing cuMemFree (error 1, inside
        # libcufile) that memcheck reports: these runs leave cuFile out (the
        # GDS path is checked separately with --report-api-errors no)
        KVF_CUFILE_LIB=/nonexistent timeout 150 compute-sanitizer --tool $1 --error-exitcode 9 \
            $B/tests/$2 >"$OUT/$1-$2.log" 2>&1
        echo "compute-sanitizer $1 $2: rc=$? ($(tail -n 1 "$OUT/$1-$2.log"))"
    done
fi
[ -x $B/bench/cuda_paths ] && [ -z "${SKIP_PATHS:-}" ] &&
    timeout 240 $B/bench/cuda_paths >"$OUT/cuda_paths.txt" 2>&1
# where a batch's host time goes (bench/latency.c)
if [ -x $B/bench/latency ] && [ -z "${SKIP_LATENCY:-}" ]; then
    KVF_LOG=${BENCH_LOG:-warn} timeout 120 $B/bench/latency 7 >"$OUT/latency.txt" 2>&1
    echo "bench/latency: rc=$?"
    cat "$OUT/latency.txt"
fi
# A/B against BASE_DIR's build: 4 KiB and 16 KiB blocks (256 MiB a batch;
# AB_HEAD_SIZES: other head sizes, 64 per 4 KiB) through the engine,
# alternating builds, AB_ROUNDS rounds (default 3);
# lines: build, block size, d2h, h2d, both (GB/s). The first round records
# each build's timeline (KVF_TIMELINE, where the revision has it): the
# medians of when a large submit's checks ended, its first part was handed
# to the GPU, it returned, and its last part completed.
if [ -n "${BASE_DIR:-}" ] && [ -x "$BASE_DIR/build/kvferry" ]; then
    for r in $(seq "${AB_ROUNDS:-3}"); do
        for v in base this; do
            K=$B/kvferry
            [ $v = base ] && K=$BASE_DIR/build/kvferry
            for hs in ${AB_HEAD_SIZES:-64 256}; do
                tl=$([ "$r" = 1 ] && echo "$OUT/timeline-$v-$((hs / 16))k.txt" || echo "")
                KVF_TIMELINE=$tl timeout 60 "$K" bench --backend cuda --layers 1 --kv 1 --heads 1 \
                    --tokens-per-block 32 --head-size $hs --blocks $((4194304 / hs)) --iters 7 2>&1 |
                    awk -v v=$v -v kib=$((hs / 16)) '/^  kvferry  /{print v, kib "KiB", $2, $4, $6}'
            done
        done
    done | tee "$OUT/ab.txt"
    for f in "$OUT"/timeline-*.txt; do
        [ -s "$f" ] && echo "$(basename "$f" .txt): $(python3 bench/timeline.py "$f" --summary)"
    done
fi
# PyTorch's gather-then-copy path, the alternative users already have
if [ -z "${SKIP_TORCH:-}" ]; then
    timeout 120 python3 bench/torch_gather.py >"$OUT/torch_gather.txt" 2>&1
    echo "bench/torch_gather.py: rc=$?"
    cat "$OUT/torch_gather.txt"
fi
# COMPARE_MODES: the KVF_CUDA_COPY values to run --compare under (auto first)
[ -n "${SKIP_COMPARE:-}" ] && COMPARE_MODES=" "
for m in ${COMPARE_MODES:-auto}; do
    sfx=$([ "$m" = auto ] && echo "" || echo "-$m")
    KVF_LOG=${BENCH_LOG:-warn} KVF_CUDA_COPY=$m timeout 400 $B/kvferry bench --backend cuda --compare \
        --json "$OUT/compare$sfx.jsonl" >"$OUT/compare$sfx.txt" 2>&1
    echo "kvferry bench --compare (KVF_CUDA_COPY=$m): rc=$?"
    sed -n '/--compare: GB/,$p' "$OUT/compare$sfx.txt"
done
if [ -z "${SKIP_FILE:-}" ]; then
    for be in cuda host; do
        timeout 120 $B/kvferry bench --backend $be --mode posix --layers 8 --tokens-per-block 32 --blocks 256 --iters 3 \
            --json "$OUT/file-posix-$be.json" >"$OUT/file-posix-$be.txt" 2>&1
        echo "kvferry bench --backend $be --mode posix: rc=$?"
        tail -n 12 "$OUT/file-posix-$be.txt"
    done
fi
if [ -z "${SKIP_REPLAY:-}" ] && $B/kvferry replay --help >/dev/null 2>&1; then
    rm -rf /tmp/kvf-replay-gpu
    timeout 120 $B/kvferry replay --backend cuda --gen mixed --requests 400 \
        --disk /tmp/kvf-replay-gpu --disk-blocks 4096 >"$OUT/replay-cuda.txt" 2>&1
    echo "kvferry replay --backend cuda: rc=$?"
    tail -n 30 "$OUT/replay-cuda.txt"
    # the cache owning the GPU blocks, three clients sharing prefixes at once
    rm -rf /tmp/kvf-replay-gpu2
    timeout 120 $B/kvferry replay --backend cuda --gen mixed --requests 300 --gpu-tier \
        --gpu-blocks 256 --host-blocks 512 --clients 3 --disk /tmp/kvf-replay-gpu2 \
        --disk-blocks 4096 >"$OUT/replay-cuda-gpu-tier.txt" 2>&1
    echo "kvferry replay --backend cuda --gpu-tier --clients 3: rc=$?"
    tail -n 14 "$OUT/replay-cuda-gpu-tier.txt"
fi
date -u
