# SPDX-License-Identifier: Apache-2.0
"""A SGLang HiCache storage backend (the L3 tier below HiCache's host
memory pools) on kvferry Caches: pages go between SGLang's host pools,
which kvferry registers as its primary pools, and kvferry's disk and remote
tiers (and, if asked, a host tier of its own). Importing this module
imports SGLang.

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
        '{"backend_name": "kvferry", "module_path": "kvferry.integrations.sglang",
          "class_name": "KvferryStorage", "interface_v1": 1,
          "file_dir": "/mnt/nvme/kv", "disk_bytes": "512GiB"}'

docs/integrations/sglang.md has the settings and what was tested."""

import logging
import os
import threading
import time
from collections import Counter
from typing import Any, Dict, List, Optional

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, PoolHitPolicy, PoolName, PoolTransfer,
                                                  PoolTransferResult)

from .._cache import Cache, tier_name
from .._engine import Engine
from .._moves import Move
from .._enums import Backend, CacheRemote, Memory, Status, Tier
from .._errors import make_error
from ._serving import (add_pools, block_file, check_settings, failed_moves, namespace, prefix_get, string_key,
                       tensor_pools)

log = logging.getLogger("kvferry.integrations.sglang")

_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
_ENGINE_KEYS = ("file_dir", "remote_url", "threads", "config_file", "file_io", "fsync")
_CACHE_KEYS = ("host_blocks", "host_bytes", "disk_blocks", "disk_bytes", "remote", "offload_min_priority",
               "disk_admit_uses")
_OWN_KEYS = ("namespace", "priority")

# The host pool layouts SGLang builds on every device. page_first_kv_split
# (Ascend NPUs only) keeps K, V and the indexer in buffers of their own and
# is not taken.
_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head", "page_unified")


def _host_buffers(pool) -> list:
    """The pool's host tensors: kv_buffer (one, or a list for Mamba's
    states), or the DSA indexer pool's one buffer."""
    bufs = getattr(pool, "kv_buffer", None)
    if bufs is None:
        bufs = getattr(pool, "index_k_with_scale_buffer", None)
    return [b for b in (bufs if isinstance(bufs, (list, tuple)) else [bufs]) if b is not None and b.numel()]


def host_pool_pools(pool, what: str):
    """kvferry pools over a SGLang host pool's buffers, a page a block. A
    buffer that has a dimension of the pool's token count indexes tokens
    (layer_first, page_first; Mamba's slots, a token a page) and is cut
    into pages; one that has none indexes pages (page_first_direct,
    page_head, page_unified, the DSA indexer's rows). Every dimension
    outside a page's bytes (K/V, a layer-first layer) is a pool of its own.
    Raises naming `what` for a pool kvferry cannot map."""
    layout = getattr(pool, "layout", None)
    if layout not in _LAYOUTS:
        raise make_error(Status.ERR_UNSUPPORTED, f"{what}: layout {layout!r}; kvferry takes {', '.join(_LAYOUTS)}")
    bufs = _host_buffers(pool)
    if not bufs:
        raise make_error(Status.ERR_UNSUPPORTED, f"{what}: no host buffer kvferry can register")
    ps, size = int(pool.page_size), int(pool.size)
    pages = [n for n in (getattr(pool, "page_num", None), getattr(pool, "indexer_page_num", None)) if n]
    out = []
    for n, buf in enumerate(bufs):
        shape = list(buf.shape)
        if size in shape:
            dim = shape.index(size)
            if size % ps:
                raise make_error(Status.ERR_INVALID, f"{what}: {size} tokens are not whole pages of {ps}")
            view = buf.view(*shape[:dim], size // ps, ps, *shape[dim + 1:])
        else:
            dims = [d for d in range(len(shape)) if shape[d] in pages]
            if not dims:
                raise make_error(Status.ERR_INVALID, f"{what}: buffer {n} of shape {tuple(shape)} has no dimension "
                                 f"of {size} tokens or of {' or '.join(map(str, pages))} pages")
            dim, view = dims[0], buf
        out += tensor_pools(view, dim, ps, f"{what} buffer {n}")
    return out


def _dtype_names(pool) -> str:
    return "+".join(sorted({str(b.dtype).rsplit(".", 1)[-1] for b in _host_buffers(pool)}))


def rank_namespace(c, extra, dtype: str, page_size: int, layout: str, pool: str = "kv",
                   replicated: Optional[bool] = None) -> str:
    """The namespace of one rank's pages of one pool: every dimension that
    changes a page's bytes (the model or the configured namespace, the pool,
    the host pool's element type, page size and layout, the PP stage,
    attention CP rank, DCP rank and attention-DP rank, and the TP rank
    unless the pool is replicated across TP ranks, as MLA's latent is)."""
    model = extra.get("namespace") or (c.model_name or "model").rstrip("/").rsplit("/", 1)[-1]
    if replicated is None:
        replicated = _replicated(c, pool)
    dcp = int(getattr(c, "dcp_size", 1) or 1)
    if replicated:
        tp = "mla"
    else:
        tp = f"tp{c.tp_rank}of{c.tp_size}" if c.tp_size > 1 else None
    return namespace(
        "sglang", model, None if pool == PoolName.KV else pool, dtype, f"ps{page_size}", layout.replace("_", ""), tp,
        f"pp{c.pp_rank}of{c.pp_size}" if c.pp_size > 1 else None,
        f"cp{c.attn_cp_rank}of{c.attn_cp_size}" if getattr(c, "attn_cp_size", 1) > 1 else None,
        f"dcp{int(getattr(c, 'dcp_rank', 0))}of{dcp}" if dcp > 1 else None,
        f"dp{c.dp_rank}" if getattr(c, "dp_rank", 0) else None)


def _replicated(c, pool: str) -> bool:
    """MLA models' pools hold the same bytes on every TP rank, except the
    Mamba state, which is sharded whatever the attention."""
    return bool(c.is_mla_model) and str(pool) != PoolName.MAMBA


class _PoolStore:
    """One SGLang host pool's pages in one kvferry Cache, a page a block.

    A pool every TP rank holds alike (MLA) has one writer, SGLang's storage
    writer rank; the other ranks are readers: their cache has no disk tier
    of its own (the writer's directory is not theirs to evict from) and
    reads the remote store, and what they look up and load past it comes
    from the writer's files in the shared directory, found by name. So
    every rank's answer comes from the shared store and HiCache's minimum
    over ranks is the real hit."""

    def __init__(self, name: str, host_pool, config, extra: dict):
        self.name = str(name)
        self.host_pool = host_pool
        self.page_size = int(host_pool.page_size)
        what = f"SGLang {self.name} host pool ({type(host_pool).__name__}, {host_pool.layout})"
        pools = host_pool_pools(host_pool, what)
        replicated = _replicated(config, self.name)
        self.writer = not replicated or bool(config.is_storage_writer)
        self.namespace = rank_namespace(config, extra, _dtype_names(host_pool), self.page_size, host_pool.layout,
                                        self.name, replicated)
        ekw = {k: extra[k] for k in _ENGINE_KEYS if k in extra}
        ckw = {k: extra[k] for k in _CACHE_KEYS if k in extra}
        if "remote" in ckw:
            ckw["remote"] = CacheRemote[str(ckw["remote"]).upper()]
        self.file_dir = ekw.get("file_dir")
        if not self.writer:
            if not self.file_dir and not ekw.get("remote_url"):
                raise make_error(Status.ERR_INVALID, f"KvferryStorage: {what}: TP rank {config.tp_rank} reads the "
                                 f"pages rank {config.dcp_rank} stores; set file_dir or remote_url to a store every "
                                 f"rank shares")
            for k in ("disk_blocks", "disk_bytes"):
                ckw.pop(k, None)
            if ekw.get("remote_url"):
                ckw["remote"] = CacheRemote.READ
            if not ckw.get("host_blocks") and not ckw.get("host_bytes"):
                ckw["host_blocks"] = 1  # a cache needs a tier of its own: one page
        if "host_bytes" in ckw:
            from .._cache import size_parse

            ckw["host_blocks"] = size_parse(ckw.pop("host_bytes")) // sum(p.geometry.block_bytes for p in pools)
        self.page_bytes = sum(p.geometry.block_bytes for p in pools)
        self.engine = Engine(backend=Backend.HOST, file_namespace=self.namespace, **ekw)
        try:
            # page-locked or not, the host backend copies it as host memory
            add_pools(self.engine, pools, int(ckw.get("host_blocks", 0)), Memory.HOST)
            self.cache = Cache(self.engine, **ckw)
        except BaseException:
            self.engine.close()
            raise
        self._lock = threading.Lock()
        # pages HiCache takes (a get's pages before its first failure), by
        # the tier they came from; and the pages a lookup found that it
        # does not take (failed, or after a failed one), by the tier the
        # lookup found them in: never counted as loaded
        self.loaded = Counter()
        self.failed = Counter()
        log.info("kvferry: SGLang %s pool in namespace %s (%s)", self.name, self.namespace,
                 "writer" if self.writer else "reader of the shared store")

    def close(self):
        self.engine.close()

    def pages(self, keys: List[str], host_indices) -> List[int]:
        ps = self.page_size
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) != len(keys) * ps:
            raise make_error(Status.ERR_INVALID, f"KvferryStorage: {self.name} pool: {len(keys)} keys but "
                             f"{len(idx)} host indices (page size {ps})")
        pages = []
        for i in range(len(keys)):
            first = int(idx[i * ps])
            if first % ps or idx[i * ps:(i + 1) * ps] != list(range(first, first + ps)):
                raise make_error(Status.ERR_INVALID, f"KvferryStorage: {self.name} pool: key {keys[i]}: host "
                                 f"indices {first}.. are not one whole page")
            pages.append(first // ps)
        return pages

    def _shared_run(self, keys: List[int], start: int) -> int:
        """A reader's pages in the writer's files: the end of the run of
        keys from start whose files exist."""
        end = start
        if not self.writer and self.file_dir:
            while end < len(keys) and os.path.exists(block_file(self.file_dir, self.namespace, keys[end])):
                end += 1
        return end

    def exists(self, keys: List[str]) -> int:
        """The stored prefix of keys."""
        ks = [string_key(k) for k in keys]
        hits, _ = self.cache.lookup(ks)
        return self._shared_run(ks, hits)

    def present(self, keys: List[str]) -> List[bool]:
        """Whether each key is stored, prefix or not."""
        return [self.exists([k]) == 1 for k in keys]

    def get(self, keys: List[str], host_indices) -> List[bool]:
        ok = [False] * len(keys)
        if not keys:
            return ok
        ks, slots = [string_key(k) for k in keys], self.pages(keys, host_indices)
        tiers: list = []
        hits, ticket, _err = prefix_get(self.cache, ks, slots, tiers)
        end, shared = self._shared_run(ks, hits), None
        if end > hits:
            shared = self.engine.onboard(Tier.DISK, [Move(k, s) for k, s in zip(ks[hits:end], slots[hits:end])])
        ok[:end] = [True] * end
        for i in failed_moves(ticket):  # waits: the pages are in the host pool on return
            ok[i] = False
        for i in failed_moves(shared):
            ok[hits + i] = False
        # HiCache takes the pages before the first False (count_pool_hits,
        # _page_get_zero_copy): those are the hits; a page after a failed
        # one arrived in vain
        taken = ok.index(False) if False in ok[:end] else end
        with self._lock:
            for i in range(end):
                tier = tier_name(tiers[i]) if i < hits else "disk"
                (self.loaded if i < taken else self.failed)[tier] += 1
        return ok

    def set(self, keys: List[str], host_indices, priority: int) -> List[bool]:
        if not keys:
            return []
        if not self.writer:
            # HiCache backs replicated pages up on the writer rank only
            log.warning("kvferry: %s pool: %d pages not stored: this rank reads what the writer stores",
                        self.name, len(keys))
            return [False] * len(keys)
        pages = self.pages(keys, host_indices)
        t = self.cache.put([string_key(k) for k in keys], pages, priority)
        return [s == Status.OK for s in t.wait()]  # SGLang may reuse the pages on return


def _indices(t: PoolTransfer):
    return t.host_indices if t.host_indices is not None else []


class KvferryStorage(HiCacheStorage):
    """HiCacheStorage on kvferry, zero-copy: SGLang's v1 page interface
    (batch_exists, batch_get_v1, batch_set_v1) for the KV pool and its v2
    interface (batch_exists_v2, batch_get_v2, batch_set_v2) for every host
    pool HiCache registers (KV, Mamba, SWA, indexer...). Each pool is a
    kvferry Cache of its own, in a namespace of its own; a page is one
    block holding the page of every layer; its key is BLAKE2b-128
    of SGLang's page hash (SGLang's storage hash chain starts from the request's
    extra_key and cache_salt, so two tenants' pages never share a key). The
    namespace names the model, the pool, the host pool's dtype, page size
    and layout and the rank (TP unless replicated, PP, CP, DCP, attention
    DP): ranks never read each other's pages. A page that cannot be read
    back whole and checked is reported failed (False), never served."""

    def __init__(self, storage_config, kwargs: Optional[dict] = None):
        extra = dict(storage_config.extra_config or {})
        known = _SGLANG_KEYS + _ENGINE_KEYS + _CACHE_KEYS + _OWN_KEYS
        unknown = set(extra) - set(known)
        if unknown:
            raise make_error(Status.ERR_INVALID, f"KvferryStorage: unknown extra_config key(s) "
                             f"{', '.join(sorted(unknown))}; known: {', '.join(known)}")
        if not extra.get("interface_v1"):
            # without it HiCache calls the deprecated copy-through-a-tensor path
            raise make_error(Status.ERR_INVALID, "KvferryStorage: set \"interface_v1\": 1 in "
                             "--hicache-storage-backend-extra-config (kvferry moves pages in place)")
        check_settings(extra, "KvferryStorage")
        self.storage_config = storage_config
        self._extra = extra
        self._priority = int(extra.get("priority", 50))
        self._stores: Dict[str, _PoolStore] = {}
        self._metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._mlock = threading.Lock()
        self._calls: Dict[str, list] = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                                        "backup_bandwidth": []}

    # ---- setup ---------------------------------------------------------------------
    def _add(self, name: str, host_pool) -> _PoolStore:
        name = str(name)
        old = self._stores.get(name)
        if old is not None:
            if old.host_pool is not host_pool:
                raise make_error(Status.ERR_INVALID, f"KvferryStorage: a second {name} host pool "
                                 f"({type(host_pool).__name__}) registered")
            return old
        self._stores[name] = _PoolStore(name, host_pool, self.storage_config, self._extra)
        return self._stores[name]

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self._add(PoolName.KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._add(host_pool_name, host_pool)

    def close(self):
        stores, self._stores = self._stores, {}
        for s in stores.values():
            s.close()

    def _store(self, name=PoolName.KV) -> _PoolStore:
        s = self._stores.get(str(name))
        if s is None:
            raise make_error(Status.ERR_STATE, f"KvferryStorage: no {name} host pool registered")
        return s

    # the KV pool's, for callers and tests that look at one cache
    @property
    def engine(self) -> Optional[Engine]:
        s = self._stores.get(str(PoolName.KV))
        return s.engine if s else None

    @property
    def cache(self) -> Optional[Cache]:
        s = self._stores.get(str(PoolName.KV))
        return s.cache if s else None

    @property
    def _namespace(self) -> str:
        return self._store().namespace

    # ---- v1: the KV pool -------------------------------------------------------------
    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        return self._store().exists(keys) if keys else 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        return self._timed("prefetch", self._store(), keys, host_indices)

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        return self._timed("backup", self._store(), keys, host_indices)

    # ---- v2: every pool ----------------------------------------------------------------
    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info=None) -> PoolTransferResult:
        """The longest prefix of keys whose KV pages are stored and whose
        other pools' pages are stored as each transfer's hit policy asks
        (all pages of the prefix, or its trailing len(keys) pages)."""
        kv_pages = self.batch_exists(keys)
        hit = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            present = self._store(t.name).present(keys[:kv_pages])
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = present.index(False) if False in present else kv_pages
                ok = set(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(t.keys) if t.keys else 1)
                ok = {p for p in range(1, kv_pages + 1) if all(present[max(0, p - trailing):p])}
                boundary = max(ok, default=0)
            else:
                raise make_error(Status.ERR_UNSUPPORTED, f"KvferryStorage: {t.name} pool: hit policy "
                                 f"{t.hit_policy}; kvferry takes all_pages and trailing_pages")
            if boundary:
                hit[t.name] = boundary
            restorable = [p for p in restorable if p in ok]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit, restorable)

    def batch_get_v2(self, transfers: List[PoolTransfer], extra_info=None) -> Dict[str, List[bool]]:
        return {t.name: self._timed("prefetch", self._store(t.name), t.keys or [], _indices(t)) for t in transfers}

    def batch_set_v2(self, transfers: List[PoolTransfer], extra_info=None) -> Dict[str, List[bool]]:
        return {t.name: self._timed("backup", self._store(t.name), t.keys or [], _indices(t)) for t in transfers}

    # ---- metrics -------------------------------------------------------------------------
    def _timed(self, kind: str, store: _PoolStore, keys: List[str], host_indices) -> List[bool]:
        """A load (prefetch) or store (backup) of one pool's pages, with
        SGLang's per-call metrics when they are on."""
        t0 = time.perf_counter()
        if kind == "prefetch":
            ok = store.get(keys, host_indices)
        else:
            ok = store.set(keys, host_indices, self._priority)
        if self._metrics and keys:
            dt = max(time.perf_counter() - t0, 1e-9)
            with self._mlock:
                self._calls[f"{kind}_pgs"].append(len(keys))
                self._calls[f"{kind}_bandwidth"].append(sum(ok) * store.page_bytes / 1e9 / dt)
        return ok

    def get_stats(self):
        """SGLang's StorageMetrics for the calls since the last get_stats
        (pages per call, GB/s), and kvferry's own since the last call:
        loaded_pages_by_tier, the KV pages HiCache took from a load (those
        before its first failed page) by the tier they came from (host,
        disk, remote); failed_pages_by_tier, the KV pages a lookup found
        whose load failed or came after a failed one, by the tier the
        lookup found them in, never among the loaded; both per pool in
        pool_loaded_pages_by_tier and pool_failed_pages_by_tier; and each
        pool's kvferry CacheStats in cache_stats (the cache's own counters:
        its hits are lookups that found a page, batch_exists' and each
        get's, whatever the load then did)."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        m = StorageMetrics()
        with self._mlock:
            for k, v in self._calls.items():
                getattr(m, k).extend(v)
                v.clear()
        loaded, failed = {}, {}
        for name, s in self._stores.items():
            with s._lock:
                loaded[name], failed[name] = dict(s.loaded), dict(s.failed)
                s.loaded.clear()
                s.failed.clear()
        m.pool_loaded_pages_by_tier = loaded
        m.loaded_pages_by_tier = loaded.get(str(PoolName.KV), {})
        m.pool_failed_pages_by_tier = failed
        m.failed_pages_by_tier = failed.get(str(PoolName.KV), {})
        m.cache_stats = {name: s.cache.stats() for name, s in self._stores.items()}
        return m

    # The copy-through-a-tensor interface (batch_get / batch_set) is not
    # served: __init__ requires interface_v1, so HiCache never calls these.
    def _v0(self, name):
        raise NotImplementedError(f"KvferryStorage.{name}: kvferry serves the zero-copy interface only "
                                  f"(interface_v1 = 1)")

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        self._v0("get")

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        self._v0("batch_get")

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        self._v0("set")

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        self._v0("batch_set")
