/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's side of the planner: the caller's prefill cost, kept, and a
 * plan per request over its lookup and the engine's costs
 * (docs/planner.md).
 */
#include "cache_private.h"
#include "median.h"
#include "sized.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvf__cache_prefill_free(kvf_cache *c)
{
    free(c->prefill_mem);
    c->prefill_mem = NULL;
    c->has_prefill = false;
    pthread_mutex_destroy(&c->prefill_mu);
}

kvf_status kvf_cache_set_prefill_cost(kvf_cache *c, const kvf_prefill_cost *cost)
{
    kvf__clear_error();
    if (!c)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_set_prefill_cost: cache is NULL");
    kvf_prefill_cost p = KVF_PREFILL_COST_INIT;
    void *mem = NULL;
    if (cost) {
        kvf_status st = kvf__prefill_check(cost, &p);
        if (st != KVF_OK)
            return st;
        if (!p.fn) {
            /* the table's arrays, copied into one allocation */
            size_t rows = p.n_prefix ? p.n_prefix : 1;
            size_t axes = (p.n_new + p.n_prefix) * sizeof(uint64_t);
            mem = malloc(axes + rows * p.n_new * sizeof(double));
            if (!mem)
                return kvf__fail(KVF_ERR_NOMEM, "kvf_cache_set_prefill_cost: out of memory");
            uint64_t *nt = mem, *pt = nt + p.n_new;
            double *sec = (double *)((char *)mem + axes);
            memcpy(nt, p.new_tokens, p.n_new * sizeof *nt);
            if (p.n_prefix)
                memcpy(pt, p.prefix_tokens, p.n_prefix * sizeof *pt);
            memcpy(sec, p.seconds, rows * p.n_new * sizeof *sec);
            p.new_tokens = nt;
            p.prefix_tokens = p.n_prefix ? pt : NULL;
            p.seconds = sec;
        }
    }
    pthread_mutex_lock(&c->prefill_mu);
    void *old = c->prefill_mem;
    c->prefill = p;
    c->prefill_mem = mem;
    c->has_prefill = cost != NULL;
    c->learn_n = c->learn_next = 0; /* learnt against the old cost */
    pthread_mutex_unlock(&c->prefill_mu);
    free(old);
    return KVF_OK;
}

/* The window's ratios of one kind: their median, 1 with fewer than
 * KVF_PLAN_LEARN_MIN; *n_p how many. */
static double window_median(const kvf_cache *c, bool load, uint32_t *n_p)
{
    double v[KVF_PLAN_LEARN_WINDOW];
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->learn_n; i++)
        if (c->learn_load[i] == load)
            v[n++] = c->learn_ratio[i];
    *n_p = n;
    if (n < KVF_PLAN_LEARN_MIN)
        return 1;
    return kvf__median(v, n);
}

/* What the window teaches (prefill_mu held). */
static void learnt_locked(const kvf_cache *c, kvf_plan_learnt *out)
{
    out->load_ratio = window_median(c, true, &out->load_observed);
    out->recompute_ratio = window_median(c, false, &out->recompute_observed);
}

kvf_status kvf_cache_observe_plan(kvf_cache *c, const kvf_plan *plan, double ttft_s)
{
    static const char fn[] = "kvf_cache_observe_plan";
    kvf__clear_error();
    if (!c || !plan)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument", fn);
    if (!kvf__sized_ok(plan, sizeof(size_t), 65536))
        return kvf__fail(KVF_ERR_INVALID, "%s: plan's struct_size %zu (a plan from kvf_cache_plan)",
                         fn, kvf__sized_size(plan));
    if (!isfinite(ttft_s) || ttft_s < 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: ttft_s = %g (must be finite and >= 0)", fn, ttft_s);
    kvf_plan p;
    memset(&p, 0, sizeof p);
    kvf__sized_copy_in(&p, sizeof p, plan);
    bool load = p.load_blocks > p.load_first;
    /* the model's own prediction: the plan's over the ratio it applied
     * (0 in a plan of an older struct: none) */
    double applied = load ? p.load_ratio : p.recompute_ratio;
    if (applied == 0)
        applied = 1;
    if (!isfinite(p.ttft_s) || p.ttft_s < 0 || !isnormal(applied) || applied < 0)
        return kvf__fail(KVF_ERR_INVALID,
                         "%s: the plan predicts %g s with a ratio of %g (not a plan's prediction)",
                         fn, p.ttft_s, applied);
    double model = p.ttft_s / applied;
    if (model < KVF_PLAN_LEARN_MIN_S)
        return KVF_OK; /* a ratio to ~0 says nothing of the costs */
    pthread_mutex_lock(&c->prefill_mu);
    c->learn_ratio[c->learn_next] = ttft_s / model;
    c->learn_load[c->learn_next] = load;
    c->learn_next = (c->learn_next + 1) % KVF_PLAN_LEARN_WINDOW;
    if (c->learn_n < KVF_PLAN_LEARN_WINDOW)
        c->learn_n++;
    pthread_mutex_unlock(&c->prefill_mu);
    return KVF_OK;
}

kvf_status kvf_cache_plan_learnt(kvf_cache *c, kvf_plan_learnt *out)
{
    kvf__clear_error();
    if (!c || !out || !kvf__sized_ok(out, sizeof(size_t), 65536))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_plan_learnt: NULL, or out's struct_size is "
                                          "wrong (start from KVF_PLAN_LEARNT_INIT)");
    kvf_plan_learnt l = KVF_PLAN_LEARNT_INIT;
    pthread_mutex_lock(&c->prefill_mu);
    learnt_locked(c, &l);
    pthread_mutex_unlock(&c->prefill_mu);
    kvf__sized_copy_out(out, &l, sizeof l);
    return KVF_OK;
}

kvf_status kvf_cache_plan(kvf_cache *c, const kvf_key *keys, size_t n, uint64_t request_tokens,
                          kvf_tier *tiers, kvf_plan *plan)
{
    static const char fn[] = "kvf_cache_plan";
    kvf__clear_error();
    if (!c || !plan || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument", fn);
    kvf_tier *own = NULL;
    if (!tiers && n) {
        if (!(own = malloc(n * sizeof *own)))
            return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        tiers = own;
    }
    size_t hits = 0;
    kvf_status st = n ? kvf_cache_lookup(c, keys, n, &hits, tiers) : KVF_OK;
    kvf_plan_input in = KVF_PLAN_INPUT_INIT;
    if (st == KVF_OK)
        st = kvf_engine_costs(c->engine, &in.costs);
    if (st != KVF_OK)
        goto out;
    in.tiers = tiers;
    in.hits = hits;
    in.block_bytes = c->block_bytes;
    in.tokens_per_block = kvf__engine_tokens_per_block(c->engine);
    in.request_tokens = request_tokens;
    in.layerwise_tiers = kvf_engine_layerwise_tiers(c->engine);
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        in.arrival_steps[t] = kvf_engine_arrival_groups(c->engine, (kvf_tier)t);
    pthread_mutex_lock(&c->prefill_mu);
    kvf_plan_learnt learnt;
    learnt_locked(c, &learnt);
    in.load_ratio = learnt.load_ratio;
    in.recompute_ratio = learnt.recompute_ratio;
    if (!c->has_prefill) {
        st = kvf__fail(KVF_ERR_STATE, "%s: no prefill cost (kvf_cache_set_prefill_cost first)", fn);
    } else {
        in.prefill = &c->prefill;
        st = kvf_plan_compute(&in, plan);
    }
    pthread_mutex_unlock(&c->prefill_mu);
out:
    free(own);
    return st;
}
