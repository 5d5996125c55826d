# SPDX-License-Identifier: Apache-2.0
"""Contract tests of kvferry.integrations.sglang against the installed
SGLang: the backend is made by SGLang's StorageBackendFactory ("dynamic",
by module path) over SGLang's own host pools (MHATokenToKVPoolHost and
MLATokenToKVPoolHost on CPU in each of their layouts, MambaPoolHost and a
second MHA pool as the SWA pool for the v2 interface), keys are SGLang's
page hashes (get_storage_hash_str),
and the calls come as HiCacheController makes them: register_mem_pool_host,
batch_exists, batch_get_v1 into freshly allocated host pages (stopping at
the first failure), batch_set_v1 of backed-up pages. Pages are compared
byte for byte through the pool's own get_data_page, into destinations
poisoned through set_from_flat_data_page. Disk blocks are real kvferry
block files; the remote tier is kvferry's in-process mem:// store.

Skipped unless sglang imports (see docs/integrations/sglang.md)."""

import re
from collections import Counter
from pathlib import Path

import pytest

sglang = pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig, PoolHitPolicy,  # noqa: E402
                                                  PoolName, PoolTransfer)
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402
from sglang_pools import (MHA_LAYOUTS, MLA_LAYOUTS, PS, dsa_pools, fill_pages, host_pool, mamba_pool,  # noqa: E402
                          mla_pool, page_bytes, page_hashes, poisoned_pages, read_page, set_ranks)

import kvferry  # noqa: E402
from kvferry.integrations import sglang as kvf_sglang  # noqa: E402
from kvferry.integrations._serving import block_file, string_key  # noqa: E402

def storage_config(model="org/tiny-model", tp_rank=0, tp_size=1, mla=False, metrics=False, layout="page_first",
                   **more):
    cfg = dict(backend_name="kvferry", module_path="kvferry.integrations.sglang", class_name="KvferryStorage",
               interface_v1=1)
    cfg.update(more.pop("extra", {}))
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
                                is_page_first_layout=layout == "page_first", model_name=model, extra_config=cfg,
                                **more)


def backend(tmp_path, pool, model="org/tiny-model", tp_rank=0, mla=False, metrics=False, **extra):
    sc = storage_config(model, tp_rank, mla=mla, metrics=metrics, layout=pool.layout, extra=extra)
    b = StorageBackendFactory.create_backend("dynamic", sc, pool)
    b.register_mem_pool_host(pool)  # as HiCacheController.attach_storage_backend does
    return b


def disk(tmp_path):
    return {"file_dir": str(tmp_path / "kv"), "disk_blocks": 1024, "namespace": "sgl-test"}


def stored_file(files, key) -> Path:
    """The block file of SGLang page hash `key` in namespace directory files."""
    return Path(block_file(str(files.parent), files.name, string_key(key)))


def load(b, keys, pool):
    """As HiCacheController._page_get_zero_copy: pages up to the first failure."""
    idx = poisoned_pages(pool, len(keys))
    ok = b.batch_get_v1(keys, idx)
    got = ok.index(False) if False in ok else len(ok)
    return ok, got, idx


@pytest.mark.parametrize("kind,layout", [("mha", lay) for lay in MHA_LAYOUTS] + [("mla", lay) for lay in MLA_LAYOUTS])
def test_set_exists_get_roundtrip(tmp_path, kind, layout):
    pool = host_pool(layout) if kind == "mha" else mla_pool(layout)
    b = backend(tmp_path, pool, mla=kind == "mla", host_blocks=2, **disk(tmp_path))
    try:
        assert isinstance(b, HiCacheStorage) and isinstance(b, kvf_sglang.KvferryStorage)
        keys = page_hashes(1, 6)
        idx, refs = fill_pages(pool, 6, 2)
        assert b.batch_set_v1(keys, idx) == [True] * 6
        assert b.batch_exists(keys) == 6 and b.exists(keys[5])
        ok, got, dst = load(b, keys, pool)
        assert got == 6
        for i in range(6):
            assert torch.equal(page_bytes(pool, dst, i), refs[i]), f"page {i}"
        s = b.cache.stats()
        assert s.blocks["host"] == 2 and s.blocks["disk"] == 4 and s.failures == 0
    finally:
        b.close()


def test_miss_and_partial_hit(tmp_path):
    pool = host_pool("page_first")
    b = backend(tmp_path, pool, **disk(tmp_path))
    try:
        keys = page_hashes(3, 6)
        assert b.batch_exists(keys) == 0
        ok, got, _ = load(b, keys, pool)
        assert ok == [False] * 6
        idx, refs = fill_pages(pool, 4, 4)
        assert all(b.batch_set_v1(keys[:4], idx))
        assert b.batch_exists(keys) == 4
        ok, got, dst = load(b, keys, pool)
        assert ok == [True] * 4 + [False] * 2
        for i in range(4):
            assert torch.equal(page_bytes(pool, dst, i), refs[i])
        m = b.get_stats()  # SGLang's metrics off: no per-call figures kept, kvferry's tiers counted
        assert m.backup_pgs == m.prefetch_pgs == m.prefetch_bandwidth == [] and m.loaded_pages_by_tier == {"disk": 4}
    finally:
        b.close()


@pytest.mark.parametrize("damage", ["corrupt", "remove", "foreign"])
def test_damaged_page_fails_never_served(tmp_path, damage):
    pool = host_pool("layer_first")
    b = backend(tmp_path, pool, **disk(tmp_path))
    try:
        keys = page_hashes(5, 4)
        idx, refs = fill_pages(pool, 4, 6)
        assert all(b.batch_set_v1(keys, idx))
        files = tmp_path / "kv" / b._namespace
        path = stored_file(files, keys[1])
        assert path.exists()
        if damage == "corrupt":
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0x01
            path.write_bytes(bytes(raw))
        elif damage == "remove":
            path.unlink()
        else:  # a valid block of another key in its place
            path.write_bytes(stored_file(files, keys[0]).read_bytes())
        b.get_stats()  # drained: what follows is this load's
        ok, got, dst = load(b, keys, pool)
        assert ok[1] is False and got == 1
        assert torch.equal(page_bytes(pool, dst, 0), refs[0])
        # HiCache takes page 0: the one hit; the lookup's other 3 failed (page 1)
        # or came after a failed one, and are no hits
        m = b.get_stats()
        assert m.loaded_pages_by_tier == {"disk": 1} and m.failed_pages_by_tier == {"disk": 3}
        assert m.pool_failed_pages_by_tier == {"kv": {"disk": 3}}
        assert b.batch_exists(keys) == 1  # the damaged page left the cache
        assert b.cache.stats().failures >= 1
        # backed up again, it is served again
        assert all(b.batch_set_v1(keys, idx))
        ok, got, dst = load(b, keys, pool)
        assert got == 4 and all(torch.equal(page_bytes(pool, dst, i), refs[i]) for i in range(4))
        m = b.get_stats()
        assert m.loaded_pages_by_tier == {"disk": 4} and m.failed_pages_by_tier == {}
    finally:
        b.close()


def test_restart_and_namespaces(tmp_path):
    pool = host_pool("page_first_direct")
    keys = page_hashes(7, 3)
    idx, refs = fill_pages(pool, 3, 8)
    b = backend(tmp_path, pool, file_dir=str(tmp_path / "kv"), disk_blocks=64)
    assert all(b.batch_set_v1(keys, idx))
    b.close()
    b = backend(tmp_path, pool, file_dir=str(tmp_path / "kv"), disk_blocks=64)  # a restarted server
    try:
        ok, got, dst = load(b, keys, pool)
        assert got == 3 and all(torch.equal(page_bytes(pool, dst, i), refs[i]) for i in range(3))
    finally:
        b.close()
    other = backend(tmp_path, pool, model="org/other-model", file_dir=str(tmp_path / "kv"), disk_blocks=64)
    try:  # another model's namespace: same page hashes, nothing shared
        assert other.batch_exists(keys) == 0
    finally:
        other.close()


def test_remote_tier_shared_between_instances(tmp_path):
    pa, pb = host_pool("page_first"), host_pool("page_first")
    a = backend(tmp_path, pa, remote_url="mem://sgl-share", remote="write_through", host_blocks=4,
                namespace="shared")
    b = backend(tmp_path, pb, remote_url="mem://sgl-share", remote="read", host_blocks=4, namespace="shared")
    try:
        keys = page_hashes(9, 5)
        idx, refs = fill_pages(pa, 5, 10)
        assert all(a.batch_set_v1(keys, idx))
        assert b.batch_exists(keys) == 5  # found in the store a wrote
        ok, got, dst = load(b, keys, pb)
        assert got == 5 and all(torch.equal(page_bytes(pb, dst, i), refs[i]) for i in range(5))
    finally:
        a.close()
        b.close()


def test_bad_input_is_refused_by_name(tmp_path):
    pool = host_pool("page_first")
    with pytest.raises(kvferry.InvalidArgument, match="interface_v1"):
        backend(tmp_path, pool, interface_v1=0, **disk(tmp_path))
    with pytest.raises(kvferry.InvalidArgument, match="disk_blok"):
        backend(tmp_path, pool, disk_blok=3)
    b = backend(tmp_path, pool, **disk(tmp_path))
    try:
        keys = page_hashes(11, 2)
        idx, _ = fill_pages(pool, 2, 12)
        with pytest.raises(kvferry.InvalidArgument, match="whole page"):
            b.batch_set_v1(keys, idx + 1)
        with pytest.raises(kvferry.InvalidArgument, match="2 keys but 16 host indices"):
            b.batch_get_v1(keys, idx[:PS])
        with pytest.raises(NotImplementedError, match="interface_v1"):
            b.batch_get(keys)
        assert b.batch_exists([]) == 0 and b.batch_get_v1([], idx[:0]) == []
    finally:
        b.close()


@pytest.mark.parametrize("extra,match", [({"remote": "sideways"}, "remote = 'sideways'"),
                                         ({"host_bytes": "lots"}, "host_bytes = 'lots'"),
                                         ({"host_blocks": "8"}, "host_blocks = '8' is not a count"),
                                         ({"disk_blocks": -1}, "disk_blocks = -1 is not a count"),
                                         ({"priority": 101}, "priority = 101"),
                                         ({"namespace": ""}, "namespace = ''"),
                                         ({"disk_blocks": 4}, "disk_blocks/disk_bytes without file_dir")])
def test_bad_settings_fail_the_start_naming_the_key(tmp_path, extra, match):
    """Store settings that would fail later, unclearly, or fall back
    silently (an empty namespace would be the model's) fail the backend's
    start, the message naming the key."""
    with pytest.raises(kvferry.InvalidArgument, match=rf"KvferryStorage: {re.escape(match)}"):
        backend(tmp_path, host_pool("page_first"), **{"host_blocks": 4, **extra})


def test_a_host_pool_kvferry_cannot_cut_is_refused_by_name():
    """A host pool whose tokens are not whole pages, or whose buffer has no
    dimension of its tokens or pages: refused naming the pool."""
    def fake(buf, size=PS * 3 + 1):
        return type("P", (), {"layout": "page_first", "page_size": PS, "size": size, "kv_buffer": buf})()

    with pytest.raises(kvferry.InvalidArgument, match=rf"a pool: {PS * 3 + 1} tokens are not whole pages of {PS}"):
        kvf_sglang.host_pool_pools(fake(torch.zeros(2, PS * 3 + 1, 4)), "a pool")
    with pytest.raises(kvferry.InvalidArgument, match=r"a pool: buffer 0 of shape \(2, 5, 4\) has no dimension of"):
        kvf_sglang.host_pool_pools(fake(torch.zeros(2, 5, 4)), "a pool")


def mla_backend(tmp_path, pool, tp_rank, tp_size=2, extra=None, **more):
    sc = storage_config("m", tp_rank, tp_size, mla=True, extra=extra if extra is not None else disk(tmp_path), **more)
    b = StorageBackendFactory.create_backend("dynamic", sc, pool)
    b.register_mem_pool_host(pool)
    return b


@pytest.mark.parametrize("layout", ("page_first", "layer_first"))
def test_mla_one_writer_every_rank_hits(tmp_path, layout):
    """MLA ranks hold equal pages, and SGLang backs them up on its storage
    writer rank only: rank 1 was started before rank 0 stored anything and
    stores nothing itself, yet answers batch_exists from the files rank 0
    wrote and loads them byte for byte; HiCache's minimum over ranks is the
    real hit."""
    pools = [mla_pool(layout), mla_pool(layout)]
    ranks = [mla_backend(tmp_path, pools[r], r) for r in range(2)]
    try:
        assert [b.storage_config.is_storage_writer for b in ranks] == [True, False]
        assert ranks[0]._namespace == ranks[1]._namespace
        keys = page_hashes(13, 4)
        assert [b.batch_exists(keys) for b in ranks] == [0, 0]
        idx1, _ = fill_pages(pools[1], 4, 14)
        assert ranks[1].batch_set_v1(keys, idx1) == [False] * 4  # a reader never writes
        assert [b.batch_exists(keys) for b in ranks] == [0, 0]
        idx, refs = fill_pages(pools[0], 4, 14)
        assert ranks[0].batch_set_v1(keys, idx) == [True] * 4
        assert [b.batch_exists(keys) for b in ranks] == [4, 4]
        for r, b in enumerate(ranks):
            ok, got, dst = load(b, keys, pools[r])
            assert got == 4 and all(torch.equal(page_bytes(pools[r], dst, i), refs[i]) for i in range(4)), r
        assert ranks[1].get_stats().loaded_pages_by_tier == {"disk": 4}
        # the writer's file of page 2 goes (evicted, removed): the reader's hit stops there
        files = tmp_path / "kv" / ranks[0]._namespace
        stored_file(files, keys[2]).unlink()
        assert ranks[1].batch_exists(keys) == 2
        # a damaged file is a failed page on the reader, never its bytes
        path = stored_file(files, keys[1])
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        path.write_bytes(bytes(raw))
        ok, got, dst = load(ranks[1], keys, pools[1])
        assert ok == [True, False, False, False]
        assert torch.equal(page_bytes(pools[1], dst, 0), refs[0])
    finally:
        for b in ranks:
            b.close()


def test_mla_reader_through_the_remote_store(tmp_path):
    """Without a shared directory the ranks share the remote store: the
    writer writes through, the readers' caches read it."""
    pools = [mla_pool("page_first"), mla_pool("page_first")]
    ranks = [mla_backend(tmp_path, pools[r], r, extra=dict(remote_url="mem://sgl-mla", remote="write_through",
                                                           host_blocks=2, namespace="mla-remote"))
             for r in range(2)]
    try:
        keys = page_hashes(19, 3)
        idx, refs = fill_pages(pools[0], 3, 20)
        assert ranks[0].batch_set_v1(keys, idx) == [True] * 3
        assert [b.batch_exists(keys) for b in ranks] == [3, 3]
        ok, got, dst = load(ranks[1], keys, pools[1])
        assert got == 3 and all(torch.equal(page_bytes(pools[1], dst, i), refs[i]) for i in range(3))
        assert ranks[1].get_stats().loaded_pages_by_tier == {"remote": 3}
    finally:
        for b in ranks:
            b.close()


def test_mla_reader_needs_a_shared_store(tmp_path):
    with pytest.raises(kvferry.InvalidArgument, match="file_dir or remote_url"):
        mla_backend(tmp_path, mla_pool("page_first"), 1, extra=dict(host_blocks=4))


def test_dcp_ranks_never_read_each_other(tmp_path):
    """Decode-context ranks hold different shards of a page: one rank's
    store is never another's hit, on one directory."""
    pools = [mla_pool("page_first"), mla_pool("page_first")]
    ranks = [mla_backend(tmp_path, pools[1], 1, dcp_size=2, dcp_rank=1, logical_page_size=2 * PS)]
    try:
        keys = page_hashes(15, 3)
        idx, _ = fill_pages(pools[1], 3, 16)
        assert all(ranks[0].batch_set_v1(keys, idx))
        # rank 0 starts on the directory rank 1 filled (as after a restart)
        ranks.append(mla_backend(tmp_path, pools[0], 0, dcp_size=2, dcp_rank=0, logical_page_size=2 * PS))
        assert "dcp1of2" in ranks[0]._namespace and "dcp0of2" in ranks[1]._namespace
        assert ranks[0].batch_exists(keys) == 3 and ranks[1].batch_exists(keys) == 0
    finally:
        for b in ranks:
            b.close()


def test_tenants_never_share_a_page(tmp_path):
    """SGLang's storage hash chain starts from the request's cache_salt and
    extra_key (LoRA): the same tokens of another tenant are another key."""
    from sglang.srt.mem_cache.radix_cache import RadixKey

    pool = host_pool("page_first")
    b = backend(tmp_path, pool, **disk(tmp_path))
    try:
        g = torch.Generator().manual_seed(17)
        tokens = torch.randint(1, 30000, (3 * PS,), generator=g).tolist()
        a = get_storage_hash_str(RadixKey(tokens, cache_salt="tenant-A"), None, page_size=PS)
        bb = get_storage_hash_str(RadixKey(tokens, cache_salt="tenant-B"), None, page_size=PS)
        lora = get_storage_hash_str(RadixKey(tokens, extra_key="adapter-1", cache_salt="tenant-A"), None,
                                    page_size=PS)
        idx, _ = fill_pages(pool, 3, 18)
        assert all(b.batch_set_v1(a, idx))
        assert b.batch_exists(a) == 3 and b.batch_exists(bb) == 0 and b.batch_exists(lora) == 0
    finally:
        b.close()


@pytest.mark.parametrize("what", ["dtype", "page", "layout"])
def test_namespace_names_dtype_page_size_and_layout(what):
    c = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                             is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                             model_name="org/m")
    base = kvf_sglang.rank_namespace(c, {}, "bfloat16", PS, "page_first")
    other = {"dtype": ("float16", PS, "page_first"), "page": ("bfloat16", 2 * PS, "page_first"),
             "layout": ("bfloat16", PS, "page_first_direct")}[what]
    assert kvf_sglang.rank_namespace(c, {}, *other) != base


def test_namespace_names_the_pool_and_the_tp_rank_where_pages_differ():
    mha = [storage_config("org/m", r, 2) for r in range(2)]
    mla = [storage_config("org/m", r, 2, mla=True) for r in range(2)]
    ns = kvf_sglang.rank_namespace
    assert ns(mha[0], {}, "bfloat16", PS, "page_first") != ns(mha[1], {}, "bfloat16", PS, "page_first")
    assert ns(mla[0], {}, "bfloat16", PS, "page_first") == ns(mla[1], {}, "bfloat16", PS, "page_first")
    # the Mamba state is sharded by TP rank whatever the attention
    assert ns(mla[0], {}, "float32", 1, "page_first", "mamba") != ns(mla[1], {}, "float32", 1, "page_first", "mamba")
    assert len({ns(mha[0], {}, "bfloat16", PS, "page_first", p) for p in ("kv", "swa", "mamba", "indexer")}) == 4


def rank_config(mla=False, **ranks):
    """A storage config of one rank: ranks sets pp_rank / pp_size,
    attn_cp_rank / attn_cp_size, dp_rank (the rest as storage_config's)."""
    c = {**dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1), **ranks}
    return HiCacheStorageConfig(is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True,
                                model_name="org/m", extra_config=dict(
                                    backend_name="kvferry", module_path="kvferry.integrations.sglang",
                                    class_name="KvferryStorage", interface_v1=1), **c)


@pytest.mark.parametrize("mla", (False, True))
def test_pp_stages_cp_and_dp_ranks_never_read_each_other(tmp_path, mla):
    """PP stages hold other layers, attention-CP ranks other tokens and
    attention-DP ranks other requests' pages under rank-local TP numbers
    (MLA's TP replication changes none of that): each is a namespace of
    its own, and a page one stored on the shared directory is no hit for
    the other."""
    ns = kvf_sglang.rank_namespace
    for a, b in (({"pp_rank": 0, "pp_size": 2}, {"pp_rank": 1, "pp_size": 2}),
                 ({"attn_cp_rank": 0, "attn_cp_size": 2}, {"attn_cp_rank": 1, "attn_cp_size": 2}),
                 ({"dp_rank": 0}, {"dp_rank": 1})):
        assert ns(rank_config(mla, **a), {}, "bfloat16", PS, "page_first") != \
            ns(rank_config(mla, **b), {}, "bfloat16", PS, "page_first"), (a, b)
    assert ns(rank_config(mla, pp_rank=0, pp_size=2), {}, "bfloat16", PS, "page_first") != \
        ns(rank_config(mla), {}, "bfloat16", PS, "page_first")
    pools, stores = [], []
    try:
        for stage in range(2):
            sc = rank_config(mla, pp_rank=stage, pp_size=2)
            sc.extra_config.update(disk(tmp_path))
            pools.append(mla_pool("page_first") if mla else host_pool("page_first"))
            stores.append(StorageBackendFactory.create_backend("dynamic", sc, pools[-1]))
            stores[-1].register_mem_pool_host(pools[-1])
        keys = page_hashes(33, 3)
        idx, _ = fill_pages(pools[0], 3, 34)
        assert all(stores[0].batch_set_v1(keys, idx))
        assert stores[0].batch_exists(keys) == 3 and stores[1].batch_exists(keys) == 0
    finally:
        for b in stores:
            b.close()


# ---- the v2 interface: a pool per transfer ----------------------------------------------


def hybrid_backend(tmp_path, metrics=False, mamba_layout="page_first", **extra):
    """KV, SWA and Mamba host pools registered as HybridCacheController
    registers them: the anchor through register_mem_pool_host, every pool
    (the anchor again included) through register_mem_host_pool_v2."""
    kv, swa, mamba = host_pool("page_first"), host_pool("page_first_direct", heads=1), mamba_pool(layout=mamba_layout)
    b = backend(tmp_path, kv, metrics=metrics, **extra)
    for name, p in ((PoolName.KV, kv), (PoolName.SWA, swa), (PoolName.MAMBA, mamba)):
        b.register_mem_host_pool_v2(p, name)
    b.on_host_pools_registered()
    return b, kv, swa, mamba


@pytest.mark.parametrize("mamba_layout", ("page_first", "page_first_direct"))
def test_v2_kv_swa_mamba_roundtrip_and_hit_policies(tmp_path, mamba_layout):
    b, kv, swa, mamba = hybrid_backend(tmp_path, mamba_layout=mamba_layout, **disk(tmp_path))
    try:
        keys = page_hashes(21, 6)
        kidx, krefs = fill_pages(kv, 6, 22)
        sidx, srefs = fill_pages(swa, 2, 23)  # the window: the last 2 pages
        midx, mrefs = fill_pages(mamba, 1, 24)  # the state after the last page
        assert b.batch_set_v1(keys, kidx) == [True] * 6
        got = b.batch_set_v2([PoolTransfer(PoolName.SWA, host_indices=sidx, keys=keys[4:]),
                              PoolTransfer(PoolName.MAMBA, host_indices=midx, keys=keys[5:])])
        assert got == {PoolName.SWA: [True, True], PoolName.MAMBA: [True]}
        want = [PoolTransfer(PoolName.SWA, keys=keys[4:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
                PoolTransfer(PoolName.MAMBA, keys=keys[5:], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        r = b.batch_exists_v2(keys, want)
        assert r.kv_hit_pages == 6 and r.restorable_prefix_pages == [6]
        assert r.extra_pool_hit_pages == {PoolName.KV: 6, PoolName.SWA: 6, PoolName.MAMBA: 6}
        # all-pages policy: the SWA pool holds pages 5 and 6 only, so no prefix restores
        r = b.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)])
        assert r.kv_hit_pages == 0 and r.restorable_prefix_pages == []
        # loads into poisoned pages of each pool
        dk, ds, dm = poisoned_pages(kv, 6), poisoned_pages(swa, 2), poisoned_pages(mamba, 1)
        assert b.batch_get_v1(keys, dk) == [True] * 6
        got = b.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=ds, keys=keys[4:]),
                              PoolTransfer(PoolName.MAMBA, host_indices=dm, keys=keys[5:])])
        assert got == {PoolName.SWA: [True, True], PoolName.MAMBA: [True]}
        assert all(torch.equal(page_bytes(kv, dk, i), krefs[i]) for i in range(6))
        assert all(torch.equal(page_bytes(swa, ds, i), srefs[i]) for i in range(2))
        assert torch.equal(page_bytes(mamba, dm, 0), mrefs[0])
        # a Mamba state stored under page 3 only: a prefix of 3 restores, 6 does not
        m3, m3ref = fill_pages(mamba, 1, 25)
        assert b.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=m3, keys=[keys[2]])]) == {
            PoolName.MAMBA: [True]}
        b.cache.remove([string_key(keys[5])])  # page 6's KV goes
        r = b.batch_exists_v2(keys, [PoolTransfer(PoolName.MAMBA, keys=[keys[4]],
                                                  hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        assert r.kv_hit_pages == 3 and r.restorable_prefix_pages == [3]
    finally:
        b.close()


def test_v2_pools_are_namespaces_of_their_own(tmp_path):
    """The same page hash in two pools is two blocks: a Mamba state never
    loads as a KV page or the other way round."""
    b, kv, swa, mamba = hybrid_backend(tmp_path, **disk(tmp_path))
    try:
        keys = page_hashes(27, 2)
        idx, _ = fill_pages(kv, 2, 28)
        assert all(b.batch_set_v1(keys, idx))
        r = b.batch_exists_v2(keys, [PoolTransfer(PoolName.MAMBA, keys=keys[1:],
                                                  hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        assert r.kv_hit_pages == 0 and r.extra_pool_hit_pages == {PoolName.KV: 2}
        dm = poisoned_pages(mamba, 1)
        assert b.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=dm, keys=keys[1:])]) == {
            PoolName.MAMBA: [False]}
        assert torch.equal(page_bytes(mamba, dm, 0), torch.full_like(page_bytes(mamba, dm, 0), 0xA5))
        names = {s.namespace for s in b._stores.values()}
        assert len(names) == 3 and any("mamba" in n for n in names) and any("swa" in n for n in names)
    finally:
        b.close()


@pytest.mark.parametrize("layout", ("layer_first", "page_first", "page_first_direct"))
def test_v2_dsa_indexer_pool_rides_on_kv_pages(tmp_path, layout):
    """DeepSeek sparse attention: the indexer's pages take the KV pages'
    host indices and keys (a KV-derived sidecar, all pages hit policy)."""
    set_ranks(0, 1)
    kv, ix = dsa_pools(layout)
    ps = kv.page_size
    b = backend(tmp_path, kv, mla=True, **disk(tmp_path))
    try:
        for name, p in ((PoolName.KV, kv), (PoolName.INDEXER, ix)):
            b.register_mem_host_pool_v2(p, name)
        keys = page_hashes(35, 3)
        idx, krefs = fill_pages(kv, 3, 36)
        _, irefs = fill_pages(ix, 3, 37, idx)  # the indexer's rows of the same pages
        assert b.batch_set_v1(keys, idx) == [True] * 3
        assert b.batch_set_v2([PoolTransfer(PoolName.INDEXER, host_indices=idx[:2 * ps], keys=keys[:2])]) == {
            PoolName.INDEXER: [True, True]}
        r = b.batch_exists_v2(keys, [PoolTransfer(PoolName.INDEXER, hit_policy=PoolHitPolicy.ALL_PAGES,
                                                  indices_from_pool=PoolName.KV)])
        assert r.kv_hit_pages == 2 and r.extra_pool_hit_pages == {PoolName.KV: 3, PoolName.INDEXER: 2}
        dst = poisoned_pages(ix, 3, poisoned_pages(kv, 3))
        assert b.batch_get_v1(keys, dst) == [True] * 3
        got = b.batch_get_v2([PoolTransfer(PoolName.INDEXER, host_indices=dst, keys=keys)])
        assert got == {PoolName.INDEXER: [True, True, False]}
        assert all(torch.equal(page_bytes(kv, dst, i), krefs[i]) for i in range(3))
        assert all(torch.equal(read_page(ix, int(dst[i * ps])), irefs[i]) for i in range(2))
        assert torch.equal(read_page(ix, int(dst[2 * ps])), torch.full_like(irefs[2], 0xA5))
    finally:
        b.close()


def test_v2_bad_input_is_refused_by_name(tmp_path):
    b, kv, swa, mamba = hybrid_backend(tmp_path, **disk(tmp_path))
    try:
        keys = page_hashes(29, 2)
        with pytest.raises(kvferry.KvferryError, match="no indexer host pool"):
            b.batch_get_v2([PoolTransfer(PoolName.INDEXER, host_indices=poisoned_pages(kv, 2), keys=keys)])
        with pytest.raises(kvferry.InvalidArgument, match="mamba pool: 2 keys but 1 host indices"):
            b.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=mamba.alloc(1), keys=keys)])
        assert all(b.batch_set_v1(keys, fill_pages(kv, 2, 30)[0]))  # a KV hit, so the SWA policy is asked
        with pytest.raises(kvferry.KvferryError, match="swa pool: hit policy"):
            b.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.BLOCK_GROUPS)])
        with pytest.raises(kvferry.InvalidArgument, match="second swa host pool"):
            b.register_mem_host_pool_v2(host_pool("page_first"), PoolName.SWA)
        with pytest.raises(kvferry.KvferryError, match="layout 'page_first_kv_split'"):
            kvf_sglang.host_pool_pools(type("P", (), {"layout": "page_first_kv_split"})(), "a pool")
    finally:
        b.close()


# ---- SGLang's storage metrics ---------------------------------------------------------------


def test_storage_metrics_with_hits_per_tier(tmp_path):
    """get_stats: SGLang's StorageMetrics (pages per call and GB/s of the
    calls since the last get_stats) and the pages loaded per kvferry tier."""
    from sglang.srt.observability.metrics_collector import StorageMetrics

    pool = host_pool("page_first")
    b = backend(tmp_path, pool, metrics=True, host_blocks=2, **disk(tmp_path))
    try:
        keys = page_hashes(31, 5)
        idx, refs = fill_pages(pool, 5, 32)
        assert all(b.batch_set_v1(keys, idx))
        ok, got, dst = load(b, keys, pool)
        assert got == 5
        m = b.get_stats()
        assert isinstance(m, StorageMetrics)
        assert m.backup_pgs == [5] and m.prefetch_pgs == [5]
        assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0 and m.prefetch_bandwidth[0] > 0
        tiers = b.cache.lookup([string_key(k) for k in keys])[1]
        assert m.loaded_pages_by_tier == dict(Counter(kvferry.tier_name(t) for t in tiers))
        assert m.loaded_pages_by_tier == {"host": 2, "disk": 3}
        assert m.cache_stats["kv"].blocks["host"] == 2 and m.cache_stats["kv"].blocks["disk"] == 3
        assert m.failed_pages_by_tier == {} and m.pool_failed_pages_by_tier == {"kv": {}}
        m = b.get_stats()  # drained
        assert m.backup_pgs == [] and m.prefetch_pgs == [] and m.loaded_pages_by_tier == {}
    finally:
        b.close()
