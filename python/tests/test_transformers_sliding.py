# SPDX-License-Identifier: Apache-2.0
"""The transformers adapter with sliding-window layers beside full ones
(Gemma-3 and GPT-OSS style alternation), tiny random models on the CPU
(host backend): greedy outputs identical with and without kvferry, the
prefix served from kvferry (its stats say so), a sliding layer reading only
the blocks of its window (its other slots stay poisoned), a multi-turn
follow-up hitting on the previous answer, and a Cache whose sliding layers
kept their window only never stored in part. Skipped without torch and
transformers."""

import logging

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_transformers import TPB, poison, prompt  # noqa: E402

from kvferry.integrations.transformers import KVFerryPrefixCache  # noqa: E402

WINDOW = 24  # not a multiple of a block: the window starts inside one


def gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                        "sliding_attention"], max_position_embeddings=1024)
    return Gemma3ForCausalLM(cfg).eval()


def gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    cfg = GptOssConfig(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                       num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=1024)
    return GptOssForCausalLM(cfg).eval()


MODELS = {"gemma3": gemma3, "gpt_oss": gpt_oss}


def greedy(model, ids, n=8):
    return model.generate(ids, max_new_tokens=n, do_sample=False)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("mode", ["layerwise", "whole"])
def test_sliding_layers_served(name, mode):
    model = MODELS[name]()
    assert any(model.config.layer_types[i] == "sliding_attention" for i in range(model.config.num_hidden_layers))
    ids = prompt(7, 7 * TPB + 5)
    with torch.no_grad():
        ref = greedy(model, ids)
        with KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, max_tokens=512, host_blocks=64,
                                           salt=name, mode=mode) as kv:
            assert kv.window == WINDOW and any(kv.sliding) and not all(kv.sliding)
            first = kv.generate(model, ids, max_new_tokens=8, do_sample=False)
            assert torch.equal(first, ref)
            kv.sync()
            assert kv.cache.stats().hits["host"] == 0
            # served: 7 blocks of the prompt, a sliding layer's from the window's blocks only
            poison(kv)
            again = kv.generate(model, ids, max_new_tokens=8, do_sample=False)
            assert torch.equal(again, ref)
            assert kv.cache.stats().hits["host"] >= 7
            cached = 7 * TPB
            lo = (cached - (WINDOW - 1)) // TPB  # the first block a sliding layer reads
            for i in range(kv.num_layers):
                for pool in (kv.k_pools[i], kv.v_pools[i]):
                    if kv.sliding[i]:
                        assert torch.isnan(pool[:lo]).all(), f"layer {i}: a block outside the window loaded"
                        assert not torch.isnan(pool[lo:7]).any(), f"layer {i}"
                    else:
                        assert not torch.isnan(pool[:7]).any(), f"layer {i}"
            # a follow-up turn: the previous answer's whole blocks are cached too
            turn = torch.cat([ref, prompt(8, 2 * TPB)], dim=1)
            want = greedy(model, turn)
            kv.sync()
            hits_before = kv.cache.stats().hits["host"]
            poison(kv)
            got = kv.generate(model, turn, max_new_tokens=8, do_sample=False)
            assert torch.equal(got, want)
            assert kv.cache.stats().hits["host"] - hits_before >= ref.shape[1] // TPB
            assert kv.cache.stats().failures == 0


def test_sliding_prefix_is_the_model_s_own():
    """The K/V a sliding layer takes from the pools is what the model
    computed for those tokens, bit for bit, and the logits after a served
    prefix match a full forward's."""
    model = gemma3()
    ids = prompt(9, 5 * TPB + 3)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, max_tokens=512,
                                                        host_blocks=64, salt="bits") as kv:
        ref = kv.forward(model, ids, mode="recompute")
        kv.sync()
        poison(kv)
        past = kv.prepare(ids)
        assert past.cached_tokens == 5 * TPB
        out = model(ids[:, past.cached_tokens:], past_key_values=past, use_cache=True)
        past.finish()
        torch.testing.assert_close(out.logits[0, -1], ref.logits[0, -1], rtol=1e-4, atol=1e-4)
        assert past.get_seq_length() == ids.shape[1]
        for i, layer in enumerate(past.layers):
            first = layer.get_seq_length() - layer.keys.shape[-2]
            assert first == (5 * TPB - (WINDOW - 1) if kv.sliding[i] else 0), i
            want = ref.past_key_values.layers[i]
            held = want.get_seq_length() - want.keys.shape[-2]  # transformers' own sliding layer: its window
            lo = max(first, held)
            a, b = layer.keys[..., lo - first:5 * TPB - first, :], want.keys[..., lo - held:5 * TPB - held, :]
            assert a.shape == b.shape and torch.equal(a, b), f"layer {i}"


def test_a_window_only_cache_is_not_stored(caplog):
    """A Cache of transformers' own (its sliding layers keep their window
    only) cannot give every layer of the prompt's blocks: nothing of it is
    stored, with a warning, never a block in part."""
    model = gemma3()
    ids = prompt(10, 6 * TPB)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, max_tokens=512,
                                                        host_blocks=64, salt="own") as kv:
        out = model(ids, use_cache=True)
        with caplog.at_level(logging.WARNING, logger="kvferry.transformers"):
            assert kv.store(ids, out.past_key_values) == 0
        assert "holds tokens from" in caplog.text
        assert kv.lookup(ids) == 0


@pytest.mark.parametrize("first,load", [(0, 7), (3, 7), (6, 7), (2, 5)])
def test_sliding_layers_follow_a_plan(first, load):
    """Mode "plan" with a sliding-window model: the front computed while the
    blocks after it load (a sliding layer's window then spans the computed
    front and the loaded blocks, or the loaded ones only), the logits those
    of a recompute."""
    from test_transformers_plan import DEAR, GivenPlan

    model = gemma3()
    ids = prompt(11, 7 * TPB + 5)
    with torch.no_grad(), GivenPlan.from_model(model, tokens_per_block=TPB, max_tokens=512, host_blocks=64,
                                               salt="plan", prefill_cost=DEAR) as kv:
        ref = kv.forward(model, ids, mode="recompute")
        kv.sync()
        kv.given = (first, load)
        poison(kv)
        past = kv.prepare(ids, "plan", model=model)
        assert past.cached_tokens == load * TPB and past.front_blocks == first
        out = model(ids[:, past.cached_tokens:], past_key_values=past, use_cache=True)
        past.finish()
        torch.testing.assert_close(out.logits[0, -1], ref.logits[0, -1], rtol=1e-4, atol=1e-4)
        assert kv.store(ids, past) == 0 and kv.cache.stats().failures == 0
        gen = kv.generate(model, ids, mode="plan", max_new_tokens=6, do_sample=False)
        assert torch.equal(gen, greedy(model, ids, 6))
