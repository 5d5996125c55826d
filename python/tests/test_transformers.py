# SPDX-License-Identifier: Apache-2.0
"""The transformers adapter (kvferry.integrations.transformers) with a real,
tiny, randomly initialised Llama on the CPU and the host backend: the
prefix served from the host and disk tiers is the K/V the model computed,
bit for bit; layer-wise and whole gets agree; a second process reuses the
prefix through the disk directory; partial blocks are never cached; a failed
block is recomputed; bad input is refused by name. Skipped without torch
and transformers."""

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from kvferry.integrations.transformers import KVFerryPrefixCache, PrefixLoadError, cache_kwargs  # noqa: E402

TPB = 16
LAYERS = 3


def forward(model, ids, past):
    """model(ids) over the cache `past`, under the keyword this transformers
    names it by."""
    return model(ids, **cache_kwargs(model, past))


def tiny_model(seed=0, kv_heads=2, dtype=torch.float32, device="cpu"):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=1024)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def prompt(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (1, n), generator=g)


def poison(kv):
    """What a get must overwrite: the slots still hold what store wrote
    (once its puts have read them)."""
    kv.sync()
    for p in kv.k_pools + kv.v_pools:
        p.fill_(float("nan"))


def bits(t):
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16)


def assert_prefix_equal(past, ref, tokens):
    """The first `tokens` K/V of every layer of past equal ref's, bit for bit."""
    for i, (a, b) in enumerate(zip(past.layers, ref.layers)):
        assert torch.equal(bits(a.keys[..., :tokens, :]), bits(b.keys[..., :tokens, :])), f"layer {i} K"
        assert torch.equal(bits(a.values[..., :tokens, :]), bits(b.values[..., :tokens, :])), f"layer {i} V"


TIERS = {
    "host": dict(host_blocks=64),
    "disk": dict(disk_blocks=64),  # host tier off: put writes files
    "host-evicted-to-disk": dict(host_blocks=2, disk_blocks=64),
}


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_prefix_served_byte_exact(tmp_path, tier):
    model = tiny_model()
    opts = dict(TIERS[tier])
    if "disk_blocks" in opts:
        opts["disk_dir"] = tmp_path
    first = prompt(1, 5 * TPB + 7)
    second = torch.cat([first[:, :4 * TPB], prompt(2, 21)], dim=1)  # shares 4 whole blocks
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, max_tokens=512,
                                                        **opts) as kv:
        out1 = kv.forward(model, first)
        kv.sync()
        s = kv.cache.stats()
        assert sum(s.blocks.values()) == 5 and s.puts == 5
        if tier == "host-evicted-to-disk":
            assert s.blocks["host"] == 2 and s.blocks["disk"] == 3
        poison(kv)
        past = kv.prepare(second)
        assert past.cached_tokens == 4 * TPB and past.get_seq_length() == 4 * TPB
        out2 = forward(model, second[:, past.cached_tokens:], past)
        past.finish()
        assert past.loaded and past.get_seq_length() == second.shape[1]
        assert_prefix_equal(past, out1.past_key_values, 4 * TPB)
        full = model(second)
        assert not torch.equal(full.logits[0, -1], model(second[:, -5:]).logits[0, -1])  # the prefix matters
        torch.testing.assert_close(out2.logits[0], full.logits[0, past.cached_tokens:], rtol=1e-4, atol=1e-4)
        assert kv.cache.stats().failures == 0


def test_layerwise_and_whole_agree(tmp_path):
    model = tiny_model()
    ids = prompt(3, 6 * TPB + 3)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, host_blocks=64) as kv:
        kv.forward(model, ids)
        runs = {}
        for mode in ("layerwise", "whole", "recompute"):
            poison(kv)
            past = kv.prepare(ids, mode=mode)
            out = forward(model, ids[:, past.cached_tokens:], past)
            past.finish()
            runs[mode] = (past, out, past.cached_tokens)
        assert runs["layerwise"][2] == runs["whole"][2] == 6 * TPB and runs["recompute"][2] == 0
        assert_prefix_equal(runs["layerwise"][0], runs["whole"][0], ids.shape[1])
        torch.testing.assert_close(runs["layerwise"][1].logits[0, -1], runs["recompute"][1].logits[0, -1],
                                   rtol=1e-4, atol=1e-4)


def test_crop_before_the_forward_takes_the_prefix_first():
    model = tiny_model()
    ids = prompt(11, 4 * TPB + 1)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, host_blocks=64) as kv:
        out = kv.forward(model, ids)
        poison(kv)
        past = kv.prepare(ids)
        assert past.cached_tokens == 4 * TPB
        past.crop(-5)  # as assisted decoding does: the layers must hold the prefix to cut it
        assert past.loaded and past.get_seq_length() == 4 * TPB - 5
        past.finish()
        assert_prefix_equal(past, out.past_key_values, 4 * TPB - 5)


def test_generate_reuses_the_prompt():
    model = tiny_model()
    ids = prompt(4, 3 * TPB + 5)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, host_blocks=64) as kv:
        plain = model.generate(ids, max_new_tokens=12, do_sample=False)
        a = kv.generate(model, ids, max_new_tokens=12, do_sample=False)
        assert torch.equal(a, plain)
        assert kv.lookup(a) == 4 * TPB  # K/V of 53 + 12 - 1 tokens: 4 whole blocks stored
        before = kv.cache.stats().hits["host"]
        b = kv.generate(model, ids, max_new_tokens=12, do_sample=False)
        assert torch.equal(b, plain)
        assert kv.cache.stats().hits["host"] - before == 3  # (53 - 1) // 16 blocks served


CHILD = textwrap.dedent("""
    import sys, torch
    sys.path[:0] = [{tests!r}, {pkg!r}]
    from test_transformers import tiny_model, prompt, TPB
    from kvferry.integrations.transformers import KVFerryPrefixCache
    model = tiny_model()
    ids = prompt(5, 7 * TPB)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, disk_dir={dir!r},
                                                        disk_blocks=64) as kv:
        out = kv.forward(model, ids)
        torch.save([(l.keys.clone(), l.values.clone()) for l in out.past_key_values.layers], {ref!r})
""")


def test_across_processes_through_disk(tmp_path):
    here = Path(__file__).resolve().parent
    script = CHILD.format(tests=str(here), pkg=str(here.parent), dir=str(tmp_path / "kv"),
                          ref=str(tmp_path / "ref.pt"))
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    ref = torch.load(tmp_path / "ref.pt")
    model = tiny_model()
    ids = torch.cat([prompt(5, 7 * TPB), prompt(6, 9)], dim=1)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, disk_dir=tmp_path / "kv",
                                                        disk_blocks=64) as kv:
        assert kv.cache.stats().blocks["disk"] == 7  # entered from the directory at creation
        poison(kv)
        past = kv.prepare(ids)
        assert past.cached_tokens == 7 * TPB
        out = forward(model, ids[:, past.cached_tokens:], past)
        past.finish()
        for i, (layer, (k, v)) in enumerate(zip(past.layers, ref)):
            assert torch.equal(bits(layer.keys[..., :7 * TPB, :]), bits(k)), f"layer {i} K"
            assert torch.equal(bits(layer.values[..., :7 * TPB, :]), bits(v)), f"layer {i} V"
        torch.testing.assert_close(out.logits[0, -1], model(ids).logits[0, -1], rtol=1e-4, atol=1e-4)
        assert kv.cache.stats().hits["disk"] == 7


def test_another_instance_through_the_remote_tier():
    """Write-through to a remote store, read by a second cache that has none
    of the blocks locally (mem://: the in-process store; Redis is the same
    path across processes)."""
    model = tiny_model()
    ids = prompt(10, 5 * TPB + 3)
    opts = dict(tokens_per_block=TPB, host_blocks=16, remote_url="mem://test-transformers")
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, **opts) as writer, \
            KVFerryPrefixCache.from_model(model, remote="read", **opts) as reader:
        out = writer.forward(model, ids)
        writer.sync()
        assert sum(reader.cache.stats().blocks.values()) == 0
        poison(reader)
        past = reader.prepare(ids)
        assert past.cached_tokens == 5 * TPB
        forward(model, ids[:, past.cached_tokens:], past)
        past.finish()
        assert_prefix_equal(past, out.past_key_values, 5 * TPB)
        assert reader.cache.stats().hits["remote"] == 5


def test_short_and_partial_blocks():
    model = tiny_model()
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, host_blocks=64) as kv:
        short = prompt(7, TPB - 3)
        kv.forward(model, short)
        kv.forward(model, short)  # nothing to serve, nothing stored
        kv.sync()
        assert kv.prepare(short).cached_tokens == 0
        assert sum(kv.cache.stats().blocks.values()) == 0
        ids = prompt(8, 2 * TPB + TPB // 2)  # 2 whole blocks and a partial one
        kv.forward(model, ids)
        kv.sync()
        assert kv.cache.stats().blocks["host"] == 2
        assert kv.prepare(ids).cached_tokens == 2 * TPB
        exact = ids[:, :2 * TPB]  # all blocks cached: the last token is still computed
        assert kv.prepare(exact).cached_tokens == TPB
        out = kv.forward(model, exact)
        torch.testing.assert_close(out.logits[0, -1], model(exact).logits[0, -1], rtol=1e-4, atol=1e-4)


def corrupt_files(kv, root, expect):
    files = sorted(p for p in (Path(root) / kv.namespace).rglob("*") if p.is_file())
    assert len(files) == expect
    for f in files:  # flip bytes in the middle of the payload
        with open(f, "r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(size // 2)
            data = fh.read(64)
            fh.seek(size // 2)
            fh.write(bytes(b ^ 0x5A for b in data))


def test_corrupt_block_is_recomputed(tmp_path, caplog):
    model = tiny_model()
    ids = prompt(9, 4 * TPB + 2)
    with torch.no_grad(), KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, disk_dir=tmp_path,
                                                        disk_blocks=64) as kv:
        kv.forward(model, ids)
        kv.sync()
        corrupt_files(kv, tmp_path, 4)
        assert kv.lookup(ids) == 4 * TPB
        with caplog.at_level("WARNING", logger="kvferry.transformers"):
            out = kv.forward(model, ids)  # fails at layer 0, recomputes, stores again
        assert "failed to load" in caplog.text
        torch.testing.assert_close(out.logits[0, -1], model(ids).logits[0, -1], rtol=1e-4, atol=1e-4)
        assert kv.cache.stats().failures >= 1
        kv.sync()
        corrupt_files(kv, tmp_path, 4)
        past = kv.prepare(ids)  # by hand: the error reaches the caller
        assert past.cached_tokens == 4 * TPB
        with pytest.raises(PrefixLoadError, match="failed to load"):
            forward(model, ids[:, past.cached_tokens:], past)
        with pytest.raises(PrefixLoadError):
            past.finish()
        assert kv.lookup(ids) == 0  # the cache dropped the corrupt blocks


def test_bad_input_is_refused(tmp_path):
    model = tiny_model()
    other = tiny_model(kv_heads=4)
    with KVFerryPrefixCache.from_model(model, tokens_per_block=TPB, host_blocks=8) as kv:
        with pytest.raises(ValueError, match="4 kv_heads, this cache was built for 2"):
            kv.forward(other, prompt(1, 40))
        with pytest.raises(ValueError, match="dtype"):
            kv.forward(tiny_model(dtype=torch.bfloat16), prompt(1, 40))
        with pytest.raises(ValueError, match="batch 2"):
            kv.prepare(torch.zeros(2, 40, dtype=torch.long))
        with pytest.raises(ValueError, match="mode 'fast'"):
            kv.prepare(prompt(1, 40), mode="fast")
        with pytest.raises(ValueError, match="empty"):
            kv.prepare(torch.zeros(1, 0, dtype=torch.long))
        # a forward of another model through a prepared cache: refused at its first layer
        kv.forward(model, prompt(1, 40))
        past = kv.prepare(prompt(1, 40))
        with torch.no_grad(), pytest.raises(ValueError, match=r"layer 0: the model's keys are \[1, 4, 8, 16\]"):
            forward(other, prompt(1, 40)[:, past.cached_tokens:], past)
    with pytest.raises(ValueError, match="no tier"):
        KVFerryPrefixCache.from_model(model)
    with pytest.raises(ValueError, match="no tier"):
        KVFerryPrefixCache.from_model(model, remote_url="mem://no-local-tier")
    with pytest.raises(ValueError, match="needs disk_blocks"):
        KVFerryPrefixCache.from_model(model, disk_dir=tmp_path)
    with pytest.raises(ValueError, match="tokens_per_block"):
        KVFerryPrefixCache.from_model(model, host_blocks=8, tokens_per_block=0)
    with pytest.raises(ValueError, match="float32, float16, bfloat16"):
        KVFerryPrefixCache(model.config, dtype=torch.int8, host_blocks=8)
    linear = LlamaConfig(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"])
    with pytest.raises(ValueError, match="linear_attention"):
        KVFerryPrefixCache(linear, dtype=torch.float32, host_blocks=8)
    windowless = LlamaConfig(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(ValueError, match="sliding_window = None"):
        KVFerryPrefixCache(windowless, dtype=torch.float32, host_blocks=8)


def test_ttft_bench_runs_tiny(tmp_path):
    """bench/ttft.py --tiny on this machine's device: every row byte-exact."""
    import json

    bench = Path(__file__).resolve().parents[2] / "bench" / "ttft.py"
    out = tmp_path / "ttft.json"
    r = subprocess.run([sys.executable, str(bench), "--tiny", "--lengths", "128", "--new", "16", "--runs", "1",
                        "--warmup", "0", "--tokens-per-block", "32", "--disk-dir", str(tmp_path / "kv"),
                        "--copy", "auto,dma", "--json", str(out)], env=dict(os.environ), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(row["tier"], row["length"], row["copy"]) for row in rows] == [
        ("host", 128, "auto"), ("host", 128, "dma"), ("disk", 128, "auto"), ("disk", 128, "dma")]
    assert [row["cuda_copy"] for row in rows] == ["auto", "dma"] * 2
    for row in rows:  # the plan column: the plan followed, its prediction beside it
        p = row["plan"]
        assert row["plan_s"] > 0 and p["predicted_s"] > 0 and p["hits"] == 128 // 32
        assert 0 <= p["load_first"] <= p["load_blocks"] <= p["hits"]
    # whole, layerwise, plan, layerwise again
    assert all(row["byte_exact"] and row["byte_exact_runs"] == 4 for row in rows)


def test_ttft_bench_skips_a_length_out_of_memory(tmp_path, monkeypatch, capsys):
    """A length the device has no memory for (transformers' eager attention
    at 32k on an 80 GB card) is reported and skipped; the others run."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "ttft_bench", Path(__file__).resolve().parents[2] / "bench" / "ttft.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    real = bench.Bench.case

    def case(self, length, tier, disk_root):
        if length == 128:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB\nmore")
        yield from real(self, length, tier, disk_root)

    monkeypatch.setattr(bench.Bench, "case", case)
    out = tmp_path / "ttft.json"
    monkeypatch.setattr(sys, "argv", ["ttft.py", "--tiny", "--lengths", "64,128", "--new", "16", "--runs", "1",
                                      "--warmup", "0", "--tokens-per-block", "32", "--tiers", "host",
                                      "--disk-dir", str(tmp_path / "kv"), "--json", str(out)])
    assert bench.main() == 0
    d = json.loads(out.read_text())
    assert [row["length"] for row in d["rows"]] == [64] and all(row["byte_exact"] for row in d["rows"])
    assert d["skipped"] == [{"tier": "host", "length": 128,
                             "reason": "CUDA out of memory. Tried to allocate 64.00 GiB"}]
    text = capsys.readouterr().out
    assert "128  host skipped, out of device memory" in text and "not measured (out of device memory): host 128" in text


def test_example_runs():
    ex = Path(__file__).resolve().parents[1] / "examples" / "transformers_prefix.py"
    r = subprocess.run([sys.executable, str(ex)], env=dict(os.environ, KVF_LOG="error"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "served prefixes byte-exact" in r.stdout and " 592 served from kvferry" in r.stdout


def test_cache_keyword_follows_the_forward():
    class Newer:
        def forward(self, input_ids, cache=None, past_key_values=None):
            pass

    class Older:
        def forward(self, input_ids, past_key_values=None):
            pass

    assert cache_kwargs(Newer(), "p") == {"cache": "p"}
    assert cache_kwargs(Older(), "p") == {"past_key_values": "p"}
    model = tiny_model()
    (name,) = cache_kwargs(model, "p")
    assert name in inspect.signature(model.forward).parameters
