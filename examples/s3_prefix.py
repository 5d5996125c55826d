#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A prompt prefix stored in S3 by one engine and served to another.

One process (the "prefill" engine) computes a system prompt's KV blocks and
puts them in its cache, whose remote tier is an s3:// bucket written
through; a second process (the "decode" engine, another machine in a real
fleet) with a cache reading that bucket finds the same prefix by its keys
and gets the blocks, byte for byte, instead of recomputing them.

    KVFERRY_LIBRARY=build/libkvferry.so PYTHONPATH=python python3 examples/s3_prefix.py [URL]

URL: s3://ACCESS:SECRET@BUCKET/PREFIX?endpoint=...; without it a SeaweedFS
is started on loopback for the run (scripts/seaweedfs.py).
"""
import os
import subprocess
import sys

import numpy as np
import kvferry as kvf

GEOMETRY = dict(layers=4, kv_factor=2, kv_heads=4, tokens_per_block=16, head_size=64)
PROMPT = list(range(1000, 1000 + 16 * 6))  # a system prompt: 6 blocks of tokens


def compute(key, nbytes):
    """What "computing" a block's KV means here: bytes that follow from its key."""
    return np.random.default_rng(key).integers(0, 256, nbytes, dtype=np.uint8)


def engine_and_cache(url, remote):
    eng = kvf.Engine(backend="host", file_namespace="s3-prefix", remote_url=url)
    pool = eng.add_pool(kvf.Geometry(**GEOMETRY), primary=8, secondary=8)
    return eng, pool, kvf.Cache(eng, host_blocks=8, remote=remote)


def prefill(url):
    eng, pool, cache = engine_and_cache(url, "write_through")
    keys = kvf.key_chain_all(PROMPT, GEOMETRY["tokens_per_block"])
    for slot, key in enumerate(keys):
        eng.slot_view(0, slot).view(np.uint8).reshape(-1)[:] = compute(key, pool.geometry.block_bytes)
    cache.put(keys, list(range(len(keys)))).wait(check=True)
    print(f"prefill: {len(keys)} blocks of the prompt stored (host, and {url.split('@')[-1]})")
    cache.close()
    eng.close()


def decode(url):
    eng, pool, cache = engine_and_cache(url, "read")
    keys = kvf.key_chain_all(PROMPT, GEOMETRY["tokens_per_block"])
    hits, tiers = cache.lookup(keys)
    print(f"decode: {hits} of {len(keys)} blocks found, in {sorted({t.name for t in tiers})}")
    cache.get(keys[:hits], list(range(hits))).wait(check=True)
    for slot, key in enumerate(keys[:hits]):
        if not np.array_equal(eng.slot_view(0, slot).view(np.uint8).reshape(-1),
                              compute(key, pool.geometry.block_bytes)):
            sys.exit(f"decode: block {slot} differs")
    print(f"decode: {hits} blocks served from S3, byte for byte; no recompute")
    cache.close()
    eng.close()
    return 0 if hits == len(keys) else 1


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--decode":
        sys.exit(decode(sys.argv[2]))
    if len(sys.argv) > 1:
        url = sys.argv[1]
        prefill(url)
        sys.exit(subprocess.call([sys.executable, __file__, "--decode", url]))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from seaweedfs import SeaweedFS
    with SeaweedFS() as s3:
        url = s3.url("fleet")
        prefill(url)
        rc = subprocess.call([sys.executable, __file__, "--decode", url])
    sys.exit(rc)


if __name__ == "__main__":
    main()
