# SPDX-License-Identifier: Apache-2.0
"""What the vLLM and SGLang adapters share: a serving engine's paged KV
tensors registered as kvferry pools, namespaces and string keys, and loads
that report per block what did not arrive. torch is imported by the caller
(its tensors are passed in), never here."""

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .._buffers import CUDA, HOST, PINNED, Buffer
from .._cache import Cache, key_salt, size_parse
from .._engine import Engine
from .._geometry import Geometry
from .._pools import PoolDesc
from .._tickets import Ticket
from .._enums import Backend, CacheRemote, Dtype, Memory, Order, Status
from .._errors import KvferryError, make_error

log = logging.getLogger("kvferry.integrations")

_DTYPES = {"float32": Dtype.FP32, "float16": Dtype.FP16, "bfloat16": Dtype.BF16, "float8_e4m3fn": Dtype.FP8_E4M3,
           "float8_e5m2": Dtype.FP8_E5M2, "int8": Dtype.INT8, "uint8": Dtype.INT8}


def kv_dtype(t) -> Dtype:
    """kvferry's element type for a torch tensor. Caches stored as raw
    bytes (uint8 views of fp8) count as 8-bit."""
    name = str(t.dtype).rsplit(".", 1)[-1]
    if name in _DTYPES:
        return _DTYPES[name]
    raise make_error(Status.ERR_UNSUPPORTED, f"KV tensor of dtype {t.dtype}: kvferry has no such element type")


@dataclass
class TensorPool:
    """One pool cut out of an engine tensor: its slots and their geometry."""

    buffer: Buffer
    slots: int
    slot_stride: int  # bytes from one slot to the next
    geometry: Geometry
    label: str


def tensor_pools(t, block_dim: int, tokens_per_block: int, what: str) -> List[TensorPool]:
    """Pools of tensor t whose dimension block_dim indexes blocks (pages).

    Every dimension of larger stride (K/V, a layer of a layer-first host
    pool) gives a pool of its own; the dimensions of smaller stride must be
    dense, so that one block is one run of bytes. Raises InvalidArgument
    naming `what` otherwise."""
    shape, strides = tuple(t.shape), tuple(t.stride())
    if not 0 <= block_dim < len(shape):
        raise make_error(Status.ERR_INVALID, f"{what}: block dimension {block_dim} of a {len(shape)}-d tensor")
    bstride = strides[block_dim]
    outer = [d for d in range(len(shape)) if d != block_dim and strides[d] > bstride and shape[d] > 1]
    inner = sorted((d for d in range(len(shape)) if d != block_dim and d not in outer and shape[d] > 1),
                   key=lambda d: -strides[d])
    expect = 1
    for d in reversed(inner):
        if strides[d] != expect:
            raise make_error(Status.ERR_INVALID, f"{what}: shape {shape} strides {strides}: a block is not one "
                             f"dense run of memory (dimension {d})")
        expect *= shape[d]
    elems = expect
    if bstride < elems:
        raise make_error(Status.ERR_INVALID, f"{what}: blocks overlap (stride {bstride} < {elems} elements)")
    if elems % tokens_per_block:
        raise make_error(Status.ERR_INVALID, f"{what}: {elems} elements a block do not split into "
                         f"{tokens_per_block} tokens")
    itemsize = t.element_size()
    head = shape[inner[-1]] if inner else 1
    per_token = elems // tokens_per_block
    if per_token % head:
        head = per_token
    g = Geometry(layers=1, kv_factor=1, kv_heads=per_token // head, tokens_per_block=tokens_per_block,
                 head_size=head, dtype=kv_dtype(t), order=Order.TOKEN_MAJOR)
    if g.block_bytes != elems * itemsize:
        raise make_error(Status.ERR_INVALID, f"{what}: {elems * itemsize} bytes a block, geometry {g} "
                         f"gives {g.block_bytes}")
    kind = CUDA if t.is_cuda else (PINNED if t.is_pinned() else HOST)
    device = t.device.index if t.is_cuda else None
    nblocks = shape[block_dim]
    out = []
    for idx in _product([range(shape[d]) for d in outer]):
        offset = sum(i * strides[d] for i, d in zip(idx, outer))
        ptr = t.data_ptr() + offset * itemsize
        nbytes = ((nblocks - 1) * bstride + elems) * itemsize
        label = what + "".join(f"[{d}={i}]" for d, i in zip(outer, idx))
        out.append(TensorPool(Buffer(ptr, nbytes, kind, device, t, None, "torch tensor"), nblocks,
                              bstride * itemsize, g, label))
    return out


def _product(ranges):
    if not ranges:
        yield ()
        return
    for i in ranges[0]:
        for rest in _product(ranges[1:]):
            yield (i,) + rest


def check_settings(extra: dict, who: str) -> None:
    """Refuses, naming the key, the store settings both adapters take that
    would be wrong later or fall back silently: an unknown remote mode, a
    size that does not parse, a count that is not one, a priority past
    100, an empty namespace, a disk tier without a directory. who: the
    adapter's class name, which every message starts with."""
    if "remote" in extra and str(extra["remote"]).upper() not in CacheRemote.__members__:
        raise make_error(Status.ERR_INVALID, f"{who}: remote = {extra['remote']!r} (want one of "
                         f"{', '.join(m.lower() for m in CacheRemote.__members__)})")
    for k in ("host_bytes", "disk_bytes"):
        if k in extra:
            try:
                size_parse(extra[k])
            except KvferryError as exc:
                raise make_error(Status.ERR_INVALID, f"{who}: {k} = {extra[k]!r}: {exc}") from None
    for k in ("host_blocks", "disk_blocks", "priority", "threads"):
        if k in extra and (isinstance(extra[k], bool) or not isinstance(extra[k], int) or extra[k] < 0):
            raise make_error(Status.ERR_INVALID, f"{who}: {k} = {extra[k]!r} is not a count")
    if "priority" in extra and extra["priority"] > 100:
        raise make_error(Status.ERR_INVALID, f"{who}: priority = {extra['priority']!r} (0..100)")
    if "namespace" in extra and (not isinstance(extra["namespace"], str) or not extra["namespace"]):
        raise make_error(Status.ERR_INVALID, f"{who}: namespace = {extra['namespace']!r}")
    if (extra.get("disk_blocks") or extra.get("disk_bytes")) and not extra.get("file_dir"):
        raise make_error(Status.ERR_INVALID, f"{who}: disk_blocks/disk_bytes without file_dir")


def backend_for(tensors) -> Backend:
    """CUDA for GPU tensors, the host backend for CPU ones (not both)."""
    kinds = {bool(t.is_cuda) for t in tensors}
    if len(kinds) > 1:
        raise make_error(Status.ERR_INVALID, "KV tensors: some are on the GPU and some are not")
    return Backend.CUDA if kinds == {True} else Backend.HOST


def add_pools(engine: Engine, pools: Sequence[TensorPool], secondary: int, memory: Optional[Memory] = None
              ) -> List[int]:
    """Registers the pools (secondary: host slots kvferry allocates for
    each, 0 for none; memory: as PoolDesc's); returns their indices."""
    out = []
    for p in pools:
        # the slot count of a registered buffer whose last slot is shorter
        # than the stride is given, not derived from its size
        desc = PoolDesc(slots=p.slots, memory=memory, buffer=p.buffer, slot_stride=p.slot_stride)
        out.append(engine.add_pool(p.geometry, primary=desc, secondary=secondary or None).index)
    return out


def namespace(*parts, limit: int = 64) -> str:
    """A file/remote namespace from parts such as the engine, the model and
    the rank: [A-Za-z0-9._-], at most `limit` characters (a hash of the
    whole ends a name that had to be cut)."""
    text = "-".join(str(p) for p in parts if p not in (None, ""))
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "default"
    if len(clean) <= limit:
        return clean
    return f"{clean[:limit - 17]}-{key_salt(text):016x}"


def string_key(key: str) -> int:
    """A 128-bit block key for an engine's string key (SGLang's page hash):
    BLAKE2b-128 of its UTF-8 bytes, little-endian, never 0 (the root)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=16).digest()
    return int.from_bytes(digest, "little") or 1


def block_file(file_dir: str, ns: str, key: int) -> str:
    """The file the engine's file tier stores a block in (kvferry.h:
    <dir>/<namespace>/<key as 32 hex digits>.kvf): what a process that
    shares the directory but not the writer's cache looks for."""
    return os.path.join(file_dir, ns, f"{key:032x}.kvf")


def prefix_get(cache: Cache, keys: List[int], slots: List[int], tiers: Optional[list] = None
               ) -> Tuple[int, Optional[Ticket], Optional[KvferryError]]:
    """Starts copying the longest cached prefix of keys into slots:
    (hits, its ticket or None, the error that stopped the get). The blocks
    from hits on are not loaded: the caller reports them failed. tiers, if
    given, receives the tier each hit was found in."""
    hits, found = cache.lookup(keys)
    if tiers is not None:
        tiers[:] = found
    if hits == 0:
        return 0, None, None
    try:
        return hits, cache.get(keys[:hits], slots[:hits]), None
    except KvferryError as exc:  # e.g. evicted since the lookup: nothing moved
        log.warning("kvferry: get of %d blocks refused: %s", hits, exc)
        return 0, None, exc


def failed_moves(ticket: Optional[Ticket]) -> List[int]:
    """Indices of the ticket's blocks that did not arrive (waits)."""
    if ticket is None:
        return []
    bad = ticket.failed()
    if bad:
        for err in ticket.errors()[:4]:
            log.warning("kvferry: block load failed: %s", err.message)
    return bad
