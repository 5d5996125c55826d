# SPDX-License-Identifier: Apache-2.0
"""The planner on the CUDA backend with torch: per-layer K and V tensors
(one pool each) cached in the host and disk tiers; the engine learns the
tiers' costs from its own gets, the plan counts layer-wise arrival for the
host tier only, is followed pool by pool with stream waits, and brings the
planned blocks back byte for byte. Skipped unless torch with CUDA is
importable and libkvferry was built with CUDA and sees a GPU."""

import time

import kvferry as kvf
from conftest import torch_cuda

torch = torch_cuda()

LAYERS, BLOCKS, TOKENS, HEADS, HEAD = 4, 96, 16, 8, 128


def test_plan_followed_layer_by_layer(tmp_path):
    g = torch.Generator(device="cuda").manual_seed(5)
    kv = [(torch.randn(BLOCKS, TOKENS, HEADS, HEAD, device="cuda", dtype=torch.bfloat16, generator=g),
           torch.randn(BLOCKS, TOKENS, HEADS, HEAD, device="cuda", dtype=torch.bfloat16, generator=g))
          for _ in range(LAYERS)]
    geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=HEADS, tokens_per_block=TOKENS, head_size=HEAD,
                        dtype=kvf.Dtype.BF16, order=kvf.Order.TOKEN_MAJOR)
    with kvf.Engine(backend=kvf.Backend.CUDA, file_dir=str(tmp_path), file_namespace="gpu-plan") as e:
        for k, v in kv:
            e.add_pool(geom, primary=k, secondary=16)
            e.add_pool(geom, primary=v, secondary=16)
        with kvf.Cache(e, host_blocks=16, disk_blocks=64) as cache:
            keys = [0x7700 + i for i in range(40)]
            src = list(range(40))
            torch.cuda.synchronize()
            # stored last to first: the leading 16 stay in the host tier
            for i in reversed(src):
                cache.put([keys[i]], [i]).wait(check=True)
            ref = [(k[:40].clone(), v[:40].clone()) for k, v in kv]
            hits, tiers = cache.lookup(keys)
            assert hits == 40 and tiers[:16] == [kvf.Tier.HOST] * 16
            # the engine learns both tiers from gets, and times them here too
            dst = list(range(48, 88))
            for _ in range(3):
                t0 = time.perf_counter()
                cache.get(keys[:16], dst[:16]).wait(check=True)
                host_s = time.perf_counter() - t0
                cache.get(keys[16:], dst[16:]).wait(check=True)
            assert e.layerwise_tiers() == (kvf.Tier.HOST, kvf.Tier.GPU)
            c = e.costs()
            assert c[kvf.Tier.HOST].observed >= 3 and c[kvf.Tier.DISK].observed >= 3
            predicted = c[kvf.Tier.HOST].seconds(16 * 2 * LAYERS * TOKENS * HEADS * HEAD * 2)
            print(f"host get of 16 blocks: {host_s * 1e3:.3f} ms, predicted {predicted * 1e3:.3f} ms")
            assert predicted < 10 * host_s and host_s < 10 * predicted
            # a prefill of 100 us a token: loading pays for the host blocks; a
            # disk held far too slow to load, so that the front shape (which
            # could load the disk blocks behind a computed front) cannot win
            # on this machine's disk speed and the plan is layer by layer
            e.set_tier_cost("disk", 10.0, 1e6, hold=True)
            cache.set_prefill_cost(lambda nw, pre: 1e-4 * nw, layers=LAYERS, overlap=True)
            p = cache.plan(keys, 41 * TOKENS)
            assert p.shape == "leading" and p.overlap and p.load["host"] == 16 and p.recompute_hits["disk"] == 24
            same = kvf.plan_compute(tiers, 2 * LAYERS * TOKENS * HEADS * HEAD * 2, TOKENS, 41 * TOKENS,
                                    {t: (x.latency_s, x.bytes_per_s) for t, x in e.costs().items()},
                                    lambda nw, pre: 1e-4 * nw, layers=LAYERS, overlap=True,
                                    layerwise_tiers=e.layerwise_tiers())
            assert same.load_blocks == p.load_blocks and abs(same.ttft_s - p.ttft_s) <= 1e-9 * p.ttft_s
            for k, v in kv:
                k[dst] = float("nan")
                v[dst] = -3.0
            torch.cuda.synchronize()
            n = p.load_blocks
            t = cache.get(keys[:n], dst[:n], pools=list(range(2 * LAYERS)))
            stream = torch.cuda.current_stream()
            for layer, ((k, v), (rk, rv)) in enumerate(zip(kv, ref)):
                t.stream_wait_pool(2 * layer, stream)
                t.stream_wait_pool(2 * layer + 1, stream)
                assert torch.equal(k[dst[:n]].view(torch.int16), rk[:n].view(torch.int16))
                assert torch.equal(v[dst[:n]].view(torch.int16), rv[:n].view(torch.int16))
            t.wait(check=True)
