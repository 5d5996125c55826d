/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Waits of every kind racing on the same tickets: kvf_wait,
 * kvf_wait_errors, kvf_poll, kvf_poll_errors, kvf_wait_pool and
 * kvf_stream_wait_pool from eight threads at once (racing_waits.h), while
 * untracked batches of the other outcome keep recycling the engine's
 * batches. Each answer is the exact status of its own batch, or, once
 * another thread retired the ticket, KVF_ERR_UNKNOWN_TICKET; exactly one
 * thread retires each ticket. Batches alternate between all moves good
 * and all moves failing (a block never stored: KVF_ERR_NOT_FOUND), so an
 * answer read from a batch that was retired and reused shows.
 */
#include "engine_fixture.h"
#include "racing_waits.h"

enum { ROUNDS = 3000, MOVES = 6 };

static kvf_status engine_wait(void *ctx, rw_kind k, uint64_t id, kvf_status *per, size_t *n_errors)
{
    kvf_engine *e = ctx;
    kvf_ticket t = {id};
    kvf_move_error errors[MOVES];
    switch (k) {
    case RW_WAIT:
        return kvf_wait(e, t, per);
    case RW_WAIT_ERRORS:
        return kvf_wait_errors(e, t, per, errors, MOVES, n_errors);
    case RW_POLL:
        return kvf_poll(e, t, per);
    case RW_POLL_ERRORS:
        return kvf_poll_errors(e, t, per, errors, MOVES, n_errors);
    case RW_POOL_A:
    case RW_POOL_B:
        return kvf_wait_pool(e, t, k == RW_POOL_A ? 0 : 2);
    default:
        return kvf_stream_wait_pool(e, t, k == RW_STREAM_POOL_A ? 0 : 2, NULL);
    }
}

static bool retired_elsewhere(kvf_status st)
{
    return st == KVF_ERR_UNKNOWN_TICKET;
}

static const rw_ops engine_ops = {engine_wait,
                                  retired_elsewhere,
                                  {"kvf_wait", "kvf_wait_errors", "kvf_poll", "kvf_poll_errors",
                                   "kvf_wait_pool", "kvf_wait_pool", "kvf_stream_wait_pool",
                                   "kvf_stream_wait_pool"}};

static int test_racing_waits(void)
{
    fixture f;
    CHECK(fx_init(&f, true, 32) == 0);
    /* secondary slots 0..MOVES-1 hold good blocks */
    kvf_move mv[MOVES];
    for (uint32_t i = 0; i < MOVES; i++) {
        fill_block(&f, i, 40 + i);
        mv[i] = (kvf_move){i, i, 0};
    }
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, mv, MOVES, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);

    rw_race *x = malloc(sizeof *x);
    REQUIRE(x && rw_start(x, &engine_ops, f.e, MOVES, ROUNDS) == 0);
    uint64_t rng = 7;
    for (int r = 0; r < ROUNDS; r++) {
        rw_room(x, r);
        bool good = r % 2 == 0;
        for (uint32_t i = 0; i < MOVES; i++)
            mv[i] = good ? (kvf_move){i, 8 + i, 0}
                         : FROM_KEY(0x77000000ull + (uint64_t)r * MOVES + i, 16 + i);
        kvf_status st =
            good ? kvf_onboard_pools(f.e, KVF_TIER_HOST, (uint32_t[]){2, 0, 1}, 3, mv, MOVES, &t)
                 : kvf_onboard(f.e, KVF_TIER_DISK, mv, MOVES, &t);
        REQUIRE(st == KVF_OK);
        rw_publish(x, r, good ? KVF_OK : KVF_ERR_NOT_FOUND, t.id);
        /* untracked batches of the other outcome: the retired batches are
         * reused at once */
        for (uint32_t k = 0; k < 2; k++) {
            kvf_move m = good ? FROM_KEY(0x78000000ull + test_xorshift64(&rng) % 4096, 24 + k)
                              : (kvf_move){k, 24 + k, 0};
            REQUIRE(kvf_onboard(f.e, good ? KVF_TIER_DISK : KVF_TIER_HOST, &m, 1, NULL) == KVF_OK);
        }
    }
    CHECK_EQ_INT(rw_finish(x), 0);
    free(x);
    /* the good rounds' blocks arrived whole */
    for (uint32_t i = 0; i < MOVES; i++)
        CHECK(expect_block(&f, 8 + i, 40 + i, 0) == 0);
    fx_done(&f);
    return 0;
}

int main(void)
{
    kvf_log_set_level(KVF_LOG_ERROR); /* the untracked failures' warnings */
    int fails = test_racing_waits();
    return fails || test_result() ? 1 : 0;
}
