# SPDX-License-Identifier: Apache-2.0
"""What the library and the machine offer: version, stores, CUDA, cuFile (kvf_info_get, kvf_store_info_get)."""

import ctypes
from dataclasses import dataclass
from typing import Tuple

from . import _lib
from ._enums import GdsState, Status
from ._errors import check

L = _lib.lib


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
