/* SPDX-License-Identifier: Apache-2.0 */
/* The GDS path of the file tier. Everywhere: the compat-mode setting, the
 * choice of path, cuFile missing (the probe says why, an engine asked for
 * GDS takes the POSIX path with one warning). With a GPU: the CRC-32C
 * kernel against the host's, and, where cuFile loads, engines on the GDS
 * path with three pools of different shapes, whole and partial blocks,
 * round trips GDS/GDS, GDS/POSIX and POSIX/GDS across engine restarts,
 * and damaged files failing only their own move with the destination left
 * as it was. Random data, poisoned destinations. Layouts of gds.h are
 * checked against cufile.h where that header is installed. */
#include "testutil.h"

#include "blockfile.h"
#include "checksum.h"
#include "cufile_api.h"
#include "engine.h"
#include "gds.h"

#include <fcntl.h>
#include <stddef.h>
#include <unistd.h>

#ifdef KVF_HAVE_CUDA
#include "testutil_cuda.h"
#ifdef KVF_HAVE_CUFILE_H
#include <stdbool.h>

#include <cufile.h>
#define HAVE_CUFILE_H 1
_Static_assert(sizeof(kvf__cufile_error) == sizeof(CUfileError_t), "CUfileError_t");
_Static_assert(offsetof(kvf__cufile_error, cu_err) == offsetof(CUfileError_t, cu_err), "cu_err");
_Static_assert(sizeof(kvf__cufile_descr) == sizeof(CUfileDescr_t), "CUfileDescr_t");
_Static_assert(offsetof(kvf__cufile_descr, handle) == offsetof(CUfileDescr_t, handle), "handle");
_Static_assert(offsetof(kvf__cufile_descr, fs_ops) == offsetof(CUfileDescr_t, fs_ops), "fs_ops");
_Static_assert(sizeof(kvf__cufile_props) == sizeof(CUfileDrvProps_t), "CUfileDrvProps_t");
_Static_assert(offsetof(kvf__cufile_props, nvfs.dcontrolflags) ==
                   offsetof(CUfileDrvProps_t, nvfs.dcontrolflags),
               "dcontrolflags");
_Static_assert(offsetof(kvf__cufile_props, fflags) == offsetof(CUfileDrvProps_t, fflags), "fflags");
_Static_assert(KVF_CUFILE_HANDLE_TYPE_OPAQUE_FD == CU_FILE_HANDLE_TYPE_OPAQUE_FD, "fd type");
_Static_assert(KVF_CUFILE_ALLOW_COMPAT_MODE_BIT == CU_FILE_ALLOW_COMPAT_MODE, "compat bit");
_Static_assert(KVF_CUFILE_PARAM_ALLOW_COMPAT_MODE == CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE,
               "allow compat parameter");
#endif
#endif

#define POOLS 3
#define SLOTS 16
#define POISON 0xA5

/* stderr into a file, to count warnings */
static int saved_stderr = -1;
static char errlog[600];

static void capture_stderr(const char *dir)
{
    snprintf(errlog, sizeof errlog, "%s/stderr.txt", dir);
    fflush(stderr);
    saved_stderr = dup(2);
    int fd = open(errlog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0 && saved_stderr >= 0);
    dup2(fd, 2);
    close(fd);
}

/* Restores stderr; returns how often `needle` was written meanwhile. */
static int release_stderr(const char *needle)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    FILE *f = fopen(errlog, "r");
    int n = 0;
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        fputs(line, stderr); /* still shown */
        if (strstr(line, needle))
            n++;
    }
    if (f)
        fclose(f);
    return n;
}

static int test_compat_setting(void)
{
    unsetenv("KVF_GDS_COMPAT");
    CHECK_EQ_INT(kvf__gds_compat_of(KVF_GDS_COMPAT_AUTO), KVF_GDS_COMPAT_AUTO);
    setenv("KVF_GDS_COMPAT", "on", 1);
    CHECK_EQ_INT(kvf__gds_compat_of(KVF_GDS_COMPAT_AUTO), KVF_GDS_COMPAT_ON);
    CHECK_EQ_INT(kvf__gds_compat_of(KVF_GDS_COMPAT_OFF), KVF_GDS_COMPAT_OFF); /* config wins */
    setenv("KVF_GDS_COMPAT", "off", 1);
    CHECK_EQ_INT(kvf__gds_compat_of(KVF_GDS_COMPAT_AUTO), KVF_GDS_COMPAT_OFF);
    setenv("KVF_GDS_COMPAT", "sideways", 1);
    CHECK_EQ_INT(kvf__gds_compat_of(KVF_GDS_COMPAT_AUTO), KVF_GDS_COMPAT_AUTO);
    unsetenv("KVF_GDS_COMPAT");
    return 0;
}

static int test_choice(void)
{
    char why[400];
    kvf__gds_probe p2p = {KVF_GDS_STATE_P2P, "p2p"}, compat = {KVF_GDS_STATE_COMPAT, "compat"},
                   refused = {KVF_GDS_STATE_REFUSED, "driver said no"},
                   absent = {KVF_GDS_STATE_ABSENT, "gone"};
    /* forced POSIX stays POSIX */
    CHECK(!kvf__gds_choose(KVF_FILE_IO_POSIX, KVF_GDS_COMPAT_ON, &p2p, why, sizeof why));
    /* P2P: taken by AUTO and GDS whatever the compat setting */
    CHECK(kvf__gds_choose(KVF_FILE_IO_AUTO, KVF_GDS_COMPAT_OFF, &p2p, why, sizeof why));
    CHECK(kvf__gds_choose(KVF_FILE_IO_GDS, KVF_GDS_COMPAT_AUTO, &p2p, why, sizeof why));
    /* compat only: GDS takes it unless compat is off; AUTO only when on */
    CHECK(kvf__gds_choose(KVF_FILE_IO_GDS, KVF_GDS_COMPAT_AUTO, &compat, why, sizeof why));
    CHECK(kvf__gds_choose(KVF_FILE_IO_GDS, KVF_GDS_COMPAT_ON, &compat, why, sizeof why));
    CHECK(!kvf__gds_choose(KVF_FILE_IO_GDS, KVF_GDS_COMPAT_OFF, &compat, why, sizeof why));
    CHECK_STR_HAS(why, "compat mode is off");
    CHECK(!kvf__gds_choose(KVF_FILE_IO_AUTO, KVF_GDS_COMPAT_AUTO, &compat, why, sizeof why));
    CHECK_STR_HAS(why, "no P2P");
    CHECK(kvf__gds_choose(KVF_FILE_IO_AUTO, KVF_GDS_COMPAT_ON, &compat, why, sizeof why));
    /* nothing to use: the probe's reason */
    CHECK(!kvf__gds_choose(KVF_FILE_IO_GDS, KVF_GDS_COMPAT_ON, &refused, why, sizeof why));
    CHECK_STR_HAS(why, "driver said no");
    CHECK(!kvf__gds_choose(KVF_FILE_IO_AUTO, KVF_GDS_COMPAT_ON, &absent, why, sizeof why));
    CHECK_STR_HAS(why, "gone");
    return 0;
}

/* Must run before anything loads the real library (it stays loaded). */
static int test_missing_library(void)
{
    setenv("KVF_CUFILE_LIB", "/nonexistent/libcufile.so.0", 1);
    kvf__gds_probe p;
    CHECK_STATUS(kvf__gds_acquire(KVF_GDS_COMPAT_AUTO, &p), KVF_ERR_UNSUPPORTED);
    CHECK_EQ_INT(p.found, KVF_GDS_STATE_ABSENT);
#ifdef KVF_HAVE_CUDA
    CHECK_STR_HAS(p.detail, "libcufile not loaded");
    CHECK_STR_HAS(p.detail, "/nonexistent/libcufile.so.0");
#else
    CHECK_STR_HAS(p.detail, "built without CUDA");
#endif
    CHECK_STR_HAS(kvf_last_error(), "cufile");
    kvf_info info = KVF_INFO_INIT;
    CHECK_STATUS(kvf_info_get(&info), KVF_OK);
    CHECK_EQ_INT(info.gds_state, 0);
    CHECK(info.gds_detail[0] != '\0');
    return 0;
}

/* file_io GDS where it cannot be had (the host backend here; the CUDA
 * backend with cuFile missing below): the POSIX path, one warning a
 * process, and the blocks still move. */
static int test_fallback_host(void)
{
    char dir[512];
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    capture_stderr(dir);
    for (int round = 0; round < 2; round++) {
        kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
        cfg.backend = KVF_BACKEND_HOST;
        cfg.file.dir = dir;
        cfg.file.io = KVF_FILE_IO_GDS;
        kvf_engine *e = NULL;
        CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_OK);
        CHECK(!kvf__engine_gds(e));
        kvf_geometry g = {2, 2, 2, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, 4};
        CHECK_STATUS(kvf_engine_add_pool(e, &g, &prim, NULL, NULL), KVF_OK);
        void *p0 = NULL, *p1 = NULL;
        REQUIRE(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 0, &p0) == KVF_OK);
        REQUIRE(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 1, &p1) == KVF_OK);
        size_t bb = 0;
        REQUIRE(kvf_geometry_block_bytes(&g, &bb) == KVF_OK);
        test_fill_random(p0, bb, 5 + (uint64_t)round);
        memset(p1, POISON, bb);
        kvf_move m = TO_KEY(0, 77);
        kvf_ticket t;
        CHECK_STATUS(kvf_offload(e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
        m = FROM_KEY(77, 1);
        CHECK_STATUS(kvf_onboard(e, KVF_TIER_DISK, &m, 1, &t), KVF_OK);
        CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
        CHECK_MEM_EQ(p0, p1, bb);
        kvf_engine_destroy(e);
    }
    CHECK_EQ_INT(release_stderr("GPUDirect Storage not used"), 1);
    test_rmtree(dir);
    return 0;
}

#ifdef KVF_HAVE_CUDA

static int test_crc_kernel(void)
{
    if (!test_have_gpu())
        return fprintf(stderr, "no CUDA device\n"), TEST_SKIP;
    enum { SLOT = 9u << 20 };
    kvf__gds_buf *g = NULL;
    CHECK_STATUS(kvf__gds_buf_create(0, SLOT, 2, &g), KVF_OK);
    REQUIRE(g);
    const kvf__image_ops *ops = kvf__gds_image_ops();
    REQUIRE(ops);
    uint8_t *host = malloc(SLOT);
    REQUIRE(host);
    test_fill_random(host, SLOT, 99);
    uint8_t *img = kvf__gds_buf_slot(g, 1);
    CHECK_STATUS(ops->put(g, img, host, SLOT), KVF_OK);
    static const size_t lens[] = {0,
                                  1,
                                  3,
                                  7,
                                  8,
                                  9,
                                  63,
                                  64,
                                  65,
                                  1000,
                                  1023,
                                  1024,
                                  1025,
                                  4095,
                                  4101,
                                  8192,
                                  65537,
                                  1u << 20,
                                  3u << 20 | 17,
                                  (8u << 20) - 1,
                                  9u << 20};
    static const size_t offs[] = {0, 1, 5, 64};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (size_t j = 0; j < sizeof offs / sizeof offs[0]; j++) {
            size_t n = lens[i], off = offs[j];
            if (off + n > SLOT)
                continue;
            uint32_t got = 0xdeadbeef;
            CHECK_STATUS(ops->crc(g, img + off, n, &got), KVF_OK);
            uint32_t want = kvf__crc32c(0, host + off, n);
            if (got != want)
                TEST_FAIL_AT(__FILE__, __LINE__, "crc of %zu bytes at +%zu: 0x%08x, host 0x%08x", n,
                             off, got, want);
        }
    /* get and zero-fill */
    uint8_t back[300];
    CHECK_STATUS(ops->put(g, img + 10, NULL, 100), KVF_OK);
    CHECK_STATUS(ops->get(g, img, back, sizeof back), KVF_OK);
    CHECK_MEM_EQ(back, host, 10);
    for (int i = 10; i < 110; i++)
        CHECK_EQ_INT(back[i], 0);
    CHECK_MEM_EQ(back + 110, host + 110, sizeof back - 110);
    free(host);
    kvf__gds_buf_destroy(g);
    return 0;
}

/* ---- engines on the GDS path ------------------------------------------------ */

static const kvf_geometry GEOM[POOLS] = {
    {2, 2, 4, 32, 64, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
    {2, 2, 2, 32, 64, KVF_DTYPE_INT4, KVF_ORDER_HEAD_MAJOR},
    {1, 1, 8, 32, 128, KVF_DTYPE_BF16, KVF_ORDER_TOKEN_MAJOR},
};

typedef struct fx {
    kvf_engine *e;
    uint8_t *prim[POOLS];
    size_t bytes[POOLS];
} fx;

static int fx_open(fx *f, const char *dir, kvf_file_io io)
{
    memset(f, 0, sizeof *f);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_CUDA;
    cfg.file.dir = dir;
    cfg.file.namespace_ = "gds";
    cfg.file.io = io;
    REQUIRE(kvf_engine_create(&cfg, &f->e) == KVF_OK);
    for (int p = 0; p < POOLS; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_DEVICE, NULL, 0, SLOTS};
        REQUIRE(kvf_engine_add_pool(f->e, &GEOM[p], &prim, NULL, NULL) == KVF_OK);
        void *ptr = NULL;
        REQUIRE(kvf_engine_slot_ptr(f->e, p, KVF_LEVEL_PRIMARY, 0, &ptr) == KVF_OK);
        f->prim[p] = ptr;
        REQUIRE(kvf_geometry_block_bytes(&GEOM[p], &f->bytes[p]) == KVF_OK);
    }
    return 0;
}

/* Slots [0, SLOTS/2) random from `seed`, the rest poisoned; `img` gets the
 * whole primary of every pool as set. */
static void fx_fill(fx *f, uint64_t seed, uint8_t *img[POOLS])
{
    for (int p = 0; p < POOLS; p++) {
        size_t half = SLOTS / 2 * f->bytes[p], all = SLOTS * f->bytes[p];
        test_fill_random(img[p], half, seed + (uint64_t)p);
        memset(img[p] + half, POISON, all - half);
        CUDA_OK(cudaMemcpy(f->prim[p], img[p], all, cudaMemcpyHostToDevice));
    }
}

/* Onboards by kvf_onboard_pools, every pool in order, each waited for
 * (with KVF_DISK_GROUP_BYTES=1: a pool group per pool, read apart). */
static bool g_layerwise;

static int fx_run(fx *f, bool to_file, const kvf_move *m, size_t n, kvf_status *st)
{
    kvf_ticket t;
    static const uint32_t order[POOLS] = {0, 1, 2};
    kvf_status s = to_file       ? kvf_offload(f->e, KVF_TIER_DISK, m, n, &t)
                   : g_layerwise ? kvf_onboard_pools(f->e, KVF_TIER_DISK, order, POOLS, m, n, &t)
                                 : kvf_onboard(f->e, KVF_TIER_DISK, m, n, &t);
    REQUIRE(s == KVF_OK);
    for (int p = 0; !to_file && g_layerwise && p < POOLS; p++)
        CHECK_STATUS(kvf_wait_pool(f->e, t, (uint32_t)p), KVF_OK);
    kvf_wait(f->e, t, st);
    return 0;
}

/* Onboarded slot `dst` holds the first `tokens` tokens of source slot `src`
 * (of the image) and the poison elsewhere; `ok` false: all poison. */
static void check_slot(fx *f, uint8_t *img[POOLS], uint32_t src, uint32_t dst, uint32_t tokens,
                       bool ok)
{
    for (int p = 0; p < POOLS; p++) {
        size_t bb = f->bytes[p];
        uint8_t *got = malloc(bb), *want = malloc(bb);
        REQUIRE(got && want);
        CUDA_OK(cudaMemcpy(got, f->prim[p] + dst * bb, bb, cudaMemcpyDeviceToHost));
        memset(want, POISON, bb);
        if (ok) {
            kvf_region r;
            REQUIRE(kvf_geometry_region(&GEOM[p], tokens ? tokens : GEOM[p].tokens_per_block, &r) ==
                    KVF_OK);
            for (size_t row = 0; row < r.rows; row++)
                memcpy(want + row * r.pitch, img[p] + src * bb + row * r.pitch, r.row_bytes);
        }
        size_t d = test_mem_diff(got, want, bb);
        if (d != (size_t)-1)
            TEST_FAIL_AT(__FILE__, __LINE__,
                         "pool %d slot %u (from %u, %u tokens): byte %zu differs", p, dst, src,
                         tokens, d);
        free(got);
        free(want);
    }
}

/* Writes blocks 0..7 (even: whole, odd: 8 tokens) with `wio`, reads them
 * back in a new engine with `rio` into slots 8..15. */
static int round_trip(const char *dir, kvf_file_io wio, kvf_file_io rio, uint64_t seed)
{
    uint8_t *img[POOLS];
    fx f;
    if (fx_open(&f, dir, wio))
        return 1;
    for (int p = 0; p < POOLS; p++)
        REQUIRE((img[p] = malloc(SLOTS * f.bytes[p])) != NULL);
    fx_fill(&f, seed, img);
    kvf_move m[SLOTS / 2];
    kvf_status st[SLOTS / 2];
    for (uint32_t i = 0; i < SLOTS / 2; i++)
        m[i] = test_move(KVF_TIER_DISK, true, i, 5000 + seed * 100 + i, i % 2 ? 8 : 0);
    fx_run(&f, true, m, SLOTS / 2, st);
    for (int i = 0; i < SLOTS / 2; i++)
        CHECK_STATUS(st[i], KVF_OK);
    kvf_engine_destroy(f.e);

    if (fx_open(&f, dir, rio)) /* a restart: a new engine on the same directory */
        return 1;
    for (int p = 0; p < POOLS; p++) {
        uint8_t *poison = malloc(SLOTS * f.bytes[p]);
        memset(poison, POISON, SLOTS * f.bytes[p]);
        CUDA_OK(cudaMemcpy(f.prim[p], poison, SLOTS * f.bytes[p], cudaMemcpyHostToDevice));
        free(poison);
    }
    for (uint32_t i = 0; i < SLOTS / 2; i++)
        m[i] = test_move(KVF_TIER_DISK, false, 5000 + seed * 100 + i, SLOTS / 2 + i, i % 2 ? 8 : 0);
    fx_run(&f, false, m, SLOTS / 2, st);
    for (uint32_t i = 0; i < SLOTS / 2; i++) {
        CHECK_STATUS(st[i], KVF_OK);
        check_slot(&f, img, i, SLOTS / 2 + i, i % 2 ? 8 : 0, true);
    }
    kvf_engine_destroy(f.e);
    for (int p = 0; p < POOLS; p++)
        free(img[p]);
    return 0;
}

static bool engine_takes_gds(const char *dir)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_CUDA;
    cfg.file.dir = dir;
    cfg.file.io = KVF_FILE_IO_GDS;
    kvf_engine *e = NULL;
    kvf_status st = kvf_engine_create(&cfg, &e);
    bool gds = st == KVF_OK && kvf__engine_gds(e);
    kvf_engine_destroy(e);
    return gds;
}

static int test_gds_engine(void)
{
    if (!test_have_gpu())
        return fprintf(stderr, "no CUDA device\n"), TEST_SKIP;
    char dir[512];
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    kvf__gds_probe p;
    if (kvf__gds_acquire(KVF_GDS_COMPAT_AUTO, &p) != KVF_OK) {
        test_rmtree(dir);
        return fprintf(stderr, "cuFile not usable: %s\n", p.detail), TEST_SKIP;
    }
    printf("cufile: %s\n", p.detail);
    /* compat AUTO takes cuFile only where it takes the directory's files
     * (a virtio disk in a VM it refuses: every block would go through host
     * memory twice); compat ON takes it anyway, so that the device path is
     * tested on any machine with cuFile */
    bool taken = engine_takes_gds(dir);
    char root[700], why[300];
    snprintf(root, sizeof root, "%s/default", dir);
    bool usable = kvf__gds_dir_usable(root, why, sizeof why);
    kvf__gds_release();
    printf("cufile on %s: %s\n", root, usable ? "files registered" : why);
    CHECK(taken == usable);
    setenv("KVF_GDS_COMPAT", "on", 1);
    CHECK(engine_takes_gds(dir));

    CHECK(round_trip(dir, KVF_FILE_IO_GDS, KVF_FILE_IO_GDS, 1) == 0);
    CHECK(round_trip(dir, KVF_FILE_IO_GDS, KVF_FILE_IO_POSIX, 2) == 0);
    CHECK(round_trip(dir, KVF_FILE_IO_POSIX, KVF_FILE_IO_GDS, 3) == 0);
    /* layer-wise from disk, a pool group per pool: each group read apart
     * into device staging (GDS) or host staging (POSIX), checked and
     * scattered into device slots, byte-exact */
    setenv("KVF_DISK_GROUP_BYTES", "1", 1);
    g_layerwise = true;
    CHECK(round_trip(dir, KVF_FILE_IO_GDS, KVF_FILE_IO_GDS, 4) == 0);
    CHECK(round_trip(dir, KVF_FILE_IO_GDS, KVF_FILE_IO_POSIX, 5) == 0);
    g_layerwise = false;
    unsetenv("KVF_DISK_GROUP_BYTES");

    /* damage: key 5101 a byte flipped in its payload, 5103 cut short, 5105
     * never stored; the others read back */
    char path[700];
    snprintf(path, sizeof path, "%s/gds/0000000000000000%016llx.kvf", dir, 5101ull);
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t b;
    REQUIRE(pread(fd, &b, 1, 64 + 100) == 1);
    b ^= 0x10;
    REQUIRE(pwrite(fd, &b, 1, 64 + 100) == 1);
    close(fd);
    snprintf(path, sizeof path, "%s/gds/0000000000000000%016llx.kvf", dir, 5103ull);
    REQUIRE(truncate(path, 4096) == 0);
    snprintf(path, sizeof path, "%s/gds/0000000000000000%016llx.kvf", dir, 5105ull);
    REQUIRE(unlink(path) == 0);

    fx f;
    uint8_t *img[POOLS];
    if (fx_open(&f, dir, KVF_FILE_IO_GDS))
        return 1;
    for (int q = 0; q < POOLS; q++)
        REQUIRE((img[q] = malloc(SLOTS * f.bytes[q])) != NULL);
    fx_fill(&f, 1, img); /* the data key 51xx was written from */
    for (int q = 0; q < POOLS; q++) {
        size_t half = SLOTS / 2 * f.bytes[q];
        memset(img[q] + half, POISON, half);
        CUDA_OK(cudaMemcpy(f.prim[q] + half, img[q] + half, half, cudaMemcpyHostToDevice));
    }
    kvf_move m[SLOTS / 2];
    kvf_status st[SLOTS / 2];
    for (uint32_t i = 0; i < SLOTS / 2; i++)
        m[i] = test_move(KVF_TIER_DISK, false, 5100 + i, SLOTS / 2 + i, i % 2 ? 8 : 0);
    fx_run(&f, false, m, SLOTS / 2, st);
    for (uint32_t i = 0; i < SLOTS / 2; i++) {
        kvf_status want = i == 1 || i == 3 ? KVF_ERR_CORRUPT : i == 5 ? KVF_ERR_NOT_FOUND : KVF_OK;
        CHECK_STATUS(st[i], want);
        check_slot(&f, img, i, SLOTS / 2 + i, i % 2 ? 8 : 0, want == KVF_OK);
    }
    kvf_engine_destroy(f.e);
    for (int q = 0; q < POOLS; q++)
        free(img[q]);
    unsetenv("KVF_GDS_COMPAT");
    test_rmtree(dir);
    return 0;
}

/* The CUDA backend with cuFile missing: POSIX path, blocks still move. */
static int test_fallback_cuda(void)
{
    if (!test_have_gpu())
        return fprintf(stderr, "no CUDA device\n"), TEST_SKIP;
    char dir[512];
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    CHECK(!engine_takes_gds(dir)); /* KVF_CUFILE_LIB still points nowhere */
    CHECK(round_trip(dir, KVF_FILE_IO_GDS, KVF_FILE_IO_GDS, 4) == 0);
    test_rmtree(dir);
    return 0;
}
#endif

int main(void)
{
#ifdef HAVE_CUFILE_H
    printf("gds.h checked against cufile.h\n");
#else
    printf("no cufile.h here: gds.h not checked against it\n");
#endif
    RUN(test_compat_setting);
    RUN(test_choice);
    RUN(test_missing_library);
    RUN(test_fallback_host);
#ifdef KVF_HAVE_CUDA
    RUN(test_fallback_cuda);
    unsetenv("KVF_CUFILE_LIB");
    RUN(test_crc_kernel);
    RUN(test_gds_engine);
#endif
    return TEST_RESULT();
}
