# SPDX-License-Identifier: Apache-2.0
"""Runs vLLM's LLM engine (its CPU build) on a tiny random-initialised Llama,
with or without kvferry's connector, and prints what the engine tests check
as one JSON line. A program, not a test: vLLM's engine wants a process of
its own, started under `if __name__ == "__main__"`.

    python vllm_engine_main.py MODEL_DIR SCENARIO [FILE_DIR]

SCENARIO: plain (no connector), kvferry (a fresh cache: misses, then hits),
restart (a cache on a directory an earlier run filled). The engine core and
the worker run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the
worker's kvferry cache is read directly for its stats."""

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

BLOCK = 32  # the CPU attention backend takes multiples of 32
VOCAB = 512


def write_model(d):
    """A 2-layer Llama of random weights (fixed generator, spread wide enough that
    every token's logits differ, so an output depends on every KV row it
    attends to; vLLM's load_format="dummy" weights are so small that all
    logits tie) and a WordLevel tokenizer ("w<i>" is token i + 3)."""
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return
    os.makedirs(d, exist_ok=True)
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      initializer_range=0.2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(VOCAB - 3)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "model_max_length": 2048}, f)


def tokens(stream, n):
    import random

    r = random.Random(stream)
    return [r.randrange(3, VOCAB) for _ in range(n)]


def kv_config(file_dir):
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="KvferryConnector", kv_connector_module_path="kvferry.integrations.vllm",
                            kv_role="kv_both", kv_load_failure_policy="recompute",
                            kv_connector_extra_config={"host_blocks": 8, "disk_blocks": 4096, "file_dir": file_dir})


def main():
    model, scenario = sys.argv[1], sys.argv[2]
    file_dir = sys.argv[3] if len(sys.argv) > 3 else None
    write_model(model)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.time()
    llm = LLM(model=model, enable_prefix_caching=False, max_model_len=1024, seed=0,
              block_size=BLOCK, max_num_seqs=4, kv_transfer_config=None if scenario == "plain" else kv_config(file_dir))
    started = time.time() - t0
    greedy = SamplingParams(max_tokens=8, temperature=0, logprobs=5)

    def run(toks, salt=None, sp=greedy):
        p = TokensPrompt(prompt_token_ids=toks)
        if salt is not None:
            p["cache_salt"] = salt
        o = llm.generate([p], sp, use_tqdm=False)[0]
        c = o.outputs[0]
        top = [sorted((int(t), round(float(lp.logprob), 4)) for t, lp in step.items()) for step in (c.logprobs or [])]
        return {"tokens": list(c.token_ids), "top5": top, "cached": int(o.num_cached_tokens or 0)}

    def hits():
        if scenario == "plain":
            return {}
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        return dict(get_kv_transfer_group().cache.stats().hits)

    long = tokens(1, 485)
    out = {"started_s": started, "scenario": scenario}
    if scenario == "restart":  # the very first request of this process
        out["first"] = run(long)
        out["hits_after_first"] = hits()
    else:
        out["first"] = run(long)
        out["hits_after_first"] = hits()
        out["second"] = run(long)
        out["hits_after_second"] = hits()
        tenant = tokens(2, 200)
        out["tenant_a"] = run(tenant, "tenant-A")
        out["tenant_b"] = run(tenant, "tenant-B")
        out["tenant_a_again"] = run(tenant, "tenant-A")
        turn1 = tokens(3, 100)
        answer = run(turn1, sp=SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
        turn2 = turn1 + answer["tokens"] + tokens(4, 40)
        out["turn1_len"], out["answer_len"] = len(turn1), len(answer["tokens"])
        out["turn2"] = run(turn2)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
