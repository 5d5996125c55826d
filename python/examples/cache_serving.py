# SPDX-License-Identifier: Apache-2.0
"""How a serving engine wires kvferry.Cache into its prefix cache.

A paged-attention engine (vLLM, SGLang) keeps a prefix cache in its own GPU
KV pool: blocks are named by a hash of their tokens and everything before
them, and a freed block stays reusable until the allocator needs it back.
kvferry.Cache extends that pool downwards, to host memory and disk:

  * evict -> put: when the allocator takes back a block that still holds a
    reusable prefix, the engine hands it to the cache (cache.put) instead of
    throwing it away;
  * new request -> lookup + get: the blocks of a request's prefix that are
    no longer on the GPU are looked up (cache.lookup) and copied into fresh
    GPU blocks (cache.get); only what follows is prefilled.

Keys are kvferry.key_chain_all(tokens, block_size, salt): the same chained
hash for every process, so several engines (and restarts) share one disk
tier. Here the KV cache is NumPy (the host backend); with torch CUDA tensors
the same code runs with Backend.CUDA, registering each layer's K and V
tensors as pools. The "model" writes bytes derived from each block's key, so
the example checks every restored block byte for byte.

    KVFERRY_LIBRARY=build/libkvferry.so python3 python/examples/cache_serving.py
"""

import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a source checkout
import kvferry as kvf  # noqa: E402

LAYERS, GPU_BLOCKS, HOST_BLOCKS, BLOCK, HEADS, HEAD = 4, 32, 16, 16, 4, 32


def model_kv(key, shape):
    """What the model computes for a block: deterministic in its key."""
    rng = np.random.default_rng(key)
    return rng.standard_normal(shape).astype(np.float16)


class Engine:
    """The parts of a serving engine that touch its KV cache."""

    def __init__(self, file_dir):
        shape = (GPU_BLOCKS, BLOCK, HEADS, HEAD)  # vLLM's per-layer layout
        self.kv = [(np.zeros(shape, np.float16), np.zeros(shape, np.float16)) for _ in range(LAYERS)]
        self.kvf = kvf.Engine(backend=kvf.Backend.HOST, file_dir=file_dir, file_namespace="llama-rank0")
        geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=HEADS, tokens_per_block=BLOCK, head_size=HEAD,
                            dtype=kvf.Dtype.FP16, order=kvf.Order.TOKEN_MAJOR)
        for k, v in self.kv:  # a block is the same slot of every pool: one move carries all layers
            self.kvf.add_pool(geom, primary=k, secondary=HOST_BLOCKS)
            self.kvf.add_pool(geom, primary=v, secondary=HOST_BLOCKS)
        self.cache = kvf.Cache(self.kvf, host_blocks=HOST_BLOCKS, disk_blocks=1024, event_queue=4096)
        self.free = list(range(GPU_BLOCKS))
        self.on_gpu = OrderedDict()  # key -> GPU block of the engine's own prefix cache, LRU first
        self.counts = dict(gpu=0, host=0, disk=0, prefill=0)

    # -- the allocator ------------------------------------------------------
    def allocate(self, n, keep):
        """n free GPU blocks; evicts the least recently used cached ones,
        handing them to kvferry (evict -> put)."""
        victims = []
        while len(self.free) < n:
            key, block = next((kb for kb in self.on_gpu.items() if kb[0] not in keep), (None, None))
            if key is None:
                raise RuntimeError("GPU KV pool too small for this request")
            del self.on_gpu[key]
            victims.append((key, block))
            self.free.append(block)
        if victims:
            keys, blocks = zip(*victims)
            # the blocks are written again right after this: wait for the copies
            # (a GPU engine would call self.kvf.sync_stream(compute_stream) instead)
            self.cache.put(list(keys), list(blocks), priority=50).wait()
        return [self.free.pop() for _ in range(n)]

    # -- a request ----------------------------------------------------------
    def run(self, tokens, salt=0):
        keys = kvf.key_chain_all(tokens, BLOCK, salt)
        # 1. the prefix still on the GPU
        n_gpu = 0
        while n_gpu < len(keys) and keys[n_gpu] in self.on_gpu:
            self.on_gpu.move_to_end(keys[n_gpu])
            n_gpu += 1
        rest = keys[n_gpu:]
        # 2. what kvferry holds of the rest (host or disk), pinned until used
        hits, tiers = self.cache.lookup(rest)
        self.cache.pin(rest[:hits])
        blocks = self.allocate(len(rest), keep=set(keys[:n_gpu]))
        statuses = self.cache.get(rest[:hits], blocks[:hits]).wait() if hits else []
        self.cache.unpin(rest[:hits])
        # 3. prefill what was neither on the GPU nor restored
        for i, (key, block) in enumerate(zip(rest, blocks)):
            restored = i < hits and statuses[i] == kvf.Status.OK
            for layer, (k, v) in enumerate(self.kv):
                want_k = model_kv(key * 2 + layer * 1000, k.shape[1:])
                want_v = model_kv(key * 2 + 1 + layer * 1000, v.shape[1:])
                if restored:
                    assert np.array_equal(k[block].view(np.uint16), want_k.view(np.uint16)), f"block {key:#x}"
                    assert np.array_equal(v[block].view(np.uint16), want_v.view(np.uint16)), f"block {key:#x}"
                else:  # a miss, or a block kvferry reported lost: compute it
                    k[block], v[block] = want_k, want_v
            if restored:
                self.counts[tiers[i].name.lower()] += 1
            else:
                self.counts["prefill"] += 1
            old = self.on_gpu.pop(key, None)  # an older copy further down the request
            if old is not None:
                self.free.append(old)
            self.on_gpu[key] = block
        self.counts["gpu"] += n_gpu

    def close(self):
        self.cache.close()
        self.kvf.close()


def main():
    rng = np.random.default_rng(5)
    # two system prompts of 20 blocks each: a GPU pool of 32 blocks holds one,
    # so every switch evicts the other's blocks into kvferry
    prompts = [list(rng.integers(0, 32000, 20 * BLOCK)) for _ in range(2)]
    with tempfile.TemporaryDirectory() as d:
        eng = Engine(d)
        for turn in range(4):
            for chat in range(4):
                user = list(np.random.default_rng(chat * 100 + turn).integers(0, 32000, 4 * BLOCK))
                eng.run(prompts[chat % 2] + user)
        events = eng.cache.events()
        stats = eng.cache.stats()
        counts = dict(eng.counts)
        eng.close()
        # a restart: a fresh engine and cache find the disk tier again
        eng = Engine(d)
        on_disk = eng.cache.stats().blocks["disk"]
        eng.run(prompts[0])
        eng.run(prompts[1])
        restart = dict(eng.counts)
        eng.close()
    print(f"16 requests: {counts['gpu']} blocks reused on the GPU, {counts['host']} restored from host, "
          f"{counts['disk']} from disk, {counts['prefill']} prefilled")
    print(f"cache: hit rate {stats.hit_rate:.0%}, {len(events)} events "
          f"({sum(e.kind == kvf.EventKind.UPDATED for e in events)} blocks moved down to disk)")
    print(f"after a restart: {on_disk} blocks on disk; the two prompts: {restart['disk']} blocks restored, "
          f"{restart['prefill']} prefilled")
    assert counts["host"] > 0 and counts["disk"] > 0 and on_disk > 0
    print("every restored block byte-exact")


if __name__ == "__main__":
    main()
