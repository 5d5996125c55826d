# SPDX-License-Identifier: Apache-2.0
"""The engine's settings: each kvf_engine_config field by its setting name,
the defaults, and the effective settings an engine or a cache reports."""

import ctypes
from typing import Dict, NamedTuple

from . import _lib
from ._enums import Backend, CudaCopy, FileIO, FileRunner, Fsync, GdsCompat, SettingSource
from ._errors import check

L = _lib.lib


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
