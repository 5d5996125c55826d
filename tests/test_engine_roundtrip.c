/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine on the host backend: round trips through secondary slots and
 * files (whole and partial blocks, random order), demote and promote,
 * copies between primary slots, caller-owned memory, and TensorRT-LLM's
 * defects 1 and 4 (DESIGN.md section 2) as scenarios: an onboard after a
 * step's sync, namespaces of two ranks and a restart.
 */
#include "engine_fixture.h"

/* ---- round trips ----------------------------------------------------------- */

static int round_trip(kvf_tier tier, uint32_t tokens)
{
    fixture f;
    if (fx_init(&f, tier == KVF_TIER_DISK, 64))
        return 1;
    enum { N = 40 };
    kvf_move off[N], on[N];
    uint32_t perm[N];
    test_permutation(perm, N, 77 + tokens);
    for (uint32_t i = 0; i < N; i++) {
        fill_block(&f, i, 1000 + i);
        off[i] = test_move(tier, true, i,
                           tier == KVF_TIER_DISK ? 0xabc00000ull + perm[i] : 63 - perm[i], tokens);
        on[i] =
            test_move(tier, false, tier == KVF_TIER_DISK ? 0xabc00000ull + perm[i] : 63 - perm[i],
                      (i + 7) % N, tokens);
    }
    kvf_ticket t;
    kvf_status per[N];
    CHECK_STATUS(kvf_offload(f.e, tier, off, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, per), KVF_OK);
    for (int i = 0; i < N; i++)
        CHECK_STATUS(per[i], KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_UNKNOWN_TICKET);
    for (uint32_t i = 0; i < N; i++)
        poison_block(&f, i);
    CHECK_STATUS(kvf_onboard(f.e, tier, on, N, &t), KVF_OK);
    kvf_status st;
    while ((st = kvf_poll(f.e, t, per)) == KVF_INPROGRESS)
        usleep(100);
    CHECK_STATUS(st, KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        if (expect_block(&f, (i + 7) % N, 1000 + i, tokens))
            return 1;
    fx_done(&f);
    return 0;
}

static int test_host_whole(void)
{
    return round_trip(KVF_TIER_HOST, 0);
}
static int test_host_partial(void)
{
    return round_trip(KVF_TIER_HOST, 4) || round_trip(KVF_TIER_HOST, 15);
}
static int test_file_whole(void)
{
    return round_trip(KVF_TIER_DISK, 0);
}
static int test_file_partial(void)
{
    return round_trip(KVF_TIER_DISK, 6) || round_trip(KVF_TIER_DISK, 1 * 2);
}

/* A partial onboard of a block stored whole, and a refused one of more
 * tokens than were stored. */
static int test_partial_of_stored(void)
{
    for (int tier = 0; tier < 2; tier++) {
        fixture f;
        if (fx_init(&f, tier == KVF_TIER_DISK, 8))
            return 1;
        fill_block(&f, 0, 5);
        fill_block(&f, 1, 6);
        CHECK_STATUS(run1(f.e, true, (kvf_tier)tier, 0, 3, 0), KVF_OK);
        CHECK_STATUS(run1(f.e, true, (kvf_tier)tier, 1, 4, 8), KVF_OK);
        poison_block(&f, 2);
        CHECK_STATUS(run1(f.e, false, (kvf_tier)tier, 3, 2, 10), KVF_OK);
        if (expect_block(&f, 2, 5, 10))
            return 1;
        poison_block(&f, 2);
        CHECK_STATUS(run1(f.e, false, (kvf_tier)tier, 4, 2, 6), KVF_OK);
        if (expect_block(&f, 2, 6, 6))
            return 1;
        /* 8 tokens stored, 12 asked: refused, and the slot is not touched */
        poison_block(&f, 2);
        CHECK_STATUS(run1(f.e, false, (kvf_tier)tier, 4, 2, 12), KVF_ERR_RANGE);
        CHECK_STATUS(run1(f.e, false, (kvf_tier)tier, 4, 2, 0), KVF_ERR_RANGE);
        CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 2)[0] == POISON);
        fx_done(&f);
    }
    return 0;
}

/* Blocks pushed from the host tier down to files without the primary slots
 * (demote), and files read into the host tier (promote), queued back to
 * back so each step depends on the previous one: offload -> demote ->
 * promote into other secondary slots -> onboard, checked byte for byte. */
static int test_demote_promote(void)
{
    fixture f;
    if (fx_init(&f, true, 64))
        return 1;
    enum { N = 24 };
    kvf_move off[N], dem[N], pro[N], on[N];
    uint32_t perm[N];
    test_permutation(perm, N, 4242);
    uint32_t tokens = 6; /* partial: the stored token count travels along */
    for (uint32_t i = 0; i < N; i++) {
        fill_block(&f, i, 500 + i);
        off[i] = (kvf_move){i, 63 - perm[i], tokens};
        dem[i] = test_move(KVF_TIER_DISK, true, 63 - perm[i], 0x5eed0000ull + i, tokens);
        pro[i] = test_move(KVF_TIER_DISK, false, 0x5eed0000ull + i, perm[i], tokens);
        on[i] = (kvf_move){perm[i], (i + 5) % N, 0};
    }
    kvf_ticket t[4];
    kvf_status per[N];
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, off, N, &t[0]), KVF_OK);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_DISK, dem, N, &t[1]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[0], NULL), KVF_OK); /* the primaries are read */
    /* the demoted secondary slots may be overwritten at once: write after read */
    for (uint32_t i = 0; i < N; i++)
        fill_block(&f, i, 9000 + i);
    kvf_move clobber[N];
    for (uint32_t i = 0; i < N; i++)
        clobber[i] = (kvf_move){i, 63 - perm[i], 0};
    kvf_ticket tc;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, clobber, N, &tc), KVF_OK);
    CHECK_STATUS(kvf_promote(f.e, KVF_TIER_DISK, pro, N, &t[2]), KVF_OK);
    for (int k = 1; k < 3; k++) {
        CHECK_STATUS(kvf_wait(f.e, t[k], per), KVF_OK);
        for (int i = 0; i < N; i++)
            CHECK_STATUS(per[i], KVF_OK);
    }
    CHECK_STATUS(kvf_wait(f.e, tc, NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        poison_block(&f, i);
    /* the promoted slots hold the partial blocks: asking for more fails */
    kvf_move too_much = {perm[0], 40, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &too_much, 1, &t[3]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[3], NULL), KVF_ERR_RANGE);
    for (uint32_t i = 0; i < N; i++)
        on[i].tokens = tokens;
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, on, N, &t[3]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[3], NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        if (expect_block(&f, (i + 5) % N, 500 + i, tokens))
            return 1;
    /* an empty secondary slot has nothing to demote; a missing key nothing to promote */
    kvf_move empty = TO_KEY(30, 0x77), missing = FROM_KEY(0x404, 30);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_DISK, &empty, 1, &t[0]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[0], NULL), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(kvf_promote(f.e, KVF_TIER_DISK, &missing, 1, &t[0]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[0], NULL), KVF_ERR_NOT_FOUND);
    kvf_move bad = TO_KEY(64, 0x78);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_DISK, &bad, 1, &t[0]), KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "secondary slot 64") != NULL);
    fx_done(&f);

    /* without a file tier, refused whole */
    if (fx_init(&f, false, 8))
        return 1;
    kvf_move m = TO_KEY(0, 1);
    CHECK_STATUS(kvf_demote(f.e, KVF_TIER_DISK, &m, 1, &t[0]), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "no file tier") != NULL);
    fx_done(&f);
    return 0;
}

static int test_copy_primary(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    fill_block(&f, 0, 42);
    poison_block(&f, 5);
    kvf_move m = {0, 5, 9};
    kvf_ticket t;
    CHECK_STATUS(kvf_copy(f.e, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    if (expect_block(&f, 5, 42, 9))
        return 1;
    kvf_move bad[2] = {{1, 2, 0}, {2, 3, 0}}; /* slot 2 read and written */
    CHECK_STATUS(kvf_copy(f.e, bad, 2, &t), KVF_ERR_INVALID);
    kvf_move self = {4, 4, 0};
    CHECK_STATUS(kvf_copy(f.e, &self, 1, &t), KVF_ERR_INVALID);
    fx_done(&f);
    return 0;
}

/* Caller-owned memory, with a slot stride larger than the block. */
static int test_caller_memory(void)
{
    kvf_geometry g = G_REF;
    size_t bytes;
    CHECK_STATUS(kvf_geometry_block_bytes(&g, &bytes), KVF_OK);
    size_t stride = bytes + 256;
    uint8_t *prim = malloc(stride * 4), *sec = malloc(stride * 4);
    memset(prim, POISON, stride * 4);
    memset(sec, 0, stride * 4);
    kvf_engine *e;
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_OK);
    kvf_pool_desc pd = {KVF_MEMORY_HOST, prim, stride, 4}, sd = {KVF_MEMORY_HOST, sec, stride, 4};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &pd, &sd, NULL), KVF_OK);
    void *p;
    CHECK_STATUS(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 2, &p), KVF_OK);
    CHECK(p == prim + 2 * stride);
    test_fill_random(prim + stride, bytes, 9);
    CHECK_STATUS(run1(e, true, KVF_TIER_HOST, 1, 3, 0), KVF_OK);
    CHECK(memcmp(sec + 3 * stride, prim + stride, bytes) == 0);
    /* the gap after each slot is the caller's and stays untouched */
    for (size_t i = bytes; i < stride; i++)
        CHECK(sec[3 * stride + i] == 0);
    CHECK_STATUS(run1(e, false, KVF_TIER_HOST, 3, 0, 0), KVF_OK);
    CHECK(memcmp(prim, prim + stride, bytes) == 0);
    kvf_engine_destroy(e);
    free(prim);
    free(sec);
    return 0;
}

/* ---- TensorRT-LLM's defects (DESIGN.md section 2) --------------------- */

/* 1. Skipped onboards: a block offloaded to a file in one step and reused
 * in a later one (after syncTransfers cleared TensorRT-LLM's pending list)
 * must be read back. */
static int test_defect1_onboard_after_sync(void)
{
    fixture f;
    if (fx_init(&f, true, 8))
        return 1;
    fill_block(&f, 0, 11);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_DISK, 0, 0x1111, 0), KVF_OK);
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK); /* the step ends */
    fill_block(&f, 0, 12);                            /* the slot is reused */
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK); /* another step */
    poison_block(&f, 1);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_DISK, 0x1111, 1, 0), KVF_OK);
    if (expect_block(&f, 1, 11, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* 4. Name collisions and restarts: two engines (two ranks) writing one key
 * in one directory keep their own blocks; a new engine on the same
 * namespace finds the blocks stored before it started. */
static int test_defect4_namespaces_and_restart(void)
{
    fixture a, b;
    if (fx_init(&a, true, 4))
        return 1;
    memset(&b, 0, sizeof b);
    b.pools = a.pools;
    memcpy(b.g, a.g, sizeof a.g);
    b.slots = 4;
    if (fx_open(&b, a.dir, "rank1", 0))
        return 1;
    fill_block(&a, 0, 100);
    fill_block(&b, 0, 200);
    CHECK_STATUS(run1(a.e, true, KVF_TIER_DISK, 0, 7, 0), KVF_OK);
    CHECK_STATUS(run1(b.e, true, KVF_TIER_DISK, 0, 7, 0), KVF_OK);
    poison_block(&a, 1);
    poison_block(&b, 1);
    CHECK_STATUS(run1(a.e, false, KVF_TIER_DISK, 7, 1, 0), KVF_OK);
    CHECK_STATUS(run1(b.e, false, KVF_TIER_DISK, 7, 1, 0), KVF_OK);
    if (expect_block(&a, 1, 100, 0) || expect_block(&b, 1, 200, 0))
        return 1;
    kvf_engine_destroy(b.e);
    /* restart rank 0's engine: its block is still there */
    kvf_engine_destroy(a.e);
    if (fx_open(&a, a.dir, "test", 0))
        return 1;
    poison_block(&a, 2);
    CHECK_STATUS(run1(a.e, false, KVF_TIER_DISK, 7, 2, 0), KVF_OK);
    if (expect_block(&a, 2, 100, 0))
        return 1;
    /* a new engine with another layout on the same namespace is refused */
    kvf_engine_destroy(a.e);
    a.g[1].head_size = 16;
    if (fx_open(&a, a.dir, "test", 0))
        return 1;
    CHECK_STATUS(run1(a.e, false, KVF_TIER_DISK, 7, 2, 0), KVF_ERR_MISMATCH);
    fx_done(&a);
    return 0;
}

int main(void)
{
    RUN(test_host_whole);
    RUN(test_host_partial);
    RUN(test_file_whole);
    RUN(test_file_partial);
    RUN(test_partial_of_stored);
    RUN(test_copy_primary);
    RUN(test_demote_promote);
    RUN(test_caller_memory);
    RUN(test_defect1_onboard_after_sync);
    RUN(test_defect4_namespaces_and_restart);
    return TEST_RESULT();
}
