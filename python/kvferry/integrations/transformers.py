# SPDX-License-Identifier: Apache-2.0
"""Prefix reuse for Hugging Face transformers (5.x) through a kvferry cache.

    from kvferry.integrations.transformers import KVFerryPrefixCache

    kv = KVFerryPrefixCache.from_model(model, host_blocks=512, disk_dir="/var/kv", disk_blocks=8192)
    out = kv.generate(model, input_ids, max_new_tokens=32)   # serves, then stores, the prompt's blocks

or by hand, around a forward:

    past = kv.prepare(input_ids)                             # lookup + get queued, nothing waited for
    out = model(input_ids[:, past.cached_tokens:], past_key_values=past)
    past.finish()                                            # raises PrefixLoadError if a block failed
    kv.store(input_ids, past)

The KV of each layer lives in two kvferry pools (K, then V), torch tensors
shaped [max_blocks, tokens_per_block, kv_heads, head_dim] (Order.TOKEN_MAJOR).
A request's cached prefix is fetched into slots 0..hits-1 of every pool,
layer by layer (mode "layerwise": layer l's attention waits for its own two
pools only, so layer l+1 loads while layer l computes), or all of it before
the forward (mode "whole"). The model runs on the new tokens only.

One request at a time per object, batch size 1, full-attention decoders
(no sliding-window layers). docs/integrations/transformers.md has the rest.
"""

import logging
from typing import Optional

import numpy as np
import torch
from transformers.cache_utils import Cache as _HFCache
from transformers.cache_utils import DynamicCache, DynamicLayer

import kvferry as kvf

__all__ = ["KVFerryPrefixCache", "KVFerryDynamicCache", "PrefixLoadError", "MODES"]

log = logging.getLogger("kvferry.transformers")

MODES = ("layerwise", "whole", "recompute")

_DTYPES = {torch.float32: kvf.Dtype.FP32, torch.float16: kvf.Dtype.FP16, torch.bfloat16: kvf.Dtype.BF16}


class PrefixLoadError(RuntimeError):
    """A cached block could not be brought back (lost, corrupt, unreadable):
    the forward that used it is invalid. The cache has already dropped the
    block; KVFerryPrefixCache.forward / generate recompute on their own."""


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
    """layers, kv_heads, head_dim of a decoder config; ValueError for a model
    this adapter cannot serve (sliding-window or linear-attention layers)."""
    cfg = _text_config(config)
    try:
        layers = int(cfg.num_hidden_layers)
        heads = int(cfg.num_attention_heads)
    except AttributeError as exc:
        raise ValueError(f"KVFerryPrefixCache: {type(cfg).__name__} has no {exc.name}: not a decoder config") from None
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    types = getattr(cfg, "layer_types", None)
    if types:
        other = sorted({t for t in types if t != "full_attention"})
        if other:
            raise ValueError(f"KVFerryPrefixCache: {type(cfg).__name__} has {', '.join(other)} layers; only "
                             f"full-attention decoders are supported (a sliding window drops prefix tokens)")
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim}


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
        k, v = self._request._prefix(self._index, key_states)
        self.dtype, self.device = k.dtype, k.device
        if key_states is None:
            self.keys, self.values = k.contiguous(), v.contiguous()
        else:  # one copy: the prefix (a view of the pools) and the new tokens
            self.keys = torch.cat([k, key_states], dim=-2)
            self.values = torch.cat([v, value_states], dim=-2)
        self.is_initialized = True
        self.pending = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if self.pending:
            self._materialize(key_states, value_states)
            return self.keys, self.values
        return super().update(key_states, value_states, *args, **kwargs)


def _prefix_first(name):
    base = getattr(DynamicLayer, name)

    def method(self, *args, **kwargs):
        if self.pending:
            self._materialize()
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


# what rewrites a layer (assisted decoding's crop, beam search) needs the prefix in it first
for _name in ("crop", "batch_repeat_interleave", "batch_select_indices", "reorder_cache"):
    setattr(_PrefixLayer, _name, _prefix_first(_name))


class KVFerryDynamicCache(DynamicCache):
    """The transformers Cache of one request: a DynamicCache whose layers
    start with the request's cached prefix (cached_tokens tokens), each
    layer's part taken from the kvferry pools when the model first updates
    that layer. get_seq_length() counts the prefix from the start, so the
    model's positions and masks are right for the new tokens."""

    def __init__(self, owner: "KVFerryPrefixCache", cached_tokens: int, ticket, mode: str):
        self.owner, self.cached_tokens, self.mode = owner, cached_tokens, mode
        self.cached_blocks = cached_tokens // owner.tokens_per_block
        self._ticket = ticket
        self._failed: Optional[BaseException] = None
        _HFCache.__init__(self, layers=[_PrefixLayer(self, i) for i in range(owner.num_layers)])

    def _wait_layer(self, layer: int) -> None:
        if self._failed is not None:
            raise PrefixLoadError(f"layer {layer}: the cached prefix failed to load: {self._failed}") \
                from self._failed
        t = self._ticket
        if t is None:  # no prefix, or waited for whole
            return
        try:
            # this layer's K and V pools only; on CUDA the stream waits, not the host
            if self.owner.cuda:
                self.owner._stream_wait(t, layer)
            else:
                t.wait_pool(2 * layer)
                t.wait_pool(2 * layer + 1)
        except kvf.KvferryError as exc:
            self._failed = exc
            raise PrefixLoadError(f"layer {layer}: the cached prefix ({self.cached_blocks} blocks) failed to "
                                  f"load: {exc}; recompute the request") from exc

    def _prefix(self, layer: int, key_states):
        o = self.owner
        if key_states is not None:
            o._check_states(layer, key_states)
        self._wait_layer(layer)
        n, t = self.cached_blocks, o.cached_shape
        # [n, tokens, heads, dim] -> [1, heads, n * tokens, dim], a view
        k = o.k_pools[layer][:n].view(1, n * t[0], t[1], t[2]).transpose(1, 2)
        v = o.v_pools[layer][:n].view(1, n * t[0], t[1], t[2]).transpose(1, 2)
        return k, v

    def finish(self) -> None:
        """Waits for the prefix's get to complete: raises PrefixLoadError if a
        block failed (the forward that read it must be recomputed). Call it
        after the forward and before using its output; idempotent."""
        t, self._ticket = self._ticket, None
        if t is not None:
            try:
                t.wait(check=True)
            except kvf.KvferryError as exc:
                self._failed = exc
        if self._failed is not None:
            raise PrefixLoadError(f"the cached prefix ({self.cached_blocks} blocks) failed to load: "
                                  f"{self._failed}; recompute the request") from self._failed

    @property
    def loaded(self) -> bool:
        """Every layer took its prefix (or there was none)."""
        return all(layer.pending == 0 for layer in self.layers)


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
    "layerwise", "whole" or "recompute" (no reuse, for baselines).
    engine_options / cache_options: more kvf.Engine / kvf.Cache keywords."""

    def __init__(self, config, *, dtype=None, device="cpu", tokens_per_block: int = 64, max_tokens: int = 8192,
                 host_blocks: int = 0, host_bytes=0, disk_dir=None, disk_blocks: int = 0, disk_bytes=0,
                 remote_url: Optional[str] = None, remote="write-through", namespace: Optional[str] = None,
                 salt=None, mode: str = "layerwise", priority: int = 50, engine_options: Optional[dict] = None,
                 cache_options: Optional[dict] = None):
        geo = model_geometry(config)
        cfg = _text_config(config)
        self.num_layers, self.kv_heads, self.head_dim = geo["layers"], geo["kv_heads"], geo["head_dim"]
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
        self._pools_read = False  # kernels queued since the last settle may still read the pools
        self._slots = np.arange(self.max_blocks, dtype=np.uint32)
        if self.cuda:
            # kvferry takes stream 0 (torch's default, legacy stream) for "no stream" and would make the host
            # wait; a layer then waits on a stream of ours and the model's stream waits for it through an event
            self._side = torch.cuda.Stream(self.device)
            self._events = [torch.cuda.Event() for _ in range(self.num_layers)]

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
            self._settle()
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
        for name, mine in (("layers", self.num_layers), ("kv_heads", self.kv_heads), ("head_dim", self.head_dim)):
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
        """The kvferry keys of the request's whole blocks (at most max_blocks), a uint64 NumPy array."""
        keys = kvf.key_chain_all(self.tokens(input_ids), self.tokens_per_block, self.salt)[:self.max_blocks]
        return np.array(keys, dtype=np.uint64)

    def lookup(self, input_ids) -> int:
        """How many of the request's leading tokens prepare would serve."""
        ids = self.tokens(input_ids)
        keys = self.keys(ids)
        usable = min(len(keys), max(len(ids) - 1, 0) // self.tokens_per_block)
        return self.cache.lookup(keys[:usable])[0] * self.tokens_per_block if usable else 0

    def _stream_wait(self, ticket, layer: int) -> None:
        """Work queued on the current stream from now on waits on the GPU for
        layer `layer`'s two pools; the host does not wait."""
        stream = torch.cuda.current_stream(self.device)
        if stream.cuda_stream:
            ticket.stream_wait_pool(2 * layer, stream)
            ticket.stream_wait_pool(2 * layer + 1, stream)
            return
        ticket.stream_wait_pool(2 * layer, self._side)
        ticket.stream_wait_pool(2 * layer + 1, self._side)
        event = self._events[layer]
        event.record(self._side)
        stream.wait_event(event)

    # -- a request --
    def _settle(self) -> None:
        """The previous request's transfers done and the pools free to reuse."""
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

    def prepare(self, input_ids, mode: Optional[str] = None) -> KVFerryDynamicCache:
        """Looks the request up and queues the get of its cached prefix into
        the pools; returns the Cache to pass as past_key_values, with the
        model run on input_ids[:, cached_tokens:]. At least one token is
        left to compute. mode "whole" waits for the get here (and returns an
        empty cache, with a warning, if a block failed)."""
        mode = self._mode(mode or self.mode)
        self._settle()
        ids = self.tokens(input_ids)
        if not len(ids):
            raise ValueError("KVFerryPrefixCache: empty input_ids")
        hits = 0
        if mode != "recompute":
            keys = self.keys(ids)
            usable = min(len(keys), (len(ids) - 1) // self.tokens_per_block)
            if usable:
                hits = self.cache.lookup(keys[:usable])[0]
        if not hits:
            return KVFerryDynamicCache(self, 0, None, mode)
        try:
            ticket = self.cache.get(keys[:hits], self._slots[:hits],
                                    pools=self.pool_order if mode == "layerwise" else None)
        except kvf.NotFound as exc:  # gone since the lookup (a shared store evicted it): compute it all
            log.warning("kvferry: the cached prefix (%d blocks) is gone, recomputing: %s", hits, exc)
            return KVFerryDynamicCache(self, 0, None, mode)
        if mode == "whole":
            try:
                ticket.wait(check=True)
            except kvf.KvferryError as exc:
                log.warning("kvferry: the cached prefix (%d blocks) failed to load, recomputing: %s", hits, exc)
                return KVFerryDynamicCache(self, 0, None, mode)
            if self.cuda:  # the model's stream reads the slots after the copies, whatever queue they ran on
                self.engine.sync_stream(torch.cuda.current_stream(self.device))
            ticket = None
        past = KVFerryDynamicCache(self, hits * self.tokens_per_block, ticket, mode)
        self._get = past
        self._pools_read = True
        return past

    def store(self, input_ids, past, priority: Optional[int] = None) -> int:
        """Puts the request's whole blocks that past holds (K/V of the first
        len(input_ids) tokens, as the model computed them) into the cache;
        returns how many were queued. Blocks served from the cache are not
        copied again. Returns at once: the copies run behind, and the next
        request waits for them before it reuses the pools."""
        if isinstance(past, KVFerryDynamicCache):
            if past.owner is not self:
                raise ValueError("KVFerryPrefixCache.store: past belongs to another KVFerryPrefixCache")
            past.finish()
            if self._get is past:
                self._get = None
            start = past.cached_blocks
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
        if self._put is not None or self._get is not None:
            self._settle()
        tpb = self.tokens_per_block
        for i, layer in enumerate(past.layers):
            self._check_states(i, layer.keys)
            for pool, states in ((self.k_pools[i], layer.keys), (self.v_pools[i], layer.values)):
                # [heads, tokens, dim] of the request -> [tokens, heads, dim] in slots start..n-1
                pool[start:n].view((n - start) * tpb, self.kv_heads, self.head_dim).copy_(
                    states[0, :, start * tpb:n * tpb].transpose(0, 1))
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()  # the put reads what the stream wrote
        self._put = self.cache.put(keys[start:n], self._slots[start:n],
                                   self.priority if priority is None else priority)
        return n - start

    def sync(self) -> None:
        """Waits for the stores queued so far (e.g. before another process
        reads the disk directory)."""
        self._settle()

    def forward(self, model, input_ids, *, mode: Optional[str] = None, store: bool = True, **kwargs):
        """model(...) over the request with its cached prefix served; stores
        its blocks afterwards. Extra keywords go to the model. A prefix that
        fails to load is recomputed (a warning says why)."""
        self.check_model(model)
        ids = self._ids_2d(input_ids, model)
        past = self.prepare(ids, mode)
        try:
            out = model(ids[:, past.cached_tokens:], past_key_values=past, use_cache=True, **kwargs)
            past.finish()
        except PrefixLoadError as exc:
            log.warning("kvferry: %s", exc)
            past = self.prepare(ids, "recompute")
            out = model(ids, past_key_values=past, use_cache=True, **kwargs)
        if store:
            self.store(ids, past)
        return out

    def generate(self, model, input_ids, *, mode: Optional[str] = None, store: bool = True, **kwargs):
        """model.generate(...) with the prompt's cached prefix served; stores
        the whole blocks of the prompt and of what was generated. Returns
        what generate returns."""
        self.check_model(model)
        ids = self._ids_2d(input_ids, model)
        past = self.prepare(ids, mode)
        try:
            out = model.generate(ids, past_key_values=past, **kwargs)
            past.finish()
        except PrefixLoadError as exc:
            log.warning("kvferry: %s", exc)
            past = self.prepare(ids, "recompute")
            out = model.generate(ids, past_key_values=past, **kwargs)
        if store:
            self.store(out.sequences if hasattr(out, "sequences") else out, past)
        return out

    def _ids_2d(self, input_ids, model):
        if not torch.is_tensor(input_ids):
            input_ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64))
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        self.tokens(input_ids)  # batch and range checks
        return input_ids.to(model.device)
