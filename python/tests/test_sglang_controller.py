# SPDX-License-Identifier: Apache-2.0
"""kvferry driven by SGLang's own HiCacheController threads, on the CPU:
the controller is built over SGLang's CPU device pool, its paged allocator
and its host pool, kvferry attached at start by SGLang's
StorageBackendFactory; backups are done by the controller's backup thread,
hit queries by its prefetch thread and loads by its prefetch I/O thread
(sglang_controller_main.py plays the scheduler thread between them, with
the queues SGLang's radix cache uses). Loaded pages are compared byte for
byte with what was backed up, in poisoned host pages. MLA with TP 2 runs
two processes, a gloo group between them as SGLang builds it. The v2
interface runs under SGLang's HybridCacheController (SWA + Mamba, and
DeepSeek sparse attention's indexer).

Nothing here needs CUDA: the controller's streams are torch.cpu streams
on a machine without an accelerator, and its device-host copies (not used
here) are the only part that would want one.

Skipped unless sglang imports (see docs/integrations/sglang.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sglang = pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

import sglang_controller_main as main  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402
from sglang_pools import MHA_LAYOUTS, MLA_LAYOUTS, PS, fill_pages, page_bytes, page_tokens, set_ranks  # noqa: E402

import kvferry  # noqa: E402
from kvferry.integrations._serving import block_file, string_key  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    set_ranks(0, 1)


@pytest.mark.parametrize("kind,layout", [("mha", lay) for lay in MHA_LAYOUTS] + [("mla", lay) for lay in MLA_LAYOUTS])
def test_backup_thread_stores_and_prefetch_threads_load(tmp_path, kind, layout):
    kv = str(tmp_path / "kv")
    cc, host = main.controller(kind, layout, file_dir=kv, disk_blocks=64)
    try:
        assert isinstance(cc.storage_backend, kvferry.integrations.sglang.KvferryStorage)
        assert cc.page_set_func == cc._page_set_zero_copy  # interface_v1: pages move in place
        tokens = page_tokens(51, 5) + [7] * (PS // 2)  # 5 whole pages and a partial one
        idx, refs = fill_pages(host, 5, 52)
        assert main.backup(cc, idx, tokens[:5 * PS]) == 5 * PS
        assert cc.storage_backend.cache.stats().puts == 5
        found, loaded, dst = main.prefetch(cc, host, "r1", tokens)
        assert (found, loaded) == (5 * PS, 5 * PS)
        for i in range(5):
            assert torch.equal(page_bytes(host, dst, i), refs[i]), f"page {i}"
        # other tokens: the prefetch thread finds nothing, nothing is loaded
        assert main.prefetch(cc, host, "r2", page_tokens(53, 3)) == (0, 0, None)
    finally:
        cc.detach_storage_backend()
    # a restarted server: a new controller on the directory loads from disk
    cc, host = main.controller(kind, layout, file_dir=kv, disk_blocks=64)
    try:
        found, loaded, dst = main.prefetch(cc, host, "r3", tokens)
        assert (found, loaded) == (5 * PS, 5 * PS)
        assert all(torch.equal(page_bytes(host, dst, i), refs[i]) for i in range(5))
        assert cc.storage_backend.get_stats().loaded_pages_by_tier == {"disk": 5}
    finally:
        cc.detach_storage_backend()


def test_damaged_page_stops_the_prefetch_there(tmp_path):
    """A page whose file was damaged after its backup is a failed page for
    the I/O thread: the prefetch loads the pages before it, never its bytes."""
    kv = tmp_path / "kv"
    cc, host = main.controller("mha", "page_first", file_dir=str(kv), disk_blocks=64)
    try:
        tokens = page_tokens(55, 4)
        idx, refs = fill_pages(host, 4, 56)
        assert main.backup(cc, idx, tokens) == 4 * PS
        third = Path(block_file(str(kv), cc.storage_backend._namespace,
                                string_key(get_storage_hash_str(tokens, None, page_size=PS)[2])))
        raw = bytearray(third.read_bytes())
        raw[-9] ^= 0x40
        third.write_bytes(bytes(raw))
        cc.storage_backend.get_stats()  # drained: what follows is this prefetch's
        found, loaded, dst = main.prefetch(cc, host, "r1", tokens)
        assert (found, loaded) == (4 * PS, 2 * PS)
        assert all(torch.equal(page_bytes(host, dst, i), refs[i]) for i in range(2))
        # the 2 pages the controller took are the hits; the damaged one and the
        # one after it (read, then dropped by the controller) are failed, not hits
        m = cc.storage_backend.get_stats()
        assert m.loaded_pages_by_tier == {"disk": 2} and m.failed_pages_by_tier == {"disk": 2}
    finally:
        cc.detach_storage_backend()


def test_mla_tp2_one_writer_every_rank_hits(tmp_path):
    """Two TP ranks, a process each, SGLang's gloo groups between them: the
    writer rank's backup thread stores the pages once, rank 1's skips them;
    each rank's batch_exists answers from the shared directory, the
    prefetch threads' minimum over the ranks is every page, and both ranks
    load them byte for byte."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(HERE / "sglang_controller_main.py"), str(r), "2", str(tmp_path),
                               "page_first"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}:\n{outs[r][-4000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    n = ranks[0]["pages"]
    assert [r["writer"] for r in ranks] == [True, False]
    assert ranks[0]["namespace"] == ranks[1]["namespace"]
    assert [r["stored_tokens"] for r in ranks] == [n * PS, 0]  # rank 1's backup thread skipped it
    assert [r["puts"] for r in ranks] == [n, 0]
    assert [r["own_exists"] for r in ranks] == [n, n]  # each rank's own answer
    assert [r["found_tokens"] for r in ranks] == [n * PS, n * PS]  # the minimum over the ranks
    assert [r["loaded_tokens"] for r in ranks] == [n * PS, n * PS]
    assert [r["equal"] for r in ranks] == [[True] * n, [True] * n]
    assert ranks[1]["tiers"] == {"disk": n}


# ---- the v2 interface under SGLang's HybridCacheController ------------------------------


def test_hybrid_controller_threads_move_kv_swa_and_mamba(tmp_path):
    """An SWA + Mamba hybrid: the backup thread stores the KV pages (v1),
    the last 2 pages' sliding-window KV and the Mamba state after the last
    page (v2); the prefetch thread's batch_exists_v2 finds every pool's
    pages by their trailing-pages policy; the I/O thread loads them all,
    byte-exact, into poisoned pages of each pool."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    cc, pools = main.hybrid_controller("mamba", file_dir=str(tmp_path / "kv"), disk_blocks=64)
    kv, swa, mamba = pools[PoolName.KV], pools[PoolName.SWA], pools[PoolName.MAMBA]
    try:
        assert set(cc.storage_backend._stores) == {"kv", "swa", "mamba"}
        tokens = page_tokens(61, 4)
        keys = get_storage_hash_str(tokens, None, page_size=PS)
        idx, refs = fill_pages(kv, 4, 62)
        sidx, srefs = fill_pages(swa, 2, 63)
        midx, mrefs = fill_pages(mamba, 1, 64)

        def pools_of(with_indices):
            trailing = PoolHitPolicy.TRAILING_PAGES
            return [PoolTransfer(PoolName.SWA, host_indices=sidx if with_indices else None, keys=keys[2:],
                                 hit_policy=trailing),
                    PoolTransfer(PoolName.MAMBA, host_indices=midx if with_indices else None, keys=keys[3:],
                                 hit_policy=trailing)]

        assert main.backup(cc, idx, tokens, pools_of(True)) == 4 * PS
        want = pools_of(False)
        found, loaded, dst = main.prefetch(cc, kv, "r1", tokens, want, pools)
        assert (found, loaded) == (4 * PS, 4 * PS)
        assert cc.storage_backend.get_stats().pool_loaded_pages_by_tier == {"kv": {"disk": 4}, "swa": {"disk": 2},
                                                                            "mamba": {"disk": 1}}
        assert all(torch.equal(page_bytes(kv, dst, i), refs[i]) for i in range(4))
        assert all(torch.equal(page_bytes(swa, want[0].host_indices, i), srefs[i]) for i in range(2))
        assert torch.equal(page_bytes(mamba, want[1].host_indices, 0), mrefs[0])
        # a prefix that ends on page 3: its Mamba state was never stored, so nothing restores
        found, loaded, dst = main.prefetch(cc, kv, "r2", tokens[:3 * PS], [
            PoolTransfer(PoolName.MAMBA, keys=keys[2:3], hit_policy=PoolHitPolicy.TRAILING_PAGES)], pools)
        assert (found, loaded, dst) == (0, 0, None)
    finally:
        cc.detach_storage_backend()


def test_hybrid_controller_threads_move_dsa_indexer_pages(tmp_path):
    """DeepSeek sparse attention (MLA, 64-token pages): the indexer pool
    rides on the KV pages (KV-derived): the backup thread stores both, the
    prefetch I/O thread loads both into poisoned pages, byte-exact."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    cc, pools = main.hybrid_controller("dsa", file_dir=str(tmp_path / "kv"), disk_blocks=64)
    kv, ix = pools[PoolName.KV], pools[PoolName.INDEXER]
    ps = kv.page_size
    try:
        assert cc.storage_backend.storage_config.is_mla_model and ps == 64
        tokens = page_tokens(65, 3, ps)
        idx, refs = fill_pages(kv, 3, 66)
        _, irefs = fill_pages(ix, 3, 67, idx)

        def indexer():
            return [PoolTransfer(PoolName.INDEXER, indices_from_pool=PoolName.KV, hit_policy=PoolHitPolicy.ALL_PAGES)]

        assert main.backup(cc, idx, tokens, indexer()) == 3 * ps
        found, loaded, dst = main.prefetch(cc, kv, "r1", tokens, indexer(), pools)
        assert (found, loaded) == (3 * ps, 3 * ps)
        assert all(torch.equal(page_bytes(kv, dst, i), refs[i]) for i in range(3))
        assert all(torch.equal(page_bytes(ix, dst, i), irefs[i]) for i in range(3))
    finally:
        cc.detach_storage_backend()
