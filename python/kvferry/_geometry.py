# SPDX-License-Identifier: Apache-2.0
"""Block geometry (kvf_geometry): a block's shape, its bytes and the region of its first tokens."""

import ctypes
from dataclasses import dataclass
from typing import NamedTuple, Optional

from . import _lib
from ._cargs import c_int, fill
from ._enums import Dtype, DtypeLike, Order
from ._errors import check

L = _lib.lib


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
