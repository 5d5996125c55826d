/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The file tier's block files: CRC-32C (the published vectors, the
 * hardware path against the tables), namespaces and their directories,
 * round trips of every size, blocks of another layout or namespace
 * refused, writers of one key never sharing a temporary file, and bad
 * arguments.
 */
#include "blockfile_fixture.h"

/* crc32c.c: the table path, whatever the CPU. */
extern uint32_t kvf__crc32c_sw(uint32_t crc, const void *data, size_t n);

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
    CHECK_STR_HAS(p, "/0000000000000000000000000000002d.kvf");
    struct stat st;
    CHECK(stat(p, &st) == 0 && st.st_size == (off_t)(PRE + 4096));
    CHECK((st.st_mode & 0600) == 0600 && (st.st_mode & 0111) == 0);
    uint8_t h[PRE];
    int fd = open(p, O_RDONLY);
    REQUIRE(fd >= 0);
    CHECK(pread(fd, h, PRE, 0) == PRE);
    close(fd);
    CHECK(memcmp(h, "KVFBLK\r\n", 8) == 0);
    CHECK_EQ_INT(le(h + 8, 4), 3);    /* version */
    CHECK_EQ_INT(le(h + 12, 4), 128); /* header bytes */
    CHECK_EQ_U64(le(h + 16, 8), FP);
    CHECK_EQ_U64(le(h + 24, 8), fnv1a64("rt"));
    CHECK_EQ_U64(le(h + 32, 8), 0);    /* key, high half */
    CHECK_EQ_U64(le(h + 40, 8), 0x2d); /* key, low half */
    CHECK_EQ_INT(le(h + 48, 4), 16);   /* tokens */
    CHECK_EQ_INT(le(h + 52, 4), 3);    /* pools */
    CHECK_EQ_U64(le(h + 56, 8), 4096);
    {
        /* the pool table at 128: three pools splitting the payload evenly
         * (the remainder in the last), each with its CRC-32C, zeros to 256;
         * its own CRC in the header */
        uint8_t want[4096];
        test_fill_random(want, sizeof want, 10 + 3);
        CHECK_EQ_U64(le(h + 64, 4), kvf__crc32c(0, h + 128, 128));
        const uint32_t split[3] = {1365, 1365, 1366};
        size_t off = 0;
        for (int k = 0; k < 3; k++) {
            CHECK_EQ_U64(le(h + 128 + 8 * k, 4), split[k]);
            CHECK_EQ_U64(le(h + 132 + 8 * k, 4), kvf__crc32c(0, want + off, split[k]));
            off += split[k];
        }
        for (size_t i = 128 + 24; i < PRE; i++)
            CHECK_EQ_INT(h[i], 0);
    }
    for (size_t i = 68; i < 124; i++)
        CHECK_EQ_INT(h[i], 0); /* reserved */
    CHECK_EQ_U64(le(h + 124, 4), kvf__crc32c(0, h, 124));
    /* a reserved byte set, the header CRC made right: still refused */
    {
        uint8_t hb[PRE];
        memcpy(hb, h, PRE);
        hb[100] = 1;
        uint32_t crc = kvf__crc32c(0, hb, 124);
        for (int k = 0; k < 4; k++)
            hb[124 + k] = (uint8_t)(crc >> (8 * k));
        kvf__block_header bh;
        CHECK_STATUS(kvf__block_header_parse(hb, "test", &bh), KVF_ERR_CORRUPT);
        CHECK_STR_HAS(kvf_last_error(), "reserved header byte 100");
    }
    /* the high half of a key: in its file's name and its header */
    {
        const kvf_key big = {0x0123456789abcdefull, 0x2d};
        uint8_t *buf = calloc(1, PRE + 64);
        REQUIRE(buf);
        kvf__blockfile_meta m = {big, 1, 1, 64};
        CHECK_STATUS(kvf__blockfile_write(&d, &m, buf), KVF_OK);
        char q[1024];
        snprintf(q, sizeof q, "%s/0123456789abcdef000000000000002d.kvf", d.root);
        fd = open(q, O_RDONLY);
        CHECK(fd >= 0);
        if (fd >= 0) {
            CHECK(pread(fd, h, PRE, 0) == PRE);
            close(fd);
            CHECK_EQ_U64(le(h + 32, 8), 0x0123456789abcdefull);
            CHECK_EQ_U64(le(h + 40, 8), 0x2d);
        }
        /* both blocks stand: the one whose key has the same low half too */
        CHECK_EQ_INT(expect(&d, 0x2a + 3, 10 + 3, 4096), 0);
        free(buf);
    }

    /* overwrite: another size, other bytes */
    CHECK_STATUS(put(&d, 0x2a, 99, 5000), KVF_OK);
    CHECK_EQ_INT(expect(&d, 0x2a, 99, 5000), 0);
    CHECK_STATUS(put(&d, 0x2a, 98, 10), KVF_OK);
    CHECK_EQ_INT(expect(&d, 0x2a, 98, 10), 0);

    /* not found names the file */
    uint8_t buf[256];
    kvf__blockfile_meta m = {KEY(7), 7, 7, 7};
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0xabcdef), buf, sizeof buf, &m), KVF_ERR_NOT_FOUND);
    CHECK_STR_HAS(kvf_last_error(), "block 00000000000000000000000000abcdef");
    CHECK_STR_HAS(kvf_last_error(), "00000000000000000000000000abcdef.kvf: not stored");
    CHECK(kvf_key_eq(m.key, KEY(7)) && m.payload_bytes == 7); /* untouched on failure */

    /* a buffer too small: refused, and not written to */
    memset(buf, POISON, sizeof buf);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x2a + 3), buf, sizeof buf, &m), KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "does not fit");
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x2a + 3), buf, 10, &m), KVF_ERR_RANGE);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x2a + 3), buf, PRE + 4095, &m), KVF_ERR_RANGE);
    for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != POISON) {
            TEST_FAIL_AT(__FILE__, __LINE__, "refused read wrote byte %zu", i);
            break;
        }
    CHECK(kvf_key_eq(m.key, KEY(7)) && m.payload_bytes == 7);
    /* exactly the block's size is enough */
    {
        uint8_t *exact = malloc(PRE + 4096);
        REQUIRE(exact);
        CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0x2a + 3), exact, PRE + 4096, &m), KVF_OK);
        CHECK_EQ_U64(m.payload_bytes, 4096);
        free(exact);
    }
    /* a missing block is not found, whatever the buffer */
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(0xabcdef), buf, 1, NULL), KVF_ERR_NOT_FOUND);
    CHECK(exists(&d, 0x2a + 3)); /* a refused read removes nothing */

    /* every fsync mode writes the same file; count the syncs */
    kvf__set_io_fault(fault_hook);
    /* NONE 0, BATCH 0 (the batch's syncfs does it all), BLOCK 2 (file, dir) */
    static const struct {
        kvf_fsync mode;
        int syncs;
    } modes[] = {{KVF_FSYNC_NONE, 0}, {KVF_FSYNC_BATCH, 0}, {KVF_FSYNC_BLOCK, 2}};
    for (int i = 0; i < 3; i++) {
        kvf__blockfile_dir d2;
        if (open_ns("rt", FP, modes[i].mode, &d2))
            continue;
        fault_clear();
        CHECK_STATUS(put(&d2, 0x77, 5 + i, 1000), KVF_OK);
        CHECK_EQ_INT(fault.calls[3], modes[i].syncs);
        CHECK_EQ_INT(expect(&d, 0x77, 5 + i, 1000), 0);
        CHECK_STATUS(kvf__blockfile_fsync_dir(&d2), KVF_OK);
        CHECK_EQ_INT(fault.calls[3], modes[i].syncs + 1);
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
    uint8_t *buf = malloc(PRE + 2000);
    REQUIRE(buf);
    kvf__blockfile_meta m;

    /* the same namespace under another layout */
    if (!open_ns("mm-a", FP ^ 1, KVF_FSYNC_NONE, &other_fp)) {
        CHECK_STATUS(kvf__blockfile_read(&other_fp, TKEY(5), buf, PRE + 2000, &m),
                     KVF_ERR_MISMATCH);
        CHECK_STR_HAS(kvf_last_error(), "layout");
        kvf__blockfile_close_dir(&other_fp);
    }
    /* a file copied into another namespace */
    if (!open_ns("mm-b", FP, KVF_FSYNC_NONE, &b)) {
        char from[1024], to[1024];
        block_path(&a, 5, from, sizeof from);
        block_path(&b, 5, to, sizeof to);
        copy_file(from, to);
        CHECK_STATUS(kvf__blockfile_read(&b, TKEY(5), buf, PRE + 2000, &m), KVF_ERR_MISMATCH);
        CHECK_STR_HAS(kvf_last_error(), "namespace");
        /* and one renamed to another key */
        block_path(&a, 6, to, sizeof to);
        copy_file(from, to);
        CHECK_STATUS(kvf__blockfile_read(&a, TKEY(6), buf, PRE + 2000, &m), KVF_ERR_CORRUPT);
        kvf__blockfile_close_dir(&b);
    }
    CHECK_EQ_INT(expect(&a, 5, 1, 2000), 0);
    free(buf);
    kvf__blockfile_close_dir(&a);
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
        uint8_t *buf = malloc(PRE + 30004);
        kvf__blockfile_meta m;
        if (kvf__blockfile_read(&d, TKEY(0x4242), buf, PRE + 30004, &m) == KVF_OK &&
            m.payload_bytes == 30000 + tag)
            matches += expect(&d, 0x4242, tag, 30000 + tag) == 0;
        free(buf);
    }
    CHECK_EQ_INT(matches, 1);
    CHECK_EQ_INT(count_tmp(&d), 0);
    kvf__blockfile_close_dir(&d);
    return 0;
}

static int test_bad_args(void)
{
    kvf__blockfile_dir closed;
    memset(&closed, 0, sizeof closed);
    uint8_t buf[PRE + 8];
    kvf__blockfile_meta m = {KEY(1), 1, 1, 8};
    CHECK_STATUS(kvf__blockfile_write(&closed, &m, buf), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__blockfile_read(&closed, TKEY(1), buf, sizeof buf, &m), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__blockfile_fsync_dir(&closed), KVF_ERR_INVALID);
    kvf__blockfile_dir d;
    if (open_ns("args", FP, KVF_FSYNC_NONE, &d))
        return 1;
    CHECK_STATUS(kvf__blockfile_write(&d, NULL, buf), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__blockfile_write(&d, &m, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__blockfile_read(&d, TKEY(1), NULL, 100, &m), KVF_ERR_INVALID);
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
    int fds = bf_init();
    RUN(test_crc_vectors);
    RUN(test_crc_hw_matches_sw);
    RUN(test_namespaces);
    RUN(test_round_trip);
    RUN(test_mismatch);
    RUN(test_concurrent_writers);
    RUN(test_bad_args);
    bf_fini(fds);
    return TEST_RESULT();
}
