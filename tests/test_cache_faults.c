/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's faults: a file damaged behind its back, a tier whose
 * directory vanished, a failed offload leaving no entry; and bad input on
 * every public function.
 */
#include "cache_fixture.h"

/* A file damaged behind the cache's back fails its get with
 * KVF_ERR_CORRUPT, is removed, and nothing else is touched; a tier whose
 * directory vanished fails the blocks in it, which are then forgotten. */
static int test_faults(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk.blocks = 16;
    if (fx_init(&f, 8, 0, true, &cc))
        return 1;
    for (uint64_t k = 1; k <= 6; k++) {
        fill(&f, 0, k);
        CHECK_STATUS(put1(&f, k, 0, 50), KVF_OK);
    }
    char path[600];
    REQUIRE(block_path(&f, 3, path, sizeof path) == 0);
    flip_byte(path, 200);
    kvf_key keys[3] = {KEY(2), KEY(3), KEY(4)};
    uint32_t slots[3] = {5, 6, 7};
    kvf_cache_ticket t;
    kvf_status per[3];
    for (int i = 0; i < 3; i++)
        poison(&f, slots[i]);
    CHECK_STATUS(kvf_cache_get(f.c, keys, slots, 3, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, per), KVF_ERR_CORRUPT);
    CHECK_STATUS(per[0], KVF_OK);
    CHECK_STATUS(per[1], KVF_ERR_CORRUPT);
    CHECK_STATUS(per[2], KVF_OK);
    CHECK(expect(&f, 5, 2) == 0);
    CHECK(expect(&f, 7, 4) == 0);
    CHECK_EQ_INT(tier_of(&f, 3), -1);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.failures, 1);
    CHECK_EQ_INT(s.blocks[KVF_TIER_DISK], 5);
    /* the directory removed underneath */
    char ns[600];
    snprintf(ns, sizeof ns, "%s/cache", f.dir);
    test_rmtree(ns);
    CHECK_STATUS(get1(&f, 1, 5), KVF_ERR_NOT_FOUND);
    CHECK_EQ_INT(tier_of(&f, 1), -1);
    fill(&f, 0, 77);
    CHECK_STATUS(put1(&f, 77, 0, 50), KVF_ERR_IO);
    CHECK_EQ_INT(tier_of(&f, 77), -1);
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.failures, 3);
    CHECK_EQ_INT(s.blocks[KVF_TIER_DISK], 4);
    fx_done(&f);
    return 0;
}

/* An offload that fails (a copy fault) leaves no entry naming its slot: a
 * get of that key is refused or fails, never served from a stale slot. */
static int fail_all_copies;
static kvf_status copy_fault(const kvf__copy *c)
{
    (void)c;
    if (!__atomic_load_n(&fail_all_copies, __ATOMIC_ACQUIRE))
        return KVF_OK;
    usleep(50000); /* long enough for the get to queue behind it */
    return KVF_ERR_IO;
}

static int test_failed_put(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 2;
    if (fx_init(&f, 8, 2, false, &cc))
        return 1;
    fill(&f, 0, 41);
    CHECK_STATUS(put1(&f, 41, 0, 50), KVF_OK);
    fill(&f, 0, 42);
    CHECK_STATUS(put1(&f, 42, 0, 50), KVF_OK);
    kvf__set_copy_hook(copy_fault);
    __atomic_store_n(&fail_all_copies, 1, __ATOMIC_RELEASE);
    fill(&f, 0, 43); /* evicts 41, whose slot it then fails to write */
    kvf_key k43 = KEY(43);
    uint32_t s0 = 0;
    CHECK_STATUS(kvf_cache_put(f.c, &k43, &s0, 1, 50, NULL), KVF_OK);
    /* queued behind the failing put: fails with it, never reads 41's bytes */
    kvf_cache_ticket t;
    uint32_t s4 = 4;
    CHECK_STATUS(kvf_cache_get(f.c, &k43, &s4, 1, &t), KVF_OK);
    kvf_status st = kvf_cache_wait(f.c, t, NULL);
    CHECK(st == KVF_ERR_IO || st == KVF_ERR_LOST);
    __atomic_store_n(&fail_all_copies, 0, __ATOMIC_RELEASE);
    kvf__set_copy_hook(NULL);
    CHECK_EQ_INT(tier_of(&f, 43), -1);
    CHECK_EQ_INT(tier_of(&f, 41), -1);
    CHECK_EQ_INT(tier_of(&f, 42), KVF_TIER_HOST);
    poison(&f, 5);
    CHECK_STATUS(get1(&f, 42, 5), KVF_OK);
    CHECK(expect(&f, 5, 42) == 0);
    /* the slot is usable again */
    CHECK_STATUS(put1(&f, 43, 0, 50), KVF_OK);
    poison(&f, 5);
    CHECK_STATUS(get1(&f, 43, 5), KVF_OK);
    CHECK(expect(&f, 5, 43) == 0);
    fx_done(&f);
    return 0;
}

/* ---- bad input ----------------------------------------------------------------- */

static int test_bad_input(void)
{
    fixture f;
    memset(&f, 0, sizeof f);
    f.primary = 8;
    f.secondary = 4;
    fx_engine(&f, false);
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    kvf_cache *c = (kvf_cache *)&f; /* must stay untouched on failure */
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_ERR_INVALID); /* capacity 0 */
    CHECK_STR_HAS(kvf_last_error(), "capacity 0");
    CHECK(c == (kvf_cache *)&f);
    cc.host.blocks = 5;
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "4 secondary slots");
    cc.host.blocks = 4;
    cc.disk.blocks = 10;
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "file tier");
    cc.disk.blocks = 0;
    cc.offload_min_priority = 500;
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_ERR_RANGE);
    cc.offload_min_priority = 0;
    kvf_cache_config tiny = cc;
    tiny.struct_size = 4;
    CHECK_STATUS(kvf_cache_create(f.e, &tiny, &c), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_create(NULL, &cc, &c), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    kvf_cache_destroy(NULL);

    kvf_key k = KEY(5), zero = KEY(0);
    uint32_t s = 0, big = 8;
    kvf_cache_ticket t = {0};
    CHECK_STATUS(kvf_cache_put(f.c, &zero, &s, 1, 50, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_put(f.c, &k, &big, 1, 50, &t), KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "primary slot 8");
    CHECK_STATUS(kvf_cache_put(f.c, &k, &s, 1, 101, &t), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_cache_put(f.c, &k, &s, 0, 50, &t), KVF_ERR_INVALID);
    CHECK(t.id == 0);
    /* unknown keys: refused whole, named */
    kvf_key two[2] = {KEY(5), KEY(6)};
    uint32_t ss[2] = {1, 2};
    fill(&f, 0, 5);
    CHECK_STATUS(put1(&f, 5, 0, 50), KVF_OK);
    CHECK_STATUS(kvf_cache_get(f.c, two, ss, 2, &t), KVF_ERR_NOT_FOUND);
    CHECK_STR_HAS(kvf_last_error(), "00000000000000000000000000000006");
    CHECK_STATUS(kvf_cache_get(f.c, &k, &s, 1, NULL), KVF_ERR_INVALID);
    kvf_key same[2] = {KEY(5), KEY(5)};
    uint32_t dup[2] = {3, 3};
    CHECK_STATUS(kvf_cache_get(f.c, same, dup, 2, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "primary slot 3");
    /* a key twice in one put: refused whole (as kvf_cache_commit), named
     * with both its indexes */
    kvf_key again[3] = {KEY(5), KEY(7), KEY(7)};
    uint32_t from[3] = {0, 1, 1};
    fill(&f, 1, 7);
    kvf_status per[3];
    t = (kvf_cache_ticket){0};
    CHECK_STATUS(kvf_cache_put(f.c, again, from, 3, 50, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "00000000000000000000000000000007");
    CHECK_STR_HAS(kvf_last_error(), "keys 1 and 2");
    CHECK(t.id == 0);
    size_t found = 9;
    CHECK_STATUS(kvf_cache_lookup(f.c, again + 1, 1, &found, NULL), KVF_OK);
    CHECK_EQ_INT(found, 0);
    /* a key cached before: stored once, counted */
    CHECK_STATUS(kvf_cache_put(f.c, again, from, 2, 50, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, per), KVF_OK);
    kvf_cache_stats st = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(f.c, &st), KVF_OK);
    CHECK_EQ_INT(st.put_duplicates, 1);
    CHECK_EQ_INT(st.blocks[KVF_TIER_HOST], 2);
    /* tickets */
    CHECK_STATUS(kvf_cache_wait(f.c, (kvf_cache_ticket){12345}, NULL), KVF_ERR_UNKNOWN_TICKET);
    CHECK_STATUS(kvf_cache_poll(f.c, (kvf_cache_ticket){0}, NULL), KVF_ERR_UNKNOWN_TICKET);
    /* a short stats struct gets its prefix */
    struct {
        size_t struct_size;
        uint64_t blocks[KVF_TIER_COUNT];
    } old = {sizeof old, {0}};
    CHECK_STATUS(kvf_cache_stats_get(f.c, (kvf_cache_stats *)&old), KVF_OK);
    CHECK_EQ_INT(old.blocks[KVF_TIER_HOST], 2);
    size_t hits = 9;
    CHECK_STATUS(kvf_cache_lookup(f.c, NULL, 0, &hits, NULL), KVF_OK);
    CHECK_EQ_INT(hits, 0);
    CHECK_STATUS(kvf_cache_lookup(f.c, &k, 1, NULL, NULL), KVF_ERR_INVALID);
    CHECK(strcmp(kvf_tier_name(KVF_TIER_DISK), "disk") == 0);
    CHECK(strcmp(kvf_tier_name((kvf_tier)9), "?") == 0);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_faults);
    RUN(test_failed_put);
    RUN(test_bad_input);
    return TEST_RESULT();
}
