/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's hazards (TensorRT-LLM's defect 7): read after write and
 * write after read, made deterministic by slowing one copy down; a write
 * still pending after thousands of later batches, which a later read still
 * waits for; fire and forget, then kvf_sync_stream(NULL) as a step's end;
 * onboards overtaking queued offloads while the hazards on the slots they
 * share still hold.
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

/* Offloads of primary slot 0 are held in their copy until released. */
static uint8_t *held_src;
static atomic_bool held_released;
static kvf_status held_copy(const kvf__copy *c)
{
    while (c->src == held_src && !atomic_load(&held_released))
        usleep(200);
    return KVF_OK;
}

/* Three offloads are in the engine, the first stuck in its copy: an
 * onboard into other slots completes meanwhile (onboards never wait for
 * offloads they do not depend on), while an onboard into the slot the
 * stuck offload reads waits for it (write after read), and the offload
 * stores the slot's old bytes. */
static int test_onboards_overtake_offloads(void)
{
    fixture f;
    memset(&f, 0, sizeof f);
    f.g[0] = G_REF;
    f.g[1] = G_TOK;
    f.g[2] = G_I4;
    f.pools = 3;
    f.slots = 16;
    CHECK(fx_open(&f, NULL, "test", 2) == 0);
    for (uint32_t s = 0; s < 8; s++)
        fill_block(&f, s, 40 + s);
    kvf_move m[2] = {{2, 2, 0}, {3, 3, 0}};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, m, 2, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    held_src = slot(&f, 0, KVF_LEVEL_PRIMARY, 0);
    atomic_store(&held_released, false);
    kvf__set_copy_hook(held_copy);
    kvf_ticket off[3];
    for (uint32_t k = 0; k < 3; k++) {
        kvf_move o = {k == 0 ? 0 : 4 + k, 8 + k, 0};
        CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &o, 1, &off[k]), KVF_OK);
    }
    /* independent: secondary 2, 3 -> primary 10, 11 */
    poison_block(&f, 10);
    poison_block(&f, 11);
    kvf_move in[2] = {{2, 10, 0}, {3, 11, 0}};
    kvf_ticket fast, war;
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, in, 2, &fast), KVF_OK);
    /* writes primary slot 0, which the stuck offload reads */
    kvf_move over = {3, 0, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &over, 1, &war), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, fast, NULL), KVF_OK);
    CHECK(expect_block(&f, 10, 42, 0) == 0);
    CHECK(expect_block(&f, 11, 43, 0) == 0);
    usleep(20 * 1000);
    CHECK_STATUS(kvf_poll(f.e, war, NULL), KVF_INPROGRESS);
    CHECK_STATUS(kvf_poll(f.e, off[0], NULL), KVF_INPROGRESS);
    atomic_store(&held_released, true);
    for (uint32_t k = 0; k < 3; k++)
        CHECK_STATUS(kvf_wait(f.e, off[k], NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, war, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    /* the offload stored slot 0's old block; slot 0 now holds block 43 */
    CHECK(expect_block(&f, 0, 43, 0) == 0);
    poison_block(&f, 12);
    kvf_move back = {8, 12, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &back, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    CHECK(expect_block(&f, 12, 40, 0) == 0);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_defect7_hazards);
    RUN(test_long_pending_writer);
    RUN(test_sync_without_tickets);
    RUN(test_onboards_overtake_offloads);
    return TEST_RESULT();
}
