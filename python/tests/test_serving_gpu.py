# SPDX-License-Identifier: Apache-2.0
"""The serving adapters' kvferry path on the GPU, without vLLM: KV tensors
in vLLM's layouts on the GPU become pools through the adapters' own
tensor_pools / add_pools, blocks are put into the host and disk tiers, and a
layer-wise get is consumed as the vLLM connector's wait_for_layer_load
consumes it: each layer's reader on torch's current stream waits for that
layer's pools only (stream_wait_pool), the host not at all. Byte-exact into
poisoned blocks. Skipped unless torch has CUDA and libkvferry a CUDA backend."""

import pytest

import kvferry as kvf
from conftest import torch_cuda

torch = torch_cuda()

from kvferry.integrations._serving import add_pools, backend_for, tensor_pools  # noqa: E402

LAYERS, BLOCKS, BS, HEADS, HEAD = 6, 96, 16, 8, 64


def blk(t, dim, ids):
    return t[:, ids] if dim == 1 else t[ids]


def layer_tensor(layout, g):
    if layout == "flash_attn":  # [2, blocks, block_size, heads, dim]
        return torch.randn(2, BLOCKS, BS, HEADS, HEAD, device="cuda", dtype=torch.bfloat16, generator=g), 1
    # flashinfer: [blocks, 2, block_size, heads, dim]
    return torch.randn(BLOCKS, 2, BS, HEADS, HEAD, device="cuda", dtype=torch.bfloat16, generator=g), 0


@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer"])
def test_layerwise_get_into_gpu_kv(tmp_path, layout):
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
