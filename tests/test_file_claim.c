/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A block file whose header claims more than any block holds: a sparse
 * file of 4 GiB whose intact header says 4 GiB of payload matches the
 * length rule, so only the claim itself can be refused. fsck's scan, the
 * cache's listing and the engine's read refuse it quickly, allocating
 * nothing from it (the claim once sized a 4 GiB buffer and read the whole
 * file: 4.1 GiB of memory, 27 s).
 */
#include "blockfile.h"
#include "blockhdr.h"
#include "testutil.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define HDR KVF_BLOCK_HEADER_BYTES
#define CLAIM ((uint64_t)4 << 30)
#define BLOCK_N 0x77ull
#define DEADLINE_S 20

static long maxrss_kib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The sparse file: an intact header claiming CLAIM bytes, then a hole. */
static int make_claim(const kvf__blockfile_dir *d, char *path, size_t cap)
{
    snprintf(path, cap, "%s/" KVF_KEY_FMT ".kvf", d->root, KVF_KEY_ARGS(KEY(BLOCK_N)));
    /* the header's own checksum holds; the table is never reached */
    kvf__block_header h = {0x1234, d->ns_hash, KEY(BLOCK_N), 16, 1, CLAIM, 0};
    uint8_t hb[KVF_BLOCK_PREFIX_MAX] = {0};
    kvf__block_prefix_seal(&h, hb);
    size_t pre = kvf__block_prefix_bytes(1);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(pwrite(fd, hb, pre, 0) == (ssize_t)pre);
    REQUIRE(ftruncate(fd, (off_t)(pre + CLAIM)) == 0);
    close(fd);
    return 0;
}

typedef struct seen {
    int corrupt, other;
    char detail[1024];
} seen;

static void scan_visit(void *arg, kvf_key key, kvf_status st, const char *detail)
{
    seen *s = arg;
    CHECK(kvf_key_eq(key, KEY(BLOCK_N)));
    if (st == KVF_ERR_CORRUPT)
        s->corrupt++;
    else
        s->other++;
    snprintf(s->detail, sizeof s->detail, "%s", detail ? detail : "");
}

static void list_visit(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns)
{
    (void)meta;
    (void)mtime_ns;
    ++*(int *)arg;
}

static int test_huge_claim_refused(void)
{
    alarm(DEADLINE_S);
    char base[256], path[600];
    REQUIRE(test_tmpdir(base, sizeof base) == 0);
    kvf__blockfile_dir d;
    /* fingerprint 0: any layout, as fsck opens a namespace */
    REQUIRE(kvf__blockfile_open_dir(base, "ns", 0, KVF_FSYNC_NONE, &d) == KVF_OK);
    make_claim(&d, path, sizeof path);
    long rss0 = maxrss_kib();
    double t0 = now_s();

    seen s = {0, 0, ""};
    CHECK_STATUS(kvf__blockfile_scan(&d, scan_visit, &s), KVF_OK);
    CHECK_EQ_INT(s.corrupt, 1);
    CHECK_EQ_INT(s.other, 0);
    CHECK_STR_HAS(s.detail, "claims");
    CHECK_STR_HAS(s.detail, path);

    int listed = 0;
    CHECK_STATUS(kvf__blockfile_list(&d, list_visit, &listed), KVF_OK);
    CHECK_EQ_INT(listed, 0);

    uint8_t buf[8192];
    kvf_status st = kvf__blockfile_read(&d, TKEY(BLOCK_N), buf, sizeof buf, NULL);
    CHECK(st == KVF_ERR_CORRUPT || st == KVF_ERR_RANGE);

    double secs = now_s() - t0;
    long grew = maxrss_kib() - rss0;
    fprintf(stderr, "a 4 GiB claim: refused in %.3f s, max RSS grew %ld KiB\n", secs, grew);
    CHECK(secs < 2.0);
    CHECK(grew < 64 * 1024);
    /* nothing removed: fsck reports, it does not repair */
    CHECK(access(path, F_OK) == 0);
    kvf__blockfile_close_dir(&d);
    test_rmtree(base);
    alarm(0);
    return 0;
}

/* Nothing is written that a reader would refuse. */
static int test_write_over_limit_refused(void)
{
    char base[256];
    REQUIRE(test_tmpdir(base, sizeof base) == 0);
    kvf__blockfile_dir d;
    REQUIRE(kvf__blockfile_open_dir(base, "ns", 0x1234, KVF_FSYNC_NONE, &d) == KVF_OK);
    uint8_t buf[HDR + 64];
    test_fill_random(buf, sizeof buf, 3);
    kvf__blockfile_meta m = {KEY(BLOCK_N), 16, 1, CLAIM};
    CHECK_STATUS(kvf__blockfile_write(&d, &m, buf), KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "at most");
    kvf__blockfile_close_dir(&d);
    test_rmtree(base);
    return 0;
}

int main(void)
{
    RUN(test_huge_claim_refused);
    RUN(test_write_over_limit_refused);
    return TEST_RESULT();
}
