# SPDX-License-Identifier: Apache-2.0
"""A block directory and a remote store looked at without an engine:
dir_check's verdicts (good, corrupt, torn, mismatch, foreign) on files an
engine wrote and then damaged here, dir_list, dir_namespaces, remote_probe
against a real redis-server, and the errors of each."""

import os
import struct

import numpy as np
import pytest

import kvferry as kvf
from conftest import random_bytes, redis_server

KEYS = [0x2A, 0x2B, 0x2C, 0x2D]


def store(tmp_path, geometry, rng, ns="rank0", keys=KEYS):
    """keys written to <tmp>/kv/<ns> by an engine of two pools, from random slots."""
    d = tmp_path / "kv"
    with kvf.Engine(backend=kvf.Backend.HOST, file_dir=str(d), file_namespace=ns) as e:
        pools = [e.add_pool(geometry, primary=len(keys)) for _ in range(2)]
        for p in pools:
            for s in range(len(keys)):
                p.slot_view(s)[:] = random_bytes(rng, p.block_bytes)
        e.offload(kvf.Tier.DISK, [(s, k) for s, k in enumerate(keys)]).wait(check=True)
    return d


def block_file(d, ns, key):
    return d / ns / f"{key:032x}.kvf"


def test_check_and_list_a_sound_directory(tmp_path, geometry, rng):
    d = store(tmp_path, geometry, rng)
    store(tmp_path, geometry, rng, ns="rank1", keys=KEYS[:1])
    (d / "not a namespace").mkdir()
    assert kvf.dir_namespaces(d) == ["rank0", "rank1"]
    assert kvf.dir_namespaces(str(d)) == kvf.dir_namespaces(os.fsencode(d))
    seen = []
    r = kvf.dir_check(d, "rank0", [geometry, geometry], visit=seen.append)
    assert r.counts == kvf.DirCounts(good=4) and r.problems == []
    assert sorted(e.key for e in seen) == KEYS
    payload = 2 * geometry.block_bytes
    for e in seen:
        assert (e.kind, e.status, e.tokens, e.pools, e.payload_bytes) == (
            kvf.DirEntryKind.GOOD, kvf.Status.OK, geometry.tokens_per_block, 2, payload)
    blocks = kvf.dir_list(d, "rank0", [geometry, geometry])
    assert sorted(b.key for b in blocks) == KEYS
    assert all(b.pools == 2 and b.payload_bytes == payload and b.mtime_ns > 0 for b in blocks)
    assert [b.key for b in kvf.dir_list(d, "rank1")] == KEYS[:1]


def test_check_names_each_kind_of_damage(tmp_path, geometry, rng):
    d = store(tmp_path, geometry, rng)
    bad = block_file(d, "rank0", KEYS[0])
    raw = bytearray(bad.read_bytes())
    raw[64 + 1000] ^= 0x40  # one payload bit
    bad.write_bytes(bytes(raw))
    fifo = block_file(d, "rank0", 0x77)
    os.mkfifo(fifo)
    (d / "rank0" / f".{0x78:032x}.{os.getpid()}.1.tmp").write_bytes(b"half a block")
    r = kvf.dir_check(d, "rank0", [geometry, geometry])
    assert r.counts == kvf.DirCounts(good=3, corrupt=1, torn=1, foreign=1)
    kinds = {e.key: e for e in r.problems}
    assert set(kinds) == {KEYS[0], 0x77, 0x78}
    c = kinds[KEYS[0]]
    assert c.kind == kvf.DirEntryKind.CORRUPT and c.status == kvf.Status.ERR_CORRUPT
    assert f"{KEYS[0]:032x}.kvf" in c.message
    assert kinds[0x77].kind == kvf.DirEntryKind.FOREIGN
    assert kinds[0x78].kind == kvf.DirEntryKind.TORN
    # headers only: the damaged payload is still listed, the FIFO and the torn write are not
    assert sorted(b.key for b in kvf.dir_list(d, "rank0", [geometry, geometry])) == KEYS
    # a layout the blocks were not written with: every block a mismatch (the
    # layout is checked before the payload), none listed
    other = kvf.Geometry(layers=2, kv_factor=2, kv_heads=4, tokens_per_block=16, head_size=64,
                         dtype=kvf.Dtype.FP16, order=kvf.Order.HEAD_MAJOR)
    r = kvf.dir_check(d, "rank0", [other, other])
    assert r.counts == kvf.DirCounts(mismatch=4, torn=1, foreign=1)
    assert kvf.dir_list(d, "rank0", other) == []
    assert bad.exists() and fifo.exists()  # looking never removes


def test_bad_arguments_and_a_failing_visit(tmp_path, geometry, rng):
    d = store(tmp_path, geometry, rng)
    with pytest.raises(kvf.NotFound, match="nowhere"):
        kvf.dir_check(tmp_path / "nowhere", "rank0")
    with pytest.raises(kvf.NotFound):
        kvf.dir_namespaces(tmp_path / "nowhere")
    with pytest.raises(kvf.InvalidArgument):
        kvf.dir_list(d, "../rank0")
    with pytest.raises(kvf.InvalidArgument, match="geometries"):
        kvf.dir_check(d, "rank0", geometries=[])
    with pytest.raises(kvf.InvalidArgument, match="not a path"):
        kvf.dir_list(42, "rank0")
    calls = []

    def visit(entry):
        calls.append(entry)
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        kvf.dir_check(d, "rank0", visit=visit)
    assert len(calls) == 1  # the first failure is raised; later entries are not visited


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def _as_version_1(path, key64):
    """Rewrites a current (format 3) block file as format version 1 wrote
    it: the 64-byte header with the 64-bit key and one CRC of the payload
    (no pool table), its 16-digit name."""
    data = path.read_bytes()
    fp, ns, hi, lo, tokens, pools, payload, _table_crc = struct.unpack_from("<QQQQIIQI", data, 16)
    assert hi == 0 and lo == key64
    prefix = (128 + 8 * pools + 127) // 128 * 128
    body = data[prefix:prefix + payload]
    pcrc = _crc32c(body)
    h = b"KVFBLK\r\n" + struct.pack("<IIQQQIIQI", 1, 64, fp, ns, key64, tokens, pools, payload, pcrc)
    h += struct.pack("<I", _crc32c(h))
    path.unlink()
    old = path.parent / f"{key64:016x}.kvf"
    old.write_bytes(h + body)
    return old


def test_version_1_blocks_are_upgraded(tmp_path, geometry, rng):
    """Blocks of format version 1 are reported, never served; dir_upgrade
    rewrites them under {0, key}, byte for byte, and leaves a damaged one."""
    d = tmp_path / "kv"
    keys = [0x51, 0x52]
    with kvf.Engine(backend=kvf.Backend.HOST, file_dir=str(d), file_namespace="up") as e:
        pool = e.add_pool(geometry, primary=4)
        data = [random_bytes(rng, pool.block_bytes) for _ in keys]
        for s, b in enumerate(data):
            pool.slot_view(s)[:] = b
        e.offload(kvf.Tier.DISK, [(s, k) for s, k in enumerate(keys)]).wait(check=True)
    olds = [_as_version_1(block_file(d, "up", k), k) for k in keys]
    damaged = bytearray(olds[1].read_bytes())
    damaged[64 + 10] ^= 0x40
    olds[1].write_bytes(bytes(damaged))
    r = kvf.dir_check(d, "up")
    assert r.counts.old_format == 2 and r.counts.good == 0
    assert all(p.kind == kvf.DirEntryKind.OLD_FORMAT and "format version 1" in p.message for p in r.problems)
    assert kvf.dir_list(d, "up") == []
    up = kvf.dir_upgrade(d, "up")
    assert up.counts.upgraded == 1 and up.counts.corrupt == 1
    assert [p.key for p in up.problems] == [0x52] and up.problems[0].kind == kvf.DirEntryKind.CORRUPT
    assert not olds[0].exists() and olds[1].exists() and block_file(d, "up", 0x51).exists()
    with kvf.Engine(backend=kvf.Backend.HOST, file_dir=str(d), file_namespace="up") as e:
        pool = e.add_pool(geometry, primary=4)
        pool.slot_view(3)[:] = 0xA5
        e.onboard(kvf.Tier.DISK, [(0x51, 3)]).wait(check=True)
        np.testing.assert_array_equal(pool.slot_view(3), data[0])
        assert e.onboard(kvf.Tier.DISK, [(0x52, 2)]).wait() == [kvf.Status.ERR_NOT_FOUND]


def test_remote_probe(tmp_path, monkeypatch):
    with pytest.raises(kvf.InvalidArgument):
        kvf.remote_probe("memcached://127.0.0.1")
    with pytest.raises(kvf.InvalidArgument):
        kvf.remote_probe("redis://127.0.0.1", timeout_ms=-1)
    monkeypatch.delenv("KVF_REMOTE_URL", raising=False)
    with pytest.raises((kvf.NotFound, kvf.Unsupported)):
        kvf.remote_probe()
    # the Redis store's own line: remote_built is every remote store (S3 too)
    if not any(s.name == "redis" and s.built for s in kvf.info().stores):
        with pytest.raises(kvf.Unsupported):
            kvf.remote_probe("redis://127.0.0.1:6379")
        pytest.skip("libkvferry built without hiredis")
    with redis_server(tmp_path) as port:
        got = kvf.remote_probe(f"redis://127.0.0.1:{port}/3", timeout_ms=2000)
        assert f"127.0.0.1:{port}" in got and "db 3" in got
        monkeypatch.setenv("KVF_REMOTE_URL", f"redis://127.0.0.1:{port}")
        assert f"127.0.0.1:{port}" in kvf.remote_probe()
    with redis_server(tmp_path, "--requirepass", "s3cret-word") as port:
        assert "s3cret-word" not in kvf.remote_probe(f"redis://:s3cret-word@127.0.0.1:{port}")
        with pytest.raises(kvf.RemoteFailure) as exc:
            kvf.remote_probe(f"redis://:wrong-word@127.0.0.1:{port}", timeout_ms=2000)
        assert "wrong-word" not in str(exc.value)
    with pytest.raises((kvf.RemoteFailure, kvf.Timeout)):
        kvf.remote_probe(f"redis://127.0.0.1:{port}", timeout_ms=300)  # nobody there now


def test_module_exports():
    for name in ("dir_check", "dir_list", "dir_namespaces", "remote_probe", "DirEntryKind", "DirCounts"):
        assert name in kvf.__all__ and hasattr(kvf, name)
    assert np.array_equal([k.value for k in kvf.DirEntryKind], range(7))
