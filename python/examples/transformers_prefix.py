# SPDX-License-Identifier: Apache-2.0
# requires: torch transformers
"""Prefix reuse in a transformers program through kvferry.

Requests that share a long prefix (a system prompt, a document, the turns of
a chat) pay for it once: KVFerryPrefixCache stores each request's whole KV
blocks in kvferry's host and disk tiers and serves the next request's cached
prefix from there, layer by layer while the model computes, so only the new
tokens are prefilled. Blocks the host tier evicts go to the disk tier,
which outlives the process (host-tier blocks do not): processes that share
a prefix through the directory use host_blocks=0, or a Redis server.

Without --model it builds a small randomly initialised Llama (nothing to
download); with --model it loads a checkpoint (AutoModelForCausalLM) and
uses its tokenizer. Every served prefix is checked bit for bit against the
K/V the model computed when it was stored.

    KVFERRY_LIBRARY=build/libkvferry.so python3 python/examples/transformers_prefix.py [--disk DIR]
    python3 python/examples/transformers_prefix.py --model meta-llama/Llama-3.2-1B --device cuda
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a source checkout
from kvferry.integrations.transformers import KVFerryPrefixCache, cache_kwargs  # noqa: E402


def load(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if args.model:
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if args.device == "cuda"
                                                     else torch.float32).to(args.device).eval()
        return model, lambda text: tok(text, return_tensors="pt").input_ids
    torch.manual_seed(0)  # the same random weights in every run: the disk tier's blocks stay valid
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).to(args.device).eval()
    # stand-in tokenizer: deterministic ids per word
    return model, lambda text: torch.tensor([[sum(map(ord, w)) * 7919 % 4096 for w in text.split()]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a checkpoint to load (default: a small random Llama)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--disk", help="the disk tier's directory (default: a temporary one)")
    args = ap.parse_args()
    model, tokenize = load(args)
    tmp = None if args.disk else tempfile.TemporaryDirectory(prefix="kvf-hf-")
    disk = args.disk or tmp.name

    system = " ".join(f"rule{i} keep answers short and cite the document section {i % 17}" for i in range(60))
    questions = ["what does section three say about latency", "summarise section nine in one line",
                 "which sections mention disks"]
    bad = 0
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=16, max_tokens=4096,
                                                        host_blocks=256, disk_dir=disk, disk_blocks=4096,
                                                        salt=args.model or "example-random-llama") as kv:
        stored = None
        for q in questions:
            ids = torch.cat([tokenize(system), tokenize(q)], dim=1).to(args.device)
            t0 = time.perf_counter()
            past = kv.prepare(ids)  # lookup, and the get queued: nothing waited for yet
            out = model(ids[:, past.cached_tokens:], **cache_kwargs(model, past), logits_to_keep=1)
            past.finish()  # every block arrived whole (else PrefixLoadError: recompute)
            first = int(out.logits[0, -1].argmax())
            ms = (time.perf_counter() - t0) * 1e3
            print(f"{ids.shape[1]:5d} tokens, {past.cached_tokens:5d} served from kvferry, first token {first:5d} "
                  f"in {ms:7.1f} ms")
            if stored is not None and past.cached_tokens:  # the served prefix is what was stored, bit for bit
                n = past.cached_tokens
                same = all(torch.equal(a.keys[..., :n, :], b[0][..., :n, :])
                           and torch.equal(a.values[..., :n, :], b[1][..., :n, :])
                           for a, b in zip(past.layers, stored))
                bad += not same
            kv.store(ids, past)  # its whole blocks, for the next request
            if stored is None:
                stored = [(layer.keys.clone(), layer.values.clone()) for layer in past.layers]
        kv.sync()
        s = kv.cache.stats()
        print(f"cache: {s.blocks['host']} blocks in host memory, {s.blocks['disk']} on disk, hits {s.hits}")
        # generate() does the same around model.generate
        ids = torch.cat([tokenize(system), tokenize("and section twelve")], dim=1).to(args.device)
        gen = kv.generate(model, ids, max_new_tokens=8, do_sample=False)
        print(f"generate: {gen.shape[1] - ids.shape[1]} new tokens after a served prefix")
    print("served prefixes byte-exact" if not bad else f"{bad} served prefixes DIFFER")
    if tmp is not None:
        tmp.cleanup()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
