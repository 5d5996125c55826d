/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The file I/O runners (io_uring, threads, inline): raw ops of many files
 * at once byte-exact on random data into poisoned buffers, faults
 * confined to the op they hit, io_uring refused (a pool of threads
 * instead), and an engine's file I/O runner forced by config. None needs
 * io_uring or O_DIRECT to pass (tmpfs and containers take the fallbacks).
 */
#include "fileio_fixture.h"

/* ---- raw ops through the runner ------------------------------------------ */

/* One file per op, with O_DIRECT where the file system takes it, and a
 * write op of `len` random bytes (seed + i) into it; dst poisoned. */
typedef struct raw_files {
    int n;
    kvf__fio_op ops[40];
    uint8_t *src[40], *dst[40];
    int fds[40];
    char paths[40][600];
} raw_files;

static void raw_open(raw_files *r, const char *tag, int n, size_t len, uint64_t seed)
{
    r->n = n;
    for (int i = 0; i < n; i++) {
        snprintf(r->paths[i], sizeof r->paths[i], "%s/%s%02d", base, tag, i);
        int fd = open(r->paths[i], O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
        bool direct = fd >= 0;
        if (fd < 0)
            fd = open(r->paths[i], O_RDWR | O_CREAT | O_TRUNC, 0644);
        REQUIRE(fd >= 0);
        r->fds[i] = fd;
        r->src[i] = aligned_alloc_poisoned(len);
        r->dst[i] = aligned_alloc_poisoned(len);
        test_fill_random(r->src[i], len, seed + (uint64_t)i);
        r->ops[i] = (kvf__fio_op){.kind = KVF_FIO_WRITE,
                                  .fd = fd,
                                  .buf = r->src[i],
                                  .len = len,
                                  .need = len,
                                  .path = r->paths[i],
                                  .direct = direct};
    }
}

/* Links the ops as `kind` into dst (reads) or from src; returns the list. */
static kvf__fio_op *raw_list(raw_files *r, kvf__fio_kind kind)
{
    for (int i = 0; i < r->n; i++) {
        r->ops[i].kind = kind;
        r->ops[i].buf = kind == KVF_FIO_READ ? r->dst[i] : r->src[i];
        r->ops[i].next = i + 1 < r->n ? &r->ops[i + 1] : NULL;
    }
    return r->ops;
}

static void raw_close(raw_files *r)
{
    for (int i = 0; i < r->n; i++) {
        close(r->fds[i]);
        unlink(r->paths[i]);
        free(r->src[i]);
        free(r->dst[i]);
    }
}

/* Writes n files of `len` bytes each at once, reads them back into
 * poisoned buffers, compares; with O_DIRECT where the file system takes it. */
static int test_ops_round_trip(void)
{
    static const size_t lens[] = {ALIGN, 3 * ALIGN, 65536, 1 << 20};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        size_t len = lens[li];
        raw_files *r = malloc(sizeof *r);
        REQUIRE(r);
        raw_open(r, "raw", 40, len, 1000 * li);
        kvf__fileio_runner_run(fio, raw_list(r, KVF_FIO_WRITE));
        for (int i = 0; i < r->n; i++) {
            CHECK_EQ_INT(r->ops[i].err, 0);
            CHECK_EQ_U64(r->ops[i].done, len);
        }
        kvf__fileio_runner_run(fio, raw_list(r, KVF_FIO_READ));
        for (int i = 0; i < r->n; i++) {
            CHECK_EQ_INT(r->ops[i].err, 0);
            CHECK_EQ_U64(r->ops[i].done, len);
            CHECK_MEM_EQ(r->dst[i], r->src[i], len);
        }
        kvf__fileio_runner_run(fio, raw_list(r, KVF_FIO_FSYNC));
        for (int i = 0; i < r->n; i++) {
            CHECK_EQ_INT(r->ops[i].err, 0);
            CHECK(r->ops[i].synced);
        }
        raw_close(r);
        free(r);
    }
    return 0;
}

/* Faults hit only their op: EIO on one file of many, short calls of odd
 * lengths (O_DIRECT dropped, bytes still exact), EINTR retried. */
static int test_ops_faults(void)
{
    enum { N = 12, LEN = 5 * ALIGN };
    raw_files *r = malloc(sizeof *r);
    REQUIRE(r);
    raw_open(r, "fault", N, LEN, 77);
    kvf__set_io_fault(fault_hook);
    fault_set("write", "fault03", EIO, 0);
    kvf__fileio_runner_run(fio, raw_list(r, KVF_FIO_WRITE));
    CHECK_EQ_INT(fault.hits, 1);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(r->ops[i].err, i == 3 ? EIO : 0);
    /* short writes of an odd length: continued to the end */
    fault_set("write", "fault0", 0, 1000);
    kvf__fileio_runner_run(fio, raw_list(r, KVF_FIO_WRITE));
    CHECK(fault.hits > 10 * 20);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(r->ops[i].err, 0);
        CHECK_EQ_U64(r->ops[i].done, LEN);
    }
    /* reads: EIO on one, short on all, EINTR on some */
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 0)
            fault_set("read", "fault07", EIO, 0);
        else if (pass == 1)
            fault_set("read", NULL, 0, 333);
        else
            fault_set("read", "fault1", EINTR, 0);
        if (pass == 2)
            fault.times = 5; /* an injected EINTR is retried */
        for (int i = 0; i < N; i++)
            memset(r->dst[i], POISON, LEN);
        kvf__fileio_runner_run(fio, raw_list(r, KVF_FIO_READ));
        if (pass == 2)
            CHECK_EQ_INT(fault.hits, 5);
        for (int i = 0; i < N; i++) {
            if (pass == 0 && i == 7) {
                CHECK_EQ_INT(r->ops[i].err, EIO);
                CHECK(r->dst[i][0] == POISON);
                continue;
            }
            CHECK_EQ_INT(r->ops[i].err, 0);
            CHECK_EQ_U64(r->ops[i].done, LEN);
            CHECK_MEM_EQ(r->dst[i], r->src[i], LEN);
        }
    }
    /* a read past the end: eof, done = the file's bytes */
    CHECK(ftruncate(r->fds[0], 100) == 0);
    fault_set(NULL, NULL, 0, 0);
    raw_list(r, KVF_FIO_READ);
    r->ops[0].next = NULL;
    memset(r->dst[0], POISON, LEN);
    kvf__fileio_runner_run(fio, &r->ops[0]);
    CHECK_EQ_INT(r->ops[0].err, 0);
    CHECK(r->ops[0].eof);
    CHECK_EQ_U64(r->ops[0].done, 100);
    CHECK_MEM_EQ(r->dst[0], r->src[0], 100);
    kvf__set_io_fault(NULL);
    raw_close(r);
    free(r);
    return 0;
}

/* ---- fallbacks ------------------------------------------------------------ */

/* io_uring refused (as in a container): the runner is a pool of threads,
 * and works. */
static int test_uring_refused(void)
{
    kvf__fileio_test_refuse(true, false);
    kvf__fileio_runner *io = NULL;
    CHECK_STATUS(kvf__fileio_runner_create(KVF_FILE_RUNNER_URING, 4, 2, &io), KVF_OK);
    kvf__fileio_test_refuse(false, false);
    REQUIRE(io);
    CHECK(kvf__fileio_runner_type(io) == KVF_FILE_RUNNER_THREADS);
    kvf__fileio_runner *saved = fio;
    fio = io;
    int rc = test_ops_round_trip();
    fio = saved;
    kvf__fileio_runner_destroy(io);
    kvf__fileio_runner_destroy(NULL);
    return rc;
}

/* An engine on each I/O runner, forced by config, moves blocks through
 * files byte-exact; a bad enum is refused. */
static int test_engine_config(void)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.dir = base;
    cfg.file.namespace_ = "cfg";
    cfg.file.runner = (kvf_file_runner)7;
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    static const kvf_file_runner engines[] = {KVF_FILE_RUNNER_AUTO, KVF_FILE_RUNNER_URING,
                                              KVF_FILE_RUNNER_THREADS};
    for (int k = 0; k < 3; k++) {
        cfg.file.runner = engines[k];
        cfg.file.queue_depth = k == 2 ? 3 : 0;
        REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
        kvf_geometry g = {2, 2, 3, 16, 100, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, 20};
        REQUIRE(kvf_engine_add_pool(e, &g, &prim, NULL, NULL) == KVF_OK);
        size_t bytes;
        REQUIRE(kvf_geometry_block_bytes(&g, &bytes) == KVF_OK);
        kvf_move mv[10];
        for (uint32_t i = 0; i < 10; i++) {
            void *s;
            REQUIRE(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, i, &s) == KVF_OK);
            test_fill_random(s, bytes, 60 + i + 100 * (uint64_t)k);
            mv[i] = test_move(KVF_TIER_DISK, true, i, 0x700 + i, i % 3 == 0 ? 5 : 0);
        }
        kvf_ticket t;
        CHECK_STATUS(kvf_offload(e, KVF_TIER_DISK, mv, 10, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
        for (uint32_t i = 0; i < 10; i++) {
            void *s;
            REQUIRE(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 10 + i, &s) == KVF_OK);
            memset(s, POISON, bytes);
            mv[i] = test_move(KVF_TIER_DISK, false, 0x700 + i, 10 + i, i % 3 == 0 ? 5 : 0);
        }
        CHECK_STATUS(kvf_onboard(e, KVF_TIER_DISK, mv, 10, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
        uint8_t *want = malloc(bytes);
        REQUIRE(want);
        kvf_region r;
        REQUIRE(kvf_geometry_region(&g, 5, &r) == KVF_OK);
        for (uint32_t i = 0; i < 10; i++) {
            void *s;
            REQUIRE(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 10 + i, &s) == KVF_OK);
            test_fill_random(want, bytes, 60 + i + 100 * (uint64_t)k);
            if (i % 3 != 0) {
                CHECK_MEM_EQ(s, want, bytes);
                continue;
            }
            /* a partial block: the rows of 5 tokens moved, the rest poisoned */
            const uint8_t *got = s;
            for (size_t row = 0; row < r.rows; row++) {
                CHECK_MEM_EQ(got + row * r.pitch, want + row * r.pitch, r.row_bytes);
                CHECK(got[row * r.pitch + r.row_bytes] == POISON);
            }
        }
        free(want);
        kvf_engine_destroy(e);
    }
    return 0;
}

/* the tests run once per file I/O runner */
static void each_engine(void)
{
    RUN(test_ops_round_trip);
    RUN(test_ops_faults);
}

int main(void)
{
    int fds = fio_init();
    fio_each_engine(each_engine);
    RUN(test_uring_refused);
    RUN(test_engine_config);
    fio_fini(fds);
    return TEST_RESULT();
}
