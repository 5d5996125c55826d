/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Files under a block's name that kvferry never wrote and cannot read: a
 * FIFO, a directory, a symbolic link. Opening a FIFO for reading waits for
 * a writer forever, so each test runs under alarm(): a regression fails
 * (SIGALRM) instead of hanging. Onboard fails the move naming the file;
 * the cache's restore and the block scan of fsck skip it and count it as
 * foreign; nobody removes it.
 */
#include "testutil.h"

#include "blockfile.h"
#include "engine.h"
#include "file_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#define POISON 0xA5
#define GOOD_KEY 0x1ull
#define FIFO_KEY 0x2ull
#define DIR_KEY 0x3ull
#define LINK_KEY 0x4ull
#define DEADLINE_S 20

/* A good block under GOOD_KEY, and a FIFO, a directory and a link to the
 * good file under the other names. */
static int fx_init(file_fixture *f)
{
    ff_init(f);
    test_fill_random(ff_slot(f, KVF_LEVEL_PRIMARY, 0), f->bytes, 7);
    CHECK_STATUS(ff_move1(f, true, 0, GOOD_KEY), KVF_OK);
    char p[400], good[400];
    ff_key_path(f, FIFO_KEY, p, sizeof p);
    REQUIRE(mkfifo(p, 0644) == 0);
    ff_key_path(f, DIR_KEY, p, sizeof p);
    REQUIRE(mkdir(p, 0755) == 0);
    ff_key_path(f, GOOD_KEY, good, sizeof good);
    ff_key_path(f, LINK_KEY, p, sizeof p);
    REQUIRE(symlink(good, p) == 0);
    return 0;
}

/* All three foreign files are still there, as they were. */
static void check_left_alone(const file_fixture *f)
{
    char p[400];
    struct stat sb;
    ff_key_path(f, FIFO_KEY, p, sizeof p);
    CHECK(lstat(p, &sb) == 0 && S_ISFIFO(sb.st_mode));
    ff_key_path(f, DIR_KEY, p, sizeof p);
    CHECK(lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode));
    ff_key_path(f, LINK_KEY, p, sizeof p);
    CHECK(lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode));
}

static int test_onboard_refuses_foreign(void)
{
    file_fixture f;
    alarm(DEADLINE_S);
    fx_init(&f);
    const uint64_t keys[] = {FIFO_KEY, DIR_KEY, LINK_KEY};
    const char *kinds[] = {"a FIFO", "a directory", "a symbolic link"};
    for (int i = 0; i < 3; i++) {
        memset(ff_slot(&f, KVF_LEVEL_PRIMARY, 1), POISON, f.bytes);
        CHECK_STATUS(ff_move1(&f, false, keys[i], 1), KVF_ERR_CORRUPT);
        CHECK(ff_slot(&f, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
        /* the message names the file and what it is */
        uint8_t buf[8192];
        char p[400];
        ff_key_path(&f, keys[i], p, sizeof p);
        CHECK_STATUS(
            kvf__blockfile_read(kvf__engine_dir(f.e), TKEY(keys[i]), buf, sizeof buf, NULL),
            KVF_ERR_CORRUPT);
        CHECK_STR_HAS(kvf_last_error(), p);
        CHECK_STR_HAS(kvf_last_error(), kinds[i]);
        CHECK_STR_HAS(kvf_last_error(), "foreign");
    }
    /* the good block beside them */
    memset(ff_slot(&f, KVF_LEVEL_PRIMARY, 1), POISON, f.bytes);
    CHECK_STATUS(ff_move1(&f, false, GOOD_KEY, 1), KVF_OK);
    CHECK_MEM_EQ(ff_slot(&f, KVF_LEVEL_PRIMARY, 1), ff_slot(&f, KVF_LEVEL_PRIMARY, 0), f.bytes);
    check_left_alone(&f);
    ff_done(&f);
    alarm(0);
    return 0;
}

typedef struct scan_counts {
    int good, foreign, other;
} scan_counts;

static void scan_visit(void *arg, kvf_key key, kvf_status st, const char *detail)
{
    scan_counts *c = arg;
    if (st == KVF_OK)
        c->good += kvf_key_eq(key, KEY(GOOD_KEY));
    else if (detail && strstr(detail, "foreign"))
        c->foreign++;
    else
        c->other++;
}

/* What `kvferry fsck` runs over each namespace. */
static int test_scan_counts_foreign(void)
{
    file_fixture f;
    alarm(DEADLINE_S);
    fx_init(&f);
    scan_counts c = {0, 0, 0};
    CHECK_STATUS(kvf__blockfile_scan(kvf__engine_dir(f.e), scan_visit, &c), KVF_OK);
    CHECK_EQ_INT(c.good, 1);
    CHECK_EQ_INT(c.foreign, 3);
    CHECK_EQ_INT(c.other, 0);
    check_left_alone(&f);
    ff_done(&f);
    alarm(0);
    return 0;
}

static void list_visit(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns)
{
    (void)mtime_ns;
    int *n = arg;
    CHECK(kvf_key_eq(meta->key, KEY(GOOD_KEY)));
    (*n)++;
}

/* The cache's restore lists the directory: the foreign files are skipped,
 * not removed, and the good block is found. */
static int test_restore_skips_foreign(void)
{
    file_fixture f;
    alarm(DEADLINE_S);
    fx_init(&f);
    int n = 0;
    CHECK_STATUS(kvf__blockfile_list(kvf__engine_dir(f.e), list_visit, &n), KVF_OK);
    CHECK_EQ_INT(n, 1);
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk.blocks = 16;
    kvf_cache *c = NULL;
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_OK);
    if (c) {
        kvf_cache_stats s = KVF_CACHE_STATS_INIT;
        CHECK_STATUS(kvf_cache_stats_get(c, &s), KVF_OK);
        CHECK_EQ_U64(s.blocks[KVF_TIER_DISK], 1);
        kvf_cache_destroy(c);
    }
    check_left_alone(&f);
    ff_done(&f);
    alarm(0);
    return 0;
}

int main(void)
{
    RUN(test_onboard_refuses_foreign);
    RUN(test_scan_counts_foreign);
    RUN(test_restore_skips_foreign);
    return TEST_RESULT();
}
