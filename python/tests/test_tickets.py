# SPDX-License-Identifier: Apache-2.0
"""Tickets: per-move statuses, poll until done, unknown and retired tickets."""

import time

import pytest

import kvferry as kvf
from conftest import random_bytes


def test_unknown_ticket(engine):
    with pytest.raises(kvf.UnknownTicket) as ei:
        engine.wait(424242)
    assert ei.value.status == kvf.Status.ERR_UNKNOWN_TICKET == -5
    assert "424242" in ei.value.message
    with pytest.raises(kvf.UnknownTicket):
        engine.poll(0)  # 0 is never a ticket


def test_poll_until_done(engine, geometry, rng):
    pool = engine.add_pool(geometry, primary=4, secondary=4)
    for s in range(4):
        pool.slot_view(s)[:] = random_bytes(rng, pool.block_bytes)
    t = engine.offload(kvf.Tier.DISK, [(s, 0x500 + s) for s in range(4)])
    assert isinstance(t, kvf.Ticket) and t.id != 0 and t.count == 4
    deadline = time.monotonic() + 30
    while (st := t.poll()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert st == [kvf.Status.OK] * 4 and t.done and t.ok
    assert t.poll() == st and t.wait() == st  # kept after retirement
    with pytest.raises(kvf.UnknownTicket):
        engine._result(t.id, t.count, block=False)  # retired in the library


def test_wait_by_number_and_mixed_statuses(engine, geometry, rng):
    pool = engine.add_pool(geometry, primary=4, secondary=4)
    pool.slot_view(0)[:] = random_bytes(rng, pool.block_bytes)
    engine.offload(kvf.Tier.DISK, (0, 1)).wait(check=True)
    t = engine.onboard(kvf.Tier.DISK, [(1, 1), (2, 2), (1, 3)])
    st = engine.wait(t.id)  # by number: the engine remembers the batch's size
    assert st == [kvf.Status.OK, kvf.Status.ERR_NOT_FOUND, kvf.Status.OK]
    assert all(isinstance(s, kvf.Status) for s in st)
    with pytest.raises(kvf.UnknownTicket):
        engine.wait(t.id)


def test_detached_batches_and_sync_stream(engine, geometry, rng):
    pool = engine.add_pool(geometry, primary=4, secondary=4)
    data = random_bytes(rng, pool.block_bytes)
    pool.slot_view(0)[:] = data
    assert engine.offload(kvf.Tier.HOST, (0, 2), detach=True) is None
    engine.sync_stream()  # host backend / None: blocks until queued batches complete
    assert bytes(pool.slot_view(2, kvf.Level.SECONDARY)) == data.tobytes()

    class Stream:
        cuda_stream = 0

    engine.sync_stream(0)
    engine.sync_stream(Stream())
    with pytest.raises(TypeError):
        engine.sync_stream("stream")


def test_tickets_from_threads(engine, geometry, rng):
    import threading

    pool = engine.add_pool(geometry, primary=8, secondary=8)
    for s in range(8):
        pool.slot_view(s)[:] = random_bytes(rng, pool.block_bytes)
    out = []

    def worker(s):
        out.append(engine.offload(kvf.Tier.HOST, (s, s)).wait())

    ths = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert out == [[kvf.Status.OK]] * 8
    for s in range(8):
        assert bytes(pool.slot_view(s, kvf.Level.SECONDARY)) == bytes(pool.slot_view(s))
