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
 * handed over).
 */
#include "cache_fixture.h"
#include "fileio.h"

#include <stdatomic.h>
#include <time.h>

enum { N = 24, TPB = 16, EXTRA = 4 };

/* the forward pass: MS_PER_TOKEN a token, after any prefix */
#define MS_PER_TOKEN 1.0
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
    *seconds = (double)new_tokens * MS_PER_TOKEN * 1e-3;
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
    kvf_cache_ticket t;
    if (kvf_cache_get(f->c, keys + first, dst + first, k - first, &t) != KVF_OK) {
        *bad = 1;
        return 0;
    }
    compute((double)(first * TPB) * MS_PER_TOKEN * 1e-3); /* the front, beside the loads */
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
    compute(*hedged ? p->fallback_s : (double)p->compute_tokens * MS_PER_TOKEN * 1e-3);
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

static int test_hedge(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk.blocks = 64;
    if (fx_init(&f, 64, 0, true, &cc))
        return 1;
    kvf_key keys[N];
    for (int i = 0; i < N; i++) {
        keys[i] = KEY(0x4ed9e000ull + (uint64_t)i * 7);
        fill(&f, (uint32_t)i, keys[i]);
        CHECK_STATUS(put1(&f, keys[i], (uint32_t)i, 50), KVF_OK);
    }
    kvf_prefill_cost pc = KVF_PREFILL_COST_INIT;
    pc.fn = prefill;
    CHECK_STATUS(kvf_cache_set_prefill_cost(f.c, &pc), KVF_OK);
    uint64_t request = (N + EXTRA) * TPB;
    double recompute = (double)request * MS_PER_TOKEN * 1e-3;
    size_t bb = f.bytes[0] + f.bytes[1];

    kvf__set_io_fault(slow_reads);
    /* two plans: a disk held at a tenth of a block's compute a block (load
     * every hit), and at twice it (compute the front while the back loads) */
    double per_block[2] = {0.1, 2.0};
    for (int shape = 0; shape < 2; shape++) {
        double block_s = per_block[shape] * TPB * MS_PER_TOKEN * 1e-3;
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

int main(void)
{
    RUN(test_hedge);
    return TEST_RESULT();
}
