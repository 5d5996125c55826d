/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Blocks stored by format version 1 (64-bit keys, a 64-byte header,
 * <16 hex digits>.kvf), written here byte by byte in that layout: never
 * served, reported by fsck as old format, refused with a message naming
 * the format where one sits under a current name; kvf_dir_upgrade
 * rewrites each sound one in the current format under {0, old key},
 * byte-exact, and reports a damaged one without touching it. The same for
 * format version 2 (128-byte header, one checksum for the payload, no
 * pool table), rewritten in place under its own name.
 */
#include "blockfile_fixture.h"
#include "checksum.h"

#include <dirent.h>
#include <fcntl.h>

#define NS "old"
#define PAYLOAD 3000

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes f[0..len) as <dir>/NS/<name>, and frees f. */
static void write_file(const char *dir, const char *name, uint8_t *f, size_t len)
{
    char path[700];
    snprintf(path, sizeof path, "%s/" NS "/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0 && write(fd, f, len) == (ssize_t)len);
    close(fd);
    free(f);
}

/* A version-1 block file of `key` holding payload[0..n), as that version
 * wrote it: header, payload, zeros to the next 4096 bytes. */
static void write_v1(const char *dir, uint64_t key, const uint8_t *payload, size_t n)
{
    size_t len = (64 + n + 4095) & ~(size_t)4095;
    uint8_t *f = calloc(1, len);
    REQUIRE(f);
    memcpy(f, "KVFBLK\r\n", 8);
    put_le(f + 8, 1, 4);
    put_le(f + 12, 64, 4);
    put_le(f + 16, 0, 8); /* any layout: fsck's view */
    put_le(f + 24, kvf__ns_hash(NS), 8);
    put_le(f + 32, key, 8);
    put_le(f + 40, 16, 4);
    put_le(f + 44, 3, 4);
    put_le(f + 48, n, 8);
    put_le(f + 56, kvf__crc32c(0, payload, n), 4);
    put_le(f + 60, kvf__crc32c(0, f, 60), 4);
    memcpy(f + 64, payload, n);
    char name[64];
    snprintf(name, sizeof name, "%016llx.kvf", (unsigned long long)key);
    write_file(dir, name, f, len);
}

/* A version-2 block file of `key` holding payload[0..n), as that version
 * wrote it: the 128-byte header (version 2, the payload's CRC at 64),
 * payload, zeros to the next 4096 bytes. */
static void write_v2(const char *dir, kvf_key key, const uint8_t *payload, size_t n)
{
    size_t len = (128 + n + 4095) & ~(size_t)4095;
    uint8_t *f = calloc(1, len);
    REQUIRE(f);
    memcpy(f, "KVFBLK\r\n", 8);
    put_le(f + 8, 2, 4);
    put_le(f + 12, 128, 4);
    put_le(f + 16, 0, 8);
    put_le(f + 24, kvf__ns_hash(NS), 8);
    put_le(f + 32, key.hi, 8);
    put_le(f + 40, key.lo, 8);
    put_le(f + 48, 16, 4);
    put_le(f + 52, 3, 4);
    put_le(f + 56, n, 8);
    put_le(f + 64, kvf__crc32c(0, payload, n), 4);
    put_le(f + 124, kvf__crc32c(0, f, 124), 4);
    memcpy(f + 128, payload, n);
    char name[64];
    snprintf(name, sizeof name, KVF_KEY_FMT ".kvf", KVF_KEY_ARGS(key));
    write_file(dir, name, f, len);
}

typedef struct seen {
    int n, ok, corrupt, old;
    char last[1024];
} seen;

static void visit(void *arg, const kvf_dir_entry *e)
{
    seen *s = arg;
    s->n++;
    s->ok += e->status == KVF_OK;
    s->corrupt += e->kind == KVF_DIR_ENTRY_CORRUPT;
    s->old += e->kind == KVF_DIR_ENTRY_OLD_FORMAT;
    snprintf(s->last, sizeof s->last, "%s", e->message);
}

static bool has_file(const char *dir, const char *name)
{
    char path[700];
    snprintf(path, sizeof path, "%s/" NS "/%s", dir, name);
    return access(path, F_OK) == 0;
}

static int test_upgrade(void)
{
    char dir[512];
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    char ns[600];
    snprintf(ns, sizeof ns, "%s/" NS, dir);
    REQUIRE(mkdir(ns, 0755) == 0);
    uint8_t a[PAYLOAD], b[PAYLOAD], c[PAYLOAD];
    test_fill_random(a, sizeof a, 1);
    test_fill_random(b, sizeof b, 2);
    test_fill_random(c, sizeof c, 3);
    write_v1(dir, 0x1111, a, sizeof a);
    write_v1(dir, 0xfedcba9876543210ull, b, sizeof b);
    write_v1(dir, 0x3333, c, sizeof c);
    /* block 0x3333 damaged in its payload */
    char path[700];
    snprintf(path, sizeof path, "%s/0000000000003333.kvf", ns);
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0 && pwrite(fd, "\xff", 1, 64 + 500) == 1);
    close(fd);

    /* fsck: three old-format blocks, none good, none served */
    kvf_dir_counts cnt = KVF_DIR_COUNTS_INIT;
    seen s = {0};
    CHECK_STATUS(kvf_dir_check(dir, NS, NULL, 0, visit, &s, &cnt), KVF_OK);
    CHECK_EQ_U64(cnt.old_format, 3);
    CHECK_EQ_U64(cnt.good, 0);
    CHECK_STR_HAS(s.last, "format version 1 (64-bit keys)");
    CHECK_STR_HAS(s.last, "--upgrade");
    uint64_t listed = 99;
    CHECK_STATUS(kvf_dir_list(dir, NS, NULL, 0, NULL, NULL, &listed), KVF_OK);
    CHECK_EQ_U64(listed, 0);

    /* a version-1 file under a current name: refused, naming the format */
    {
        char from[700], to[700];
        write_v1(dir, 0x4444, a, sizeof a);
        snprintf(from, sizeof from, "%s/0000000000004444.kvf", ns);
        snprintf(to, sizeof to, "%s/00000000000000000000000000004444.kvf", ns);
        REQUIRE(rename(from, to) == 0);
        kvf__blockfile_dir d;
        REQUIRE(kvf__blockfile_open_dir(dir, NS, 0, KVF_FSYNC_NONE, &d) == KVF_OK);
        uint8_t *buf = aligned_alloc(4096, 8192);
        REQUIRE(buf);
        CHECK_STATUS(kvf__blockfile_read(&d, KEY(0x4444), buf, 8192, NULL), KVF_ERR_MISMATCH);
        CHECK_STR_HAS(kvf_last_error(), "format version 1 (64-bit keys)");
        CHECK_STR_HAS(kvf_last_error(), "kvferry fsck --upgrade");
        free(buf);
        kvf__blockfile_close_dir(&d);
        REQUIRE(unlink(to) == 0);
    }

    /* the upgrade: two rewritten, the damaged one reported and left */
    cnt = (kvf_dir_counts)KVF_DIR_COUNTS_INIT;
    s = (seen){0};
    CHECK_STATUS(kvf_dir_upgrade(dir, NS, visit, &s, &cnt), KVF_OK);
    CHECK_EQ_INT(s.n, 3);
    CHECK_EQ_INT(s.ok, 2);
    CHECK_EQ_INT(s.corrupt, 1);
    CHECK_EQ_U64(cnt.upgraded, 2);
    CHECK_EQ_U64(cnt.corrupt, 1);
    CHECK(!has_file(dir, "0000000000001111.kvf") && !has_file(dir, "fedcba9876543210.kvf"));
    CHECK(has_file(dir, "00000000000000000000000000001111.kvf"));
    CHECK(has_file(dir, "0000000000000000fedcba9876543210.kvf"));
    CHECK(has_file(dir, "0000000000003333.kvf"));
    CHECK(!has_file(dir, "00000000000000000000000000003333.kvf"));

    /* read back through the file tier: byte-exact, under {0, old key} */
    kvf__blockfile_dir d;
    REQUIRE(kvf__blockfile_open_dir(dir, NS, 0, KVF_FSYNC_NONE, &d) == KVF_OK);
    uint8_t *buf = aligned_alloc(4096, 8192);
    REQUIRE(buf);
    const struct {
        kvf_key key;
        const uint8_t *want;
    } back[2] = {{{0, 0x1111}, a}, {{0, 0xfedcba9876543210ull}, b}};
    for (int i = 0; i < 2; i++) {
        memset(buf, 0xa5, 8192);
        kvf__blockfile_meta m;
        CHECK_STATUS(kvf__blockfile_read(&d, back[i].key, buf, 8192, &m), KVF_OK);
        CHECK_EQ_U64(m.payload_bytes, PAYLOAD);
        CHECK_EQ_INT(m.tokens, 16);
        CHECK_EQ_INT(m.pools, 3);
        CHECK_MEM_EQ(buf + kvf__block_prefix_bytes(3), back[i].want, PAYLOAD);
    }
    free(buf);
    kvf__blockfile_close_dir(&d);

    /* fsck now: two good, the damaged old one still reported */
    cnt = (kvf_dir_counts)KVF_DIR_COUNTS_INIT;
    CHECK_STATUS(kvf_dir_check(dir, NS, NULL, 0, NULL, NULL, &cnt), KVF_OK);
    CHECK_EQ_U64(cnt.good, 2);
    CHECK_EQ_U64(cnt.old_format, 1);
    /* a second run changes nothing more */
    cnt = (kvf_dir_counts)KVF_DIR_COUNTS_INIT;
    CHECK_STATUS(kvf_dir_upgrade(dir, NS, NULL, NULL, &cnt), KVF_OK);
    CHECK_EQ_U64(cnt.upgraded, 0);
    CHECK_EQ_U64(cnt.corrupt, 1);
    /* no temporary file left behind */
    DIR *dd = opendir(ns);
    REQUIRE(dd);
    struct dirent *de;
    int tmps = 0;
    while ((de = readdir(dd)))
        tmps += strstr(de->d_name, ".tmp") != NULL;
    closedir(dd);
    CHECK_EQ_INT(tmps, 0);
    CHECK_STATUS(kvf_dir_upgrade(dir, "nosuch", NULL, NULL, NULL), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(kvf_dir_upgrade(NULL, NS, NULL, NULL, NULL), KVF_ERR_INVALID);
    test_rmtree(dir);
    return 0;
}

/* Version 2: refused by readers naming the format and the upgrade,
 * counted old by fsck, rewritten in place byte-exact with each pool's
 * checksum (the payload split evenly among the 3 pools); a damaged one is
 * reported and left as it was. */
static int test_upgrade_v2(void)
{
    char dir[512];
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    char ns[600];
    snprintf(ns, sizeof ns, "%s/" NS, dir);
    REQUIRE(mkdir(ns, 0755) == 0);
    uint8_t a[PAYLOAD], c[PAYLOAD];
    test_fill_random(a, sizeof a, 21);
    test_fill_random(c, sizeof c, 23);
    const kvf_key ka = {0xabcdef0123456789ull, 0x51}, kc = {0, 0x53};
    write_v2(dir, ka, a, sizeof a);
    write_v2(dir, kc, c, sizeof c);
    char path[700];
    snprintf(path, sizeof path, "%s/" KVF_KEY_FMT ".kvf", ns, KVF_KEY_ARGS(kc));
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0 && pwrite(fd, "\xff", 1, 128 + 2000) == 1);
    close(fd);

    kvf__blockfile_dir d;
    REQUIRE(kvf__blockfile_open_dir(dir, NS, 0, KVF_FSYNC_NONE, &d) == KVF_OK);
    uint8_t *buf = aligned_alloc(4096, 8192);
    REQUIRE(buf);
    CHECK_STATUS(kvf__blockfile_read(&d, ka, buf, 8192, NULL), KVF_ERR_MISMATCH);
    CHECK_STR_HAS(kvf_last_error(), "format version 2");
    CHECK_STR_HAS(kvf_last_error(), "kvferry fsck --upgrade");

    kvf_dir_counts cnt = KVF_DIR_COUNTS_INIT;
    seen s = {0};
    CHECK_STATUS(kvf_dir_check(dir, NS, NULL, 0, visit, &s, &cnt), KVF_OK);
    CHECK_EQ_U64(cnt.old_format, 2);
    CHECK_EQ_U64(cnt.good, 0);

    cnt = (kvf_dir_counts)KVF_DIR_COUNTS_INIT;
    s = (seen){0};
    CHECK_STATUS(kvf_dir_upgrade(dir, NS, visit, &s, &cnt), KVF_OK);
    CHECK_EQ_INT(s.n, 2);
    CHECK_EQ_INT(s.ok, 1);
    CHECK_EQ_INT(s.corrupt, 1);
    CHECK_EQ_U64(cnt.upgraded, 1);
    memset(buf, 0xa5, 8192);
    kvf__blockfile_meta m;
    CHECK_STATUS(kvf__blockfile_read(&d, ka, buf, 8192, &m), KVF_OK);
    CHECK_EQ_U64(m.payload_bytes, PAYLOAD);
    CHECK_EQ_INT(m.pools, 3);
    size_t pre = kvf__block_prefix_bytes(3);
    CHECK_MEM_EQ(buf + pre, a, PAYLOAD);
    /* each pool's own checksum: 1000 bytes each */
    for (uint32_t p = 0; p < 3; p++) {
        kvf__block_span sp = kvf__block_prefix_span(buf, p);
        CHECK_EQ_U64(sp.bytes, 1000);
        CHECK_EQ_U64(sp.crc, kvf__crc32c(0, a + 1000 * p, 1000));
    }
    /* the damaged one: still version 2, still refused */
    CHECK_STATUS(kvf__blockfile_read(&d, kc, buf, 8192, NULL), KVF_ERR_MISMATCH);
    cnt = (kvf_dir_counts)KVF_DIR_COUNTS_INIT;
    CHECK_STATUS(kvf_dir_check(dir, NS, NULL, 0, NULL, NULL, &cnt), KVF_OK);
    CHECK_EQ_U64(cnt.good, 1);
    CHECK_EQ_U64(cnt.old_format, 1);
    free(buf);
    kvf__blockfile_close_dir(&d);
    test_rmtree(dir);
    return 0;
}

int main(void)
{
    RUN(test_upgrade);
    RUN(test_upgrade_v2);
    return TEST_RESULT();
}
