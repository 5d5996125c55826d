# SPDX-License-Identifier: Apache-2.0
"""The cache on the CUDA backend with torch: an engine's per-layer KV
tensors (vLLM-like [num_blocks, block_size, heads, head_size], K and V per
layer, one pool each) round-trip blocks through the host and disk tiers of a
kvferry.Cache, byte-exact. Skipped unless torch with CUDA is importable and
libkvferry was built with CUDA and sees a GPU."""

import kvferry as kvf
from conftest import torch_cuda

torch = torch_cuda()

LAYERS, BLOCKS, TOKENS, HEADS, HEAD = 4, 64, 16, 8, 64


def kv_tensors():
    g = torch.Generator(device="cuda").manual_seed(11)
    return [(torch.randn(BLOCKS, TOKENS, HEADS, HEAD, device="cuda", dtype=torch.bfloat16, generator=g),
             torch.randn(BLOCKS, TOKENS, HEADS, HEAD, device="cuda", dtype=torch.bfloat16, generator=g))
            for _ in range(LAYERS)]


def test_torch_kv_through_host_and_disk(tmp_path):
    kv = kv_tensors()
    geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=HEADS, tokens_per_block=TOKENS, head_size=HEAD,
                        dtype=kvf.Dtype.BF16, order=kvf.Order.TOKEN_MAJOR)
    with kvf.Engine(backend=kvf.Backend.CUDA, file_dir=str(tmp_path), file_namespace="gpu-cache") as e:
        for k, v in kv:
            e.add_pool(geom, primary=k, secondary=8)
            e.add_pool(geom, primary=v, secondary=8)
        with kvf.Cache(e, host_blocks=8, disk_blocks=64, event_queue=1024) as cache:
            tokens = torch.randint(0, 32000, (24 * TOKENS,)).numpy()
            keys = kvf.key_chain_all(tokens, TOKENS)
            src = list(range(24))  # the request's GPU blocks, freed into the cache
            ref = [(k[src].clone(), v[src].clone()) for k, v in kv]
            torch.cuda.synchronize()
            cache.put(keys, src, priority=70).wait(check=True)
            hits, tiers = cache.lookup(keys)
            assert hits == 24
            assert tiers.count(kvf.Tier.HOST) == 8 and tiers.count(kvf.Tier.DISK) == 16
            dst = list(range(32, 56))
            for k, v in kv:  # what the engine left in the destination blocks
                k[dst] = float("nan")
                v[dst] = -7.0
            torch.cuda.synchronize()
            cache.get(keys, dst).wait(check=True)
            e.sync_stream(torch.cuda.current_stream())
            for (k, v), (rk, rv) in zip(kv, ref):
                # bit-exact: compare the raw bytes, NaN-safe
                assert torch.equal(k[dst].view(torch.int16), rk.view(torch.int16))
                assert torch.equal(v[dst].view(torch.int16), rv.view(torch.int16))
            s = cache.stats()
            assert s.hits == {"host": 8, "disk": 16, "remote": 0, "gpu": 0} and s.failures == 0
            assert any(ev.kind == kvf.EventKind.UPDATED for ev in cache.events())
