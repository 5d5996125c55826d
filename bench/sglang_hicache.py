# SPDX-License-Identifier: Apache-2.0
"""SGLang's HiCacheController on the CPU, its backup and prefetch threads
moving pages between its host pool and storage: kvferry's backend
(`dynamic`, zero-copy) against SGLang's own file backend (`file`,
HiCacheFile), in one run, on one directory's file system.

    KVFERRY_LIBRARY=build/libkvferry.so ~/.cache/kvferry/vllm-venv/bin/python \\
        bench/sglang_hicache.py [DIR] [--pages N] [--rounds R]

A page is 32 tokens of 16 layers, 8 KV heads of 128 (bf16, K and V:
2 MiB, an 8B model's page at a quarter of its layers). Each round backs up
N pages (write_storage until the backup thread's ack) and prefetches them
into other host pages (prefetch, the hit query, the I/O thread's load
until its last ack) into host pages poisoned beforehand, bytes checked; the file backend's directory and
kvferry's namespace are emptied between rounds, so every backup writes.
The page cache is not dropped: prefetches read what was just written.
Prints one line per backend: median seconds and GB/s of backup and of
prefetch."""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "python"), os.path.join(HERE, "..", "python", "tests")]

import torch  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

import sglang_controller_main as run  # noqa: E402
from sglang_pools import fill_pages, page_bytes, page_tokens, poisoned_pages, set_ranks  # noqa: E402

from kvferry.integrations._serving import string_key  # noqa: E402

PS, LAYERS, HEADS, HEAD = 32, 16, 8, 128


def controller(backend, pages, root):
    tokens = pages * PS
    dev = MHATokenToKVPool(size=tokens, page_size=PS, dtype=torch.bfloat16, head_num=HEADS, head_dim=HEAD,
                           layer_num=LAYERS, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    host = MHATokenToKVPoolHost(dev._mha_buffer_info(), 2.0, 0, PS, "page_first", pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=LAYERS)
    alloc = PagedTokenToKVPoolAllocator(tokens, PS, torch.bfloat16, "cpu", dev, False)
    if backend == "kvferry":
        cfg = dict(backend_name="kvferry", module_path="kvferry.integrations.sglang", class_name="KvferryStorage",
                   interface_v1=1, file_dir=os.path.join(root, "kvferry"), disk_blocks=4 * pages, namespace="bench")
        kind = "dynamic"
    else:
        cfg = dict(file_storage_path=os.path.join(root, "file"))
        kind = "file"
    cc = HiCacheController(alloc, host, PS, None, threading.Event(), storage_backend=kind, model_name="bench",
                           storage_backend_extra_config=cfg)
    return cc, host


def one_round(cc, host, pages, r):
    tokens = page_tokens(1000 + r, pages, PS)
    idx, refs = fill_pages(host, pages, 2000 + r)
    dst = poisoned_pages(host, pages)
    t0 = time.perf_counter()
    stored = run.backup(cc, idx, tokens)
    t1 = time.perf_counter()
    found, loaded, dst = run.prefetch(cc, host, f"bench{r}", tokens, dst=dst)
    t2 = time.perf_counter()
    assert stored == found == loaded == pages * PS, (stored, found, loaded)
    assert all(torch.equal(page_bytes(host, dst, i), refs[i]) for i in range(pages))
    host.free(idx)
    host.free(dst)
    return t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default=None)
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    set_ranks(0, 1)
    root = tempfile.mkdtemp(prefix="sglang-bench-", dir=a.dir)
    page_bytes_ = PS * LAYERS * 2 * HEADS * HEAD * 2
    print(f"# {a.pages} pages of {page_bytes_ >> 20} MiB, {a.rounds} rounds, {root}")
    try:
        for backend in ("file", "kvferry"):
            cc, host = controller(backend, a.pages, root)
            times = []
            try:
                for r in range(a.rounds):
                    times.append(one_round(cc, host, a.pages, r))
                    if backend == "file":
                        cc.storage_backend.clear()
                    else:
                        hashes = get_storage_hash_str(page_tokens(1000 + r, a.pages, PS), None, page_size=PS)
                        cc.storage_backend.cache.remove([string_key(h) for h in hashes])
            finally:
                cc.detach_storage_backend()
            gb = a.pages * page_bytes_ / 1e9
            b = statistics.median(t[0] for t in times)
            p = statistics.median(t[1] for t in times)
            print(f"{backend:8s} backup {b:.3f} s {gb / b:.2f} GB/s   prefetch {p:.3f} s {gb / p:.2f} GB/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
