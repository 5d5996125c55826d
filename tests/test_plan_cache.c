/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvf_cache_plan through a real cache (host backend, host and disk tiers):
 * the plan covers the lookup's hits, loads what its costs say pays and
 * recomputes the rest, and the blocks it loads come back byte for byte.
 */
#include "cache_fixture.h"

enum { N = 24, HOST = 8, TPB = 16 };

static int get_and_check(fixture *f, const kvf_key *keys, size_t k)
{
    uint32_t dst[N];
    for (size_t i = 0; i < k; i++) {
        dst[i] = (uint32_t)(63 - i);
        poison(f, dst[i]);
    }
    if (k == 0)
        return 0;
    kvf_cache_ticket t;
    kvf_status per[N];
    CHECK_STATUS(kvf_cache_get(f->c, keys, dst, k, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f->c, t, per), KVF_OK);
    for (size_t i = 0; i < k; i++)
        if (per[i] != KVF_OK || expect(f, dst[i], keys[i]))
            return 1;
    return 0;
}

static int test_plan_cache(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = HOST;
    cc.disk.blocks = 64;
    if (fx_init(&f, 64, HOST, true, &cc))
        return 1;
    kvf_key keys[N + 1];
    keys[N] = KEY(0xdead0001); /* never stored: the prefix stops before it */
    /* stored last to first, so the leading (most recent) blocks stay in
     * the host tier and the others go down to disk */
    for (int i = N - 1; i >= 0; i--) {
        keys[i] = KEY(0xbeef0000ull + (uint64_t)i * 131);
        fill(&f, (uint32_t)i, keys[i]);
        CHECK_STATUS(put1(&f, keys[i], (uint32_t)i, 50), KVF_OK);
    }
    kvf_tier tiers[N + 1];
    size_t hits = 0;
    CHECK_STATUS(kvf_cache_lookup(f.c, keys, N + 1, &hits, tiers), KVF_OK);
    CHECK_EQ_INT(hits, N);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(tiers[i], i < HOST ? KVF_TIER_HOST : KVF_TIER_DISK);

    kvf_plan p = KVF_PLAN_INIT;
    uint64_t request = (N + 4) * TPB;
    CHECK_STATUS(kvf_cache_plan(f.c, keys, N + 1, request, NULL, &p), KVF_ERR_STATE);
    CHECK_STR_HAS(kvf_last_error(), "no prefill cost");
    /* 1 ms a token, a prefix costs nothing more */
    uint64_t nt[2] = {1, 1000};
    double sec[2] = {1e-3, 1.0};
    kvf_prefill_cost pc = KVF_PREFILL_COST_INIT;
    pc.new_tokens = nt;
    pc.n_new = 2;
    pc.prefix_tokens = NULL;
    pc.seconds = sec;
    sec[1] = -1;
    CHECK_STATUS(kvf_cache_set_prefill_cost(f.c, &pc), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "seconds[1]");
    sec[1] = 1.0;
    CHECK_STATUS(kvf_cache_set_prefill_cost(f.c, &pc), KVF_OK);
    sec[1] = 1e9; /* the cache kept its own copy */

    /* a fast host tier, a disk slower than computing a block (16 ms) */
    size_t bb = f.bytes[0] + f.bytes[1];
    CHECK_STATUS(kvf_engine_set_tier_cost(f.e, KVF_TIER_HOST, 1e-5, 1e9, 1), KVF_OK);
    CHECK_STATUS(kvf_engine_set_tier_cost(f.e, KVF_TIER_DISK, 1e-3, (double)bb / 0.05, 1), KVF_OK);
    kvf_tier pt[N + 1];
    CHECK_STATUS(kvf_cache_plan(f.c, keys, N + 1, request, pt, &p), KVF_OK);
    CHECK_EQ_INT(p.hits, N);
    CHECK_EQ_INT(p.load_blocks, HOST);
    CHECK_EQ_INT(p.load[KVF_TIER_HOST], HOST);
    CHECK_EQ_INT(p.load[KVF_TIER_DISK], 0);
    CHECK_EQ_INT(p.recompute_hits[KVF_TIER_DISK], N - HOST);
    CHECK_EQ_INT(p.recompute_from, HOST * TPB);
    CHECK_EQ_INT(p.compute_tokens, request - HOST * TPB);
    CHECK(p.ttft_s < p.ttft_recompute_s && p.ttft_s < p.ttft_load_all_s);
    CHECK_EQ_INT(p.overlap, 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(pt[i], tiers[i]);
    if (get_and_check(&f, keys, p.load_blocks))
        return 1;

    /* the disk held fast: everything loads */
    CHECK_STATUS(kvf_engine_set_tier_cost(f.e, KVF_TIER_DISK, 1e-5, 1e10, 1), KVF_OK);
    CHECK_STATUS(kvf_cache_plan(f.c, keys, N + 1, request, NULL, &p), KVF_OK);
    CHECK_EQ_INT(p.load_blocks, N);
    CHECK_EQ_INT(p.load[KVF_TIER_DISK], N - HOST);
    if (get_and_check(&f, keys, p.load_blocks))
        return 1;
    /* a short request: only the blocks that leave a token to compute */
    CHECK_STATUS(kvf_cache_plan(f.c, keys, N + 1, 3 * TPB, NULL, &p), KVF_OK);
    CHECK_EQ_INT(p.load_blocks, 2);
    CHECK_EQ_INT(p.compute_tokens, TPB);
    /* nothing cached */
    kvf_key other = KEY(0x12345);
    CHECK_STATUS(kvf_cache_plan(f.c, &other, 1, 100, NULL, &p), KVF_OK);
    CHECK_EQ_INT(p.hits, 0);
    CHECK_EQ_INT(p.load_blocks, 0);
    CHECK(p.ttft_s == p.ttft_recompute_s);
    /* cleared: no plan */
    CHECK_STATUS(kvf_cache_set_prefill_cost(f.c, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_plan(f.c, keys, N, request, NULL, &p), KVF_ERR_STATE);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_plan_cache);
    return TEST_RESULT();
}
