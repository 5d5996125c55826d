# SPDX-License-Identifier: Apache-2.0
"""The transformers adapter on the CUDA backend: a tiny bf16 Llama on the
GPU, its prefix served from the host and disk tiers into CUDA pools, bit
for bit, layer-wise (each layer's attention waits on the GPU for its own
pools) and whole. Skipped unless torch has CUDA, transformers is importable
and libkvferry has a usable CUDA backend."""

import pytest
from conftest import torch_cuda

torch = torch_cuda()
pytest.importorskip("transformers")

from kvferry.integrations.transformers import KVFerryPrefixCache  # noqa: E402
from test_transformers import TPB, forward, assert_prefix_equal, poison, prompt, tiny_model  # noqa: E402


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_prefix_served_byte_exact_on_gpu(tmp_path, tier):
    model = tiny_model(dtype=torch.bfloat16, device="cuda")
    opts = dict(host_blocks=64) if tier == "host" else dict(disk_dir=tmp_path, disk_blocks=64)
    first = prompt(1, 8 * TPB + 5).cuda()
    second = torch.cat([first[:, :6 * TPB], prompt(2, 19).cuda()], dim=1)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, max_tokens=1024,
                                                        **opts) as kv:
        assert kv.cuda and kv.engine.backend.name == "CUDA"
        out1 = kv.forward(model, first)
        runs = {}
        for mode in ("layerwise", "whole"):
            poison(kv)
            past = kv.prepare(second, mode=mode)
            assert past.cached_tokens == 6 * TPB
            out = forward(model, second[:, past.cached_tokens:], past)
            past.finish()
            torch.cuda.synchronize()
            assert_prefix_equal(past, out1.past_key_values, 6 * TPB)
            runs[mode] = (past, out)
        assert_prefix_equal(runs["layerwise"][0], runs["whole"][0], second.shape[1])
        full = model(second)
        torch.testing.assert_close(runs["layerwise"][1].logits[0, -1].float(), full.logits[0, -1].float(),
                                   rtol=0.05, atol=0.05)
        assert kv.cache.stats().failures == 0


def test_layerwise_on_a_stream_of_its_own():
    """The model on a non-default stream: each layer's wait goes straight to
    that stream (on the default stream it goes through the adapter's own)."""
    model = tiny_model(dtype=torch.bfloat16, device="cuda")
    first = prompt(3, 6 * TPB + 7).cuda()
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, max_tokens=1024,
                                                        host_blocks=64) as kv:
        out1 = kv.forward(model, first)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            poison(kv)
            past = kv.prepare(first, mode="layerwise")
            assert past.cached_tokens == 6 * TPB
            forward(model, first[:, past.cached_tokens:], past)
            past.finish()
        stream.synchronize()
        assert_prefix_equal(past, out1.past_key_values, 6 * TPB)


@pytest.mark.parametrize("tier", ["host", "disk"])
@pytest.mark.parametrize("first,load", [(0, 6), (2, 6)])
def test_plan_shapes_on_gpu(tmp_path, tier, first, load):
    """Mode "plan" on CUDA pools, both shapes as given: the loaded blocks bit
    for bit, the front's slots untouched, the logits a recompute's."""
    from test_transformers_plan import DEAR, GivenPlan

    model = tiny_model(dtype=torch.bfloat16, device="cuda")
    opts = dict(host_blocks=64) if tier == "host" else dict(disk_dir=tmp_path, disk_blocks=64)
    ids = prompt(4, 7 * TPB + 3).cuda()
    with torch.no_grad(), GivenPlan.from_model(model, tokens_per_block=TPB, max_tokens=1024, prefill_cost=DEAR,
                                               **opts) as kv:
        ref = kv.forward(model, ids, mode="recompute")
        kv.given = (first, load)
        poison(kv)
        past = kv.prepare(ids, "plan", model=model)
        assert past.cached_tokens == load * TPB and past.front_blocks == first
        out = forward(model, ids[:, past.cached_tokens:], past)
        past.finish()
        torch.cuda.synchronize()
        for k in kv.k_pools:
            assert torch.isnan(k[:first]).all() and not torch.isnan(k[first:load]).any()
        lo, hi = first * TPB, load * TPB
        for a, b in zip(past.layers, ref.past_key_values.layers):
            assert torch.equal(a.keys[..., lo:hi, :].view(torch.int16), b.keys[..., lo:hi, :].view(torch.int16))
            assert torch.equal(a.values[..., lo:hi, :].view(torch.int16),
                               b.values[..., lo:hi, :].view(torch.int16))
        torch.testing.assert_close(out.logits[0, -1].float(), ref.logits[0, -1].float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("tier", ["host", "disk"])
@pytest.mark.parametrize("mode", ["layerwise", "whole"])
def test_sliding_layers_on_gpu(tmp_path, tier, mode):
    """A Gemma-3-style model (sliding-window layers beside a full one) on
    CUDA pools: each layer's stream waits on the get that moves its pools
    (a sliding layer's window blocks come in a get of their own), greedy
    outputs identical with and without kvferry, served from the tier, a
    sliding layer's slots outside its window untouched."""
    from test_transformers_sliding import WINDOW, gemma3

    model = gemma3().to(device="cuda")  # float32: greedy tokens compared exactly
    opts = dict(host_blocks=64) if tier == "host" else dict(disk_dir=tmp_path, disk_blocks=64)
    ids = prompt(5, 7 * TPB + 5).cuda()
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, max_tokens=1024, salt="g",
                                                        mode=mode, **opts) as kv:
        ref = model.generate(ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(kv.generate(model, ids, max_new_tokens=8, do_sample=False), ref)
        kv.sync()
        poison(kv)
        assert torch.equal(kv.generate(model, ids, max_new_tokens=8, do_sample=False), ref)
        torch.cuda.synchronize()
        assert kv.cache.stats().hits[tier] >= 7 and kv.cache.stats().failures == 0
        lo = (7 * TPB - (WINDOW - 1)) // TPB
        for i in range(kv.num_layers):
            if kv.sliding[i]:
                assert torch.isnan(kv.k_pools[i][:lo]).all() and not torch.isnan(kv.k_pools[i][lo:7]).any()
            else:
                assert not torch.isnan(kv.k_pools[i][:7]).any()
