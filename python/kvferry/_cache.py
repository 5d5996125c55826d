# SPDX-License-Identifier: Apache-2.0
"""Block keys and the content-addressed cache (kvf_key_*, kvf_cache_*).

    with kvf.Cache(engine, host_blocks=64, disk_blocks=1024, event_queue=4096) as cache:
        keys = kvf.key_chain_all(tokens, tokens_per_block=16)
        cache.put(keys, slots=[3, 4, 5]).wait(check=True)   # the engine frees GPU blocks 3-5
        hits, tiers = cache.lookup(keys)                     # a later request, same prefix
        cache.get(keys[:hits], slots=free_blocks[:hits]).wait(check=True)
"""

import ctypes
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

from . import _lib
from ._cargs import c_key, c_string, fill, key_array, key_int
from ._config import Setting, _settings
from ._engine import Engine
from ._moves import _is_int, _pool_list, _uint_array
from ._tickets import Ticket, _Issuer
from ._streams import _stream_handle
from ._enums import CacheRemote, CacheRemoteLike, EventKind, Status, Tier, TierLike
from ._errors import check, make_error
from ._plan import MIN_GAIN, Plan, PlanLearnt, Prefill, PrefillLike, TierCost, plan_from_c, plan_to_c

L = _lib.lib

# ---- block keys ------------------------------------------------------------------


def _tokens(tokens, what="tokens"):
    return _uint_array(tokens, what, 32, "token id")


def _keys(keys, what):
    return key_array(keys, what)


def _salt(salt) -> int:
    if isinstance(salt, (str, bytes)):
        return key_salt(salt)
    if not _is_int(salt) or not 0 <= salt < 2**64:
        raise make_error(Status.ERR_INVALID, f"salt: {salt!r} is neither a name nor an unsigned 64-bit integer")
    return int(salt)


def size_parse(text) -> int:
    """Bytes of a size: an int as it is, or text as kvf_size_parse reads it
    ("64GB" = 64e9, "64GiB" = 64 * 2**30, "512M", "1.5T", "4096"; any case)."""
    if _is_int(text):
        if text < 0 or text >= 2**64:
            raise make_error(Status.ERR_RANGE, f"size {text!r}: not 0 .. 2**64 - 1 bytes")
        return int(text)
    if not isinstance(text, str):
        raise make_error(Status.ERR_INVALID, f"size {text!r}: expected an int or a string such as '64GB'")
    out = ctypes.c_uint64()
    check(L.kvf_size_parse(c_string(text, "size_parse: text"), ctypes.byref(out)))
    return out.value


def key_salt(name) -> int:
    """A salt from a name (a LoRA adapter, a model): XXH64 of its bytes."""
    return int(L.kvf_key_salt(c_string(name if isinstance(name, (str, bytes)) else bytes(name), "key_salt: name")))


def key_chain(parent: int, tokens, salt=0) -> int:
    """The key of one block, a 128-bit int (XXH3-128): its parent's key (0
    for a request's first block), the salt (an int, or a name for
    key_salt) and its token ids."""
    c_parent = c_key(parent, "key_chain: parent")
    ptr, n, keep = _tokens(tokens)
    key = key_int(L.kvf_key_chain(c_parent, ptr, n, _salt(salt)))
    del keep
    return key


def key_chain_all(tokens, tokens_per_block: int, salt=0) -> List[int]:
    """The keys of every whole block of a token sequence (a list or a NumPy
    array of ids), chained from the root; a partial last block has none."""
    if not _is_int(tokens_per_block) or not 0 < tokens_per_block < 2**32:
        raise make_error(Status.ERR_INVALID, f"key_chain_all: tokens_per_block = {tokens_per_block!r}")
    ptr, n, keep = _tokens(tokens)
    cap = n // tokens_per_block
    out = (_lib.Key_t * max(cap, 1))()
    got = L.kvf_key_chain_all(ptr, n, int(tokens_per_block), _salt(salt), out, cap)
    del keep
    return [key_int(out[i]) for i in range(min(got, cap))]


# ---- events and stats --------------------------------------------------------------


@dataclass(frozen=True)
class CacheEvent:
    """One change of the cache's content (kvf_cache_event), in order."""

    seq: int
    kind: EventKind
    key: int
    tier: Tier
    from_tier: Tier  # UPDATED: the tier it left; else equal to tier
    priority: int

    @classmethod
    def _from_c(cls, e):
        return cls(int(e.seq), _enum(EventKind, e.kind), key_int(e.key), _enum(Tier, e.tier),
                   _enum(Tier, e.from_), int(e.priority))


def _enum(cls, v):
    try:
        return cls(v)
    except ValueError:
        return int(v)


def _tiers(arr) -> Dict[str, int]:
    return {t.name.lower(): int(arr[t]) for t in Tier}


@dataclass(frozen=True)
class CacheStats:
    """Counters since the cache was created, and its content now
    (kvf_cache_stats). Per-tier figures are dicts {"host": n, "disk": n}."""

    blocks: Dict[str, int]
    capacity: Dict[str, int]
    lookups: int
    hits: Dict[str, int]
    misses: int
    lookup_blocks: int
    puts: int
    put_duplicates: int
    gets: int
    bytes_in: Dict[str, int]
    bytes_out: Dict[str, int]
    evictions: Dict[str, int]
    dropped: int
    failures: int
    events_dropped: int
    latency_us: Tuple[int, ...]  # counts per bucket of upper bound 2^(4+i) us, the last unbounded
    latency_count: int
    latency_sum_us: int
    remote_errors: int  # remote operations that failed (a miss, never data)

    @property
    def hit_rate(self) -> float:
        """Blocks found by lookups over blocks asked for."""
        return sum(self.hits.values()) / self.lookup_blocks if self.lookup_blocks else 0.0

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def _stats_from_c(s) -> CacheStats:
    return CacheStats(_tiers(s.blocks), _tiers(s.capacity), s.lookups, _tiers(s.hits), s.misses, s.lookup_blocks,
                      s.puts, s.put_duplicates, s.gets, _tiers(s.bytes_in), _tiers(s.bytes_out),
                      _tiers(s.evictions), s.dropped, s.failures, s.events_dropped, tuple(s.latency_us),
                      s.latency_count, s.latency_sum_us, s.remote_errors)


# ---- the cache -------------------------------------------------------------------------


class Cache(_Issuer):
    """A content-addressed cache of whole blocks below an engine's primary
    slots (kvf_cache). The engine keeps owning its primary (GPU) blocks: it
    hands a block to the cache by slot when it would free it (put), asks
    which leading blocks of a new request are cached (lookup) and has them
    copied into slots of its choice (get).

    host_blocks / disk_blocks: capacity of each tier (0: off; the host tier
    uses the engine's secondary slots 0..host_blocks-1, the disk tier its
    file tier). host_bytes / disk_bytes: the same in bytes instead, an int
    or text such as "64GB" or "64GiB" (size_parse), rounded down to whole
    blocks of the engine's pools; give a tier blocks or bytes, not both.
    Arguments left at 0 may come from KVF_CACHE_* variables or the config
    file (docs/configuration.md): the engine's (Engine(config_file=...) or
    $KVF_CONFIG), so a Cache takes no config_file of its own; settings()
    says where each came from. offload_min_priority, disk_admit_uses, event_queue: as in
    kvf_cache_config. remote: CacheRemote.WRITE_THROUGH or READ to use the
    engine's remote tier (Engine(remote_url=...)) below disk; its blocks are
    the store's (not counted, evicted or pinned here). gpu_blocks: the cache
    owns primary slots 0..gpu_blocks-1 and hands them out (alloc, acquire,
    commit, free) instead of the engine owning them. on_event: called for each event, in order, from the
    thread that made the change and with the cache's lock held: it must not
    call into the cache; exceptions it raises are printed and dropped.

    Calls may come from several threads; close() must be the last one. The
    engine must stay open while the cache is (Engine.close() closes it)."""

    _what = "cache"
    _wait_fn = L.kvf_cache_wait_errors
    _poll_fn = L.kvf_cache_poll_errors
    _wait_pool_fn = L.kvf_cache_wait_pool
    _stream_wait_pool_fn = L.kvf_cache_stream_wait_pool
    _ticket_t = _lib.CacheTicket_t  # not interchangeable with an Engine's

    def __init__(self, engine: Engine, host_blocks: int = 0, disk_blocks: int = 0, offload_min_priority: int = 0,
                 disk_admit_uses: int = 0, event_queue: int = 0,
                 on_event: Optional[Callable[[CacheEvent], None]] = None, remote: CacheRemoteLike = CacheRemote.OFF,
                 gpu_blocks: int = 0, host_bytes: Union[int, str] = 0, disk_bytes: Union[int, str] = 0):
        self._handle = None
        self._prefill = None
        self._pending = {}
        self._lock = threading.Lock()
        self.engine = engine
        c = _lib.CacheConfig_t()
        c.struct_size = ctypes.sizeof(_lib.CacheConfig_t)
        # the keywords are the settings' names; the struct groups them by tier
        fill(c, (("host.blocks", "host_blocks", host_blocks), ("disk.blocks", "disk_blocks", disk_blocks),
                 ("offload_min_priority", "offload_min_priority", offload_min_priority),
                 ("disk.admit_uses", "disk_admit_uses", disk_admit_uses), ("events.queue", "event_queue", event_queue),
                 ("gpu.blocks", "gpu_blocks", gpu_blocks), ("remote", "remote", CacheRemote(remote))))
        c.host.bytes = size_parse(host_bytes)
        c.disk.bytes = size_parse(disk_bytes)
        self._callback = None
        if on_event is not None:
            if not callable(on_event):
                raise TypeError("Cache: on_event must be callable")

            def trampoline(_arg, ev, fn=on_event):
                try:
                    fn(CacheEvent._from_c(ev.contents))
                except BaseException as exc:  # never unwind into C
                    print(f"kvferry: Cache on_event raised {exc!r}", file=sys.stderr)

            self._callback = _lib.CacheEventFn(trampoline)
            c.events.fn = self._callback
        self.config = dict(host_blocks=host_blocks, disk_blocks=disk_blocks,
                           offload_min_priority=offload_min_priority, disk_admit_uses=disk_admit_uses,
                           event_queue=event_queue, remote=CacheRemote(remote), gpu_blocks=gpu_blocks,
                           host_bytes=c.host.bytes, disk_bytes=c.disk.bytes)
        h = ctypes.c_void_p()
        check(L.kvf_cache_create(engine._h(), ctypes.byref(c), ctypes.byref(h)))
        self._handle = h.value
        engine._caches.add(self)

    # -- life --
    def close(self) -> None:
        """Waits for the cache's transfers in flight and frees it; the blocks
        on disk stay for the next cache. Idempotent."""
        h, self._handle = self._handle, None
        if h:
            L.kvf_cache_destroy(h)
        self._pending.clear()

    def settings(self) -> Dict[str, Setting]:
        """The cache's effective settings (cache_* names), {name:
        Setting(value, source, env)}; a tier's blocks are those after
        rounding its bytes."""
        return _settings(L.kvf_cache_settings, self._h())

    def __repr__(self):
        if self._handle is None:
            return "<kvferry.Cache closed>"
        return f"<kvferry.Cache host {self.config['host_blocks']}, disk {self.config['disk_blocks']} blocks>"

    # -- content --
    def lookup(self, keys) -> Tuple[int, List[Tier]]:
        """The longest cached prefix of keys: (hits, the tier of each hit).
        Changes nothing (no recency, no pin)."""
        ptr, n, keep = _keys(keys, "lookup")
        hits = ctypes.c_size_t()
        tiers = (_lib.c_enum * max(n, 1))()
        check(L.kvf_cache_lookup(self._h(), ptr, n, ctypes.byref(hits), tiers))
        del keep
        return hits.value, [_enum(Tier, tiers[i]) for i in range(hits.value)]

    def _keys_slots(self, keys, slots, what):
        kp, n, kk = _keys(keys, what)
        sp, m, sk = _slots(slots, what)
        if n != m:
            raise make_error(Status.ERR_INVALID, f"{what}: {n} keys but {m} slots")
        return kp, sp, n, (kk, sk)

    def put(self, keys, slots, priority: int = 50, *, detach: bool = False) -> Optional[Ticket]:
        """Stores the blocks the engine filled: keys[i] from primary slot
        slots[i], at priority 0-100. The Ticket's statuses say which blocks
        were stored; once it completes the slots may be written again.
        detach=True: no ticket (order later writes of the slots with
        Engine.sync_stream)."""
        if not _is_int(priority) or not 0 <= priority <= 100:
            raise make_error(Status.ERR_INVALID, f"put: priority {priority!r} is not in 0..100")
        kp, sp, n, keep = self._keys_slots(keys, slots, "put")
        t = _lib.CacheTicket_t()
        check(L.kvf_cache_put(self._h(), kp, sp, n, int(priority), None if detach else ctypes.byref(t)))
        del keep
        return None if detach else self._issue(t.id, n)

    def get(self, keys, slots, *, pools=None) -> Ticket:
        """Copies cached blocks into primary slots: keys[i] into slots[i].
        Every key must be cached (NotFound names the first that is not). A
        block whose status is not OK holds no data to use: recompute it.
        pools: move only these pools, arriving in this order
        (kvf_cache_get_pools): a layer-wise get, waited for a pool at a time
        with Ticket.wait_pool / Ticket.stream_wait_pool."""
        kp, sp, n, keep = self._keys_slots(keys, slots, "get")
        t = _lib.CacheTicket_t()
        if pools is None:
            check(L.kvf_cache_get(self._h(), kp, sp, n, ctypes.byref(t)))
        else:
            pp, np_, pkeep = _pool_list(pools, "get")
            check(L.kvf_cache_get_pools(self._h(), kp, sp, n, pp, np_, ctypes.byref(t)))
            del pkeep
        del keep
        return self._issue(t.id, n)

    def wait_pool_by(self, ticket, pool: int, within_s: float, stream=None) -> bool:
        """Waits for pool `pool` of a get (as Ticket.wait_pool, or
        stream_wait_pool with a stream) until `within_s` seconds after the
        get was submitted (kvf_cache_wait_pool_by): True once it arrived,
        False once the limit passed first. The get runs on after False:
        its blocks stay cached, and its ticket still must be waited for
        before the slots are reused; recompute what it was to bring and
        read none of its slots. Plan.hedge_s is the limit of a plan."""
        if not isinstance(ticket, Ticket) or ticket.engine is not self:
            raise make_error(Status.ERR_INVALID, "wait_pool_by: not a ticket of this cache")
        if ticket.statuses is not None:
            ticket.raise_for_status()
            return True
        if not _is_int(pool) or not 0 <= pool < 2**32:
            raise make_error(Status.ERR_INVALID, f"wait_pool_by: pool {pool!r} is not a pool index")
        handle = None if stream is None else _stream_handle(stream, "wait_pool_by")
        st = L.kvf_cache_wait_pool_by(self._h(), self._ticket_t(ticket.id), int(pool), handle, float(within_s))
        if st == Status.ERR_TIMEOUT:
            return False
        check(st)
        return True

    def pin(self, keys) -> int:
        """Pins cached blocks (never evicted until unpinned; pins nest).
        Returns how many of keys were cached and pinned."""
        ptr, n, keep = _keys(keys, "pin")
        out = ctypes.c_size_t()
        check(L.kvf_cache_pin(self._h(), ptr, n, ctypes.byref(out)))
        return out.value

    def unpin(self, keys) -> None:
        """Undoes one pin of each key; InvalidState names a key not pinned."""
        ptr, n, keep = _keys(keys, "unpin")
        check(L.kvf_cache_unpin(self._h(), ptr, n))

    def remove(self, keys) -> int:
        """Removes blocks from every tier (their files too); returns how many
        were cached."""
        ptr, n, keep = _keys(keys, "remove")
        out = ctypes.c_size_t()
        check(L.kvf_cache_remove(self._h(), ptr, n, ctypes.byref(out)))
        return out.value

    # -- the GPU tier (gpu_blocks > 0) --
    def alloc(self, n: int) -> Tuple[List[int], Ticket]:
        """n GPU slots for the caller to fill (unpinned GPU blocks are evicted
        down the tiers to make room); write them once the Ticket completes.
        NoSpace, nothing allocated, when n cannot be found."""
        if not _is_int(n) or n <= 0:
            raise make_error(Status.ERR_INVALID, f"alloc: n = {n!r} is not a positive slot count")
        out = (ctypes.c_uint32 * n)()
        t = _lib.CacheTicket_t()
        check(L.kvf_cache_alloc(self._h(), out, n, ctypes.byref(t)))
        return [int(out[i]) for i in range(n)], self._issue(t.id, 0)  # no per-block statuses

    def commit(self, keys, slots, priority: int = 50) -> List[Status]:
        """The caller filled allocated slots: keys[i] in slots[i] enters the
        GPU tier, pinned once for the caller's request (unpin when it ends).
        Returns a status per block: ERR_STATE where another request uses the
        key's copy (the slot stays the caller's: free it)."""
        if not _is_int(priority) or not 0 <= priority <= 100:
            raise make_error(Status.ERR_INVALID, f"commit: priority {priority!r} is not in 0..100")
        kp, sp, n, keep = self._keys_slots(keys, slots, "commit")
        per = (_lib.c_status * max(n, 1))()
        ret = L.kvf_cache_commit(self._h(), kp, sp, n, int(priority), per)
        if ret == Status.ERR_INVALID or (ret < 0 and n == 0):
            raise make_error(ret)
        return [_enum(Status, per[i]) for i in range(n)]

    def free(self, slots) -> None:
        """Gives back allocated slots that were not committed."""
        ptr, n, keep = _slots(slots, "free")
        check(L.kvf_cache_free(self._h(), ptr, n))

    def acquire(self, keys) -> Tuple[int, List[int], Ticket]:
        """A request's cached prefix in GPU slots: (hits, their slots, a
        Ticket). GPU-tier blocks are pinned in place, host and disk ones
        copied up into GPU slots; each acquired block needs one unpin. A
        block whose status fails holds no data: recompute it. No keys: (0,
        [], None)."""
        kp, n, keep = _keys(keys, "acquire")
        if n == 0:
            return 0, [], None
        out = (ctypes.c_uint32 * n)()
        hits = ctypes.c_size_t()
        t = _lib.CacheTicket_t()
        check(L.kvf_cache_acquire(self._h(), kp, n, out, ctypes.byref(hits), ctypes.byref(t)))
        return hits.value, [int(out[i]) for i in range(hits.value)], self._issue(t.id, hits.value)

    def events(self, max_events: Optional[int] = None) -> List[CacheEvent]:
        """Drains the queued events (up to max_events), oldest first; empty
        without an event_queue."""
        out: List[CacheEvent] = []
        buf = (_lib.CacheEvent_t * 256)()
        while max_events is None or len(out) < max_events:
            cap = 256 if max_events is None else min(256, max_events - len(out))
            n = L.kvf_cache_events(self._h(), buf, cap)
            out.extend(CacheEvent._from_c(buf[i]) for i in range(n))
            if n < cap:
                break
        return out

    # -- the planner (docs/planner.md) --
    def costs(self) -> Dict[Tier, TierCost]:
        """The engine's read costs per tier (Engine.costs)."""
        return self.engine.costs()

    def set_prefill_cost(self, cost: Optional[PrefillLike], *, layers: int = 0, overlap: bool = False,
                         min_gain: float = MIN_GAIN, leading_only: bool = False) -> None:
        """What the model's prefill costs (kvf_cache_set_prefill_cost): a
        function f(new_tokens, prefix_tokens) -> seconds, a list of
        (tokens, seconds) full prefills, or a table {"new_tokens": [...],
        "prefix_tokens": [...], "seconds": [[...]]} (see kvferry.Prefill).
        layers: the model's layers; overlap=True: the engine loads layer by
        layer (get(..., pools=...) and Ticket.wait_pool) and computes each
        layer once it arrived. min_gain: the fraction a split (some hits
        loaded, others recomputed) must predict less than the better pure
        policy to be taken. leading_only=True: the engine computes only
        after loading leading hits (no front computed while the back
        loads). None clears it. A function is called from
        plan(), on the planning thread, once per candidate split."""
        if cost is None:
            check(L.kvf_cache_set_prefill_cost(self._h(), None))
            self._prefill = None
            return
        pf = cost if isinstance(cost, Prefill) else Prefill(cost, layers, overlap, min_gain, leading_only)
        check(L.kvf_cache_set_prefill_cost(self._h(), ctypes.byref(pf.c)))
        self._prefill = pf  # its callback must outlive the cache's use of it

    def plan(self, keys, request_tokens: int) -> Plan:
        """Looks up keys (a lookup in the stats) and plans the request of
        request_tokens tokens: which leading hits to load, from which tiers,
        and from which token to compute, for the least predicted time to the
        first token (kvf_cache_plan). Needs set_prefill_cost first."""
        if isinstance(request_tokens, bool) or not _is_int(request_tokens) or not 0 <= request_tokens < 2**64:
            raise make_error(Status.ERR_INVALID, f"plan: request_tokens = {request_tokens!r}")
        ptr, n, keep = _keys(keys, "plan")
        tiers = (_lib.c_enum * max(n, 1))()
        p = _lib.Plan_t()
        p.struct_size = ctypes.sizeof(_lib.Plan_t)
        pf = getattr(self, "_prefill", None)
        st = L.kvf_cache_plan(self._h(), ptr if n else None, n, int(request_tokens), tiers, ctypes.byref(p))
        del keep
        if pf is not None:
            pf.call(st)
        else:
            check(st)
        return plan_from_c(p, [_enum(Tier, tiers[i]) for i in range(p.hits)])

    def observe_plan(self, plan: Plan, ttft_s: float) -> None:
        """Teaches the cache what a request that followed `plan` (this
        cache's plan()) took, from the plan to its first token, all of it
        (kvf_cache_observe_plan): later plans scale their predictions by
        what was learnt (plan_learnt()), so a load that runs slower than
        its model makes loading predict slower, and recomputing wins where
        it should. The tiers' costs are not touched."""
        p = plan_to_c(plan)
        if isinstance(ttft_s, bool) or not isinstance(ttft_s, (int, float)):
            raise make_error(Status.ERR_INVALID, f"observe_plan: ttft_s = {ttft_s!r} is not a number")
        check(L.kvf_cache_observe_plan(self._h(), ctypes.byref(p), float(ttft_s)))

    def plan_learnt(self) -> PlanLearnt:
        """What observe_plan has taught this cache's plans (kvf_cache_plan_learnt)."""
        out = _lib.PlanLearnt_t()
        out.struct_size = ctypes.sizeof(_lib.PlanLearnt_t)
        check(L.kvf_cache_plan_learnt(self._h(), ctypes.byref(out)))
        return PlanLearnt(float(out.load_ratio), float(out.recompute_ratio), int(out.load_observed),
                          int(out.recompute_observed))

    def stats(self) -> CacheStats:
        s = _lib.CacheStats_t()
        s.struct_size = ctypes.sizeof(_lib.CacheStats_t)
        check(L.kvf_cache_stats_get(self._h(), ctypes.byref(s)))
        return _stats_from_c(s)

    def prometheus(self) -> str:
        """The stats in the Prometheus text exposition format."""
        cap = 8192
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = ctypes.c_size_t()
            check(L.kvf_cache_stats_prometheus(self._h(), buf, cap, ctypes.byref(n)))
            if n.value < cap:
                return buf.value.decode()
            cap = n.value + 1


def _slots(slots, what):
    return _uint_array(slots, what, 32, "slot")


def tier_name(tier: TierLike) -> str:
    return L.kvf_tier_name(int(Tier(tier))).decode()
