# SPDX-License-Identifier: Apache-2.0
"""kvferry: move paged LLM KV-cache blocks between GPU memory, host memory
and files. A ctypes binding of libkvferry (include/kvferry.h).

    import numpy as np, kvferry as kvf
    with kvf.Engine(backend=kvf.Backend.HOST, file_dir="/tmp/kv") as e:
        pool = e.add_pool(kvf.Geometry(4, 2, 8, 16, 64, "bf16"), primary=8, secondary=32)
        pool.slot_view(0)[:] = np.random.randint(1, 256, pool.block_bytes, dtype=np.uint8)
        e.offload(kvf.Tier.HOST, (0, 5)).wait(check=True)     # primary 0 -> secondary 5
        statuses = e.onboard(kvf.Tier.HOST, [(5, 1)]).wait()   # secondary 5 -> primary 1
        with kvf.Cache(e, host_blocks=16, disk_blocks=256) as cache:  # content-addressed, on top
            keys = kvf.key_chain_all(tokens, tokens_per_block=16)
            cache.put(keys[:1], [0]).wait(check=True)            # primary 0 holds keys[0]
            hits, tiers = cache.lookup(keys)
"""

from . import _lib
from ._buffers import Buffer, as_buffer
from ._config import Setting
from ._engine import Engine
from ._geometry import Geometry, Region, block_bytes, dtype_bits, region
from ._info import Info, StoreInfo, info, version
from ._moves import Move, move_dtype
from ._pools import Pool, PoolDesc, PoolLevel
from ._tickets import Ticket
from ._cache import Cache, CacheEvent, CacheStats, key_chain, key_chain_all, key_salt, size_parse, tier_name
from ._dir import DirBlock, DirCheck, DirCounts, DirEntry, dir_check, dir_list, dir_namespaces, dir_upgrade, remote_probe
from ._enums import (Backend, CacheRemote, CudaCopy, DirEntryKind, Dtype, EventKind, FileIO, FileRunner, Fsync, GdsCompat, GdsState, Level,
                     LogLevel, Memory, Order, SettingSource, Status, Tier)
from ._errors import (Corrupt, DeviceError, DeviceFailure, FileError, IntegrityError, InvalidArgument,
                      InvalidState, IOFailure, KvferryError, Lost, Mismatch, MoveError, NoDevice, NoSpace, NotFound,
                      OutOfMemory, OutOfRange, OutOfResource, RemoteError, RemoteFailure, Timeout, UnknownTicket, Unsupported,
                      UsageError, error_class)
from ._plan import Plan, PlanLearnt, Prefill, PrefillProfile, TierCost, plan_compute
from ._log import get_log_level, install_log_handler, remove_log_handler, set_log_level
from ._version import package_version as _package_version

__version__ = _package_version() or version().split()[0]
library_path = _lib.path


def _check_version():
    lib_version = version().split()[0]
    if __version__ != lib_version:
        raise ImportError(f"kvferry: the Python package is version {__version__} but {_lib.path} is "
                          f"libkvferry {lib_version}; rebuild one of them (or point KVFERRY_LIBRARY "
                          f"at a matching library)")


_check_version()

__all__ = [
    "Engine", "Geometry", "Info", "Move", "Pool", "PoolDesc", "PoolLevel", "Region", "Setting", "StoreInfo", "Ticket", "Buffer",
    "as_buffer", "block_bytes", "dtype_bits", "info", "move_dtype", "region", "version", "library_path",
    "Cache", "CacheEvent", "CacheStats", "CacheRemote", "EventKind", "key_chain", "key_chain_all", "key_salt", "size_parse",
    "tier_name", "Backend", "CudaCopy", "Dtype", "FileIO", "FileRunner", "Fsync", "GdsCompat", "GdsState", "Level", "LogLevel", "Memory", "Order",
    "SettingSource", "Status", "Tier", "install_log_handler", "remove_log_handler", "set_log_level", "get_log_level",
    "KvferryError", "UsageError", "InvalidArgument", "OutOfRange", "Unsupported", "InvalidState",
    "UnknownTicket", "OutOfMemory", "OutOfResource", "DeviceError", "NoDevice", "DeviceFailure", "FileError", "IOFailure",
    "NotFound", "NoSpace", "RemoteError", "RemoteFailure", "Timeout", "IntegrityError", "Corrupt",
    "Mismatch", "Lost", "MoveError", "error_class", "Plan", "PlanLearnt", "Prefill", "PrefillProfile", "TierCost", "plan_compute",
    "DirBlock", "DirCheck", "DirCounts", "DirEntry", "DirEntryKind", "dir_check", "dir_list", "dir_namespaces", "dir_upgrade",
    "remote_probe",
]
