/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's waits of every kind racing on the same tickets:
 * kvf_cache_wait, kvf_cache_wait_errors, kvf_cache_poll,
 * kvf_cache_poll_errors, kvf_cache_wait_pool and kvf_cache_stream_wait_pool
 * from eight threads at once (racing_waits.h), while untracked engine
 * batches of the other outcome keep recycling the engine's batches. Gets
 * alternate between all blocks good and all failing (a whole get whose
 * destination copies fail: KVF_ERR_IO, the blocks kept). Each answer is
 * its own call's exact status, or KVF_ERR_STATE (another thread waits for
 * it) or KVF_ERR_UNKNOWN_TICKET (another thread retired it); exactly one
 * thread retires each ticket.
 */
#include "cache_fixture.h"
#include "racing_waits.h"

enum { ROUNDS = 2000, BLOCKS = 6, FAIL_SLOT = 16 };

/* Pool 0 of primary slots FAIL_SLOT .. FAIL_SLOT + BLOCKS - 1: every copy
 * into them fails. */
static _Atomic(uint8_t *) fail_lo, fail_hi;
static kvf_status fail_into(const kvf__copy *c)
{
    const uint8_t *d = c->dst;
    return d >= atomic_load(&fail_lo) && d < atomic_load(&fail_hi) ? KVF_ERR_IO : KVF_OK;
}

static kvf_status cache_wait(void *ctx, rw_kind k, uint64_t id, kvf_status *per, size_t *n_errors)
{
    kvf_cache *c = ctx;
    kvf_cache_ticket t = {id};
    kvf_move_error errors[BLOCKS];
    switch (k) {
    case RW_WAIT:
        return kvf_cache_wait(c, t, per);
    case RW_WAIT_ERRORS:
        return kvf_cache_wait_errors(c, t, per, errors, BLOCKS, n_errors);
    case RW_POLL:
        return kvf_cache_poll(c, t, per);
    case RW_POLL_ERRORS:
        return kvf_cache_poll_errors(c, t, per, errors, BLOCKS, n_errors);
    case RW_POOL_A:
    case RW_POOL_B:
        return kvf_cache_wait_pool(c, t, k == RW_POOL_A ? 0 : 1);
    default:
        return kvf_cache_stream_wait_pool(c, t, k == RW_STREAM_POOL_A ? 0 : 1, NULL);
    }
}

/* Another thread's wait holds the call, or retired it. */
static bool someone_else(kvf_status st)
{
    return st == KVF_ERR_STATE || st == KVF_ERR_UNKNOWN_TICKET;
}

static const rw_ops cache_ops = {cache_wait,
                                 someone_else,
                                 {"kvf_cache_wait", "kvf_cache_wait_errors", "kvf_cache_poll",
                                  "kvf_cache_poll_errors", "kvf_cache_wait_pool",
                                  "kvf_cache_wait_pool", "kvf_cache_stream_wait_pool",
                                  "kvf_cache_stream_wait_pool"}};

static int test_racing_waits(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 16;
    CHECK(fx_init(&f, 32, 16, false, &cc) == 0);
    kvf_key keys[BLOCKS];
    uint32_t slots[BLOCKS];
    for (uint32_t i = 0; i < BLOCKS; i++) {
        keys[i] = KEY(0x900 + i);
        slots[i] = i;
        fill(&f, i, keys[i]);
    }
    kvf_cache_ticket t;
    CHECK_STATUS(kvf_cache_put(f.c, keys, slots, BLOCKS, 50, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    atomic_store(&fail_lo, prim(&f, 0, FAIL_SLOT));
    atomic_store(&fail_hi, prim(&f, 0, FAIL_SLOT + BLOCKS));
    kvf__set_copy_hook(fail_into);

    rw_race *x = malloc(sizeof *x);
    REQUIRE(x && rw_start(x, &cache_ops, f.c, BLOCKS, ROUNDS) == 0);
    for (int r = 0; r < ROUNDS; r++) {
        rw_room(x, r);
        bool good = r % 2 == 0;
        for (uint32_t i = 0; i < BLOCKS; i++)
            slots[i] = (good ? 8 : FAIL_SLOT) + i;
        kvf_status st =
            good ? kvf_cache_get_pools(f.c, keys, slots, BLOCKS, (uint32_t[]){1, 0}, 2, &t)
                 : kvf_cache_get(f.c, keys, slots, BLOCKS, &t);
        REQUIRE(st == KVF_OK);
        rw_publish(x, r, good ? KVF_OK : KVF_ERR_IO, t.id);
        /* an untracked engine batch of the other outcome, reusing the
         * engine's batches as soon as they retire: a copy of primary slot
         * 0 into a slot whose copies fail, or into one whose succeed */
        kvf_move m = {0, good ? FAIL_SLOT : 24, 0};
        REQUIRE(kvf_copy(f.e, &m, 1, NULL) == KVF_OK);
    }
    CHECK_EQ_INT(rw_finish(x), 0);
    free(x);
    kvf__set_copy_hook(NULL);
    /* the failed gets were about their destinations: every block stays,
     * and the good gets' blocks arrived whole */
    for (uint32_t i = 0; i < BLOCKS; i++) {
        CHECK(tier_of(&f, keys[i]) == KVF_TIER_HOST);
        CHECK(expect(&f, 8 + i, keys[i]) == 0);
    }
    fx_done(&f);
    return 0;
}

int main(void)
{
    kvf_log_set_level(KVF_LOG_ERROR); /* the untracked failures' warnings */
    int fails = test_racing_waits();
    return fails || test_result() ? 1 : 0;
}
