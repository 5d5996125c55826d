/* SPDX-License-Identifier: Apache-2.0 */
/* Each failed move's message reaches the ticket's holder (kvf_wait_errors,
 * kvf_poll_errors): injected file faults, a damaged file, a lost source, a
 * failed copy and an unreachable store each give the move's index, its
 * status and a message naming what it touched (file path, slot, key) and
 * why; more failures than `cap` are counted, the first `cap` kept. */
#include "backend.h"
#include "blockhdr.h"
#include "fileio.h"
#include "testutil.h"

#include <fcntl.h>
#include <stdatomic.h>

enum { SLOTS = 16, TPB = 8 };

static const kvf_geometry G = {2, 2, 2, TPB, 16, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
static size_t block_bytes;

typedef struct fixture {
    char dir[256];
    kvf_engine *e;
} fixture;

static int fx_init(fixture *f, const char *remote_url)
{
    REQUIRE(test_tmpdir(f->dir, sizeof f->dir) == 0);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.dir = f->dir;
    cfg.file.namespace_ = "ns";
    cfg.remote.url = remote_url;
    cfg.remote.timeout_ms = 500;
    cfg.file.fsync = KVF_FSYNC_NONE; /* durability is not what these tests check */
    REQUIRE(kvf_engine_create(&cfg, &f->e) == KVF_OK);
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, SLOTS};
    kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, SLOTS};
    REQUIRE(kvf_engine_add_pool(f->e, &G, &prim, &sec, NULL) == KVF_OK);
    REQUIRE(kvf_geometry_block_bytes(&G, &block_bytes) == KVF_OK);
    for (uint32_t s = 0; s < SLOTS; s++) {
        void *p;
        REQUIRE(kvf_engine_slot_ptr(f->e, 0, KVF_LEVEL_PRIMARY, s, &p) == KVF_OK);
        test_fill_random(p, block_bytes, 1000 + s);
    }
    return 0;
}

static void fx_done(fixture *f)
{
    kvf_engine_destroy(f->e);
    test_rmtree(f->dir);
}

/* Fails `fault_op` ("write", "read", "unlink") with EIO for files whose
 * name holds `fault_name`; atomic, as the cache's background removals may
 * run while a test changes them. */
static _Atomic(const char *) fault_op, fault_name;
static int fault_hook(const char *op, const char *path, size_t *len_p)
{
    (void)len_p;
    const char *fop = fault_op, *fname = fault_name;
    if (fop && fname && strcmp(op, fop) == 0 && strstr(path, fname))
        return EIO;
    return 0;
}

static void key_file(const fixture *f, uint64_t key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/ns/" KVF_KEY_FMT ".kvf", f->dir, KVF_KEY_ARGS(KEY(key)));
}

static int test_file_write_faults(void)
{
    fixture f;
    fx_init(&f, NULL);
    kvf_move mv[6];
    for (uint32_t i = 0; i < 6; i++)
        mv[i] = TO_KEY(i, KEY(0x100 + i));
    kvf__set_io_fault(fault_hook);
    fault_op = "write";
    fault_name = "0000000000000103.";
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, mv, 6, &t), KVF_OK);
    kvf_status per[6];
    kvf_move_error err[4];
    size_t n = 99;
    CHECK_STATUS(kvf_wait_errors(f.e, t, per, err, 4, &n), KVF_ERR_IO);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    REQUIRE(n == 1);
    CHECK_EQ_INT(err[0].index, 3);
    CHECK_STATUS(err[0].status, KVF_ERR_IO);
    CHECK_STATUS(per[3], KVF_ERR_IO);
    CHECK_STATUS(per[2], KVF_OK);
    CHECK_STR_HAS(err[0].message, "0000000000000103.");
    CHECK_STR_HAS(err[0].message, f.dir);
    CHECK_STR_HAS(err[0].message, strerror(EIO));
    CHECK_STR_HAS(err[0].message, "offload to file");
    /* the ticket is retired, its messages with it */
    CHECK_STATUS(kvf_wait_errors(f.e, t, NULL, err, 4, &n), KVF_ERR_UNKNOWN_TICKET);
    fx_done(&f);
    return 0;
}

static int test_file_read_faults_and_checksum(void)
{
    fixture f;
    fx_init(&f, NULL);
    kvf_move mv[4];
    for (uint32_t i = 0; i < 4; i++)
        mv[i] = TO_KEY(i, KEY(0x200 + i));
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, mv, 4, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    /* damage block 0x201's payload; fail the read of 0x203 */
    char path[512];
    key_file(&f, 0x201, path, sizeof path);
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t byte;
    off_t at = (off_t)kvf__block_prefix_bytes(1) + 10; /* in the payload */
    REQUIRE(pread(fd, &byte, 1, at) == 1);
    byte ^= 0x5a;
    REQUIRE(pwrite(fd, &byte, 1, at) == 1);
    close(fd);
    kvf__set_io_fault(fault_hook);
    fault_op = "read";
    fault_name = "0000000000000203.kvf";
    for (uint32_t i = 0; i < 4; i++)
        mv[i] = FROM_KEY(KEY(0x200 + i), 8 + i);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_DISK, mv, 4, &t), KVF_OK);
    kvf_move_error err[4];
    size_t n = 0;
    CHECK_STATUS(kvf_wait_errors(f.e, t, NULL, err, 4, &n), KVF_ERR_CORRUPT);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    REQUIRE(n == 2);
    CHECK_EQ_INT(err[0].index, 1);
    CHECK_STATUS(err[0].status, KVF_ERR_CORRUPT);
    CHECK_STR_HAS(err[0].message, path);
    CHECK_STR_HAS(err[0].message, "checksum");
    CHECK_EQ_INT(err[1].index, 3);
    CHECK_STATUS(err[1].status, KVF_ERR_IO);
    CHECK_STR_HAS(err[1].message, "0000000000000203.kvf");
    CHECK_STR_HAS(err[1].message, strerror(EIO));
    fx_done(&f);
    return 0;
}

/* Fails every copy into one destination address. */
static void *_Atomic fail_dst;
static kvf_status copy_hook(const kvf__copy *c)
{
    return c->dst == atomic_load(&fail_dst) ? KVF_ERR_IO : KVF_OK;
}

static int test_copy_and_lost_source(void)
{
    fixture f;
    fx_init(&f, NULL);
    void *sec3, *prim5;
    REQUIRE(kvf_engine_slot_ptr(f.e, 0, KVF_LEVEL_SECONDARY, 3, &sec3) == KVF_OK);
    REQUIRE(kvf_engine_slot_ptr(f.e, 0, KVF_LEVEL_PRIMARY, 5, &prim5) == KVF_OK);
    kvf_move seed = {4, 6, 0};
    kvf_ticket t1, t2;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &seed, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    kvf__set_copy_hook(copy_hook);
    atomic_store(&fail_dst, sec3);
    /* the offload into secondary slot 3 fails; the onboard queued behind
     * it reads that slot: lost, saying which slot and why */
    kvf_move off = {2, 3, 0};
    kvf_move on[2] = {{6, 10, 0}, {3, 11, 0}};
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, on, 2, &t2), KVF_OK);
    kvf_move_error err[3];
    size_t n = 0;
    CHECK_STATUS(kvf_wait_errors(f.e, t1, NULL, err, 3, &n), KVF_ERR_IO);
    REQUIRE(n == 1);
    CHECK_EQ_INT(err[0].index, 0);
    CHECK_STR_HAS(err[0].message, "primary slot 2 to secondary slot 3");
    CHECK_STR_HAS(err[0].message, "injected");
    n = 0;
    kvf_status st = kvf_wait_errors(f.e, t2, NULL, err, 3, &n);
    CHECK(st == KVF_ERR_LOST || st == KVF_ERR_NOT_FOUND);
    REQUIRE(n == 1);
    CHECK_EQ_INT(err[0].index, 1);
    CHECK_STATUS(err[0].status, st);
    CHECK_STR_HAS(err[0].message, "secondary slot 3");
    /* a copy between primary slots (the GPU path fails the copies it
     * handed over together: there, every move of the batch) */
    atomic_store(&fail_dst, prim5);
    kvf_move cp[3] = {{0, 4, 0}, {1, 5, 0}, {2, 7, 0}};
    CHECK_STATUS(kvf_copy(f.e, cp, 3, &t1), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_ERR_IO);
    /* kvf_wait names the first failed move and its message */
    CHECK_STR_HAS(kvf_last_error(), "moves failed; move ");
    CHECK_STR_HAS(kvf_last_error(), "injected");
    CHECK_STATUS(kvf_copy(f.e, cp, 3, &t1), KVF_OK);
    CHECK_STATUS(kvf_wait_errors(f.e, t1, NULL, err, 3, &n), KVF_ERR_IO);
    REQUIRE(n >= 1 && n <= 3);
    const kvf_move_error *e1 = NULL;
    for (size_t k = 0; k < n; k++)
        if (err[k].index == 1)
            e1 = &err[k];
    REQUIRE(e1 != NULL);
    CHECK_STR_HAS(e1->message, "primary slot 1 to primary slot 5");
    CHECK_STR_HAS(e1->message, "injected");
    atomic_store(&fail_dst, NULL);
    kvf__set_copy_hook(NULL);
    fx_done(&f);
    return 0;
}

/* More failures than cap: all counted, the first cap given in index
 * order. */
static int test_more_failures_than_cap(void)
{
    fixture f;
    fx_init(&f, NULL);
    enum { N = 600 };
    kvf_key *keys = malloc(N * sizeof *keys);
    kvf_status *per = malloc(N * sizeof *per);
    REQUIRE(keys && per);
    for (uint32_t i = 0; i < N; i++)
        keys[i] = KEY(0x10000 + i);
    kvf__set_io_fault(fault_hook);
    fault_op = "unlink";
    fault_name = ".kvf";
    kvf_ticket t;
    CHECK_STATUS(kvf_remove(f.e, KVF_TIER_DISK, keys, N, &t), KVF_OK);
    kvf_move_error err[5];
    size_t n = 0;
    CHECK_STATUS(kvf_wait_errors(f.e, t, per, err, 5, &n), KVF_ERR_IO);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    CHECK_EQ_INT(n, N);
    for (size_t k = 0; k < 5; k++) {
        CHECK_EQ_INT(err[k].index, k);
        CHECK_STATUS(err[k].status, per[k]);
        char name[KVF_KEY_STR_BYTES + 4];
        snprintf(name, sizeof name, KVF_KEY_FMT ".kvf", KVF_KEY_ARGS(TKEY(keys[k])));
        CHECK_STR_HAS(err[k].message, name);
        CHECK_STR_HAS(err[k].message, strerror(EIO));
    }
    free(keys);
    free(per);
    fx_done(&f);
    return 0;
}

/* One failure in a batch cut into parts, among moves that succeed: the
 * index is the caller's, not the part's. */
static int test_group_indexes(void)
{
    fixture f;
    fx_init(&f, NULL);
    enum { N = 4200 }; /* over PART_MOVES: parts of 512, 1024, 2048 and 616 moves */
    kvf_move *mv = malloc(N * sizeof *mv);
    REQUIRE(mv);
    for (uint32_t i = 0; i < N; i++)
        mv[i] = TO_KEY(i % SLOTS, KEY(0x40000 + i));
    kvf__set_io_fault(fault_hook);
    fault_op = "write";
    fault_name = "0000000000041005."; /* move 4101, in the last part */
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_DISK, mv, N, &t), KVF_OK);
    kvf_move_error err[4];
    size_t n = 0;
    CHECK_STATUS(kvf_wait_errors(f.e, t, NULL, err, 4, &n), KVF_ERR_IO);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    REQUIRE(n == 1);
    CHECK_EQ_INT(err[0].index, 0x1005);
    CHECK_STR_HAS(err[0].message, "0000000000041005.");
    free(mv);
    fx_done(&f);
    return 0;
}

static int test_remote_unreachable(void)
{
    if (!test_store_built("redis"))
        return TEST_SKIP;
    fixture f;
    /* a loopback port nothing listens on: refused at once */
    fx_init(&f, "redis://127.0.0.1:1");
    kvf_move mv[3] = {TO_KEY(0, KEY(0x301)), TO_KEY(1, KEY(0x302)), TO_KEY(2, KEY(0x303))};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_REMOTE, mv, 3, &t), KVF_OK);
    kvf_move_error err[3];
    size_t n = 0;
    kvf_status st = kvf_wait_errors(f.e, t, NULL, err, 3, &n);
    CHECK(st == KVF_ERR_REMOTE || st == KVF_ERR_TIMEOUT);
    REQUIRE(n == 3);
    for (size_t k = 0; k < 3; k++) {
        CHECK_EQ_INT(err[k].index, k);
        char key[32];
        snprintf(key, sizeof key, "%016llx", 0x301ull + k);
        CHECK_STR_HAS(err[k].message, key);
        CHECK_STR_HAS(err[k].message, "127.0.0.1");
    }
    fx_done(&f);
    return 0;
}

static int test_arguments(void)
{
    fixture f;
    fx_init(&f, NULL);
    kvf_move mv = {0, 1, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &mv, 1, &t), KVF_OK);
    size_t n = 7;
    CHECK_STATUS(kvf_wait_errors(f.e, t, NULL, NULL, 2, &n), KVF_ERR_INVALID);
    CHECK_EQ_INT(n, 7);
    /* the ticket survived the refusal; a batch that succeeds keeps nothing */
    CHECK_STATUS(kvf_wait_errors(f.e, t, NULL, NULL, 0, &n), KVF_OK);
    CHECK_EQ_INT(n, 0);
    CHECK_STATUS(kvf_poll_errors(f.e, t, NULL, NULL, 0, NULL), KVF_ERR_UNKNOWN_TICKET);
    CHECK_STATUS(kvf_wait_errors(NULL, t, NULL, NULL, 0, &n), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &mv, 1, &t), KVF_OK);
    kvf_status st;
    while ((st = kvf_poll_errors(f.e, t, NULL, NULL, 0, &n)) == KVF_INPROGRESS)
        ;
    CHECK_STATUS(st, KVF_OK);
    /* a failed batch never waited for: its messages go with the engine */
    kvf_move none = FROM_KEY(KEY(0x999), 2);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_DISK, &none, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
    fx_done(&f);
    return 0;
}

/* The cache's calls: a put whose file writes fail, a get of a damaged
 * file; the indexes are the call's blocks. */
static int test_cache_calls(void)
{
    fixture f;
    fx_init(&f, NULL);
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk.blocks = 64;
    kvf_cache *c;
    REQUIRE(kvf_cache_create(f.e, &cc, &c) == KVF_OK);
    kvf_key keys[5] = {KEY(0x501), KEY(0x502), KEY(0x503), KEY(0x504), KEY(0x505)};
    uint32_t slots[5] = {0, 1, 2, 3, 4};
    kvf__set_io_fault(fault_hook);
    fault_op = "write";
    fault_name = "0000000000000502.";
    kvf_cache_ticket t;
    CHECK_STATUS(kvf_cache_put(c, keys, slots, 5, 50, &t), KVF_OK);
    kvf_move_error err[2];
    kvf_status per[5];
    size_t n = 0;
    CHECK_STATUS(kvf_cache_wait_errors(c, t, per, err, 2, &n), KVF_ERR_IO);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    REQUIRE(n == 1);
    CHECK_EQ_INT(err[0].index, 1);
    CHECK_STATUS(per[1], KVF_ERR_IO);
    CHECK_STR_HAS(err[0].message, "00000000000000000000000000000502");
    CHECK_STR_HAS(err[0].message, "disk");
    CHECK_STR_HAS(err[0].message, f.dir);
    CHECK_STR_HAS(err[0].message, strerror(EIO));
    /* a damaged file, and one whose read fails: two failures, cap 1 */
    char path[512];
    key_file(&f, 0x504, path, sizeof path);
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t byte = 0;
    off_t at = (off_t)kvf__block_prefix_bytes(1) + 3;
    REQUIRE(pread(fd, &byte, 1, at) == 1);
    byte ^= 0x11;
    REQUIRE(pwrite(fd, &byte, 1, at) == 1);
    close(fd);
    kvf_key want[3] = {KEY(0x503), KEY(0x504), KEY(0x505)};
    uint32_t into[3] = {10, 11, 12};
    kvf__set_io_fault(fault_hook);
    fault_op = "read";
    fault_name = "0000000000000505.kvf";
    CHECK_STATUS(kvf_cache_get(c, want, into, 3, &t), KVF_OK);
    n = 0;
    CHECK_STATUS(kvf_cache_wait_errors(c, t, NULL, err, 1, &n), KVF_ERR_CORRUPT);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(err[0].index, 1);
    CHECK_STATUS(err[0].status, KVF_ERR_CORRUPT);
    CHECK_STR_HAS(err[0].message, path);
    CHECK_STR_HAS(err[0].message, "checksum");
    /* plain kvf_cache_wait names the first failed block */
    kvf_key again = KEY(0x503);
    CHECK_STATUS(kvf_cache_get(c, &again, into, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait_errors(c, t, NULL, NULL, 0, &n), KVF_OK);
    CHECK_EQ_INT(n, 0);
    CHECK_STATUS(kvf_cache_wait_errors(c, t, NULL, NULL, 0, &n), KVF_ERR_UNKNOWN_TICKET);
    kvf_cache_destroy(c);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_file_write_faults);
    RUN(test_file_read_faults_and_checksum);
    RUN(test_copy_and_lost_source);
    RUN(test_more_failures_than_cap);
    RUN(test_group_indexes);
    RUN(test_remote_unreachable);
    RUN(test_arguments);
    RUN(test_cache_calls);
    return TEST_RESULT();
}
