# SPDX-License-Identifier: Apache-2.0
"""The serving adapters' kvferry path on the GPU, without vLLM: KV tensors
in vLLM's layouts become pools through the adapters' own helpers, blocks
are put into the host and disk tiers, and a layer-wise get is consumed as
the vLLM connector's wait_for_layer_load consumes it: each layer's reader
on a torch stream waits for that layer's pools only (stream_wait_pool),
the host not at all. Byte-exact into poisoned blocks; every block the load
was not given stays as it was.

The hybrid and MLA tests run the connector's own map (kvferry.integrations.
_vllm_kv: KV cache groups and their keys, tensors cut into pools, the
blocks a hit loads per group, a sliding window only those it reaches, the
held part of a load, a layer's wait) with vLLM's config classes where vLLM
is installed, else stand-ins of the same names and fields (the map reads
nothing else). Each runs on the GPU (skipped unless torch has CUDA and
libkvferry a CUDA backend) and on the host backend with CPU tensors
(skipped without torch)."""

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import List

import pytest

import kvferry as kvf
from conftest import torch_cuda

torch = pytest.importorskip("torch")

from kvferry.integrations._serving import add_pools, backend_for, tensor_pools  # noqa: E402
from kvferry.integrations._vllm_kv import (_block_dim, block_key, cut_kv_caches, first_needed,  # noqa: E402
                                           group_loads, held_prefixes, kv_groups, tensor_ident, wait_layer)

try:
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec,
                                            SlidingWindowSpec)
except ImportError:  # the GPU machine has no vLLM: its config classes' names and the fields the map reads
    SlidingWindowManager = None

    @dataclass
    class FullAttentionSpec:
        block_size: int
        num_kv_heads: int
        head_size: int
        dtype: object

    class MLAAttentionSpec(FullAttentionSpec):
        pass

    @dataclass
    class SlidingWindowSpec(FullAttentionSpec):
        sliding_window: int = 0

    @dataclass
    class KVCacheGroupSpec:
        layer_names: List[str]
        kv_cache_spec: object

    @dataclass
    class KVCacheConfig:
        num_blocks: int
        kv_cache_tensors: list = field(default_factory=list)
        kv_cache_groups: list = field(default_factory=list)

LAYERS, BLOCKS, BS, HEADS, HEAD = 6, 96, 16, 8, 64
POISON = -1  # 0xFFFF: a NaN in bf16, never drawn by randn


def device_of(name):
    """cuda (skips unless usable) or cpu."""
    if name == "cuda":
        torch_cuda()
    return name


def blk(t, dim, ids):
    return t[:, ids] if dim == 1 else t[ids]


def layer_tensor(layout, g, device="cuda"):
    if layout == "flash_attn":  # [2, blocks, block_size, heads, dim]
        return torch.randn(2, BLOCKS, BS, HEADS, HEAD, device=device, dtype=torch.bfloat16, generator=g), 1
    # flashinfer: [blocks, 2, block_size, heads, dim]
    return torch.randn(BLOCKS, 2, BS, HEADS, HEAD, device=device, dtype=torch.bfloat16, generator=g), 0


@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer"])
def test_layerwise_get_into_gpu_kv(tmp_path, layout):
    device_of("cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    kv = [layer_tensor(layout, g) for _ in range(LAYERS)]
    assert backend_for([t for t, _ in kv]) == kvf.Backend.CUDA
    with kvf.Engine(backend=kvf.Backend.CUDA, file_dir=str(tmp_path), file_namespace="serving-gpu") as e:
        layer_pools = [add_pools(e, tensor_pools(t, dim, BS, f"layer {i}"), 8) for i, (t, dim) in enumerate(kv)]
        order = [p for pools in layer_pools for p in pools]
        with kvf.Cache(e, host_blocks=8, disk_blocks=64) as cache:
            keys = kvf.key_chain_all(torch.randint(0, 32000, (20 * BS,)).numpy(), BS)
            src, dst = list(range(20)), list(range(40, 60))
            ref = [blk(t, dim, src).clone() for t, dim in kv]
            torch.cuda.synchronize()
            cache.put(keys, src).wait(check=True)
            for t, dim in kv:
                if dim == 1:
                    t[:, dst] = float("nan")
                else:
                    t[dst] = float("nan")
            torch.cuda.synchronize()
            ticket = cache.get(keys, dst, pools=order)
            seen = []
            for (t, dim), pools in zip(kv, layer_pools):
                for p in pools:
                    ticket.stream_wait_pool(p)  # torch's current stream
                seen.append(blk(t, dim, dst).clone())  # the layer's "attention", queued after the wait
            torch.cuda.synchronize()
            assert ticket.wait() == [kvf.Status.OK] * 20
            for got, want in zip(seen, ref):
                assert torch.equal(got.view(torch.int16), want.view(torch.int16))
            s = cache.stats()
            assert s.failures == 0 and s.blocks["host"] == 8 and s.blocks["disk"] == 12


# ---- the vLLM connector's map: several KV cache groups, MLA ----------------------------------

def window_skipped(window):
    """Tokens before a sliding window's reach: vLLM's SlidingWindowManager
    says so where vLLM is installed; else its rule (the window covers the
    next token and the window - 1 before it)."""
    if SlidingWindowManager is not None:
        mgr = SimpleNamespace(sliding_window=window, extra_retained_tokens=0)
        return lambda tokens: SlidingWindowManager.get_num_skipped_tokens(mgr, tokens)
    return lambda tokens: max(0, tokens - window + 1)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def serve_layerwise(tmp_path, device, kv_caches, config, groups, keys, saved, tables, hit, skipped, gone=()):
    """One save and one layer-wise load through the connector's map.

    saved[g] / tables[g]: group g's block ids when its blocks were saved /
    for the request that loads them (vLLM's null block 0 where a window
    does not reach). Saves every whole block of every group (as the
    connector does), poisons every block the saver had and the loader's
    table, loads a hit of `hit` blocks layer by layer with each layer's
    reader on a stream that is not the default one, and checks that each
    loaded block is byte for byte the saved one and every other block is
    untouched. gone: keys removed between the scheduler's look and the
    load (their group's list fails from there on). Returns each group's
    loaded block indices and the blocks reported missing."""
    cuda = device == "cuda"
    tensors = list(kv_caches.values())
    assert backend_for(tensors) == (kvf.Backend.CUDA if cuda else kvf.Backend.HOST)
    cut = cut_kv_caches(kv_caches, config.num_blocks, BS)
    before = {tensor_ident(t): t.clone() for t in tensors}
    bdim = {tensor_ident(t): _block_dim(t, config.num_blocks, name) for name, t in kv_caches.items()}
    with kvf.Engine(backend=backend_for(tensors), file_dir=str(tmp_path), file_namespace="serving-map") as e:
        added = {ident: add_pools(e, pools, 4) for ident, pools in cut.items()}
        order = [p for pools in added.values() for p in pools]
        layer_pools = {name: added[tensor_ident(t)] for name, t in kv_caches.items()}
        with kvf.Cache(e, host_blocks=4, disk_blocks=256) as cache:
            put_keys = [k for gk in keys for k in gk]
            put_ids = [b for ids in saved for b in ids]
            sync(device)
            cache.put(put_keys, put_ids).wait(check=True)
            # the saver's blocks and the loader's table hold no trace of the saved bytes
            poisoned = sorted({b for ids in saved + tables for b in ids})
            for t in tensors:
                idx = [slice(None)] * bdim[tensor_ident(t)] + [poisoned]
                t.view(torch.int16)[tuple(idx)] = POISON
            sync(device)
            after_poison = {tensor_ident(t): t.clone() for t in tensors}

            needed = lambda g, blocks, local: first_needed(g, blocks, local, BS, skipped)  # noqa: E731
            loads = group_loads(groups, keys, tables, 0, hit, 0, needed)
            assert cache.remove(list(gone)) == len(gone)
            lkeys, slots, missing = held_prefixes(cache, loads)
            assert len(set(slots + missing)) == len(slots) + len(missing)
            ticket = cache.get(lkeys, slots, pools=order)
            side = torch.cuda.Stream() if cuda else None
            seen = {}
            with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
                for name, t in kv_caches.items():  # the forward, layer by layer
                    wait_layer(ticket, layer_pools[name], cuda)
                    # the layer's "attention", queued after the wait
                    seen[name] = blk(t, bdim[tensor_ident(t)], slots).clone()
            if cuda:
                side.synchronize()
            assert ticket.wait() == [kvf.Status.OK] * len(slots)
            sync(device)  # the checks below read on the default stream

    # the saved bytes of each loaded block: the saver's block of the same group and index
    src_of = {}
    for gi, ids in enumerate(tables):
        for j, b in enumerate(ids[:hit]):
            if b in slots:
                src_of[b] = saved[gi][j]
    for name, t in kv_caches.items():
        bd = bdim[tensor_ident(t)]
        want = blk(before[tensor_ident(t)], bd, [src_of[s] for s in slots])
        assert torch.equal(seen[name].view(torch.int16), want.view(torch.int16)), name
        rest = [b for b in range(t.shape[bd]) if b not in slots]
        assert torch.equal(blk(t, bd, rest).view(torch.int16),
                           blk(after_poison[tensor_ident(t)], bd, rest).view(torch.int16)), name
    return [[j for j, b in enumerate(ids[:hit]) if b in slots] for ids in tables], missing


def hashes(n, seed):
    """n block hashes as vLLM's hasher gives them (32 bytes each)."""
    gen = torch.Generator().manual_seed(seed)
    return [bytes(torch.randint(0, 256, (32,), generator=gen, dtype=torch.uint8).tolist()) for _ in range(n)]


@pytest.mark.parametrize("gone", [False, True])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_hybrid_groups_layerwise(tmp_path, device, gone):
    """A hybrid model under vLLM's hybrid allocator: two full-attention
    groups and a sliding-window group (3 blocks' window), each of two
    layers; a KV tensor per layer position shared by one layer of each
    group (flash_attn layout, bf16), one block table per group from one
    block pool. Every whole block of every group is saved; an 8-block hit
    loads all 8 blocks of each full group and only the 3 the window
    reaches, never a block before it (given a real block here, it must
    stay poisoned) nor vLLM's null block. With the second full group's
    block 5 evicted before the load, that group loads blocks 0-4 only, its
    blocks 5-7 are reported and stay poisoned, the other groups load all
    theirs."""
    device_of(device)
    g = torch.Generator(device=device).manual_seed(11)
    tensors = [torch.randn(2, BLOCKS, BS, HEADS, HEAD, device=device, dtype=torch.bfloat16, generator=g)
               for _ in range(2)]
    names = [[f"model.layers.{2 * gi + j}.self_attn.attn" for j in range(2)] for gi in range(3)]
    kv_caches = {n: tensors[j] for gi in range(3) for j, n in enumerate(names[gi])}
    window = 3 * BS
    full = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.bfloat16)
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.bfloat16,
                            sliding_window=window)
    config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(names[0], full), KVCacheGroupSpec(names[1], full),
                                            KVCacheGroupSpec(names[2], swa)])
    groups = kv_groups(config, BS, 7)
    assert [x.window for x in groups] == [False, False, True] and len({x.salt for x in groups}) == 3
    n = 8
    h = hashes(n, 100)
    keys = [[block_key(x, gr.salt) for x in h] for gr in groups]
    assert len({k for gk in keys for k in gk}) == 3 * n  # no two groups share a key
    perm = torch.randperm(BLOCKS - 1, generator=torch.Generator().manual_seed(3)).add(1).tolist()  # 0: null
    saved = [perm[0:8], perm[8:16], perm[16:24]]
    loader = perm[24:50]
    # the loader's tables: the window's first two blocks null, the next three real but out of its reach
    tables = [loader[0:8], loader[8:16], [0, 0] + loader[16:22]]
    got, missing = serve_layerwise(tmp_path, device, kv_caches, config, groups, keys, saved, tables, n,
                                   window_skipped(window), [keys[1][5]] if gone else [])
    if gone:
        assert got == [list(range(8)), list(range(5)), [5, 6, 7]] and missing == tables[1][5:8]
    else:
        assert got == [list(range(8)), list(range(8)), [5, 6, 7]] and missing == []


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_mla_layerwise(tmp_path, device):
    """MLA as vLLM lays it out: one latent tensor per layer, [blocks,
    block_size, 576] bf16 (no K/V split, one pool a layer), one group. A
    6-block hit of an 8-block save, loaded layer by layer into poisoned
    blocks; the two blocks after the hit stay poisoned."""
    device_of(device)
    g = torch.Generator(device=device).manual_seed(13)
    latent = 576
    kv_caches = {f"model.layers.{i}.self_attn.attn": torch.randn(BLOCKS, BS, latent, device=device,
                                                                 dtype=torch.bfloat16, generator=g)
                 for i in range(LAYERS)}
    cut = cut_kv_caches(kv_caches, BLOCKS, BS)
    assert [len(p) for p in cut.values()] == [1] * LAYERS
    assert all(p[0].geometry.block_bytes == BS * latent * 2 for p in cut.values())
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=latent, dtype=torch.bfloat16)
    config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(list(kv_caches), spec)])
    groups = kv_groups(config, BS, 0)
    assert [(x.window, x.salt) for x in groups] == [(False, 0)]
    keys = [[block_key(x) for x in hashes(8, 200)]]
    perm = torch.randperm(BLOCKS - 1, generator=torch.Generator().manual_seed(4)).add(1).tolist()
    got, missing = serve_layerwise(tmp_path, device, kv_caches, config, groups, keys, [perm[:8]], [perm[8:16]], 6,
                                   None)
    assert got == [list(range(6))] and missing == []
