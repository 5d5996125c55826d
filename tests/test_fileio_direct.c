/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block files on the O_DIRECT path, on every file I/O runner: alignment
 * edge cases and the padded length rule, one block of a batch failing
 * alone, spare files reused and removed, and O_DIRECT refused (buffered,
 * the same bytes in the same padded files). None needs io_uring or
 * O_DIRECT to pass (tmpfs and containers take the fallbacks).
 */
#include "fileio_fixture.h"

static size_t round_up(size_t n)
{
    return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/* ---- block files on the O_DIRECT path ------------------------------------ */

static int count_named(const char *root, const char *suffix)
{
    DIR *d = opendir(root);
    REQUIRE(d);
    int n = 0;
    struct dirent *e;
    size_t m = strlen(suffix);
    while ((e = readdir(d))) {
        size_t k = strlen(e->d_name);
        n += k >= m && strcmp(e->d_name + k - m, suffix) == 0;
    }
    closedir(d);
    return n;
}

static void block_path(const kvf__blockfile_dir *d, uint64_t key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/" KVF_KEY_FMT ".kvf", d->root, KVF_KEY_ARGS(TKEY(key)));
}

/* A namespace of its own for each runner: every runner starts afresh. */
static int open_dir(const char *ns, kvf_fsync mode, kvf__blockfile_dir *d)
{
    memset(d, 0, sizeof *d);
    char name[64];
    snprintf(name, sizeof name, "%s-%s", ns, engine_name);
    kvf_status st = kvf__blockfile_open_dir(base, name, 0x1234, mode, d);
    CHECK_STATUS(st, KVF_OK);
    d->fio = fio;
    return st != KVF_OK;
}

/* A batch of blocks whose images are one byte short of, exactly at and
 * one byte past the alignment, tiny and large: written at once through
 * aligned staging, each file padded to round_up(64 + payload), read back
 * byte-exact into poisoned aligned buffers, and through the single-block
 * reader with an unaligned buffer of exactly the block's size. */
static int test_direct_alignment(void)
{
    kvf__blockfile_dir d;
    if (open_dir("align", KVF_FSYNC_BATCH, &d))
        return 1;
    static const size_t payloads[] = {0,
                                      1,
                                      ALIGN - PRE - 1,
                                      ALIGN - PRE,
                                      ALIGN - PRE + 1,
                                      ALIGN,
                                      3 * ALIGN + 17,
                                      (1u << 20) + 13};
    enum { N = sizeof payloads / sizeof *payloads };
    kvf__blockfile_io *ios = calloc(N, sizeof *ios);
    REQUIRE(ios);
    uint8_t *want[N];
    for (size_t i = 0; i < N; i++) {
        size_t cap = round_up(PRE + payloads[i]);
        ios[i].buf = aligned_alloc_poisoned(cap);
        ios[i].cap = cap;
        test_fill_random(ios[i].buf + PRE, payloads[i], 500 + i);
        want[i] = malloc(payloads[i] + 1);
        REQUIRE(want[i]);
        memcpy(want[i], ios[i].buf + PRE, payloads[i]);
        ios[i].meta = (kvf__blockfile_meta){TKEY(0x100 + i), 7, 2, payloads[i]};
    }
    kvf__blockfile_write_many(&d, fio, ios, N);
    CHECK_STATUS(kvf__blockfile_fsync_dir(&d), KVF_OK);
    for (size_t i = 0; i < N; i++) {
        CHECK_STATUS(ios[i].status, KVF_OK);
        char p[1024];
        block_path(&d, 0x100 + i, p, sizeof p);
        struct stat st;
        CHECK(stat(p, &st) == 0 && (size_t)st.st_size == round_up(PRE + payloads[i]));
    }
    CHECK_EQ_INT(count_named(d.root, ".tmp"), 0);
    /* read them all back at once */
    for (size_t i = 0; i < N; i++) {
        memset(ios[i].buf, POISON, ios[i].cap);
        memset(&ios[i].meta, 0, sizeof ios[i].meta);
        ios[i].meta.key = TKEY(0x100 + i);
    }
    kvf__blockfile_read_many(&d, fio, ios, N);
    for (size_t i = 0; i < N; i++) {
        CHECK_STATUS(ios[i].status, KVF_OK);
        CHECK_EQ_U64(ios[i].meta.payload_bytes, payloads[i]);
        CHECK(ios[i].meta.tokens == 7 && ios[i].meta.pools == 2);
        CHECK_MEM_EQ(ios[i].buf + PRE, want[i], payloads[i]);
        /* the unaligned single-block reader: exactly header + payload */
        uint8_t *u = malloc(PRE + payloads[i] + 2);
        REQUIRE(u);
        memset(u, POISON, PRE + payloads[i] + 2);
        kvf__blockfile_meta m;
        CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x100 + i), u + 1, PRE + payloads[i], &m),
                     KVF_OK);
        CHECK_MEM_EQ(u + 1 + PRE, want[i], payloads[i]);
        CHECK(u[0] == POISON && u[PRE + payloads[i] + 1] == POISON);
        free(u);
    }
    /* damage in the padding, or a length off the rule, is corrupt */
    size_t i = 2; /* 4095-byte image: 1 byte of padding */
    char p[1024];
    block_path(&d, 0x100 + 3 + 1, p, sizeof p); /* 4097-byte image: 4095 bytes of padding */
    int fd = open(p, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t x = 1;
    CHECK(pwrite(fd, &x, 1, ALIGN + 100) == 1);
    close(fd);
    uint8_t *rb = aligned_alloc_poisoned(2 * ALIGN);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x104), rb, 2 * ALIGN, NULL), KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "padding");
    block_path(&d, 0x100 + i, p, sizeof p);
    CHECK(truncate(p, ALIGN - 1) == 0); /* the exact length: still fine */
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x102), rb, 2 * ALIGN, NULL), KVF_OK);
    CHECK(truncate(p, ALIGN - 2) == 0);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x102), rb, 2 * ALIGN, NULL), KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "truncated");
    block_path(&d, 0x107, p, sizeof p);
    CHECK(truncate(p, (off_t)round_up(PRE + payloads[7]) - 1) == 0); /* padding cut */
    uint8_t *big = aligned_alloc_poisoned(round_up(PRE + payloads[7]) + ALIGN);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x107), big, round_up(PRE + payloads[7]), NULL),
                 KVF_ERR_CORRUPT);
    CHECK(truncate(p, (off_t)round_up(PRE + payloads[7]) + 1) == 0);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x107), big, round_up(PRE + payloads[7]) + 1, NULL),
                 KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "extended");
    free(big);
    free(rb);
    for (size_t k = 0; k < N; k++) {
        free(ios[k].buf);
        free(want[k]);
    }
    free(ios);
    kvf__blockfile_close_dir(&d);
    return 0;
}

/* One block of a batch failing (EIO on its write, ENOSPC on its open, EIO
 * on its read) fails only that block, with a message naming block and
 * file; the others are stored or read byte-exact, and nothing is left. */
static int test_batch_faults(void)
{
    enum { N = 9, LEN = 20000 };
    static const kvf_fsync modes[] = {KVF_FSYNC_NONE, KVF_FSYNC_BATCH, KVF_FSYNC_BLOCK};
    for (int mi = 0; mi < 3; mi++) {
        kvf__blockfile_dir d;
        char ns[32];
        snprintf(ns, sizeof ns, "batch%d", mi);
        if (open_dir(ns, modes[mi], &d))
            return 1;
        kvf__blockfile_io *ios = calloc(N, sizeof *ios);
        REQUIRE(ios);
        size_t cap = round_up(PRE + LEN);
        static const char *const ops[] = {"write", "open", "fsync", "rename"};
        for (int fi = 0; fi < 4; fi++) {
            if (fi == 2 && modes[mi] == KVF_FSYNC_NONE)
                continue;
            if (fi == 2 && modes[mi] == KVF_FSYNC_BATCH)
                continue; /* BATCH's fsync is the batch's syncfs: test_blockfile_format */
            /* fresh keys each round: no spares, so a temporary file's name
             * says whose it is */
            uint64_t key0 = 0x40 + 0x10 * (uint64_t)fi;
            for (int i = 0; i < N; i++) {
                if (!ios[i].buf)
                    ios[i].buf = aligned_alloc_poisoned(cap);
                ios[i].cap = cap;
                test_fill_random(ios[i].buf + PRE, LEN, 900 + (size_t)(fi * N + i));
                ios[i].meta = (kvf__blockfile_meta){TKEY(key0 + (uint64_t)i), 3, 1, LEN};
            }
            kvf__set_io_fault(fault_hook);
            /* block key0+4: its temporary file (open, write, fsync), or its final name */
            char match[64], hex[64];
            snprintf(match, sizeof match,
                     fi == 3 ? "0000000000000000%016llx.kvf" : ".0000000000000000%016llx.",
                     (unsigned long long)(key0 + 4));
            snprintf(hex, sizeof hex,
                     "block 0000000000000000%016llx: ", (unsigned long long)(key0 + 4));
            fault_set(ops[fi], match, EIO, 0);
            kvf__blockfile_write_many(&d, fio, ios, N);
            kvf__set_io_fault(NULL);
            CHECK(fault.hits >= 1);
            for (int i = 0; i < N; i++) {
                if (i == 4) {
                    CHECK_STATUS(ios[i].status, KVF_ERR_IO);
                    CHECK_STR_HAS(ios[i].msg, hex);
                    CHECK_STR_HAS(ios[i].msg, ".kvf: ");
                    CHECK_STR_HAS(ios[i].msg, ops[fi]);
                    continue;
                }
                CHECK_STATUS(ios[i].status, KVF_OK);
            }
            CHECK_EQ_INT(count_named(d.root, ".tmp"), 0);
            /* read back: the failed one is not stored, the rest exact */
            for (int i = 0; i < N; i++) {
                memset(ios[i].buf, POISON, cap);
                ios[i].meta.key = TKEY(key0 + (uint64_t)i);
            }
            kvf__blockfile_read_many(&d, fio, ios, N);
            for (int i = 0; i < N; i++) {
                if (i == 4) {
                    CHECK_STATUS(ios[i].status, KVF_ERR_NOT_FOUND);
                    continue;
                }
                CHECK_STATUS(ios[i].status, KVF_OK);
                uint8_t *want = malloc(LEN);
                REQUIRE(want);
                test_fill_random(want, LEN, 900 + (size_t)(fi * N + i));
                CHECK_MEM_EQ(ios[i].buf + PRE, want, LEN);
                free(want);
            }
        }
        /* EIO reading one block of a batch */
        for (int i = 0; i < N; i++)
            ios[i].meta.key = TKEY(0x40 + (uint64_t)(i == 4 ? 5 : i));
        kvf__set_io_fault(fault_hook);
        fault_set("read", "0000000000000042.kvf", EIO, 0);
        kvf__blockfile_read_many(&d, fio, ios, N);
        kvf__set_io_fault(NULL);
        for (int i = 0; i < N; i++) {
            CHECK_STATUS(ios[i].status, i == 2 ? KVF_ERR_IO : KVF_OK);
            if (i == 2)
                CHECK_STR_HAS(ios[i].msg, "block 00000000000000000000000000000042: ");
        }
        for (int i = 0; i < N; i++)
            free(ios[i].buf);
        free(ios);
        kvf__blockfile_close_dir(&d);
    }
    return 0;
}

/* Reads `key` through the batch reader into io's poisoned buffer; 0 when
 * its payload is the `len` random bytes of `seed`. */
static int expect_one(kvf__blockfile_dir *d, kvf__blockfile_io *io, uint64_t key, uint64_t seed,
                      size_t len)
{
    uint8_t *want = malloc(len);
    REQUIRE(want);
    test_fill_random(want, len, seed);
    memset(io->buf, POISON, io->cap);
    io->meta.key = TKEY(key);
    kvf__blockfile_read_many(d, fio, io, 1);
    int bad = io->status != KVF_OK || memcmp(io->buf + PRE, want, len) != 0;
    if (bad)
        fprintf(stderr, "block " KVF_KEY_FMT ": %s: %s\n", KVF_KEY_ARGS(TKEY(key)),
                kvf_status_str(io->status), io->msg);
    free(want);
    return bad;
}

/* Overwrites leave spares that later writes reuse in place; a failed
 * write into a spare leaves neither it nor the key; close removes the
 * spares; stale ones of a dead writer go when the directory is opened. */
static int test_spares(void)
{
    kvf__blockfile_dir d;
    if (open_dir("spares", KVF_FSYNC_BATCH, &d))
        return 1;
    enum { LEN = 3 * ALIGN };
    size_t cap = round_up(PRE + LEN);
    kvf__blockfile_io io;
    memset(&io, 0, sizeof io);
    io.buf = aligned_alloc_poisoned(cap);
    io.cap = cap;
    for (int round = 0; round < 4; round++) {
        test_fill_random(io.buf + PRE, LEN, 40 + (size_t)round);
        io.meta = (kvf__blockfile_meta){TKEY(0x99), 1, 1, LEN};
        kvf__blockfile_write_many(&d, fio, &io, 1);
        CHECK_STATUS(io.status, KVF_OK);
        /* a replaced file becomes a spare (where the file system can swap),
         * and the next write takes it */
        CHECK(count_named(d.root, ".spare") <= 1);
    }
    CHECK_EQ_INT(expect_one(&d, &io, 0x99, 43, LEN), 0);
    /* a failing write (into the spare, if there is one): the key is gone */
    kvf__set_io_fault(fault_hook);
    fault_set("write", NULL, EIO, 0);
    io.meta = (kvf__blockfile_meta){TKEY(0x99), 1, 1, LEN};
    kvf__blockfile_write_many(&d, fio, &io, 1);
    kvf__set_io_fault(NULL);
    CHECK_STATUS(io.status, KVF_ERR_IO);
    CHECK_EQ_INT(count_named(d.root, ".tmp"), 0);
    CHECK_EQ_INT(count_named(d.root, ".spare"), 0);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x99), io.buf, cap, NULL), KVF_ERR_NOT_FOUND);
    /* a spare of a writer that is gone is removed on open */
    char p[1024];
    snprintf(p, sizeof p, "%s/.0000000000000099.999999999.1.spare", d.root);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fclose(f);
    io.meta = (kvf__blockfile_meta){TKEY(0x99), 1, 1, LEN};
    kvf__blockfile_write_many(&d, fio, &io, 1);
    kvf__blockfile_write_many(&d, fio, &io, 1);
    CHECK(count_named(d.root, ".spare") >= 1);
    kvf__blockfile_close_dir(&d);
    kvf__blockfile_dir d2;
    if (open_dir("spares", KVF_FSYNC_BATCH, &d2))
        return 1;
    kvf__blockfile_remove_stale(&d2);
    CHECK_EQ_INT(count_named(d2.root, ".spare"), 0);
    CHECK_STATUS(kvf__blockfile_read(&d2, TKEY(0x99), io.buf, cap, NULL), KVF_OK);
    kvf__blockfile_close_dir(&d2);
    free(io.buf);
    return 0;
}

/* O_DIRECT refused (as on tmpfs): buffered, once and for all, and the
 * same bytes in the same padded files. */
static int test_direct_refused(void)
{
    kvf__fileio_test_refuse(false, true);
    kvf__blockfile_dir d;
    int rc = open_dir("nodirect", KVF_FSYNC_BLOCK, &d);
    if (!rc) {
        enum { LEN = 5000 };
        size_t cap = round_up(PRE + LEN);
        kvf__blockfile_io io;
        memset(&io, 0, sizeof io);
        io.buf = aligned_alloc_poisoned(cap);
        io.cap = cap;
        test_fill_random(io.buf + PRE, LEN, 3);
        io.meta = (kvf__blockfile_meta){TKEY(0x5), 1, 1, LEN};
        kvf__blockfile_write_many(&d, fio, &io, 1);
        CHECK_STATUS(io.status, KVF_OK);
        CHECK(!atomic_load(&d.direct));
        char p[1024];
        block_path(&d, 0x5, p, sizeof p);
        struct stat st;
        CHECK(stat(p, &st) == 0 && (size_t)st.st_size == cap);
        CHECK_EQ_INT(expect_one(&d, &io, 0x5, 3, LEN), 0);
        free(io.buf);
        kvf__blockfile_close_dir(&d);
    }
    kvf__fileio_test_refuse(false, false);
    return rc;
}

/* the tests run once per file I/O runner */
static void each_engine(void)
{
    RUN(test_direct_alignment);
    RUN(test_batch_faults);
    RUN(test_spares);
    RUN(test_direct_refused);
}

int main(void)
{
    int fds = fio_init();
    fio_each_engine(each_engine);
    fio_fini(fds);
    return TEST_RESULT();
}
