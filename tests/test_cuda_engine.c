/* SPDX-License-Identifier: Apache-2.0 */
/* The public API on the CUDA backend: device primary pools (allocated by
 * kvferry and the caller's own cudaMalloc'd memory), pinned secondary pools
 * (kvferry's and caller malloc'd memory that kvferry pins), offload and
 * onboard of scattered whole and partial blocks (fp16, int4, bf16), kvf_copy
 * on the device, the file tier staged through pinned buffers, hazards
 * between batches queued back to back, kvf_sync_stream ordering work on
 * a caller's stream, and kvf_offload_after ordering an offload after it. Every check compares all
 * bytes of every pool with a host model that applies the moves in submission order. Exits 77
 * without a GPU. */
#include "testutil_cuda.h"

#include <cuda_runtime.h>

#define POOLS 3
#define SLOTS 128
#define POISON 0xA5

typedef enum op { OP_OFFLOAD, OP_ONBOARD, OP_COPY, OP_OFFLOAD_FILE, OP_ONBOARD_FILE } op;

typedef struct fixture {
    kvf_engine *e;
    kvf_geometry g[POOLS];
    size_t bytes[POOLS];
    uint8_t *prim[POOLS], *sec[POOLS];                /* device, pinned host */
    uint8_t *pimg[POOLS], *simg[POOLS], *fimg[POOLS]; /* the model */
    void *caller_dev, *caller_host;
    char dir[512];
} fixture;

/* fp16 head-major (TensorRT-LLM's layout), int4, bf16 token-major */
static const kvf_geometry G_FP16 = {2, 2, 4, 32, 64, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
static const kvf_geometry G_INT4 = {2, 2, 2, 32, 64, KVF_DTYPE_INT4, KVF_ORDER_HEAD_MAJOR};
static const kvf_geometry G_BF16 = {1, 1, 8, 32, 128, KVF_DTYPE_BF16, KVF_ORDER_TOKEN_MAJOR};

static uint64_t seed_counter = 11;

static void upload_primary(fixture *f)
{
    for (int p = 0; p < POOLS; p++)
        CUDA_OK(cudaMemcpy(f->prim[p], f->pimg[p], SLOTS * f->bytes[p], cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
}

static int fx_open(fixture *f, kvf_cuda_copy mode, bool files)
{
    memset(f, 0, sizeof *f);
    f->g[0] = G_FP16;
    f->g[1] = G_INT4;
    f->g[2] = G_BF16;
    if (files)
        REQUIRE(test_tmpdir(f->dir, sizeof f->dir) == 0);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_CUDA;
    cfg.cuda.copy = mode;
    cfg.file.dir = files ? f->dir : NULL;
    cfg.file.namespace_ = "cuda-test";
    kvf_status st = kvf_engine_create(&cfg, &f->e);
    if (st == KVF_ERR_NO_DEVICE) {
        if (files)
            test_rmtree(f->dir);
        TEST_SKIP_ALL("no CUDA device: %s", kvf_last_error());
    }
    REQUIRE(st == KVF_OK);
    CHECK(kvf_engine_backend(f->e) == KVF_BACKEND_CUDA);
    CHECK(kvf_engine_layerwise_tiers(f->e) ==
          (1u << KVF_TIER_HOST | 1u << KVF_TIER_GPU | 1u << KVF_TIER_DISK));
    for (int p = 0; p < POOLS; p++)
        REQUIRE(kvf_geometry_block_bytes(&f->g[p], &f->bytes[p]) == KVF_OK);

    /* pools 0 and 1: kvferry's memory; pool 2: the caller's cudaMalloc'd
     * device memory and malloc'd host memory that kvferry pins */
    CUDA_OK(cudaMalloc(&f->caller_dev, SLOTS * f->bytes[2]));
    f->caller_host = aligned_alloc(4096, SLOTS * f->bytes[2]);
    REQUIRE(f->caller_host);
    for (int p = 0; p < POOLS; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_DEVICE, p == 2 ? f->caller_dev : NULL, 0, SLOTS};
        kvf_pool_desc sec = {KVF_MEMORY_HOST_PINNED, p == 2 ? f->caller_host : NULL, 0, SLOTS};
        uint32_t idx = 99;
        CHECK_STATUS(kvf_engine_add_pool(f->e, &f->g[p], &prim, &sec, &idx), KVF_OK);
        CHECK_EQ_INT(idx, p);
        void *ptr = NULL;
        REQUIRE(kvf_engine_slot_ptr(f->e, p, KVF_LEVEL_PRIMARY, 0, &ptr) == KVF_OK);
        f->prim[p] = ptr;
        REQUIRE(kvf_engine_slot_ptr(f->e, p, KVF_LEVEL_SECONDARY, 0, &ptr) == KVF_OK);
        f->sec[p] = ptr;
        size_t n = SLOTS * f->bytes[p];
        f->pimg[p] = malloc(n);
        f->simg[p] = malloc(n);
        f->fimg[p] = malloc(n);
        REQUIRE(f->pimg[p] && f->simg[p] && f->fimg[p]);
        test_fill_random(f->pimg[p], n, seed_counter++);
        memset(f->simg[p], POISON, n);
        memset(f->sec[p], POISON, n);
        memset(f->fimg[p], POISON, n);
    }
    CHECK(f->prim[2] == f->caller_dev);
    CHECK(f->sec[2] == f->caller_host);
    upload_primary(f);
    return 0;
}

static void fx_close(fixture *f)
{
    kvf_engine_destroy(f->e);
    CUDA_OK(cudaFree(f->caller_dev));
    free(f->caller_host);
    for (int p = 0; p < POOLS; p++) {
        free(f->pimg[p]);
        free(f->simg[p]);
        free(f->fimg[p]);
    }
    if (f->dir[0])
        test_rmtree(f->dir);
}

/* Applies one move to the model. File keys are 1000 + an index. */
static void model(fixture *f, op o, const kvf_move *m)
{
    for (int p = 0; p < POOLS; p++) {
        kvf_region r;
        REQUIRE(kvf_geometry_region(&f->g[p], m->tokens, &r) == KVF_OK);
        const uint8_t *src = o == OP_ONBOARD        ? f->simg[p]
                             : o == OP_ONBOARD_FILE ? f->fimg[p]
                                                    : f->pimg[p];
        uint8_t *dst = o == OP_OFFLOAD        ? f->simg[p]
                       : o == OP_OFFLOAD_FILE ? f->fimg[p]
                                              : f->pimg[p];
        uint64_t s = o == OP_ONBOARD_FILE ? m->src - 1000 : m->src;
        uint64_t d = o == OP_OFFLOAD_FILE ? m->dst - 1000 : m->dst;
        for (size_t row = 0; row < r.rows; row++)
            memmove(dst + d * f->bytes[p] + row * r.pitch, src + s * f->bytes[p] + row * r.pitch,
                    r.row_bytes);
    }
}

static kvf_status submit(fixture *f, op o, const kvf_move *m, size_t n, kvf_ticket *t)
{
    for (size_t i = 0; i < n; i++)
        model(f, o, &m[i]);
    if (o == OP_OFFLOAD_FILE || o == OP_ONBOARD_FILE) {
        /* the model numbers file keys; the engine takes them as keys */
        kvf_move *k = malloc(n * sizeof *k);
        REQUIRE(k);
        for (size_t i = 0; i < n; i++)
            k[i] = test_move(KVF_TIER_DISK, o == OP_OFFLOAD_FILE, m[i].src, m[i].dst, m[i].tokens);
        kvf_status st = o == OP_OFFLOAD_FILE ? kvf_offload(f->e, KVF_TIER_DISK, k, n, t)
                                             : kvf_onboard(f->e, KVF_TIER_DISK, k, n, t);
        free(k);
        return st;
    }
    switch (o) {
    case OP_OFFLOAD:
        return kvf_offload(f->e, KVF_TIER_HOST, m, n, t);
    case OP_ONBOARD:
        return kvf_onboard(f->e, KVF_TIER_HOST, m, n, t);
    case OP_COPY:
        return kvf_copy(f->e, m, n, t);
    case OP_OFFLOAD_FILE:
        return kvf_offload(f->e, KVF_TIER_DISK, m, n, t);
    case OP_ONBOARD_FILE:
        return kvf_onboard(f->e, KVF_TIER_DISK, m, n, t);
    }
    return KVF_ERR_INVALID;
}

static void run_wait(fixture *f, op o, const kvf_move *m, size_t n)
{
    kvf_ticket t = {0};
    CHECK_STATUS(submit(f, o, m, n, &t), KVF_OK);
    kvf_status *per = malloc(n * sizeof *per);
    CHECK_STATUS(kvf_wait(f->e, t, per), KVF_OK);
    for (size_t i = 0; i < n; i++)
        if (per[i] != KVF_OK) {
            TEST_FAIL_AT(__FILE__, __LINE__, "move %zu: %s", i, kvf_status_str(per[i]));
            break;
        }
    free(per);
}

/* Every byte of every pool, primary and secondary, against the model. */
static int check_all(fixture *f, const char *what)
{
    int rc = 0;
    for (int p = 0; p < POOLS; p++) {
        size_t n = SLOTS * f->bytes[p];
        uint8_t *got = malloc(n);
        CUDA_OK(cudaMemcpy(got, f->prim[p], n, cudaMemcpyDeviceToHost));
        size_t off = test_mem_diff(got, f->pimg[p], n);
        if (off != (size_t)-1) {
            TEST_FAIL_AT(__FILE__, __LINE__,
                         "%s: pool %d primary slot %zu byte %zu: 0x%02x, want 0x%02x", what, p,
                         off / f->bytes[p], off % f->bytes[p], got[off], f->pimg[p][off]);
            rc = 1;
        }
        off = test_mem_diff(f->sec[p], f->simg[p], n);
        if (off != (size_t)-1) {
            TEST_FAIL_AT(__FILE__, __LINE__,
                         "%s: pool %d secondary slot %zu byte %zu: 0x%02x, want 0x%02x", what, p,
                         off / f->bytes[p], off % f->bytes[p], f->sec[p][off], f->simg[p][off]);
            rc = 1;
        }
        free(got);
    }
    return rc;
}

static const uint32_t TOKENS[] = {0, 8, 1, 31, 32, 16, 0, 5};

/* n moves from shuffled slots of [s0, s0 + n) to shuffled slots of
 * [d0, d0 + n), whole and partial; file keys where `to_file`. */
static void moves_make(kvf_move *m, size_t n, uint32_t s0, uint32_t d0, uint64_t seed)
{
    uint32_t ps[SLOTS], pd[SLOTS];
    for (uint32_t i = 0; i < n; i++)
        ps[i] = pd[i] = i;
    test_shuffle_u32(ps, n, seed);
    test_shuffle_u32(pd, n, seed + 1);
    for (size_t i = 0; i < n; i++)
        m[i] = (kvf_move){s0 + ps[i], d0 + pd[i], TOKENS[(i + seed) % 8]};
}

static int round_trip(kvf_cuda_copy mode)
{
    fixture f;
    fx_open(&f, mode, false);
    kvf_move m[SLOTS];
    /* offload 64 scattered blocks, whole and partial */
    moves_make(m, 64, 0, 0, seed_counter++);
    run_wait(&f, OP_OFFLOAD, m, 64);
    check_all(&f, "offload");
    /* onboard them into other primary slots, poisoned first */
    for (int p = 0; p < POOLS; p++)
        memset(f.pimg[p] + 64 * f.bytes[p], POISON, 64 * f.bytes[p]);
    upload_primary(&f);
    kvf_move back[64];
    for (size_t i = 0; i < 64; i++)
        back[i] = (kvf_move){m[i].dst, 64 + (m[i].src * 37) % 64, m[i].tokens};
    run_wait(&f, OP_ONBOARD, back, 64);
    check_all(&f, "onboard");
    /* fewer tokens than stored: fine */
    for (size_t i = 0; i < 64; i++)
        back[i].tokens = back[i].tokens == 0 ? 17 : back[i].tokens > 1 ? back[i].tokens - 1 : 1;
    run_wait(&f, OP_ONBOARD, back, 64);
    check_all(&f, "onboard fewer tokens");
    /* device->device, partial and whole */
    kvf_move cp[32];
    for (size_t i = 0; i < 32; i++)
        cp[i] = (kvf_move){(uint32_t)(i * 3) % 64, 64 + (uint32_t)i * 2, TOKENS[i % 8]};
    run_wait(&f, OP_COPY, cp, 32);
    check_all(&f, "kvf_copy");
    fx_close(&f);
    return 0;
}

static int test_round_trip_auto(void)
{
    return round_trip(KVF_CUDA_COPY_AUTO);
}

static int test_round_trip_kernel(void)
{
    return round_trip(KVF_CUDA_COPY_KERNEL);
}

static int test_round_trip_dma(void)
{
    return round_trip(KVF_CUDA_COPY_DMA);
}

static int test_file_tier(void)
{
    fixture f;
    fx_open(&f, KVF_CUDA_COPY_AUTO, true);
    kvf_move m[32];
    moves_make(m, 32, 0, 0, seed_counter++);
    for (size_t i = 0; i < 32; i++)
        m[i].dst += 1000;
    run_wait(&f, OP_OFFLOAD_FILE, m, 32);
    for (int p = 0; p < POOLS; p++)
        memset(f.pimg[p] + 64 * f.bytes[p], POISON, 64 * f.bytes[p]);
    upload_primary(&f);
    kvf_move back[32];
    for (size_t i = 0; i < 32; i++)
        back[i] = (kvf_move){m[i].dst, 64 + (uint32_t)i * 2, m[i].tokens};
    run_wait(&f, OP_ONBOARD_FILE, back, 32);
    check_all(&f, "file round trip");
    /* more tokens than stored: refused per move, nothing written */
    kvf_move bad = test_move(KVF_TIER_DISK, false, 0, 127, 0);
    for (size_t i = 0; i < 32; i++)
        if (m[i].tokens != 0 && m[i].tokens != 32) {
            bad = test_move(KVF_TIER_DISK, false, m[i].dst, 127, 0);
            break;
        }
    kvf_ticket t = {0};
    kvf_status per = KVF_OK;
    kvf_status st = kvf_onboard(f.e, KVF_TIER_DISK, &bad, 1, &t);
    if (st == KVF_OK)
        CHECK_STATUS(kvf_wait(f.e, t, &per), KVF_ERR_RANGE);
    else
        CHECK_STATUS(st, KVF_ERR_RANGE);
    check_all(&f, "file refused onboard");
    fx_close(&f);
    return 0;
}

/* Offload into secondary slots, then at once onboard from the same slots,
 * round after round with nothing waited for: each onboard must read what
 * the offload before it wrote (read after write) and each offload must wait
 * until the onboard before it has read the slot (write after read). */
static int hazards(kvf_cuda_copy mode)
{
    fixture f;
    fx_open(&f, mode, false);
    enum { ROUNDS = 60, N = 48 };
    kvf_ticket *tickets = calloc(2 * ROUNDS, sizeof *tickets);
    kvf_move m[N], back[N];
    for (int r = 0; r < ROUNDS; r++) {
        /* sources rotate through slots 0..63, destinations 64..127 */
        moves_make(m, N, (uint32_t)(r * 5) % 16, (uint32_t)(r * 3) % 16, (uint64_t)r * 7 + 1);
        for (int i = 0; i < N; i++)
            back[i] = (kvf_move){m[i].dst, 64 + (m[i].dst + (uint32_t)r * 11) % 64,
                                 m[i].tokens ? m[i].tokens : TOKENS[(i + r) % 8]};
        CHECK_STATUS(submit(&f, OP_OFFLOAD, m, N, &tickets[2 * r]), KVF_OK);
        CHECK_STATUS(submit(&f, OP_ONBOARD, back, N, &tickets[2 * r + 1]), KVF_OK);
    }
    for (int i = 0; i < 2 * ROUNDS; i++)
        CHECK_STATUS(kvf_wait(f.e, tickets[i], NULL), KVF_OK);
    check_all(&f, "offload/onboard rounds");

    /* an onboard reading slots that an offload queued right after it
     * overwrites: the onboard gets the old bytes */
    moves_make(m, N, 0, 0, 99);
    for (int i = 0; i < N; i++)
        m[i].tokens = 0;
    run_wait(&f, OP_OFFLOAD, m, N);
    for (int i = 0; i < N; i++) {
        back[i] = (kvf_move){m[i].dst, 64 + (uint32_t)i, 0};
        m[i].src = (m[i].src + 17) % 64;
    }
    kvf_ticket t1 = {0}, t2 = {0};
    CHECK_STATUS(submit(&f, OP_ONBOARD, back, N, &t1), KVF_OK);
    CHECK_STATUS(submit(&f, OP_OFFLOAD, m, N, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
    check_all(&f, "onboard then overwrite");
    free(tickets);
    fx_close(&f);
    return 0;
}

static int test_hazards_kernel(void)
{
    return hazards(KVF_CUDA_COPY_KERNEL);
}

static int test_hazards_dma(void)
{
    return hazards(KVF_CUDA_COPY_DMA);
}

/* kvf_sync_stream: copies queued on the caller's stream afterwards read
 * the onboarded slots as the onboard left them. */
static int test_sync_stream(void)
{
    fixture f;
    fx_open(&f, KVF_CUDA_COPY_AUTO, false);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t n0 = SLOTS * f.bytes[0];
    uint8_t *scratch = NULL, *out = NULL;
    CUDA_OK(cudaMalloc((void **)&scratch, n0));
    CUDA_OK(cudaMallocHost((void **)&out, n0));
    kvf_move m[64], back[64];
    for (int round = 0; round < 10; round++) {
        moves_make(m, 64, 0, 0, seed_counter++);
        for (int i = 0; i < 64; i++)
            back[i] = (kvf_move){m[i].dst, 64 + (uint32_t)(i * 7 + round) % 64, m[i].tokens};
        kvf_ticket t1 = {0}, t2 = {0};
        CHECK_STATUS(submit(&f, OP_OFFLOAD, m, 64, &t1), KVF_OK);
        CHECK_STATUS(submit(&f, OP_ONBOARD, back, 64, &t2), KVF_OK);
        CHECK_STATUS(kvf_sync_stream(f.e, (void *)s), KVF_OK);
        /* device->device on the stream, then to the host */
        CUDA_OK(cudaMemcpyAsync(scratch, f.prim[0], n0, cudaMemcpyDeviceToDevice, s));
        CUDA_OK(cudaMemcpyAsync(out, scratch, n0, cudaMemcpyDeviceToHost, s));
        CUDA_OK(cudaStreamSynchronize(s));
        CHECK_MEM_EQ(out, f.pimg[0], n0);
        CHECK_STATUS(kvf_wait(f.e, t1, NULL), KVF_OK);
        CHECK_STATUS(kvf_wait(f.e, t2, NULL), KVF_OK);
    }
    check_all(&f, "sync_stream rounds");
    /* NULL stream: blocks until done */
    moves_make(m, 64, 64, 0, seed_counter++);
    CHECK_STATUS(submit(&f, OP_OFFLOAD, m, 64, NULL), KVF_OK);
    CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
    check_all(&f, "sync_stream NULL");
    CUDA_OK(cudaFree(scratch));
    CUDA_OK(cudaFreeHost(out));
    CUDA_OK(cudaStreamDestroy(s));
    fx_close(&f);
    return 0;
}

/* kvf_offload_after: the caller's stream waits at a gate, then a kernel on
 * it spins ~5 ms and writes a new random pattern over every primary slot;
 * the offload queued right after it (no sync) must read the late pattern,
 * byte for byte, in every block, and must not have waited for the stream,
 * which is still at its gate when the call returns, however long the call
 * took (in the first round the host sleeps 20 ms more, longer than the
 * kernel spins, as a host slowed by parallel tests would). To the DISK tier
 * the blocks come back through an onboard into other slots. */
static int offload_after_case(bool files)
{
    fixture f;
    fx_open(&f, KVF_CUDA_COPY_AUTO, files);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint8_t *late_dev[POOLS];
    for (int p = 0; p < POOLS; p++)
        CUDA_OK(cudaMalloc((void **)&late_dev[p], SLOTS * f.bytes[p]));
    kvf_move m[64], back[64];
    kvf_status per[64];
    for (uint32_t round = 0; round < 6; round++) {
        for (int p = 0; p < POOLS; p++) {
            test_fill_random(f.pimg[p], SLOTS * f.bytes[p], seed_counter++);
            CUDA_OK(cudaMemcpy(late_dev[p], f.pimg[p], SLOTS * f.bytes[p], cudaMemcpyHostToDevice));
        }
        CUDA_OK(cudaDeviceSynchronize());
        /* the gate, then the first kernel spins; the others follow it */
        test_gate gate;
        CUDA_OK(test_gate_hold(&gate, s));
        for (int p = 0; p < POOLS; p++)
            CUDA_OK(
                test_late_copy(f.prim[p], late_dev[p], SLOTS * f.bytes[p], p == 0 ? 5.0 : 0.0, s));
        double t_late = test_gate_held_s(&gate);
        uint32_t s0 = (round % 2) * 64;
        moves_make(m, 64, s0, 0, seed_counter++);
        op o = files ? OP_OFFLOAD_FILE : OP_OFFLOAD;
        for (int i = 0; i < 64; i++) {
            if (files)
                m[i].dst += 1000;
            model(&f, o, &m[i]);
        }
        kvf_ticket t = {0};
        kvf_tier to = files ? KVF_TIER_DISK : KVF_TIER_HOST;
        kvf_move k[64];
        for (int i = 0; i < 64; i++)
            k[i] = test_move(to, true, m[i].src, m[i].dst, m[i].tokens);
        CHECK_STATUS(kvf_offload_after(f.e, (void *)s, to, k, 64, &t), KVF_OK);
        double t_call = test_gate_held_s(&gate);
        if (round == 0)
            usleep(20000);
        /* the call did not wait for the stream: still at its gate */
        CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
        if (!test_gate_open(&gate))
            TEST_FAIL_AT(__FILE__, __LINE__,
                         "round %u: the gate timed out (%d s) before it was opened: the late "
                         "writes were queued %.3f s after it was held, kvf_offload_after "
                         "returned at %.3f s",
                         round, TEST_GATE_TIMEOUT_S, t_late, t_call);
        CHECK_STATUS(kvf_wait(f.e, t, per), KVF_OK);
        for (int i = 0; i < 64; i++)
            CHECK_STATUS(per[i], KVF_OK);
        if (files) {
            /* into the other half of the primary slots, which the kernel
             * wrote too (the model has its late pattern there) */
            for (int i = 0; i < 64; i++)
                back[i] =
                    (kvf_move){m[i].dst, 64 - s0 + (uint32_t)(i * 5 + round) % 64, m[i].tokens};
            run_wait(&f, OP_ONBOARD_FILE, back, 64);
        }
        CUDA_OK(cudaStreamSynchronize(s));
        test_gate_fini(&gate);
        check_all(&f, files ? "offload_after to disk" : "offload_after to host");
    }
    /* a NULL stream: as kvf_offload */
    moves_make(m, 64, 0, 64, seed_counter++);
    for (int i = 0; i < 64; i++)
        model(&f, OP_OFFLOAD, &m[i]);
    kvf_ticket t = {0};
    CHECK_STATUS(kvf_offload_after(f.e, NULL, KVF_TIER_HOST, m, 64, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    check_all(&f, "offload_after NULL stream");
    for (int p = 0; p < POOLS; p++)
        CUDA_OK(cudaFree(late_dev[p]));
    CUDA_OK(cudaStreamDestroy(s));
    fx_close(&f);
    return 0;
}

static int test_offload_after_host(void)
{
    return offload_after_case(false);
}

static int test_offload_after_disk(void)
{
    return offload_after_case(true);
}

/* Pools the CUDA backend refuses. */
static int test_bad_pools(void)
{
    fixture f;
    fx_open(&f, KVF_CUDA_COPY_AUTO, false);
    kvf_engine *e = NULL;
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_CUDA;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    uint8_t *host = malloc(16 * f.bytes[0]);
    kvf_pool_desc prim = {KVF_MEMORY_DEVICE, host, 0, 16};
    kvf_pool_desc sec = {KVF_MEMORY_HOST_PINNED, NULL, 0, 16};
    /* host memory claimed to be device memory */
    CHECK_STATUS(kvf_engine_add_pool(e, &G_FP16, &prim, &sec, NULL), KVF_ERR_INVALID);
    kvf_engine_destroy(e);
    free(host);
    fx_close(&f);
    return 0;
}

/* Large batches through the engine, where the CUDA
 * backend stages them (its secondary slots are kvferry's pinned memory and
 * each part of a batch is a dense run of them): 20000 scattered 4 KiB
 * blocks offloaded, then at once onboarded into other, poisoned primary
 * slots that the offload is still reading (read after write on the
 * secondary slots, write after read on the primary ones); byte for byte.
 * Again with 512 KiB blocks (one part, staged in two chunks). */
static int staged_case(size_t head, uint32_t n)
{
    kvf_geometry g = {1, 2, 1, 32, (uint32_t)head, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
    size_t bytes;
    REQUIRE(kvf_geometry_block_bytes(&g, &bytes) == KVF_OK);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_CUDA;
    kvf_engine *e;
    kvf_status st = kvf_engine_create(&cfg, &e);
    if (st == KVF_ERR_NO_DEVICE)
        TEST_SKIP_ALL("no CUDA device: %s", kvf_last_error());
    REQUIRE(st == KVF_OK);
    kvf_pool_desc prim = {KVF_MEMORY_DEVICE, NULL, 0, n};
    kvf_pool_desc sec = {KVF_MEMORY_HOST_PINNED, NULL, 0, n};
    CHECK_STATUS(kvf_engine_add_pool(e, &g, &prim, &sec, NULL), KVF_OK);
    uint8_t *dp, *hp;
    REQUIRE(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 0, (void **)&dp) == KVF_OK);
    REQUIRE(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_SECONDARY, 0, (void **)&hp) == KVF_OK);
    size_t total = bytes * n;
    uint8_t *orig = malloc(total), *got = malloc(total);
    uint32_t *ps = malloc(n * sizeof *ps), *pq = malloc(n * sizeof *pq);
    kvf_move *off = malloc(n * sizeof *off), *on = malloc(n * sizeof *on);
    REQUIRE(orig && got && ps && pq && off && on);
    test_fill_random(orig, total, seed_counter++);
    CUDA_OK(cudaMemcpy(dp, orig, total, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
    memset(hp, POISON, total);
    for (uint32_t i = 0; i < n; i++)
        ps[i] = pq[i] = i;
    test_shuffle_u32(ps, n, seed_counter++);
    test_shuffle_u32(pq, n, seed_counter++);
    for (uint32_t i = 0; i < n; i++) {
        off[i] = (kvf_move){i, ps[i], 0};
        on[i] = (kvf_move){ps[i], pq[i], 0};
    }
    kvf_ticket t1, t2;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_HOST, off, n, &t1), KVF_OK);
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, on, n, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t2, NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t1, NULL), KVF_OK);
    int bad = 0;
    for (uint32_t i = 0; i < n && bad < 3; i++)
        if (memcmp(hp + (size_t)ps[i] * bytes, orig + (size_t)i * bytes, bytes) != 0) {
            fprintf(stderr, "staged %zu-byte blocks: secondary slot %u wrong\n", bytes, ps[i]);
            bad++;
        }
    CUDA_OK(cudaMemcpy(got, dp, total, cudaMemcpyDeviceToHost));
    for (uint32_t i = 0; i < n && bad < 6; i++)
        if (memcmp(got + (size_t)pq[i] * bytes, orig + (size_t)i * bytes, bytes) != 0) {
            fprintf(stderr, "staged %zu-byte blocks: primary slot %u wrong\n", bytes, pq[i]);
            bad++;
        }
    CHECK(bad == 0);
    /* then the first 8 of 32 tokens (2-D copies, staged with 2-D DMAs)
     * into poisoned slots: the rest of each row keeps the poison */
    CUDA_OK(cudaMemset(dp, POISON, total));
    CUDA_OK(cudaDeviceSynchronize());
    test_shuffle_u32(pq, n, seed_counter++);
    for (uint32_t i = 0; i < n; i++)
        on[i] = (kvf_move){ps[i], pq[i], 8};
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_HOST, on, n, &t2), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t2, NULL), KVF_OK);
    CUDA_OK(cudaMemcpy(got, dp, total, cudaMemcpyDeviceToHost));
    size_t pitch = bytes / 2, w = pitch / 4;
    for (uint32_t i = 0; i < n && bad < 3; i++)
        for (size_t row = 0; row < 2; row++) {
            const uint8_t *gp = got + (size_t)pq[i] * bytes + row * pitch;
            const uint8_t *o = orig + (size_t)i * bytes + row * pitch;
            bool ok = memcmp(gp, o, w) == 0;
            for (size_t k = w; k < pitch && ok; k++)
                ok = gp[k] == POISON;
            if (!ok) {
                fprintf(stderr, "staged %zu-byte blocks, 8 tokens: slot %u row %zu wrong\n", bytes,
                        pq[i], row);
                bad++;
            }
        }
    CHECK(bad == 0);
    kvf_engine_destroy(e);
    free(orig);
    free(got);
    free(ps);
    free(pq);
    free(off);
    free(on);
    return 0;
}

static int test_staged(void)
{
    staged_case(32, 20000); /* 4 KiB blocks, 8 parts */
    staged_case(4096, 40);  /* 512 KiB blocks, 2 chunks of 16 MiB */
    return 0;
}

int main(void)
{
    unsetenv("KVF_CUDA_COPY");
    RUN(test_round_trip_auto);
    RUN(test_round_trip_kernel);
    RUN(test_round_trip_dma);
    RUN(test_file_tier);
    RUN(test_hazards_kernel);
    RUN(test_hazards_dma);
    RUN(test_sync_stream);
    RUN(test_offload_after_host);
    RUN(test_offload_after_disk);
    RUN(test_bad_pools);
    RUN(test_staged);
    return TEST_RESULT();
}
