# SPDX-License-Identifier: Apache-2.0
"""Read costs per tier and the load-or-recompute planner (kvf_engine_costs,
kvf_plan_compute, kvf_cache_plan; docs/planner.md).

    cache.set_prefill_cost([(2048, 0.060), (8192, 0.255), (32768, 1.40)], layers=32, overlap=True)
    plan = cache.plan(keys, request_tokens=len(prompt))
    cache.get(keys[:plan.load_blocks], slots[:plan.load_blocks])   # then prefill from plan.recompute_from
"""

import ctypes
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _lib
from ._enums import Status, Tier, TierLike
from ._errors import check, make_error

L = _lib.lib


@dataclass(frozen=True)
class TierCost:
    """A tier's read cost into primary slots (kvf_tier_cost): a batch of B
    bytes takes latency_s + B / bytes_per_s. observed: batches learnt from;
    held: set with hold=True, observations leave it."""

    latency_s: float
    bytes_per_s: float
    observed: int = 0
    held: bool = False

    def seconds(self, nbytes: int) -> float:
        """The predicted time of one batch of nbytes."""
        return self.latency_s + nbytes / self.bytes_per_s


def _tier_key(t) -> Tier:
    if isinstance(t, str):
        try:
            return Tier[t.upper()]
        except KeyError:
            raise make_error(Status.ERR_INVALID, f"tier {t!r}: not one of host, disk, remote, gpu") from None
    return Tier(t)


def costs_from_c(c) -> Dict[Tier, TierCost]:
    return {t: TierCost(float(c.tier[t].latency_s), float(c.tier[t].bytes_per_s), int(c.tier[t].observed),
                        bool(c.tier[t].held)) for t in Tier}


def costs_to_c(costs: Mapping) -> "_lib.Costs_t":
    c = _lib.Costs_t()
    c.struct_size = ctypes.sizeof(_lib.Costs_t)
    for t, v in costs.items():
        k = c.tier[int(_tier_key(t))]
        if isinstance(v, TierCost):
            k.latency_s, k.bytes_per_s = v.latency_s, v.bytes_per_s
        else:
            k.latency_s, k.bytes_per_s = (float(x) for x in v)
    return c


@dataclass(frozen=True)
class Plan:
    """What to load and what to recompute (kvf_plan): load
    keys[load_first:load_blocks] (load[tier] of them from each tier), compute
    tokens recompute_from .. request end (compute_tokens of them). With
    load_first > 0 (the front shape) tokens 0 .. load_first * tokens_per_block
    are computed from scratch while the loads run, before the rest.
    recompute_hits[tier]: hits the plan recomputes because loading them would
    not pay. ttft_s is the predicted time to the first token, load_s and
    compute_s (every forward pass) its parts, against ttft_recompute_s (every
    hit recomputed) and ttft_load_all_s (every usable hit loaded);
    ttft_split_s is the best split's prediction, taken or not (a split must
    gain the prefill cost's min_gain), 0 where none was possible. hedge_s:
    seconds after the get's submission by which its blocks must have
    arrived; past it, stop waiting (Cache.wait_pool_by) and recompute the
    tokens from load_first * tokens_per_block on (fallback_s, predicted):
    the request then ends within min_gain of ttft_recompute_s; never
    before HEDGE_MIN_S, which a late thread may take (0 when nothing is
    loaded). load_ratio, recompute_ratio: what the cache learnt from the
    requests it served (Cache.observe_plan), applied: the predictions of
    shapes that load are their model's times x load_ratio, recomputing's x
    recompute_ratio (1 and 1 from plan_compute by default); load_s,
    compute_s and fallback_s are the model's. first_s: when the loads'
    first layers are predicted in, seconds after the get (load_s for a
    tier that arrives whole). Per-tier figures are dicts
    {"host": n, "disk": n, ...}."""

    hits: int
    load_blocks: int
    load: Dict[str, int]
    recompute_hits: Dict[str, int]
    recompute_from: int
    compute_tokens: int
    ttft_s: float
    load_s: float
    compute_s: float
    ttft_recompute_s: float
    ttft_load_all_s: float
    overlap: bool
    load_first: int = 0
    tiers: List[Tier] = field(default_factory=list)  # the tier of each hit
    ttft_split_s: float = 0.0
    hedge_s: float = 0.0
    fallback_s: float = 0.0
    load_ratio: float = 1.0
    recompute_ratio: float = 1.0
    first_s: float = 0.0

    @property
    def recomputes_hits(self) -> bool:
        """Whether the plan leaves cached blocks to recompute."""
        return self.load_blocks - self.load_first < self.hits

    @property
    def shape(self) -> str:
        """"recompute" (nothing loaded), "leading" (keys[:load_blocks]) or
        "front" (the front computed while keys[load_first:load_blocks] load)."""
        if self.load_blocks == self.load_first:
            return "recompute"
        return "front" if self.load_first else "leading"

    @property
    def model_ttft_s(self) -> float:
        """ttft_s as the model alone predicts it, before the learnt ratio."""
        return self.ttft_s / (self.load_ratio if self.load_blocks > self.load_first else self.recompute_ratio)


@dataclass(frozen=True)
class PlanLearnt:
    """What a cache learnt from the requests its plans served
    (kvf_plan_learnt): measured over predicted time to the first token,
    the median of the latest LEARN_WINDOW requests of each kind (plans
    that load, plans that recompute everything), 1 while fewer than
    LEARN_MIN of the kind are in the window; how many of each are."""

    load_ratio: float
    recompute_ratio: float
    load_observed: int
    recompute_observed: int


def _per_tier(arr) -> Dict[str, int]:
    return {t.name.lower(): int(arr[t]) for t in Tier}


def plan_from_c(p, tiers) -> Plan:
    return Plan(int(p.hits), int(p.load_blocks), _per_tier(p.load), _per_tier(p.recompute_hits),
                int(p.recompute_from), int(p.compute_tokens), float(p.ttft_s), float(p.load_s), float(p.compute_s),
                float(p.ttft_recompute_s), float(p.ttft_load_all_s), bool(p.overlap), int(p.load_first),
                list(tiers), float(p.ttft_split_s), float(p.hedge_s), float(p.fallback_s), float(p.load_ratio),
                float(p.recompute_ratio), float(p.first_s))


def plan_to_c(plan: Plan) -> "_lib.Plan_t":
    """What kvf_cache_observe_plan reads of a plan: its shape, its
    prediction and the ratios it applied."""
    if not isinstance(plan, Plan):
        raise make_error(Status.ERR_INVALID, f"observe_plan: {type(plan).__name__} is not a Plan (Cache.plan's)")
    p = _lib.Plan_t()
    p.struct_size = ctypes.sizeof(_lib.Plan_t)
    p.hits, p.load_blocks, p.load_first = plan.hits, plan.load_blocks, plan.load_first
    p.ttft_s, p.load_s, p.compute_s = plan.ttft_s, plan.load_s, plan.compute_s
    p.ttft_recompute_s, p.ttft_load_all_s = plan.ttft_recompute_s, plan.ttft_load_all_s
    p.hedge_s, p.fallback_s = plan.hedge_s, plan.fallback_s
    p.load_ratio, p.recompute_ratio, p.first_s = plan.load_ratio, plan.recompute_ratio, plan.first_s
    return p


# kvf.h's KVF_PLAN_MIN_GAIN: the gain a split must predict by default
MIN_GAIN = 0.10
# kvf.h's KVF_PLAN_HEDGE_MIN_S: the earliest a plan's hedge gives its loads up
HEDGE_MIN_S = 0.024
# kvf.h's KVF_PLAN_LEARN_WINDOW and KVF_PLAN_LEARN_MIN: the requests a cache
# learns its plans' error from, and how many of a kind move its ratio
LEARN_WINDOW = 16
LEARN_MIN = 3
# kvf.h's KVF_PLAN_LEARN_MIN_S: a plan predicting less teaches nothing
LEARN_MIN_S = 0.001

PrefillLike = Union[Callable[[int, int], float], Mapping, Sequence[Tuple[int, float]]]


class Prefill:
    """A prefill cost as C sees it (kvf_prefill_cost), with what must stay
    alive while C may call it: the arrays and the callback. cost is

    - a function f(new_tokens, prefix_tokens) -> seconds;
    - a list of (tokens, seconds) pairs: full prefills from an empty cache
      (new tokens after a prefix then cost T(prefix + new) - T(prefix));
    - a mapping {"new_tokens": [...], "prefix_tokens": [...], "seconds": [[...], ...]}:
      seconds[p][j] for new_tokens[j] after prefix_tokens[p] (prefix_tokens
      may be left out: then one row, as the pairs).

    An exception the function raises fails the plan, and is raised again
    from it. min_gain: a split (some hits loaded, others recomputed) is
    taken only where it predicts at least this fraction less than the
    better of recompute all and load all (kvf_prefill_cost.min_gain).
    leading_only=True: the engine computes only after its loads, which are
    the leading hits (vLLM's connector), so no plan computes a front while
    the back loads."""

    def __init__(self, cost: PrefillLike, layers: int = 0, overlap: bool = False, min_gain: float = MIN_GAIN,
                 leading_only: bool = False):
        if not isinstance(layers, int) or not 0 <= layers < 2**32:
            raise make_error(Status.ERR_INVALID, f"prefill cost: layers = {layers!r}")
        c = _lib.PrefillCost_t()
        c.struct_size = ctypes.sizeof(_lib.PrefillCost_t)
        c.layers = layers
        c.overlap = 1 if overlap else 0
        if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)):
            raise make_error(Status.ERR_INVALID, f"prefill cost: min_gain = {min_gain!r}")
        c.min_gain = float(min_gain)
        c.leading_only = 1 if leading_only else 0
        self.error = None
        self._keep = []
        if callable(cost):
            def trampoline(_user, new_tokens, prefix, out, fn=cost):
                try:
                    out[0] = float(fn(int(new_tokens), int(prefix)))
                    return 0
                except BaseException as exc:  # never unwind into C
                    if self.error is None:
                        self.error = exc
                    return int(Status.ERR_INVALID)

            c.fn = _lib.PrefillFn(trampoline)
            self._keep.append(c.fn)
        else:
            if isinstance(cost, Mapping):
                nt = list(cost.get("new_tokens", ()))
                pt = list(cost.get("prefix_tokens", ()) or ())
                sec = cost.get("seconds", ())
                rows = [list(r) for r in sec] if pt else [list(sec)]
            else:
                pairs = list(cost)
                nt = [p[0] for p in pairs]
                pt = []
                rows = [[p[1] for p in pairs]]
            flat = [float(x) for r in rows for x in r]
            if any(len(r) != len(nt) for r in rows) or (pt and len(rows) != len(pt)):
                raise make_error(Status.ERR_INVALID, f"prefill cost: seconds must be {max(len(pt), 1)} rows "
                                                     f"of {len(nt)} (one per new_tokens entry)")
            for name, axis in (("new_tokens", nt), ("prefix_tokens", pt)):
                for i, v in enumerate(axis):
                    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
                        raise make_error(Status.ERR_INVALID, f"prefill cost: {name}[{i}] = {v!r} is not a token count")
            a_nt = (ctypes.c_uint64 * max(len(nt), 1))(*nt)
            a_pt = (ctypes.c_uint64 * max(len(pt), 1))(*pt)
            a_s = (ctypes.c_double * max(len(flat), 1))(*flat)
            self._keep += [a_nt, a_pt, a_s]
            c.new_tokens = ctypes.cast(a_nt, ctypes.POINTER(ctypes.c_uint64))
            c.n_new = len(nt)
            if pt:
                c.prefix_tokens = ctypes.cast(a_pt, ctypes.POINTER(ctypes.c_uint64))
                c.n_prefix = len(pt)
            c.seconds = ctypes.cast(a_s, ctypes.POINTER(ctypes.c_double))
        self.c = c
        check(L.kvf_prefill_cost_check(ctypes.byref(c)))

    def call(self, status: int) -> int:
        """Raises the function's own exception for a failed plan, else
        checks the status."""
        err, self.error = self.error, None
        if err is not None and status < 0:
            raise err
        return check(status)


def plan_compute(tiers: Sequence[TierLike], block_bytes: int, tokens_per_block: int, request_tokens: int,
                 costs: Mapping, prefill: PrefillLike, *, layers: int = 0, overlap: bool = False,
                 layerwise_tiers: Sequence[TierLike] = (), min_gain: float = MIN_GAIN,
                 leading_only: bool = False, arrival_steps: Optional[Mapping] = None, load_ratio: float = 1.0,
                 recompute_ratio: float = 1.0) -> Plan:
    """kvf_plan_compute: the plan for a request of request_tokens whose
    leading cached blocks are in `tiers` (one per hit), from costs
    {tier: TierCost or (latency_s, bytes_per_s)} (Cache.costs() gives the
    engine's) and a prefill cost (see Prefill). layerwise_tiers: the tiers
    whose blocks arrive layer by layer (an Engine's layerwise_tiers());
    arrival_steps: {tier: steps} for those arriving in fewer steps than
    layers (an Engine's arrival_groups(tier): the disk's pool groups).
    load_ratio, recompute_ratio: measured over predicted time of the
    shapes that load and of recomputing (Cache.plan_learnt()), which scale
    their predictions; finite and > 0."""
    pf = prefill if isinstance(prefill, Prefill) else Prefill(prefill, layers, overlap, min_gain, leading_only)
    ts = [int(_tier_key(t)) for t in tiers]
    arr = (_lib.c_enum * max(len(ts), 1))(*ts)
    i = _lib.PlanInput_t()
    i.struct_size = ctypes.sizeof(_lib.PlanInput_t)
    i.tiers = ctypes.cast(arr, ctypes.POINTER(_lib.c_enum))
    i.hits = len(ts)
    for name, v, bits in (("block_bytes", block_bytes, 64), ("tokens_per_block", tokens_per_block, 32),
                          ("request_tokens", request_tokens, 64)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**bits:
            raise make_error(Status.ERR_INVALID, f"plan_compute: {name} = {v!r}")
        setattr(i, name, v)
    i.costs = costs_to_c(costs)
    i.prefill = ctypes.pointer(pf.c)
    mask = 0
    for t in layerwise_tiers:
        mask |= 1 << int(_tier_key(t))
    i.layerwise_tiers = mask
    for t, steps in (arrival_steps or {}).items():
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps < 2**32:
            raise make_error(Status.ERR_INVALID, f"plan_compute: arrival_steps[{t!r}] = {steps!r}")
        i.arrival_steps[int(_tier_key(t))] = steps
    for name, v in (("load_ratio", load_ratio), ("recompute_ratio", recompute_ratio)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise make_error(Status.ERR_INVALID, f"plan_compute: {name} = {v!r} is not a number")
        setattr(i, name, float(v))
    p = _lib.Plan_t()
    p.struct_size = ctypes.sizeof(_lib.Plan_t)
    pf.call(L.kvf_plan_compute(ctypes.byref(i), ctypes.byref(p)))
    return plan_from_c(p, [Tier(t) for t in ts])


class PrefillProfile:
    """Prefill times measured from a model's own forward passes, as a prefill
    cost table: record(tokens, seconds, prefix=0) for each forward pass of
    `tokens` new tokens after `prefix` cached ones. table() gives each
    point's median (the latest `keep` samples), made non-decreasing (noise
    must not make more tokens, or a longer prefix, cheaper):

    - with every sample at prefix 0, [(tokens, seconds)] full prefills;
    - with samples at several prefixes, the 2-D mapping {"new_tokens",
      "prefix_tokens", "seconds"}, which needs every (tokens, prefix) pair of
      the grid measured. A 2-D table is what predicts a small compute after
      a long prefix (the plan's last blocks) and the fixed cost of a forward
      pass; full prefills alone underrate both.

        prof = kvf.PrefillProfile()
        t0 = time.perf_counter(); model(prompt); torch.cuda.synchronize()
        prof.record(len(prompt), time.perf_counter() - t0)
        cache.set_prefill_cost(prof.table(), layers=32, overlap=True)
    """

    def __init__(self, keep: int = 16):
        self._samples: Dict[Tuple[int, int], List[float]] = {}
        self._keep = keep

    def record(self, tokens: int, seconds: float, prefix: int = 0) -> None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise make_error(Status.ERR_INVALID, f"PrefillProfile.record: tokens = {tokens!r} (must be > 0)")
        if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
            raise make_error(Status.ERR_INVALID, f"PrefillProfile.record: prefix = {prefix!r} (must be >= 0)")
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
            raise make_error(Status.ERR_INVALID, f"PrefillProfile.record: {tokens} tokens after {prefix} took "
                                                 f"{seconds!r} s (must be finite, >= 0)")
        s = self._samples.setdefault((tokens, prefix), [])
        s.append(float(seconds))
        del s[:-self._keep]  # the latest samples: the model's speed now

    def __len__(self):
        return len(self._samples)

    def table(self, min_points: int = 1):
        if len(self._samples) < max(min_points, 1):
            raise make_error(Status.ERR_STATE, f"PrefillProfile: {len(self._samples)} points measured, "
                                               f"{max(min_points, 1)} needed")
        new = sorted({t for t, _ in self._samples})
        pre = sorted({p for _, p in self._samples})
        if pre == [0]:
            out, floor = [], 0.0
            for tokens in new:
                floor = max(floor, statistics.median(self._samples[(tokens, 0)]))
                out.append((tokens, floor))
            return out
        rows = []
        for p in pre:
            row = []
            for j, t in enumerate(new):
                if (t, p) not in self._samples:
                    raise make_error(Status.ERR_STATE, f"PrefillProfile: {t} tokens after a prefix of {p} not "
                                                       f"measured (a 2-D table needs every pair of the grid)")
                v = statistics.median(self._samples[(t, p)])
                if j:
                    v = max(v, row[-1])
                if rows:
                    v = max(v, rows[-1][j])
                row.append(v)
            rows.append(row)
        return {"new_tokens": new, "prefix_tokens": pre, "seconds": rows}


def check_cost_args(latency_s, bytes_per_s):
    for name, v in (("latency_s", latency_s), ("bytes_per_s", bytes_per_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise make_error(Status.ERR_INVALID, f"set_tier_cost: {name} = {v!r} is not a number")
    return float(latency_s), float(bytes_per_s)


__all__ = ["TierCost", "Plan", "PlanLearnt", "Prefill", "PrefillProfile", "plan_compute", "costs_from_c", "plan_from_c"]
