# SPDX-License-Identifier: Apache-2.0
"""A vLLM KV connector (KVConnectorBase_V1) whose store is a kvferry Cache:
prompt blocks are saved by content key into kvferry's host, disk and remote
tiers and loaded back, layer by layer, into the blocks vLLM allocates.
A block's key is taken from vLLM's own block hash (which covers the tokens,
cache_salt, LoRA, multimodal inputs and prompt embeddings), prompt and
generated blocks alike; the namespace names the model, the KV dtype, the
block size, the layout and the worker's ranks. Importing this module
imports vLLM (its map from vLLM's KV cache to pools, slots and keys,
_vllm_kv, does not).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvferryConnector",
        "kv_connector_module_path": "kvferry.integrations.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"host_bytes": "32GiB", "disk_bytes": "512GiB",
                                      "file_dir": "/mnt/nvme/kv"}}'

docs/integrations/vllm.md has the settings and what was tested."""

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole,
                                                              KVConnectorTransferResults, KVConnectorWorkerMetadata,
                                                              SupportsHMA)

import threading

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from .._cache import Cache, key_salt, size_parse
from .._engine import Engine
from .._dir import dir_list, dir_namespaces
from .._enums import Backend, CacheRemote, EventKind, Status, Tier
from .._errors import KvferryError, make_error
from .._plan import MIN_GAIN, Prefill, check_cost_args, plan_compute
from ._saver import Save, Saver
from ._serving import add_pools, backend_for, check_settings, failed_moves, namespace
from ._vllm_kv import (_Group, block_key, cut_kv_caches, first_needed, group_loads, held_prefixes, kv_groups,
                       tensor_ident, unique_pools, wait_layer)

log = logging.getLogger("kvferry.integrations.vllm")

# kv_connector_extra_config keys: the Engine's and the Cache's settings by
# their kvferry names, and the connector's own.
_ENGINE_KEYS = ("file_dir", "remote_url", "threads", "config_file", "file_io", "fsync")
_CACHE_KEYS = ("host_blocks", "host_bytes", "disk_blocks", "disk_bytes", "remote", "offload_min_priority",
               "disk_admit_uses")
_OWN_KEYS = ("namespace", "salt", "priority", "prefill_cost", "plan_min_gain", "tier_costs", "load")
# "load": each layer's blocks waited for as the forward reaches the layer
# (needs piecewise CUDA graphs), all of them before the forward, or
# between steps (vLLM's asynchronous loads: the request waits, unscheduled,
# until get_finished reports its blocks in place)
_LOADS = ("layerwise", "whole", "async")

# A worker's place among the instance's workers: (tensor-parallel rank,
# pipeline stage, prefill-context rank). Each has a cache of its own.
_Rank = Tuple[int, int, int]

# What the worker tells the scheduler's planner: (bytes of one block of
# every layer, {tier: (latency_s, bytes_per_s)}, tiers that load layer by layer)
_Link = Tuple[int, Dict[int, Tuple[float, float]], Tuple[int, ...], Tuple[Tuple[int, int], ...]]


@dataclass
class KvferryConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker, one step: blocks to load before the forward
    (per request: content keys and vLLM block ids), blocks to save after
    (and the request each belongs to), and the preempted requests whose
    saves must finish before their blocks are written again."""

    loads: List[Tuple[str, List[int], List[int]]] = field(default_factory=list)
    save_keys: List[int] = field(default_factory=list)
    save_blocks: List[int] = field(default_factory=list)
    save_reqs: List[str] = field(default_factory=list)
    # per save: vLLM frees the block before the request ends (a sliding-
    # window block leaving the window): its save must finish before the
    # next step can write the block again
    save_transient: List[bool] = field(default_factory=list)
    preempted: List[str] = field(default_factory=list)


# a step with nothing to load, save or wait for (never changed: the
# worker only reads metadata)
_NOTHING = KvferryConnectorMetadata()


@dataclass
class KvferryWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler, one step: per worker (its _Rank), what entered
    and left its cache, [(EventKind, key, tier)] in order, every event (the
    cache hands them over through a callback into an unbounded list, never
    a queue that drops), so the scheduler's lookups see it; when they
    changed, the read costs its plans use (link); and the loads that ended
    this step, [(request, blocks of its hit that count)] (_ALL: every
    one arrived; n: vLLM recomputes from the hit's block n on), so that
    the scheduler counts as hits only what was loaded."""

    events: Dict[_Rank, List[Tuple[int, int, int]]] = field(default_factory=dict)
    link: Optional[_Link] = None
    loads: Dict[_Rank, List[Tuple[str, int]]] = field(default_factory=dict)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        if isinstance(other, KvferryWorkerMetadata):
            events = {r: list(e) for r, e in self.events.items()}
            for r, e in other.events.items():
                events.setdefault(r, []).extend(e)
            loads = {r: list(o) for r, o in self.loads.items()}
            for r, o in other.loads.items():
                loads.setdefault(r, []).extend(o)
            return KvferryWorkerMetadata(events, _slower(self.link, other.link), loads)
        return self


_ALL = -1  # a load outcome: every block of the hit arrived


class KvferryStats(KVConnectorStats):
    """The connector's counters for one interval (vLLM's KVConnectorStats):
    {name: count}, names as in _STAT_HELP, summed across workers and the
    scheduler."""

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for k, v in (other.data if other is not None else {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


# Prometheus counters (vllm:kvferry_<name>_total) from the stats' names; a
# <name>_<tier> name of a _TIERED counter is that counter with a tier label
_STAT_HELP = {"hit_tokens": "Prompt tokens loaded from kvferry, by the tier that held them",
              "load_failed_tokens": "Prompt tokens a kvferry lookup found whose load then failed (vLLM "
                                    "recomputed them; never hits), by the tier that held them",
              "load_failed_requests": "Requests whose kvferry load failed in part or whole",
              "loaded_blocks": "Blocks kvferry loaded into vLLM's KV cache",
              "load_failed_blocks": "Blocks a kvferry load failed (vLLM recomputed them)",
              "saved_blocks": "Blocks kvferry saved from vLLM's KV cache"}
_TIERED = ("hit_tokens", "load_failed_tokens")


class KvferryPromMetrics(KVConnectorPromMetrics):
    """The stats as Prometheus counters on vLLM's /metrics, per engine."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {
            name: self._counter_cls(name=f"vllm:kvferry_{name}", documentation=doc,
                                    labelnames=labelnames + (["tier"] if name in _TIERED else []))
            for name, doc in _STAT_HELP.items()}

    def observe(self, transfer_stats_data, engine_idx: int = 0):
        labels = self.per_engine_labelvalues[engine_idx]
        for key, n in (transfer_stats_data or {}).items():
            tiered = next((t for t in _TIERED if key.startswith(t + "_")), None)
            if tiered is not None:
                self._counters[tiered].labels(*labels, key[len(tiered) + 1:]).inc(n)
            elif key in self._counters:
                self._counters[key].labels(*labels).inc(n)


def _kv_dtype_name(vllm_config) -> str:
    """The KV cache's element type: cache_dtype, or the model's when it is
    "auto" (the cache then holds the model dtype)."""
    dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto") or "auto")
    if dtype == "auto" and vllm_config.model_config is not None:
        dtype = str(getattr(vllm_config.model_config, "dtype", "auto")).rsplit(".", 1)[-1]
    return dtype


def namespace_head(vllm_config, extra, rank: _Rank, dcp_rank: int) -> str:
    """The part of a worker's namespace the scheduler can name too: every
    dimension that changes a page's bytes and is known from the config
    (model, KV dtype, block size, TP rank and size unless MLA, where ranks
    hold equal pages, PP stage, prefill- and decode-context rank). The
    worker appends the layout it finds in its KV tensors."""
    par = vllm_config.parallel_config
    mc = vllm_config.model_config
    tp_rank, pp_rank, pcp_rank = rank
    tp, pp = int(par.tensor_parallel_size), int(par.pipeline_parallel_size)
    pcp = int(getattr(par, "prefill_context_parallel_size", 1) or 1)
    dcp = int(getattr(par, "decode_context_parallel_size", 1) or 1)
    mla = bool(getattr(mc, "use_mla", False)) if mc is not None else False
    model = extra.get("namespace") or (str(getattr(mc, "model", None) or "model")).rstrip("/").rsplit("/", 1)[-1]
    return namespace(
        "vllm", model, _kv_dtype_name(vllm_config), f"bs{int(vllm_config.cache_config.block_size)}",
        f"tp{tp_rank}of{tp}" if tp > 1 and not mla else None,
        f"pp{pp_rank}of{pp}" if pp > 1 else None,
        f"pcp{pcp_rank}of{pcp}" if pcp > 1 else None,
        f"dcp{dcp_rank}of{dcp}" if dcp > 1 else None, limit=_HEAD_LEN)


_HEAD_LEN = 54  # + "-L" and 8 hex digits of the layout: 64, the namespace limit


def _ranks(vllm_config) -> List[_Rank]:
    """Every worker of the instance (one data-parallel engine)."""
    par = vllm_config.parallel_config
    pcp = int(getattr(par, "prefill_context_parallel_size", 1) or 1)
    return [(t, p, c) for p in range(int(par.pipeline_parallel_size)) for c in range(pcp)
            for t in range(int(par.tensor_parallel_size))]


def _dcp_rank_of(vllm_config, tp_rank: int) -> int:
    """The decode-context rank of a TP rank: vLLM groups consecutive TP
    ranks into decode-context groups of decode_context_parallel_size."""
    dcp = int(getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1) or 1)
    return tp_rank % dcp


def layout_tag(kv_caches) -> str:
    """'L' and 8 hex digits naming how the worker's KV tensors lay a block
    out: each distinct tensor's dtype, its shape with the block count left
    out and the order of its strides. Two attention backends whose blocks
    have the same size but not the same byte order (NHD / HND, K/V first or
    blocks first) never share a namespace."""
    seen, parts = set(), []
    for t in kv_caches.values():
        ident = (t.data_ptr(), tuple(t.shape))
        if ident in seen:
            continue
        seen.add(ident)
        order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
        parts.append(f"{t.dtype}:{tuple(t.shape)[1:] if t.dim() else ()}:{tuple(order)}:{len(t.shape)}")
    return f"L{key_salt('|'.join(parts)) & 0xFFFFFFFF:08x}"


def _slower(a: Optional[_Link], b: Optional[_Link]) -> Optional[_Link]:
    """Two ranks' links as one: a step waits for its slowest rank, so per
    tier the larger latency and the lower throughput."""
    if a is None or b is None:
        return a if b is None else b
    costs = {t: (max(a[1][t][0], b[1][t][0]), min(a[1][t][1], b[1][t][1])) if t in b[1] else a[1][t]
             for t in a[1]}
    layerwise = tuple(t for t in a[2] if t in b[2])
    # per tier the coarser arrival: fewer steps (0: a step per layer, the finest)
    sa, sb = dict(a[3]), dict(b[3])
    steps = tuple((t, min((s for s in (sa.get(t, 0), sb.get(t, 0)) if s), default=0)) for t in layerwise)
    return max(a[0], b[0]), {**b[1], **costs}, layerwise, steps


def _prefill_cost(extra, layers: int) -> Optional[Prefill]:
    """The planner's prefill cost from kv_connector_extra_config, checked:
    prefill_cost is [[tokens, seconds], ...] full prefills or the mapping
    {"new_tokens", "prefix_tokens", "seconds"} (kvferry.Prefill)."""
    if "prefill_cost" not in extra:
        if "plan_min_gain" in extra:
            raise make_error(Status.ERR_INVALID, "KvferryConnector: plan_min_gain without prefill_cost")
        return None
    cost = extra["prefill_cost"]
    if isinstance(cost, (list, tuple)):
        cost = [tuple(p) for p in cost]
    gain = extra.get("plan_min_gain", MIN_GAIN)
    # the connector computes a request's tokens after its loaded blocks
    # only, and loads them layer by layer: no front shape, overlap counted
    # for the tiers the worker reports layer-wise
    return Prefill(cost, layers=layers, overlap=True, min_gain=gain, leading_only=True)


def _tier_costs(extra) -> Dict[Tier, Tuple[float, float]]:
    """tier_costs {"disk": [latency_s, bytes_per_s], ...}: held costs."""
    out = {}
    for name, v in dict(extra.get("tier_costs") or {}).items():
        try:
            tier = Tier[str(name).upper()]
            lat, bw = v
        except (KeyError, TypeError, ValueError):
            raise make_error(Status.ERR_INVALID, f"KvferryConnector: tier_costs {name!r}: {v!r} (want a tier "
                             f"name: [latency_s, bytes_per_s])") from None
        out[tier] = check_cost_args(lat, bw)
    return out


@dataclass
class _Request:
    block_ids: List[List[int]]  # per KV cache group
    saved: List[int]  # per group, leading blocks already saved or found stored
    next_whole: int = 0  # tokens computed that make the next block whole: (min(saved) + 1) * block size


class KvferryConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector on kvferry. The scheduler side answers lookups
    from the keys the workers report stored (their cache's events); the
    worker side owns the Engine (vLLM's KV tensors as its primary pools) and
    the Cache. Every KV cache group of a hybrid model is served (vLLM's
    hybrid manager stays on): full attention and MLA as one block per key,
    sliding-window groups loading only the blocks the window reaches, Mamba
    / linear-attention state groups (vLLM's align mode) the states vLLM
    hands over, keyed by the block each ends, a hit loading the state at
    its end. Loads are synchronous in vLLM's sense (this step's forward
    waits for them, per layer or whole) or asynchronous (`load: async`,
    which state groups need); a block that does not arrive is reported by
    get_block_ids_with_load_errors and vLLM recomputes from it (an
    asynchronous load of a model of several groups fails its request
    whole: failed_recving). Saves are queued to a saver thread. With a prefill cost configured, the scheduler reports
    only the hits its load-or-recompute plan loads (docs/planner.md)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        unknown = set(extra) - set(_ENGINE_KEYS + _CACHE_KEYS + _OWN_KEYS)
        if unknown:
            raise make_error(Status.ERR_INVALID, f"KvferryConnector: unknown kv_connector_extra_config key(s) "
                             f"{', '.join(sorted(unknown))}; known: {', '.join(_ENGINE_KEYS + _CACHE_KEYS + _OWN_KEYS)}")
        self._extra = extra
        self._check_config(extra)
        self._vllm_config = vllm_config
        self._block_size = int(vllm_config.cache_config.block_size)
        # the model, dtype and ranks are in the namespace; `salt` in every key
        self._salt = key_salt(str(extra["salt"])) if extra.get("salt") else 0
        self._priority = int(extra.get("priority", 50))
        self._groups = kv_groups(kv_cache_config, self._block_size, self._salt)
        states = [g for g in self._groups if g.state]
        # a model of several KV cache groups loads asynchronously: vLLM 0.32
        # maps a failed synchronous load's block ids (invalid_block_ids) to
        # requests for models of one group only and stops its engine with a
        # RuntimeError for more, while a failed asynchronous load is
        # reported by request (failed_recving, _fail_requests) and
        # recomputed. A hit that fails must be recovered, so a synchronous
        # setting for such a model is refused, not warned about.
        several = len(self._groups) > 1 or bool(states)
        self._load_mode = extra.get("load") or ("async" if several else "layerwise")
        self._layerwise = self._load_mode == "layerwise"
        if states and self._load_mode != "async":
            # vLLM copies a Mamba hit's state into the request's running
            # block before the step's forward, so before start_load_kv: a
            # synchronous load would land after that copy
            raise make_error(Status.ERR_INVALID, f"KvferryConnector: load = {self._load_mode!r} with KV cache group "
                             f"{states[0].index} (MambaSpec): vLLM copies a Mamba hit's state before a step's loads "
                             f"start; a model with Mamba / linear-attention groups needs load: async")
        if several and self._load_mode != "async":
            raise make_error(Status.ERR_INVALID, f"KvferryConnector: load = {self._load_mode!r} on a model of "
                             f"{len(self._groups)} KV cache groups: vLLM cannot recompute a synchronous load of "
                             f"several groups that fails (a block damaged or evicted between lookup and load stops "
                             f"its engine); set load: async in kv_connector_extra_config, or leave load unset")
        # the layers of state groups: their tensors are raw bytes, cut by page
        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
        self._state_layers = frozenset(n for g in states for n in groups[g.index].layer_names)
        # an asynchronous load that fails anywhere fails its whole request
        # (vLLM recomputes it from its start: failed_recving) where a
        # failed block cannot be reported: vLLM maps block ids to requests
        # with one group only, and a prefix cut short at a state group's
        # block has no state to go on from
        self._fail_requests = len(self._groups) > 1 or bool(states)
        self._prefill = _prefill_cost(extra, _model_layers(vllm_config))
        self._held_costs = _tier_costs(extra)
        # scheduler side: per worker, key -> the tier it holds the block in
        self._ranks = _ranks(vllm_config)
        self._stored: Dict[_Rank, Dict[int, int]] = {r: {} for r in self._ranks}
        self._live: Dict[str, object] = {}  # vLLM's Request objects, by id
        self._req_keys: Dict[str, List[List[int]]] = {}  # their keys so far, per group
        self._link: Optional[_Link] = None
        # hits the plans loaded and recomputed (blocks), requests planned
        self.plan_counts = {"loaded": 0, "recomputed": 0, "planned": 0}
        self._requests: Dict[str, _Request] = {}
        self._matched: Dict[str, Tuple[int, List[List[int]]]] = {}  # req -> (local tokens, keys per group)
        self._loads: List[Tuple[str, List[int], List[int]]] = []
        self._saving: Set[str] = set()  # requests with saves vLLM must wait for when they finish
        self._hit_tiers: Dict[str, Dict[Tier, int]] = {}  # request -> tokens it loads, by tier
        # keys queued for saving that no worker has reported stored (nor
        # failed) yet: hits already, the worker's load waits for the save
        self._in_flight: Set[int] = set()
        self._loading: Set[str] = set()  # requests whose asynchronous load is not reported done
        self._no_hits: Set[str] = set()  # requests whose load failed as a whole: computed, never loaded again
        # whose hits count per tier: a full-attention group's, else a state group's
        self._tier_group = next((g.index for g in self._groups if not g.window and not g.state),
                                next((g.index for g in self._groups if g.state), 0))
        # per request whose load is under way: the tier of each block of its
        # hit (of _tier_group) and the workers yet to report how it ended
        self._pending_hits: Dict[str, Tuple[List[Tier], Set[_Rank], List[int]]] = {}
        # since the last stats: hit_tokens_<tier> (loaded), load_failed_tokens_<tier>, load_failed_requests
        self._hit_counts: Dict[str, int] = {}
        # vLLM's KV events, when its config asks for them: per key being
        # saved, (block hash, parent hash, tokens, LoRA id, LoRA name, group)
        ev = getattr(vllm_config, "kv_events_config", None)
        self._events_on = bool(ev is not None and getattr(ev, "enable_kv_cache_events", False))
        self._block_info: Dict[int, tuple] = {}
        self._kv_events: list = []
        # worker side
        self.engine: Optional[Engine] = None
        self.cache: Optional[Cache] = None
        self._layer_pools: Dict[str, List[int]] = {}
        self._pool_order: List[int] = []  # layer order: the order a layer-wise load lands in
        self._load_ticket = None
        self._load_slots: List[int] = []
        self._load_errors: Set[int] = set()
        # (ticket or None, request, its slots in the get, its hit's blocks in order)
        self._async_loads: List[Tuple[object, str, List[int], List[int]]] = []
        self._bad: Dict[str, Set[int]] = {}  # an asynchronous load's blocks that did not arrive, by request
        self._sync_ids: List[Tuple[str, List[int]]] = []  # this step's synchronous loads: (request, blocks)
        self._outcomes: List[Tuple[str, int]] = []  # loads ended since the last worker metadata
        self._load_failed: Set[str] = set()  # asynchronous loads that failed somewhere (_fail_requests)
        self._failed_recving: Set[str] = set()  # of those, the ones get_finished reports done now
        self._transient: List[Save] = []  # saves of blocks vLLM frees before the next step
        self._counts: Dict[str, int] = {}  # blocks moved since the last stats
        self._events: List[Tuple[int, int, int]] = []
        self._events_lock = threading.Lock()
        self._rank: _Rank = (0, 0, 0)
        self._namespace = ""
        self._block_bytes = 0
        self._sent_link: Optional[_Link] = None
        self._costs_moved = True  # a load landed (or none was sent yet): the link may have changed
        # saves queued or in flight (the saver thread issues them); per
        # request, its saves not yet done; the finished requests waiting
        self._saver: Optional[Saver] = None
        self._saves: List[Save] = []
        self._save_count: Dict[str, int] = {}
        self._saved_reqs: Set[str] = set()  # every request a save was queued for: vLLM holds its blocks
        self._finished_waiting: Set[str] = set()
        if role == KVConnectorRole.SCHEDULER:
            self._scan_stores()

    def _check_config(self, extra):
        """Refuses at start what would be wrong later, naming the setting."""
        policy = getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute")
        if policy != "recompute":
            # a lookup that said hit and a load that then failed (a block
            # evicted or damaged in between) must be recomputed, not fail
            # the request
            raise make_error(Status.ERR_INVALID, f"KvferryConnector: kv_transfer_config.kv_load_failure_policy is "
                             f"{policy!r}; kvferry needs \"recompute\" (a block the lookup found can be evicted "
                             f"or found damaged before it loads)")
        if extra.get("load", "layerwise") not in _LOADS:
            raise make_error(Status.ERR_INVALID, f"KvferryConnector: load = {extra['load']!r} (want one of "
                             f"{', '.join(_LOADS)})")
        check_settings(extra, "KvferryConnector")
        _tier_costs(extra)

    def _scan_stores(self):
        """What the shared disk directory holds for each worker, read by the
        scheduler itself (block headers only): a restarted instance serves
        its first request from disk. Namespaces of another layout under the
        same head are taken too: a block they name that the worker's own
        namespace lacks fails its load and is recomputed, never read."""
        file_dir = self._extra.get("file_dir")
        if not file_dir:
            return
        try:
            names = dir_namespaces(file_dir)
        except KvferryError:
            return  # no directory yet: nothing stored
        for r in self._ranks:
            head = namespace_head(self._vllm_config, self._extra, r, _dcp_rank_of(self._vllm_config, r[0]))
            for ns in names:
                if ns.startswith(head + "-L") and len(ns) == len(head) + 10:
                    try:
                        for b in dir_list(file_dir, ns):
                            self._stored[r][b.key] = int(Tier.DISK)
                    except KvferryError as exc:
                        log.warning("kvferry: %s/%s not listed: %s", file_dir, ns, exc)
    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a save that never happens is a later miss

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        # wait_for_layer_load must run between graph pieces, never be
        # skipped in a replay; whole loads finish before the forward
        return dict(extra_config or {}).get("load", "layerwise") == "layerwise"

    # ---- keys ----------------------------------------------------------------------
    def _keys(self, request) -> List[List[int]]:
        """Per KV cache group, the keys of the request's whole blocks so far
        (prompt and generated), from vLLM's block hashes, extended as they
        grow."""
        hashes = request.block_hashes
        if len(hashes) and len(hashes) != request.num_tokens // self._block_size:
            raise make_error(Status.ERR_UNSUPPORTED, f"KvferryConnector: request {request.request_id}: "
                             f"{len(hashes)} block hashes for {request.num_tokens} tokens in blocks of "
                             f"{self._block_size} (vLLM hashes at another block size)")
        keys = self._req_keys.setdefault(request.request_id, [[] for _ in self._groups])
        have = len(keys[0])
        for g, gkeys in zip(self._groups, keys):
            gkeys.extend(block_key(h, g.salt) for h in hashes[have:])
        return keys

    def _held(self, key: int) -> bool:
        """Whether every worker holds the block (each loads its own part),
        or will once the save in flight completes."""
        return key in self._in_flight or all(key in s for s in self._stored.values())

    def _tier(self, key: int) -> Tier:
        """The slowest tier a worker holds the block in (disk while saving)."""
        tiers = [s[key] for s in self._stored.values() if key in s]
        return Tier(max(tiers)) if len(tiers) == len(self._stored) else Tier.DISK

    def _first_needed(self, g: _Group, blocks: int, local: int) -> int:
        """The first block of group g a hit of `blocks` blocks must bring
        (vLLM already holds those before `local`): 0 for full attention;
        for a sliding window, the first its window reaches from the hit's
        end, as vLLM's own manager for the group counts it (the blocks
        before it stay null in vLLM's block table)."""
        m = self._kv_cache_manager
        skipped = None
        if g.window and m is not None:
            skipped = m.coordinator.single_type_managers[g.index].get_num_skipped_tokens
        return first_needed(g, blocks, local, self._block_size, skipped)

    # ---- scheduler side --------------------------------------------------------------
    def on_new_request(self, request) -> None:
        self._live[request.request_id] = request

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        self._live[request.request_id] = request
        if self._no_hits and request.request_id in self._no_hits:
            return 0, False
        keys = self._keys(request)
        # the last token is always computed, for its logits
        limit = min(len(keys[0]), (request.num_tokens - 1) // self._block_size)
        local = num_computed_tokens // self._block_size
        full = [k for g, k in zip(self._groups, keys) if not g.window and not g.state]
        hits = local
        while hits < limit and all(self._held(k[hits]) for k in full):
            hits += 1
        # the longest hit whose sliding windows and states at its end are held too
        while hits > local and not all(self._held(k) for g, gk in zip(self._groups, keys) if g.window or g.state
                                       for k in gk[self._first_needed(g, hits, local):hits]):
            hits -= 1
        if hits > local and self._prefill is not None and self._link is not None:
            hits = self._planned((full or keys)[0][:hits], request.num_tokens, local)
        self._matched[request.request_id] = (num_computed_tokens, keys)
        tokens = max(0, hits * self._block_size - num_computed_tokens)
        return tokens, bool(tokens) and self._load_mode == "async"

    def _planned(self, keys: List[int], request_tokens: int, local: int) -> int:
        """The hits the plan loads (at least vLLM's own `local` ones, which
        are in GPU memory already); every hit if planning fails."""
        block_bytes, costs, layerwise, steps = self._link
        tiers = [Tier.GPU] * local + [self._tier(k) for k in keys[local:]]
        try:
            p = plan_compute(tiers, block_bytes, self._block_size, request_tokens, costs, self._prefill,
                             layerwise_tiers=layerwise, arrival_steps=dict(steps))
        except KvferryError as exc:
            log.warning("kvferry: plan of %d hits failed, loading them all: %s", len(keys), exc)
            return len(keys)
        load = max(p.load_blocks, local)
        self.plan_counts["planned"] += 1
        self.plan_counts["loaded"] += load - local
        self.plan_counts["recomputed"] += len(keys) - load
        if load < len(keys):
            log.debug("kvferry: loading %d of %d hits (predicted ttft %.1f ms; recompute all %.1f, load all "
                      "%.1f)", load - local, len(keys) - local, p.ttft_s * 1e3, p.ttft_recompute_s * 1e3,
                      p.ttft_load_all_s * 1e3)
        return load

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        if num_external_tokens <= 0 or request.request_id not in self._matched:
            return
        local, keys = self._matched.pop(request.request_id)
        first = local // self._block_size
        end = first + num_external_tokens // self._block_size
        for k, ids in group_loads(self._groups, keys, blocks.get_block_ids(), first, end, self._null_block(),
                                  self._first_needed):
            self._loads.append((request.request_id, k, ids))
        tiers = [self._tier(k) for k in keys[self._tier_group][first:end]]
        by_tier: Dict[Tier, int] = {}
        for t in tiers:
            by_tier[t] = by_tier.get(t, 0) + self._block_size
        self._hit_tiers[request.request_id] = by_tier
        # counted once every worker says how the load ended (update_connector_output)
        self._pending_hits[request.request_id] = (tiers, set(self._ranks), [len(tiers)])
        if self._load_mode == "async":
            self._loading.add(request.request_id)

    def _null_block(self) -> int:
        """vLLM's null block id (the padding of a sliding window's table)."""
        m = self._kv_cache_manager
        return m.block_pool.null_block.block_id if m is not None else 0

    def get_external_cache_hit_sources(self, request, num_external_tokens: int):
        """vLLM's per-source prefix-cache metrics: the tokens this request
        loads from kvferry's host tier, its disk tier and the remote store
        (reported as vLLM's external_unspecified). vLLM counts them as the
        request is admitted, before its load; kvferry's own hit_tokens wait
        for the load's end (_load_ended)."""
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        by_tier = self._hit_tiers.pop(request.request_id, {})
        source = {Tier.HOST: CacheHitSource.HOST, Tier.DISK: CacheHitSource.DISK}
        out: Dict[object, int] = {}
        for tier, tokens in by_tier.items():
            s = source.get(tier, CacheHitSource.EXTERNAL_UNSPECIFIED)
            out[s] = out.get(s, 0) + tokens
        if sum(out.values()) != num_external_tokens:  # not the load this connector planned: say so
            return {CacheHitSource.EXTERNAL_UNSPECIFIED: num_external_tokens} if num_external_tokens else {}
        return out

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        """Per step: the loads update_state_after_alloc queued, and the
        saves of the blocks this step makes whole. A decode step fills a
        block once in block_size steps: a request is looked at further only
        when it gets new blocks or its tokens reach its next whole block."""
        meta = None  # most decode steps have nothing to say: the shared empty one then
        preempted = getattr(scheduler_output, "preempted_req_ids", None)
        if self._loads or scheduler_output.scheduled_new_reqs or (preempted and self._saving):
            meta = KvferryConnectorMetadata(loads=self._loads)
            self._loads = []
            if preempted and self._saving:
                meta.preempted = [r for r in preempted if r in self._saving]
        if self._matched:
            self._matched.clear()
        queued: Set[int] = set()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id not in self._live:
                continue  # never announced (on_new_request): no hashes to key it by
            req = _Request([list(ids) for ids in new.block_ids], [0] * len(self._groups))
            self._requests[new.req_id] = req
            self._queue_saves(new.req_id, req, new.num_computed_tokens + scheduled.get(new.req_id, 0), meta,
                              queued)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = cached.resumed_req_ids
        requests = self._requests
        for rid, new_ids, done in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            req = requests.get(rid)
            if req is None:
                continue
            if resumed and rid in resumed:  # preempted and back: all its blocks are new
                req.block_ids = [list(ids) for ids in new_ids] if new_ids else [[] for _ in self._groups]
            elif new_ids:
                for mine, ids in zip(req.block_ids, new_ids):
                    mine.extend(ids)
            computed = done + scheduled.get(rid, 0)
            if computed >= req.next_whole:  # a decode step fills a block 1 time in 16-32
                if meta is None:
                    meta = KvferryConnectorMetadata()
                self._queue_saves(rid, req, computed, meta, queued)
        if self._state_layers:
            block_state = getattr(scheduler_output, "kv_connector_block_state", None)
            offloads = getattr(block_state, "boundary_state_offloads", None)
            if offloads:
                if meta is None:
                    meta = KvferryConnectorMetadata()
                for rid, offers in offloads.items():
                    self._queue_state_saves(rid, offers, meta, queued)
        return _NOTHING if meta is None else meta

    def _queue_state_saves(self, rid: str, offers, meta: KvferryConnectorMetadata, queued: Set[int]):
        """Saves the states vLLM hands over (its boundary-state offloads:
        (group, block id, tokens) of each state block its prefix cache
        takes this step, which this step's forward writes): each under the
        key of the block the state ends, so it serves exactly that prefix.
        A state at a boundary that is no block's end (a partial tail) is
        not saved. vLLM frees a state block within two steps: its save is
        waited for before the next step writes any block."""
        request = self._live.get(rid)
        if request is None:
            return
        keys = self._keys(request)
        state = {g.index: gi for gi, g in enumerate(self._groups) if g.state}
        for group_id, block_id, tokens in offers:
            gi = state.get(group_id)
            j = tokens // self._block_size - 1
            if gi is None or tokens % self._block_size or not 0 <= j < len(keys[gi]):
                continue
            key = keys[gi][j]
            if self._held(key) or key in queued:
                continue
            queued.add(key)
            meta.save_keys.append(key)
            meta.save_blocks.append(block_id)
            meta.save_reqs.append(rid)
            meta.save_transient.append(True)
            self._saving.add(rid)
            self._in_flight.add(key)
            if self._events_on:
                self._block_info[key] = _event_info(request, j, self._block_size, group_id)

    def _queue_saves(self, rid: str, req: _Request, computed: int, meta: KvferryConnectorMetadata,
                     queued: Set[int]):
        """Saves the blocks this step makes whole, of every group: prompt
        blocks and the ones generated tokens fill (their hashes exist once
        vLLM appended the tokens), so a conversation's next turn finds its
        answer. Every whole block of a sliding window too: any block
        boundary can end a later request's hit, whose window it reaches."""
        request = self._live[rid]
        keys = self._keys(request)
        null = self._null_block()
        for gi, (g, gkeys, ids) in enumerate(zip(self._groups, keys, req.block_ids)):
            if g.state:  # saved as vLLM hands its states over (_queue_state_saves)
                continue
            whole = min(computed // self._block_size, len(gkeys), len(ids))
            for j in range(req.saved[gi], whole):
                key = gkeys[j]
                if ids[j] == null or self._held(key) or key in queued:
                    continue  # a window's padding, or stored already
                queued.add(key)
                meta.save_keys.append(key)
                meta.save_blocks.append(ids[j])
                meta.save_reqs.append(rid)
                meta.save_transient.append(g.window)
                self._saving.add(rid)
                self._in_flight.add(key)
                if self._events_on:
                    self._block_info[key] = _event_info(request, j, self._block_size, g.index)
            req.saved[gi] = max(req.saved[gi], whole)
        # state groups are saved as vLLM hands states over, not by tokens
        saved = [n for g, n in zip(self._groups, req.saved) if not g.state]
        req.next_whole = (min(saved) + 1) * self._block_size if saved else float("inf")

    def update_connector_output(self, connector_output):
        recving = getattr(connector_output, "finished_recving", None)
        if recving and self._loading:
            self._loading.difference_update(recving)  # their asynchronous loads are over
        failed = getattr(connector_output, "failed_recving", None)
        if failed:  # vLLM computes them again from their start: no load this time
            self._no_hits.update(failed)
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if meta is None or not isinstance(meta, KvferryWorkerMetadata):
            return
        for rank, ended in meta.loads.items():
            for rid, ok in ended:
                self._load_ended(rid, tuple(rank), ok)
        first = self._ranks[0]
        for rank, events in meta.events.items():
            rank = tuple(rank)
            stored = self._stored.setdefault(rank, {})
            for kind, key, tier in events:
                self._in_flight.discard(key)  # stored, or its save failed
                if self._events_on and rank == first:  # the instance's tiers: its first worker's
                    self._kv_event(kind, key, tier, stored.get(key))
                if kind == EventKind.REMOVED:
                    stored.pop(key, None)
                else:
                    stored[key] = tier
        if meta.link is not None:
            self._link = meta.link

    def _load_ended(self, rid: str, rank: _Rank, ok: int) -> None:
        """A worker's word on how a request's load ended: ok leading blocks
        of the hit count (_ALL: every one). Once every worker has spoken,
        the blocks all of them brought count as hits by tier and the rest
        (vLLM recomputed them) as failed, never as hits."""
        pending = self._pending_hits.get(rid)
        if pending is None:
            return
        tiers, waiting, least = pending
        waiting.discard(rank)
        if ok != _ALL:
            least[0] = min(least[0], ok)
        if waiting:
            return
        del self._pending_hits[rid]
        n, counts = least[0], self._hit_counts
        for i, t in enumerate(tiers):
            name = f"{'hit_tokens' if i < n else 'load_failed_tokens'}_{t.name.lower()}"
            counts[name] = counts.get(name, 0) + self._block_size
        if n < len(tiers):
            counts["load_failed_requests"] = counts.get("load_failed_requests", 0) + 1

    def _kv_event(self, kind: int, key: int, tier: int, was: Optional[int]) -> None:
        """vLLM's KV cache events (BlockStored / BlockRemoved with the
        medium: CPU for kvferry's host tier, STORAGE for disk and remote)
        for a block this scheduler saved (it knows the block's hash, parent
        and tokens; a block found on disk at start has no hash to name)."""
        from vllm.distributed.kv_events import MEDIUM_CPU, MEDIUM_STORAGE, BlockRemoved, BlockStored
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        info = self._block_info.get(key)
        if info is None:
            return
        medium = {int(Tier.HOST): MEDIUM_CPU}
        h = maybe_convert_block_hash(info[0])
        if kind != EventKind.STORED and was is not None:
            self._kv_events.append(BlockRemoved(block_hashes=[h], medium=medium.get(was, MEDIUM_STORAGE),
                                                group_idx=info[5]))
        if kind == EventKind.REMOVED:
            self._block_info.pop(key, None)
            return
        self._kv_events.append(BlockStored(block_hashes=[h], parent_block_hash=info[1], token_ids=info[2],
                                           block_size=self._block_size, lora_id=info[3],
                                           medium=medium.get(tier, MEDIUM_STORAGE), lora_name=info[4],
                                           group_idx=info[5]))

    def take_events(self):
        events, self._kv_events = self._kv_events, []
        return events

    def get_kv_connector_stats(self):
        """What happened since the last call, as vLLM's stats carry it to
        its loggers and Prometheus: on the scheduler, the tokens its loads
        took from each tier (hit_tokens_host, _disk, _remote), counted once
        the load has ended, and apart from them the tokens whose load failed
        (load_failed_tokens_<tier>) and the requests that had such tokens
        (load_failed_requests); on a worker, the blocks it loaded, failed
        to load and saved."""
        counts = self._hit_counts if self._role == KVConnectorRole.SCHEDULER else self._counts
        if not counts:
            return None
        data = dict(counts)
        counts.clear()
        return KvferryStats(data)

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvferryStats(dict(data) if data is not None else {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvferryPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def request_finished(self, request, block_ids):
        return self._finished(request)

    def request_finished_all_groups(self, request, block_ids):
        return self._finished(request)

    def _finished(self, request):
        """(whether vLLM must keep the request's blocks until get_finished
        says so, None): saves run after the step, and an asynchronous load
        may still be writing them."""
        rid = request.request_id
        self._requests.pop(rid, None)
        self._matched.pop(rid, None)
        self._live.pop(rid, None)
        self._req_keys.pop(rid, None)
        self._hit_tiers.pop(rid, None)
        self._no_hits.discard(rid)
        held = rid in self._saving or rid in self._loading
        self._saving.discard(rid)
        return held, None

    # ---- worker side -------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]):
        num_blocks = int(self._kv_cache_config.num_blocks)
        tensors = list(kv_caches.values())
        ckw = {k: self._extra[k] for k in _CACHE_KEYS if k in self._extra}
        if "remote" in ckw:
            ckw["remote"] = CacheRemote[str(ckw["remote"]).upper()]
        cut = cut_kv_caches(kv_caches, num_blocks, self._block_size, self._state_layers)
        distinct = unique_pools(cut)
        host = int(ckw.get("host_blocks", 0))
        if "host_bytes" in ckw:  # each host slot holds one block of every pool
            per_block = sum(p.geometry.block_bytes for pools in distinct for p in pools)
            host = size_parse(ckw.pop("host_bytes")) // per_block
            ckw["host_blocks"] = host
        ekw = {k: self._extra[k] for k in _ENGINE_KEYS if k in self._extra}
        self._rank, dcp_rank = _worker_rank()
        self._namespace = (f"{namespace_head(self._vllm_config, self._extra, self._rank, dcp_rank)}-"
                           f"{layout_tag(kv_caches)}")
        engine = Engine(backend=backend_for(tensors), file_namespace=self._namespace, **ekw)
        try:
            added_of = {id(pools): add_pools(engine, pools, host) for pools in distinct}
            added = {ident: added_of[id(pools)] for ident, pools in cut.items()}
            # every event reaches the scheduler: none is dropped by a queue
            self.cache = Cache(engine, on_event=self._on_event, **ckw)
            for tier, (lat, bw) in self._held_costs.items():
                engine.set_tier_cost(tier, lat, bw, hold=True)
        except BaseException:
            engine.close()
            raise
        self.engine = engine
        self._saver = Saver(self.cache, self._priority)
        for name, t in kv_caches.items():
            self._layer_pools[name] = added[tensor_ident(t)]
        self._pool_order = [p for pools in distinct for p in added_of[id(pools)]]
        self._block_bytes = sum(p.geometry.block_bytes for pools in distinct for p in pools)
        log.info("kvferry: worker %s namespace %s", self._rank, self._namespace)

    def _on_event(self, e) -> None:
        # called with the cache's lock held, from any thread: only appends
        with self._events_lock:
            self._events.append((int(e.kind), e.key, int(e.tier)))

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvferryConnectorMetadata) or not meta.loads or self.cache is None:
            return
        if self._saves:  # a block saved a step ago may be loaded now: its save first
            self._reap(keys={k for _rid, ks, _ids in meta.loads for k in ks})
        if self._load_mode == "async":
            by_req: Dict[str, list] = {}
            for rid, k, ids in meta.loads:  # a request has a load per KV cache group
                by_req.setdefault(rid, []).append((k, ids))
            for rid, loads in by_req.items():
                self._start_load(loads, rid)
        else:  # one KV cache group (__init__): a request's one load, its blocks in hit order
            self._sync_ids = [(rid, ids) for rid, _k, ids in meta.loads]
            self._start_load([(k, ids) for _rid, k, ids in meta.loads])

    def _start_load(self, loads, rid: Optional[str] = None) -> None:
        """Starts one get of [(keys, blocks), ...], each list a prefix
        (of a request's KV cache group): a block evicted since the
        scheduler looked fails with the rest of its list. An asynchronous
        load (rid given) is reported by get_finished; a synchronous one
        is waited for per layer or here (load: whole)."""
        keys, slots, missing = held_prefixes(self.cache, loads)
        self._failed(missing, rid)
        ticket = None
        if keys:
            if self.engine.backend == Backend.CUDA:
                # vLLM may still be zeroing new blocks on its stream: land after it
                torch.cuda.current_stream().synchronize()
            try:
                # pool by pool in layer order, each layer waited for alone
                ticket = self.cache.get(keys, slots, pools=self._pool_order)
            except KvferryError as exc:
                log.warning("kvferry: load of %d blocks refused: %s", len(keys), exc)
                self._failed(slots, rid)
        if rid is not None:  # get_finished reports it once every block is in place or failed
            self._async_loads.append((ticket, rid, slots, [b for _k, ids in loads for b in ids]))
        elif ticket is not None and self._layerwise:
            self._load_ticket, self._load_slots = ticket, slots
        elif ticket is not None:  # the forward starts with every block in place
            self._landed(ticket, slots)

    def _landed(self, ticket, slots: List[int], rid: Optional[str] = None) -> None:
        """A finished load: its failed blocks to vLLM, its count to the stats."""
        bad = [slots[i] for i in failed_moves(ticket)]
        self._failed(bad, rid)
        self._costs_moved = True
        self._count("loaded_blocks", len(slots) - len(bad))
        self._count("load_failed_blocks", len(bad))

    def _failed(self, blocks: List[int], rid: Optional[str]) -> None:
        """Blocks a load did not bring: vLLM recomputes from the first of
        them, or the whole request where a block cannot say (_fail_requests:
        an asynchronous load's request is reported in failed_recving)."""
        if not blocks:
            return
        if rid is not None:
            self._bad.setdefault(rid, set()).update(blocks)
        if rid is not None and self._fail_requests:
            self._load_failed.add(rid)
        else:
            self._load_errors.update(blocks)

    def _ended(self, rid: str, ids: List[int], bad) -> None:
        """A request's load is over: the scheduler hears how many leading
        blocks of its hit count (vLLM recomputes from the first failed one;
        a load failed whole, none)."""
        if rid in self._load_failed:
            ok = 0
        else:
            ok = next((i for i, b in enumerate(ids) if b in bad), _ALL)
        self._outcomes.append((rid, ok))

    def _count(self, name: str, n: int) -> None:
        if n:
            self._counts[name] = self._counts.get(name, 0) + n

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Makes the layer's attention see its blocks: on the GPU, torch's
        current stream waits for the layer's pools (the host does not); on
        the host backend this thread waits."""
        if self._load_ticket is not None:
            wait_layer(self._load_ticket, self._layer_pools.get(layer_name, ()), self.engine.backend == Backend.CUDA)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        # a cached block holds every layer: saved whole in wait_for_save
        return

    def handle_preemptions(self, kv_connector_metadata):
        """Before the step writes any block: the saves of blocks vLLM freed
        since (a sliding window's blocks that left it) and a preempted
        request's saves finish first."""
        if self._transient:
            for t in self._transient:
                t.wait()  # issued by the saver thread, then read
            self._transient = []
        if isinstance(kv_connector_metadata, KvferryConnectorMetadata) and kv_connector_metadata.preempted:
            self._reap(set(kv_connector_metadata.preempted))

    def wait_for_save(self):
        """Queues this step's saves and returns: the saver thread issues the
        puts (on CUDA after the forward's writes, by an event on the
        current stream), they finish in the background, and a finished
        request's blocks stay vLLM's until get_finished reports its saves
        done. The step thread neither copies nor waits."""
        meta = self._connector_metadata
        if not isinstance(meta, KvferryConnectorMetadata) or not meta.save_keys or self._saver is None:
            return
        self._saved_reqs.update(meta.save_reqs)  # vLLM holds them, whatever happens to the save
        after = None
        if self.engine.backend == Backend.CUDA:
            after = torch.cuda.Event()
            after.record()  # the forward wrote the blocks before this point of the stream
        transient = meta.save_transient
        parts = [(False, range(len(meta.save_keys)))] if not any(transient) else [
            (w, [i for i, t in enumerate(transient) if t == w]) for w in (False, True)]
        for window, idx in parts:
            if not idx:
                continue
            keys = [meta.save_keys[i] for i in idx]
            rids = {meta.save_reqs[i] for i in idx}
            job = Save(keys, [meta.save_blocks[i] for i in idx], rids, window, after)
            self._saves.append(job)
            for rid in rids:
                self._save_count[rid] = self._save_count.get(rid, 0) + 1
            if window:
                self._transient.append(job)
            self._saver.queue(job)

    def _reap(self, wait_for: Set[str] = frozenset(), keys: Set[int] = frozenset()) -> None:
        """Retires the saves that are done, waiting for those of the
        requests in wait_for and those of the given keys."""
        keep = []
        for job in self._saves:
            if not job.done() and not (job.rids & wait_for) and not keys.intersection(job.keys):
                keep.append(job)
                continue
            bad = job.failed()  # done, or waited for here
            if bad:
                log.warning("kvferry: %d blocks not saved", len(bad))
                with self._events_lock:  # the scheduler counted them as coming
                    self._events.extend((int(EventKind.REMOVED), job.keys[i], int(Tier.HOST)) for i in bad)
            self._count("saved_blocks", len(job.keys) - len(bad))
            for rid in job.rids:
                self._save_count[rid] -= 1
                if not self._save_count[rid]:
                    del self._save_count[rid]
        self._saves = keep

    def get_finished(self, finished_req_ids):
        """(requests whose saves are done since they finished, None): the
        requests vLLM holds are those a save was queued for (the scheduler's
        request_finished said so from the same metadata)."""
        recving = self._loads_done() if self._async_loads else None
        if finished_req_ids and self._saved_reqs:
            self._finished_waiting.update(r for r in finished_req_ids if r in self._saved_reqs)
        if not self._finished_waiting:
            return None, recving
        self._reap()
        done = {r for r in self._finished_waiting if r not in self._save_count}
        self._finished_waiting -= done
        self._saved_reqs -= done
        return (done or None), recving

    def _loads_done(self) -> Optional[Set[str]]:
        """The requests whose asynchronous loads are over, their failed
        blocks among the load errors of this same step (as vLLM asks)."""
        done, keep = set(), []
        for t, rid, slots, ids in self._async_loads:
            if t is not None and t.poll() is None:
                keep.append((t, rid, slots, ids))
                continue
            if t is not None:
                self._landed(t, slots, rid)
            self._ended(rid, ids, self._bad.pop(rid, ()))
            if rid in self._load_failed:  # reported failed in this same pass
                self._load_failed.discard(rid)
                self._failed_recving.add(rid)
            done.add(rid)
        self._async_loads = keep
        return done or None

    def get_transfer_results(self, finished_req_ids):
        """get_finished's sets, and the asynchronous loads of those it
        reports done that failed somewhere (vLLM recomputes each from its
        start, whatever its groups: see _fail_requests)."""
        sending, recving = self.get_finished(finished_req_ids)
        failed, self._failed_recving = self._failed_recving, set()
        return KVConnectorTransferResults(finished_sending=set(sending or ()),
                                          finished_recving=set(recving or ()) | failed, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        if self._load_ticket is None and not self._load_errors and not self._sync_ids:
            return set()
        if self._load_ticket is not None:
            self._landed(self._load_ticket, self._load_slots)
            self._load_ticket, self._load_slots = None, []
        out, self._load_errors = self._load_errors, set()
        for rid, ids in self._sync_ids:  # this step's synchronous loads are over
            self._ended(rid, ids, out)
        self._sync_ids = []
        return out

    def _link_now(self) -> Optional[_Link]:
        """What the scheduler's plans need from this worker (None without a
        prefill cost): the costs move with every load, so they travel in
        the steps that changed them."""
        if self._prefill is None or self.engine is None:
            return None
        costs = {int(t): (c.latency_s, c.bytes_per_s) for t, c in self.engine.costs().items()}
        layerwise = tuple(int(t) for t in self.engine.layerwise_tiers())
        steps = tuple((t, self.engine.arrival_groups(t)) for t in layerwise)
        return self._block_bytes, costs, layerwise, steps

    def build_connector_worker_meta(self):
        fresh = None
        if self._costs_moved:  # read costs change only as loads land
            self._costs_moved = False
            link = self._link_now()
            if link != self._sent_link:
                fresh = self._sent_link = link
        if not self._events and fresh is None and not self._outcomes:  # a list's length is read whole
            return None
        with self._events_lock:
            events, self._events = self._events, []
        ended, self._outcomes = self._outcomes, []
        return KvferryWorkerMetadata({self._rank: events}, fresh, {self._rank: ended} if ended else {})

    def shutdown(self):
        if self._saver is not None:
            self._saver.close(self._saves)
            self._saver = None
        for t, _rid, _slots, _ids in self._async_loads:
            if t is not None:
                t.wait()
        self._transient = []
        self._reap(set(self._save_count))
        if self.engine is not None:
            self.engine.close()  # closes the cache first
        self.engine = self.cache = None


def _event_info(request, j: int, block_size: int, group: int) -> tuple:
    """What vLLM's BlockStored names of the request's block j: (its hash,
    its parent's, its tokens, LoRA id, LoRA name, group)."""
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    lora = getattr(request, "lora_request", None)
    parent = maybe_convert_block_hash(request.block_hashes[j - 1]) if j else None
    return (request.block_hashes[j], parent, list(request.all_token_ids[j * block_size:(j + 1) * block_size]),
            lora.lora_int_id if lora else None, lora.lora_name if lora else None, group)


def _worker_rank() -> Tuple[_Rank, int]:
    """This worker's (TP rank, PP stage, PCP rank) and its DCP rank, from
    vLLM's process groups (0 where a group is not set up)."""
    from vllm.distributed import parallel_state as ps

    def rank(getter):
        try:
            return int(getattr(ps, getter)().rank_in_group)
        except (AssertionError, AttributeError, TypeError):
            return 0

    return (rank("get_tp_group"), rank("get_pp_group"), rank("get_pcp_group")), rank("get_dcp_group")


def _model_layers(vllm_config) -> int:
    """The layers this instance's forward runs (its pipeline stage's)."""
    mc = vllm_config.model_config
    if mc is None:
        return 0
    try:
        return int(mc.get_num_layers(vllm_config.parallel_config))
    except (AttributeError, TypeError, ValueError):
        return int(getattr(mc.hf_text_config, "num_hidden_layers", 0) or 0)
