/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache owning the GPU blocks (the GPU tier, on the host backend
 * here): a request's life (alloc, prefill, commit, unpin, acquire),
 * random requests over a shared chain of keys checked byte for byte, and
 * the races and failed copies around acquire found in review.
 */
#include "cache_fixture.h"

/* ---- the GPU tier ------------------------------------------------------------ */

static kvf_status wait_ok(fixture *f, kvf_cache_ticket t, kvf_status *per)
{
    return kvf_cache_wait(f->c, t, per);
}

/* A request's life with a cache that owns the GPU blocks: alloc, prefill,
 * commit, unpin; later requests acquire the prefix (from the GPU tier, or
 * brought back up from host and disk) while their own allocations evict
 * unpinned GPU blocks down the tiers. Every block acquired is checked. */
static int test_gpu_tier(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 6;
    cc.host.blocks = 4;
    cc.disk.blocks = 16;
    cc.events.queue = 256;
    /* primary slots 0..5 are the cache's; 6..15 the engine's own */
    if (fx_init(&f, 16, 4, true, &cc))
        return 1;
    kvf_cache_ticket t;
    uint32_t slots[6];
    kvf_key keys[6];
    for (int r = 0; r < 4; r++) {
        /* a request of 4 new blocks */
        CHECK_STATUS(kvf_cache_alloc(f.c, slots, 4, &t), KVF_OK);
        CHECK_STATUS(wait_ok(&f, t, NULL), KVF_OK);
        for (int i = 0; i < 4; i++) {
            CHECK(slots[i] < 6);
            keys[i] = KEY(0x600 + (uint64_t)(r * 4 + i));
            fill(&f, slots[i], keys[i]);
        }
        CHECK_STATUS(kvf_cache_commit(f.c, keys, slots, 4, 50, NULL), KVF_OK);
        CHECK_EQ_INT(tier_of(&f, keys[0]), KVF_TIER_GPU);
        CHECK_STATUS(kvf_cache_unpin(f.c, keys, 4), KVF_OK);
    }
    /* 16 blocks: 6 fit the GPU tier, the rest went down to host and disk */
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_TIER_GPU] + s.blocks[KVF_TIER_HOST] + s.blocks[KVF_TIER_DISK], 16);
    CHECK_EQ_INT(s.blocks[KVF_TIER_GPU], 6); /* full: allocations evict only as needed */
    CHECK(s.blocks[KVF_TIER_DISK] > 0);

    /* acquire the oldest request's prefix: from disk, up into GPU slots */
    kvf_key first[4] = {KEY(0x600), KEY(0x601), KEY(0x602), KEY(0x603)};
    CHECK(tier_of(&f, 0x600) == KVF_TIER_DISK);
    size_t hits = 0;
    uint32_t got[4];
    kvf_status per[4];
    CHECK_STATUS(kvf_cache_acquire(f.c, first, 4, got, &hits, &t), KVF_OK);
    CHECK_EQ_INT(hits, 4);
    CHECK_STATUS(wait_ok(&f, t, per), KVF_OK);
    for (int i = 0; i < 4; i++) {
        CHECK(got[i] < 6);
        CHECK_EQ_INT(tier_of(&f, first[i]), KVF_TIER_GPU);
        if (expect(&f, got[i], first[i]))
            return 1;
    }
    /* pinned: an allocation of more than the free and unpinned slots fails
     * whole; a smaller one evicts the unpinned ones */
    CHECK_STATUS(kvf_cache_alloc(f.c, slots, 3, &t), KVF_ERR_NO_SPACE);
    CHECK_STATUS(kvf_cache_alloc(f.c, slots, 2, &t), KVF_OK);
    CHECK_STATUS(wait_ok(&f, t, NULL), KVF_OK);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(tier_of(&f, first[i]), KVF_TIER_GPU);
    /* handed-out slots: commit or free them, nothing else */
    kvf_key k2[2] = {KEY(0x700), KEY(0x701)};
    uint32_t bogus = 7;
    CHECK_STATUS(kvf_cache_commit(f.c, k2, &bogus, 1, 50, NULL), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "slot 7");
    /* in use by this request in the GPU tier: the new copy stays private */
    kvf_status cs;
    CHECK_STATUS(kvf_cache_commit(f.c, first, slots, 1, 50, &cs), KVF_ERR_STATE);
    CHECK_STATUS(cs, KVF_ERR_STATE);
    CHECK_STATUS(kvf_cache_free(f.c, slots, 2), KVF_OK);
    CHECK_STATUS(kvf_cache_free(f.c, slots, 1), KVF_ERR_INVALID); /* twice */
    /* a get copies a GPU block to the engine's own slot; a get into a
     * cached GPU slot is refused */
    poison(&f, 10);
    uint32_t s10 = 10;
    kvf_cache_ticket tg;
    CHECK_STATUS(kvf_cache_get(f.c, &first[1], &s10, 1, &tg), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, tg, NULL), KVF_OK);
    CHECK(expect(&f, 10, first[1]) == 0);
    CHECK_STATUS(kvf_cache_get(f.c, &first[2], &got[0], 1, &tg), KVF_ERR_INVALID);
    /* unpinned and re-acquired where they are */
    CHECK_STATUS(kvf_cache_unpin(f.c, first, 4), KVF_OK);
    uint32_t again[4];
    CHECK_STATUS(kvf_cache_acquire(f.c, first, 4, again, &hits, &t), KVF_OK);
    CHECK_EQ_INT(hits, 4);
    CHECK_STATUS(wait_ok(&f, t, NULL), KVF_OK);
    CHECK(memcmp(again, got, sizeof got) == 0);
    CHECK_STATUS(kvf_cache_unpin(f.c, first, 4), KVF_OK);
    /* an unknown key ends the prefix */
    kvf_key mixed[3] = {KEY(0x600), KEY(0x999), KEY(0x601)};
    CHECK_STATUS(kvf_cache_acquire(f.c, mixed, 3, again, &hits, &t), KVF_OK);
    CHECK_EQ_INT(hits, 1);
    CHECK_STATUS(wait_ok(&f, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, mixed, 1), KVF_OK);
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.failures, 0);
    CHECK(s.evictions[KVF_TIER_GPU] > 0);
    /* no GPU tier: refused */
    fx_close(&f);
    kvf_cache_config plain = KVF_CACHE_CONFIG_INIT;
    plain.host.blocks = 4;
    fx_engine(&f, false);
    CHECK_STATUS(kvf_cache_create(f.e, &plain, &f.c), KVF_OK);
    CHECK_STATUS(kvf_cache_alloc(f.c, slots, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "gpu.blocks");
    fx_close(&f);
    plain.gpu.blocks = 17;
    fx_engine(&f, false);
    CHECK_STATUS(kvf_cache_create(f.e, &plain, &f.c), KVF_ERR_RANGE);
    kvf_engine_destroy(f.e);
    test_rmtree(f.dir);
    return 0;
}

/* Two requests acquire the same blocks while the first one's copy up from
 * the host tier is still running (slowed down here): the second ticket
 * must not complete before the bytes are in place (found by kvferry
 * replay --gpu-tier --clients 3). */
static int slow_copies;
static kvf_status slow_copy(const kvf__copy *cp)
{
    (void)cp;
    if (__atomic_load_n(&slow_copies, __ATOMIC_ACQUIRE))
        usleep(20000);
    return KVF_OK;
}

static int test_gpu_tier_acquire_race(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 4;
    cc.host.blocks = 8; /* room for both sets: acquiring one evicts nothing */
    if (fx_init(&f, 8, 8, false, &cc))
        return 1;
    kvf_key a[4] = {KEY(0xa1), KEY(0xa2), KEY(0xa3), KEY(0xa4)},
            b[4] = {KEY(0xb1), KEY(0xb2), KEY(0xb3), KEY(0xb4)};
    uint32_t slots[4];
    kvf_cache_ticket t;
    for (int round = 0; round < 2; round++) {
        kvf_key *keys = round ? b : a;
        CHECK_STATUS(kvf_cache_alloc(f.c, slots, 4, &t), KVF_OK);
        CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
        for (int i = 0; i < 4; i++)
            fill(&f, slots[i], keys[i]);
        CHECK_STATUS(kvf_cache_commit(f.c, keys, slots, 4, 50, NULL), KVF_OK);
        CHECK_STATUS(kvf_cache_unpin(f.c, keys, 4), KVF_OK);
    }
    CHECK_EQ_INT(tier_of(&f, a[0]), KVF_TIER_HOST); /* pushed down by b */
    kvf__set_copy_hook(slow_copy);
    __atomic_store_n(&slow_copies, 1, __ATOMIC_RELEASE);
    uint32_t s1[4], s2[4];
    size_t h1 = 0, h2 = 0;
    kvf_cache_ticket t1, t2;
    kvf_status per[4];
    CHECK_STATUS(kvf_cache_acquire(f.c, a, 4, s1, &h1, &t1), KVF_OK);
    CHECK_STATUS(kvf_cache_acquire(f.c, a, 4, s2, &h2, &t2), KVF_OK);
    CHECK_EQ_INT(h1, 4);
    CHECK_EQ_INT(h2, 4);
    CHECK_STATUS(kvf_cache_wait(f.c, t2, per), KVF_OK);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(s2[i], s1[i]);
        CHECK(expect(&f, s2[i], a[i]) == 0); /* in place once t2 completed */
    }
    CHECK_STATUS(kvf_cache_wait(f.c, t1, NULL), KVF_OK);
    __atomic_store_n(&slow_copies, 0, __ATOMIC_RELEASE);
    kvf__set_copy_hook(NULL);
    CHECK_STATUS(kvf_cache_unpin(f.c, a, 4), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, a, 4), KVF_OK);
    fx_done(&f);
    return 0;
}

/* Random requests against a GPU tier with host and disk below: each
 * acquires a random prefix of a shared chain of keys, allocates and commits
 * the rest, and ends (unpins); some give allocations back. After every
 * request, every acquired block's bytes are checked, and the blocks found
 * per tier equal the counts. */
static int test_gpu_tier_random(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 10;
    cc.host.blocks = 6;
    cc.disk.blocks = 12;
    cc.offload_min_priority = 20;
    if (fx_init(&f, 16, 6, true, &cc))
        return 1;
    enum { MAXREQ = 8 };
    uint64_t rng = 2024;
    for (int step = 0; step < 300; step++) {
        /* a request: a prefix of one of 5 chains, 1..MAXREQ blocks long */
        size_t len = 1 + test_xorshift64(&rng) % MAXREQ;
        kvf_key base = KEY(10000 + (test_xorshift64(&rng) % 5) * 100);
        kvf_key keys[MAXREQ];
        for (size_t i = 0; i < len; i++)
            keys[i] = KEY(base.lo + i);
        uint32_t slots[MAXREQ];
        size_t hits = 0;
        kvf_cache_ticket t;
        kvf_status per[MAXREQ];
        CHECK_STATUS(kvf_cache_acquire(f.c, keys, len, slots, &hits, &t), KVF_OK);
        CHECK_STATUS(kvf_cache_wait(f.c, t, per), KVF_OK);
        for (size_t i = 0; i < hits; i++)
            if (expect(&f, slots[i], keys[i])) {
                fprintf(stderr, "step %d: acquired block %zu wrong\n", step, i);
                return 1;
            }
        size_t rest = len - hits;
        if (rest) {
            kvf_status st = kvf_cache_alloc(f.c, slots + hits, rest, &t);
            if (st == KVF_ERR_NO_SPACE) {
                CHECK_STATUS(kvf_cache_unpin(f.c, keys, hits), KVF_OK);
                continue;
            }
            CHECK_STATUS(st, KVF_OK);
            CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
            for (size_t i = hits; i < len; i++)
                fill(&f, slots[i], keys[i]);
            if (test_xorshift64(&rng) % 8 == 0) {
                CHECK_STATUS(kvf_cache_free(f.c, slots + hits, rest), KVF_OK);
                len = hits;
            } else {
                /* blocks after a prefix miss may be cached already: those
                 * in use stay private, the others are replaced */
                uint32_t prio = (uint32_t)(test_xorshift64(&rng) % 101);
                kvf_status cs[MAXREQ];
                kvf_cache_commit(f.c, keys + hits, slots + hits, rest, prio, cs);
                size_t kept = hits;
                for (size_t i = hits; i < len; i++) {
                    if (cs[i - hits] == KVF_OK) {
                        keys[kept] = keys[i];
                        kept++;
                    } else {
                        CHECK_STATUS(cs[i - hits], KVF_ERR_STATE);
                        CHECK_STATUS(kvf_cache_free(f.c, &slots[i], 1), KVF_OK);
                    }
                }
                len = kept;
            }
        }
        if (kvf_cache_unpin(f.c, keys, len) != KVF_OK) {
            fprintf(stderr, "step %d: len %zu hits %zu rest %zu: %s\n", step, len, hits, rest,
                    kvf_last_error());
            for (size_t i = 0; i < len; i++)
                fprintf(stderr, "  key %zu tier %d\n", i, tier_of(&f, keys[i]));
            return 1;
        }
        kvf_cache_stats s = KVF_CACHE_STATS_INIT;
        kvf_cache_stats_get(f.c, &s);
        uint64_t found[KVF_TIER_COUNT] = {0};
        for (uint64_t b = 10000; b < 10500; b += 100)
            for (uint64_t i = 0; i < MAXREQ; i++) {
                int tier = tier_of(&f, b + i);
                if (tier >= 0)
                    found[tier]++;
            }
        for (int tier = 0; tier < KVF_TIER_COUNT; tier++)
            if (found[tier] != s.blocks[tier]) {
                fprintf(stderr, "step %d: tier %d: %llu found, %llu counted\n", step, tier,
                        (unsigned long long)found[tier], (unsigned long long)s.blocks[tier]);
                return 1;
            }
        CHECK(s.blocks[KVF_TIER_GPU] <= 10 && s.blocks[KVF_TIER_HOST] <= 6 &&
              s.blocks[KVF_TIER_DISK] <= 12);
        CHECK_EQ_INT(s.failures, 0);
    }
    fx_done(&f);
    return 0;
}

/* Found in review. A get of a GPU-tier block whose acquire copy failed
 * (the engine done, the cache not yet told): fails, never OK with bytes
 * that are not the block's. */
static int test_gpu_get_after_failed_acquire(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 4;
    cc.disk.blocks = 16;
    if (fx_init(&f, 16, 0, true, &cc))
        return 1;
    kvf_key K = KEY(0x77);
    fill(&f, 8, K);
    CHECK_STATUS(put1(&f, K, 8, 50), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, K), KVF_TIER_DISK);
    char path[600];
    block_path(&f, K, path, sizeof path);
    flip_byte(path, 200);
    uint32_t s;
    size_t hits;
    kvf_cache_ticket ta, tg;
    CHECK_STATUS(kvf_cache_acquire(f.c, &K, 1, &s, &hits, &ta), KVF_OK);
    CHECK_EQ_INT(hits, 1);
    usleep(200000); /* the engine completes the failed read */
    poison(&f, 9);
    uint32_t d = 9;
    CHECK_STATUS(kvf_cache_get(f.c, &K, &d, 1, &tg), KVF_OK);
    kvf_status gs = kvf_cache_wait(f.c, tg, NULL);
    CHECK(gs == KVF_ERR_LOST || (gs == KVF_OK && expect(&f, 9, K) == 0));
    CHECK(gs != KVF_OK); /* the copy into the GPU slot failed: so does the get */
    CHECK_STATUS(kvf_cache_wait(f.c, ta, NULL), KVF_ERR_CORRUPT);
    kvf_cache_unpin(f.c, &K, 1);
    fx_done(&f);
    return 0;
}

/* A get in flight, then an acquire moving the same key: the get's pin is released all the same. */
static int test_get_pin_released_after_acquire(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 4;
    cc.host.blocks = 4;
    if (fx_init(&f, 16, 4, false, &cc))
        return 1;
    kvf_key K = KEY(0x88);
    fill(&f, 8, K);
    CHECK_STATUS(put1(&f, K, 8, 50), KVF_OK);
    uint32_t d = 9, s;
    size_t hits;
    kvf_cache_ticket tg, ta;
    CHECK_STATUS(kvf_cache_get(f.c, &K, &d, 1, &tg), KVF_OK);
    CHECK_STATUS(kvf_cache_acquire(f.c, &K, 1, &s, &hits, &ta), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, tg, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, ta, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK);
    /* K should now be unpinned: a second unpin must fail */
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_ERR_STATE);
    CHECK_STATUS(kvf_cache_pin(f.c, &K, 1, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK);
    uint32_t sl[4];
    kvf_cache_ticket t;
    CHECK_STATUS(kvf_cache_alloc(f.c, sl, 4, &t), KVF_OK); /* K evictable again */
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    fx_done(&f);
    return 0;
}

/* Unpinned before its acquire is waited, a block whose copy failed is not copied down as good. */
static int test_gpu_failed_acquire_not_passed_down(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 1;
    cc.host.blocks = 1;
    cc.disk.blocks = 16;
    if (fx_init(&f, 16, 1, true, &cc))
        return 1;
    kvf_key K = KEY(0x99), K2 = KEY(0x9a);
    fill(&f, 8, K);
    CHECK_STATUS(put1(&f, K, 8, 50), KVF_OK);
    fill(&f, 8, K2);
    CHECK_STATUS(put1(&f, K2, 8, 50), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, K), KVF_TIER_DISK);
    char path[600];
    block_path(&f, K, path, sizeof path);
    flip_byte(path, 200);
    uint32_t s;
    size_t hits;
    kvf_cache_ticket ta, t;
    poison(&f, 0);
    CHECK_STATUS(kvf_cache_acquire(f.c, &K, 1, &s, &hits, &ta), KVF_OK);
    usleep(200000);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK); /* request cancelled */
    uint32_t s2;
    CHECK_STATUS(kvf_cache_alloc(f.c, &s2, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, ta, NULL), KVF_ERR_CORRUPT);
    poison(&f, 9);
    kvf_status gs = get1(&f, K, 9);
    CHECK(gs != KVF_OK || expect(&f, 9, K) == 0); /* never another block's bytes */
    kvf_cache_free(f.c, &s2, 1);
    fx_done(&f);
    return 0;
}

/* A failed copy long gone does not fail a good block later committed into the same slot. */
static int test_gpu_stale_failure_forgotten(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 1;
    cc.disk.blocks = 16;
    if (fx_init(&f, 16, 0, true, &cc))
        return 1;
    kvf_key K = KEY(0x55), K2 = KEY(0x56);
    fill(&f, 8, K);
    CHECK_STATUS(put1(&f, K, 8, 50), KVF_OK);
    char path[600];
    block_path(&f, K, path, sizeof path);
    flip_byte(path, 200);
    uint32_t s;
    size_t hits;
    kvf_cache_ticket t;
    CHECK_STATUS(kvf_cache_acquire(f.c, &K, 1, &s, &hits, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_ERR_CORRUPT);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK);
    CHECK_STATUS(kvf_cache_alloc(f.c, &s, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    fill(&f, s, K2);
    CHECK_STATUS(kvf_cache_commit(f.c, &K2, &s, 1, 50, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K2, 1), KVF_OK);
    CHECK_STATUS(kvf_cache_acquire(f.c, &K2, 1, &s, &hits, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K2, 1), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, K2), KVF_TIER_GPU);
    fx_done(&f);
    return 0;
}

static int test_gpu_acquire_duplicate_keys(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 2;
    cc.host.blocks = 2;
    if (fx_init(&f, 16, 2, false, &cc))
        return 1;
    kvf_key K = KEY(0x33);
    uint32_t s;
    kvf_cache_ticket t;
    CHECK_STATUS(kvf_cache_alloc(f.c, &s, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    fill(&f, s, K);
    CHECK_STATUS(kvf_cache_commit(f.c, &K, &s, 1, 50, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK);
    kvf_key kk[2] = {K, K};
    uint32_t ss[2];
    size_t hits;
    /* refused up front: a request names each block once */
    CHECK_STATUS(kvf_cache_acquire(f.c, kk, 2, ss, &hits, &t), KVF_ERR_INVALID);
    CHECK_EQ_INT(tier_of(&f, K), KVF_TIER_GPU);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_gpu_tier);
    RUN(test_gpu_tier_random);
    RUN(test_gpu_tier_acquire_race);
    RUN(test_gpu_get_after_failed_acquire);
    RUN(test_get_pin_released_after_acquire);
    RUN(test_gpu_failed_acquire_not_passed_down);
    RUN(test_gpu_stale_failure_forgotten);
    RUN(test_gpu_acquire_duplicate_keys);
    return TEST_RESULT();
}
