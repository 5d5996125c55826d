# SPDX-License-Identifier: Apache-2.0
"""Runs vLLM's LLM engine (its CPU build) on a tiny random-initialised Llama,
with or without kvferry's connector, and prints what the engine tests check
as one JSON line. A program, not a test: vLLM's engine wants a process of
its own, started under `if __name__ == "__main__"`.

    python vllm_engine_main.py MODEL_DIR SCENARIO [FILE_DIR]

SCENARIO: plain (no connector), kvferry (a fresh cache: misses, then hits),
restart (a cache on a directory an earlier run filled), timing-plain and
timing-kvferry (decode steps timed, and the connector's share of them). The engine core and
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


_TIMED = {"scheduler": ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                        "update_connector_output", "request_finished"),
          "worker": ("handle_preemptions", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                     "get_finished", "get_block_ids_with_load_errors", "build_connector_worker_meta")}


def timing(llm, with_kvferry, requests=4, new_tokens=256):
    """Decode steps of `requests` sequences: wall time per engine step and,
    with kvferry, the host time its connector's calls took per step (both
    sides, every hook vLLM calls)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    spent = {}  # connector hook -> seconds
    steps = [0]
    if with_kvferry:
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        sched = llm.llm_engine.engine_core.engine_core.scheduler.connector
        for side, conn in (("scheduler", sched), ("worker", get_kv_transfer_group())):
            for name in _TIMED[side]:
                fn = getattr(conn, name)

                def timed(*a, _fn=fn, _name=name, **kw):
                    t = time.perf_counter()
                    try:
                        return _fn(*a, **kw)
                    finally:
                        spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - t

                setattr(conn, name, timed)
    core = llm.llm_engine.engine_core.engine_core
    real_step = core.step_fn  # what the in-process client calls each step

    def counted(*a, **kw):
        steps[0] += 1
        return real_step(*a, **kw)

    core.step_fn = counted
    prompts = [TokensPrompt(prompt_token_ids=tokens(100 + i, 64)) for i in range(requests)]
    sp = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)  # warm
    spent.clear()
    steps[0] = 0
    t0 = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    n = max(steps[0], 1)
    return {"steps": steps[0], "step_s": wall / n, "connector_s_per_step": sum(spent.values()) / n,
            "per_hook_s_per_step": {k: v / n for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}}


def main():
    model, scenario = sys.argv[1], sys.argv[2]
    file_dir = sys.argv[3] if len(sys.argv) > 3 else None
    write_model(model)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.time()
    plain = scenario in ("plain", "timing-plain")
    llm = LLM(model=model, enable_prefix_caching=False, max_model_len=1024, seed=0, block_size=BLOCK, max_num_seqs=4,
              kv_transfer_config=None if plain else kv_config(file_dir))
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
        if plain:
            return {}
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        return dict(get_kv_transfer_group().cache.stats().hits)

    long = tokens(1, 485)
    out = {"started_s": started, "scenario": scenario}
    if scenario.startswith("timing"):
        out.update(timing(llm, scenario == "timing-kvferry"))
    elif scenario == "restart":  # the very first request of this process
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
