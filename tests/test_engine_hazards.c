/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's hazards (the reference's defect 7): read after write and
 * write after read, made deterministic by slowing one copy down; a write
 * still pending after thousands of later batches, which a later read still
 * waits for; fire and forget, then kvf_sync_stream(NULL) as a step's end.
 */
#include "engine_fixture.h"

/* 7. Hazards both ways, made deterministic by slowing one copy down. */
static uint8_t *slow_src, *slow_dst;
static kvf_status slow_copy(const kvf__copy *c)
{
    if (c->src == slow_src || c->dst == slow_dst)
        usleep(50 * 1000);
    return KVF_OK;
}

static int test_defect7_hazards(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    kvf__set_copy_hook(slow_copy);
    kvf_ticket t1, t2, t3;

    /* read after write: the onboard of slot 2 waits for its slow offload */
    fill_block(&f, 0, 10);
    slow_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 2);
    kvf_move off = {0, 2, 0}, on = {2, 1, 0};
    poison_block(&f, 1);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on, 1, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    if (expect_block(&f, 1, 10, 0))
        return 1;
    slow_dst = NULL;

    /* write after read: an offload into slot 2 waits for the slow onboard
     * still reading it */
    fill_block(&f, 3, 30);
    slow_src = slot(&f, 0, KVF_LEVEL_SECONDARY, 2);
    poison_block(&f, 4);
    kvf_move on2 = {2, 4, 0}, off2 = {3, 2, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on2, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off2, 1, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    if (expect_block(&f, 4, 10, 0))
        return 1;
    slow_src = NULL;

    /* write after read on a primary slot: an onboard into slot 3 waits for
     * the slow offload still reading it; then write after write */
    fill_block(&f, 5, 50);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_HOST, 5, 6, 0), KVF_OK);
    slow_src = slot(&f, 0, KVF_LEVEL_PRIMARY, 3);
    kvf_move off3 = {3, 7, 0}, on3 = {6, 3, 0}, on4 = {2, 3, 0};
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off3, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on3, 1, &t2), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on4, 1, &t3), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t3, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    slow_src = NULL;
    kvf__set_copy_hook(NULL);
    /* slot 7 got block 30 (slot 3 before the onboards), slot 3 ends with
     * the last onboard's data (slot 2 of secondary: block 30) */
    poison_block(&f, 0);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 7, 0, 0), KVF_OK);
    if (expect_block(&f, 0, 30, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* A write still pending after thousands of later batches came and went
 * (each named by its id in the hazard entries; the engine's table of
 * batches not done then spans them all): a read queued after it still
 * waits for it and gets its data. */
static uint8_t *gate_dst;
static atomic_bool gate_shut;
static kvf_status gated_copy(const kvf__copy *c)
{
    while (c->dst == gate_dst && atomic_load(&gate_shut))
        usleep(1000);
    return KVF_OK;
}

static int test_long_pending_writer(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    fill_block(&f, 0, 70);
    fill_block(&f, 4, 71);
    poison_block(&f, 1);
    gate_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 2);
    atomic_store(&gate_shut, true);
    kvf__set_copy_hook(gated_copy);
    kvf_move off = {0, 2, 0}, on = {2, 1, 0}, cp = {4, 5, 0};
    kvf_ticket t1, t2, t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off, 1, &t1), KVF_OK);
    for (int i = 0; i < 5000; i++) {
        CHECK_STATUS(kvf_copy(f.e, &cp, 1, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    }
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on, 1, &t2), KVF_OK);
    usleep(20 * 1000);
    CHECK_STATUS(kvf_poll(f.e, t2, NULL), KVF_INPROGRESS); /* behind the gated write */
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
    atomic_store(&gate_shut, false);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    if (expect_block(&f, 1, 70, 0) || expect_block(&f, 5, 71, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* Fire and forget, then kvf_sync_stream(NULL) as the end of a step. */
static int test_sync_without_tickets(void)
{
    fixture f;
    if (fx_init(&f, true, 16))
        return 1;
    for (uint32_t i = 0; i < 16; i++) {
        fill_block(&f, i, 500 + i);
        kvf_move m = {i, i, 0};
        CHECK_STATUS(kvf_offload(f.e, i % 2 ? KVF_TIER_DISK : KVF_TIER_HOST, &m, 1, NULL), KVF_OK);
    }
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
    for (uint32_t i = 0; i < 16; i++) {
        poison_block(&f, i);
        kvf_move m = {i, i, 0};
        CHECK_STATUS(kvf_onboard(f.e, i % 2 ? KVF_TIER_DISK : KVF_TIER_HOST, &m, 1, NULL), KVF_OK);
    }
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
    for (uint32_t i = 0; i < 16; i++)
        if (expect_block(&f, i, 500 + i, 0))
            return 1;
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_defect7_hazards);
    RUN(test_long_pending_writer);
    RUN(test_sync_without_tickets);
    return TEST_RESULT();
}
