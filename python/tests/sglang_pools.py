# SPDX-License-Identifier: Apache-2.0
"""SGLang's own host pools built on the CPU, and their pages read and
written through the pools' own accessors: what the SGLang tests
(test_sglang_adapter.py, test_sglang_controller.py and the ranks that
sglang_controller_main.py runs) share. Importing it imports SGLang."""

import torch
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_storage_hash_str

PS, HEADS, HEAD, LAYERS, TOKENS = 16, 2, 16, 3, 512
LAYOUTS = ("layer_first", "page_first", "page_first_direct")
# every layout each host pool class of SGLang 0.5.23 builds on the CPU
MHA_LAYOUTS = LAYOUTS + ("page_head", "page_unified")
MLA_LAYOUTS = LAYOUTS + ("page_unified",)
LORA, ROPE = 32, 16


def mha_device(heads=HEADS):
    return MHATokenToKVPool(size=TOKENS, page_size=PS, dtype=torch.bfloat16, head_num=heads, head_dim=HEAD,
                            layer_num=LAYERS, device="cpu", enable_memory_saver=False, enable_alt_stream=False)


def mla_device():
    return MLATokenToKVPool(size=TOKENS, page_size=PS, dtype=torch.bfloat16, kv_lora_rank=LORA,
                            qk_rope_head_dim=ROPE, layer_num=LAYERS, device="cpu", enable_memory_saver=False)


def host_pool(layout, heads=HEADS, dev=None):
    dev = dev or mha_device(heads)
    return MHATokenToKVPoolHost(dev._mha_buffer_info(), 2.0, 0, PS, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS)


def mla_pool(layout, dev=None):
    dev = dev or mla_device()
    return MLATokenToKVPoolHost(dev._mla_buffer_info(), 2.0, 0, PS, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS,
                                target_layer_num=LAYERS)


def mamba_pool(slots=16, layout="page_first"):
    """SGLang's Mamba host pool (a state slot a page) over CPU state
    tensors: fp32 temporal state and a bf16 conv state, 2 layers."""
    info = MambaStateBufferInfo(temporal=torch.zeros(2, slots, 4, 8, dtype=torch.float32),
                                conv=(torch.zeros(2, slots, 6, 3, dtype=torch.bfloat16),))
    return MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu", layout=layout)


def set_ranks(rank: int, world: int) -> None:
    """What SGLang's launcher publishes for the pools and the controller to
    read (the DSA pool and HiCacheController ask for the DCP width)."""
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(tp_rank=rank, tp_size=world, pp_rank=0, pp_size=1, attn_dcp_size=1,
                                        attn_dcp_rank=0)


def dsa_pools(layout, page_size=64):
    """DeepSeek sparse attention's pools as SGLang's hybrid assembler makes
    them: the MLA host pool (the KV anchor) of a DSA device pool (64-token
    pages) and its indexer host pool, which reuses the anchor's host
    indices. Needs the parallel ranks set (set_ranks)."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl

    dev = DSATokenToKVPool(size=TOKENS, page_size=page_size, kv_lora_rank=LORA, dtype=torch.bfloat16,
                           qk_rope_head_dim=ROPE, layer_num=LAYERS, device="cpu", index_head_dim=128,
                           enable_memory_saver=False, kv_cache_dim=LORA + ROPE)
    kv = MLATokenToKVPoolHost(dev._mla_buffer_info(), 2.0, 0, page_size, layout, pin_memory=False, device="cpu",
                              device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS,
                              target_layer_num=LAYERS)
    return kv, DSAIndexerPoolHost(make_dsa_indexer_pool_decl(dev), kv, pin_memory=False, device="cpu")


def page_tokens(seed, pages, page_size=PS):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 30000, (pages * page_size,), generator=g).tolist()


def page_hashes(seed, pages):
    """SGLang's storage keys of `pages` pages of random tokens."""
    return get_storage_hash_str(page_tokens(seed, pages), None, page_size=PS)


def _raw_page(pool, index):
    """page_unified's page: the buffer's leading dimension, whose C order is
    the page's byte order (SGLang's get_data_page does not take it)."""
    return pool.kv_buffer[index // pool.page_size].view(torch.uint8)


def read_page(pool, index):
    if pool.layout == "page_unified":
        return _raw_page(pool, index).flatten().clone()
    return pool.get_data_page(index).contiguous().view(torch.uint8).flatten()


def write_page(pool, index, data):
    if pool.layout == "page_unified":
        _raw_page(pool, index).copy_(data.view(_raw_page(pool, index).shape))
        return
    page = pool.get_data_page(index)
    pool.set_from_flat_data_page(index, data.view(page.dtype))


def fill_pages(pool, n, seed, idx=None):
    """n host pages of random bytes, freshly allocated or at idx (a pool
    riding on another's pages): (host indices, each page's bytes as
    SGLang's get_data_page reads them)."""
    ps = pool.page_size
    idx = pool.alloc(n * ps) if idx is None else idx
    g = torch.Generator().manual_seed(seed)
    refs = []
    for i in range(n):
        nbytes = read_page(pool, int(idx[i * ps])).numel()
        data = torch.randint(1, 255, (nbytes,), dtype=torch.uint8, generator=g)
        write_page(pool, int(idx[i * ps]), data)
        refs.append(data)
    return idx, refs


def poisoned_pages(pool, n, idx=None):
    ps = pool.page_size
    idx = pool.alloc(n * ps) if idx is None else idx
    for i in range(n):
        nbytes = read_page(pool, int(idx[i * ps])).numel()
        write_page(pool, int(idx[i * ps]), torch.full((nbytes,), 0xA5, dtype=torch.uint8))
    return idx


def page_bytes(pool, idx, i):
    return read_page(pool, int(idx[i * pool.page_size]))
