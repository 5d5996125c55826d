/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_paths: how fast each way of moving scattered KV blocks runs on this
 * machine, against the ceiling of one large pinned copy measured in the same
 * run.
 *
 * For block sizes 4 KiB .. 4 MiB (256 MiB of blocks per run, at least 64
 * blocks, in shuffled order on both sides) and for host->device,
 * device->host, both at once, device->device, and the first 8 of 32 tokens
 * of each block, in two shapes: rows of 1 KiB at a 4 KiB pitch (p-), and
 * the engine's head-major K and V of `kvferry bench --compare`'s partial
 * runs (kv-: two rows of an eighth of the block, half a block apart):
 *   ceil    one cudaMemcpyAsync of the same bytes, contiguous (the ceiling)
 *   perblk  one cudaMemcpyAsync (cudaMemcpy2DAsync) per block
 *   batch   one cudaMemcpyBatchAsync (cudaMemcpy3DBatchAsync) per run
 *   kN      the backend's copy kernel on N thread blocks (N SMs)
 *   dma     the backend's copy-engine path
 *   staged  the backend's staged path (KVF_CUDA_COPY=staged: gather or
 *           scatter on the GPU through a device staging ring, one DMA per
 *           16 MiB chunk), where the host blocks tile one range (they do
 *           here: a permutation of the run), as an engine's sorted parts;
 *           timed on the host clock from submit to the done callback
 *   auto    the backend's choice (the path it took is printed after it)
 *   calls   the same, handed over in calls of 4 MiB of useful bytes, as
 *           the engine hands a large batch to the backend (the kernel
 *           path's per-call cost shows here)
 * GB/s of useful bytes, median of the timed runs (CUDA events, after a
 * warm-up), the ratio to ceil, and the host's submit time per block. Every
 * method's destination is poisoned first and checked byte for byte after
 * its timed runs (poison outside the copied rows included).
 *
 * Usage: cuda_paths [reps [host|partial]] (default 7 reps; `host`: whole
 * blocks between host and device only; `partial`: the partial shapes
 * between host and device only).
 */
#include "backend.h"

#include "bench_cuda.h"
#include "bench_stats.h"

#include "cuda_kernels.h"
#include "cuda_paths.h"

#include <cuda_runtime.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUN_BYTES ((size_t)256 << 20)
#define POISON 0xA5

enum { DIR_H2D, DIR_D2H, DIR_D2D };
static const char *const job_dir_names[] = {"h2d", "d2h", "d2d"};
enum {
    M_CEIL,
    M_PERBLK,
    M_BATCH,
    M_K8,
    M_K16,
    M_K32,
    M_K64,
    M_DMA,
    M_STAGED,
    M_AUTO,
    M_CALLS,
    M_COUNT
};
static const char *method_names[M_COUNT] = {"ceil", "perblk", "batch",  "k8",   "k16",  "k32",
                                            "k64",  "dma",    "staged", "auto", "calls"};
/* the engine's call size (src/engine/async.c) */
#define CALL_BYTES ((size_t)4 << 20)
/* the shapes of a row */
enum { SHAPE_WHOLE, SHAPE_ROWS, SHAPE_KV };
static const uint32_t kernel_sms[4] = {8, 16, 32, 64};

typedef struct job {
    int dir;
    size_t n;       /* blocks */
    kvf__copy *c;   /* one per block */
    uint8_t *dbase; /* destination region, RUN_BYTES long */
    const uint8_t *sbase;
    const uint8_t *simg; /* host image of the source region */
    bool dst_dev;
    size_t useful; /* bytes moved */
    /* cudaMemcpyBatchAsync / cudaMemcpy3DBatchAsync arguments */
    void **dsts;
    const void **srcs;
    size_t *sizes;
    struct cudaMemcpy3DBatchOp *ops;
} job;

static uint8_t *g_h, *g_d, *g_d2, *g_dimg, *g_check;
static cudaStream_t g_s[2];
static kvf__backend *g_b[M_COUNT];
static atomic_int g_done;

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void fill_random(uint8_t *p, size_t n)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v = next_rand();
        memcpy(p + i, &v, 8);
    }
}

static void shuffle(uint32_t *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = next_rand() % i;
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static void job_make(job *j, int dir, size_t bs, int shape, uint8_t *dbase)
{
    memset(j, 0, sizeof *j);
    j->dir = dir;
    j->n = RUN_BYTES / bs;
    j->dbase = dbase;
    j->dst_dev = dir != DIR_D2H;
    if (dir == DIR_H2D) {
        j->sbase = g_h;
        j->simg = g_h;
    } else {
        j->sbase = g_d + RUN_BYTES;
        j->simg = g_dimg + RUN_BYTES;
    }
    uint32_t *ps = malloc(j->n * sizeof *ps), *pd = malloc(j->n * sizeof *pd);
    shuffle(ps, j->n);
    shuffle(pd, j->n);
    j->c = malloc(j->n * sizeof *j->c);
    j->dsts = malloc(j->n * sizeof *j->dsts);
    j->srcs = malloc(j->n * sizeof *j->srcs);
    j->sizes = malloc(j->n * sizeof *j->sizes);
    j->ops = calloc(j->n, sizeof *j->ops);
    /* SHAPE_ROWS: 8 of 32 tokens of 128 bytes: rows of 1 KiB at a 4 KiB
     * pitch; SHAPE_KV: 8 of 32 tokens of K and of V, [kv][tokens][head]:
     * two rows of bs / 8 at a pitch of bs / 2 */
    size_t rows = shape == SHAPE_ROWS ? (bs >= 4096 ? bs / 4096 : 1) : shape == SHAPE_KV ? 2 : 1;
    size_t width = shape == SHAPE_ROWS ? 1024 : shape == SHAPE_KV ? bs / 8 : bs;
    size_t pitch = shape == SHAPE_ROWS ? 4096 : shape == SHAPE_KV ? bs / 2 : bs;
    for (size_t i = 0; i < j->n; i++) {
        kvf__copy *c = &j->c[i];
        *c = (kvf__copy){j->dbase + pd[i] * bs, j->sbase + ps[i] * bs, width, rows, pitch, pitch};
        j->dsts[i] = c->dst;
        j->srcs[i] = c->src;
        j->sizes[i] = width * rows;
        struct cudaMemcpy3DBatchOp *o = &j->ops[i];
        o->src.type = cudaMemcpyOperandTypePointer;
        o->src.op.ptr.ptr = (void *)c->src;
        o->src.op.ptr.rowLength = pitch;
        o->dst.type = cudaMemcpyOperandTypePointer;
        o->dst.op.ptr.ptr = c->dst;
        o->dst.op.ptr.rowLength = pitch;
        o->extent = make_cudaExtent(width, rows, 1);
        o->srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        j->useful += width * rows;
    }
    free(ps);
    free(pd);
}

static void job_free(job *j)
{
    free(j->c);
    free(j->dsts);
    free(j->srcs);
    free(j->sizes);
    free(j->ops);
}

static void poison(const job *j)
{
    if (j->dst_dev) {
        CK(cudaMemset(j->dbase, POISON, RUN_BYTES));
        CK(cudaDeviceSynchronize());
    } else {
        memset(j->dbase, POISON, RUN_BYTES);
    }
}

/* The offset of the first of p[0..n) that is not poison; n if none. */
static size_t first_unpoisoned(const uint8_t *p, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (p[k] != POISON)
            return k;
    return n;
}

/* The offset of the first byte where a[0..n) and b[0..n) differ; n if
 * none. */
static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    if (!memcmp(a, b, n))
        return n;
    size_t k = 0;
    while (a[k] == b[k])
        k++;
    return k;
}

/* Every copied row equals its source; every other byte is poison (the rows
 * and the gaps after them cover each block: rows * dpitch == block in
 * every shape). On the first wrong byte says which copy, row and byte,
 * what was expected and what was found, and returns false. */
static bool verify(const job *j, const char *what, size_t bs, int m)
{
    const uint8_t *got = j->dbase;
    if (j->dst_dev) {
        CK(cudaMemcpy(g_check, j->dbase, RUN_BYTES, cudaMemcpyDeviceToHost));
        got = g_check;
    }
    for (size_t i = 0; i < j->n; i++) {
        const kvf__copy *c = &j->c[i];
        size_t doff = (size_t)((const uint8_t *)c->dst - j->dbase);
        size_t soff = (size_t)((const uint8_t *)c->src - j->sbase);
        for (size_t r = 0; r < c->rows; r++) {
            const uint8_t *row = got + doff + r * c->dpitch;
            const uint8_t *want = j->simg + soff + r * c->spitch;
            size_t k = first_diff(row, want, c->width), gap = 0;
            bool in_gap = false;
            if (k == c->width && c->dpitch > c->width) {
                gap = c->dpitch - c->width;
                k = c->width + first_unpoisoned(row + c->width, gap);
                in_gap = k < c->width + gap;
            }
            if (k < c->width || in_gap) {
                fprintf(stderr,
                        "VERIFY FAILED: %s %zu %s: %s copy %zu of %zu (%zu x %zu bytes, pitch "
                        "%zu/%zu), row %zu, byte %zu %s (destination offset %zu): expected "
                        "0x%02x, got 0x%02x\n",
                        what, bs, method_names[m], job_dir_names[j->dir], i, j->n, c->rows,
                        c->width, c->dpitch, c->spitch, r, in_gap ? k - c->width : k,
                        in_gap ? "after the row (poison)" : "of the row", doff + r * c->dpitch + k,
                        in_gap ? POISON : want[k], row[k]);
                return false;
            }
        }
    }
    return true;
}

static void on_done(void *arg, kvf_status st)
{
    (void)arg;
    if (st != KVF_OK)
        fprintf(stderr, "copy batch failed: %d\n", (int)st);
    atomic_fetch_add(&g_done, 1);
}

static kvf__queue queue_of(const job *j)
{
    return j->dir == DIR_D2H ? KVF_QUEUE_OFFLOAD : KVF_QUEUE_ONBOARD;
}

typedef struct result {
    double gbs;
    double submit_us; /* per block */
    int ok;           /* 1 verified, 0 wrong, -1 not checked, -2 call failed */
    int path;
} result;

/* Queues job j by method m; false when a call is refused. *calls: the
 * backend calls made (each calls back once). */
static bool submit(int m, const job *j, int idx, cudaStream_t s, int *calls)
{
    bool partial = j->c[0].rows > 1 && j->c[0].width != j->c[0].dpitch;
    switch (m) {
    case M_CEIL:
        return cudaMemcpyAsync(j->dbase, j->sbase, j->useful, cudaMemcpyDefault, s) == cudaSuccess;
    case M_PERBLK:
        for (size_t i = 0; i < j->n; i++) {
            const kvf__copy *c = &j->c[i];
            cudaError_t e =
                partial ? cudaMemcpy2DAsync(c->dst, c->dpitch, c->src, c->spitch, c->width, c->rows,
                                            cudaMemcpyDefault, s)
                        : cudaMemcpyAsync(c->dst, c->src, c->width * c->rows, cudaMemcpyDefault, s);
            if (e != cudaSuccess)
                return false;
        }
        return true;
    case M_BATCH: {
        cudaError_t e;
        if (partial) {
            e = cudaMemcpy3DBatchAsync(j->n, j->ops, 0, s);
        } else {
            struct cudaMemcpyAttributes attr;
            memset(&attr, 0, sizeof attr);
            attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            size_t ai = 0;
            e = cudaMemcpyBatchAsync(j->dsts, j->srcs, j->sizes, j->n, &attr, &ai, 1, s);
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        return true;
    }
    case M_CALLS: {
        kvf__backend *b = g_b[m];
        for (size_t i = 0; i < j->n;) {
            size_t k = i, bytes = 0;
            for (; k < j->n && bytes < CALL_BYTES; k++)
                bytes += j->c[k].width * j->c[k].rows;
            if (b->ops->copy_async(b, queue_of(j), j->c + i, k - i, 0, on_done, NULL) != KVF_OK)
                return false;
            ++*calls;
            i = k;
        }
        return true;
    }
    default: {
        kvf__backend *b = g_b[m];
        (void)idx;
        ++*calls;
        return b->ops->copy_async(b, queue_of(j), j->c, j->n, 0, on_done, NULL) == KVF_OK;
    }
    }
}

static result measure(int m, job *jobs, int njobs, int reps, const char *what, size_t bs)
{
    result res = {0, 0, -1, 0};
    cudaStream_t st[2];
    for (int k = 0; k < njobs; k++) {
        st[k] = m >= M_K8 ? (cudaStream_t)kvf__cuda_queue_stream(g_b[m], (int)queue_of(&jobs[k]))
                          : g_s[k];
        if (m != M_CEIL)
            poison(&jobs[k]);
    }
    cudaEvent_t ev0, ev1, evj;
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    CK(cudaEventCreate(&evj));
    double *ms = malloc((size_t)reps * sizeof *ms), *sub = malloc((size_t)reps * sizeof *sub);
    int timed = 0;
    size_t blocks = 0, useful = 0;
    for (int k = 0; k < njobs; k++) {
        blocks += jobs[k].n;
        useful += jobs[k].useful;
    }
    for (int r = -1; r < reps; r++) { /* r == -1: warm-up */
        atomic_store(&g_done, 0);
        int want_done = 0;
        CK(cudaEventRecord(ev0, st[0]));
        for (int k = 1; k < njobs; k++)
            CK(cudaStreamWaitEvent(st[k], ev0, 0));
        double t0 = bench_now_us();
        for (int k = 0; k < njobs; k++) {
            int calls = 0;
            if (!submit(m, &jobs[k], k, st[k], &calls)) {
                res.ok = -2;
                goto out;
            }
            if (m >= M_K8)
                want_done += calls;
        }
        double t1 = bench_now_us();
        for (int k = 1; k < njobs; k++) {
            CK(cudaEventRecord(evj, st[k]));
            CK(cudaStreamWaitEvent(st[0], evj, 0));
        }
        CK(cudaEventRecord(ev1, st[0]));
        CK(cudaEventSynchronize(ev1));
        while (atomic_load(&g_done) < want_done)
            ;
        double t2 = bench_now_us();
        if (r >= 0) {
            float x;
            CK(cudaEventElapsedTime(&x, ev0, ev1));
            /* the staged path's last scatter runs on a stream of its own,
             * after ev1: its time is the host's, submit to callback; so
             * is that of the engine-sized calls, which AUTO may stage */
            ms[timed] = m == M_STAGED || m == M_CALLS ? (float)((t2 - t0) / 1e3) : x;
            sub[timed] = (t1 - t0) / (double)blocks;
            timed++;
        }
    }
    qsort(ms, (size_t)timed, sizeof *ms, cmp_double);
    qsort(sub, (size_t)timed, sizeof *sub, cmp_double);
    res.gbs = (double)useful / (ms[timed / 2] * 1e6);
    res.submit_us = sub[timed / 2];
    if (m >= M_K8)
        res.path = kvf__cuda_last_path(g_b[m], (int)queue_of(&jobs[0]));
    if (m != M_CEIL) {
        res.ok = 1;
        for (int k = 0; k < njobs; k++)
            if (!verify(&jobs[k], what, bs, m))
                res.ok = 0;
    }
out:
    CK(cudaDeviceSynchronize());
    for (int k = 0; k < njobs && m >= M_K8; k++)
        CK(cudaStreamSynchronize(st[k]));
    free(ms);
    free(sub);
    CK(cudaEventDestroy(ev0));
    CK(cudaEventDestroy(ev1));
    CK(cudaEventDestroy(evj));
    return res;
}

static int g_fail;

static void row(const char *what, size_t bs, job *jobs, int njobs, int reps)
{
    result r[M_COUNT];
    for (int m = 0; m < M_COUNT; m++) {
        /* one call per block at 4 KiB: 65536 calls a run; fewer repeats */
        int k = m == M_PERBLK && bs <= 16384 ? 3 : reps;
        r[m] = measure(m, jobs, njobs, k, what, bs);
        if (r[m].ok == 0)
            g_fail = 1; /* verify said where */
    }
    double ceil = r[M_CEIL].gbs;
    printf("%-8s %5zuK", what, bs >> 10);
    for (int m = 0; m < M_COUNT; m++) {
        if (r[m].ok == -2)
            printf(" |   err      ");
        else if (m == M_CEIL)
            printf(" | %7.1f     ", r[m].gbs);
        else
            printf(" | %7.1f %.2f%s", r[m].gbs, r[m].gbs / ceil, r[m].ok == 0 ? "!" : " ");
    }
    printf(" | auto=%s staged=%s calls=%s\n", kvf__cuda_path_name(r[M_AUTO].path),
           kvf__cuda_path_name(r[M_STAGED].path), kvf__cuda_path_name(r[M_CALLS].path));
    printf("%-8s %5s  submit us/block:", "", "");
    for (int m = M_PERBLK; m < M_COUNT; m++)
        if (r[m].ok != -2)
            printf(" %s %.3f", method_names[m], r[m].submit_us);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    /* "host": whole blocks between host and device only */
    bool host_only = argc > 2 && strcmp(argv[2], "host") == 0;
    bool partial_only = argc > 2 && strcmp(argv[2], "partial") == 0;
    if (reps < 1)
        reps = 1;
    unsetenv("KVF_CUDA_COPY");
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        fprintf(stderr, "no CUDA device\n");
        return 77;
    }
    time_t t = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    printf("cuda_paths: %s, %d SMs, cc %d.%d, runtime %d, %s, %d timed runs (median)\n", p.name,
           p.multiProcessorCount, p.major, p.minor, CUDART_VERSION, date, reps);

    for (int m = M_K8; m < M_COUNT; m++) {
        kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
        cfg.cuda.copy = m == M_DMA                                     ? KVF_CUDA_COPY_DMA
                        : m == M_AUTO || m == M_STAGED || m == M_CALLS ? KVF_CUDA_COPY_AUTO
                                                                       : KVF_CUDA_COPY_KERNEL;
        cfg.cuda.copy_sms = m <= M_K64 ? kernel_sms[m - M_K8] : 0;
        /* the staged mode is not in the API: its environment switch */
        if (m == M_STAGED)
            setenv("KVF_CUDA_COPY", "staged", 1);
        kvf_status st = kvf__cuda_backend_create(&cfg, &g_b[m]);
        unsetenv("KVF_CUDA_COPY");
        if (st != KVF_OK) {
            fprintf(stderr, "backend: %s\n", kvf_last_error());
            return 1;
        }
    }
    CK(cudaStreamCreateWithFlags(&g_s[0], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&g_s[1], cudaStreamNonBlocking));
    /* pinned by the staged backend, which DMAs only inside pinned memory it
     * knows of (mapped and portable: every backend's kernel reaches it) */
    if (g_b[M_STAGED]->ops->mem_alloc(g_b[M_STAGED], KVF_MEMORY_HOST_PINNED, 2 * RUN_BYTES,
                                      (void **)&g_h) != KVF_OK) {
        fprintf(stderr, "pinned memory: %s\n", kvf_last_error());
        return 1;
    }
    CK(cudaMalloc((void **)&g_d, 2 * RUN_BYTES));
    CK(cudaMalloc((void **)&g_d2, RUN_BYTES));
    g_dimg = malloc(2 * RUN_BYTES);
    g_check = malloc(RUN_BYTES);
    if (!g_dimg || !g_check)
        return 1;
    fill_random(g_h, 2 * RUN_BYTES);
    fill_random(g_dimg, 2 * RUN_BYTES);
    CK(cudaMemcpy(g_d, g_dimg, 2 * RUN_BYTES, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());

    printf("GB/s of useful bytes (ratio to ceil); '!' = bytes wrong\n");
    printf("%-8s %6s", "what", "block");
    for (int m = 0; m < M_COUNT; m++)
        printf(" | %-12s", method_names[m]);
    printf("\n");
    static const size_t sizes[] = {4096, 16384, 65536, 262144, 1 << 20, 4 << 20};
    static const char *const prefix[] = {"", "p-", "kv-"};
    static const char *const dir_names[] = {"h2d", "d2h", "both", "d2d"};
    /* host: whole blocks, host<->device; partial: both partial shapes,
     * host<->device; else everything */
    int shape0 = partial_only ? SHAPE_ROWS : SHAPE_WHOLE;
    int shape1 = host_only ? SHAPE_WHOLE : SHAPE_KV;
    int ndirs = host_only || partial_only ? 3 : 4;
    for (int shape = shape0; shape <= shape1; shape++) {
        for (int dir = 0; dir < ndirs; dir++) {
            for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
                size_t bs = sizes[k];
                if (shape != SHAPE_WHOLE && bs < 8192)
                    continue; /* a partial 4 KiB block is one 1 KiB row */
                job jobs[2];
                int nj = 1;
                if (dir == 0) {
                    job_make(&jobs[0], DIR_H2D, bs, shape, g_d);
                } else if (dir == 1) {
                    job_make(&jobs[0], DIR_D2H, bs, shape, g_h + RUN_BYTES);
                } else if (dir == 2) {
                    job_make(&jobs[0], DIR_H2D, bs, shape, g_d);
                    job_make(&jobs[1], DIR_D2H, bs, shape, g_h + RUN_BYTES);
                    nj = 2;
                } else {
                    job_make(&jobs[0], DIR_D2D, bs, shape, g_d2);
                }
                char what[16];
                snprintf(what, sizeof what, "%s%s", prefix[shape], dir_names[dir]);
                row(what, bs, jobs, nj, reps);
                for (int i = 0; i < nj; i++)
                    job_free(&jobs[i]);
            }
        }
    }
    g_b[M_STAGED]->ops->mem_free(g_b[M_STAGED], KVF_MEMORY_HOST_PINNED, g_h);
    for (int m = M_K8; m < M_COUNT; m++)
        g_b[m]->ops->destroy(g_b[m]);
    CK(cudaFree(g_d));
    CK(cudaFree(g_d2));
    free(g_dimg);
    free(g_check);
    printf(g_fail ? "cuda_paths: VERIFY FAILED\n" : "cuda_paths: all bytes verified\n");
    return g_fail;
}
