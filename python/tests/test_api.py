# SPDX-License-Identifier: Apache-2.0
"""Library loading, versions, enums, geometry helpers."""

import ctypes

import pytest

import kvferry as kvf
from kvferry import _lib


def test_version_matches_header():
    assert kvf.version().split()[0] == kvf.__version__
    assert kvf.__version__.count(".") == 2


def test_info():
    i = kvf.info()
    assert isinstance(i.cuda_built, bool)
    assert i.cuda_devices >= 0
    if not i.cuda_built:
        assert i.cuda_devices == 0


def test_info_stores():
    """The stores come from the library's registry: each scheme it lists is
    served by that store (a probe never says no store serves it), and
    remote_built is whether every remote store is built."""
    stores = kvf.info().stores
    names = [s.name for s in stores]
    assert "file" in names and "mem" in names and len(set(names)) == len(names)
    for s in stores:
        assert s.schemes and all(x.endswith("://") for x in s.schemes) and s.detail
        for scheme in s.schemes:
            try:
                kvf.remote_probe(scheme + "127.0.0.1:1", timeout_ms=100)
            except kvf.KvferryError as e:
                assert "no store serves" not in str(e)
                if not s.built:
                    assert isinstance(e, kvf.Unsupported)
    assert kvf.info().remote_built == all(s.built for s in stores if s.remote)


def test_enums_mirror_the_library():
    for d in kvf.Dtype:
        assert _lib.lib.kvf_dtype_name(d).decode() == d.name.lower()
        assert kvf.dtype_bits(d.name.lower()) == _lib.lib.kvf_dtype_bits(d) > 0
    assert _lib.lib.kvf_dtype_name(len(kvf.Dtype)) == b"?"  # KVF_DTYPE_COUNT
    for b in kvf.Backend:
        assert _lib.lib.kvf_backend_name(b).decode() == b.name.lower()
    unknown = _lib.status_str(-99)
    for s in kvf.Status:
        assert _lib.status_str(s) != unknown, s
    assert (kvf.Memory.HOST, kvf.Memory.HOST_PINNED, kvf.Memory.DEVICE) == (0, 1, 2)
    assert (kvf.Tier.HOST, kvf.Tier.DISK, kvf.Level.PRIMARY, kvf.Level.SECONDARY) == (0, 1, 0, 1)
    assert (kvf.Order.HEAD_MAJOR, kvf.Order.TOKEN_MAJOR) == (0, 1)
    assert (kvf.Fsync.BATCH, kvf.Fsync.NONE, kvf.Fsync.BLOCK) == (0, 1, 2)


def test_struct_sizes():
    assert ctypes.sizeof(_lib.Move_t) == 40  # src, dst, tokens, the 128-bit key
    assert ctypes.sizeof(_lib.Geometry_t) == 28
    assert ctypes.sizeof(_lib.PoolDesc_t) == 32
    assert ctypes.sizeof(_lib.EngineConfig_t) == 104
    assert ctypes.sizeof(_lib.Info_t) == 456
    assert ctypes.sizeof(_lib.CacheConfig_t) == 88
    assert ctypes.sizeof(_lib.CacheStats_t) == 648
    assert ctypes.sizeof(_lib.CacheEvent_t) == 48
    assert kvf.move_dtype().itemsize == 40


def test_block_bytes_and_region(geometry):
    g = geometry
    assert g.block_bytes == 2 * 2 * 4 * 16 * 32 * 2
    assert kvf.block_bytes(g) == g.block_bytes
    assert kvf.block_bytes(layers=1, kv_factor=1, kv_heads=1, tokens_per_block=2, head_size=2, dtype="int4") == 2
    assert kvf.region(g) == kvf.Region(1, g.block_bytes, g.block_bytes)
    r = g.region(5)  # head-major: one run per (layer, kv, head)
    assert r == (2 * 2 * 4, 5 * 32 * 2, 16 * 32 * 2)
    t = kvf.Geometry(1, 1, 4, 16, 32, kvf.Dtype.BF16, kvf.Order.TOKEN_MAJOR)
    assert t.region(5)[:2] == (1, 5 * 4 * 32 * 2)  # TOKEN_MAJOR, one layer: one run
    g.check()


def test_bad_geometry():
    with pytest.raises(kvf.InvalidArgument) as ei:
        kvf.Geometry(1, 3, 1, 16, 8).check()
    assert ei.value.status == kvf.Status.ERR_INVALID == -1
    assert ei.value.name == "ERR_INVALID"
    assert "kv_factor" in ei.value.message
    with pytest.raises(kvf.KvferryError):
        kvf.Geometry(1, 2, 1, 16, 8, dtype="fp12")
    with pytest.raises(kvf.Unsupported):
        kvf.Geometry(1, 1, 1, 16, 1, dtype="int4").region(3)


def test_error_classes():
    for s in kvf.Status:
        if s < 0:
            cls = kvf.error_class(s)
            assert issubclass(cls, kvf.KvferryError) and cls is not kvf.KvferryError, s
    assert kvf.error_class(-1) is kvf.InvalidArgument
    assert kvf.error_class(-31) is kvf.NotFound and issubclass(kvf.NotFound, kvf.FileError)
    assert kvf.error_class(-50) is kvf.Corrupt and issubclass(kvf.Corrupt, kvf.IntegrityError)
    assert kvf.error_class(-52) is kvf.Lost
    assert kvf.error_class(-20) is kvf.NoDevice and issubclass(kvf.NoDevice, kvf.DeviceError)
    assert kvf.error_class(-10) is kvf.OutOfMemory and issubclass(kvf.OutOfMemory, MemoryError)
    assert kvf.error_class(-11) is kvf.OutOfResource and kvf.Status.ERR_RESOURCE == -11
    assert kvf.error_class(-59) is kvf.IntegrityError  # a future code keeps its group
    assert kvf.error_class(-7) is kvf.UsageError
    assert kvf.error_class(-1000) is kvf.KvferryError
    e = kvf.error_class(-31)(-31, "block 0x2a: not stored")
    assert (e.status, e.name, e.message) == (-31, "ERR_NOT_FOUND", "block 0x2a: not stored")
    assert "block 0x2a" in str(e)


def test_library_path_is_reported():
    assert kvf.library_path.endswith(".so") or "kvferry" in kvf.library_path


def test_import_error_names_what_was_tried(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    env = {"KVFERRY_LIBRARY": str(tmp_path / "nope.so"), "PATH": "/usr/bin:/bin"}
    code = "import sys; sys.path.insert(0, %r); import kvferry" % str(Path(kvf.__file__).parent.parent)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.returncode != 0
    assert "ImportError" in p.stderr and "KVFERRY_LIBRARY" in p.stderr and "nope.so" in p.stderr
