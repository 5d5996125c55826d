# SPDX-License-Identifier: Apache-2.0
"""Load or recompute, measured on a GPU (docs/planner.md).

A randomly initialised decoder of a given shape (default Llama-3-8B's: 32
layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, bf16; no
RoPE, which costs little next to the rest) prefills prompts whose prefix is
cached by kvferry in blocks of 16 tokens, one pool per layer for K and one
for V (2 MiB a block). For each tier (host, disk) and prompt length it
times, from the cache's point of view after a warm-up:

- recompute: the whole prompt computed, nothing loaded;
- load all: every usable hit got (kvf_cache_get), then the rest computed;
- plan: kvf_cache_plan's split, followed; where the plan overlaps (the host
  tier on the CUDA backend) the hits are got pool by pool and layer l's
  attention waits on the GPU for its two pools (stream_wait_pool);

and prints the plan's predicted TTFT beside the measured one. The prefill
cost the plan uses is measured first on the same model (full prefills of
the table's lengths, with prefix 0), the tier costs are the engine's,
learnt from the gets before the plan.

    python3 bench/plan_ttft.py --tokens 2048,8192,32768 --disk /tmp/kv --json plan.json
    python3 bench/plan_ttft.py --layers 2 --hidden 512 --heads 8 --kv-heads 2 --mlp 1024 --tokens 256,1024

Targets (issue 19): plan <= 1.05 x min(recompute, load all); from disk,
plan <= 0.8 x recompute at 8k and 32k tokens; predicted within 20 % of
measured. The JSON holds every figure; the last lines say which held.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import kvferry as kvf  # noqa: E402

try:
    from torch.nn.attention.bias import causal_lower_right
except ImportError:  # older torch: an explicit mask below
    causal_lower_right = None

TPB = 16


class Decoder:
    """Random weights of a Llama-shaped decoder; forward one layer at a time."""

    def __init__(self, a, dev):
        g = torch.Generator(device=dev).manual_seed(1)
        h, kvd, m = a.hidden, a.kv_heads * a.head, a.mlp
        mk = lambda r, c: (torch.randn(r, c, device=dev, dtype=torch.bfloat16, generator=g) * 0.02)  # noqa: E731
        self.a = a
        self.w = [dict(q=mk(h, h), k=mk(h, kvd), v=mk(h, kvd), o=mk(h, h), gate=mk(h, m), up=mk(h, m),
                       down=mk(m, h)) for _ in range(a.layers)]

    @staticmethod
    def norm(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)

    def layer(self, l, x, k_pre=None, v_pre=None):
        """x: [n, hidden]; k_pre, v_pre: [P, kv_heads, head] or None.
        Returns x and this layer's new K, V ([n, kv_heads, head])."""
        a, w = self.a, self.w[l]
        n = x.shape[0]
        h = self.norm(x)
        q = (h @ w["q"]).view(n, a.heads, a.head)
        k = (h @ w["k"]).view(n, a.kv_heads, a.head)
        v = (h @ w["v"]).view(n, a.kv_heads, a.head)
        kk = k if k_pre is None else torch.cat([k_pre, k])
        vv = v if v_pre is None else torch.cat([v_pre, v])
        rep = a.heads // a.kv_heads
        qh = q.transpose(0, 1).unsqueeze(0)
        kh = kk.repeat_interleave(rep, dim=1).transpose(0, 1).unsqueeze(0)
        vh = vv.repeat_interleave(rep, dim=1).transpose(0, 1).unsqueeze(0)
        s = kh.shape[2]
        if s == n:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        elif causal_lower_right is not None:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(n, s))
        else:
            mask = torch.ones(n, s, dtype=torch.bool, device=x.device).tril(diagonal=s - n)
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        x = x + o.squeeze(0).transpose(0, 1).reshape(n, -1) @ w["o"]
        h = self.norm(x)
        x = x + (F.silu(h @ w["gate"]) * (h @ w["up"])) @ w["down"]
        return x, k, v


def sync():
    torch.cuda.synchronize()


def median_time(fn, repeat):
    out = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


class Bench:
    def __init__(self, a, model, engine, cache, kv, tier):
        self.a, self.m, self.e, self.c, self.kv, self.tier = a, model, engine, cache, kv, tier

    def embed(self, n):
        g = torch.Generator(device="cuda").manual_seed(n)
        return torch.randn(n, self.a.hidden, device="cuda", dtype=torch.bfloat16, generator=g)

    def prefill(self, x, slots=None, prefix=None):
        """Every layer over x; prefix: (slots of the loaded blocks, ticket or
        None): layer l reads its K and V from those slots once they arrived."""
        for l in range(self.a.layers):
            kp = vp = None
            if prefix is not None:
                pslots, ticket = prefix
                if ticket is not None:
                    ticket.stream_wait_pool(2 * l, torch.cuda.current_stream())
                    ticket.stream_wait_pool(2 * l + 1, torch.cuda.current_stream())
                kp = self.kv[l][0][pslots].reshape(-1, self.a.kv_heads, self.a.head)
                vp = self.kv[l][1][pslots].reshape(-1, self.a.kv_heads, self.a.head)
            x, k, v = self.m.layer(l, x, kp, vp)
            if slots is not None:
                self.kv[l][0][slots] = k.view(len(slots), TPB, self.a.kv_heads, self.a.head)
                self.kv[l][1][slots] = v.view(len(slots), TPB, self.a.kv_heads, self.a.head)
        return x

    def run(self, n, table):
        a = self.a
        nb = n // TPB
        keys = [(int(self.tier) + 1) << 44 | n << 20 | (i + 1) for i in range(nb)]
        x = self.embed(n)
        # the prompt computed once, its blocks handed to the cache
        src = list(range(nb))
        self.prefill(x, slots=src)
        sync()
        self.c.put(keys, src).wait(check=True)
        self.e.sync_stream(None)
        hits, tiers = self.c.lookup(keys)
        assert hits == nb and all(t == self.tier for t in tiers), (hits, set(tiers))
        dst = list(range(nb, 2 * nb))
        k_all = (n - 1) // TPB

        def recompute():
            self.prefill(x)

        def load_all():
            self.c.get(keys[:k_all], dst[:k_all]).wait(check=True)
            self.e.sync_stream(torch.cuda.current_stream())
            self.prefill(x[k_all * TPB:], prefix=(dst[:k_all], None))

        t_rec = median_time(recompute, a.repeat)
        t_all = median_time(load_all, a.repeat)  # also teaches the engine the tier's cost
        self.c.set_prefill_cost(table, layers=a.layers, overlap=True)
        plan = self.c.plan(keys, n)
        kb = plan.load_blocks

        def follow():
            if kb == 0:
                self.prefill(x)
                return
            t = self.c.get(keys[:kb], dst[:kb], pools=list(range(2 * a.layers)))
            self.prefill(x[kb * TPB:], prefix=(dst[:kb], t))
            t.wait(check=True)

        t_plan = median_time(follow, a.repeat)
        c = self.e.costs()[self.tier]
        return dict(tier=self.tier.name.lower(), tokens=n, blocks=nb, recompute_s=t_rec, load_all_s=t_all,
                    plan_s=t_plan, plan_blocks=kb, plan_overlap=plan.overlap, predicted_plan_s=plan.ttft_s,
                    predicted_recompute_s=plan.ttft_recompute_s, predicted_load_all_s=plan.ttft_load_all_s,
                    tier_latency_s=c.latency_s, tier_bytes_per_s=c.bytes_per_s, tier_observed=c.observed)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head", type=int, default=128)
    p.add_argument("--mlp", type=int, default=14336)
    p.add_argument("--tokens", default="2048,8192,32768")
    p.add_argument("--tiers", default="host,disk")
    p.add_argument("--disk", default=None, help="the disk tier's directory (default: a temporary one)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    lengths = [int(t) for t in a.tokens.split(",")]
    assert all(n % TPB == 0 for n in lengths), "prompt lengths are whole blocks"
    model = Decoder(a, "cuda")
    # the prefill cost, measured: full prefills of the table's lengths
    points = sorted({min(max(lengths), v) for v in [256, 1024, 2048, 4096, 8192, 16384, 32768] + lengths})
    b0 = Bench(a, model, None, None, None, None)
    b0.prefill(b0.embed(points[0]))  # warm-up: kernels, allocator
    table = []
    for n in points:
        x = b0.embed(n)
        table.append((n, median_time(lambda: b0.prefill(x), a.repeat)))
        del x
    for i in range(1, len(table)):  # noise must not make more tokens cheaper
        table[i] = (table[i][0], max(table[i][1], table[i - 1][1]))
    print("prefill table:", ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in table))
    geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=a.kv_heads, tokens_per_block=TPB, head_size=a.head,
                        dtype=kvf.Dtype.BF16, order=kvf.Order.TOKEN_MAJOR)
    blocks = 2 * (max(lengths) // TPB) + 8
    rows = []
    tmp = tempfile.TemporaryDirectory()
    for tier_name in a.tiers.split(","):
        tier = kvf.Tier[tier_name.upper()]
        kv = [(torch.zeros(blocks, TPB, a.kv_heads, a.head, device="cuda", dtype=torch.bfloat16),
               torch.zeros(blocks, TPB, a.kv_heads, a.head, device="cuda", dtype=torch.bfloat16))
              for _ in range(a.layers)]
        host = blocks if tier == kvf.Tier.HOST else 0
        d = a.disk or tmp.name
        with kvf.Engine(backend=kvf.Backend.CUDA, file_dir=d, file_namespace=f"plan-{tier_name}",
                        fsync=kvf.Fsync.NONE) as e:
            for k, v in kv:
                e.add_pool(geom, primary=k, secondary=host or None)
                e.add_pool(geom, primary=v, secondary=host or None)
            with kvf.Cache(e, host_blocks=host, disk_blocks=0 if host else blocks) as cache:
                b = Bench(a, model, e, cache, kv, tier)
                for n in lengths:
                    r = b.run(n, table)
                    rows.append(r)
                    print(f"{r['tier']:5} {n:6} tokens: recompute {r['recompute_s'] * 1e3:8.1f} ms, load all "
                          f"{r['load_all_s'] * 1e3:8.1f} ms, plan {r['plan_s'] * 1e3:8.1f} ms "
                          f"(predicted {r['predicted_plan_s'] * 1e3:8.1f} ms; {r['plan_blocks']} of "
                          f"{r['blocks']} blocks loaded{', layer-wise' if r['plan_overlap'] else ''}); "
                          f"tier {r['tier_bytes_per_s'] / 1e9:.2f} GB/s + {r['tier_latency_s'] * 1e6:.0f} us",
                          flush=True)
        del kv
        torch.cuda.empty_cache()
    ok = True
    for r in rows:
        best = min(r["recompute_s"], r["load_all_s"])
        checks = [("plan <= 1.05 x min(recompute, load all)", r["plan_s"] <= 1.05 * best),
                  ("predicted within 20 %", abs(r["predicted_plan_s"] - r["plan_s"]) <= 0.2 * r["plan_s"])]
        if r["tier"] == "disk" and r["tokens"] >= 8192:
            checks.append(("disk plan <= 0.8 x recompute", r["plan_s"] <= 0.8 * r["recompute_s"]))
        r["targets"] = {name: bool(held) for name, held in checks}
        for name, held in checks:
            ok = ok and held
            print(f"{r['tier']:5} {r['tokens']:6}: {name}: {'held' if held else 'MISSED'}")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(args=vars(a), prefill_table=table, rows=rows), indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
