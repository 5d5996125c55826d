# SPDX-License-Identifier: Apache-2.0
"""bench/plan_ttft.py's followed paths on the CPU (host backend), with a tiny
decoder: the leading blocks loaded (whole and layer by layer) and the front
shape (the back's get submitted from a thread while the front computes)
give the prompt's last hidden state as a full recompute does, and every
block got is the block stored, byte for byte, in poisoned slots. Then the
whole bench, end to end, on that shape. Skipped without torch."""

import argparse
import json
import statistics
import sys
from pathlib import Path

import pytest

import kvferry as kvf

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import plan_ttft as bench  # noqa: E402

TINY = ["--device", "cpu", "--layers", "2", "--hidden", "128", "--heads", "4", "--kv-heads", "2", "--head", "32",
        "--mlp", "256", "--repeat", "1"]


@pytest.fixture
def rig(tmp_path):
    a = argparse.Namespace(layers=2, hidden=128, heads=4, kv_heads=2, head=32, mlp=256, repeat=1, new_tokens=32,
                           front_submit="thread", attention="auto", hedge="on")
    dev = bench.Dev("cpu")
    kv = [tuple(torch.zeros(40, bench.TPB, 2, 32, dtype=torch.bfloat16) for _ in range(2)) for _ in range(2)]
    model = bench.Model(a, dev, kv)
    geom = kvf.Geometry(layers=1, kv_factor=1, kv_heads=2, tokens_per_block=bench.TPB, head_size=32,
                        dtype=kvf.Dtype.BF16, order=kvf.Order.TOKEN_MAJOR)
    with kvf.Engine(backend=kvf.Backend.HOST, file_dir=str(tmp_path), file_namespace="bench") as e:
        for k, v in kv:
            e.add_pool(geom, primary=k)
            e.add_pool(geom, primary=v)
        with kvf.Cache(e, disk_blocks=40) as cache:
            yield bench.Bench(a, model, e, cache, kvf.Tier.DISK, None)


def test_followed_paths_compute_the_prompt(rig):
    n = 16 * bench.TPB
    x, keys = rig.store(n)
    full = rig.mo.prefill(x)[-1]
    hits = (n - rig.a.new_tokens) // bench.TPB
    src, dst = list(range(16)), list(range(16, 32))
    outs = {}

    def run(name, fn, lo, hi):
        rig.poison(dst)
        out = {}
        orig = rig.mo.prefill

        def last(*args, **kw):  # the prompt's last hidden state: the rest's
            out["x"] = orig(*args, **kw)
            return out["x"]

        rig.mo.prefill = last
        try:
            fn()
        finally:
            rig.mo.prefill = orig
        assert rig.same(dst[lo:hi], src[lo:hi]), name
        # poisoned slots outside the loads stay poisoned: nothing else written
        if hi < 16:
            assert not rig.same(dst[hi:hi + 1], src[hi:hi + 1])
        outs[name] = out["x"][-1]

    for layerwise in (False, True):
        rig.layerwise = layerwise
        run(f"load all, layerwise {layerwise}", lambda: rig.load_then_compute(x, keys, dst, hits), 0, hits)
    rig.layerwise = False
    run("front [5, 11)", lambda: rig.front_then_rest(x, keys, dst, 5, 11), 5, 11)
    rig.a.front_submit = "inline"
    run("front [1, 14), inline", lambda: rig.front_then_rest(x, keys, dst, 1, hits), 1, hits)
    # what the layers added to the last token's input: the residual stream
    # alone would hide a wrong attention
    want = (full - x[-1]).float()
    for name, out in outs.items():
        err = ((out - x[-1]).float() - want).norm() / want.norm()
        assert err < 0.05, (name, float(err))


def test_attention_reads_kv_heads_in_place_as_copied(rig):
    """The two attentions give one result, with a prefix and without, and a
    torch whose attention takes enable_gqa gets the in-place one. Decided
    here by the keyword alone, not by the bench's own check, so that a
    wrong in-place result fails rather than skips."""
    m = rig.mo.m
    g = torch.Generator().manual_seed(5)
    for n, s in ((48, 48), (16, 80)):
        q = torch.randn(n, 4, 32, generator=g).to(torch.bfloat16)
        kk, vv = (torch.randn(s, 2, 32, generator=g).to(torch.bfloat16) for _ in range(2))
        want = m.attend(q, kk, vv, False).float()
        try:
            got = m.attend(q, kk, vv, True).float()
        except TypeError:
            pytest.skip(f"torch {torch.__version__} has no enable_gqa: the bench copies KV heads")
        assert got.shape == (n, 4 * 32)
        assert torch.allclose(got, want, atol=2e-2, rtol=2e-2), (n, s, float((got - want).abs().max()))
        assert m.gqa


def test_bench_end_to_end(tmp_path):
    out = tmp_path / "plan.json"
    rc = bench.main(TINY + ["--tokens", "128,256", "--new-tokens", "32", "--disk", str(tmp_path / "kv"),
                            "--json", str(out)])
    assert rc in (0, 1)  # 2: a byte was wrong; targets are for the GPU
    d = json.loads(out.read_text())
    assert len(d["rows"]) == 4 and all(r["bytes_ok"] for r in d["rows"])
    t = d["prefill_table"]
    assert t["new_tokens"][0] == 16 and t["prefix_tokens"] == [0, 96, 224]
    for r in d["rows"]:
        assert r["plan_shape"] in ("recompute", "leading", "front")
        assert 0 <= r["plan_load_first"] <= r["plan_load_blocks"] <= r["hits"]
        assert set(r["targets"]) >= {"predicted plan within 20 %", "predicted load all within 20 %"}
    # the plan again at the speed load all read in the rounds (whole batches here)
    again = [r for r in d["rows"] if "replanned_s" in r]
    assert again, "no row replanned at the rounds' speed"
    for r in again:
        assert r["rounds_bytes_per_s"] > 0 and 0 < r["replanned_s"] <= r["replanned_recompute_s"]


def test_bench_learns_costs_and_plans_each_round(tmp_path):
    """--costs learn: the fit is a starting point the engine's own
    observations move (not held), and every timed round makes its own plan,
    each followed and its bytes checked."""
    out = tmp_path / "plan.json"
    rc = bench.main(TINY + ["--tokens", "256", "--new-tokens", "32", "--tiers", "disk", "--repeat", "2",
                            "--costs", "learn", "--disk", str(tmp_path / "kv"), "--json", str(out)])
    assert rc in (0, 1)
    (r,) = json.loads(out.read_text())["rows"]
    assert r["costs"] == "learn" and r["bytes_ok"]
    assert not r["tier_held"] and r["tier_observed"] > 0
    assert len(r["rounds"]) == 2
    for p in r["rounds"]:
        assert p["shape"] in ("recompute", "leading", "front") and p["predicted_s"] > 0
        assert 0 <= p["load_first"] <= p["load_blocks"] <= r["hits"]
    # the row's prediction is the rounds' median, its shape the last round's
    assert r["predicted_plan_s"] == pytest.approx(statistics.median(p["predicted_s"] for p in r["rounds"]))
    assert r["plan_shape"] == r["rounds"][-1]["shape"]


def test_bench_holds_the_fit_by_default(tmp_path):
    out = tmp_path / "plan.json"
    bench.main(TINY + ["--tokens", "256", "--new-tokens", "32", "--tiers", "disk", "--disk", str(tmp_path / "kv"),
                       "--json", str(out)])
    (r,) = json.loads(out.read_text())["rows"]
    assert r["costs"] == "hold" and r["tier_held"] and r["rounds"] == []


def test_hedged_paths_compute_the_prompt(rig):
    """The paths a late load takes (its get given up at the plan's hedge,
    whatever made it late: test_plan_hedge and the transformers adapter's
    test stall a real store): the front shape recomputes the tokens after
    its front, the leading shape the whole prompt, each giving the prompt's
    last hidden state; the late get still lands byte for byte."""
    n = 16 * bench.TPB
    x, keys = rig.store(n)
    full = rig.mo.prefill(x)[-1]
    src, dst = list(range(16)), list(range(16, 32))
    rig.in_time = lambda t, hedge_s: (rig.late.append(t), False)[1]  # every load late
    want = (full - x[-1]).float()
    for name, fn, lo, hi in (("front [5, 11)", lambda: rig.front_then_rest(x, keys, dst, 5, 11, 1.0), 5, 11),
                             ("leading 12", lambda: rig.load_then_compute(x, keys, dst, 12, 1.0), 0, 12)):
        rig.poison(dst)
        out = {}
        orig = rig.mo.prefill

        def last(*args, **kw):
            out["x"] = orig(*args, **kw)
            return out["x"]

        rig.mo.prefill = last
        try:
            fn()
        finally:
            rig.mo.prefill = orig
        err = ((out["x"][-1] - x[-1]).float() - want).norm() / want.norm()
        assert err < 0.05, (name, float(err))
        assert len(rig.late) == 1
        rig.retire_late()
        assert not rig.late and rig.same(dst[lo:hi], src[lo:hi]), name


def test_bench_hedges_by_default(tmp_path):
    out = tmp_path / "plan.json"
    bench.main(TINY + ["--tokens", "256", "--new-tokens", "32", "--tiers", "disk", "--disk", str(tmp_path / "kv"),
                       "--json", str(out)])
    (r,) = json.loads(out.read_text())["rows"]
    assert r["bytes_ok"] and r["plan_hedged"] >= 0
    assert r["plan_hedge_s"] > 0 or r["plan_shape"] == "recompute"
