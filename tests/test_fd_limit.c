/* SPDX-License-Identifier: Apache-2.0 */
/* A process out of file descriptors (or another resource) never loses a
 * stored block: reads fail with KVF_ERR_RESOURCE, the blocks stay cached
 * and their files stay on disk, and once descriptors are free again every
 * block reads back whole. Runs the cache at a low RLIMIT_NOFILE, and the
 * engine and the cache's GPU tier with EMFILE injected into opens. */
#include "fileio.h"
#include "status.h"
#include "testutil.h"

#include <stdatomic.h>
#include <sys/resource.h>

#define POISON 0x5A
#define NBLOCKS 200u
#define NGET 196u
#define KEY0 0x7000u

/* One pool of 2 KiB blocks. */
static const kvf_geometry G = {2, 2, 2, 16, 16, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};

typedef struct fixture {
    kvf_engine *e;
    kvf_cache *c;
    char dir[512];
    size_t bytes;
} fixture;

static int fx_open(fixture *f, uint32_t primary, const kvf_cache_config *cc)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    cfg.file.dir = f->dir;
    cfg.file.namespace_ = "fdlimit";
    cfg.file.fsync = KVF_FSYNC_NONE;
    kvf_status st = kvf_engine_create(&cfg, &f->e);
    if (st != KVF_OK) {
        fprintf(stderr, "kvf_engine_create: %s\n", kvf_last_error());
        return 1;
    }
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, primary};
    kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, 4};
    REQUIRE(kvf_engine_add_pool(f->e, &G, &prim, &sec, NULL) == KVF_OK);
    REQUIRE(kvf_geometry_block_bytes(&G, &f->bytes) == KVF_OK);
    if (!cc)
        return 0;
    st = kvf_cache_create(f->e, cc, &f->c);
    if (st != KVF_OK) {
        fprintf(stderr, "kvf_cache_create: %s\n", kvf_last_error());
        return 1;
    }
    return 0;
}

static void fx_close(fixture *f)
{
    kvf_cache_destroy(f->c);
    kvf_engine_destroy(f->e);
    f->c = NULL;
    f->e = NULL;
}

static uint8_t *prim(fixture *f, uint32_t slot)
{
    void *ptr = NULL;
    REQUIRE(kvf_engine_slot_ptr(f->e, 0, KVF_LEVEL_PRIMARY, slot, &ptr) == KVF_OK);
    return ptr;
}

static void fill(fixture *f, uint32_t slot, kvf_key key)
{
    test_fill_random(prim(f, slot), f->bytes, KEY_SEED(key) * 7 + 1);
}

static int expect(fixture *f, uint32_t slot, kvf_key key)
{
    uint8_t *want = malloc(f->bytes);
    test_fill_random(want, f->bytes, KEY_SEED(key) * 7 + 1);
    size_t off = test_mem_diff(prim(f, slot), want, f->bytes);
    free(want);
    if (off != (size_t)-1) {
        fprintf(stderr, "slot %u: block " KVF_KEY_FMT " differs at byte %zu\n", slot,
                KVF_KEY_ARGS(TKEY(key)), off);
        return 1;
    }
    return 0;
}

static bool file_exists(const fixture *f, kvf_key key)
{
    char path[700];
    snprintf(path, sizeof path, "%s/fdlimit/" KVF_KEY_FMT ".kvf", f->dir, KVF_KEY_ARGS(TKEY(key)));
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The RLIMIT_NOFILE that leaves `spare` descriptor numbers free: a new
 * descriptor takes the lowest free number, which must be below the limit
 * (those open above it stay usable, and are not counted). */
static int limit_leaving(int spare)
{
    static bool open_fd[4096];
    memset(open_fd, 0, sizeof open_fd);
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int own = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd != own && fd < 4096)
            open_fd[fd] = true;
    }
    closedir(d);
    int lim = 0;
    for (int free_below = 0; lim < 4096 && free_below < spare; lim++)
        free_below += !open_fd[lim];
    return lim;
}

static int set_fd_limit(rlim_t soft)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    rl.rlim_cur = soft;
    return setrlimit(RLIMIT_NOFILE, &rl);
}

/* Gets blocks KEY0 + first .. + n-1 into slots 0..n-1 (poisoned first) and
 * checks every block that succeeded; per[] gets each status. */
static void get_range(fixture *f, uint32_t first, uint32_t n, kvf_status *per)
{
    kvf_key *keys = malloc(n * sizeof *keys);
    uint32_t *slots = malloc(n * sizeof *slots);
    for (uint32_t i = 0; i < n; i++) {
        keys[i] = KEY(KEY0 + first + i);
        slots[i] = i;
        memset(prim(f, i), POISON, f->bytes);
    }
    kvf_cache_ticket t;
    kvf_status st = kvf_cache_get(f->c, keys, slots, n, &t);
    CHECK_STATUS(st, KVF_OK);
    if (st == KVF_OK)
        kvf_cache_wait(f->c, t, per);
    else
        for (uint32_t i = 0; i < n; i++)
            per[i] = st;
    for (uint32_t i = 0; i < n; i++)
        if (per[i] == KVF_OK)
            CHECK(expect(f, i, keys[i]) == 0);
    free(keys);
    free(slots);
}

/* The scenario: a cache of 200 blocks on disk restarted with
 * hardly a descriptor to spare does one get of 196. Reads fail with
 * KVF_ERR_RESOURCE (and only with it); the blocks stay cached and on disk,
 * the same cache reads them once the limit is raised, and a restart finds
 * all 200. */
static int test_cache_restart_at_low_limit(void)
{
    fixture f = {0};
    REQUIRE(test_tmpdir(f.dir, sizeof f.dir) == 0);
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk.blocks = 256;
    REQUIRE(fx_open(&f, 256, &cc) == 0);
    for (uint32_t i = 0; i < NBLOCKS; i++) {
        kvf_key key = KEY(KEY0 + i);
        uint32_t slot = i;
        fill(&f, slot, key);
        kvf_cache_ticket t;
        CHECK_STATUS(kvf_cache_put(f.c, &key, &slot, 1, 50, &t), KVF_OK);
        CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    }
    fx_close(&f);

    /* what the engine and cache hold idle, and a few more: the listing at
     * create takes two at a time */
    struct rlimit saved;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &saved) == 0);
    REQUIRE(fx_open(&f, 256, &cc) == 0);
    int lim = limit_leaving(3), idle = test_count_fds(), lim_listing = limit_leaving(1);
    fx_close(&f);

    /* one descriptor to spare: the listing at create opens the directory
     * and no block; the create fails rather than know none of them */
    REQUIRE(lim_listing > 0 && (rlim_t)lim_listing < saved.rlim_cur);
    REQUIRE(set_fd_limit((rlim_t)lim_listing) == 0);
    if (fx_open(&f, 256, NULL) == 0) {
        CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_ERR_RESOURCE);
        CHECK_STR_HAS(kvf_last_error(), ".kvf: open");
    }
    REQUIRE(set_fd_limit(saved.rlim_cur) == 0);
    fx_close(&f);
    for (uint32_t i = 0; i < NBLOCKS; i++)
        CHECK(file_exists(&f, TKEY(KEY0 + i)));

    REQUIRE(lim > 0);
    rlim_t low = (rlim_t)lim;
    fprintf(stderr, "idle engine and cache: %d descriptors open; limit set to %llu\n", idle,
            (unsigned long long)low);
    REQUIRE(low < saved.rlim_cur);
    REQUIRE(set_fd_limit(low) == 0);

    int failed = 0;
    if (fx_open(&f, 256, &cc) != 0) {
        set_fd_limit(saved.rlim_cur);
        test_note_failure_();
        return 1;
    }
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(f.c, &s), KVF_OK);
    CHECK_EQ_U64(s.blocks[KVF_TIER_DISK], NBLOCKS);
    kvf_status per[NGET];
    get_range(&f, 0, NGET, per);
    for (uint32_t i = 0; i < NGET; i++) {
        if (per[i] == KVF_ERR_RESOURCE)
            failed++;
        else
            CHECK_STATUS(per[i], KVF_OK);
    }
    fprintf(stderr, "at a limit of %llu: %d of %u gets failed with KVF_ERR_RESOURCE\n",
            (unsigned long long)low, failed, NGET);
    /* else this run proves nothing */
    CHECK(failed > 0);

    /* still cached, on disk, and still a file each */
    REQUIRE(set_fd_limit(saved.rlim_cur) == 0);
    kvf_key *keys = malloc(NBLOCKS * sizeof *keys);
    kvf_tier *tiers = malloc(NBLOCKS * sizeof *tiers);
    for (uint32_t i = 0; i < NBLOCKS; i++)
        keys[i] = KEY(KEY0 + i);
    size_t hits = 0;
    CHECK_STATUS(kvf_cache_lookup(f.c, keys, NBLOCKS, &hits, tiers), KVF_OK);
    CHECK_EQ_U64(hits, NBLOCKS);
    for (uint32_t i = 0; i < NBLOCKS; i++) {
        if (i < hits)
            CHECK_EQ_INT(tiers[i], KVF_TIER_DISK);
        CHECK(file_exists(&f, keys[i]));
    }
    CHECK_STATUS(kvf_cache_stats_get(f.c, &s), KVF_OK);
    CHECK_EQ_U64(s.failures, 0);
    /* the same cache reads them now */
    get_range(&f, 0, NGET, per);
    for (uint32_t i = 0; i < NGET; i++)
        CHECK_STATUS(per[i], KVF_OK);
    fx_close(&f);

    /* and a restart finds all 200, byte-exact */
    REQUIRE(fx_open(&f, 256, &cc) == 0);
    CHECK_STATUS(kvf_cache_lookup(f.c, keys, NBLOCKS, &hits, NULL), KVF_OK);
    CHECK_EQ_U64(hits, NBLOCKS);
    kvf_status all[NBLOCKS];
    get_range(&f, 0, NBLOCKS, all);
    for (uint32_t i = 0; i < NBLOCKS; i++)
        CHECK_STATUS(all[i], KVF_OK);
    fx_close(&f);
    free(keys);
    free(tiers);
    test_rmtree(f.dir);
    return 0;
}

/* ---- injected EMFILE --------------------------------------------------------- */

static _Atomic int emfile_left; /* opens of block files still to fail; -1: all */

static int emfile_hook(const char *op, const char *path, size_t *len_p)
{
    (void)len_p;
    if (strcmp(op, "open") != 0 || !strstr(path, ".kvf") || strstr(path, ".tmp"))
        return 0;
    int left = atomic_load(&emfile_left);
    if (left < 0)
        return EMFILE;
    while (left > 0)
        if (atomic_compare_exchange_weak(&emfile_left, &left, left - 1))
            return EMFILE;
    return 0;
}

/* An offload of slot `slot` to `key`, or an onboard of `key` into it. */
static kvf_status move1(kvf_engine *e, bool onboard, kvf_key key, uint32_t slot)
{
    kvf_move mv = onboard ? FROM_KEY(key, slot) : TO_KEY(slot, key);
    kvf_ticket t;
    kvf_status st = onboard ? kvf_onboard(e, KVF_TIER_DISK, &mv, 1, &t)
                            : kvf_offload(e, KVF_TIER_DISK, &mv, 1, &t);
    kvf_status per = KVF_INPROGRESS;
    if (st == KVF_OK)
        kvf_wait(e, t, &per);
    return st == KVF_OK ? per : st;
}

/* The engine alone: an onboard whose open keeps failing with EMFILE fails
 * with KVF_ERR_RESOURCE and leaves the file; one that fails once is
 * retried and succeeds. */
static int test_engine_onboard_emfile(void)
{
    fixture f = {0};
    REQUIRE(test_tmpdir(f.dir, sizeof f.dir) == 0);
    REQUIRE(fx_open(&f, 4, NULL) == 0);
    const kvf_key key = KEY(0xE3F1);
    fill(&f, 0, key);
    CHECK_STATUS(move1(f.e, false, key, 0), KVF_OK);

    kvf__set_io_fault(emfile_hook);
    atomic_store(&emfile_left, -1);
    memset(prim(&f, 1), POISON, f.bytes);
    CHECK_STATUS(move1(f.e, true, key, 1), KVF_ERR_RESOURCE);
    CHECK(file_exists(&f, key));
    CHECK_STR_HAS(kvf_status_str(KVF_ERR_RESOURCE), "retry");

    /* one EMFILE: the worker's retry reads it */
    atomic_store(&emfile_left, 1);
    memset(prim(&f, 2), POISON, f.bytes);
    CHECK_STATUS(move1(f.e, true, key, 2), KVF_OK);
    CHECK(expect(&f, 2, key) == 0);
    CHECK_EQ_INT(atomic_load(&emfile_left), 0);
    kvf__set_io_fault(NULL);

    memset(prim(&f, 3), POISON, f.bytes);
    CHECK_STATUS(move1(f.e, true, key, 3), KVF_OK);
    CHECK(expect(&f, 3, key) == 0);
    fx_close(&f);
    test_rmtree(f.dir);
    return 0;
}

/* An acquire into the GPU tier that cannot open the block's file leaves
 * the block on disk, its file in place, and a later acquire reads it. */
static int test_acquire_emfile(void)
{
    fixture f = {0};
    REQUIRE(test_tmpdir(f.dir, sizeof f.dir) == 0);
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu.blocks = 2;
    cc.disk.blocks = 8;
    REQUIRE(fx_open(&f, 4, &cc) == 0);
    /* two blocks through the GPU tier; a third pushes the first to disk */
    kvf_key keys[3] = {KEY(0xA1), KEY(0xA2), KEY(0xA3)};
    for (int i = 0; i < 3; i++) {
        uint32_t slot;
        kvf_cache_ticket t;
        CHECK_STATUS(kvf_cache_alloc(f.c, &slot, 1, &t), KVF_OK);
        CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
        fill(&f, slot, keys[i]);
        CHECK_STATUS(kvf_cache_commit(f.c, &keys[i], &slot, 1, 50, NULL), KVF_OK);
        CHECK_STATUS(kvf_cache_unpin(f.c, &keys[i], 1), KVF_OK);
    }
    kvf_tier tier;
    size_t hits = 0;
    CHECK_STATUS(kvf_cache_lookup(f.c, &keys[0], 1, &hits, &tier), KVF_OK);
    REQUIRE(hits == 1 && tier == KVF_TIER_DISK);
    REQUIRE(file_exists(&f, keys[0]));

    kvf__set_io_fault(emfile_hook);
    atomic_store(&emfile_left, -1);
    uint32_t slot;
    kvf_cache_ticket t;
    kvf_status per = KVF_INPROGRESS;
    CHECK_STATUS(kvf_cache_acquire(f.c, &keys[0], 1, &slot, &hits, &t), KVF_OK);
    CHECK_EQ_U64(hits, 1);
    kvf_cache_wait(f.c, t, &per);
    CHECK_STATUS(per, KVF_ERR_RESOURCE);
    CHECK_STATUS(kvf_cache_unpin(f.c, &keys[0], 1), KVF_OK);
    kvf__set_io_fault(NULL);
    CHECK_STATUS(kvf_cache_lookup(f.c, &keys[0], 1, &hits, &tier), KVF_OK);
    CHECK(hits == 1 && tier == KVF_TIER_DISK);
    CHECK(file_exists(&f, keys[0]));

    /* now it comes up, whole; its file goes once read */
    CHECK_STATUS(kvf_cache_acquire(f.c, &keys[0], 1, &slot, &hits, &t), KVF_OK);
    CHECK_EQ_U64(hits, 1);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK(expect(&f, slot, keys[0]) == 0);
    CHECK_STATUS(kvf_cache_unpin(f.c, &keys[0], 1), KVF_OK);
    fx_close(&f); /* waits for the background removal */
    CHECK(!file_exists(&f, keys[0]));
    test_rmtree(f.dir);
    return 0;
}

static int test_errno_mapping(void)
{
    CHECK_EQ_INT(kvf__errno_status(EMFILE), KVF_ERR_RESOURCE);
    CHECK_EQ_INT(kvf__errno_status(ENFILE), KVF_ERR_RESOURCE);
    CHECK_EQ_INT(kvf__errno_status(EAGAIN), KVF_ERR_RESOURCE);
    CHECK_EQ_INT(kvf__errno_status(ENOBUFS), KVF_ERR_RESOURCE);
    CHECK_EQ_INT(kvf__errno_status(ENOMEM), KVF_ERR_NOMEM);
    CHECK_EQ_INT(kvf__errno_status(EIO), KVF_ERR_IO);
    CHECK(!kvf__status_condemns_block(KVF_ERR_RESOURCE));
    CHECK(!kvf__status_condemns_block(KVF_ERR_IO));
    CHECK(!kvf__status_condemns_block(KVF_ERR_NOMEM));
    CHECK(kvf__status_condemns_block(KVF_ERR_CORRUPT));
    CHECK(kvf__status_condemns_block(KVF_ERR_NOT_FOUND));
    CHECK(strcmp(kvf_status_str(KVF_ERR_RESOURCE), "unknown status") != 0);
    return 0;
}

int main(void)
{
    RUN(test_errno_mapping);
    RUN(test_engine_onboard_emfile);
    RUN(test_acquire_emfile);
    RUN(test_cache_restart_at_low_limit);
    return TEST_RESULT();
}
