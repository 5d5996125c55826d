/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's side of the planner: the caller's prefill cost, kept, and a
 * plan per request over its lookup and the engine's costs
 * (docs/planner.md).
 */
#include "cache_private.h"

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
    pthread_mutex_unlock(&c->prefill_mu);
    free(old);
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
