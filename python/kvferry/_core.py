# SPDX-License-Identifier: Apache-2.0
"""Engine, pools, moves and tickets over the C API."""

import ctypes
import numbers
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple

from . import _lib
from ._buffers import CUDA, PINNED, as_buffer
from ._enums import (Backend, CudaCopy, Dtype, DtypeLike, FileIO, FileRunner, Fsync, GdsCompat, GdsState, Level, LevelLike, Memory,
                     Order, SettingSource, Status, Tier, TierLike, status)
from ._cargs import c_int, c_key, fill, key_array
from ._errors import MoveError, check, make_error
from ._plan import TierCost, check_cost_args, costs_from_c

if TYPE_CHECKING:
    import numpy as np

L = _lib.lib

# ---- geometry ----------------------------------------------------------------


class Region(NamedTuple):
    """Where a block's first N tokens lie: `rows` runs of `row_bytes`, `pitch` apart."""

    rows: int
    row_bytes: int
    pitch: int


def _dtype(value: DtypeLike) -> Dtype:
    return Dtype(value)  # names in any case, as kvf_dtype_name spells them too


@dataclass
class Geometry:
    """The shape of one block of one pool (kvf_geometry). dtype may be a
    Dtype or its name ("fp16", "bf16", "int4", ...)."""

    layers: int
    kv_factor: int
    kv_heads: int
    tokens_per_block: int
    head_size: int
    dtype: Dtype = Dtype.FP16
    order: Order = Order.HEAD_MAJOR

    def __post_init__(self):
        self.dtype = _dtype(self.dtype)
        self.order = Order(self.order)

    def _c(self) -> _lib.Geometry_t:
        g = _lib.Geometry_t()
        fill(g, ((name, f"geometry: {name}", getattr(self, name)) for name, *_ in _lib.Geometry_t._fields_))
        return g

    def check(self) -> None:
        """Raises InvalidArgument / OutOfRange when kvferry would refuse it."""
        check(L.kvf_geometry_check(ctypes.byref(self._c())))

    @property
    def block_bytes(self) -> int:
        out = ctypes.c_size_t()
        check(L.kvf_geometry_block_bytes(ctypes.byref(self._c()), ctypes.byref(out)))
        return out.value

    def region(self, tokens: int = 0) -> Region:
        out = _lib.Region_t()
        check(L.kvf_geometry_region(ctypes.byref(self._c()), c_int(tokens, ctypes.c_uint32, "region: tokens"),
                                    ctypes.byref(out)))
        return Region(out.rows, out.row_bytes, out.pitch)


def _geometry(g=None, **kw) -> Geometry:
    if g is None:
        return Geometry(**kw)
    if kw:
        raise TypeError("pass a Geometry or its fields as keywords, not both")
    if isinstance(g, Geometry):
        return g
    if isinstance(g, dict):
        return Geometry(**g)
    raise TypeError(f"expected a Geometry, got {type(g).__name__}")


def block_bytes(geometry: Optional[Geometry] = None, **fields) -> int:
    """Bytes of one block: block_bytes(g) or block_bytes(layers=..., ...)."""
    return _geometry(geometry, **fields).block_bytes


def region(geometry: Geometry, tokens: int = 0) -> Region:
    """The strided region holding a block's first `tokens` tokens (0: the whole block)."""
    return _geometry(geometry).region(tokens)


def dtype_bits(dtype: DtypeLike) -> int:
    return L.kvf_dtype_bits(int(_dtype(dtype)))


# ---- information ---------------------------------------------------------------


def version() -> str:
    """The library's version string, e.g. "0.1.0 (cuda)"."""
    return L.kvf_version().decode()


@dataclass(frozen=True)
class StoreInfo:
    """One store of the library (kvf_store_info_get): where blocks can be kept."""

    name: str  # "file", "redis", "mem"
    schemes: Tuple[str, ...]  # the URL schemes it serves: ("redis://", "redis-cluster://", ...)
    built: bool  # this build can open it
    remote: bool  # it can be an engine's remote tier
    detail: str  # built: what with ("hiredis 1.2.0, TLS (rediss://)"); else what the build lacks


@dataclass(frozen=True)
class Info:
    cuda_built: bool
    cuda_devices: int
    cuda_runtime: int
    cufile_present: bool
    uring_built: bool
    device_name: str
    cuda_error: str
    remote_built: bool = False
    gds_state: GdsState = GdsState.ABSENT  # what probing cuFile found
    gds_detail: str = ""  # what the probe found, or why not
    stores: Tuple[StoreInfo, ...] = ()  # every store of the library, built or not


def _stores() -> Tuple[StoreInfo, ...]:
    out = []
    while True:
        s = _lib.StoreInfo_t()
        s.struct_size = ctypes.sizeof(_lib.StoreInfo_t)
        st = L.kvf_store_info_get(len(out), ctypes.byref(s))
        if st == Status.ERR_NOT_FOUND:
            return tuple(out)
        check(st)
        out.append(StoreInfo(s.name.decode(), tuple(s.schemes.decode().split()), bool(s.built),
                             bool(s.remote), s.detail.decode(errors="replace")))


def info() -> Info:
    """What this machine offers kvferry (kvf_info_get)."""
    i = _lib.Info_t()
    i.struct_size = ctypes.sizeof(_lib.Info_t)
    check(L.kvf_info_get(ctypes.byref(i)))
    return Info(bool(i.cuda_built), i.cuda_devices, i.cuda_runtime, bool(i.cufile_present),
                bool(i.uring_built), i.device_name.decode(errors="replace"),
                i.cuda_error.decode(errors="replace"), bool(i.remote_built), GdsState(i.gds_state),
                i.gds_detail.decode(errors="replace"), _stores())


# ---- moves ---------------------------------------------------------------------


class Move(NamedTuple):
    """One block to move; tokens 0 means the whole block."""

    src: int
    dst: int
    tokens: int = 0


def move_dtype() -> "np.dtype":
    """The NumPy structured dtype laid out as kvf_move (40 bytes): src,
    dst, tokens, and the block key's halves key_hi, key_lo (DISK and
    REMOTE moves name their block there; src / dst then 0 on that side)."""
    import numpy as np

    return np.dtype({"names": ["src", "dst", "tokens", "key_hi", "key_lo"],
                     "formats": ["<u8", "<u8", "<u4", "<u8", "<u8"],
                     "offsets": [0, 8, 16, 24, 32], "itemsize": 40})


def _key_side(tier, into: bool) -> Optional[str]:
    """Which of a move's (src, dst) is the block key: a move into DISK or
    REMOTE keys its dst, one out of them its src; slot moves: None."""
    if tier is None or Tier(tier) not in (Tier.DISK, Tier.REMOTE):
        return None
    return "dst" if into else "src"



def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _moves_from_numpy(a, side=None):
    import numpy as np

    dt = move_dtype()
    if a.dtype.names:
        if "src" not in a.dtype.names or "dst" not in a.dtype.names:
            raise make_error(Status.ERR_INVALID, "moves: a structured array needs fields 'src' and 'dst'")
        a = a.reshape(-1)
        out = np.zeros(a.shape[0], dt)
        for f in ("src", "dst", "tokens", "key_hi", "key_lo"):
            if f in a.dtype.names:
                col = a[f]
                if np.issubdtype(col.dtype, np.signedinteger) and (col < 0).any():
                    raise make_error(Status.ERR_INVALID, f"moves: negative {f}")
                out[f] = col
        return out
    if not np.issubdtype(a.dtype, np.integer):
        raise make_error(Status.ERR_INVALID, f"moves: an integer array is needed, not {a.dtype}")
    if a.ndim == 1 and a.shape[0] in (2, 3):
        a = a.reshape(1, -1)
    if a.ndim != 2 or a.shape[1] not in (2, 3):
        raise make_error(Status.ERR_INVALID, f"moves: an int array of shape (n, 2) or (n, 3) is needed, not {a.shape}")
    if np.issubdtype(a.dtype, np.signedinteger) and (a < 0).any():
        raise make_error(Status.ERR_INVALID, "moves: negative slot, key or token count")
    out = np.zeros(a.shape[0], dt)
    out["src"] = a[:, 0]
    out["dst"] = a[:, 1]
    if a.shape[1] == 3:
        if (a[:, 2] >= 2**32).any():
            raise make_error(Status.ERR_INVALID, "moves: token count above 2^32")
        out["tokens"] = a[:, 2]
    return out


def _as_moves(moves, side=None):
    """(pointer, count, keepalive) for one move or a batch. side: which of
    (src, dst) holds the block key for DISK and REMOTE moves (_key_side):
    an int below 2**128, moved into kvf_move.key, that side left 0."""
    if type(moves).__module__ == "numpy" and hasattr(moves, "dtype"):
        if moves.ndim == 0:  # one structured element
            moves = moves.reshape(1)
        arr = _moves_from_numpy(moves)
        if side is not None:
            take = (arr["key_hi"] == 0) & (arr["key_lo"] == 0)
            arr["key_lo"][take] = arr[side][take]
            arr[side] = 0
        return arr.ctypes.data, arr.shape[0], arr
    if isinstance(moves, (tuple, list)) and moves and _is_int(moves[0]):
        moves = [moves]  # one move
    seq = list(moves)
    arr = (_lib.Move_t * max(len(seq), 1))()
    for i, m in enumerate(seq):
        if isinstance(m, dict):
            m = (m["src"], m["dst"], m.get("tokens", 0))
        try:
            vals = tuple(int(v) for v in m)
        except TypeError:
            raise make_error(Status.ERR_INVALID, f"moves: entry {i} is {m!r}, not (src, dst[, tokens])") from None
        if len(vals) not in (2, 3):
            raise make_error(Status.ERR_INVALID, f"moves: entry {i} has {len(vals)} fields, not (src, dst[, tokens])")
        src, dst, tokens = vals if len(vals) == 3 else vals + (0,)
        if side is not None:
            key = src if side == "src" else dst
            arr[i].key = c_key(key, f"moves: entry {i}: {side}")
            src, dst = (0, dst) if side == "src" else (src, 0)
        if not (0 <= src < 2**64 and 0 <= dst < 2**64 and 0 <= tokens < 2**32):
            raise make_error(Status.ERR_INVALID, f"moves: entry {i} = {vals} is out of range (unsigned src/dst, 32-bit tokens)")
        arr[i].src, arr[i].dst, arr[i].tokens = src, dst, tokens
    return ctypes.addressof(arr), len(seq), arr


# ---- tickets -------------------------------------------------------------------

_SENTINEL = 0x7FFF_FFFF  # never a kvf_status: tells "nothing written" apart


class Ticket:
    """A submitted batch. poll() / wait() return one Status per move once the
    batch is complete (and keep returning it); a failed move's status says
    which block is lost, errors() why. wait(check=True) raises instead: the
    first failed move's error, carrying every failure (.failures)."""

    __slots__ = ("engine", "id", "count", "_statuses", "_errors", "_error_count")

    def __init__(self, engine, ticket_id: int, count: int):
        self.engine, self.id, self.count, self._statuses = engine, ticket_id, count, None
        self._errors, self._error_count = (), 0

    def __int__(self):
        return self.id

    def __index__(self):
        return self.id

    def __repr__(self):
        st = self._statuses
        state = "pending" if st is None else ("ok" if all(s == Status.OK for s in st) else "failed")
        return f"<kvferry.Ticket {self.id}: {self.count} moves, {state}>"

    def _take(self, result) -> None:
        if result is not None:
            self._statuses, self._errors, self._error_count = result

    def poll(self) -> Optional[List[Status]]:
        """None while in flight, else the per-move statuses."""
        if self._statuses is None:
            self._take(self.engine._result(self.id, self.count, block=False))
        return self._statuses

    def wait(self, check: bool = False) -> List[Status]:
        """Blocks until complete; the per-move statuses. check=True raises
        when a move failed: the first failed move's error class (IOFailure,
        Corrupt, ...), its .failures a MoveError for each failed move."""
        if self._statuses is None:
            self._take(self.engine._result(self.id, self.count, block=True))
        if check:
            self.raise_for_status()
        return self._statuses

    def wait_pool(self, pool: int) -> None:
        """Blocks until pool `pool` of every move has arrived, without
        retiring the ticket (wait() still gives the statuses); raises the
        failure of a move already known, or ERR_RANGE for a pool the batch
        does not move (kvf_wait_pool). A batch already waited for returns
        at once, raising if a move failed."""
        self._wait_pool(pool, None)

    def stream_wait_pool(self, pool: int, stream=None) -> None:
        """As wait_pool, but work queued on `stream` after this call waits
        for the pool on the GPU, the host only until the batch is on the
        device (kvf_stream_wait_pool). stream: a torch.cuda.Stream, an
        object with .cuda_stream or __cuda_stream__, or an int
        cudaStream_t; None: torch's current stream where torch has CUDA,
        else a host wait."""
        self._wait_pool(pool, _stream_handle(stream, "stream_wait_pool") if stream is not None
                        else _torch_stream())

    def _wait_pool(self, pool, handle) -> None:
        if self._statuses is not None:
            self.raise_for_status()
            return
        if not _is_int(pool) or not 0 <= pool < 2**32:
            raise make_error(Status.ERR_INVALID, f"wait_pool: pool {pool!r} is not a pool index")
        self.engine._wait_pool(self.id, int(pool), handle)

    @property
    def done(self) -> bool:
        return self.poll() is not None

    @property
    def statuses(self) -> Optional[List[Status]]:
        return self._statuses

    @property
    def ok(self) -> bool:
        """Complete and every move succeeded (polls)."""
        st = self.poll()
        return st is not None and all(s == Status.OK for s in st)

    def failed(self) -> List[int]:
        """Indices of the moves that failed (waits)."""
        return [i for i, s in enumerate(self.wait()) if s != Status.OK]

    def errors(self) -> List[MoveError]:
        """Why moves failed, without raising (waits): a MoveError (index,
        status, message naming block, slot, file or node and the reason) per
        failed move in index order; the first ERRORS_KEPT of them when more
        failed (error_count says how many did)."""
        self.wait()
        return list(self._errors)

    @property
    def error_count(self) -> int:
        """Moves that failed (waits); errors() holds at most ERRORS_KEPT."""
        self.wait()
        return self._error_count

    def raise_for_status(self) -> None:
        st = self.wait()
        if self._error_count == 0:
            return
        first = self._errors[0] if self._errors else None
        if first is None:  # cannot happen: a failure always has its message
            i = next(i for i, s in enumerate(st) if s != Status.OK)
            first = MoveError(i, st[i], _lib.status_str(st[i]))
        err = make_error(first.status, f"ticket {self.id}: {self._error_count} of {self.count} moves failed; "
                                       f"move {first.index}: {first.message}")
        err.failures = tuple(self._errors)
        raise err


ERRORS_KEPT = 64  # failed moves' messages a Ticket keeps (their statuses are all kept)


# ---- pools ---------------------------------------------------------------------


@dataclass
class PoolDesc:
    """One array of block slots (kvf_pool_desc). With buffer None kvferry
    allocates `slots` slots; with a buffer (NumPy array, __array_interface__,
    __cuda_array_interface__ or __dlpack__ object) the caller's memory is
    registered, `slots` defaults to what the buffer holds, and the owner is
    kept alive with the engine. memory None picks what the backend and the
    buffer call for."""

    slots: Optional[int] = None
    memory: Optional[Memory] = None
    buffer: Any = None
    slot_stride: int = 0


@dataclass
class PoolLevel:
    memory: Memory
    slots: int
    slot_stride: int
    owner: Any = field(default=None, repr=False)


class Pool:
    """One registered pool: its index, geometry and slot arrays."""

    def __init__(self, engine, index, geometry, primary, secondary):
        self.engine = engine
        self.index = index
        self.geometry = geometry
        self.block_bytes = geometry.block_bytes
        self.primary = primary
        self.secondary = secondary

    def __repr__(self):
        return (f"<kvferry.Pool {self.index}: {self.block_bytes} B blocks, primary {self.primary.slots} "
                f"{self.primary.memory.name}, secondary "
                f"{self.secondary.slots if self.secondary else 0}>")

    def level(self, level: LevelLike) -> Optional[PoolLevel]:
        return self.primary if Level(level) == Level.PRIMARY else self.secondary

    def slot_ptr(self, slot: int, level: LevelLike = Level.PRIMARY) -> int:
        return self.engine.slot_ptr(self.index, slot, level)

    def slot_view(self, slot: int, level: LevelLike = Level.PRIMARY) -> "np.ndarray":
        return self.engine.slot_view(self.index, slot, level)


class _ViewOwner:
    """The base of a slot view: keeps the engine object referenced."""

    def __init__(self, engine, ptr, nbytes):
        self.engine = engine
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


# ---- handles and what issues tickets ---------------------------------------------


class _Handle:
    """A C handle closed by close() (idempotent), a context manager, and
    closed when collected. Subclasses set _what ("engine", "cache")."""

    _what = "handle"
    _handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _h(self):
        if self._handle is None:
            raise make_error(Status.ERR_STATE, f"{self._what} is closed")
        return self._handle


class _Issuer(_Handle):
    """Tickets of an Engine (kvf_wait_errors / kvf_poll_errors) or a Cache
    (kvf_cache_wait_errors / kvf_cache_poll_errors): set _wait_fn and
    _poll_fn, _h() and _pending / _lock."""

    _wait_fn = _poll_fn = _ticket_t = None

    def _result(self, ticket_id, count, block):
        """None while in flight, else (statuses, MoveErrors kept, failures)."""
        per = (_lib.c_status * max(count, 1))(*([_SENTINEL] * max(count, 1)))
        cap = min(max(count, 1), ERRORS_KEPT)
        errs = (_lib.MoveError_t * cap)()
        n_err = ctypes.c_size_t(_SENTINEL)
        fn = self._wait_fn if block else self._poll_fn
        ret = fn(self._h(), self._ticket_t(ticket_id), per if count else None, errs, cap, ctypes.byref(n_err))
        if ret == Status.INPROGRESS:
            return None
        if ret < 0 and n_err.value == _SENTINEL:
            raise make_error(ret)  # the call itself failed (unknown ticket, ...)
        with self._lock:
            self._pending.pop(ticket_id, None)
        kept = tuple(MoveError(int(e.index), status(e.status), e.message.decode(errors="replace"))
                     for e in errs[:min(n_err.value, cap)])
        return [status(per[i]) for i in range(count)], kept, int(n_err.value)

    def _issue(self, ticket_id: int, count: int) -> Ticket:
        with self._lock:
            self._pending[ticket_id] = count
        return Ticket(self, ticket_id, count)

    def _ticket(self, ticket) -> Ticket:
        if isinstance(ticket, Ticket):
            return ticket
        tid = int(ticket)
        with self._lock:
            n = self._pending.get(tid, 0)
        return Ticket(self, tid, n)

    _wait_pool_fn = _stream_wait_pool_fn = None

    def _wait_pool(self, ticket_id: int, pool: int, stream) -> None:
        t = self._ticket_t(ticket_id)
        pool = c_int(pool, ctypes.c_uint32, "wait_pool: pool")
        if stream is None:
            check(self._wait_pool_fn(self._h(), t, pool))
        else:
            check(self._stream_wait_pool_fn(self._h(), t, pool, stream))

    def poll(self, ticket) -> Optional[List[Status]]:
        """As Ticket.poll, for a Ticket or a ticket number. A number never
        issued here, or one already retired, raises UnknownTicket."""
        return self._ticket(ticket).poll()

    def wait(self, ticket, check: bool = False) -> List[Status]:
        """As Ticket.wait, for a Ticket or a ticket number."""
        return self._ticket(ticket).wait(check)


def _uint_array(values, what, bits=64, item="value"):
    """(pointer, count, keepalive) of an array of unsigned `bits`-bit ints
    (64 or 32) from one int, a list of ints or an integer NumPy array."""
    ctype, limit = (ctypes.c_uint64, 2**64) if bits == 64 else (ctypes.c_uint32, 2**32)
    if _is_int(values):
        values = [values]
    if type(values).__module__ == "numpy" and hasattr(values, "dtype"):
        import numpy as np

        a = values.reshape(-1)
        if not np.issubdtype(a.dtype, np.integer):
            raise make_error(Status.ERR_INVALID, f"{what}: an integer array is needed, not {a.dtype}")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= limit):
            raise make_error(Status.ERR_INVALID, f"{what}: each {item} is in 0..2^{bits}-1")
        a = np.ascontiguousarray(a, dtype=np.uint64 if bits == 64 else np.uint32)
        return a.ctypes.data, a.shape[0], a
    seq = list(values)
    arr = (ctype * max(len(seq), 1))()
    for i, v in enumerate(seq):
        if not _is_int(v) or not 0 <= v < limit:
            raise make_error(Status.ERR_INVALID, f"{what}: entry {i} = {v!r} is not a {item} (0..2^{bits}-1)")
        arr[i] = int(v)
    return ctypes.addressof(arr), len(seq), arr


# ---- engine --------------------------------------------------------------------

def _leaf_fields(struct, prefix="", base=0) -> Dict[int, str]:
    """{offset: dotted path} of a ctypes struct's fields, nested structs
    walked into ("file.dir")."""
    out = {}
    for name, ctype in struct._fields_:
        off = base + getattr(struct, name).offset
        if issubclass(ctype, ctypes.Structure):
            out.update(_leaf_fields(ctype, f"{prefix}{name}.", off))
        else:
            out[off] = prefix + name
    return out


def _config_fields() -> Dict[str, str]:
    """{setting: field path} of kvf_engine_config, in the library's order,
    from its settings table (kvf_engine_config_key): the keywords are the
    settings' names (docs/configuration.md), flat where the struct groups
    them by tier (file_dir is .file.dir)."""
    paths = _leaf_fields(_lib.EngineConfig_t)
    fields, off, i = {}, ctypes.c_size_t(), 0
    while True:
        key = L.kvf_engine_config_key(i, ctypes.byref(off))
        if key is None:
            return fields
        fields[key.decode()] = paths[off.value]
        i += 1


def _field(struct, path: str):
    for name in path.split("."):
        struct = getattr(struct, name)
    return struct


_CONFIG_FIELDS = _config_fields()
# the Python enum of each enum setting
_CONFIG_ENUMS = dict(backend=Backend, file_io=FileIO, fsync=Fsync, file_runner=FileRunner, gds_compat=GdsCompat,
                     cuda_copy=CudaCopy)
# every setting's default: its field in KVF_ENGINE_CONFIG_INIT, all zero
_DEFAULT_CONFIG = {k: _CONFIG_ENUMS.get(k, lambda v: v)(_field(_lib.EngineConfig_t(), path))
                   for k, path in _CONFIG_FIELDS.items()}


class Setting(NamedTuple):
    """One effective setting (kvf_setting): its value as text ("" for
    none), where it came from, and its environment variable."""

    value: str
    source: SettingSource
    env: str


def _settings(fn, handle) -> Dict[str, Setting]:
    """kvf_engine_settings / kvf_cache_settings as {name: Setting}, in the
    library's order."""
    arr = ctypes.POINTER(_lib.Setting_t)()
    n = ctypes.c_size_t()
    check(fn(handle, ctypes.byref(arr), ctypes.byref(n)))
    dec = lambda b: (b or b"").decode("utf-8", "replace")  # noqa: E731
    return {dec(arr[i].name): Setting(dec(arr[i].value), SettingSource(arr[i].source), dec(arr[i].env))
            for i in range(n.value)}


def _torch_stream():
    """torch's current CUDA stream where torch is loaded and has CUDA, else None."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.current_stream().cuda_stream) or _CUDA_STREAM_LEGACY


def _pool_list(pools, fn):
    """(pointer, count, keepalive) of a pool list; (None, 0, None) for None."""
    if pools is None:
        return None, 0, None
    return _uint_array(pools, f"{fn}: pools", bits=32, item="pool index")


# cudaStreamLegacy: CUDA's default stream named explicitly, where kvferry's
# C API takes NULL for "no stream" (a host wait)
_CUDA_STREAM_LEGACY = 1


def _stream_handle(stream, fn="sync_stream"):
    """The cudaStream_t of `stream` for the C API: None stays None (no
    stream); a stream object whose handle is 0 (torch's default stream) is
    CUDA's legacy default stream, passed as cudaStreamLegacy; an int is
    taken as it is, 0 meaning None."""
    if stream is None:
        return None
    if _is_int(stream):
        return int(stream) or None
    proto = getattr(stream, "__cuda_stream__", None)
    if callable(proto):
        return int(proto()[1]) or _CUDA_STREAM_LEGACY
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        return int(handle) or _CUDA_STREAM_LEGACY
    raise TypeError(f"{fn}: expected None, an int cudaStream_t or an object with .cuda_stream, "
                    f"not {type(stream).__name__}")


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
        seeded, then learnt from every onboard batch that completed."""
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
