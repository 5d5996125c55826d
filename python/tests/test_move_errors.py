# SPDX-License-Identifier: Apache-2.0
"""Each failed move's message reaches Python: Ticket.errors() without
raising, wait(check=True) raising the first failure's class with every
failure in .failures; the default wait() still returns the statuses."""

import os

import pytest

import kvferry as kvf
from conftest import random_bytes


def _damage(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def test_errors_name_file_and_reason(engine, geometry, rng, tmp_path):
    pool = engine.add_pool(geometry, primary=4, secondary=4)
    for s in range(3):
        pool.slot_view(s)[:] = random_bytes(rng, pool.block_bytes)
    engine.offload(kvf.Tier.DISK, [(s, 0x700 + s) for s in range(3)]).wait(check=True)
    path = tmp_path / "kv" / "pytest" / "00000000000000000000000000000701.kvf"
    _damage(path, os.path.getsize(path) - pool.block_bytes + 5)  # in the payload
    # 0x701 damaged, 0x7ff never stored
    t = engine.onboard(kvf.Tier.DISK, [(0x700, 0), (0x701, 1), (0x7FF, 2)])
    st = t.wait()  # the default: statuses, no raise
    assert st == [kvf.Status.OK, kvf.Status.ERR_CORRUPT, kvf.Status.ERR_NOT_FOUND]
    errs = t.errors()
    assert [e.index for e in errs] == [1, 2] and t.error_count == 2
    assert errs[0].status == kvf.Status.ERR_CORRUPT and isinstance(errs[0].status, kvf.Status)
    assert str(path) in errs[0].message and "checksum" in errs[0].message
    assert "00000000000007ff" in errs[1].message
    with pytest.raises(kvf.Corrupt) as ei:
        t.wait(check=True)
    err = ei.value
    assert isinstance(err, kvf.KvferryError)
    assert [(f.index, f.status) for f in err.failures] == [(1, kvf.Status.ERR_CORRUPT),
                                                          (2, kvf.Status.ERR_NOT_FOUND)]
    assert "2 of 3 moves failed" in err.message and str(path) in err.message


def test_lost_secondary_slot_and_success(engine, geometry, rng):
    pool = engine.add_pool(geometry, primary=4, secondary=4)
    pool.slot_view(0)[:] = random_bytes(rng, pool.block_bytes)
    ok = engine.offload(kvf.Tier.HOST, (0, 1))
    assert ok.wait(check=True) == [kvf.Status.OK]
    assert ok.errors() == [] and ok.error_count == 0
    t = engine.onboard(kvf.Tier.HOST, [(1, 2), (3, 3)])  # secondary 3 holds nothing
    with pytest.raises(kvf.NotFound) as ei:
        t.wait(check=True)
    (f,) = ei.value.failures
    assert f.index == 1 and "secondary slot 3" in f.message
    assert t.errors() == list(ei.value.failures)  # kept on the ticket, readable again


def test_more_failures_than_kept(engine, geometry):
    n = kvf._tickets.ERRORS_KEPT + 10
    engine.add_pool(geometry, primary=n, secondary=4)
    t = engine.onboard(kvf.Tier.DISK, [(0x9000 + i, i) for i in range(n)])  # none stored
    assert t.wait() == [kvf.Status.ERR_NOT_FOUND] * n
    assert t.error_count == n
    errs = t.errors()
    assert [e.index for e in errs] == list(range(kvf._tickets.ERRORS_KEPT))
    assert all(f"{0x9000 + e.index:032x}" in e.message for e in errs)


def test_cache_errors(engine, geometry, rng, tmp_path):
    pool = engine.add_pool(geometry, primary=8, secondary=8)
    for s in range(2):
        pool.slot_view(s)[:] = random_bytes(rng, pool.block_bytes)
    with kvf.Cache(engine, disk_blocks=16) as cache:
        cache.put([0x801, 0x802], [0, 1]).wait(check=True)
        path = tmp_path / "kv" / "pytest" / "00000000000000000000000000000802.kvf"
        _damage(path, os.path.getsize(path) - pool.block_bytes + 7)
        t = cache.get([0x801, 0x802], [4, 5])
        with pytest.raises(kvf.Corrupt) as ei:
            t.wait(check=True)
        (f,) = ei.value.failures
        assert f.index == 1 and str(path) in f.message and "00000000000000000000000000000802" in f.message
        with pytest.raises(kvf.InvalidArgument) as ei:
            cache.put([0x803, 0x803], [2, 3])
        assert "keys 0 and 1" in ei.value.message
