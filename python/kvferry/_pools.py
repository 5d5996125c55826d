# SPDX-License-Identifier: Apache-2.0
"""A registered pool of block slots and what describes its two levels (kvf_pool_desc)."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ._enums import Level, LevelLike, Memory

if TYPE_CHECKING:
    import numpy as np


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
