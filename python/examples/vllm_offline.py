# SPDX-License-Identifier: Apache-2.0
# manual: needs vLLM, a model and a GPU (docs/integrations/vllm.md)
"""vLLM with kvferry as its KV connector: a long prompt is run, vLLM's own
GPU prefix cache is emptied, and the prompt is run again; the second run
loads the prompt's blocks from kvferry (host slots, then block files) and
must give the same greedy output. Needs a GPU build of vLLM and a model:

    python python/examples/vllm_offline.py Qwen/Qwen2.5-0.5B-Instruct /tmp/kv
"""

import sys
from pathlib import Path

from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig


def main(model: str, kv_dir: str) -> int:
    config = KVTransferConfig(
        kv_connector="KvferryConnector", kv_connector_module_path="kvferry.integrations.vllm", kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"host_bytes": "2GiB", "disk_bytes": "16GiB", "file_dir": kv_dir})
    llm = LLM(model=model, kv_transfer_config=config, gpu_memory_utilization=0.5, max_model_len=8192,
              enforce_eager=False)
    prompt = "Summarise the following log.\n" + "\n".join(f"line {i}: status ok, {i * 37 % 101} ms"
                                                           for i in range(400))
    greedy = SamplingParams(temperature=0.0, max_tokens=48)
    first = llm.generate([prompt], greedy)[0].outputs[0].text
    llm.reset_prefix_cache()  # from now on only kvferry holds the prompt's KV
    second = llm.generate([prompt], greedy)[0].outputs[0].text
    files = sum(1 for _ in Path(kv_dir).rglob("*.kvf"))
    print(f"kvferry block files: {files}")
    print("same output after a kvferry load:", first == second)
    return 0 if first == second else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
