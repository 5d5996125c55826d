/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A cache restarted on its disk tier: the blocks on disk are found again
 * (those of the host tier are lost with the process), a smaller disk tier
 * keeps the newest files and removes the others, and another layout sees
 * none of them.
 */
#include "cache_fixture.h"

/* ---- restart ------------------------------------------------------------------- */

static int test_restart(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 4;
    cc.disk.blocks = 32;
    if (fx_init(&f, 8, 4, true, &cc))
        return 1;
    enum { N = 20 };
    for (uint32_t i = 0; i < N; i++) {
        fill(&f, 0, 500 + i);
        CHECK_STATUS(put1(&f, 500 + i, 0, 50), KVF_OK);
        usleep(2000); /* distinct modification times: the restart order */
    }
    /* the last 4 are in the host tier, and are lost with the process */
    fx_close(&f);

    fx_engine(&f, true);
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    for (uint32_t i = 0; i < N; i++) {
        int want = i < N - 4 ? KVF_TIER_DISK : -1;
        CHECK_EQ_INT(tier_of(&f, 500 + i), want);
        if (want < 0)
            continue;
        poison(&f, 2);
        CHECK_STATUS(get1(&f, 500 + i, 2), KVF_OK);
        CHECK(expect(&f, 2, 500 + i) == 0);
    }
    fx_close(&f);

    /* a smaller disk tier keeps the newest and removes the oldest files */
    kvf_cache_config smaller = cc;
    smaller.disk.blocks = 10;
    fx_engine(&f, true);
    CHECK_STATUS(kvf_cache_create(f.e, &smaller, &f.c), KVF_OK);
    for (uint32_t i = 0; i < N - 4; i++)
        CHECK_EQ_INT(tier_of(&f, 500 + i), i < N - 4 - 10 ? -1 : KVF_TIER_DISK);
    fx_close(&f);
    fx_engine(&f, true);
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_TIER_DISK], 10); /* the files are gone, not hidden */
    fx_close(&f);

    /* another layout does not see them */
    kvf_engine_config ec = KVF_ENGINE_CONFIG_INIT;
    ec.backend = KVF_BACKEND_HOST;
    ec.file.dir = f.dir;
    ec.file.namespace_ = "cache";
    REQUIRE(kvf_engine_create(&ec, &f.e) == KVF_OK);
    kvf_pool_desc p = {KVF_MEMORY_HOST, NULL, 0, 8};
    REQUIRE(kvf_engine_add_pool(f.e, &G_A, &p, &p, NULL) == KVF_OK);
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_TIER_DISK], 0);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_restart);
    return TEST_RESULT();
}
