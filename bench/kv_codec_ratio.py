#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""How far a lossless codec could shrink a decoder's K/V on a slow tier.

Runs a randomly initialised decoder of Llama-3-8B's layer shape (hidden
4096, 8 KV heads of 128, bf16 K/V; --layers of them, a smaller vocabulary:
the embedding's size does not change what a layer writes) over random
token ids, takes each layer's K and V as the cache holds them (bf16), and
prints, for K, V and both:

- the bound of any order-0 entropy coder over the whole values (the
  Shannon entropy of the 16-bit values: no coder that codes each value
  alone does better);
- the same after the usual byte-plane split (the high bytes, sign and
  exponent, coded apart from the low bytes, mantissa): the sum of each
  plane's entropy;
- what zlib and LZMA make of the split planes, and of the bytes as stored
  (the alternative a user would reach for), and how fast one CPU core
  decodes them (every byte compared with the original);

and what that ratio would make of a disk-bound load (the load's time over
the ratio, where decoding keeps up with the disk).

No trained checkpoint is reachable from the machines this was written on,
so the figures are for random weights: a trained model's K has outlier
channels and may code better or worse; the bench takes --model to run a
checkpoint where one is at hand.

Usage: kv_codec_ratio.py [--layers 4] [--tokens 1024] [--model PATH] [--json FILE]
"""
import argparse
import json
import lzma
import math
import sys
import time
import zlib

try:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
except ImportError as exc:
    print(f"kv_codec_ratio: {exc.name} is not installed; skipped")
    sys.exit(77)


def entropy_bits(counts):
    """Shannon entropy in bits per symbol of a histogram."""
    total = float(counts.sum())
    p = counts[counts > 0].double() / total
    return float(-(p * torch.log2(p)).sum())


def planes(t):
    """The bf16 tensor t as (values uint16, high bytes, low bytes)."""
    v = t.contiguous().view(torch.int16).flatten().to(torch.int32) & 0xFFFF
    return v, (v >> 8).to(torch.uint8), (v & 0xFF).to(torch.uint8)


def measure(name, tensors):
    """Ratios for the bf16 tensors' bytes: entropy bounds and real coders."""
    v, hi, lo = (torch.cat(p) for p in zip(*(planes(t) for t in tensors)))
    n = v.numel()
    h16 = entropy_bits(torch.bincount(v, minlength=65536))
    hhi = entropy_bits(torch.bincount(hi.to(torch.int64), minlength=256))
    hlo = entropy_bits(torch.bincount(lo.to(torch.int64), minlength=256))
    raw = torch.stack([lo, hi], dim=1).flatten().numpy().tobytes()  # little-endian, as stored
    split = hi.numpy().tobytes(), lo.numpy().tobytes()
    z_raw = len(zlib.compress(raw, 6))
    zs = [zlib.compress(p, 6) for p in split]
    xs = [lzma.compress(p, preset=1) for p in split]
    z_split, x_split = sum(map(len, zs)), sum(map(len, xs))
    # decoding is what a load pays: one CPU core's rate, beside the disk's
    t0 = time.perf_counter()
    assert b"".join(zlib.decompress(p) for p in zs) == b"".join(split)
    z_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert b"".join(lzma.decompress(p) for p in xs) == b"".join(split)
    x_s = time.perf_counter() - t0
    row = {
        "what": name, "bytes": 2 * n,
        "entropy_bits": h16, "bound_ratio": 16 / h16,
        "plane_bits": [hhi, hlo], "plane_bound_ratio": 16 / (hhi + hlo),
        "zlib_raw_ratio": len(raw) / z_raw, "zlib_split_ratio": len(raw) / z_split,
        "lzma_split_ratio": len(raw) / x_split,
        "zlib_decode_GBps": len(raw) / z_s / 1e9, "lzma_decode_GBps": len(raw) / x_s / 1e9,
    }
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--model", help="a checkpoint to load instead of random weights")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    if a.model:
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16).eval()
        what = a.model
    else:
        cfg = LlamaConfig(hidden_size=4096, num_hidden_layers=a.layers, num_attention_heads=32,
                          num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                          max_position_embeddings=8192, rope_theta=500000.0, attn_implementation="sdpa")
        model = LlamaForCausalLM(cfg).eval()
        what = f"random weights, Llama-3-8B layer shape, {a.layers} layers"
    ids = torch.randint(0, model.config.vocab_size, (1, a.tokens))
    with torch.no_grad():
        out = model(ids, use_cache=True)
    cache = out.past_key_values
    ks, vs = [], []
    for layer in range(model.config.num_hidden_layers):
        k, v = (cache.layers[layer].keys, cache.layers[layer].values) if hasattr(cache, "layers") \
            else cache[layer]
        ks.append(k.to(torch.bfloat16))
        vs.append(v.to(torch.bfloat16))
    print(f"kv_codec_ratio: {what}; {a.tokens} tokens; K/V in bf16 "
          f"({time.perf_counter() - t0:.0f} s to build and run)")
    rows = [measure("K", ks), measure("V", vs), measure("K+V", ks + vs)]
    print(f"{'':4} {'MiB':>7} {'bound':>7} {'planes':>7} {'hi/lo bits':>11} {'zlib':>6} "
          f"{'zlib split':>10} {'lzma split':>10}")
    for r in rows:
        print(f"{r['what']:4} {r['bytes'] / 2**20:7.1f} {r['bound_ratio']:6.3f}x {r['plane_bound_ratio']:6.3f}x "
              f"{r['plane_bits'][0]:5.2f}/{r['plane_bits'][1]:4.2f} {r['zlib_raw_ratio']:5.3f}x "
              f"{r['zlib_split_ratio']:9.3f}x {r['lzma_split_ratio']:9.3f}x")
    both = rows[2]
    best = max(both["zlib_split_ratio"], both["lzma_split_ratio"])
    print(f"bound: no order-0 coder of the values beats {both['bound_ratio']:.3f}x; the split planes coded "
          f"reach {best:.3f}x here (zlib on the bytes as stored: {both['zlib_raw_ratio']:.3f}x)")
    print(f"decoding on one CPU core (every byte checked against the original): zlib "
          f"{both['zlib_decode_GBps']:.2f} GB/s, LZMA {both['lzma_decode_GBps']:.2f} GB/s of K/V")
    print(f"a disk-bound load with a codec at the bound, decoding as fast as the disk reads: "
          f"{1 / both['bound_ratio']:.2f}x of its time; at the coded planes' ratio {1 / best:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": what, "tokens": a.tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
