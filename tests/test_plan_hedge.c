/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A plan's hedge through a real cache and a real disk tier (host
 * backend): the disk is made slow by sleeping in the file layer's own
 * fault hook before every read, the forward passes are the prefill cost's
 * seconds slept by this test (the library plans around a caller's compute,
 * it does not run it). A request that follows the plan and waits for its
 * loads with kvf_cache_wait_pool_by(plan.hedge_s) ends within the margin
 * of recomputing, where waiting for them takes far longer; on a disk at
 * its normal speed the hedge does not fire. A late get still lands its
 * blocks byte for byte, nothing stored is dropped for being late, and at
 * the moment the hedge fires the get has not completed (its slots are not
 * handed over). A learnt disk cost that the stall made slow is forgotten
 * once the plans have stopped reading the disk long enough, so they load
 * again when it recovers.
 */
#include "cache_fixture.h"
#include "engine_costs.h"
#include "fileio.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

enum { N = 24, TPB = 16, EXTRA = 4 };

/* the forward pass: ms_per_token a token, after any prefix */
static double ms_per_token = 1.0;
/* the test's disk stalls: a read waits until then (kvf__now_ns time; 0:
 * the disk at its normal speed), however many reads run at once */
static _Atomic uint64_t stall_until_ns;

static int slow_reads(const char *op, const char *path, size_t *len_p)
{
    (void)path;
    (void)len_p;
    uint64_t until = atomic_load(&stall_until_ns), now = kvf__now_ns();
    if (until > now && strcmp(op, "read") == 0) {
        uint64_t ns = until - now;
        struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static double now_s(void)
{
    return (double)kvf__now_ns() * 1e-9;
}

static void compute(double seconds)
{
    if (seconds <= 0)
        return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

static int prefill(void *user, uint64_t new_tokens, uint64_t prefix_tokens, double *seconds)
{
    (void)user;
    (void)prefix_tokens;
    *seconds = (double)new_tokens * ms_per_token * 1e-3;
    return 0;
}

/* One request that follows plan p over keys; returns its time to the first
 * token, *hedged whether it gave its loads up. hedge: wait with the plan's
 * limit, else wait for them however long they take. */
static double follow(fixture *f, const kvf_key *keys, const kvf_plan *p, bool hedge, bool *hedged,
                     int *bad)
{
    size_t first = p->load_first, k = p->load_blocks;
    uint32_t dst[N];
    for (size_t i = first; i < k; i++) {
        dst[i] = (uint32_t)(40 + i);
        poison(f, dst[i]);
    }
    *hedged = false;
    double t0 = now_s();
    if (k == first) { /* a plan that recomputes: the forward pass alone */
        compute((double)p->compute_tokens * ms_per_token * 1e-3);
        return now_s() - t0;
    }
    kvf_cache_ticket t;
    if (kvf_cache_get(f->c, keys + first, dst + first, k - first, &t) != KVF_OK) {
        *bad = 1;
        return 0;
    }
    compute((double)(first * TPB) * ms_per_token * 1e-3); /* the front, beside the loads */
    for (uint32_t pool = 0; pool < 2 && !*hedged; pool++) {
        kvf_status st = hedge ? kvf_cache_wait_pool_by(f->c, t, pool, NULL, p->hedge_s)
                              : kvf_cache_wait_pool(f->c, t, pool);
        if (st == KVF_ERR_TIMEOUT) {
            *hedged = true;
            /* given up: the get has not completed, so nothing of it is read */
            kvf_status per[N];
            if (kvf_cache_poll(f->c, t, per) != KVF_INPROGRESS)
                *bad = 1;
        } else if (st != KVF_OK) {
            *bad = 1;
        }
    }
    compute(*hedged ? p->fallback_s : (double)p->compute_tokens * ms_per_token * 1e-3);
    double ttft = now_s() - t0;
    /* the late get lands whole, byte for byte, whenever it ends */
    kvf_status per[N];
    if (kvf_cache_wait(f->c, t, per) != KVF_OK)
        *bad = 1;
    for (size_t i = first; i < k; i++)
        if (per[i - first] != KVF_OK || expect(f, dst[i], keys[i]))
            *bad = 1;
    return ttft;
}

/* A cache with a disk tier holding N blocks keys[i] = base + i * 7, and
 * the prefill cost above. */
static int setup(fixture *f, kvf_key *keys, uint64_t base)
{
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk.blocks = 64;
    if (fx_init(f, 64, 0, true, &cc))
        return 1;
    for (int i = 0; i < N; i++) {
        keys[i] = KEY(base + (uint64_t)i * 7);
        fill(f, (uint32_t)i, keys[i]);
        CHECK_STATUS(put1(f, keys[i], (uint32_t)i, 50), KVF_OK);
    }
    kvf_prefill_cost pc = KVF_PREFILL_COST_INIT;
    pc.fn = prefill;
    CHECK_STATUS(kvf_cache_set_prefill_cost(f->c, &pc), KVF_OK);
    return 0;
}

static int test_hedge(void)
{
    fixture f;
    kvf_key keys[N];
    if (setup(&f, keys, 0x4ed9e000ull))
        return 1;
    uint64_t request = (N + EXTRA) * TPB;
    double recompute = (double)request * ms_per_token * 1e-3;
    size_t bb = f.bytes[0] + f.bytes[1];

    kvf__set_io_fault(slow_reads);
    /* two plans: a disk held at a tenth of a block's compute a block (load
     * every hit), and at twice it (compute the front while the back loads) */
    double per_block[2] = {0.1, 2.0};
    for (int shape = 0; shape < 2; shape++) {
        double block_s = per_block[shape] * TPB * ms_per_token * 1e-3;
        CHECK_STATUS(kvf_engine_set_tier_cost(f.e, KVF_TIER_DISK, 0, (double)bb / block_s, 1),
                     KVF_OK);
        kvf_plan p = KVF_PLAN_INIT;
        CHECK_STATUS(kvf_cache_plan(f.c, keys, N, request, NULL, &p), KVF_OK);
        CHECK(p.load_blocks > p.load_first);
        CHECK_EQ_INT(p.load_first > 0, shape == 1);
        CHECK(p.ttft_s < p.ttft_recompute_s);
        CHECK(p.hedge_s >= p.load_s);
        /* the hedge's bound: give up at hedge_s, compute the rest */
        double margin = KVF_PLAN_MIN_GAIN;
        CHECK(p.hedge_s + p.fallback_s <= (1 + margin) * p.ttft_recompute_s + 1e-9);
        CHECK(p.ttft_recompute_s == recompute);

        /* the disk at its speed: the plan's loads arrive, no hedge */
        bool hedged;
        int bad = 0;
        atomic_store(&stall_until_ns, 0);
        double fast = follow(&f, keys, &p, true, &hedged, &bad);
        CHECK_EQ_INT(bad, 0);
        CHECK(!hedged);
        CHECK(fast < recompute);

        /* the disk stalls for 3 x recomputing from the request's start:
         * waiting for it costs far more than recomputing; the hedge ends
         * within the margin */
        uint64_t stall = (uint64_t)(3e9 * recompute);
        atomic_store(&stall_until_ns, kvf__now_ns() + stall);
        double slow = follow(&f, keys, &p, false, &hedged, &bad);
        CHECK_EQ_INT(bad, 0);
        CHECK(!hedged);
        atomic_store(&stall_until_ns, kvf__now_ns() + stall);
        double cut = follow(&f, keys, &p, true, &hedged, &bad);
        CHECK_EQ_INT(bad, 0);
        CHECK(hedged);
        printf("  %s plan: predicted %.0f ms, recompute %.0f ms; normal disk %.0f ms; slow disk "
               "%.0f ms waited for, %.0f ms hedged (at %.0f ms)\n",
               shape ? "front" : "leading", p.ttft_s * 1e3, recompute * 1e3, fast * 1e3, slow * 1e3,
               cut * 1e3, p.hedge_s * 1e3);
        CHECK(slow > 1.5 * recompute);
        /* the margin, and 30 ms for the sleeps' and waits' own lateness */
        CHECK(cut <= (1 + margin) * recompute + 0.030);

        /* lateness is no evidence against a block: every one stays */
        size_t hits = 0;
        CHECK_STATUS(kvf_cache_lookup(f.c, keys, N, &hits, NULL), KVF_OK);
        CHECK_EQ_INT(hits, N);
    }
    atomic_store(&stall_until_ns, 0);
    kvf__set_io_fault(NULL);

    /* bad input: a limit that is not a time */
    kvf_cache_ticket t;
    uint32_t slot = 50;
    CHECK_STATUS(kvf_cache_get(f.c, keys, &slot, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool_by(f.c, t, 0, NULL, -1), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "within_s");
    CHECK_STATUS(kvf_cache_wait_pool_by(f.c, t, 7, NULL, 1), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_cache_wait_pool_by(f.c, t, 1, NULL, 10), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool_by(f.c, t, 0, NULL, 1), KVF_ERR_UNKNOWN_TICKET);
    fx_done(&f);
    return 0;
}

/* One request planned by the cache, its disk stalled (from the request's
 * start, for 3 x recomputing) where stall; followed with the hedge and
 * its time taught to the cache. */
static double serve(fixture *f, const kvf_key *keys, uint64_t request, bool stall, kvf_plan *p,
                    bool *hedged, int *bad)
{
    *p = (kvf_plan)KVF_PLAN_INIT;
    if (kvf_cache_plan(f->c, keys, N, request, NULL, p) != KVF_OK) {
        *bad = 1;
        return 0;
    }
    double recompute = (double)request * ms_per_token * 1e-3;
    atomic_store(&stall_until_ns, stall ? kvf__now_ns() + (uint64_t)(3e9 * recompute) : 0);
    double ttft = follow(f, keys, p, true, hedged, bad);
    atomic_store(&stall_until_ns, 0);
    if (kvf_cache_observe_plan(f->c, p, ttft) != KVF_OK)
        *bad = 1;
    return ttft;
}

/* A disk that runs slow request after request (the file layer's fault
 * hook sleeping its reads): the plan loads, each request is hedged and
 * ends near the margin of recomputing, far above the plan's prediction;
 * taught those times, the cache's plans predict loading as slow as it
 * ran and recompute, with the disk's held cost untouched (and with a
 * learnt one alike). Once the slow requests have left the window the plan
 * loads again, and with the disk at its speed keeps loading. */
/* The disk at its speed again: serves requests until three in a row load
 * (at most two windows' worth), counting those that recomputed first. A
 * request that recomputes after one loaded, or a load hedged, fails. */
static int recover(fixture *f, const kvf_key *keys, uint64_t request, int *recomputed, int *loaded)
{
    kvf_plan p;
    bool hedged;
    int bad = 0;
    for (int i = 0; i < 2 * KVF_PLAN_LEARN_WINDOW && *loaded < 3; i++) {
        serve(f, keys, request, false, &p, &hedged, &bad);
        CHECK_EQ_INT(bad, 0);
        if (p.load_blocks > p.load_first) {
            CHECK(!hedged);
            (*loaded)++;
        } else {
            CHECK_EQ_INT(*loaded, 0);
            (*recomputed)++;
        }
    }
    return 0;
}

static int test_learn(void)
{
    ms_per_token = 0.5; /* 448 tokens: 224 ms recomputed, sleeps well above their own lateness */
    for (int hold = 1; hold >= 0; hold--) {
        fixture f;
        kvf_key keys[N];
        if (setup(&f, keys, 0x1ea3e000ull))
            return 1;
        kvf_prefill_cost pc = KVF_PREFILL_COST_INIT;
        pc.fn = prefill;
        uint64_t request = (N + EXTRA) * TPB;
        size_t bb = f.bytes[0] + f.bytes[1];
        /* the disk at a tenth of a block's compute a block: loading all pays */
        double block_s = 0.1 * TPB * ms_per_token * 1e-3;
        CHECK_STATUS(kvf_engine_set_tier_cost(f.e, KVF_TIER_DISK, 1e-4, (double)bb / block_s, hold),
                     KVF_OK);
        kvf_costs before = KVF_COSTS_INIT;
        CHECK_STATUS(kvf_engine_costs(f.e, &before), KVF_OK);
        kvf__set_io_fault(slow_reads);

        kvf_plan p;
        bool hedged;
        int bad = 0, slow = 0;
        double first_pred = 0, took = 0;
        /* slow requests until the plan stops loading */
        while (slow < 10) {
            took = serve(&f, keys, request, true, &p, &hedged, &bad);
            CHECK_EQ_INT(bad, 0);
            if (p.load_blocks == p.load_first)
                break;
            if (!slow)
                first_pred = p.ttft_s;
            CHECK(hedged);
            slow++;
        }
        kvf_plan_learnt l = KVF_PLAN_LEARNT_INIT;
        CHECK_STATUS(kvf_cache_plan_learnt(f.c, &l), KVF_OK);
        printf("  hold %d: %d slow requests, %.0f ms predicted, then a plan that recomputes, "
               "predicting %.0f ms for loading all (load ratio %.2f), %.0f ms taken\n",
               hold, slow, first_pred * 1e3, p.ttft_load_all_s * 1e3, l.load_ratio, took * 1e3);
        CHECK_EQ_INT(p.load_blocks, 0);
        CHECK(p.ttft_load_all_s > p.ttft_recompute_s);
        CHECK(p.ttft_s == p.ttft_recompute_s);
        kvf_costs after = KVF_COSTS_INIT;
        CHECK_STATUS(kvf_engine_costs(f.e, &after), KVF_OK);
        if (!hold) {
            /* a learnt cost follows the slow reads itself (the late gets
             * land and teach the disk): no more slow requests than held */
            CHECK(slow >= 1 && slow <= KVF_PLAN_LEARN_MIN);
            CHECK(after.tier[KVF_TIER_DISK].bytes_per_s < before.tier[KVF_TIER_DISK].bytes_per_s);
            /* the disk at its speed again: nothing reads it while the
             * plans recompute, until its learnt cost is forgotten (after
             * a minute; 300 ms here) and the slow requests have left the
             * plan's window; then a plan loads, learns the disk is fast,
             * and keeps loading */
            kvf__engine_costs_forget_after(f.e, 300000000u);
            int recomputed = 0, loaded = 0;
            CHECK(recover(&f, keys, request, &recomputed, &loaded) == 0);
            printf("  learnt: %d requests recomputed, then %d loaded\n", recomputed, loaded);
            CHECK_EQ_INT(loaded, 3);
            CHECK(recomputed <= KVF_PLAN_LEARN_WINDOW);
            CHECK_STATUS(kvf_engine_costs(f.e, &after), KVF_OK);
            CHECK(after.tier[KVF_TIER_DISK].observed >= 3);
            CHECK(after.tier[KVF_TIER_DISK].bytes_per_s >
                  0.5 * before.tier[KVF_TIER_DISK].bytes_per_s);
            kvf__set_io_fault(NULL);
            fx_done(&f);
            continue;
        }
        CHECK_EQ_INT(slow, KVF_PLAN_LEARN_MIN);
        CHECK_EQ_INT(l.load_observed, KVF_PLAN_LEARN_MIN);
        CHECK(l.load_ratio > 2);
        CHECK(p.load_ratio == l.load_ratio);
        /* held: the disk's cost is what was set, the learning is the plan's */
        CHECK(after.tier[KVF_TIER_DISK].held);
        CHECK(after.tier[KVF_TIER_DISK].latency_s == before.tier[KVF_TIER_DISK].latency_s);
        CHECK(after.tier[KVF_TIER_DISK].bytes_per_s == before.tier[KVF_TIER_DISK].bytes_per_s);

        /* the disk at its speed again: the plan recomputes until the slow
         * requests leave the window, then loads, and keeps loading */
        int recomputed = 0, loaded = 0;
        CHECK(recover(&f, keys, request, &recomputed, &loaded) == 0);
        CHECK_EQ_INT(loaded, 3);
        CHECK_EQ_INT(recomputed, KVF_PLAN_LEARN_WINDOW - KVF_PLAN_LEARN_MIN);
        CHECK_STATUS(kvf_cache_plan_learnt(f.c, &l), KVF_OK);
        CHECK(l.load_ratio < 2);

        /* a new prefill cost forgets what was learnt against the old one */
        CHECK_STATUS(kvf_cache_set_prefill_cost(f.c, &pc), KVF_OK);
        CHECK_STATUS(kvf_cache_plan_learnt(f.c, &l), KVF_OK);
        CHECK(l.load_observed == 0 && l.recompute_observed == 0 && l.load_ratio == 1);
        kvf__set_io_fault(NULL);
        fx_done(&f);
    }
    ms_per_token = 1.0;
    return 0;
}

/* A cache of 64 slots over a disk tier of 64 blocks, for the tests that
 * feed the plan's window by hand. */
static int disk_cache(fixture *f)
{
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk.blocks = 64;
    return fx_init(f, 64, 0, true, &cc);
}

/* What is not a time, a plan or a ratio is refused by name; a plan too
 * short to time teaches nothing. */
static int test_learn_bad_input(void)
{
    fixture f;
    if (disk_cache(&f))
        return 1;
    kvf_plan p = KVF_PLAN_INIT;
    p.ttft_s = 0.5;
    p.load_blocks = 3;
    static const double bad[] = {-1, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_STATUS(kvf_cache_observe_plan(f.c, &p, bad[i]), KVF_ERR_INVALID);
        CHECK_STR_HAS(kvf_last_error(), "ttft_s");
    }
    CHECK_STATUS(kvf_cache_observe_plan(f.c, NULL, 1), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_observe_plan(NULL, &p, 1), KVF_ERR_INVALID);
    kvf_plan sized = p;
    sized.struct_size = 0;
    CHECK_STATUS(kvf_cache_observe_plan(f.c, &sized, 1), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "struct_size");
    kvf_plan nan_plan = p;
    nan_plan.ttft_s = NAN;
    CHECK_STATUS(kvf_cache_observe_plan(f.c, &nan_plan, 1), KVF_ERR_INVALID);
    nan_plan.ttft_s = 0.5;
    nan_plan.load_ratio = -2;
    CHECK_STATUS(kvf_cache_observe_plan(f.c, &nan_plan, 1), KVF_ERR_INVALID);
    kvf_plan_learnt l = KVF_PLAN_LEARNT_INIT;
    CHECK_STATUS(kvf_cache_plan_learnt(f.c, &l), KVF_OK);
    CHECK_EQ_INT(l.load_observed, 0);
    /* below KVF_PLAN_LEARN_MIN_S: accepted, nothing learnt */
    kvf_plan tiny = p;
    tiny.ttft_s = KVF_PLAN_LEARN_MIN_S / 2;
    CHECK_STATUS(kvf_cache_observe_plan(f.c, &tiny, 10), KVF_OK);
    CHECK_STATUS(kvf_cache_observe_plan(f.c, &p, 1), KVF_OK);
    CHECK_STATUS(kvf_cache_plan_learnt(f.c, &l), KVF_OK);
    CHECK_EQ_INT(l.load_observed, 1);
    CHECK(l.load_ratio == 1); /* fewer than KVF_PLAN_LEARN_MIN */
    CHECK_STATUS(kvf_cache_plan_learnt(f.c, NULL), KVF_ERR_INVALID);

    /* the pure planner's ratios */
    kvf_tier tiers[4] = {KVF_TIER_DISK, KVF_TIER_DISK, KVF_TIER_DISK, KVF_TIER_DISK};
    kvf_prefill_cost pc = KVF_PREFILL_COST_INIT;
    pc.fn = prefill;
    kvf_plan_input in = KVF_PLAN_INPUT_INIT;
    in.tiers = tiers;
    in.hits = 4;
    in.block_bytes = 1 << 20;
    in.tokens_per_block = TPB;
    in.request_tokens = 5 * TPB;
    in.prefill = &pc;
    in.costs.tier[KVF_TIER_DISK].latency_s = 1e-4;
    in.costs.tier[KVF_TIER_DISK].bytes_per_s = 1e12;
    static const double bad_ratio[] = {-1, NAN, INFINITY, 5e-324};
    for (int which = 0; which < 2; which++)
        for (size_t i = 0; i < sizeof bad_ratio / sizeof *bad_ratio; i++) {
            kvf_plan_input b = in;
            *(which ? &b.recompute_ratio : &b.load_ratio) = bad_ratio[i];
            kvf_plan out = KVF_PLAN_INIT;
            CHECK_STATUS(kvf_plan_compute(&b, &out), KVF_ERR_INVALID);
            CHECK_STR_HAS(kvf_last_error(), which ? "recompute_ratio" : "load_ratio");
        }
    /* 0 is 1 (an older caller's struct); a ratio scales its shapes */
    kvf_plan one = KVF_PLAN_INIT, two = KVF_PLAN_INIT;
    CHECK_STATUS(kvf_plan_compute(&in, &one), KVF_OK);
    CHECK(one.load_ratio == 1 && one.recompute_ratio == 1 && one.load_blocks == 4);
    in.load_ratio = 2;
    CHECK_STATUS(kvf_plan_compute(&in, &two), KVF_OK);
    CHECK(two.ttft_load_all_s == 2 * one.ttft_load_all_s);
    CHECK(two.ttft_recompute_s == one.ttft_recompute_s);
    CHECK(two.load_s == one.load_s && two.first_s == one.first_s && one.first_s > 0);
    fx_done(&f);
    return 0;
}

/* Requests served at once on threads teach one cache together, while
 * another thread reads what is learnt and a third sets a new prefill cost
 * (which forgets it) in between: the window never holds more than
 * KVF_PLAN_LEARN_WINDOW, a ratio is 1 or one that was observed, and once
 * the threads are done the counts add up. */
typedef struct learn_thread {
    kvf_cache *c;
    const kvf_plan *plan;
    double ttft_s;
    atomic_int *bad;
} learn_thread;

static void *observe_main(void *arg)
{
    learn_thread *t = arg;
    for (int i = 0; i < 500; i++)
        if (kvf_cache_observe_plan(t->c, t->plan, t->ttft_s) != KVF_OK)
            atomic_fetch_add(t->bad, 1);
    return NULL;
}

static void *learnt_main(void *arg)
{
    learn_thread *t = arg;
    for (int i = 0; i < 500; i++) {
        kvf_plan_learnt l = KVF_PLAN_LEARNT_INIT;
        if (kvf_cache_plan_learnt(t->c, &l) != KVF_OK ||
            l.load_observed + l.recompute_observed > KVF_PLAN_LEARN_WINDOW ||
            (l.load_ratio != 1 && l.load_ratio != 2) ||
            (l.recompute_ratio != 1 && l.recompute_ratio != 3))
            atomic_fetch_add(t->bad, 1);
        if (i % 100 == 0) {
            kvf_prefill_cost pc = KVF_PREFILL_COST_INIT;
            pc.fn = prefill;
            if (kvf_cache_set_prefill_cost(t->c, &pc) != KVF_OK)
                atomic_fetch_add(t->bad, 1);
        }
    }
    return NULL;
}

static int test_learn_threads(void)
{
    fixture f;
    if (disk_cache(&f))
        return 1;
    kvf_plan load = KVF_PLAN_INIT, rec = KVF_PLAN_INIT;
    load.ttft_s = rec.ttft_s = 0.5;
    load.load_blocks = 3; /* a plan that loads: ratio 2 */
    atomic_int bad = 0;
    learn_thread t[4] = {{f.c, &load, 1.0, &bad},
                         {f.c, &load, 1.0, &bad},
                         {f.c, &rec, 1.5, &bad}, /* one that recomputes: ratio 3 */
                         {f.c, NULL, 0, &bad}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&th[i], NULL, t[i].plan ? observe_main : learnt_main, &t[i]) == 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_INT(atomic_load(&bad), 0);
    kvf_plan_learnt l = KVF_PLAN_LEARNT_INIT;
    CHECK_STATUS(kvf_cache_plan_learnt(f.c, &l), KVF_OK);
    CHECK(l.load_observed + l.recompute_observed <= KVF_PLAN_LEARN_WINDOW);
    /* a window's worth of loading requests leaves only them in it */
    for (int i = 0; i < KVF_PLAN_LEARN_WINDOW; i++)
        CHECK_STATUS(kvf_cache_observe_plan(f.c, &load, 1.0), KVF_OK);
    CHECK_STATUS(kvf_cache_plan_learnt(f.c, &l), KVF_OK);
    CHECK(l.load_observed == KVF_PLAN_LEARN_WINDOW && l.recompute_observed == 0 &&
          l.load_ratio == 2 && l.recompute_ratio == 1);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_hedge);
    RUN(test_learn);
    RUN(test_learn_bad_input);
    RUN(test_learn_threads);
    return TEST_RESULT();
}
