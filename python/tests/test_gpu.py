# SPDX-License-Identifier: Apache-2.0
"""CUDA backend with torch: an engine's per-layer KV tensors (one pool per
layer's K and per layer's V, TOKEN_MAJOR, layers=1, kv_factor=1) round-trip
blocks through host memory and files. Skipped unless torch with CUDA is
importable and libkvferry was built with CUDA and sees a GPU."""

import pytest

import kvferry as kvf
from conftest import torch_cuda

torch = torch_cuda()

LAYERS, BLOCKS, TOKENS, HEADS, HEAD = 4, 32, 16, 8, 64


@pytest.fixture
def kv_cache():
    """vLLM-style: per layer, K and V of [blocks][tokens][heads][head] fp16."""
    g = torch.Generator(device="cuda").manual_seed(7)
    return [(torch.randn(BLOCKS, TOKENS, HEADS, HEAD, device="cuda", dtype=torch.float16, generator=g) + 4,
             torch.randn(BLOCKS, TOKENS, HEADS, HEAD, device="cuda", dtype=torch.float16, generator=g) - 4)
            for _ in range(LAYERS)]


def register(engine, kv_cache, host_slots):
    geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=HEADS, tokens_per_block=TOKENS, head_size=HEAD,
                        dtype=kvf.Dtype.FP16, order=kvf.Order.TOKEN_MAJOR)
    pools = []
    for k, v in kv_cache:
        for t in (k, v):
            pools.append(engine.add_pool(geom, primary=t, secondary=host_slots))
    assert all(p.primary.memory == kvf.Memory.DEVICE and p.primary.slots == BLOCKS for p in pools)
    return pools


@pytest.mark.parametrize("tier", [kvf.Tier.HOST, kvf.Tier.DISK])
def test_torch_kv_round_trip(tmp_path, kv_cache, tier):
    with kvf.Engine(backend=kvf.Backend.CUDA, file_dir=str(tmp_path), file_namespace="gpu") as e:
        register(e, kv_cache, host_slots=16)
        ref = [(k.clone(), v.clone()) for k, v in kv_cache]
        blocks = [3, 17, 30, 5]
        dst = list(range(len(blocks))) if tier == kvf.Tier.HOST else [0x9000 + b for b in blocks]
        stream = torch.cuda.current_stream()
        e.offload(tier, list(zip(blocks, dst))).wait(check=True)
        for k, v in kv_cache:  # poison the evicted blocks
            k[blocks] = float("nan")
            v[blocks] = -1234.0
        torch.cuda.synchronize()
        back = [20, 21, 22, 23]
        e.onboard(tier, list(zip(dst, back))).wait(check=True)
        e.sync_stream(stream)
        for (k, v), (rk, rv) in zip(kv_cache, ref):
            for b, nb in zip(blocks, back):
                assert torch.equal(k[nb], rk[b]) and torch.equal(v[nb], rv[b])
        # partial tokens: the first 5 tokens only, the rest untouched (block
        # back[0] holds ref's blocks[0] again)
        e.offload(tier, [(back[0], dst[0], 5)]).wait(check=True)
        for k, _ in kv_cache:
            k[8] = 0.5
        e.onboard(tier, [(dst[0], 8, 5)]).wait(check=True)
        e.sync_stream(stream)
        for (k, _), (rk, _) in zip(kv_cache, ref):
            assert torch.equal(k[8, :5], rk[blocks[0], :5])
            assert bool((k[8, 5:] == 0.5).all())


def test_cuda_tensor_buffer_and_stream(kv_cache):
    k = kv_cache[0][0]
    b = kvf.as_buffer(k)
    assert (b.kind, b.ptr, b.nbytes) == ("cuda", k.data_ptr(), k.numel() * 2)

    class DLPackOnly:
        def __dlpack__(self, stream=None):
            return k.__dlpack__()

    d = kvf.as_buffer(DLPackOnly())  # the DLPack path parses CUDA tensors too
    assert (d.kind, d.ptr, d.nbytes, d.device) == ("cuda", k.data_ptr(), k.numel() * 2, k.device.index)
    with pytest.raises(kvf.InvalidArgument, match="C-contiguous"):
        kvf.as_buffer(k.transpose(1, 2))
    with kvf.Engine(backend=kvf.Backend.CUDA) as e:
        e.sync_stream(torch.cuda.Stream())
        e.sync_stream(torch.cuda.current_stream().cuda_stream)
        e.sync_stream(None)
