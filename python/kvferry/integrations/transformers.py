# SPDX-License-Identifier: Apache-2.0
"""Prefix reuse for Hugging Face transformers (5.x) through a kvferry cache.

    from kvferry.integrations.transformers import KVFerryPrefixCache

    kv = KVFerryPrefixCache.from_model(model, host_blocks=512, disk_dir="/var/kv", disk_blocks=8192)
    out = kv.generate(model, input_ids, max_new_tokens=32)   # serves, then stores, the prompt's blocks

or by hand, around a forward:

    past = kv.prepare(input_ids)                             # lookup + get queued, nothing waited for
    out = model(input_ids[:, past.cached_tokens:], **cache_kwargs(model, past))
    past.finish()                                            # raises PrefixLoadError if a block failed
    kv.store(input_ids, past)

The KV of each layer lives in two kvferry pools (K, then V), torch tensors
shaped [max_blocks, tokens_per_block, kv_heads, head_dim] (Order.TOKEN_MAJOR).
A request's cached prefix is fetched into slots 0..hits-1 of every pool,
layer by layer (mode "layerwise": layer l's attention waits for its own two
pools only, so layer l+1 loads while layer l computes), or all of it before
the forward (mode "whole"). The model runs on the new tokens only. Mode
"plan" follows the cache's load-or-recompute plan (docs/planner.md): the
hits worth loading are loaded layer-wise, or the first blocks are computed
while the hits after them load, and the rest is computed.

One request at a time per object, batch size 1, decoders of full-attention
layers and sliding-window ones beside them (Gemma-3, GPT-OSS): every layer
of a stored block is stored, and a sliding layer loads only the blocks
holding the prefix's last window - 1 tokens, all its attention reads.
docs/integrations/transformers.md has the rest.
"""

import os
import inspect
import logging
import time
from typing import Optional

import numpy as np
import torch
from transformers.cache_utils import Cache as _HFCache
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

import kvferry as kvf
from kvferry._plan import HEDGE_MIN_S as _HEDGE_MIN_S
from kvferry._plan import MIN_GAIN as _MIN_GAIN

# a hedged wait longer than this waited for its pools (one for pools already in returns in tens of us):
# it returned as they arrived, which tells the loads' pace
_WAITED_S = 200e-6

__all__ = ["KVFerryPrefixCache", "KVFerryDynamicCache", "PrefixLoadError", "PrefixLate", "MODES", "measure_prefill",
           "cache_kwargs"]

log = logging.getLogger("kvferry.transformers")

MODES = ("layerwise", "whole", "recompute", "plan")

_DTYPES = {torch.float32: kvf.Dtype.FP32, torch.float16: kvf.Dtype.FP16, torch.bfloat16: kvf.Dtype.BF16}


class PrefixLoadError(RuntimeError):
    """A cached block could not be brought back (lost, corrupt, unreadable):
    the forward that used it is invalid. The cache has already dropped the
    block; KVFerryPrefixCache.forward / generate recompute on their own."""


class PrefixLate(PrefixLoadError):
    """Mode "plan": the prefix's loads had not arrived by the plan's hedge
    (Plan.hedge_s after the request's start, or sooner where the loads'
    pace so far says they would end past it: KVFerryDynamicCache.limit),
    so waiting longer would make the request slower than recomputing by
    more than the plan's margin. The loads were
    given up (they land later, unread; every block stays cached);
    KVFerryPrefixCache.forward / generate recompute what they were to bring
    (after the computed front, if any) on their own."""


def _text_config(config):
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if get is not None else config


def _torch_dtype(value, what):
    if isinstance(value, str):
        value = getattr(torch, value, None)
    if value not in _DTYPES:
        raise ValueError(f"KVFerryPrefixCache: {what} {value!r} is not one of float32, float16, bfloat16")
    return value


def model_geometry(config) -> dict:
    """layers, kv_heads, head_dim, sliding (per layer: a sliding-window
    layer) and window (its tokens, 0 without one) of a decoder config;
    ValueError for a model this adapter cannot serve (linear-attention or
    other layer kinds)."""
    cfg = _text_config(config)
    try:
        layers = int(cfg.num_hidden_layers)
        heads = int(cfg.num_attention_heads)
    except AttributeError as exc:
        raise ValueError(f"KVFerryPrefixCache: {type(cfg).__name__} has no {exc.name}: not a decoder config") from None
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    types = list(getattr(cfg, "layer_types", None) or [])
    other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if other:
        raise ValueError(f"KVFerryPrefixCache: {type(cfg).__name__} has {', '.join(other)} layers; only "
                         f"full-attention and sliding-window attention layers are served")
    sliding = tuple(t == "sliding_attention" for t in types) if types else (False,) * layers
    if len(sliding) != layers:
        raise ValueError(f"KVFerryPrefixCache: {type(cfg).__name__} lists {len(sliding)} layer_types for "
                         f"{layers} layers")
    window = 0
    if any(sliding):
        window = getattr(cfg, "sliding_window", None)
        if not isinstance(window, int) or window <= 1:
            raise ValueError(f"KVFerryPrefixCache: {type(cfg).__name__} has sliding_attention layers and "
                             f"sliding_window = {window!r} (need an int > 1)")
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "sliding": sliding, "window": window}


class _PrefixLayer(DynamicLayer):
    """A DynamicLayer whose first `pending` tokens are the cached prefix, still
    in the pools until the layer is first used."""

    def __init__(self, request, index):
        super().__init__()
        self._request, self._index = request, index
        self.pending = request.cached_tokens

    def get_seq_length(self) -> int:
        return self.pending + super().get_seq_length()

    def _materialize(self, key_states=None, value_states=None):
        ks, vs = self._request._prefix(self._index, key_states)
        self.dtype, self.device = ks[0].dtype, ks[0].device
        if key_states is not None:
            ks.append(key_states)
            vs.append(value_states)
        # one copy: the prefix (views of the pools, after a computed front) and the new tokens
        self.keys = torch.cat(ks, dim=-2) if len(ks) > 1 else ks[0].contiguous()
        self.values = torch.cat(vs, dim=-2) if len(vs) > 1 else vs[0].contiguous()
        self.is_initialized = True
        self.pending = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if self.pending:
            self._materialize(key_states, value_states)
            return self.keys, self.values
        return super().update(key_states, value_states, *args, **kwargs)


def _prefix_first(base_cls, name):
    base = getattr(base_cls, name)

    def method(self, *args, **kwargs):
        if self.pending:
            self._materialize()
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


class _PrefixSlidingLayer(DynamicSlidingWindowLayer):
    """A sliding-window layer whose first `pending` tokens are the cached
    prefix, of which it takes only the last window - 1 (all its attention
    reads) from the pools. It keeps every token after them (transformers'
    own keeps the last window - 1), so that store finds the K/V of each
    block it stores: get_seq_length() - keys.shape[-2] is the first token
    it holds."""

    def __init__(self, request, index, window):
        super().__init__(sliding_window=window)
        self._request, self._index = request, index
        self.pending = request.cached_tokens
        self.cumulative_length = request.cached_tokens  # positions and masks count the prefix
        self.record_past = True  # every token kept (until a crop, which assisted decoding makes)

    def _materialize(self, key_states=None, value_states=None):
        ks, vs = self._request._prefix(self._index, key_states)
        self.lazy_initialization(ks[0], vs[0])
        if key_states is not None:
            ks.append(key_states)
            vs.append(value_states)
        self.keys = torch.cat(ks, dim=-2) if len(ks) > 1 else ks[0].contiguous()
        self.values = torch.cat(vs, dim=-2) if len(vs) > 1 else vs[0].contiguous()
        self.pending = 0

    def update(self, key_states, value_states, *args, **kwargs):
        # every update here, not DynamicSlidingWindowLayer's: recording the past, transformers 5.17's
        # returns every token kept while its mask (get_mask_sizes) covers the window only (5.19's cuts
        # to the window); this returns what the mask covers on both
        if self.pending:
            self._materialize(key_states, value_states)
        else:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        self.cumulative_length += key_states.shape[-2]
        # the window's tokens before the new ones, and them
        visible = self.sliding_window - 1 + key_states.shape[-2]
        return self.keys[:, :, -visible:, :], self.values[:, :, -visible:, :]


# what rewrites a layer (assisted decoding's crop, beam search) needs the prefix in it first
for _name in ("crop", "batch_repeat_interleave", "batch_select_indices", "reorder_cache"):
    setattr(_PrefixLayer, _name, _prefix_first(DynamicLayer, _name))
    setattr(_PrefixSlidingLayer, _name, _prefix_first(DynamicSlidingWindowLayer, _name))


class KVFerryDynamicCache(DynamicCache):
    """The transformers Cache of one request: a DynamicCache whose layers
    start with the request's cached prefix (cached_tokens tokens), each
    layer's part taken from the kvferry pools when the model first updates
    that layer (after, in mode "plan", the front_blocks blocks prepare
    computed). get_seq_length() counts the prefix from the start, so the
    model's positions and masks are right for the new tokens."""

    def __init__(self, owner: "KVFerryPrefixCache", cached_tokens: int, tickets, mode: str, *, plan=None,
                 front=None, known_blocks: Optional[int] = None, started: Optional[float] = None,
                 get_at: Optional[float] = None):
        self.owner, self.cached_tokens, self.mode = owner, cached_tokens, mode
        # the request's clock (time.perf_counter): its start (prepare's), its get's submission
        self.started = time.perf_counter() if started is None else started
        self.get_at = self.started if get_at is None else get_at
        self.ttft_s: Optional[float] = None  # measured, once the first token is out (first_token)
        self._updates0 = 0  # forward passes that reached layer 0: the second is the first token's successor
        self.cached_blocks = cached_tokens // owner.tokens_per_block
        # mode "plan": the plan followed; front: the K/V per layer of the first front_blocks blocks,
        # computed by prepare while the blocks after them loaded into their slots
        self.plan = plan
        self._front = front
        self.front_blocks = front[0][0].shape[-2] // owner.tokens_per_block if front else 0
        # leading blocks the cache holds already (store skips them): the hits, loaded or not
        self.known_blocks = self.cached_blocks if known_blocks is None else known_blocks
        # the gets of the prefix: (ticket, the pools it moves); a sliding layer's pools move only in
        # the get of the blocks its window reads
        self._tickets = list(tickets or ())
        self._failed: Optional[BaseException] = None
        # mode "plan": stop waiting for the loads by the plan's hedge (limit)
        hedge = getattr(plan, "hedge_s", 0) if self._tickets else 0
        self.hedge_s = hedge if hedge and hedge > 0 else None
        self.late = False  # the loads were given up (PrefixLate)
        self.late_at: Optional[float] = None  # when (time.perf_counter)
        self._steps: Optional[int] = None  # in how many steps the loads arrive (limit)
        # the loads' pace so far: the latest layer's arrival seen by a wait that waited for it, over
        # when the plan has that layer in (never below 1); a due hedge stretches with it
        self.pace = 1.0
        # host seconds the forward spent in the layers' waits for their pools (a plan's loads
        # running late, or the waits' own cost): a term of the request's time the plan leaves out
        self.waited_s = 0.0
        _HFCache.__init__(self, layers=[
            _PrefixSlidingLayer(self, i, owner.window) if owner.sliding[i] else _PrefixLayer(self, i)
            for i in range(owner.num_layers)])

    def _wait_layer(self, layer: int) -> None:
        if self._failed is not None:
            raise PrefixLoadError(f"layer {layer}: the cached prefix failed to load: {self._failed}") \
                from self._failed
        t0 = time.perf_counter()
        try:
            # this layer's K and V pools only; on CUDA the stream waits, not the host
            for t, pools in self._tickets:  # none: no prefix, or waited for whole
                if 2 * layer not in pools:
                    continue
                if self.hedge_s is not None:
                    self._wait_hedged(t, layer)
                elif self.owner.cuda:
                    self.owner._stream_wait(t, layer)
                else:
                    t.wait_pool(2 * layer)
                    t.wait_pool(2 * layer + 1)
        except kvf.KvferryError as exc:
            self._failed = exc
            raise PrefixLoadError(f"layer {layer}: the cached prefix ({self.cached_blocks} blocks) failed to "
                                  f"load: {exc}; recompute the request") from exc
        finally:
            self.waited_s += time.perf_counter() - t0

    def limit(self, layer: int) -> float:
        """Seconds after the get by which layer `layer`'s pools must have
        arrived, or the loads are given up and what they were to bring
        recomputed (docs/planner.md, the hedge). The request's whole
        lateness counts, not one wait's: its time before the get (its
        lookup, its plan) comes off the plan's hedge_s, which holds from
        the request's start; and where the loads arrive layer by layer,
        one whose pace so far (its time over its predicted arrival) would
        end the request past the margin of recomputing, and later than
        giving up now would, is given up at once, not when its last layer
        runs late. A plan whose give-up at hedge_s would end past the
        margin anyway (its loads due later than the margin allows: hedge_s
        is their due time) waits as long as their pace so far says they
        are due (pace x hedge_s), where finishing at that pace ends the
        request sooner than giving up at hedge_s would: giving up costs a
        whole recompute more where finishing costs the drift. Never
        before HEDGE_MIN_S after the get."""
        p = self.plan
        pre = max(self.get_at - self.started, 0.0)
        limit = self.hedge_s - pre  # the margin, from the request's start
        fallback = p.fallback_s * p.recompute_ratio
        arrive, load = self._due(layer)
        after = max(p.ttft_s - load, 0.0)  # the plan's time after its last load is in
        if self.hedge_s + fallback > (1 + _MIN_GAIN) * p.ttft_recompute_s * (1 + 1e-9) and \
                self.pace * load + after < limit + fallback:
            # no give-up keeps the margin, and the loads at their pace so far end the request sooner
            # than giving them up at their due: the due, paced (a pace that says otherwise, a layer due
            # at ~0 seen a thread's wake-up late, leaves the due as it is)
            limit = self.pace * self.hedge_s - pre
        if 0 < arrive < load:  # a step before the last: the loads' pace says when the last is in
            # waiting for it until t (after the get) says the loads run t / arrive of their pace: they end
            # at t * load / arrive, the request at pre + that + after; giving up ends it at pre + t + fallback
            past_margin = arrive * ((1 + _MIN_GAIN) * p.ttft_recompute_s - pre - after) / load
            sooner = (fallback - after) / (load / arrive - 1)
            limit = min(limit, max(past_margin, sooner))
        return max(limit, _HEDGE_MIN_S)

    def _due(self, layer: int):
        """(when the plan has layer `layer`'s pools in, when it has them
        all), in seconds after the get, as the shapes that load have run:
        where the loads arrive in several steps, the layer's step on the
        line from the first step (first_s) to the last (load_s)."""
        p = self.plan
        load = p.load_s * p.load_ratio
        first = min(p.first_s * p.load_ratio, load)
        if self._steps is None:  # asked of the engine once a request, not once a layer
            self._steps = self.owner._arrival_steps(p)
        steps = self._steps
        n = self.owner.num_layers
        return (first + (load - first) * (layer * steps // n) / (steps - 1) if steps > 1 else load), load

    def _arrived(self, layer: int, at: float) -> None:
        """Layer `layer`'s pools were seen in at `at` (time.perf_counter)
        by a wait that waited for them: the loads' pace (pace) is that
        arrival over the plan's. The latest such arrival counts, not the
        slowest: the loads' time so far over the plan's is what says when
        the rest are in, and a first layer's few milliseconds are mostly
        the tier's latency."""
        arrive, _ = self._due(layer)
        if arrive > 0:
            self.pace = max(1.0, (at - self.get_at) / arrive)

    def _wait_hedged(self, t, layer: int) -> None:
        o = self.owner
        stream = torch.cuda.current_stream(o.device) if o.cuda else None
        limit = self.limit(layer)
        t0 = time.perf_counter()
        for pool in (2 * layer, 2 * layer + 1):
            if not o.cache.wait_pool_by(t, pool, limit, stream):
                self.late, self.late_at = True, time.perf_counter()
                tickets, self._tickets = self._tickets, []
                o._give_up([t for t, _ in tickets], self)
                raise PrefixLate(f"layer {layer}: the cached prefix ({self.cached_blocks - self.front_blocks} "
                                 f"blocks) had not arrived {limit * 1e3:.1f} ms after its get (the plan "
                                 f"predicted {self.plan.load_s * 1e3:.1f} ms, its hedge "
                                 f"{self.plan.hedge_s * 1e3:.1f} ms after the request's start); recomputing it")
        now = time.perf_counter()
        if now - t0 > _WAITED_S:  # the pools came in while this thread waited: their arrival is now
            self._arrived(layer, now)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx == 0:
            self._updates0 += 1
            if self._updates0 == 2:  # generate's next forward: the first token is out
                self.first_token()
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def first_token(self, at: Optional[float] = None) -> Optional[float]:
        """Marks the request's first token out (now, or at `at`, a
        time.perf_counter() value; on CUDA after the stream has computed
        it) and, in mode "plan", teaches the cache what its plan's
        request took from prepare on (kvf.Cache.observe_plan): later plans
        predict with it. KVFerryPrefixCache.forward and generate call it;
        a caller that runs the model itself calls it once the first
        token's logits are computed. Once per request; returns the
        seconds measured."""
        if self.ttft_s is None:
            self.ttft_s = (time.perf_counter() if at is None else at) - self.started
            if isinstance(self.plan, kvf.Plan):
                self.owner.cache.observe_plan(self.plan, self.ttft_s)
        return self.ttft_s

    def _prefix(self, layer: int, key_states):
        o = self.owner
        if key_states is not None:
            o._check_states(layer, key_states)
        self._wait_layer(layer)
        f, n, t = self.front_blocks, self.cached_blocks, o.cached_shape
        lo = o.first_read(layer, self.cached_tokens)  # a sliding layer reads its window only
        b = max(f, lo // t[0])
        # [n - b, tokens, heads, dim] -> [1, heads, (n - b) * tokens, dim], a view
        off = max(lo - b * t[0], 0)
        k = o.k_pools[layer][b:n].view(1, (n - b) * t[0], t[1], t[2]).transpose(1, 2)[..., off:, :]
        v = o.v_pools[layer][b:n].view(1, (n - b) * t[0], t[1], t[2]).transpose(1, 2)[..., off:, :]
        if not f:
            return [k], [v]
        fk, fv = self._front[layer]
        self._front[layer] = None  # the layer's own copy replaces it
        if lo >= f * t[0]:
            return [k], [v]
        return [fk[..., lo:, :], k], [fv[..., lo:, :], v]

    def finish(self) -> None:
        """Waits for the prefix's get to complete: raises PrefixLoadError if a
        block failed (the forward that read it must be recomputed). Call it
        after the forward and before using its output; idempotent."""
        tickets, self._tickets = self._tickets, []
        for t, _ in tickets:
            try:
                t.wait(check=True)
            except kvf.KvferryError as exc:
                self._failed = self._failed or exc
        if self._failed is not None:
            raise PrefixLoadError(f"the cached prefix ({self.cached_blocks} blocks) failed to load: "
                                  f"{self._failed}; recompute the request") from self._failed

    @property
    def loaded(self) -> bool:
        """Every layer took its prefix (or there was none)."""
        return all(layer.pending == 0 for layer in self.layers)


def _forward_params(model):
    """The names model.forward takes (none known where it has no signature)."""
    try:
        return inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}


def _forward_keywords(model) -> dict:
    """logits_to_keep=1 where the model takes it: a prefill's cost is its
    last token's logits, not a vocabulary row per token."""
    return {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}


def cache_kwargs(model, past) -> dict:
    """The keyword argument that hands `past` to `model` (model(ids,
    **cache_kwargs(model, past))): `cache` where its forward takes one
    (transformers' newer name; `past_key_values` there is deprecated), else
    `past_key_values`."""
    return {"cache" if "cache" in _forward_params(model) else "past_key_values": past}


def _ladder(tokens_per_block: int, max_tokens: int):
    """tokens_per_block, x4, x16, ... below max_tokens, then max_tokens."""
    out, n = [], tokens_per_block
    while n < max_tokens:
        out.append(n)
        n *= 4
    return out + [max_tokens]


def measure_prefill(model, max_tokens: int, *, tokens_per_block: int = 64, runs: int = 1, warmup: int = 1,
                    new_tokens=None, prefix_tokens=None) -> dict:
    """The model's prefill cost as a table for Cache.set_prefill_cost:
    {"new_tokens", "prefix_tokens", "seconds"}, seconds[p][j] the median
    time of a forward over new_tokens[j] tokens after prefix_tokens[p]
    cached ones (zeros: attention costs the same whatever the values),
    bounded by synchronize() on CUDA (passes under 50 ms run twice more).
    The default grid: new tokens from
    tokens_per_block up by x4 to max_tokens, prefixes 0 and the same below
    max_tokens; cells past max_tokens in all are not run but extended along
    their row from the two before, and every row and column is made
    non-decreasing (noise must not make more tokens cheaper)."""
    geo = model_geometry(model.config)
    cfg = _text_config(model.config)
    nt = list(new_tokens or _ladder(tokens_per_block, max_tokens))
    pt = list(prefix_tokens if prefix_tokens is not None else [0] + _ladder(tokens_per_block, max_tokens)[:-1])
    if not nt or not pt or sorted(set(nt)) != nt or sorted(set(pt)) != pt or nt[0] <= 0 or pt[0] < 0:
        raise ValueError(f"measure_prefill: new_tokens {nt} and prefix_tokens {pt} must be increasing, new "
                         f"tokens > 0")
    dev = model.device
    cuda = torch.device(dev).type == "cuda"
    kw = _forward_keywords(model)
    g = torch.Generator().manual_seed(0)

    def once(n, p):
        past = DynamicCache()
        if p:
            shape = (1, geo["kv_heads"], p, geo["head_dim"])
            for i in range(geo["layers"]):
                past.update(torch.zeros(shape, dtype=model.dtype, device=dev),
                            torch.zeros(shape, dtype=model.dtype, device=dev), i)
        ids = torch.randint(0, int(cfg.vocab_size), (1, n), generator=g).to(dev)
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        model(ids, use_cache=True, **cache_kwargs(model, past), **kw)
        if cuda:
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    rows = []
    with torch.no_grad():
        for _ in range(2):  # the first passes pay for lazy set-up (kernels, allocator, threads)
            once(nt[0], 0)
        for p in pt:
            row = []
            for n in nt:
                if p + n > max(max_tokens, nt[0] + p) and len(row) >= 1:
                    row.append(None)
                    continue
                times = [once(n, p) for _ in range(warmup + runs)][warmup:]
                if times[0] < 0.05:  # cheap: a median of more, since one slow pass would lift the whole table
                    times += [once(n, p) for _ in range(2)]
                row.append(sorted(times)[len(times) // 2])
            rows.append(row)
    for row in rows:  # extend the cells not run along the row
        for j, x in enumerate(row):
            if x is None:
                a, b = (j - 2, j - 1) if j >= 2 else (None, j - 1)
                slope = row[b] / nt[b] if a is None else max(row[b] - row[a], 0.0) / (nt[b] - nt[a])
                row[j] = row[b] + slope * (nt[j] - nt[b])
        for j in range(1, len(row)):
            row[j] = max(row[j], row[j - 1])
    for i in range(1, len(rows)):
        rows[i] = [max(x, y) for x, y in zip(rows[i], rows[i - 1])]
    return {"new_tokens": nt, "prefix_tokens": pt, "seconds": rows}


class KVFerryPrefixCache:
    """A kvferry Engine and Cache shaped for one model: K and V pools per
    layer, the cache's tiers below them (host slots, a disk directory, a
    Redis server), and the prefix flow around a transformers forward.

    config: the model's config (or use from_model). dtype, device: the
    model's (the pools live there; CUDA backend on a cuda device, host
    backend on cpu). tokens_per_block: tokens of one cached block; only
    whole blocks are cached. max_tokens: the longest prefix served or stored
    (pool slots = max_tokens // tokens_per_block). host_blocks / host_bytes,
    disk_dir + disk_blocks / disk_bytes: the local tiers (at least one);
    remote_url + remote: a Redis server (redis://...) below them.
    namespace: the disk directory's subfolder (default from the geometry).
    salt: names the weights (an int or a name for kvf.key_salt);
    the default comes from the config's name and geometry, so give one for
    weights that share a name (fine-tunes, random initialisations). mode:
    "layerwise", "whole", "recompute" (no reuse, for baselines) or "plan"
    (the cache's load-or-recompute plan, followed; needs the model).
    prefill_cost: the model's prefill cost for "plan" (see
    set_prefill_cost; measured from the model on first use when not
    given). engine_options / cache_options: more kvf.Engine / kvf.Cache
    keywords."""

    def __init__(self, config, *, dtype=None, device="cpu", tokens_per_block: int = 64, max_tokens: int = 8192,
                 host_blocks: int = 0, host_bytes=0, disk_dir=None, disk_blocks: int = 0, disk_bytes=0,
                 remote_url: Optional[str] = None, remote="write-through", namespace: Optional[str] = None,
                 salt=None, mode: str = "layerwise", priority: int = 50, engine_options: Optional[dict] = None,
                 cache_options: Optional[dict] = None, prefill_cost=None):
        geo = model_geometry(config)
        cfg = _text_config(config)
        self.num_layers, self.kv_heads, self.head_dim = geo["layers"], geo["kv_heads"], geo["head_dim"]
        self.sliding, self.window = geo["sliding"], geo["window"]
        if dtype is None:
            dtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
            if dtype is None:
                raise ValueError("KVFerryPrefixCache: the config names no dtype; pass dtype=")
        self.dtype = _torch_dtype(dtype, "dtype")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"KVFerryPrefixCache: device {self.device} is neither cpu nor cuda")
        self.cuda = self.device.type == "cuda"
        if not isinstance(tokens_per_block, int) or tokens_per_block <= 0:
            raise ValueError(f"KVFerryPrefixCache: tokens_per_block = {tokens_per_block!r}")
        if not isinstance(max_tokens, int) or max_tokens < tokens_per_block:
            raise ValueError(f"KVFerryPrefixCache: max_tokens = {max_tokens!r} holds no whole block of "
                             f"{tokens_per_block} tokens")
        self.tokens_per_block = tokens_per_block
        self.max_blocks = max_tokens // tokens_per_block
        self.mode = self._mode(mode)
        self.priority = priority
        self.cached_shape = (tokens_per_block, self.kv_heads, self.head_dim)
        if salt is None:
            name = getattr(cfg, "_name_or_path", "") or getattr(cfg, "model_type", "")
            salt = f"{name}|{self.num_layers}x{self.kv_heads}x{self.head_dim}|{self.dtype}"
            if self.window:  # the window shapes every later layer's K/V
                salt += f"|w{self.window}:" + "".join("s" if x else "f" for x in self.sliding)
        self.salt = kvf.key_salt(salt) if isinstance(salt, (str, bytes)) else int(salt)

        geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=self.kv_heads, tokens_per_block=tokens_per_block,
                            head_size=self.head_dim, dtype=_DTYPES[self.dtype], order=kvf.Order.TOKEN_MAJOR)
        block_bytes_all = 2 * self.num_layers * geom.block_bytes
        if host_bytes:
            if host_blocks:
                raise ValueError("KVFerryPrefixCache: give host_blocks or host_bytes, not both")
            host_blocks = kvf.size_parse(host_bytes) // block_bytes_all
        if disk_dir is not None and not (disk_blocks or disk_bytes):
            raise ValueError(f"KVFerryPrefixCache: disk_dir {disk_dir!r} needs disk_blocks or disk_bytes")
        if (disk_blocks or disk_bytes) and disk_dir is None:
            raise ValueError("KVFerryPrefixCache: a disk tier needs disk_dir")
        if not (host_blocks or disk_dir):  # the cache stores into a local tier; remote sits below one
            raise ValueError("KVFerryPrefixCache: no tier to cache into: give host_blocks / host_bytes or "
                             "disk_dir with disk_blocks / disk_bytes (remote_url adds a tier below them)")
        self.namespace = namespace or (f"hf-{self.num_layers}l{self.kv_heads}h{self.head_dim}d-"
                                       f"{str(self.dtype).split('.')[-1]}-t{tokens_per_block}")
        eopts = dict(engine_options or {})
        eopts["backend"] = kvf.Backend.CUDA if self.cuda else kvf.Backend.HOST
        if self.cuda:
            eopts["device"] = self.device.index
            # Loads run beside the model's kernels: copy engines (DMA) leave
            # the SMs to the model, where the default picks SM copies for an
            # idle GPU. Measured on the H200 (docs/performance.md): layer-wise
            # TTFT from the host tier 3-20 % lower with DMA, at every length.
            if "cuda_copy" not in eopts and not os.environ.get("KVF_CUDA_COPY"):
                eopts["cuda_copy"] = kvf.CudaCopy.DMA
        if disk_dir is not None:
            eopts["file_dir"] = str(disk_dir)
            eopts["file_namespace"] = self.namespace
        if remote_url:
            eopts["remote_url"] = remote_url
        self.engine = kvf.Engine(**eopts)
        try:
            shape = (self.max_blocks,) + self.cached_shape
            self.k_pools, self.v_pools = [], []
            for _ in range(self.num_layers):
                for pools in (self.k_pools, self.v_pools):
                    t = torch.empty(shape, dtype=self.dtype, device=self.device)
                    pools.append(t)
                    self.engine.add_pool(geom, primary=t, secondary=host_blocks or None)
            copts = dict(cache_options or {})
            if remote_url:
                copts["remote"] = remote
            self.cache = kvf.Cache(self.engine, host_blocks=host_blocks, disk_blocks=disk_blocks,
                                   disk_bytes=disk_bytes, **copts)
        except BaseException:
            self.engine.close()
            raise
        # pool order of a layer-wise get: layer 0's K and V arrive first
        self.pool_order = list(range(2 * self.num_layers))
        self._get: Optional[KVFerryDynamicCache] = None
        self._put = None
        self._late = []  # gets given up (PrefixLate): (ticket, first slot, end slot)
        self.hedged = 0  # requests whose loads were given up and recomputed
        self.last: Optional[KVFerryDynamicCache] = None  # the latest request forward or generate served
        self._pools_read = False  # kernels queued since the last settle may still read the pools
        self.prefill_cost = None
        if prefill_cost is not None:
            try:
                self.set_prefill_cost(prefill_cost)
            except BaseException:
                self.close()
                raise
        self._slots = np.arange(self.max_blocks, dtype=np.uint32)

    @classmethod
    def from_model(cls, model, **options) -> "KVFerryPrefixCache":
        """Built for `model`: its config, dtype and device."""
        options.setdefault("dtype", model.dtype)
        options.setdefault("device", model.device)
        return cls(model.config, **options)

    # -- life --
    def close(self) -> None:
        """Waits for transfers in flight, then frees the pools; blocks on disk
        or in Redis stay for the next process. Idempotent."""
        if getattr(self, "engine", None) is None:
            return
        try:
            self._settle(late=True)
        finally:
            self.cache.close()
            self.engine.close()
            self.engine = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<KVFerryPrefixCache {self.num_layers} layers x {self.kv_heads} kv heads x {self.head_dim}, "
                f"{str(self.dtype).split('.')[-1]} on {self.device}, {self.tokens_per_block} tokens a block, "
                f"mode {self.mode}>")

    # -- checks --
    @staticmethod
    def _mode(mode):
        if mode not in MODES:
            raise ValueError(f"KVFerryPrefixCache: mode {mode!r} is not one of {', '.join(MODES)}")
        return mode

    def check_model(self, model) -> None:
        """ValueError naming the first field where `model` differs from the
        geometry, dtype or device this cache was built for."""
        geo = model_geometry(model.config)
        for name, mine in (("layers", self.num_layers), ("kv_heads", self.kv_heads), ("head_dim", self.head_dim),
                           ("sliding", self.sliding), ("window", self.window)):
            if geo[name] != mine:
                raise ValueError(f"KVFerryPrefixCache: the model has {geo[name]} {name}, this cache was built for "
                                 f"{mine} (a cache serves one model's geometry)")
        if model.dtype != self.dtype:
            raise ValueError(f"KVFerryPrefixCache: the model's dtype is {model.dtype}, this cache holds {self.dtype}")
        if torch.device(model.device).type != self.device.type:
            raise ValueError(f"KVFerryPrefixCache: the model is on {model.device}, this cache's pools on "
                             f"{self.device}")

    def _check_states(self, layer, key_states):
        shape = tuple(key_states.shape)
        if (key_states.dim() != 4 or shape[0] != 1 or shape[1] != self.kv_heads or shape[3] != self.head_dim
                or key_states.dtype != self.dtype or key_states.device.type != self.device.type):
            raise ValueError(f"KVFerryPrefixCache: layer {layer}: the model's keys are {list(shape)} "
                             f"{key_states.dtype} on {key_states.device}; this cache serves [1, {self.kv_heads}, "
                             f"tokens, {self.head_dim}] {self.dtype} on {self.device} (another model's cache, or "
                             f"batch > 1)")

    def tokens(self, input_ids) -> np.ndarray:
        """One request's token ids as uint32 (a 1-D sequence, or [1, n])."""
        if torch.is_tensor(input_ids):
            if input_ids.dim() == 2:
                if input_ids.shape[0] != 1:
                    raise ValueError(f"KVFerryPrefixCache: input_ids of batch {input_ids.shape[0]}; one request "
                                     f"at a time (batch 1)")
                input_ids = input_ids[0]
            if input_ids.dim() != 1 or input_ids.is_floating_point():
                raise ValueError(f"KVFerryPrefixCache: input_ids must be integer ids of shape [n] or [1, n], "
                                 f"not {input_ids.dtype} {list(input_ids.shape)}")
            ids = input_ids.detach().to("cpu", torch.int64).numpy()
        else:
            ids = np.asarray(input_ids)
            if ids.ndim == 2 and ids.shape[0] == 1:
                ids = ids[0]
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise ValueError("KVFerryPrefixCache: input_ids must be integer ids of shape [n] or [1, n]")
        if ids.size and (ids.min() < 0 or ids.max() >= 2**32):
            raise ValueError("KVFerryPrefixCache: token ids must be in 0 .. 2**32 - 1")
        return ids.astype(np.uint32)

    def keys(self, input_ids):
        """The kvferry keys of the request's whole blocks (at most max_blocks): a list of 128-bit ints."""
        return list(kvf.key_chain_all(self.tokens(input_ids), self.tokens_per_block, self.salt)[:self.max_blocks])

    def lookup(self, input_ids) -> int:
        """How many of the request's leading tokens prepare would serve
        (modes layerwise and whole)."""
        ids = self.tokens(input_ids)
        keys = self.keys(ids)
        usable = self._usable(ids, keys)
        return self.cache.lookup(keys[:usable])[0] * self.tokens_per_block if usable else 0

    def first_read(self, layer: int, cached_tokens: int) -> int:
        """The first of a prefix's cached_tokens that layer `layer` reads
        after it: 0 for a full-attention layer; for a sliding one, the last
        window - 1 only (a new token at position p attends to p - window + 1
        on)."""
        return max(cached_tokens - (self.window - 1), 0) if self.sliding[layer] else 0

    def _gets(self, keys, first: int, hits: int, whole: bool):
        """The gets of a prefix's hits first..hits-1 into their slots, as
        (ticket, pools moved): full-attention layers' pools for every block,
        a sliding layer's only for the blocks its window reads."""
        tpb = self.tokens_per_block
        full = [p for i in range(self.num_layers) if not self.sliding[i] for p in (2 * i, 2 * i + 1)]
        every = range(2 * self.num_layers)
        window = self.first_read(self.sliding.index(True), hits * tpb) if self.window else 0
        split = min(max(first, window // tpb), hits)
        out = []
        try:
            if split > first and full:
                out.append((self.cache.get(keys[first:split], self._slots[first:split], pools=full), set(full)))
            if hits > split:
                out.append((self.cache.get(keys[split:hits], self._slots[split:hits],
                                           pools=None if whole and split == first else self.pool_order),
                            set(every)))
        except BaseException:
            for t, _ in out:
                t.wait()
            raise
        return out

    def _arrival_steps(self, plan) -> int:
        """In how many steps the plan's loads arrive (the most of its
        tiers'), as the planner counts them: never more than the layers."""
        steps = 1
        for name, n in plan.load.items():
            if n:
                groups = self.engine.arrival_groups(kvf.Tier[name.upper()])
                steps = max(steps, min(groups, self.num_layers) if groups else 1)
        return steps

    def _stream_wait(self, ticket, layer: int) -> None:
        """Work queued on the current stream from now on waits on the GPU for
        layer `layer`'s two pools; the host does not wait."""
        # torch's default stream (handle 0) goes to kvferry as cudaStreamLegacy
        stream = torch.cuda.current_stream(self.device)
        ticket.stream_wait_pool(2 * layer, stream)
        ticket.stream_wait_pool(2 * layer + 1, stream)

    # -- planning (mode "plan"; docs/planner.md) --
    def set_prefill_cost(self, cost) -> None:
        """The model's prefill cost for the cache's plans: a table from
        measure_prefill (or any kvf.Cache.set_prefill_cost form), with this
        model's layers and layer-wise overlap."""
        self.cache.set_prefill_cost(cost, layers=self.num_layers, overlap=True)
        self.prefill_cost = cost

    def profile(self, model, **options) -> dict:
        """Measures the model's prefill cost (measure_prefill up to
        max_tokens; options go to it) and sets it; the table is kept, so a
        plan measures once per object."""
        self.check_model(model)
        cost = measure_prefill(model, self.max_blocks * self.tokens_per_block,
                               tokens_per_block=self.tokens_per_block, **options)
        self.set_prefill_cost(cost)
        return cost

    def plan(self, input_ids, model=None):
        """The cache's plan for the request (kvf.Cache.plan over its usable
        blocks): which leading hits to load and from which token to compute.
        Measures the prefill cost from `model` first if none is set."""
        ids = self.tokens(input_ids)
        keys = self.keys(ids)
        return self._plan(ids, keys[:self._usable(ids, keys)], model)

    def _usable(self, ids, keys) -> int:
        """Blocks that may be served: at least one token is left to compute."""
        return min(len(keys), max(len(ids) - 1, 0) // self.tokens_per_block)

    def _plan(self, ids, keys, model):
        if self.prefill_cost is None:
            if model is None:
                raise ValueError("KVFerryPrefixCache: mode 'plan' needs the model's prefill cost: pass "
                                 "model= (measured once) or prefill_cost= / set_prefill_cost")
            self.profile(model)
        return self.cache.plan(keys, len(ids))

    # -- a request --
    def _settle(self, late: bool = False) -> None:
        """The previous request's transfers done and the pools free to reuse
        (with late, the late gets too; without, those that landed are
        retired and the others run on: a get into their slots is ordered
        after them by the engine)."""
        self._retire_late(block=late)
        if self._get is not None:
            try:
                self._get.finish()
            except PrefixLoadError:
                pass  # its caller was told (or ignored it); the blocks are dropped
            self._get = None
        if self._put is not None:
            put, self._put = self._put, None
            failed = put.errors()
            if failed:
                log.warning("kvferry: %d of %d blocks were not stored; first: %s", put.error_count, put.count,
                            failed[0].message)
        if self.cuda and self._pools_read:
            torch.cuda.current_stream(self.device).synchronize()  # no kernel still reads the pools
        self._pools_read = False

    def prepare(self, input_ids, mode: Optional[str] = None, *, model=None) -> KVFerryDynamicCache:
        """Looks the request up and queues the get of its cached prefix into
        the pools; returns the Cache to pass as past_key_values, with the
        model run on input_ids[:, cached_tokens:]. At least one token is
        left to compute. mode "whole" waits for the get here (and returns an
        empty cache, with a warning, if a block failed). mode "plan" follows
        the cache's plan (past.plan): loads its leading hits layer-wise, or,
        where it says so, computes the first load_first blocks here with
        `model` while the hits after them load; model is needed for the
        plan's prefill cost (measured once) and for that front."""
        started = time.perf_counter()
        mode = self._mode(mode or self.mode)
        self._settle()
        ids = self.tokens(input_ids)
        if not len(ids):
            raise ValueError("KVFerryPrefixCache: empty input_ids")
        if model is not None:
            self.check_model(model)
        hits = first = 0
        plan = known = None
        if mode != "recompute":
            keys = self.keys(ids)
            usable = self._usable(ids, keys)
            if usable and mode == "plan":
                plan = self._plan(ids, keys[:usable], model)
                hits, known = plan.load_blocks, plan.hits
                first = min(int(getattr(plan, "load_first", 0) or 0), hits)
                if first == hits:  # nothing left to load: the plan computes it all
                    hits = first = 0
                elif first and model is None:
                    raise ValueError(f"KVFerryPrefixCache: the plan computes the first {first} blocks while "
                                     f"the rest load: prepare needs model=")
            elif usable:
                hits = self.cache.lookup(keys[:usable])[0]
        if not hits:
            return KVFerryDynamicCache(self, 0, None, mode, plan=plan, known_blocks=known, started=started)
        get_at = time.perf_counter()
        try:
            tickets = self._gets(keys, first, hits, mode == "whole")
        except kvf.NotFound as exc:  # gone since the lookup (a shared store evicted it): compute it all
            log.warning("kvferry: the cached prefix (%d blocks) is gone, recomputing: %s", hits - first, exc)
            return KVFerryDynamicCache(self, 0, None, mode, plan=plan, known_blocks=0, started=started)
        front = None
        if first:  # the front computed while the blocks after it load
            try:
                front = self._front(model, input_ids, first * self.tokens_per_block)
            except BaseException:
                for t, _ in tickets:
                    t.wait()
                raise
        if mode == "whole":
            failed = None
            for t, _ in tickets:
                try:
                    t.wait(check=True)
                except kvf.KvferryError as exc:
                    failed = failed or exc
            if failed is not None:
                log.warning("kvferry: the cached prefix (%d blocks) failed to load, recomputing: %s", hits,
                            failed)
                return KVFerryDynamicCache(self, 0, None, mode)
            if self.cuda:  # the model's stream reads the slots after the copies, whatever queue they ran on
                self.engine.sync_stream(torch.cuda.current_stream(self.device))
            tickets = None
        past = KVFerryDynamicCache(self, hits * self.tokens_per_block, tickets, mode, plan=plan, front=front,
                                   known_blocks=known, started=started, get_at=get_at)
        self._get = past
        self._pools_read = True
        return past

    def _front(self, model, input_ids, tokens: int):
        """K/V per layer of the request's first `tokens` tokens, computed."""
        if not torch.is_tensor(input_ids):
            input_ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
        ids = input_ids.reshape(1, -1)[:, :tokens].to(model.device)
        past = DynamicCache()
        with torch.no_grad():
            model(ids, use_cache=True, **cache_kwargs(model, past), **_forward_keywords(model))
        if len(past.layers) != self.num_layers:
            raise ValueError(f"KVFerryPrefixCache: the model filled {len(past.layers)} layers, this cache has "
                             f"{self.num_layers}")
        for i, layer in enumerate(past.layers):
            self._check_states(i, layer.keys)
        return [(layer.keys, layer.values) for layer in past.layers]

    def store(self, input_ids, past, priority: Optional[int] = None) -> int:
        """Puts the request's whole blocks that past holds (K/V of the first
        len(input_ids) tokens, as the model computed them) into the cache;
        returns how many were queued. Blocks the cache held (served, or in
        mode "plan" recomputed) are not copied again. Returns at once: the
        copies run behind, and the next request waits for them before it
        reuses the pools."""
        if isinstance(past, KVFerryDynamicCache):
            if past.owner is not self:
                raise ValueError("KVFerryPrefixCache.store: past belongs to another KVFerryPrefixCache")
            past.finish()
            if self._get is past:
                self._get = None
            start = past.known_blocks
        elif isinstance(past, _HFCache):
            start = 0
        else:
            raise ValueError(f"KVFerryPrefixCache.store: past is a {type(past).__name__}, not a transformers Cache")
        if len(past.layers) != self.num_layers:
            raise ValueError(f"KVFerryPrefixCache.store: past has {len(past.layers)} layers, this cache "
                             f"{self.num_layers}")
        if any(getattr(layer, "pending", 0) for layer in past.layers):
            return 0  # the forward did not run through every layer
        ids = self.tokens(input_ids)
        keys = self.keys(ids)
        n = min(len(keys), past.get_seq_length() // self.tokens_per_block)
        if n <= start:
            return 0
        # the first token each layer holds: a sliding-window layer of transformers' own keeps its
        # window only, and a block is stored with every layer or not at all
        held = [layer.get_seq_length() - layer.keys.shape[-2] for layer in past.layers]
        if max(held) > start * self.tokens_per_block:
            log.warning("kvferry: not stored: layer %d holds tokens from %d on, blocks from %d are to be stored "
                        "(a sliding-window layer keeps its window only: pass the Cache prepare made)",
                        held.index(max(held)), max(held), start)
            return 0
        if self._put is not None or self._get is not None:
            self._settle()
        self._retire_late(start, n, block=True)  # a late get still writing these slots lands first
        tpb = self.tokens_per_block
        for i, layer in enumerate(past.layers):
            self._check_states(i, layer.keys)
            for pool, states in ((self.k_pools[i], layer.keys), (self.v_pools[i], layer.values)):
                # [heads, tokens, dim] of the request -> [tokens, heads, dim] in slots start..n-1
                lo = start * tpb - held[i]
                pool[start:n].view((n - start) * tpb, self.kv_heads, self.head_dim).copy_(
                    states[0, :, lo:lo + (n - start) * tpb].transpose(0, 1))
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()  # the put reads what the stream wrote
        self._put = self.cache.put(keys[start:n], self._slots[start:n],
                                   self.priority if priority is None else priority)
        return n - start

    def sync(self) -> None:
        """Waits for the stores queued so far (e.g. before another process
        reads the disk directory), and for gets given up as late."""
        self._settle(late=True)

    def forward(self, model, input_ids, *, mode: Optional[str] = None, store: bool = True, **kwargs):
        """model(...) over the request with its cached prefix served; stores
        its blocks afterwards. Extra keywords go to the model. A prefix that
        fails to load is recomputed (a warning says why)."""
        self.check_model(model)
        ids = self._ids_2d(input_ids, model)
        past = self.prepare(ids, mode, model=model)
        try:
            out = model(ids[:, past.cached_tokens:], use_cache=True, **cache_kwargs(model, past), **kwargs)
            past.finish()
        except PrefixLoadError as exc:
            past = self._recover(ids, past, exc)
            out = model(ids[:, past.cached_tokens:], use_cache=True, **cache_kwargs(model, past), **kwargs)
        self._first_token(past)
        self.last = past
        if store:
            self.store(ids, past)
        return out

    def generate(self, model, input_ids, *, mode: Optional[str] = None, store: bool = True, **kwargs):
        """model.generate(...) with the prompt's cached prefix served; stores
        the whole blocks of the prompt and of what was generated. Returns
        what generate returns."""
        self.check_model(model)
        ids = self._ids_2d(input_ids, model)
        past = self.prepare(ids, mode, model=model)
        try:
            out = model.generate(ids, **cache_kwargs(model, past), **kwargs)
            past.finish()
        except PrefixLoadError as exc:
            past = self._recover(ids, past, exc)
            out = model.generate(ids, **cache_kwargs(model, past), **kwargs)
        self._first_token(past)  # where generate made one token only: no next forward marked it
        self.last = past
        if store:
            self.store(out.sequences if hasattr(out, "sequences") else out, past)
        return out

    def _recover(self, ids, past, exc) -> KVFerryDynamicCache:
        """The Cache to run the request again with, its prefix having failed
        (recompute it all) or run late (PrefixLate: keep the computed front,
        recompute the rest; the hits stay cached, so store skips them)."""
        if not isinstance(exc, PrefixLate):
            log.warning("kvferry: %s", exc)
            return self.prepare(ids, "recompute")
        log.info("kvferry: %s", exc)
        self.hedged += 1
        # a layer that took its front before the wait ran late has none left: recompute it all
        whole = past.front_blocks and all(f is not None for f in past._front)
        tokens = past.front_blocks * self.tokens_per_block if whole else 0
        again = KVFerryDynamicCache(self, tokens, None, past.mode, plan=past.plan,
                                    front=past._front if tokens else None, known_blocks=past.known_blocks,
                                    started=past.started, get_at=past.get_at)
        again.late, again.late_at = past.late, past.late_at
        again.waited_s, again.pace = past.waited_s, past.pace  # the request's, the given-up wait's included
        return again

    def _first_token(self, past) -> None:
        """The request's first token is out (past.first_token), once the
        device has computed it."""
        if past.ttft_s is None:
            if self.cuda:
                torch.cuda.current_stream(self.device).synchronize()
            past.first_token()

    def _give_up(self, tickets, past) -> None:
        """Late gets, no longer waited for: they land in their slots later,
        unread, and are retired before anything else writes them."""
        self._late.extend((t, past.front_blocks, past.cached_blocks) for t in tickets)
        if self._get is past:
            self._get = None

    def _retire_late(self, lo: int = 0, hi: Optional[int] = None, block: bool = False) -> None:
        """Retires the late gets that have landed; with block, waits for the
        ones writing slots lo..hi first. Their outcome changes nothing here:
        a block that failed is dropped by the cache, one that arrived late
        stays cached."""
        keep = []
        for ticket, first, end in self._late:
            overlaps = first < (self.max_blocks if hi is None else hi) and lo < end
            if (ticket.wait() if block and overlaps else ticket.poll()) is None:
                keep.append((ticket, first, end))
        self._late = keep

    def _ids_2d(self, input_ids, model):
        if not torch.is_tensor(input_ids):
            input_ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        self.tokens(input_ids)  # batch and range checks
        return input_ids.to(model.device)
