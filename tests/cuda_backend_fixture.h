/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend tests' fixture: a backend of each copy mode, arenas of
 * pinned host and device memory with images on the host that every copy is
 * checked against byte for byte (poison outside the copied regions
 * included), batches of copies and a waiter for their completions. Shared by
 * the test_cuda_backend_* programs; one program per translation unit (the
 * helpers keep static state). Each program exits 77 without a GPU.
 */
#ifndef KVF_CUDA_BACKEND_FIXTURE_H
#define KVF_CUDA_BACKEND_FIXTURE_H

#include "backend.h"
#include "cuda_kernels.h"
#include "cuda_paths.h"
#include "testutil_cuda.h"
#include <cuda_runtime.h>
#include <pthread.h>

#define ARENA_BYTES ((size_t)32 << 20)

typedef struct arena {
    kvf_memory kind;
    uint8_t *p;
    size_t bytes;
} arena;

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    kvf_status status;
} waiter;

static inline void waiter_init(waiter *w)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->done = 0;
    w->status = KVF_OK;
}

static inline void on_done(void *arg, kvf_status st)
{
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done++;
    if (st != KVF_OK)
        w->status = st;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static inline void waiter_wait(waiter *w, int count)
{
    pthread_mutex_lock(&w->mu);
    while (w->done < count)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static inline void waiter_fini(waiter *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static inline kvf__backend *backend_new(kvf_cuda_copy mode)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.cuda.copy = mode;
    kvf__backend *b = NULL;
    kvf_status st = kvf__cuda_backend_create(&cfg, &b);
    if (st == KVF_ERR_NO_DEVICE)
        TEST_SKIP_ALL("no CUDA device: %s", kvf_last_error());
    REQUIRE(st == KVF_OK);
    return b;
}

static inline void arena_put(const arena *a, const uint8_t *img)
{
    /* cudaMemcpy from pageable memory may return before the device has
     * the bytes, and the backend's streams do not wait for the legacy
     * stream: synchronize */
    if (a->kind == KVF_MEMORY_DEVICE) {
        CUDA_OK(cudaMemcpy(a->p, img, a->bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaDeviceSynchronize());
    } else
        memcpy(a->p, img, a->bytes);
}

static inline void arena_get(const arena *a, uint8_t *img)
{
    if (a->kind == KVF_MEMORY_DEVICE)
        CUDA_OK(cudaMemcpy(img, a->p, a->bytes, cudaMemcpyDeviceToHost));
    else
        memcpy(img, a->p, a->bytes);
}

/* The host's idea of the copies: applied to images of the two arenas. */
static inline void apply(uint8_t *dimg, const arena *d, const uint8_t *simg, const arena *s,
                         const kvf__copy *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t doff = (size_t)((const uint8_t *)c[i].dst - d->p);
        size_t soff = (size_t)((const uint8_t *)c[i].src - s->p);
        for (size_t r = 0; r < c[i].rows; r++)
            memmove(dimg + doff + r * c[i].dpitch, simg + soff + r * c[i].spitch, c[i].width);
    }
}

static uint64_t seed_counter = 1;

/* Fills src with random bytes and dst with random poison, runs the copies
 * as batches of `per_batch` copies (all queued before any is waited for,
 * with copy_async's `flags`), and compares all of dst with the host's
 * image; want_path > 0: the path (kvf__cuda_path) the last batch took. */
static inline int run_batches_flags(kvf__backend *b, kvf__queue q, const arena *d, const arena *s,
                                    const kvf__copy *c, size_t n, size_t per_batch, unsigned flags,
                                    const char *what, int want_path)
{
    uint8_t *simg = malloc(s->bytes), *dimg = malloc(d->bytes), *got = malloc(d->bytes);
    REQUIRE(simg && dimg && got);
    test_fill_random(simg, s->bytes, seed_counter++);
    test_fill_random(dimg, d->bytes, seed_counter++);
    arena_put(s, simg);
    arena_put(d, dimg);
    apply(dimg, d, simg, s, c, n);

    waiter w;
    waiter_init(&w);
    int batches = 0;
    for (size_t i = 0; i < n || (n == 0 && batches == 0); i += per_batch) {
        size_t k = n - i < per_batch ? n - i : per_batch;
        kvf_status st = b->ops->copy_async(b, q, c + i, k, flags, on_done, &w);
        CHECK_STATUS(st, KVF_OK);
        if (st == KVF_OK)
            batches++;
        if (n == 0)
            break;
    }
    waiter_wait(&w, batches);
    CHECK_STATUS(w.status, KVF_OK);
    waiter_fini(&w);
    if (want_path && kvf__cuda_last_path(b, (int)q) != want_path) {
        fprintf(stderr, "%s: took the %s path, want %s\n", what,
                kvf__cuda_path_name(kvf__cuda_last_path(b, (int)q)),
                kvf__cuda_path_name(want_path));
        test_note_failure_();
    }

    arena_get(d, got);
    size_t off = test_mem_diff(got, dimg, d->bytes);
    int rc = 0;
    if (off != (size_t)-1) {
        fprintf(stderr, "%s: byte %zu differs: 0x%02x, want 0x%02x\n", what, off, got[off],
                dimg[off]);
        test_note_failure_();
        rc = 1;
    }
    free(simg);
    free(dimg);
    free(got);
    return rc;
}

static inline int run_batches(kvf__backend *b, kvf__queue q, const arena *d, const arena *s,
                              const kvf__copy *c, size_t n, size_t per_batch, const char *what,
                              int want_path)
{
    return run_batches_flags(b, q, d, s, c, n, per_batch, 0, what, want_path);
}

/* `count` whole blocks of `bytes`, from shuffled source slots to shuffled
 * destination slots. */
static inline size_t scattered(const arena *d, const arena *s, size_t bytes, size_t count,
                               kvf__copy *out)
{
    size_t slots = d->bytes / bytes;
    uint32_t *ps = malloc(slots * sizeof *ps), *pd = malloc(slots * sizeof *pd);
    for (size_t i = 0; i < slots; i++)
        ps[i] = pd[i] = (uint32_t)i;
    test_shuffle_u32(ps, slots, seed_counter++);
    test_shuffle_u32(pd, slots, seed_counter++);
    if (count > slots)
        count = slots;
    for (size_t i = 0; i < count; i++)
        out[i] = (kvf__copy){d->p + pd[i] * bytes, s->p + ps[i] * bytes, bytes, 1, bytes, bytes};
    free(ps);
    free(pd);
    return count;
}

static arena A_H, A_D1, A_D2;

/* The arenas every test copies between (32 MiB of mapped pinned host
 * memory, two of device memory); the whole program skips without a GPU. */
static inline void arenas_init(void)
{
    unsetenv("KVF_CUDA_COPY");
    kvf__backend *b = backend_new(KVF_CUDA_COPY_AUTO); /* skips without a GPU */
    A_H.kind = KVF_MEMORY_HOST_PINNED;
    A_D1.kind = A_D2.kind = KVF_MEMORY_DEVICE;
    A_H.bytes = A_D1.bytes = A_D2.bytes = ARENA_BYTES;
    /* arenas outlive the backend that allocated them: plain CUDA calls */
    CUDA_OK(
        cudaHostAlloc((void **)&A_H.p, ARENA_BYTES, cudaHostAllocMapped | cudaHostAllocPortable));
    CUDA_OK(cudaMalloc((void **)&A_D1.p, ARENA_BYTES));
    CUDA_OK(cudaMalloc((void **)&A_D2.p, ARENA_BYTES));
    b->ops->destroy(b);
}

static inline void arenas_fini(void)
{
    CUDA_OK(cudaFreeHost(A_H.p));
    CUDA_OK(cudaFree(A_D1.p));
    CUDA_OK(cudaFree(A_D2.p));
}

#endif /* KVF_CUDA_BACKEND_FIXTURE_H */
