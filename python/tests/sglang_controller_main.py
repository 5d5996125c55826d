# SPDX-License-Identifier: Apache-2.0
"""SGLang's HiCacheController on the CPU with kvferry as its storage
backend, driven as SGLang's scheduler drives it: backups are queued with
write_storage and done by the controller's backup thread; prefetches are
queued with prefetch, their hits counted by its prefetch thread (the
minimum over the TP group, by its own gloo all-reduce), the host pages
given to it as the scheduler gives them, and the pages loaded by its
prefetch I/O thread. The test module calls the functions; run as a
program it is one TP rank of a group (a process per rank, as SGLang runs
them) and writes what it saw as JSON:

    python sglang_controller_main.py RANK WORLD WORKDIR LAYOUT

Every rank holds the same MLA pages (MLA is replicated over TP), queues
their backup as the radix cache does on every rank (the controller skips
it on all but the storage writer), waits at a barrier, then prefetches
them into poisoned host pages and compares the bytes."""

import json
import os
import sys
import threading

import torch
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.utils import get_storage_hash_str

from sglang_pools import LAYERS, PS, TOKENS, dsa_pools, fill_pages, host_pool, mamba_pool, mha_device, mla_device, \
    mla_pool, page_bytes, page_tokens, poisoned_pages, set_ranks

WAIT_S = 120


def controller(kind: str, layout: str, model: str = "org/tiny", tp_group=None, **extra):
    """(HiCacheController with kvferry attached at start, its host pool)."""
    dev = mha_device() if kind == "mha" else mla_device()
    host = host_pool(layout, dev=dev) if kind == "mha" else mla_pool(layout, dev=dev)
    alloc = PagedTokenToKVPoolAllocator(TOKENS, PS, torch.bfloat16, "cpu", dev, False)
    cfg = dict(backend_name="kvferry", module_path="kvferry.integrations.sglang", class_name="KvferryStorage",
               interface_v1=1, **extra)
    cc = HiCacheController(alloc, host, PS, tp_group, threading.Event(), storage_backend="dynamic",
                           model_name=model, storage_backend_extra_config=cfg)
    return cc, host


def hybrid_controller(kind: str, **extra):
    """(SGLang's HybridCacheController, the v2 interface's caller, with
    kvferry attached at start, its host pools by name). kind "mamba":
    an MHA KV pool, a sliding-window pool (its own host pages) and a Mamba
    state pool; "dsa": DeepSeek sparse attention's MLA pool and its indexer
    pool on the KV pages. Built as SGLang's hybrid pool assembler builds
    them (one HostPoolGroup, the KV pool its anchor)."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_pool_entry
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup

    layers = {i: i for i in range(LAYERS)}
    if kind == "mamba":
        dev = mha_device()
        pools = {PoolName.KV: host_pool("page_first", dev=dev), PoolName.SWA: host_pool("page_first_direct", heads=1),
                 PoolName.MAMBA: mamba_pool()}
    else:
        pools = dict(zip((PoolName.KV, PoolName.INDEXER), dsa_pools("page_first")))
        dev = pools[PoolName.INDEXER].device_pool
    group = HostPoolGroup([build_pool_entry(name=n, host_pool=p, device_pool=dev if n == PoolName.KV else None,
                                            layer_mapping=layers if n == PoolName.KV else {},
                                            transfer_layer_id_max=LAYERS, is_anchor=n == PoolName.KV)
                           for n, p in pools.items()])
    ps = pools[PoolName.KV].page_size
    alloc = PagedTokenToKVPoolAllocator(TOKENS, ps, torch.bfloat16, "cpu", dev, False)
    cfg = dict(backend_name="kvferry", module_path="kvferry.integrations.sglang", class_name="KvferryStorage",
               interface_v1=1, **extra)
    cc = HybridCacheController(alloc, group, ps, None, threading.Event(), storage_backend="dynamic",
                               model_name="org/hybrid", storage_backend_extra_config=cfg)
    return cc, pools


def backup(cc, host_indices, tokens, extra_pools=None) -> int:
    """Queues a backup of the pages (and, for the hybrid controller, its
    other pools' transfers) and waits for the backup thread's ack: the
    tokens it stored."""
    ps = cc.page_size
    more = {} if extra_pools is None else dict(extra_pools=extra_pools)
    op_id = cc.write_storage(host_indices, tokens, hash_value=get_storage_hash_str(tokens, None, page_size=ps),
                             **more)
    op = cc.ack_backup_queue.get(timeout=WAIT_S)
    assert op.id == op_id, (op.id, op_id)
    return op.completed_tokens


def prefetch(cc, host, rid: str, tokens, extra_pools=None, pools=None, dst=None):
    """A prefetch as the scheduler runs one: (tokens the prefetch thread
    found, tokens the I/O thread loaded, the poisoned host indices it
    loaded into or None; dst: host indices poisoned beforehand, as many as
    the hit needs). For the hybrid controller, extra_pools are the other
    pools' transfers and pools the host pools to give them poisoned pages
    from (the pages each transfer's keys need); the ack's per-pool hits are
    in op.pool_hits."""
    ps = cc.page_size
    if extra_pools is None:
        op = cc.prefetch(rid, tokens)
    else:
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        op = cc.prefetch(CacheRequestHandle(rid, 0), tokens, extra_pools=extra_pools)
    hit = cc.prefetch_hit_queue.get(timeout=WAIT_S)
    assert hit is op
    if op.storage_hit_count == 0:
        return 0, 0, None
    op.host_indices = poisoned_pages(host, op.storage_hit_count // ps) if dst is None else dst
    for t in extra_pools or []:
        if t.indices_from_pool is None:
            t.host_indices = poisoned_pages(pools[t.name], len(t.keys))
        else:  # riding on the KV pages: its rows of them
            poisoned_pages(pools[t.name], len(op.host_indices) // ps, op.host_indices)
    cc.prefetch_buffer.put(op)
    loaded, op.pool_hits = 0, {}
    while True:
        ack = cc.ack_prefetch_queue.get(timeout=WAIT_S)
        assert ack.rid == rid
        op.pool_hits.update({k: v for k, v in (ack.pool_hits or {}).items() if v})
        if ack.completed_req:
            return op.storage_hit_count, loaded, op.host_indices
        if ack.completed_tokens is not None:
            loaded = ack.completed_tokens


def rank_main(rank: int, world: int, workdir: str, layout: str) -> dict:
    torch.distributed.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank,
                                         world_size=world)
    set_ranks(rank, world)
    cc, host = controller("mla", layout, model="org/tiny-mla", tp_group=torch.distributed.group.WORLD,
                          file_dir=os.path.join(workdir, "kv"), disk_blocks=64)
    try:
        pages = 6
        tokens = page_tokens(41, pages)
        idx, refs = fill_pages(host, pages, 42)  # the same bytes on every rank: MLA pages are equal
        stored = backup(cc, idx, tokens)
        torch.distributed.barrier()  # the writer's backup has completed
        backend = cc.storage_backend
        own = backend.batch_exists(get_storage_hash_str(tokens, None, page_size=PS))
        found, loaded, dst = prefetch(cc, host, f"r{rank}", tokens)
        equal = [bool(torch.equal(page_bytes(host, dst, i), refs[i])) for i in range(loaded // PS)]
        return dict(rank=rank, writer=backend.storage_config.is_storage_writer, namespace=backend._namespace,
                    stored_tokens=stored, puts=backend.cache.stats().puts, own_exists=own, found_tokens=found,
                    loaded_tokens=loaded, equal=equal, tiers=backend.get_stats().loaded_pages_by_tier,
                    pages=pages)
    finally:
        cc.detach_storage_backend()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    r, w, d, lay = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    out = rank_main(r, w, d, lay)
    with open(os.path.join(d, f"rank{r}.json"), "w") as f:
        json.dump(out, f)
