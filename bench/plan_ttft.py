# SPDX-License-Identifier: Apache-2.0
"""Load or recompute, measured (docs/planner.md).

A randomly initialised decoder of a given shape (default Llama-3-8B's: 32
layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, bf16; no
RoPE, which costs little next to the rest; its attention reads each KV
head in place for the query heads of its group, as an engine's kernel
does, where this torch can) prefills prompts of N tokens whose first
N - NEW tokens (--new-tokens, default 512) are cached by kvferry in
blocks of 16 tokens, one pool per layer for K and one for V (2 MiB a
block). For each tier (host, disk) and prompt length it times,
after a warm-up:

- recompute: the whole prompt computed, nothing loaded;
- load all: every cached block got, then the rest computed (layer by
  layer, waiting for each layer's pools, where the bench chose overlap);
- plan: kvf_cache_plan's choice, followed. Its shapes: recompute; the
  leading blocks loaded (as load all, fewer blocks); or the front shape:
  the get of blocks [F, L) submitted (from a second thread, so that a
  submission that blocks its caller still overlaps; --front-submit inline:
  before the front, on the same thread) and the front, tokens [0, F * 16),
  computed from scratch meanwhile, then tokens [L * 16, N) over the full
  cache. Whole loads are waited for until the plan's hedge (Plan.hedge_s,
  Cache.wait_pool_by; --hedge off: however long they take): loads later
  than that are given up and what they were to bring recomputed (the
  tokens after the front, or all of them), the late get checked once it
  lands; the rows count the rounds hedged.

The three are timed in rounds, each policy once a round (the first round
a warm-up), so that a drift of the machine falls on all of them alike.
Every policy's TTFT is printed beside the plan's prediction of it, from
what the bench measured first on the same model and the same path:

- the prefill cost, a 2-D table: new tokens (16, 64, 128 ... up to the
  longest prompt) after prefixes of 0 and of each request's cached tokens,
  the prefix read from KV slots as the followed path reads it, measured in
  passes over the whole grid (each point once a pass);
- each tier's read cost: the gets the followed path makes (the same call,
  waited for the same way) timed at two sizes, fitted to latency + bytes /
  throughput and held, so the load's fixed costs (submission, per-block
  work, the wait) are in the prediction. With --costs learn the fit is
  only the starting point: the engine's observations of every load after
  it (load all's alone, the front's beside its computation) move it, and
  each round plans the request anew from the costs at that moment, as a
  serving engine plans each request when it arrives.

Every block got is checked byte for byte against the blocks stored, in
destination slots poisoned before each run.

    python3 bench/plan_ttft.py --disk /var/tmp/kv --json plan.json          # GPU, about 3 minutes
    python3 bench/plan_ttft.py --quick                                      # GPU smoke run, under a minute
    python3 bench/plan_ttft.py --device cpu --layers 2 --hidden 256 --heads 4 --kv-heads 2 --head 64 \\
        --mlp 512 --tokens 256,1024 --new-tokens 64                         # CPU, host backend

Targets: plan <= 1.05 x min(recompute, load all); from disk,
plan <= 0.8 x recompute at 8k and 32k tokens; every prediction within
20 % of its measurement. The JSON holds every figure; the last lines say
which held (the exit status is 1 when one missed, 2 when a byte was wrong).
"""

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kvferry as kvf  # noqa: E402
from quiet_gc import gc_paused  # noqa: E402

try:
    from torch.nn.attention.bias import causal_lower_right
except ImportError:  # older torch: an explicit mask below
    causal_lower_right = None

TPB = 16
POISON = 0x7FA5  # a bf16 NaN: no computed value has it


class Decoder:
    """Random weights of a Llama-shaped decoder; forward one layer at a time."""

    def __init__(self, a, dev):
        g = torch.Generator(device=dev).manual_seed(1)
        h, kvd, m = a.hidden, a.kv_heads * a.head, a.mlp
        mk = lambda r, c: (torch.randn(r, c, device=dev, dtype=torch.bfloat16, generator=g) * 0.02)  # noqa: E731
        self.a = a
        self.w = [dict(q=mk(h, h), k=mk(h, kvd), v=mk(h, kvd), o=mk(h, h), gate=mk(h, m), up=mk(h, m),
                       down=mk(m, h)) for _ in range(a.layers)]
        self.gqa = a.attention != "copy" and self.gqa_works(dev)
        if a.attention == "gqa" and not self.gqa:
            raise SystemExit(f"--attention gqa: torch {torch.__version__}'s attention has no working enable_gqa")

    def attend(self, q, kk, vv, gqa):
        """Causal attention of q ([n, heads, head]) over kk, vv ([s, kv_heads,
        head]), the last n of them q's own; [n, heads * head]. gqa: the
        attention kernel reads each KV head for its group of query heads, as
        an engine's does; else each KV head is first copied once per query
        head of its group."""
        a = self.a
        n, s = q.shape[0], kk.shape[0]
        qh = q.transpose(0, 1).unsqueeze(0)
        if gqa:
            kh, vh, extra = kk.transpose(0, 1).unsqueeze(0), vv.transpose(0, 1).unsqueeze(0), dict(enable_gqa=True)
        else:
            rep = a.heads // a.kv_heads
            kh = kk.repeat_interleave(rep, dim=1).transpose(0, 1).unsqueeze(0)
            vh = vv.repeat_interleave(rep, dim=1).transpose(0, 1).unsqueeze(0)
            extra = {}
        if s == n:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, **extra)
        elif causal_lower_right is not None:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(n, s), **extra)
        else:
            mask = torch.ones(n, s, dtype=torch.bool, device=q.device).tril(diagonal=s - n)
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, **extra)
        return o.squeeze(0).transpose(0, 1).reshape(n, -1)

    def gqa_works(self, dev):
        """Whether this torch's attention takes enable_gqa, and gives what the
        copied heads give, with and without a prefix."""
        a = self.a
        g = torch.Generator(device=dev).manual_seed(2)
        rnd = lambda *shape: torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=g)  # noqa: E731
        try:
            for n, s in ((32, 32), (16, 48)):
                q, kk, vv = rnd(n, a.heads, a.head), rnd(s, a.kv_heads, a.head), rnd(s, a.kv_heads, a.head)
                if not torch.allclose(self.attend(q, kk, vv, True).float(), self.attend(q, kk, vv, False).float(),
                                      atol=2e-2, rtol=2e-2):
                    return False
        except (TypeError, RuntimeError):
            return False
        return True

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
        o = self.attend(q, kk, vv, self.gqa)
        x = x + o @ w["o"]
        h = self.norm(x)
        x = x + (F.silu(h @ w["gate"]) * (h @ w["up"])) @ w["down"]
        return x, k, v


class Dev:
    """What differs between a GPU and the CPU: syncs and waits."""

    def __init__(self, name):
        self.name = name
        self.cuda = name == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def wait_pool(self, ticket, pool):
        if self.cuda:
            ticket.stream_wait_pool(pool, torch.cuda.current_stream())
        else:
            ticket.wait_pool(pool)

    def after_gets(self, engine):
        """Work queued from now on runs after every get waited for."""
        if self.cuda:
            engine.sync_stream(torch.cuda.current_stream())


def once(dev, fn, setup=None):
    """Seconds of one run of fn, the device idle before and after, and
    Python's garbage collector out of it (quiet_gc)."""
    if setup is not None:
        setup()
    with gc_paused():
        dev.sync()
        t0 = time.perf_counter()
        fn()
        dev.sync()
        return time.perf_counter() - t0


def median_times(dev, runs, repeat, warmup=1):
    """Medians of runs {name: (fn, setup, after)}, timed in rounds that take
    each in turn: a drift of the machine (its clocks, a shared disk) then
    falls on every policy alike, not on the one timed while it lasted.
    after(), untimed, follows each run (a check of its bytes)."""
    out = {name: [] for name in runs}
    for i in range(warmup + repeat):
        for name, (fn, setup, after) in runs.items():
            t = once(dev, fn, setup)
            if after is not None:
                after()
            if i >= warmup:
                out[name].append(t)
    return {name: statistics.median(v) for name, v in out.items()}


def median_time(dev, fn, repeat, setup=None, warmup=1):
    out = [once(dev, fn, setup) for _ in range(warmup + repeat)]
    return statistics.median(out[warmup:])


class Model:
    """The decoder over KV slots: kv[l] = (K, V) of [blocks, TPB, kv_heads, head]."""

    def __init__(self, a, dev, kv):
        self.a, self.dev, self.kv = a, dev, kv
        self.m = Decoder(a, dev.name)

    def embed(self, n, seed):
        g = torch.Generator(device=self.dev.name).manual_seed(seed)
        return torch.randn(n, self.a.hidden, device=self.dev.name, dtype=torch.bfloat16, generator=g)

    def prefill(self, x, slots=None, prefix=(), ticket=None, keep=None, front=None):
        """Every layer over x. prefix: the slots of the cached tokens before x
        (read from the KV pools; with a ticket, layer l first waits for its
        two pools); front: each layer's (K, V) of tokens before those; keep: a
        list that receives each layer's (K, V) of x; slots: where x's K, V go."""
        a = self.a
        rows, at = self.rows(prefix), self.rows(slots)
        for l in range(a.layers):
            kp = vp = None
            if ticket is not None:
                self.dev.wait_pool(ticket, 2 * l)
                self.dev.wait_pool(ticket, 2 * l + 1)
            if len(prefix):
                kp = self.kv[l][0][rows].reshape(-1, a.kv_heads, a.head)
                vp = self.kv[l][1][rows].reshape(-1, a.kv_heads, a.head)
            if front is not None:
                fk, fv = front[l]
                kp = fk if kp is None else torch.cat([fk, kp])
                vp = fv if vp is None else torch.cat([fv, vp])
            x, k, v = self.m.layer(l, x, kp, vp)
            if keep is not None:
                keep.append((k, v))
            if slots is not None:
                self.kv[l][0][at] = k.view(len(slots), TPB, a.kv_heads, a.head)
                self.kv[l][1][at] = v.view(len(slots), TPB, a.kv_heads, a.head)
        return x

    def rows(self, slots):
        """An index of the slots for every layer: a slice where they run
        contiguously (a view, as an engine's block table reads them), else
        one device tensor. Indexing by a Python list would copy it to the
        device per layer, a blocking copy that makes the host wait for the
        GPU at every layer: the forward then costs its host time on top of
        its GPU time."""
        if slots is None or not len(slots):
            return None
        s = list(slots)
        if s == list(range(s[0], s[0] + len(s))):
            return slice(s[0], s[0] + len(s))
        return torch.tensor(s, dtype=torch.long).pin_memory().to(self.dev.name, non_blocking=True) \
            if self.dev.cuda else torch.tensor(s, dtype=torch.long)


def prefill_table(a, model, lengths, new_tokens):
    """The 2-D prefill cost: new tokens after prefixes of 0 and of each
    request's cached tokens, the prefix read from slots."""
    nmax = max(lengths)
    cols = sorted({v for v in [16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768] if v <= nmax}
                  | set(lengths) | {new_tokens})
    rows = sorted({0} | {n - new_tokens for n in lengths})
    g = torch.Generator(device=model.dev.name).manual_seed(3)
    pb = max(rows) // TPB
    for k, v in model.kv:  # the prefix's K, V: any values time the same
        k[:pb].normal_(generator=g)
        v[:pb].normal_(generator=g)
    prof = kvf.PrefillProfile()
    xs = {n: model.embed(n, n) for n in cols}
    # in passes over the whole grid (the first a warm-up), each point once a
    # pass: a slow phase of the machine spreads over every point instead of
    # biasing the row measured while it lasted
    for i in range(a.repeat + 1):
        for p in rows:
            prefix = list(range(p // TPB))
            for n in cols:
                t = once(model.dev, lambda: model.prefill(xs[n], prefix=prefix))
                if i:
                    prof.record(n, t, prefix=p)
    return prof.table()


def grid_point(table, new, prefix):
    """The table's own measurement of new tokens after prefix, or None."""
    try:
        return table["seconds"][table["prefix_tokens"].index(prefix)][table["new_tokens"].index(new)]
    except (KeyError, ValueError):
        return None


def fit_cost(samples):
    """(latency, bytes/s) through two or more (bytes, seconds) medians."""
    (b1, t1), (b2, t2) = samples[0], samples[-1]
    per_byte = max((t2 - t1) / (b2 - b1), 1e-15)
    return max(t1 - per_byte * b1, 0.0), 1.0 / per_byte


class Bench:
    def __init__(self, a, model, engine, cache, tier, table):
        self.a, self.mo, self.e, self.c, self.tier, self.table = a, model, engine, cache, tier, table
        self.dev = model.dev
        self.layerwise = False  # the bench's loads go pool by pool
        self.trace = {}  # the front shape's last run: when its parts ended
        self.late = []  # gets given up at the plan's hedge, retired before their bytes are checked
        self.hedged = 0

    def poison(self, slots):
        idx = torch.tensor(slots, dtype=torch.long, device=self.dev.name)
        for k, v in self.mo.kv:
            k.view(torch.int16)[idx] = POISON
            v.view(torch.int16)[idx] = POISON

    def same(self, dst, src):
        """Whether every byte of slots dst equals slots src."""
        if not dst:
            return True
        i, j = (torch.tensor(s, dtype=torch.long, device=self.dev.name) for s in (dst, src))
        return all(torch.equal(t.view(torch.int16)[i], t.view(torch.int16)[j]) for kv in self.mo.kv for t in kv)

    def get(self, keys, slots):
        pools = list(range(2 * self.a.layers)) if self.layerwise else None
        return self.c.get(keys, slots, pools=pools)

    def in_time(self, t, hedge_s):
        """Whether a whole get arrived by the plan's hedge (always, without
        one); a late one is kept to retire later, unread."""
        if not hedge_s:
            return True
        if self.c.wait_pool_by(t, 0, hedge_s, torch.cuda.current_stream() if self.dev.cuda else None):
            return True
        self.late.append(t)
        self.hedged += 1
        return False

    def retire_late(self):
        """The late gets landed (their bytes are checked as any get's)."""
        for t in self.late:
            t.wait(check=True)
        self.late = []

    def load_then_compute(self, x, keys, dst, n_load, hedge_s=0.0):
        """The leading n_load blocks got, then the rest computed after them;
        with hedge_s, whole loads not in by then are given up and the whole
        prompt computed."""
        t = self.get(keys[:n_load], dst[:n_load])
        if not self.layerwise and not self.in_time(t, hedge_s):
            self.mo.prefill(x)
        elif self.layerwise:
            self.mo.prefill(x[n_load * TPB:], prefix=dst[:n_load], ticket=t)
            t.wait(check=True)
        else:
            t.wait(check=True)
            self.dev.after_gets(self.e)
            self.mo.prefill(x[n_load * TPB:], prefix=dst[:n_load])

    def front_then_rest(self, x, keys, dst, f, l, hedge_s=0.0):
        """Blocks [f, l) got while tokens [0, f * TPB) are computed, then
        tokens [l * TPB, N) after both; with hedge_s, blocks not in by then
        are given up and tokens [f * TPB, N) computed after the front."""
        box = {}

        def submit():
            try:
                box["t"] = self.get(keys[f:l], dst[f:l])
            except BaseException as exc:  # raised below, on the bench's thread
                box["err"] = exc

        t0 = time.perf_counter()
        if self.dev.cuda:
            start, front_done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        if self.a.front_submit == "thread":
            th = threading.Thread(target=submit)
            th.start()
        else:
            submit()
        front = []
        self.mo.prefill(x[:f * TPB], keep=front)
        if self.dev.cuda:
            front_done.record()
        if self.a.front_submit == "thread":
            th.join()
        if "err" in box:
            raise box["err"]
        if self.layerwise:
            # the tail's layer l waits for the back's layer l only (the
            # hedge is not taken: a layer-wise get is waited for per layer)
            self.mo.prefill(x[l * TPB:], prefix=dst[f:l], front=front, ticket=box["t"])
            box["t"].wait(check=True)
            self.trace["load_s"] = time.perf_counter() - t0
            if self.dev.cuda:
                self.trace["front"] = (start, front_done)
            return
        late = not self.in_time(box["t"], hedge_s)
        if not late:
            box["t"].wait(check=True)
        self.trace["load_s"] = time.perf_counter() - t0
        if self.dev.cuda:
            self.trace["front"] = (start, front_done)
        if late:
            self.mo.prefill(x[f * TPB:], front=front)
            return
        self.dev.after_gets(self.e)
        self.mo.prefill(x[l * TPB:], prefix=dst[f:l], front=front)

    def follow(self, plan, x, keys, dst):
        """Follows a plan: recompute, the leading blocks, or the front."""
        hedge_s = plan.hedge_s if self.a.hedge == "on" else 0.0
        if plan.shape == "front":
            self.front_then_rest(x, keys, dst, plan.load_first, plan.load_blocks, hedge_s)
        elif plan.shape == "leading":
            self.load_then_compute(x, keys, dst, plan.load_blocks, hedge_s)
        else:
            self.mo.prefill(x)

    @property
    def block_bytes(self):
        """One block of every pool: K and V of every layer, bf16."""
        return 2 * self.a.layers * TPB * self.a.kv_heads * self.a.head * 2

    def fit_tier(self, keys, dst, hits):
        """Times the loads the bench makes at two sizes and sets the fit:
        held (--costs hold), or as the starting point that the engine's own
        observations of every later load keep moving (--costs learn)."""
        sizes = sorted({max(1, hits // 8), hits})
        if len(sizes) < 2:
            return
        bb = self.block_bytes
        samples = []
        for n in sizes:
            def load():
                self.get(keys[:n], dst[:n]).wait(check=True)
                self.dev.after_gets(self.e)
            samples.append((n * bb, median_time(self.dev, load, self.a.repeat)))
        lat, bw = fit_cost(samples)
        self.e.set_tier_cost(self.tier, lat, bw, hold=self.a.costs == "hold")

    def replan_at_rounds_speed(self, n, hits, read_s, c):
        """The plan again, its tier refitted to the speed load all's reading
        (its time less its forward pass) kept during the timed rounds: what
        the split would predict had the fit before them caught that speed.
        Tells a misprediction of the tier from the bound of the shape."""
        bb = self.block_bytes
        if read_s <= c.latency_s:
            return {}
        bps = hits * bb / (read_s - c.latency_s)
        p = kvf.plan_compute([self.tier] * hits, bb, TPB, n, {self.tier: (c.latency_s, bps)}, self.table,
                             layers=self.a.layers)
        return dict(rounds_bytes_per_s=bps, replanned_s=p.ttft_s, replanned_shape=p.shape,
                    replanned_recompute_s=p.ttft_recompute_s)

    def store(self, n):
        """The prompt of n tokens computed once, its cached part handed to
        the cache; returns (x, keys)."""
        nb, hits = n // TPB, (n - self.a.new_tokens) // TPB
        keys = [(int(self.tier) + 1) << 44 | n << 20 | (i + 1) for i in range(nb)]
        x = self.mo.embed(n, n)
        src = list(range(nb))
        self.mo.prefill(x, slots=src)
        self.dev.sync()
        self.c.put(keys[:hits], src[:hits]).wait(check=True)
        self.e.sync_stream(None)
        got, tiers = self.c.lookup(keys)
        assert got == hits and all(t == self.tier for t in tiers), (got, hits, set(tiers))
        return x, keys

    def run(self, n, x, keys, layerwise):
        """Each policy timed, with its prediction; loads pool by pool or whole."""
        a = self.a
        self.layerwise = layerwise
        nb, hits = n // TPB, (n - a.new_tokens) // TPB
        src, dst = list(range(nb)), list(range(nb, 2 * nb))
        self.fit_tier(keys, dst, hits)
        self.c.set_prefill_cost(self.table, layers=a.layers, overlap=self.layerwise)
        ok = True
        same = []  # every run's bytes, checked after it

        def check(first, last):
            def after():
                self.retire_late()  # a get given up lands whole: its bytes are checked too
                same.append(self.same(dst[first:last], src[first:last]))
            return after

        self.hedged = 0

        if a.costs == "hold":
            # one plan, made before the rounds and followed in each
            plan = self.c.plan(keys, n)
            plan_run = (lambda: self.follow(plan, x, keys, dst),
                        lambda: self.poison(dst[plan.load_first:plan.load_blocks]),
                        check(plan.load_first, plan.load_blocks))
        else:
            # a plan made in each round (timed with it), from the costs the
            # engine holds then, as a serving engine plans every request
            planned = []

            def plan_and_follow():
                planned.append(self.c.plan(keys, n))
                self.follow(planned[-1], x, keys, dst)

            plan_run = (plan_and_follow, lambda: self.poison(dst[:hits]),
                        lambda: check(planned[-1].load_first, planned[-1].load_blocks)())
        t = median_times(self.dev, {
            "recompute": (lambda: self.mo.prefill(x), None, None),
            "load_all": (lambda: self.load_then_compute(x, keys, dst, hits), lambda: self.poison(dst[:hits]),
                         check(0, hits)),
            "plan": plan_run,
        }, a.repeat)
        t_rec, t_all, t_plan = t["recompute"], t["load_all"], t["plan"]
        ok &= all(same)
        rounds = []
        if a.costs == "learn":
            # the timed rounds' plans (the warm-up's left out), their median
            # prediction against the median TTFT, and the last one's shape
            timed = planned[len(planned) - a.repeat:]
            rounds = [dict(shape=p.shape, load_first=p.load_first, load_blocks=p.load_blocks,
                           predicted_s=p.ttft_s, predicted_load_all_s=p.ttft_load_all_s) for p in timed]
            plan = timed[-1]
        f, l = plan.load_first, plan.load_blocks
        # the parts, each alone, beside what the plan predicted for them:
        # the forward pass over a loaded prefix (in its slots now), and the
        # front shape's front and load as its last run met them
        tail = lambda k: median_time(self.dev, lambda: self.mo.prefill(x[k * TPB:], prefix=dst[:k]),  # noqa: E731
                                     a.repeat)
        parts = dict(compute_load_all_alone_s=tail(hits),
                     table_load_all_s=grid_point(self.table, a.new_tokens, n - a.new_tokens))
        if plan.shape == "leading" and l < hits:
            parts["compute_plan_alone_s"] = tail(l)
        elif plan.shape == "front" and "front" in self.trace:
            parts["front_done_s"] = self.trace["front"][0].elapsed_time(self.trace["front"][1]) / 1e3
            parts["front_load_done_s"] = self.trace["load_s"]
            parts["predicted_load_s"] = plan.load_s
        c = self.e.costs()[self.tier]
        if not self.layerwise:
            parts.update(self.replan_at_rounds_speed(n, hits, t_all - parts["compute_load_all_alone_s"], c))
        predicted_plan, predicted_all = plan.ttft_s, plan.ttft_load_all_s
        if rounds:
            predicted_plan = statistics.median(r["predicted_s"] for r in rounds)
            predicted_all = statistics.median(r["predicted_load_all_s"] for r in rounds)
        return dict(tier=self.tier.name.lower(), tokens=n, blocks=nb, hits=hits, recompute_s=t_rec,
                    load_all_s=t_all, plan_s=t_plan, plan_shape=plan.shape, plan_load_first=f, plan_load_blocks=l,
                    plan_overlap=plan.overlap, predicted_plan_s=predicted_plan, costs=a.costs, rounds=rounds,
                    predicted_recompute_s=plan.ttft_recompute_s, predicted_load_all_s=predicted_all,
                    layerwise=self.layerwise, tier_latency_s=c.latency_s, tier_bytes_per_s=c.bytes_per_s,
                    tier_observed=c.observed, tier_held=bool(c.held),
                    predicted_split_s=plan.ttft_split_s, predicted_compute_s=plan.compute_s, bytes_ok=bool(ok),
                    plan_hedge_s=plan.hedge_s, plan_hedged=self.hedged,
                    **parts)


def report_line(r):
    def ms(what):
        return f"{r[f'{what}_s'] * 1e3:8.1f} ms (predicted {r[f'predicted_{what}_s'] * 1e3:8.1f})"

    return (f"{r['tier']:5} {r['tokens']:6} tokens ({r['hits']} of {r['blocks']} blocks cached): "
            f"recompute {ms('recompute')}, load all {ms('load_all')}, plan {ms('plan')}: {r['plan_shape']}, "
            f"blocks [{r['plan_load_first']}, {r['plan_load_blocks']}) loaded"
            f"{', layer by layer' if r['plan_overlap'] else ''}; tier {r['tier_bytes_per_s'] / 1e9:.2f} GB/s + "
            f"{r['tier_latency_s'] * 1e6:.0f} us"
            + (f"; hedged in {r['plan_hedged']} runs" if r.get("plan_hedged") else "")
            + f"; bytes {'checked' if r['bytes_ok'] else 'WRONG'}"
            + parts_line(r))


def split_bound_s(r):
    """The least any split of the prefix between loading and computing can
    take: every cached token either read at load all's rate or computed at
    recompute's, both side by side at full speed with nothing in between,
    T = 1 / (1 / recompute + 1 / load all). A plan near it has no shape
    left to find; one far above it does."""
    return r["recompute_s"] * r["load_all_s"] / (r["recompute_s"] + r["load_all_s"])


def parts_line(r):
    """The parts each alone, against the prediction's figures for them."""
    bound = split_bound_s(r)
    out = (f"\n      split bound (load and compute side by side, each at its full rate) {bound * 1e3:.1f} ms "
           f"= {bound / r['recompute_s']:.2f}x recompute; the plan {r['plan_s'] / bound:.2f}x the bound")
    out += f"\n      load all's forward alone {r['compute_load_all_alone_s'] * 1e3:.1f} ms"
    if r.get("table_load_all_s") is not None:
        out += f" (the table: {r['table_load_all_s'] * 1e3:.1f})"
    if "compute_plan_alone_s" in r:
        out += (f"; the plan's forward alone {r['compute_plan_alone_s'] * 1e3:.1f} ms "
                f"(predicted {r['predicted_compute_s'] * 1e3:.1f})")
    if "front_done_s" in r:
        out += (f"; front done at {r['front_done_s'] * 1e3:.1f} ms, loads at {r['front_load_done_s'] * 1e3:.1f} "
                f"(predicted {r['predicted_load_s'] * 1e3:.1f})")
    if r.get("predicted_split_s") and r["plan_shape"] != "front" and r["predicted_split_s"] < r["predicted_plan_s"]:
        out += f"; best split predicted {r['predicted_split_s'] * 1e3:.1f} ms, within min_gain: not taken"
    if r.get("rounds"):
        out += "\n      each round's plan (costs learnt): " + ", ".join(
            f"{p['shape']} [{p['load_first']}, {p['load_blocks']}) predicted {p['predicted_s'] * 1e3:.1f} ms"
            for p in r["rounds"])
    if "replanned_s" in r:
        out += (f"\n      at the {r['rounds_bytes_per_s'] / 1e9:.2f} GB/s load all read in the rounds, the plan "
                f"predicts {r['replanned_s'] * 1e3:.1f} ms ({r['replanned_shape']}, "
                f"{r['replanned_s'] / r['replanned_recompute_s']:.2f}x its recompute)")
    return out


def targets(r):
    best = min(r["recompute_s"], r["load_all_s"])
    within = lambda p, m: abs(p - m) <= 0.2 * m  # noqa: E731
    checks = [("plan <= 1.05 x min(recompute, load all)", r["plan_s"] <= 1.05 * best)]
    for what in ("recompute", "load_all", "plan"):
        checks.append((f"predicted {what.replace('_', ' ')} within 20 %",
                       within(r[f"predicted_{what}_s"], r[f"{what}_s"])))
    if r["tier"] == "disk" and r["tokens"] >= 8192:
        checks.append(("disk plan <= 0.8 x recompute", r["plan_s"] <= 0.8 * r["recompute_s"]))
    return checks


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head", type=int, default=128)
    p.add_argument("--mlp", type=int, default=14336)
    p.add_argument("--tokens", default="2048,8192,32768", help="prompt lengths")
    p.add_argument("--new-tokens", type=int, default=512, help="the last tokens of each prompt, never cached")
    p.add_argument("--tiers", default="host,disk")
    p.add_argument("--disk", default=None, help="the disk tier's directory (default: a temporary one)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--overlap", choices=["auto", "on", "off"], default="auto",
                   help="load the host tier layer by layer (CUDA only); auto: where it measured faster")
    p.add_argument("--attention", choices=["auto", "gqa", "copy"], default="auto",
                   help="gqa: each KV head read in place for its group of query heads (an engine's kernel); "
                        "copy: the KV heads copied per query head first; auto: gqa where this torch has it")
    p.add_argument("--front-submit", choices=["thread", "inline"], default="thread",
                   help="the front shape's get: submitted from a second thread, or inline before the front")
    p.add_argument("--costs", choices=["hold", "learn"], default="hold",
                   help="hold: the tier's fitted cost held and one plan made before the rounds; learn: the fit "
                        "a starting point that the engine's observations of every load move, and a plan made "
                        "in each round from the costs then (as a serving engine plans each request)")
    p.add_argument("--hedge", choices=["on", "off"], default="on",
                   help="on: whole loads not in by the plan's hedge_s are given up and recomputed (the plan "
                        "stays near recomputing when the disk drifts); off: waited for however long")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2k and 8k tokens, 2 repeats")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.tokens, a.repeat = "2048,8192", 2
    lengths = [int(t) for t in a.tokens.split(",")]
    if not all(n % TPB == 0 and a.new_tokens % TPB == 0 and n > a.new_tokens for n in lengths):
        p.error(f"prompt lengths and --new-tokens must be whole blocks of {TPB}, each prompt longer than "
                f"--new-tokens")
    dev = Dev(a.device)
    blocks = 2 * (max(lengths) // TPB) + 8
    kv = [(torch.zeros(blocks, TPB, a.kv_heads, a.head, device=dev.name, dtype=torch.bfloat16),
           torch.zeros(blocks, TPB, a.kv_heads, a.head, device=dev.name, dtype=torch.bfloat16))
          for _ in range(a.layers)]
    model = Model(a, dev, kv)
    a.attention = "gqa" if model.m.gqa else "copy"
    print(f"attention: {'KV heads read in place (enable_gqa)' if model.m.gqa else 'KV heads copied per query head'}")
    table = prefill_table(a, model, lengths, a.new_tokens)
    print("prefill table (ms; rows: prefix tokens, columns: new tokens):")
    print("  prefix " + "".join(f"{n:>9}" for n in table["new_tokens"]))
    for pt, row in zip(table["prefix_tokens"], table["seconds"]):
        print(f"  {pt:6} " + "".join(f"{s * 1e3:9.2f}" for s in row))
    geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=a.kv_heads, tokens_per_block=TPB, head_size=a.head,
                        dtype=kvf.Dtype.BF16, order=kvf.Order.TOKEN_MAJOR)
    backend = kvf.Backend.CUDA if dev.cuda else kvf.Backend.HOST
    rows = []
    tmp = tempfile.TemporaryDirectory()
    for tier_name in a.tiers.split(","):
        tier = kvf.Tier[tier_name.upper()]
        host = blocks if tier == kvf.Tier.HOST else 0
        with kvf.Engine(backend=backend, file_dir=a.disk or tmp.name, file_namespace=f"plan-{tier_name}",
                        fsync=kvf.Fsync.NONE) as e:
            for k, v in kv:
                e.add_pool(geom, primary=k, secondary=host or None)
                e.add_pool(geom, primary=v, secondary=host or None)
            with kvf.Cache(e, host_blocks=host, disk_blocks=0 if host else blocks) as cache:
                # pool by pool only where the engine delivers so
                # (Engine.layerwise_tiers: the host tier on CUDA, the disk's
                # pool groups), and, with auto, where it measured faster
                can = dev.cuda and tier in e.layerwise_tiers() and a.overlap != "off"
                b = Bench(a, model, e, cache, tier, table)
                for n in lengths:
                    x, keys = b.store(n)
                    if can and a.overlap == "auto":
                        whole, layer = b.run(n, x, keys, False), b.run(n, x, keys, True)
                        r = layer if layer["load_all_s"] < whole["load_all_s"] else whole
                        r["load_all_other_s"] = (whole if r is layer else layer)["load_all_s"]
                        print(f"{tier_name:5} {n:6} tokens: load all {whole['load_all_s'] * 1e3:.1f} ms whole, "
                              f"{layer['load_all_s'] * 1e3:.1f} ms layer by layer: the bench loads "
                              f"{'layer by layer' if r is layer else 'whole'}")
                    else:
                        r = b.run(n, x, keys, can)
                    del x
                    rows.append(r)
                    print(report_line(r), flush=True)
        if dev.cuda:
            torch.cuda.empty_cache()
    ok, bytes_ok = True, all(r["bytes_ok"] for r in rows)
    for r in rows:
        checks = targets(r)
        r["targets"] = {name: bool(held) for name, held in checks}
        r["split_bound_s"] = split_bound_s(r)
        for name, held in checks:
            ok = ok and held
            print(f"{r['tier']:5} {r['tokens']:6}: {name}: {'held' if held else 'MISSED'}")
    if a.json:
        Path(a.json).write_text(json.dumps(dict(args=vars(a), prefill_table=table, rows=rows), indent=1))
    return 2 if not bytes_ok else 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
