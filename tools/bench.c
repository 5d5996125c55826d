/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry bench: offload + onboard round trips over a chosen geometry, in
 * scattered slot order, timed next to the ceiling and a per-block copy
 * (one copy call per block) measured in the same run, with every byte verified afterwards.
 */
#include "bench.h"
#include "blockhdr.h"
#include "cli.h"
#include "engine.h"
#include "fileio.h"
#include "layout.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef KVF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

typedef enum bench_mode { MODE_DRAM, MODE_POSIX, MODE_GDS } bench_mode;

typedef struct bench_opts {
    kvf_backend backend;
    bench_mode mode;
    kvf_geometry g;
    uint32_t pools, blocks, tokens, iters, threads;
    const char *dir;
    const char *json, *plot;
    kvf_fsync fsync;
    kvf_file_runner file_runner;
    uint32_t queue_depth;
    uint64_t seed;
    bool compare;
    bool blocks_given; /* --blocks: --compare's runs move that many blocks */
} bench_opts;

/* What one run measured, for --compare's summary. */
typedef struct bench_result {
    size_t block_bytes;
    uint32_t tokens;
    double mine[3];
    double ceiling[3], per_block[3], batch[3];
    double spread; /* the widest spread of the run's rounds */
} bench_result;

typedef struct result {
    const char *what;
    double offload_gbs, onboard_gbs;
} result;

double kvf_bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void kvf_bench_fill_random(uint8_t *p, size_t n, uint64_t *state)
{
    uint64_t x = *state;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x | 1);
    }
    *state = x;
}

/* A size of 1 byte to 256 MiB, with an optional K or M; 0 or -1 (printed). */
int kvf_bench_parse_size(const char *name, const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (end == s || s[0] == '-') {
        fprintf(stderr, "kvferry bench: --%s: '%s' is not a size (N, NK or NM)\n", name, s);
        return -1;
    }
    int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : 0;
    end += shift != 0;
    if (*end && *end != ',') {
        fprintf(stderr, "kvferry bench: --%s: '%s' is not a size (N, NK or NM)\n", name, s);
        return -1;
    }
    if (errno == ERANGE || v == 0 || v > (256ull << 20) >> shift) {
        fprintf(stderr, "kvferry bench: --%s: %.*s is out of range (1..256M)\n", name,
                (int)(end - s), s);
        return -1;
    }
    *out = (size_t)(v << shift);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int kvf_bench_parse_sizes(const char *list, size_t *sizes, size_t max, size_t *n)
{
    *n = 0;
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (*n == max) {
            fprintf(stderr, "kvferry bench: --sizes: more than %zu sizes\n", max);
            return -1;
        }
        if (kvf_bench_parse_size("sizes", p, &sizes[(*n)++]))
            return -1;
    }
    return 0;
}

/* The q-quantile (0..1) of n samples, nearest rank; v is sorted in place. */
double kvf_bench_quantile(double *v, size_t n, double q)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n ? v[(size_t)(q * (double)(n - 1) + 0.5)] : 0;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The q-quantile of sorted v[0..n), interpolated between ranks. */
static double sorted_quantile(const double *v, size_t n, double q)
{
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    return i + 1 < n ? v[i] + (pos - (double)i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* The median of n timed rounds (sorted in place); *spread becomes the
 * larger of itself and these rounds' interquartile range over their
 * median: how far the rounds that make the median lie apart, blind to one
 * cold first round or one stall, as a median is. */
static double rounds_median(double *t, size_t n, double *spread)
{
    double m = median(t, n);
    double iqr = n > 1 ? sorted_quantile(t, n, 0.75) - sorted_quantile(t, n, 0.25) : 0;
    if (m > 0 && iqr / m > *spread)
        *spread = iqr / m;
    return m;
}

bool kvf_bench_busy(char *where, size_t cap, cJSON *json)
{
    double load = -1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (getloadavg(&load, 1) != 1)
        load = -1;
    snprintf(where, cap, "load average %.2f on %ld CPU(s)", load, cpus);
    cJSON_AddNumberToObject(json, "load_average", load);
    return load > (double)cpus;
}

bool kvf_bench_report_spread(double spread, uint32_t rounds, cJSON *json)
{
    char where[96];
    bool busy = kvf_bench_busy(where, sizeof where, json);
    cJSON_AddNumberToObject(json, "rounds", rounds);
    cJSON_AddNumberToObject(json, "spread", rounds >= KVF_BENCH_MIN_ROUNDS ? spread : -1);
    if (rounds < KVF_BENCH_MIN_ROUNDS) {
        printf("  spread: not known from %u round(s): take --iters %d or more to see how far "
               "the figures can be trusted (%s)\n",
               rounds, KVF_BENCH_MIN_ROUNDS, where);
        return false;
    }
    bool wide = spread > KVF_BENCH_WIDE_SPREAD;
    printf("  spread: the middle half of each figure's %u rounds lies within %.0f %% of its "
           "median (%s)\n",
           rounds, spread * 100, where);
    if (wide)
        printf("  WARNING: rounds spread by more than %.0f %%: the GB/s and ratios above are not "
               "to be trusted%s; rerun on an idle machine, or with more --iters\n",
               KVF_BENCH_WIDE_SPREAD * 100,
               busy ? " (more runnable work than CPUs: something else is running)" : "");
    return wide;
}

/* ---- slot access: the CLI fills and checks slots like an engine would --- */

bool kvf_bench_on_gpu(kvf_engine *e)
{
    return kvf_engine_backend(e) == KVF_BACKEND_CUDA;
}

int kvf_bench_slot_io(kvf_engine *e, uint32_t pool, uint32_t slot, void *host, size_t n, bool write)
{
    void *p;
    if (kvf_engine_slot_ptr(e, pool, KVF_LEVEL_PRIMARY, slot, &p) != KVF_OK) {
        fprintf(stderr, "kvferry bench: %s\n", kvf_last_error());
        return -1;
    }
#ifdef KVF_HAVE_CUDA
    if (kvf_bench_on_gpu(e)) {
        cudaError_t ce = write ? cudaMemcpy(p, host, n, cudaMemcpyHostToDevice)
                               : cudaMemcpy(host, p, n, cudaMemcpyDeviceToHost);
        if (ce != cudaSuccess) {
            fprintf(stderr, "kvferry bench: cudaMemcpy: %s\n", cudaGetErrorString(ce));
            return -1;
        }
        return 0;
    }
#endif
    if (write)
        memcpy(p, host, n);
    else
        memcpy(host, p, n);
    return 0;
}

/* All primary slots of a pool at once: the bench's pools are allocated by
 * kvferry with no gap between slots, so they are one array. */
static int pool_io(kvf_engine *e, uint32_t pool, uint32_t blocks, void *host, size_t block_bytes,
                   bool write)
{
    return kvf_bench_slot_io(e, pool, 0, host, block_bytes * blocks, write);
}

/* ---- baselines ------------------------------------------------------------ */

/* Copies one call per block per pool (TensorRT-LLM's transfer manager's
 * pattern) or one
 * large contiguous copy, between freshly allocated buffers of the same kind
 * as the engine's pools. Returns GB/s, or 0 where unavailable. */
typedef struct dram_base {
    /* [0] offload, [1] onboard, [2] both at once (0: not measured) */
    double ceiling[3], per_block[3], batch[3];
    /* the GPU's ceiling timed as kvferry is, on the host from the call to
     * the synchronize's return: what a caller of that one copy waits
     * (ceiling[] is timed by CUDA events, the GPU's time alone) */
    double ceiling_host[3];
    double spread;         /* the widest of their rounds' spreads */
    double per_block_cold; /* files: the per-block files' read pass from the disk */
} dram_base;

/* Leaves the caches as the kvferry runs find them: the source just
 * written, the destination just poisoned. */
static void touch(uint8_t *src, uint8_t *dst, size_t n)
{
    memset(src, 0x5A, n);
    memset(dst, 0xA5, n);
}

/* For a partial move (r.rows > 1) the ceiling copies the useful bytes in
 * one piece and the per-block copy copies each block's rows, as
 * TensorRT-LLM's partial-copy kernel does, one block at a time. */
static void host_dram_baselines(size_t block_bytes, const kvf_region *r, uint32_t blocks,
                                const uint32_t *perm, uint32_t iters, dram_base *out)
{
    size_t total = block_bytes * blocks, useful = kvf__region_bytes(r) * blocks;
    uint8_t *a = malloc(total), *b = malloc(total);
    if (!a || !b) {
        free(a);
        free(b);
        return;
    }
    uint64_t seed = 7;
    kvf_bench_fill_random(a, total, &seed);
    memset(b, 0xA5, total);
    double *t = malloc(iters * sizeof *t);
    for (int dir = 0; dir < 2; dir++) {
        uint8_t *src = dir ? b : a, *dst = dir ? a : b;
        for (uint32_t it = 0; it < iters; it++) {
            touch(src, dst, total);
            double t0 = kvf_bench_now_s();
            memcpy(dst, src, useful);
            t[it] = kvf_bench_now_s() - t0;
        }
        out->ceiling[dir] = useful / rounds_median(t, iters, &out->spread) / 1e9;
        for (uint32_t it = 0; it < iters; it++) {
            touch(src, dst, total);
            double t0 = kvf_bench_now_s();
            for (uint32_t i = 0; i < blocks; i++)
                for (size_t row = 0; row < r->rows; row++)
                    memcpy(dst + (size_t)perm[i] * block_bytes + row * r->pitch,
                           src + (size_t)i * block_bytes + row * r->pitch, r->row_bytes);
            t[it] = kvf_bench_now_s() - t0;
        }
        out->per_block[dir] = useful / rounds_median(t, iters, &out->spread) / 1e9;
    }
    free(t);
    free(a);
    free(b);
}

#ifdef KVF_HAVE_CUDA
/* One method of moving `blocks` scattered blocks (their first-N-token
 * regions) between dst and src on stream s: 0 one large copy (the
 * ceiling), 1 one call per block (the per-block copy), 2 cudaMemcpyBatchAsync. */
typedef struct cuda_job {
    uint8_t *dst, *src;
    const kvf_region *r;
    size_t block_bytes, useful;
    uint32_t blocks;
    const uint32_t *perm;
    void **dsts;
    const void **srcs;
    size_t *sizes;
} cuda_job;

static void cuda_issue(const cuda_job *j, int method, cudaStream_t s)
{
    const kvf_region *r = j->r;
    if (method == 0) {
        cudaMemcpyAsync(j->dst, j->src, j->useful, cudaMemcpyDefault, s);
    } else if (method == 1) {
        for (uint32_t i = 0; i < j->blocks; i++)
            cudaMemcpy2DAsync(j->dst + (size_t)j->perm[i] * j->block_bytes, r->pitch,
                              j->src + (size_t)i * j->block_bytes, r->pitch, r->row_bytes, r->rows,
                              cudaMemcpyDefault, s);
    } else {
#if CUDART_VERSION >= 12080
        size_t n = 0;
        for (uint32_t i = 0; i < j->blocks; i++)
            for (size_t row = 0; row < r->rows; row++, n++) {
                j->dsts[n] = j->dst + (size_t)j->perm[i] * j->block_bytes + row * r->pitch;
                j->srcs[n] = j->src + (size_t)i * j->block_bytes + row * r->pitch;
                j->sizes[n] = r->row_bytes;
            }
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof attr);
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t idx = 0;
#if CUDART_VERSION >= 13000
        cudaMemcpyBatchAsync(j->dsts, j->srcs, j->sizes, n, &attr, &idx, 1, s);
#else
        size_t fail;
        cudaMemcpyBatchAsync(j->dsts, (void **)j->srcs, j->sizes, n, &attr, &idx, 1, &fail, s);
#endif
#endif
    }
}

/* The ceiling, the per-block copy and cudaMemcpyBatchAsync over the same bytes,
 * each direction and both at once (two streams, each moving half). */
static void cuda_dram_baselines(size_t block_bytes, const kvf_region *r, uint32_t blocks,
                                const uint32_t *perm, uint32_t iters, dram_base *out)
{
    size_t total = block_bytes * blocks;
    uint32_t half = blocks / 2;
    uint8_t *d = NULL, *h = NULL;
    cudaStream_t s[2] = {NULL, NULL};
    cudaEvent_t e0 = NULL, e1 = NULL, e2 = NULL;
    size_t nrows = (size_t)blocks * r->rows;
    void **dsts = malloc(nrows * sizeof *dsts);
    const void **srcs = malloc(nrows * sizeof *srcs);
    size_t *sizes = malloc(nrows * sizeof *sizes);
    uint32_t *perm2 = malloc((half ? half : 1) * sizeof *perm2);
    double *t = malloc(iters * sizeof *t), *th = malloc(iters * sizeof *th);
    if (!dsts || !srcs || !sizes || !perm2 || !t || !th ||
        cudaMalloc((void **)&d, total) != cudaSuccess ||
        cudaMallocHost((void **)&h, total) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s[0], cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s[1], cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess ||
        cudaEventCreate(&e2) != cudaSuccess)
        goto out;
    memset(h, 0x5A, total);
    /* both at once: blocks [0, half) go down while [half, 2 half) come up,
     * each permuted within its half */
    uint32_t k = 0;
    for (uint32_t i = 0; i < blocks && k < half; i++)
        if (perm[i] < half)
            perm2[k++] = perm[i];
    for (int method = 0; method < 3; method++) {
#if CUDART_VERSION < 12080
        if (method == 2)
            break;
#endif
        for (int dir = 0; dir < 3; dir++) {
            cuda_job down = {h,      d,    r,    block_bytes, kvf__region_bytes(r) * blocks,
                             blocks, perm, dsts, srcs,        sizes};
            cuda_job up = {d, h, r, block_bytes, down.useful, blocks, perm, dsts, srcs, sizes};
            cuda_job hd = {h,    d,     r,    block_bytes, kvf__region_bytes(r) * half,
                           half, perm2, dsts, srcs,        sizes};
            cuda_job hu = {d + (size_t)half * block_bytes,
                           h + (size_t)half * block_bytes,
                           r,
                           block_bytes,
                           hd.useful,
                           half,
                           perm2,
                           dsts + (size_t)half * r->rows,
                           srcs + (size_t)half * r->rows,
                           sizes + (size_t)half * r->rows};
            if (dir == 2 && half == 0)
                continue;
            for (uint32_t it = 0; it <= iters; it++) {
                double h0 = kvf_bench_now_s();
                cudaEventRecord(e0, s[0]);
                if (dir < 2) {
                    cuda_issue(dir ? &up : &down, method, s[0]);
                } else {
                    cudaStreamWaitEvent(s[1], e0, 0);
                    cuda_issue(&hd, method, s[0]);
                    cuda_issue(&hu, method, s[1]);
                    cudaEventRecord(e2, s[1]);
                    cudaStreamWaitEvent(s[0], e2, 0);
                }
                cudaEventRecord(e1, s[0]);
                cudaEventSynchronize(e1);
                double h1 = kvf_bench_now_s();
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (it) { /* the first run warms up */
                    t[it - 1] = ms / 1e3;
                    th[it - 1] = h1 - h0;
                }
            }
            size_t bytes = dir < 2 ? down.useful : 2 * hd.useful;
            double gbs = bytes / rounds_median(t, iters, &out->spread) / 1e9;
            if (method == 0)
                out->ceiling_host[dir] = bytes / rounds_median(th, iters, &out->spread) / 1e9;
            double *dst = method == 0 ? out->ceiling : method == 1 ? out->per_block : out->batch;
            dst[dir] = gbs;
        }
    }
out:
    cudaGetLastError();
    free(t);
    free(th);
    free(perm2);
    free(dsts);
    free(srcs);
    free(sizes);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (e2)
        cudaEventDestroy(e2);
    for (int i = 0; i < 2; i++)
        if (s[i])
            cudaStreamDestroy(s[i]);
    cudaFree(d);
    cudaFreeHost(h);
}
#endif

/* What ran the file ceiling's calls, and so the tier's (same config). */
static char file_runner_used[64];

/* The file ceiling: the bytes the tier moves (each block's image of header
 * and payload, padded to 4 KiB) as one file, written over in place and read
 * with O_DIRECT by the same I/O runner at the same queue depth in the same
 * scattered order (block i at image perm[i]), fsynced
 * once when the tier fsyncs: the disk with no per-file cost and no block
 * allocation (an untimed first pass allocates the file). Its passes are
 * interleaved with the tier's round trips, so both see the same disk: it
 * is shared and its speed drifts by 2x within a minute. */
typedef struct file_ceiling {
    char path[4096];
    uint8_t *buf;
    size_t image, total;
    uint32_t blocks, n[2];
    const uint32_t *perm; /* block i lies at image perm[i], as the tier scatters */
    bool fsync_on, failed;
    kvf__fio_op *ops;
    kvf__fileio_runner *io;
    double *t[2];
} file_ceiling;

static void ceiling_pass(file_ceiling *c, int d, bool timed)
{
    if (c->failed)
        return;
    double t0 = kvf_bench_now_s();
    int flags = d ? O_RDONLY : O_WRONLY | O_CREAT;
    bool direct = true;
    int fd = open(c->path, flags | O_DIRECT, 0644);
    if (fd < 0 && errno == EINVAL) {
        direct = false; /* tmpfs: the page cache is the ceiling there */
        fd = open(c->path, flags, 0644);
    }
    if (fd < 0) {
        c->failed = true;
        return;
    }
    for (uint32_t b = 0; b < c->blocks; b++)
        c->ops[b] = (kvf__fio_op){.kind = d ? KVF_FIO_READ : KVF_FIO_WRITE,
                                  .fd = fd,
                                  .buf = c->buf + (size_t)b * c->image,
                                  .len = c->image,
                                  .need = c->image,
                                  .off = (uint64_t)c->perm[b] * c->image,
                                  .path = c->path,
                                  .direct = direct,
                                  .next = b + 1 < c->blocks ? &c->ops[b + 1] : NULL};
    kvf__fileio_runner_run(c->io, c->ops);
    for (uint32_t b = 0; b < c->blocks; b++)
        c->failed |= c->ops[b].err != 0 || c->ops[b].done < c->image;
    if (!d && c->fsync_on)
        c->failed |= fsync(fd) != 0;
    close(fd);
    if (timed && !c->failed)
        c->t[d][c->n[d]++] = kvf_bench_now_s() - t0;
}

/* stored: the payload bytes of one block's file (every pool's region). */
static int ceiling_open(file_ceiling *c, const char *dir, size_t stored, const uint32_t *perm,
                        const bench_opts *o)
{
    memset(c, 0, sizeof *c);
    c->perm = perm;
    c->blocks = o->blocks;
    c->fsync_on = o->fsync != KVF_FSYNC_NONE;
    c->image =
        (KVF_BLOCK_HEADER_BYTES + stored + KVF_FILE_ALIGN - 1) & ~(size_t)(KVF_FILE_ALIGN - 1);
    c->total = stored * c->blocks;
    snprintf(c->path, sizeof c->path, "%s/ceiling.bin", dir);
    void *mem = NULL;
    if (posix_memalign(&mem, KVF_FILE_ALIGN, c->image * c->blocks) != 0)
        return -1;
    c->buf = mem;
    uint64_t seed = 11;
    kvf_bench_fill_random(c->buf, c->image * c->blocks, &seed);
    c->ops = calloc(c->blocks, sizeof *c->ops);
    c->t[0] = calloc(o->iters, sizeof(double));
    c->t[1] = calloc(o->iters, sizeof(double));
    if (!c->ops || !c->t[0] || !c->t[1] ||
        kvf__fileio_runner_create(o->file_runner, o->queue_depth, 1, &c->io) != KVF_OK)
        return -1;
    snprintf(file_runner_used, sizeof file_runner_used, "%s, queue depth %u",
             kvf__fileio_runner_type(c->io) == KVF_FILE_RUNNER_URING ? "io_uring" : "threads",
             kvf__fileio_runner_depth(c->io));
    ceiling_pass(c, 0, false);
    return c->failed ? -1 : 0;
}

/* Reports the medians into `out` (when given) and frees; safe to repeat. */
static void ceiling_close(file_ceiling *c, dram_base *out)
{
    for (int d = 0; d < 2 && out; d++)
        if (c->n[d] && !c->failed)
            out->ceiling[d] = c->total / rounds_median(c->t[d], c->n[d], &out->spread) / 1e9;
    if (c->path[0])
        unlink(c->path);
    kvf__fileio_runner_destroy(c->io);
    free(c->ops);
    free(c->t[0]);
    free(c->t[1]);
    free(c->buf);
    memset(c, 0, sizeof *c);
}

/* TensorRT-LLM's POSIX algorithm, block by block on one thread: a fresh
 * zero-filled pageable buffer per block per pool, a synchronous copy
 * between it and the primary slot (cudaMemcpy on the GPU, as
 * TensorRT-LLM does), one open + write or read + close of block_<id>_pool_<p>.bin. Its writes stay
 * in the page cache (no fsync) and its reads find the blocks it just wrote there, so the read pass
 * is also timed cold: the files written back and dropped from the page cache first (untimed), as
 * blocks offloaded long before they are reused would be. */
static void file_per_block(kvf_engine *e, const char *dir, size_t block_bytes, uint32_t blocks,
                           uint32_t pools, uint32_t iters, dram_base *out)
{
    size_t total = block_bytes * blocks * pools;
    double *t = malloc(iters * sizeof *t);
    char path[4096];
    if (!t)
        return;
    /* d: 0 write, 1 read warm, 2 read cold */
    for (int d = 0; d < 3; d++) {
        for (uint32_t it = 0; it < iters; it++) {
            if (d == 2)
                for (uint32_t b = 0; b < blocks; b++)
                    for (uint32_t p = 0; p < pools; p++) {
                        snprintf(path, sizeof path, "%s/block_%u_pool_%u.bin", dir, b, p);
                        int fd = open(path, O_RDONLY);
                        if (fd < 0)
                            continue;
                        if (fdatasync(fd) != 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
                            perror("kvferry bench: per-block files: drop from page cache");
                        close(fd);
                    }
            double t0 = kvf_bench_now_s();
            for (uint32_t b = 0; b < blocks; b++)
                for (uint32_t p = 0; p < pools; p++) {
                    snprintf(path, sizeof path, "%s/block_%u_pool_%u.bin", dir, b, p);
                    uint8_t *host = calloc(1, block_bytes); /* TensorRT-LLM's std::vector */
                    int fd = open(path, d ? O_RDONLY : O_CREAT | O_WRONLY, 0664);
                    if (fd >= 0 && host) {
                        if (d) {
                            if (read(fd, host, block_bytes) < 0)
                                perror("kvferry bench: per-block files: read");
                            kvf_bench_slot_io(e, p, b, host, block_bytes, true);
                        } else {
                            kvf_bench_slot_io(e, p, b, host, block_bytes, false);
                            if (write(fd, host, block_bytes) < 0)
                                perror("kvferry bench: per-block files: write");
                        }
                    }
                    if (fd >= 0)
                        close(fd);
                    free(host);
                }
            t[it] = kvf_bench_now_s() - t0;
        }
        double gbs = total / rounds_median(t, iters, &out->spread) / 1e9;
        if (d < 2)
            out->per_block[d] = gbs;
        else
            out->per_block_cold = gbs;
    }
    for (uint32_t b = 0; b < blocks; b++)
        for (uint32_t p = 0; p < pools; p++) {
            snprintf(path, sizeof path, "%s/block_%u_pool_%u.bin", dir, b, p);
            unlink(path);
        }
    free(t);
}

/* ---- the run ------------------------------------------------------------- */

static void usage(void)
{
    printf("usage: kvferry bench [options]\n"
           "  --backend auto|host|cuda     default auto (cuda where a GPU is usable)\n"
           "  --mode dram|posix|gds|remote|contention\n"
           "                               dram: GPU<->host slots; posix/gds: files;\n"
           "                               remote: Redis (--mode remote --help);\n"
           "                               contention: onboard latency under offloads\n"
           "                               (--mode contention --help)\n"
           "%s"
           "  --pools N                    pools (tensors) per block, default 1\n"
           "  --blocks N                   blocks per round trip, default 512\n"
           "  --tokens N                   move only the first N tokens (0: whole blocks)\n"
           "  --iters N                    timed round trips, default 5 (median reported)\n"
           "  --threads N                  engine worker threads (0: default)\n"
           "  --dir DIR                    file-tier directory (default: a fresh temp dir)\n"
           "  --fsync none|batch|block     file durability, default batch (the library's)\n"
           "  --file-runner auto|uring|threads   what runs the file tier's calls\n"
           "  --queue-depth N              file calls in flight (0: the engine's default)\n"
           "  --seed N                     random data seed\n"
           "  --compare                    sweep 4 KiB..4 MiB blocks, whole and first 8 of 32\n"
           "                               tokens, each against the ceiling, a per-block\n"
           "                               copy and cudaMemcpyBatchAsync, then a summary table\n"
           "                               (--json: one JSON line per run); ~256 MiB a run,\n"
           "                               or --blocks N blocks\n"
           "  --plot FILE.png              with --compare: GB/s against block size, the\n"
           "                               ceiling drawn (bench/plot_compare.py, matplotlib)\n"
           "A byte read back wrong exits 1; --plot that cannot draw (no matplotlib) exits 3\n"
           "before the sweep runs.\n"
           "%s",
           kvf_cli_geometry_usage, kvf_cli_common_usage);
}

enum {
    OPT_MODE = 'm',
    OPT_POOLS = KVF_OPT_OWN,
    OPT_BLOCKS,
    OPT_TOKENS,
    OPT_ITERS,
    OPT_THREADS,
    OPT_DIR,
    OPT_FSYNC,
    OPT_SEED,
    OPT_COMPARE,
    OPT_PLOT,
    OPT_FILE_RUNNER,
    OPT_QUEUE_DEPTH,
};

static const struct option bench_options[] = {
    KVF_CLI_OPTS_COMMON,
    KVF_CLI_OPTS_BACKEND,
    KVF_CLI_OPTS_GEOMETRY,
    {"mode", required_argument, NULL, OPT_MODE},
    {"pools", required_argument, NULL, OPT_POOLS},
    {"blocks", required_argument, NULL, OPT_BLOCKS},
    {"tokens", required_argument, NULL, OPT_TOKENS},
    {"iters", required_argument, NULL, OPT_ITERS},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"dir", required_argument, NULL, OPT_DIR},
    {"fsync", required_argument, NULL, OPT_FSYNC},
    {"seed", required_argument, NULL, OPT_SEED},
    {"compare", no_argument, NULL, OPT_COMPARE},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"file-runner", required_argument, NULL, OPT_FILE_RUNNER},
    {"queue-depth", required_argument, NULL, OPT_QUEUE_DEPTH},
    KVF_CLI_OPTS_END,
};

/* One option's value into *o: 0, or -1 on a bad value (printed). */
static int bench_option(int c, const char *v, bench_opts *o)
{
    static const char *const modes[] = {"dram", "posix", "gds", "remote", "contention", NULL};
    static const char *const runners[] = {"auto", "uring", "threads", NULL}; /* kvf_file_runner's */
    uint64_t u;
    int choice, rc = 0;
    switch (c) {
    case KVF_OPT_JSON:
        o->json = v;
        break;
    case KVF_OPT_BACKEND:
        return kvf_cli_backend("bench", v, &o->backend);
    case OPT_MODE: /* remote and contention were routed to their files before */
        rc = kvf_cli_choice("bench", "mode", v, modes, &choice);
        o->mode = rc ? o->mode : (bench_mode)choice;
        break;
    case OPT_POOLS:
        rc = kvf_cli_number("bench", "pools", v, 1, 1024, &u);
        o->pools = (uint32_t)u;
        break;
    case OPT_BLOCKS:
        rc = kvf_cli_number("bench", "blocks", v, 1, UINT32_MAX, &u);
        o->blocks = (uint32_t)u;
        o->blocks_given = true;
        break;
    case OPT_TOKENS:
        return kvf_cli_u32("bench", "tokens", v, &o->tokens);
    case OPT_ITERS:
        rc = kvf_cli_number("bench", "iters", v, 1, 1000000, &u);
        o->iters = (uint32_t)u;
        break;
    case OPT_THREADS:
        return kvf_cli_u32("bench", "threads", v, &o->threads);
    case OPT_DIR:
        o->dir = v;
        break;
    case OPT_FSYNC:
        rc = kvf_cli_choice("bench", "fsync", v, kvf_cli_fsync_names, &choice);
        o->fsync = rc ? o->fsync : (kvf_fsync)choice;
        break;
    case OPT_SEED:
        return kvf_cli_u64("bench", "seed", v, &o->seed);
    case OPT_COMPARE:
        o->compare = true;
        break;
    case OPT_PLOT:
        o->plot = v;
        break;
    case OPT_FILE_RUNNER:
        rc = kvf_cli_choice("bench", "file-runner", v, runners, &choice);
        o->file_runner = rc ? o->file_runner : (kvf_file_runner)choice;
        break;
    case OPT_QUEUE_DEPTH:
        return kvf_cli_u32("bench", "queue-depth", v, &o->queue_depth);
    default:
        return kvf_cli_geometry_opt("bench", c, v, &o->g) == 1 ? 0 : -1;
    }
    return rc;
}

/* 0 parsed, 1 --help printed, -1 a usage error (printed). */
static int parse_args(int argc, char **argv, bench_opts *o)
{
    int c;
    optind = 0;
    while ((c = kvf_cli_getopt("bench", argc, argv, bench_options)) != -1) {
        if (c == 'h') {
            usage();
            return 1;
        }
        if (c == '?' || bench_option(c, optarg, o))
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "kvferry bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->plot && !o->compare) {
        fprintf(stderr, "kvferry bench: --plot draws --compare's sweep: add --compare\n");
        return -1;
    }
    return 0;
}

/* A row of GB/s, or of ratios to `base` when it is given; "-" where a
 * figure was not measured. */
static void print_row(const char *name, const double v[3], const double base[3])
{
    printf("  %-40s", name);
    for (int i = 0; i < 3; i++) {
        double d = base ? base[i] : 1;
        if (v[i] > 0 && d > 0)
            printf(base ? " %11.2fx" : " %7.2f GB/s", v[i] / d);
        else
            printf(" %12s", "-");
    }
    printf("\n");
}

static const char *mode_name(bench_mode m)
{
    return m == MODE_DRAM ? "dram" : m == MODE_POSIX ? "posix" : "gds";
}

/* Checks every primary slot against the original data: the moved region
 * must match, every other byte must still hold the poison. */
static long verify(kvf_engine *e, const bench_opts *o, const uint8_t *orig, size_t block_bytes,
                   uint8_t *scratch, uint8_t poison)
{
    kvf_region r;
    kvf_geometry_region(&o->g, o->tokens, &r);
    long bad = 0;
    for (uint32_t p = 0; p < o->pools; p++)
        for (uint32_t b = 0; b < o->blocks; b++) {
            if (kvf_bench_slot_io(e, p, b, scratch, block_bytes, false))
                return -1;
            const uint8_t *want = orig + ((size_t)p * o->blocks + b) * block_bytes;
            size_t row = 0;
            for (size_t off = 0; off < block_bytes; off++) {
                while (row < r.rows && off >= row * r.pitch + r.row_bytes)
                    row++;
                bool moved = row < r.rows && off >= row * r.pitch;
                uint8_t expect = moved ? want[off] : poison;
                if (scratch[off] != expect) {
                    if (bad < 5)
                        fprintf(stderr,
                                "kvferry bench: pool %u block %u byte %zu: 0x%02x, expected "
                                "0x%02x\n",
                                p, b, off, scratch[off], expect);
                    bad++;
                }
            }
        }
    return bad;
}

static int make_tmpdir(char *out, size_t cap)
{
    const char *base = getenv("TMPDIR");
    snprintf(out, cap, "%s/kvferry-bench-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(out) ? 0 : -1;
}

/* Removes the temporary directory the bench made: <dir>/<ns>/<files>. */
static void remove_bench_dir(const char *dir, const char *ns)
{
    char sub[4096], path[8192];
    snprintf(sub, sizeof sub, "%s/%s", dir, ns);
    DIR *d = opendir(sub);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", sub, de->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(sub);
    rmdir(dir);
}

static int bench_one(bench_opts o, bench_result *res);

/* bench/plot_compare.py, where the tool runs from a build directory of the
 * source tree (or $KVF_PLOT_SCRIPT); 0 when found. */
static int find_plot_script(char *out, size_t cap)
{
    const char *env = getenv("KVF_PLOT_SCRIPT");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return access(out, R_OK);
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    static const char *const tries[] = {"/../bench/plot_compare.py", "/../../bench/plot_compare.py",
                                        "/../share/kvferry/plot_compare.py"};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        snprintf(out, cap, "%s%s", exe, tries[i]);
        if (access(out, R_OK) == 0)
            return 0;
    }
    return -1;
}

/* Before --compare's sweep: whether --plot can draw when it ends (the
 * script found, python3 with matplotlib, the PNG writable); -1 said why. */
static int plot_ready(const char *png, char *script, size_t cap)
{
    if (find_plot_script(script, cap)) {
        fprintf(stderr, "kvferry bench: --plot: plot_compare.py not found beside this kvferry "
                        "(share/kvferry/ of its prefix, or bench/ of its source tree); set "
                        "KVF_PLOT_SCRIPT to its path\n");
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        execlp("python3", "python3", script, "--check", (char *)NULL);
        fprintf(stderr, "kvferry bench: --plot: python3: %s\n", strerror(errno));
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "kvferry bench: --plot: cannot draw (above: why); nothing was run\n");
        return -1;
    }
    int fd = open(png, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0 && errno == EEXIST)
        fd = open(png, O_WRONLY);
    else if (fd >= 0)
        unlink(png); /* made only to know it can be */
    if (fd < 0) {
        fprintf(stderr, "kvferry bench: --plot: %s: %s; nothing was run\n", png, strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

/* --plot: the sweep's figures as JSON lines (the fields of --json's lines
 * that the plot reads) in a temporary file, drawn by plot_compare.py. */
static int plot_compare(const bench_result *res, int n, const char *png, const char *script)
{
    char data[] = "/tmp/kvferry-compare-XXXXXX";
    int fd = mkstemp(data);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "kvferry bench: --plot: %s: %s\n", data, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    static const char *const dirs[] = {"offload_gbs", "onboard_gbs", "both_gbs"};
    for (int k = 0; k < n; k++) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "block_bytes", (double)res[k].block_bytes);
        cJSON_AddNumberToObject(j, "tokens", res[k].tokens);
        cJSON_AddNumberToObject(j, "tokens_per_block", 32);
        const double *rows[] = {res[k].mine, res[k].ceiling, res[k].per_block, res[k].batch};
        static const char *const names[] = {NULL, "ceiling", "per_block", "batch"};
        for (int r = 0; r < 4; r++) {
            cJSON *o = names[r] ? cJSON_AddObjectToObject(j, names[r]) : j;
            for (int d = 0; d < 3; d++)
                cJSON_AddNumberToObject(o, dirs[d], rows[r][d]);
        }
        char *text = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        if (text)
            fprintf(f, "%s\n", text);
        free(text);
    }
    int bad = ferror(f) | fclose(f);
    int rc = -1;
    if (bad) {
        fprintf(stderr, "kvferry bench: --plot: %s: a write failed\n", data);
    } else {
        pid_t pid = fork();
        if (pid == 0) {
            execlp("python3", "python3", script, data, png, (char *)NULL);
            fprintf(stderr, "kvferry bench: --plot: python3: %s\n", strerror(errno));
            _exit(127);
        }
        int status = 0;
        if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
            WEXITSTATUS(status) == 0) {
            printf("kvferry bench: plot written to %s\n", png);
            rc = 0;
        } else {
            fprintf(stderr,
                    "kvferry bench: --plot: %s did not draw %s (above: why); the sweep's "
                    "figures are kept in %s\n",
                    script, png, data);
            return -1;
        }
    }
    unlink(data);
    return rc;
}

/* A figure of the summary, "-" where it was not measured (no
 * cudaMemcpyBatchAsync without a GPU, no ceiling for both directions at
 * once on the host). */
static void cell(double v, const char *fmt, int width)
{
    if (v > 0)
        printf(fmt, width, v);
    else
        printf(" %*s", width, "-");
}

/* --compare's summary: a column only where some run measured it. */
static void print_compare_table(const bench_result *res, int n)
{
    bool batch = false;
    int wide = 0;
    for (int k = 0; k < n; k++) {
        batch |= res[k].batch[0] > 0;
        wide += res[k].spread > KVF_BENCH_WIDE_SPREAD;
    }
    printf("\nkvferry bench --compare: GB/s of useful bytes; x = kvferry's ratio; blk: one copy "
           "call per block\n");
    printf("%-8s %-5s %-6s %7s %7s", "block", "part", "dir", "ceiling", "blk");
    if (batch)
        printf(" %7s", "batch");
    printf(" %7s  %6s %6s", "kvferry", "x ceil", "x blk");
    if (batch)
        printf(" %6s", "x bat");
    printf(" %6s\n", "spread");
    static const char *const dirs[] = {"d2h", "h2d", "both"};
    for (int k = 0; k < n; k++)
        for (int d = 0; d < 3; d++) {
            const bench_result *b = &res[k];
            printf("%5zuKiB %-5s %-6s", b->block_bytes / 1024, b->tokens ? "8/32" : "whole",
                   dirs[d]);
            cell(b->ceiling[d], " %*.1f", 7);
            cell(b->per_block[d], " %*.1f", 7);
            if (batch)
                cell(b->batch[d], " %*.1f", 7);
            cell(b->mine[d], " %*.1f", 7);
            printf(" ");
            cell(b->ceiling[d] > 0 ? b->mine[d] / b->ceiling[d] : 0, " %*.2f", 6);
            cell(b->per_block[d] > 0 ? b->mine[d] / b->per_block[d] : 0, " %*.2f", 6);
            if (batch)
                cell(b->batch[d] > 0 ? b->mine[d] / b->batch[d] : 0, " %*.2f", 6);
            if (b->spread >= 0)
                printf(" %5.0f%%\n", b->spread * 100);
            else
                printf(" %6s\n", "-");
        }
    if (wide)
        printf("WARNING: %d of %d runs had rounds more than %.0f %% apart (spread): their ratios "
               "are not to be trusted; rerun on an idle machine, or with more --iters\n",
               wide, n, KVF_BENCH_WIDE_SPREAD * 100);
}

/* --compare: the same run over block sizes from 4 KiB to 4 MiB
 * ([1][2][1][32][head] fp16 blocks), whole and partial, ~256 MiB each
 * (--blocks N: N blocks each). */
static int bench_compare(bench_opts o)
{
    static const uint32_t heads[] = {32, 128, 512, 2048, 8192, 32768};
    enum { N = sizeof heads / sizeof heads[0] };
    bench_result res[2 * N];
    memset(res, 0, sizeof res);
    char script[4096];
    if (o.plot && plot_ready(o.plot, script, sizeof script))
        return KVF_CLI_MISSING;
    int rc = 0;
    for (int partial = 0; partial < 2; partial++)
        for (int i = 0; i < N; i++) {
            bench_opts r = o;
            r.g = (kvf_geometry){1, 2, 1, 32, heads[i], KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
            r.pools = 1;
            r.tokens = partial ? 8 : 0;
            size_t bytes = (size_t)128 * heads[i];
            size_t blocks = (256u << 20) / bytes;
            r.blocks = o.blocks_given ? o.blocks
                                      : (uint32_t)(blocks > 65536 ? 65536
                                                   : blocks < 64  ? 64
                                                                  : blocks);
            if (bench_one(r, &res[partial * N + i]))
                rc = 1;
        }
    print_compare_table(res, 2 * N);
    if (o.plot && plot_compare(res, 2 * N, o.plot, script))
        rc = 1;
    return rc;
}

int kvf_cli_bench(int argc, char **argv)
{
    bench_opts o = {
        .backend = KVF_BACKEND_AUTO,
        .mode = MODE_DRAM,
        .g = KVF_CLI_GEOMETRY_DEFAULT,
        .pools = 1,
        .blocks = 512,
        .tokens = 0,
        .iters = 5,
        .fsync = KVF_CLI_FSYNC_DEFAULT,
        .seed = 0x9e3779b97f4a7c15ull,
    };
    for (int i = 1; i < argc; i++) {
        const char *m = !strcmp(argv[i], "--mode") && i + 1 < argc ? argv[i + 1]
                        : !strncmp(argv[i], "--mode=", 7)          ? argv[i] + 7
                                                                   : "";
        if (!strcmp(m, "remote"))
            return kvf_cli_bench_remote(argc, argv);
        if (!strcmp(m, "contention"))
            return kvf_cli_bench_contend(argc, argv);
    }
    int parsed = parse_args(argc, argv, &o);
    if (parsed)
        return parsed > 0 ? 0 : kvf_cli_usage_error("bench");
    if (kvf_cli_json_open("bench", o.json))
        return KVF_CLI_FAILED;
    int rc = o.compare ? bench_compare(o) : bench_one(o, NULL);
    fflush(stdout);
    if (kvf_cli_json_close("bench") && rc == 0)
        rc = KVF_CLI_FAILED;
    return rc;
}

/* One configuration: round trips, both directions at once, baselines,
 * verification; the table on stdout, `res` filled when given. */
static int bench_one(bench_opts o, bench_result *res)
{
    bool json_failed = false;
    size_t block_bytes;
    kvf_region region;
    if (kvf_geometry_block_bytes(&o.g, &block_bytes) != KVF_OK ||
        kvf_geometry_region(&o.g, o.tokens, &region) != KVF_OK) {
        fprintf(stderr, "kvferry bench: %s\n", kvf_last_error());
        return 2;
    }
    size_t useful = kvf__region_bytes(&region) * o.pools * o.blocks;

    char tmpdir[4096] = "";
    const char *dir = o.dir;
    if (o.mode != MODE_DRAM && !dir) {
        if (make_tmpdir(tmpdir, sizeof tmpdir)) {
            fprintf(stderr, "kvferry bench: cannot create a temporary directory: %s\n",
                    strerror(errno));
            return 1;
        }
        dir = tmpdir;
    }

    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = o.backend;
    cfg.threads = o.threads;
    cfg.file = (kvf_engine_file_config){
        .dir = o.mode == MODE_DRAM ? NULL : dir,
        .namespace_ = "bench",
        .io = o.mode == MODE_GDS ? KVF_FILE_IO_GDS : KVF_FILE_IO_POSIX,
        .fsync = o.fsync,
        .runner = o.file_runner,
        .queue_depth = o.queue_depth,
    };
    kvf_engine *e;
    kvf_status created = kvf_engine_create(&cfg, &e);
    if (created != KVF_OK) {
        fprintf(stderr, "kvferry bench: engine: %s\n", kvf_last_error());
        return kvf_cli_create_exit(created);
    }
    bool gpu = kvf_bench_on_gpu(e);
    int rc = 1;
    uint8_t *orig = NULL, *scratch = NULL, *poison_buf = NULL, *poison_all = NULL;
    uint32_t *perm = NULL;
    kvf_move *off_moves = NULL, *on_moves = NULL;
    double *t_off = NULL, *t_on = NULL, *t_both = NULL;
    double submit_us = 0; /* host time in kvf_offload per block, best run */
    bool files = o.mode != MODE_DRAM;
    file_ceiling fc;
    memset(&fc, 0, sizeof fc);

    for (uint32_t p = 0; p < o.pools; p++) {
        kvf_pool_desc prim = {gpu ? KVF_MEMORY_DEVICE : KVF_MEMORY_HOST, NULL, 0, o.blocks};
        kvf_pool_desc sec = {gpu ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST, NULL, 0, o.blocks};
        if (kvf_engine_add_pool(e, &o.g, &prim, o.mode == MODE_DRAM ? &sec : NULL, NULL) !=
            KVF_OK) {
            fprintf(stderr, "kvferry bench: %s\n", kvf_last_error());
            goto out;
        }
    }
    size_t total = block_bytes * o.pools * o.blocks;
    orig = malloc(total);
    scratch = malloc(block_bytes);
    poison_buf = malloc(block_bytes);
    poison_all = malloc(block_bytes * o.blocks);
    perm = malloc(o.blocks * sizeof *perm);
    off_moves = malloc(o.blocks * sizeof *off_moves);
    on_moves = malloc(o.blocks * sizeof *on_moves);
    t_off = malloc(o.iters * sizeof *t_off);
    t_on = malloc(o.iters * sizeof *t_on);
    t_both = malloc(o.iters * sizeof *t_both);
    if (!orig || !scratch || !poison_buf || !poison_all || !perm || !off_moves || !on_moves ||
        !t_off || !t_on || !t_both) {
        fprintf(stderr, "kvferry bench: out of memory for %zu bytes of test data\n", total);
        goto out;
    }
    uint64_t seed = o.seed ? o.seed : 1;
    kvf_bench_fill_random(orig, total, &seed);
    const uint8_t poison = 0xA5;
    memset(poison_buf, poison, block_bytes);
    memset(poison_all, poison, block_bytes * o.blocks);
    /* scattered order: block i goes to slot (or key) perm[i]. The two
     * halves of the blocks trade places, each shuffled within: blocks
     * [0, half) go to slots [blocks - half, blocks), the others to [0,
     * blocks - half). "Both at once" below moves the first half down and
     * the second up, so each direction covers one dense set of slots in
     * scattered order, as the baselines' halves do (a random half of the
     * slots would leave every run of slots with holes, a different and
     * harder pattern than the baselines'). */
    uint32_t lo = o.blocks / 2;
    for (uint32_t i = 0; i < o.blocks; i++)
        perm[i] = i < lo ? o.blocks - lo + i : i - lo;
    for (int h = 0; h < 2; h++) {
        uint32_t first = h ? lo : 0, n = h ? o.blocks - lo : lo;
        for (uint32_t i = n; i > 1; i--) {
            uint32_t j = (uint32_t)((seed = seed * 6364136223846793005ull + 1) >> 33) % i;
            uint32_t tmp = perm[first + i - 1];
            perm[first + i - 1] = perm[first + j];
            perm[first + j] = tmp;
        }
    }
    /* DRAM: secondary slots perm[i]; files: keys, named by perm[i] */
    for (uint32_t i = 0; i < o.blocks; i++) {
        if (o.mode == MODE_DRAM) {
            off_moves[i] = (kvf_move){.src = i, .dst = perm[i], .tokens = o.tokens};
            on_moves[i] = (kvf_move){.src = perm[i], .dst = i, .tokens = o.tokens};
        } else {
            kvf_key key = {0x6b7666, perm[i] + 1u};
            off_moves[i] = (kvf_move){.src = i, .tokens = o.tokens, .key = key};
            on_moves[i] = (kvf_move){.dst = i, .tokens = o.tokens, .key = key};
        }
    }
    kvf_tier tier = o.mode == MODE_DRAM ? KVF_TIER_HOST : KVF_TIER_DISK;
    if (files && ceiling_open(&fc, dir, useful / o.blocks, perm, &o) != 0)
        fprintf(stderr, "kvferry bench: the disk ceiling could not be measured\n");
    bool tty = isatty(2);
    for (uint32_t it = 0; it < o.iters; it++) {
        if (tty)
            fprintf(stderr, "\rkvferry bench: round trip %u/%u", it + 1, o.iters);
        for (uint32_t p = 0; p < o.pools; p++)
            if (pool_io(e, p, o.blocks, orig + (size_t)p * o.blocks * block_bytes, block_bytes,
                        true))
                goto out;
        kvf_ticket t;
        double t0 = kvf_bench_now_s();
        kvf_status st = kvf_offload(e, tier, off_moves, o.blocks, &t);
        double submitted = kvf_bench_now_s() - t0;
        if (submit_us == 0 || submitted * 1e6 / o.blocks < submit_us)
            submit_us = submitted * 1e6 / o.blocks;
        if (st == KVF_OK)
            st = kvf_wait(e, t, NULL);
        t_off[it] = kvf_bench_now_s() - t0;
        if (files)
            ceiling_pass(&fc, 0, true);
        if (st != KVF_OK) {
            fprintf(stderr, "\nkvferry bench: offload failed: %s\n", kvf_last_error());
            goto out;
        }
        /* poison the primary slots so an onboard that moves nothing fails
         * verification instead of finding the old bytes in place */
        for (uint32_t p = 0; p < o.pools; p++)
            if (pool_io(e, p, o.blocks, poison_all, block_bytes, true))
                goto out;
        t0 = kvf_bench_now_s();
        st = kvf_onboard(e, tier, on_moves, o.blocks, &t);
        if (st == KVF_OK)
            st = kvf_wait(e, t, NULL);
        t_on[it] = kvf_bench_now_s() - t0;
        if (files)
            ceiling_pass(&fc, 1, true);
        if (st != KVF_OK) {
            fprintf(stderr, "\nkvferry bench: onboard failed: %s\n", kvf_last_error());
            goto out;
        }
    }
    /* both directions at once: the first half of the blocks goes down
     * while the second half comes back up, on disjoint slots */
    uint32_t half = o.blocks / 2;
    double both_gbs = 0;
    if (half) {
        for (uint32_t it = 0; it < o.iters; it++) {
            for (uint32_t p = 0; p < o.pools; p++)
                if (kvf_bench_slot_io(e, p, half, poison_all, block_bytes * (o.blocks - half),
                                      true))
                    goto out;
            kvf_ticket t1, t2;
            double t0 = kvf_bench_now_s();
            kvf_status st = kvf_offload(e, tier, off_moves, half, &t1);
            kvf_status st2 = kvf_onboard(e, tier, on_moves + half, o.blocks - half, &t2);
            if (st == KVF_OK)
                st = kvf_wait(e, t1, NULL);
            if (st2 == KVF_OK)
                st2 = kvf_wait(e, t2, NULL);
            t_both[it] = kvf_bench_now_s() - t0;
            if (st != KVF_OK || st2 != KVF_OK) {
                fprintf(stderr, "\nkvferry bench: both directions: %s\n", kvf_last_error());
                goto out;
            }
        }
    }
    if (tty)
        fprintf(stderr, "\r%40s\r", "");
    long bad = verify(e, &o, orig, block_bytes, scratch, poison);
    double spread = 0;
    double off_gbs = useful / rounds_median(t_off, o.iters, &spread) / 1e9;
    double on_gbs = useful / rounds_median(t_on, o.iters, &spread) / 1e9;
    if (half)
        both_gbs = useful / rounds_median(t_both, o.iters, &spread) / 1e9;

    dram_base base;
    memset(&base, 0, sizeof base);
    const char *ceiling_name, *ref_name;
    if (o.mode == MODE_DRAM) {
        /* the baselines treat the pools of a block as one larger block */
        kvf_region all = region;
        if (all.rows == 1)
            all.row_bytes = all.pitch = block_bytes * o.pools;
        else
            all.rows *= o.pools;
#ifdef KVF_HAVE_CUDA
        if (gpu)
            cuda_dram_baselines(block_bytes * o.pools, &all, o.blocks, perm, o.iters, &base);
        else
#endif
            host_dram_baselines(block_bytes * o.pools, &all, o.blocks, perm, o.iters, &base);
        ceiling_name = gpu ? "one large pinned copy" : "one large memcpy";
        ref_name = gpu ? (o.tokens ? "per-block copy (cudaMemcpy2DAsync)"
                                   : "per-block copy (cudaMemcpyAsync)")
                       : "per-block copy (memcpy, 1 thread)";
    } else {
        ceiling_close(&fc, &base);
        file_per_block(e, dir, block_bytes, o.blocks, o.pools, o.iters, &base);
        ceiling_name = "raw disk: O_DIRECT, same queue depth";
        ref_name = "per-block files, 1 thread (page cache)";
    }

    char h1[32], h2[32];
    printf("kvferry bench: %s backend, mode %s, %u pool(s) x %u blocks of %s "
           "(%s, %ux%ux%ux%ux%u %s), %s, median of %u\n",
           kvf_backend_name(kvf_engine_backend(e)), mode_name(o.mode), o.pools, o.blocks,
           kvf_cli_bytes(block_bytes, h1), kvf_dtype_name(o.g.dtype), o.g.layers, o.g.kv_factor,
           o.g.kv_heads, o.g.tokens_per_block, o.g.head_size,
           o.g.order == KVF_ORDER_HEAD_MAJOR ? "head-major" : "token-major",
           o.tokens ? "partial" : "whole blocks", o.iters);
    if (o.mode != MODE_DRAM)
        printf("  files: %s path, %s, fsync %s\n",
               kvf__engine_gds(e) ? "GDS (cuFile into device staging)"
               : gpu              ? "POSIX (pinned host staging)"
                                  : "POSIX (host staging)",
               file_runner_used,
               o.fsync == KVF_FSYNC_NONE    ? "none"
               : o.fsync == KVF_FSYNC_BATCH ? "per batch"
                                            : "per block");
    if (o.tokens)
        printf("  first %u of %u tokens: %s useful per block per pool in %zu rows\n", o.tokens,
               o.g.tokens_per_block, kvf_cli_bytes(kvf__region_bytes(&region), h2), region.rows);
    double mine[3] = {off_gbs, on_gbs, both_gbs};
    printf("  %-40s %12s %12s %12s\n", "GB/s", "offload", "onboard", "both at once");
    print_row(ceiling_name, base.ceiling, NULL);
    if (base.ceiling_host[0] > 0)
        print_row("  the same, timed on the host", base.ceiling_host, NULL);
    print_row(ref_name, base.per_block, NULL);
    const double cold[3] = {0, base.per_block_cold, 0};
    if (base.per_block_cold > 0)
        print_row("per-block files, read from the disk", cold, NULL);
    if (base.batch[0] > 0)
        print_row("cudaMemcpyBatchAsync", base.batch, NULL);
    print_row("kvferry", mine, NULL);
    print_row("kvferry / ceiling", mine, base.ceiling);
    if (base.ceiling_host[0] > 0)
        print_row("kvferry / ceiling timed on the host", mine, base.ceiling_host);
    print_row(files ? "kvferry / per-block files" : "kvferry / per-block copy", mine,
              base.per_block);
    if (base.per_block_cold > 0)
        print_row("kvferry / per-block read from the disk", mine, cold);
    if (base.batch[0] > 0)
        print_row("kvferry / cudaMemcpyBatchAsync", mine, base.batch);
    printf("  host time to submit: %.3f us per block (kvf_offload of %u blocks)\n", submit_us,
           o.blocks);
    printf("  verified: %s (%s per direction per round trip)\n", bad == 0 ? "every byte" : "FAILED",
           kvf_cli_bytes(useful, h2));
    if (base.spread > spread)
        spread = base.spread;
    cJSON *j = o.json ? cJSON_CreateObject() : NULL;
    kvf_bench_report_spread(spread, o.iters, j);
    if (res) {
        res->block_bytes = block_bytes;
        res->tokens = o.tokens;
        memcpy(res->mine, mine, sizeof mine);
        memcpy(res->ceiling, base.ceiling, sizeof base.ceiling);
        memcpy(res->per_block, base.per_block, sizeof base.per_block);
        memcpy(res->batch, base.batch, sizeof base.batch);
        res->spread = o.iters >= KVF_BENCH_MIN_ROUNDS ? spread : -1;
    }
    if (j) {
        cJSON_AddStringToObject(j, "backend", kvf_backend_name(kvf_engine_backend(e)));
        cJSON_AddStringToObject(j, "mode", mode_name(o.mode));
        cJSON_AddNumberToObject(j, "pools", o.pools);
        cJSON_AddNumberToObject(j, "blocks", o.blocks);
        cJSON_AddNumberToObject(j, "block_bytes", (double)block_bytes);
        cJSON_AddNumberToObject(j, "tokens", o.tokens);
        cJSON_AddNumberToObject(j, "tokens_per_block", o.g.tokens_per_block);
        cJSON_AddStringToObject(j, "dtype", kvf_dtype_name(o.g.dtype));
        cJSON_AddNumberToObject(j, "iters", o.iters);
        cJSON_AddNumberToObject(j, "useful_bytes", (double)useful);
        cJSON_AddNumberToObject(j, "offload_gbs", off_gbs);
        cJSON_AddNumberToObject(j, "onboard_gbs", on_gbs);
        cJSON_AddNumberToObject(j, "both_gbs", both_gbs);
        static const char *const dirs[] = {"offload_gbs", "onboard_gbs", "both_gbs"};
        const double *rows[] = {base.batch, base.ceiling, base.per_block};
        static const char *const row_names[] = {"batch", "ceiling", "per_block"};
        const char *whats[] = {"cudaMemcpyBatchAsync", ceiling_name, ref_name};
        for (int k = 0; k < 3; k++) {
            cJSON *row = cJSON_AddObjectToObject(j, row_names[k]);
            cJSON_AddStringToObject(row, "what", whats[k]);
            for (int d = 0; d < 3; d++)
                cJSON_AddNumberToObject(row, dirs[d], rows[k][d]);
        }
        cJSON_AddNumberToObject(cJSON_GetObjectItem(j, "per_block"), "onboard_cold_gbs",
                                base.per_block_cold);
        if (base.ceiling_host[0] > 0) {
            /* timed as kvferry is: host wall from the call to the sync */
            cJSON *row = cJSON_AddObjectToObject(j, "ceiling_host");
            for (int d = 0; d < 3; d++)
                cJSON_AddNumberToObject(row, dirs[d], base.ceiling_host[d]);
        }
        cJSON_AddNumberToObject(j, "submit_us_per_block", submit_us);
        cJSON_AddBoolToObject(j, "verified", bad == 0);
        cJSON_AddNumberToObject(j, "bad_bytes", (double)bad);
        if (kvf_cli_json_emit("bench", j))
            json_failed = true;
    }
    rc = bad == 0 ? (json_failed ? 1 : 0) : 1;
out:
    ceiling_close(&fc, NULL);
    kvf_engine_destroy(e);
    if (tmpdir[0])
        remove_bench_dir(tmpdir, "bench");
    free(orig);
    free(scratch);
    free(poison_buf);
    free(poison_all);
    free(perm);
    free(off_moves);
    free(on_moves);
    free(t_off);
    free(t_on);
    free(t_both);
    return rc;
}
