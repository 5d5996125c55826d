/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvferry bench --mode contention`: does a small onboard wait behind
 * offloads? The latency of a 16-block onboard (host secondary slots ->
 * primary slots, kvf_onboard + kvf_wait) idle, while another thread
 * keeps large offload batches in flight on disjoint slots of the same
 * engine, and into slots being evicted: submitted right after a large
 * offload batch whose first moves read its destinations (an engine
 * evicting GPU blocks and reusing their slots at once); the offloads'
 * throughput alone and beside the onboards; and, in the same run, the
 * same questions asked of raw copies (cudaMemcpyAsync on two streams, or
 * memcpy on two threads on the host backend). Every onboarded block is
 * compared with its random source after the phase, each onboard having
 * gone into destinations poisoned before it, and every eviction stored
 * the poison its slots held before the onboard (write after read).
 * --pools N splits each block over N pools, as vLLM and SGLang keep a
 * pool per layer (K and V apart): the engine sizes its calls by the
 * copies' size, and the raw copies make one copy per pool of each block.
 */
#include "bench.h"
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KVF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define MAX_SIZES 8
/* offload batches the load keeps in flight, at most */
#define LOAD_DEPTH_MAX 16
#define POISON 0xA5
/* kvf_side.differs[i]: block i is the same as its source in every pool */
#define SAME UINT32_MAX
/* --pools: at most this many pools (a 2 MiB block of a Llama-3-8B shape is
 * 64: one per layer, K and V apart) */
#define POOLS_MAX 1024

typedef struct contend_opts {
    kvf_backend backend;
    const char *json;
    size_t sizes[MAX_SIZES];
    size_t nsizes;
    uint32_t blocks, load_blocks, load_depth, reps;
    uint32_t pools; /* each block of --sizes split evenly over them */
    double load_seconds;
    uint64_t seed;
} contend_opts;

/* ---- the load: batches kept in flight by a thread --------------------- */

/* A thread that moves batch_bytes per batch until told to stop, recording
 * each batch's submission and completion times. */
typedef struct load {
    void *(*body)(void *);
    void *ctx;
    size_t batch_bytes;
    pthread_t th;
    atomic_bool stop;
    atomic_uint done;
    bool failed;
    double *start, *end;
    size_t n, cap;
} load;

static int load_record(load *l, double start, double end)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        double *s = realloc(l->start, cap * sizeof *s);
        if (s)
            l->start = s;
        double *e = s ? realloc(l->end, cap * sizeof *e) : NULL;
        if (!e)
            return -1;
        l->end = e;
        l->cap = cap;
    }
    l->start[l->n] = start;
    l->end[l->n++] = end;
    atomic_fetch_add(&l->done, 1);
    return 0;
}

static int load_start(load *l)
{
    l->n = 0;
    l->failed = false;
    atomic_store(&l->stop, false);
    atomic_store(&l->done, 0);
    if (pthread_create(&l->th, NULL, l->body, l) != 0) {
        fprintf(stderr, "kvferry bench: cannot start the load thread\n");
        return -1;
    }
    return 0;
}

/* Waits until the load completed its first batch (so it runs at full
 * speed from here); -1 when it failed instead. */
static int load_warm(load *l)
{
    while (atomic_load(&l->done) == 0 && !l->failed) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return l->failed ? -1 : 0;
}

static int load_stop(load *l)
{
    atomic_store(&l->stop, true);
    pthread_join(l->th, NULL);
    return l->failed ? -1 : 0;
}

/* GB/s during [a, b]: each batch's bytes counted in proportion to the
 * part of its time (submission to completion) inside the window, so that a
 * window shorter than a batch still measures; with batches in flight
 * each one's time is twice the link's, and the sum comes out the same. */
static double load_gbs(const load *l, double a, double b)
{
    double bytes = 0;
    for (size_t i = 0; i < l->n; i++) {
        double from = l->start[i] > a ? l->start[i] : a;
        double to = l->end[i] < b ? l->end[i] : b;
        if (to > from && l->end[i] > l->start[i])
            bytes += (double)l->batch_bytes * (to - from) / (l->end[i] - l->start[i]);
    }
    return b > a ? bytes / (b - a) / 1e9 : 0;
}

static void load_free(load *l)
{
    free(l->start);
    free(l->end);
}

/* ---- one phase: small moves timed one by one, with or without load ----- */

/* One small move, the rep-th; 0, or -1 printed. */
typedef int (*small_fn)(void *ctx, uint32_t rep);

/* Untimed work before rep `rep` is timed (rep == reps: after the last):
 * the evicting phase's offload batch; 0, or -1 printed. */
typedef int (*prep_fn)(void *ctx, uint32_t rep);

typedef struct phase {
    double p50, p99; /* seconds */
    double load_gbs; /* the load's throughput during the phase (0 idle) */
    /* the phase's length, and the mean time a load batch took from submit
     * to completion: load_gbs spreads each batch's bytes over that time,
     * which a phase of a few batch times does not average out */
    double window_s, batch_span_s;
} phase;

/* Mean submit-to-completion time of the load's batches that overlap [a, b]. */
static double load_span(const load *l, double a, double b)
{
    double sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->end[i] > a && l->start[i] < b) {
            sum += l->end[i] - l->start[i];
            n++;
        }
    return n ? sum / (double)n : 0;
}

/* Phases shorter than this many batch spans make load_gbs unreliable. */
#define WINDOW_SPANS 5.0

static int run_phase_prep(small_fn fn, prep_fn prep, void *ctx, uint32_t reps, load *l, double *t,
                          phase *out)
{
    memset(out, 0, sizeof *out);
    if (l && load_start(l))
        return -1;
    if (l && load_warm(l)) {
        load_stop(l);
        return -1;
    }
    double a = kvf_bench_now_s();
    int rc = 0;
    for (uint32_t r = 0; r < reps && rc == 0; r++) {
        if (prep && (rc = prep(ctx, r)) != 0)
            break;
        double t0 = kvf_bench_now_s();
        rc = fn(ctx, r);
        t[r] = kvf_bench_now_s() - t0;
    }
    if (prep && rc == 0)
        rc = prep(ctx, reps);
    double b = kvf_bench_now_s();
    if (l) {
        rc |= load_stop(l);
        out->load_gbs = load_gbs(l, a, b);
        out->window_s = b - a;
        out->batch_span_s = load_span(l, a, b);
    }
    out->p50 = kvf_bench_quantile(t, reps, 0.5);
    out->p99 = kvf_bench_quantile(t, reps, 0.99);
    return rc;
}

static int run_phase(small_fn fn, void *ctx, uint32_t reps, load *l, double *t, phase *out)
{
    return run_phase_prep(fn, NULL, ctx, reps, l, t, out);
}

/* The load alone for `seconds` after its first batch: its GB/s. */
static int load_alone(load *l, double seconds, double *gbs)
{
    if (load_start(l))
        return -1;
    if (load_warm(l)) {
        load_stop(l);
        return -1;
    }
    double a = kvf_bench_now_s();
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    double b = kvf_bench_now_s();
    if (load_stop(l))
        return -1;
    *gbs = load_gbs(l, a, b);
    return 0;
}

/* ---- kvferry: the engine, its onboards and its offloads ---------------- */

/* Slots of every pool (the same slots in each, as an engine's block is a
 * slot in each of its layers' pools): onboards read secondary [0, blocks)
 * into primary [blocks * rep, blocks * (rep + 1)), fresh poisoned slots
 * for each rep; the load's batches move primary [blocks * reps + k *
 * load_blocks, ...) to secondary [blocks + k * load_blocks, ...),
 * k < load_depth. A block is block_bytes, pool_bytes in each pool. */
typedef struct kvf_side {
    kvf_engine *e;
    const contend_opts *o;
    size_t block_bytes, pool_bytes;
    kvf_move *on, *off[LOAD_DEPTH_MAX];
    /* the onboards' sources: pool p's blocks at orig + p * blocks *
     * pool_bytes; one rep's destinations in one pool, read back; for each
     * block of a rep, the first pool in which it differs */
    uint8_t *orig, *scratch;
    uint32_t *differs;
    /* the evicting phase: its offload batch of max(load_blocks, blocks)
     * moves, in flight since its rep's prep; the poison its first moves
     * must store; evictions that stored anything else */
    kvf_move *evict;
    uint32_t nevict;
    kvf_ticket evict_t;
    bool evict_busy;
    const uint8_t *poison;
    long evict_bad;
} kvf_side;

/* " of pool P" for messages about a block's part in pool p; "" with one
 * pool. */
static const char *pool_name(const contend_opts *o, uint32_t p, char *buf, size_t cap)
{
    if (o->pools == 1)
        return "";
    snprintf(buf, cap, " of pool %u", p);
    return buf;
}

static int kvf_small(void *ctx, uint32_t rep)
{
    kvf_side *s = ctx;
    for (uint32_t i = 0; i < s->o->blocks; i++)
        s->on[i] = (kvf_move){.src = i, .dst = (uint64_t)s->o->blocks * rep + i};
    kvf_ticket t;
    kvf_status st = kvf_onboard(s->e, KVF_TIER_HOST, s->on, s->o->blocks, &t);
    if (st == KVF_OK)
        st = kvf_wait(s->e, t, NULL);
    if (st != KVF_OK)
        fprintf(stderr, "kvferry bench: onboard %u: %s\n", rep, kvf_last_error());
    return st == KVF_OK ? 0 : -1;
}

/* Before rep `rep` of the evicting phase: waits for the previous rep's
 * eviction, checks that it stored the poison its slots held before that
 * rep's onboard wrote them (secondary slots [blocks, 2 * blocks) of every
 * pool), and
 * queues this rep's: its first moves evict the rep's onboard
 * destinations, the others primary slots of the load's. */
static int kvf_evict_prep(void *ctx, uint32_t rep)
{
    kvf_side *s = ctx;
    uint32_t B = s->o->blocks;
    if (s->evict_busy) {
        s->evict_busy = false;
        if (kvf_wait(s->e, s->evict_t, NULL) != KVF_OK) {
            fprintf(stderr, "kvferry bench: eviction %u: %s\n", rep - 1, kvf_last_error());
            return -1;
        }
        for (uint32_t pool = 0; pool < s->o->pools; pool++)
            for (uint32_t i = 0; i < B; i++) {
                void *p = NULL;
                char pn[32];
                if (kvf_engine_slot_ptr(s->e, pool, KVF_LEVEL_SECONDARY, B + i, &p) != KVF_OK)
                    return -1;
                if (memcmp(p, s->poison, s->pool_bytes) != 0 && s->evict_bad++ < 5)
                    fprintf(stderr,
                            "kvferry bench: eviction %u: primary slot %u%s stored bytes other "
                            "than it held before the onboard into it\n",
                            rep - 1, B * (rep - 1) + i, pool_name(s->o, pool, pn, sizeof pn));
            }
    }
    if (rep == s->o->reps)
        return 0;
    uint32_t base = B * s->o->reps;
    for (uint32_t i = 0; i < s->nevict; i++)
        s->evict[i] = (kvf_move){.src = i < B ? B * rep + i : base + i, .dst = B + i};
    if (kvf_offload(s->e, KVF_TIER_HOST, s->evict, s->nevict, &s->evict_t) != KVF_OK) {
        fprintf(stderr, "kvferry bench: eviction %u: %s\n", rep, kvf_last_error());
        return -1;
    }
    s->evict_busy = true;
    return 0;
}

/* load_depth offload batches in flight: while one runs, the others are
 * queued behind it. */
static void *kvf_load_body(void *arg)
{
    load *l = arg;
    kvf_side *s = l->ctx;
    uint32_t depth = s->o->load_depth;
    kvf_ticket t[LOAD_DEPTH_MAX];
    double start[LOAD_DEPTH_MAX];
    bool busy[LOAD_DEPTH_MAX] = {false};
    for (uint32_t k = 0;; k = (k + 1) % depth) {
        if (busy[k]) {
            busy[k] = false;
            if (kvf_wait(s->e, t[k], NULL) != KVF_OK ||
                load_record(l, start[k], kvf_bench_now_s())) {
                fprintf(stderr, "kvferry bench: offload: %s\n", kvf_last_error());
                l->failed = true;
                break;
            }
        }
        if (atomic_load(&l->stop))
            break;
        start[k] = kvf_bench_now_s();
        if (kvf_offload(s->e, KVF_TIER_HOST, s->off[k], s->o->load_blocks, &t[k]) != KVF_OK) {
            fprintf(stderr, "kvferry bench: offload: %s\n", kvf_last_error());
            l->failed = true;
            break;
        }
        busy[k] = true;
    }
    for (uint32_t k = 0; k < depth; k++)
        if (busy[k])
            kvf_wait(s->e, t[k], NULL);
    return NULL;
}

/* Poisons every rep's destinations in every pool (the poison buffer holds
 * one rep's). */
static int kvf_poison(kvf_side *s, uint8_t *poison)
{
    size_t n = s->pool_bytes * s->o->blocks;
    for (uint32_t r = 0; r < s->o->reps; r++)
        for (uint32_t p = 0; p < s->o->pools; p++)
            if (kvf_bench_slot_io(s->e, p, s->o->blocks * r, poison, n, true))
                return -1;
    return 0;
}

/* Every rep's destinations in every pool against the sources, each pool's
 * part of a rep read in one piece (a GPU read per block and pool would take
 * longer than the bench): the number of blocks with a part in some pool
 * that differs (named on stderr, the first few), -1 when they cannot be
 * read. */
static long kvf_verify(kvf_side *s)
{
    long bad = 0;
    uint32_t B = s->o->blocks;
    size_t part = s->pool_bytes * B;
    for (uint32_t r = 0; r < s->o->reps; r++) {
        for (uint32_t i = 0; i < B; i++)
            s->differs[i] = SAME;
        for (uint32_t p = 0; p < s->o->pools; p++) {
            if (kvf_bench_slot_io(s->e, p, B * r, s->scratch, part, false))
                return -1;
            for (uint32_t i = 0; i < B; i++)
                if (s->differs[i] == SAME &&
                    memcmp(s->scratch + i * s->pool_bytes, s->orig + p * part + i * s->pool_bytes,
                           s->pool_bytes) != 0)
                    s->differs[i] = p;
        }
        for (uint32_t i = 0; i < B; i++) {
            char pn[32];
            if (s->differs[i] != SAME && bad++ < 5)
                fprintf(stderr,
                        "kvferry bench: onboard %u: block %u (primary slot %u%s) differs from "
                        "its source (secondary slot %u)\n",
                        r, i, B * r + i, pool_name(s->o, s->differs[i], pn, sizeof pn), i);
        }
    }
    return bad;
}

static void kvf_side_close(kvf_side *s)
{
    kvf_engine_destroy(s->e);
    free(s->on);
    free(s->evict);
    for (uint32_t k = 0; k < s->o->load_depth; k++)
        free(s->off[k]);
    free(s->orig);
    free(s->scratch);
    free(s->differs);
    memset(s, 0, sizeof *s);
}

/* An engine with --pools pools over which a block of block_bytes is split
 * evenly, each pool's block [1][2][1][32][n] fp16, its onboards' sources
 * filled with random data. 0; an exit code (kvf_cli_create_exit) for an
 * engine not created; -1 printed. */
static int kvf_side_open(kvf_side *s, const contend_opts *o, size_t block_bytes)
{
    memset(s, 0, sizeof *s);
    s->o = o;
    s->block_bytes = block_bytes;
    s->pool_bytes = block_bytes / o->pools;
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = o->backend;
    kvf_status created = kvf_engine_create(&cfg, &s->e);
    if (created != KVF_OK) {
        fprintf(stderr, "kvferry bench: engine: %s\n", kvf_last_error());
        return kvf_cli_create_exit(created);
    }
    bool gpu = kvf_bench_on_gpu(s->e);
    kvf_geometry g = {
        1, 2, 1, 32, (uint32_t)(s->pool_bytes / 128), KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
    uint32_t L = o->load_blocks, base = o->blocks * o->reps;
    uint32_t D = o->load_depth;
    kvf_pool_desc prim = {gpu ? KVF_MEMORY_DEVICE : KVF_MEMORY_HOST, NULL, 0, base + D * L};
    kvf_pool_desc sec = {gpu ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST, NULL, 0,
                         o->blocks + D * L};
    for (uint32_t p = 0; p < o->pools; p++)
        if (kvf_engine_add_pool(s->e, &g, &prim, &sec, NULL) != KVF_OK) {
            char pn[32];
            fprintf(stderr, "kvferry bench: pool%s of %zu-byte blocks: %s\n",
                    pool_name(o, p, pn, sizeof pn), s->pool_bytes, kvf_last_error());
            return -1;
        }
    s->on = malloc(o->blocks * sizeof *s->on);
    s->nevict = L > o->blocks ? L : o->blocks;
    s->evict = malloc(s->nevict * sizeof *s->evict);
    bool offs = s->evict != NULL;
    for (uint32_t k = 0; k < D; k++)
        offs = (s->off[k] = malloc(L * sizeof *s->off[k])) != NULL && offs;
    s->orig = malloc(block_bytes * o->blocks);
    s->scratch = malloc(s->pool_bytes * o->blocks);
    s->differs = malloc(o->blocks * sizeof *s->differs);
    if (!s->on || !offs || !s->orig || !s->scratch || !s->differs) {
        fprintf(stderr, "kvferry bench: out of memory\n");
        return -1;
    }
    for (uint32_t k = 0; k < D; k++)
        for (uint32_t i = 0; i < L; i++)
            s->off[k][i] = (kvf_move){.src = base + k * L + i, .dst = o->blocks + k * L + i};
    uint64_t seed = o->seed ^ block_bytes;
    kvf_bench_fill_random(s->orig, block_bytes * o->blocks, &seed);
    /* the sources get there as an engine's blocks would: offloaded, from
     * the first rep's destinations (poisoned before the rep) */
    size_t pool_src = s->pool_bytes * o->blocks;
    for (uint32_t p = 0; p < o->pools; p++)
        if (kvf_bench_slot_io(s->e, p, 0, s->orig + p * pool_src, pool_src, true))
            return -1;
    for (uint32_t i = 0; i < o->blocks; i++)
        s->on[i] = (kvf_move){.src = i, .dst = i};
    kvf_ticket t;
    kvf_status st = kvf_offload(s->e, KVF_TIER_HOST, s->on, o->blocks, &t);
    if (st == KVF_OK)
        st = kvf_wait(s->e, t, NULL);
    if (st != KVF_OK) {
        fprintf(stderr, "kvferry bench: offload of the onboards' sources: %s\n", kvf_last_error());
        return -1;
    }
    return 0;
}

/* What one block size measured. */
typedef struct size_result {
    size_t block_bytes;
    phase idle, loaded, evicting;          /* kvferry's onboards */
    double offload_alone_gbs;              /* the offloads without onboards */
    phase raw_idle, raw_loaded, raw_evict; /* the raw copies' small moves */
    double raw_alone_gbs;                  /* the raw load without small moves */
    long bad_blocks, bad_evictions;
} size_result;

/* kvferry's idle and loaded onboards and the offloads alone; every
 * onboard verified. 0, kvf_side_open's exit code, or -1 printed. */
static int measure_kvferry(const contend_opts *o, size_t block_bytes, double *t, size_result *res,
                           const char **backend)
{
    kvf_side s;
    memset(&s, 0, sizeof s);
    load l = {.body = kvf_load_body, .ctx = &s, .batch_bytes = block_bytes * o->load_blocks};
    uint8_t *poison = malloc(block_bytes * o->blocks);
    int rc = poison ? kvf_side_open(&s, o, block_bytes) : -1;
    if (rc)
        goto out;
    rc = -1;
    *backend = kvf_backend_name(kvf_engine_backend(s.e));
    memset(poison, POISON, block_bytes * o->blocks);
    s.poison = poison;
    long bad[3] = {0, 0, 0};
    if (kvf_poison(&s, poison) || run_phase(kvf_small, &s, o->reps, NULL, t, &res->idle) ||
        (bad[0] = kvf_verify(&s)) < 0 || kvf_poison(&s, poison) ||
        load_alone(&l, o->load_seconds, &res->offload_alone_gbs) ||
        run_phase(kvf_small, &s, o->reps, &l, t, &res->loaded) || (bad[1] = kvf_verify(&s)) < 0 ||
        kvf_poison(&s, poison) ||
        run_phase_prep(kvf_small, kvf_evict_prep, &s, o->reps, NULL, t, &res->evicting) ||
        (bad[2] = kvf_verify(&s)) < 0)
        goto out;
    res->bad_blocks = bad[0] + bad[1] + bad[2];
    res->bad_evictions = s.evict_bad;
    rc = 0;
out:
    if (s.evict_busy)
        kvf_wait(s.e, s.evict_t, NULL);
    load_free(&l);
    kvf_side_close(&s);
    free(poison);
    return rc;
}

/* ---- raw copies: the same small moves and load, no kvferry ------------- */

/* The small moves copy src into dst block by block, one copy per pool of
 * each block (src, dst and edst hold pool p's parts of the blocks at p *
 * blocks * pool_bytes, as the engine's pools are arrays of their own); the
 * load copies lsrc into ldst whole, again and again. On the GPU:
 * host-to-device from pinned memory on stream s[0], the load
 * device-to-host on s[1]; on the host: memcpy on two threads. An eviction
 * copies dst out to edst first, one copy per pool. */
typedef struct raw_side {
    bool gpu;
    uint32_t blocks, reps, pools;
    size_t block_bytes, pool_bytes, load_bytes;
    uint8_t *src, *dst, *lsrc, *ldst, *edst;
#ifdef KVF_HAVE_CUDA
    cudaStream_t s[2];
    cudaEvent_t evicted;
#endif
} raw_side;

/* The evicting phase's raw copies, the least any engine can do: the
 * small moves' destinations copied out first (one copy per pool: they are
 * adjacent slots of each), then the small moves. On the GPU the eviction
 * of a batch of load_bytes is queued before each rep (device to host on
 * s[1], its first bytes those of the destinations; an event once they are
 * out), and the previous rep's waited for; on the host the destinations
 * are copied out in the timed rep, beside the load thread. */
static int raw_evict_prep(void *ctx, uint32_t rep)
{
#ifdef KVF_HAVE_CUDA
    raw_side *r = ctx;
    if (r->gpu) {
        size_t small = r->block_bytes * r->blocks, part = r->pool_bytes * r->blocks;
        cudaError_t ce = cudaStreamSynchronize(r->s[1]);
        if (ce == cudaSuccess && rep < r->reps) {
            for (uint32_t p = 0; p < r->pools; p++)
                cudaMemcpyAsync(r->edst + p * part, r->dst + p * part, part, cudaMemcpyDeviceToHost,
                                r->s[1]);
            cudaEventRecord(r->evicted, r->s[1]);
            if (r->load_bytes > small)
                cudaMemcpyAsync(r->ldst, r->lsrc, r->load_bytes - small, cudaMemcpyDeviceToHost,
                                r->s[1]);
            ce = cudaGetLastError();
        }
        if (ce != cudaSuccess)
            fprintf(stderr, "kvferry bench: raw eviction: %s\n", cudaGetErrorString(ce));
        return ce == cudaSuccess ? 0 : -1;
    }
#endif
    (void)ctx;
    (void)rep;
    return 0;
}

/* Block i's part in pool p: its offset in src, dst and edst. */
static size_t raw_part(const raw_side *r, uint32_t p, uint32_t i)
{
    return ((size_t)p * r->blocks + i) * r->pool_bytes;
}

static int raw_small(void *ctx, uint32_t rep)
{
    raw_side *r = ctx;
    (void)rep;
#ifdef KVF_HAVE_CUDA
    if (r->gpu) {
        for (uint32_t i = 0; i < r->blocks; i++)
            for (uint32_t p = 0; p < r->pools; p++)
                cudaMemcpyAsync(r->dst + raw_part(r, p, i), r->src + raw_part(r, p, i),
                                r->pool_bytes, cudaMemcpyHostToDevice, r->s[0]);
        cudaError_t ce = cudaStreamSynchronize(r->s[0]);
        if (ce != cudaSuccess)
            fprintf(stderr, "kvferry bench: raw copies: %s\n", cudaGetErrorString(ce));
        return ce == cudaSuccess ? 0 : -1;
    }
#endif
    for (uint32_t i = 0; i < r->blocks; i++)
        for (uint32_t p = 0; p < r->pools; p++)
            memcpy(r->dst + raw_part(r, p, i), r->src + raw_part(r, p, i), r->pool_bytes);
    return 0;
}

static int raw_evict(void *ctx, uint32_t rep)
{
    raw_side *r = ctx;
#ifdef KVF_HAVE_CUDA
    if (r->gpu) {
        if (cudaStreamWaitEvent(r->s[0], r->evicted, 0) != cudaSuccess) {
            fprintf(stderr, "kvferry bench: raw eviction: %s\n",
                    cudaGetErrorString(cudaGetLastError()));
            return -1;
        }
        return raw_small(ctx, rep);
    }
#endif
    size_t part = r->pool_bytes * r->blocks;
    for (uint32_t p = 0; p < r->pools; p++)
        memcpy(r->edst + p * part, r->dst + p * part, part);
    return raw_small(ctx, rep);
}

static void *raw_load_body(void *arg)
{
    load *l = arg;
    raw_side *r = l->ctx;
    while (!atomic_load(&l->stop)) {
        double t0 = kvf_bench_now_s();
#ifdef KVF_HAVE_CUDA
        if (r->gpu) {
            cudaMemcpyAsync(r->ldst, r->lsrc, r->load_bytes, cudaMemcpyDeviceToHost, r->s[1]);
            cudaError_t ce = cudaStreamSynchronize(r->s[1]);
            if (ce != cudaSuccess) {
                fprintf(stderr, "kvferry bench: raw load: %s\n", cudaGetErrorString(ce));
                l->failed = true;
                break;
            }
        } else
#endif
            memcpy(r->ldst, r->lsrc, r->load_bytes);
        if (load_record(l, t0, kvf_bench_now_s())) {
            l->failed = true;
            break;
        }
    }
    return NULL;
}

static void raw_close(raw_side *r)
{
#ifdef KVF_HAVE_CUDA
    if (r->gpu) {
        cudaFreeHost(r->src);
        cudaFree(r->dst);
        cudaFree(r->lsrc);
        cudaFreeHost(r->ldst);
        cudaFreeHost(r->edst);
        for (int i = 0; i < 2; i++)
            if (r->s[i])
                cudaStreamDestroy(r->s[i]);
        if (r->evicted)
            cudaEventDestroy(r->evicted);
        cudaGetLastError();
        return;
    }
#endif
    free(r->src);
    free(r->dst);
    free(r->lsrc);
    free(r->ldst);
    free(r->edst);
}

/* Buffers of the kind the engine's pools are (pinned host and device on
 * the GPU), touched before any timing; 0, or -1 printed. */
static int raw_open(raw_side *r)
{
    size_t small = r->block_bytes * r->blocks;
#ifdef KVF_HAVE_CUDA
    if (r->gpu) {
        if (cudaMallocHost((void **)&r->src, small) != cudaSuccess ||
            cudaMalloc((void **)&r->dst, small) != cudaSuccess ||
            cudaMalloc((void **)&r->lsrc, r->load_bytes) != cudaSuccess ||
            cudaMallocHost((void **)&r->ldst, r->load_bytes) != cudaSuccess ||
            cudaMallocHost((void **)&r->edst, small) != cudaSuccess ||
            cudaStreamCreateWithFlags(&r->s[0], cudaStreamNonBlocking) != cudaSuccess ||
            cudaStreamCreateWithFlags(&r->s[1], cudaStreamNonBlocking) != cudaSuccess ||
            cudaEventCreateWithFlags(&r->evicted, cudaEventDisableTiming) != cudaSuccess ||
            cudaMemset(r->dst, POISON, small) != cudaSuccess ||
            cudaMemset(r->lsrc, 0x5A, r->load_bytes) != cudaSuccess) {
            fprintf(stderr, "kvferry bench: raw copies: %s\n",
                    cudaGetErrorString(cudaGetLastError()));
            return -1;
        }
        memset(r->src, 0x5A, small);
        memset(r->ldst, POISON, r->load_bytes);
        return 0;
    }
#endif
    r->src = malloc(small);
    r->dst = malloc(small);
    r->lsrc = malloc(r->load_bytes);
    r->ldst = malloc(r->load_bytes);
    r->edst = malloc(small);
    if (!r->src || !r->dst || !r->lsrc || !r->ldst || !r->edst) {
        fprintf(stderr, "kvferry bench: raw copies: out of memory\n");
        return -1;
    }
    memset(r->src, 0x5A, small);
    memset(r->dst, POISON, small);
    memset(r->lsrc, 0x5A, r->load_bytes);
    memset(r->ldst, POISON, r->load_bytes);
    memset(r->edst, POISON, small);
    return 0;
}

static int measure_raw(const contend_opts *o, size_t block_bytes, bool gpu, double *t,
                       size_result *res)
{
    raw_side r = {.gpu = gpu,
                  .blocks = o->blocks,
                  .reps = o->reps,
                  .pools = o->pools,
                  .block_bytes = block_bytes,
                  .pool_bytes = block_bytes / o->pools,
                  .load_bytes = block_bytes * o->load_blocks};
    load l = {.body = raw_load_body, .ctx = &r, .batch_bytes = r.load_bytes};
    int rc = -1;
    if (raw_open(&r) == 0 && run_phase(raw_small, &r, o->reps, NULL, t, &res->raw_idle) == 0 &&
        load_alone(&l, o->load_seconds, &res->raw_alone_gbs) == 0 &&
        run_phase(raw_small, &r, o->reps, &l, t, &res->raw_loaded) == 0 &&
        run_phase_prep(raw_evict, raw_evict_prep, &r, o->reps, gpu ? NULL : &l, t,
                       &res->raw_evict) == 0)
        rc = 0;
    load_free(&l);
    raw_close(&r);
    return rc;
}

/* ---- the report ---------------------------------------------------------- */

static double ratio(double a, double b)
{
    return a > 0 && b > 0 ? a / b : 0;
}

/* kvferry's ratio may reach 1.2, or the raw copies' where that is higher. */
static double allowed(double raw_ratio)
{
    return raw_ratio > 1.2 ? raw_ratio : 1.2;
}

static void print_phase(const char *name, const phase *p)
{
    printf("    %-44s %9.3f %9.3f\n", name, p->p50 * 1e3, p->p99 * 1e3);
}

/* kvferry's ratio of phase `k` over `k0` (idle) beside the raw copies',
 * and whether it is within the target. */
static void print_ratios(const char *what, const phase *k, const phase *k0, const phase *w,
                         const phase *w0)
{
    double k50 = ratio(k->p50, k0->p50), k99 = ratio(k->p99, k0->p99);
    double w50 = ratio(w->p50, w0->p50), w99 = ratio(w->p99, w0->p99);
    char name[64];
    snprintf(name, sizeof name, "kvferry: %s / idle", what);
    printf("    %-44s %8.2fx %8.2fx\n", name, k50, k99);
    snprintf(name, sizeof name, "raw: %s / idle", what);
    printf("    %-44s %8.2fx %8.2fx\n", name, w50, w99);
    printf("    target: kvferry's ratio <= max(1.2, raw ratio) = %.2fx / %.2fx: p50 %s, p99 %s\n",
           allowed(w50), allowed(w99), k50 <= allowed(w50) ? "met" : "NOT met",
           k99 <= allowed(w99) ? "met" : "NOT met");
}

static void print_size(const size_result *r, bool gpu, const contend_opts *o)
{
    char h1[32], h2[32], h3[32], h4[32], split[64] = "";
    if (o->pools > 1)
        snprintf(split, sizeof split, " %u pools of %s each,", o->pools,
                 kvf_cli_bytes(r->block_bytes / o->pools, h4));
    printf("  %s blocks:%s %u-block onboards (%s), offload batches of %u blocks (%s), %u in "
           "flight\n",
           kvf_cli_bytes(r->block_bytes, h1), split, o->blocks,
           kvf_cli_bytes(r->block_bytes * o->blocks, h2), o->load_blocks,
           kvf_cli_bytes(r->block_bytes * o->load_blocks, h3), o->load_depth);
    printf("    %-44s %9s %9s\n", "latency, ms", "p50", "p99");
    print_phase("kvferry onboard, idle", &r->idle);
    print_phase("kvferry onboard, under offloads", &r->loaded);
    print_phase("kvferry onboard, into slots being evicted", &r->evicting);
    print_phase(gpu ? "raw: cudaMemcpyAsync H2D, idle" : "raw: memcpy, idle", &r->raw_idle);
    print_phase(gpu ? "raw: the same beside D2H copies" : "raw: beside a memcpy thread",
                &r->raw_loaded);
    print_phase(gpu ? "raw: D2H of the slots first, then H2D" : "raw: slots copied out, then in",
                &r->raw_evict);
    print_ratios("under offloads", &r->loaded, &r->idle, &r->raw_loaded, &r->raw_idle);
    print_ratios("into slots being evicted", &r->evicting, &r->idle, &r->raw_evict, &r->raw_idle);
    double off = ratio(r->loaded.load_gbs, r->offload_alone_gbs);
    printf("    offloads: %.2f GB/s alone, %.2f GB/s beside the onboards: %.2fx (target >= "
           "0.90: %s)\n",
           r->offload_alone_gbs, r->loaded.load_gbs, off, off >= 0.9 ? "met" : "NOT met");
    printf("    raw load: %.2f GB/s alone, %.2f GB/s beside the small copies\n", r->raw_alone_gbs,
           r->raw_loaded.load_gbs);
    if (r->bad_evictions)
        printf("    evictions that stored what the onboard wrote: %ld (write after read broken)\n",
               r->bad_evictions);
    if (r->loaded.window_s < WINDOW_SPANS * r->loaded.batch_span_s)
        printf("    note: the onboards took %.1f ms, under %.0f offload batch times (%.1f ms each "
               "from submit to completion): the offloads' GB/s beside them is unreliable; raise "
               "--reps\n",
               r->loaded.window_s * 1e3, WINDOW_SPANS, r->loaded.batch_span_s * 1e3);
}

static cJSON *phase_json(cJSON *parent, const char *name, const phase *p)
{
    cJSON *j = cJSON_AddObjectToObject(parent, name);
    cJSON_AddNumberToObject(j, "p50_ms", p->p50 * 1e3);
    if (p->batch_span_s > 0) {
        cJSON_AddNumberToObject(j, "window_ms", p->window_s * 1e3);
        cJSON_AddNumberToObject(j, "load_batch_span_ms", p->batch_span_s * 1e3);
    }
    cJSON_AddNumberToObject(j, "p99_ms", p->p99 * 1e3);
    return j;
}

static void size_json(cJSON *arr, const size_result *r, bool gpu, uint32_t pools)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "block_bytes", (double)r->block_bytes);
    cJSON_AddNumberToObject(j, "pool_block_bytes", (double)(r->block_bytes / pools));
    phase_json(j, "idle", &r->idle);
    phase_json(j, "loaded", &r->loaded);
    phase_json(j, "evicting", &r->evicting);
    cJSON_AddNumberToObject(j, "ratio_p50", ratio(r->loaded.p50, r->idle.p50));
    cJSON_AddNumberToObject(j, "ratio_p99", ratio(r->loaded.p99, r->idle.p99));
    cJSON_AddNumberToObject(j, "evicting_ratio_p50", ratio(r->evicting.p50, r->idle.p50));
    cJSON_AddNumberToObject(j, "evicting_ratio_p99", ratio(r->evicting.p99, r->idle.p99));
    cJSON_AddNumberToObject(j, "offload_alone_gbs", r->offload_alone_gbs);
    cJSON_AddNumberToObject(j, "offload_loaded_gbs", r->loaded.load_gbs);
    cJSON_AddNumberToObject(j, "offload_ratio", ratio(r->loaded.load_gbs, r->offload_alone_gbs));
    cJSON *raw = cJSON_AddObjectToObject(j, "raw");
    cJSON_AddStringToObject(raw, "what",
                            gpu ? "cudaMemcpyAsync host-to-device beside device-to-host copies"
                                : "memcpy beside a memcpy thread");
    phase_json(raw, "idle", &r->raw_idle);
    phase_json(raw, "loaded", &r->raw_loaded);
    phase_json(raw, "evicting", &r->raw_evict);
    double w50 = ratio(r->raw_loaded.p50, r->raw_idle.p50);
    double w99 = ratio(r->raw_loaded.p99, r->raw_idle.p99);
    double v50 = ratio(r->raw_evict.p50, r->raw_idle.p50);
    double v99 = ratio(r->raw_evict.p99, r->raw_idle.p99);
    cJSON_AddNumberToObject(raw, "ratio_p50", w50);
    cJSON_AddNumberToObject(raw, "ratio_p99", w99);
    cJSON_AddNumberToObject(raw, "evicting_ratio_p50", v50);
    cJSON_AddNumberToObject(raw, "evicting_ratio_p99", v99);
    cJSON_AddNumberToObject(raw, "load_alone_gbs", r->raw_alone_gbs);
    cJSON_AddNumberToObject(raw, "load_loaded_gbs", r->raw_loaded.load_gbs);
    cJSON_AddNumberToObject(j, "allowed_ratio_p50", allowed(w50));
    cJSON_AddNumberToObject(j, "allowed_ratio_p99", allowed(w99));
    cJSON_AddNumberToObject(j, "evicting_allowed_ratio_p50", allowed(v50));
    cJSON_AddNumberToObject(j, "evicting_allowed_ratio_p99", allowed(v99));
    cJSON_AddNumberToObject(j, "bad_blocks", (double)r->bad_blocks);
    cJSON_AddNumberToObject(j, "bad_evictions", (double)r->bad_evictions);
    cJSON_AddItemToArray(arr, j);
}

/* ---- options and the run ------------------------------------------------- */

static void usage(void)
{
    printf("usage: kvferry bench --mode contention [options]\n"
           "Whether a small onboard waits behind offloads: its latency (p50, p99) idle,\n"
           "while offload batches stay in flight on other slots of the same engine, and\n"
           "into slots being evicted (right after an offload batch of --load-blocks whose\n"
           "first moves read its destinations); the offloads' GB/s alone and beside it,\n"
           "and the same for raw copies in the same run (cuda: cudaMemcpyAsync\n"
           "host-to-device on one stream beside device-to-host copies of a batch's bytes\n"
           "on another, evicting: the slots' device-to-host copy first; host: memcpy on\n"
           "two threads); the raw copies make one copy per pool of each block, as the\n"
           "engine does. Target: kvferry's ratio <= max(1.2, the raw ratio), offloads\n"
           ">= 0.90.\n"
           "  --backend auto|host|cuda     default auto (cuda where a GPU is usable)\n"
           "  --sizes LIST                 block sizes, default 256K,2M (multiples of\n"
           "                               128 x --pools)\n"
           "  --pools N                    pools each block is split over evenly, default 1\n"
           "                               (at most 1024): vLLM and SGLang keep a pool per\n"
           "                               layer, K and V apart, and the engine sizes its\n"
           "                               calls by the copies' size; a 2 MiB block of a\n"
           "                               Llama-3-8B shape is --pools 64 of 32 KiB\n"
           "  --blocks N                   blocks per onboard, default 16\n"
           "  --reps N                     onboards per phase, default 200; each into\n"
           "                               fresh slots: the pools hold blocks x reps\n"
           "  --load-blocks N              blocks per offload batch, default 512\n"
           "  --load-depth N               offload batches kept in flight, default 2\n"
           "                               (at most 16)\n"
           "  --load-ms N                  how long the offloads run alone, default 1000\n"
           "  --seed N                     random data seed\n"
           "An onboarded byte that differs from its source, an eviction that stored what\n"
           "the onboard wrote, or a failed move, exits 1; a target missed is reported,\n"
           "not an error.\n"
           "%s",
           kvf_cli_common_usage);
}

enum {
    OPT_MODE = 'm',
    OPT_SIZES = KVF_OPT_OWN,
    OPT_BLOCKS,
    OPT_REPS,
    OPT_LOAD_BLOCKS,
    OPT_LOAD_DEPTH,
    OPT_LOAD_MS,
    OPT_SEED,
    OPT_POOLS,
};

static const struct option contend_options[] = {
    KVF_CLI_OPTS_COMMON,
    KVF_CLI_OPTS_BACKEND,
    {"mode", required_argument, NULL, OPT_MODE},
    {"sizes", required_argument, NULL, OPT_SIZES},
    {"blocks", required_argument, NULL, OPT_BLOCKS},
    {"reps", required_argument, NULL, OPT_REPS},
    {"load-blocks", required_argument, NULL, OPT_LOAD_BLOCKS},
    {"load-depth", required_argument, NULL, OPT_LOAD_DEPTH},
    {"load-ms", required_argument, NULL, OPT_LOAD_MS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"pools", required_argument, NULL, OPT_POOLS},
    KVF_CLI_OPTS_END,
};

/* --sizes: multiples of 128 bytes, one block being [1][2][1][32][size / 128] fp16 */
static int parse_sizes(const char *v, contend_opts *o)
{
    if (kvf_bench_parse_sizes(v, o->sizes, MAX_SIZES, &o->nsizes))
        return -1;
    for (size_t i = 0; i < o->nsizes; i++)
        if (o->sizes[i] % 128) {
            fprintf(stderr, "kvferry bench: --sizes: %zu is not a multiple of 128 bytes\n",
                    o->sizes[i]);
            return -1;
        }
    return 0;
}

/* One option's value into *o: 0, or -1 on a bad value (printed). */
static int contend_option(int c, const char *v, contend_opts *o)
{
    uint64_t u;
    int rc = 0;
    switch (c) {
    case OPT_MODE: /* contention: how this file was reached */
        break;
    case KVF_OPT_JSON:
        o->json = v;
        break;
    case KVF_OPT_BACKEND:
        return kvf_cli_backend("bench", v, &o->backend);
    case OPT_SIZES:
        return parse_sizes(v, o);
    case OPT_BLOCKS:
        rc = kvf_cli_number("bench", "blocks", v, 1, 65536, &u);
        o->blocks = (uint32_t)u;
        break;
    case OPT_REPS:
        rc = kvf_cli_number("bench", "reps", v, 1, 100000, &u);
        o->reps = (uint32_t)u;
        break;
    case OPT_LOAD_BLOCKS:
        rc = kvf_cli_number("bench", "load-blocks", v, 1, 1u << 20, &u);
        o->load_blocks = (uint32_t)u;
        return rc;
    case OPT_LOAD_DEPTH:
        rc = kvf_cli_number("bench", "load-depth", v, 1, LOAD_DEPTH_MAX, &u);
        o->load_depth = (uint32_t)u;
        break;
    case OPT_LOAD_MS:
        rc = kvf_cli_number("bench", "load-ms", v, 1, 3600000, &u);
        o->load_seconds = (double)u / 1000;
        break;
    case OPT_SEED:
        return kvf_cli_u64("bench", "seed", v, &o->seed);
    case OPT_POOLS:
        rc = kvf_cli_number("bench", "pools", v, 1, POOLS_MAX, &u);
        o->pools = (uint32_t)u;
        break;
    default:
        return -1;
    }
    return rc;
}

/* 0 parsed, 1 --help printed, -1 a usage error (printed). */
static int parse_args(int argc, char **argv, contend_opts *o)
{
    int c;
    optind = 0;
    while ((c = kvf_cli_getopt("bench", argc, argv, contend_options)) != -1) {
        if (c == 'h') {
            usage();
            return 1;
        }
        if (c == '?' || contend_option(c, optarg, o))
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "kvferry bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    /* each pool's block is [1][2][1][32][n] fp16: size / pools a multiple
     * of 128 */
    for (size_t i = 0; i < o->nsizes; i++)
        if (o->sizes[i] % ((size_t)o->pools * 128)) {
            fprintf(stderr,
                    "kvferry bench: --pools %u: --sizes %zu is not a multiple of %u x 128 "
                    "bytes (%zu), each pool's block being a multiple of 128\n",
                    o->pools, o->sizes[i], o->pools, (size_t)o->pools * 128);
            return -1;
        }
    return 0;
}

/* Every size: kvferry, then the raw copies; the report and the JSON. */
static int contend_run(const contend_opts *o)
{
    size_result res[MAX_SIZES];
    memset(res, 0, sizeof res);
    double *t = malloc(o->reps * sizeof *t);
    const char *backend = "?";
    long bad = 0;
    int rc = 0;
    for (size_t i = 0; i < o->nsizes && rc == 0 && t; i++) {
        res[i].block_bytes = o->sizes[i];
        int m = measure_kvferry(o, o->sizes[i], t, &res[i], &backend);
        if (m || measure_raw(o, o->sizes[i], !strcmp(backend, "cuda"), t, &res[i]))
            rc = m > 0 ? m : KVF_CLI_FAILED; /* > 0: the engine's exit code */
        bad += res[i].bad_blocks + res[i].bad_evictions;
    }
    free(t);
    if (!t) {
        fprintf(stderr, "kvferry bench: out of memory\n");
        return KVF_CLI_FAILED;
    }
    if (rc)
        return rc;
    bool gpu = !strcmp(backend, "cuda");
    printf("kvferry bench: contention, %s backend, %u onboards per phase", backend, o->reps);
    if (o->pools > 1)
        printf(", each block split over %u pools (a pool per layer, K and V apart)", o->pools);
    printf("\n");
    for (size_t i = 0; i < o->nsizes; i++)
        print_size(&res[i], gpu, o);
    printf("  verified: %s (%" PRIu64 " onboarded blocks)\n", bad == 0 ? "every byte" : "FAILED",
           (uint64_t)o->nsizes * 3 * o->reps * o->blocks);
    cJSON *j = o->json ? cJSON_CreateObject() : NULL;
    char where[96];
    if (kvf_bench_busy(where, sizeof where, j))
        printf("  WARNING: %s: other work competes for the CPUs, and the ratios above measure "
               "it too; rerun on an idle machine\n",
               where);
    else
        printf("  %s\n", where);
    if (j) {
        cJSON_AddStringToObject(j, "mode", "contention");
        cJSON_AddStringToObject(j, "backend", backend);
        cJSON_AddNumberToObject(j, "blocks", o->blocks);
        cJSON_AddNumberToObject(j, "reps", o->reps);
        cJSON_AddNumberToObject(j, "load_blocks", o->load_blocks);
        cJSON_AddNumberToObject(j, "load_depth", o->load_depth);
        cJSON_AddNumberToObject(j, "pools", o->pools);
        cJSON *sizes = cJSON_AddArrayToObject(j, "sizes");
        for (size_t i = 0; i < o->nsizes; i++)
            size_json(sizes, &res[i], gpu, o->pools);
        cJSON_AddBoolToObject(j, "verified", bad == 0);
        cJSON_AddNumberToObject(j, "bad_blocks", (double)bad);
        if (kvf_cli_json_emit("bench", j))
            rc = KVF_CLI_FAILED;
    }
    return bad ? KVF_CLI_FAILED : rc;
}

int kvf_cli_bench_contend(int argc, char **argv)
{
    contend_opts o = {
        .backend = KVF_CLI_BACKEND_DEFAULT,
        .sizes = {256 << 10, 2 << 20},
        .nsizes = 2,
        .blocks = 16,
        .load_blocks = 512,
        .load_depth = 2,
        .pools = 1,
        .reps = 200,
        .load_seconds = 1,
        .seed = 0x9e3779b97f4a7c15ull,
    };
    int parsed = parse_args(argc, argv, &o);
    if (parsed)
        return parsed > 0 ? 0 : kvf_cli_usage_error("bench");
    if (kvf_cli_json_open("bench", o.json))
        return KVF_CLI_FAILED;
    int rc = contend_run(&o);
    fflush(stdout);
    if (kvf_cli_json_close("bench") && rc == 0)
        rc = KVF_CLI_FAILED;
    return rc;
}
