/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's read costs per tier: seeds, what completed onboards teach
 * them, the caller's overrides, and a calibration that times scratch
 * blocks (docs/planner.md).
 *
 * The model of one batch of B bytes is latency + B / throughput, fitted
 * to the tier's latest KVF_COST_WINDOW reads by medians (Theil-Sen): the
 * cost of a byte is the median of the slopes between pairs of reads of
 * clearly different sizes, the latency the median of what each read took
 * beyond its bytes. Medians, because a read's time has a tail (a cold
 * first read, a neighbour's burst) that a mean, or an update in proportion
 * to each error, follows: one read three times as slow in six pulled such
 * an estimate 50 % off, and reads of one size taught it a latency it
 * could not tell from throughput (small blocks put a cold read's whole
 * time into the latency, which then over-charged every large batch).
 * The latency is read from the smaller half of the reads, where the
 * slope's own error weighs little. While every read in the window has
 * about one size, the latency cannot be told apart: it stays where it
 * was (the starting figure, a set value, the last fit), below 90 % of
 * the fastest of those reads, and the throughput fits their median. A tier
 * that turns slower is followed once half the window has seen it.
 */
#include "engine_private.h"
#include "median.h"
#include "sized.h"

#include <math.h> /* isfinite, a macro: nothing to link */

/* two reads teach a slope when one moves this much more than the other */
#define SIZE_RATIO 1.25

/* Seeds until something is observed: orders of magnitude, not promises
 * (docs/planner.md lists them; kvf_engine_calibrate measures). */
static const kvf_tier_cost SEED_CUDA[KVF_TIER_COUNT] = {
    [KVF_TIER_HOST] = {20e-6, 25e9, 0, 0},
    [KVF_TIER_DISK] = {200e-6, 2e9, 0, 0},
    [KVF_TIER_REMOTE] = {500e-6, 1e9, 0, 0},
    [KVF_TIER_GPU] = {10e-6, 500e9, 0, 0},
};
static const kvf_tier_cost SEED_HOST[KVF_TIER_COUNT] = {
    [KVF_TIER_HOST] = {20e-6, 5e9, 0, 0},
    [KVF_TIER_DISK] = {200e-6, 2e9, 0, 0},
    [KVF_TIER_REMOTE] = {500e-6, 1e9, 0, 0},
    [KVF_TIER_GPU] = {20e-6, 5e9, 0, 0},
};

void kvf__costs_init(kvf__costs *c, bool cuda)
{
    pthread_mutex_init(&c->mu, NULL);
    memcpy(c->tier, cuda ? SEED_CUDA : SEED_HOST, sizeof c->tier);
    memcpy(c->start, c->tier, sizeof c->start);
    c->forget_ns = KVF_COST_FORGET_NS;
}

/* A learnt tier whose newest read is older than forget_ns goes back to
 * its start (KVF_COST_FORGET_NS says why). Lock held. */
static void forget_if_stale(kvf__costs *c, kvf_tier tier, uint64_t now)
{
    if (c->tier[tier].held || !c->samples[tier] || !c->forget_ns ||
        now - c->last_ns[tier] <= c->forget_ns)
        return;
    c->tier[tier] = c->start[tier];
    c->samples[tier] = 0;
}

void kvf__engine_costs_forget_after(kvf_engine *e, uint64_t ns)
{
    pthread_mutex_lock(&e->costs.mu);
    e->costs.forget_ns = ns;
    pthread_mutex_unlock(&e->costs.mu);
}

void kvf__costs_destroy(kvf__costs *c)
{
    pthread_mutex_destroy(&c->mu);
}

/* The fit of a tier's window of n reads into k (lock held). */
static void fit(kvf_tier_cost *k, const kvf__cost_sample *w, size_t n)
{
    double slopes[KVF_COST_WINDOW * (KVF_COST_WINDOW - 1) / 2], rest[KVF_COST_WINDOW];
    size_t ns = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (w[j].bytes >= SIZE_RATIO * w[i].bytes)
                slopes[ns++] = (w[j].seconds - w[i].seconds) / (w[j].bytes - w[i].bytes);
    /* a slope from a pair or two is noise: half the window's pairs of
     * different sizes, and at least three */
    double per_byte = ns >= 3 ? kvf__median(slopes, ns) : 0;
    if (per_byte > 0) {
        /* the latency from the smaller half of the reads: a large read's
         * time beyond its bytes is mostly the slope's own error */
        for (size_t i = 0; i < n; i++)
            rest[i] = w[i].bytes;
        double mid = kvf__median(rest, n);
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (w[i].bytes <= mid)
                rest[m++] = w[i].seconds - per_byte * w[i].bytes;
        double lat = kvf__median(rest, m);
        k->latency_s = lat > 0 ? lat : 0;
        k->bytes_per_s = 1 / per_byte;
        return;
    }
    /* one size, or sizes whose slopes say nothing (the larger reads no
     * slower: a cold first read, a cached one): keep the latency, below
     * the fastest read, so that every read leaves it a positive time for
     * its bytes. Below a typical (median) read was not enough: a tier set
     * at 1 ms and read 1 MB in 0.3 ms, 4 MB in 0.1 ms, then both in 1 ms
     * fitted a negative throughput (test_costs_learn) */
    double fastest = w[0].seconds;
    for (size_t i = 1; i < n; i++)
        if (w[i].seconds < fastest)
            fastest = w[i].seconds;
    if (k->latency_s > fastest * 0.9)
        k->latency_s = fastest * 0.9;
    for (size_t i = 0; i < n; i++)
        rest[i] = (w[i].seconds - k->latency_s) / w[i].bytes;
    k->bytes_per_s = 1 / kvf__median(rest, n);
}

void kvf__costs_observe(kvf__costs *c, kvf_tier tier, double bytes, double seconds)
{
    if ((unsigned)tier >= KVF_TIER_COUNT || !(bytes > 0) || !(seconds > 0) || !isfinite(seconds) ||
        !isfinite(bytes))
        return;
    uint64_t now = kvf__now_ns();
    pthread_mutex_lock(&c->mu);
    forget_if_stale(c, tier, now);
    kvf_tier_cost *k = &c->tier[tier];
    if (!k->held) {
        c->last_ns[tier] = now;
        uint32_t n = c->samples[tier];
        c->window[tier][n % KVF_COST_WINDOW] = (kvf__cost_sample){bytes, seconds};
        c->samples[tier] = ++n;
        fit(k, c->window[tier], n < KVF_COST_WINDOW ? n : KVF_COST_WINDOW);
        k->observed++;
    }
    pthread_mutex_unlock(&c->mu);
}

/* The tier an onboard or copy reads, or -1 for kinds that teach nothing. */
static int kind_read_tier(op_kind k)
{
    return k.dir == OP_ONBOARD || k.dir == OP_COPY ? (int)k.tier : -1;
}

void kvf__costs_batch_done(kvf_engine *e, const batch *b)
{
    int tier = kind_read_tier(b->kind);
    if (tier < 0 || !b->submit_ns || b->n == 0)
        return;
    for (size_t i = 0; i < b->n; i++)
        if (b->status[i] != KVF_OK)
            return; /* a failure's time says nothing about the tier's speed */
    /* a block's bytes in the pools the batch moves (kvf_onboard_pools) */
    double block = (double)e->all_block_bytes;
    if (b->sel && !b->sel->whole) {
        block = 0;
        for (uint32_t k = 0; k < b->sel->n; k++)
            block += (double)e->pools[b->sel->order[k]].block_bytes;
    }
    /* partial moves count by their tokens */
    double bytes = block * (double)b->tokens_total / e->pools[0].g.tokens_per_block;
    double seconds = (double)(kvf__now_ns() - b->submit_ns) * 1e-9;
    kvf__costs_observe(&e->costs, (kvf_tier)tier, bytes, seconds);
}

/* ---- the API ----------------------------------------------------------- */

kvf_status kvf_engine_costs(kvf_engine *e, kvf_costs *costs)
{
    kvf__clear_error();
    if (!e || !costs)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_costs: NULL argument");
    if (!kvf__sized_ok(costs, sizeof(size_t), 65536))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_engine_costs: struct_size %zu (start from KVF_COSTS_INIT)",
                         costs->struct_size);
    kvf_costs out = KVF_COSTS_INIT;
    uint64_t now = kvf__now_ns();
    pthread_mutex_lock(&e->costs.mu);
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        forget_if_stale(&e->costs, (kvf_tier)t, now);
    memcpy(out.tier, e->costs.tier, sizeof e->costs.tier);
    pthread_mutex_unlock(&e->costs.mu);
    kvf__sized_copy_out(costs, &out, sizeof out);
    return KVF_OK;
}

/* The checks every call on one tier's cost starts with. */
static kvf_status tier_call(const char *fn, const kvf_engine *e, kvf_tier tier)
{
    kvf__clear_error();
    if (!e)
        return kvf__fail(KVF_ERR_INVALID, "%s: engine is NULL", fn);
    if ((unsigned)tier >= KVF_TIER_COUNT)
        return kvf__fail(KVF_ERR_INVALID, "%s: tier %d is not one of host, disk, remote, gpu", fn,
                         (int)tier);
    return KVF_OK;
}

kvf_status kvf_engine_set_tier_cost(kvf_engine *e, kvf_tier tier, double latency_s,
                                    double bytes_per_s, int hold)
{
    static const char fn[] = "kvf_engine_set_tier_cost";
    kvf_status st = tier_call(fn, e, tier);
    if (st != KVF_OK)
        return st;
    if (!isfinite(latency_s) || latency_s < 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: %s tier: latency %g s (must be finite, >= 0)", fn,
                         kvf_tier_name(tier), latency_s);
    if (!isfinite(bytes_per_s) || !(bytes_per_s > 0))
        return kvf__fail(KVF_ERR_INVALID, "%s: %s tier: throughput %g B/s (must be finite, > 0)",
                         fn, kvf_tier_name(tier), bytes_per_s);
    pthread_mutex_lock(&e->costs.mu);
    kvf_tier_cost *k = &e->costs.tier[tier];
    k->latency_s = latency_s;
    k->bytes_per_s = bytes_per_s;
    k->held = hold != 0;
    k->observed = 0;
    /* a set value is a new start: the fit begins again from it, and a
     * forgotten fit returns to it */
    e->costs.samples[tier] = 0;
    e->costs.start[tier] = *k;
    pthread_mutex_unlock(&e->costs.mu);
    return KVF_OK;
}

kvf_status kvf_engine_observe_tier_cost(kvf_engine *e, kvf_tier tier, uint64_t bytes,
                                        double seconds)
{
    static const char fn[] = "kvf_engine_observe_tier_cost";
    kvf_status st = tier_call(fn, e, tier);
    if (st != KVF_OK)
        return st;
    if (bytes == 0 || !isfinite(seconds) || !(seconds > 0))
        return kvf__fail(KVF_ERR_INVALID,
                         "%s: %s tier: %llu bytes in %g s (need bytes > 0, seconds finite and > 0)",
                         fn, kvf_tier_name(tier), (unsigned long long)bytes, seconds);
    kvf__costs_observe(&e->costs, tier, (double)bytes, seconds);
    return KVF_OK;
}

/* ---- calibration --------------------------------------------------------- */

/* Writes the scratch blocks to `tier`, then reads one and all of them back
 * `rounds` times: the onboards teach the costs as any would. */
static kvf_status calibrate_tier(kvf_engine *e, kvf_tier tier, kvf_move *mv, size_t n,
                                 uint32_t rounds)
{
    kvf_ticket t;
    kvf_status st = kvf_offload(e, tier, mv, n, &t);
    if (st == KVF_OK)
        st = kvf_wait(e, t, NULL);
    for (size_t i = 0; i < n; i++) {
        uint64_t s = mv[i].src;
        mv[i].src = mv[i].dst;
        mv[i].dst = s;
    }
    for (uint32_t r = 0; r < rounds && st == KVF_OK; r++) {
        st = kvf_onboard(e, tier, mv, 1, &t);
        if (st == KVF_OK)
            st = kvf_wait(e, t, NULL);
        if (st == KVF_OK)
            st = kvf_onboard(e, tier, mv, n, &t);
        if (st == KVF_OK)
            st = kvf_wait(e, t, NULL);
    }
    if (tier != KVF_TIER_HOST) {
        /* the scratch keys go, whatever happened */
        kvf_key *keys = malloc(n * sizeof *keys);
        for (size_t i = 0; keys && i < n; i++)
            keys[i] = mv[i].key;
        if (keys && kvf_remove(e, tier, keys, n, &t) == KVF_OK)
            kvf_wait(e, t, NULL);
        free(keys);
    }
    if (st != KVF_OK)
        return kvf__fail(st, "kvf_engine_calibrate: %s tier: %s", kvf_tier_name(tier),
                         kvf_last_error());
    return KVF_OK;
}

kvf_status kvf_engine_calibrate(kvf_engine *e, const uint32_t *slots, const uint32_t *host_slots,
                                size_t n, kvf_key key_base, uint32_t rounds)
{
    static const char fn[] = "kvf_engine_calibrate";
    kvf__clear_error();
    if (!e || !slots || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL engine or slots, or n = 0", fn);
    if (kvf_key_is_root(key_base) || key_base.lo + n < key_base.lo)
        return kvf__fail(KVF_ERR_INVALID,
                         "%s: key_base " KVF_KEY_FMT " cannot name %zu scratch keys", fn,
                         KVF_KEY_ARGS(key_base), n);
    if (rounds == 0)
        rounds = 3;
    kvf_move *mv = malloc(n * sizeof *mv);
    if (!mv)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    kvf_status first = KVF_OK;
    char why[256] = "";
    for (int tier = KVF_TIER_HOST; tier <= KVF_TIER_REMOTE; tier++) {
        if ((tier == KVF_TIER_HOST && !host_slots) || (tier == KVF_TIER_DISK && !e->file_enabled) ||
            (tier == KVF_TIER_REMOTE && !kvf__engine_has_remote(e)))
            continue;
        for (size_t i = 0; i < n; i++)
            mv[i] = tier == KVF_TIER_HOST
                        ? (kvf_move){.src = slots[i], .dst = host_slots[i]}
                        : (kvf_move){.src = slots[i], .key = {key_base.hi, key_base.lo + i}};
        kvf_status st = calibrate_tier(e, (kvf_tier)tier, mv, n, rounds);
        if (st == KVF_OK) {
            /* what the tier measured is where it returns once forgotten */
            pthread_mutex_lock(&e->costs.mu);
            if (!e->costs.tier[tier].held) {
                e->costs.start[tier] = e->costs.tier[tier];
                e->costs.start[tier].observed = 0; /* a start is learnt from nothing */
            }
            pthread_mutex_unlock(&e->costs.mu);
        }
        if (st != KVF_OK && first == KVF_OK) {
            first = st;
            snprintf(why, sizeof why, "%s", kvf_last_error());
        }
    }
    free(mv);
    if (first != KVF_OK)
        return kvf__fail(first, "%s", why);
    return KVF_OK;
}
