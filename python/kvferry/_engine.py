# SPDX-License-Identifier: Apache-2.0
"""The engine (kvf_engine): its life, pools, moves and read costs."""

import ctypes
import threading
import weakref
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from . import _lib
from ._buffers import CUDA, PINNED, as_buffer
from ._cargs import c_int, c_key, fill, key_array
from ._config import _CONFIG_ENUMS, _CONFIG_FIELDS, _DEFAULT_CONFIG, Setting, _settings
from ._enums import Backend, Level, LevelLike, Memory, Status, Tier, TierLike
from ._errors import check, make_error
from ._geometry import Geometry, _geometry
from ._moves import _as_moves, _is_int, _key_side, _pool_list, _uint_array
from ._plan import TierCost, check_cost_args, costs_from_c
from ._pools import Pool, PoolDesc, PoolLevel, _ViewOwner
from ._streams import _stream_handle
from ._tickets import Ticket, _Issuer

if TYPE_CHECKING:
    import numpy as np

L = _lib.lib


class Engine(_Issuer):
    """A kvferry engine (kvf_engine). Keyword arguments are the settings of
    kvf_engine_config by their names in docs/configuration.md (the struct's
    group and field joined by '_'): backend, device, threads, file_dir,
    file_namespace, file_io, fsync, file_runner, file_queue_depth,
    gds_compat, remote_url, remote_ttl_s, remote_timeout_ms, cuda_copy,
    cuda_copy_sms, config_file and remote_mem_bytes. Use it as a context manager, or call
    close(); slot views and registered buffers are valid until then.

    A keyword left at its default is taken from the environment (KVF_*),
    else from the YAML config file, else the default
    (docs/configuration.md); settings() says where each came from.
    config_file (a str or path; default $KVF_CONFIG) names that file; a
    Cache on this engine reads its cache_* keys from it too. A bad value
    there raises InvalidArgument naming the file, line and key; a missing
    file NotFound; a build without libyaml Unsupported.

    Calls may come from several threads; close() must be the last one."""

    _what = "engine"
    _wait_fn = L.kvf_wait_errors
    _poll_fn = L.kvf_poll_errors
    _wait_pool_fn = L.kvf_wait_pool
    _stream_wait_pool_fn = L.kvf_stream_wait_pool
    _ticket_t = _lib.Ticket_t  # not interchangeable with a Cache's

    def __init__(self, **config):
        unknown = set(config) - set(_DEFAULT_CONFIG)
        if unknown:
            raise TypeError(f"Engine: unknown config field(s) {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(_DEFAULT_CONFIG)}")
        cfg = dict(_DEFAULT_CONFIG, **config)
        self._handle = None
        self._owners = []  # registered caller memory, kept until after destroy
        self._pools = []
        self._pending = {}  # ticket id -> move count
        self._lock = threading.Lock()
        self._caches = weakref.WeakSet()  # closed before the engine
        c = _lib.EngineConfig_t()
        c.struct_size = ctypes.sizeof(_lib.EngineConfig_t)
        # each keyword into its field (file_dir is .file.dir), checked for its C type
        self._cstrs = fill(c, ((_CONFIG_FIELDS[k], k, _CONFIG_ENUMS[k](v) if k in _CONFIG_ENUMS else v)
                               for k, v in cfg.items()))
        self.config = cfg
        h = ctypes.c_void_p()
        check(L.kvf_engine_create(ctypes.byref(c), ctypes.byref(h)))
        self._handle = h.value
        self.backend = Backend(L.kvf_engine_backend(self._handle))

    # -- life --
    def close(self) -> None:
        """Waits for every batch in flight, frees the engine, then releases
        the registered caller memory. Idempotent."""
        for cache in list(getattr(self, "_caches", ())):
            cache.close()  # a cache must not outlive its engine
        h, self._handle = self._handle, None
        if h:
            L.kvf_engine_destroy(h)
        for pool in self._pools:
            for lv in (pool.primary, pool.secondary):
                if lv is not None:
                    lv.owner = None
        self._owners.clear()
        self._pending.clear()

    def settings(self) -> Dict[str, Setting]:
        """The engine's effective settings, {name: Setting(value, source,
        env)}, as resolved at create: every kvf_engine_config field by its
        config-file key ("backend", "file_dir", ...), config_file, and the
        process-wide knobs (file_direct, fsync_method, ...)."""
        return _settings(L.kvf_engine_settings, self._h())

    def __repr__(self):
        state = self.backend.name.lower() if self._handle else "closed"
        return f"<kvferry.Engine {state}, {len(self._pools)} pools>"

    # -- pools --
    @property
    def pools(self) -> List[Pool]:
        return list(self._pools)

    @property
    def pool_count(self) -> int:
        return L.kvf_engine_pool_count(self._h())

    def _desc(self, spec, level, index, g):
        what = f"pool {index} {level.name.lower()}"
        if spec is None:
            return None, None
        if _is_int(spec):
            spec = PoolDesc(slots=int(spec))
        elif isinstance(spec, dict):
            spec = PoolDesc(**spec)
        elif not isinstance(spec, PoolDesc):
            spec = PoolDesc(buffer=spec)
        cuda = self.backend == Backend.CUDA
        memory = None if spec.memory is None else Memory(spec.memory)
        stride = int(spec.slot_stride or 0)
        slots = spec.slots
        base = None
        owner = None
        if spec.buffer is not None:
            buf = as_buffer(spec.buffer, what)
            owner = buf
            if memory is None:
                memory = {CUDA: Memory.DEVICE, PINNED: Memory.HOST_PINNED}.get(
                    buf.kind, Memory.HOST_PINNED if cuda else Memory.HOST)
            if memory == Memory.DEVICE and buf.kind != CUDA:
                raise make_error(Status.ERR_INVALID, f"{what}: DEVICE memory was asked for but the buffer "
                                 f"({buf.source}) is host memory")
            if memory != Memory.DEVICE and buf.kind == CUDA:
                raise make_error(Status.ERR_INVALID, f"{what}: the buffer ({buf.source}) is CUDA device memory, "
                                 f"but {memory.name} memory was asked for"
                                 + (" (the host backend takes host memory only)" if not cuda else ""))
            if buf.kind == CUDA and not cuda:
                raise make_error(Status.ERR_INVALID, f"{what}: the buffer is CUDA memory; the engine runs on the "
                                 f"{self.backend.name.lower()} backend")
            if buf.kind == CUDA and buf.device is not None and buf.device != self.config["device"]:
                raise make_error(Status.ERR_INVALID, f"{what}: the buffer is on CUDA device {buf.device}, "
                                 f"the engine on device {self.config['device']}")
            eff = stride or g.block_bytes
            if slots is None:
                if buf.nbytes < eff or buf.nbytes % eff:
                    raise make_error(Status.ERR_RANGE, f"{what}: the buffer's {buf.nbytes} bytes are not a whole "
                                     f"number of {eff}-byte slots (check the geometry)")
                slots = buf.nbytes // eff
            elif buf.nbytes < int(slots) * eff:
                raise make_error(Status.ERR_RANGE, f"{what}: the buffer holds {buf.nbytes} bytes; {slots} slots "
                                 f"x {eff} bytes = {int(slots) * eff} are needed")
            if not buf.ptr:
                raise make_error(Status.ERR_INVALID, f"{what}: the buffer's address is NULL")
            base = buf.ptr
        else:
            if slots is None:
                raise make_error(Status.ERR_INVALID, f"{what}: give a slot count or a buffer")
            if memory is None:
                memory = (Memory.DEVICE if level == Level.PRIMARY else Memory.HOST_PINNED) if cuda else Memory.HOST
        d = _lib.PoolDesc_t()
        fill(d, (("memory", f"{what}: memory", memory), ("base", f"{what}: base", base),
                 ("slot_stride", f"{what}: slot_stride", stride), ("slots", f"{what}: slots", slots)))
        slots = d.slots
        return d, PoolLevel(memory, slots, stride or g.block_bytes, owner)

    def add_pool(self, geometry: Optional[Geometry] = None, primary=None, secondary=None, **geometry_fields) -> Pool:
        """Adds a pool (before the first transfer). primary / secondary are
        each a slot count (kvferry allocates), a PoolDesc, or a buffer to
        register; secondary None means a pool offloaded only to files.
        Geometry as a Geometry or as keywords (layers=, kv_factor=, ...)."""
        h = self._h()
        g = _geometry(geometry, **geometry_fields)
        if primary is None:
            raise make_error(Status.ERR_INVALID, "add_pool: primary slots are required")
        index = L.kvf_engine_pool_count(h)
        gc = g._c()
        pd, pl = self._desc(primary, Level.PRIMARY, index, g)
        sd, sl = self._desc(secondary, Level.SECONDARY, index, g)
        out = ctypes.c_uint32()
        check(L.kvf_engine_add_pool(h, ctypes.byref(gc), ctypes.byref(pd),
                                    ctypes.byref(sd) if sd is not None else None, ctypes.byref(out)))
        for lv in (pl, sl):
            if lv is not None and lv.owner is not None:
                self._owners.append(lv.owner)
        pool = Pool(self, out.value, g, pl, sl)
        self._pools.append(pool)
        return pool

    def slot_ptr(self, pool: int, slot: int, level: LevelLike = Level.PRIMARY) -> int:
        """Address of one slot (host memory, or device memory for CUDA primaries)."""
        p = ctypes.c_void_p()
        check(L.kvf_engine_slot_ptr(self._h(), c_int(pool, ctypes.c_uint32, "slot_ptr: pool"), int(Level(level)),
                                    c_int(slot, ctypes.c_uint32, "slot_ptr: slot"), ctypes.byref(p)))
        return p.value

    def slot_view(self, pool: int, slot: int, level: LevelLike = Level.PRIMARY) -> "np.ndarray":
        """One slot's block bytes as a writable NumPy uint8 array, for host
        memory (every slot on the host backend, secondary slots on CUDA).
        Valid until the engine is closed; write a primary slot only while no
        transfer touching it is in flight."""
        import numpy as np

        pool, level = int(pool), Level(level)
        ptr = self.slot_ptr(pool, slot, level)
        if pool < len(self._pools):
            p = self._pools[pool]
            lv = p.level(level)
            if lv is not None and lv.memory == Memory.DEVICE:
                raise make_error(Status.ERR_UNSUPPORTED, f"pool {pool} {level.name.lower()} slot {slot}: device "
                                 f"memory cannot be viewed as a NumPy array")
            nbytes = p.block_bytes
        else:
            raise make_error(Status.ERR_RANGE, f"pool {pool}: not added through this Engine object")
        return np.asarray(_ViewOwner(self, ptr, nbytes))

    # -- moves --
    def _submit(self, fn, args, moves, detach, args_keep=None, side=None):
        ptr, n, keep = _as_moves(moves, side)
        t = _lib.Ticket_t()
        check(fn(self._h(), *args, ptr, n, None if detach else ctypes.byref(t)))
        del keep, args_keep  # copied by the library
        if detach:
            return None
        return self._issue(t.id, n)

    def offload(self, to: TierLike, moves, *, detach: bool = False, after=None, pools=None) -> Optional[Ticket]:
        """Queues offloads (primary slot -> secondary slot, or -> file key).
        moves: one (src, dst[, tokens]) or a batch: a list of them, an int
        array of shape (n, 2|3) or a structured array with src/dst/tokens.
        Returns a Ticket; detach=True: fire and forget (None).
        after: a CUDA stream (torch.cuda.Stream, an object with .cuda_stream
        or __cuda_stream__, or an int cudaStream_t): the batch reads no
        byte before the work queued on it so far has finished, and this
        thread does not wait for it (kvf_offload_after). None: not ordered.
        The host backend refuses a stream (KvfError ERR_UNSUPPORTED).
        pools: a list of pool indices to move only those (a layer at a
        time; some pools only to Tier.HOST), in that order
        (kvf_offload_pools); None: every pool."""
        stream = None if after is None else _stream_handle(after, "offload")
        if pools is not None:
            pp, np_, keep = _pool_list(pools, "offload")
            return self._submit(L.kvf_offload_pools, (stream, int(Tier(to)), pp, np_), moves, detach, keep,
                                _key_side(to, True))
        if after is None:
            return self._submit(L.kvf_offload, (int(Tier(to)),), moves, detach, side=_key_side(to, True))
        return self._submit(L.kvf_offload_after, (stream, int(Tier(to))), moves, detach, side=_key_side(to, True))

    def onboard(self, frm: TierLike, moves, *, detach: bool = False, pools=None) -> Optional[Ticket]:
        """Queues onboards (secondary slot or file key -> primary slot); as
        offload. pools: move only these pools, arriving in this order
        (kvf_onboard_pools); wait for one with Ticket.wait_pool or
        Ticket.stream_wait_pool."""
        if pools is not None:
            pp, np_, keep = _pool_list(pools, "onboard")
            return self._submit(L.kvf_onboard_pools, (int(Tier(frm)), pp, np_), moves, detach, keep,
                                _key_side(frm, False))
        return self._submit(L.kvf_onboard, (int(Tier(frm)),), moves, detach, side=_key_side(frm, False))

    def copy(self, moves, *, detach: bool = False) -> Optional[Ticket]:
        """Queues primary -> primary copies; as offload."""
        return self._submit(L.kvf_copy, (), moves, detach)

    def demote(self, moves, *, to: TierLike = Tier.DISK, detach: bool = False) -> Optional[Ticket]:
        """Queues secondary slot -> `to` moves (src = secondary slot, dst =
        block key), leaving the primary slots alone; as offload. `to` is
        Tier.DISK or Tier.REMOTE."""
        return self._submit(L.kvf_demote, (int(Tier(to)),), moves, detach, side=_key_side(to, True))

    def promote(self, moves, *, frm: TierLike = Tier.DISK, detach: bool = False) -> Optional[Ticket]:
        """Queues `frm` -> secondary slot moves (src = block key, dst =
        secondary slot); as demote."""
        return self._submit(L.kvf_promote, (int(Tier(frm)),), moves, detach, side=_key_side(frm, False))

    def remove(self, tier: TierLike, keys, *, detach: bool = False) -> Optional[Ticket]:
        """Removes stored blocks from Tier.DISK or Tier.REMOTE (there for
        every engine sharing the namespace), in order with the moves queued
        before on the same keys; a key with no block there is not an error.
        keys: one int (below 2**128), a list of them or an integer NumPy
        array (or one of shape (n, 2): (hi, lo) halves)."""
        tier = Tier(tier)
        ptr, n, keep = key_array(keys, f"remove from {tier.name.lower()}")
        t = _lib.Ticket_t()
        check(L.kvf_remove(self._h(), int(tier), ptr, n, None if detach else ctypes.byref(t)))
        del keep
        return None if detach else self._issue(t.id, n)

    def file_remove(self, keys, *, detach: bool = False) -> Optional[Ticket]:
        """remove(Tier.DISK, keys)."""
        return self.remove(Tier.DISK, keys, detach=detach)

    def remote_remove(self, keys, *, detach: bool = False) -> Optional[Ticket]:
        """remove(Tier.REMOTE, keys)."""
        return self.remove(Tier.REMOTE, keys, detach=detach)

    def sync_stream(self, stream=None) -> None:
        """Orders work queued on `stream` after every batch queued so far.
        stream: None (block this thread until those batches complete), an int
        cudaStream_t, or an object with .cuda_stream (torch.cuda.Stream) or
        __cuda_stream__."""
        check(L.kvf_sync_stream(self._h(), _stream_handle(stream)))

    # -- read costs (docs/planner.md) --
    def costs(self) -> Dict[Tier, TierCost]:
        """Each tier's read cost as the engine sees it now (kvf_engine_costs):
        seeded, then learnt from every onboard batch that completed; a
        learnt cost whose newest read is a minute old is forgotten (back to
        its starting estimate, the last set value or calibration's fit, observed 0)."""
        c = _lib.Costs_t()
        c.struct_size = ctypes.sizeof(_lib.Costs_t)
        check(L.kvf_engine_costs(self._h(), ctypes.byref(c)))
        return costs_from_c(c)

    def layerwise_tiers(self) -> Tuple[Tier, ...]:
        """The tiers whose blocks the layer-wise loads deliver pool by pool
        on this engine (kvf_engine_layerwise_tiers): what plan()'s
        layerwise_tiers takes."""
        mask = L.kvf_engine_layerwise_tiers(self._h())
        return tuple(t for t in Tier if mask >> int(t) & 1)

    def arrival_groups(self, tier: TierLike) -> int:
        """In how many steps a layer-wise load from `tier` arrives
        (kvf_engine_arrival_groups): the pool groups of DISK and REMOTE,
        the pool count for HOST and GPU on the CUDA backend, 0 for a tier
        arriving whole: what plan()'s arrival_steps takes."""
        return int(L.kvf_engine_arrival_groups(self._h(), int(Tier(tier))))

    def set_tier_cost(self, tier: TierLike, latency_s: float, bytes_per_s: float, hold: bool = False) -> None:
        """Sets a tier's cost: a new starting point observations keep
        updating, or with hold=True fixed until set again."""
        lat, bw = check_cost_args(latency_s, bytes_per_s)
        check(L.kvf_engine_set_tier_cost(self._h(), int(Tier(tier)), lat, bw, 1 if hold else 0))

    def observe_tier_cost(self, tier: TierLike, nbytes: int, seconds: float) -> None:
        """Feeds one read of nbytes from `tier` that took `seconds`, as the
        engine does for its own batches."""
        if isinstance(nbytes, bool) or not _is_int(nbytes) or not 0 <= nbytes < 2**64:
            raise make_error(Status.ERR_INVALID, f"observe_tier_cost: nbytes = {nbytes!r}")
        check(L.kvf_engine_observe_tier_cost(self._h(), int(Tier(tier)), int(nbytes), float(seconds)))

    def calibrate(self, slots, host_slots=None, key_base: int = 0x6B7666657272790, rounds: int = 3) -> Dict[Tier, TierCost]:
        """Times reads of len(slots) scratch blocks from each tier the engine
        has (kvf_engine_calibrate): the primary slots `slots` and secondary
        slots `host_slots` (None: the host tier is not timed) are overwritten;
        scratch keys key_base + i are written to disk / remote and removed.
        Returns costs()."""
        sp, n, keep = _uint_array(slots, "calibrate", 32, "slot")
        hp, m, hkeep = (None, n, None) if host_slots is None else _uint_array(host_slots, "calibrate", 32, "slot")
        if m != n:
            raise make_error(Status.ERR_INVALID, f"calibrate: {n} slots but {m} host_slots")
        check(L.kvf_engine_calibrate(self._h(), sp, hp, n, c_key(key_base, "calibrate: key_base"),
                                     c_int(rounds, ctypes.c_uint32, "calibrate: rounds")))
        del keep, hkeep
        return self.costs()
