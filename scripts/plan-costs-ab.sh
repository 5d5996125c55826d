#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The planner's disk rows with the tier's cost held (one plan before the
# rounds) and learnt (a plan each round), on one machine in one call, with
# the disk's raw ceiling between them: bench/plan_ttft.py --costs hold|learn.
# Builds like gpu-run.sh (SKIP_* there); output in $OUT (default ./gpu-out).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
CTEST_REGEX=${CTEST_REGEX:-plan} SKIP_PYTEST=1 SKIP_SANITIZE=1 SKIP_PATHS=1 SKIP_LATENCY=1 \
    RUN_PLAN=1 PLAN_ARGS="${PLAN_ARGS:---tiers disk}" bash scripts/gpu-run.sh >/dev/null 2>&1
echo "gpu-run.sh (plan, --costs hold): rc=$?"
KVFERRY_LIBRARY=build-gpu/libkvferry.so timeout "${PLAN_TIMEOUT:-300}" python3 bench/plan_ttft.py \
    --disk /var/tmp/kvf-plan --tiers disk --tokens "${LEARN_TOKENS:-2048,8192,32768}" --costs learn \
    --json "$OUT/plan-learn.json" >"$OUT/plan-learn.txt" 2>&1
echo "bench/plan_ttft.py --costs learn: rc=$?"
