#!/bin/bash
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
B=build-gpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON >/dev/null &&
    cmake --build $B -j"$(nproc)" 2>&1 | grep -E "error|warning: " | head -40
(cd $B && ctest --output-on-failure 2>&1 | tail -40)
$B/kvferry info
if command -v compute-sanitizer >/dev/null && [ -z "${SKIP_SANITIZE:-}" ]; then
    for t in "memcheck test_cuda_engine" "racecheck test_cuda_backend" "synccheck test_cuda_backend"; do
        set -- $t
        timeout 150 compute-sanitizer --tool $1 --error-exitcode 9 $B/tests/$2 >"$OUT/$1-$2.log" 2>&1
        echo "compute-sanitizer $1 $2: rc=$? ($(tail -n 1 "$OUT/$1-$2.log"))"
    done
fi
[ -x $B/bench/cuda_paths ] && [ -z "${SKIP_PATHS:-}" ] &&
    timeout 240 $B/bench/cuda_paths >"$OUT/cuda_paths.txt" 2>&1
# COMPARE_MODES: the KVF_CUDA_COPY values to run --compare under (auto first)
for m in ${COMPARE_MODES:-auto}; do
    sfx=$([ "$m" = auto ] && echo "" || echo "-$m")
    KVF_CUDA_COPY=$m timeout 400 $B/kvferry bench --backend cuda --compare \
        --json "$OUT/compare$sfx.jsonl" >"$OUT/compare$sfx.txt" 2>&1
    echo "kvferry bench --compare (KVF_CUDA_COPY=$m): rc=$?"
    sed -n '/--compare: GB/,$p' "$OUT/compare$sfx.txt"
done
[ -z "${SKIP_FILE:-}" ] &&
    timeout 120 $B/kvferry bench --backend cuda --mode posix --blocks 256 --iters 3 \
        --json "$OUT/file-posix.json"
date -u
