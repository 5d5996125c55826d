# SPDX-License-Identifier: Apache-2.0
"""kvferry's connector inside vLLM's own engine (its CPU build): the LLM
engine and the OpenAI server on a tiny random-initialised Llama, and the
LLM engine on a Gemma-3-style hybrid (sliding-window layers beside a full
one: four KV cache groups), a DeepSeek-V2-style MLA model and a
Qwen3-Next-style hybrid (three gated-delta-net linear-attention layers,
each a Mamba state group, beside a full-attention one), vLLM's prefix
cache off (Qwen3-Next: on, as its states need, and reset before every
request) so that every cached token came from kvferry. Each engine
runs in a process of its own (vllm_engine_main.py); outputs and top-5
logprobs are compared with an engine without kvferry.

Skipped unless vllm imports: `make engines-check` makes the environment
(scripts/install-vllm.sh) and runs these tests in it."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make engines-check installs it)")

HERE = Path(__file__).resolve().parent
MAIN = HERE / "vllm_engine_main.py"
sys.path.insert(0, str(HERE))
import vllm_engine_main as engine_main  # noqa: E402


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(HERE.parent)] + [p for p in [e.get("PYTHONPATH")] if p])
    e.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return e


def engine(tmp, scenario, model="llama", kv="kv", environ=None, **opts):
    """One engine process's RESULT line, parsed (opts: vllm_engine_main's
    key=value options; environ: variables for that process)."""
    args = [str(tmp / f"model-{model}"), scenario, str(tmp / kv), f"model={model}"]
    args += [f"{k}={v}" for k, v in opts.items()]
    p = subprocess.run([sys.executable, str(MAIN)] + args, env={**env(), **(environ or {})}, capture_output=True,
                       text=True, timeout=900)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"{scenario}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """plain (no kvferry), kvferry (a fresh cache) and restart (a new
    process on the directory kvferry filled), in that order."""
    tmp = tmp_path_factory.mktemp("vllm-engine")
    return tmp, {s: engine(tmp, s) for s in ("plain", "kvferry", "restart")}


NAMES = ("first", "second", "tenant_a", "tenant_b", "tenant_a_again", "turn2")


def whole(tokens, block=engine_main.BLOCK):
    """The tokens of a prompt's whole blocks but the one holding its last
    token (computed for its logits): what a full hit loads."""
    return (tokens - 1) // block * block


def same_output(a, b):
    assert a["tokens"] == b["tokens"]
    assert a["top5"] == b["top5"]


def reference(plain, name, cached):
    """What the engine without kvferry gave the request `name`. The next
    turn's: as vLLM's own prefix cache serves it (the same tokens cached),
    its greedy tokens checked against the full prefill too. Its hit holds
    the KV decode steps wrote for the first turn's answer, which a full
    prefill computes as one chunk: on some CPUs (this build's kernels pick
    their blocking by shape and instruction set) that rounds otherwise, a
    few 1e-3 in a logprob, with kvferry or vLLM's own prefix cache alike.
    Where vLLM's own cache hits fewer tokens than kvferry (a sliding-
    window hybrid's) or none (MLA on the CPU), the full prefill's."""
    own = plain.get("turn2_own")
    if name != "turn2" or own is None or own["cached"] != cached:  # vLLM's own cache hit less (Gemma-3) or none
        return plain[name]
    assert own["tokens"] == plain["turn2"]["tokens"]
    return own


def test_outputs_identical_with_and_without_kvferry(runs):
    _, r = runs
    for name in NAMES:
        k = r["kvferry"][name]
        same_output(k, reference(r["plain"], name, k["cached"]))
    same_output(r["restart"]["first"], r["plain"]["first"])
    assert all(r["plain"][n]["cached"] == 0 for n in ("first", "second", "turn2"))  # no prefix cache of vLLM's


def test_later_requests_load_their_prefix_from_kvferry(runs):
    _, r = runs
    k = r["kvferry"]
    block = engine_main.BLOCK
    assert k["first"]["cached"] == 0 and sum(k["hits_after_first"].values()) == 0
    # 485 tokens: every whole block but the one holding the last token
    assert k["second"]["cached"] == (485 - 1) // block * block
    assert sum(k["hits_after_second"].values()) == (485 - 1) // block  # the cache's own count: every block a hit
    assert k["loaded_bytes_equal"] and all(k["loaded_bytes_equal"].values())  # what the first run computed


def test_first_request_after_a_restart_is_served_from_disk(runs):
    _, r = runs
    first = r["restart"]["first"]
    assert first["cached"] == (485 - 1) // engine_main.BLOCK * engine_main.BLOCK
    assert r["restart"]["hits_after_first"]["disk"] == (485 - 1) // engine_main.BLOCK


def test_tenants_with_different_cache_salt_never_share(runs):
    _, r = runs
    k = r["kvferry"]
    assert k["tenant_a"]["cached"] == 0
    assert k["tenant_b"]["cached"] == 0  # tenant A's blocks were stored: B must not get them
    assert k["tenant_a_again"]["cached"] == (200 - 1) // engine_main.BLOCK * engine_main.BLOCK


def test_next_turn_hits_on_the_previous_answer(runs):
    _, r = runs
    k = r["kvferry"]
    # the answer's blocks were saved as decoding filled them: the hit
    # reaches past the first turn's prompt into its answer
    whole = (k["turn1_len"] + k["answer_len"] - 1) // engine_main.BLOCK * engine_main.BLOCK
    assert k["turn2"]["cached"] == whole > k["turn1_len"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def test_openai_server_serves_from_kvferry(runs):
    """vLLM's OpenAI server with kvferry's connector, on the directory the
    earlier engines filled: its first request is served from disk, with
    the text an engine without kvferry gave."""
    tmp, r = runs
    port = free_port()
    kv = {"kv_connector": "KvferryConnector", "kv_connector_module_path": "kvferry.integrations.vllm",
          "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
          "kv_connector_extra_config": {"host_blocks": 8, "disk_blocks": 4096, "file_dir": str(tmp / "kv")}}
    log = open(tmp / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                               str(tmp / "model-llama"), "--host", "127.0.0.1", "--port", str(port),
                               "--no-enable-prefix-caching", "--block-size", str(engine_main.BLOCK),
                               "--max-model-len", "1024", "--enable-prompt-tokens-details", "--seed", "0",
                               "--kv-transfer-config", json.dumps(kv)], env=env(), stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp / "server.log").read_text()[-6000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start in 300 s"
                time.sleep(1)
        words = " ".join(f"w{t - 3}" for t in engine_main.tokens(1, 485))  # the engines' long prompt
        body = {"model": str(tmp / "model-llama"), "prompt": words, "max_tokens": 8, "temperature": 0}
        first = post(port, body)
        cached = (first["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
        assert first["usage"]["prompt_tokens"] == 485
        assert cached == (485 - 1) // engine_main.BLOCK * engine_main.BLOCK
        plain = r["plain"]["first"]["tokens"]
        assert first["choices"][0]["text"].split() == [f"w{t - 3}" for t in plain if t >= 3]
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module", params=["gemma3", "deepseek", "qwen3next"])
def shaped(request, tmp_path_factory):
    """A hybrid (gemma3: sliding-window groups beside a full-attention
    one, vLLM's hybrid manager on), an MLA (deepseek, in float32: below) or
    a linear-attention hybrid (qwen3next: Mamba state groups, loaded
    asynchronously as they must be) model: plain and through kvferry, KV
    events on."""
    tmp = tmp_path_factory.mktemp(f"vllm-{request.param}")
    kind = request.param
    both = {"dtype": "float32"} if kind in ("deepseek", "gemma3") else {}
    mine = {"load": "async"} if kind == "qwen3next" else {}
    runs = {s: engine(tmp, s, kind, events=1, **both, **(mine if s == "kvferry" else {})) for s in ("plain", "kvferry")}
    return kind, dict(runs, dir=tmp)


def test_every_model_shape_is_served_with_identical_outputs(shaped):
    """Gemma-3 (float32): greedy tokens and top-5 logprobs identical but
    for the next turn's, which vLLM's own prefix cache cannot serve with
    the same hit (it keeps 96 of its 160 tokens' windows): its hit holds
    the KV decode steps wrote for the first turn's answer, which the
    engine without kvferry computes in one prefill, rounded otherwise on
    some CPUs (in bf16 on an AMX machine: logprobs about 0.06 apart, the
    same tokens); greedy tokens identical, top-5 logprobs within 2e-4.
    MLA: greedy
    tokens identical, top-5 logprobs identical where nothing was loaded and
    within 2e-4 where a prefix was: a loaded prefix runs vLLM's MLA prefill
    over cached context (the cached latents up-projected, merged by their
    softmax sums), which its CPU platform never takes itself (it turns
    prefix caching and chunked prefill off for MLA), so the engine without
    kvferry computes those requests another way. In bf16 that other
    rounding moved logprobs by up to 0.03 and one greedy token; in float32,
    as here, by one unit of the 4 decimals compared. Qwen3-Next: every
    request as without kvferry, the next turn as on vLLM's own prefix
    cache: its hit ends at a block of the first turn's answer, where a
    full prefill's linear-attention chunk runs on (other rounding: 0.001 in
    a logprob, the same tokens), so the engine without kvferry serves it
    from its own prefix cache too (the same 160 tokens cached)."""
    kind, r = shaped
    for name in NAMES:
        a = r["kvferry"][name]
        b = reference(r["plain"], name, a["cached"])  # MLA: vLLM's CPU build has no prefix cache for it
        same_hit = name != "turn2" or b is r["plain"].get("turn2_own")
        if not a["cached"] or (kind != "deepseek" and same_hit):
            same_output(a, b)
        else:
            assert a["tokens"] == b["tokens"], name
            for sa, sb in zip(a["top5"], b["top5"], strict=True):
                assert [t for t, _ in sa] == [t for t, _ in sb], name
                assert max(abs(x - y) for (_, x), (_, y) in zip(sa, sb)) <= 2e-4, name
    block = r["kvferry"]["block"]
    k = r["kvferry"]
    assert k["first"]["cached"] == 0 and k["tenant_b"]["cached"] == 0
    assert k["second"]["cached"] == whole(485, block)
    assert k["tenant_a_again"]["cached"] == whole(200, block)
    assert k["turn2"]["cached"] == whole(k["turn1_len"] + k["answer_len"], block) > k["turn1_len"]


def test_loaded_blocks_hold_the_computed_bytes(shaped):
    """The blocks the second run of the prompt loaded from kvferry hold,
    byte for byte, what the first run computed in vLLM's own KV tensors
    (every full-attention or MLA layer; for MLA the latent and its rope
    part): the logprob differences MLA shows come from vLLM's prefill over
    cached context, not from the bytes."""
    _, r = shaped
    equal = r["kvferry"]["loaded_bytes_equal"]
    assert equal and all(equal.values()), equal


def test_sliding_window_groups_load_only_the_window(shaped):
    """Gemma-3's layers 0-2 (a 64-token window, three groups) and its full
    layer 3: a 480-token hit loads 15 full-attention blocks and, per
    window group, the 2 blocks the window reaches from the hit's end."""
    kind, r = shaped
    hits = sum(r["kvferry"]["hits_after_second"].values())
    if kind == "gemma3":
        window_blocks = -(-(engine_main.WINDOW - 1) // engine_main.BLOCK)
        assert hits == 480 // engine_main.BLOCK + 3 * window_blocks
    elif kind == "qwen3next":  # the full layer's 15 blocks, each state group its state at 480
        assert hits == 480 // engine_main.BLOCK + 3
    else:  # MLA: one group, one latent block per 16 tokens
        assert hits == whole(485, 16) // 16


def test_a_load_that_fails_recomputes_its_request(shaped):
    """Qwen3-Next after a restart on a directory whose block files were all
    damaged since (a byte of each payload flipped, the headers the
    scheduler lists intact): the first request's lookup hits 480 tokens on
    disk, every load fails its check, and vLLM recomputes the request from
    its start (kvferry reports it failed whole: a prefix cut short at a
    state group's block has no state to go on from, and vLLM maps failed
    blocks to requests only for models of one group), with the output an
    engine without kvferry gives it."""
    kind, r = shaped
    if kind != "qwen3next":
        pytest.skip("the state model's failure path")
    files = list((r["dir"] / "kv").rglob("*.kvf"))
    assert files
    for f in files:
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    again = engine(r["dir"], "restart", kind, load="async")
    same_output(again["first"], r["plain"]["first"])
    assert again["failures"] >= 1 and sum(again["hits_after_first"].values()) >= 1
    never_a_hit(again["metrics"], whole(485))


def never_a_hit(m, tokens):
    """The connector's Prometheus counters of a restart whose every load
    failed: the `tokens` the lookup found on disk counted as failed, for
    one request, none of them as a hit."""
    assert sum(v for n, v in m.items() if n.startswith("vllm:kvferry_hit_tokens")) == 0, m
    assert m["vllm:kvferry_load_failed_tokens{tier=disk}"] == tokens, m
    assert m["vllm:kvferry_load_failed_requests{}"] == 1 and m["vllm:kvferry_load_failed_blocks{}"] >= 1, m


def test_a_synchronous_load_that_fails_is_recomputed_never_a_hit(runs):
    """The Llama (one KV cache group, layer-wise loads) restarted on a copy
    of the directory whose block files were all damaged since: the first
    request's lookup hits 480 tokens on disk, every block fails its check
    as its layer waits, the failed block ids go back to vLLM, which
    recomputes from the first, the output that of the engine without
    kvferry; the connector counts the 480 tokens as failed, not hits."""
    import shutil

    tmp, r = runs
    shutil.copytree(tmp / "kv", tmp / "kv-damaged")
    files = list((tmp / "kv-damaged").rglob("*.kvf"))
    assert files
    for f in files:
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    again = engine(tmp, "restart", kv="kv-damaged")
    same_output(again["first"], r["plain"]["first"])
    assert again["failures"] >= 1
    never_a_hit(again["metrics"], whole(485))


def test_kv_events_name_the_medium(shaped):
    """vLLM's KV events, read from the engine's ZMQ publisher: every
    group's blocks stored in kvferry's host tier (CPU), moved to disk
    (STORAGE: stored there, removed from CPU: the host tier holds 8)."""
    kind, r = shaped
    events = [tuple(e) for e in r["kvferry"]["events"]]
    groups = 1 if kind == "deepseek" else 4
    for g in range(groups):
        assert ("BlockStored", "CPU", g) in events
        assert ("BlockStored", "STORAGE", g) in events
    assert ("BlockRemoved", "CPU", 0) in events
    # besides vLLM's own prefix cache's (GPU, and its resets: qwen3next)
    mine = {e[1] for e in events} - {"GPU", None}
    assert mine == {"CPU", "STORAGE"} and (kind == "qwen3next" or mine == {e[1] for e in events})
    assert not [e for e in r["plain"]["events"] if e[1] not in ("GPU", None)]


def test_metrics_count_each_tiers_hits(shaped):
    """The connector's Prometheus counters, read from the engine: the
    tokens loaded per tier add up to every request's cached tokens."""
    _, r = shaped
    k = r["kvferry"]
    m = k["metrics"]
    cached = sum(k[n]["cached"] for n in NAMES)
    assert m["vllm:kvferry_hit_tokens{tier=host}"] > 0 and m["vllm:kvferry_hit_tokens{tier=disk}"] > 0
    assert sum(v for n, v in m.items() if n.startswith("vllm:kvferry_hit_tokens")) == cached
    assert m["vllm:external_prefix_cache_hits{}"] == cached
    assert m["vllm:kvferry_loaded_blocks{}"] == sum(k["hits_at_end"].values())  # every hit loaded, none failed
    assert m["vllm:kvferry_saved_blocks{}"] > 0


def test_async_loads_serve_identical_outputs(runs):
    """load: async: vLLM holds each hit request waiting for its blocks
    until get_finished reports them in place, then computes the rest."""
    tmp, r = runs
    a = engine(tmp, "kvferry", kv="kv-async", load="async")
    for name in NAMES:
        same_output(a[name], reference(r["plain"], name, a[name]["cached"]))
        assert a[name]["cached"] == r["kvferry"][name]["cached"]
    assert a["second"]["cached"] == whole(485)


def test_bad_config_fails_the_engine_start_naming_the_key(runs):
    tmp, _ = runs
    errors = engine(tmp, "bad-config", kv="kv-bad")["errors"]
    for key, error in errors.items():
        assert error is not None, f"{key}: the engine started"
        assert key in error and "KvferryConnector" in error, error


def test_mamba_modes_kvferry_cannot_serve_fail_the_engine_start(tmp_path):
    """Qwen3-Next with vLLM's prefix cache off (its states kept per request
    only: mamba_cache_mode 'none') and with synchronous loads (vLLM copies
    a hit's state into the running block before a step's loads start):
    each engine fails to start, its error naming the setting."""
    errors = engine(tmp_path, "bad-config", "qwen3next", kv="kv-bad")["errors"]
    assert set(errors) == {"mamba_cache_mode", "load"}
    for key, error in errors.items():
        assert error is not None, f"{key}: the engine started"
        assert key in error and "KvferryConnector" in error and "MambaSpec" in error, error


def test_a_hybrid_model_refuses_synchronous_loads_at_start(tmp_path):
    """Gemma-3's four KV cache groups with `load: layerwise` or `whole`:
    vLLM 0.32 could not recompute such a load that failed (its scheduler
    raises for failed block ids of several groups), so the engine fails
    to start, its error naming the setting and the value that works."""
    errors = engine(tmp_path, "bad-config", "gemma3", kv="kv-bad")["errors"]
    assert set(errors) == {"load", "load=whole"}
    for case, error in errors.items():
        assert error is not None, f"{case}: the engine started"
        mode = "whole" if case == "load=whole" else "layerwise"
        assert f"load = '{mode}' on a model of 4 KV cache groups" in error and "set load: async" in error, error


def test_the_connectors_hooks_take_under_2_percent_of_a_decode_step(tmp_path):
    """The step thread's budget for the connector: 4 sequences decoding 512
    tokens each through kvferry's connector (the prompts stored by a
    warm-up first, saves into a host tier with disk behind it), every hook
    vLLM calls on both sides timed, the timer's own cost subtracted: their
    time per step, on average, under 2 % of the median decode step. One
    OpenMP thread, as bench/vllm_step_cost.py runs it (its rounds compare
    whole steps with and without kvferry; this is its hook figure)."""
    r = engine(tmp_path, "timing-kvferry", kv="kv-timing", batch=4, tokens=512, hooks=1,
               environ={"OMP_NUM_THREADS": "1"})
    assert r["hooks_timed"] and r["steps"] >= 512
    calls = r["calls_per_step"]
    assert calls["build_connector_meta"] >= 1 and calls["wait_for_save"] >= 1  # the hooks did run, every step
    hooks = sum(r["hooks_s"]) / len(r["hooks_s"])
    step = sorted(r["step_wall_s"])[len(r["step_wall_s"]) // 2]
    assert 0 < hooks < 0.02 * step, f"hooks {hooks * 1e6:.1f} us a step, median step {step * 1e6:.1f} us"
