/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's hazards (TensorRT-LLM's defect 7): read after write and
 * write after read, made deterministic by slowing one copy down; a write
 * still pending after thousands of later batches, which a later read still
 * waits for; fire and forget, then kvf_sync_stream(NULL) as a step's end;
 * onboards overtaking queued offloads while the hazards on the slots they
 * share still hold; an onboard into a slot that a large offload batch is
 * evicting waits for that slot's copy only (its chunk held or failed, a
 * slot read twice), never reading it before the copy ended.
 */
#include "engine_fixture.h"

/* KVF_HOST_ASYNC=1: the host backend takes copy_async, the path of a GPU */
static bool host_async(void)
{
    const char *v = getenv("KVF_HOST_ASYNC");
    return v && strcmp(v, "1") == 0;
}

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
        kvf_move m = test_move(i % 2 ? KVF_TIER_DISK : KVF_TIER_HOST, true, i, i, 0);
        CHECK_STATUS(kvf_offload(f.e, i % 2 ? KVF_TIER_DISK : KVF_TIER_HOST, &m, 1, NULL), KVF_OK);
    }
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
    for (uint32_t i = 0; i < 16; i++) {
        poison_block(&f, i);
        kvf_move m = test_move(i % 2 ? KVF_TIER_DISK : KVF_TIER_HOST, false, i, i, 0);
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

/* ---- evictions: an onboard into a slot waits for that slot's copy only ---- */

/* Blocks of 512 KiB: a chunk of an offload (a worker's, or a call to the
 * backend's copy_async) holds a few of them: 8 (4 MiB) on the workers, 2
 * (1 MiB) in copy_async calls. */
static const kvf_geometry G_BIG = {1, 2, 1, 32, 4096, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
#define BIG_SLOTS 32u
#define BIG_BYTES ((size_t)512 << 10)
/* Blocks of 256 KiB: 16 to a worker's chunk, 4 to a copy_async call. */
static const kvf_geometry G_SMALL = {1, 2, 1, 32, 2048, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
#define SMALL_BYTES ((size_t)256 << 10)
/* the geometry and block size of the engine evict_engine made last */
static const kvf_geometry *ev_geom = &G_BIG;
static size_t ev_bytes = BIG_BYTES;
/* the offload batch evicts primary slots [0, EVICT) into the same secondary slots */
#define EVICT 24u
/* the onboards' source: secondary slot 31, holding block SRC_TAG */
#define SRC_SLOT 31u
#define SRC_TAG 900u

/* Copies from or to ev_hold[k] wait until gate k opens; those writing
 * ev_fail_dst fail. */
static uint8_t *ev_hold[2], *ev_fail_dst;
static atomic_bool ev_open[2];
static kvf_status evict_copy(const kvf__copy *c)
{
    if (c->dst == ev_fail_dst)
        return KVF_ERR_IO;
    for (int k = 0; k < 2; k++)
        while (ev_hold[k] && (c->src == ev_hold[k] || c->dst == ev_hold[k]) &&
               !atomic_load(&ev_open[k]))
            usleep(200);
    return KVF_OK;
}

static uint8_t *big_slot(kvf_engine *e, kvf_level lv, uint32_t s)
{
    void *p = NULL;
    return kvf_engine_slot_ptr(e, 0, lv, s, &p) == KVF_OK ? p : NULL;
}

/* An engine of BIG_SLOTS slots a level of geometry g (blocks of
 * block_bytes), 2 workers: primary slots [0, EVICT) hold blocks 0..,
 * secondary SRC_SLOT holds block SRC_TAG, the other secondary slots
 * poison. */
static kvf_engine *evict_engine_of(const kvf_geometry *g, size_t block_bytes)
{
    ev_geom = g;
    ev_bytes = block_bytes;
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    kvf_engine *e = NULL;
    if (kvf_engine_create(&cfg, &e) != KVF_OK)
        return NULL;
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, BIG_SLOTS};
    kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, BIG_SLOTS};
    size_t bytes = 0;
    if (kvf_engine_add_pool(e, ev_geom, &prim, &sec, NULL) != KVF_OK ||
        kvf_geometry_block_bytes(ev_geom, &bytes) != KVF_OK || bytes != ev_bytes) {
        kvf_engine_destroy(e);
        return NULL;
    }
    test_fill_random(big_slot(e, KVF_LEVEL_PRIMARY, SRC_SLOT), ev_bytes, SRC_TAG);
    kvf_move m = {SRC_SLOT, SRC_SLOT, 0};
    kvf_ticket t;
    if (kvf_offload(e, KVF_TIER_HOST, &m, 1, &t) != KVF_OK || kvf_wait(e, t, NULL) != KVF_OK) {
        kvf_engine_destroy(e);
        return NULL;
    }
    for (uint32_t s = 0; s < BIG_SLOTS; s++) {
        if (s < EVICT)
            test_fill_random(big_slot(e, KVF_LEVEL_PRIMARY, s), ev_bytes, s + 1);
        if (s != SRC_SLOT)
            memset(big_slot(e, KVF_LEVEL_SECONDARY, s), POISON, ev_bytes);
    }
    ev_hold[0] = ev_hold[1] = ev_fail_dst = NULL;
    atomic_store(&ev_open[0], false);
    atomic_store(&ev_open[1], false);
    kvf__set_copy_hook(evict_copy);
    return e;
}

static kvf_engine *evict_engine(void)
{
    return evict_engine_of(&G_BIG, BIG_BYTES);
}

/* Ends the hold and the hook, whatever the test found. */
static void evict_release(void)
{
    atomic_store(&ev_open[0], true);
    atomic_store(&ev_open[1], true);
}

/* The offload of primary slots [0, EVICT): move i into secondary slot i,
 * but for the moves `extra` names (move -> source slot, or NULL). */
static kvf_status evict_batch(kvf_engine *e, const uint32_t *extra_move, const uint32_t *extra_src,
                              size_t nextra, kvf_ticket *t)
{
    kvf_move m[EVICT];
    for (uint32_t i = 0; i < EVICT; i++)
        m[i] = (kvf_move){i, i, 0};
    for (size_t k = 0; k < nextra; k++)
        m[extra_move[k]].src = extra_src[k];
    return kvf_offload(e, KVF_TIER_HOST, m, EVICT, t);
}

static kvf_status onboard_into(kvf_engine *e, uint32_t dst, kvf_ticket *t)
{
    kvf_move m = {SRC_SLOT, dst, 0};
    return kvf_onboard(e, KVF_TIER_HOST, &m, 1, t);
}

/* Polls ticket t until it is done or `seconds` have passed (a hang caught,
 * never a pass decided by time): its status, or KVF_INPROGRESS. */
static kvf_status poll_for(kvf_engine *e, kvf_ticket t, double seconds)
{
    for (double waited = 0; waited < seconds; waited += 0.001) {
        kvf_status st = kvf_poll(e, t, NULL);
        if (st != KVF_INPROGRESS)
            return st;
        usleep(1000);
    }
    return KVF_INPROGRESS;
}

/* Onboard `near` completes while `war` still waits for a held copy of
 * offload `off` (queued before near, on the same queue, it has nothing
 * else left to wait for: given time, it still waits); then the gates open
 * and all three complete. */
static int near_before_war(kvf_engine *e, kvf_ticket off, kvf_ticket near, kvf_ticket war)
{
    CHECK_STATUS(poll_for(e, near, 10.0), KVF_OK);
    usleep(20 * 1000);
    CHECK_STATUS(kvf_poll(e, war, NULL), KVF_INPROGRESS);
    evict_release();
    CHECK_STATUS(kvf_wait(e, war, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(e, off, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    return 0;
}

/* Slot s of level lv holds block `tag` byte for byte. */
static int expect_big(kvf_engine *e, kvf_level lv, uint32_t s, uint64_t tag)
{
    uint8_t *want = malloc(ev_bytes);
    if (!want)
        return 1;
    test_fill_random(want, ev_bytes, tag);
    size_t diff = test_mem_diff(big_slot(e, lv, s), want, ev_bytes);
    free(want);
    if (diff != SIZE_MAX) {
        fprintf(stderr, "%s slot %u: byte %zu differs from block %llu\n",
                lv == KVF_LEVEL_PRIMARY ? "primary" : "secondary", s, diff,
                (unsigned long long)tag);
        return 1;
    }
    return 0;
}

/* The offload stored every evicted slot's old block. */
static int expect_evicted(kvf_engine *e)
{
    int bad = 0;
    for (uint32_t s = 0; s < EVICT; s++)
        bad |= expect_big(e, KVF_LEVEL_SECONDARY, s, s + 1);
    return bad;
}

/* An engine evicts primary slots 0..23 in one offload batch and at once
 * onboards a block into slot 0: the onboard completes while the batch's
 * last chunk is still stuck in its copy (it waits for slot 0's copy, not
 * for the batch), and the batch stores slot 0's old bytes. */
static int test_evict_onboard_first_chunk(void)
{
    kvf_engine *e = evict_engine();
    CHECK(e != NULL);
    if (!e)
        return 1;
    ev_hold[0] = big_slot(e, KVF_LEVEL_PRIMARY, EVICT - 1);
    kvf_ticket off, on;
    CHECK_STATUS(evict_batch(e, NULL, NULL, 0, &off), KVF_OK);
    CHECK_STATUS(onboard_into(e, 0, &on), KVF_OK);
    CHECK_STATUS(poll_for(e, on, 10.0), KVF_OK);
    CHECK_STATUS(kvf_poll(e, off, NULL), KVF_INPROGRESS);
    evict_release();
    CHECK_STATUS(kvf_wait(e, off, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    CHECK(expect_evicted(e) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, 0, SRC_TAG) == 0);
    kvf_engine_destroy(e);
    return 0;
}

/* Write after read stays exact: the copies reading slot 0 (the first
 * chunk) and slot 12 (the second) are held while onboards into slots 2
 * and 12 are queued; once the first chunk ends, the onboard into slot 2
 * completes, but the one into slot 12 waits until the copy of slot 12 has
 * read the old bytes. */
static int test_evict_onboard_waits_for_its_slot(void)
{
    kvf_engine *e = evict_engine();
    CHECK(e != NULL);
    if (!e)
        return 1;
    const uint32_t y = 12;
    ev_hold[0] = big_slot(e, KVF_LEVEL_PRIMARY, 0);
    ev_hold[1] = big_slot(e, KVF_LEVEL_PRIMARY, y);
    kvf_ticket off, near, war;
    CHECK_STATUS(evict_batch(e, NULL, NULL, 0, &off), KVF_OK);
    CHECK_STATUS(onboard_into(e, y, &war), KVF_OK);
    CHECK_STATUS(onboard_into(e, 2, &near), KVF_OK);
    atomic_store(&ev_open[0], true);
    CHECK(near_before_war(e, off, near, war) == 0);
    CHECK(expect_evicted(e) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, y, SRC_TAG) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, 2, SRC_TAG) == 0);
    kvf_engine_destroy(e);
    return 0;
}

/* A slot the batch reads twice, in its first and last chunks: the onboard
 * into it waits for the second read too. */
static int test_evict_slot_read_twice(void)
{
    kvf_engine *e = evict_engine();
    CHECK(e != NULL);
    if (!e)
        return 1;
    const uint32_t y = 3, again = 20; /* move 20 reads slot 3 too */
    ev_hold[0] = big_slot(e, KVF_LEVEL_SECONDARY, again);
    kvf_ticket off, near, war;
    CHECK_STATUS(evict_batch(e, &again, &y, 1, &off), KVF_OK);
    CHECK_STATUS(onboard_into(e, y, &war), KVF_OK);
    CHECK_STATUS(onboard_into(e, 9, &near), KVF_OK);
    CHECK(near_before_war(e, off, near, war) == 0);
    CHECK(expect_big(e, KVF_LEVEL_SECONDARY, y, y + 1) == 0);
    CHECK(expect_big(e, KVF_LEVEL_SECONDARY, again, y + 1) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, y, SRC_TAG) == 0);
    kvf_engine_destroy(e);
    return 0;
}

/* A move of the batch fails (slot 1 into secondary slot 1): the onboard
 * into slot 1 still goes (its read ended), the batch reports that move
 * alone as failed, and secondary slot 1 is lost, never served. On the GPU
 * path a failed call fails every move not yet done, and what the device
 * still read is not known: the onboard waits for the batch. */
static int test_evict_failed_move(void)
{
    kvf_engine *e = evict_engine();
    CHECK(e != NULL);
    if (!e)
        return 1;
    ev_fail_dst = big_slot(e, KVF_LEVEL_SECONDARY, 1);
    ev_hold[0] = big_slot(e, KVF_LEVEL_PRIMARY, EVICT - 1);
    kvf_ticket off, on;
    CHECK_STATUS(evict_batch(e, NULL, NULL, 0, &off), KVF_OK);
    CHECK_STATUS(onboard_into(e, 1, &on), KVF_OK);
    if (!host_async()) {
        CHECK_STATUS(poll_for(e, on, 10.0), KVF_OK);
        CHECK_STATUS(kvf_poll(e, off, NULL), KVF_INPROGRESS);
    }
    evict_release();
    kvf_status per[EVICT];
    CHECK_STATUS(kvf_wait(e, off, per), KVF_ERR_IO);
    if (host_async())
        CHECK_STATUS(kvf_wait(e, on, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    for (uint32_t i = 0; i < EVICT; i++)
        CHECK_STATUS(per[i], i == 1 || host_async() ? KVF_ERR_IO : KVF_OK);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, 1, SRC_TAG) == 0);
    kvf_move back = {1, 30, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, &back, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_ERR_LOST);
    kvf_engine_destroy(e);
    return 0;
}

/* Blocks of 256 KiB, where a 4 MiB chunk would be 16 of them: the copy of
 * slot 12 is held while onboards into slots 12, 13 and 2 are queued. The
 * onboard into slot 2 completes while slot 12's copy is still held (on
 * the GPU's path the batch goes in calls of 1 MiB, 4 slots, there; on the
 * workers in two chunks of 12), and the ones into slots 12 and 13, which
 * share a call or chunk with the held copy, still wait: a slot is
 * released with its own call, never before. Then every slot holds the
 * right bytes. */
static int test_evict_small_blocks(void)
{
    kvf_engine *e = evict_engine_of(&G_SMALL, SMALL_BYTES);
    CHECK(e != NULL);
    if (!e)
        return 1;
    const uint32_t y = 12, beside = 13, near_slot = 2;
    ev_hold[0] = big_slot(e, KVF_LEVEL_PRIMARY, y);
    kvf_ticket off, near, war, war2;
    CHECK_STATUS(evict_batch(e, NULL, NULL, 0, &off), KVF_OK);
    CHECK_STATUS(onboard_into(e, y, &war), KVF_OK);
    CHECK_STATUS(onboard_into(e, beside, &war2), KVF_OK);
    CHECK_STATUS(onboard_into(e, near_slot, &near), KVF_OK);
    CHECK_STATUS(poll_for(e, near, 10.0), KVF_OK);
    usleep(20 * 1000);
    CHECK_STATUS(kvf_poll(e, war, NULL), KVF_INPROGRESS);
    CHECK_STATUS(kvf_poll(e, war2, NULL), KVF_INPROGRESS);
    CHECK_STATUS(kvf_poll(e, off, NULL), KVF_INPROGRESS);
    evict_release();
    CHECK_STATUS(kvf_wait(e, war, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(e, war2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(e, off, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    CHECK(expect_evicted(e) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, y, SRC_TAG) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, beside, SRC_TAG) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, near_slot, SRC_TAG) == 0);
    kvf_engine_destroy(e);
    return 0;
}

/* KVF_DEVICE_CALL_BYTES at one block: where the batch goes to the backend
 * in calls (copy_async), each block is a call of its own, so with slot
 * 13's copy held the onboard into slot 12, which shares the call of
 * slots 12-15 by default, completes (the calls run in order: 12's before
 * 13's); the one into slot 13 still waits for it. On the workers the
 * setting changes nothing: slot 12 shares 13's chunk and waits. Every
 * slot then holds the right bytes. */
static int test_evict_call_bytes(void)
{
    char one[32];
    snprintf(one, sizeof one, "%zu", SMALL_BYTES);
    setenv("KVF_DEVICE_CALL_BYTES", one, 1);
    kvf_engine *e = evict_engine_of(&G_SMALL, SMALL_BYTES);
    CHECK(e != NULL);
    if (!e) {
        unsetenv("KVF_DEVICE_CALL_BYTES");
        return 1;
    }
    const uint32_t y = 13, beside = 12;
    ev_hold[0] = big_slot(e, KVF_LEVEL_PRIMARY, y);
    kvf_ticket off, war, war2;
    CHECK_STATUS(evict_batch(e, NULL, NULL, 0, &off), KVF_OK);
    CHECK_STATUS(onboard_into(e, y, &war), KVF_OK);
    CHECK_STATUS(onboard_into(e, beside, &war2), KVF_OK);
    if (host_async())
        CHECK_STATUS(poll_for(e, war2, 10.0), KVF_OK);
    usleep(20 * 1000);
    CHECK_STATUS(kvf_poll(e, war, NULL), KVF_INPROGRESS);
    if (!host_async())
        CHECK_STATUS(kvf_poll(e, war2, NULL), KVF_INPROGRESS);
    CHECK_STATUS(kvf_poll(e, off, NULL), KVF_INPROGRESS);
    evict_release();
    CHECK_STATUS(kvf_wait(e, war, NULL), KVF_OK);
    if (!host_async()) /* (polled to its end above otherwise) */
        CHECK_STATUS(kvf_wait(e, war2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(e, off, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    unsetenv("KVF_DEVICE_CALL_BYTES");
    CHECK(expect_evicted(e) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, y, SRC_TAG) == 0);
    CHECK(expect_big(e, KVF_LEVEL_PRIMARY, beside, SRC_TAG) == 0);
    kvf_engine_destroy(e);
    return 0;
}

/* No hook: rounds of an eviction of slots 0..23 followed at once by
 * onboards into a random few of them, one or two to a batch; each round
 * the evicted blocks are the slots' old ones and the onboarded slots hold
 * the new block, byte for byte, however the chunks and onboards raced. */
static int test_evict_onboard_races(void)
{
    kvf_engine *e = evict_engine();
    CHECK(e != NULL);
    if (!e)
        return 1;
    kvf__set_copy_hook(NULL);
    uint64_t rng = 0x5eed;
    for (uint32_t round = 0; round < 12; round++) {
        uint64_t tag0 = 1000 + round * EVICT;
        for (uint32_t s = 0; s < EVICT; s++)
            test_fill_random(big_slot(e, KVF_LEVEL_PRIMARY, s), ev_bytes, tag0 + s);
        kvf_move m[EVICT];
        for (uint32_t i = 0; i < EVICT; i++)
            m[i] = (kvf_move){i, i, 0};
        kvf_ticket off, on[EVICT];
        CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, m, EVICT, &off), KVF_OK);
        bool into[EVICT] = {false};
        uint32_t non = 0;
        for (uint32_t k = 0; k < 6; k++) {
            uint32_t a = (uint32_t)(test_xorshift64(&rng) % EVICT);
            uint32_t b = (uint32_t)(test_xorshift64(&rng) % EVICT);
            kvf_move in[2] = {{SRC_SLOT, a, 0}, {SRC_SLOT, b, 0}};
            into[a] = into[b] = true;
            CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, in, a == b ? 1 : 2, &on[non++]), KVF_OK);
        }
        for (uint32_t k = 0; k < non; k++)
            CHECK_STATUS(kvf_wait(e, on[k], NULL), KVF_OK);
        CHECK_STATUS(kvf_wait(e, off, NULL), KVF_OK);
        for (uint32_t s = 0; s < EVICT; s++) {
            CHECK(expect_big(e, KVF_LEVEL_SECONDARY, s, tag0 + s) == 0);
            CHECK(expect_big(e, KVF_LEVEL_PRIMARY, s, into[s] ? SRC_TAG : tag0 + s) == 0);
        }
    }
    kvf_engine_destroy(e);
    return 0;
}

int main(void)
{
    RUN(test_defect7_hazards);
    RUN(test_long_pending_writer);
    RUN(test_sync_without_tickets);
    RUN(test_onboards_overtake_offloads);
    RUN(test_evict_onboard_first_chunk);
    RUN(test_evict_onboard_waits_for_its_slot);
    RUN(test_evict_slot_read_twice);
    RUN(test_evict_failed_move);
    RUN(test_evict_onboard_races);
    RUN(test_evict_small_blocks);
    RUN(test_evict_call_bytes);
    return TEST_RESULT();
}
