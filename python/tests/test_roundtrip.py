# SPDX-License-Identifier: Apache-2.0
"""Byte-exact round trips on the host backend: random data (never zeros),
poisoned destinations, whole blocks and first-N-token moves, host and file
tiers, kvferry-allocated and caller-registered pools."""

import numpy as np
import pytest

import kvferry as kvf
from conftest import random_bytes

POISON = 0xA5


def fill(pool, slot, rng, level=kvf.Level.PRIMARY):
    data = random_bytes(rng, pool.block_bytes)
    pool.slot_view(slot, level)[:] = data
    return data


def poison(pool, slot, level=kvf.Level.PRIMARY):
    pool.slot_view(slot, level)[:] = POISON


def token_mask(g, tokens):
    """True for the bytes of a block that hold its first `tokens` tokens."""
    r = g.region(tokens)
    mask = np.zeros(g.block_bytes, bool)
    for row in range(r.rows):
        mask[row * r.pitch: row * r.pitch + r.row_bytes] = True
    return mask


@pytest.mark.parametrize("tier", [kvf.Tier.HOST, kvf.Tier.DISK])
def test_whole_block_round_trip(engine, geometry, rng, tier):
    pool = engine.add_pool(geometry, primary=8, secondary=8)
    src = [fill(pool, s, rng) for s in range(4)]
    dst = [0x100 + s for s in range(4)] if tier == kvf.Tier.DISK else [7, 6, 5, 4]
    t = engine.offload(tier, [(s, d) for s, d in zip(range(4), dst)])
    assert t.wait() == [kvf.Status.OK] * 4
    for s in range(4):
        poison(pool, s)
    t = engine.onboard(tier, [(d, 3 - s) for s, d in enumerate(dst)])
    assert t.wait(check=True) == [kvf.Status.OK] * 4
    for s in range(4):
        np.testing.assert_array_equal(pool.slot_view(3 - s), src[s])


@pytest.mark.parametrize("order", [kvf.Order.HEAD_MAJOR, kvf.Order.TOKEN_MAJOR])
@pytest.mark.parametrize("tier", [kvf.Tier.HOST, kvf.Tier.DISK])
def test_partial_tokens(engine, rng, order, tier):
    g = kvf.Geometry(2, 2, 4, 16, 8, kvf.Dtype.BF16, order)
    pool = engine.add_pool(g, primary=4, secondary=4)
    data = fill(pool, 0, rng)
    key = 0x2A if tier == kvf.Tier.DISK else 2
    engine.offload(tier, (0, key, 5)).wait(check=True)
    poison(pool, 1)
    engine.onboard(tier, (key, 1, 5)).wait(check=True)
    got = pool.slot_view(1)
    mask = token_mask(g, 5)
    assert 0 < mask.sum() < g.block_bytes
    np.testing.assert_array_equal(got[mask], data[mask])
    assert (got[~mask] == POISON).all()  # nothing beyond the 5 tokens was written
    # fewer tokens than stored is fine; more is refused, per move
    poison(pool, 2)
    engine.onboard(tier, [(key, 2, 3)]).wait(check=True)
    m3 = token_mask(g, 3)
    np.testing.assert_array_equal(pool.slot_view(2)[m3], data[m3])
    assert engine.onboard(tier, [(key, 3, 6)]).wait() == [kvf.Status.ERR_RANGE]
    assert engine.onboard(tier, [(key, 3, 0)]).wait() == [kvf.Status.ERR_RANGE]


def test_many_pools_one_block(engine, rng):
    """A block is the same slot of every pool: one move carries all of them."""
    geos = [kvf.Geometry(1, 1, 2, 16, 16, kvf.Dtype.FP16, kvf.Order.TOKEN_MAJOR) for _ in range(3)]
    pools = [engine.add_pool(g, primary=4, secondary=4) for g in geos]
    data = [fill(p, 1, rng) for p in pools]
    engine.offload(kvf.Tier.HOST, (1, 3)).wait(check=True)
    engine.offload(kvf.Tier.DISK, (1, 77)).wait(check=True)
    for p in pools:
        poison(p, 2)
        poison(p, 0)
    engine.onboard(kvf.Tier.HOST, (3, 2)).wait(check=True)
    engine.onboard(kvf.Tier.DISK, (77, 0)).wait(check=True)
    for p, d in zip(pools, data):
        np.testing.assert_array_equal(p.slot_view(2), d)
        np.testing.assert_array_equal(p.slot_view(0), d)
        np.testing.assert_array_equal(p.slot_view(3, kvf.Level.SECONDARY), d)


def test_batch_forms(engine, geometry, rng):
    pool = engine.add_pool(geometry, primary=8, secondary=8)
    data = {s: fill(pool, s, rng) for s in range(4)}
    # int array (n, 2), structured array, Move tuples, dicts
    engine.offload(kvf.Tier.HOST, np.array([[0, 0], [1, 1]], dtype=np.int64)).wait(check=True)
    sa = np.zeros(2, dtype=[("src", "u4"), ("dst", "u4"), ("tokens", "u2")])
    sa["src"], sa["dst"] = [2, 3], [2, 3]
    engine.offload(kvf.Tier.HOST, sa).wait(check=True)
    for s in range(4):
        poison(pool, 4 + s)
    moves = np.zeros(2, dtype=kvf.move_dtype())
    moves["src"], moves["dst"] = [0, 1], [4, 5]
    engine.onboard(kvf.Tier.HOST, moves).wait(check=True)
    engine.onboard(kvf.Tier.HOST, [kvf.Move(2, 6), {"src": 3, "dst": 7}]).wait(check=True)
    for s in range(4):
        np.testing.assert_array_equal(pool.slot_view(4 + s), data[s])
    # (n, 3) with tokens, and one move given as a 1-D array
    engine.offload(kvf.Tier.DISK, np.array([[0, 9, 4], [1, 10, 0]], dtype=np.uint32)).wait(check=True)
    poison(pool, 4)
    engine.onboard(kvf.Tier.DISK, np.array([10, 4])).wait(check=True)
    np.testing.assert_array_equal(pool.slot_view(4), data[1])
    with pytest.raises(kvf.InvalidArgument):
        engine.offload(kvf.Tier.HOST, np.array([[0, -1]]))
    with pytest.raises(kvf.InvalidArgument):
        engine.offload(kvf.Tier.HOST, [(0, 1, 2, 3)])


def test_copy(engine, geometry, rng):
    pool = engine.add_pool(geometry, primary=4)
    data = fill(pool, 0, rng)
    poison(pool, 1)
    poison(pool, 2)
    engine.copy([(0, 1), (0, 2, 7)]).wait(check=True)
    np.testing.assert_array_equal(pool.slot_view(1), data)
    m = token_mask(geometry, 7)
    np.testing.assert_array_equal(pool.slot_view(2)[m], data[m])
    assert (pool.slot_view(2)[~m] == POISON).all()


def test_caller_registered_numpy_pools(engine, geometry, rng):
    bb = geometry.block_bytes
    primary = random_bytes(rng, 6 * bb).reshape(6, bb)  # the engine's own KV array
    secondary = np.full((4, bb), POISON, np.uint8)
    expected = primary.copy()
    pool = engine.add_pool(geometry, primary=primary, secondary=kvf.PoolDesc(buffer=secondary))
    assert pool.primary.slots == 6 and pool.secondary.slots == 4
    assert engine.slot_ptr(0, 2) == primary.ctypes.data + 2 * bb
    engine.offload(kvf.Tier.HOST, [(0, 3), (5, 0)]).wait(check=True)
    np.testing.assert_array_equal(secondary[3], expected[0])  # kvferry wrote the caller's array
    np.testing.assert_array_equal(secondary[0], expected[5])
    primary[1] = POISON
    primary[2] = POISON
    engine.onboard(kvf.Tier.HOST, [(3, 1), (0, 2)]).wait(check=True)
    np.testing.assert_array_equal(primary[1], expected[0])
    np.testing.assert_array_equal(primary[2], expected[5])
    engine.offload(kvf.Tier.DISK, (4, 0x44)).wait(check=True)
    primary[4] = POISON
    engine.onboard(kvf.Tier.DISK, (0x44, 4)).wait(check=True)
    np.testing.assert_array_equal(primary[4], expected[4])


def test_registered_typed_array_with_stride(engine, rng):
    """A [blocks][tokens][heads][head] fp16 tensor as one TOKEN_MAJOR pool,
    and a padded stride given explicitly."""
    g = kvf.Geometry(1, 1, 2, 16, 8, kvf.Dtype.FP16, kvf.Order.TOKEN_MAJOR)
    kv = rng.standard_normal((5, 16, 2, 8)).astype(np.float16) + np.float16(8)
    stride = g.block_bytes + 64
    host = np.full(3 * stride, POISON, np.uint8)
    pool = engine.add_pool(g, primary=kv, secondary=kvf.PoolDesc(buffer=host, slot_stride=stride))
    assert pool.primary.slots == 5 and pool.secondary.slots == 3
    ref = kv.copy()
    engine.offload(kvf.Tier.HOST, (4, 2)).wait(check=True)
    assert bytes(host[2 * stride: 2 * stride + g.block_bytes]) == ref[4].tobytes()
    assert (host[2 * stride + g.block_bytes: 3 * stride] == POISON).all()
    kv[0] = np.float16(-1)
    engine.onboard(kvf.Tier.HOST, (2, 0)).wait(check=True)
    np.testing.assert_array_equal(kv[0], ref[4])


class ArrayInterfaceOnly:
    def __init__(self, arr):
        self._arr = arr
        self.__array_interface__ = arr.__array_interface__


def test_registration_protocols(engine, geometry, rng):
    """__array_interface__, DLPack and buffer-protocol objects as pools."""
    bb = geometry.block_bytes
    via_iface = random_bytes(rng, 2 * bb)
    via_dlpack = random_bytes(rng, 2 * bb)
    sec_bytes = bytearray(2 * bb)
    pool = engine.add_pool(geometry, primary=ArrayInterfaceOnly(via_iface), secondary=sec_bytes)
    other = engine.add_pool(geometry, primary=kvf.PoolDesc(buffer=_DLPackOnly(via_dlpack)), secondary=2)
    assert other.primary.slots == 2 and pool.secondary.slots == 2
    a, b = via_iface.copy(), via_dlpack.copy()
    engine.offload(kvf.Tier.HOST, (1, 0)).wait(check=True)
    assert bytes(sec_bytes[:bb]) == a[bb:].tobytes()
    via_iface[:bb] = POISON
    via_dlpack[:bb] = POISON
    engine.onboard(kvf.Tier.HOST, (0, 0)).wait(check=True)
    np.testing.assert_array_equal(via_iface[:bb], a[bb:])
    np.testing.assert_array_equal(via_dlpack[:bb], b[bb:])
    np.testing.assert_array_equal(other.slot_view(0, kvf.Level.SECONDARY), b[bb:])


class _DLPackOnly:
    """An object that only speaks DLPack (NumPy's own exporter underneath)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, stream=None):
        return self._arr.__dlpack__()

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def test_dlpack_buffer_parse(rng):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = kvf.as_buffer(_DLPackOnly(a))
    assert (b.ptr, b.nbytes, b.kind, b.source) == (a.ctypes.data, a.nbytes, "host", "__dlpack__")
    s = kvf.as_buffer(_DLPackOnly(a[1:]))  # a view at an offset
    assert (s.ptr, s.nbytes) == (a.ctypes.data + 12 * 4, 12 * 4)
    one = kvf.as_buffer(_DLPackOnly(a[1:2, :, :]))  # an extent-1 dim's stride does not matter
    assert one.nbytes == 12 * 4
    with pytest.raises(kvf.InvalidArgument, match="not C-contiguous"):
        kvf.as_buffer(_DLPackOnly(a[:, :, ::2]))


def test_file_blocks_survive_reopen(tmp_path, geometry, rng):
    kw = dict(backend=kvf.Backend.HOST, file_dir=str(tmp_path), file_namespace="reopen")
    with kvf.Engine(**kw) as e:
        p = e.add_pool(geometry, primary=2)
        data = fill(p, 0, rng)
        e.offload(kvf.Tier.DISK, (0, 0xBEEF)).wait(check=True)
    with kvf.Engine(**kw) as e:
        p = e.add_pool(geometry, primary=2)
        poison(p, 1)
        e.onboard(kvf.Tier.DISK, (0xBEEF, 1)).wait(check=True)
        np.testing.assert_array_equal(p.slot_view(1), data)
    with kvf.Engine(**dict(kw, file_namespace="other")) as e:
        e.add_pool(geometry, primary=2)
        assert e.onboard(kvf.Tier.DISK, (0xBEEF, 1)).wait() == [kvf.Status.ERR_NOT_FOUND]


def test_registered_memory_outlives_the_engine_object(geometry, rng):
    import gc
    import weakref

    bb = geometry.block_bytes
    arr = random_bytes(rng, 2 * bb)
    e = kvf.Engine(backend=kvf.Backend.HOST)
    holder = ArrayInterfaceOnly(arr)
    ref = weakref.ref(holder)
    e.add_pool(geometry, primary=holder, secondary=2)
    del holder
    gc.collect()
    assert ref() is not None  # the engine keeps the owner
    e.offload(kvf.Tier.HOST, (0, 0)).wait(check=True)
    e.close()
    gc.collect()
    assert ref() is None  # released once the engine is gone
    assert e.closed
    with pytest.raises(kvf.InvalidState, match="closed"):
        e.slot_ptr(0, 0)


class _FakeStream:
    cuda_stream = 0x1234  # a handle the host backend must refuse, never touch


@pytest.mark.parametrize("tier", [kvf.Tier.HOST, kvf.Tier.DISK])
def test_offload_after(engine, geometry, rng, tier):
    """offload(after=None) is offload; a stream (int or object) is refused on
    the host backend, naming the call, and nothing is queued."""
    pool = engine.add_pool(geometry, primary=4, secondary=4)
    src = fill(pool, 0, rng)
    dst = 0 if tier == kvf.Tier.HOST else 0x77
    for after in (0x1234, _FakeStream()):
        with pytest.raises(kvf.Unsupported, match="kvf_offload_after"):
            engine.offload(tier, (0, dst), after=after)
    engine.sync_stream(None)
    if tier == kvf.Tier.HOST:
        assert not np.any(pool.slot_view(dst, kvf.Level.SECONDARY))
    else:
        with pytest.raises(kvf.KvferryError):
            engine.onboard(tier, (dst, 1)).wait(check=True)
    with pytest.raises(TypeError, match="offload"):
        engine.offload(tier, (0, dst), after="stream")
    engine.offload(tier, (0, dst), after=None).wait(check=True)
    poison(pool, 2)
    engine.onboard(tier, (dst, 2)).wait(check=True)
    np.testing.assert_array_equal(pool.slot_view(2), src)


@pytest.mark.parametrize("where", ["disk", "mem"])
def test_128_bit_keys(tmp_path, geometry, rng, where):
    """Keys are ints below 2**128: keys equal in their low (or high) 64 bits
    are different blocks on disk and in a remote store, through lists and
    structured arrays alike; a key of 2**128 or more, or negative, is
    refused naming the move, before anything moves."""
    lo = 0xABCDEF
    keys = [lo, 1 << 64 | lo, (2**64 - 1) << 64 | lo, 1 << 64 | (lo + 1)]
    kw = ({"file_dir": str(tmp_path / "kv"), "file_namespace": "wide"} if where == "disk"
          else {"remote_url": "mem://py-wide-keys"})
    tier = kvf.Tier.DISK if where == "disk" else kvf.Tier.REMOTE
    with kvf.Engine(backend=kvf.Backend.HOST, **kw) as e:
        pool = e.add_pool(geometry, primary=16)
        data = [fill(pool, s, rng) for s in range(len(keys))]
        e.offload(tier, [(s, k) for s, k in enumerate(keys)]).wait(check=True)
        for s in range(8, 16):
            poison(pool, s)
        e.onboard(tier, [(k, 8 + i) for i, k in enumerate(keys)]).wait(check=True)
        for i in range(len(keys)):
            np.testing.assert_array_equal(pool.slot_view(8 + i), data[i])
        # the same through a structured array with the key's halves
        a = np.zeros(len(keys), kvf.move_dtype())
        a["dst"] = np.arange(12, 12 + len(keys))
        a["key_hi"] = [k >> 64 for k in keys]
        a["key_lo"] = [k & (2**64 - 1) for k in keys]
        e.onboard(tier, a).wait(check=True)
        for i in range(len(keys)):
            np.testing.assert_array_equal(pool.slot_view(12 + i), data[i])
        with pytest.raises(kvf.InvalidArgument, match=r"moves: entry 1: dst = 340282366920938463463374607431768211456"):
            e.offload(tier, [(0, 5), (1, 2**128)])
        with pytest.raises(kvf.InvalidArgument, match="moves: entry 0: src"):
            e.onboard(tier, [(-1, 3)])
        e.remove(tier, [keys[1]]).wait(check=True)
        st = e.onboard(tier, [(k, 8 + i) for i, k in enumerate(keys)]).wait()
        assert st == [kvf.Status.OK, kvf.Status.ERR_NOT_FOUND, kvf.Status.OK, kvf.Status.OK]
    if where == "disk":
        names = sorted(p.name for p in (tmp_path / "kv" / "wide").glob("*.kvf"))
        assert names == sorted(f"{k:032x}.kvf" for k in keys if k != keys[1])
