# SPDX-License-Identifier: Apache-2.0
"""The ctypes side checked against include/kvferry.h, field by field: every
enum of the header (names and values) against kvferry's enums, and every
struct with a body (field names, order, sizes and offsets) against the
ctypes Structure that mirrors it; a field whose type is another struct of
the header (the config structs' groups: kvf_engine_config.file) must be
that struct's mirror, checked in its own right. A new enum, value, struct or field in the
header fails here until the Python side has it too (or is told below why
it need not)."""

import ctypes
import keyword
import re
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

import kvferry as kvf
from kvferry import _lib

HEADER = Path(__file__).resolve().parents[2] / "include" / "kvferry.h"

# C enum -> (Python enum, the prefix its names drop)
ENUMS = {
    "kvf_status": (kvf.Status, "KVF_"),
    "kvf_log_level": (kvf.LogLevel, "KVF_LOG_"),
    "kvf_dtype": (kvf.Dtype, "KVF_DTYPE_"),
    "kvf_token_order": (kvf.Order, "KVF_ORDER_"),
    "kvf_backend": (kvf.Backend, "KVF_BACKEND_"),
    "kvf_file_io": (kvf.FileIO, "KVF_FILE_IO_"),
    "kvf_fsync": (kvf.Fsync, "KVF_FSYNC_"),
    "kvf_gds_compat": (kvf.GdsCompat, "KVF_GDS_COMPAT_"),
    "kvf_file_runner": (kvf.FileRunner, "KVF_FILE_RUNNER_"),
    "kvf_cuda_copy": (kvf.CudaCopy, "KVF_CUDA_COPY_"),
    "kvf_setting_source": (kvf.SettingSource, "KVF_SOURCE_"),
    "kvf_memory": (kvf.Memory, "KVF_MEMORY_"),
    "kvf_level": (kvf.Level, "KVF_LEVEL_"),
    "kvf_tier": (kvf.Tier, "KVF_TIER_"),
    "kvf_gds_state": (kvf.GdsState, "KVF_GDS_STATE_"),
    "kvf_cache_event_kind": (kvf.EventKind, "KVF_EVENT_"),
    "kvf_cache_remote": (kvf.CacheRemote, "KVF_CACHE_REMOTE_"),
    "kvf_dir_entry_kind": (kvf.DirEntryKind, "KVF_DIR_ENTRY_"),
}
# Counts that close an enum: not members, but checked where Python has them.
COUNTS = {"KVF_DTYPE_COUNT": len(kvf.Dtype), "KVF_TIER_COUNT": _lib.TIER_COUNT}

# C struct -> the ctypes Structure that mirrors it
STRUCTS = {
    "kvf_geometry": _lib.Geometry_t,
    "kvf_region": _lib.Region_t,
    "kvf_engine_file_config": _lib.EngineFileConfig_t,
    "kvf_engine_remote_config": _lib.EngineRemoteConfig_t,
    "kvf_engine_cuda_config": _lib.EngineCudaConfig_t,
    "kvf_engine_config": _lib.EngineConfig_t,
    "kvf_setting": _lib.Setting_t,
    "kvf_pool_desc": _lib.PoolDesc_t,
    "kvf_key": _lib.Key_t,
    "kvf_move": _lib.Move_t,
    "kvf_ticket": _lib.Ticket_t,
    "kvf_cache_ticket": _lib.CacheTicket_t,
    "kvf_move_error": _lib.MoveError_t,
    "kvf_cache_event": _lib.CacheEvent_t,
    "kvf_cache_host_config": _lib.CacheHostConfig_t,
    "kvf_cache_disk_config": _lib.CacheDiskConfig_t,
    "kvf_cache_gpu_config": _lib.CacheGpuConfig_t,
    "kvf_cache_events_config": _lib.CacheEventsConfig_t,
    "kvf_cache_config": _lib.CacheConfig_t,
    "kvf_cache_stats": _lib.CacheStats_t,
    "kvf_info": _lib.Info_t,
    "kvf_store_info": _lib.StoreInfo_t,
    "kvf_tier_cost": _lib.TierCost_t,
    "kvf_costs": _lib.Costs_t,
    "kvf_prefill_cost": _lib.PrefillCost_t,
    "kvf_plan_input": _lib.PlanInput_t,
    "kvf_plan": _lib.Plan_t,
    "kvf_plan_learnt": _lib.PlanLearnt_t,
    "kvf_dir_entry": _lib.DirEntry_t,
    "kvf_dir_counts": _lib.DirCounts_t,
    "kvf_dir_block": _lib.DirBlock_t,
}

# Types of calls the binding does not offer yet, each with the reason; the
# day they are bound, their types move to ENUMS / STRUCTS.
UNBOUND: dict = {}

_P = ctypes.sizeof(ctypes.c_void_p)
SCALARS = {"char": 1, "int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int": ctypes.sizeof(ctypes.c_int),
           "unsigned": ctypes.sizeof(ctypes.c_uint), "int32_t": 4, "uint32_t": 4, "int64_t": 8, "uint64_t": 8,
           "size_t": ctypes.sizeof(ctypes.c_size_t), "ssize_t": ctypes.sizeof(ctypes.c_ssize_t),
           "float": ctypes.sizeof(ctypes.c_float), "double": ctypes.sizeof(ctypes.c_double)}


# ---- a reader for the header's own style: typedefs of enums, structs,
# scalars and function pointers; #define constants; struct fields of a
# struct type typedef'd earlier in the header (no anonymous nested types) ---


class Field(NamedTuple):
    name: str
    size: int  # of one element
    count: Optional[int]  # array length; None: not an array
    pointer: bool
    align: int
    struct: Optional[str] = None  # the header's struct type of the field

def _source():
    if not HEADER.exists():
        pytest.skip(f"{HEADER} not found (an installed package without its source tree)")
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _defines(src):
    return {m[1]: int(m[2]) for m in re.finditer(r"^\s*#\s*define\s+(\w+)\s+\(?(-?\d+)\)?\s*$", src, re.M)}


def _int(expr, known):
    expr = expr.strip()
    if expr in known:
        return known[expr]
    return int(re.sub(r"(?<=\d)[uUlL]+$", "", expr), 0)


def parse_enums(src):
    """{enum name: {constant: value}}, in order."""
    enums, known = {}, dict(_defines(src))
    for m in re.finditer(r"typedef\s+enum\s+(\w+)?\s*\{(.*?)\}\s*(\w+)\s*;", src, re.S):
        values, nxt = {}, 0
        for item in filter(None, (i.strip() for i in m[2].split(","))):
            name, _, expr = (p.strip() for p in item.partition("="))
            nxt = _int(expr, known) if expr else nxt
            values[name] = known[name] = nxt
            nxt += 1
        enums[m[3]] = values
    return enums


def _typedefs(src, enums):
    """Sizes of the header's typedef names (enums, scalar aliases, function
    pointers), and which of them are pointers."""
    sizes = {name: ctypes.sizeof(ctypes.c_int) for name in enums}
    for m in re.finditer(r"typedef\s+(\w+)\s+(\w+)\s*;", src):
        if m[1] in SCALARS:
            sizes[m[2]] = SCALARS[m[1]]
    pointers = set(re.findall(r"typedef\s+[\w\s\*]+\(\s*\*\s*(\w+)\s*\)", src))
    sizes.update(dict.fromkeys(pointers, _P))
    return sizes, pointers


def parse_structs(src, enums):
    """{struct name: [Field]}, for the structs with a body, in the header's
    order (a struct is known as a field's type once it has been read)."""
    sizes, pointer_types = _typedefs(src, enums)
    sizes, defines = dict(SCALARS, **sizes), _defines(src)
    structs, layouts = {}, {}  # layouts: struct name -> (size, alignment)
    for m in re.finditer(r"typedef\s+struct\s+(\w+)?\s*\{(.*?)\}\s*(\w+)\s*;", src, re.S):
        fields = []
        for decl in filter(None, (" ".join(d.split()) for d in m[2].split(";"))):
            fp = re.match(r"[\w\s\*]+\(\s*\*\s*(\w+)\s*\)\s*\(.*\)$", decl)
            if fp:
                fields.append(Field(fp[1], _P, None, True, _P))
                continue
            t = re.match(r"((?:const\s+|unsigned\s+|signed\s+|struct\s+|enum\s+)*\w+)\s*(.*)$", decl)
            assert t, f"{m[3]}: cannot read {decl!r}"
            base = t[1].replace("const ", "").strip()
            for d in (x.strip() for x in t[2].split(",")):
                f = re.match(r"(\*?)\s*(\w+)\s*(?:\[\s*(\w+)\s*\])?$", d)
                assert f, f"{m[3]}: cannot read {d!r} of {decl!r}"
                pointer = bool(f[1]) or base in pointer_types
                assert pointer or base in sizes or base in layouts, f"{m[3]}.{f[2]}: unknown type {base}"
                count = _int(f[3], defines) if f[3] else None
                if pointer:
                    fields.append(Field(f[2], _P, count, True, _P))
                elif base in layouts:
                    fields.append(Field(f[2], *layouts[base][:1], count, False, layouts[base][1], base))
                else:
                    fields.append(Field(f[2], sizes[base], count, False, sizes[base]))
        structs[m[3]] = fields
        layouts[m[3]] = _c_layout(fields)[1:]
    return structs


def _c_layout(fields):
    """(offsets, size, alignment) by the C rules for natural alignment."""
    offsets, off, align = [], 0, 1
    for f in fields:
        off = (off + f.align - 1) // f.align * f.align
        offsets.append(off)
        off += f.size * (f.count or 1)
        align = max(align, f.align)
    return offsets, (off + align - 1) // align * align, align


# ---- the checks ----------------------------------------------------------

SRC = _source()
C_ENUMS = parse_enums(SRC)
C_STRUCTS = parse_structs(SRC, C_ENUMS)


def test_the_reader_reads():
    """The parse finds what the header is known to hold (a reader that
    found nothing would pass every check below)."""
    assert C_ENUMS["kvf_status"]["KVF_ERR_LOST"] == -52
    assert C_ENUMS["kvf_dtype"]["KVF_DTYPE_FP4"] == 7  # implicit values count on
    names = [f.name for f in C_STRUCTS["kvf_cache_stats"]]
    assert names[names.index("puts") + 1] == "put_duplicates"  # two fields in one declaration
    assert Field("message", 1, 256, False, 1) in C_STRUCTS["kvf_move_error"]
    assert Field("fn", _P, None, True, _P) in C_STRUCTS["kvf_cache_events_config"]
    # a group of a config struct: its struct's size and alignment, not a scalar's
    file = next(f for f in C_STRUCTS["kvf_engine_config"] if f.name == "file")
    assert (file.struct, file.size, file.align) == ("kvf_engine_file_config", 5 * 4 + 2 * _P + 4, _P)
    disk = next(f for f in C_STRUCTS["kvf_cache_config"] if f.name == "disk")
    assert (disk.struct, disk.size, disk.align) == ("kvf_cache_disk_config", 24, 8)


def test_every_enum_and_struct_is_mirrored():
    assert sorted(set(C_ENUMS) - set(ENUMS) - set(UNBOUND)) == [], \
        "enums of the header missing from kvferry (add them to ENUMS)"
    assert sorted(set(ENUMS) - set(C_ENUMS)) == [], "ENUMS names enums the header no longer has"
    assert sorted(set(C_STRUCTS) - set(STRUCTS) - set(UNBOUND)) == [], \
        "structs of the header missing from kvferry._lib (add them to STRUCTS)"
    assert sorted(set(STRUCTS) - set(C_STRUCTS)) == [], "STRUCTS names structs the header no longer has"
    assert sorted(set(UNBOUND) - set(C_ENUMS) - set(C_STRUCTS)) == [], "UNBOUND names types the header lacks"
    assert sorted(set(UNBOUND) & (set(ENUMS) | set(STRUCTS))) == [], "bound types are not UNBOUND"


@pytest.mark.parametrize("c_name", sorted(ENUMS))
def test_enum(c_name):
    py, prefix = ENUMS[c_name]
    want = {}
    for name, value in C_ENUMS[c_name].items():
        if name in COUNTS:
            assert COUNTS[name] == value, f"{name} = {value} in the header, {COUNTS[name]} in Python"
            continue
        assert name.startswith(prefix), f"{c_name}: {name} lacks the prefix {prefix}"
        want[name[len(prefix):]] = value
    have = {m.name: int(m) for m in py}
    assert have == want, f"{py.__name__} differs from {c_name}"


def _ctypes_fields(cls):
    for name, ctype in cls._fields_:
        length = getattr(ctype, "_length_", None)
        elem = ctype._type_ if length is not None else ctype
        pointer = (ctype in (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_wchar_p)
                   or issubclass(ctype, (ctypes._Pointer, ctypes._CFuncPtr)))
        yield name, elem, ctypes.sizeof(elem), length, pointer, getattr(cls, name).offset


@pytest.mark.parametrize("c_name", sorted(STRUCTS))
def test_struct(c_name):
    cls, fields = STRUCTS[c_name], C_STRUCTS[c_name]
    py = list(_ctypes_fields(cls))
    c_names = [f.name + "_" if keyword.iskeyword(f.name) else f.name for f in fields]
    assert [p[0] for p in py] == c_names, f"{cls.__name__}: fields differ from {c_name}'s"
    offsets, size, _ = _c_layout(fields)
    for f, off, (_, elem, size_py, length, pointer_py, off_py) in zip(fields, offsets, py):
        what = f"{c_name}.{f.name}"
        if f.struct:  # a group: the mirror of its struct, whose fields test_struct checks
            assert elem is STRUCTS[f.struct], f"{what}: {elem.__name__} in ctypes, not {f.struct}'s mirror"
        assert (size_py, length) == (f.size, f.count), f"{what}: {f.size}-byte x {f.count} in C, " \
                                                       f"{size_py}-byte x {length} in ctypes"
        assert pointer_py == f.pointer, f"{what}: a pointer on one side only"
        assert off_py == off, f"{what}: offset {off} in C, {off_py} in ctypes"
    assert ctypes.sizeof(cls) == size, f"sizeof({c_name}) {size}, ctypes {ctypes.sizeof(cls)}"


def test_plan_min_gain_default():
    """Python's default margin for a split, and the hedge's floor, are the header's."""
    from kvferry._plan import HEDGE_MIN_S, MIN_GAIN

    for name, value in (("KVF_PLAN_MIN_GAIN", MIN_GAIN), ("KVF_PLAN_HEDGE_MIN_S", HEDGE_MIN_S)):
        m = re.search(rf"^#define {name} ([0-9.]+)\s*$", _source(), re.M)
        assert m and float(m[1]) == value, name
