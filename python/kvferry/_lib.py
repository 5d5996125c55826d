# SPDX-License-Identifier: Apache-2.0
"""Loading libkvferry and declaring its C API with ctypes.

The structs below mirror include/kvferry.h field for field; the enum
values live in kvferry._enums. Search order for the library:

1. the environment variable KVFERRY_LIBRARY (a path to libkvferry.so),
2. libkvferry.so shipped inside this package (``pip install ./python``),
3. the repository's build/ directory (a source checkout after ``make``),
4. ctypes.util.find_library("kvferry") (an installed library).
"""

import ctypes
import ctypes.util
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent.parent  # python/kvferry -> repository root

c_status = ctypes.c_int  # kvf_status: an int-sized enum with negative values
c_enum = ctypes.c_int


class Ticket_t(ctypes.Structure):
    """kvf_ticket: an engine batch's ticket, passed by value."""

    _fields_ = [("id", ctypes.c_uint64)]


class CacheTicket_t(ctypes.Structure):
    """kvf_cache_ticket: a cache call's ticket; not interchangeable with Ticket_t."""

    _fields_ = [("id", ctypes.c_uint64)]


class Geometry_t(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_uint32),
        ("kv_factor", ctypes.c_uint32),
        ("kv_heads", ctypes.c_uint32),
        ("tokens_per_block", ctypes.c_uint32),
        ("head_size", ctypes.c_uint32),
        ("dtype", c_enum),
        ("order", c_enum),
    ]


class Region_t(ctypes.Structure):
    _fields_ = [("rows", ctypes.c_size_t), ("row_bytes", ctypes.c_size_t), ("pitch", ctypes.c_size_t)]


class EngineFileConfig_t(ctypes.Structure):
    _fields_ = [
        ("dir", ctypes.c_char_p),
        ("namespace_", ctypes.c_char_p),
        ("io", c_enum),
        ("fsync", c_enum),
        ("runner", c_enum),
        ("queue_depth", ctypes.c_uint32),
        ("gds_compat", c_enum),
    ]


class EngineRemoteConfig_t(ctypes.Structure):
    _fields_ = [("url", ctypes.c_char_p), ("ttl_s", ctypes.c_uint32), ("timeout_ms", ctypes.c_uint32)]


class EngineCudaConfig_t(ctypes.Structure):
    _fields_ = [("copy", c_enum), ("copy_sms", ctypes.c_uint32)]


class EngineConfig_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backend", c_enum),
        ("device", ctypes.c_int),
        ("threads", ctypes.c_uint32),
        ("file", EngineFileConfig_t),
        ("remote", EngineRemoteConfig_t),
        ("cuda", EngineCudaConfig_t),
        ("config_file", ctypes.c_char_p),
        ("remote_mem_bytes", ctypes.c_uint64),
    ]


class Setting_t(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("env", ctypes.c_char_p),
        ("value", ctypes.c_char_p),
        ("source", c_enum),
    ]


LogFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, c_enum, ctypes.c_char_p)


class PoolDesc_t(ctypes.Structure):
    _fields_ = [
        ("memory", c_enum),
        ("base", ctypes.c_void_p),
        ("slot_stride", ctypes.c_size_t),
        ("slots", ctypes.c_uint32),
    ]


class Key_t(ctypes.Structure):
    """kvf_key: a 128-bit block key, hi then lo."""

    _fields_ = [("hi", ctypes.c_uint64), ("lo", ctypes.c_uint64)]


class Move_t(ctypes.Structure):
    _fields_ = [("src", ctypes.c_uint64), ("dst", ctypes.c_uint64), ("tokens", ctypes.c_uint32),
                ("key", Key_t)]


MOVE_ERROR_MESSAGE = 256  # KVF_MOVE_ERROR_MESSAGE


class MoveError_t(ctypes.Structure):
    _fields_ = [("index", ctypes.c_size_t), ("status", c_status), ("message", ctypes.c_char * MOVE_ERROR_MESSAGE)]


class Info_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("cuda_built", ctypes.c_int),
        ("cuda_devices", ctypes.c_int),
        ("cuda_runtime", ctypes.c_int),
        ("cufile_present", ctypes.c_int),
        ("uring_built", ctypes.c_int),
        ("device_name", ctypes.c_char * 128),
        ("cuda_error", ctypes.c_char * 128),
        ("remote_built", ctypes.c_int),
        ("gds_state", c_enum),
        ("gds_detail", ctypes.c_char * 160),
    ]


class StoreInfo_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char * 32),
        ("schemes", ctypes.c_char * 128),
        ("built", ctypes.c_int),
        ("remote", ctypes.c_int),
        ("detail", ctypes.c_char * 256),
    ]


class CacheEvent_t(ctypes.Structure):
    _fields_ = [
        ("seq", ctypes.c_uint64),
        ("kind", c_enum),
        ("key", Key_t),
        ("tier", c_enum),
        ("from_", c_enum),
        ("priority", ctypes.c_uint32),
    ]


CacheEventFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(CacheEvent_t))


class CacheHostConfig_t(ctypes.Structure):
    _fields_ = [("blocks", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


class CacheDiskConfig_t(ctypes.Structure):
    _fields_ = [("blocks", ctypes.c_uint64), ("bytes", ctypes.c_uint64), ("admit_uses", ctypes.c_uint32)]


class CacheGpuConfig_t(ctypes.Structure):
    _fields_ = [("blocks", ctypes.c_uint64)]


class CacheEventsConfig_t(ctypes.Structure):
    _fields_ = [("queue", ctypes.c_uint32), ("fn", CacheEventFn), ("arg", ctypes.c_void_p)]


class CacheConfig_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("host", CacheHostConfig_t),
        ("disk", CacheDiskConfig_t),
        ("gpu", CacheGpuConfig_t),
        ("events", CacheEventsConfig_t),
        ("remote", c_enum),
        ("offload_min_priority", ctypes.c_uint32),
    ]


TIER_COUNT = 4  # host, disk, remote, gpu (KVF_TIER_COUNT)
CACHE_TIER_SLOTS = 8  # per-tier counters have room for tiers to come (KVF_CACHE_TIER_SLOTS)
CACHE_LATENCY_BUCKETS = 20
_T2 = ctypes.c_uint64 * CACHE_TIER_SLOTS


class CacheStats_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("blocks", _T2),
        ("capacity", _T2),
        ("lookups", ctypes.c_uint64),
        ("hits", _T2),
        ("misses", ctypes.c_uint64),
        ("lookup_blocks", ctypes.c_uint64),
        ("puts", ctypes.c_uint64),
        ("put_duplicates", ctypes.c_uint64),
        ("gets", ctypes.c_uint64),
        ("bytes_in", _T2),
        ("bytes_out", _T2),
        ("evictions", _T2),
        ("dropped", ctypes.c_uint64),
        ("failures", ctypes.c_uint64),
        ("events_dropped", ctypes.c_uint64),
        ("latency_us", ctypes.c_uint64 * CACHE_LATENCY_BUCKETS),
        ("latency_count", ctypes.c_uint64),
        ("latency_sum_us", ctypes.c_uint64),
        ("remote_errors", ctypes.c_uint64),
    ]


# ---- costs and the planner (kvf_costs, kvf_prefill_cost, kvf_plan) --------------


class TierCost_t(ctypes.Structure):
    _fields_ = [("latency_s", ctypes.c_double), ("bytes_per_s", ctypes.c_double), ("observed", ctypes.c_uint64),
                ("held", ctypes.c_int)]


class Costs_t(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("tier", TierCost_t * CACHE_TIER_SLOTS)]


PrefillFn = ctypes.CFUNCTYPE(c_status, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                             ctypes.POINTER(ctypes.c_double))


class PrefillCost_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("new_tokens", ctypes.POINTER(ctypes.c_uint64)),
        ("n_new", ctypes.c_size_t),
        ("prefix_tokens", ctypes.POINTER(ctypes.c_uint64)),
        ("n_prefix", ctypes.c_size_t),
        ("seconds", ctypes.POINTER(ctypes.c_double)),
        ("fn", PrefillFn),
        ("user", ctypes.c_void_p),
        ("layers", ctypes.c_uint32),
        ("overlap", ctypes.c_int),
        ("min_gain", ctypes.c_double),
        ("leading_only", ctypes.c_int),
    ]


class PlanInput_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("tiers", ctypes.POINTER(c_enum)),
        ("hits", ctypes.c_size_t),
        ("block_bytes", ctypes.c_uint64),
        ("tokens_per_block", ctypes.c_uint32),
        ("request_tokens", ctypes.c_uint64),
        ("costs", Costs_t),
        ("prefill", ctypes.POINTER(PrefillCost_t)),
        ("layerwise_tiers", ctypes.c_uint32),
        ("arrival_steps", ctypes.c_uint32 * 8),
        ("load_ratio", ctypes.c_double),
        ("recompute_ratio", ctypes.c_double),
    ]


class Plan_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("hits", ctypes.c_size_t),
        ("load_blocks", ctypes.c_size_t),
        ("load", _T2),
        ("recompute_hits", _T2),
        ("recompute_from", ctypes.c_uint64),
        ("compute_tokens", ctypes.c_uint64),
        ("ttft_s", ctypes.c_double),
        ("load_s", ctypes.c_double),
        ("compute_s", ctypes.c_double),
        ("ttft_recompute_s", ctypes.c_double),
        ("ttft_load_all_s", ctypes.c_double),
        ("overlap", ctypes.c_int),
        ("load_first", ctypes.c_size_t),
        ("ttft_split_s", ctypes.c_double),
        ("hedge_s", ctypes.c_double),
        ("fallback_s", ctypes.c_double),
        ("load_ratio", ctypes.c_double),
        ("recompute_ratio", ctypes.c_double),
        ("first_s", ctypes.c_double),
    ]


class PlanLearnt_t(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("load_ratio", ctypes.c_double),
        ("recompute_ratio", ctypes.c_double),
        ("load_observed", ctypes.c_uint32),
        ("recompute_observed", ctypes.c_uint32),
    ]


class DirEntry_t(ctypes.Structure):
    _fields_ = [
        ("key", Key_t),
        ("kind", c_enum),
        ("status", c_status),
        ("message", ctypes.c_char_p),
        ("tokens", ctypes.c_uint32),
        ("pools", ctypes.c_uint32),
        ("payload_bytes", ctypes.c_uint64),
    ]


class DirCounts_t(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("good", "corrupt", "torn", "mismatch", "foreign", "unreadable",
                                                     "old_format", "upgraded")]


class DirBlock_t(ctypes.Structure):
    _fields_ = [
        ("key", Key_t),
        ("tokens", ctypes.c_uint32),
        ("pools", ctypes.c_uint32),
        ("payload_bytes", ctypes.c_uint64),
        ("mtime_ns", ctypes.c_int64),
    ]


DirCheckFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(DirEntry_t))
DirListFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(DirBlock_t))
DirNamespaceFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)

assert ctypes.sizeof(Move_t) == 40
assert ctypes.sizeof(CacheEvent_t) == 48


def _candidates():
    """(description, path or name) pairs, in search order."""
    env = os.environ.get("KVFERRY_LIBRARY")
    if env:
        yield "KVFERRY_LIBRARY", env
        return  # an explicit choice is never silently replaced
    yield "package", str(_HERE / "libkvferry.so")
    yield "build directory", str(_REPO / "build" / "libkvferry.so")
    found = ctypes.util.find_library("kvferry")
    yield "find_library('kvferry')", found


def _load():
    tried = []
    for what, path in _candidates():
        if not path:
            tried.append(f"{what}: not found")
            continue
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{what}: {path} does not exist")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as exc:
            tried.append(f"{what}: {path}: {exc}")
    raise ImportError(
        "kvferry: cannot load libkvferry.so; tried\n  "
        + "\n  ".join(tried)
        + "\nBuild it (make, in the repository) and set KVFERRY_LIBRARY=/path/to/build/libkvferry.so,"
        " or install the package with `pip install ./python`."
    )


lib, path = _load()

_P = ctypes.POINTER
_protos = {
    "kvf_version": (ctypes.c_char_p, []),
    "kvf_status_str": (ctypes.c_char_p, [c_status]),
    "kvf_last_error": (ctypes.c_char_p, []),
    "kvf_log_set_handler": (None, [LogFn, ctypes.c_void_p]),
    "kvf_log_set_level": (c_status, [c_enum]),
    "kvf_log_get_level": (c_enum, []),
    "kvf_dtype_bits": (ctypes.c_uint, [c_enum]),
    "kvf_dtype_name": (ctypes.c_char_p, [c_enum]),
    "kvf_dtype_parse": (c_status, [ctypes.c_char_p, _P(c_enum)]),
    "kvf_geometry_check": (c_status, [_P(Geometry_t)]),
    "kvf_geometry_block_bytes": (c_status, [_P(Geometry_t), _P(ctypes.c_size_t)]),
    "kvf_geometry_region": (c_status, [_P(Geometry_t), ctypes.c_uint32, _P(Region_t)]),
    "kvf_backend_name": (ctypes.c_char_p, [c_enum]),
    "kvf_engine_create": (c_status, [_P(EngineConfig_t), _P(ctypes.c_void_p)]),
    "kvf_engine_destroy": (None, [ctypes.c_void_p]),
    "kvf_engine_backend": (c_enum, [ctypes.c_void_p]),
    "kvf_engine_config_key": (ctypes.c_char_p, [ctypes.c_size_t, _P(ctypes.c_size_t)]),
    "kvf_engine_settings": (c_status, [ctypes.c_void_p, _P(_P(Setting_t)), _P(ctypes.c_size_t)]),
    "kvf_cache_settings": (c_status, [ctypes.c_void_p, _P(_P(Setting_t)), _P(ctypes.c_size_t)]),
    "kvf_engine_add_pool": (
        c_status,
        [ctypes.c_void_p, _P(Geometry_t), _P(PoolDesc_t), _P(PoolDesc_t), _P(ctypes.c_uint32)],
    ),
    "kvf_engine_pool_count": (ctypes.c_uint32, [ctypes.c_void_p]),
    "kvf_engine_slot_ptr": (
        c_status,
        [ctypes.c_void_p, ctypes.c_uint32, c_enum, ctypes.c_uint32, _P(ctypes.c_void_p)],
    ),
    "kvf_offload": (c_status, [ctypes.c_void_p, c_enum, ctypes.c_void_p, ctypes.c_size_t, _P(Ticket_t)]),
    "kvf_offload_after": (c_status, [ctypes.c_void_p, ctypes.c_void_p, c_enum, ctypes.c_void_p, ctypes.c_size_t,
                                     _P(Ticket_t)]),
    "kvf_onboard": (c_status, [ctypes.c_void_p, c_enum, ctypes.c_void_p, ctypes.c_size_t, _P(Ticket_t)]),
    "kvf_onboard_pools": (c_status, [ctypes.c_void_p, c_enum, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.c_size_t, _P(Ticket_t)]),
    "kvf_offload_pools": (c_status, [ctypes.c_void_p, ctypes.c_void_p, c_enum, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_void_p, ctypes.c_size_t, _P(Ticket_t)]),
    "kvf_wait_pool": (c_status, [ctypes.c_void_p, Ticket_t, ctypes.c_uint32]),
    "kvf_stream_wait_pool": (c_status, [ctypes.c_void_p, Ticket_t, ctypes.c_uint32, ctypes.c_void_p]),
    "kvf_copy": (c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(Ticket_t)]),
    "kvf_poll": (c_status, [ctypes.c_void_p, Ticket_t, ctypes.c_void_p]),
    "kvf_wait": (c_status, [ctypes.c_void_p, Ticket_t, ctypes.c_void_p]),
    "kvf_poll_errors": (
        c_status,
        [ctypes.c_void_p, Ticket_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "kvf_wait_errors": (
        c_status,
        [ctypes.c_void_p, Ticket_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "kvf_sync_stream": (c_status, [ctypes.c_void_p, ctypes.c_void_p]),
    "kvf_info_get": (c_status, [_P(Info_t)]),
    "kvf_store_info_get": (c_status, [ctypes.c_size_t, _P(StoreInfo_t)]),
    "kvf_demote": (c_status, [ctypes.c_void_p, c_enum, ctypes.c_void_p, ctypes.c_size_t, _P(Ticket_t)]),
    "kvf_promote": (c_status, [ctypes.c_void_p, c_enum, ctypes.c_void_p, ctypes.c_size_t, _P(Ticket_t)]),
    "kvf_remove": (c_status, [ctypes.c_void_p, c_enum, ctypes.c_void_p, ctypes.c_size_t, _P(Ticket_t)]),
    "kvf_tier_name": (ctypes.c_char_p, [c_enum]),
    # block keys
    "kvf_key_chain": (Key_t, [Key_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]),
    "kvf_key_chain_all": (
        ctypes.c_size_t,
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t],
    ),
    "kvf_key_salt": (ctypes.c_uint64, [ctypes.c_char_p]),
    "kvf_size_parse": (c_status, [ctypes.c_char_p, _P(ctypes.c_uint64)]),
    # cache
    "kvf_cache_create": (c_status, [ctypes.c_void_p, _P(CacheConfig_t), _P(ctypes.c_void_p)]),
    "kvf_cache_destroy": (None, [ctypes.c_void_p]),
    "kvf_cache_lookup": (
        c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(ctypes.c_size_t), ctypes.c_void_p]),
    "kvf_cache_put": (
        c_status,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, _P(CacheTicket_t)],
    ),
    "kvf_cache_get": (
        c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(CacheTicket_t)]),
    "kvf_cache_get_pools": (
        c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                   ctypes.c_size_t, _P(CacheTicket_t)]),
    "kvf_cache_wait_pool": (c_status, [ctypes.c_void_p, CacheTicket_t, ctypes.c_uint32]),
    "kvf_cache_stream_wait_pool": (c_status, [ctypes.c_void_p, CacheTicket_t, ctypes.c_uint32, ctypes.c_void_p]),
    "kvf_cache_wait_pool_by": (
        c_status, [ctypes.c_void_p, CacheTicket_t, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_double]),
    "kvf_cache_wait": (c_status, [ctypes.c_void_p, CacheTicket_t, ctypes.c_void_p]),
    "kvf_cache_poll": (c_status, [ctypes.c_void_p, CacheTicket_t, ctypes.c_void_p]),
    "kvf_cache_poll_errors": (
        c_status,
        [ctypes.c_void_p, CacheTicket_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "kvf_cache_wait_errors": (
        c_status,
        [ctypes.c_void_p, CacheTicket_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(ctypes.c_size_t)],
    ),
    "kvf_cache_pin": (c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(ctypes.c_size_t)]),
    "kvf_cache_unpin": (c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "kvf_cache_remove": (c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(ctypes.c_size_t)]),
    "kvf_cache_alloc": (c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _P(CacheTicket_t)]),
    "kvf_cache_commit": (
        c_status,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p],
    ),
    "kvf_cache_free": (c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "kvf_cache_acquire": (
        c_status,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, _P(ctypes.c_size_t), _P(CacheTicket_t)],
    ),
    "kvf_cache_events": (ctypes.c_size_t, [ctypes.c_void_p, _P(CacheEvent_t), ctypes.c_size_t]),
    "kvf_cache_stats_get": (c_status, [ctypes.c_void_p, _P(CacheStats_t)]),
    "kvf_cache_stats_prometheus": (
        c_status, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_size_t)]),
    # costs and the planner
    "kvf_engine_costs": (c_status, [ctypes.c_void_p, _P(Costs_t)]),
    "kvf_engine_layerwise_tiers": (ctypes.c_uint32, [ctypes.c_void_p]),
    "kvf_engine_arrival_groups": (ctypes.c_uint32, [ctypes.c_void_p, c_enum]),
    "kvf_engine_set_tier_cost": (c_status, [ctypes.c_void_p, c_enum, ctypes.c_double, ctypes.c_double, ctypes.c_int]),
    "kvf_engine_observe_tier_cost": (c_status, [ctypes.c_void_p, c_enum, ctypes.c_uint64, ctypes.c_double]),
    "kvf_engine_calibrate": (
        c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, Key_t, ctypes.c_uint32]),
    "kvf_prefill_cost_check": (c_status, [_P(PrefillCost_t)]),
    "kvf_plan_compute": (c_status, [_P(PlanInput_t), _P(Plan_t)]),
    "kvf_cache_set_prefill_cost": (c_status, [ctypes.c_void_p, _P(PrefillCost_t)]),
    # block directories and the remote store, without an engine
    "kvf_dir_check": (
        c_status, [ctypes.c_char_p, ctypes.c_char_p, _P(Geometry_t), ctypes.c_size_t, DirCheckFn, ctypes.c_void_p,
                   _P(DirCounts_t)]),
    "kvf_dir_list": (
        c_status, [ctypes.c_char_p, ctypes.c_char_p, _P(Geometry_t), ctypes.c_size_t, DirListFn, ctypes.c_void_p,
                   _P(ctypes.c_uint64)]),
    "kvf_dir_upgrade": (
        c_status, [ctypes.c_char_p, ctypes.c_char_p, DirCheckFn, ctypes.c_void_p, _P(DirCounts_t)]),
    "kvf_dir_namespaces": (c_status, [ctypes.c_char_p, DirNamespaceFn, ctypes.c_void_p, _P(ctypes.c_size_t)]),
    "kvf_remote_probe": (c_status, [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]),
    "kvf_cache_plan": (
        c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_void_p, _P(Plan_t)]),
    "kvf_cache_observe_plan": (c_status, [ctypes.c_void_p, _P(Plan_t), ctypes.c_double]),
    "kvf_cache_plan_learnt": (c_status, [ctypes.c_void_p, _P(PlanLearnt_t)]),
}
for _name, (_res, _args) in _protos.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        raise ImportError(f"kvferry: {path} has no symbol {_name}: not a matching libkvferry") from None
    _fn.restype = _res
    _fn.argtypes = _args


def last_error() -> str:
    return (lib.kvf_last_error() or b"").decode("utf-8", "replace")


def status_str(status: int) -> str:
    return (lib.kvf_status_str(status) or b"?").decode("utf-8", "replace")
