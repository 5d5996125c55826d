#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The GDS path on a GPU machine: what cuFile finds, the GDS and CUDA tests,
# then the file tier's bench on the POSIX and GDS paths (same geometry, the
# raw-disk ceiling of each run printed with it). Logs under $OUT.
OUT=${OUT:-/tmp/gds-out}
B=${B:-build-gpu}
mkdir -p "$OUT"
{
    date -u; uname -r; nvidia-smi -L
    ls -la /usr/local/cuda/include/cufile.h /usr/local/cuda/lib64/libcufile* 2>&1
    ls /proc/driver/nvidia-fs /sys/module/nvidia_fs 2>&1; lsmod 2>/dev/null | grep -i nvidia
    cat /etc/cufile.json 2>/dev/null | grep -i compat
    df -hT /tmp .
} >"$OUT/machine.txt" 2>&1
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DKVF_CUDA=ON >"$OUT/build.txt" 2>&1
cmake --build $B -j16 -- -k >>"$OUT/build.txt" 2>&1 || grep -E -B2 -A6 'error' "$OUT/build.txt" | head -60
grep -n 'KVF_HAVE_CUFILE_H' $B/CMakeCache.txt
$B/kvferry info >"$OUT/info.txt" 2>&1; cat "$OUT/info.txt"
KVF_LOG=info timeout 60 $B/tests/test_gds >"$OUT/test_gds.txt" 2>&1; echo "test_gds rc=$?"
grep -E '^(ok|FAIL|skip)|cufile|gds.h|FAILED' "$OUT/test_gds.txt"
G="--backend cuda --layers 32 --kv 2 --heads 8 --tokens-per-block 16 --head-size 128 --dtype fp16 --pools 2 --blocks 128 --iters 3"
D=$(mktemp -d /tmp/gdsbench.XXXX)
for run in "posix" "gds" "gds-compat-off" "gds-partial" "posix-partial"; do
    case $run in
    posix) a="--mode posix"; env="" ;;
    gds) a="--mode gds"; env="" ;;
    gds-compat-off) a="--mode gds"; env="KVF_GDS_COMPAT=off" ;;
    gds-partial) a="--mode gds --tokens 8"; env="" ;;
    posix-partial) a="--mode posix --tokens 8" ;;
    esac
    echo "== $run: $env kvferry bench $a"
    env $env KVF_LOG=info timeout 45 $B/kvferry bench $G $a --dir $D 2>&1 | grep -v '^kvferry info: engine'
    echo "rc=$?"
done >"$OUT/bench.txt" 2>&1
grep -v '^  *[0-9]' "$OUT/bench.txt" | head -90
cp cufile.log $B/cufile.log $B/tests/cufile.log "$OUT/" 2>/dev/null
rm -rf "$D"
(cd $B && timeout 120 ctest --output-on-failure -j6 -R 'cuda|blockfile|engine') >"$OUT/ctest.txt" 2>&1
echo "ctest rc=$?"; grep -E 'tests passed|Failed|\*\*\*' "$OUT/ctest.txt"
