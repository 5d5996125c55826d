/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which copy path the CUDA backend's table gives a batch, without a GPU:
 * batches are described with the memory kinds their sides would have
 * (nothing is copied or dereferenced), and the pick is checked against
 * AUTO's rule case by case, on each side of every threshold, and under
 * each forced path (KVF_CUDA_COPY, cuda.copy). The GPU tests
 * (test_cuda_backend_paths, _staged) check the same choices on copies that
 * move bytes.
 */
#include "cuda_private.h"
#include "testutil.h"

#define HOST cudaMemoryTypeHost
#define DEV cudaMemoryTypeDevice
#define PAGED cudaMemoryTypeUnregistered

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* Addresses only: the pick never touches the bytes. The pinned range is
 * the backend's own; the other host range is pinned memory it was never
 * given (the staged path DMAs only inside ranges it knows). */
#define PINNED_AT ((uintptr_t)1 << 44)
#define PINNED_BYTES ((size_t)1 << 32)
#define FOREIGN_AT ((uintptr_t)2 << 44)
#define DEVICE_AT ((uintptr_t)3 << 44)

static cuda_backend *g_b;
static cuda_queue *g_q;
static uint64_t g_seed = 7;

static void fx_init(void)
{
    g_b = calloc(1, sizeof *g_b);
    g_q = calloc(1, sizeof *g_q);
    REQUIRE(g_b && g_q);
    pthread_mutex_init(&g_b->range_lock, NULL);
    pthread_mutex_init(&g_q->lock, NULL);
    kvf__cuda_pinned_add(g_b, (void *)PINNED_AT, PINNED_BYTES);
}

static void fx_fini(void)
{
    for (int p = KVF__CUDA_PATH_NONE + 1; p < KVF__CUDA_PATH_END; p++)
        kvf__cuda_path_table[p].fini(g_q->path_state[p]);
    pthread_mutex_destroy(&g_q->lock);
    pthread_mutex_destroy(&g_b->range_lock);
    free(g_b->pinned);
    free(g_b->ranges);
    free(g_b);
    free(g_q);
}

/* count copies of `bytes` between host blocks host_at + k * bytes (each k
 * once, shuffled) and shuffled device slots; 2-D (rows of `width` at
 * `pitch`) where width < pitch. */
static size_t blocks(kvf__copy *c, uintptr_t host_at, size_t bytes, size_t count, bool to_host,
                     size_t width, size_t pitch)
{
    uint32_t *ph = malloc(count * sizeof *ph), *pd = malloc(count * sizeof *pd);
    REQUIRE(ph && pd);
    for (size_t i = 0; i < count; i++)
        ph[i] = pd[i] = (uint32_t)i;
    test_shuffle_u32(ph, count, g_seed++);
    test_shuffle_u32(pd, count, g_seed++);
    for (size_t i = 0; i < count; i++) {
        void *h = (void *)(host_at + ph[i] * bytes), *d = (void *)(DEVICE_AT + pd[i] * bytes);
        size_t rows = width < pitch ? bytes / pitch : 1, w = width < pitch ? width : bytes;
        size_t p = width < pitch ? pitch : bytes;
        c[i] = to_host ? (kvf__copy){h, d, w, rows, p, p} : (kvf__copy){d, h, w, rows, p, p};
    }
    free(ph);
    free(pd);
    return count;
}

/* Whole blocks. */
static size_t whole(kvf__copy *c, uintptr_t host_at, size_t bytes, size_t count, bool to_host)
{
    return blocks(c, host_at, bytes, count, to_host, bytes, bytes);
}

/* The pick for copies[0..n) with sides of these kinds, locked as
 * copy_async locks it. */
static int pick(const kvf__copy *c, size_t n, unsigned flags, enum cudaMemoryType dst,
                enum cudaMemoryType src, bool pageable)
{
    cuda_batch bt;
    kvf__cuda_batch_describe(&bt, c, n, flags, dst, src, pageable);
    pthread_mutex_lock(&g_q->lock);
    int p = kvf__cuda_path_pick(g_b, g_q, &bt);
    pthread_mutex_unlock(&g_q->lock);
    return p;
}

#define CHECK_PATH(what, got, want)                                                                \
    do {                                                                                           \
        int got_ = (got), want_ = (want);                                                          \
        if (got_ != want_)                                                                         \
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: the %s path, want %s", what,                     \
                         kvf__cuda_path_name(got_), kvf__cuda_path_name(want_));                   \
    } while (0)

static kvf__copy g_c[4096];

/* A batch of `count` blocks of `bytes` (2-D where width < pitch) between
 * the host range at host_at and the device, and the path it must take. */
typedef struct shape_case {
    const char *what;
    uintptr_t host_at;
    size_t bytes, count, width, pitch;
    unsigned flags;
    bool pageable;
    int want;
} shape_case;

#define BESIDE KVF__COPY_BESIDE_COMPUTE
#define P_STAGED KVF__CUDA_PATH_STAGED
#define P_KERNEL KVF__CUDA_PATH_KERNEL
#define P_DMA KVF__CUDA_PATH_DMA

/* Host<->device under AUTO: the staged path for dense whole blocks below
 * 256 KiB in the backend's pinned memory, the kernel for short runs, the
 * copy engines for the rest. */
static const shape_case AUTO_CASES[] = {
    {"dense 4 KiB", PINNED_AT, 4 * KIB, 1024, 4 * KIB, 4 * KIB, 0, false, P_STAGED},
    {"dense 252 KiB", PINNED_AT, 252 * KIB, 64, 252 * KIB, 252 * KIB, 0, false, P_STAGED},
    {"dense 256 KiB", PINNED_AT, 256 * KIB, 64, 256 * KIB, 256 * KIB, 0, false, P_DMA},
    {"dense 4 KiB beside compute", PINNED_AT, 4 * KIB, 1024, 4 * KIB, 4 * KIB, BESIDE, false,
     P_DMA},
    /* staged needs two blocks, and blocks of 512 bytes at least */
    {"one 4 KiB block", PINNED_AT, 4 * KIB, 1, 4 * KIB, 4 * KIB, 0, false, P_KERNEL},
    {"dense 256-byte blocks", PINNED_AT, 256, 64, 256, 256, 0, false, P_KERNEL},
    /* pinned memory the backend does not know of: no staging */
    {"4 KiB in foreign pinned", FOREIGN_AT, 4 * KIB, 1024, 4 * KIB, 4 * KIB, 0, false, P_KERNEL},
    /* the kernel's threshold on whole runs */
    {"256 KiB - 1", FOREIGN_AT, 256 * KIB - 1, 16, 256 * KIB - 1, 256 * KIB - 1, 0, false,
     P_KERNEL},
    {"256 KiB", FOREIGN_AT, 256 * KIB, 16, 256 * KIB, 256 * KIB, 0, false, P_DMA},
    {"4 KiB beside compute", FOREIGN_AT, 4 * KIB, 16, 4 * KIB, 4 * KIB, BESIDE, false, P_DMA},
    /* 2-D partial copies: never staged under AUTO; the kernel while rows
     * are below 128 KiB */
    {"dense 2-D rows of 1 KiB", PINNED_AT, 256 * KIB, 64, KIB, 4 * KIB, 0, false, P_KERNEL},
    {"2-D rows of 128 KiB - 1", PINNED_AT, 4 * MIB, 8, 128 * KIB - 1, 512 * KIB, 0, false,
     P_KERNEL},
    {"2-D rows of 128 KiB", PINNED_AT, 4 * MIB, 8, 128 * KIB, 512 * KIB, 0, false, P_DMA},
    {"2-D beside compute", PINNED_AT, 256 * KIB, 64, KIB, 4 * KIB, BESIDE, false, P_DMA},
    /* memory the kernel cannot reach: the copy engines */
    {"4 KiB touching pageable", PINNED_AT, 4 * KIB, 1024, 4 * KIB, 4 * KIB, 0, true, P_DMA},
};

/* Forced to the staged path: whatever tiles the backend's pinned memory,
 * in chunks of 16 MiB; the rest by AUTO's order. */
static const shape_case STAGED_CASES[] = {
    {"dense 1 MiB", PINNED_AT, MIB, 64, MIB, MIB, 0, false, P_STAGED},
    {"dense 16 MiB", PINNED_AT, 16 * MIB, 4, 16 * MIB, 16 * MIB, 0, false, P_STAGED},
    {"blocks above a chunk", PINNED_AT, 16 * MIB + 4 * KIB, 4, 16 * MIB + 4 * KIB,
     16 * MIB + 4 * KIB, 0, false, P_DMA},
    {"dense 2-D", PINNED_AT, 64 * KIB, 384, KIB, 4 * KIB, 0, false, P_STAGED},
    {"dense 2-D beside compute", PINNED_AT, 64 * KIB, 384, KIB, 4 * KIB, BESIDE, false, P_DMA},
    {"foreign 4 KiB", FOREIGN_AT, 4 * KIB, 64, 4 * KIB, 4 * KIB, 0, false, P_KERNEL},
    {"foreign 1 MiB", FOREIGN_AT, MIB, 64, MIB, MIB, 0, false, P_DMA},
};

/* Each case both ways (host to device, device to host). */
static void run_cases(const char *mode, const shape_case *cases, size_t ncases)
{
    for (size_t k = 0; k < ncases; k++)
        for (int to_host = 0; to_host < 2; to_host++) {
            const shape_case *sc = &cases[k];
            size_t n =
                blocks(g_c, sc->host_at, sc->bytes, sc->count, to_host, sc->width, sc->pitch);
            int got =
                pick(g_c, n, sc->flags, to_host ? HOST : DEV, to_host ? DEV : HOST, sc->pageable);
            if (got != sc->want)
                TEST_FAIL_AT(__FILE__, __LINE__, "%s: %s %s: the %s path, want %s", mode, sc->what,
                             to_host ? "d2h" : "h2d", kvf__cuda_path_name(got),
                             kvf__cuda_path_name(sc->want));
        }
}

static int test_auto_host_device(void)
{
    g_b->kernel_ok = true;
    g_b->forced = KVF__CUDA_PATH_NONE;
    run_cases("auto", AUTO_CASES, sizeof AUTO_CASES / sizeof *AUTO_CASES);
    for (int to_host = 0; to_host < 2; to_host++) {
        enum cudaMemoryType d = to_host ? HOST : DEV, s = to_host ? DEV : HOST;
        kvf__copy *c = g_c;
        /* not dense: a block missing, a block twice */
        size_t n = whole(c, PINNED_AT, 4 * KIB, 1024, to_host);
        for (size_t i = 0; i < n; i++)
            if ((uintptr_t)(to_host ? c[i].dst : c[i].src) == PINNED_AT + 5 * 4 * KIB) {
                c[i] = c[--n]; /* host block 5 */
                break;
            }
        CHECK_PATH("4 KiB with a hole", pick(c, n, 0, d, s, false), KVF__CUDA_PATH_KERNEL);
        n = whole(c, PINNED_AT, 4 * KIB, 1024, to_host);
        if (to_host)
            c[7].dst = c[9].dst;
        else
            c[7].src = c[9].src;
        CHECK_PATH("4 KiB with a duplicate", pick(c, n, 0, d, s, false), KVF__CUDA_PATH_KERNEL);
        /* a side CUDA does not know (pageable, unregistered) */
        n = whole(c, PINNED_AT, 4 * KIB, 1024, to_host);
        CHECK_PATH("4 KiB from unregistered",
                   pick(c, n, 0, to_host ? PAGED : d, to_host ? s : PAGED, false),
                   KVF__CUDA_PATH_DMA);
    }
    return 0;
}

/* Device to device and host to host under AUTO; empty batches. */
static int test_auto_other(void)
{
    g_b->kernel_ok = true;
    g_b->forced = KVF__CUDA_PATH_NONE;
    kvf__copy *c = g_c;
    size_t n = whole(c, DEVICE_AT + 64 * MIB * 64, 4 * MIB, 16, false);
    CHECK_PATH("d2d 4 MiB", pick(c, n, 0, DEV, DEV, false), KVF__CUDA_PATH_KERNEL);
    CHECK_PATH("d2d 4 MiB beside compute", pick(c, n, KVF__COPY_BESIDE_COMPUTE, DEV, DEV, false),
               KVF__CUDA_PATH_KERNEL);
    n = whole(c, DEVICE_AT + 64 * MIB * 64, 64 * MIB - 1, 4, false);
    CHECK_PATH("d2d 64 MiB - 1", pick(c, n, 0, DEV, DEV, false), KVF__CUDA_PATH_KERNEL);
    n = whole(c, DEVICE_AT + 64 * MIB * 64, 64 * MIB, 4, false);
    CHECK_PATH("d2d 64 MiB", pick(c, n, 0, DEV, DEV, false), KVF__CUDA_PATH_DMA);
    n = blocks(c, DEVICE_AT + 256 * MIB * 64, 256 * MIB, 2, false, 64 * MIB, 128 * MIB);
    CHECK_PATH("d2d 2-D rows of 64 MiB", pick(c, n, 0, DEV, DEV, false), KVF__CUDA_PATH_KERNEL);
    n = whole(c, PINNED_AT, 4 * KIB, 64, false);
    for (size_t i = 0; i < n; i++)
        c[i].dst = (void *)(FOREIGN_AT + i * 4 * KIB);
    CHECK_PATH("h2h 4 KiB", pick(c, n, 0, HOST, HOST, false), KVF__CUDA_PATH_KERNEL);
    CHECK_PATH("h2h 4 KiB beside compute", pick(c, n, KVF__COPY_BESIDE_COMPUTE, HOST, HOST, false),
               KVF__CUDA_PATH_DMA);
    kvf__copy empty[2] = {{(void *)DEVICE_AT, (void *)PINNED_AT, 0, 1, 0, 0},
                          {(void *)DEVICE_AT, (void *)PINNED_AT, 64, 0, 64, 64}};
    CHECK_PATH("empty copies", pick(empty, 2, 0, PAGED, PAGED, false), KVF__CUDA_PATH_DMA);
    CHECK_PATH("no copies", pick(empty, 0, 0, PAGED, PAGED, false), KVF__CUDA_PATH_DMA);
    /* a device that cannot use host pointers: the copy engines only */
    g_b->kernel_ok = false;
    n = whole(c, PINNED_AT, 4 * KIB, 1024, false);
    CHECK_PATH("dense 4 KiB, no mapped pointers", pick(c, n, 0, DEV, HOST, false),
               KVF__CUDA_PATH_DMA);
    n = whole(c, DEVICE_AT + 64 * MIB * 64, 4 * KIB, 16, false);
    CHECK_PATH("d2d 4 KiB, no mapped pointers", pick(c, n, 0, DEV, DEV, false), KVF__CUDA_PATH_DMA);
    g_b->kernel_ok = true;
    return 0;
}

/* A forced path takes every batch it can; where it cannot, AUTO's order
 * decides. */
static int test_forced(void)
{
    g_b->kernel_ok = true;
    kvf__copy *c = g_c;
    size_t n;

    g_b->forced = KVF__CUDA_PATH_KERNEL;
    n = whole(c, PINNED_AT, 4 * KIB, 1024, false);
    CHECK_PATH("kernel: dense 4 KiB", pick(c, n, 0, DEV, HOST, false), KVF__CUDA_PATH_KERNEL);
    CHECK_PATH("kernel: beside compute", pick(c, n, KVF__COPY_BESIDE_COMPUTE, DEV, HOST, false),
               KVF__CUDA_PATH_KERNEL);
    CHECK_PATH("kernel: pageable", pick(c, n, 0, DEV, HOST, true), KVF__CUDA_PATH_DMA);
    n = whole(c, FOREIGN_AT, 4 * MIB, 16, true);
    CHECK_PATH("kernel: 4 MiB", pick(c, n, 0, HOST, DEV, false), KVF__CUDA_PATH_KERNEL);
    n = whole(c, DEVICE_AT + 64 * MIB * 64, 64 * MIB, 4, false);
    CHECK_PATH("kernel: d2d 64 MiB", pick(c, n, 0, DEV, DEV, false), KVF__CUDA_PATH_KERNEL);
    g_b->kernel_ok = false;
    n = whole(c, PINNED_AT, 4 * KIB, 1024, false);
    CHECK_PATH("kernel: no mapped pointers", pick(c, n, 0, DEV, HOST, false), KVF__CUDA_PATH_DMA);
    g_b->kernel_ok = true;

    g_b->forced = KVF__CUDA_PATH_DMA;
    CHECK_PATH("dma: dense 4 KiB", pick(c, n, 0, DEV, HOST, false), KVF__CUDA_PATH_DMA);
    n = whole(c, DEVICE_AT + 64 * MIB * 64, 4 * KIB, 16, false);
    CHECK_PATH("dma: d2d 4 KiB", pick(c, n, 0, DEV, DEV, false), KVF__CUDA_PATH_DMA);

    g_b->forced = KVF__CUDA_PATH_STAGED;
    run_cases("staged", STAGED_CASES, sizeof STAGED_CASES / sizeof *STAGED_CASES);
    n = whole(c, DEVICE_AT + 64 * MIB * 64, 4 * KIB, 16, false);
    CHECK_PATH("staged: d2d", pick(c, n, 0, DEV, DEV, false), KVF__CUDA_PATH_KERNEL);
    g_b->forced = KVF__CUDA_PATH_NONE;
    return 0;
}

/* The names, and which path the configuration and the environment force. */
static int test_names_and_forcing(void)
{
    CHECK(strcmp(kvf__cuda_path_name(KVF__CUDA_PATH_NONE), "auto") == 0);
    CHECK(strcmp(kvf__cuda_path_name(KVF__CUDA_PATH_STAGED), "staged") == 0);
    CHECK(strcmp(kvf__cuda_path_name(KVF__CUDA_PATH_KERNEL), "kernel") == 0);
    CHECK(strcmp(kvf__cuda_path_name(KVF__CUDA_PATH_DMA), "dma") == 0);
    CHECK(strcmp(kvf__cuda_path_name(KVF__CUDA_PATH_END), "?") == 0);
    CHECK(strcmp(kvf__cuda_path_name(-1), "?") == 0);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    unsetenv("KVF_CUDA_COPY");
    CHECK_EQ_INT(kvf__cuda_forced_path(NULL), KVF__CUDA_PATH_NONE);
    CHECK_EQ_INT(kvf__cuda_forced_path(&cfg), KVF__CUDA_PATH_NONE);
    cfg.cuda.copy = KVF_CUDA_COPY_KERNEL;
    CHECK_EQ_INT(kvf__cuda_forced_path(&cfg), KVF__CUDA_PATH_KERNEL);
    cfg.cuda.copy = KVF_CUDA_COPY_DMA;
    CHECK_EQ_INT(kvf__cuda_forced_path(&cfg), KVF__CUDA_PATH_DMA);
    cfg.cuda.copy = KVF_CUDA_COPY_AUTO;
    for (int p = KVF__CUDA_PATH_NONE + 1; p < KVF__CUDA_PATH_END; p++) {
        setenv("KVF_CUDA_COPY", kvf__cuda_path_name(p), 1);
        CHECK_EQ_INT(kvf__cuda_forced_path(&cfg), p);
    }
    /* the caller's choice stands over the environment */
    setenv("KVF_CUDA_COPY", "staged", 1);
    cfg.cuda.copy = KVF_CUDA_COPY_DMA;
    CHECK_EQ_INT(kvf__cuda_forced_path(&cfg), KVF__CUDA_PATH_DMA);
    setenv("KVF_CUDA_COPY", "auto", 1);
    cfg.cuda.copy = KVF_CUDA_COPY_AUTO;
    CHECK_EQ_INT(kvf__cuda_forced_path(&cfg), KVF__CUDA_PATH_NONE);
    unsetenv("KVF_CUDA_COPY");
    return 0;
}

int main(void)
{
    fx_init();
    RUN(test_auto_host_device);
    RUN(test_auto_other);
    RUN(test_forced);
    RUN(test_names_and_forcing);
    fx_fini();
    return TEST_RESULT();
}
