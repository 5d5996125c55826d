/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's tiers: round trips through the host tier alone, the disk
 * tier alone and both, and a block on disk handed back by the engine
 * promoted to the host tier.
 */
#include "cache_fixture.h"

/* ---- round trips -------------------------------------------------------------- */

static int round_trip(uint32_t host, uint32_t disk)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = host;
    cc.disk.blocks = disk;
    if (fx_init(&f, 64, host ? 32 : 0, disk > 0, &cc))
        return 1;
    enum { N = 24 };
    kvf_key keys[N];
    uint32_t src[N], dst[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = KEY(0xc0ffee00ull + i * 7919);
        src[i] = i;
        dst[i] = 63 - i;
        fill(&f, i, keys[i]);
    }
    kvf_cache_ticket t;
    kvf_status per[N];
    CHECK_STATUS(kvf_cache_put(f.c, keys, src, N, 50, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, per), KVF_OK);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_STATUS(per[i], KVF_OK);
        poison(&f, src[i]);
        poison(&f, dst[i]);
    }
    size_t hits = 0;
    kvf_tier tiers[N];
    CHECK_STATUS(kvf_cache_lookup(f.c, keys, N, &hits, tiers), KVF_OK);
    CHECK_EQ_INT(hits, N);
    CHECK_STATUS(kvf_cache_get(f.c, keys, dst, N, &t), KVF_OK);
    kvf_status st;
    while ((st = kvf_cache_poll(f.c, t, per)) == KVF_INPROGRESS)
        usleep(100);
    CHECK_STATUS(st, KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        if (expect(&f, dst[i], keys[i]))
            return 1;
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(f.c, &s), KVF_OK);
    CHECK_EQ_INT(s.blocks[KVF_TIER_HOST] + s.blocks[KVF_TIER_DISK], N);
    CHECK_EQ_INT(s.gets, N);
    CHECK_EQ_INT(s.puts, N);
    uint64_t bb = f.bytes[0] + f.bytes[1];
    CHECK_EQ_U64(s.bytes_out[KVF_TIER_HOST] + s.bytes_out[KVF_TIER_DISK], N * bb);
    CHECK_EQ_INT(s.latency_count, 2);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_ERR_UNKNOWN_TICKET);
    fx_done(&f);
    return 0;
}

static int test_host_only(void)
{
    return round_trip(32, 0);
}

static int test_disk_only(void)
{
    return round_trip(0, 64);
}

static int test_host_and_disk(void)
{
    /* 24 blocks into 8 host + 64 disk: 16 demoted on the way */
    return round_trip(8, 64);
}

/* A block that fell to disk and is handed back by the engine (a put of a
 * key cached on disk) returns to the host tier: hot blocks do not stay on
 * disk. Its file goes; the bytes are the ones put. */
static int test_promotion(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 2;
    cc.disk.blocks = 8;
    if (fx_init(&f, 8, 2, true, &cc))
        return 1;
    for (uint64_t k = 1; k <= 3; k++) {
        fill(&f, (uint32_t)k, k);
        CHECK_STATUS(put1(&f, k, (uint32_t)k, 50), KVF_OK);
    }
    CHECK_EQ_INT(tier_of(&f, 1), KVF_TIER_DISK);
    CHECK_STATUS(put1(&f, 1, 1, 50), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, 1), KVF_TIER_HOST);
    CHECK_EQ_INT(tier_of(&f, 2), KVF_TIER_DISK); /* the host victim it displaced */
    char path[600];
    snprintf(path, sizeof path, "%s/cache/0000000000000000%016llx.kvf", f.dir, 1ull);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_TIER_HOST], 2);
    CHECK_EQ_INT(s.blocks[KVF_TIER_DISK], 1);
    poison(&f, 6);
    CHECK_STATUS(get1(&f, 1, 6), KVF_OK);
    CHECK(expect(&f, 6, 1) == 0);
    fx_close(&f); /* waits for the file's removal */
    CHECK(access(path, F_OK) != 0);
    test_rmtree(f.dir);
    return 0;
}

int main(void)
{
    RUN(test_host_only);
    RUN(test_disk_only);
    RUN(test_host_and_disk);
    RUN(test_promotion);
    return TEST_RESULT();
}
