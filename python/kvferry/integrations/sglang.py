# SPDX-License-Identifier: Apache-2.0
"""A SGLang HiCache storage backend (the L3 tier below HiCache's host
memory pool) on a kvferry Cache: pages go between SGLang's host pool, which
kvferry registers as its primary pools, and kvferry's disk and remote tiers
(and, if asked, a host tier of its own). Importing this module imports
SGLang.

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
        '{"backend_name": "kvferry", "module_path": "kvferry.integrations.sglang",
          "class_name": "KvferryStorage", "interface_v1": 1,
          "file_dir": "/mnt/nvme/kv", "disk_bytes": "512GiB"}'

docs/integrations/sglang.md has the settings and what was tested."""

import logging
from typing import Any, List, Optional

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from .._cache import Cache
from .._engine import Engine
from .._enums import Backend, CacheRemote, Memory, Status
from .._errors import make_error
from ._serving import add_pools, failed_moves, namespace, prefix_get, string_key, tensor_pools

log = logging.getLogger("kvferry.integrations.sglang")

_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
_ENGINE_KEYS = ("file_dir", "remote_url", "threads", "config_file", "file_io", "fsync")
_CACHE_KEYS = ("host_blocks", "host_bytes", "disk_blocks", "disk_bytes", "remote", "offload_min_priority",
               "disk_admit_uses")
_OWN_KEYS = ("namespace", "priority")


def _page_view(buf, layout: str, page_size: int):
    """(view, block dim): the host pool's buffer with a dimension that
    indexes pages. MHA buffers lead with K/V (2); MLA ones do not."""
    direct = layout in ("page_first_direct", "page_head")
    mha = buf.dim() == (6 if direct else 5)
    lead = 1 if mha else 0
    if direct:
        return buf, lead
    if layout == "layer_first":
        tok = lead + 1
    elif layout == "page_first":
        tok = lead
    else:
        raise make_error(Status.ERR_UNSUPPORTED, f"SGLang host pool layout {layout!r}: kvferry takes layer_first, "
                         f"page_first, page_first_direct and page_head")
    shape = list(buf.shape)
    if shape[tok] % page_size:
        raise make_error(Status.ERR_INVALID, f"SGLang host pool: {shape[tok]} tokens are not whole pages of {page_size}")
    view = buf.view(*shape[:tok], shape[tok] // page_size, page_size, *shape[tok + 1:])
    return view, tok


def rank_namespace(c, extra, dtype: str, page_size: int, layout: str) -> str:
    """The namespace of one rank's pages: every dimension that changes a
    page's bytes (the model or the configured namespace, the host pool's
    element type, page size and layout, the TP rank, PP stage, attention CP
    rank, DCP rank and attention-DP rank)."""
    model = extra.get("namespace") or (c.model_name or "model").rstrip("/").rsplit("/", 1)[-1]
    dcp = int(getattr(c, "dcp_size", 1) or 1)
    tp = f"{'mla-' if c.is_mla_model else ''}tp{c.tp_rank}of{c.tp_size}" if c.tp_size > 1 else (
        "mla" if c.is_mla_model else None)
    return namespace(
        "sglang", model, dtype, f"ps{page_size}", layout.replace("_", ""), tp,
        f"pp{c.pp_rank}of{c.pp_size}" if c.pp_size > 1 else None,
        f"cp{c.attn_cp_rank}of{c.attn_cp_size}" if getattr(c, "attn_cp_size", 1) > 1 else None,
        f"dcp{int(getattr(c, 'dcp_rank', 0))}of{dcp}" if dcp > 1 else None,
        f"dp{c.dp_rank}" if getattr(c, "dp_rank", 0) else None)


class KvferryStorage(HiCacheStorage):
    """HiCacheStorage on kvferry, zero-copy (SGLang's v1 page interface:
    batch_exists, batch_get_v1, batch_set_v1). A page is one kvferry block
    holding the page of every layer, K and V; its key is XXH64 of SGLang's
    page hash (SGLang's storage hash chain starts from the request's
    extra_key and cache_salt, so two tenants' pages never share a key). The
    namespace names the model, the host pool's dtype, page size and layout
    and the rank (TP, PP, CP, DCP, attention DP): ranks never read each
    other's pages. Every rank stores and loads its own pages, MLA ones
    included, so that each rank's batch_exists answers from what it holds
    and HiCache's minimum over ranks hits. A page that cannot be read back
    whole and checked is reported failed (False), never served."""

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
        self.storage_config = storage_config
        self._extra = extra
        self._priority = int(extra.get("priority", 50))
        self._namespace = ""
        self.engine: Optional[Engine] = None
        self.cache: Optional[Cache] = None
        self._page_size = 0

    # ---- setup ---------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        if self.engine is not None:
            return
        buf = mem_pool_host.kv_buffer
        if buf is None or isinstance(buf, (list, tuple)):
            raise make_error(Status.ERR_UNSUPPORTED, f"KvferryStorage: {type(mem_pool_host).__name__} has no single "
                             f"host KV buffer (kvferry takes MHA and MLA host pools)")
        self._page_size = int(mem_pool_host.page_size)
        view, block_dim = _page_view(buf, mem_pool_host.layout, self._page_size)
        pools = tensor_pools(view, block_dim, self._page_size, f"SGLang host pool ({mem_pool_host.layout})")
        self._namespace = rank_namespace(self.storage_config, self._extra, str(buf.dtype).rsplit(".", 1)[-1],
                                         self._page_size, mem_pool_host.layout)
        ekw = {k: self._extra[k] for k in _ENGINE_KEYS if k in self._extra}
        ckw = {k: self._extra[k] for k in _CACHE_KEYS if k in self._extra}
        if "remote" in ckw:
            ckw["remote"] = CacheRemote[str(ckw["remote"]).upper()]
        host = int(ckw.get("host_blocks", 0))
        if "host_bytes" in ckw:
            from .._cache import size_parse

            host = size_parse(ckw.pop("host_bytes")) // sum(p.geometry.block_bytes for p in pools)
            ckw["host_blocks"] = host
        self.engine = Engine(backend=Backend.HOST, file_namespace=self._namespace, **ekw)
        log.info("kvferry: SGLang rank namespace %s", self._namespace)
        try:
            # page-locked or not, the host backend copies it as host memory
            add_pools(self.engine, pools, host, Memory.HOST)
            self.cache = Cache(self.engine, **ckw)
        except BaseException:
            self.engine.close()
            self.engine = None
            raise

    def close(self):
        if self.engine is not None:
            self.engine.close()
        self.engine = self.cache = None

    # ---- pages ---------------------------------------------------------------------
    def _pages(self, keys: List[str], host_indices) -> List[int]:
        ps = self._page_size
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) != len(keys) * ps:
            raise make_error(Status.ERR_INVALID, f"KvferryStorage: {len(keys)} keys but {len(idx)} host indices "
                             f"(page size {ps})")
        pages = []
        for i in range(len(keys)):
            first = int(idx[i * ps])
            if first % ps or idx[i * ps:(i + 1) * ps] != list(range(first, first + ps)):
                raise make_error(Status.ERR_INVALID, f"KvferryStorage: key {keys[i]}: host indices {first}.. "
                                 f"are not one whole page")
            pages.append(first // ps)
        return pages

    def _ready(self):
        if self.cache is None:
            raise make_error(Status.ERR_STATE, "KvferryStorage: no host pool registered yet")
        return self.cache

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        if not keys:
            return 0
        hits, _ = self._ready().lookup([string_key(k) for k in keys])
        return hits

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        ok = [False] * len(keys)
        if not keys:
            return ok
        hits, ticket, _err = prefix_get(self._ready(), [string_key(k) for k in keys], self._pages(keys, host_indices))
        ok[:hits] = [True] * hits
        for i in failed_moves(ticket):  # waits: the pages are in the host pool on return
            ok[i] = False
        return ok

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        if not keys:
            return []
        pages = self._pages(keys, host_indices)
        t = self._ready().put([string_key(k) for k in keys], pages, self._priority)
        return [s == Status.OK for s in t.wait()]  # SGLang may reuse the pages on return

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
