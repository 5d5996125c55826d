#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Put and get of KV blocks in S3: kvferry's remote tier on s3:// (an
engine's offload / onboard, every block checked by its CRC-32C on the way
back and compared byte for byte here once) beside boto3's transfer manager
moving the same bytes as the same number of objects, in the same run,
against one SeaweedFS on loopback that this script starts
(scripts/seaweedfs.py). Prints GB/s (median of the rounds, and the spread)
and kvferry's ratio to boto3; --json writes the raw rounds.

    KVFERRY_LIBRARY=build/libkvferry.so PYTHONPATH=python \\
        python3 bench/s3_bench.py --sizes 256K,2M --batch-mb 64 --rounds 5
"""
import argparse
import io
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from seaweedfs import SeaweedFS  # noqa: E402

import numpy as np  # noqa: E402
import kvferry as kvf  # noqa: E402


def size_of(text):
    mult = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def kvferry_rounds(s3, size, n, rounds, conns):
    """GB/s of each round's offload (put) and onboard (get) of n blocks,
    yielded round by round."""
    tokens = size // (2 * 2 * 8 * 128 * 2)  # layers 2, k and v, 8 heads of 128 fp16
    g = kvf.Geometry(layers=2, kv_factor=2, kv_heads=8, tokens_per_block=tokens, head_size=128)
    assert g.block_bytes == size
    eng = kvf.Engine(backend="host", remote_url=s3.url(f"bench-kvf-{size}", conns),
                     file_namespace="bench", remote_timeout_ms=10000)
    eng.add_pool(g, primary=n)
    rng = np.random.default_rng(size)
    want = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
    puts, gets = [], []
    for r in range(rounds):
        for i in range(n):
            eng.slot_view(0, i).view(np.uint8).reshape(-1)[:] = want[i]
        moves = [(i, (r << 32) | i) for i in range(n)]
        t0 = time.perf_counter()
        eng.offload(kvf.Tier.REMOTE, moves).wait(check=True)
        puts.append(n * size / (time.perf_counter() - t0) / 1e9)
        for i in range(n):
            eng.slot_view(0, i).view(np.uint8).reshape(-1)[:] = 0xC3
        t0 = time.perf_counter()
        eng.onboard(kvf.Tier.REMOTE, [(k, s) for s, k in moves]).wait(check=True)
        gets.append(n * size / (time.perf_counter() - t0) / 1e9)
        if r == 0:
            for i in range(n):
                if not np.array_equal(eng.slot_view(0, i).view(np.uint8).reshape(-1), want[i]):
                    sys.exit(f"kvferry: block {i} of {size} bytes differs after the round trip")
        yield puts[-1], gets[-1]
    eng.close()


def boto3_rounds(s3, size, n, rounds, conns):
    """The same bytes as n objects through boto3's transfer manager, round
    by round."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    client = s3.boto3(conns=conns)
    # one request per object, as kvferry sends: a block is below the threshold
    cfg = TransferConfig(max_concurrency=conns, multipart_threshold=64 << 20, use_threads=True)
    rng = np.random.default_rng(size + 1)
    data = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(n)]
    puts, gets = [], []
    with create_transfer_manager(client, cfg) as tm:
        for r in range(rounds):
            keys = [f"bench-boto3-{size}/{r}/{i:08x}" for i in range(n)]
            t0 = time.perf_counter()
            for f in [tm.upload(io.BytesIO(d), s3.bucket, k) for d, k in zip(data, keys)]:
                f.result()
            puts.append(n * size / (time.perf_counter() - t0) / 1e9)
            outs = [io.BytesIO() for _ in range(n)]
            t0 = time.perf_counter()
            for f in [tm.download(s3.bucket, k, o) for k, o in zip(keys, outs)]:
                f.result()
            gets.append(n * size / (time.perf_counter() - t0) / 1e9)
            if r == 0 and any(o.getvalue() != d for o, d in zip(outs, data)):
                sys.exit("boto3: an object differs after the round trip")
            yield puts[-1], gets[-1]


def spread(v):
    return f"{statistics.median(v):6.3f} GB/s [{min(v):.3f}-{max(v):.3f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256K,2M")
    ap.add_argument("--batch-mb", type=int, default=64, help="bytes per batch, in MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conns", type=int, default=16, help="connections of each client")
    ap.add_argument("--json", help="write the rounds here")
    a = ap.parse_args()
    out = {"machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
           "conns": a.conns, "batch_bytes": a.batch_mb << 20, "rows": []}
    print(f"# {out['machine']}; {a.conns} connections each; {a.batch_mb} MiB per batch; "
          f"median of {a.rounds} rounds [min-max], the clients' rounds alternating")
    with SeaweedFS() as s3:
        print(f"# SeaweedFS {s3.weed} at {s3.endpoint}")
        for size in (size_of(s) for s in a.sizes.split(",")):
            n = max(1, (a.batch_mb << 20) // size)
            # the two clients' rounds alternate, so that both meet the same
            # load of a shared machine
            kp, kg, bp, bg = [], [], [], []
            for (p1, g1), (p2, g2) in zip(kvferry_rounds(s3, size, n, a.rounds, a.conns),
                                          boto3_rounds(s3, size, n, a.rounds, a.conns)):
                kp.append(p1), kg.append(g1), bp.append(p2), bg.append(g2)
            for op, k, b in (("put", kp, bp), ("get", kg, bg)):
                ratio = statistics.median(k) / statistics.median(b)
                print(f"{size >> 10:5d} KiB x {n:4d} {op}: kvferry {spread(k)}   "
                      f"boto3 {spread(b)}   ratio {ratio:.2f}x")
                out["rows"].append({"block_bytes": size, "blocks": n, "op": op, "kvferry_gbps": k,
                                    "boto3_gbps": b, "ratio_of_medians": ratio})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
