#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# SGLang with kvferry as its HiCache storage (L3) backend: pages leave the
# host pool for kvferry's block files and come back on a prefix hit. Needs a
# GPU build of SGLang and a model:
#   sh python/examples/sglang_hicache.sh Qwen/Qwen2.5-0.5B-Instruct /tmp/kv
#   sh python/examples/sglang_hicache.sh deepseek-ai/DeepSeek-V2-Lite /tmp/kv 2
# With TP > 1 every rank uses KV_DIR: an MLA model's pages are stored once,
# by SGLang's storage writer rank, and read from there by every rank.
# --enable-metrics turns on SGLang's storage metrics (and kvferry's pages
# per tier in them).
set -eu
usage="usage: sglang_hicache.sh MODEL KV_DIR [TP]"
model=${1:?"$usage"}
kv=${2:?"$usage"}
tp=${3:-1}
exec python3 -m sglang.launch_server --model-path "$model" --port 30000 --tp-size "$tp" --enable-metrics \
    --enable-hierarchical-cache --hicache-ratio 2 --page-size 16 \
    --hicache-storage-backend dynamic \
    --hicache-storage-backend-extra-config "{\"backend_name\": \"kvferry\",
        \"module_path\": \"kvferry.integrations.sglang\", \"class_name\": \"KvferryStorage\",
        \"interface_v1\": 1, \"file_dir\": \"$kv\", \"disk_bytes\": \"64GiB\"}"
