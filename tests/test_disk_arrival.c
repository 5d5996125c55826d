/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-wise arrival from the disk tier: kvf_onboard_pools from DISK reads
 * block files pool group by pool group (KVF_DISK_GROUP_BYTES=1 here: a
 * group per pool), and a pool's wait returns once its group is in every
 * slot of the batch, while the reads of later groups are held back (the
 * I/O fault hook blocks them); a pool of one block damaged in the middle
 * fails that block alone, naming the pool and the file, after its earlier
 * pools were handed over checked and before its later ones are written;
 * random data into poisoned slots, byte-exact; a pool table that splits
 * the payload otherwise than the engine's pools keeps its block from
 * being handed over in groups (read whole, it is sound). ctest runs it on
 * every file runner.
 */
#include "blockhdr.h"
#include "engine.h"
#include "fileio.h"
#include "hold_gate.h"
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POOLS 4
#define BLOCKS 8
#define POISON 0xA5
/* 16 KiB a pool: each pool group is a read of its own */
static const kvf_geometry G = {1, 2, 4, 16, 64, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};

static char dir[512];
static size_t pool_bytes;

/* The fault hook: each block file's first `pass` reads go through (its
 * first pool groups: a group is one read here), later ones wait until
 * released; per file, so that chunks of the batch on other workers read
 * their own first groups whatever the order. */
#define FILES_MAX 64
static hold_gate hold = HOLD_GATE_INIT;
static struct {
    char path[FILES_MAX][600];
    int reads[FILES_MAX], nfiles;
    int pass;
} gate;

static int gate_hook(const char *op, const char *path, size_t *len_p)
{
    (void)len_p;
    if (strcmp(op, "read") != 0 || !strstr(path, ".kvf"))
        return 0;
    pthread_mutex_lock(&hold.mu);
    int k = 0;
    while (k < gate.nfiles && strcmp(gate.path[k], path) != 0)
        k++;
    if (k == gate.nfiles && k < FILES_MAX) {
        snprintf(gate.path[k], sizeof gate.path[k], "%s", path);
        gate.reads[k] = 0;
        gate.nfiles++;
    }
    if (k < FILES_MAX && gate.reads[k] < gate.pass)
        gate.reads[k]++;
    else
        hold_gate_wait(&hold);
    pthread_mutex_unlock(&hold.mu);
    return 0;
}

static void gate_close(int pass)
{
    pthread_mutex_lock(&hold.mu);
    gate.nfiles = 0;
    gate.pass = pass;
    hold.release = false;
    pthread_mutex_unlock(&hold.mu);
}

static void gate_open(void)
{
    pthread_mutex_lock(&hold.mu);
    gate.pass = 1 << 30;
    hold_gate_release(&hold);
    pthread_mutex_unlock(&hold.mu);
}

/* Whether a read is held at the gate (waiting up to 10 s): the later
 * groups' reads have started and stopped there. */
static bool gate_holding(void)
{
    return hold_gate_holding(&hold);
}

static uint8_t *slot_of(kvf_engine *e, uint32_t p, uint32_t s)
{
    void *ptr = NULL;
    return kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, s, &ptr) == KVF_OK ? ptr : NULL;
}

/* Pool p of slot s holds block `tag`'s bytes (want) or poison. */
static bool pool_is(kvf_engine *e, uint32_t p, uint32_t s, uint64_t tag, bool want)
{
    uint8_t *exp = malloc(pool_bytes);
    REQUIRE(exp);
    if (want)
        test_fill_random(exp, pool_bytes, tag * 31 + p + 1);
    else
        memset(exp, POISON, pool_bytes);
    bool same = memcmp(slot_of(e, p, s), exp, pool_bytes) == 0;
    free(exp);
    return same;
}

/* An engine on the host backend with POOLS pools of BLOCKS slots over
 * `dir`, blocks 500 + s stored on disk from slot s, the slots poisoned. */
static kvf_engine *open_stored(void)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    /* one worker, so a batch is one chunk: the gate holds a read on
     * whichever thread runs it, and the thread runner's callers help with
     * each other's queued reads, so a second worker's chunk could be held
     * in the first one's later group (forever, here; a slow read
     * elsewhere) */
    cfg.threads = 1;
    cfg.file.dir = dir;
    cfg.file.namespace_ = "arrival";
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    for (uint32_t p = 0; p < POOLS; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, BLOCKS};
        uint32_t idx;
        REQUIRE(kvf_engine_add_pool(e, &G, &prim, NULL, &idx) == KVF_OK);
    }
    REQUIRE(kvf_geometry_block_bytes(&G, &pool_bytes) == KVF_OK);
    kvf_move mv[BLOCKS];
    for (uint32_t s = 0; s < BLOCKS; s++) {
        for (uint32_t p = 0; p < POOLS; p++)
            test_fill_random(slot_of(e, p, s), pool_bytes, (500 + s) * 31 + p + 1);
        mv[s] = TO_KEY(s, 500 + s);
    }
    kvf_ticket t;
    REQUIRE(kvf_offload(e, KVF_TIER_DISK, mv, BLOCKS, &t) == KVF_OK);
    REQUIRE(kvf_wait(e, t, NULL) == KVF_OK);
    for (uint32_t s = 0; s < BLOCKS; s++)
        for (uint32_t p = 0; p < POOLS; p++)
            memset(slot_of(e, p, s), POISON, pool_bytes);
    CHECK_EQ_INT(kvf_engine_arrival_groups(e, KVF_TIER_DISK), POOLS);
    CHECK(kvf_engine_layerwise_tiers(e) >> KVF_TIER_DISK & 1u);
    return e;
}

static void onboard_all(kvf_engine *e, kvf_ticket *t)
{
    kvf_move mv[BLOCKS];
    for (uint32_t s = 0; s < BLOCKS; s++)
        mv[s] = (kvf_move){.dst = s, .key = TKEY(500 + s)};
    const uint32_t pools[POOLS] = {0, 1, 2, 3};
    REQUIRE(kvf_onboard_pools(e, KVF_TIER_DISK, pools, POOLS, mv, BLOCKS, t) == KVF_OK);
}

/* Pool 0's wait returns while every later group's reads are held: pool 0
 * is in every slot, byte-exact, the others still poison; released, the
 * rest arrives. */
static int test_first_group_first(void)
{
    kvf_engine *e = open_stored();
    /* group 0 of each block is one read; the next reads are held */
    gate_close(1);
    kvf_ticket t;
    onboard_all(e, &t);
    CHECK_STATUS(kvf__stream_wait_pool_by(e, t, 0, NULL, kvf__now_ns() + 20000000000ull), KVF_OK);
    CHECK(gate_holding());
    for (uint32_t s = 0; s < BLOCKS; s++) {
        CHECK(pool_is(e, 0, s, 500 + s, true));
        for (uint32_t p = 1; p < POOLS; p++)
            CHECK(pool_is(e, p, s, 500 + s, false));
    }
    /* pool 1 has not arrived: a wait by a deadline gives up */
    CHECK_STATUS(kvf__stream_wait_pool_by(e, t, 1, NULL, kvf__now_ns() + 50000000ull),
                 KVF_ERR_TIMEOUT);
    gate_open();
    CHECK_STATUS(kvf_wait_pool(e, t, 3), KVF_OK);
    CHECK_STATUS(kvf_wait_pool(e, t, 1), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    for (uint32_t s = 0; s < BLOCKS; s++)
        for (uint32_t p = 0; p < POOLS; p++)
            CHECK(pool_is(e, p, s, 500 + s, true));
    kvf_engine_destroy(e);
    return 0;
}

/* Block 3's pool 2 damaged: pools 0 and 1 of every block arrive (checked);
 * pool 2's wait fails, the move's message names pool 2 and the file; the
 * other blocks arrive whole, block 3's pools 2 and 3 stay poison. */
static int test_damaged_middle_pool(void)
{
    kvf_engine *e = open_stored();
    char path[700];
    snprintf(path, sizeof path, "%s/arrival/" KVF_KEY_FMT ".kvf", dir, KVF_KEY_ARGS(TKEY(500 + 3)));
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    off_t at = (off_t)(kvf__block_prefix_bytes(POOLS) + 2 * pool_bytes + 1000);
    uint8_t b;
    REQUIRE(pread(fd, &b, 1, at) == 1);
    b ^= 0x20;
    REQUIRE(pwrite(fd, &b, 1, at) == 1);
    close(fd);

    gate_close(2); /* groups 0 and 1 pass, group 2 is held */
    kvf_ticket t;
    onboard_all(e, &t);
    CHECK_STATUS(kvf__stream_wait_pool_by(e, t, 1, NULL, kvf__now_ns() + 20000000000ull), KVF_OK);
    CHECK_STATUS(kvf_wait_pool(e, t, 0), KVF_OK);
    CHECK(gate_holding());
    gate_open();
    CHECK_STATUS(kvf_wait_pool(e, t, 2), KVF_ERR_CORRUPT);
    CHECK_STATUS(kvf_wait_pool(e, t, 3), KVF_ERR_CORRUPT);
    kvf_status per[BLOCKS];
    kvf_move_error errs[4];
    size_t nerr = 0;
    CHECK_STATUS(kvf_wait_errors(e, t, per, errs, 4, &nerr), KVF_ERR_CORRUPT);
    CHECK_EQ_INT((int)nerr, 1);
    CHECK_EQ_INT((int)errs[0].index, 3);
    CHECK_STR_HAS(errs[0].message, "pool 2: checksum mismatch");
    CHECK_STR_HAS(errs[0].message, "000000000000000000000000000001f7.kvf");
    for (uint32_t s = 0; s < BLOCKS; s++) {
        CHECK_STATUS(per[s], s == 3 ? KVF_ERR_CORRUPT : KVF_OK);
        for (uint32_t p = 0; p < POOLS; p++)
            CHECK(pool_is(e, p, s, 500 + s, s != 3 || p < 2));
    }
    kvf_engine_destroy(e);
    return 0;
}

/* Block 5's pool table rewritten with another split of the same payload
 * (every checksum sound, as kvf_dir_upgrade writes for a format that did
 * not record the split): its group 0 would check other bytes than the
 * engine scatters, so the block is not handed over in groups: its move
 * fails KVF_ERR_UNSUPPORTED naming the table, nothing of it reaches its
 * slot, the other blocks arrive; a whole onboard, which checks every
 * pool, then takes it byte-exact. */
static int test_table_not_ours(void)
{
    kvf_engine *e = open_stored();
    char path[700];
    snprintf(path, sizeof path, "%s/arrival/" KVF_KEY_FMT ".kvf", dir, KVF_KEY_ARGS(TKEY(500 + 5)));
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    size_t pre = kvf__block_prefix_bytes(POOLS), payload = POOLS * pool_bytes;
    uint8_t *img = malloc(pre + payload);
    REQUIRE(img && pread(fd, img, pre + payload, 0) == (ssize_t)(pre + payload));
    kvf__block_header h;
    REQUIRE(kvf__block_header_parse(img, "test", &h) == KVF_OK);
    const uint32_t other[POOLS] = {(uint32_t)pool_bytes / 2, (uint32_t)pool_bytes,
                                   (uint32_t)pool_bytes, (uint32_t)pool_bytes * 3 / 2};
    REQUIRE(kvf__block_prefix_make(&h, other, img + pre, "test", img) == KVF_OK);
    REQUIRE(pwrite(fd, img, pre, 0) == (ssize_t)pre);
    close(fd);
    free(img);

    kvf_ticket t;
    onboard_all(e, &t);
    CHECK_STATUS(kvf_wait_pool(e, t, 0), KVF_ERR_UNSUPPORTED);
    kvf_status per[BLOCKS];
    kvf_move_error errs[4];
    size_t nerr = 0;
    CHECK_STATUS(kvf_wait_errors(e, t, per, errs, 4, &nerr), KVF_ERR_UNSUPPORTED);
    CHECK_EQ_INT((int)nerr, 1);
    CHECK_EQ_INT((int)errs[0].index, 5);
    CHECK_STR_HAS(errs[0].message, "pool table gives pool 0");
    for (uint32_t s = 0; s < BLOCKS; s++) {
        CHECK_STATUS(per[s], s == 5 ? KVF_ERR_UNSUPPORTED : KVF_OK);
        for (uint32_t p = 0; p < POOLS; p++)
            CHECK(pool_is(e, p, s, 500 + s, s != 5));
    }
    /* read whole, every pool checked: the block is sound */
    kvf_move mv = {.dst = 5, .key = TKEY(500 + 5)};
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_DISK, &mv, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    for (uint32_t p = 0; p < POOLS; p++)
        CHECK(pool_is(e, p, 5, 500 + 5, true));
    kvf_engine_destroy(e);
    return 0;
}

/* A block refused by the engine once its first group is read (stored
 * with 8 tokens, 16 asked): no pool of it is written, in that group or a
 * later one; the block beside it arrives whole. */
static int test_refused_after_first_group(void)
{
    kvf_engine *e = open_stored();
    kvf_move mv = {.src = 0, .tokens = 8, .key = TKEY(600)};
    for (uint32_t p = 0; p < POOLS; p++)
        test_fill_random(slot_of(e, p, 0), pool_bytes, 500 * 31 + p + 1);
    kvf_ticket t;
    REQUIRE(kvf_offload(e, KVF_TIER_DISK, &mv, 1, &t) == KVF_OK);
    REQUIRE(kvf_wait(e, t, NULL) == KVF_OK);
    for (uint32_t p = 0; p < POOLS; p++)
        memset(slot_of(e, p, 0), POISON, pool_bytes);
    kvf_move in[2] = {{.dst = 0, .key = TKEY(600)}, {.dst = 1, .key = TKEY(501)}};
    const uint32_t pools[POOLS] = {0, 1, 2, 3};
    REQUIRE(kvf_onboard_pools(e, KVF_TIER_DISK, pools, POOLS, in, 2, &t) == KVF_OK);
    kvf_status per[2];
    CHECK_STATUS(kvf_wait(e, t, per), KVF_ERR_RANGE);
    CHECK_STATUS(per[0], KVF_ERR_RANGE);
    CHECK_STATUS(per[1], KVF_OK);
    for (uint32_t p = 0; p < POOLS; p++) {
        CHECK(pool_is(e, p, 0, 0, false));
        CHECK(pool_is(e, p, 1, 501, true));
    }
    kvf_engine_destroy(e);
    return 0;
}

int main(void)
{
    setenv("KVF_DISK_GROUP_BYTES", "1", 1);
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    kvf__set_io_fault(gate_hook);
    RUN(test_first_group_first);
    RUN(test_damaged_middle_pool);
    RUN(test_table_not_ours);
    RUN(test_refused_after_first_group);
    kvf__set_io_fault(NULL);
    test_rmtree(dir);
    return TEST_RESULT();
}
