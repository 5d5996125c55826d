/*
 * The file tier's storage layer: CRC-32C, the block file format, and every
 * way a write or read can go wrong (short calls, EINTR, EIO, ENOSPC, files
 * changed behind the library's back).
 */
#include "blockfile.h"
#include "blockhdr.h"
#include "checksum.h"
#include "fileio.h"
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* crc32c.c: the table path, whatever the CPU. */
extern uint32_t kvf__crc32c_sw(uint32_t crc, const void *data, size_t n);

#define FP 0x1234567890abcdefull
#define HDR KVF_BLOCKFILE_HEADER_BYTES
#define POISON 0xA5

static char base[512];   /* the test's temporary directory */
static kvf__fileio *fio; /* the I/O engine of env KVF_FILE_ENGINE, for every directory */
static char files[600];  /* file_dir: base/a/b, created by open_dir */

/* ---- fault hook ---------------------------------------------------------- */

static struct {
    const char *op; /* the op to act on; NULL: none */
    int err;        /* errno to fail with; 0: succeed (maybe short) */
    size_t short_len;
    int skip;  /* let this many matching calls through first */
    int times; /* act on this many calls; -1: all */
    int hits;
    off_t truncate_to; /* >= 0: truncate the file before the call */
    int calls[8];      /* per op, every call seen */
} fault;

static const char *const ops[] = {"open", "write", "read", "fsync", "rename"};

static int fault_hook(const char *op, const char *path, size_t *len_p)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(op, ops[i]) == 0)
            fault.calls[i]++;
    if (!fault.op || strcmp(op, fault.op) != 0)
        return 0;
    if (fault.times == 0)
        return 0;
    /* every matching call is shortened, so that a large one becomes
     * several and `skip` can reach the middle of a file */
    if (fault.short_len && *len_p > fault.short_len)
        *len_p = fault.short_len;
    if (fault.skip > 0) {
        fault.skip--;
        return 0;
    }
    if (fault.times > 0)
        fault.times--;
    fault.hits++;
    if (fault.truncate_to >= 0)
        CHECK(truncate(path, fault.truncate_to) == 0);
    return fault.err;
}

static void fault_set(const char *op, int err, size_t short_len, int skip, int times)
{
    memset(&fault, 0, sizeof fault);
    fault.op = op;
    fault.err = err;
    fault.short_len = short_len;
    fault.skip = skip;
    fault.times = times;
    fault.truncate_to = -1;
}

static void fault_clear(void)
{
    fault_set(NULL, 0, 0, 0, 0);
}

/* ---- helpers ------------------------------------------------------------- */

/* n little-endian bytes at p */
static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static uint8_t *make_block(uint64_t key, uint64_t tag, size_t payload, kvf__blockfile_meta *m)
{
    uint8_t *buf = malloc(HDR + payload + 1);
    REQUIRE(buf);
    memset(buf, 0, HDR);
    test_fill_random(buf + HDR, payload, tag);
    *m = (kvf__blockfile_meta){key, 16, 3, payload};
    return buf;
}

static kvf_status put(kvf__blockfile_dir *d, uint64_t key, uint64_t tag, size_t payload)
{
    kvf__blockfile_meta m;
    uint8_t *buf = make_block(key, tag, payload, &m);
    kvf_status st = kvf__blockfile_write(d, &m, buf);
    free(buf);
    return st;
}

/* Reads `key` into a poisoned buffer and compares with the bytes `tag`
 * made. 0 when byte-exact. */
static int expect(kvf__blockfile_dir *d, uint64_t key, uint64_t tag, size_t payload)
{
    size_t cap = HDR + payload + 100;
    uint8_t *got = malloc(cap), *want = malloc(payload + 1);
    REQUIRE(got && want);
    memset(got, POISON, cap);
    test_fill_random(want, payload, tag);
    kvf__blockfile_meta m;
    memset(&m, 0xEE, sizeof m);
    kvf_status st = kvf__blockfile_read(d, key, got, cap, &m);
    int bad = 0;
    if (st != KVF_OK) {
        fprintf(stderr, "block 0x%llx: %s: %s\n", (unsigned long long)key, kvf_status_str(st),
                kvf_last_error());
        bad = 1;
    } else {
        bad |= test_mem_diff(got + HDR, want, payload) != (size_t)-1;
        bad |= m.key != key || m.tokens != 16 || m.pools != 3 || m.payload_bytes != payload;
        /* nothing written past the block */
        for (size_t i = HDR + payload; i < cap; i++)
            bad |= got[i] != POISON;
        if (bad)
            fprintf(stderr, "block 0x%llx: wrong bytes or meta\n", (unsigned long long)key);
    }
    free(got);
    free(want);
    return bad;
}

static void block_path(const kvf__blockfile_dir *d, uint64_t key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%016llx.kvf", d->root, (unsigned long long)key);
}

static bool exists(const kvf__blockfile_dir *d, uint64_t key)
{
    char p[1024];
    block_path(d, key, p, sizeof p);
    return access(p, F_OK) == 0;
}

/* Leftover temporary files in the namespace directory. */
static int count_tmp(const kvf__blockfile_dir *d)
{
    DIR *dd = opendir(d->root);
    REQUIRE(dd);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        if (e->d_name[0] == '.' && strstr(e->d_name, ".tmp"))
            n++;
    closedir(dd);
    return n;
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    unsigned char c;
    REQUIRE(pread(fd, &c, 1, off) == 1);
    c ^= 0x40;
    REQUIRE(pwrite(fd, &c, 1, off) == 1);
    close(fd);
}

static void copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(in >= 0 && out >= 0);
    char b[65536];
    ssize_t n;
    while ((n = read(in, b, sizeof b)) > 0)
        REQUIRE(write(out, b, (size_t)n) == n);
    close(in);
    close(out);
}

/* Blocks that no fault aimed at may touch. */
#define NBYSTANDERS 3
static const uint64_t bystander_key[NBYSTANDERS] = {0x1, 0xfeedface, 0xffffffffffffffffull};
static const size_t bystander_len[NBYSTANDERS] = {1, 4096, 300000};

static void put_bystanders(kvf__blockfile_dir *d)
{
    for (int i = 0; i < NBYSTANDERS; i++)
        CHECK_STATUS(put(d, bystander_key[i], 500 + i, bystander_len[i]), KVF_OK);
}

static int bystanders_intact(kvf__blockfile_dir *d)
{
    int bad = 0;
    for (int i = 0; i < NBYSTANDERS; i++)
        bad |= expect(d, bystander_key[i], 500 + i, bystander_len[i]);
    bad |= count_tmp(d) != 0;
    return bad;
}

static int open_ns(const char *ns, uint64_t fp, kvf_fsync mode, kvf__blockfile_dir *d)
{
    memset(d, 0, sizeof *d);
    kvf_status st = kvf__blockfile_open_dir(files, ns, fp, mode, d);
    CHECK_STATUS(st, KVF_OK);
    d->fio = fio;
    return st != KVF_OK;
}

/* Opens a namespace as an engine does: stale temporary files removed. */
static int open_clean(const char *ns, kvf__blockfile_dir *d)
{
    if (open_ns(ns, FP, KVF_FSYNC_NONE, d))
        return 1;
    kvf__blockfile_remove_stale(d);
    return 0;
}

/* ---- crc32c -------------------------------------------------------------- */

static int test_crc_vectors(void)
{
    static const char digits[] = "123456789";
    CHECK_EQ_U64(kvf__crc32c(0, digits, 9), 0xE3069283u);
    CHECK_EQ_U64(kvf__crc32c_sw(0, digits, 9), 0xE3069283u);
    CHECK_EQ_U64(kvf__crc32c(0, digits, 0), 0);

    /* RFC 3720, B.4 */
    uint8_t b[32];
    memset(b, 0, 32);
    CHECK_EQ_U64(kvf__crc32c(0, b, 32), 0x8A9136AAu);
    memset(b, 0xff, 32);
    CHECK_EQ_U64(kvf__crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    CHECK_EQ_U64(kvf__crc32c(0, b, 32), 0x46DD794Eu);
    CHECK_EQ_U64(kvf__crc32c_sw(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(31 - i);
    CHECK_EQ_U64(kvf__crc32c(0, b, 32), 0x113FDB5Cu);

    /* chaining at every split point */
    for (size_t k = 0; k <= 9; k++)
        CHECK_EQ_U64(kvf__crc32c(kvf__crc32c(0, digits, k), digits + k, 9 - k), 0xE3069283u);
    return 0;
}

/* The hardware path (three streams, combined) against the tables, on
 * lengths around every stream boundary and at every alignment. */
static int test_crc_hw_matches_sw(void)
{
    enum { MAX = 3 * 8192 * 3 + 1000 };
    uint8_t *buf = malloc(MAX + 8);
    REQUIRE(buf);
    test_fill_random(buf, MAX + 8, 42);
    size_t lens[400];
    size_t n = 0;
    for (size_t l = 0; l < 80; l++)
        lens[n++] = l;
    static const size_t edges[] = {256 * 3, 8192 * 3, 8192 * 6};
    for (int e = 0; e < 3; e++)
        for (int d = -17; d <= 17; d++)
            lens[n++] = (size_t)((long)edges[e] + d);
    uint64_t s = 7;
    while (n < 400)
        lens[n++] = test_xorshift64(&s) % MAX;
    int mismatches = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t a = 0; a < 8; a++) {
            uint32_t hw = kvf__crc32c(0, buf + a, lens[i]);
            uint32_t sw = kvf__crc32c_sw(0, buf + a, lens[i]);
            if (hw != sw && mismatches++ < 5)
                fprintf(stderr, "len %zu align %zu: 0x%08x != 0x%08x\n", lens[i], a, hw, sw);
            /* chained in two pieces, the second misaligned */
            size_t k = lens[i] / 3;
            uint32_t ch = kvf__crc32c(kvf__crc32c(0, buf + a, k), buf + a + k, lens[i] - k);
            if (ch != sw && mismatches++ < 5)
                fprintf(stderr, "len %zu align %zu chained: 0x%08x != 0x%08x\n", lens[i], a, ch,
                        sw);
        }
    CHECK_EQ_INT(mismatches, 0);
    /* one large buffer, beyond every stream length */
    size_t big = 5u << 20;
    uint8_t *bb = malloc(big);
    REQUIRE(bb);
    test_fill_random(bb, big, 3);
    CHECK_EQ_U64(kvf__crc32c(0, bb, big), kvf__crc32c_sw(0, bb, big));
    free(bb);
    free(buf);
    return 0;
}

/* ---- directories --------------------------------------------------------- */

static int test_namespaces(void)
{
    static const char *const bad[] = {"", ".", "..", "a/b", "a b", "ä", "x\n", "../up", "*"};
    kvf__blockfile_dir d;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&d, 0, sizeof d);
        CHECK_STATUS(kvf__blockfile_open_dir(files, bad[i], FP, KVF_FSYNC_NONE, &d),
                     KVF_ERR_INVALID);
        CHECK(d.root == NULL);
    }
    char ns[80];
    memset(ns, 'n', 65);
    ns[65] = '\0';
    CHECK_STATUS(kvf__blockfile_open_dir(files, ns, FP, KVF_FSYNC_NONE, &d), KVF_ERR_INVALID);
    ns[64] = '\0';
    if (!open_ns(ns, FP, KVF_FSYNC_NONE, &d))
        kvf__blockfile_close_dir(&d);
    if (!open_ns("A-z_0.9", FP, KVF_FSYNC_NONE, &d))
        kvf__blockfile_close_dir(&d);
    CHECK_STATUS(kvf__blockfile_open_dir(NULL, "x", FP, KVF_FSYNC_NONE, &d), KVF_ERR_INVALID);

    /* NULL is "default"; the path is created with its parents */
    if (!open_ns(NULL, FP, KVF_FSYNC_NONE, &d)) {
        char want[1024];
        snprintf(want, sizeof want, "%s/default", files);
        CHECK(strcmp(d.root, want) == 0);
        struct stat st;
        CHECK(stat(want, &st) == 0 && S_ISDIR(st.st_mode));
        kvf__blockfile_close_dir(&d);
    }
    /* a trailing slash does not change the directory */
    char slash[700];
    snprintf(slash, sizeof slash, "%s//", files);
    memset(&d, 0, sizeof d);
    CHECK_STATUS(kvf__blockfile_open_dir(slash, "default", FP, KVF_FSYNC_NONE, &d), KVF_OK);
    if (d.root) {
        char want[1024];
        snprintf(want, sizeof want, "%s/default", files);
        CHECK(strcmp(d.root, want) == 0);
    }
    kvf__blockfile_close_dir(&d);

    /* a file where a directory should be */
    char f[700];
    snprintf(f, sizeof f, "%s/plainfile", base);
    int fd = open(f, O_WRONLY | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    close(fd);
    CHECK_STATUS(kvf__blockfile_open_dir(f, "x", FP, KVF_FSYNC_NONE, &d), KVF_ERR_IO);
    CHECK_STR_HAS(kvf_last_error(), f);

    /* a failed open leaves a struct that close accepts, whatever it held */
    memset(&d, 0x5a, sizeof d);
    CHECK_STATUS(kvf__blockfile_open_dir(files, "a/b", FP, KVF_FSYNC_NONE, &d), KVF_ERR_INVALID);
    CHECK(d.root == NULL && d.dir_fd == -1);
    kvf__blockfile_close_dir(&d);
    memset(&d, 0x5a, sizeof d);
    CHECK_STATUS(kvf__blockfile_open_dir(f, "x", FP, KVF_FSYNC_NONE, &d), KVF_ERR_IO);
    CHECK(d.root == NULL && d.dir_fd == -1);
    kvf__blockfile_close_dir(&d);
    /* and an open one closes twice */
    if (!open_ns("twice", FP, KVF_FSYNC_NONE, &d)) {
        kvf__blockfile_close_dir(&d);
        CHECK(d.root == NULL && d.dir_fd == -1);
        kvf__blockfile_close_dir(&d);
    }

    /* closing is safe on a zeroed struct, and twice */
    memset(&d, 0, sizeof d);
    kvf__blockfile_close_dir(&d);
    kvf__blockfile_close_dir(&d);
    kvf__blockfile_close_dir(NULL);
    return 0;
}

/* ---- round trips --------------------------------------------------------- */

static int test_round_trip(void)
{
    kvf__blockfile_dir d;
    if (open_ns("rt", FP, KVF_FSYNC_BLOCK, &d))
        return 1;
    static const size_t sizes[] = {0, 1, 7, 4096, 65537, (1u << 20) + 13};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        CHECK_STATUS(put(&d, 0x2a + i, 10 + i, sizes[i]), KVF_OK);
        CHECK_EQ_INT(expect(&d, 0x2a + i, 10 + i, sizes[i]), 0);
    }

    /* the file on disk: name, length, header fields */
    char p[1024];
    block_path(&d, 0x2a + 3, p, sizeof p);
    CHECK_STR_HAS(p, "/000000000000002d.kvf");
    struct stat st;
    CHECK(stat(p, &st) == 0 && st.st_size == (off_t)(HDR + 4096));
    CHECK((st.st_mode & 0600) == 0600 && (st.st_mode & 0111) == 0);
    uint8_t h[HDR];
    int fd = open(p, O_RDONLY);
    REQUIRE(fd >= 0);
    CHECK(pread(fd, h, HDR, 0) == HDR);
    close(fd);
    CHECK(memcmp(h, "KVFBLK\r\n", 8) == 0);
    CHECK_EQ_INT(le(h + 8, 4), 1);   /* version */
    CHECK_EQ_INT(le(h + 12, 4), 64); /* header bytes */
    CHECK_EQ_U64(le(h + 16, 8), FP);
    CHECK_EQ_U64(le(h + 24, 8), fnv1a64("rt"));
    CHECK_EQ_U64(le(h + 32, 8), 0x2d);
    CHECK_EQ_INT(le(h + 40, 4), 16); /* tokens */
    CHECK_EQ_INT(le(h + 44, 4), 3);  /* pools */
    CHECK_EQ_U64(le(h + 48, 8), 4096);
    {
        uint8_t want[4096];
        test_fill_random(want, sizeof want, 10 + 3);
        CHECK_EQ_U64(le(h + 56, 4), kvf__crc32c(0, want, sizeof want));
    }
    CHECK_EQ_U64(le(h + 60, 4), kvf__crc32c(0, h, 60));

    /* overwrite: another size, other bytes */
    CHECK_STATUS(put(&d, 0x2a, 99, 5000), KVF_OK);
    CHECK_EQ_INT(expect(&d, 0x2a, 99, 5000), 0);
    CHECK_STATUS(put(&d, 0x2a, 98, 10), KVF_OK);
    CHECK_EQ_INT(expect(&d, 0x2a, 98, 10), 0);

    /* not found names the file */
    uint8_t buf[256];
    kvf__blockfile_meta m = {7, 7, 7, 7};
    CHECK_STATUS(kvf__blockfile_read(&d, 0xabcdef, buf, sizeof buf, &m), KVF_ERR_NOT_FOUND);
    CHECK_STR_HAS(kvf_last_error(), "block 0xabcdef");
    CHECK_STR_HAS(kvf_last_error(), "0000000000abcdef.kvf: not stored");
    CHECK(m.key == 7 && m.payload_bytes == 7); /* untouched on failure */

    /* a buffer too small: refused, and not written to */
    memset(buf, POISON, sizeof buf);
    CHECK_STATUS(kvf__blockfile_read(&d, 0x2a + 3, buf, sizeof buf, &m), KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "does not fit");
    CHECK_STATUS(kvf__blockfile_read(&d, 0x2a + 3, buf, 10, &m), KVF_ERR_RANGE);
    CHECK_STATUS(kvf__blockfile_read(&d, 0x2a + 3, buf, HDR + 4095, &m), KVF_ERR_RANGE);
    for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != POISON) {
            TEST_FAIL_AT(__FILE__, __LINE__, "refused read wrote byte %zu", i);
            break;
        }
    CHECK(m.key == 7 && m.payload_bytes == 7);
    /* exactly the block's size is enough */
    {
        uint8_t *exact = malloc(HDR + 4096);
        REQUIRE(exact);
        CHECK_STATUS(kvf__blockfile_read(&d, 0x2a + 3, exact, HDR + 4096, &m), KVF_OK);
        CHECK_EQ_U64(m.payload_bytes, 4096);
        free(exact);
    }
    /* a missing block is not found, whatever the buffer */
    CHECK_STATUS(kvf__blockfile_read(&d, 0xabcdef, buf, 1, NULL), KVF_ERR_NOT_FOUND);
    CHECK(exists(&d, 0x2a + 3)); /* a refused read removes nothing */

    /* every fsync mode writes the same file; count the syncs */
    kvf__set_io_fault(fault_hook);
    for (int mode = 0; mode < 3; mode++) {
        kvf__blockfile_dir d2;
        if (open_ns("rt", FP, (kvf_fsync)mode, &d2))
            continue;
        fault_clear();
        CHECK_STATUS(put(&d2, 0x77, 5 + mode, 1000), KVF_OK);
        /* NONE 0, BATCH 0 (the batch's syncfs does it all), BLOCK 2 (file, dir) */
        CHECK_EQ_INT(fault.calls[3], mode == KVF_FSYNC_BATCH ? 0 : mode);
        CHECK_EQ_INT(expect(&d, 0x77, 5 + mode, 1000), 0);
        CHECK_STATUS(kvf__blockfile_fsync_dir(&d2), KVF_OK);
        CHECK_EQ_INT(fault.calls[3], mode == KVF_FSYNC_BATCH ? 1 : mode + 1);
        kvf__blockfile_close_dir(&d2);
    }
    /* BATCH with an fsync per file instead of a syncfs per batch */
    {
        kvf__blockfile_dir d2;
        setenv("KVF_FSYNC_METHOD", "fsync", 1);
        int rc = open_ns("rt", FP, KVF_FSYNC_BATCH, &d2);
        unsetenv("KVF_FSYNC_METHOD");
        if (!rc) {
            fault_clear();
            CHECK_STATUS(put(&d2, 0x78, 9, 1000), KVF_OK);
            CHECK_EQ_INT(fault.calls[3], 1);
            CHECK_STATUS(kvf__blockfile_fsync_dir(&d2), KVF_OK);
            CHECK_EQ_INT(fault.calls[3], 2);
            CHECK_EQ_INT(expect(&d, 0x78, 9, 1000), 0);
            kvf__blockfile_close_dir(&d2);
        }
    }
    kvf__set_io_fault(NULL);
    CHECK_EQ_INT(count_tmp(&d), 0);
    kvf__blockfile_close_dir(&d);
    return 0;
}

static int test_mismatch(void)
{
    kvf__blockfile_dir a, other_fp, b;
    if (open_ns("mm-a", FP, KVF_FSYNC_NONE, &a))
        return 1;
    CHECK_STATUS(put(&a, 5, 1, 2000), KVF_OK);
    uint8_t *buf = malloc(HDR + 2000);
    REQUIRE(buf);
    kvf__blockfile_meta m;

    /* the same namespace under another layout */
    if (!open_ns("mm-a", FP ^ 1, KVF_FSYNC_NONE, &other_fp)) {
        CHECK_STATUS(kvf__blockfile_read(&other_fp, 5, buf, HDR + 2000, &m), KVF_ERR_MISMATCH);
        CHECK_STR_HAS(kvf_last_error(), "layout");
        kvf__blockfile_close_dir(&other_fp);
    }
    /* a file copied into another namespace */
    if (!open_ns("mm-b", FP, KVF_FSYNC_NONE, &b)) {
        char from[1024], to[1024];
        block_path(&a, 5, from, sizeof from);
        block_path(&b, 5, to, sizeof to);
        copy_file(from, to);
        CHECK_STATUS(kvf__blockfile_read(&b, 5, buf, HDR + 2000, &m), KVF_ERR_MISMATCH);
        CHECK_STR_HAS(kvf_last_error(), "namespace");
        /* and one renamed to another key */
        block_path(&a, 6, to, sizeof to);
        copy_file(from, to);
        CHECK_STATUS(kvf__blockfile_read(&a, 6, buf, HDR + 2000, &m), KVF_ERR_CORRUPT);
        kvf__blockfile_close_dir(&b);
    }
    CHECK_EQ_INT(expect(&a, 5, 1, 2000), 0);
    free(buf);
    kvf__blockfile_close_dir(&a);
    return 0;
}

/* Files damaged behind the library's back are refused, never served. */
static int test_corruption(void)
{
    kvf__blockfile_dir d;
    if (open_ns("corrupt", FP, KVF_FSYNC_NONE, &d))
        return 1;
    put_bystanders(&d);
    enum { LEN = 10000 };
    size_t cap = HDR + LEN + 64;
    uint8_t *buf = malloc(cap);
    REQUIRE(buf);
    char p[1024];
    block_path(&d, 0x99, p, sizeof p);
    kvf__blockfile_meta m;

    struct {
        const char *what;
        off_t truncate_to; /* -1: no */
        off_t flip;        /* -1: no */
        size_t append;
        const char *detail;
    } cases[] = {
        {"truncated by one", HDR + LEN - 1, -1, 0, "truncated"},
        {"truncated to the header", HDR, -1, 0, "truncated"},
        {"truncated inside the header", 10, -1, 0, "truncated"},
        {"empty", 0, -1, 0, "truncated"},
        {"extended", -1, -1, 1, "extended"},
        {"payload byte flipped", -1, HDR + 1234, 0, "checksum mismatch"},
        {"last payload byte flipped", -1, HDR + LEN - 1, 0, "checksum mismatch"},
        {"magic flipped", -1, 0, 0, "magic"},
        {"version flipped", -1, 8, 0, "version"},
        {"tokens flipped", -1, 40, 0, "header checksum"},
        {"payload length flipped", -1, 49, 0, "header checksum"},
        {"payload crc flipped", -1, 57, 0, "checksum"},
        {"header crc flipped", -1, 62, 0, "header checksum"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK_STATUS(put(&d, 0x99, 77, LEN), KVF_OK);
        if (cases[i].truncate_to >= 0)
            CHECK(truncate(p, cases[i].truncate_to) == 0);
        if (cases[i].flip >= 0)
            flip_byte(p, cases[i].flip);
        if (cases[i].append) {
            int fd = open(p, O_WRONLY | O_APPEND);
            REQUIRE(fd >= 0);
            CHECK(write(fd, "x", 1) == 1);
            close(fd);
        }
        memset(buf, POISON, cap);
        kvf_status st = kvf__blockfile_read(&d, 0x99, buf, cap, &m);
        if (st != KVF_ERR_CORRUPT || !strstr(kvf_last_error(), cases[i].detail))
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: %s: %s", cases[i].what, kvf_status_str(st),
                         kvf_last_error());
        CHECK_STR_HAS(kvf_last_error(), "block 0x99: ");
        CHECK_STR_HAS(kvf_last_error(), p);
    }
    CHECK_EQ_INT(bystanders_intact(&d), 0);
    free(buf);
    kvf__blockfile_close_dir(&d);
    return 0;
}

/* ---- faults -------------------------------------------------------------- */

/* A write fails with `err` on the `skip`-th call of `op`: the status is
 * `want`, and the key's file, old or new, is gone. */
static void write_fault(kvf__blockfile_dir *d, const char *op, int err, int skip, size_t short_len,
                        kvf_status want, const char *text)
{
    static uint64_t next = 0x5000;
    uint64_t key = next++;
    CHECK_STATUS(put(d, key, 1, 20000), KVF_OK); /* the old version */
    fault_set(op, err, short_len, skip, 1);
    kvf_status st = put(d, key, 2, 20000);
    if (st != want)
        TEST_FAIL_AT(__FILE__, __LINE__, "%s errno %d: %s, want %s (%s)", op, err,
                     kvf_status_str(st), kvf_status_str(want), kvf_last_error());
    CHECK_EQ_INT(fault.hits, 1);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvf_last_error());
    fault_clear();
    char hex[64];
    snprintf(hex, sizeof hex, "block 0x%llx: ", (unsigned long long)key);
    CHECK_STR_HAS(msg, hex);
    CHECK_STR_HAS(msg, text);
    CHECK(!exists(d, key));
    uint8_t b[HDR];
    CHECK_STATUS(kvf__blockfile_read(d, key, b, sizeof b, NULL), KVF_ERR_NOT_FOUND);
    CHECK_EQ_INT(bystanders_intact(d), 0);
}

static int test_write_faults(void)
{
    kvf__blockfile_dir d;
    if (open_ns("wfault", FP, KVF_FSYNC_BLOCK, &d))
        return 1;
    put_bystanders(&d);
    kvf__set_io_fault(fault_hook);

    /* short writes, all the way: still byte-exact */
    fault_set("write", 0, 7, 0, -1);
    CHECK_STATUS(put(&d, 0x10, 3, 5000), KVF_OK);
    CHECK(fault.hits > 700);
    fault_set("write", 0, 4093, 0, -1);
    CHECK_STATUS(put(&d, 0x11, 4, 300001), KVF_OK);
    fault_clear();
    CHECK_EQ_INT(expect(&d, 0x10, 3, 5000), 0);
    CHECK_EQ_INT(expect(&d, 0x11, 4, 300001), 0);
    /* EINTR, several times, on open and write */
    fault_set("write", EINTR, 1000, 1, 5);
    CHECK_STATUS(put(&d, 0x12, 5, 7000), KVF_OK);
    CHECK_EQ_INT(fault.hits, 5);
    fault_set("open", EINTR, 0, 0, 2);
    CHECK_STATUS(put(&d, 0x13, 6, 7000), KVF_OK);
    CHECK_EQ_INT(fault.hits, 2);
    /* and on each fsync (file, directory) and the rename */
    for (int skip = 0; skip < 2; skip++) {
        fault_set("fsync", EINTR, 0, skip, 1);
        CHECK_STATUS(put(&d, 0x14 + (uint64_t)skip, 7, 7000), KVF_OK);
        CHECK_EQ_INT(fault.hits, 1);
        CHECK_EQ_INT(fault.calls[3], 3);
    }
    fault_set("rename", EINTR, 0, 0, 1);
    CHECK_STATUS(put(&d, 0x16, 8, 7000), KVF_OK);
    CHECK_EQ_INT(fault.hits, 1);
    fault_clear();
    CHECK_EQ_INT(expect(&d, 0x14, 7, 7000), 0);
    CHECK_EQ_INT(expect(&d, 0x15, 7, 7000), 0);
    CHECK_EQ_INT(expect(&d, 0x16, 8, 7000), 0);
    CHECK_EQ_INT(expect(&d, 0x12, 5, 7000), 0);
    CHECK_EQ_INT(expect(&d, 0x13, 6, 7000), 0);

    char enospc[64];
    snprintf(enospc, sizeof enospc, "write: %s", strerror(ENOSPC));
    write_fault(&d, "write", EIO, 0, 0, KVF_ERR_IO, "write: ");
    write_fault(&d, "write", EIO, 3, 1000, KVF_ERR_IO, ".kvf: write: ");
    write_fault(&d, "write", ENOSPC, 0, 0, KVF_ERR_NO_SPACE, enospc);
    write_fault(&d, "write", ENOSPC, 2, 512, KVF_ERR_NO_SPACE, enospc);
    write_fault(&d, "write", EDQUOT, 0, 0, KVF_ERR_NO_SPACE, "write: ");
    write_fault(&d, "open", EIO, 0, 0, KVF_ERR_IO, "open: ");
    write_fault(&d, "open", ENOSPC, 0, 0, KVF_ERR_NO_SPACE, "open: ");
    write_fault(&d, "open", ENOENT, 0, 0, KVF_ERR_IO, "open: ");
    write_fault(&d, "fsync", EIO, 0, 0, KVF_ERR_IO, "fsync: ");
    write_fault(&d, "fsync", EIO, 1, 0, KVF_ERR_IO, "fsync: "); /* the directory's */
    write_fault(&d, "rename", EIO, 0, 0, KVF_ERR_IO, "rename: ");

    /* a new key failing leaves nothing either */
    fault_set("write", EIO, 0, 0, 1);
    CHECK_STATUS(put(&d, 0x6000, 1, 100), KVF_ERR_IO);
    fault_clear();
    CHECK(!exists(&d, 0x6000));
    CHECK_EQ_INT(bystanders_intact(&d), 0);

    fault_set("fsync", EIO, 0, 0, 1);
    CHECK_STATUS(kvf__blockfile_fsync_dir(&d), KVF_ERR_IO);
    fault_clear();
    kvf__set_io_fault(NULL);
    kvf__blockfile_close_dir(&d);
    return 0;
}

static int test_read_faults(void)
{
    kvf__blockfile_dir d;
    if (open_ns("rfault", FP, KVF_FSYNC_NONE, &d))
        return 1;
    put_bystanders(&d);
    enum { LEN = 100003 };
    CHECK_STATUS(put(&d, 0x20, 8, LEN), KVF_OK);
    kvf__set_io_fault(fault_hook);

    /* short reads: byte-exact, header and payload in pieces */
    static const size_t shorts[] = {1, 5, 63, 4096};
    for (size_t i = 0; i < 4; i++) {
        fault_set("read", 0, shorts[i], 0, shorts[i] < 5 ? 200 : -1);
        CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);
        CHECK(fault.hits > 1);
    }
    /* EINTR */
    fault_set("read", EINTR, 0, 0, 3);
    CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);
    fault_set("read", EINTR, 0, 1, 3);
    CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);
    fault_set("open", EINTR, 0, 0, 3);
    CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);

    uint8_t *buf = malloc(HDR + LEN);
    REQUIRE(buf);
    kvf__blockfile_meta m;
    /* EIO on the first call and on a later one (the file read in 4 KiB pieces) */
    for (int skip = 0; skip < 2; skip++) {
        fault_set("read", EIO, 4096, skip, 1);
        CHECK_STATUS(kvf__blockfile_read(&d, 0x20, buf, HDR + LEN, &m), KVF_ERR_IO);
        CHECK_STR_HAS(kvf_last_error(), "block 0x20: ");
        CHECK_STR_HAS(kvf_last_error(), "read: ");
        CHECK_EQ_INT(fault.hits, 1);
    }
    fault_set("open", EACCES, 0, 0, 1);
    CHECK_STATUS(kvf__blockfile_read(&d, 0x20, buf, HDR + LEN, &m), KVF_ERR_IO);
    /* the file shrinks between fstat and the payload's read: the read
     * sees end of file and must call it corrupt, not pad with zeros */
    fault_set("read", 0, 4096, 1, 1);
    fault.truncate_to = HDR + 100;
    CHECK_STATUS(kvf__blockfile_read(&d, 0x20, buf, HDR + LEN, &m), KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "short read");
    fault_clear();
    kvf__set_io_fault(NULL);
    CHECK_STATUS(put(&d, 0x20, 8, LEN), KVF_OK);
    CHECK_EQ_INT(expect(&d, 0x20, 8, LEN), 0);
    CHECK_EQ_INT(bystanders_intact(&d), 0);
    free(buf);
    kvf__blockfile_close_dir(&d);
    return 0;
}

/* ---- concurrency --------------------------------------------------------- */

typedef struct writer {
    kvf__blockfile_dir *d;
    uint64_t tag;
    int fails;
} writer;

static void *write_loop(void *arg)
{
    writer *w = arg;
    for (int i = 0; i < 50; i++)
        if (put(w->d, 0x4242, w->tag, 30000 + (size_t)w->tag) != KVF_OK)
            w->fails++;
    return NULL;
}

/* Writers of one key never share a temporary file: the survivor is one
 * complete version. */
static int test_concurrent_writers(void)
{
    kvf__blockfile_dir d;
    if (open_ns("conc", FP, KVF_FSYNC_NONE, &d))
        return 1;
    writer w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (writer){&d, (uint64_t)i + 1, 0};
        REQUIRE(pthread_create(&t[i], NULL, write_loop, &w[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_INT(w[i].fails, 0);
    }
    int matches = 0;
    for (uint64_t tag = 1; tag <= 4; tag++) {
        uint8_t *buf = malloc(HDR + 30004);
        kvf__blockfile_meta m;
        if (kvf__blockfile_read(&d, 0x4242, buf, HDR + 30004, &m) == KVF_OK &&
            m.payload_bytes == 30000 + tag)
            matches += expect(&d, 0x4242, tag, 30000 + tag) == 0;
        free(buf);
    }
    CHECK_EQ_INT(matches, 1);
    CHECK_EQ_INT(count_tmp(&d), 0);
    kvf__blockfile_close_dir(&d);
    return 0;
}

/* ---- scan ---------------------------------------------------------------- */

typedef struct scan_seen {
    int ok, corrupt, torn, mismatch, other;
    uint64_t torn_key;
} scan_seen;

static void visit(void *arg, uint64_t key, kvf_status st, const char *detail)
{
    scan_seen *s = arg;
    if (st == KVF_OK)
        s->ok++;
    else if (st == KVF_ERR_CORRUPT && strcmp(detail, "torn write (temporary file)") == 0) {
        s->torn++;
        s->torn_key = key;
    } else if (st == KVF_ERR_CORRUPT)
        s->corrupt++;
    else if (st == KVF_ERR_MISMATCH)
        s->mismatch++;
    else
        s->other++;
}

static int test_scan(void)
{
    kvf__blockfile_dir d;
    if (open_ns("scan", FP, KVF_FSYNC_NONE, &d))
        return 1;
    put_bystanders(&d);
    CHECK_STATUS(put(&d, 0xc0, 1, 2000000), KVF_OK); /* larger than any before */
    CHECK_STATUS(put(&d, 0xc1, 2, 100), KVF_OK);
    char p[1024];
    block_path(&d, 0xc1, p, sizeof p);
    flip_byte(p, HDR + 5);
    /* a write interrupted by a crash, and files that are not blocks */
    snprintf(p, sizeof p, "%s/.%016llx.1234.0.tmp", d.root, 0xdeadull);
    int fd = open(p, O_WRONLY | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    CHECK(write(fd, "partial", 7) == 7);
    close(fd);
    snprintf(p, sizeof p, "%s/README", d.root);
    copy_file("/dev/null", p);
    snprintf(p, sizeof p, "%s/00000000000000zz.kvf", d.root);
    copy_file("/dev/null", p);
    /* a huge file with a zeroed header: refused on its header, without
     * sizing a buffer from its length (sparse; skipped where unsupported) */
    int huge = 0;
    snprintf(p, sizeof p, "%s/%016llx.kvf", d.root, 0xc2ull);
    copy_file("/dev/null", p);
    if (truncate(p, (off_t)64 << 30) == 0)
        huge = 1;
    else
        unlink(p);

    scan_seen s = {0};
    CHECK_STATUS(kvf__blockfile_scan(&d, visit, &s), KVF_OK);
    CHECK_EQ_INT(s.ok, NBYSTANDERS + 1);
    CHECK_EQ_INT(s.corrupt, 1 + huge);
    CHECK_EQ_INT(s.torn, 1);
    CHECK_EQ_U64(s.torn_key, 0xdead);
    CHECK_EQ_INT(s.mismatch + s.other, 0);

    /* fsck's view: fingerprint 0 checks every layout; a known one flags
     * the others */
    kvf__blockfile_dir any, other;
    if (!open_ns("scan", 0, KVF_FSYNC_NONE, &any)) {
        memset(&s, 0, sizeof s);
        CHECK_STATUS(kvf__blockfile_scan(&any, visit, &s), KVF_OK);
        CHECK_EQ_INT(s.ok, NBYSTANDERS + 1);
        kvf__blockfile_close_dir(&any);
    }
    if (!open_ns("scan", FP + 1, KVF_FSYNC_NONE, &other)) {
        memset(&s, 0, sizeof s);
        CHECK_STATUS(kvf__blockfile_scan(&other, visit, &s), KVF_OK);
        CHECK_EQ_INT(s.mismatch, NBYSTANDERS + 2); /* the damaged one too */
        kvf__blockfile_close_dir(&other);
    }
    if (huge) {
        snprintf(p, sizeof p, "%s/%016llx.kvf", d.root, 0xc2ull);
        unlink(p);
    }
    CHECK_STATUS(kvf__blockfile_scan(&d, NULL, &s), KVF_ERR_INVALID);
    kvf__blockfile_close_dir(&d);
    return 0;
}

/* ---- stale temporary files ----------------------------------------------- */

static void touch(const char *root, const char *name)
{
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", root, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    CHECK(write(fd, "partial", 7) == 7);
    close(fd);
}

static bool name_exists(const char *root, const char *name)
{
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", root, name);
    return access(p, F_OK) == 0;
}

/* The pid of a child that has exited and been reaped: no process has it
 * (until the kernel hands it out again, which takes a wrap of pid_max). */
static pid_t dead_pid(void)
{
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0)
        _exit(0);
    int ws;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    return pid;
}

/* an engine's open removes the temporary files of writers that are gone, and
 * only those: a live writer's, and names it did not write, stay. */
static int test_stale_tmp(void)
{
    kvf__blockfile_dir d;
    if (open_clean("stale", &d))
        return 1;
    put_bystanders(&d);
    char *root = strdup(d.root);
    REQUIRE(root);
    kvf__blockfile_close_dir(&d);

    long dead = (long)dead_pid(), dead2 = (long)dead_pid(), me = (long)getpid();
    char gone[3][96], keep[12][96];
    snprintf(gone[0], 96, ".%016llx.%ld.0.tmp", 0xabcull, dead);
    snprintf(gone[1], 96, ".%016llx.%ld.18446744073709551615.tmp", 0xffffffffffffffffull, dead);
    snprintf(gone[2], 96, ".%016llx.%ld.7.tmp", 0x1ull, dead2); /* a bystander's key */
    /* this process's own: a write in flight */
    snprintf(keep[0], 96, ".%016llx.%ld.3.tmp", 0xabcull, me);
    /* the parent (the test runner): alive, maybe not ours to signal */
    snprintf(keep[1], 96, ".%016llx.%ld.0.tmp", 0xabdull, (long)getppid());
    /* not names a writer gives, whatever the pid */
    snprintf(keep[2], 96, ".%016llx.%ld.tmp", 0xabcull, dead);
    snprintf(keep[3], 96, ".%016llx.%ld.x.tmp", 0xabcull, dead);
    snprintf(keep[4], 96, ".%015llx.%ld.0.tmp", 0xabcull, dead);
    snprintf(keep[5], 96, ".%016llx.%ld.0.tmp.bak", 0xabcull, dead);
    snprintf(keep[6], 96, ".%016llx.0.0.tmp", 0xabcull);  /* kill(0) is the group */
    snprintf(keep[7], 96, ".%016llx.-1.0.tmp", 0xabcull); /* kill(-1) is everyone */
    snprintf(keep[8], 96, ".%016llx.4294967297.0.tmp", 0xabcull);
    snprintf(keep[9], 96, ".%016llx.%ld.0.TMP", 0xabcull, dead);
    snprintf(keep[10], 96, "%016llx.%ld.0.tmp", 0xabcull, dead);
    snprintf(keep[11], 96, ".%016llX.%ld.0.tmp", 0xabcull, dead);
    for (int i = 0; i < 3; i++)
        touch(root, gone[i]);
    for (int i = 0; i < 12; i++)
        touch(root, keep[i]);

    if (open_clean("stale", &d)) {
        free(root);
        return 1;
    }
    for (int i = 0; i < 3; i++)
        if (name_exists(root, gone[i]))
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: not removed", gone[i]);
    for (int i = 0; i < 12; i++)
        if (!name_exists(root, keep[i]))
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: removed", keep[i]);
    for (int i = 0; i < NBYSTANDERS; i++)
        CHECK_EQ_INT(expect(&d, bystander_key[i], 500 + i, bystander_len[i]), 0);

    /* scan still reports what is left (fsck's view): the live writer's
     * files and the other well-formed-looking leftovers, as torn */
    scan_seen s = {0};
    CHECK_STATUS(kvf__blockfile_scan(&d, visit, &s), KVF_OK);
    CHECK_EQ_INT(s.ok, NBYSTANDERS);
    CHECK_EQ_INT(s.torn, 7); /* keep[0..3] and keep[6..8] */
    CHECK_EQ_INT(s.corrupt + s.mismatch + s.other, 0);
    kvf__blockfile_close_dir(&d);

    /* reopening again changes nothing more */
    if (!open_clean("stale", &d)) {
        for (int i = 0; i < 12; i++)
            CHECK(name_exists(root, keep[i]));
        kvf__blockfile_close_dir(&d);
    }
    free(root);
    return 0;
}

static int test_bad_args(void)
{
    kvf__blockfile_dir closed;
    memset(&closed, 0, sizeof closed);
    uint8_t buf[HDR + 8];
    kvf__blockfile_meta m = {1, 1, 1, 8};
    CHECK_STATUS(kvf__blockfile_write(&closed, &m, buf), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__blockfile_read(&closed, 1, buf, sizeof buf, &m), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__blockfile_fsync_dir(&closed), KVF_ERR_INVALID);
    kvf__blockfile_dir d;
    if (open_ns("args", FP, KVF_FSYNC_NONE, &d))
        return 1;
    CHECK_STATUS(kvf__blockfile_write(&d, NULL, buf), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__blockfile_write(&d, &m, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__blockfile_read(&d, 1, NULL, 100, &m), KVF_ERR_INVALID);
    m.payload_bytes = UINT64_MAX - 10;
    CHECK_STATUS(kvf__blockfile_write(&d, &m, buf), KVF_ERR_RANGE);
    /* even a refused write leaves no old version to serve */
    CHECK_STATUS(put(&d, 1, 1, 8), KVF_OK);
    CHECK_STATUS(kvf__blockfile_write(&d, &m, buf), KVF_ERR_RANGE);
    CHECK(!exists(&d, 1));
    kvf__blockfile_close_dir(&d);
    return 0;
}

int main(void)
{
    int fds = test_count_fds();
    if (test_tmpdir(base, sizeof base) != 0)
        TEST_SKIP_ALL("no temporary directory");
    snprintf(files, sizeof files, "%s/a/b", base);
    /* the same tests on each I/O engine: ctest runs this once per engine */
    const char *engine = getenv("KVF_FILE_ENGINE");
    if (engine && *engine) {
        kvf_file_engine want =
            strcmp(engine, "uring") == 0 ? KVF_FILE_ENGINE_URING : KVF_FILE_ENGINE_THREADS;
        REQUIRE(kvf__fileio_create(want, 8, 2, &fio) == KVF_OK);
        printf("file i/o engine: %s\n",
               kvf__fileio_engine(fio) == KVF_FILE_ENGINE_URING ? "io_uring" : "threads");
    }

    RUN(test_crc_vectors);
    RUN(test_crc_hw_matches_sw);
    RUN(test_namespaces);
    RUN(test_round_trip);
    RUN(test_mismatch);
    RUN(test_corruption);
    RUN(test_write_faults);
    RUN(test_read_faults);
    RUN(test_concurrent_writers);
    RUN(test_scan);
    RUN(test_stale_tmp);
    RUN(test_bad_args);

    kvf__set_io_fault(NULL);
    kvf__fileio_destroy(fio);
    if (fds >= 0)
        CHECK_EQ_INT(test_count_fds(), fds);
    test_rmtree(base);
    return TEST_RESULT();
}
