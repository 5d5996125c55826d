# SPDX-License-Identifier: Apache-2.0
"""Contract tests of kvferry.integrations.sglang against the installed
SGLang: the backend is made by SGLang's StorageBackendFactory ("dynamic",
by module path) over SGLang's own host pool (MHATokenToKVPoolHost on CPU,
each host layout), keys are SGLang's page hashes (get_storage_hash_str),
and the calls come as HiCacheController makes them: register_mem_pool_host,
batch_exists, batch_get_v1 into freshly allocated host pages (stopping at
the first failure), batch_set_v1 of backed-up pages. Pages are compared
byte for byte through the pool's own get_data_page, into destinations
poisoned through set_from_flat_data_page. Disk blocks are real kvferry
block files; the remote tier is kvferry's in-process mem:// store.

Skipped unless sglang imports (see docs/integrations/sglang.md)."""

import pytest

sglang = pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

import kvferry  # noqa: E402
from kvferry.integrations import sglang as kvf_sglang  # noqa: E402
from kvferry.integrations._serving import string_key  # noqa: E402

PS, HEADS, HEAD, LAYERS, TOKENS = 16, 2, 16, 3, 512
LAYOUTS = ("layer_first", "page_first", "page_first_direct")


def host_pool(layout):
    dev = MHATokenToKVPool(size=TOKENS, page_size=PS, dtype=torch.bfloat16, head_num=HEADS, head_dim=HEAD,
                           layer_num=LAYERS, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    return MHATokenToKVPoolHost(dev._mha_buffer_info(), 2.0, 0, PS, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS)


def backend(tmp_path, pool, model="org/tiny-model", tp_rank=0, **extra):
    cfg = dict(backend_name="kvferry", module_path="kvferry.integrations.sglang", class_name="KvferryStorage",
               interface_v1=1)
    cfg.update(extra)
    sc = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                              is_mla_model=False, enable_storage_metrics=False,
                              is_page_first_layout=pool.layout != "layer_first", model_name=model,
                              extra_config=cfg)
    b = StorageBackendFactory.create_backend("dynamic", sc, pool)
    b.register_mem_pool_host(pool)  # as HiCacheController.attach_storage_backend does
    return b


def disk(tmp_path):
    return {"file_dir": str(tmp_path / "kv"), "disk_blocks": 1024, "namespace": "sgl-test"}


def page_hashes(seed, pages):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 30000, (pages * PS,), generator=g).tolist()
    return get_storage_hash_str(tokens, None, page_size=PS)


def fill_pages(pool, n, seed):
    """n freshly allocated host pages of random bytes: (host indices, each
    page's bytes as SGLang's get_data_page reads them)."""
    idx = pool.alloc(n * PS)
    g = torch.Generator().manual_seed(seed)
    refs = []
    for i in range(n):
        page = pool.get_data_page(int(idx[i * PS]))
        data = torch.randint(1, 255, (page.numel() * page.element_size(),), dtype=torch.uint8, generator=g)
        pool.set_from_flat_data_page(int(idx[i * PS]), data.view(page.dtype))
        refs.append(data)
    return idx, refs


def poisoned_pages(pool, n):
    idx = pool.alloc(n * PS)
    for i in range(n):
        page = pool.get_data_page(int(idx[i * PS]))
        poison = torch.full((page.numel() * page.element_size(),), 0xA5, dtype=torch.uint8)
        pool.set_from_flat_data_page(int(idx[i * PS]), poison.view(page.dtype))
    return idx


def page_bytes(pool, idx, i):
    return pool.get_data_page(int(idx[i * PS])).contiguous().view(torch.uint8).flatten()


def load(b, keys, pool):
    """As HiCacheController._page_get_zero_copy: pages up to the first failure."""
    idx = poisoned_pages(pool, len(keys))
    ok = b.batch_get_v1(keys, idx)
    got = ok.index(False) if False in ok else len(ok)
    return ok, got, idx


@pytest.mark.parametrize("layout", LAYOUTS)
def test_set_exists_get_roundtrip(tmp_path, layout):
    pool = host_pool(layout)
    b = backend(tmp_path, pool, host_blocks=2, **disk(tmp_path))
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
        path = files / f"{string_key(keys[1]):032x}.kvf"
        assert path.exists()
        if damage == "corrupt":
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0x01
            path.write_bytes(bytes(raw))
        elif damage == "remove":
            path.unlink()
        else:  # a valid block of another key in its place
            path.write_bytes((files / f"{string_key(keys[0]):032x}.kvf").read_bytes())
        ok, got, dst = load(b, keys, pool)
        assert ok[1] is False and got == 1
        assert torch.equal(page_bytes(pool, dst, 0), refs[0])
        assert b.batch_exists(keys) == 1  # the damaged page left the cache
        assert b.cache.stats().failures >= 1
        # backed up again, it is served again
        assert all(b.batch_set_v1(keys, idx))
        ok, got, dst = load(b, keys, pool)
        assert got == 4 and all(torch.equal(page_bytes(pool, dst, i), refs[i]) for i in range(4))
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


def mla_backend(tmp_path, pool, tp_rank, tp_size=2, **more):
    cfg = dict(backend_name="kvferry", module_path="kvferry.integrations.sglang", class_name="KvferryStorage",
               interface_v1=1, **disk(tmp_path))
    sc = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                              attn_cp_size=1, is_mla_model=True, enable_storage_metrics=False,
                              is_page_first_layout=True, model_name="m", extra_config=cfg, **more)
    b = StorageBackendFactory.create_backend("dynamic", sc, pool)
    b.register_mem_pool_host(pool)
    return b


def test_mla_every_rank_hits(tmp_path):
    """HiCache takes the minimum of the ranks' batch_exists: every MLA rank
    stores what it is handed, so every rank hits."""
    pools = [host_pool("page_first"), host_pool("page_first")]
    ranks = [mla_backend(tmp_path, pools[r], r) for r in range(2)]
    try:
        keys = page_hashes(13, 2)
        for r, b in enumerate(ranks):
            idx, _ = fill_pages(pools[r], 2, 14)
            assert b.batch_set_v1(keys, idx) == [True, True]
        assert [b.batch_exists(keys) for b in ranks] == [2, 2]
        assert ranks[0]._namespace != ranks[1]._namespace
    finally:
        for b in ranks:
            b.close()


def test_dcp_ranks_never_read_each_other(tmp_path):
    """Decode-context ranks hold different shards of a page: one rank's
    store is never another's hit, on one directory."""
    pools = [host_pool("page_first"), host_pool("page_first")]
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
