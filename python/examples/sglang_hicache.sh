#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# SGLang with kvferry as its HiCache storage (L3) backend: pages leave the
# host pool for kvferry's block files and come back on a prefix hit. Needs a
# GPU build of SGLang and a model:
#   sh python/examples/sglang_hicache.sh Qwen/Qwen2.5-0.5B-Instruct /tmp/kv
set -eu
model=${1:?"usage: sglang_hicache.sh MODEL KV_DIR"}
kv=${2:?"usage: sglang_hicache.sh MODEL KV_DIR"}
exec python3 -m sglang.launch_server --model-path "$model" --port 30000 \
    --enable-hierarchical-cache --hicache-ratio 2 --page-size 16 \
    --hicache-storage-backend dynamic \
    --hicache-storage-backend-extra-config "{\"backend_name\": \"kvferry\",
        \"module_path\": \"kvferry.integrations.sglang\", \"class_name\": \"KvferryStorage\",
        \"interface_v1\": 1, \"file_dir\": \"$kv\", \"disk_bytes\": \"64GiB\"}"
