# SPDX-License-Identifier: Apache-2.0
"""Layer-wise moves through the Python API on the host backend: an onboard
or a cache get of some pools writes those pools only; Ticket.wait_pool
answers per pool before wait(); bad pool lists raise naming the pool."""

import numpy as np
import pytest

import kvferry as kvf

GEOM = dict(layers=1, kv_factor=2, kv_heads=2, tokens_per_block=16, head_size=32, dtype=kvf.Dtype.FP16)
LAYERS = 4


def engine(tmp_path=None):
    e = kvf.Engine(backend=kvf.Backend.HOST, file_dir=str(tmp_path) if tmp_path else None)
    for _ in range(LAYERS):
        e.add_pool(primary=16, secondary=16, **GEOM)
    return e


def fill(e, slot, tag):
    rng = np.random.default_rng(tag)
    out = []
    for p in range(LAYERS):
        v = e.slot_view(p, slot)
        v[:] = rng.integers(0, 256, v.size, dtype=np.uint8)
        out.append(v.copy())
    return out


def test_onboard_some_pools(tmp_path):
    with engine(tmp_path) as e:
        blocks = [fill(e, s, 100 + s) for s in range(4)]
        e.offload(kvf.Tier.HOST, [(s, s) for s in range(4)]).wait(check=True)
        e.offload(kvf.Tier.DISK, [(s, 500 + s) for s in range(4)]).wait(check=True)
        for tier, src in ((kvf.Tier.HOST, 0), (kvf.Tier.DISK, 500)):
            for s in range(4, 8):
                for p in range(LAYERS):
                    e.slot_view(p, s)[:] = 0xA5
            t = e.onboard(tier, [(src + s, 4 + s) for s in range(4)], pools=[3, 1])
            t.wait_pool(1)
            t.stream_wait_pool(3)  # no torch stream here: a host wait
            with pytest.raises(kvf.OutOfRange):
                t.wait_pool(0)
            assert all(s == kvf.Status.OK for s in t.wait())
            t.wait_pool(3)  # waited: returns at once
            for s in range(4):
                for p in range(LAYERS):
                    got = e.slot_view(p, 4 + s)
                    if p in (1, 3):
                        assert np.array_equal(got, blocks[s][p])
                    else:
                        assert (got == 0xA5).all()


def test_offload_a_layer_at_a_time():
    """Each layer offloaded from a different block: the slot ends with each
    layer's own."""
    with engine() as e:
        want = []
        for p in range(LAYERS):
            want.append(fill(e, 0, 10 + p)[p])
            e.offload(kvf.Tier.HOST, [(0, 9)], pools=[p]).wait(check=True)
        e.onboard(kvf.Tier.HOST, [(9, 1)]).wait(check=True)
        for p in range(LAYERS):
            assert np.array_equal(e.slot_view(p, 1), want[p])


def test_bad_pool_lists(tmp_path):
    with engine(tmp_path) as e:
        with pytest.raises(kvf.OutOfRange, match="pool 9 out of range"):
            e.onboard(kvf.Tier.HOST, [(0, 1)], pools=[0, 9])
        with pytest.raises(kvf.InvalidArgument, match="listed twice"):
            e.onboard(kvf.Tier.HOST, [(0, 1)], pools=[2, 2])
        with pytest.raises(kvf.Unsupported, match="a stored block holds every pool"):
            e.offload(kvf.Tier.DISK, [(0, 5)], pools=[0])
        with pytest.raises(kvf.InvalidArgument):
            e.onboard(kvf.Tier.HOST, [(0, 1)], pools=[-1])


def test_cache_get_pools(tmp_path):
    with engine(tmp_path) as e, kvf.Cache(e, host_blocks=2, disk_blocks=16) as c:
        blocks = [fill(e, s, 200 + s) for s in range(6)]
        keys = list(range(0x500, 0x506))
        c.put(keys, list(range(6))).wait(check=True)
        for s in range(6, 12):
            for p in range(LAYERS):
                e.slot_view(p, s)[:] = 0xA5
        t = c.get(keys, list(range(6, 12)), pools=[2])
        t.wait_pool(2)
        with pytest.raises(kvf.OutOfRange):
            t.wait_pool(0)
        t.wait(check=True)
        for s in range(6):
            for p in range(LAYERS):
                got = e.slot_view(p, 6 + s)
                assert np.array_equal(got, blocks[s][p]) if p == 2 else (got == 0xA5).all()


def test_default_stream_is_named():
    """torch's default stream has handle 0, which the C API reads as "no
    stream" (a host wait, or no ordering): the binding passes
    cudaStreamLegacy for it instead."""
    from kvferry._streams import _stream_handle

    class Stream:
        def __init__(self, h):
            self.cuda_stream = h

    assert _stream_handle(Stream(0)) == 1
    assert _stream_handle(Stream(0x7f00)) == 0x7f00
    assert _stream_handle(None) is None
    assert _stream_handle(0) is None
