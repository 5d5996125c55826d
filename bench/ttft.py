#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Time to first token of a request whose first P tokens are cached in
kvferry and whose last N are new, with a randomly initialised decoder of
Llama-3-8B's shape (32 layers, 32 heads, 8 KV heads, head 128, bf16, sdpa;
no weights needed), through kvferry.integrations.transformers. Per prefix
length and tier (host: the blocks in pinned host slots; disk: a cache whose
host tier is off, so they are files read back with the engine's file I/O):

  recompute   the whole request computed, no cache
  whole       the prefix fetched whole, then the N new tokens computed
  layerwise   layer l+1's K/V loading while layer l computes
  plan        the cache's load-or-recompute plan, followed (mode "plan"),
              beside the TTFT it predicted and its shape: loaded blocks of
              the hits, after the front blocks computed while they load;
              every run teaches the cache its time (first_token), so later
              runs plan with what the earlier ones took (learnt: measured
              over the model's prediction, of the plans that loaded), and
              the runs whose loads the hedge gave up (hedged)
  lw again    layer-wise timed once more after the plan (a drift of the
              machine between the two shows here)
  load        the whole prefix's get alone
  compute     the N new tokens' forward alone, the prefix already in memory
  ceiling     one pinned host -> device copy of the prefix's bytes (torch)

The plan's prefill cost is the model's own, measured once before the rows
(measure_prefill: new tokens x prefix tokens); its tier costs are what the
engine learnt from the gets before it (--costs learnt), or those figures
held from then on (--costs held). A row's plan meets its target when it is
within 1.05 x the better pure policy (recompute, or layer-wise: every hit
loaded) and its predictions within 20 % of the runs' times.

--copy auto,dma times whole, layerwise, load and plan once per CUDA copy mode of
the engine, each through its own cache, in the same run.

Each is the median of --runs after --warmup, bounded by synchronize(), with
Python's garbage collector paused inside each timed run (quiet_gc.py). The
target: layerwise <= 1.15 x max(load, compute), and below whole. After every
whole and layer-wise run the restored prefix K/V are compared, bit for bit,
with the K/V the model computed when the blocks were stored (logits prove
nothing: eager forward passes are not bit-deterministic). Exit 1 if any
differs, 77 without torch or transformers, or without CUDA unless --tiny.

  python3 bench/ttft.py --json out.json                  # on a GPU: 2k, 8k, 32k x host, disk
  python3 bench/ttft.py --tiny                           # a small model on the CPU, host backend
"""
import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import torch
    import transformers
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
except ImportError as exc:
    print(f"ttft: {exc.name} is not installed; skipped")
    sys.exit(77)

import kvferry as kvf  # noqa: E402
from quiet_gc import gc_paused  # noqa: E402
from kvferry.integrations.transformers import (KVFerryPrefixCache, PrefixLate, cache_kwargs,  # noqa: E402
                                              measure_prefill)

TARGET = 1.15
PLAN_TARGET = 1.05  # the plan against the better pure policy
PREDICTION_TARGET = 0.20  # the plan's prediction against its runs' median


def llama3_8b_shape():
    return LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
                       rope_theta=500000.0, attn_implementation="sdpa")


def tiny_shape():
    return LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                       intermediate_size=512, vocab_size=1024, max_position_embeddings=8192,
                       attn_implementation="sdpa")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default=None, help="cached prefix lengths in tokens, comma-separated "
                    "(default 2048,8192,32768; --tiny 256,1024; --quick 2048)")
    ap.add_argument("--new", type=int, default=None, help="new tokens after the prefix (default 512; --tiny 64)")
    ap.add_argument("--tiers", default="host,disk", help="host, disk or both (default host,disk)")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per measurement (default 5; --quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 2; --quick 1)")
    ap.add_argument("--copy", default=None, help="the engine's CUDA copy modes to time, comma-separated, "
                    "each through its own cache in this run: auto, dma, kernel (default $KVF_CUDA_COPY or "
                    "auto; e.g. auto,dma)")
    ap.add_argument("--tokens-per-block", type=int, default=64)
    ap.add_argument("--costs", default="learnt", choices=("learnt", "held"), help="the plan's tier costs: "
                    "as the engine keeps learning them (default), or held at what it learnt before the plan")
    ap.add_argument("--disk-dir", default=None, help="where the disk tier's files go (default: a new "
                    "folder under $TMPDIR; removed afterwards)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument("--tiny", action="store_true", help="a small model; runs on the CPU (host backend) "
                    "when there is no GPU")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    a = ap.parse_args()
    a.device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.device.type == "cuda" and a.device.index is None:
        a.device = torch.device("cuda", torch.cuda.current_device())
    if a.device.type == "cpu" and not a.tiny:
        print("ttft: no GPU (the full-size model runs on CUDA only; --tiny runs a small one on the CPU); skipped")
        sys.exit(77)
    default_lengths = "256,1024" if a.tiny else ("2048" if a.quick else "2048,8192,32768")
    a.lengths = [int(x) for x in (a.lengths or default_lengths).split(",") if x]
    a.new = a.new or (64 if a.tiny else 512)
    a.runs = a.runs or (2 if a.quick else 5)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 2)
    a.tiers = [t for t in a.tiers.split(",") if t]
    env_copy = os.environ.pop("KVF_CUDA_COPY", None)  # it would override every cache's "auto"
    a.copy = [c for c in (a.copy or env_copy or "auto").split(",") if c]
    for c in a.copy:
        if c not in ("auto", "dma", "kernel"):
            ap.error(f"--copy: {c!r} is not one of auto, dma, kernel")
    if not a.copy or len(set(a.copy)) != len(a.copy):
        ap.error("--copy: give each mode once")
    for t in a.tiers:
        if t not in ("host", "disk"):
            ap.error(f"--tiers: {t!r} is neither host nor disk")
    for n in a.lengths:
        if n <= 0 or n % a.tokens_per_block:
            ap.error(f"--lengths: {n} is not a positive multiple of --tokens-per-block {a.tokens_per_block}")
    if a.new <= 0 or a.runs <= 0 or a.warmup < 0:
        ap.error("--new and --runs must be positive, --warmup not negative")
    return a


class Bench:
    def __init__(self, args):
        self.a = args
        self.dev = args.device
        self.cuda = self.dev.type == "cuda"
        cfg = tiny_shape() if args.tiny else llama3_8b_shape()
        dtype = torch.bfloat16 if self.cuda else torch.float32
        torch.manual_seed(0)
        t0 = time.perf_counter()
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # built in bf16 on the GPU: no fp32 copy of 8B weights
        try:
            with torch.device(self.dev):
                self.model = LlamaForCausalLM(cfg).eval()
        finally:
            torch.set_default_dtype(default)
        self.sync()
        self.init_s = time.perf_counter() - t0
        self.cfg = cfg
        t0 = time.perf_counter()
        self.prefill = measure_prefill(self.model, max(args.lengths) + args.new,
                                       tokens_per_block=args.tokens_per_block)
        self.prefill_s = time.perf_counter() - t0

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def timed(self, fn, before=None, after=None):
        """Median seconds of fn() over the timed runs; before() and after()
        run outside the clock (set-up, checks), and so does Python's
        garbage collector (quiet_gc)."""
        times = []
        for i in range(self.a.warmup + self.a.runs):
            state = before() if before else None
            with gc_paused():
                self.sync()
                t0 = time.perf_counter()
                out = fn(state)
                self.sync()
                dt = time.perf_counter() - t0
            if after:
                after(out, i >= self.a.warmup)
            if i >= self.a.warmup:
                times.append(dt)
        return statistics.median(times), times

    def forward(self, ids, past):
        out = self.model(ids, use_cache=True, **cache_kwargs(self.model, past), logits_to_keep=1)
        return out.logits[0, -1].argmax()  # the first token

    def case(self, length, tier, disk_root):
        """One row per copy mode for a prefix of `length` tokens on `tier`;
        recompute, compute and ceiling do not depend on the copy mode and are
        measured once."""
        a = self.a
        g = torch.Generator().manual_seed(length)
        ids = torch.randint(0, self.cfg.vocab_size, (1, length + a.new), generator=g).to(self.dev)
        with torch.no_grad():
            # the expected K/V: the prefix's as the model computed it, stored into every cache
            full = DynamicCache()
            self.forward(ids, full)
            ref = [(layer.keys[..., :length, :].clone(), layer.values[..., :length, :].clone())
                   for layer in full.layers]
            shared = {}
            rows = [self.served(length, tier, disk_root, ids, full, ref, copy, shared) for copy in a.copy]
            del full
            shared["compute_s"], shared["compute_runs"] = self.timed(
                lambda c: self.forward(ids[:, length:], c), before=lambda: self.with_prefix(ref))
        nbytes = sum(rk.numel() * rk.element_size() * 2 for rk, _ in ref)
        shared["prefix_bytes"] = nbytes
        if self.cuda:
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(nbytes, dtype=torch.uint8, device=self.dev)
            shared["ceiling_s"], _ = self.timed(lambda _: dev.copy_(host, non_blocking=True))
            del host, dev
        else:
            shared["ceiling_s"] = None
        ref.clear()  # free the expected K/V before the next case
        for row in rows:
            row.update(shared)
            ref_s = max(row["load_s"], row["compute_s"])
            row["target_s"] = ref_s
            row["layerwise_over_target"] = row["layerwise_s"] / ref_s
            row["within_target"] = row["layerwise_over_target"] <= TARGET
            row["below_whole"] = row["layerwise_s"] < row["whole_s"]
            best = min(row["recompute_s"], row["layerwise_s"])  # the better pure policy
            row["plan_over_best"] = row["plan_s"] / best
            row["plan_error"] = row["plan"]["predicted_median_s"] / row["plan_s"] - 1
            row["plan_met"] = (row["plan_over_best"] <= PLAN_TARGET and abs(row["plan_error"]) <= PREDICTION_TARGET)
        if self.cuda:
            torch.cuda.empty_cache()
        return rows

    @staticmethod
    def with_prefix(ref):
        """A DynamicCache already holding the prefix: the new tokens' compute alone."""
        c = DynamicCache()
        for i, (rk, rv) in enumerate(ref):
            c.update(rk, rv, i)
        return c

    def served(self, length, tier, disk_root, ids, full, ref, copy, shared):
        """whole, layer-wise and load through a cache whose engine moves
        blocks with `copy` (kvf.CudaCopy)."""
        a, tpb = self.a, self.a.tokens_per_block
        blocks = length // tpb
        opts = dict(host_blocks=blocks + 1) if tier == "host" else dict(
            disk_dir=os.path.join(disk_root, f"p{length}-{copy}"), disk_blocks=blocks + 1)
        opts["engine_options"] = {"cuda_copy": kvf.CudaCopy[copy.upper()]}
        row = {"length": length, "new": a.new, "tier": tier, "copy": copy, "blocks": blocks}
        with KVFerryPrefixCache.from_model(self.model, tokens_per_block=tpb, max_tokens=length + a.new,
                                           salt=f"ttft-{length}", prefill_cost=self.prefill, **opts) as kv:
            assert kv.store(ids[:, :length], full) == blocks
            kv.sync()
            settings = kv.engine.settings()
            row["cuda_copy"] = settings["cuda_copy"].value if "cuda_copy" in settings else None
            if tier == "disk":
                row["disk_settings"] = {k: str(v.value) for k, v in settings.items() if k.startswith("file_")}
            assert kv.lookup(ids) == length, f"{kv.lookup(ids)} of {length} tokens cached"
            exact = []

            bits = {2: torch.int16, 4: torch.int32}[ref[0][0].element_size()]

            def check(past, timed):
                past.finish()
                assert past.cached_tokens == length and past.loaded
                exact.append(all(torch.equal(layer.keys[..., :length, :].view(bits), rk.view(bits))
                                 and torch.equal(layer.values[..., :length, :].view(bits), rv.view(bits))
                                 for layer, (rk, rv) in zip(past.layers, ref)))

            def poison():  # the pools still hold what store wrote: a get that did nothing must show
                kv.sync()
                for pool in kv.k_pools + kv.v_pools:
                    pool.fill_(float("nan"))

            def check_plan(past, timed):
                past.finish()
                if timed:
                    measured.append(past.ttft_s)
                    predicted.append(past.plan.ttft_s)
                    waited.append(past.waited_s)
                    # the adapter's own record of when its hedge fired
                    hedged_at.append(past.late_at - past.started if past.late else None)
                    # when the adapter had its loads due (all of them), its hedge, and the pace the
                    # layers' waits saw (KVFerryDynamicCache.pace)
                    dues.append((past._due(0)[1], past.plan.hedge_s, past.pace))
                lo, hi = past.front_blocks * tpb, past.cached_tokens  # the blocks it loaded
                exact.append(all(torch.equal(layer.keys[..., lo:hi, :].view(bits), rk[..., lo:hi, :].view(bits))
                                 and torch.equal(layer.values[..., lo:hi, :].view(bits),
                                                 rv[..., lo:hi, :].view(bits))
                                 for layer, (rk, rv) in zip(past.layers, ref)))
                plans.append(past.plan)

            plans, measured, predicted, waited, hedged_at, dues = [], [], [], [], [], []
            prepare = {}  # host seconds in prepare per mode: the adapter's own part of the critical path

            def served(mode):
                def run(_):
                    t0 = time.perf_counter()
                    past = kv.prepare(ids, mode=mode, model=self.model)
                    prepare.setdefault(mode, []).append(time.perf_counter() - t0)
                    try:
                        self.forward(ids[:, past.cached_tokens:], past)
                        past.finish()
                    except PrefixLate as exc:
                        # the plan's hedge gave up a late load: the request
                        # recomputes what had not arrived, as the adapter's
                        # own forward and generate do, inside the timing
                        past = kv._recover(ids, past, exc)
                        self.forward(ids[:, past.cached_tokens:], past)
                        past.finish()
                    self.sync()  # the first token computed: its time teaches the cache (mode "plan")
                    past.first_token()
                    return past
                return run

            if "recompute_s" not in shared:
                shared["recompute_s"], shared["recompute_runs"] = self.timed(
                    lambda _: self.forward(ids, kv.prepare(ids, mode="recompute")))
            row["whole_s"], row["whole_runs"] = self.timed(served("whole"), before=poison, after=check)
            row["layerwise_s"], row["layerwise_runs"] = self.timed(served("layerwise"), before=poison,
                                                                   after=check)

            def load(_):
                past = kv.prepare(ids, mode="whole")
                assert past.cached_tokens == length
                return past
            row["load_s"], row["load_runs"] = self.timed(load, before=poison)
            # after the gets above: the engine's tier costs are learnt ones; held from here with --costs held
            if a.costs == "held":
                for t, c in kv.engine.costs().items():
                    if c.observed:
                        kv.engine.set_tier_cost(t, c.latency_s, c.bytes_per_s, hold=True)
            hedged = kv.hedged
            row["plan_s"], row["plan_runs"] = self.timed(served("plan"), before=poison, after=check_plan)
            row["plan_hedged"] = kv.hedged - hedged  # runs whose late loads were given up
            if row["plan_hedged"]:
                print(f"ttft: {length} {tier}: the plan's hedge gave up late loads in {row['plan_hedged']} "
                      f"of {self.a.warmup + self.a.runs} runs (recomputed, inside the timing)", flush=True)
            # layer-wise once more, after the plan: tells a cost of the plan's
            # path from a drift of the machine between the two
            row["layerwise_again_s"], row["layerwise_again_runs"] = self.timed(served("layerwise"), before=poison,
                                                                               after=check)
            p = plans[-1]
            row["plan"] = {"predicted_s": p.ttft_s, "hits": p.hits, "load_blocks": p.load_blocks,
                           "load_first": int(getattr(p, "load_first", 0) or 0), "load_s": p.load_s,
                           "compute_s": p.compute_s, "ttft_recompute_s": p.ttft_recompute_s,
                           "ttft_load_all_s": p.ttft_load_all_s, "overlap": p.overlap,
                           "same_every_run": all(q == p for q in plans),
                           "shapes": [plan_blocks_of(q) for q in plans],
                           "predicted_runs": predicted, "measured_runs": measured, "waited_runs": waited,
                           "hedged_at_runs": hedged_at, "due_hedge_pace_runs": dues,
                           "predicted_median_s": statistics.median(predicted),
                           "learnt": dataclasses.asdict(kv.cache.plan_learnt())}
            row["prepare_s"] = {m: statistics.median(t) for m, t in prepare.items()}
            row["byte_exact"] = all(exact)
            row["byte_exact_runs"] = len(exact)
            row["stats"] = {k: v for k, v in kv.cache.stats().as_dict().items()
                            if k in ("hits", "failures", "bytes_out", "blocks")}
        return row


def fs_of(path):
    """The file system type holding path (tmpfs makes 'disk' memory)."""
    best, fstype = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if str(path).startswith(mnt) and len(mnt) > len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        pass
    return fstype


def plan_blocks_of(p):
    """plan_blocks of a kvferry Plan."""
    return plan_blocks({"load_first": p.load_first, "load_blocks": p.load_blocks, "hits": p.hits})


def plan_blocks(p):
    """loaded/hits, after the computed front where the plan has one: 3+29/32."""
    f = p["load_first"]
    return (f"{f}+{p['load_blocks'] - f}" if f else f"{p['load_blocks']}") + f"/{p['hits']}"


def ms(x):
    return f"{'-':>9}" if x is None else f"{x * 1e3:9.1f}"


def main():
    t0 = time.perf_counter()
    a = parse_args()
    b = Bench(a)
    tmp = None
    disk_root = a.disk_dir
    if disk_root is None and "disk" in a.tiers:
        tmp = tempfile.TemporaryDirectory(prefix="kvf-ttft-")
        disk_root = tmp.name
    meta = {
        "model": "tiny llama" if a.tiny else "Llama-3-8B shape, random init",
        "layers": b.cfg.num_hidden_layers, "kv_heads": b.cfg.num_key_value_heads,
        "head_dim": b.cfg.hidden_size // b.cfg.num_attention_heads, "dtype": str(b.model.dtype),
        "attn": b.model.config._attn_implementation, "device": str(a.device),
        "gpu": torch.cuda.get_device_name(a.device) if b.cuda else platform.processor() or "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "kvferry": kvf.version(),
        "tokens_per_block": a.tokens_per_block, "new_tokens": a.new, "runs": a.runs, "warmup": a.warmup,
        "disk_dir_fs": fs_of(disk_root) if disk_root else None,
        "model_init_s": round(b.init_s, 2), "prefill_table": b.prefill, "prefill_table_s": round(b.prefill_s, 2),
        "target": f"layerwise <= {TARGET} x max(load, compute) and < whole",
    }
    print(f"ttft: {meta['model']} ({meta['layers']} layers, {meta['kv_heads']} kv heads x {meta['head_dim']}, "
          f"{meta['dtype']}) on {meta['gpu']}; torch {meta['torch']}, transformers {meta['transformers']}, "
          f"{meta['kvferry']}")
    print(f"ttft: {a.new} new tokens, {a.tokens_per_block} tokens a block, median of {a.runs} after {a.warmup} "
          f"warm-up" + (f"; disk dir on {meta['disk_dir_fs']}" if disk_root else ""))
    rows = []
    hdr = (f"{'prefix':>7} {'tier':>5} {'copy':>6} {'recompute':>9} {'whole':>9} {'layerwise':>9} {'load':>9}"
           f" {'compute':>9} {'ceiling':>9} {'lw/target':>9} {'< whole':>7} {'plan':>9} {'predicted':>9}"
           f" {'plan blocks':>13} {'plan/best':>9} {'learnt':>6} {'hedged':>6} {'lw again':>9} {'exact':>5}   (ms)")
    print(hdr)
    skipped = []  # (tier, length) cases the device had no memory for
    try:
        for tier in a.tiers:
            for length in a.lengths:
                out_of_memory = False
                try:
                    for r in b.case(length, tier, disk_root):
                        rows.append(r)
                        print(f"{length:>7} {tier:>5} {r['copy']:>6} {ms(r['recompute_s'])} {ms(r['whole_s'])} "
                              f"{ms(r['layerwise_s'])} {ms(r['load_s'])} {ms(r['compute_s'])} "
                              f"{ms(r['ceiling_s'])} {r['layerwise_over_target']:9.2f} "
                              f"{'yes' if r['below_whole'] else 'NO':>7} {ms(r['plan_s'])} "
                              f"{ms(r['plan']['predicted_median_s'])} {plan_blocks(r['plan']):>13} "
                              f"{r['plan_over_best']:9.2f} {r['plan']['learnt']['load_ratio']:6.2f} "
                              f"{r['plan_hedged']:>6} "
                              f"{ms(r['layerwise_again_s'])} {'yes' if r['byte_exact'] else 'NO':>5}", flush=True)
                        pr = r["plan"]
                        print(f"ttft: {length} {tier} plan runs: " + ", ".join(
                            f"{sh} {m * 1e3:.1f}/{q * 1e3:.1f}/{w * 1e3:.1f}"
                            + (f" (loads due {d[0] * 1e3:.1f}, hedge {d[1] * 1e3:.1f}, pace {d[2]:.2f})"
                               if d[1] > 0 else "")
                            + (f" (hedged at {h * 1e3:.1f})" if h is not None else "")
                            for sh, m, q, w, h, d in zip(
                                pr["shapes"][-len(pr["measured_runs"]):], pr["measured_runs"],
                                pr["predicted_runs"], pr["waited_runs"], pr["hedged_at_runs"],
                                pr["due_hedge_pace_runs"]))
                              + f" ms measured/predicted/in the layers' waits; prepare "
                              f"{r['prepare_s'].get('plan', 0) * 1e3:.1f} ms", flush=True)
                except torch.cuda.OutOfMemoryError as exc:
                    # the model's own attention at this length (transformers'
                    # eager path copies K/V per query head): the other
                    # lengths still run
                    why = str(exc).splitlines()[0] if str(exc) else "out of memory"
                    skipped.append({"tier": tier, "length": length, "reason": why})
                    print(f"{length:>7} {tier:>5} skipped, out of device memory: {why[:160]}", flush=True)
                    out_of_memory = True
                if out_of_memory:  # past the handler: its traceback no longer holds the case's frames
                    free_device_memory(b)
    finally:
        if tmp is not None:
            tmp.cleanup()
    ok = all(r["byte_exact"] for r in rows)
    met = all(r["within_target"] and r["below_whole"] for r in rows)
    plan_met = all(r["plan_met"] for r in rows)
    missing = ", ".join(f"{c['tier']} {c['length']}" for c in skipped)
    print(f"ttft: K/V byte-exact after every round trip: {'yes' if ok else 'NO'}; target met at every row "
          f"measured: {'yes' if met else 'no'}; plan <= {PLAN_TARGET} x the better pure policy and its prediction "
          f"within {PREDICTION_TARGET:.0%} at every row: {'yes' if plan_met else 'no'} ({a.costs} costs)"
          + (f"; not measured (out of device memory): {missing}" if skipped else "")
          + f"; {time.perf_counter() - t0:.0f} s in all, {b.prefill_s:.0f} s of it the prefill table")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "skipped": skipped, "byte_exact": ok, "target_met": met,
                       "plan_target_met": plan_met}, f,
                      indent=1)
    return 0 if ok else 1


def free_device_memory(b):
    """What a case that ran out of memory left: its tensors are garbage once
    its frames are gone; the allocator's cache goes back to the device."""
    import gc

    gc.collect()
    if b.cuda:
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
