/* SPDX-License-Identifier: Apache-2.0 */
/*
 * latency: where the host time of a batch goes, from submit to the moment
 * the caller learns it is done. For scattered blocks of 4 KiB .. 4 MiB
 * (256 MiB a run), each way, median of the timed runs:
 *   gpu     cudaMemcpyBatchAsync of the blocks, timed with CUDA events
 *   sync    the same call, host clock to cudaStreamSynchronize's return
 *   hostfn  the same call, then cudaLaunchHostFunc signalling a condition
 *           variable the caller waits on (what a callback costs)
 *   backend kvferry's CUDA backend alone (copy_async, its done callback
 *           signalling the caller), copy mode AUTO
 *   engine  kvf_offload / kvf_onboard + kvf_wait (AUTO), and the part of it
 *           spent in the submit call
 *   be128sm the backend alone with its gather/scatter kernel on 128 SMs
 * Every figure is GB/s of the bytes moved; then the host time each adds
 * over `gpu`, in microseconds a batch, and the time spent in the backend's
 * and the engine's submit calls (be-sub, en-sub). Destinations are
 * checked once per method after the timed runs.
 *
 * Usage: latency [reps] (default 9).
 */
#include "backend.h"

#include "bench_cuda.h"
#include "bench_stats.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUN_BYTES ((size_t)256 << 20)

#define KV(expr)                                                                                   \
    do {                                                                                           \
        if ((expr) != KVF_OK) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, kvf_last_error());       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* a one-shot signal from a callback to the waiting caller */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_flag;

static void signal_done(void)
{
    pthread_mutex_lock(&g_mu);
    g_flag = 1;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
}
static void wait_done(void)
{
    pthread_mutex_lock(&g_mu);
    while (!g_flag)
        pthread_cond_wait(&g_cv, &g_mu);
    g_flag = 0;
    pthread_mutex_unlock(&g_mu);
}
static void CUDART_CB hostfn(void *arg)
{
    (void)arg;
    signal_done();
}
static void backend_done(void *arg, kvf_status st)
{
    (void)arg;
    if (st != KVF_OK)
        fprintf(stderr, "backend batch failed: %s\n", kvf_status_str(st));
    signal_done();
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 8) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t v = seed ^ (seed >> 29);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1)
        reps = 9;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "latency: no CUDA device\n");
        return 77;
    }
    static const size_t sizes[] = {4096, 16384, 65536, 262144, 1 << 20, 4 << 20};
    printf("%-8s %-4s %8s %8s %8s %8s %8s %8s %8s | %7s %7s %7s %7s %7s %7s %s\n", "block", "dir",
           "gpu", "sync", "hostfn", "backend", "engine", "be128sm", "ceil", "+sync", "+hostfn",
           "+backnd", "+engine", "be-sub", "en-sub", "check");
    uint8_t *img = malloc(RUN_BYTES), *back = malloc(RUN_BYTES);
    if (!img || !back)
        return 1;
    fill(img, RUN_BYTES, 7);

    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t bs = sizes[si], n = RUN_BYTES / bs;
        /* the engine: one pool of n blocks; its memory is the benchmark's */
        kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
        cfg.backend = KVF_BACKEND_CUDA;
        kvf_engine *e;
        KV(kvf_engine_create(&cfg, &e));
        kvf_geometry g = {
            1, 2, 1, 32, (uint32_t)(bs / 2 / 32 / 2), KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
        kvf_pool_desc prim = {KVF_MEMORY_DEVICE, NULL, 0, (uint32_t)n};
        kvf_pool_desc sec = {KVF_MEMORY_HOST_PINNED, NULL, 0, (uint32_t)n};
        uint32_t pool;
        KV(kvf_engine_add_pool(e, &g, &prim, &sec, &pool));
        void *dev, *host;
        KV(kvf_engine_slot_ptr(e, pool, KVF_LEVEL_PRIMARY, 0, &dev));
        KV(kvf_engine_slot_ptr(e, pool, KVF_LEVEL_SECONDARY, 0, &host));
        /* a backend of our own, over memory of its own (so that it knows
         * the pinned range, as the engine's backend knows its slots) */
        kvf__backend *be, *be128;
        KV(kvf__cuda_backend_create(&cfg, &be));
        kvf_engine_config cfg128 = cfg;
        cfg128.cuda.copy_sms = 128;
        KV(kvf__cuda_backend_create(&cfg128, &be128));
        void *bdev, *bhost;
        KV(be->ops->mem_alloc(be, KVF_MEMORY_DEVICE, RUN_BYTES, &bdev));
        KV(be->ops->mem_alloc(be, KVF_MEMORY_HOST_PINNED, RUN_BYTES, &bhost));

        uint32_t *perm = malloc(n * sizeof *perm);
        kvf_move *off = malloc(n * sizeof *off), *on = malloc(n * sizeof *on);
        kvf__copy *cd2h = malloc(n * sizeof *cd2h), *ch2d = malloc(n * sizeof *ch2d);
        kvf__copy *bd2h = malloc(n * sizeof *bd2h), *bh2d = malloc(n * sizeof *bh2d);
        void **dsts = malloc(n * sizeof *dsts), **srcs = malloc(n * sizeof *srcs);
        size_t *lens = malloc(n * sizeof *lens);
        uint64_t s = 99;
        for (size_t i = 0; i < n; i++)
            perm[i] = (uint32_t)i;
        for (size_t i = n - 1; i > 0; i--) {
            s = s * 6364136223846793005ull + 1;
            size_t j = (size_t)(s >> 33) % (i + 1);
            uint32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (size_t i = 0; i < n; i++) {
            off[i] = (kvf_move){.src = i, .dst = perm[i]};
            on[i] = (kvf_move){.src = perm[i], .dst = i};
            uint8_t *d = (uint8_t *)dev + i * bs, *h = (uint8_t *)host + (size_t)perm[i] * bs;
            cd2h[i] = (kvf__copy){h, d, bs, 1, bs, bs};
            ch2d[i] = (kvf__copy){d, h, bs, 1, bs, bs};
            uint8_t *bd = (uint8_t *)bdev + i * bs, *bh = (uint8_t *)bhost + (size_t)perm[i] * bs;
            bd2h[i] = (kvf__copy){bh, bd, bs, 1, bs, bs};
            bh2d[i] = (kvf__copy){bd, bh, bs, 1, bs, bs};
        }
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        double *t = malloc((size_t)reps * sizeof *t), *tsub = malloc((size_t)reps * sizeof *tsub);
        double ceil_gbs[2];

        for (int dir = 0; dir < 2; dir++) { /* 0: d2h (offload), 1: h2d */
            const kvf__copy *cp = dir == 0 ? cd2h : ch2d;
            double med[7], sub = 0, bsub = 0;
            for (size_t i = 0; i < n; i++) {
                dsts[i] = cp[i].dst;
                srcs[i] = (void *)cp[i].src;
                lens[i] = bs;
            }
            struct cudaMemcpyAttributes attr;
            memset(&attr, 0, sizeof attr);
            attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            size_t ai = 0;
            for (int m = 0; m < 7; m++) {
                /* the source holds the image, the destination poison */
                uint8_t *src = dir == 0 ? dev : host, *dst = dir == 0 ? host : dev;
                if (m == 4 || m == 6) {
                    src = dir == 0 ? bdev : bhost;
                    dst = dir == 0 ? bhost : bdev;
                }
                CK(cudaMemcpy(src, img, RUN_BYTES, cudaMemcpyDefault));
                CK(cudaMemset(dst, 0xA5, RUN_BYTES));
                for (int r = -1; r < reps; r++) {
                    double t0 = bench_now_us(), t1 = t0;
                    switch (m) {
                    case 0: /* ceiling: one contiguous copy, events */
                    case 1: /* gpu: the batch, events */
                        CK(cudaEventRecord(e0, st));
                        if (m == 0)
                            CK(cudaMemcpyAsync(dst, src, RUN_BYTES, cudaMemcpyDefault, st));
                        else
                            CK(cudaMemcpyBatchAsync((void **)dsts, (const void **)srcs, lens, n,
                                                    &attr, &ai, 1, st));
                        CK(cudaEventRecord(e1, st));
                        CK(cudaEventSynchronize(e1));
                        {
                            float ms;
                            CK(cudaEventElapsedTime(&ms, e0, e1));
                            t1 = t0 + ms * 1e3;
                        }
                        break;
                    case 2: /* sync */
                        CK(cudaMemcpyBatchAsync((void **)dsts, (const void **)srcs, lens, n, &attr,
                                                &ai, 1, st));
                        CK(cudaStreamSynchronize(st));
                        t1 = bench_now_us();
                        break;
                    case 3: /* hostfn */
                        CK(cudaMemcpyBatchAsync((void **)dsts, (const void **)srcs, lens, n, &attr,
                                                &ai, 1, st));
                        CK(cudaLaunchHostFunc(st, hostfn, NULL));
                        wait_done();
                        t1 = bench_now_us();
                        break;
                    case 4:   /* backend */
                    case 6: { /* backend, the gather kernel on 128 SMs */
                        kvf__backend *bb = m == 4 ? be : be128;
                        KV(bb->ops->copy_async(bb, dir == 0 ? KVF_QUEUE_OFFLOAD : KVF_QUEUE_ONBOARD,
                                               dir == 0 ? bd2h : bh2d, n, 0, backend_done, NULL));
                        if (r >= 0 && m == 4)
                            tsub[r] = bench_now_us() - t0;
                        wait_done();
                        t1 = bench_now_us();
                        break;
                    }
                    case 5: { /* engine */
                        kvf_ticket tk;
                        if (dir == 0)
                            KV(kvf_offload(e, KVF_TIER_HOST, off, n, &tk));
                        else
                            KV(kvf_onboard(e, KVF_TIER_HOST, on, n, &tk));
                        double ts = bench_now_us();
                        KV(kvf_wait(e, tk, NULL));
                        t1 = bench_now_us();
                        if (r >= 0)
                            tsub[r] = ts - t0;
                        break;
                    }
                    }
                    if (r >= 0)
                        t[r] = t1 - t0;
                }
                double mt = median(t, reps);
                if (m == 0)
                    ceil_gbs[dir] = RUN_BYTES / mt / 1e3;
                else
                    med[m - 1] = mt;
                if (m == 5)
                    sub = median(tsub, reps);
                if (m == 4)
                    bsub = median(tsub, reps);
                /* check the destination once a method */
                if (m >= 1) {
                    CK(cudaMemcpy(back, dst, RUN_BYTES, cudaMemcpyDefault));
                    const uint8_t *want_base = img;
                    for (size_t i = 0; i < n; i++) {
                        size_t di = dir == 0 ? perm[i] : i, si2 = dir == 0 ? i : perm[i];
                        if (memcmp(back + di * bs, want_base + si2 * bs, bs) != 0) {
                            fprintf(stderr, "latency: block %zu wrong after method %d\n", i, m);
                            return 1;
                        }
                    }
                }
            }
            char name[24];
            snprintf(name, sizeof name, "%zuK", bs >> 10);
            printf("%-8s %-4s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | %7.0f %7.0f %7.0f "
                   "%7.0f %7.0f %7.0f ok\n",
                   name, dir == 0 ? "d2h" : "h2d", RUN_BYTES / med[0] / 1e3,
                   RUN_BYTES / med[1] / 1e3, RUN_BYTES / med[2] / 1e3, RUN_BYTES / med[3] / 1e3,
                   RUN_BYTES / med[4] / 1e3, RUN_BYTES / med[5] / 1e3, ceil_gbs[dir],
                   med[1] - med[0], med[2] - med[0], med[3] - med[0], med[4] - med[0], bsub, sub);
            fflush(stdout);
        }
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        CK(cudaStreamDestroy(st));
        be->ops->mem_free(be, KVF_MEMORY_DEVICE, bdev);
        be->ops->mem_free(be, KVF_MEMORY_HOST_PINNED, bhost);
        be->ops->destroy(be);
        be128->ops->destroy(be128);
        kvf_engine_destroy(e);
        free(perm);
        free(off);
        free(on);
        free(cd2h);
        free(ch2d);
        free(bd2h);
        free(bh2d);
        free(dsts);
        free(srcs);
        free(lens);
        free(t);
        free(tsub);
    }
    free(img);
    free(back);
    return 0;
}
