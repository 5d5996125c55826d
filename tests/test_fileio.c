/*
 * The file I/O engines (io_uring, threads, inline) and the file tier's
 * O_DIRECT path: byte-exact transfers on random data into poisoned
 * buffers, faults confined to the op or block they hit, O_DIRECT alignment
 * edge cases and the padded length rule, spare files, and the fallbacks
 * (io_uring refused -> threads, O_DIRECT refused -> buffered). Each test
 * runs on every engine this machine offers; none needs io_uring or
 * O_DIRECT to pass (tmpfs and containers take the fallbacks).
 */
#include "blockfile.h"
#include "blockhdr.h"
#include "fileio.h"
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HDR KVF_BLOCKFILE_HEADER_BYTES
#define ALIGN KVF_FILE_ALIGN
#define POISON 0xA5

static char base[512];
static const char *engine_name = "inline";
static kvf__fileio *fio; /* the engine under test; NULL: inline */

static size_t round_up(size_t n)
{
    return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

static uint8_t *aligned_alloc_poisoned(size_t n)
{
    void *p = NULL;
    REQUIRE(posix_memalign(&p, ALIGN, n ? n : ALIGN) == 0);
    memset(p, POISON, n);
    return p;
}

/* ---- fault hook: one path, one op ---------------------------------------- */

static struct {
    const char *op;
    const char *path_has; /* only calls on a path containing this */
    int err;
    size_t short_len; /* > 0: every matching call at most this long */
    int times;        /* act on this many calls; -1: all */
    int hits;
} fault;

static int fault_hook(const char *op, const char *path, size_t *len_p)
{
    if (!fault.op || strcmp(op, fault.op) != 0)
        return 0;
    if (fault.path_has && !strstr(path, fault.path_has))
        return 0;
    /* hooks run on the engines' threads: take one of `times` atomically */
    int t = __atomic_load_n(&fault.times, __ATOMIC_RELAXED);
    while (t > 0 && !__atomic_compare_exchange_n(&fault.times, &t, t - 1, false, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED))
        ;
    if (t == 0)
        return 0;
    __atomic_add_fetch(&fault.hits, 1, __ATOMIC_RELAXED);
    if (fault.short_len && *len_p > fault.short_len)
        *len_p = fault.short_len;
    return fault.err;
}

static void fault_set(const char *op, const char *path_has, int err, size_t short_len)
{
    fault.op = op;
    fault.path_has = path_has;
    fault.err = err;
    fault.short_len = short_len;
    fault.times = -1;
    fault.hits = 0;
}

/* ---- raw ops through the engine ------------------------------------------ */

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
        kvf__fileio_run(fio, raw_list(r, KVF_FIO_WRITE));
        for (int i = 0; i < r->n; i++) {
            CHECK_EQ_INT(r->ops[i].err, 0);
            CHECK_EQ_U64(r->ops[i].done, len);
        }
        kvf__fileio_run(fio, raw_list(r, KVF_FIO_READ));
        for (int i = 0; i < r->n; i++) {
            CHECK_EQ_INT(r->ops[i].err, 0);
            CHECK_EQ_U64(r->ops[i].done, len);
            CHECK_MEM_EQ(r->dst[i], r->src[i], len);
        }
        kvf__fileio_run(fio, raw_list(r, KVF_FIO_FSYNC));
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
    kvf__fileio_run(fio, raw_list(r, KVF_FIO_WRITE));
    CHECK_EQ_INT(fault.hits, 1);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(r->ops[i].err, i == 3 ? EIO : 0);
    /* short writes of an odd length: continued to the end */
    fault_set("write", "fault0", 0, 1000);
    kvf__fileio_run(fio, raw_list(r, KVF_FIO_WRITE));
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
        kvf__fileio_run(fio, raw_list(r, KVF_FIO_READ));
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
    kvf__fileio_run(fio, &r->ops[0]);
    CHECK_EQ_INT(r->ops[0].err, 0);
    CHECK(r->ops[0].eof);
    CHECK_EQ_U64(r->ops[0].done, 100);
    CHECK_MEM_EQ(r->dst[0], r->src[0], 100);
    kvf__set_io_fault(NULL);
    raw_close(r);
    free(r);
    return 0;
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
    snprintf(out, cap, "%s/%016llx.kvf", d->root, (unsigned long long)key);
}

/* A namespace of its own for each engine: every engine starts afresh. */
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
                                      ALIGN - HDR - 1,
                                      ALIGN - HDR,
                                      ALIGN - HDR + 1,
                                      ALIGN,
                                      3 * ALIGN + 17,
                                      (1u << 20) + 13};
    enum { N = sizeof payloads / sizeof *payloads };
    kvf__blockfile_io *ios = calloc(N, sizeof *ios);
    REQUIRE(ios);
    uint8_t *want[N];
    for (size_t i = 0; i < N; i++) {
        size_t cap = round_up(HDR + payloads[i]);
        ios[i].buf = aligned_alloc_poisoned(cap);
        ios[i].cap = cap;
        test_fill_random(ios[i].buf + HDR, payloads[i], 500 + i);
        want[i] = malloc(payloads[i] + 1);
        REQUIRE(want[i]);
        memcpy(want[i], ios[i].buf + HDR, payloads[i]);
        ios[i].meta = (kvf__blockfile_meta){0x100 + i, 7, 2, payloads[i]};
    }
    kvf__blockfile_write_many(&d, fio, ios, N);
    CHECK_STATUS(kvf__blockfile_fsync_dir(&d), KVF_OK);
    for (size_t i = 0; i < N; i++) {
        CHECK_STATUS(ios[i].status, KVF_OK);
        char p[1024];
        block_path(&d, 0x100 + i, p, sizeof p);
        struct stat st;
        CHECK(stat(p, &st) == 0 && (size_t)st.st_size == round_up(HDR + payloads[i]));
    }
    CHECK_EQ_INT(count_named(d.root, ".tmp"), 0);
    /* read them all back at once */
    for (size_t i = 0; i < N; i++) {
        memset(ios[i].buf, POISON, ios[i].cap);
        memset(&ios[i].meta, 0, sizeof ios[i].meta);
        ios[i].meta.key = 0x100 + i;
    }
    kvf__blockfile_read_many(&d, fio, ios, N);
    for (size_t i = 0; i < N; i++) {
        CHECK_STATUS(ios[i].status, KVF_OK);
        CHECK_EQ_U64(ios[i].meta.payload_bytes, payloads[i]);
        CHECK(ios[i].meta.tokens == 7 && ios[i].meta.pools == 2);
        CHECK_MEM_EQ(ios[i].buf + HDR, want[i], payloads[i]);
        /* the unaligned single-block reader: exactly header + payload */
        uint8_t *u = malloc(HDR + payloads[i] + 2);
        REQUIRE(u);
        memset(u, POISON, HDR + payloads[i] + 2);
        kvf__blockfile_meta m;
        CHECK_STATUS(kvf__blockfile_read(&d, 0x100 + i, u + 1, HDR + payloads[i], &m), KVF_OK);
        CHECK_MEM_EQ(u + 1 + HDR, want[i], payloads[i]);
        CHECK(u[0] == POISON && u[HDR + payloads[i] + 1] == POISON);
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
    CHECK_STATUS(kvf__blockfile_read(&d, 0x104, rb, 2 * ALIGN, NULL), KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "padding");
    block_path(&d, 0x100 + i, p, sizeof p);
    CHECK(truncate(p, ALIGN - 1) == 0); /* the exact length: still fine */
    CHECK_STATUS(kvf__blockfile_read(&d, 0x102, rb, 2 * ALIGN, NULL), KVF_OK);
    CHECK(truncate(p, ALIGN - 2) == 0);
    CHECK_STATUS(kvf__blockfile_read(&d, 0x102, rb, 2 * ALIGN, NULL), KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "truncated");
    block_path(&d, 0x107, p, sizeof p);
    CHECK(truncate(p, (off_t)round_up(HDR + payloads[7]) - 1) == 0); /* padding cut */
    uint8_t *big = aligned_alloc_poisoned(round_up(HDR + payloads[7]) + ALIGN);
    CHECK_STATUS(kvf__blockfile_read(&d, 0x107, big, round_up(HDR + payloads[7]), NULL),
                 KVF_ERR_CORRUPT);
    CHECK(truncate(p, (off_t)round_up(HDR + payloads[7]) + 1) == 0);
    CHECK_STATUS(kvf__blockfile_read(&d, 0x107, big, round_up(HDR + payloads[7]) + 1, NULL),
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
        size_t cap = round_up(HDR + LEN);
        static const char *const ops[] = {"write", "open", "fsync", "rename"};
        for (int fi = 0; fi < 4; fi++) {
            if (fi == 2 && modes[mi] == KVF_FSYNC_NONE)
                continue;
            if (fi == 2 && modes[mi] == KVF_FSYNC_BATCH)
                continue; /* BATCH's fsync is the batch's syncfs: test_blockfile */
            /* fresh keys each round: no spares, so a temporary file's name
             * says whose it is */
            uint64_t key0 = 0x40 + 0x10 * (uint64_t)fi;
            for (int i = 0; i < N; i++) {
                if (!ios[i].buf)
                    ios[i].buf = aligned_alloc_poisoned(cap);
                ios[i].cap = cap;
                test_fill_random(ios[i].buf + HDR, LEN, 900 + (size_t)(fi * N + i));
                ios[i].meta = (kvf__blockfile_meta){key0 + (uint64_t)i, 3, 1, LEN};
            }
            kvf__set_io_fault(fault_hook);
            /* block key0+4: its temporary file (open, write, fsync), or its final name */
            char match[64], hex[32];
            snprintf(match, sizeof match, fi == 3 ? "%016llx.kvf" : ".%016llx.",
                     (unsigned long long)(key0 + 4));
            snprintf(hex, sizeof hex, "block 0x%llx: ", (unsigned long long)(key0 + 4));
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
                ios[i].meta.key = key0 + (uint64_t)i;
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
                CHECK_MEM_EQ(ios[i].buf + HDR, want, LEN);
                free(want);
            }
        }
        /* EIO reading one block of a batch */
        for (int i = 0; i < N; i++)
            ios[i].meta.key = 0x40 + (uint64_t)(i == 4 ? 5 : i);
        kvf__set_io_fault(fault_hook);
        fault_set("read", "0000000000000042.kvf", EIO, 0);
        kvf__blockfile_read_many(&d, fio, ios, N);
        kvf__set_io_fault(NULL);
        for (int i = 0; i < N; i++) {
            CHECK_STATUS(ios[i].status, i == 2 ? KVF_ERR_IO : KVF_OK);
            if (i == 2)
                CHECK_STR_HAS(ios[i].msg, "block 0x42: ");
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
    io->meta.key = key;
    kvf__blockfile_read_many(d, fio, io, 1);
    int bad = io->status != KVF_OK || memcmp(io->buf + HDR, want, len) != 0;
    if (bad)
        fprintf(stderr, "block 0x%llx: %s: %s\n", (unsigned long long)key,
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
    size_t cap = round_up(HDR + LEN);
    kvf__blockfile_io io;
    memset(&io, 0, sizeof io);
    io.buf = aligned_alloc_poisoned(cap);
    io.cap = cap;
    for (int round = 0; round < 4; round++) {
        test_fill_random(io.buf + HDR, LEN, 40 + (size_t)round);
        io.meta = (kvf__blockfile_meta){0x99, 1, 1, LEN};
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
    io.meta = (kvf__blockfile_meta){0x99, 1, 1, LEN};
    kvf__blockfile_write_many(&d, fio, &io, 1);
    kvf__set_io_fault(NULL);
    CHECK_STATUS(io.status, KVF_ERR_IO);
    CHECK_EQ_INT(count_named(d.root, ".tmp"), 0);
    CHECK_EQ_INT(count_named(d.root, ".spare"), 0);
    CHECK_STATUS(kvf__blockfile_read(&d, 0x99, io.buf, cap, NULL), KVF_ERR_NOT_FOUND);
    /* a spare of a writer that is gone is removed on open */
    char p[1024];
    snprintf(p, sizeof p, "%s/.0000000000000099.999999999.1.spare", d.root);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fclose(f);
    io.meta = (kvf__blockfile_meta){0x99, 1, 1, LEN};
    kvf__blockfile_write_many(&d, fio, &io, 1);
    kvf__blockfile_write_many(&d, fio, &io, 1);
    CHECK(count_named(d.root, ".spare") >= 1);
    kvf__blockfile_close_dir(&d);
    kvf__blockfile_dir d2;
    if (open_dir("spares", KVF_FSYNC_BATCH, &d2))
        return 1;
    kvf__blockfile_remove_stale(&d2);
    CHECK_EQ_INT(count_named(d2.root, ".spare"), 0);
    CHECK_STATUS(kvf__blockfile_read(&d2, 0x99, io.buf, cap, NULL), KVF_OK);
    kvf__blockfile_close_dir(&d2);
    free(io.buf);
    return 0;
}

/* ---- fallbacks ------------------------------------------------------------ */

/* io_uring refused (as in a container): the engine is a pool of threads,
 * and works. */
static int test_uring_refused(void)
{
    kvf__fileio_test_refuse(true, false);
    kvf__fileio *io = NULL;
    CHECK_STATUS(kvf__fileio_create(KVF_FILE_ENGINE_URING, 4, 2, &io), KVF_OK);
    kvf__fileio_test_refuse(false, false);
    REQUIRE(io);
    CHECK(kvf__fileio_engine(io) == KVF_FILE_ENGINE_THREADS);
    kvf__fileio *saved = fio;
    fio = io;
    int rc = test_ops_round_trip();
    fio = saved;
    kvf__fileio_destroy(io);
    kvf__fileio_destroy(NULL);
    return rc;
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
        size_t cap = round_up(HDR + LEN);
        kvf__blockfile_io io;
        memset(&io, 0, sizeof io);
        io.buf = aligned_alloc_poisoned(cap);
        io.cap = cap;
        test_fill_random(io.buf + HDR, LEN, 3);
        io.meta = (kvf__blockfile_meta){0x5, 1, 1, LEN};
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

/* An engine on each I/O engine, forced by config, moves blocks through
 * files byte-exact; a bad enum is refused. */
static int test_engine_config(void)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file_dir = base;
    cfg.file_namespace = "cfg";
    cfg.file_engine = (kvf_file_engine)7;
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    static const kvf_file_engine engines[] = {KVF_FILE_ENGINE_AUTO, KVF_FILE_ENGINE_URING,
                                              KVF_FILE_ENGINE_THREADS};
    for (int k = 0; k < 3; k++) {
        cfg.file_engine = engines[k];
        cfg.file_queue_depth = k == 2 ? 3 : 0;
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
            mv[i] = (kvf_move){i, 0x700 + i, i % 3 == 0 ? 5 : 0};
        }
        kvf_ticket t;
        CHECK_STATUS(kvf_offload(e, KVF_TIER_FILE, mv, 10, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
        for (uint32_t i = 0; i < 10; i++) {
            void *s;
            REQUIRE(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 10 + i, &s) == KVF_OK);
            memset(s, POISON, bytes);
            mv[i] = (kvf_move){0x700 + i, 10 + i, i % 3 == 0 ? 5 : 0};
        }
        CHECK_STATUS(kvf_onboard(e, KVF_TIER_FILE, mv, 10, &t), KVF_OK);
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

int main(void)
{
    int fds = test_count_fds();
    if (test_tmpdir(base, sizeof base) != 0)
        TEST_SKIP_ALL("no temporary directory");
    /* every test on every engine: inline (NULL), threads, io_uring */
    for (int k = 0; k < 3; k++) {
        fio = NULL;
        if (k > 0) {
            kvf_file_engine want = k == 1 ? KVF_FILE_ENGINE_THREADS : KVF_FILE_ENGINE_URING;
            REQUIRE(kvf__fileio_create(want, 8, 2, &fio) == KVF_OK);
            if (k == 2 && kvf__fileio_engine(fio) != KVF_FILE_ENGINE_URING) {
                printf("skip io_uring: not built or refused here\n");
                kvf__fileio_destroy(fio);
                continue;
            }
        }
        engine_name = k == 0 ? "inline" : k == 1 ? "threads" : "io_uring";
        printf("-- %s\n", engine_name);
        RUN(test_ops_round_trip);
        RUN(test_ops_faults);
        RUN(test_direct_alignment);
        RUN(test_batch_faults);
        RUN(test_spares);
        RUN(test_direct_refused);
        kvf__fileio_destroy(fio);
        fio = NULL;
    }
    RUN(test_uring_refused);
    RUN(test_engine_config);
    kvf__set_io_fault(NULL);
    if (fds >= 0)
        CHECK_EQ_INT(test_count_fds(), fds);
    test_rmtree(base);
    return TEST_RESULT();
}
