# SPDX-License-Identifier: Apache-2.0
"""Contract tests of kvferry.integrations.vllm against the installed vLLM:
its real Scheduler (and KV cache manager) drives the scheduler-side
connector, found through kv_connector_module_path by vLLM's own factory,
and the worker-side connector runs inside vLLM's
KVConnectorModelRunnerMixin step, as the GPU model runner calls it. Only
the model's forward is ours: per layer it waits for the layer's load and
writes each computed token's KV, a function of the token prefix, into the
token's block slot. Every load is checked byte for byte against that
function, into blocks poisoned first. KV tensors are CPU torch tensors on
kvferry's host backend; disk blocks are real kvferry block files.

Skipped unless vllm imports (see docs/integrations/vllm.md for the venv)."""

import hashlib
import time
from contextlib import contextmanager

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin  # noqa: E402

import kvferry  # noqa: E402
from kvferry.integrations import vllm as kvf_vllm  # noqa: E402

BS, HEADS, HEAD, BLOCKS = 16, 2, 16, 64
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
POISON = 0x7E7E  # an fp16 NaN pattern no token writes


# vLLM's own block hasher, as its engine core sets it up for a connector
HASH_FN = get_hash_fn_by_name("sha256")
init_none_hash(HASH_FN)
HASHER = get_request_block_hasher(BS, HASH_FN)


def vllm_request(rid, tokens, max_tokens=2, **kw):
    """A vLLM Request hashed by vLLM's hasher (kw: cache_salt, mm_features,
    lora_request, ...)."""
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(rid, list(tokens), sp, None, block_hasher=HASHER, **kw)


def keys_of(tokens, **kw):
    """The kvferry keys of a prompt's whole blocks, as the connector derives
    them from vLLM's block hashes."""
    return [kvf_vllm.block_key(h) for h in vllm_request("keys", tokens, **kw).block_hashes]


def token_kv(layer, prefix):
    """The K and V rows of the last token of `prefix` in `layer`: random
    int16 bit patterns seeded by the whole prefix, never POISON."""
    h = hashlib.blake2b(np.asarray(prefix, dtype=np.int64).tobytes(), digest_size=8, key=bytes([layer + 1]))
    rng = np.random.default_rng(int.from_bytes(h.digest(), "little"))
    rows = rng.integers(0, 0x7C00, (2, HEADS, HEAD), dtype=np.int16)  # finite positive fp16s
    return torch.from_numpy(rows).view(torch.float16)


def kv_tensor(layout):
    """(the tensor an attention backend hands the connector, its view as
    [K/V, block, token, head, dim]), poisoned."""
    if layout == "flash_attn":  # [2, blocks, block_size, heads, dim]
        raw = torch.empty(2, BLOCKS, BS, HEADS, HEAD, dtype=torch.float16)
        given, view = raw, raw
    elif layout == "flashinfer":  # [blocks, 2, block_size, heads, dim]
        raw = torch.empty(BLOCKS, 2, BS, HEADS, HEAD, dtype=torch.float16)
        given, view = raw, raw.transpose(0, 1)
    else:  # "hnd": heads before tokens in memory, shown to vLLM as NHD
        raw = torch.empty(2, BLOCKS, HEADS, BS, HEAD, dtype=torch.float16)
        given = view = raw.permute(0, 1, 3, 2, 4)
    raw.view(torch.int16).fill_(POISON)
    return given, view


class Harness:
    """One vLLM instance: the real Scheduler, a worker connector, KV tensors
    in vLLM's FlashAttention layout [2, blocks, block_size, heads, head].
    runner: how the worker's hooks are driven each step, as vLLM's model
    runner V1 does (its KVConnectorModelRunnerMixin) or as Model Runner V2
    does (its ActiveKVConnector: handle_preemptions first, the forward,
    finish_forward, then the step's outputs)."""

    def __init__(self, tmp_path, extra, layout="flash_attn", window=None, runner="v1"):
        model_dir = tmp_path / "model"  # a key's salt holds the model: instances share it
        from transformers import LlamaConfig

        LlamaConfig(vocab_size=5000, hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYERS),
                    num_attention_heads=4, num_key_value_heads=HEADS,
                    max_position_embeddings=4096).save_pretrained(str(model_dir))
        self.config = VllmConfig(
            model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float16",
                                     max_model_len=2048),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=2048,
                                             enable_chunked_prefill=True, is_encoder_decoder=False),
            cache_config=CacheConfig(block_size=BS, enable_prefix_caching=True),
            kv_transfer_config=KVTransferConfig(kv_connector="KvferryConnector",
                                                kv_connector_module_path="kvferry.integrations.vllm",
                                                kv_role="kv_both", kv_connector_extra_config=extra,
                                                kv_load_failure_policy="recompute"),
            device_config=DeviceConfig("cpu"))
        self.config.cache_config.num_gpu_blocks = BLOCKS
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
        if window is None:
            groups = [KVCacheGroupSpec(list(LAYERS), spec)]
        else:  # a hybrid model: layer 0 sees a sliding window of `window` tokens, layer 1 everything
            from vllm.v1.kv_cache_interface import SlidingWindowSpec

            sliding = SlidingWindowSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16,
                                        sliding_window=window)
            groups = [KVCacheGroupSpec([LAYERS[0]], sliding), KVCacheGroupSpec([LAYERS[1]], spec)]
        self.group_of = {name: i for i, g in enumerate(groups) for name in g.layer_names}
        self.kv_config = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)
        # stats on, as an engine that logs them or serves /metrics: vLLM asks the
        # connector for its hit sources and both sides for their stats each step
        self.sched = Scheduler(vllm_config=self.config, kv_cache_config=self.kv_config,
                               structured_output_manager=StructuredOutputManager(self.config), block_size=BS,
                               log_stats=True)
        self.stats = {}  # the connector's stats, summed over every step (what vLLM's loggers get)
        assert isinstance(self.sched.connector, kvf_vllm.KvferryConnector)
        self.worker = KVConnectorFactory.create_connector(self.config, KVConnectorRole.WORKER, self.kv_config)
        registered, self.kv = {}, {}  # what vLLM registers; its [K/V, block, token, head, dim] view
        for name in LAYERS:
            registered[name], self.kv[name] = kv_tensor(layout)
        self.v2 = None
        if runner == "v2":  # Model Runner V2's wrapper registers the tensors itself
            from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

            with self._worker_agent():
                self.v2 = ActiveKVConnector(self.config, registered)
        else:
            self.worker.register_kv_caches(registered)
        self.loaded = []  # (req id, block ids, first block index) of each step's loads
        self.load_errors = set()

    def close(self):
        self.worker.shutdown()

    def add(self, rid, prompt, max_tokens=2, **kw):
        self.sched.add_request(vllm_request(rid, prompt, max_tokens, **kw))

    def block_table(self, rid, group=0):
        return list(self.sched.kv_cache_manager.get_block_ids(rid)[group])

    @contextmanager
    def _worker_agent(self):
        kv_transfer_state._KV_CONNECTOR_AGENT = self.worker
        try:
            yield
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = None

    def step(self, poison_loads=True):
        so = self.sched.schedule()
        meta = so.kv_connector_metadata
        if poison_loads:  # what a load must overwrite
            for _rid, _keys, ids in meta.loads:
                for t in self.kv.values():
                    t.view(torch.int16)[:, ids] = POISON
        self.loaded.append([(rid, ids) for rid, _k, ids in meta.loads])
        with self._worker_agent(), set_forward_context(None, self.config):
            if self.v2 is not None:
                self.v2.pre_forward(so)
                self._forward(so)
                self.v2.finish_forward()
                out = self.v2.post_forward(so.finished_req_ids)
            else:
                with KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(so) as out:
                    self._forward(so)
        self.load_errors |= set(out.invalid_block_ids)
        rids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in rids:
            req = self.sched.requests[rid]
            # a token only once every token is computed (not mid chunk);
            # schedule() has already counted this step's
            sampled.append([4000 + req.num_tokens] if req.num_computed_tokens >= req.num_tokens else [])
        mro = ModelRunnerOutput(req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)},
                                sampled_token_ids=sampled, kv_connector_output=out)
        for eco in self.sched.update_from_output(so, mro).values():
            got = eco.scheduler_stats.kv_connector_stats if eco.scheduler_stats is not None else None
            for k, n in (got or {}).items():
                self.stats[k] = self.stats.get(k, 0) + n
        return so, out

    def _forward(self, so):
        """Per layer: wait for its load (as attention does), then write the
        KV of each scheduled token (as the attention kernel does)."""
        for li, name in enumerate(LAYERS):
            self.worker.wait_for_layer_load(name)
            for rid, n in so.num_scheduled_tokens.items():
                req = self.sched.requests[rid]
                table = self.block_table(rid, self.group_of[name])
                toks = list(req.all_token_ids)
                # schedule() has already counted this step's tokens as computed
                for pos in range(req.num_computed_tokens - n, req.num_computed_tokens):
                    self.kv[name][:, table[pos // BS], pos % BS] = token_kv(li, toks[:pos + 1])
            self.worker.save_kv_layer(name, self.kv[name], None)

    def admitted(self, rid, wait_s=60.0):
        """Steps until rid is scheduled (an asynchronous load parks it while
        its blocks load): (that step's scheduler output, the block ids of
        each load issued for rid on the way, the block ids reported
        failed on the way)."""
        loads, errors = [], set()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            so, out = self.step()
            loads += [ids for r, ids in self.loaded[-1] if r == rid]
            errors |= set(out.invalid_block_ids)
            if any(n.req_id == rid for n in so.scheduled_new_reqs):
                return so, loads, errors
            time.sleep(0.01)
        raise AssertionError(f"{rid} was not scheduled in {wait_s} s")

    def run(self, limit=64, wait_s=60.0):
        """Steps until every request has finished: at most `limit` steps
        that schedule work; steps while a request waits for an
        asynchronous load (its disk reads take what they take on a loaded
        machine) do not count, within wait_s seconds."""
        steps, deadline = 0, time.monotonic() + wait_s
        while steps < limit and time.monotonic() < deadline:
            if not self.sched.has_unfinished_requests():
                return self.drain()
            self.step()
            if any(q.status == RequestStatus.WAITING_FOR_REMOTE_KVS for q in self.sched.requests.values()):
                time.sleep(0.01)
            else:
                steps += 1
        state = {r: (q.status, q.num_computed_tokens, q.num_tokens) for r, q in self.sched.requests.items()}
        raise AssertionError(f"requests did not finish: {state}")

    def drain(self):
        """Steps until the worker's saves are done and reported: their
        blocks back to vLLM, their keys in the scheduler's view."""
        for _ in range(4):
            if not (self.worker._saves or self.worker._finished_waiting or self.sched.finished_req_ids):
                return
            for s in self.worker._saves:
                s.wait()
            self.step()
        raise AssertionError("saves not reported done")

    def stored(self, seed, n):
        """A prompt of n tokens run to the end (its blocks saved), then
        vLLM's own prefix cache emptied: (prompt, its block keys)."""
        a = prompt(seed, n)
        self.add(f"p{seed}", a)
        self.run()
        self.sched.reset_prefix_cache()
        return a, keys_of(a)

    def expect_blocks(self, rid, tokens, first, count, layers=LAYERS):
        """The blocks first..first+count-1 of rid hold exactly the KV of tokens."""
        for li, name in enumerate(LAYERS):
            if name not in layers:
                continue
            table = self.block_table(rid, self.group_of[name])
            for b in range(first, first + count):
                want = torch.stack([token_kv(li, tokens[:p + 1]) for p in range(b * BS, (b + 1) * BS)], dim=1)
                got = self.kv[name][:, table[b]]
                assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{name} block {b}"


def prompt(seed, n):
    return [int(x) for x in np.random.default_rng(seed).integers(10, 3000, n)]


@pytest.fixture
def harness(tmp_path):
    made = []

    def make(extra, layout="flash_attn", window=None, runner="v1"):
        h = Harness(tmp_path, extra, layout, window, runner)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def disk_only(tmp_path):
    return {"file_dir": str(tmp_path / "kv"), "disk_blocks": 256, "namespace": "vllm-test"}


def block_file(tmp_path, key, h):
    """Where h's worker keeps the block of key on disk."""
    return tmp_path / "kv" / h.worker._namespace / f"{key:032x}.kvf"


def test_connector_is_vllms(harness, tmp_path):
    h = harness({"host_blocks": 8, **disk_only(tmp_path)})
    assert isinstance(h.worker, vllm.distributed.kv_transfer.kv_connector.v1.base.KVConnectorBase_V1)
    assert len(h.worker.engine.pools) == 2 * len(LAYERS)  # K and V of each layer
    bad = KVTransferConfig(kv_connector="KvferryConnector", kv_connector_module_path="kvferry.integrations.vllm",
                           kv_role="kv_both", kv_connector_extra_config={"host_blok": 1},
                           kv_load_failure_policy="recompute")
    cfg = VllmConfig(model_config=h.config.model_config, cache_config=h.config.cache_config,
                     scheduler_config=h.config.scheduler_config, device_config=DeviceConfig("cpu"),
                     kv_transfer_config=bad)
    with pytest.raises(kvferry.InvalidArgument, match="host_blok"):
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, h.kv_config)


@pytest.mark.parametrize("layout,pools", [("flash_attn", 2), ("flashinfer", 1), ("hnd", 2)])
def test_save_then_full_and_partial_hits(harness, tmp_path, layout, pools):
    # 5 blocks: some stay in host slots, some go to disk
    h = harness({"host_blocks": 3, **disk_only(tmp_path)}, layout)
    assert len(h.worker.engine.pools) == pools * len(LAYERS)
    a = prompt(1, 5 * BS + 3)
    h.add("a", a)
    h.run()
    sched_side = h.sched.connector
    keys = keys_of(a)
    assert len(keys) == 5 and all(sched_side._held(k) for k in keys)
    stats = h.worker.cache.stats()
    assert stats.blocks["host"] + stats.blocks["disk"] == 5 and stats.blocks["disk"] >= 2
    h.sched.reset_prefix_cache()  # vLLM's own GPU prefix cache forgets: only kvferry can hit

    b = a[:4 * BS] + prompt(2, 2 * BS + 5)  # shares 4 blocks with a
    h.add("b", b)
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 4 * BS
    (rid, ids), = h.loaded[-1]
    assert rid == "b" and ids == h.block_table("b")[:4]
    assert not out.invalid_block_ids
    h.expect_blocks("b", b, 0, 4)

    c = list(a)  # the whole prompt: every whole block but the one holding the last token
    h.add("c", c)
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 5 * BS
    h.expect_blocks("c", c, 0, 5)
    h.run()
    s = h.worker.cache.stats()
    # b's 4 blocks, then c's fifth: vLLM's own prefix cache held b's 4
    assert s.failures == 0 and sum(s.hits.values()) == 5


def test_miss_loads_nothing(harness, tmp_path):
    h = harness(disk_only(tmp_path))
    h.stored(3, 3 * BS + 1)
    h.add("d", prompt(4, 3 * BS + 1))
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0 and h.loaded[-1] == []
    assert not out.invalid_block_ids


def test_short_prompt_and_exact_blocks(harness, tmp_path):
    h = harness(disk_only(tmp_path))
    a, _ = h.stored(5, 2 * BS)  # exactly two blocks: the last token's block is recomputed
    h.add("a2", list(a))
    so, _ = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == BS
    h.expect_blocks("a2", a, 0, 1)
    h.add("tiny", a[:BS - 1])  # no whole block: nothing to look up
    so, _ = h.step()
    assert h.loaded[-1] == []


@pytest.mark.parametrize("damage", ["corrupt", "remove", "foreign"])
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_damaged_block_is_a_load_error_then_recomputed(harness, tmp_path, damage, runner):
    h = harness(disk_only(tmp_path), runner=runner)
    a, keys = h.stored(6, 4 * BS + 2)
    path = block_file(tmp_path, keys[2], h)
    assert path.exists()
    if damage == "corrupt":  # a flipped payload byte: the CRC refuses it
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x40  # in the payload
        path.write_bytes(bytes(raw))
    elif damage == "remove":
        path.unlink()
    else:  # another key's valid block in its place: the header refuses it
        path.write_bytes(block_file(tmp_path, keys[0], h).read_bytes())
    b = list(a)
    h.stats.clear()
    h.add("b", b)
    so, out = h.step()
    table = h.block_table("b")
    assert out.invalid_block_ids == {table[2]}  # vLLM's way: the block ids that failed
    # the lookup said 4 blocks; 2 arrived before the failed one: only they are hits
    assert failed_load_stats(h) == {"hit_tokens_disk": 2 * BS, "load_failed_tokens_disk": 2 * BS,
                                    "load_failed_requests": 1}
    assert h.stats["load_failed_blocks"] == 1 and h.stats["loaded_blocks"] == 3
    # what did arrive is right; the failed block is never served
    h.expect_blocks("b", b, 0, 2)
    assert not h.sched.connector._held(keys[2])  # the worker's REMOVED event reached the scheduler
    h.run()  # vLLM recomputes from the failed block
    s = h.worker.cache.stats()
    assert s.failures >= 1
    h.sched.reset_prefix_cache()
    h.stats.clear()
    h.add("c", list(a))
    so, out = h.step()
    assert not out.invalid_block_ids
    h.expect_blocks("c", a, 0, 4)  # the recomputed block was saved again
    # what kvferry loaded (past vLLM's own prefix cache), every block a hit
    assert set(failed_load_stats(h)) == {"hit_tokens_disk"}
    assert h.stats["hit_tokens_disk"] == h.stats["loaded_blocks"] * BS


def failed_load_stats(h):
    """The scheduler side's hit and failed-load counters in the stats vLLM
    got since h.stats was cleared."""
    return {k: n for k, n in h.stats.items() if k.startswith(("hit_tokens_", "load_failed_tokens_",
                                                              "load_failed_requests"))}


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_evicted_between_lookup_and_load(harness, tmp_path, runner):
    h = harness(disk_only(tmp_path), runner=runner)
    a, keys = h.stored(7, 3 * BS + 1)
    assert h.worker.cache.remove([keys[1]]) == 1  # gone after the scheduler's lookup saw it
    h.stats.clear()
    h.add("b", list(a))
    so, out = h.step()
    table = h.block_table("b")
    assert table[1] in out.invalid_block_ids and table[0] not in out.invalid_block_ids
    h.expect_blocks("b", a, 0, 1)
    assert failed_load_stats(h) == {"hit_tokens_disk": BS, "load_failed_tokens_disk": 2 * BS,
                                    "load_failed_requests": 1}


def test_restart_finds_disk_blocks(harness, tmp_path):
    a = prompt(8, 3 * BS + 4)
    h = harness(disk_only(tmp_path))
    h.add("a", a)
    h.run()
    h.close()
    h2 = harness(disk_only(tmp_path))  # a new instance: same directory, namespace and model
    # the scheduler read the directory itself: its first request hits
    assert all(h2.sched.connector._held(k) for k in keys_of(a))
    h2.add("c", list(a))
    so, out = h2.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 3 * BS and not out.invalid_block_ids
    h2.expect_blocks("c", a, 0, 3)


def test_lora_is_in_the_key(tmp_path):
    a = prompt(10, 2 * BS + 1)
    from vllm.lora.request import LoRARequest

    mine = keys_of(a)
    lora = keys_of(a, lora_request=LoRARequest("adapter", 1, str(tmp_path)))
    assert set(lora).isdisjoint(mine) and len(lora) == len(mine) == 2


def test_host_bytes_and_bad_tensors(harness, tmp_path):
    per_block = 2 * len(LAYERS) * BS * HEADS * HEAD * 2  # K and V of every layer, fp16
    h = harness({"host_bytes": per_block * 5 + 7})
    assert h.worker.cache.config["host_blocks"] == 5
    w = KVConnectorFactory.create_connector(h.config, KVConnectorRole.WORKER, h.kv_config)
    with pytest.raises(kvferry.InvalidArgument, match="layer bad: .* no dimension of 64 blocks"):
        w.register_kv_caches({"bad": torch.empty(3, 5)})
    w = KVConnectorFactory.create_connector(h.config, KVConnectorRole.WORKER, h.kv_config)
    gappy = torch.empty(2, BLOCKS, BS, HEADS, 2 * HEAD, dtype=torch.float16)[..., :HEAD]
    with pytest.raises(kvferry.InvalidArgument, match="not one dense run"):
        w.register_kv_caches({"gappy": gappy})


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_loads_are_waited_layer_by_layer(harness, tmp_path, monkeypatch, runner):
    h = harness(disk_only(tmp_path), runner=runner)
    a, _ = h.stored(12, 3 * BS + 1)
    waited = []
    real = kvferry.Ticket.wait_pool

    def spy(ticket, pool):  # records, then really waits
        waited.append(pool)
        return real(ticket, pool)

    monkeypatch.setattr(kvferry.Ticket, "wait_pool", spy)
    h.add("b", list(a))
    h.step()
    # each layer waits for its own K and V pools, in layer order, before its attention
    assert waited == [p for name in LAYERS for p in h.worker._layer_pools[name]] == [0, 1, 2, 3]
    h.expect_blocks("b", a, 0, 3)
    assert kvf_vllm.KvferryConnector.requires_piecewise_for_cudagraph({})


# A prefill of about 1 us a token: cheap next to a disk of 1 MB/s, dear next
# to a host tier of 1 TB/s.
CHEAP_PREFILL = [[16, 16e-6], [4096, 4096e-6]]


def planned(tmp_path, **more):
    return {**disk_only(tmp_path), "prefill_cost": CHEAP_PREFILL, "plan_min_gain": 0, **more}


def test_plan_recomputes_hits_of_a_slow_tier(harness, tmp_path):
    """Disk hits that would take longer to read than to compute are not
    reported matched: vLLM computes them, and they stay stored."""
    h = harness(planned(tmp_path, tier_costs={"disk": [0.01, 1e6]}))
    a, keys = h.stored(13, 4 * BS + 3)
    side = h.sched.connector
    assert side._link is not None and side._link[0] == 2 * len(LAYERS) * BS * HEADS * HEAD * 2
    assert all(side._stored[(0, 0, 0)][k] == int(kvferry.Tier.DISK) for k in keys)
    h.add("b", list(a))
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0 and h.loaded[-1] == []
    assert side.plan_counts == {"planned": 1, "loaded": 0, "recomputed": 4}
    h.expect_blocks("b", a, 0, 4)  # computed by this step's forward, not loaded
    h.run()
    assert all(block_file(tmp_path, k, h).exists() for k in keys) and all(side._held(k) for k in keys)
    assert h.worker.cache.stats().failures == 0


def test_plan_loads_hits_that_pay(harness, tmp_path):
    """The same hits from a fast tier (the worker's held cost) are loaded."""
    h = harness(planned(tmp_path, tier_costs={"disk": [0.0, 1e12]}))
    a, _ = h.stored(14, 4 * BS + 3)
    h.add("b", list(a))
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 4 * BS
    assert h.sched.connector.plan_counts == {"planned": 1, "loaded": 4, "recomputed": 0}
    assert not out.invalid_block_ids
    h.expect_blocks("b", a, 0, 4)


def test_plan_loads_the_fast_tiers_leading_hits(harness, tmp_path):
    """Hits in the host tier (fast) before hits on a slow disk: the plan
    loads the leading run of host hits and recomputes from the first disk
    hit on (a disk block in the loads would cost its 10 s latency)."""
    h = harness(planned(tmp_path, host_blocks=3, tier_costs={"disk": [10.0, 1e6], "host": [0.0, 1e12]}))
    side = h.sched.connector
    first, _ = h.stored(15, 3 * BS + 1)  # 3 blocks, to disk when the next prompt needs the host slots
    a = first[:3 * BS] + prompt(16, 2 * BS + 1)
    h.add("a", a)
    h.run()
    h.sched.reset_prefix_cache()
    keys = keys_of(a)
    tiers = [side._stored[(0, 0, 0)][k] for k in keys]
    assert int(kvferry.Tier.DISK) in tiers and int(kvferry.Tier.HOST) in tiers, tiers
    lead = next((i for i, t in enumerate(tiers) if t != int(kvferry.Tier.HOST)), len(tiers))
    before = dict(side.plan_counts)
    h.add("b", list(a))
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == lead * BS
    assert side.plan_counts["loaded"] - before["loaded"] == lead
    assert side.plan_counts["recomputed"] - before["recomputed"] == 5 - lead
    assert [rid for rid, _ in h.loaded[-1]] == (["b"] if lead else [])
    h.expect_blocks("b", a, 0, 5)  # loaded, then computed by the forward


def test_plan_config_refused_by_name(harness, tmp_path):
    h = harness(disk_only(tmp_path))
    for extra, match in (({"prefill_cost": [[16, -1.0]]}, "seconds"),
                         ({"plan_min_gain": 0.1}, "plan_min_gain without prefill_cost"),
                         ({"prefill_cost": CHEAP_PREFILL, "plan_min_gain": 1.5}, "min_gain"),
                         ({"tier_costs": {"tape": [0, 1e9]}}, "tier_costs 'tape'"),
                         ({"tier_costs": {"disk": [0, -1]}}, "disk")):
        cfg = KVTransferConfig(kv_connector="KvferryConnector", kv_connector_module_path="kvferry.integrations.vllm",
                               kv_role="kv_both", kv_connector_extra_config={**disk_only(tmp_path), **extra},
                               kv_load_failure_policy="recompute")
        vc = VllmConfig(model_config=h.config.model_config, cache_config=h.config.cache_config,
                        scheduler_config=h.config.scheduler_config, device_config=DeviceConfig("cpu"),
                        kv_transfer_config=cfg)
        with pytest.raises(kvferry.InvalidArgument, match=match):
            w = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, h.kv_config)
            w.register_kv_caches({n: kv_tensor("flash_attn")[0] for n in LAYERS})


# ---- identity: two requests or configurations whose blocks differ never share one ----


def test_tenants_never_share_and_one_tenant_does(harness, tmp_path):
    """cache_salt is in vLLM's block hash and so in kvferry's key: tenant B
    with tenant A's prompt misses, tenant A again hits."""
    h = harness(disk_only(tmp_path))
    a = prompt(20, 4 * BS + 3)
    h.add("a", a, cache_salt="tenant-A")
    h.run()
    h.sched.reset_prefix_cache()
    assert set(keys_of(a, cache_salt="tenant-A")).isdisjoint(keys_of(a, cache_salt="tenant-B"))
    h.add("b", list(a), cache_salt="tenant-B")
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0 and h.loaded[-1] == []
    h.run()
    h.sched.reset_prefix_cache()
    h.add("a2", list(a), cache_salt="tenant-A")
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 4 * BS and not out.invalid_block_ids
    h.expect_blocks("a2", a, 0, 4)


def mm_feature(identifier, offset, length):
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return MultiModalFeatureSpec(data=None, modality="image", identifier=identifier,
                                 mm_position=PlaceholderRange(offset=offset, length=length))


def test_images_with_equal_placeholders_never_share():
    """Two prompts with the same placeholder tokens for different images:
    every block from the image on differs, the text before it is shared."""
    toks = prompt(21, BS) + [7] * (2 * BS) + prompt(22, BS + 1)
    cat = keys_of(toks, mm_features=[mm_feature("image-cat", BS, 2 * BS)])
    dog = keys_of(toks, mm_features=[mm_feature("image-dog", BS, 2 * BS)])
    text = keys_of(toks)
    assert len(cat) == len(dog) == 4
    assert cat[0] == dog[0] == text[0]
    assert set(cat[1:]).isdisjoint(dog[1:]) and set(cat[1:]).isdisjoint(text[1:])


def test_prompt_embeddings_are_in_the_key():
    toks = prompt(23, 2 * BS + 1)
    one = keys_of(toks, prompt_embeds=torch.ones(len(toks), 8))
    two = keys_of(toks, prompt_embeds=torch.full((len(toks), 8), 2.0))
    assert set(one).isdisjoint(two) and set(one).isdisjoint(keys_of(toks))


def test_salt_setting_is_in_the_key():
    h = b"\x01" * 32
    assert kvf_vllm.block_key(h) != kvf_vllm.block_key(h, kvferry.key_salt("secret"))
    assert kvf_vllm.block_key(b"\x00" * 32) == 1  # never the root key
    with pytest.raises(kvferry.InvalidArgument, match="4 bytes.*16"):
        kvf_vllm.block_key(b"abcd")


def heads(**over):
    """namespace_head for each worker of a configuration (over: ParallelConfig
    and CacheConfig / ModelConfig settings), by worker."""
    from vllm.config import ParallelConfig

    par = {k: over.pop(k) for k in list(over) if k.endswith("parallel_size")}
    cache = {k: over.pop(k) for k in list(over) if k in ("cache_dtype", "block_size")}
    cfg = VllmConfig.__new__(VllmConfig)  # the fields namespace_head reads, validated by their own classes
    object.__setattr__(cfg, "parallel_config", ParallelConfig.__new__(ParallelConfig))
    for k, v in {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "prefill_context_parallel_size": 1,
                 "decode_context_parallel_size": 1, **par}.items():
        object.__setattr__(cfg.parallel_config, k, v)
    object.__setattr__(cfg, "cache_config", CacheConfig(**{"block_size": BS, **cache}))
    mc = type("ModelConfig", (), {"model": over.pop("model", "org/tiny"), "dtype": over.pop("dtype", torch.float16),
                                  "use_mla": over.pop("use_mla", False)})()
    object.__setattr__(cfg, "model_config", mc)
    assert not over, over
    return {r: kvf_vllm.namespace_head(cfg, {}, r, kvf_vllm._dcp_rank_of(cfg, r[0])) for r in kvf_vllm._ranks(cfg)}


def test_namespace_names_every_dimension_of_a_page():
    one = heads()[(0, 0, 0)]
    pp = heads(pipeline_parallel_size=2)
    tp = heads(tensor_parallel_size=2)
    dcp = heads(tensor_parallel_size=2, decode_context_parallel_size=2)
    mla = heads(tensor_parallel_size=2, use_mla=True)
    mla_dcp = heads(tensor_parallel_size=2, decode_context_parallel_size=2, use_mla=True)
    pcp = heads(prefill_context_parallel_size=2)
    # PP stages hold different layers: every stage its own namespace
    assert len(set(pp.values())) == 2 and one not in pp.values()
    # prefill-context ranks hold different tokens' KV
    assert len(set(pcp.values())) == 2 and all("pcp" in v for v in pcp.values()) and one not in pcp.values()
    assert heads(model="org/other")[(0, 0, 0)] != one
    assert len(set(tp.values())) == 2
    assert len(set(dcp.values())) == 2 and all("dcp" in v for v in dcp.values())
    # MLA: TP ranks hold equal pages, one namespace; DCP ranks still split it
    assert len(set(mla.values())) == 1 and len(set(mla_dcp.values())) == 2
    # the KV dtype, "auto" resolved to the model's
    assert heads(dtype=torch.bfloat16)[(0, 0, 0)] != one
    assert heads(cache_dtype="fp8")[(0, 0, 0)] != one
    assert heads(cache_dtype="float16")[(0, 0, 0)] != heads(cache_dtype="fp8_e5m2")[(0, 0, 0)]
    assert heads(block_size=2 * BS)[(0, 0, 0)] != one
    # a head leaves room for the layout: the whole name fits 64 characters
    long = heads(pipeline_parallel_size=2)[(0, 1, 0)]
    assert len(long) <= kvf_vllm._HEAD_LEN


def test_layouts_never_share_a_namespace():
    """FlashAttention's NHD and an HND layout of equal-sized blocks hold the
    same bytes in another order: their namespaces differ."""
    tags = {lay: kvf_vllm.layout_tag({n: kv_tensor(lay)[0] for n in LAYERS}) for lay in ("flash_attn", "flashinfer",
                                                                                            "hnd")}
    assert len(set(tags.values())) == 3
    assert tags["flash_attn"] == kvf_vllm.layout_tag({n: kv_tensor("flash_attn")[0] for n in LAYERS})


def test_pipeline_stages_never_read_each_other(harness, tmp_path, monkeypatch):
    """Two workers of one directory as two PP stages: the second stage's
    cache finds none of the first's blocks, and its scheduler view neither."""
    h = harness(disk_only(tmp_path))
    object.__setattr__(h.config.parallel_config, "pipeline_parallel_size", 2)  # the instance's two stages
    for conn in (h.worker, h.sched.connector):
        conn._vllm_config = h.config
    h.worker.shutdown()  # stage 0 again, now knowing it is one of two
    monkeypatch.setattr(kvf_vllm, "_worker_rank", lambda: ((0, 0, 0), 0))
    h.worker.register_kv_caches({n: kv for n, kv in h.kv.items()})
    a, keys = h.stored(24, 3 * BS + 1)
    monkeypatch.setattr(kvf_vllm, "_worker_rank", lambda: ((0, 1, 0), 0))
    w = KVConnectorFactory.create_connector(h.config, KVConnectorRole.WORKER, h.kv_config)
    w.register_kv_caches({n: kv_tensor("flash_attn")[0] for n in LAYERS})
    try:
        assert "pp0of2" in h.worker._namespace and "pp1of2" in w._namespace
        assert w.cache.lookup(keys)[0] == 0 and h.worker.cache.lookup(keys)[0] == 3
    finally:
        w.shutdown()


def test_a_hit_needs_every_worker(harness, tmp_path):
    """With two workers, a block one of them reported is not a hit."""
    h = harness(disk_only(tmp_path))
    side = h.sched.connector
    side._stored[(1, 0, 0)] = {}  # a second TP rank that has stored nothing
    a, keys = h.stored(25, 2 * BS + 1)
    h.add("b", list(a))
    so, _ = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0
    meta = kvf_vllm.KvferryWorkerMetadata({(1, 0, 0): [(int(kvferry.EventKind.STORED), k, 0) for k in keys]})
    agg = kvf_vllm.KvferryWorkerMetadata({(0, 0, 0): []}).aggregate(meta)
    assert set(agg.events) == {(0, 0, 0), (1, 0, 0)}
    side.update_connector_output(type("Out", (), {"kv_connector_worker_meta": agg})())
    assert all(side._held(k) for k in keys)


def test_a_hit_counts_once_every_worker_loaded_it(harness, tmp_path):
    """Two TP workers: a request's hit counts when both have said how its
    load ended, and only the blocks both brought (vLLM recomputes from
    the first block any worker lacks); the rest count as failed, never as
    hits. Two workers' metadata of one step merge their load reports."""
    h = harness(disk_only(tmp_path))
    side = h.sched.connector
    a, keys = h.stored(44, 3 * BS + 1)
    second = (1, 0, 0)
    side._ranks = [(0, 0, 0), second]  # a second TP rank, holding the blocks too
    side._stored[second] = {k: int(kvferry.Tier.DISK) for k in keys}
    h.stats.clear()
    h.add("b", list(a))
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 3 * BS and not out.invalid_block_ids
    assert failed_load_stats(h) == {} and "b" in side._pending_hits  # rank 1 has not spoken
    ours = kvf_vllm.KvferryWorkerMetadata({(0, 0, 0): []}, loads={(0, 0, 0): [("x", kvf_vllm._ALL)]})
    theirs = kvf_vllm.KvferryWorkerMetadata({second: []}, loads={second: [("b", 1)]})  # its block 1 failed
    merged = ours.aggregate(theirs)
    assert merged.loads == {(0, 0, 0): [("x", kvf_vllm._ALL)], second: [("b", 1)]}
    side.update_connector_output(type("Out", (), {"kv_connector_worker_meta": merged})())
    assert not side._pending_hits
    assert side.get_kv_connector_stats().data == {"hit_tokens_disk": BS, "load_failed_tokens_disk": 2 * BS,
                                                  "load_failed_requests": 1}


def test_load_failure_policy_fail_is_refused_by_name(harness, tmp_path):
    h = harness(disk_only(tmp_path))
    for policy in ("fail", None):
        kw = {} if policy is None else {"kv_load_failure_policy": policy}
        cfg = KVTransferConfig(kv_connector="KvferryConnector", kv_connector_module_path="kvferry.integrations.vllm",
                               kv_role="kv_both", kv_connector_extra_config=disk_only(tmp_path), **kw)
        vc = VllmConfig(model_config=h.config.model_config, cache_config=h.config.cache_config,
                        scheduler_config=h.config.scheduler_config, device_config=DeviceConfig("cpu"),
                        kv_transfer_config=cfg)
        with pytest.raises(kvferry.InvalidArgument, match="kv_load_failure_policy is 'fail'"):
            KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, h.kv_config)


@pytest.mark.parametrize("extra,match", [({"remote": "sideways"}, "remote = 'sideways'"),
                                         ({"load": "lazy"}, "load = 'lazy'"),
                                         ({"disk_bytes": "lots"}, "disk_bytes = 'lots'"),
                                         ({"host_blocks": -1}, "host_blocks = -1"),
                                         ({"priority": 101}, "priority = 101"),
                                         ({"disk_blocks": 4}, "without file_dir")])
def test_bad_config_refused_at_start_by_key(harness, tmp_path, extra, match):
    h = harness({"host_blocks": 2})
    cfg = KVTransferConfig(kv_connector="KvferryConnector", kv_connector_module_path="kvferry.integrations.vllm",
                           kv_role="kv_both", kv_connector_extra_config=extra, kv_load_failure_policy="recompute")
    vc = VllmConfig(model_config=h.config.model_config, cache_config=h.config.cache_config,
                    scheduler_config=h.config.scheduler_config, device_config=DeviceConfig("cpu"),
                    kv_transfer_config=cfg)
    with pytest.raises(kvferry.InvalidArgument, match=match):
        KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, h.kv_config)


def test_generated_blocks_are_saved(harness, tmp_path):
    """A conversation's next turn (prompt + answer + new text) finds the
    answer's blocks: decode-produced blocks are saved."""
    h = harness(disk_only(tmp_path))
    a = prompt(26, 2 * BS + 2)
    h.add("a", a, max_tokens=2 * BS)
    h.run()
    h.sched.reset_prefix_cache()
    answered = [4000 + n for n in range(len(a), len(a) + 2 * BS)]  # the harness's sampled tokens
    turn2 = a + answered + prompt(27, BS)
    keys = keys_of(turn2)
    assert sum(h.sched.connector._held(k) for k in keys) == (len(a) + 2 * BS - 1) // BS
    h.add("t2", turn2)
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 4 * BS and not out.invalid_block_ids
    h.expect_blocks("t2", turn2, 0, 4)


def test_whole_loads_finish_before_the_forward(harness, tmp_path):
    h = harness({**disk_only(tmp_path), "load": "whole"})
    assert not kvf_vllm.KvferryConnector.requires_piecewise_for_cudagraph({"load": "whole"})
    a, _ = h.stored(28, 3 * BS + 1)
    h.add("b", list(a))
    so = h.sched.schedule()
    with h._worker_agent(), set_forward_context(None, h.config):
        h.worker.bind_connector_metadata(so.kv_connector_metadata)
        h.worker.start_load_kv(None)
        assert h.worker._load_ticket is None  # nothing left for the layers to wait on
    h.expect_blocks("b", a, 0, 3)


def test_restart_with_more_blocks_than_a_queue_holds(harness, tmp_path):
    """70,000 blocks on disk (more than the 65,536 events a cache's queue
    holds): a restarted instance's scheduler knows all of them before its
    first request, and that request hits; the worker's event channel
    dropped none of the stores either."""
    n = 70_000
    extra = {"disk_blocks": n + 100, "file_dir": str(tmp_path / "kv"), "threads": 2}
    h = harness(extra)
    a = prompt(30, 3 * BS + 1)
    h.add("a", a)
    h.run()
    filler = [0x1000 + i for i in range(n)]  # other blocks' keys, their bytes any block's
    for i in range(0, n, 4096):
        ks = filler[i:i + 4096]
        assert all(s == kvferry.Status.OK for s in h.worker.cache.put(ks, [j % BLOCKS for j in range(len(ks))]).wait())
    meta = h.worker.build_connector_worker_meta()
    assert len(meta.events[(0, 0, 0)]) == n  # every filler (a's blocks went out with its steps)
    h.close()
    h2 = harness(extra)
    side = h2.sched.connector
    assert len(side._stored[(0, 0, 0)]) == n + 3
    h2.add("c", list(a))
    so, out = h2.step()  # the first request of the new instance
    assert so.scheduled_new_reqs[0].num_computed_tokens == 3 * BS and not out.invalid_block_ids
    h2.expect_blocks("c", a, 0, 3)


def test_saves_finish_in_the_background_and_hold_the_blocks(harness, tmp_path, monkeypatch):
    """wait_for_save starts the put and returns; a finished request's blocks
    stay vLLM's until get_finished reports its saves done; a preempted
    request's saves are waited for before the step's forward."""
    h = harness(disk_only(tmp_path))
    h.add("a", prompt(31, 3 * BS + 1))
    in_flight = {"on": True}
    real_poll = kvferry.Ticket.poll
    monkeypatch.setattr(kvferry.Ticket, "poll", lambda t: None if in_flight["on"] else real_poll(t))
    while h.sched.has_unfinished_requests():
        h.step()
    assert h.worker._saves  # started, not waited for
    so, out = h.step()  # 'a' finished: vLLM holds its blocks while the save is in flight
    assert not out.finished_sending and "a" in h.sched.requests
    in_flight["on"] = False
    for s in h.worker._saves:
        s.wait()
    so, out = h.step()
    assert out.finished_sending == {"a"} and "a" not in h.sched.requests
    assert not h.worker._saves and not h.worker._saved_reqs
    # preemption: the request's saves are waited for (not polled) first
    in_flight["on"] = True
    h.add("b", prompt(32, 2 * BS + 1), max_tokens=4)
    h.step()
    assert h.worker._save_count.get("b")
    h.worker.handle_preemptions(kvf_vllm.KvferryConnectorMetadata(preempted=["b"]))
    assert "b" not in h.worker._save_count
    in_flight["on"] = False
    h.run()


def test_the_step_thread_never_puts(harness, tmp_path, monkeypatch):
    """wait_for_save only queues: the put runs on the saver thread, so a
    put that takes its time (here held until released) stalls no step; the
    finished request's blocks stay vLLM's until the put has read them, and
    the stored bytes are the forward's. A put the cache refuses stores
    nothing: the scheduler stops counting its keys (a later miss, never a
    hit that fails)."""
    import threading

    h = harness(disk_only(tmp_path))
    cache = h.worker.cache
    real_put = cache.put
    release, threads = threading.Event(), []

    def held_put(*a, **kw):
        threads.append(threading.current_thread())
        assert release.wait(60)
        return real_put(*a, **kw)

    monkeypatch.setattr(cache, "put", held_put)
    a = prompt(41, 3 * BS + 1)
    h.add("a", a)
    for _ in range(8):  # 'a' runs to its end and finishes while its put is held
        h.step()
        if "a" not in h.sched.running and not h.sched.waiting:
            break
    deadline = time.monotonic() + 30
    while not threads and time.monotonic() < deadline:  # the saver thread takes the put up
        time.sleep(0.01)
    assert threads and threading.current_thread() not in threads
    assert h.worker._save_count.get("a") and "a" in h.sched.requests  # vLLM still holds its blocks
    release.set()
    h.drain()
    assert "a" not in h.sched.requests and not h.worker._saves
    h.sched.reset_prefix_cache()
    h.add("b", list(a))
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 3 * BS and not out.invalid_block_ids
    h.expect_blocks("b", a, 0, 3)
    h.run()

    def refused(*a, **kw):
        raise kvferry.NoSpace("every block is pinned")

    monkeypatch.setattr(cache, "put", refused)
    c = prompt(42, 2 * BS + 1)
    h.add("c", c)
    h.run()
    side = h.sched.connector
    assert not side._in_flight & set(keys_of(c)) and not any(side._held(k) for k in keys_of(c))
    h.sched.reset_prefix_cache()
    h.add("d", list(c))
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0 and not out.invalid_block_ids
    h.run()


def test_a_block_still_being_saved_is_loaded_after_its_save(harness, tmp_path, monkeypatch):
    """The next request asks for blocks whose save has not reported back:
    the scheduler counts them (saves in flight), the worker's load waits for
    the save, and the bytes are right."""
    h = harness(disk_only(tmp_path))
    a = prompt(33, 3 * BS + 1)
    h.add("a", a)
    monkeypatch.setattr(kvferry.Ticket, "poll", lambda t: None)  # every save looks in flight
    with monkeypatch.context() as lagging:  # the worker's events have not arrived yet
        lagging.setattr(h.worker, "build_connector_worker_meta", lambda: None)
        while h.sched.has_unfinished_requests():
            h.step()
    assert h.worker._saves and not any(h.sched.connector._stored.values())
    assert set(keys_of(a)) == h.sched.connector._in_flight
    h.sched.reset_prefix_cache()
    h.add("b", list(a))
    so, out = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 3 * BS and not out.invalid_block_ids
    h.expect_blocks("b", a, 0, 3)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_hit_sources_name_the_tier(harness, tmp_path, monkeypatch, runner):
    """vLLM's per-source cache metrics (asked as the request is admitted)
    and kvferry's hit_tokens_<tier> stats (counted once the load ended)
    get the host and disk tokens apart."""
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    h = harness({"host_blocks": 2, **disk_only(tmp_path)}, runner=runner)
    a, keys = h.stored(34, 4 * BS + 1)
    side = h.sched.connector
    tiers = [side._tier(k) for k in keys]
    sources = []
    real = side.get_external_cache_hit_sources
    monkeypatch.setattr(side, "get_external_cache_hit_sources", lambda *a: sources.append(real(*a)) or sources[-1])
    h.stats.clear()
    h.add("b", list(a))
    so, _ = h.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 4 * BS
    want, stats = {}, {}
    for t in tiers:
        s = CacheHitSource.HOST if t == kvferry.Tier.HOST else CacheHitSource.DISK
        want[s] = want.get(s, 0) + BS
        stats[f"hit_tokens_{t.name.lower()}"] = stats.get(f"hit_tokens_{t.name.lower()}", 0) + BS
    assert sources == [want] and len(want) == 2
    assert {k: n for k, n in h.stats.items() if "tokens" in k or "requests" in k} == stats
    assert h.stats["loaded_blocks"] == 4 and "load_failed_blocks" not in h.stats


def kv_config_of(*specs):
    """A KVCacheConfig of one group per spec, layers named by group."""
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"model.layers.{i}.attn"], s) for i, s in enumerate(specs)])


def test_each_kv_cache_group_has_keys_of_its_own():
    """A hybrid model's groups (full attention, a sliding window) hold
    different layers' bytes under one block hash: their keys differ; one
    group keeps the keys of a model without groups."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    full = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
    window = SlidingWindowSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16,
                               sliding_window=2 * BS)
    one = kvf_vllm.kv_groups(kv_config_of(full), BS, 5)
    assert [(g.window, g.salt) for g in one] == [(False, 5)]
    two = kvf_vllm.kv_groups(kv_config_of(window, full), BS, 5)
    assert [g.window for g in two] == [True, False]
    h = vllm_request("k", prompt(1, BS)).block_hashes[0]
    assert len({kvf_vllm.block_key(h, g.salt) for g in two + one}) == 3


def test_kv_cache_groups_kvferry_cannot_store_are_refused_by_name():
    """Mamba / linear-attention state vLLM keeps per request only (its
    "none" mode: one running state, never a block boundary's) and a group
    of another block size than vLLM hashes at."""
    from vllm.v1.kv_cache_interface import MambaSpec

    full = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
    mamba = MambaSpec(block_size=BS, shapes=((4, 8),), dtypes=(torch.float16,))
    with pytest.raises(kvferry.KvferryError, match=r"KV cache group 1 \(MambaSpec, layers model.layers.1.attn\): "
                       r"cache_config.mamba_cache_mode is 'none'.*enable_prefix_caching"):
        kvf_vllm.kv_groups(kv_config_of(full, mamba), BS, 0)
    wide = FullAttentionSpec(block_size=2 * BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
    with pytest.raises(kvferry.KvferryError, match=rf"group 0 .*block_size {2 * BS} is not the cache's block_size"):
        kvf_vllm.kv_groups(kv_config_of(wide), BS, 0)


def test_state_groups_key_the_state_at_a_block_end():
    """A Mamba group in vLLM's align mode: a state group whose keys carry
    the group and the state's layout (two element types of one state never
    share a key, whatever the groups), whose hit needs the state at its
    end only."""
    from kvferry.integrations._vllm_kv import first_needed
    from vllm.v1.kv_cache_interface import MambaSpec

    full = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
    f16 = MambaSpec(block_size=BS, shapes=((4, 8), (2, 8, 8)), dtypes=(torch.float16, torch.float32),
                    mamba_cache_mode="align")
    f32 = MambaSpec(block_size=BS, shapes=((4, 8), (2, 8, 8)), dtypes=(torch.float16, torch.float16),
                    mamba_cache_mode="align")
    a = kvf_vllm.kv_groups(kv_config_of(f16, full), BS, 5)
    b = kvf_vllm.kv_groups(kv_config_of(f32, full), BS, 5)
    alone = kvf_vllm.kv_groups(kv_config_of(f16), BS, 5)
    assert [(g.state, g.window) for g in a] == [(True, False), (False, False)]
    assert a[1] == b[1] and len({a[0].salt, b[0].salt, 5}) == 3
    assert alone[0].salt == a[0].salt  # a state group's keys: its layers and layout, not the other groups
    # a hit of 6 blocks needs the state after block 5; vLLM's own 2 blocks change nothing
    assert first_needed(a[0], 6, 2, BS, None) == 5 and first_needed(a[1], 6, 2, BS, None) == 2


def test_a_state_page_overlaid_on_an_attention_page_is_one_pool():
    """vLLM lays a hybrid's state layers (raw bytes: the state, padded to
    an attention page) over the attention layer's pages: one pool, each
    block stored once; a state tensor alone is cut by its page."""
    from kvferry.integrations._vllm_kv import cut_kv_caches, tensor_ident, unique_pools

    nb, page = 8, 2 * BS * HEADS * HEAD * 2  # bytes of an fp16 K+V page
    buf = torch.zeros(nb * page, dtype=torch.int8)
    attn = buf.view(torch.float16).view(nb, HEADS, BS, 2 * HEAD)
    state = buf.view(nb, page)[:, : page // 3].view(nb, 1, 1, page // 3)  # the state's bytes of each page
    cut = cut_kv_caches({"l0.linear": state, "l1.linear": state, "l2.attn": attn}, nb, BS, {"l0.linear", "l1.linear"})
    assert cut[tensor_ident(state)] is cut[tensor_ident(attn)] and len(unique_pools(cut)) == 1
    (pool,) = unique_pools(cut)[0]
    assert (pool.slot_stride, pool.geometry.block_bytes) == (page, page)
    alone = cut_kv_caches({"l0.linear": state}, nb, BS, {"l0.linear"})
    (pool,) = unique_pools(alone)[0]
    assert (pool.buffer.ptr, pool.slot_stride, pool.geometry.block_bytes) == (buf.data_ptr(), page, page)
    with pytest.raises(kvferry.KvferryError, match="layer l0.linear: its state pages do not fit"):
        short = torch.zeros((nb - 1) * page + 8, dtype=torch.int8)  # the last state ends its memory
        cut_kv_caches({"l0.linear": short.as_strided((nb, 1, 1, 8), (page, 8, 8, 1))}, nb, BS, {"l0.linear"})


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_sliding_window_group_loads_only_its_window(harness, tmp_path, runner):
    """A hybrid model under vLLM's hybrid manager: layer 0 in a sliding-
    window group (2 blocks), layer 1 in a full-attention group. A 6-block
    hit loads all 6 full-attention blocks and only the window group's last
    2 (its earlier blocks stay vLLM's null block), byte for byte into
    poisoned blocks; with the window's last block gone, the hit is the
    longest whose window is still held."""
    h = harness({"host_blocks": 64}, window=2 * BS, runner=runner)  # loads asynchronously, as a hybrid model must
    a = prompt(7, 6 * BS + 1)
    h.add("a", a)
    h.run()
    g = h.sched.connector._groups
    wkeys = [kvf_vllm.block_key(x, g[0].salt) for x in vllm_request("k", a).block_hashes]
    fkeys = [kvf_vllm.block_key(x, g[1].salt) for x in vllm_request("k", a).block_hashes]
    assert all(h.sched.connector._held(k) for k in wkeys + fkeys)  # every whole block of both groups saved
    h.sched.reset_prefix_cache()

    h.add("b", list(a))
    so, loads, errors = h.admitted("b")
    assert so.scheduled_new_reqs[0].num_computed_tokens == 6 * BS and not errors
    assert sorted(len(ids) for ids in loads) == [2, 6]  # the window group's 2, the full group's 6
    assert h.block_table("b", 0)[:4] == [0] * 4  # vLLM's null block: never loaded into
    h.expect_blocks("b", a, 4, 2, layers=[LAYERS[0]])
    h.expect_blocks("b", a, 0, 6, layers=[LAYERS[1]])
    h.run()
    h.sched.reset_prefix_cache()

    h.worker.cache.remove(wkeys[:3])  # blocks no window of a 6-block hit reaches: still a hit
    h.step()  # the worker reports the removal to the scheduler
    h.add("c", list(a))
    so, _, errors = h.admitted("c")
    assert so.scheduled_new_reqs[0].num_computed_tokens == 6 * BS and not errors
    assert "c" not in h.sched.connector._no_hits  # loaded, not failed and computed again
    h.run()
    h.sched.reset_prefix_cache()

    h.worker.cache.remove([wkeys[5]])  # the window of a 6-block hit lacks its last block
    h.step()
    h.add("d", list(a))
    so, _, errors = h.admitted("d")
    # 5 blocks: their window (blocks 3, 4) is held
    assert so.scheduled_new_reqs[0].num_computed_tokens == 5 * BS and not errors
    h.expect_blocks("d", a, 3, 2, layers=[LAYERS[0]])
    h.expect_blocks("d", a, 0, 5, layers=[LAYERS[1]])
    h.run()


def test_window_saves_finish_before_the_next_step_writes(harness, tmp_path):
    """vLLM frees a sliding window's blocks that leave it at the next
    schedule, and the next step may write them: their save, unlike a full-
    attention block's (held to the request's end), is waited for before
    that step's forward (handle_preemptions, which vLLM calls first)."""
    h = harness({"host_blocks": 64}, window=2 * BS)
    h.add("a", prompt(8, 6 * BS + 1), max_tokens=4)
    h.step()
    (t,) = h.worker._transient
    assert len(h.worker._saves) == 2  # the full group's save and the window's
    h.worker.handle_preemptions(kvf_vllm.KvferryConnectorMetadata())
    assert not h.worker._transient and t.done()
    h.run()


def test_model_runner_v2_waits_for_window_saves_before_the_next_forward(harness, tmp_path, monkeypatch):
    """Model Runner V2 calls handle_preemptions before each step's forward:
    a sliding window's block saved in one step (vLLM frees it at the next
    schedule) is read by its put before the next forward may write it,
    however long the put takes (held here until a timer releases it)."""
    import threading

    h = harness({"host_blocks": 64}, window=2 * BS, runner="v2")
    real_put, release = h.worker.cache.put, threading.Event()

    def held_put(*a, **kw):
        assert release.wait(60)
        return real_put(*a, **kw)

    monkeypatch.setattr(h.worker.cache, "put", held_put)
    h.add("a", prompt(9, 6 * BS + 1), max_tokens=4)
    h.step()
    (t,) = h.worker._transient
    assert not t.done()
    seen, forward = [], h._forward
    h._forward = lambda so: (seen.append(t.done()), forward(so))
    timer = threading.Timer(0.3, release.set)
    timer.start()
    try:
        h.step()
    finally:
        timer.cancel()
        release.set()
    assert seen == [True] and t not in h.worker._transient
    h.run()


def test_several_groups_load_asynchronously_and_refuse_synchronous_loads(harness, tmp_path):
    """vLLM 0.32 stops its engine when a synchronous load of a model of
    several KV cache groups reports failed blocks (it maps block ids to
    requests for one group only): such a model loads asynchronously (a
    failed asynchronous load is recomputed), and a synchronous `load`
    fails the connector's start, scheduler and worker alike, naming the
    setting and the value that works; a model of one group keeps
    layer-wise loads."""
    h = harness({"host_blocks": 64}, window=2 * BS)
    assert h.sched.connector._load_mode == "async" and h.worker._load_mode == "async"
    assert h.sched.connector._fail_requests
    for mode in ("layerwise", "whole"):
        cfg = KVTransferConfig(kv_connector="KvferryConnector", kv_connector_module_path="kvferry.integrations.vllm",
                               kv_role="kv_both", kv_connector_extra_config={"host_blocks": 64, "load": mode},
                               kv_load_failure_policy="recompute")
        vc = VllmConfig(model_config=h.config.model_config, cache_config=h.config.cache_config,
                        scheduler_config=h.config.scheduler_config, device_config=DeviceConfig("cpu"),
                        kv_transfer_config=cfg)
        for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
            with pytest.raises(kvferry.InvalidArgument, match=rf"load = '{mode}' on a model of 2 KV cache groups.*"
                               r"set load: async"):
                KVConnectorFactory.create_connector(vc, role, h.kv_config)
    one = harness({"host_blocks": 64})
    assert one.sched.connector._load_mode == "layerwise" and one.worker._load_mode == "layerwise"
    assert not one.sched.connector._fail_requests


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_hybrid_models_failed_async_load_is_computed_again(harness, tmp_path, runner):
    """vLLM maps failed block ids to requests for one KV cache group only
    (with several its scheduler stops with a RuntimeError): a hybrid
    model's asynchronous load that fails is reported as a failed receive,
    vLLM computes the request from its start, the connector offers it no
    hit again, and its blocks hold the right bytes."""
    h = harness({"host_blocks": 64, "load": "async"}, window=2 * BS, runner=runner)
    a = prompt(43, 6 * BS + 1)
    h.add("a", a, max_tokens=2)
    h.run()
    h.sched.reset_prefix_cache()
    side = h.sched.connector
    stored = list(side._stored[(0, 0, 0)])
    assert stored
    h.worker.cache.remove(stored)  # gone after the scheduler looked: the load fails whole
    h.stats.clear()
    h.add("c", list(a), max_tokens=2)
    so, out = h.step()
    assert not so.scheduled_new_reqs  # parked while its load runs
    failed = set(out.failed_recving)
    for _ in range(50):
        so, out = h.step()
        failed |= out.failed_recving
        if so.scheduled_new_reqs:
            break
    assert failed == {"c"}
    new = so.scheduled_new_reqs[0]
    assert new.req_id == "c" and new.num_computed_tokens == 0  # computed again, not loaded
    assert "c" in side._no_hits and not h.load_errors
    h.expect_blocks("c", a, 0, 6, layers=[LAYERS[1]])
    h.run()
    assert "c" not in side._no_hits
    # the lookup's 6 blocks (of the full-attention group) all failed: no hit
    assert failed_load_stats(h) == {"load_failed_tokens_host": 6 * BS, "load_failed_requests": 1}
    assert not side._pending_hits


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_async_loads_land_between_steps(harness, tmp_path, runner):
    """load: async: vLLM parks the hit request while its blocks load (no
    forward touches them), get_finished reports it, then vLLM schedules
    it with the loaded tokens computed; the blocks hold the bytes, loaded
    into poisoned blocks; a block gone before the load is a load error of
    the same step the request is reported in, and vLLM recomputes it."""
    from vllm.v1.request import RequestStatus

    assert not kvf_vllm.KvferryConnector.requires_piecewise_for_cudagraph({"load": "async"})
    h = harness({**disk_only(tmp_path), "load": "async"}, runner=runner)
    a, keys = h.stored(41, 4 * BS + 3)
    h.add("b", list(a))
    so, out = h.step()
    assert not so.scheduled_new_reqs and h.sched.requests["b"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    (rid, ids), = h.loaded[-1]
    assert rid == "b" and len(ids) == 4
    for _ in range(500):  # vLLM steps on while the load runs (disk reads: let them take their time)
        so, out = h.step()
        if so.scheduled_new_reqs:
            break
        time.sleep(0.01)
    assert so.scheduled_new_reqs[0].req_id == "b" and so.scheduled_new_reqs[0].num_computed_tokens == 4 * BS
    h.expect_blocks("b", a, 0, 4)
    h.run()
    h.sched.reset_prefix_cache()

    h.worker.cache.remove([keys[2]])  # gone after the scheduler looked: blocks 2 and 3 fail
    h.sched.connector._stored[(0, 0, 0)][keys[2]] = int(kvferry.Tier.DISK)  # the scheduler has not heard yet
    h.stats.clear()
    h.add("c", list(a))
    h.run()
    assert len(h.load_errors) == 2
    assert failed_load_stats(h) == {"hit_tokens_disk": 2 * BS, "load_failed_tokens_disk": 2 * BS,
                                    "load_failed_requests": 1}
    assert h.sched.requests.get("c") is None  # finished: recomputed from the first failed block
