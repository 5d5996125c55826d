/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-wise batches on the host backend: kvf_onboard_pools and
 * kvf_offload_pools move the listed pools only (the others keep their
 * poison), from the host and disk tiers; kvf_wait_pool and
 * kvf_stream_wait_pool answer per pool without retiring the ticket; a
 * partial write of a slot whose last write failed is lost too; bad input
 * is refused naming what is wrong.
 */
#include "engine_fixture.h"

/* Pool p of primary slot s holds the block of `tag` (moved == true) or
 * poison. */
static int expect_pool(fixture *f, uint32_t p, uint32_t s, uint64_t tag, bool moved)
{
    uint8_t *want = malloc(f->bytes[p]);
    if (moved)
        test_fill_random(want, f->bytes[p], tag * 31 + p + 1);
    else
        memset(want, POISON, f->bytes[p]);
    int bad = memcmp(slot(f, p, KVF_LEVEL_PRIMARY, s), want, f->bytes[p]) != 0;
    if (bad)
        fprintf(stderr, "slot %u pool %u: %s\n", s, p, moved ? "not the block" : "not poison");
    free(want);
    return bad;
}

/* Blocks tagged 100 + s offloaded whole from primary slot s to secondary
 * slot s (and to disk as key 1000 + s when `disk`), then poisoned. */
static int stage_blocks(fixture *f, uint32_t n, bool disk)
{
    kvf_move *mv = calloc(n, sizeof *mv);
    for (uint32_t s = 0; s < n; s++) {
        fill_block(f, s, 100 + s);
        mv[s] = (kvf_move){s, s, 0};
    }
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f->e, KVF_TIER_HOST, mv, n, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f->e, t, NULL), KVF_OK);
    if (disk) {
        for (uint32_t s = 0; s < n; s++)
            mv[s] = TO_KEY(s, 1000 + s);
        CHECK_STATUS(kvf_offload(f->e, KVF_TIER_DISK, mv, n, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(f->e, t, NULL), KVF_OK);
    }
    for (uint32_t s = 0; s < n; s++)
        poison_block(f, s);
    free(mv);
    return 0;
}

/* Onboards pools {2, 0} of 24 blocks (in a random order of slots) from
 * the host tier or disk: pool 1 keeps its poison. */
static int test_onboard_some_pools(bool disk)
{
    fixture f;
    CHECK(fx_init(&f, disk, 32) == 0);
    CHECK(stage_blocks(&f, 24, disk) == 0);
    kvf_move mv[24];
    for (uint32_t s = 0; s < 24; s++)
        mv[s] = test_move(disk ? KVF_TIER_DISK : KVF_TIER_HOST, false,
                          disk ? 1000 + (23 - s) : 23 - s, 23 - s, 0);
    const uint32_t pools[2] = {2, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_onboard_pools(f.e, disk ? KVF_TIER_DISK : KVF_TIER_HOST, pools, 2, mv, 24, &t),
                 KVF_OK);
    /* per pool, in any order, before the ticket is retired */
    CHECK_STATUS(kvf_wait_pool(f.e, t, 0), KVF_OK);
    CHECK_STATUS(kvf_stream_wait_pool(f.e, t, 2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait_pool(f.e, t, 1), KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "pool 1 is not one the batch moves") != NULL);
    CHECK_STATUS(kvf_wait_pool(f.e, t, 7), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait_pool(f.e, t, 0), KVF_ERR_UNKNOWN_TICKET);
    for (uint32_t s = 0; s < 24; s++) {
        CHECK(expect_pool(&f, 0, s, 100 + s, true) == 0);
        CHECK(expect_pool(&f, 1, s, 100 + s, false) == 0);
        CHECK(expect_pool(&f, 2, s, 100 + s, true) == 0);
    }
    /* then the missing pool alone completes every block */
    CHECK_STATUS(kvf_onboard_pools(f.e, disk ? KVF_TIER_DISK : KVF_TIER_HOST, (uint32_t[]){1}, 1,
                                   mv, 24, &t),
                 KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    for (uint32_t s = 0; s < 24; s++)
        CHECK(expect_block(&f, s, 100 + s, 0) == 0);
    fx_done(&f);
    return 0;
}

/* A layer at a time to the host tier, each pool from a different block:
 * the secondary slot ends with each pool's own block. */
static int test_offload_layer_by_layer(void)
{
    fixture f;
    CHECK(fx_init(&f, false, 8) == 0);
    kvf_move mv[4];
    for (uint32_t p = 0; p < f.pools; p++) {
        for (uint32_t s = 0; s < 4; s++) {
            fill_block(&f, s, 10 * p + s);
            mv[s] = (kvf_move){s, 4 + s, 0};
        }
        kvf_ticket t;
        CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, &p, 1, mv, 4, &t), KVF_OK);
        CHECK_STATUS(kvf_wait_pool(f.e, t, p), KVF_OK);
        CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    }
    for (uint32_t s = 0; s < 4; s++) {
        poison_block(&f, s);
        mv[s] = (kvf_move){4 + s, s, 0};
    }
    kvf_ticket t;
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, mv, 4, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    for (uint32_t s = 0; s < 4; s++)
        for (uint32_t p = 0; p < f.pools; p++)
            CHECK(expect_pool(&f, p, s, 10 * p + s, true) == 0);
    fx_done(&f);
    return 0;
}

/* Whether the disk tier holds a file for `key`. */
static bool on_disk(fixture *f, uint64_t key)
{
    char path[700];
    snprintf(path, sizeof path, "%s/test/" KVF_KEY_FMT ".kvf", f->dir, KVF_KEY_ARGS(TKEY(key)));
    return access(path, F_OK) == 0;
}

/* A secondary slot never written, then one pool of it: it holds no whole
 * block. A whole onboard finds none (the primary slot untouched), nor a
 * read of a pool never written; a demote stores nothing. The pool written
 * reads back alone; once every pool is written the block is whole. */
static int test_never_written_pools(void)
{
    fixture f;
    fx_remote = "mem://never-written-pools";
    CHECK(fx_init(&f, true, 8) == 0);
    fx_remote = NULL;
    fill_block(&f, 0, 21);
    kvf_move m = {0, 3, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, (uint32_t[]){0}, 1, &m, 1, &t),
                 KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    poison_block(&f, 1);
    m = (kvf_move){3, 1, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_NOT_FOUND);
    CHECK(strstr(kvf_last_error(), "secondary slot 3: pool 1 was never written (1 of 3") != NULL);
    for (uint32_t p = 0; p < f.pools; p++)
        CHECK(expect_pool(&f, p, 1, 21, false) == 0);
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){0, 2}, 2, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_NOT_FOUND);
    CHECK(strstr(kvf_last_error(), "pool 2 was never written") != NULL);
    /* nothing partial goes down a tier */
    m = TO_KEY(3, 0x300);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_NOT_FOUND);
    CHECK(strstr(kvf_last_error(), "secondary slot 3: pool 1 was never written") != NULL);
    CHECK(!on_disk(&f, 0x300));
    m = FROM_KEY(0x300, 1);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_NOT_FOUND);
    m = TO_KEY(3, 0x301);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_REMOTE, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_NOT_FOUND);
    m = FROM_KEY(0x301, 1);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_REMOTE, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_NOT_FOUND);
    /* the pool written reads back alone, byte for byte (into a slot
     * whose last write did not fail: primary slot 1's did) */
    poison_block(&f, 4);
    m = (kvf_move){3, 4, 0};
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){0}, 1, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(expect_pool(&f, 0, 4, 21, true) == 0);
    CHECK(expect_pool(&f, 1, 4, 21, false) == 0);
    /* the other pools, one batch each (pool 1 twice): then the block is
     * whole, and goes down and back whole */
    m = (kvf_move){0, 3, 0};
    for (uint32_t p = 1; p < f.pools; p++) {
        CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, &p, 1, &m, 1, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
        CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, (uint32_t[]){1}, 1, &m, 1, &t),
                     KVF_OK);
        CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    }
    m = TO_KEY(3, 0x300);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(on_disk(&f, 0x300));
    m = TO_KEY(3, 0x301);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_REMOTE, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    poison_block(&f, 5);
    m = FROM_KEY(0x301, 5);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_REMOTE, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(expect_block(&f, 5, 21, 0) == 0);
    poison_block(&f, 1);
    m = (kvf_move){3, 1, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(expect_block(&f, 1, 21, 0) == 0);
    poison_block(&f, 2);
    m = FROM_KEY(0x300, 2);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(expect_block(&f, 2, 21, 0) == 0);
    fx_done(&f);
    return 0;
}

/* A never-written slot whose one written pool came from a failed move:
 * lost, for a whole read and a demote alike; nothing stored. */
static int test_pool_of_failed_write(void)
{
    fixture f;
    CHECK(fx_init(&f, true, 8) == 0);
    fill_block(&f, 0, 22);
    fail_dst = slot(&f, 2, KVF_LEVEL_SECONDARY, 6);
    kvf__set_copy_hook(fail_copy);
    kvf_move m = {0, 6, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, (uint32_t[]){2}, 1, &m, 1, &t),
                 KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    m = (kvf_move){6, 1, 0};
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){2}, 1, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_LOST);
    CHECK(strstr(kvf_last_error(), "secondary slot 6, pool 2: the move of batch") != NULL);
    m = TO_KEY(6, 0x600);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
    CHECK(kvf_wait(f.e, t, NULL) != KVF_OK);
    CHECK(!on_disk(&f, 0x600));
    fx_done(&f);
    return 0;
}

/* The whole list is the whole block, in the caller's order, to any tier. */
static int test_every_pool_listed(void)
{
    fixture f;
    CHECK(fx_init(&f, true, 8) == 0);
    fill_block(&f, 0, 5);
    const uint32_t all[3] = {1, 2, 0};
    kvf_move m = TO_KEY(0, 77);
    kvf_ticket t;
    CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_DISK, all, 3, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    poison_block(&f, 0);
    m = FROM_KEY(77, 0);
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_DISK, all, 3, &m, 1, &t), KVF_OK);
    for (uint32_t p = 0; p < 3; p++)
        CHECK_STATUS(kvf_wait_pool(f.e, t, p), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(expect_block(&f, 0, 5, 0) == 0);
    fx_done(&f);
    return 0;
}

static int test_bad_pool_lists(void)
{
    fixture f;
    CHECK(fx_init(&f, true, 8) == 0);
    kvf_move m = {0, 1, 0};
    kvf_ticket t = {0};
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){0, 3}, 2, &m, 1, &t),
                 KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "pools[1]: pool 3 out of range (3 pools)") != NULL);
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){1, 1}, 2, &m, 1, &t),
                 KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "pool 1 listed twice") != NULL);
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){1}, 0, &m, 1, &t),
                 KVF_ERR_INVALID);
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, NULL, 2, &m, 1, &t), KVF_ERR_INVALID);
    /* a list longer than the pool count holds a pool twice (or one out of
     * range): said so, whatever the length claimed, read no further than
     * the pool count + 1 and allocated for never (SIZE_MAX included) */
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){0, 1, 2, 0}, 4, &m, 1, &t),
                 KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "pools[3]: pool 0 listed twice") != NULL);
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){2, 2}, 5, &m, 1, &t),
                 KVF_ERR_INVALID);
    CHECK_STATUS(
        kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){0, 1, 2, 1}, SIZE_MAX, &m, 1, &t),
        KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "pools[3]: pool 1 listed twice") != NULL);
    CHECK_STATUS(
        kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, (uint32_t[]){1, 0, 2, 9}, SIZE_MAX, &m, 1, &t),
        KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "pools[3]: pool 9 out of range") != NULL);
    CHECK_STATUS(
        kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, (uint32_t[]){1, 1}, SIZE_MAX, &m, 1, &t),
        KVF_ERR_INVALID);
    CHECK_STATUS(kvf_onboard_pools(f.e, KVF_TIER_GPU, (uint32_t[]){0}, 1, &m, 1, &t),
                 KVF_ERR_INVALID);
    m = TO_KEY(0, 42);
    CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_DISK, (uint32_t[]){0}, 1, &m, 1, &t),
                 KVF_ERR_UNSUPPORTED);
    CHECK(strstr(kvf_last_error(), "a stored block holds every pool") != NULL);
    /* the host backend has no stream to order after */
    int dummy;
    CHECK_STATUS(kvf_offload_pools(f.e, &dummy, KVF_TIER_HOST, (uint32_t[]){0}, 1, &m, 1, &t),
                 KVF_ERR_UNSUPPORTED);
    /* nothing was queued by any of them */
    CHECK(t.id == 0);
    CHECK_STATUS(kvf_wait_pool(f.e, (kvf_ticket){12345}, 0), KVF_ERR_UNKNOWN_TICKET);
    CHECK_STATUS(kvf_wait_pool(NULL, (kvf_ticket){1}, 0), KVF_ERR_INVALID);
    /* a batch not naming its pools answers for each of them */
    fill_block(&f, 0, 9);
    m = (kvf_move){0, 3, 0};
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait_pool(f.e, t, 2), KVF_OK);
    CHECK_STATUS(kvf_wait_pool(f.e, t, 3), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    fx_done(&f);
    return 0;
}

/* A secondary slot whose whole write failed: writing one pool of it later
 * must not make it readable (its other pools hold the failed write's
 * leftovers), so that write is lost too; a whole write heals it. */
static int test_partial_write_of_lost_slot(void)
{
    fixture f;
    CHECK(fx_init(&f, false, 8) == 0);
    fill_block(&f, 0, 1);
    fail_dst = slot(&f, 1, KVF_LEVEL_SECONDARY, 5);
    kvf__set_copy_hook(fail_copy);
    kvf_move m = {0, 5, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    /* the next partial write is queued while nothing is pending, and one
     * queued behind a failing write: both lost */
    CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, (uint32_t[]){0}, 1, &m, 1, &t),
                 KVF_OK);
    CHECK_STATUS(kvf_wait_pool(f.e, t, 0), KVF_ERR_LOST);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_LOST);
    CHECK(strstr(kvf_last_error(), "writes only 1 of its pools") != NULL);
    m = (kvf_move){5, 1, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_LOST);
    /* every pool listed is a whole write: the slot is good again */
    m = (kvf_move){0, 5, 0};
    CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, (uint32_t[]){2, 0, 1}, 3, &m, 1, &t),
                 KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    poison_block(&f, 1);
    m = (kvf_move){5, 1, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(expect_block(&f, 1, 1, 0) == 0);
    fx_done(&f);
    return 0;
}

/* A partial write in fewer tokens: the slot holds the fewer of its writes'
 * tokens, so a read of more is refused rather than mix two blocks. */
static int test_partial_tokens(void)
{
    fixture f;
    CHECK(fx_init(&f, false, 8) == 0);
    fill_block(&f, 0, 3);
    kvf_move m = {0, 2, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    m.tokens = 8;
    CHECK_STATUS(kvf_offload_pools(f.e, NULL, KVF_TIER_HOST, (uint32_t[]){1}, 1, &m, 1, &t),
                 KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    m = (kvf_move){2, 1, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_RANGE);
    m.tokens = 8;
    poison_block(&f, 1);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(expect_block(&f, 1, 3, 8) == 0);
    fx_done(&f);
    return 0;
}

int main(void)
{
    int fails = 0;
    fails += test_onboard_some_pools(false);
    fails += test_onboard_some_pools(true);
    fails += test_offload_layer_by_layer();
    fails += test_every_pool_listed();
    fails += test_bad_pool_lists();
    fails += test_partial_write_of_lost_slot();
    fails += test_partial_tokens();
    fails += test_never_written_pools();
    fails += test_pool_of_failed_write();
    return fails ? 1 : 0;
}
