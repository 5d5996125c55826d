# SPDX-License-Identifier: Apache-2.0
"""The cache and block keys from Python, on the host backend: round trips
through the host and disk tiers byte for byte, eviction, pins, removal,
events in order, stats, Prometheus text, errors, restart."""

import numpy as np
import pytest

import kvferry as kvf
from conftest import random_bytes

POISON = 0xA5
TPB = 16


def make_engine(tmp_path, ns="cache"):
    return kvf.Engine(backend=kvf.Backend.HOST, threads=2, file_dir=str(tmp_path / "kv"), file_namespace=ns)


def add_pools(engine, geometry, primary=16, secondary=8, pools=2):
    return [engine.add_pool(geometry, primary=primary, secondary=secondary) for _ in range(pools)]


def per_tier(host=0, disk=0):
    """A per-tier figure of CacheStats."""
    return {"host": host, "disk": disk, "remote": 0, "gpu": 0}


def fill(pools, slot, rng):
    data = [random_bytes(rng, p.block_bytes) for p in pools]
    for p, d in zip(pools, data):
        p.slot_view(slot)[:] = d
    return data


def poison(pools, slot):
    for p in pools:
        p.slot_view(slot)[:] = POISON


def assert_slot(pools, slot, data):
    for p, d in zip(pools, data):
        np.testing.assert_array_equal(p.slot_view(slot), d)


# ---- keys --------------------------------------------------------------------------


def test_keys():
    tokens = list(range(1000, 1000 + 5 * TPB + 3))  # 5 whole blocks and a partial one
    keys = kvf.key_chain_all(tokens, TPB)
    assert len(keys) == 5 and len(set(keys)) == 5 and all(0 < k < 2**128 for k in keys)
    assert any(k >= 2**64 for k in keys)  # 128-bit keys, not 64-bit ones widened
    parent = 0
    for i, k in enumerate(keys):
        parent = kvf.key_chain(parent, tokens[i * TPB:(i + 1) * TPB])
        assert parent == k
    # NumPy arrays of any integer type give the same keys
    for dt in (np.uint32, np.int64, np.uint16):
        assert kvf.key_chain_all(np.array(tokens, dtype=dt), TPB) == keys
    # salts: by name (key_salt) or number; a salt separates equal tokens
    salted = kvf.key_chain_all(tokens, TPB, salt="lora-a")
    assert salted == kvf.key_chain_all(tokens, TPB, salt=kvf.key_salt("lora-a"))
    assert not set(salted) & set(keys)
    assert kvf.key_salt("lora-a") == kvf.key_salt(b"lora-a") != kvf.key_salt("lora-b")
    # shared prefixes share keys
    other = kvf.key_chain_all(tokens[:2 * TPB] + [7] * TPB, TPB)
    assert other[:2] == keys[:2] and other[2] != keys[2]
    assert kvf.key_chain_all(tokens[:TPB - 1], TPB) == []
    assert kvf.key_chain(0, []) != 0  # never 0


def test_key_errors():
    with pytest.raises(kvf.InvalidArgument, match="token id"):
        kvf.key_chain_all([1, -2, 3], TPB)
    with pytest.raises(kvf.InvalidArgument, match="token id"):
        kvf.key_chain_all(np.array([1, 2**32], dtype=np.int64), TPB)
    with pytest.raises(kvf.InvalidArgument):
        kvf.key_chain_all(np.array([1.5]), TPB)
    with pytest.raises(kvf.InvalidArgument, match="tokens_per_block"):
        kvf.key_chain_all([1, 2], 0)
    with pytest.raises(kvf.InvalidArgument, match="parent"):
        kvf.key_chain(-1, [1])
    with pytest.raises(kvf.InvalidArgument, match=r"parent = 340282366920938463463374607431768211456.*2\*\*128"):
        kvf.key_chain(2**128, [1])
    assert kvf.key_chain(2**128 - 1, [1]) != kvf.key_chain(2**64 - 1, [1])
    with pytest.raises(kvf.InvalidArgument, match="salt"):
        kvf.key_chain(0, [1], salt=-5)
    with pytest.raises(kvf.InvalidArgument, match="NUL"):
        kvf.key_salt("a\0b")


# ---- cache -------------------------------------------------------------------------------


def test_keys_equal_in_one_half_are_different_blocks(tmp_path, geometry, rng):
    """Keys that share their low (or high) 64 bits name different blocks
    in every tier the cache keeps, through put, lookup, get and remove;
    keys travel as Python ints, lists, (n, 2) uint64 arrays of (hi, lo)."""
    lo = 0x5A5A
    keys = [lo, 1 << 64 | lo, 0xFFFF << 64 | lo, 1 << 64 | (lo + 1)]
    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry)
        with kvf.Cache(e, host_blocks=1, disk_blocks=32, event_queue=64) as cache:
            data = {i: fill(pools, i, rng) for i in range(len(keys))}
            cache.put(keys, list(range(len(keys)))).wait(check=True)
            assert cache.lookup(keys)[0] == len(keys)
            assert cache.lookup([2 << 64 | lo])[0] == 0
            dst = [10 + i for i in range(len(keys))]
            halves = np.array([[k >> 64, k & (2**64 - 1)] for k in keys], dtype=np.uint64)
            cache.get(halves, dst).wait(check=True)
            for i in range(len(keys)):
                assert_slot(pools, dst[i], data[i])
            assert cache.remove([keys[1]]) == 1
            assert cache.lookup([keys[0]])[0] == 1 and cache.lookup(keys[2:])[0] == 2
            with pytest.raises(kvf.InvalidArgument, match="key 0"):
                cache.lookup([2**128])
            with pytest.raises(kvf.InvalidArgument, match="key 1"):
                cache.lookup([1, -1])
            events = cache.events()
            assert {ev.key for ev in events} >= set(keys)



def test_round_trip_host_and_disk(tmp_path, geometry, rng):
    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry)
        with kvf.Cache(e, host_blocks=4, disk_blocks=32, event_queue=1024) as cache:
            tokens = rng.integers(0, 32000, 8 * TPB)
            keys = kvf.key_chain_all(tokens, TPB)
            data = {}
            for i in range(8):  # the engine frees blocks 0..7 into the cache
                data[i] = fill(pools, i, rng)
            t = cache.put(keys, list(range(8)), priority=60)
            assert isinstance(t, kvf.Ticket) and t.count == 8
            assert t.wait(check=True) == [kvf.Status.OK] * 8
            for i in range(8):
                poison(pools, i)
            hits, tiers = cache.lookup(keys)
            assert hits == 8
            # 4 fit the host tier; the 4 least recent moved down to disk
            assert tiers.count(kvf.Tier.HOST) == 4 and tiers.count(kvf.Tier.DISK) == 4
            dst = list(range(8, 16))
            halves = np.array([[k >> 64, k & (2**64 - 1)] for k in keys], dtype=np.uint64)
            st = cache.get(halves, np.array(dst)).wait(check=True)
            assert st == [kvf.Status.OK] * 8
            for i in range(8):
                assert_slot(pools, dst[i], data[i])
            s = cache.stats()
            assert s.blocks == per_tier(4, 4) and s.capacity == per_tier(4, 32)
            assert s.hits == per_tier(4, 4) and s.lookups == 1 and s.lookup_blocks == 8
            assert s.puts == 8 and s.gets == 8 and s.evictions["host"] == 4
            bb = sum(p.block_bytes for p in pools)
            assert s.bytes_in["host"] == 8 * bb and s.bytes_in["disk"] == 4 * bb
            assert s.bytes_out == per_tier(4 * bb, 4 * bb)
            assert s.hit_rate == 1.0 and s.failures == 0
            assert s.latency_count > 0 and sum(s.latency_us) == s.latency_count
            assert s.as_dict()["hits"]["disk"] == 4
            text = cache.prometheus()
            assert "kvferry_cache_" in text and text.endswith("\n")


def test_lookup_prefix_and_misses(tmp_path, geometry, rng):
    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry)
        with kvf.Cache(e, host_blocks=8) as cache:
            keys = kvf.key_chain_all(rng.integers(0, 32000, 4 * TPB), TPB)
            for i in range(2):
                fill(pools, i, rng)
            cache.put(keys[:2], [0, 1]).wait(check=True)
            assert cache.lookup(keys) == (2, [kvf.Tier.HOST] * 2)
            assert cache.lookup(keys[2:]) == (0, [])
            assert cache.lookup([]) == (0, [])
            s = cache.stats()
            assert s.misses == 2 and s.lookups == 3
            # a duplicate put refreshes, does not copy again
            cache.put(keys[:1], [0]).wait(check=True)
            assert cache.stats().put_duplicates == 1


def test_events_in_order(tmp_path, geometry, rng):
    seen = []
    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry)
        with kvf.Cache(e, host_blocks=2, disk_blocks=2, event_queue=64, on_event=seen.append) as cache:
            keys = [0x1000 + i for i in range(5)]
            for i, k in enumerate(keys):
                fill(pools, i, rng)
                cache.put([k], [i], priority=10 * i).wait(check=True)
            assert cache.remove([keys[4], 0xDEAD]) == 1
            evs = cache.events()
            assert evs == seen  # the queue and the callback see the same, in order
            assert [ev.seq for ev in evs] == list(range(1, len(evs) + 1))
            kinds = [(ev.kind, ev.key) for ev in evs]
            for k in keys:
                assert (kvf.EventKind.STORED, k) in kinds
            # 5 puts into 2 + 2 blocks: moves down and one drop, then the removal
            ups = [ev for ev in evs if ev.kind == kvf.EventKind.UPDATED]
            assert ups and all(ev.from_tier == kvf.Tier.HOST and ev.tier == kvf.Tier.DISK for ev in ups)
            rem = [ev for ev in evs if ev.kind == kvf.EventKind.REMOVED]
            assert rem[-1].key == keys[4]
            assert any(ev.key == keys[0] for ev in rem)  # the oldest, lowest priority, dropped from disk
            assert all(isinstance(ev, kvf.CacheEvent) for ev in evs)
            stored = {ev.key: ev.priority for ev in evs if ev.kind == kvf.EventKind.STORED}
            assert stored[keys[3]] == 30
            assert cache.events() == []  # drained
            assert cache.stats().dropped >= 1


def test_pin_keeps_blocks(tmp_path, geometry, rng):
    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry)
        with kvf.Cache(e, host_blocks=2) as cache:
            fill(pools, 0, rng)
            fill(pools, 1, rng)
            cache.put([1, 2], [0, 1]).wait(check=True)
            assert cache.pin([1, 99]) == 1
            fill(pools, 2, rng)
            fill(pools, 3, rng)
            cache.put([3, 4], [2, 3]).wait(check=True)  # evicts 2 then 3, never the pinned 1
            assert cache.lookup([1])[0] == 1
            cache.unpin([1])
            with pytest.raises(kvf.InvalidState) as ei:
                cache.unpin([1])
            assert "0x1" in ei.value.message or "1" in ei.value.message


def test_get_failures_and_errors(tmp_path, geometry, rng):
    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry)
        with pytest.raises(kvf.InvalidArgument):
            kvf.Cache(e)  # every tier off
        with pytest.raises(kvf.OutOfRange):
            kvf.Cache(e, host_blocks=9)  # 8 secondary slots
        with pytest.raises(kvf.InvalidArgument):
            kvf.Cache(e, host_blocks=-1)
        cache = kvf.Cache(e, host_blocks=4)
        fill(pools, 0, rng)
        cache.put([5], [0]).wait(check=True)
        with pytest.raises(kvf.NotFound) as ei:
            cache.get([5, 6], [1, 2])  # nothing queued: 6 is not cached
        assert ei.value.status == kvf.Status.ERR_NOT_FOUND
        with pytest.raises(kvf.InvalidArgument, match="2 keys but 1 slots"):
            cache.get([5, 6], [1])
        with pytest.raises(kvf.InvalidArgument, match="priority"):
            cache.put([5], [0], priority=101)
        with pytest.raises(kvf.InvalidArgument, match="block key"):
            cache.lookup([-1])
        with pytest.raises(kvf.UnknownTicket):
            cache.wait(987654)
        # a ticket polled to completion
        t = cache.get([5], [3])
        while (st := t.poll()) is None:
            pass
        assert st == [kvf.Status.OK] and t.ok
        assert_slot(pools, 3, [p.slot_view(0).copy() for p in pools])
        cache.put([7], [1], detach=True)
        e.sync_stream(None)
        assert cache.lookup([7])[0] == 1
        cache.close()
        cache.close()  # idempotent
        with pytest.raises(kvf.InvalidState, match="closed"):
            cache.lookup([5])


def test_disk_only_restart(tmp_path, geometry, rng):
    keys = [0x51 + i for i in range(6)]
    with make_engine(tmp_path, ns="restart") as e:
        pools = add_pools(e, geometry, secondary=None)
        with kvf.Cache(e, disk_blocks=16) as cache:
            data = [fill(pools, i, rng) for i in range(6)]
            cache.put(keys, list(range(6))).wait(check=True)
            assert cache.lookup(keys) == (6, [kvf.Tier.DISK] * 6)
    # a new engine and cache on the same directory and namespace find them
    with make_engine(tmp_path, ns="restart") as e:
        pools = add_pools(e, geometry, secondary=None)
        with kvf.Cache(e, disk_blocks=16) as cache:
            assert cache.stats().blocks["disk"] == 6
            assert cache.lookup(keys)[0] == 6
            for i in range(6):
                poison(pools, 8 + i)
            cache.get(keys, list(range(8, 14))).wait(check=True)
            for i in range(6):
                assert_slot(pools, 8 + i, data[i])
    # the engine closes a cache still open: the cache never outlives it
    e = make_engine(tmp_path, ns="restart")
    add_pools(e, geometry, secondary=None)
    cache = kvf.Cache(e, disk_blocks=3)  # more on disk than room: the oldest removed
    assert cache.stats().blocks["disk"] == 3
    e.close()
    assert cache.closed


def test_engine_demote_promote_file_remove(engine, geometry, rng):
    pools = add_pools(engine, geometry, primary=4, secondary=4)
    data = fill(pools, 0, rng)
    engine.offload(kvf.Tier.HOST, (0, 1)).wait(check=True)
    engine.demote([(1, 0xAB)]).wait(check=True)  # secondary 1 -> file 0xab
    for p in pools:
        p.slot_view(2, kvf.Level.SECONDARY)[:] = POISON
    engine.promote((0xAB, 2)).wait(check=True)  # file -> secondary 2
    for p, d in zip(pools, data):
        np.testing.assert_array_equal(p.slot_view(2, kvf.Level.SECONDARY), d)
    t = engine.file_remove([0xAB, 0xCD])  # a key without a file is fine
    assert t.wait(check=True) == [kvf.Status.OK] * 2
    st = engine.onboard(kvf.Tier.DISK, (0xAB, 3)).wait()
    assert st == [kvf.Status.ERR_NOT_FOUND]
    with pytest.raises(kvf.InvalidArgument):
        engine.file_remove([-3])
    assert engine.file_remove(np.array([0xAB], dtype=np.uint64), detach=True) is None
    # one remove for every tier that holds keys; tiers a call cannot take are refused, named
    engine.offload(kvf.Tier.DISK, (0, 0xEF)).wait(check=True)
    assert engine.remove("disk", 0xEF).wait(check=True) == [kvf.Status.OK]
    with pytest.raises(kvf.InvalidArgument, match="tier host"):
        engine.remove(kvf.Tier.HOST, [1])
    with pytest.raises(kvf.InvalidArgument, match="tier gpu"):
        engine.offload(kvf.Tier.GPU, (0, 1))
    with pytest.raises(kvf.InvalidArgument, match="demote to remote: the engine has no remote tier"):
        engine.demote([(1, 0xAB)], to=kvf.Tier.REMOTE)


def test_callback_errors_and_forms(tmp_path, geometry, rng, capfd):
    def boom(ev):
        raise RuntimeError("listener failed")

    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry)
        with kvf.Cache(e, host_blocks=4, on_event=boom) as cache:  # no queue: events() is empty
            fill(pools, 0, rng)
            assert cache.put(np.array([[9]], dtype=np.int64), np.array([0], dtype=np.uint8)).wait() == [
                kvf.Status.OK]
            assert cache.events() == []
            assert cache.lookup(np.array([9], dtype=np.uint64)) == (1, [kvf.Tier.HOST])
            assert "host 4" in repr(cache)
        assert "closed" in repr(cache)
    assert "listener failed" in capfd.readouterr().err  # printed, never unwound into C
    with pytest.raises(TypeError):
        kvf.Cache(e, host_blocks=1, on_event=42)
    # 2-D token arrays are read in C order
    toks = np.arange(4 * TPB, dtype=np.int32).reshape(4, TPB)
    assert kvf.key_chain_all(toks, TPB) == kvf.key_chain_all(list(range(4 * TPB)), TPB)
    assert kvf.tier_name(kvf.Tier.DISK) == "disk"


def test_remote_tier_shared(tmp_path, geometry, rng, redis_url):
    keys = kvf.key_chain_all(rng.integers(0, 32000, 4 * TPB), TPB)
    with kvf.Engine(backend=kvf.Backend.HOST, remote_url=redis_url, file_namespace="shared") as e:
        pools = add_pools(e, geometry)
        with kvf.Cache(e, host_blocks=8, remote=kvf.CacheRemote.WRITE_THROUGH) as cache:
            data = [fill(pools, i, rng) for i in range(4)]
            cache.put(keys, [0, 1, 2, 3]).wait(check=True)
            assert cache.stats().bytes_in["remote"] > 0
    # another engine (another machine) with the same namespace and layout
    with kvf.Engine(backend=kvf.Backend.HOST, remote_url=redis_url, file_namespace="shared") as e:
        pools = add_pools(e, geometry)
        with kvf.Cache(e, host_blocks=8, remote=kvf.CacheRemote.READ) as cache:
            assert cache.lookup(keys) == (4, [kvf.Tier.REMOTE] * 4)
            for i in range(4):
                poison(pools, 8 + i)
            cache.get(keys, [8, 9, 10, 11]).wait(check=True)
            for i in range(4):
                assert_slot(pools, 8 + i, data[i])
            assert cache.stats().hits["remote"] == 4
        e.remote_remove(keys[:1]).wait(check=True)
        with kvf.Cache(e, host_blocks=8, remote=kvf.CacheRemote.READ) as cache:
            assert cache.lookup(keys)[0] == 0
            assert cache.lookup(keys[1:])[0] == 3


def test_gpu_tier_request_life(tmp_path, geometry, rng):
    """The cache owns the GPU blocks: acquire the prefix, alloc + prefill +
    commit the rest, unpin at the end; evicted GPU blocks fall to host."""
    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry, primary=8, secondary=8)
        with kvf.Cache(e, gpu_blocks=4, host_blocks=8, event_queue=256) as cache:
            keys = kvf.key_chain_all(rng.integers(0, 32000, 6 * TPB), TPB)
            hits, slots, t = cache.acquire(keys[:3])
            assert (hits, slots) == (0, []) and t.wait() == []
            got, t = cache.alloc(3)
            assert len(set(got)) == 3 and all(0 <= s < 4 for s in got)
            assert t.wait(check=True) == []
            data = {}
            for k, s in zip(keys[:3], got):
                data[k] = fill(pools, s, rng)
            assert cache.commit(keys[:3], got, priority=70) == [kvf.Status.OK] * 3
            cache.unpin(keys[:3])
            assert cache.lookup(keys[:3]) == (3, [kvf.Tier.GPU] * 3)
            # a second request needs 4 slots: GPU victims move down to host
            other, t = cache.alloc(4)
            t.wait(check=True)
            cache.free(other)
            hits, tiers = cache.lookup(keys[:3])
            assert hits == 3 and kvf.Tier.HOST in tiers
            # acquire brings them back up into GPU slots, byte-exact
            hits, slots, t = cache.acquire(keys)
            assert hits == 3
            assert t.wait(check=True) == [kvf.Status.OK] * 3
            for k, s in zip(keys[:3], slots):
                assert_slot(pools, s, data[k])
            cache.unpin(keys[:3])
            assert cache.stats().blocks["gpu"] == 3
            assert any(ev.kind == kvf.EventKind.UPDATED and ev.tier == kvf.Tier.GPU for ev in cache.events())
            with pytest.raises(kvf.InvalidArgument):
                cache.alloc(0)
        with pytest.raises(kvf.KvferryError):
            with kvf.Cache(e, host_blocks=8) as plain:
                plain.alloc(1)  # no GPU tier


# (found by kvferry replay --gpu-tier --clients 3; fixed by the cache's fence)
def test_gpu_tier_acquire_while_copy_up_in_flight(tmp_path, rng):
    g = kvf.Geometry(8, 2, 8, 64, 128, "fp16")  # 2 MiB blocks: the copy up takes a while
    with make_engine(tmp_path) as e:
        # room in the host tier for the blocks the acquire evicts from the GPU
        # tier (a slot a block moves up from is reused only after its copy)
        pool = e.add_pool(g, primary=8, secondary=16)
        with kvf.Cache(e, gpu_blocks=8, host_blocks=16) as cache:
            keys, data = [0xA0 + i for i in range(8)], {}
            slots, t = cache.alloc(8)
            t.wait(check=True)
            for k, s in zip(keys, slots):
                data[k] = random_bytes(rng, pool.block_bytes)
                pool.slot_view(s)[:] = data[k]
            cache.commit(keys, slots)
            cache.unpin(keys)
            slots, t = cache.alloc(8)  # pushes the 8 down to the host tier
            t.wait(check=True)
            for s in slots:
                pool.slot_view(s)[:] = POISON
            cache.commit([0xB0 + i for i in range(8)], slots)
            cache.unpin([0xB0 + i for i in range(8)])
            h1, s1, t1 = cache.acquire(keys)  # copies them up: not waited for
            h2, s2, t2 = cache.acquire(keys)  # the same blocks, for another request
            assert h2 == 8 and t2.wait(check=True) == [kvf.Status.OK] * 8
            wrong = [hex(k) for k, s in zip(keys, s2) if not np.array_equal(pool.slot_view(s), data[k])]
            t1.wait()
            cache.unpin(keys)
            cache.unpin(keys)
            assert wrong == []  # the second ticket must cover the copy it depends on


def test_sizes_in_bytes(tmp_path, geometry, monkeypatch):
    assert kvf.size_parse("64GB") == 64 * 10**9
    assert kvf.size_parse("64gib") == 64 << 30
    assert kvf.size_parse("1.5T") == 1_500_000_000_000
    assert kvf.size_parse(4096) == 4096
    with pytest.raises(kvf.InvalidArgument, match="lots"):
        kvf.size_parse("lots")
    with pytest.raises(kvf.OutOfRange):
        kvf.size_parse("19000PB")
    with make_engine(tmp_path) as e:
        add_pools(e, geometry)
        block = 2 * geometry.block_bytes  # a slot of both pools
        with kvf.Cache(e, host_bytes=str(3 * block + block // 2), disk_bytes=10 * block) as cache:
            assert cache.stats().capacity["host"] == 3
            assert cache.stats().capacity["disk"] == 10
        with pytest.raises(kvf.InvalidArgument, match="host tier"):
            kvf.Cache(e, host_blocks=2, host_bytes="1MiB")
        with pytest.raises(kvf.OutOfRange, match="disk tier"):
            kvf.Cache(e, disk_bytes=block - 1)
        monkeypatch.setenv("KVF_CACHE_HOST_BYTES", f"{2 * block}B")
        with kvf.Cache(e) as cache:
            assert cache.stats().capacity["host"] == 2


def test_wait_pool_by(tmp_path, geometry, rng):
    """Cache.wait_pool_by: True once a get's pool arrived (and for a get
    already waited for), False where the limit passed first (0 s: the get's
    own submission), the get then waited for as any; bad input refused by
    name, and another cache's ticket refused."""
    with make_engine(tmp_path) as e:
        pools = add_pools(e, geometry, primary=32)
        with kvf.Cache(e, disk_blocks=32) as cache, kvf.Cache(e, host_blocks=4) as other:
            keys = kvf.key_chain_all(rng.integers(0, 32000, 16 * TPB), TPB)
            data = {i: fill(pools, i, rng) for i in range(16)}
            cache.put(keys, list(range(16))).wait(check=True)
            dst = list(range(16, 32))
            for i in dst:
                poison(pools, i)
            t = cache.get(keys, dst)
            # 0 s: the limit is the get's own submission, which 16 block files are hardly read by (False);
            # either answer leaves the get to run on
            assert cache.wait_pool_by(t, 0, 0.0) in (True, False)
            assert cache.wait_pool_by(t, 0, 30.0) and cache.wait_pool_by(t, 1, 30.0)
            assert t.wait(check=True) == [kvf.Status.OK] * 16
            for i in range(16):
                assert_slot(pools, dst[i], data[i])
            assert cache.wait_pool_by(t, 0, 0.0)  # waited for: arrived
            t = cache.get(keys[:1], dst[:1])
            with pytest.raises(kvf.KvferryError, match="within_s"):
                cache.wait_pool_by(t, 0, float("nan"))
            with pytest.raises(kvf.KvferryError, match="pool"):
                cache.wait_pool_by(t, "0", 1.0)
            with pytest.raises(kvf.KvferryError, match="not a ticket of this cache"):
                other.wait_pool_by(t, 0, 1.0)
            t.wait(check=True)
