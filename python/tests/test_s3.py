# SPDX-License-Identifier: Apache-2.0
"""The S3 store from Python: listed by info(), its URL checked at engine
create (no secret in the message), and an engine's remote tier on s3://
against a real SeaweedFS (scripts/seaweedfs.py; skipped, saying why, where
it cannot be installed) shared by a second engine byte for byte."""
import os
import socket
import sys

import numpy as np
import pytest

import kvferry as kvf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))


def s3_built():
    return any(s.name == "s3" and s.built for s in kvf.info().stores)


def test_info_lists_s3():
    s3 = [s for s in kvf.info().stores if s.name == "s3"]
    assert len(s3) == 1 and s3[0].schemes == ("s3://",) and s3[0].remote


@pytest.mark.skipif(not s3_built(), reason="built without libcurl / expat")
def test_bad_url_at_create_without_secret():
    with pytest.raises(kvf.KvferryError) as e:
        kvf.Engine(backend="host", file_namespace="t",
                   remote_url="s3://key:topsecret@kvf/p?style=sideways")
    assert "style" in str(e.value) and "topsecret" not in str(e.value)


@pytest.fixture(scope="module")
def seaweedfs():
    if not s3_built():
        pytest.skip("built without libcurl / expat")
    from seaweedfs import SeaweedFS
    try:
        server = SeaweedFS()
    except Exception as e:  # no pip, no network
        pytest.skip(f"SeaweedFS not installed: {e}")
    with server as s3:
        yield s3


def test_remote_tier_on_s3(seaweedfs):
    g = kvf.Geometry(layers=2, kv_factor=2, kv_heads=2, tokens_per_block=16, head_size=32)
    engines = [kvf.Engine(backend="host", file_namespace="py", remote_url=seaweedfs.url("py"))
               for _ in range(2)]
    for e in engines:
        e.add_pool(g, primary=4)
    rng = np.random.default_rng(7)
    want = [rng.integers(0, 256, g.block_bytes, dtype=np.uint8) for _ in range(4)]
    for i in range(4):
        engines[0].slot_view(0, i).view(np.uint8).reshape(-1)[:] = want[i]
        engines[1].slot_view(0, i).view(np.uint8).reshape(-1)[:] = 0xC3
    engines[0].offload(kvf.Tier.REMOTE, [(i, 0x500 + i) for i in range(4)]).wait(check=True)
    engines[1].onboard(kvf.Tier.REMOTE, [(0x500 + i, 3 - i) for i in range(4)]).wait(check=True)
    for i in range(4):
        assert np.array_equal(engines[1].slot_view(0, 3 - i).view(np.uint8).reshape(-1), want[i])
    assert "bucket listed" in kvf.remote_probe(seaweedfs.url("py"), timeout_ms=3000)
    for e in engines:
        e.close()


def test_cache_remote_tier_on_s3(seaweedfs):
    """One cache writes a prefix through to S3; another, reading the
    bucket, finds it there and gets it byte for byte."""
    g = kvf.Geometry(layers=2, kv_factor=2, kv_heads=2, tokens_per_block=16, head_size=32)
    keys = kvf.key_chain_all(list(range(64)), 16)
    rng = np.random.default_rng(11)
    want = [rng.integers(0, 256, g.block_bytes, dtype=np.uint8) for _ in keys]
    made = []
    for mode in ("write_through", "read"):
        e = kvf.Engine(backend="host", file_namespace="pycache", remote_url=seaweedfs.url("cache"))
        e.add_pool(g, primary=4, secondary=4)
        made.append((e, kvf.Cache(e, host_blocks=4, remote=mode)))
    (e0, c0), (e1, c1) = made
    for i in range(len(keys)):
        e0.slot_view(0, i).view(np.uint8).reshape(-1)[:] = want[i]
        e1.slot_view(0, i).view(np.uint8).reshape(-1)[:] = 0xC3
    c0.put(keys, list(range(len(keys)))).wait(check=True)
    hits, tiers = c1.lookup(keys)
    assert hits == len(keys) and set(tiers) == {kvf.Tier.REMOTE}
    c1.get(keys, list(range(len(keys)))).wait(check=True)
    for i in range(len(keys)):
        assert np.array_equal(e1.slot_view(0, i).view(np.uint8).reshape(-1), want[i])
    for e, c in made:
        c.close()
        e.close()


def test_wrong_keys_named_without_secret(seaweedfs, caplog):
    """Keys the server refuses fail the engine's create (not its first
    move) with the URL named, its secret in no error and no log line."""
    import seaweedfs as sw
    url = seaweedfs.url("wrong").replace(f":{sw.SECRET}@", ":notthesecret42@")
    assert "notthesecret42" in url
    kvf.install_log_handler("debug")
    try:
        with pytest.raises(kvf.InvalidArgument) as err:
            kvf.Engine(backend="host", file_namespace="py", remote_url=url)
    finally:
        kvf.remove_log_handler()
    assert "403" in str(err.value) and "***@kvf/wrong" in str(err.value)
    assert "notthesecret42" not in str(err.value)
    assert not any("notthesecret42" in r.getMessage() for r in caplog.records)


def test_missing_bucket_at_create(seaweedfs, caplog):
    """A bucket the server does not have fails the engine's create, naming
    the URL; a server that does not answer is a warning there (it may be
    back by the first move), and the move then fails, naming the block."""
    url = seaweedfs.url("p").replace(f"@{seaweedfs.bucket}/", "@no-such-bucket-kvf/")
    with pytest.raises(kvf.InvalidArgument) as err:
        kvf.Engine(backend="host", file_namespace="py", remote_url=url)
    assert "no such bucket" in str(err.value) and "no-such-bucket-kvf" in str(err.value)
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = seaweedfs.url("p").replace(seaweedfs.endpoint, f"http://127.0.0.1:{port}")
    import seaweedfs as sw
    kvf.install_log_handler("debug")
    try:
        e = kvf.Engine(backend="host", file_namespace="py", remote_url=down, remote_timeout_ms=500)
    finally:
        kvf.remove_log_handler()
    said = [r.getMessage() for r in caplog.records]
    assert any("not reached at create" in m for m in said), said
    assert not any(sw.SECRET in m for m in said)
    e.add_pool(kvf.Geometry(layers=1, kv_factor=2, kv_heads=1, tokens_per_block=16, head_size=32), primary=2)
    with pytest.raises(kvf.KvferryError) as err:
        e.offload(kvf.Tier.REMOTE, [(0, 1)]).wait(check=True)
    e.close()
    assert "127.0.0.1:%d" % port in str(err.value)
