/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend: block slots in plain host memory, copies by memcpy on
 * the engine's worker threads. It is the whole backend on a machine without
 * a GPU, for CPU inference engines and for CI.
 *
 * With KVF_HOST_ASYNC=1 it also offers copy_async, run by one thread per
 * queue in submission order, as a CUDA stream would: the engine then takes
 * the path it takes with a GPU (chunks handed over, completions from
 * another thread), so that path runs in CI and under the sanitizers, and
 * its host cost can be measured without a GPU (`kvferry bench --backend
 * host` with small blocks: docs/performance.md). */
#include "backend.h"
#include "log.h"
#include "status.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct host_job {
    struct host_job *next;
    kvf__copy_done_fn done;
    void *arg;
    size_t n;
    kvf__copy copies[]; /* the caller's, copied: it reuses its array */
} host_job;

typedef struct host_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    host_job *head, *tail;
    bool stop, started;
    pthread_t thread;
} host_queue;

typedef struct host_backend {
    kvf__backend base;
    kvf__backend_ops ops; /* host_ops, with copy_async in async mode */
    host_queue q[KVF_QUEUE_COUNT];
} host_backend;

static void host_destroy(kvf__backend *base)
{
    host_backend *b = (host_backend *)base;
    for (int i = 0; i < KVF_QUEUE_COUNT; i++) {
        host_queue *q = &b->q[i];
        if (!q->started)
            continue;
        pthread_mutex_lock(&q->mu);
        q->stop = true;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
    }
    free(b);
}

static kvf_status host_mem_alloc(kvf__backend *b, kvf_memory kind, size_t bytes, void **ptr_p)
{
    if (kind == KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED, "host backend: no device memory");
    /* page-aligned, so O_DIRECT staging and huge copies behave */
    void *p = NULL;
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    if (rounded < bytes || posix_memalign(&p, 4096, rounded ? rounded : 4096) != 0)
        return kvf__fail(KVF_ERR_NOMEM, "host backend: cannot allocate %zu bytes", bytes);
    memset(p, 0, rounded);
    *ptr_p = p;
    return KVF_OK;
}

static void host_mem_free(kvf__backend *b, kvf_memory kind, void *ptr)
{
    free(ptr);
}

static kvf_status host_mem_register(kvf__backend *b, kvf_memory kind, void *ptr, size_t bytes,
                                    bool *registered_p)
{
    if (kind == KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED, "host backend: no device memory");
    *registered_p = false;
    return KVF_OK;
}

static void host_mem_unregister(kvf__backend *b, kvf_memory kind, void *ptr) {}

static kvf__copy_hook_fn copy_hook;

void kvf__set_copy_hook(kvf__copy_hook_fn fn)
{
    __atomic_store_n(&copy_hook, fn, __ATOMIC_RELEASE);
}

kvf_status kvf__host_copy(const kvf__copy *copies, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        kvf__copy_hook_fn hook = __atomic_load_n(&copy_hook, __ATOMIC_ACQUIRE);
        if (hook) {
            kvf_status st = hook(c);
            if (st != KVF_OK)
                return kvf__fail(st, "host backend: copy of %zu x %zu bytes failed (injected)",
                                 c->rows, c->width);
        }
        if (c->rows == 1 || (c->width == c->dpitch && c->width == c->spitch)) {
            memcpy(c->dst, c->src, c->width * c->rows);
            continue;
        }
        uint8_t *d = c->dst;
        const uint8_t *s = c->src;
        for (size_t r = 0; r < c->rows; r++)
            memcpy(d + r * c->dpitch, s + r * c->spitch, c->width);
    }
    return KVF_OK;
}

static kvf_status host_copy_sync(kvf__backend *b, kvf__queue queue, const kvf__copy *copies,
                                 size_t n)
{
    return kvf__host_copy(copies, n);
}

/* A queue's thread: runs its jobs in order (the engine destroys the
 * backend only once every batch has completed, so none is left at stop). */
static void *host_queue_main(void *arg)
{
    host_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        host_job *j = q->head;
        if (!j)
            break;
        q->head = j->next;
        if (!q->head)
            q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        kvf_status st = kvf__host_copy(j->copies, j->n);
        j->done(j->arg, st);
        free(j);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static kvf_status host_copy_async(kvf__backend *base, kvf__queue queue, const kvf__copy *copies,
                                  size_t n, unsigned flags, kvf__copy_done_fn done, void *arg)
{
    (void)flags; /* one path: memcpy */
    host_backend *b = (host_backend *)base;
    if ((unsigned)queue >= KVF_QUEUE_COUNT)
        return kvf__fail(KVF_ERR_INVALID, "host backend: queue %d", (int)queue);
    host_job *j = malloc(sizeof *j + n * sizeof *copies);
    if (!j)
        return kvf__fail(KVF_ERR_NOMEM, "host backend: out of memory for %zu copies", n);
    memcpy(j->copies, copies, n * sizeof *copies);
    j->n = n;
    j->done = done;
    j->arg = arg;
    j->next = NULL;
    host_queue *q = &b->q[queue];
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return KVF_OK;
}

static const kvf__backend_ops host_ops = {
    .name = "host",
    .destroy = host_destroy,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .mem_register = host_mem_register,
    .mem_unregister = host_mem_unregister,
    .copy_sync = host_copy_sync,
    .copy_async = NULL,
    .sync_stream = NULL,
};

kvf_status kvf__host_backend_create(kvf__backend **backend_p)
{
    host_backend *b = calloc(1, sizeof *b);
    if (!b)
        return kvf__fail(KVF_ERR_NOMEM, "host backend: out of memory");
    b->base.ops = &host_ops;
    if (kvf__env_knob("KVF_HOST_ASYNC") == 1) {
        b->ops = host_ops;
        b->ops.copy_async = host_copy_async;
        b->base.ops = &b->ops;
        for (int i = 0; i < KVF_QUEUE_COUNT; i++) {
            host_queue *q = &b->q[i];
            pthread_mutex_init(&q->mu, NULL);
            pthread_cond_init(&q->cv, NULL);
            if (pthread_create(&q->thread, NULL, host_queue_main, q) != 0) {
                pthread_mutex_destroy(&q->mu);
                pthread_cond_destroy(&q->cv);
                host_destroy(&b->base);
                return kvf__fail(KVF_ERR_NOMEM, "host backend: cannot start a copy thread");
            }
            q->started = true;
        }
    }
    *backend_p = &b->base;
    return KVF_OK;
}
