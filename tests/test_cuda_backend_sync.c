/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend's synchronisation: copy_sync from several threads at
 * once, and sync_stream ordering the caller's stream after the copies
 * queued before it. Exits 77 without a GPU.
 */
#include "cuda_backend_fixture.h"

/* ---- copy_sync from several threads ------------------------------------- */

#define SYNC_THREADS 8
#define SYNC_PART (ARENA_BYTES / SYNC_THREADS)

typedef struct sync_arg {
    kvf__backend *b;
    int id;
    int failures;
} sync_arg;

static void *sync_thread(void *p)
{
    sync_arg *a = p;
    uint8_t *src = A_H.p + (size_t)a->id * SYNC_PART; /* first half of the part */
    uint8_t *back = src + SYNC_PART / 2;              /* second half */
    uint8_t *dev = A_D1.p + (size_t)a->id * SYNC_PART;
    size_t bs = 16384, nb = SYNC_PART / 2 / bs;
    uint32_t perm[256];
    kvf__copy c[256];
    for (int it = 0; it < 40; it++) {
        test_fill_random(src, SYNC_PART / 2, (uint64_t)a->id * 1000 + (uint64_t)it + 7);
        memset(back, 0xA5, SYNC_PART / 2);
        for (size_t i = 0; i < nb; i++)
            perm[i] = (uint32_t)i;
        test_shuffle_u32(perm, nb, (uint64_t)it * 77 + (uint64_t)a->id);
        for (size_t i = 0; i < nb; i++)
            c[i] = (kvf__copy){dev + perm[i] * bs, src + i * bs, bs, 1, bs, bs};
        if (a->b->ops->copy_sync(a->b, it % 2 ? KVF_QUEUE_ONBOARD : KVF_QUEUE_OFFLOAD, c, nb) !=
            KVF_OK)
            a->failures++;
        for (size_t i = 0; i < nb; i++)
            c[i] = (kvf__copy){back + i * bs, dev + perm[i] * bs, bs / 2, 2, bs / 2, bs / 2};
        if (a->b->ops->copy_sync(a->b, KVF_QUEUE_OFFLOAD, c, nb) != KVF_OK)
            a->failures++;
        if (memcmp(src, back, SYNC_PART / 2) != 0)
            a->failures++;
    }
    return NULL;
}

static int test_copy_sync_threads(void)
{
    kvf__backend *b = backend_new(KVF_CUDA_COPY_AUTO);
    pthread_t t[SYNC_THREADS];
    sync_arg a[SYNC_THREADS];
    for (int i = 0; i < SYNC_THREADS; i++) {
        a[i] = (sync_arg){b, i, 0};
        REQUIRE(pthread_create(&t[i], NULL, sync_thread, &a[i]) == 0);
    }
    for (int i = 0; i < SYNC_THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_INT(a[i].failures, 0);
    }
    b->ops->destroy(b);
    return 0;
}

/* ---- sync_stream -------------------------------------------------------- */

/* Work queued on the caller's stream after sync_stream sees the copies
 * queued before it on both queues, without the host waiting for them. */
static int test_sync_stream(void)
{
    kvf__backend *b = backend_new(KVF_CUDA_COPY_AUTO);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t half = ARENA_BYTES / 2;
    uint8_t *out = NULL, *want = malloc(ARENA_BYTES), *d1img = malloc(ARENA_BYTES);
    CUDA_OK(cudaMallocHost((void **)&out, ARENA_BYTES));
    arena d2 = {KVF_MEMORY_DEVICE, A_D2.p, half};
    arena d2hi = {KVF_MEMORY_DEVICE, A_D2.p + half, half};
    arena h = {KVF_MEMORY_HOST_PINNED, A_H.p, half};
    test_fill_random(d1img, ARENA_BYTES, seed_counter++);
    arena_put(&A_D1, d1img);
    arena d1 = {KVF_MEMORY_DEVICE, A_D1.p, half};
    kvf__copy *c = malloc(1024 * sizeof *c);
    for (int round = 0; round < 20; round++) {
        test_fill_random(A_H.p, half, seed_counter++);
        test_fill_random(want, ARENA_BYTES, seed_counter++);
        arena_put(&A_D2, want);
        waiter w;
        waiter_init(&w);
        /* onboard from pinned memory, and device->device on the other queue */
        size_t n = scattered(&d2, &h, 32768, 256, c);
        apply(want, &A_D2, A_H.p, &A_H, c, n);
        CHECK_STATUS(b->ops->copy_async(b, KVF_QUEUE_ONBOARD, c, n, 0, on_done, &w), KVF_OK);
        n = scattered(&d2hi, &d1, 65536, 128, c);
        apply(want, &A_D2, d1img, &A_D1, c, n);
        CHECK_STATUS(b->ops->copy_async(b, KVF_QUEUE_OFFLOAD, c, n, 0, on_done, &w), KVF_OK);
        CHECK_STATUS(b->ops->sync_stream(b, (void *)s), KVF_OK);
        CUDA_OK(cudaMemcpyAsync(out, A_D2.p, ARENA_BYTES, cudaMemcpyDeviceToHost, s));
        CUDA_OK(cudaStreamSynchronize(s));
        CHECK_MEM_EQ(out, want, ARENA_BYTES);
        waiter_wait(&w, 2);
        waiter_fini(&w);
    }
    free(c);
    free(want);
    free(d1img);
    CUDA_OK(cudaFreeHost(out));
    CUDA_OK(cudaStreamDestroy(s));
    const kvf__backend_ops *ops = b->ops;
    ops->destroy(b);
    ops->destroy(NULL); /* harmless */
    return 0;
}

int main(void)
{
    arenas_init();
    RUN(test_copy_sync_threads);
    RUN(test_sync_stream);
    arenas_fini();
    return TEST_RESULT();
}
