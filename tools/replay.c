/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry replay: runs a request trace through a kvf_cache the way a
 * serving engine would, and checks every block the cache hands back.
 *
 * The model. The engine's primary slots (--gpu-blocks) are the serving
 * engine's KV pool; the cache's tiers are its secondary slots
 * (--host-blocks) and its file tier (--disk DIR --disk-blocks N). For each
 * request, in arrival order: its block keys (kvf_key_chain_all of its
 * tokens, or given), the longest cached prefix (kvf_cache_lookup, then
 * pinned for the request's life), the hits copied into free primary slots
 * (kvf_cache_get), the misses "prefilled" (each block written with bytes
 * derived from its key), every hit compared byte for byte with the bytes of
 * its key, and all of the request's blocks handed back (kvf_cache_put) as
 * the engine does when it frees them. A request longer than the primary
 * pool is run in parts of --gpu-blocks blocks. Puts are not waited for
 * until their slots are needed again, so gets and puts overlap as they do
 * in an engine. With --clients N, N threads run requests at once, each with
 * its share of the primary slots.
 *
 * With --prefill-cost each request is planned (kvf_plan_compute over its
 * lookup and the engine's costs) and the plan followed: the hits it loads
 * are got, the others recomputed like misses; the report counts both per
 * tier and sums the predicted time to the first token of the plan and of
 * the two pure policies (docs/planner.md).
 */
#include "cli.h"
#include "trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KVF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define PREFILL_POINTS 64

typedef struct replay_opts {
    const char *trace_path; /* NULL: generated */
    kvf_trace_gen gen;
    bool gen_set;
    uint32_t requests;
    uint64_t seed;
    const char *write_trace;
    kvf_backend backend;
    kvf_geometry g;
    uint32_t pools, gpu_blocks, threads, clients;
    uint64_t host_blocks, disk_blocks;
    bool disk_blocks_set, remote_set;
    const char *disk, *ns, *json, *remote_url;
    kvf_cache_remote remote;
    kvf_fsync fsync;
    uint32_t offload_min_priority, disk_admit_uses;
    bool prometheus, gpu_tier;
    /* the planner: full-prefill times (--prefill-cost), the model's layers,
     * overlap, and tier costs held fixed (--tier-cost) */
    bool plan;
    uint64_t prefill_tokens[PREFILL_POINTS];
    double prefill_s[PREFILL_POINTS];
    size_t prefill_n;
    uint32_t plan_layers;
    bool plan_overlap;
    bool plan_leading_only; /* kvf_prefill_cost.leading_only */
    double plan_min_gain;   /* kvf_prefill_cost.min_gain */
    bool plan_min_gain_set;
    bool tier_cost_set[KVF_TIER_COUNT];
    double tier_latency[KVF_TIER_COUNT], tier_bw[KVF_TIER_COUNT];
} replay_opts;

/* A put in flight over primary slots [first, first + n). */
typedef struct pending {
    kvf_cache_ticket ticket;
    uint32_t first, n;
    size_t req; /* index of the request, for messages */
} pending;

/* What the replay counts itself, per client and in all. */
typedef struct counts {
    uint64_t blocks, tokens, hits[KVF_TIER_COUNT], got_blocks, verified, prefilled;
    uint64_t bad_blocks, errors, no_space;
    uint64_t raced; /* hits evicted between lookup and pin (several clients) */
    double get_s;
    /* --prefill-cost: hits the plans loaded and recomputed per tier, and
     * the sums of their predicted times to the first token */
    uint64_t planned, plan_load[KVF_TIER_COUNT], plan_recompute[KVF_TIER_COUNT];
    /* plans per shape and tier: [0] nothing loaded (by the tier of the
     * first hit), [1] the leading hits loaded, [2] the front computed
     * while the back loads (by each tier loaded from) */
    uint64_t plan_shape[3][KVF_TIER_COUNT];
    double ttft_plan_s, ttft_recompute_s, ttft_load_all_s;
} counts;

typedef struct replay {
    const replay_opts *o;
    const kvf_trace *trace;
    kvf_engine *e;
    kvf_cache *c;
    bool gpu;
    size_t block_bytes; /* one pool's */
    atomic_size_t next; /* the next request to run */
    pthread_mutex_t ev_mu;
    kvf_cache_event *events;
    uint64_t events_seen[3], event_gaps, last_seq;
    counts n; /* summed over the clients */
    double wall_s;
} replay;

/* A key and its index in a request's part. */
typedef struct key_at {
    kvf_key key;
    size_t at;
} key_at;

/* One client: a thread running requests with primary slots of its own,
 * [base, base + nslots). */
typedef struct client {
    replay *rp;
    const replay_opts *o; /* the replay's, copied for brevity */
    const kvf_trace *trace;
    kvf_engine *e;
    kvf_cache *c;
    bool gpu;
    size_t block_bytes;
    uint32_t base, nslots;
    uint8_t *want, *got;
    uint32_t *slots;
    kvf_key *keys;
    kvf_tier *tiers;
    kvf_status *per;
    size_t keys_cap;
    kvf_key *akeys, *ukeys; /* --gpu-tier: blocks to compute, blocks to unpin */
    kvf_key *dkeys;         /* --gpu-tier: a part's keys, each once */
    key_at *dpos;           /* and where each first stands in the part */
    pending *pend;
    size_t pend_head, pend_n; /* a FIFO in slot order */
    uint32_t cursor;
    counts n;
    int rc;
    pthread_t thread;
} client;

#define EVENT_QUEUE 65536

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The bytes a block holds in one pool: a stream seeded by its key, never a
 * zero byte (so a copy that did nothing, or zeroed memory, cannot pass). */
static void key_bytes(kvf_key key, uint32_t pool, uint8_t *p, size_t n)
{
    /* both halves: keys equal in one half must not hold the same bytes */
    uint64_t s = key.lo ^ (key.hi * 0xd6e8feb86659fd93ull) ^ (0x9e3779b97f4a7c15ull * (pool + 1));
    size_t i = 0;
    for (;;) {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z = (z ^ (z >> 31)) | 0x0101010101010101ull;
        if (i + 8 > n) {
            memcpy(p + i, &z, n - i);
            return;
        }
        memcpy(p + i, &z, 8);
        i += 8;
    }
}

/* Reads or writes one pool's primary slot as an engine would: plain memory
 * on the host backend, cudaMemcpy on a GPU. */
static int slot_io(client *r, uint32_t pool, uint32_t slot, void *host, bool write)
{
    void *p;
    if (kvf_engine_slot_ptr(r->e, pool, KVF_LEVEL_PRIMARY, slot, &p) != KVF_OK) {
        fprintf(stderr, "kvferry replay: %s\n", kvf_last_error());
        return -1;
    }
#ifdef KVF_HAVE_CUDA
    if (r->gpu) {
        cudaError_t ce = write ? cudaMemcpy(p, host, r->block_bytes, cudaMemcpyHostToDevice)
                               : cudaMemcpy(host, p, r->block_bytes, cudaMemcpyDeviceToHost);
        if (ce != cudaSuccess) {
            fprintf(stderr, "kvferry replay: pool %u slot %u: cudaMemcpy: %s\n", pool, slot,
                    cudaGetErrorString(ce));
            return -1;
        }
        return 0;
    }
#endif
    if (write)
        memcpy(p, host, r->block_bytes);
    else
        memcpy(host, p, r->block_bytes);
    return 0;
}

static const char *req_name(const kvf_trace_req *q, char *buf, size_t cap)
{
    if (q->line)
        snprintf(buf, cap, "request %s (line %zu)", q->id, q->line);
    else
        snprintf(buf, cap, "request %s", q->id);
    return buf;
}

/* Prefill: the block's bytes, computed as a model would, into its slot. */
static int prefill(client *r, kvf_key key, uint32_t slot)
{
    for (uint32_t p = 0; p < r->o->pools; p++) {
        key_bytes(key, p, r->want, r->block_bytes);
        if (slot_io(r, p, slot, r->want, true))
            return -1;
    }
    r->n.prefilled++;
    return 0;
}

/* The end-to-end check: a block got from the cache holds its key's bytes. */
static int verify(client *r, const kvf_trace_req *q, size_t index, kvf_key key, uint32_t slot,
                  kvf_tier tier)
{
    for (uint32_t p = 0; p < r->o->pools; p++) {
        key_bytes(key, p, r->want, r->block_bytes);
        if (slot_io(r, p, slot, r->got, false))
            return -1;
        if (memcmp(r->want, r->got, r->block_bytes) != 0) {
            size_t off = 0;
            while (r->want[off] == r->got[off])
                off++;
            char nm[160];
            fprintf(stderr,
                    "kvferry replay: WRONG DATA: %s block %zu key " KVF_KEY_FMT
                    " (from %s): pool %u "
                    "byte %zu is 0x%02x, expected 0x%02x\n",
                    req_name(q, nm, sizeof nm), index, KVF_KEY_ARGS(key), kvf_tier_name(tier), p,
                    off, r->got[off], r->want[off]);
            r->n.bad_blocks++;
            return 0;
        }
    }
    r->n.verified++;
    return 0;
}

static int wait_put(client *r)
{
    pending *pd = &r->pend[r->pend_head];
    kvf_status st = kvf_cache_wait(r->c, pd->ticket, r->per);
    const kvf_trace_req *q = &r->trace->reqs[pd->req];
    char nm[160];
    if (st != KVF_OK) {
        for (uint32_t i = 0; i < pd->n; i++) {
            if (r->per[i] == KVF_OK)
                continue;
            if (r->per[i] == KVF_ERR_NO_SPACE) { /* every victim pinned: not an error */
                r->n.no_space++;
                continue;
            }
            fprintf(stderr, "kvferry replay: %s: put of slot %u failed: %s\n",
                    req_name(q, nm, sizeof nm), r->base + pd->first + i, kvf_status_str(r->per[i]));
            r->n.errors++;
        }
        if (st == KVF_ERR_UNKNOWN_TICKET || st == KVF_ERR_INVALID) {
            fprintf(stderr, "kvferry replay: %s: kvf_cache_wait: %s\n", req_name(q, nm, sizeof nm),
                    kvf_last_error());
            r->n.errors++;
        }
    }
    r->pend_head = (r->pend_head + 1) % r->nslots;
    r->pend_n--;
    return 0;
}

/* n free primary slots in a row, waiting for the puts still reading them. */
static uint32_t take_slots(client *r, uint32_t n)
{
    if (r->cursor + n > r->nslots)
        r->cursor = 0;
    uint32_t first = r->cursor;
    for (;;) {
        bool busy = false;
        for (size_t k = 0; k < r->pend_n && !busy; k++) {
            const pending *pd = &r->pend[(r->pend_head + k) % r->nslots];
            busy = pd->first < first + n && first < pd->first + pd->n;
        }
        if (!busy)
            break;
        wait_put(r);
    }
    r->cursor = first + n;
    for (uint32_t i = 0; i < n; i++)
        r->slots[i] = r->base + first + i;
    return r->base + first;
}

/* Drains the cache's event queue, checking that sequence numbers follow
 * each other. One client at a time, so that they are seen in order. */
static void drain_events(replay *r)
{
    size_t n;
    pthread_mutex_lock(&r->ev_mu);
    while ((n = kvf_cache_events(r->c, r->events, EVENT_QUEUE)) > 0)
        for (size_t i = 0; i < n; i++) {
            const kvf_cache_event *ev = &r->events[i];
            if ((unsigned)ev->kind < 3)
                r->events_seen[ev->kind]++;
            if (ev->seq != r->last_seq + 1)
                r->event_gaps += ev->seq > r->last_seq ? ev->seq - r->last_seq - 1 : 1;
            r->last_seq = ev->seq;
        }
    pthread_mutex_unlock(&r->ev_mu);
}

/* A hit this cache holds (and the request pins), not the remote store's. */
static bool held_here(kvf_tier tier)
{
    return tier == KVF_TIER_HOST || tier == KVF_TIER_DISK;
}

/* Undoes the request's pin of n keys. */
static void unpin_keys(client *r, const kvf_trace_req *q, const kvf_key *keys, size_t n)
{
    char nm[160];
    if (kvf_cache_unpin(r->c, keys, n) != KVF_OK) {
        fprintf(stderr, "kvferry replay: %s: kvf_cache_unpin: %s\n", req_name(q, nm, sizeof nm),
                kvf_last_error());
        r->n.errors++;
    }
}

static int cmp_key_at(const void *a, const void *b)
{
    const key_at *x = a, *y = b;
    int k = kvf_key_cmp(x->key, y->key);
    if (k)
        return k;
    return x->at < y->at ? -1 : x->at > y->at;
}

static int cmp_at(const void *a, const void *b)
{
    const key_at *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* The part's keys with each repeat dropped, in the order of their first
 * use: r->dkeys[0..n), r->dpos[i].at the index of r->dkeys[i] in the part.
 * A request may name a block twice (a trace's "blocks" repeated, tokens
 * that chain to the same key), while the cache's acquire and commit take a
 * key once per call, as does its put. */
static uint32_t distinct_keys(client *r, const kvf_key *keys, uint32_t m)
{
    for (uint32_t i = 0; i < m; i++)
        r->dpos[i] = (key_at){keys[i], i};
    qsort(r->dpos, m, sizeof *r->dpos, cmp_key_at);
    uint32_t n = 0;
    for (uint32_t i = 0; i < m; i++)
        if (i == 0 || !kvf_key_eq(r->dpos[i].key, r->dpos[i - 1].key))
            r->dpos[n++] = r->dpos[i];
    qsort(r->dpos, n, sizeof *r->dpos, cmp_at);
    for (uint32_t i = 0; i < n; i++)
        r->dkeys[i] = r->dpos[i].key;
    return n;
}

/* One part of a request: blocks [s, s + m), of which the first `gets` are
 * cache hits. */
/* One part of a request: blocks s .. s + m, of which g0 .. g1 (relative
 * to the part) are got, the others prefilled. */
static int run_part(client *r, size_t qi, size_t s, uint32_t m, uint32_t g0, uint32_t g1)
{
    const kvf_trace_req *q = &r->trace->reqs[qi];
    char nm[160];
    uint32_t first = take_slots(r, m);
    kvf_key *keys = r->keys + s;
    uint32_t gets = g1 - g0;
    if (gets) {
        kvf_cache_ticket t;
        double t0 = now_s();
        kvf_status st = kvf_cache_get(r->c, keys + g0, r->slots + g0, gets, &t);
        if (st != KVF_OK) {
            fprintf(stderr, "kvferry replay: %s: kvf_cache_get of %u blocks: %s\n",
                    req_name(q, nm, sizeof nm), gets, kvf_last_error());
            r->n.errors++;
            gets = 0; /* recompute them all */
        } else {
            st = kvf_cache_wait(r->c, t, r->per);
            r->n.get_s += now_s() - t0;
        }
    }
    for (uint32_t i = 0; i < m; i++) {
        int rc;
        bool got = i >= g0 && i < g0 + gets;
        if (got && r->per[i - g0] == KVF_OK) {
            r->n.got_blocks++;
            rc = verify(r, q, s + i, keys[i], first + i, r->tiers[s + i]);
        } else {
            if (got) {
                fprintf(stderr,
                        "kvferry replay: %s: block %zu key " KVF_KEY_FMT " (from %s): get "
                        "failed: %s; recomputed\n",
                        req_name(q, nm, sizeof nm), s + i, KVF_KEY_ARGS(keys[i]),
                        kvf_tier_name(r->tiers[s + i]), kvf_status_str(r->per[i - g0]));
                r->n.errors++;
                /* the cache drops a block it could not read back once it is
                 * unpinned: let go of it now, so that the put below stores
                 * the recomputed block again */
                if (held_here(r->tiers[s + i]))
                    unpin_keys(r, q, r->keys + s + i, 1);
                r->tiers[s + i] = KVF_TIER_COUNT; /* held no more */
            }
            rc = prefill(r, keys[i], first + i);
        }
        if (rc)
            return -1;
    }
    /* a block the part names twice is handed back once, from its first slot
     * (kvf_cache_put takes a key once per call) */
    uint32_t d = distinct_keys(r, keys, m);
    for (uint32_t i = 0; i < d; i++)
        r->slots[i] = first + r->dpos[i].at;
    pending *pd = &r->pend[(r->pend_head + r->pend_n) % r->nslots];
    kvf_status st = kvf_cache_put(r->c, r->dkeys, r->slots, d, q->priority, &pd->ticket);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry replay: %s: kvf_cache_put of %u blocks: %s\n",
                req_name(q, nm, sizeof nm), d, kvf_last_error());
        r->n.errors++;
        return 0;
    }
    pd->first = first - r->base;
    pd->n = m;
    pd->req = qi;
    r->pend_n++;
    return 0;
}

static int grow_keys(client *r, size_t n)
{
    size_t cap = r->keys_cap; /* both arrays grow alike */
    if (kvf_trace_grow((void **)&r->keys, &cap, n, sizeof *r->keys, 1024) ||
        kvf_trace_grow((void **)&r->tiers, &r->keys_cap, n, sizeof *r->tiers, 1024)) {
        fprintf(stderr, "kvferry replay: out of memory for %zu block keys\n", n);
        return -1;
    }
    return 0;
}

/* One part of a request when the cache owns the GPU slots (--gpu-tier):
 * its cached prefix acquired into GPU slots (pinned), slots allocated for
 * the rest, prefilled and committed, then all of it unpinned. A block the
 * part names twice is one block in one slot: moved and checked once. */
static int run_part_gpu(client *r, size_t qi, size_t s, uint32_t part)
{
    const kvf_trace_req *q = &r->trace->reqs[qi];
    char nm[160];
    uint32_t m = distinct_keys(r, r->keys + s, part);
    const kvf_key *keys = r->dkeys;
    size_t hits = 0, held = 0, todo = 0;
    kvf_cache_ticket t;
    double t0 = now_s();
    if (kvf_cache_acquire(r->c, keys, m, r->slots, &hits, &t) != KVF_OK) {
        fprintf(stderr, "kvferry replay: %s: kvf_cache_acquire of %u blocks: %s\n",
                req_name(q, nm, sizeof nm), m, kvf_last_error());
        r->n.errors++;
        hits = 0;
    } else {
        for (size_t i = 0; i < hits; i++)
            r->per[i] = KVF_ERR_LOST;
        kvf_cache_wait(r->c, t, r->per);
        r->n.get_s += now_s() - t0;
    }
    for (size_t i = 0; i < hits; i++) {
        if (r->per[i] == KVF_OK) {
            r->n.got_blocks++;
            size_t at = s + r->dpos[i].at;
            if (verify(r, q, at, keys[i], r->slots[i], r->tiers[at]))
                return -1;
            r->ukeys[held++] = keys[i];
            continue;
        }
        fprintf(stderr,
                "kvferry replay: %s: block %zu key " KVF_KEY_FMT
                ": acquire failed: %s; recomputed\n",
                req_name(q, nm, sizeof nm), s + r->dpos[i].at, KVF_KEY_ARGS(keys[i]),
                kvf_status_str(r->per[i]));
        r->n.errors++;
        unpin_keys(r, q, keys + i, 1); /* removed at this unpin */
        r->akeys[todo++] = keys[i];
    }
    for (size_t i = hits; i < m; i++)
        r->akeys[todo++] = keys[i];
    if (todo) {
        kvf_status st = kvf_cache_alloc(r->c, r->slots, todo, &t);
        if (st == KVF_OK)
            st = kvf_cache_wait(r->c, t, NULL);
        if (st == KVF_ERR_NO_SPACE) {
            r->n.no_space += todo; /* not computed into the cache this time */
            todo = 0;
        } else if (st != KVF_OK) {
            fprintf(stderr, "kvferry replay: %s: kvf_cache_alloc of %zu slots: %s\n",
                    req_name(q, nm, sizeof nm), todo, kvf_last_error());
            r->n.errors++;
            todo = 0;
        }
    }
    for (size_t i = 0; i < todo; i++)
        if (prefill(r, r->akeys[i], r->slots[i]))
            return -1;
    if (todo) {
        kvf_status st = kvf_cache_commit(r->c, r->akeys, r->slots, todo, q->priority, r->per);
        if (st == KVF_ERR_INVALID) {
            fprintf(stderr, "kvferry replay: %s: kvf_cache_commit: %s\n",
                    req_name(q, nm, sizeof nm), kvf_last_error());
            r->n.errors++;
        }
        size_t nfree = 0;
        for (size_t i = 0; i < todo; i++) {
            if (st != KVF_ERR_INVALID && r->per[i] == KVF_OK) {
                r->ukeys[held++] = r->akeys[i];
                continue;
            }
            if (st != KVF_ERR_INVALID && r->per[i] == KVF_ERR_STATE)
                r->n.no_space++; /* another request holds the key's copy */
            else if (st != KVF_ERR_INVALID)
                r->n.errors++;
            r->slots[nfree++] = r->slots[i];
        }
        if (nfree && kvf_cache_free(r->c, r->slots, nfree) != KVF_OK) {
            fprintf(stderr, "kvferry replay: %s: kvf_cache_free: %s\n", req_name(q, nm, sizeof nm),
                    kvf_last_error());
            r->n.errors++;
        }
    }
    if (held)
        unpin_keys(r, q, r->ukeys, held);
    return 0;
}

/* Plans a request over its `hits` (kvf_plan_compute with the engine's
 * costs now): it gets hits [*first_p, *loads_p); the plan's predictions
 * are summed. */
static int plan_request(client *r, const kvf_trace_req *q, size_t hits, size_t *first_p,
                        size_t *loads_p)
{
    const replay_opts *o = r->o;
    char nm[160];
    kvf_prefill_cost pc = KVF_PREFILL_COST_INIT;
    pc.new_tokens = o->prefill_tokens;
    pc.n_new = o->prefill_n;
    pc.seconds = o->prefill_s;
    pc.layers = o->plan_layers;
    pc.overlap = o->plan_overlap;
    pc.min_gain = o->plan_min_gain;
    pc.leading_only = o->plan_leading_only;
    kvf_plan_input in = KVF_PLAN_INPUT_INIT;
    in.tiers = r->tiers;
    in.hits = hits;
    in.block_bytes = (uint64_t)r->block_bytes * o->pools;
    in.tokens_per_block = o->g.tokens_per_block;
    in.request_tokens = q->has_keys ? q->n_keys * o->g.tokens_per_block : q->n_tokens;
    in.prefill = &pc;
    in.layerwise_tiers = kvf_engine_layerwise_tiers(r->e);
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        in.arrival_steps[t] = kvf_engine_arrival_groups(r->e, (kvf_tier)t);
    kvf_plan p = KVF_PLAN_INIT;
    if (kvf_engine_costs(r->e, &in.costs) != KVF_OK || kvf_plan_compute(&in, &p) != KVF_OK) {
        fprintf(stderr, "kvferry replay: %s: plan: %s\n", req_name(q, nm, sizeof nm),
                kvf_last_error());
        return -1;
    }
    r->n.planned++;
    r->n.ttft_plan_s += p.ttft_s;
    r->n.ttft_recompute_s += p.ttft_recompute_s;
    r->n.ttft_load_all_s += p.ttft_load_all_s;
    if (p.load_blocks == 0) {
        if (hits && (unsigned)r->tiers[0] < KVF_TIER_COUNT)
            r->n.plan_shape[0][r->tiers[0]]++;
    } else {
        for (int t = 0; t < KVF_TIER_COUNT; t++)
            if (p.load[t])
                r->n.plan_shape[p.load_first ? 2 : 1][t]++;
    }
    *first_p = p.load_first;
    *loads_p = p.load_blocks;
    return 0;
}

/* What the plan did with the hits still held: got [lf, loads), recomputed
 * the rest. */
static void plan_count(client *r, size_t hits, size_t lf, size_t loads)
{
    for (size_t i = 0; i < hits; i++)
        if ((unsigned)r->tiers[i] < KVF_TIER_COUNT)
            (i >= lf && i < loads ? r->n.plan_load : r->n.plan_recompute)[r->tiers[i]]++;
}

static int run_request(client *r, size_t qi)
{
    const kvf_trace_req *q = &r->trace->reqs[qi];
    uint32_t tpb = r->o->g.tokens_per_block;
    char nm[160];
    size_t n = q->has_keys ? q->n_keys : q->n_tokens / tpb;
    if (grow_keys(r, n ? n : 1))
        return -1;
    if (q->has_keys && n) /* no blocks: q->keys is NULL, memcpy must not see it */
        memcpy(r->keys, q->keys, n * sizeof *r->keys);
    else
        kvf_key_chain_all(q->tokens, q->n_tokens, tpb, q->salt, r->keys, n);
    r->n.blocks += n;
    r->n.tokens += q->has_keys ? n * tpb : q->n_tokens;
    if (n == 0)
        return 0;
    size_t hits = 0;
    if (kvf_cache_lookup(r->c, r->keys, n, &hits, r->tiers) != KVF_OK) {
        fprintf(stderr, "kvferry replay: %s: kvf_cache_lookup: %s\n", req_name(q, nm, sizeof nm),
                kvf_last_error());
        r->n.errors++;
        hits = 0;
    }
    for (size_t i = 0; i < hits; i++)
        if ((unsigned)r->tiers[i] < KVF_TIER_COUNT)
            r->n.hits[r->tiers[i]]++;
    size_t lf = 0, loads = hits;
    if (r->o->plan && plan_request(r, q, hits, &lf, &loads))
        return -1;
    if (r->o->gpu_tier) {
        int rc = 0;
        for (size_t s = 0; s < n && rc == 0; s += r->nslots)
            rc = run_part_gpu(r, qi, s, (uint32_t)(n - s < r->nslots ? n - s : r->nslots));
        drain_events(r->rp);
        return rc;
    }
    /* the request's hits stay cached while its parts run: pinned one by one,
     * for a hit may have been evicted since the lookup (by another client's
     * put): the prefix then ends there. Remote hits are the store's. */
    for (size_t i = 0; i < hits; i++) {
        if (!held_here(r->tiers[i]))
            continue;
        size_t pinned = 0;
        if (kvf_cache_pin(r->c, r->keys + i, 1, &pinned) != KVF_OK) {
            fprintf(stderr, "kvferry replay: %s: kvf_cache_pin: %s\n", req_name(q, nm, sizeof nm),
                    kvf_last_error());
            r->n.errors++;
        }
        if (pinned != 1) {
            r->n.raced += hits - i;
            hits = i;
        }
    }
    if (loads > hits)
        loads = hits;
    if (lf > loads)
        lf = loads;
    if (r->o->plan)
        plan_count(r, hits, lf, loads);
    int rc = 0;
    for (size_t s = 0; s < n && rc == 0; s += r->nslots) {
        uint32_t m = (uint32_t)(n - s < r->nslots ? n - s : r->nslots);
        /* [lf, loads) within this part's [s, s + m) */
        size_t a = lf > s ? lf : s, b = loads < s + m ? loads : s + m;
        uint32_t g0 = a < b ? (uint32_t)(a - s) : 0, g1 = a < b ? (uint32_t)(b - s) : 0;
        rc = run_part(r, qi, s, m, g0, g1);
    }
    for (size_t i = 0, j; i < hits; i = j + 1) { /* the runs still held */
        for (j = i; j < hits && held_here(r->tiers[j]); j++)
            ;
        if (j > i)
            unpin_keys(r, q, r->keys + i, j - i);
    }
    drain_events(r->rp);
    return rc;
}

/* ---- clients --------------------------------------------------------------- */

static int client_init(client *cl, replay *r, uint32_t base, uint32_t nslots)
{
    memset(cl, 0, sizeof *cl);
    cl->rp = r;
    cl->o = r->o;
    cl->trace = r->trace;
    cl->e = r->e;
    cl->c = r->c;
    cl->gpu = r->gpu;
    cl->block_bytes = r->block_bytes;
    cl->base = base;
    cl->nslots = nslots;
    cl->want = malloc(r->block_bytes);
    cl->got = malloc(r->block_bytes);
    cl->slots = malloc(nslots * sizeof *cl->slots);
    cl->per = malloc(nslots * sizeof *cl->per);
    cl->pend = malloc(nslots * sizeof *cl->pend);
    cl->akeys = malloc(nslots * sizeof *cl->akeys);
    cl->ukeys = malloc(nslots * sizeof *cl->ukeys);
    cl->dkeys = malloc(nslots * sizeof *cl->dkeys);
    cl->dpos = malloc(nslots * sizeof *cl->dpos);
    if (!cl->want || !cl->got || !cl->slots || !cl->per || !cl->pend || !cl->akeys || !cl->ukeys ||
        !cl->dkeys || !cl->dpos) {
        fprintf(stderr, "kvferry replay: out of memory\n");
        return -1;
    }
    return 0;
}

static void client_free(client *cl)
{
    free(cl->want);
    free(cl->got);
    free(cl->slots);
    free(cl->per);
    free(cl->pend);
    free(cl->akeys);
    free(cl->ukeys);
    free(cl->dkeys);
    free(cl->dpos);
    free(cl->keys);
    free(cl->tiers);
}

/* Runs requests, the next one not yet taken each time, then waits for its
 * puts. */
static void *client_main(void *arg)
{
    client *cl = arg;
    size_t i;
    while ((i = atomic_fetch_add(&cl->rp->next, 1)) < cl->trace->n) {
        if (run_request(cl, i)) {
            cl->rc = -1;
            break;
        }
        kvf_cli_progress("kvferry replay: requests", i + 1, cl->trace->n);
    }
    while (cl->pend_n)
        wait_put(cl);
    return NULL;
}

static void counts_add(counts *sum, const counts *c)
{
    sum->blocks += c->blocks;
    sum->tokens += c->tokens;
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        sum->hits[t] += c->hits[t];
    sum->got_blocks += c->got_blocks;
    sum->verified += c->verified;
    sum->prefilled += c->prefilled;
    sum->bad_blocks += c->bad_blocks;
    sum->errors += c->errors;
    sum->no_space += c->no_space;
    sum->raced += c->raced;
    sum->get_s += c->get_s;
    sum->planned += c->planned;
    for (int t = 0; t < KVF_TIER_COUNT; t++) {
        sum->plan_load[t] += c->plan_load[t];
        sum->plan_recompute[t] += c->plan_recompute[t];
        for (int k = 0; k < 3; k++)
            sum->plan_shape[k][t] += c->plan_shape[k][t];
    }
    sum->ttft_plan_s += c->ttft_plan_s;
    sum->ttft_recompute_s += c->ttft_recompute_s;
    sum->ttft_load_all_s += c->ttft_load_all_s;
}

/* ---- setup and report ----------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvferry replay [TRACE.jsonl | --gen KIND] [options]\n"
            "Replays requests through a kvferry cache, checking every block it hands back.\n"
            "  TRACE.jsonl             one request per line (docs/replay.md); - for stdin\n"
            "  --gen system-prompt|multi-turn|few-shot|mixed\n"
            "                          a generated shared-prefix workload (default: mixed)\n"
            "  --requests N --seed S   of the generated trace (default 200, 1)\n"
            "  --write-trace FILE      save the trace replayed, as JSONL\n"
            "  --backend auto|host|cuda  default auto (cuda where a GPU is usable)\n"
            "  --gpu-blocks N          primary slots: the serving engine's KV pool (256)\n"
            "  --gpu-tier              the cache owns the primary slots as its GPU tier\n"
            "                          (kvf_cache_acquire / alloc / commit / unpin), as\n"
            "                          TensorRT-LLM's block manager does\n"
            "  --host-blocks N         host tier capacity, in blocks (512; 0: off)\n"
            "  --disk DIR              disk tier in DIR/NAMESPACE\n"
            "  --disk-blocks N         disk tier capacity, in blocks (4096 with --disk)\n"
            "  --namespace NS          file (and remote) namespace (default replay; --ns too)\n"
            "  --remote-url URL        the engine's remote tier: redis://host:port[/db] or\n"
            "                          redis-cluster://h1:p1,h2:p2 (--remote too)\n"
            "  --remote-mode off|write-through|read   how the cache uses it (write-through)\n"
            "  --pools N               pools (tensors) per block (1)\n"
            "%s"
            "  --offload-min-priority N  --disk-admit-uses N   cache policy (default 0, 0)\n"
            "  --clients N             requests run by N threads at once, each with its share\n"
            "                          of the primary slots (1: in arrival order, a report\n"
            "                          the same on every run)\n"
            "  --threads N             engine worker threads (0: default)\n"
            "  --fsync none|batch|block  disk durability (default batch, the library's)\n"
            "  --prometheus            print the cache's Prometheus metrics at the end\n"
            "  --prefill-cost T:S[,T:S...]  plan each request (docs/planner.md): a full\n"
            "                          prefill of T tokens takes S seconds; the plan's hits\n"
            "                          are got, the others recomputed\n"
            "  --plan-layers N --plan-overlap  the model's layers; loads overlap them\n"
            "  --plan-min-gain F       a split must predict F less than the better pure\n"
            "                          policy (default 0.10)\n"
            "  --plan-leading-only     load leading hits only, never a front computed while\n"
            "                          the back loads (an engine such as vLLM)\n"
            "  --tier-cost TIER=LATENCY_S:BYTES_PER_S  hold a tier's read cost (repeatable;\n"
            "                          otherwise the engine's, learnt as the replay runs)\n"
            "A progress bar runs on standard error when it is a terminal.\n"
            "A block got from the cache that differs from what was put, a cache error, or\n"
            "every remote operation failing exits 1; a bad trace line 2; a trace file not\n"
            "found 3.\n"
            "%s",
            kvf_cli_geometry_usage, kvf_cli_common_usage);
}

/* replay's own options; a new one is a row here and a case below. */
enum {
    OPT_GEN = KVF_OPT_OWN,
    OPT_REQUESTS,
    OPT_SEED,
    OPT_WRITE_TRACE,
    OPT_GPU_BLOCKS,
    OPT_GPU_TIER,
    OPT_HOST_BLOCKS,
    OPT_DISK,
    OPT_DISK_BLOCKS,
    OPT_REMOTE_MODE,
    OPT_POOLS,
    OPT_OFFLOAD_MIN_PRIORITY,
    OPT_DISK_ADMIT_USES,
    OPT_CLIENTS,
    OPT_THREADS,
    OPT_FSYNC,
    OPT_PROMETHEUS,
    OPT_PREFILL_COST,
    OPT_PLAN_LAYERS,
    OPT_PLAN_OVERLAP,
    OPT_PLAN_MIN_GAIN,
    OPT_PLAN_LEADING_ONLY,
    OPT_TIER_COST,
};

static const struct option replay_options[] = {
    KVF_CLI_OPTS_COMMON,
    KVF_CLI_OPTS_BACKEND,
    KVF_CLI_OPTS_NAMESPACE,
    KVF_CLI_OPTS_REMOTE_URL,
    KVF_CLI_OPTS_GEOMETRY,
    {"gen", required_argument, NULL, OPT_GEN},
    {"requests", required_argument, NULL, OPT_REQUESTS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"write-trace", required_argument, NULL, OPT_WRITE_TRACE},
    {"gpu-blocks", required_argument, NULL, OPT_GPU_BLOCKS},
    {"gpu-tier", no_argument, NULL, OPT_GPU_TIER},
    {"host-blocks", required_argument, NULL, OPT_HOST_BLOCKS},
    {"disk", required_argument, NULL, OPT_DISK},
    {"disk-blocks", required_argument, NULL, OPT_DISK_BLOCKS},
    {"remote-mode", required_argument, NULL, OPT_REMOTE_MODE},
    {"pools", required_argument, NULL, OPT_POOLS},
    {"offload-min-priority", required_argument, NULL, OPT_OFFLOAD_MIN_PRIORITY},
    {"disk-admit-uses", required_argument, NULL, OPT_DISK_ADMIT_USES},
    {"clients", required_argument, NULL, OPT_CLIENTS},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"fsync", required_argument, NULL, OPT_FSYNC},
    {"prometheus", no_argument, NULL, OPT_PROMETHEUS},
    {"prefill-cost", required_argument, NULL, OPT_PREFILL_COST},
    {"plan-layers", required_argument, NULL, OPT_PLAN_LAYERS},
    {"plan-overlap", no_argument, NULL, OPT_PLAN_OVERLAP},
    {"plan-min-gain", required_argument, NULL, OPT_PLAN_MIN_GAIN},
    {"plan-leading-only", no_argument, NULL, OPT_PLAN_LEADING_ONLY},
    {"tier-cost", required_argument, NULL, OPT_TIER_COST},
    KVF_CLI_OPTS_END,
};

/* --prefill-cost T:S[,T:S...]: points of a full prefill's time, checked as
 * a plan would (kvf_prefill_cost_check). */
static int prefill_option(const char *v, replay_opts *o)
{
    const char *s = v;
    o->prefill_n = 0;
    while (*s) {
        char *end;
        errno = 0;
        unsigned long long t = strtoull(s, &end, 10);
        if (end == s || *end != ':' || errno || *s == '-')
            goto bad;
        s = end + 1;
        double sec = strtod(s, &end);
        if (end == s || (*end && *end != ',') || o->prefill_n == PREFILL_POINTS)
            goto bad;
        o->prefill_tokens[o->prefill_n] = t;
        o->prefill_s[o->prefill_n++] = sec;
        s = *end ? end + 1 : end;
    }
    kvf_prefill_cost pc = KVF_PREFILL_COST_INIT;
    pc.new_tokens = o->prefill_tokens;
    pc.n_new = o->prefill_n;
    pc.seconds = o->prefill_s;
    if (kvf_prefill_cost_check(&pc) != KVF_OK) {
        fprintf(stderr, "kvferry replay: --prefill-cost %s: %s\n", v, kvf_last_error());
        return -1;
    }
    o->plan = true;
    return 0;
bad:
    fprintf(stderr,
            "kvferry replay: --prefill-cost %s: expected TOKENS:SECONDS[,TOKENS:SECONDS...] "
            "(at most %d points)\n",
            v, PREFILL_POINTS);
    return -1;
}

/* --tier-cost TIER=LATENCY_S:BYTES_PER_S */
static int tier_cost_option(const char *v, replay_opts *o)
{
    static const char *const names[] = {"host", "disk", "remote", "gpu", NULL};
    const char *eq = strchr(v, '=');
    int t = -1;
    for (int i = 0; eq && names[i]; i++)
        if ((size_t)(eq - v) == strlen(names[i]) && !strncmp(v, names[i], (size_t)(eq - v)))
            t = i;
    char *end = NULL;
    double lat = eq ? strtod(eq + 1, &end) : 0, bw = 0;
    if (t < 0 || end == eq + 1 || *end != ':') {
        fprintf(stderr,
                "kvferry replay: --tier-cost %s: expected host|disk|remote|gpu=LATENCY_S:"
                "BYTES_PER_S\n",
                v);
        return -1;
    }
    const char *b = end + 1;
    bw = strtod(b, &end);
    if (end == b || *end || !(lat >= 0) || !(bw > 0) || lat > 1e9 || bw > 1e18) {
        fprintf(stderr,
                "kvferry replay: --tier-cost %s: latency must be >= 0 and throughput > 0 "
                "(finite numbers)\n",
                v);
        return -1;
    }
    o->tier_cost_set[t] = true;
    o->tier_latency[t] = lat;
    o->tier_bw[t] = bw;
    return 0;
}

/* One option's value into *o: 0, or -1 on a bad value (printed). */
static int replay_option(int c, const char *v, replay_opts *o)
{
    static const char *const gens[] = {"system-prompt", "multi-turn", "few-shot", "mixed",
                                       NULL}; /* kvf_trace_gen's order */
    static const char *const remote_modes[] = {"off", "write-through", "read", NULL};
    uint64_t u;
    int choice, rc = 0;
    switch (c) {
    case KVF_OPT_JSON:
        o->json = v;
        break;
    case KVF_OPT_BACKEND:
        return kvf_cli_backend("replay", v, &o->backend);
    case KVF_OPT_NAMESPACE:
        o->ns = v;
        break;
    case KVF_OPT_REMOTE_URL:
        o->remote_url = v;
        break;
    case OPT_GEN:
        rc = kvf_cli_choice("replay", "gen", v, gens, &choice);
        o->gen = rc ? o->gen : (kvf_trace_gen)choice;
        o->gen_set = true;
        break;
    case OPT_REQUESTS:
        rc = kvf_cli_number("replay", "requests", v, 1, UINT32_MAX, &u);
        o->requests = (uint32_t)u;
        break;
    case OPT_SEED:
        return kvf_cli_u64("replay", "seed", v, &o->seed);
    case OPT_WRITE_TRACE:
        o->write_trace = v;
        break;
    case OPT_GPU_BLOCKS:
        rc = kvf_cli_number("replay", "gpu-blocks", v, 1, UINT32_MAX, &u);
        o->gpu_blocks = (uint32_t)u;
        break;
    case OPT_GPU_TIER:
        o->gpu_tier = true;
        break;
    case OPT_HOST_BLOCKS: /* secondary slots of a pool: 32 bits */
        return kvf_cli_number("replay", "host-blocks", v, 0, UINT32_MAX, &o->host_blocks);
    case OPT_DISK:
        o->disk = v;
        break;
    case OPT_DISK_BLOCKS:
        o->disk_blocks_set = true;
        return kvf_cli_u64("replay", "disk-blocks", v, &o->disk_blocks);
    case OPT_REMOTE_MODE:
        rc = kvf_cli_choice("replay", "remote-mode", v, remote_modes, &choice);
        o->remote = rc ? o->remote : (kvf_cache_remote)choice;
        o->remote_set = true;
        break;
    case OPT_POOLS:
        rc = kvf_cli_number("replay", "pools", v, 1, UINT32_MAX, &u);
        o->pools = (uint32_t)u;
        break;
    case OPT_OFFLOAD_MIN_PRIORITY:
        rc = kvf_cli_number("replay", "offload-min-priority", v, 0, 100, &u);
        o->offload_min_priority = (uint32_t)u;
        break;
    case OPT_DISK_ADMIT_USES:
        return kvf_cli_u32("replay", "disk-admit-uses", v, &o->disk_admit_uses);
    case OPT_CLIENTS:
        rc = kvf_cli_number("replay", "clients", v, 1, 1024, &u);
        o->clients = (uint32_t)u;
        break;
    case OPT_THREADS:
        return kvf_cli_u32("replay", "threads", v, &o->threads);
    case OPT_FSYNC:
        rc = kvf_cli_choice("replay", "fsync", v, kvf_cli_fsync_names, &choice);
        o->fsync = rc ? o->fsync : (kvf_fsync)choice;
        break;
    case OPT_PROMETHEUS:
        o->prometheus = true;
        break;
    case OPT_PREFILL_COST:
        return prefill_option(v, o);
    case OPT_PLAN_LAYERS:
        return kvf_cli_u32("replay", "plan-layers", v, &o->plan_layers);
    case OPT_PLAN_OVERLAP:
        o->plan_overlap = true;
        break;
    case OPT_PLAN_MIN_GAIN: {
        char *end;
        o->plan_min_gain = strtod(v, &end);
        if (end == v || *end || !(o->plan_min_gain >= 0 && o->plan_min_gain < 1)) {
            fprintf(stderr, "kvferry replay: --plan-min-gain %s: a fraction >= 0 and < 1\n", v);
            return -1;
        }
        o->plan_min_gain_set = true;
        break;
    }
    case OPT_PLAN_LEADING_ONLY:
        o->plan_leading_only = true;
        break;
    case OPT_TIER_COST:
        return tier_cost_option(v, o);
    default:
        return kvf_cli_geometry_opt("replay", c, v, &o->g) == 1 ? 0 : -1;
    }
    return rc;
}

/* The options' values checked together. */
static int check_options(replay_opts *o)
{
    if (o->trace_path && o->gen_set) {
        fprintf(stderr, "kvferry replay: a trace file or --gen, not both\n");
        return -1;
    }
    if (o->gpu_blocks < o->clients) {
        fprintf(stderr, "kvferry replay: %u clients need at least as many --gpu-blocks\n",
                o->clients);
        return -1;
    }
    if (o->disk_blocks_set && !o->disk && o->disk_blocks) {
        fprintf(stderr, "kvferry replay: --disk-blocks needs --disk DIR\n");
        return -1;
    }
    if (!o->disk)
        o->disk_blocks = 0;
    else if (!o->disk_blocks_set)
        o->disk_blocks = 4096;
    if (o->remote_url && !o->remote_set)
        o->remote = KVF_CACHE_REMOTE_WRITE_THROUGH;
    if (o->remote != KVF_CACHE_REMOTE_OFF && !o->remote_url) {
        fprintf(stderr, "kvferry replay: --remote-mode needs --remote-url URL\n");
        return -1;
    }
    if (!o->host_blocks && !o->disk_blocks) {
        fprintf(stderr, "kvferry replay: every tier is off: give --host-blocks or --disk\n");
        return -1;
    }
    bool costs = false;
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        costs = costs || o->tier_cost_set[t];
    if (o->plan && o->gpu_tier) {
        /* kvf_cache_acquire brings every hit up: no plan to follow */
        fprintf(stderr, "kvferry replay: --prefill-cost and --gpu-tier: one or the other\n");
        return -1;
    }
    if (!o->plan && (costs || o->plan_layers || o->plan_overlap || o->plan_min_gain_set ||
                     o->plan_leading_only)) {
        fprintf(stderr, "kvferry replay: --tier-cost, --plan-layers, --plan-overlap, "
                        "--plan-min-gain and --plan-leading-only need --prefill-cost\n");
        return -1;
    }
    return 0;
}

/* 0 parsed, 1 --help printed, -1 a usage error (printed). */
static int parse_args(int argc, char **argv, replay_opts *o)
{
    int c;
    optind = 0;
    while ((c = kvf_cli_getopt("replay", argc, argv, replay_options)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 1;
        }
        if (c == '?' || replay_option(c, optarg, o))
            return -1;
    }
    for (; optind < argc; optind++) {
        if (o->trace_path) {
            fprintf(stderr, "kvferry replay: one trace file only ('%s')\n", argv[optind]);
            return -1;
        }
        o->trace_path = argv[optind];
    }
    return check_options(o);
}

static uint64_t total_hits(const replay *r)
{
    uint64_t n = 0;
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        n += r->n.hits[t];
    return n;
}

static double pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0;
}

static void print_report(const replay *r, const kvf_cache_stats *s, const char *source)
{
    const replay_opts *o = r->o;
    uint64_t hit = total_hits(r), miss = r->n.blocks - hit;
    uint32_t tpb = o->g.tokens_per_block;
    printf("kvferry replay: %zu requests (%s), %llu blocks of %u tokens, %s backend", r->trace->n,
           source, (unsigned long long)r->n.blocks, tpb,
           kvf_backend_name(kvf_engine_backend(r->e)));
    if (o->clients > 1)
        printf(", %u clients", o->clients);
    printf("\n");
    char b1[32], b2[32];
    printf("  block: %u pool(s) x %s (%s, %ux%ux%ux%ux%u %s)\n", o->pools,
           kvf_cli_bytes(r->block_bytes, b1), kvf_dtype_name(o->g.dtype), o->g.layers,
           o->g.kv_factor, o->g.kv_heads, o->g.tokens_per_block, o->g.head_size,
           o->g.order == KVF_ORDER_HEAD_MAJOR ? "head-major" : "token-major");
    printf("  tiers: primary %u slots, host %llu blocks, disk %llu blocks%s%s%s%s\n", o->gpu_blocks,
           (unsigned long long)o->host_blocks, (unsigned long long)o->disk_blocks,
           o->disk ? " in " : "", o->disk ? o->disk : "", o->disk ? "/" : "", o->disk ? o->ns : "");
    if (o->remote != KVF_CACHE_REMOTE_OFF)
        printf("  remote: %s (%s)\n", o->remote_url,
               o->remote == KVF_CACHE_REMOTE_READ ? "read only" : "write-through");
    printf("  hits:");
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        printf(" %s %llu (%.2f%%),", kvf_tier_name((kvf_tier)t), (unsigned long long)r->n.hits[t],
               pct(r->n.hits[t], r->n.blocks));
    printf(" misses %llu (%.2f%%)\n", (unsigned long long)miss, pct(miss, r->n.blocks));
    printf("  prefill saved: %llu of %llu tokens (%.2f%%)\n", (unsigned long long)hit * tpb,
           (unsigned long long)r->n.tokens, pct(hit * tpb, r->n.tokens));
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        printf("  %s tier: %llu blocks now, %s in, %s out, %llu evictions\n",
               kvf_tier_name((kvf_tier)t), (unsigned long long)s->blocks[t],
               kvf_cli_bytes(s->bytes_in[t], b1), kvf_cli_bytes(s->bytes_out[t], b2),
               (unsigned long long)s->evictions[t]);
    printf("  dropped %llu, failures %llu, puts refused for space %llu, hits evicted before "
           "their pin %llu, remote errors %llu, errors %llu\n",
           (unsigned long long)s->dropped, (unsigned long long)s->failures,
           (unsigned long long)r->n.no_space, (unsigned long long)r->n.raced,
           (unsigned long long)s->remote_errors, (unsigned long long)r->n.errors);
    printf("  events: %llu stored, %llu updated, %llu removed, %llu dropped\n",
           (unsigned long long)r->events_seen[KVF_EVENT_STORED],
           (unsigned long long)r->events_seen[KVF_EVENT_UPDATED],
           (unsigned long long)r->events_seen[KVF_EVENT_REMOVED],
           (unsigned long long)s->events_dropped);
    if (o->plan) {
        printf("  plan: loaded");
        for (int t = 0; t < KVF_TIER_COUNT; t++)
            printf(" %s %llu%s", kvf_tier_name((kvf_tier)t), (unsigned long long)r->n.plan_load[t],
                   t + 1 < KVF_TIER_COUNT ? "," : ";");
        printf(" recomputed");
        uint64_t loaded = 0;
        for (int t = 0; t < KVF_TIER_COUNT; t++) {
            printf(" %s %llu,", kvf_tier_name((kvf_tier)t),
                   (unsigned long long)r->n.plan_recompute[t]);
            loaded += r->n.plan_load[t];
        }
        printf(" prefill saved %llu tokens\n", (unsigned long long)(loaded * tpb));
        static const char *const shape[3] = {"recompute", "leading", "front"};
        printf("  plan shapes, per tier:");
        for (int t = 0; t < KVF_TIER_COUNT; t++)
            printf(" %s %llu/%llu/%llu%s", kvf_tier_name((kvf_tier)t),
                   (unsigned long long)r->n.plan_shape[0][t],
                   (unsigned long long)r->n.plan_shape[1][t],
                   (unsigned long long)r->n.plan_shape[2][t], t + 1 < KVF_TIER_COUNT ? "," : "");
        printf(" (%s/%s/%s)\n", shape[0], shape[1], shape[2]);
        printf("  predicted ttft, sum of %llu requests: plan %.6f s, recompute all %.6f s, load "
               "all %.6f s\n",
               (unsigned long long)r->n.planned, r->n.ttft_plan_s, r->n.ttft_recompute_s,
               r->n.ttft_load_all_s);
        kvf_costs c = KVF_COSTS_INIT;
        if (kvf_engine_costs(r->e, &c) == KVF_OK) {
            printf("  costs:");
            for (int t = 0; t < KVF_TIER_COUNT; t++)
                printf(" %s %.3g s + B / %.3g B/s (%s)%s", kvf_tier_name((kvf_tier)t),
                       c.tier[t].latency_s, c.tier[t].bytes_per_s,
                       c.tier[t].held       ? "held"
                       : c.tier[t].observed ? "observed"
                                            : "seed",
                       t + 1 < KVF_TIER_COUNT ? "," : "\n");
        }
    }
    printf("  verified: %llu blocks got from the cache, %s\n", (unsigned long long)r->n.verified,
           r->n.bad_blocks ? "SOME WRONG" : "every byte right");
    double got_bytes = (double)r->n.got_blocks * r->block_bytes * o->pools;
    printf("  time: %.3f s wall; gets of %s in %.3f s (%.2f GB/s)\n", r->wall_s,
           kvf_cli_bytes((uint64_t)got_bytes, b1), r->n.get_s,
           r->n.get_s > 0 ? got_bytes / r->n.get_s / 1e9 : 0);
}

static cJSON *tier_counts(const uint64_t *v, double scale)
{
    cJSON *o = cJSON_CreateObject();
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        cJSON_AddNumberToObject(o, kvf_tier_name((kvf_tier)t), (double)v[t] * scale);
    return o;
}

/* The report as JSON: the replay's own counts, each tier's figures at the
 * top level (as the report's readers expect them), the cache's whole stats
 * under "cache". */
static cJSON *report_json(const replay *r, const kvf_cache_stats *s, const char *source)
{
    const replay_opts *o = r->o;
    uint64_t hit = total_hits(r), tpb = o->g.tokens_per_block;
    double got_bytes = (double)r->n.got_blocks * r->block_bytes * o->pools;
    double per_block = r->n.blocks ? 1.0 / (double)r->n.blocks : 0;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "source", source);
    cJSON_AddStringToObject(j, "backend", kvf_backend_name(kvf_engine_backend(r->e)));
    cJSON_AddNumberToObject(j, "requests", (double)r->trace->n);
    cJSON_AddNumberToObject(j, "blocks", (double)r->n.blocks);
    cJSON_AddNumberToObject(j, "tokens", (double)r->n.tokens);
    cJSON_AddNumberToObject(j, "tokens_per_block", tpb);
    cJSON_AddNumberToObject(j, "pools", o->pools);
    cJSON_AddNumberToObject(j, "block_bytes", (double)r->block_bytes);
    cJSON_AddNumberToObject(j, "gpu_blocks", o->gpu_blocks);
    cJSON_AddBoolToObject(j, "gpu_tier", o->gpu_tier);
    cJSON_AddNumberToObject(j, "clients", o->clients);
    cJSON_AddNumberToObject(j, "host_blocks", (double)o->host_blocks);
    cJSON_AddNumberToObject(j, "disk_blocks", (double)o->disk_blocks);
    cJSON_AddItemToObject(j, "hits", tier_counts(r->n.hits, 1));
    cJSON_AddItemToObject(j, "hit_rate", tier_counts(r->n.hits, per_block));
    cJSON_AddNumberToObject(j, "misses", (double)(r->n.blocks - hit));
    cJSON_AddNumberToObject(j, "miss_rate", (double)(r->n.blocks - hit) * per_block);
    cJSON_AddNumberToObject(j, "prefill_tokens_saved", (double)(hit * tpb));
    cJSON_AddNumberToObject(j, "prefill_saved_share", pct(hit * tpb, r->n.tokens) / 100);
    for (int t = 0; t < KVF_TIER_COUNT; t++) {
        cJSON *tier = cJSON_AddObjectToObject(j, kvf_tier_name((kvf_tier)t));
        cJSON_AddNumberToObject(tier, "blocks", (double)s->blocks[t]);
        cJSON_AddNumberToObject(tier, "bytes_in", (double)s->bytes_in[t]);
        cJSON_AddNumberToObject(tier, "bytes_out", (double)s->bytes_out[t]);
        cJSON_AddNumberToObject(tier, "evictions", (double)s->evictions[t]);
    }
    cJSON_AddNumberToObject(j, "dropped", (double)s->dropped);
    cJSON_AddNumberToObject(j, "failures", (double)s->failures);
    cJSON_AddNumberToObject(j, "no_space", (double)r->n.no_space);
    cJSON_AddNumberToObject(j, "raced", (double)r->n.raced);
    cJSON_AddNumberToObject(j, "remote_errors", (double)s->remote_errors);
    cJSON_AddNumberToObject(j, "errors", (double)r->n.errors);
    cJSON *ev = cJSON_AddObjectToObject(j, "events");
    cJSON_AddNumberToObject(ev, "stored", (double)r->events_seen[KVF_EVENT_STORED]);
    cJSON_AddNumberToObject(ev, "updated", (double)r->events_seen[KVF_EVENT_UPDATED]);
    cJSON_AddNumberToObject(ev, "removed", (double)r->events_seen[KVF_EVENT_REMOVED]);
    cJSON_AddNumberToObject(ev, "dropped", (double)s->events_dropped);
    cJSON_AddNumberToObject(j, "verified_blocks", (double)r->n.verified);
    cJSON_AddNumberToObject(j, "wrong_blocks", (double)r->n.bad_blocks);
    cJSON_AddBoolToObject(j, "verified", r->n.bad_blocks == 0);
    cJSON_AddNumberToObject(j, "wall_s", r->wall_s);
    cJSON_AddNumberToObject(j, "get_s", r->n.get_s);
    cJSON_AddNumberToObject(j, "get_bytes", got_bytes);
    cJSON_AddNumberToObject(j, "get_gbs", r->n.get_s > 0 ? got_bytes / r->n.get_s / 1e9 : 0);
    if (o->plan) {
        cJSON *pl = cJSON_AddObjectToObject(j, "plan");
        cJSON_AddNumberToObject(pl, "requests", (double)r->n.planned);
        cJSON_AddItemToObject(pl, "loaded", tier_counts(r->n.plan_load, 1));
        cJSON_AddItemToObject(pl, "recomputed", tier_counts(r->n.plan_recompute, 1));
        cJSON *sh = cJSON_AddObjectToObject(pl, "shapes");
        cJSON_AddItemToObject(sh, "recompute", tier_counts(r->n.plan_shape[0], 1));
        cJSON_AddItemToObject(sh, "leading", tier_counts(r->n.plan_shape[1], 1));
        cJSON_AddItemToObject(sh, "front", tier_counts(r->n.plan_shape[2], 1));
        uint64_t loaded = 0;
        for (int t = 0; t < KVF_TIER_COUNT; t++)
            loaded += r->n.plan_load[t];
        cJSON_AddNumberToObject(pl, "prefill_tokens_saved", (double)(loaded * tpb));
        cJSON *tt = cJSON_AddObjectToObject(pl, "ttft_s");
        cJSON_AddNumberToObject(tt, "plan", r->n.ttft_plan_s);
        cJSON_AddNumberToObject(tt, "recompute_all", r->n.ttft_recompute_s);
        cJSON_AddNumberToObject(tt, "load_all", r->n.ttft_load_all_s);
        kvf_costs c = KVF_COSTS_INIT;
        if (kvf_engine_costs(r->e, &c) == KVF_OK) {
            cJSON *cs = cJSON_AddObjectToObject(pl, "costs");
            for (int t = 0; t < KVF_TIER_COUNT; t++) {
                cJSON *ct = cJSON_AddObjectToObject(cs, kvf_tier_name((kvf_tier)t));
                cJSON_AddNumberToObject(ct, "latency_s", c.tier[t].latency_s);
                cJSON_AddNumberToObject(ct, "bytes_per_s", c.tier[t].bytes_per_s);
                cJSON_AddNumberToObject(ct, "observed", (double)c.tier[t].observed);
                cJSON_AddBoolToObject(ct, "held", c.tier[t].held);
            }
        }
    }
    cJSON_AddItemToObject(j, "cache", kvf_cli_cache_stats_json(s));
    return j;
}

/* 0, or the exit code (printed): 3 a trace file not found, 2 a bad
 * line, 1 out of memory or a --write-trace that failed. */
static int load_trace(replay_opts *o, kvf_trace *t, char *source, size_t cap)
{
    if (!o->trace_path) {
        if (kvf_trace_generate(o->gen, o->requests, o->seed, t)) {
            fprintf(stderr, "kvferry replay: out of memory generating the trace\n");
            return KVF_CLI_FAILED;
        }
        snprintf(source, cap, "%s, seed %llu", kvf_trace_gen_name(o->gen),
                 (unsigned long long)o->seed);
    } else {
        bool stdin_ = !strcmp(o->trace_path, "-");
        FILE *f = stdin_ ? stdin : fopen(o->trace_path, "r");
        if (!f) {
            fprintf(stderr, "kvferry replay: %s: %s\n", o->trace_path, strerror(errno));
            return errno == ENOENT || errno == ENOTDIR ? KVF_CLI_MISSING : KVF_CLI_FAILED;
        }
        int rc = kvf_trace_read(f, stdin_ ? "stdin" : o->trace_path, t);
        if (!stdin_)
            fclose(f);
        if (rc)
            return KVF_CLI_USAGE;
        kvf_trace_sort(t);
        snprintf(source, cap, "%s", o->trace_path);
    }
    if (o->write_trace) {
        FILE *f = fopen(o->write_trace, "w");
        int rc = f ? kvf_trace_write(t, f) : -1;
        if (f && fclose(f))
            rc = -1;
        if (rc) {
            fprintf(stderr, "kvferry replay: --write-trace %s: %s\n", o->write_trace,
                    strerror(errno));
            return KVF_CLI_FAILED;
        }
    }
    return 0;
}

/* The engine and cache of a replay (or of `kvferry stats`): one pool per
 * --pools of the geometry, secondary slots for the host tier. 0; an exit
 * code for an engine not created; -1 (printed) for another failure. */
static int open_replay(replay *r)
{
    const replay_opts *o = r->o;
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = o->backend;
    cfg.threads = o->threads;
    cfg.file.dir = o->disk;
    cfg.file.namespace_ = o->ns;
    cfg.file.fsync = o->fsync;
    cfg.remote.url = o->remote_url;
    kvf_status created = kvf_engine_create(&cfg, &r->e);
    if (created != KVF_OK) {
        fprintf(stderr, "kvferry replay: engine: %s\n", kvf_last_error());
        return kvf_cli_create_exit(created);
    }
    r->gpu = kvf_engine_backend(r->e) == KVF_BACKEND_CUDA;
    for (uint32_t p = 0; p < o->pools; p++) {
        kvf_pool_desc prim = {r->gpu ? KVF_MEMORY_DEVICE : KVF_MEMORY_HOST, NULL, 0, o->gpu_blocks};
        kvf_pool_desc sec = {r->gpu ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST, NULL, 0,
                             (uint32_t)o->host_blocks};
        if (kvf_engine_add_pool(r->e, &o->g, &prim, o->host_blocks ? &sec : NULL, NULL) != KVF_OK) {
            fprintf(stderr, "kvferry replay: pool %u: %s\n", p, kvf_last_error());
            return -1;
        }
    }
    kvf_cache_config cc = {
        .struct_size = sizeof cc,
        .host = {.blocks = o->host_blocks},
        .disk = {.blocks = o->disk_blocks, .admit_uses = o->disk_admit_uses},
        .gpu = {.blocks = o->gpu_tier ? o->gpu_blocks : 0},
        .remote = o->remote,
        .events = {.queue = EVENT_QUEUE},
        .offload_min_priority = o->offload_min_priority,
    };
    if (kvf_cache_create(r->e, &cc, &r->c) != KVF_OK) {
        fprintf(stderr, "kvferry replay: cache: %s\n", kvf_last_error());
        return -1;
    }
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        if (o->tier_cost_set[t] && kvf_engine_set_tier_cost(r->e, (kvf_tier)t, o->tier_latency[t],
                                                            o->tier_bw[t], 1) != KVF_OK) {
            fprintf(stderr, "kvferry replay: --tier-cost: %s\n", kvf_last_error());
            return -1;
        }
    return 0;
}

/* Whether the remote tier was asked for work and did none of it. */
static bool remote_all_failed(const kvf_cache_stats *s)
{
    return s->remote_errors > 0 && s->bytes_in[KVF_TIER_REMOTE] == 0 &&
           s->bytes_out[KVF_TIER_REMOTE] == 0 && s->hits[KVF_TIER_REMOTE] == 0;
}

int kvf_cli_replay(int argc, char **argv)
{
    replay_opts o = {
        .gen = KVF_GEN_MIXED,
        .requests = 200,
        .seed = 1,
        .backend = KVF_CLI_BACKEND_DEFAULT,
        .g = KVF_CLI_GEOMETRY_DEFAULT,
        .pools = 1,
        .gpu_blocks = 256,
        .clients = 1,
        .host_blocks = 512,
        .ns = "replay",
        .fsync = KVF_CLI_FSYNC_DEFAULT,
        .plan_min_gain = KVF_PLAN_MIN_GAIN,
    };
    int parsed = parse_args(argc, argv, &o);
    if (parsed)
        return parsed > 0 ? 0 : kvf_cli_usage_error("replay");
    replay r;
    memset(&r, 0, sizeof r);
    r.o = &o;
    kvf_trace trace = {0};
    client *clients = NULL;
    uint32_t started;
    bool mutex = false;
    char source[4200];
    int rc = 1;
    if (kvf_geometry_block_bytes(&o.g, &r.block_bytes) != KVF_OK) {
        fprintf(stderr, "kvferry replay: geometry: %s\n", kvf_last_error());
        return 2;
    }
    if (kvf_cli_json_open("replay", o.json))
        return KVF_CLI_FAILED;
    int loaded = load_trace(&o, &trace, source, sizeof source);
    if (loaded) {
        kvf_cli_json_close("replay");
        kvf_trace_free(&trace);
        return loaded;
    }
    r.trace = &trace;
    r.events = malloc(EVENT_QUEUE * sizeof *r.events);
    clients = calloc(o.clients, sizeof *clients);
    if (!r.events || !clients) {
        fprintf(stderr, "kvferry replay: out of memory\n");
        goto out;
    }
    pthread_mutex_init(&r.ev_mu, NULL);
    mutex = true;
    int opened = open_replay(&r);
    if (opened) {
        rc = opened > 0 ? opened : KVF_CLI_FAILED;
        goto out;
    }
    double t0 = now_s();
    uint32_t per_client = o.gpu_blocks / o.clients;
    for (uint32_t k = 0; k < o.clients; k++)
        if (client_init(&clients[k], &r, k * per_client,
                        k + 1 < o.clients ? per_client : o.gpu_blocks - k * per_client))
            goto out;
    started = 0;
    if (o.clients == 1) {
        client_main(&clients[0]);
    } else {
        for (; started < o.clients; started++)
            if (pthread_create(&clients[started].thread, NULL, client_main, &clients[started])) {
                fprintf(stderr, "kvferry replay: cannot start client thread %u\n", started);
                r.n.errors++;
                break;
            }
        for (uint32_t k = 0; k < started; k++)
            pthread_join(clients[k].thread, NULL);
    }
    for (uint32_t k = 0; k < o.clients; k++) {
        if (clients[k].rc)
            goto out;
        counts_add(&r.n, &clients[k].n);
    }
    /* the cache's own moves down a tier, queued behind the last puts */
    if (kvf_sync_stream(r.e, NULL) != KVF_OK) {
        fprintf(stderr, "kvferry replay: kvf_sync_stream: %s\n", kvf_last_error());
        r.n.errors++;
    }
    r.wall_s = now_s() - t0;
    kvf_cli_progress_end();
    drain_events(&r);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    if (kvf_cache_stats_get(r.c, &s) != KVF_OK) {
        fprintf(stderr, "kvferry replay: stats: %s\n", kvf_last_error());
        goto out;
    }
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        if (s.hits[t] != r.n.hits[t]) {
            fprintf(stderr,
                    "kvferry replay: the cache's stats count %llu %s hits, its lookups "
                    "returned %llu\n",
                    (unsigned long long)s.hits[t], kvf_tier_name((kvf_tier)t),
                    (unsigned long long)r.n.hits[t]);
            r.n.errors++;
        }
    if (r.event_gaps > s.events_dropped) {
        fprintf(stderr, "kvferry replay: %llu event sequence numbers missing, %llu dropped\n",
                (unsigned long long)r.event_gaps, (unsigned long long)s.events_dropped);
        r.n.errors++;
    }
    print_report(&r, &s, source);
    if (remote_all_failed(&s)) {
        fprintf(stderr,
                "kvferry replay: every remote operation failed (%llu errors, nothing stored "
                "or read): the remote tier did not work\n",
                (unsigned long long)s.remote_errors);
        r.n.errors++;
    }
    if (kvf_cli_json_emit("replay", report_json(&r, &s, source)))
        r.n.errors++;
    if (o.prometheus && kvf_cli_print_prometheus(r.c, true))
        r.n.errors++;
    fflush(stdout);
    if (kvf_cli_json_close("replay"))
        r.n.errors++;
    rc = r.n.bad_blocks || r.n.errors ? 1 : 0;
out:
    kvf_cli_json_close("replay"); /* after an early error: nothing more to write */
    for (uint32_t k = 0; clients && k < o.clients; k++)
        client_free(&clients[k]);
    free(clients);
    kvf_cache_destroy(r.c);
    kvf_engine_destroy(r.e);
    if (mutex)
        pthread_mutex_destroy(&r.ev_mu);
    kvf_trace_free(&trace);
    free(r.events);
    return rc;
}
