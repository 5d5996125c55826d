# SPDX-License-Identifier: Apache-2.0
"""How a serving engine wires kvferry into its KV-cache offload path.

The engine owns a paged KV cache (here: per-layer K and V arrays of
[blocks][tokens][heads][head], NumPy on the host backend; torch CUDA tensors
are registered the same way on a GPU). When the block allocator evicts a
block that holds a reusable prefix, kvferry copies it to a host slot (and,
for colder blocks, to a file). When a new request's prefix hashes to a
stored block, kvferry brings it back into a free GPU block. A move that
fails says the block is lost: the scheduler recomputes that prefix, never
serves half-moved data.

    KVFERRY_LIBRARY=build/libkvferry.so python3 python/examples/serving_offload.py
"""

import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a source checkout
import kvferry as kvf  # noqa: E402

LAYERS, GPU_BLOCKS, HOST_SLOTS, TOKENS, HEADS, HEAD = 4, 16, 8, 16, 4, 32


class OffloadManager:
    """The piece of the engine between the block allocator and kvferry."""

    def __init__(self, kv_cache, file_dir):
        # NumPy KV arrays: the host backend. With torch CUDA tensors use
        # Backend.CUDA (DEVICE primaries, kvferry-allocated pinned host slots).
        self.kv = kvf.Engine(backend=kvf.Backend.HOST, file_dir=file_dir, file_namespace="model-rank0")
        geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=HEADS, tokens_per_block=TOKENS, head_size=HEAD,
                            dtype=kvf.Dtype.FP16, order=kvf.Order.TOKEN_MAJOR)
        for k, v in kv_cache:  # one pool per layer's K and per layer's V: a block moves all of them
            self.kv.add_pool(geom, primary=k, secondary=HOST_SLOTS)
            self.kv.add_pool(geom, primary=v, secondary=HOST_SLOTS)
        self.host = {}  # prefix hash -> host slot
        self.free_host = list(range(HOST_SLOTS))
        self.on_disk = set()  # prefix hashes stored as files (key = hash)
        self.pending = []  # tickets of offloads in flight

    def evict(self, evictions, stream=None):
        """The allocator frees these (gpu_block, prefix_hash) pairs: keep copies."""
        to_host, to_file = [], []
        for block, h in evictions:
            if self.free_host:
                slot = self.free_host.pop()
                self.host[h] = slot
                to_host.append((block, slot))
            else:  # host tier full: this one goes to disk
                to_file.append((block, h))
                self.on_disk.add(h)
        if to_host:
            self.pending.append(self.kv.offload(kvf.Tier.HOST, to_host))
        if to_file:
            self.pending.append(self.kv.offload(kvf.Tier.DISK, to_file))
        # The compute stream may now reuse the evicted GPU blocks: kvferry
        # orders it after the copies (on the host backend this waits for them).
        self.kv.sync_stream(stream)

    def reap(self):
        """Forget stored copies whose offload failed (called once per step)."""
        still = []
        for t in self.pending:
            st = t.poll()
            if st is None:
                still.append(t)
            elif not t.ok:
                print(f"offload ticket {t.id}: moves {t.failed()} failed; those prefixes will be recomputed")
        self.pending = still

    def load_prefix(self, hits):
        """A request's prefix blocks were found: (prefix_hash, free_gpu_block).
        Returns the GPU blocks that hold valid KV; the rest must be recomputed."""
        from_host = [(self.host[h], b) for h, b in hits if h in self.host]
        from_file = [(h, b) for h, b in hits if h not in self.host and h in self.on_disk]
        good = []
        for tier, moves in ((kvf.Tier.HOST, from_host), (kvf.Tier.DISK, from_file)):
            if not moves:
                continue
            statuses = self.kv.onboard(tier, moves).wait()  # on a GPU: sync_stream(compute) instead of waiting
            for (src, dst), st in zip(moves, statuses):
                if st == kvf.Status.OK:
                    good.append(dst)
                else:  # LOST / CORRUPT / NOT_FOUND ...: the block is gone, never half-valid
                    print(f"block {src:#x} -> gpu {dst}: {st.name}; recompute")
        return good

    def close(self):
        self.kv.close()


def prefix_hash(tokens):
    return int.from_bytes(hashlib.blake2b(bytes(tokens), digest_size=8).digest(), "little") & (2**63 - 1)


def main():
    rng = np.random.default_rng(0)
    kv_cache = [(rng.standard_normal((GPU_BLOCKS, TOKENS, HEADS, HEAD)).astype(np.float16),
                 rng.standard_normal((GPU_BLOCKS, TOKENS, HEADS, HEAD)).astype(np.float16))
                for _ in range(LAYERS)]
    with tempfile.TemporaryDirectory() as d:
        m = OffloadManager(kv_cache, d)
        # 12 blocks of finished requests are evicted: 8 fit the host tier, 4 go to disk
        hashes = [prefix_hash([i] * TOKENS) for i in range(12)]
        saved = {h: [kv_cache[0][0][b].copy()] for b, h in enumerate(hashes)}
        m.evict(list(enumerate(hashes)))
        for k, v in kv_cache:  # the GPU blocks get reused by other requests
            k[:12] = 0
            v[:12] = 0
        m.reap()
        # a new request shares the prefixes of blocks 2 (host) and 10 (disk), plus one never stored
        hits = [(hashes[2], 13), (hashes[10], 14)]
        good = m.load_prefix(hits)
        for (h, b) in hits:
            assert b in good and np.array_equal(kv_cache[0][0][b], saved[h][0])
        # a corrupted file on disk: reported, and the scheduler recomputes
        path = Path(d) / "model-rank0" / f"{hashes[11]:032x}.kvf"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 1
        path.write_bytes(bytes(raw))
        assert m.load_prefix([(hashes[11], 15)]) == []
        m.close()
    print(f"kvferry {kvf.version()}: evicted 12 blocks, 2 prefix hits restored byte-exact, 1 corrupt block recomputed")


if __name__ == "__main__":
    main()
