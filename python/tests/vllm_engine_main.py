# SPDX-License-Identifier: Apache-2.0
"""Runs vLLM's LLM engine (its CPU build) on a tiny random-initialised Llama,
with or without kvferry's connector, and prints what the engine tests check
as one JSON line. A program, not a test: vLLM's engine wants a process of
its own, started under `if __name__ == "__main__"`.

    python vllm_engine_main.py MODEL_DIR SCENARIO [FILE_DIR] [model=KIND] [load=MODE] [events=1]
        [batch=N] [tokens=N] [hooks=1]

SCENARIO: plain (no connector), kvferry (a fresh cache: misses, then hits),
restart (a cache on a directory an earlier run filled), timing-plain and
timing-kvferry (decode steps timed, and the connector's share of them),
bad-config (engines started with wrong settings: each one's error).
KIND: llama (default), gemma3 (sliding-window layers beside a full-attention
one: four KV cache groups under vLLM's hybrid manager), deepseek (MLA, one
latent per token), qwen3next (Qwen3-Next's hybrid: three gated-delta-net
linear-attention layers, each a Mamba state group in vLLM, and a full-
attention one; vLLM keeps states at block boundaries only with its prefix
cache on, so it is on and reset before every request). MODE: the
connector's `load` setting. events=1: vLLM's
KV events on, published over ZMQ and read back by a subscriber here.
batch, tokens: the timing scenarios' sequences and the tokens each
generates; hooks=1: the connector's hooks timed too (timing()). The
engine core and the worker run in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so the worker's kvferry cache is read
directly for its stats."""

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

BLOCK = 32  # the CPU attention backend takes multiples of 32
VOCAB = 512
# per model kind: vLLM's block size (its CPU MLA kernel takes 16 only)
BLOCKS = {"llama": BLOCK, "gemma3": BLOCK, "deepseek": 16, "qwen3next": BLOCK}
# models whose state groups vLLM keeps at block boundaries only with its
# prefix cache on: on, and reset before every request
RESET_PREFIX = ("qwen3next",)
WINDOW = 64  # the gemma3 model's sliding window, in tokens


def _config(kind):
    """(the transformers model class, its config): tiny, random weights."""
    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_attention_heads=4,
                  max_position_embeddings=2048, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM, LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, **common)
    if kind == "gemma3":  # Gemma-3's alternation: sliding-window layers, then a full one
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        return Gemma3ForCausalLM, Gemma3TextConfig(
            num_hidden_layers=4, num_key_value_heads=2, head_dim=64, sliding_window=WINDOW, pad_token_id=0,
            layer_types=["sliding_attention"] * 3 + ["full_attention"], **common)
    if kind == "deepseek":  # DeepSeek-V2's MLA (latent 512 + rope 64: the CPU kernel's only size)
        from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

        return DeepseekV2ForCausalLM, DeepseekV2Config(
            num_hidden_layers=2, num_key_value_heads=4, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
            qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=2, num_experts_per_tok=1,
            moe_intermediate_size=64, first_k_dense_replace=2, **common)
    if kind == "qwen3next":  # linear attention (GDN: a Mamba state group each) x3, then full attention
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        # one 64x64 head per GDN layer: its state (17.5 KB) fits a 32-token
        # page of the attention layer (4 KV heads of 64), so vLLM keeps
        # block size 32 (a larger state makes vLLM grow the block)
        return Qwen3NextForCausalLM, Qwen3NextConfig(
            num_hidden_layers=4, num_key_value_heads=4, head_dim=64, moe_intermediate_size=64,
            shared_expert_intermediate_size=64, num_experts=2, num_experts_per_tok=1, linear_num_value_heads=1,
            linear_num_key_heads=1, linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
            full_attention_interval=4, pad_token_id=0, **common)
    raise SystemExit(f"model={kind}: want one of {', '.join(BLOCKS)}")


def write_model(d, kind="llama"):
    """A tiny model of random weights (fixed generator, spread wide enough that
    every token's logits differ, so an output depends on every KV row it
    attends to; vLLM's load_format="dummy" weights are so small that all
    logits tie) and a WordLevel tokenizer ("w<i>" is token i + 3)."""
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return
    os.makedirs(d, exist_ok=True)
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers

    cls, cfg = _config(kind)
    torch.manual_seed(0)
    cls(cfg).to(torch.bfloat16).save_pretrained(d)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(VOCAB - 3)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "model_max_length": 2048}, f)


def tokens(stream, n):
    import random

    r = random.Random(stream)
    return [r.randrange(3, VOCAB) for _ in range(n)]


def kv_config(file_dir, **extra):
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="KvferryConnector", kv_connector_module_path="kvferry.integrations.vllm",
                            kv_role="kv_both", kv_load_failure_policy="recompute",
                            kv_connector_extra_config={"host_blocks": 8, "disk_blocks": 4096, "file_dir": file_dir,
                                                       **extra})


_TIMED = {"scheduler": ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                        "update_connector_output", "request_finished"),
          "worker": ("handle_preemptions", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                     "get_finished", "get_block_ids_with_load_errors", "build_connector_worker_meta")}


def _wrapper_cost(n=20000):
    """Seconds the hook timer itself adds inside its timed span per call
    (the call through the wrapper and one clock read), measured around a
    method that does nothing: subtracted from the hooks' times."""

    class Nothing:
        def hook(self):
            return None

    obj, spent = Nothing(), [0]
    fn = obj.hook

    def timed(*a, _fn=fn, **kw):
        t = time.perf_counter_ns()
        try:
            return _fn(*a, **kw)
        finally:
            spent[0] += time.perf_counter_ns() - t

    best = None
    for _ in range(5):
        spent[0] = 0
        for _ in range(n):
            timed()
        best = spent[0] if best is None else min(best, spent[0])
    return best / n * 1e-9


def timing(llm, with_kvferry, requests=4, new_tokens=256, hooks=False):
    """Decode steps of `requests` sequences generating new_tokens each
    after a 64-token prompt: per engine step (vLLM's step function, which
    runs the scheduler, the connector's hooks on both sides and the
    forward), the step thread's wall and CPU time. hooks (with kvferry):
    also the wall time the connector's hooks took in each step (every hook
    vLLM calls, the scheduler's and the worker's, the timer's own cost
    subtracted); the timers add to the step, so such a run's step times
    are not compared with the plain ones."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    spent = {}  # connector hook -> nanoseconds
    calls = {}
    step_hooks = [0]  # this step's hook nanoseconds
    if with_kvferry and hooks:
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        sched = llm.llm_engine.engine_core.engine_core.scheduler.connector
        for side, conn in (("scheduler", sched), ("worker", get_kv_transfer_group())):
            for name in _TIMED[side]:
                fn = getattr(conn, name)

                def timed(*a, _fn=fn, _name=name, **kw):
                    t = time.perf_counter_ns()
                    try:
                        return _fn(*a, **kw)
                    finally:
                        d = time.perf_counter_ns() - t
                        spent[_name] = spent.get(_name, 0) + d
                        calls[_name] = calls.get(_name, 0) + 1
                        step_hooks[0] += d

                setattr(conn, name, timed)
    core = llm.llm_engine.engine_core.engine_core
    real_step = core.step_fn  # what the in-process client calls each step
    walls, cpus, hook_ns, call_counts = [], [], [], []
    on = [False]

    def counted(*a, **kw):
        if not on[0]:
            return real_step(*a, **kw)
        step_hooks[0] = 0
        n0 = sum(calls.values())
        c, t = time.thread_time(), time.perf_counter()
        try:
            return real_step(*a, **kw)
        finally:
            walls.append(time.perf_counter() - t)
            cpus.append(time.thread_time() - c)
            hook_ns.append(step_hooks[0])
            call_counts.append(sum(calls.values()) - n0)

    core.step_fn = counted
    prompts = [TokensPrompt(prompt_token_ids=tokens(100 + i, 64)) for i in range(requests)]
    sp = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    # warm: the same shapes once (the prompts' blocks are then stored, as
    # they would be for a repeated system prompt)
    llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
    spent.clear()
    calls.clear()
    on[0] = True
    c0, t0 = time.process_time(), time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    wall, proc = time.perf_counter() - t0, time.process_time() - c0
    on[0] = False
    n = max(len(walls), 1)
    cost = _wrapper_cost() if hooks and with_kvferry else 0.0
    net = [max(h * 1e-9 - k * cost, 0.0) for h, k in zip(hook_ns, call_counts)]
    return {"steps": len(walls), "requests": requests, "new_tokens": new_tokens, "hooks_timed": bool(hooks),
            "step_wall_s": walls, "step_cpu_s": cpus, "hooks_s": net, "timer_cost_s": cost,
            "run_wall_s": wall, "run_process_cpu_s": proc,
            "per_hook_s_per_step": {k: (v * 1e-9 - calls[k] * cost) / n
                                    for k, v in sorted(spent.items(), key=lambda kv: -kv[1])},
            "calls_per_step": {k: v / n for k, v in calls.items()}}


class BlockBytes:
    """The KV bytes of a request's whole blocks in vLLM's own tensors, per
    layer of the full-attention (and MLA) groups: what the first run of a
    prompt computed, to compare with what a later run loaded. vLLM's
    block ids come from the scheduler's output (in this process)."""

    def __init__(self, llm):
        core = llm.llm_engine.engine_core.engine_core
        self.ids = {}  # request id -> its block ids per group, in order of scheduling
        conn = core.scheduler.connector
        real = conn.build_connector_meta

        def meta(so, _real=real):
            for n in so.scheduled_new_reqs:
                self.ids.setdefault(n.req_id, [list(g) for g in n.block_ids])
            return _real(so)

        conn.build_connector_meta = meta
        cfg = core.scheduler.kv_cache_config
        ctx = llm.llm_engine.vllm_config.compilation_config.static_forward_context
        from kvferry.integrations._vllm_kv import _block_dim

        self.layers = []  # (group, layer, its KV tensor, the dimension of its blocks)
        self.states = []  # (group, layer, its state tensors): the state at a hit's end
        for gi, g in enumerate(cfg.kv_cache_groups):
            if type(g.kv_cache_spec).__name__ == "MambaSpec":
                for name in g.layer_names:
                    t = ctx[name].kv_cache
                    self.states.append((gi, name, [t] if hasattr(t, "select") else list(t)))
            if type(g.kv_cache_spec).__name__ in ("FullAttentionSpec", "MLAAttentionSpec"):
                for name in g.layer_names:
                    t = ctx[name].kv_cache
                    t = t if hasattr(t, "select") else t[0]  # a list per virtual engine in some versions
                    self.layers.append((gi, name, t, _block_dim(t, cfg.num_blocks, name)))

    def last(self, blocks):
        """The bytes of the last request's first `blocks` blocks, per layer;
        of a state layer, its state after them (the last block's: vLLM
        keeps no other)."""
        ids = list(self.ids.values())[-1]
        out = {name: [t.select(d, ids[gi][j]).clone() for j in range(blocks)] for gi, name, t, d in self.layers}
        out.update({name: [t.select(0, ids[gi][blocks - 1]).clone() for t in ts] if blocks else []
                    for gi, name, ts in self.states})
        return out


def reset_prefix_cache(llm):
    """Empties vLLM's own prefix cache. vLLM resets it only once every block
    is free, and a finished request's blocks stay held until the connector
    reports its saves done (get_finished), which an engine step asks."""
    for _ in range(500):
        if llm.reset_prefix_cache():
            return
        llm.llm_engine.step()
        time.sleep(0.01)
    raise SystemExit("vLLM's prefix cache would not reset: blocks still held after 500 steps")


def options(argv):
    """key=value arguments after the positional ones."""
    opts = {"model": "llama", "load": None, "events": "0", "dtype": "auto", "batch": "4", "tokens": "256",
            "hooks": "0"}
    for a in argv:
        k, _, v = a.partition("=")
        if k not in opts:
            raise SystemExit(f"unknown option {a!r}; known: {', '.join(opts)}")
        opts[k] = v
    return opts


class Events:
    """A subscriber to the engine's KV events, published by vLLM's ZMQ
    publisher on an ipc endpoint it binds: takes the [kind, medium, group]
    of every event."""

    def __init__(self, endpoint):
        import zmq

        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.5)  # the subscription reaches the publisher asynchronously

    def take(self):
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        out = []
        while self.sock.poll(500, zmq.POLLIN):
            payload = self.sock.recv_multipart()[-1]
            for e in decoder.decode(payload).events:
                out.append([type(e).__name__, getattr(e, "medium", None), getattr(e, "group_idx", None)])
        return out


def bad_configs(model, file_dir, block, kind):
    """Engines started with settings kvferry refuses: each one's error."""
    from vllm import LLM

    # the setting each error must name: a wrong tier name, an unknown load
    # mode, a misspelt key, a negative count, an unknown remote mode
    cases = {"tier_costs": ({"tier_costs": {"nvme": [0.001, 1e9]}}, False), "load": ({"load": "sometimes"}, False),
             "host_block": ({"host_block": 8}, False), "disk_blocks": ({"disk_blocks": -1}, False),
             "remote": ({"remote": "write_back"}, False)}
    if kind in RESET_PREFIX:  # a state model: its Mamba modes kvferry cannot serve
        # vLLM's prefix cache off (its states kept per request only, mamba_cache_mode
        # 'none'), and synchronous loads (vLLM copies a hit's state before they start)
        cases = {"mamba_cache_mode": ({"load": "async"}, False), "load": ({"load": "layerwise"}, True)}
    elif kind == "gemma3":  # several KV cache groups: a synchronous load that failed could not be recomputed
        cases = {"load": ({"load": "layerwise"}, False), "load=whole": ({"load": "whole"}, False)}
    out = {}
    for name, (extra, prefix) in cases.items():
        try:
            LLM(model=model, enable_prefix_caching=prefix, max_model_len=1024, block_size=block, max_num_seqs=4,
                kv_transfer_config=kv_config(file_dir, **extra))
            out[name] = None
        except Exception as exc:  # noqa: BLE001 - the engine's own error, whatever its class
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def main():
    model, scenario = sys.argv[1], sys.argv[2]
    file_dir = sys.argv[3] if len(sys.argv) > 3 else None
    opts = options(sys.argv[4:])
    kind = opts["model"]
    if kind not in BLOCKS:
        _config(kind)  # exits naming the kinds
    block = BLOCKS[kind]
    write_model(model, kind)
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if scenario == "bad-config":
        print("RESULT " + json.dumps({"errors": bad_configs(model, file_dir, block, kind)}), flush=True)
        return
    t0 = time.time()
    plain = scenario in ("plain", "timing-plain")
    extra = {"load": opts["load"]} if opts["load"] else {}
    kw = {}
    endpoint = f"ipc://{os.path.abspath(file_dir or model)}-events"
    if opts["events"] == "1":
        from vllm.config import KVEventsConfig

        kw["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint,
                                                topic="kv")
    # stats on (vLLM's loggers and Prometheus) except where steps are timed
    timed = scenario.startswith("timing")
    if timed:  # saves into a host tier that holds them (a disk tier below it), as a server would
        extra.update(host_blocks=4096, disk_blocks=4096)
    # vLLM's own prefix cache on, reset before every request: for state
    # models (their states need it), and in the engine without kvferry, which
    # serves the next turn from it too (turn2_own, below)
    reset = kind in RESET_PREFIX or scenario == "plain"
    if kind in RESET_PREFIX:  # vLLM keeps (and hands kvferry) states at every block boundary, decode's too
        kw["prefix_cache_retention_interval"] = block
    if kind == "deepseek":
        # vLLM's reference CPU MLA backend, which takes float32, on every
        # machine: on a CPU with AMX tiles vLLM picks its AMX backend
        # otherwise, which takes 16-bit weights only
        kw["attention_config"] = {"backend": "CPU_MLA"}
    llm = LLM(model=model, enable_prefix_caching=reset, max_model_len=1024, seed=0, block_size=block,
              max_num_seqs=int(opts["batch"]) if timed else 4, dtype=opts["dtype"],
              kv_transfer_config=None if plain else kv_config(file_dir, **extra),
              disable_log_stats=scenario.startswith("timing"), **kw)
    started = time.time() - t0
    events = Events(endpoint) if "kv_events_config" in kw else None
    greedy = SamplingParams(max_tokens=8, temperature=0, logprobs=5)

    def run(toks, salt=None, sp=greedy, forget=True):
        p = TokensPrompt(prompt_token_ids=toks)
        if salt is not None:
            p["cache_salt"] = salt
        if reset and forget:  # vLLM's own prefix cache forgets: every cached token came from kvferry
            reset_prefix_cache(llm)
        o = llm.generate([p], sp, use_tqdm=False)[0]
        c = o.outputs[0]
        top = [sorted((int(t), round(float(lp.logprob), 4)) for t, lp in step.items()) for step in (c.logprobs or [])]
        return {"tokens": list(c.token_ids), "top5": top, "cached": int(o.num_cached_tokens or 0)}

    def hits():
        if plain:
            return {}
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        return dict(get_kv_transfer_group().cache.stats().hits)

    def metrics():
        """The engine's Prometheus counters of kvferry and of vLLM's
        connector prefix cache, by name and labels."""
        out = {}
        for m in llm.get_metrics():
            if "kvferry" in m.name or "external_prefix_cache" in m.name or "connector_prefix_cache" in m.name:
                labels = ",".join(f"{k}={v}" for k, v in sorted(m.labels.items()) if k not in ("engine", "model_name"))
                out[f"{m.name}{{{labels}}}"] = getattr(m, "value", None)
        return out

    long = tokens(1, 485)
    out = {"started_s": started, "scenario": scenario, "model": kind, "block": block}
    if scenario.startswith("timing"):
        out.update(timing(llm, scenario == "timing-kvferry", int(opts["batch"]), int(opts["tokens"]),
                          opts["hooks"] == "1"))
    elif scenario == "restart":  # the very first request of this process
        out["first"] = run(long)
        out["hits_after_first"] = hits()
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        out["failures"] = get_kv_transfer_group().cache.stats().failures  # blocks that did not arrive
        out["metrics"] = metrics()
    else:
        seen = BlockBytes(llm) if not plain else None
        out["first"] = run(long)
        out["hits_after_first"] = hits()
        computed = seen.last((len(long) - 1) // block) if seen else None
        out["second"] = run(long)
        out["hits_after_second"] = hits()
        if seen:  # the blocks the second run loaded hold what the first computed, byte for byte
            loaded = seen.last(out["second"]["cached"] // block)
            out["loaded_bytes_equal"] = {n: len(loaded[n]) == len(computed[n]) and all(
                a.view(-1).view(torch.uint8).equal(b.view(-1).view(torch.uint8)) for a, b in zip(loaded[n], computed[n]))
                for n in computed}
        tenant = tokens(2, 200)
        out["tenant_a"] = run(tenant, "tenant-A")
        out["tenant_b"] = run(tenant, "tenant-B")
        out["tenant_a_again"] = run(tenant, "tenant-A")
        turn1 = tokens(3, 100)
        answer = run(turn1, sp=SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
        turn2 = turn1 + answer["tokens"] + tokens(4, 40)
        out["turn1_len"], out["answer_len"] = len(turn1), len(answer["tokens"])
        out["turn2"] = run(turn2)
        if plain and reset:
            # the next turn on vLLM's own prefix cache: its hit holds the KV
            # decode steps wrote for the first turn's answer (a state model:
            # the state at a block boundary of it), which a full prefill of
            # the next turn computes as one chunk, rounded otherwise
            run(turn1, sp=SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
            out["turn2_own"] = run(turn2, forget=False)
        if not plain:
            out["hits_at_end"] = hits()
            out["metrics"] = metrics()
        if events is not None:
            out["events"] = events.take()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
