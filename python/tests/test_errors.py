# SPDX-License-Identifier: Apache-2.0
"""Each failure raises the right KvferryError subclass with its status and a
message naming the pool, slot, block or file; per-move failures come back
as statuses (and raise with wait(check=True))."""

import os

import numpy as np
import pytest

import kvferry as kvf
from conftest import random_bytes


def test_slot_out_of_range(engine, geometry):
    engine.add_pool(geometry, primary=4, secondary=2)
    with pytest.raises(kvf.OutOfRange) as ei:
        engine.slot_ptr(0, 70)
    e = ei.value
    assert (e.status, e.name) == (-2, "ERR_RANGE")
    assert "pool 0" in e.message and "70" in e.message
    with pytest.raises(kvf.OutOfRange, match="pool 3"):
        engine.slot_ptr(3, 0)
    with pytest.raises(kvf.OutOfRange) as ei:
        engine.offload(kvf.Tier.HOST, [(0, 0), (1, 9)])  # refused whole: secondary slot 9 of 2
    assert "9" in ei.value.message
    with pytest.raises(kvf.OutOfRange):
        engine.onboard(kvf.Tier.HOST, (0, 4))


def test_no_secondary_and_no_file_tier(geometry):
    with kvf.Engine(backend=kvf.Backend.HOST) as e:  # no file_dir
        e.add_pool(geometry, primary=2)
        with pytest.raises(kvf.UsageError) as ei:
            e.offload(kvf.Tier.HOST, (0, 0))
        assert ei.value.status < 0 and ei.value.message
        with pytest.raises(kvf.UsageError) as ei:
            e.offload(kvf.Tier.DISK, (0, 1))
        assert "file" in ei.value.message.lower()


def test_pool_after_transfer_is_state_error(engine, geometry):
    engine.add_pool(geometry, primary=2, secondary=2)
    engine.offload(kvf.Tier.HOST, (0, 0)).wait()
    with pytest.raises(kvf.InvalidState) as ei:
        engine.add_pool(geometry, primary=2)
    assert ei.value.status == kvf.Status.ERR_STATE


def test_bad_config():
    with pytest.raises(TypeError, match="file_dirr"):
        kvf.Engine(file_dirr="/tmp")
    with pytest.raises(kvf.InvalidArgument) as ei:
        kvf.Engine(backend=kvf.Backend.HOST, file_dir="/tmp/x", file_namespace="bad name/..")
    assert "namespace" in ei.value.message


def test_cuda_without_gpu_is_no_device():
    if kvf.info().cuda_devices > 0:
        pytest.skip("a GPU is usable here")
    with pytest.raises(kvf.NoDevice) as ei:
        kvf.Engine(backend=kvf.Backend.CUDA)
    assert ei.value.status == kvf.Status.ERR_NO_DEVICE and ei.value.message


def test_not_found(engine, geometry):
    engine.add_pool(geometry, primary=2, secondary=2)
    t = engine.onboard(kvf.Tier.DISK, [(0x1234, 0)])
    assert t.wait() == [kvf.Status.ERR_NOT_FOUND]
    assert t.failed() == [0] and not t.ok
    with pytest.raises(kvf.NotFound) as ei:
        t.wait(check=True)
    assert ei.value.status == -31 and "move 0" in ei.value.message
    # a secondary slot never written holds no block
    assert engine.onboard(kvf.Tier.HOST, (1, 0)).wait() == [kvf.Status.ERR_NOT_FOUND]


def _block_file(tmp_path, key):
    return tmp_path / "kv" / "pytest" / f"{key:032x}.kvf"


def test_corrupt_file(engine, geometry, rng, tmp_path):
    pool = engine.add_pool(geometry, primary=2)
    pool.slot_view(0)[:] = random_bytes(rng, pool.block_bytes)
    engine.offload(kvf.Tier.DISK, (0, 0x77)).wait(check=True)
    path = _block_file(tmp_path, 0x77)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF  # a data byte
    path.write_bytes(bytes(raw))
    pool.slot_view(1)[:] = 0x5A
    t = engine.onboard(kvf.Tier.DISK, (0x77, 1))
    with pytest.raises(kvf.Corrupt) as ei:
        t.wait(check=True)
    assert ei.value.status == kvf.Status.ERR_CORRUPT
    assert t.statuses == [kvf.Status.ERR_CORRUPT]


def test_mismatched_layout(tmp_path, geometry, rng):
    kw = dict(backend=kvf.Backend.HOST, file_dir=str(tmp_path), file_namespace="ns")
    with kvf.Engine(**kw) as e:
        p = e.add_pool(geometry, primary=1)
        p.slot_view(0)[:] = random_bytes(rng, p.block_bytes)
        e.offload(kvf.Tier.DISK, (0, 5)).wait(check=True)
    other = kvf.Geometry(geometry.layers, geometry.kv_factor, geometry.kv_heads, geometry.tokens_per_block,
                         geometry.head_size, kvf.Dtype.BF16)  # same size, another type
    with kvf.Engine(**kw) as e:
        e.add_pool(other, primary=1)
        st = e.onboard(kvf.Tier.DISK, (5, 0)).wait()
        assert st == [kvf.Status.ERR_MISMATCH]
        assert isinstance(kvf.error_class(st[0])(st[0]), kvf.Mismatch)


def test_lost_after_failed_move(tmp_path, geometry, rng):
    """A move queued to read what a failed move wrote fails with LOST."""
    with kvf.Engine(backend=kvf.Backend.HOST, threads=1, file_dir=str(tmp_path), file_namespace="lost",
                    fsync=kvf.Fsync.BLOCK) as e:
        pool = e.add_pool(geometry, primary=2, secondary=2)
        pool.slot_view(0)[:] = random_bytes(rng, pool.block_bytes)
        slow = e.offload(kvf.Tier.DISK, [(0, k) for k in range(1000, 1064)])  # reads slot 0, fsyncs each file
        bad = e.onboard(kvf.Tier.DISK, (0xDEAD, 0))  # writes slot 0 after those reads; fails
        after = e.offload(kvf.Tier.HOST, (0, 1))  # reads slot 0 after the failed write
        assert slow.wait() == [kvf.Status.OK] * 64
        assert bad.wait() == [kvf.Status.ERR_NOT_FOUND]
        assert after.wait() == [kvf.Status.ERR_LOST]
        with pytest.raises(kvf.Lost):
            after.raise_for_status()
        # and the secondary slot stays lost for later reads until rewritten
        assert e.onboard(kvf.Tier.HOST, (1, 1)).wait() == [kvf.Status.ERR_LOST]


def test_buffer_checks(engine, geometry):
    bb = geometry.block_bytes
    with pytest.raises(kvf.OutOfRange) as ei:
        engine.add_pool(geometry, primary=kvf.PoolDesc(buffer=np.ones(3 * bb, np.uint8), slots=4))
    assert "pool 0 primary" in ei.value.message and str(4 * bb) in ei.value.message
    with pytest.raises(kvf.OutOfRange, match="whole number"):
        engine.add_pool(geometry, primary=np.ones(bb + 1, np.uint8))
    with pytest.raises(kvf.InvalidArgument, match="C-contiguous"):
        engine.add_pool(geometry, primary=np.ones((4, 2 * bb), np.uint8)[:, ::2])
    ro = np.ones(2 * bb, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(kvf.InvalidArgument, match="read-only"):
        engine.add_pool(geometry, primary=ro)
    with pytest.raises(kvf.InvalidArgument, match="read-only"):
        engine.add_pool(geometry, primary=bytes(2 * bb))
    with pytest.raises(kvf.InvalidArgument, match="not an array"):
        engine.add_pool(geometry, primary=kvf.PoolDesc(buffer=object()))
    with pytest.raises(kvf.InvalidArgument, match="host memory"):
        engine.add_pool(geometry, primary=kvf.PoolDesc(buffer=np.ones(2 * bb, np.uint8), memory=kvf.Memory.DEVICE))
    assert engine.pool_count == 0  # nothing was added


class FakeCudaArray:
    def __init__(self, nbytes):
        self.__cuda_array_interface__ = {"data": (0x7F0000000000, False), "shape": (nbytes,), "typestr": "|u1",
                                         "version": 3, "strides": None}


def test_cuda_memory_on_host_backend(engine, geometry):
    with pytest.raises(kvf.InvalidArgument) as ei:
        engine.add_pool(geometry, primary=FakeCudaArray(2 * geometry.block_bytes))
    assert "CUDA" in ei.value.message and "pool 0 primary" in ei.value.message
    b = kvf.as_buffer(FakeCudaArray(64))
    assert (b.kind, b.nbytes, b.ptr) == ("cuda", 64, 0x7F0000000000)


def test_slot_view_of_missing_level(engine, geometry):
    engine.add_pool(geometry, primary=2)
    with pytest.raises(kvf.KvferryError):
        engine.slot_view(0, 0, kvf.Level.SECONDARY)
