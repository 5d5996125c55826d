/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvf_cache_get_pools: a get of some pools from the host and disk tiers
 * writes those pools only; kvf_cache_wait_pool answers per pool before the
 * ticket is waited for; bad pool lists queue nothing; a block whose pool
 * is damaged on disk fails alone, naming the pool, and is dropped, never
 * served.
 */
#include "blockhdr.h"
#include "cache_fixture.h"

#include <stdatomic.h>

static int pool_is(fixture *f, int p, uint32_t slot, kvf_key key, bool moved)
{
    uint8_t *want = malloc(f->bytes[p]);
    if (moved)
        test_fill_random(want, f->bytes[p], KEY_SEED(key) * 2 + (uint64_t)p);
    else
        memset(want, POISON, f->bytes[p]);
    size_t off = test_mem_diff(prim(f, p, slot), want, f->bytes[p]);
    free(want);
    if (off != (size_t)-1)
        fprintf(stderr, "slot %u pool %d: %s differs at byte %zu\n", slot, p,
                moved ? "the block" : "the poison", off);
    return off != (size_t)-1;
}

static int test_get_one_pool(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 4;
    cc.disk.blocks = 64;
    CHECK(fx_init(&f, 32, 4, true, &cc) == 0);
    /* 12 blocks: 4 stay on host, the others go down to disk */
    kvf_key keys[12];
    uint32_t slots[12];
    for (uint32_t i = 0; i < 12; i++) {
        keys[i] = KEY(0x100 + i);
        slots[i] = i;
        fill(&f, i, keys[i]);
    }
    kvf_cache_ticket t;
    CHECK_STATUS(kvf_cache_put(f.c, keys, slots, 12, 50, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    int on_disk = 0;
    for (uint32_t i = 0; i < 12; i++)
        on_disk += tier_of(&f, keys[i]) == KVF_TIER_DISK;
    CHECK(on_disk >= 8);
    for (uint32_t i = 0; i < 12; i++) {
        poison(&f, 16 + i);
        slots[i] = 16 + i;
    }
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, 12, (uint32_t[]){1}, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool(f.c, t, 1), KVF_OK);
    CHECK_STATUS(kvf_cache_stream_wait_pool(f.c, t, 1, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool(f.c, t, 0), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool(f.c, t, 1), KVF_ERR_UNKNOWN_TICKET);
    for (uint32_t i = 0; i < 12; i++) {
        CHECK(pool_is(&f, 0, 16 + i, keys[i], false) == 0);
        CHECK(pool_is(&f, 1, 16 + i, keys[i], true) == 0);
    }
    /* then pool 0: every block whole */
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, 12, (uint32_t[]){0}, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool(f.c, t, 0), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    for (uint32_t i = 0; i < 12; i++)
        CHECK(expect(&f, 16 + i, keys[i]) == 0);
    /* a plain get's ticket answers per pool too */
    CHECK_STATUS(kvf_cache_get(f.c, keys, slots, 12, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool(f.c, t, 0), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool(f.c, t, 1), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool(f.c, t, 2), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    /* bad lists queue nothing */
    t.id = 0;
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, 12, (uint32_t[]){2}, 1, &t), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, 12, (uint32_t[]){1, 1}, 2, &t),
                 KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, 12, NULL, 0, &t), KVF_ERR_INVALID);
    /* longer than the pool count: a pool listed twice, whatever the length */
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, 12, (uint32_t[]){0, 1, 0}, 3, &t),
                 KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "pool 0 listed twice") != NULL);
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, 12, (uint32_t[]){1, 1}, SIZE_MAX, &t),
                 KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, 12, (uint32_t[]){1, 0, 4}, SIZE_MAX, &t),
                 KVF_ERR_RANGE);
    CHECK(t.id == 0);
    fx_done(&f);
    return 0;
}

/* Copies into pool 0 of one primary slot fail. */
static _Atomic(uint8_t *) fail_dst;
static kvf_status fail_into(const kvf__copy *cp)
{
    return cp->dst == atomic_load(&fail_dst) ? KVF_ERR_IO : KVF_OK;
}

/* A layer-wise get into a primary slot whose last write failed is lost
 * for that slot (its other pools hold the failed write's leftovers): a
 * verdict on the destination, not on the block, which stays cached and
 * is got whole into the slot afterwards. */
static int test_get_into_lost_slot(bool disk)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = disk ? 1 : 4;
    cc.disk.blocks = disk ? 8 : 0;
    CHECK(fx_init(&f, 16, 4, disk, &cc) == 0);
    kvf_key keys[2] = {KEY(0x700), KEY(0x701)};
    fill(&f, 0, keys[0]);
    fill(&f, 1, keys[1]);
    CHECK_STATUS(put1(&f, keys[0], 0, 50), KVF_OK);
    CHECK_STATUS(put1(&f, keys[1], 1, 50), KVF_OK);
    kvf_key key = keys[0];
    int tier = tier_of(&f, key);
    CHECK(tier == (disk ? KVF_TIER_DISK : KVF_TIER_HOST));
    /* the caller's slot 9: a whole get into it fails in pool 0 */
    atomic_store(&fail_dst, prim(&f, 0, 9));
    kvf__set_copy_hook(fail_into);
    CHECK_STATUS(get1(&f, key, 9), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    CHECK(tier_of(&f, key) == tier);
    /* pool 1 alone into it: lost there, and said so */
    uint32_t slot = 9;
    kvf_cache_ticket t;
    kvf_move_error err[1];
    size_t n_err = 0;
    CHECK_STATUS(kvf_cache_get_pools(f.c, &key, &slot, 1, (uint32_t[]){1}, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_errors(f.c, t, NULL, err, 1, &n_err), KVF_ERR_LOST);
    CHECK(n_err == 1 && strstr(err[0].message, "primary slot 9") != NULL);
    /* the block stays, whole */
    CHECK(tier_of(&f, key) == tier);
    poison(&f, 9);
    CHECK_STATUS(get1(&f, key, 9), KVF_OK);
    CHECK(expect(&f, 9, key) == 0);
    kvf_cache_stats st = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(f.c, &st), KVF_OK);
    CHECK(st.failures == 0);
    fx_done(&f);
    return 0;
}

/* Blocks on disk, one with its pool 1 damaged: a layer-wise get of both
 * pools fails that block alone (KVF_ERR_CORRUPT naming pool 1 and its
 * file), the cache drops it (never served again: a miss), the others
 * arrive whole, byte-exact. */
static int test_get_pools_damaged_pool(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 1;
    cc.disk.blocks = 16;
    CHECK(fx_init(&f, 16, 1, true, &cc) == 0);
    kvf_key keys[6];
    uint32_t slots[6];
    for (uint32_t i = 0; i < 6; i++) {
        keys[i] = KEY(0x900 + i);
        fill(&f, i, keys[i]);
        CHECK_STATUS(put1(&f, keys[i], i, 50), KVF_OK);
    }
    /* the oldest went down to disk; damage one there, in its pool 1 */
    kvf_key bad = keys[2];
    REQUIRE(tier_of(&f, bad) == KVF_TIER_DISK);
    char path[700];
    REQUIRE(block_path(&f, bad, path, sizeof path) == 0);
    flip_byte(path, (long)(kvf__block_prefix_bytes(2) + f.bytes[0] + 100));
    size_t n = 0;
    for (uint32_t i = 0; i < 6; i++)
        if (tier_of(&f, keys[i]) == KVF_TIER_DISK) {
            keys[n] = keys[i];
            slots[n] = 8 + (uint32_t)n;
            poison(&f, slots[n]);
            n++;
        }
    REQUIRE(n >= 3);
    kvf_cache_ticket t;
    CHECK_STATUS(kvf_cache_get_pools(f.c, keys, slots, n, (uint32_t[]){0, 1}, 2, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool(f.c, t, 1), KVF_ERR_CORRUPT);
    kvf_status per[6];
    kvf_move_error err[2];
    size_t n_err = 0;
    CHECK_STATUS(kvf_cache_wait_errors(f.c, t, per, err, 2, &n_err), KVF_ERR_CORRUPT);
    CHECK(n_err == 1 && strstr(err[0].message, "pool 1: checksum mismatch") != NULL &&
          strstr(err[0].message, ".kvf") != NULL);
    for (size_t i = 0; i < n; i++) {
        bool is_bad = kvf_key_eq(keys[i], bad);
        CHECK_STATUS(per[i], is_bad ? KVF_ERR_CORRUPT : KVF_OK);
        if (!is_bad)
            CHECK(expect(&f, slots[i], keys[i]) == 0);
    }
    /* dropped: a miss from now on */
    CHECK(tier_of(&f, bad) == -1);
    fx_done(&f);
    return 0;
}

int main(void)
{
    int fails = test_get_one_pool();
    fails += test_get_pools_damaged_pool();
    fails += test_get_into_lost_slot(false);
    fails += test_get_into_lost_slot(true);
    return fails ? 1 : 0;
}
