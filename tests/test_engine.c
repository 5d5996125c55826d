/* The engine on the host backend: round trips through secondary slots and
 * files, partial blocks, hazards, failures and their propagation, and each
 * defect of the reference (DESIGN.md section 2) as a scenario. */
#include "backend.h"
#include "fileio.h"
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define POISON 0xA5

typedef struct fixture {
    kvf_engine *e;
    kvf_geometry g[3];
    size_t bytes[3];
    uint32_t pools, slots;
    char dir[512];
} fixture;

static const kvf_geometry G_REF = {2, 2, 2, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
static const kvf_geometry G_TOK = {1, 1, 4, 16, 8, KVF_DTYPE_BF16, KVF_ORDER_TOKEN_MAJOR};
static const kvf_geometry G_I4 = {3, 2, 1, 16, 6, KVF_DTYPE_INT4, KVF_ORDER_HEAD_MAJOR};

/* KVF_HOST_ASYNC=1: the host backend takes copy_async, the path of a GPU */
static bool host_async(void)
{
    const char *v = getenv("KVF_HOST_ASYNC");
    return v && strcmp(v, "1") == 0;
}

static int fx_open(fixture *f, const char *dir, const char *ns, uint32_t threads)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = threads;
    cfg.file_dir = dir;
    cfg.file_namespace = ns;
    CHECK_STATUS(kvf_engine_create(&cfg, &f->e), KVF_OK);
    CHECK(kvf_engine_backend(f->e) == KVF_BACKEND_HOST);
    for (uint32_t p = 0; p < f->pools; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, f->slots};
        kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, f->slots};
        uint32_t idx = 99;
        CHECK_STATUS(kvf_engine_add_pool(f->e, &f->g[p], &prim, &sec, &idx), KVF_OK);
        CHECK(idx == p);
        CHECK_STATUS(kvf_geometry_block_bytes(&f->g[p], &f->bytes[p]), KVF_OK);
    }
    return 0;
}

/* Three pools of different shapes, as the reference iterates over several. */
static int fx_init(fixture *f, bool files, uint32_t slots)
{
    memset(f, 0, sizeof *f);
    f->g[0] = G_REF;
    f->g[1] = G_TOK;
    f->g[2] = G_I4;
    f->pools = 3;
    f->slots = slots;
    if (files)
        CHECK(test_tmpdir(f->dir, sizeof f->dir) == 0);
    return fx_open(f, files ? f->dir : NULL, "test", 0);
}

static void fx_done(fixture *f)
{
    kvf_engine_destroy(f->e);
    f->e = NULL;
    if (f->dir[0])
        test_rmtree(f->dir);
}

static uint8_t *slot(fixture *f, uint32_t p, kvf_level lv, uint32_t s)
{
    void *ptr = NULL;
    if (kvf_engine_slot_ptr(f->e, p, lv, s, &ptr) != KVF_OK)
        return NULL;
    return ptr;
}

/* Fills primary slot s of every pool with data derived from `tag`. */
static void fill_block(fixture *f, uint32_t s, uint64_t tag)
{
    for (uint32_t p = 0; p < f->pools; p++)
        test_fill_random(slot(f, p, KVF_LEVEL_PRIMARY, s), f->bytes[p], tag * 31 + p + 1);
}

static void poison_block(fixture *f, uint32_t s)
{
    for (uint32_t p = 0; p < f->pools; p++)
        memset(slot(f, p, KVF_LEVEL_PRIMARY, s), POISON, f->bytes[p]);
}

/* Primary slot s holds the first `tokens` tokens of the block made from
 * `tag`, and poison everywhere else. */
static int expect_block(fixture *f, uint32_t s, uint64_t tag, uint32_t tokens)
{
    for (uint32_t p = 0; p < f->pools; p++) {
        uint8_t *want = malloc(f->bytes[p]);
        test_fill_random(want, f->bytes[p], tag * 31 + p + 1);
        kvf_region r;
        CHECK_STATUS(kvf_geometry_region(&f->g[p], tokens, &r), KVF_OK);
        const uint8_t *got = slot(f, p, KVF_LEVEL_PRIMARY, s);
        for (size_t off = 0; off < f->bytes[p]; off++) {
            size_t row = off / r.pitch, in_row = off % r.pitch;
            bool moved = r.rows == 1 ? off < r.row_bytes : (row < r.rows && in_row < r.row_bytes);
            uint8_t e = moved ? want[off] : POISON;
            if (got[off] != e) {
                fprintf(stderr, "slot %u pool %u byte %zu: 0x%02x, want 0x%02x (tag %llu)\n", s, p,
                        off, got[off], e, (unsigned long long)tag);
                free(want);
                return 1;
            }
        }
        free(want);
    }
    return 0;
}

static kvf_status run1(kvf_engine *e, bool offload, kvf_tier tier, uint64_t src, uint64_t dst,
                       uint32_t tokens)
{
    kvf_move m = {src, dst, tokens};
    kvf_ticket t;
    kvf_status st = offload ? kvf_offload(e, tier, &m, 1, &t) : kvf_onboard(e, tier, &m, 1, &t);
    if (st != KVF_OK)
        return st;
    return kvf_wait(e, t, NULL);
}

/* ---- round trips ----------------------------------------------------------- */

static int round_trip(kvf_tier tier, uint32_t tokens)
{
    fixture f;
    if (fx_init(&f, tier == KVF_TIER_FILE, 64))
        return 1;
    enum { N = 40 };
    kvf_move off[N], on[N];
    uint32_t perm[N];
    test_permutation(perm, N, 77 + tokens);
    for (uint32_t i = 0; i < N; i++) {
        fill_block(&f, i, 1000 + i);
        off[i] =
            (kvf_move){i, tier == KVF_TIER_FILE ? 0xabc00000ull + perm[i] : 63 - perm[i], tokens};
        on[i] = (kvf_move){off[i].dst, (i + 7) % N, tokens};
    }
    kvf_ticket t;
    kvf_status per[N];
    CHECK_STATUS(kvf_offload(f.e, tier, off, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, per), KVF_OK);
    for (int i = 0; i < N; i++)
        CHECK_STATUS(per[i], KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_UNKNOWN_TICKET);
    for (uint32_t i = 0; i < N; i++)
        poison_block(&f, i);
    CHECK_STATUS(kvf_onboard(f.e, tier, on, N, &t), KVF_OK);
    kvf_status st;
    while ((st = kvf_poll(f.e, t, per)) == KVF_INPROGRESS)
        usleep(100);
    CHECK_STATUS(st, KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        if (expect_block(&f, (i + 7) % N, 1000 + i, tokens))
            return 1;
    fx_done(&f);
    return 0;
}

static int test_host_whole(void)
{
    return round_trip(KVF_TIER_HOST, 0);
}
static int test_host_partial(void)
{
    return round_trip(KVF_TIER_HOST, 4) || round_trip(KVF_TIER_HOST, 15);
}
static int test_file_whole(void)
{
    return round_trip(KVF_TIER_FILE, 0);
}
static int test_file_partial(void)
{
    return round_trip(KVF_TIER_FILE, 6) || round_trip(KVF_TIER_FILE, 1 * 2);
}

/* A partial onboard of a block stored whole, and a refused one of more
 * tokens than were stored. */
static int test_partial_of_stored(void)
{
    for (int tier = 0; tier < 2; tier++) {
        fixture f;
        if (fx_init(&f, tier == KVF_TIER_FILE, 8))
            return 1;
        fill_block(&f, 0, 5);
        fill_block(&f, 1, 6);
        CHECK_STATUS(run1(f.e, true, (kvf_tier)tier, 0, 3, 0), KVF_OK);
        CHECK_STATUS(run1(f.e, true, (kvf_tier)tier, 1, 4, 8), KVF_OK);
        poison_block(&f, 2);
        CHECK_STATUS(run1(f.e, false, (kvf_tier)tier, 3, 2, 10), KVF_OK);
        if (expect_block(&f, 2, 5, 10))
            return 1;
        poison_block(&f, 2);
        CHECK_STATUS(run1(f.e, false, (kvf_tier)tier, 4, 2, 6), KVF_OK);
        if (expect_block(&f, 2, 6, 6))
            return 1;
        /* 8 tokens stored, 12 asked: refused, and the slot is not touched */
        poison_block(&f, 2);
        CHECK_STATUS(run1(f.e, false, (kvf_tier)tier, 4, 2, 12), KVF_ERR_RANGE);
        CHECK_STATUS(run1(f.e, false, (kvf_tier)tier, 4, 2, 0), KVF_ERR_RANGE);
        CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 2)[0] == POISON);
        fx_done(&f);
    }
    return 0;
}

/* Blocks pushed from the host tier down to files without the primary slots
 * (demote), and files read into the host tier (promote), queued back to
 * back so each step depends on the previous one: offload -> demote ->
 * promote into other secondary slots -> onboard, checked byte for byte. */
static int test_demote_promote(void)
{
    fixture f;
    if (fx_init(&f, true, 64))
        return 1;
    enum { N = 24 };
    kvf_move off[N], dem[N], pro[N], on[N];
    uint32_t perm[N];
    test_permutation(perm, N, 4242);
    uint32_t tokens = 6; /* partial: the stored token count travels along */
    for (uint32_t i = 0; i < N; i++) {
        fill_block(&f, i, 500 + i);
        off[i] = (kvf_move){i, 63 - perm[i], tokens};
        dem[i] = (kvf_move){63 - perm[i], 0x5eed0000ull + i, tokens};
        pro[i] = (kvf_move){0x5eed0000ull + i, perm[i], tokens};
        on[i] = (kvf_move){perm[i], (i + 5) % N, 0};
    }
    kvf_ticket t[4];
    kvf_status per[N];
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, off, N, &t[0]), KVF_OK);
    CHECK_STATUS(kvf_demote(f.e, dem, N, &t[1]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[0], NULL), KVF_OK); /* the primaries are read */
    /* the demoted secondary slots may be overwritten at once: write after read */
    for (uint32_t i = 0; i < N; i++)
        fill_block(&f, i, 9000 + i);
    kvf_move clobber[N];
    for (uint32_t i = 0; i < N; i++)
        clobber[i] = (kvf_move){i, 63 - perm[i], 0};
    kvf_ticket tc;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, clobber, N, &tc), KVF_OK);
    CHECK_STATUS(kvf_promote(f.e, pro, N, &t[2]), KVF_OK);
    for (int k = 1; k < 3; k++) {
        CHECK_STATUS(kvf_wait(f.e, t[k], per), KVF_OK);
        for (int i = 0; i < N; i++)
            CHECK_STATUS(per[i], KVF_OK);
    }
    CHECK_STATUS(kvf_wait(f.e, tc, NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        poison_block(&f, i);
    /* the promoted slots hold the partial blocks: asking for more fails */
    kvf_move too_much = {perm[0], 40, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &too_much, 1, &t[3]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[3], NULL), KVF_ERR_RANGE);
    for (uint32_t i = 0; i < N; i++)
        on[i].tokens = tokens;
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, on, N, &t[3]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[3], NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        if (expect_block(&f, (i + 5) % N, 500 + i, tokens))
            return 1;
    /* an empty secondary slot has nothing to demote; a missing key nothing to promote */
    kvf_move empty = {30, 0x77, 0}, missing = {0x404, 30, 0};
    CHECK_STATUS(kvf_demote(f.e, &empty, 1, &t[0]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[0], NULL), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(kvf_promote(f.e, &missing, 1, &t[0]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[0], NULL), KVF_ERR_NOT_FOUND);
    kvf_move bad = {64, 0x78, 0};
    CHECK_STATUS(kvf_demote(f.e, &bad, 1, &t[0]), KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "secondary slot 64") != NULL);
    fx_done(&f);

    /* without a file tier, refused whole */
    if (fx_init(&f, false, 8))
        return 1;
    kvf_move m = {0, 1, 0};
    CHECK_STATUS(kvf_demote(f.e, &m, 1, &t[0]), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "no file tier") != NULL);
    fx_done(&f);
    return 0;
}

static int test_copy_primary(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    fill_block(&f, 0, 42);
    poison_block(&f, 5);
    kvf_move m = {0, 5, 9};
    kvf_ticket t;
    CHECK_STATUS(kvf_copy(f.e, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    if (expect_block(&f, 5, 42, 9))
        return 1;
    kvf_move bad[2] = {{1, 2, 0}, {2, 3, 0}}; /* slot 2 read and written */
    CHECK_STATUS(kvf_copy(f.e, bad, 2, &t), KVF_ERR_INVALID);
    kvf_move self = {4, 4, 0};
    CHECK_STATUS(kvf_copy(f.e, &self, 1, &t), KVF_ERR_INVALID);
    fx_done(&f);
    return 0;
}

/* Caller-owned memory, with a slot stride larger than the block. */
static int test_caller_memory(void)
{
    kvf_geometry g = G_REF;
    size_t bytes;
    CHECK_STATUS(kvf_geometry_block_bytes(&g, &bytes), KVF_OK);
    size_t stride = bytes + 256;
    uint8_t *prim = malloc(stride * 4), *sec = malloc(stride * 4);
    memset(prim, POISON, stride * 4);
    memset(sec, 0, stride * 4);
    kvf_engine *e;
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_OK);
    kvf_pool_desc pd = {KVF_MEMORY_HOST, prim, stride, 4}, sd = {KVF_MEMORY_HOST, sec, stride, 4};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &pd, &sd, NULL), KVF_OK);
    void *p;
    CHECK_STATUS(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 2, &p), KVF_OK);
    CHECK(p == prim + 2 * stride);
    test_fill_random(prim + stride, bytes, 9);
    CHECK_STATUS(run1(e, true, KVF_TIER_HOST, 1, 3, 0), KVF_OK);
    CHECK(memcmp(sec + 3 * stride, prim + stride, bytes) == 0);
    /* the gap after each slot is the caller's and stays untouched */
    for (size_t i = bytes; i < stride; i++)
        CHECK(sec[3 * stride + i] == 0);
    CHECK_STATUS(run1(e, false, KVF_TIER_HOST, 3, 0, 0), KVF_OK);
    CHECK(memcmp(prim, prim + stride, bytes) == 0);
    kvf_engine_destroy(e);
    free(prim);
    free(sec);
    return 0;
}

/* ---- the reference's defects (DESIGN.md section 2) --------------------- */

/* 1. Skipped onboards: a block offloaded to a file in one step and reused
 * in a later one (after syncTransfers cleared the reference's pending list)
 * must be read back. */
static int test_defect1_onboard_after_sync(void)
{
    fixture f;
    if (fx_init(&f, true, 8))
        return 1;
    fill_block(&f, 0, 11);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 0, 0x1111, 0), KVF_OK);
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK); /* the step ends */
    fill_block(&f, 0, 12);                            /* the slot is reused */
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK); /* another step */
    poison_block(&f, 1);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0x1111, 1, 0), KVF_OK);
    if (expect_block(&f, 1, 11, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* 4. Name collisions and restarts: two engines (two ranks) writing one key
 * in one directory keep their own blocks; a new engine on the same
 * namespace finds the blocks stored before it started. */
static int test_defect4_namespaces_and_restart(void)
{
    fixture a, b;
    if (fx_init(&a, true, 4))
        return 1;
    memset(&b, 0, sizeof b);
    b.pools = a.pools;
    memcpy(b.g, a.g, sizeof a.g);
    b.slots = 4;
    if (fx_open(&b, a.dir, "rank1", 0))
        return 1;
    fill_block(&a, 0, 100);
    fill_block(&b, 0, 200);
    CHECK_STATUS(run1(a.e, true, KVF_TIER_FILE, 0, 7, 0), KVF_OK);
    CHECK_STATUS(run1(b.e, true, KVF_TIER_FILE, 0, 7, 0), KVF_OK);
    poison_block(&a, 1);
    poison_block(&b, 1);
    CHECK_STATUS(run1(a.e, false, KVF_TIER_FILE, 7, 1, 0), KVF_OK);
    CHECK_STATUS(run1(b.e, false, KVF_TIER_FILE, 7, 1, 0), KVF_OK);
    if (expect_block(&a, 1, 100, 0) || expect_block(&b, 1, 200, 0))
        return 1;
    kvf_engine_destroy(b.e);
    /* restart rank 0's engine: its block is still there */
    kvf_engine_destroy(a.e);
    if (fx_open(&a, a.dir, "test", 0))
        return 1;
    poison_block(&a, 2);
    CHECK_STATUS(run1(a.e, false, KVF_TIER_FILE, 7, 2, 0), KVF_OK);
    if (expect_block(&a, 2, 100, 0))
        return 1;
    /* a new engine with another layout on the same namespace is refused */
    kvf_engine_destroy(a.e);
    a.g[1].head_size = 16;
    if (fx_open(&a, a.dir, "test", 0))
        return 1;
    CHECK_STATUS(run1(a.e, false, KVF_TIER_FILE, 7, 2, 0), KVF_ERR_MISMATCH);
    fx_done(&a);
    return 0;
}

static int fault_errno, fault_short;
static const char *fault_op;
static int fault_hook(const char *op, const char *path, size_t *len_p)
{
    if (!fault_op || strcmp(op, fault_op) != 0)
        return 0;
    if (fault_short && len_p && *len_p > 1) {
        *len_p /= 2;
        return 0;
    }
    return fault_errno;
}

static int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static int block_file(fixture *f, uint64_t key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/test/%016llx.kvf", f->dir, (unsigned long long)key);
    return 0;
}

/* 2 and 6. Short I/O, missing and damaged files: each fails its own move
 * with a status and a message naming block and file, never hands back the
 * bytes, never aborts, and loses no other block. */
static int test_defect2_6_io_faults(void)
{
    fixture f;
    int fds = count_fds();
    if (fx_init(&f, true, 8))
        return 1;
    fill_block(&f, 0, 1);
    fill_block(&f, 1, 2);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 0, 0xa, 0), KVF_OK);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 1, 0xb, 0), KVF_OK);

    /* short reads and writes are continued, not taken for the data */
    kvf__set_io_fault(fault_hook);
    fault_short = 1;
    fault_op = "write";
    fill_block(&f, 2, 3);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 2, 0xc, 0), KVF_OK);
    fault_op = "read";
    poison_block(&f, 3);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xc, 3, 0), KVF_OK);
    if (expect_block(&f, 3, 3, 0))
        return 1;
    fault_short = 0;

    /* EIO on write: that block is reported lost, and its old file is gone */
    fault_op = "write";
    fault_errno = EIO;
    fill_block(&f, 2, 4);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 2, 0xa, 0), KVF_ERR_IO);
    CHECK(strstr(kvf_last_error(), "ticket") != NULL);
    fault_errno = ENOSPC;
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 2, 0xd, 0), KVF_ERR_NO_SPACE);
    fault_op = "read";
    fault_errno = EIO;
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xb, 4, 0), KVF_ERR_IO);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    poison_block(&f, 4);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xa, 4, 0), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xd, 4, 0), KVF_ERR_NOT_FOUND);
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 4)[0] == POISON);
    /* block 0xb was not touched by the failed read */
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xb, 4, 0), KVF_OK);
    if (expect_block(&f, 4, 2, 0))
        return 1;

    /* a file truncated or changed behind kvferry's back */
    char path[1024];
    block_file(&f, 0xb, path, sizeof path);
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    CHECK(truncate(path, sb.st_size - 10) == 0);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xb, 4, 0), KVF_ERR_CORRUPT);
    block_file(&f, 0xc, path, sizeof path);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t byte;
    CHECK(pread(fd, &byte, 1, 200) == 1);
    byte ^= 0x10;
    CHECK(pwrite(fd, &byte, 1, 200) == 1);
    close(fd);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xc, 4, 0), KVF_ERR_CORRUPT);
    /* a block never stored: not found, with its key and file in the log */
    kvf_move m = {0x5eed, 4, 0};
    kvf_ticket t;
    kvf_status per;
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_FILE, &m, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, &per), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(per, KVF_ERR_NOT_FOUND);
    fx_done(&f);
    CHECK(count_fds() == fds);
    return 0;
}

/* A failure is never hidden behind a later success: a move queued to read
 * what a failed move wrote is lost too, and so is every later read of that
 * secondary slot until it is written again. */
static uint8_t *fail_dst;
static kvf_status fail_copy(const kvf__copy *c)
{
    return c->dst == fail_dst ? KVF_ERR_IO : KVF_OK;
}

static int test_failure_propagates(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    fill_block(&f, 0, 1);
    fail_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 3);
    kvf__set_copy_hook(fail_copy);
    kvf_move off = {0, 3, 0}, on = {3, 1, 0};
    kvf_ticket t1, t2;
    poison_block(&f, 1);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on, 1, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_ERR_LOST);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 3, 1, 0), KVF_ERR_LOST);
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_HOST, 0, 3, 0), KVF_OK);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 3, 1, 0), KVF_OK);
    if (expect_block(&f, 1, 1, 0))
        return 1;
    /* a secondary slot never written holds nothing to onboard */
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 6, 1, 0), KVF_ERR_NOT_FOUND);
    fx_done(&f);
    return 0;
}

/* A failed write, a read queued behind it, then a good rewrite queued
 * before that read ran, then a read of the rewrite: the first read is
 * lost, the rewrite and the second read are not. */
static atomic_int fail_once_left;
static kvf_status fail_once(const kvf__copy *c)
{
    if (c->dst == fail_dst && atomic_fetch_sub(&fail_once_left, 1) > 0) {
        usleep(20 * 1000); /* the others are queued behind it meanwhile */
        return KVF_ERR_IO;
    }
    return KVF_OK;
}

static int test_failure_then_rewrite(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    fill_block(&f, 0, 80);
    fill_block(&f, 2, 81);
    poison_block(&f, 1);
    poison_block(&f, 4);
    fail_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 3);
    atomic_store(&fail_once_left, 1);
    kvf__set_copy_hook(fail_once);
    kvf_move w1 = {0, 3, 0}, r0 = {3, 1, 0}, w2 = {2, 3, 0}, r3 = {3, 4, 0};
    kvf_ticket t[4];
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &w1, 1, &t[0]), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &r0, 1, &t[1]), KVF_OK);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &w2, 1, &t[2]), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &r3, 1, &t[3]), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[3], NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[2], NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t[1], NULL), KVF_ERR_LOST);
    CHECK_STATUS(kvf_wait(f.e, t[0], NULL), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
    if (expect_block(&f, 4, 81, 0))
        return 1;
    /* the slot is good again for later reads */
    poison_block(&f, 5);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 3, 5, 0), KVF_OK);
    if (expect_block(&f, 5, 81, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* Every failed write to a file removes its key's file, however it failed:
 * in the gather from the slots into staging, from a lost source before
 * any I/O, or in the batch's closing fsync (after the file was renamed
 * into place). A later read finds no block, never the old version nor an
 * unsynced new one; other keys are untouched. */
static const uint8_t *fail_src;
static kvf_status fail_copy_from(const kvf__copy *c)
{
    return c->src == fail_src ? KVF_ERR_IO : KVF_OK;
}

static int test_failed_file_write_removes(void)
{
    fixture f;
    if (fx_init(&f, true, 8))
        return 1;
    fill_block(&f, 0, 41);
    fill_block(&f, 1, 42);
    fill_block(&f, 2, 43);
    for (uint64_t k = 0; k < 3; k++)
        CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, k, 0xf0 + k, 0), KVF_OK);
    /* the gather into staging fails: nothing of the new version was written */
    fill_block(&f, 0, 51);
    fail_src = slot(&f, 0, KVF_LEVEL_PRIMARY, 0);
    kvf__set_copy_hook(fail_copy_from);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 0, 0xf0, 0), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    poison_block(&f, 4);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xf0, 4, 0), KVF_ERR_NOT_FOUND);
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 4)[0] == POISON);
    /* a demote of a secondary slot whose write failed: lost before any I/O */
    fail_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 5);
    kvf__set_copy_hook(fail_copy);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_HOST, 1, 5, 0), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    kvf_move dm = {5, 0xf1, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_demote(f.e, &dm, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_ERR_LOST);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xf1, 4, 0), KVF_ERR_NOT_FOUND);
    /* the batch's fsync fails after its file was renamed into place */
    kvf__set_io_fault(fault_hook);
    fault_op = "fsync";
    fault_errno = EIO;
    fill_block(&f, 2, 53);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 2, 0xf2, 0), KVF_ERR_IO);
    fault_op = NULL;
    kvf__set_io_fault(NULL);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xf2, 4, 0), KVF_ERR_NOT_FOUND);
    /* a key no failure touched */
    fill_block(&f, 3, 44);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_FILE, 3, 0xf3, 0), KVF_OK);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xf3, 4, 0), KVF_OK);
    if (expect_block(&f, 4, 44, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* A read from a file whose copy from staging into its slots fails: that
 * move alone fails (on an asynchronous backend, in the backend's
 * callback), the other moves of the batch land, the file stays. */
static int test_onboard_copy_failure(void)
{
    fixture f;
    if (fx_init(&f, true, 8))
        return 1;
    fill_block(&f, 0, 61);
    fill_block(&f, 1, 62);
    kvf_move off[2] = {{0, 0xc0, 0}, {1, 0xc1, 0}};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_FILE, off, 2, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    poison_block(&f, 4);
    poison_block(&f, 5);
    fail_dst = slot(&f, 0, KVF_LEVEL_PRIMARY, 4);
    kvf__set_copy_hook(fail_copy);
    kvf_move on[2] = {{0xc0, 4, 0}, {0xc1, 5, 0}};
    kvf_status per[2];
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_FILE, on, 2, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, per), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    CHECK_STATUS(per[0], KVF_ERR_IO);
    CHECK_STATUS(per[1], KVF_OK);
    if (expect_block(&f, 5, 62, 0))
        return 1;
    CHECK_STATUS(run1(f.e, false, KVF_TIER_FILE, 0xc0, 4, 0), KVF_OK);
    if (expect_block(&f, 4, 61, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* An engine on the host backend with one pool of n primary and n
 * secondary slots of 64 bytes; their bases in *prim, *sec. */
static kvf_engine *slots64_engine(uint32_t n, uint32_t threads, uint8_t **prim, uint8_t **sec)
{
    kvf_geometry g = {1, 1, 1, 4, 4, KVF_DTYPE_FP32, KVF_ORDER_HEAD_MAJOR}; /* 64 bytes */
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = threads;
    kvf_engine *e;
    if (kvf_engine_create(&cfg, &e) != KVF_OK)
        return NULL;
    kvf_pool_desc d = {KVF_MEMORY_HOST, NULL, 0, n};
    if (kvf_engine_add_pool(e, &g, &d, &d, NULL) != KVF_OK ||
        kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 0, (void **)prim) != KVF_OK ||
        kvf_engine_slot_ptr(e, 0, KVF_LEVEL_SECONDARY, 0, (void **)sec) != KVF_OK) {
        fprintf(stderr, "64-byte slots engine: %s\n", kvf_last_error());
        kvf_engine_destroy(e);
        return NULL;
    }
    return e;
}

/* Batches larger than one part (4096 moves) are queued in parts: hazards
 * between two such batches, and each move's status at its own index. */
static int test_large_batches(void)
{
    enum { N = 10000 };
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 3, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    uint8_t *orig = malloc((size_t)N * 64);
    test_fill_random(orig, (size_t)N * 64, 2024);
    memcpy(prim, orig, (size_t)N * 64);
    uint32_t *perm = malloc(N * sizeof *perm);
    test_permutation(perm, N, 5);
    kvf_move *off = malloc(N * sizeof *off), *on = malloc(N * sizeof *on);
    for (uint32_t i = 0; i < N; i++) {
        off[i] = (kvf_move){i, perm[i], 0};
        on[i] = (kvf_move){perm[i], (i + 1) % N, 0}; /* overwrites slots still being read */
    }
    kvf_ticket t1, t2;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, off, N, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, on, N, &t2), KVF_OK);
    kvf_status *per = malloc(N * sizeof *per);
    CHECK_STATUS(kvf_wait(e, t2, per), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t1, NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_STATUS(per[i], KVF_OK);
        CHECK(memcmp(prim + (size_t)((i + 1) % N) * 64, orig + (size_t)i * 64, 64) == 0);
    }
    /* one failing move reports at its own index */
    fail_dst = sec + (size_t)perm[9000] * 64;
    kvf__set_copy_hook(fail_copy);
    for (uint32_t i = 0; i < N; i++)
        off[i] = (kvf_move){(i + 1) % N, perm[i], 0};
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, off, N, &t1), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t1, per), KVF_ERR_IO);
    kvf__set_copy_hook(NULL);
    if (!host_async()) {
        for (uint32_t i = 0; i < N; i++)
            CHECK_STATUS(per[i], i == 9000 ? KVF_ERR_IO : KVF_OK);
    } else {
        /* an async backend fails the chunk the copy was in (a GPU's copies
         * of a chunk end together): that chunk only, at most one part */
        uint32_t failed = 0;
        for (uint32_t i = 0; i < N; i++)
            if (per[i] != KVF_OK) {
                CHECK_STATUS(per[i], KVF_ERR_IO);
                failed++;
            }
        CHECK_STATUS(per[9000], KVF_ERR_IO);
        CHECK(failed >= 1 && failed <= 4096);
    }
    /* fire and forget of a large batch, then a sync */
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, on, N, NULL), KVF_OK);
    CHECK_STATUS(kvf_sync_stream(e, NULL), KVF_OK);
    kvf_engine_destroy(e);
    free(orig);
    free(perm);
    free(off);
    free(on);
    free(per);
    return 0;
}

/* A batch is registered in slices, the engine lock dropped between them.
 * A batch it depends on (registered in the first slice) completes in the
 * gap: that must not start the batch before its last slice is registered.
 * The offload it depends on is held in its copy until the gap, then
 * awaited there. */
static const uint8_t *hold_src;
static atomic_bool hold_released;
static kvf_engine *gap_engine;
static kvf_ticket gap_ticket;
static atomic_int gap_calls;
static kvf_status hold_copy(const kvf__copy *c)
{
    for (int ms = 0; c->src == hold_src && !atomic_load(&hold_released) && ms < 5000; ms++)
        usleep(1000);
    return KVF_OK;
}
static void gap_hook(void)
{
    if (atomic_fetch_add(&gap_calls, 1) != 0)
        return;
    atomic_store(&hold_released, true);
    while (kvf_poll(gap_engine, gap_ticket, NULL) == KVF_INPROGRESS)
        usleep(100);
}

static int test_dependency_done_while_registering(void)
{
    enum { N = 3000 }; /* three slices, one batch */
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 3, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    uint8_t *orig = malloc((size_t)N * 64), *fresh = malloc(64);
    test_fill_random(orig, (size_t)N * 64, 31);
    test_fill_random(fresh, 64, 32);
    memcpy(prim, orig, (size_t)N * 64);
    kvf_move *on = malloc(N * sizeof *on);
    for (uint32_t i = 0; i < N; i++)
        on[i] = (kvf_move){i, i, 0};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, on, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    memcpy(prim, fresh, 64);
    /* the offload of primary slot 0 (fresh data) to secondary slot 0, held */
    hold_src = prim;
    atomic_store(&hold_released, false);
    atomic_store(&gap_calls, 0);
    kvf__set_copy_hook(hold_copy);
    kvf_move a = {0, 0, 0};
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &a, 1, &gap_ticket), KVF_OK);
    /* an onboard whose first move reads what the offload writes */
    for (uint32_t i = 0; i < N; i++)
        on[i] = (kvf_move){i, (i + 1) % N, 0};
    gap_engine = e;
    kvf__set_register_hook(gap_hook);
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, on, N, &t), KVF_OK);
    kvf__set_register_hook(NULL);
    kvf__set_copy_hook(NULL);
    CHECK(atomic_load(&gap_calls) == 2);
    kvf_status *per = malloc(N * sizeof *per);
    CHECK_STATUS(kvf_wait(e, t, per), KVF_OK);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_STATUS(per[i], KVF_OK);
        /* slot 0's fresh data went down first, then came back up into slot 1 */
        const uint8_t *want = i == 0 ? fresh : orig + (size_t)i * 64;
        CHECK(memcmp(prim + (size_t)((i + 1) % N) * 64, want, 64) == 0);
    }
    CHECK_STATUS(kvf_sync_stream(e, NULL), KVF_OK);
    kvf_engine_destroy(e);
    free(orig);
    free(fresh);
    free(on);
    free(per);
    return 0;
}

/* A batch is shared by the workers: while one is held up in its chunk,
 * another takes the next (a worker claiming a chunk wakes the next idle
 * one; only a batch becoming ready used to). The copy of the first move
 * waits, up to 2 s, for a copy on another thread: with one worker left to
 * do the whole batch it waits in vain. */
static const uint8_t *stall_src;
static pthread_mutex_t copy_threads_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_t copy_threads[2];
static atomic_int copy_nthreads;
static atomic_bool stall_timed_out;
static kvf_status stall_copy(const kvf__copy *c)
{
    pthread_t self = pthread_self();
    pthread_mutex_lock(&copy_threads_mu);
    int n = atomic_load(&copy_nthreads);
    bool known = false;
    for (int k = 0; k < n; k++)
        known |= pthread_equal(copy_threads[k], self);
    if (!known && n < 2) {
        copy_threads[n] = self;
        atomic_store(&copy_nthreads, n + 1);
    }
    pthread_mutex_unlock(&copy_threads_mu);
    if (c->src == stall_src) {
        int waited_ms = 0;
        while (atomic_load(&copy_nthreads) < 2 && waited_ms < 2000) {
            usleep(1000);
            waited_ms++;
        }
        if (atomic_load(&copy_nthreads) < 2)
            atomic_store(&stall_timed_out, true);
    }
    return KVF_OK;
}

static int test_batch_shared_by_workers(void)
{
    if (host_async())
        return 0; /* copies run on the backend's thread, not the workers */
    enum { N = 2000 };
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 2, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    test_fill_random(prim, (size_t)N * 64, 91);
    kvf_move *mv = malloc(N * sizeof *mv);
    for (uint32_t i = 0; i < N; i++)
        mv[i] = (kvf_move){i, i, 0};
    /* both workers asleep first (a worker not yet waiting would find the
     * batch on its own) */
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    usleep(50 * 1000);
    stall_src = prim;
    atomic_store(&copy_nthreads, 0);
    atomic_store(&stall_timed_out, false);
    kvf__set_copy_hook(stall_copy);
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    CHECK(atomic_load(&copy_nthreads) == 2);
    CHECK(!atomic_load(&stall_timed_out));
    CHECK(memcmp(prim, sec, (size_t)N * 64) == 0);
    kvf_engine_destroy(e);
    free(mv);
    return 0;
}

/* Large batches (in parts, sorted by secondary slot): one that writes a
 * slot twice is refused whole, naming the move; an onboard where some
 * moves fail their checks (their secondary slots hold nothing) reports
 * each at its own index, leaves their destinations alone, and the others
 * land. */
static int test_large_batch_short_reads(void)
{
    enum { N = 12000 };
    uint8_t *prim, *sec;
    kvf_engine *e = slots64_engine(N, 2, &prim, &sec);
    CHECK(e != NULL);
    if (!e)
        return 1;
    uint8_t *orig = malloc((size_t)N * 64);
    test_fill_random(orig, (size_t)N * 64, 77);
    memcpy(prim, orig, (size_t)N * 64);
    uint32_t *perm = malloc(N * sizeof *perm);
    test_permutation(perm, N, 78);
    /* every 500th secondary slot is left empty */
    kvf_move *mv = malloc(N * sizeof *mv);
    uint32_t n = 0;
    for (uint32_t i = 0; i < N; i++)
        if (perm[i] % 500 != 0)
            mv[n++] = (kvf_move){i, perm[i], 0};
    /* a large batch writing one slot twice is refused whole, naming the
     * second move (sorted offloads find it by their counts) */
    kvf_ticket t;
    kvf_move keep = mv[n - 1];
    mv[n - 1].dst = mv[17].dst;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, n, &t), KVF_ERR_INVALID);
    char want[96];
    snprintf(want, sizeof want, "move %u writes secondary slot %llu", n - 1,
             (unsigned long long)mv[17].dst);
    CHECK_STR_HAS(kvf_last_error(), want);
    mv[n - 1] = keep;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, mv, n, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    memset(prim, 0xA5, (size_t)N * 64);
    for (uint32_t i = 0; i < N; i++)
        mv[i] = (kvf_move){perm[i], (i + 7) % N, 0};
    kvf_status *per = malloc(N * sizeof *per);
    mv[N - 1].dst = mv[3].dst;
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, mv, N, &t), KVF_ERR_INVALID);
    snprintf(want, sizeof want, "move %u writes primary slot %llu", N - 1,
             (unsigned long long)mv[3].dst);
    CHECK_STR_HAS(kvf_last_error(), want);
    mv[N - 1].dst = (N - 1 + 7) % N;
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, mv, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, per), KVF_ERR_NOT_FOUND);
    for (uint32_t i = 0; i < N; i++) {
        const uint8_t *got = prim + (size_t)((i + 7) % N) * 64;
        if (perm[i] % 500 == 0) {
            CHECK_STATUS(per[i], KVF_ERR_NOT_FOUND);
            CHECK(got[0] == 0xA5 && memcmp(got, got + 1, 63) == 0);
        } else {
            CHECK_STATUS(per[i], KVF_OK);
            CHECK(memcmp(got, orig + (size_t)i * 64, 64) == 0);
        }
    }
    kvf_engine_destroy(e);
    free(orig);
    free(perm);
    free(mv);
    free(per);
    return 0;
}

/* 7. Hazards both ways, made deterministic by slowing one copy down. */
static uint8_t *slow_src, *slow_dst;
static kvf_status slow_copy(const kvf__copy *c)
{
    if (c->src == slow_src || c->dst == slow_dst)
        usleep(50 * 1000);
    return KVF_OK;
}

static int test_defect7_hazards(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    kvf__set_copy_hook(slow_copy);
    kvf_ticket t1, t2, t3;

    /* read after write: the onboard of slot 2 waits for its slow offload */
    fill_block(&f, 0, 10);
    slow_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 2);
    kvf_move off = {0, 2, 0}, on = {2, 1, 0};
    poison_block(&f, 1);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on, 1, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    if (expect_block(&f, 1, 10, 0))
        return 1;
    slow_dst = NULL;

    /* write after read: an offload into slot 2 waits for the slow onboard
     * still reading it */
    fill_block(&f, 3, 30);
    slow_src = slot(&f, 0, KVF_LEVEL_SECONDARY, 2);
    poison_block(&f, 4);
    kvf_move on2 = {2, 4, 0}, off2 = {3, 2, 0};
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on2, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off2, 1, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    if (expect_block(&f, 4, 10, 0))
        return 1;
    slow_src = NULL;

    /* write after read on a primary slot: an onboard into slot 3 waits for
     * the slow offload still reading it; then write after write */
    fill_block(&f, 5, 50);
    CHECK_STATUS(run1(f.e, true, KVF_TIER_HOST, 5, 6, 0), KVF_OK);
    slow_src = slot(&f, 0, KVF_LEVEL_PRIMARY, 3);
    kvf_move off3 = {3, 7, 0}, on3 = {6, 3, 0}, on4 = {2, 3, 0};
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off3, 1, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on3, 1, &t2), KVF_OK);
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on4, 1, &t3), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t3, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    slow_src = NULL;
    kvf__set_copy_hook(NULL);
    /* slot 7 got block 30 (slot 3 before the onboards), slot 3 ends with
     * the last onboard's data (slot 2 of secondary: block 30) */
    poison_block(&f, 0);
    CHECK_STATUS(run1(f.e, false, KVF_TIER_HOST, 7, 0, 0), KVF_OK);
    if (expect_block(&f, 0, 30, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* A write still pending after thousands of later batches came and went
 * (each named by its id in the hazard entries; the engine's table of
 * batches not done then spans them all): a read queued after it still
 * waits for it and gets its data. */
static uint8_t *gate_dst;
static atomic_bool gate_shut;
static kvf_status gated_copy(const kvf__copy *c)
{
    while (c->dst == gate_dst && atomic_load(&gate_shut))
        usleep(1000);
    return KVF_OK;
}

static int test_long_pending_writer(void)
{
    fixture f;
    if (fx_init(&f, false, 8))
        return 1;
    fill_block(&f, 0, 70);
    fill_block(&f, 4, 71);
    poison_block(&f, 1);
    gate_dst = slot(&f, 0, KVF_LEVEL_SECONDARY, 2);
    atomic_store(&gate_shut, true);
    kvf__set_copy_hook(gated_copy);
    kvf_move off = {0, 2, 0}, on = {2, 1, 0}, cp = {4, 5, 0};
    kvf_ticket t1, t2, t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &off, 1, &t1), KVF_OK);
    for (int i = 0; i < 5000; i++) {
        CHECK_STATUS(kvf_copy(f.e, &cp, 1, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    }
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, &on, 1, &t2), KVF_OK);
    usleep(20 * 1000);
    CHECK_STATUS(kvf_poll(f.e, t2, NULL), KVF_INPROGRESS); /* behind the gated write */
    CHECK(slot(&f, 0, KVF_LEVEL_PRIMARY, 1)[0] == POISON);
    atomic_store(&gate_shut, false);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    kvf__set_copy_hook(NULL);
    if (expect_block(&f, 1, 70, 0) || expect_block(&f, 5, 71, 0))
        return 1;
    fx_done(&f);
    return 0;
}

/* Fire and forget, then kvf_sync_stream(NULL) as the end of a step. */
static int test_sync_without_tickets(void)
{
    fixture f;
    if (fx_init(&f, true, 16))
        return 1;
    for (uint32_t i = 0; i < 16; i++) {
        fill_block(&f, i, 500 + i);
        kvf_move m = {i, i, 0};
        CHECK_STATUS(kvf_offload(f.e, i % 2 ? KVF_TIER_FILE : KVF_TIER_HOST, &m, 1, NULL), KVF_OK);
    }
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
    for (uint32_t i = 0; i < 16; i++) {
        poison_block(&f, i);
        kvf_move m = {i, i, 0};
        CHECK_STATUS(kvf_onboard(f.e, i % 2 ? KVF_TIER_FILE : KVF_TIER_HOST, &m, 1, NULL), KVF_OK);
    }
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
    for (uint32_t i = 0; i < 16; i++)
        if (expect_block(&f, i, 500 + i, 0))
            return 1;
    fx_done(&f);
    return 0;
}

/* ---- bad input on every public function --------------------------------- */

static int test_bad_input(void)
{
    kvf_engine_destroy(NULL);
    CHECK_STATUS(kvf_engine_create(NULL, NULL), KVF_ERR_INVALID);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    kvf_engine *e = (kvf_engine *)0x1;
    cfg.struct_size = 3;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    CHECK(e == (kvf_engine *)0x1); /* outputs are set only on success */
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.fsync = (kvf_fsync)9;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.gds_compat = (kvf_gds_compat)3;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    CHECK(e == (kvf_engine *)0x1);
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.file_dir = "/proc/kvferry-cannot-be-here";
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_IO);
    CHECK(strstr(kvf_last_error(), "/proc/kvferry-cannot-be-here") != NULL);
    cfg = (kvf_engine_config)KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_OK);

    kvf_move m = {0, 0, 0};
    kvf_ticket t = 0;
    /* no pools yet */
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &m, 1, &t), KVF_ERR_STATE);
    kvf_geometry g = G_REF;
    kvf_pool_desc pd = {KVF_MEMORY_HOST, NULL, 0, 4}, sd = {KVF_MEMORY_HOST, NULL, 0, 2};
    CHECK_STATUS(kvf_engine_add_pool(NULL, &g, &pd, &sd, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_add_pool(e, NULL, &pd, &sd, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_add_pool(e, &g, NULL, &sd, NULL), KVF_ERR_INVALID);
    kvf_pool_desc dev = {KVF_MEMORY_DEVICE, NULL, 0, 4};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &dev, &sd, NULL), KVF_ERR_UNSUPPORTED);
    kvf_pool_desc zero = {KVF_MEMORY_HOST, NULL, 0, 0};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &zero, &sd, NULL), KVF_ERR_INVALID);
    kvf_pool_desc narrow = {KVF_MEMORY_HOST, NULL, 100, 4};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &narrow, &sd, NULL), KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "pool 0") != NULL);
    kvf_pool_desc huge = {KVF_MEMORY_HOST, NULL, SIZE_MAX / 2, 4};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &huge, &sd, NULL), KVF_ERR_RANGE);
    kvf_geometry bad = g;
    bad.layers = 0;
    CHECK_STATUS(kvf_engine_add_pool(e, &bad, &pd, &sd, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &pd, &sd, NULL), KVF_OK);
    kvf_geometry other = g;
    other.tokens_per_block = 8;
    CHECK_STATUS(kvf_engine_add_pool(e, &other, &pd, &sd, NULL), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "tokens_per_block") != NULL);
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &pd, NULL, NULL), KVF_OK); /* no secondary */
    CHECK(kvf_engine_pool_count(e) == 2);

    void *p;
    CHECK_STATUS(kvf_engine_slot_ptr(e, 2, KVF_LEVEL_PRIMARY, 0, &p), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 4, &p), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_engine_slot_ptr(e, 1, KVF_LEVEL_SECONDARY, 0, &p), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_slot_ptr(e, 0, (kvf_level)5, 0, &p), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 0, NULL), KVF_ERR_INVALID);

    /* pool 1 has no secondary slots: the host tier is refused, naming it */
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &m, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "pool 1") != NULL);
    /* no file tier configured */
    CHECK_STATUS(kvf_offload(e, KVF_TIER_FILE, &m, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "file tier") != NULL);
    CHECK_STATUS(kvf_offload(e, (kvf_tier)7, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_onboard(e, (kvf_tier)7, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_offload(NULL, KVF_TIER_HOST, &m, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_copy(e, NULL, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_copy(e, &m, 0, &t), KVF_ERR_INVALID);
    kvf_move far = {0, 9, 0};
    CHECK_STATUS(kvf_copy(e, &far, 1, &t), KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "primary slot 9") != NULL);
    kvf_move odd = {0, 1, 3};
    kvf_geometry g4 = G_I4;
    (void)g4;
    CHECK_STATUS(kvf_copy(e, &odd, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    kvf_move dup[2] = {{0, 1, 0}, {2, 1, 0}};
    CHECK_STATUS(kvf_copy(e, dup, 2, &t), KVF_ERR_INVALID);
    /* pools are fixed once a transfer was queued */
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &pd, &sd, NULL), KVF_ERR_STATE);

    CHECK_STATUS(kvf_poll(e, 12345, NULL), KVF_ERR_UNKNOWN_TICKET);
    CHECK_STATUS(kvf_wait(e, 0, NULL), KVF_ERR_UNKNOWN_TICKET);
    CHECK_STATUS(kvf_wait(NULL, 1, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_sync_stream(NULL, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_info_get(NULL), KVF_ERR_INVALID);
    kvf_info info = KVF_INFO_INIT;
    CHECK_STATUS(kvf_info_get(&info), KVF_OK);
    CHECK(kvf_version() != NULL && strncmp(kvf_version(), KVF_VERSION_STRING, 5) == 0);
    CHECK(strcmp(kvf_backend_name(kvf_engine_backend(e)), "host") == 0);
    kvf_engine_destroy(e);

    /* a 4-bit partial copy that cannot be byte-aligned is refused whole */
    fixture f;
    if (fx_init(&f, false, 4))
        return 1;
    kvf_move m3 = {0, 1, 3}; /* 3 tokens x 6 int4 = 9 bytes: fine; G_I4 rows... */
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &m3, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    fx_done(&f);
    kvf_geometry odd4 = {1, 1, 1, 16, 3, KVF_DTYPE_FP4, KVF_ORDER_HEAD_MAJOR};
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_OK);
    kvf_pool_desc p4 = {KVF_MEMORY_HOST, NULL, 0, 2};
    CHECK_STATUS(kvf_engine_add_pool(e, &odd4, &p4, &p4, NULL), KVF_OK);
    kvf_move m5 = {0, 1, 5};
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &m5, 1, &t), KVF_ERR_UNSUPPORTED);
    CHECK(strstr(kvf_last_error(), "move 0: pool 0") != NULL);
    kvf_move m6 = {0, 1, 6};
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, &m6, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);

    /* tiers this engine lacks, and an unknown one: refused, named */
    uint64_t key = 0x42;
    kvf_move to_key = {0, 0x42, 0};
    t = 0;
    CHECK_STATUS(kvf_offload(e, (kvf_tier)7, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "tier 7 unknown") != NULL);
    CHECK_STATUS(kvf_onboard(e, (kvf_tier)-1, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_offload(e, KVF_TIER_REMOTE, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "no remote tier") != NULL);
    CHECK_STATUS(kvf_remote_remove(e, &key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_file_remove(e, &key, 1, &t), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "no file tier") != NULL);
    CHECK_STATUS(kvf_file_remove(e, NULL, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_file_remove(e, &key, 0, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_demote(e, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_promote(NULL, &to_key, 1, &t), KVF_ERR_INVALID);
    CHECK(t == 0); /* no ticket for a refused batch */
    kvf_engine_destroy(e);
    return 0;
}

int main(void)
{
    RUN(test_host_whole);
    RUN(test_host_partial);
    RUN(test_file_whole);
    RUN(test_file_partial);
    RUN(test_partial_of_stored);
    RUN(test_copy_primary);
    RUN(test_demote_promote);
    RUN(test_caller_memory);
    RUN(test_defect1_onboard_after_sync);
    RUN(test_defect4_namespaces_and_restart);
    RUN(test_defect2_6_io_faults);
    RUN(test_failure_propagates);
    RUN(test_failure_then_rewrite);
    RUN(test_failed_file_write_removes);
    RUN(test_onboard_copy_failure);
    RUN(test_defect7_hazards);
    RUN(test_long_pending_writer);
    RUN(test_sync_without_tickets);
    RUN(test_large_batches);
    RUN(test_large_batch_short_reads);
    RUN(test_dependency_done_while_registering);
    RUN(test_batch_shared_by_workers);
    RUN(test_bad_input);
    return TEST_RESULT();
}
