/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the stored form of a block (src/core/blockhdr.c) and the file
 * tier's whole read path (src/store/file/blockfile_read.c). The input is a block's bytes:
 * checked as a Redis value would be (header, pool table, each pool), then
 * written as a block file and read back through kvf__blockfile_read (both
 * its fast and careful readers), kvf__blockfile_scan, kvf_dir_check
 * (fsck) and kvf__blockfile_list (the cache's restart). Properties: a
 * block is served exactly when the format says it is intact, and then
 * byte for byte. */
#include "blockfile.h"
#include "blockhdr.h"
#include "checksum.h"
#include "common.h"
#include "fileio.h"
#include "fuzz.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HDR KVF_BLOCK_HEADER_BYTES
#define NS "fuzz" /* the seeds are written under it (gen_corpus.c) */
#define BIG_CAP (1u << 20)

static char tmp_root[64];
static kvf__blockfile_dir dir;
static uint8_t *big_buf;

static void remove_tmp(void)
{
    kvf__blockfile_close_dir(&dir);
    char path[128];
    snprintf(path, sizeof path, "%s/" NS, tmp_root);
    rmdir(path);
    rmdir(tmp_root);
    free(big_buf);
}

static void setup(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/kvf-fuzz-XXXXXX", base && *base ? base : "/tmp");
    /* buffered reads unless asked: O_DIRECT goes to the disk for every
     * input, five times fewer runs, through the same checks */
    setenv("KVF_FILE_DIRECT", "0", 0);
    if (!mkdtemp(tmp_root) ||
        kvf__blockfile_open_dir(tmp_root, NS, 0, KVF_FSYNC_NONE, &dir) != KVF_OK) {
        fprintf(stderr, "fuzz_blockhdr: cannot set up %s: %s\n", tmp_root, kvf_last_error());
        exit(1);
    }
    big_buf = aligned_alloc(KVF_FILE_ALIGN, BIG_CAP);
    if (!big_buf)
        exit(1);
    atexit(remove_tmp);
}

/* The format's rule for a stored value of `size` bytes, written out here
 * apart from blockhdr.c: header, then the pool table (its CRC in the
 * header, zero padding, pools adding up to the payload), then each pool's
 * CRC; *pre_p the prefix's bytes. */
static bool intact_value(const uint8_t *data, size_t size, kvf__block_header *h, size_t *pre_p)
{
    if (size < HDR || kvf__block_header_parse(data, "fuzz", h) != KVF_OK)
        return false;
    size_t pre = (HDR + (size_t)h->pools * 8 + 127) / 128 * 128;
    if (size < pre || h->payload_bytes > size - pre)
        return false;
    if (kvf__crc32c(0, data + HDR, pre - HDR) != h->table_crc)
        return false;
    for (size_t i = HDR + (size_t)h->pools * 8; i < pre; i++)
        if (data[i] != 0)
            return false;
    uint64_t off = 0;
    for (uint32_t p = 0; p < h->pools; p++) {
        uint32_t n = kvf__get_le32(data + HDR + p * 8), crc = kvf__get_le32(data + HDR + p * 8 + 4);
        if (off + n > h->payload_bytes || kvf__crc32c(0, data + pre + off, n) != crc)
            return false;
        off += n;
    }
    *pre_p = pre;
    return off == h->payload_bytes;
}

/* The format's rule for a block file under `key` of namespace NS, any
 * layout: what every reader must accept, and nothing else. */
static bool intact_file(const uint8_t *data, size_t size, kvf_key key)
{
    kvf__block_header h;
    size_t pre;
    if (!intact_value(data, size, &h, &pre))
        return false;
    if (h.ns_hash != kvf__ns_hash(NS) || !kvf_key_eq(h.key, key))
        return false;
    size_t exact = pre + (size_t)h.payload_bytes;
    size_t padded = (exact + KVF_FILE_ALIGN - 1) & ~(size_t)(KVF_FILE_ALIGN - 1);
    if (size != exact && size != padded)
        return false;
    for (size_t i = exact; i < size; i++)
        if (data[i] != 0)
            return false;
    return true;
}

/* The reader every store's values go through (kvf__block_value_take),
 * with a buffer of the value's payload size and one of half of it: a block
 * is taken only when every check holds, and then byte for byte. */
static void take_value(const uint8_t *data, size_t size)
{
    kvf__block_header want;
    size_t pre = HDR;
    bool intact = intact_value(data, size, &want, &pre) && want.payload_bytes == size - pre;
    size_t caps[2] = {size > pre ? size - pre : 0, size > pre ? (size - pre) / 2 : 0};
    for (int i = 0; i < 2; i++) {
        uint8_t *dst = malloc(caps[i] ? caps[i] : 1);
        memset(dst, 0xa5, caps[i] ? caps[i] : 1);
        kvf__block_header h;
        kvf_status st = size >= HDR && kvf__block_header_parse(data, "fuzz", &h) == KVF_OK
                            ? kvf__block_value_take(data, size, "fuzz value", h.fingerprint,
                                                    h.ns_hash, h.key, dst, caps[i], &h)
                            : kvf__block_value_take(data, size, "fuzz value", 0, 0, KVF_KEY_ROOT,
                                                    dst, caps[i], &h);
        if (st == KVF_OK) {
            FUZZ_CHECK(intact && h.payload_bytes == size - pre && h.payload_bytes <= caps[i]);
            FUZZ_CHECK(memcmp(dst, data + pre, h.payload_bytes) == 0);
        } else if (intact && caps[i] >= want.payload_bytes) {
            FUZZ_CHECK(0); /* an intact value that fits is taken */
        }
        free(dst);
    }
}

/* The header checks on their own. */
static void check_value(const uint8_t *data, size_t size)
{
    take_value(data, size);
    if (size < HDR)
        return;
    kvf__block_header h;
    if (kvf__block_header_parse(data, "fuzz value", &h) != KVF_OK)
        return;
    /* every header byte is covered: packing what was parsed gives it back */
    uint8_t again[HDR];
    kvf__block_header_pack(&h, again);
    FUZZ_CHECK(memcmp(again, data, HDR) == 0);
    FUZZ_CHECK(kvf__block_header_expect(&h, "fuzz value", h.fingerprint, h.ns_hash, h.key) ==
               KVF_OK);
    /* a key that differs from the stored one in either half is refused */
    FUZZ_CHECK(kvf__block_header_expect(&h, "fuzz value", h.fingerprint, h.ns_hash,
                                        (kvf_key){h.key.hi ^ 1, h.key.lo}) == KVF_ERR_CORRUPT);
    FUZZ_CHECK(kvf__block_header_expect(&h, "fuzz value", h.fingerprint, h.ns_hash,
                                        (kvf_key){h.key.hi, h.key.lo ^ 1}) == KVF_ERR_CORRUPT);
    size_t pre = kvf__block_prefix_bytes(h.pools);
    if (size >= pre && h.payload_bytes == size - pre) {
        kvf__block_header w;
        size_t wpre;
        bool intact = intact_value(data, size, &w, &wpre);
        kvf_status st = kvf__block_table_check(&h, data, "fuzz value");
        if (st == KVF_OK)
            st = kvf__block_pools_check(&h, data, "fuzz value", data + pre);
        FUZZ_CHECK((st == KVF_OK) == intact);
    }
}

typedef struct seen {
    unsigned visits;
    kvf_status st;
} seen;

static void scan_visit(void *arg, kvf_key key, kvf_status st, const char *detail)
{
    seen *s = arg;
    s->visits++;
    s->st = st;
    FUZZ_CHECK(detail != NULL);
}

static void list_visit(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns)
{
    ((seen *)arg)->visits++;
}

/* One read through kvf__blockfile_read into a cap-byte buffer. */
static void check_read(const uint8_t *data, size_t size, kvf_key key, bool intact, size_t cap)
{
    memset(big_buf, 0x5a, cap); /* poisoned: what is served must come from the file */
    kvf__blockfile_meta meta;
    kvf_status st = kvf__blockfile_read(&dir, key, big_buf, cap, &meta);
    if (st == KVF_OK) {
        FUZZ_CHECK(intact);
        size_t pre = kvf__block_prefix_bytes(meta.pools);
        FUZZ_CHECK(kvf_key_eq(meta.key, key) && pre + meta.payload_bytes <= size);
        FUZZ_CHECK(memcmp(big_buf, data, pre + (size_t)meta.payload_bytes) == 0);
    } else if (intact) {
        /* only a buffer too small may refuse an intact block */
        FUZZ_CHECK(st == KVF_ERR_RANGE &&
                   kvf__block_prefix_bytes(kvf__get_le32(data + 52)) + kvf__get_le64(data + 56) >
                       cap);
    } else {
        FUZZ_CHECK(st == KVF_ERR_CORRUPT || st == KVF_ERR_MISMATCH || st == KVF_ERR_RANGE);
    }
}

static void check_file(const uint8_t *data, size_t size)
{
    /* the file is named after the key its header claims, so intact inputs
     * are found under their own name */
    kvf_key key = size >= 48 ? (kvf_key){kvf__get_le64(data + 32), kvf__get_le64(data + 40)}
                             : (kvf_key){0, 0x2a};
    char name[48], path[176];
    snprintf(name, sizeof name, KVF_KEY_FMT ".kvf", KVF_KEY_ARGS(key));
    snprintf(path, sizeof path, "%s/" NS "/%s", tmp_root, name);
    int fd = openat(dir.dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size) {
        fprintf(stderr, "fuzz_blockhdr: %s: cannot write\n", path);
        exit(1);
    }
    close(fd);
    bool intact = intact_file(data, size, key);

    check_read(data, size, key, intact, BIG_CAP);
    /* smaller than the file: the careful reader */
    if (size > HDR)
        check_read(data, size, key, intact, HDR + (size - HDR) / 2);

    seen scanned = {0, KVF_OK}, listed = {0, KVF_OK};
    FUZZ_CHECK(kvf__blockfile_scan(&dir, scan_visit, &scanned) == KVF_OK);
    FUZZ_CHECK(scanned.visits == 1 && (scanned.st == KVF_OK) == intact);
    FUZZ_CHECK(kvf__blockfile_list(&dir, list_visit, &listed) == KVF_OK);
    FUZZ_CHECK(listed.visits <= 1 && (!intact || listed.visits == 1));
    /* fsck's public call: one entry, good exactly when intact */
    kvf_dir_counts c = KVF_DIR_COUNTS_INIT;
    FUZZ_CHECK(kvf_dir_check(tmp_root, NS, NULL, 0, NULL, NULL, &c) == KVF_OK);
    FUZZ_CHECK(c.good + c.corrupt + c.mismatch + c.torn + c.foreign + c.unreadable + c.old_format ==
               1);
    FUZZ_CHECK((c.good == 1) == intact && c.unreadable == 0);
    unlinkat(dir.dir_fd, name, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tmp_root[0])
        setup();
    if (size > BIG_CAP)
        return 0;
    check_value(data, size);
    check_file(data, size);
    return 0;
}
