/*
 * The CUDA memory backend: device memory and pinned host memory, two
 * transfer streams (offload at normal priority, onboard at the highest),
 * and two ways to move a batch of scattered 2-D copies:
 *
 *  kernel  a gather/scatter kernel (cuda_kernels.cu) that walks an array of
 *          copy descriptors, reading and writing mapped pinned host memory
 *          directly. Descriptors are written into a pinned ring and uploaded
 *          with one copy per batch; nothing is allocated per call.
 *  dma     copy engines only: adjacent copies merged, contiguous ones in one
 *          cudaMemcpyBatchAsync, 2-D ones in one cudaMemcpy3DBatchAsync
 *          (per-copy cudaMemcpy2DAsync before CUDA 13).
 *
 * AUTO picks one per batch by the rule in choose_path(), derived from the
 * measurements in bench/cuda_paths.c (see the numbers there).
 *
 * Every CUDA call goes through CUDA_RET / CUDA_GOTO / CUDA_IGNORE, which
 * translate cudaError_t to kvf_status once, record the detail for
 * kvf_last_error() and clear CUDA's sticky error.
 *
 * Contract of copy_async beyond internal.h: copies within one batch must not
 * overlap each other (they may run in any order); on KVF_OK `done` is called
 * exactly once, on the backend's completion thread; on an error nothing of
 * the batch is left in flight and `done` is not called.
 */
#include "backend.h"
#include "log.h"
#include "status.h"
#include "timeline.h"

#include "cuda_kernels.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* ---- error translation ------------------------------------------------- */

static kvf_status cuda_fail(cudaError_t err, const char *expr, const char *file, int line)
{
    (void)cudaGetLastError(); /* clear the sticky error */
    int name_len = 0;
    while (expr[name_len] && expr[name_len] != '(')
        name_len++;
    kvf_status st = err == cudaErrorMemoryAllocation ? KVF_ERR_NOMEM : KVF_ERR_DEVICE;
    return kvf__fail(st, "cuda: %.*s: %s (%s:%d)", name_len, expr, cudaGetErrorString(err), file,
                     line);
}

static void cuda_warn(cudaError_t err, const char *expr, const char *file, int line)
{
    (void)cudaGetLastError();
    int name_len = 0;
    while (expr[name_len] && expr[name_len] != '(')
        name_len++;
    KVF_LOG(KVF_LOG_WARN, "cuda: %.*s: %s (%s:%d)", name_len, expr, cudaGetErrorString(err), file,
            line);
}

#define CUDA_RET(expr)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail(e_, #expr, __FILE__, __LINE__);                                       \
    } while (0)

#define CUDA_GOTO(expr, st, label)                                                                 \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (st) = cuda_fail(e_, #expr, __FILE__, __LINE__);                                       \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* For cleanup: logs, keeps the first error's detail. */
#define CUDA_IGNORE(expr)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            cuda_warn(e_, #expr, __FILE__, __LINE__);                                              \
    } while (0)

/* ---- the backend's state ----------------------------------------------- */

enum { PATH_KERNEL = 1, PATH_DMA = 2, PATH_STAGED = 3 };
/* Not in the API: KVF_CUDA_COPY=staged forces the staged path wherever it
 * applies (tests and benchmarks); AUTO picks it by measurement. */
#define MODE_STAGED 3

/* cudaMemcpy3DBatchAsync as CUDA 13 declares it (12.8 had another
 * signature); older runtimes copy 2-D regions one call each. */
#if CUDART_VERSION >= 13000
#define KVF_CUDA_3D_BATCH 1
#else
#define KVF_CUDA_3D_BATCH 0
#endif

/* Descriptors per queue ring (48 bytes each: 3 MiB pinned + 3 MiB device);
 * a larger batch is cut into launches of at most half of it. A ring of
 * 256 Ki entries was tried: no queue was ever full with it (reserve()
 * counts that) and nothing got faster. */
#define RING_DESCS (1u << 16)
#define CHUNK_DESCS (RING_DESCS / 2)
/* Batches in flight per queue before a submitter waits. */
#define BATCH_RECORDS 1024u
/* Streams kept for copy_sync. */
#define SYNC_STREAMS_MAX 64
/* Staged path: a ring of STAGE_SLOTS chunks of STAGE_CHUNK bytes of device
 * memory per queue (allocated at the first staged batch), so the gather
 * of one chunk overlaps the DMA of the one before. */
#define STAGE_CHUNK ((size_t)16 << 20)
#define STAGE_SLOTS 4u

typedef struct cuda_backend cuda_backend;

/* A record's life: FREE -> BUILT (reserved, work being queued) -> ARMED
 * (its event recorded after the work; the watcher polls it) -> FREE (the
 * watcher saw the event complete, or the work was never queued). */
enum { REC_FREE = 0, REC_BUILT = 1, REC_ARMED = 2 };

typedef struct batch_record {
    kvf__copy_done_fn done;
    void *arg;
    uint64_t desc_end;    /* ring position after this batch's descriptors */
    _Atomic uint64_t pos; /* its place in the queue's sequence of records */
    cudaEvent_t ev;       /* recorded after the batch's last step */
    atomic_int state;     /* REC_* */
} batch_record;

typedef struct cuda_queue {
    pthread_mutex_t lock;
    int index; /* KVF_QUEUE_*: names the queue in the timeline */
    cudaStream_t stream;
    cudaEvent_t sync_event;
    /* descriptor ring: monotonic positions, index = pos % RING_DESCS */
    kvf__cuda_desc *ring_host; /* pinned */
    kvf__cuda_desc *ring_dev;
    uint64_t ring_head; /* next free position */
    uint64_t ring_tail; /* oldest position still possibly in use */
    /* batch records, FIFO; rec_pub is rec_next for the watcher thread,
     * watch_pos the next record it has to see end */
    batch_record records[BATCH_RECORDS];
    uint64_t rec_next, rec_oldest;
    _Atomic uint64_t rec_pub;
    uint64_t watch_pos;
    /* dma scratch, grown on demand and kept */
    void **dsts;
    const void **srcs;
    size_t *sizes;
    size_t flat_cap;
#if KVF_CUDA_3D_BATCH
    struct cudaMemcpy3DBatchOp *ops3d;
    size_t ops3d_cap;
#endif
    atomic_int last_path;
    /* reserve() found the queue full: times, and nanoseconds waited
     * (reported at destroy with KVF_LOG=debug) */
    uint64_t full_waits, full_wait_ns;
    /* staged path: the kernels run on `aux`, the DMAs on `stream` */
    cudaStream_t aux;
    cudaEvent_t ev_start, ev_ready, ev_done;
    cudaEvent_t ev_free[STAGE_SLOTS]; /* a slot's last use is over */
    uint8_t *stage;                   /* STAGE_SLOTS * STAGE_CHUNK, device */
    uint64_t stage_next;              /* chunks staged so far */
    /* stream order of the queue across both streams: main_dirty, work on
     * `stream` that may touch device memory and that `aux` has not waited
     * for; aux_open, work on `aux` that `stream` has not waited for */
    bool main_dirty, aux_open;
    cudaEvent_t sync_event_aux;
    /* staged-path scratch: host blocks seen, host block of each copy */
    uint64_t *bits;
    size_t bits_cap;
    uint32_t *kidx;
    size_t kidx_cap;
    uint32_t *kinv; /* the copy of each host block */
    size_t kinv_cap;
} cuda_queue;

typedef struct host_range {
    uintptr_t begin, end;
} host_range;

struct cuda_backend {
    kvf__backend base;
    int device;
    int mode; /* KVF_CUDA_COPY_* */
    uint32_t grid;
    bool kernel_ok; /* mapped host pointers equal their host addresses */
    cuda_queue q[KVF_QUEUE_COUNT];

    pthread_mutex_t sync_lock;
    cudaStream_t sync_streams[SYNC_STREAMS_MAX];
    cudaEvent_t sync_events[SYNC_STREAMS_MAX]; /* one per stream, blocking sync */
    int sync_free;

    /* pageable ranges (HOST kind): the kernel path cannot touch them */
    pthread_mutex_t range_lock;
    host_range *ranges;
    size_t nranges, ranges_cap;
    atomic_size_t nranges_pub;
    /* pinned ranges the backend allocated or was given: one DMA of the
     * staged path stays inside one of them */
    host_range *pinned;
    size_t npinned, pinned_cap;

    /* the completion watcher (see "completion watcher" below) */
    pthread_t watcher;
    bool watcher_started;
    pthread_mutex_t watch_mu;
    pthread_cond_t watch_cv;
    atomic_bool watch_idle, watch_stop;
};

/* Makes b's device current on the calling thread and restores the
 * caller's device afterwards, so an application thread is left as it was. */
typedef struct dev_guard {
    int prev;
} dev_guard;

static kvf_status dev_enter(const cuda_backend *b, dev_guard *g)
{
    g->prev = -1;
    int cur = -1;
    CUDA_RET(cudaGetDevice(&cur));
    if (cur != b->device) {
        CUDA_RET(cudaSetDevice(b->device));
        g->prev = cur;
    }
    return KVF_OK;
}

static void dev_leave(const dev_guard *g)
{
    if (g->prev >= 0)
        CUDA_IGNORE(cudaSetDevice(g->prev));
}

/* ---- pageable-range registry ------------------------------------------- */

/* A list of host ranges (pageable or pinned); range_lock held. */
static bool range_push(host_range **list, size_t *n, size_t *cap, void *ptr, size_t bytes)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 16;
        host_range *r = realloc(*list, nc * sizeof *r);
        if (!r)
            return false;
        *list = r;
        *cap = nc;
    }
    (*list)[*n].begin = (uintptr_t)ptr;
    (*list)[*n].end = (uintptr_t)ptr + bytes;
    (*n)++;
    return true;
}

static void range_drop(host_range *list, size_t *n, void *ptr)
{
    for (size_t i = 0; i < *n; i++) {
        if (list[i].begin == (uintptr_t)ptr) {
            list[i] = list[--*n];
            break;
        }
    }
}

static void ranges_add(cuda_backend *b, void *ptr, size_t bytes)
{
    pthread_mutex_lock(&b->range_lock);
    if (!range_push(&b->ranges, &b->nranges, &b->ranges_cap, ptr, bytes))
        KVF_LOG(KVF_LOG_WARN, "cuda: cannot track pageable range %p", ptr);
    atomic_store(&b->nranges_pub, b->nranges);
    pthread_mutex_unlock(&b->range_lock);
}

static void ranges_remove(cuda_backend *b, void *ptr)
{
    pthread_mutex_lock(&b->range_lock);
    range_drop(b->ranges, &b->nranges, ptr);
    atomic_store(&b->nranges_pub, b->nranges);
    pthread_mutex_unlock(&b->range_lock);
}

static bool in_ranges(const cuda_backend *b, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < b->nranges; i++)
        if (a >= b->ranges[i].begin && a < b->ranges[i].end)
            return true;
    return false;
}

/* Pinned ranges: not fatal when one cannot be recorded, batches there
 * just do not take the staged path. */
static void pinned_add(cuda_backend *b, void *ptr, size_t bytes)
{
    pthread_mutex_lock(&b->range_lock);
    (void)range_push(&b->pinned, &b->npinned, &b->pinned_cap, ptr, bytes);
    pthread_mutex_unlock(&b->range_lock);
}

static void pinned_remove(cuda_backend *b, void *ptr)
{
    pthread_mutex_lock(&b->range_lock);
    range_drop(b->pinned, &b->npinned, ptr);
    pthread_mutex_unlock(&b->range_lock);
}

/* Whether [lo, hi) lies inside one known pinned range. */
static bool pinned_covers(cuda_backend *b, uintptr_t lo, uintptr_t hi)
{
    bool ok = false;
    pthread_mutex_lock(&b->range_lock);
    for (size_t i = 0; i < b->npinned && !ok; i++)
        ok = lo >= b->pinned[i].begin && hi <= b->pinned[i].end;
    pthread_mutex_unlock(&b->range_lock);
    return ok;
}

/* Whether any copy touches pageable memory the backend knows of. */
static bool batch_touches_pageable(cuda_backend *b, const kvf__copy *copies, size_t n)
{
    if (atomic_load_explicit(&b->nranges_pub, memory_order_relaxed) == 0)
        return false;
    bool hit = false;
    pthread_mutex_lock(&b->range_lock);
    for (size_t i = 0; i < n && !hit; i++)
        hit = in_ranges(b, copies[i].dst) || in_ranges(b, copies[i].src);
    pthread_mutex_unlock(&b->range_lock);
    return hit;
}

/* cudaMemoryTypeDevice, cudaMemoryTypeHost (pinned), or
 * cudaMemoryTypeUnregistered (pageable, or unknown to CUDA). */
static enum cudaMemoryType pointer_type(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return cudaMemoryTypeUnregistered;
    }
    if (a.type == cudaMemoryTypeManaged)
        return cudaMemoryTypeDevice;
    /* pinned but not mapped at its own address (registered elsewhere
     * without cudaHostRegisterMapped): the kernel cannot reach it */
    if (a.type == cudaMemoryTypeHost && a.devicePointer != p)
        return cudaMemoryTypeUnregistered;
    return a.type;
}

/* ---- memory ------------------------------------------------------------ */

static kvf_status sync_stream_get(cuda_backend *b, cudaStream_t *s_p, cudaEvent_t *ev_p);
static void sync_stream_put(cuda_backend *b, cudaStream_t s, cudaEvent_t ev);
static kvf_status sync_stream_wait(cudaStream_t s, cudaEvent_t ev);

static kvf_status cuda_mem_alloc(kvf__backend *base, kvf_memory kind, size_t bytes, void **ptr_p)
{
    cuda_backend *b = (cuda_backend *)base;
    void *p = NULL;
    dev_guard g;
    kvf_status st;
    if (bytes == 0)
        return kvf__fail(KVF_ERR_INVALID, "cuda: allocation of 0 bytes");
    switch (kind) {
    case KVF_MEMORY_DEVICE: {
        if ((st = dev_enter(b, &g)) != KVF_OK)
            return st;
        cudaStream_t s = NULL;
        cudaEvent_t ev = NULL;
        CUDA_GOTO(cudaMalloc(&p, bytes), st, out_leave);
        if ((st = sync_stream_get(b, &s, &ev)) != KVF_OK)
            goto out_free;
        /* on a stream of ours: the legacy stream would not order it
         * before our non-blocking transfer streams */
        CUDA_GOTO(cudaMemsetAsync(p, 0, bytes, s), st, out_put);
        if ((st = sync_stream_wait(s, ev)) != KVF_OK)
            goto out_put;
        sync_stream_put(b, s, ev);
        dev_leave(&g);
        *ptr_p = p;
        return KVF_OK;
    out_put:
        sync_stream_put(b, s, ev);
    out_free:
        CUDA_IGNORE(cudaFree(p));
    out_leave:
        dev_leave(&g);
        return st;
    }
    case KVF_MEMORY_HOST_PINNED:
        if ((st = dev_enter(b, &g)) != KVF_OK)
            return st;
        CUDA_GOTO(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable), st,
                  out_pinned);
        memset(p, 0, bytes);
        pinned_add(b, p, bytes);
        st = KVF_OK;
        *ptr_p = p;
    out_pinned:
        dev_leave(&g);
        return st;
    case KVF_MEMORY_HOST:
        p = calloc(1, bytes);
        if (!p)
            return kvf__fail(KVF_ERR_NOMEM, "cuda: cannot allocate %zu bytes of host memory",
                             bytes);
        ranges_add(b, p, bytes);
        *ptr_p = p;
        return KVF_OK;
    }
    return kvf__fail(KVF_ERR_INVALID, "cuda: unknown memory kind %d", (int)kind);
}

static void cuda_mem_free(kvf__backend *base, kvf_memory kind, void *ptr)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    if (!ptr)
        return;
    switch (kind) {
    case KVF_MEMORY_DEVICE:
        if (dev_enter(b, &g) == KVF_OK) {
            CUDA_IGNORE(cudaFree(ptr));
            dev_leave(&g);
        }
        break;
    case KVF_MEMORY_HOST_PINNED:
        pinned_remove(b, ptr);
        CUDA_IGNORE(cudaFreeHost(ptr));
        break;
    case KVF_MEMORY_HOST:
        ranges_remove(b, ptr);
        free(ptr);
        break;
    }
}

static kvf_status cuda_mem_register(kvf__backend *base, kvf_memory kind, void *ptr, size_t bytes,
                                    bool *registered_p)
{
    cuda_backend *b = (cuda_backend *)base;
    struct cudaPointerAttributes a, z;
    dev_guard g;
    kvf_status st = KVF_OK;
    if (!ptr || bytes == 0)
        return kvf__fail(KVF_ERR_INVALID, "cuda: register %p of %zu bytes", ptr, bytes);
    const void *last = (const char *)ptr + bytes - 1;
    switch (kind) {
    case KVF_MEMORY_DEVICE:
        if ((st = dev_enter(b, &g)) != KVF_OK)
            return st;
        CUDA_GOTO(cudaPointerGetAttributes(&a, ptr), st, out_leave);
        CUDA_GOTO(cudaPointerGetAttributes(&z, last), st, out_leave);
        if (a.type != cudaMemoryTypeDevice || a.device != b->device ||
            z.type != cudaMemoryTypeDevice || z.device != b->device) {
            st = kvf__fail(KVF_ERR_INVALID,
                           "cuda: %p (%zu bytes) is not memory of device %d (type %d, device %d)",
                           ptr, bytes, b->device, (int)a.type, a.device);
            goto out_leave;
        }
        *registered_p = false;
        break;
    case KVF_MEMORY_HOST_PINNED:
        if ((st = dev_enter(b, &g)) != KVF_OK)
            return st;
        CUDA_GOTO(cudaPointerGetAttributes(&a, ptr), st, out_leave);
        CUDA_GOTO(cudaPointerGetAttributes(&z, last), st, out_leave);
        if (a.type == cudaMemoryTypeHost && z.type == cudaMemoryTypeHost) {
            /* pinned by the caller, who may free it without telling us:
             * not recorded, so the staged path never DMAs across it */
            *registered_p = false;
            break;
        }
        if (a.type == cudaMemoryTypeDevice || z.type == cudaMemoryTypeDevice) {
            st = kvf__fail(KVF_ERR_INVALID, "cuda: %p is device memory, not host memory", ptr);
            goto out_leave;
        }
        CUDA_GOTO(cudaHostRegister(ptr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
                  st, out_leave);
        pinned_add(b, ptr, bytes);
        *registered_p = true;
        break;
    case KVF_MEMORY_HOST:
        if (pointer_type(ptr) == cudaMemoryTypeDevice)
            return kvf__fail(KVF_ERR_INVALID, "cuda: %p is device memory, not host memory", ptr);
        ranges_add(b, ptr, bytes);
        /* the range must be forgotten again: mem_unregister is needed */
        *registered_p = true;
        return KVF_OK;
    default:
        return kvf__fail(KVF_ERR_INVALID, "cuda: unknown memory kind %d", (int)kind);
    }
out_leave:
    dev_leave(&g);
    return st;
}

static void cuda_mem_unregister(kvf__backend *base, kvf_memory kind, void *ptr)
{
    cuda_backend *b = (cuda_backend *)base;
    if (kind == KVF_MEMORY_HOST_PINNED) {
        pinned_remove(b, ptr);
        CUDA_IGNORE(cudaHostUnregister(ptr));
    } else if (kind == KVF_MEMORY_HOST)
        ranges_remove(b, ptr);
}

/* ---- copies: common ---------------------------------------------------- */

static bool copy_contiguous(const kvf__copy *c)
{
    return c->rows == 1 || (c->width == c->dpitch && c->width == c->spitch);
}

static kvf_status check_copies(const kvf__copy *copies, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (c->width == 0 || c->rows == 0)
            continue;
        if (!c->dst || !c->src)
            return kvf__fail(KVF_ERR_INVALID, "cuda: copy %zu: NULL pointer", i);
        if (c->rows > 1 && (c->dpitch < c->width || c->spitch < c->width))
            return kvf__fail(KVF_ERR_INVALID, "cuda: copy %zu: pitch %zu/%zu below width %zu", i,
                             c->dpitch, c->spitch, c->width);
    }
    return KVF_OK;
}

/* ---- copy_sync: pooled streams ----------------------------------------- */

static kvf_status sync_stream_get(cuda_backend *b, cudaStream_t *s_p, cudaEvent_t *ev_p)
{
    pthread_mutex_lock(&b->sync_lock);
    if (b->sync_free > 0) {
        b->sync_free--;
        *s_p = b->sync_streams[b->sync_free];
        *ev_p = b->sync_events[b->sync_free];
        pthread_mutex_unlock(&b->sync_lock);
        return KVF_OK;
    }
    pthread_mutex_unlock(&b->sync_lock);
    CUDA_RET(cudaStreamCreateWithFlags(s_p, cudaStreamNonBlocking));
    cudaError_t e = cudaEventCreateWithFlags(ev_p, cudaEventBlockingSync | cudaEventDisableTiming);
    if (e != cudaSuccess) {
        CUDA_IGNORE(cudaStreamDestroy(*s_p));
        return cuda_fail(e, "cudaEventCreateWithFlags(blocking)", __FILE__, __LINE__);
    }
    return KVF_OK;
}

static void sync_stream_put(cuda_backend *b, cudaStream_t s, cudaEvent_t ev)
{
    pthread_mutex_lock(&b->sync_lock);
    if (b->sync_free < SYNC_STREAMS_MAX) {
        b->sync_streams[b->sync_free] = s;
        b->sync_events[b->sync_free++] = ev;
        s = NULL;
    }
    pthread_mutex_unlock(&b->sync_lock);
    if (s) {
        CUDA_IGNORE(cudaEventDestroy(ev));
        CUDA_IGNORE(cudaStreamDestroy(s));
    }
}

/* Waits for s asleep, not spinning: the file tier's I/O threads call
 * copy_sync by the dozen at once, and a spinning wait in each of them
 * takes the cores that their reads and checksums need. */
static kvf_status sync_stream_wait(cudaStream_t s, cudaEvent_t ev)
{
    CUDA_RET(cudaEventRecord(ev, s));
    CUDA_RET(cudaEventSynchronize(ev));
    return KVF_OK;
}

static kvf_status cuda_copy_sync(kvf__backend *base, kvf__queue queue, const kvf__copy *copies,
                                 size_t n)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    cudaStream_t s = NULL;
    cudaEvent_t ev = NULL;
    kvf_status st = check_copies(copies, n);
    if (st != KVF_OK || n == 0)
        return st;
    if ((st = dev_enter(b, &g)) != KVF_OK)
        return st;
    if ((st = sync_stream_get(b, &s, &ev)) != KVF_OK)
        goto out_leave;
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (c->width == 0 || c->rows == 0)
            continue;
        if (copy_contiguous(c)) {
            /* merge a run of copies that continue each other on both sides */
            char *d = c->dst;
            const char *sr = c->src;
            size_t len = c->width * c->rows;
            while (i + 1 < n && copy_contiguous(&copies[i + 1]) && copies[i + 1].dst == d + len &&
                   copies[i + 1].src == sr + len) {
                i++;
                len += copies[i].width * copies[i].rows;
            }
            CUDA_GOTO(cudaMemcpyAsync(d, sr, len, cudaMemcpyDefault, s), st, out_sync);
        } else {
            CUDA_GOTO(cudaMemcpy2DAsync(c->dst, c->dpitch, c->src, c->spitch, c->width, c->rows,
                                        cudaMemcpyDefault, s),
                      st, out_sync);
        }
    }
out_sync:
    /* also after a failed submit: nothing may stay in flight */
    if (st == KVF_OK)
        st = sync_stream_wait(s, ev);
    if (st != KVF_OK)
        CUDA_IGNORE(cudaStreamSynchronize(s));
    sync_stream_put(b, s, ev);
out_leave:
    dev_leave(&g);
    return st;
}

/* ---- copy_async -------------------------------------------------------- */

static void retire(cuda_queue *q)
{
    while (q->rec_oldest != q->rec_next) {
        batch_record *r = &q->records[q->rec_oldest % BATCH_RECORDS];
        if (atomic_load_explicit(&r->state, memory_order_acquire) != REC_FREE)
            break;
        q->ring_tail = r->desc_end;
        q->rec_oldest++;
    }
    if (q->rec_oldest == q->rec_next)
        q->ring_tail = q->ring_head;
}

static void backoff(unsigned *spins)
{
    if (++*spins < 64) {
        sched_yield();
    } else {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* Reserves a batch record and, when ndesc > 0, ndesc contiguous ring
 * entries; waits (without CUDA calls) while the queue is full. Returns the
 * ring index of the first entry. Called with q->lock held. */
static batch_record *reserve(cuda_queue *q, uint32_t ndesc, uint32_t *index_p)
{
    unsigned spins = 0;
    uint64_t t0 = 0;
    for (;;) {
        retire(q);
        uint64_t pos = q->ring_head;
        if (ndesc && pos % RING_DESCS + ndesc > RING_DESCS)
            pos += RING_DESCS - pos % RING_DESCS; /* wrap: entries stay contiguous */
        bool ring_ok = pos + ndesc - q->ring_tail <= RING_DESCS;
        bool rec_ok = q->rec_next - q->rec_oldest < BATCH_RECORDS;
        if (ring_ok && rec_ok) {
            batch_record *r = &q->records[q->rec_next % BATCH_RECORDS];
            q->ring_head = pos + ndesc;
            r->desc_end = q->ring_head;
            r->done = NULL;
            r->arg = NULL;
            atomic_store_explicit(&r->pos, q->rec_next, memory_order_relaxed);
            atomic_store_explicit(&r->state, REC_BUILT, memory_order_relaxed);
            q->rec_next++;
            atomic_store(&q->rec_pub, q->rec_next);
            *index_p = (uint32_t)(pos % RING_DESCS);
            if (spins) {
                q->full_waits++;
                q->full_wait_ns += kvf__now_ns() - t0;
            }
            return r;
        }
        if (!spins)
            t0 = kvf__now_ns();
        backoff(&spins);
    }
}

/* A reserved record whose work never got queued: retire it in place. */
static void unreserve(batch_record *r)
{
    atomic_store_explicit(&r->state, REC_FREE, memory_order_release);
}

static void watcher_wake(cuda_backend *b);

/* A record's name in the timeline. */
static uint64_t record_tl_id(const cuda_queue *q, const batch_record *r)
{
    return (uint64_t)q->index << 56 | atomic_load_explicit(&r->pos, memory_order_relaxed);
}

/* Ends record r of q, holding `ncopies` copies, after the work queued so
 * far on `s`: its event, then the watcher's eye on it. On failure the
 * caller unwinds. */
static kvf_status finish_record_on(cuda_backend *b, cuda_queue *q, cudaStream_t s, batch_record *r,
                                   size_t ncopies, kvf__copy_done_fn done, void *arg)
{
    r->done = done;
    r->arg = arg;
    CUDA_RET(cudaEventRecord(r->ev, s));
    KVF_TIMELINE(KVF_TL_GPU_QUEUED, record_tl_id(q, r), ncopies);
    atomic_store(&r->state, REC_ARMED);
    watcher_wake(b);
    return KVF_OK;
}

static kvf_status finish_record(cuda_backend *b, cuda_queue *q, batch_record *r, size_t ncopies,
                                kvf__copy_done_fn done, void *arg)
{
    return finish_record_on(b, q, q->stream, r, ncopies, done, arg);
}

/* ---- completion watcher --------------------------------------------------
 *
 * A batch ends with an event recorded after its last step. One thread per
 * backend watches the oldest unfinished record of each queue and, once its
 * event has completed, frees the record and calls its `done`. (A CUDA host
 * function did this before: it took 190-330 us from the last
 * copy to a waiting caller, where polling every few microseconds takes
 * about ten, and it held up the next work of its stream while it ran:
 * bench/latency.c.) While records are in flight the thread polls with
 * short sleeps; with none it sleeps until a submit wakes it.
 */

#define WATCH_POLL_NS 4000

static void watcher_wake(cuda_backend *b)
{
    if (atomic_load(&b->watch_idle)) {
        pthread_mutex_lock(&b->watch_mu);
        pthread_cond_signal(&b->watch_cv);
        pthread_mutex_unlock(&b->watch_mu);
    }
}

/* Ends what has ended on q, oldest first. Returns whether records of q are
 * still unfinished. */
static bool watch_queue(cuda_queue *q)
{
    uint64_t pub = atomic_load(&q->rec_pub);
    while (q->watch_pos < pub) {
        batch_record *r = &q->records[q->watch_pos % BATCH_RECORDS];
        int state = atomic_load(&r->state);
        if (state == REC_FREE ||
            atomic_load_explicit(&r->pos, memory_order_relaxed) != q->watch_pos) {
            /* never queued (unreserved), or already gone and its slot reused */
            q->watch_pos++;
            continue;
        }
        if (state != REC_ARMED)
            return true; /* its work is still being queued */
        cudaError_t e = cudaEventQuery(r->ev);
        if (e == cudaErrorNotReady)
            return true;
        kvf_status st = KVF_OK;
        if (e != cudaSuccess)
            st = cuda_fail(e, "cudaEventQuery(batch end)", __FILE__, __LINE__);
        kvf__copy_done_fn done = r->done;
        void *arg = r->arg;
        KVF_TIMELINE(KVF_TL_GPU_ENDED, record_tl_id(q, r), 0);
        q->watch_pos++;
        atomic_store_explicit(&r->state, REC_FREE, memory_order_release);
        if (done)
            done(arg, st);
    }
    return false;
}

static void *watcher_main(void *arg)
{
    cuda_backend *b = arg;
    /* short sleeps must be short: the default 50 us timer slack would
     * make every poll a 50 us one */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    if (cudaSetDevice(b->device) != cudaSuccess)
        (void)cudaGetLastError();
    for (;;) {
        bool pending = false;
        for (int i = 0; i < KVF_QUEUE_COUNT; i++)
            pending |= watch_queue(&b->q[i]);
        if (pending) {
            struct timespec ts = {0, WATCH_POLL_NS};
            nanosleep(&ts, NULL);
            continue;
        }
        pthread_mutex_lock(&b->watch_mu);
        atomic_store(&b->watch_idle, true);
        /* a record published after the scan above is seen here, or its
         * submitter sees watch_idle and signals */
        bool more = false;
        for (int i = 0; i < KVF_QUEUE_COUNT; i++)
            more |= b->q[i].watch_pos < atomic_load(&b->q[i].rec_pub);
        if (!more && atomic_load(&b->watch_stop)) {
            pthread_mutex_unlock(&b->watch_mu);
            break;
        }
        if (!more)
            pthread_cond_wait(&b->watch_cv, &b->watch_mu);
        atomic_store(&b->watch_idle, false);
        pthread_mutex_unlock(&b->watch_mu);
    }
    return NULL;
}

/* Ends the watcher once every record has ended (the streams drained). */
static void watcher_stop(cuda_backend *b)
{
    if (!b->watcher_started)
        return;
    pthread_mutex_lock(&b->watch_mu);
    atomic_store(&b->watch_stop, true);
    pthread_cond_signal(&b->watch_cv);
    pthread_mutex_unlock(&b->watch_mu);
    pthread_join(b->watcher, NULL);
    b->watcher_started = false;
}

/* Kernel path: copies[0..n) (no empty ones among them after filtering). */
static kvf_status submit_kernel(cuda_backend *b, cuda_queue *q, const kvf__copy *copies, size_t n,
                                kvf__copy_done_fn done, void *arg)
{
    size_t i = 0;
    kvf_status st;
    do {
        uint32_t idx;
        uint32_t want = n - i < CHUNK_DESCS ? (uint32_t)(n - i) : CHUNK_DESCS;
        batch_record *r = reserve(q, want, &idx);
        kvf__cuda_desc *d = q->ring_host + idx;
        uint32_t nd = 0;
        uint64_t tiles = 0;
        for (; i < n && nd < want; i++) {
            const kvf__copy *c = &copies[i];
            if (c->width == 0 || c->rows == 0)
                continue;
            size_t width = c->width, rows = c->rows;
            size_t dp = c->dpitch, sp = c->spitch;
            if (copy_contiguous(c)) {
                width = c->width * c->rows;
                rows = 1;
                dp = sp = 0;
            }
            /* a row longer than 2^31 bytes is cut into rows of 2^30 */
            if (width > (1u << 31) && rows == 1) {
                size_t piece = (size_t)1 << 30;
                if (width % piece == 0) {
                    rows = width / piece;
                    width = piece;
                    dp = sp = piece;
                } else {
                    unreserve(r);
                    return kvf__fail(KVF_ERR_UNSUPPORTED,
                                     "cuda: copy %zu: %zu bytes too long for the kernel", i, width);
                }
            } else if (width > (1u << 31)) {
                unreserve(r);
                return kvf__fail(KVF_ERR_UNSUPPORTED,
                                 "cuda: copy %zu: row of %zu bytes too long for the kernel", i,
                                 width);
            }
            uint32_t tpr = (uint32_t)((width + KVF_CUDA_TILE_BYTES - 1) / KVF_CUDA_TILE_BYTES);
            d[nd].dst = (uint64_t)(uintptr_t)c->dst;
            d[nd].src = (uint64_t)(uintptr_t)c->src;
            d[nd].dpitch = dp;
            d[nd].spitch = sp;
            d[nd].tile_begin = tiles;
            d[nd].width = (uint32_t)width;
            d[nd].tiles_per_row = tpr;
            tiles += (uint64_t)tpr * rows;
            nd++;
        }
        if (nd > 0) {
            CUDA_GOTO(cudaMemcpyAsync(q->ring_dev + idx, d, nd * sizeof *d, cudaMemcpyHostToDevice,
                                      q->stream),
                      st, fail);
            CUDA_GOTO(kvf__cuda_copy_launch(q->ring_dev + idx, nd, tiles, b->grid, q->stream), st,
                      fail);
        }
        if ((st = finish_record(b, q, r, nd, i == n ? done : NULL, arg)) != KVF_OK)
            goto fail;
        continue;
    fail:
        CUDA_IGNORE(cudaStreamSynchronize(q->stream));
        unreserve(r);
        return st;
    } while (i < n);
    return KVF_OK;
}

static kvf_status grow_flat(cuda_queue *q, size_t n)
{
    if (n <= q->flat_cap)
        return KVF_OK;
    size_t cap = q->flat_cap ? q->flat_cap : 256;
    while (cap < n)
        cap *= 2;
    void **d = realloc(q->dsts, cap * sizeof *d);
    if (d)
        q->dsts = d;
    const void **s = realloc(q->srcs, cap * sizeof *s);
    if (s)
        q->srcs = s;
    size_t *z = realloc(q->sizes, cap * sizeof *z);
    if (z)
        q->sizes = z;
    if (!d || !s || !z)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: cannot grow copy lists to %zu", cap);
    q->flat_cap = cap;
    return KVF_OK;
}

#if KVF_CUDA_3D_BATCH
static kvf_status grow_3d(cuda_queue *q, size_t n)
{
    if (n <= q->ops3d_cap)
        return KVF_OK;
    size_t cap = q->ops3d_cap ? q->ops3d_cap : 64;
    while (cap < n)
        cap *= 2;
    struct cudaMemcpy3DBatchOp *o = realloc(q->ops3d, cap * sizeof *o);
    if (!o)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: cannot grow 2-D copy list to %zu", cap);
    q->ops3d = o;
    q->ops3d_cap = cap;
    return KVF_OK;
}
#endif

/* Flat copies k..k+m-1 of q's lists, one call. */
static kvf_status dma_flat(cuda_queue *q, size_t k, size_t m)
{
    if (m == 1) {
        CUDA_RET(
            cudaMemcpyAsync(q->dsts[k], q->srcs[k], q->sizes[k], cudaMemcpyDefault, q->stream));
        return KVF_OK;
    }
#if CUDART_VERSION >= 12080
    {
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof attr);
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
        CUDA_RET(cudaMemcpyBatchAsync(q->dsts + k, q->srcs + k, q->sizes + k, m, &attr, &attr_idx,
                                      1, q->stream));
#else
        size_t fail_idx = 0;
        CUDA_RET(cudaMemcpyBatchAsync(q->dsts + k, (void **)(q->srcs + k), q->sizes + k, m, &attr,
                                      &attr_idx, 1, &fail_idx, q->stream));
#endif
    }
#else
    for (size_t i = k; i < k + m; i++)
        CUDA_RET(
            cudaMemcpyAsync(q->dsts[i], q->srcs[i], q->sizes[i], cudaMemcpyDefault, q->stream));
#endif
    return KVF_OK;
}

/* Copy-engine path: merged contiguous copies (and the rows of wide 2-D
 * copies) in batched calls (see the groups below), other 2-D copies in one
 * 3-D batch call. */
#define DMA_FLAT_ROWS_FROM ((size_t)64 << 10)
static kvf_status submit_dma(cuda_backend *b, cuda_queue *q, const kvf__copy *copies, size_t n,
                             kvf__copy_done_fn done, void *arg)
{
    kvf_status st;
    size_t nflat = 0, n2d = 0, flat_need = 0;
    /* 2-D copies of wide rows go as one flat copy per row: the copy engines
     * move a batch of flat copies faster than the same rows as 2-D ops */
    for (size_t i = 0; i < n; i++)
        flat_need += copy_contiguous(&copies[i]) || copies[i].width < DMA_FLAT_ROWS_FROM
                         ? 1
                         : copies[i].rows;
    if ((st = grow_flat(q, flat_need)) != KVF_OK)
        return st;
#if KVF_CUDA_3D_BATCH
    if ((st = grow_3d(q, n)) != KVF_OK)
        return st;
#endif
    uint32_t idx;
    batch_record *r = reserve(q, 0, &idx);
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (c->width == 0 || c->rows == 0)
            continue;
        bool flat = copy_contiguous(c);
        if (flat || c->width >= DMA_FLAT_ROWS_FROM) {
            size_t nrows = flat ? 1 : c->rows, len = flat ? c->width * c->rows : c->width;
            for (size_t row = 0; row < nrows; row++) {
                char *d = (char *)c->dst + row * c->dpitch;
                const char *sr = (const char *)c->src + row * c->spitch;
                if (nflat > 0 && (char *)q->dsts[nflat - 1] + q->sizes[nflat - 1] == d &&
                    (const char *)q->srcs[nflat - 1] + q->sizes[nflat - 1] == sr) {
                    q->sizes[nflat - 1] += len;
                    continue;
                }
                q->dsts[nflat] = d;
                q->srcs[nflat] = sr;
                q->sizes[nflat] = len;
                nflat++;
            }
            continue;
        }
#if KVF_CUDA_3D_BATCH
        struct cudaMemcpy3DBatchOp *o = &q->ops3d[n2d];
        memset(o, 0, sizeof *o);
        o->src.type = cudaMemcpyOperandTypePointer;
        o->src.op.ptr.ptr = (void *)c->src;
        o->src.op.ptr.rowLength = c->spitch;
        o->src.op.ptr.layerHeight = 0;
        o->dst.type = cudaMemcpyOperandTypePointer;
        o->dst.op.ptr.ptr = c->dst;
        o->dst.op.ptr.rowLength = c->dpitch;
        o->dst.op.ptr.layerHeight = 0;
        o->extent = make_cudaExtent(c->width, c->rows, 1);
        o->srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        n2d++;
#else
        CUDA_GOTO(cudaMemcpy2DAsync(c->dst, c->dpitch, c->src, c->spitch, c->width, c->rows,
                                    cudaMemcpyDefault, q->stream),
                  st, fail);
        n2d++;
#endif
    }
    /* in calls of 2, 2, 4, 8... copies: cudaMemcpyBatchAsync takes host
     * time per copy before the engines start, so the first copies go on
     * their way while the rest are handed over (worth 1-5 GB/s at 1-4 MiB
     * blocks in `kvferry bench --compare`) */
    for (size_t k = 0, grp = 2; k < nflat;) {
        size_t m = nflat - k < grp ? nflat - k : grp;
        if ((st = dma_flat(q, k, m)) != KVF_OK)
            goto fail;
        k += m;
        if (k > 2)
            grp *= 2;
    }
#if KVF_CUDA_3D_BATCH
    if (n2d == 1) {
        const struct cudaMemcpy3DBatchOp *o = &q->ops3d[0];
        CUDA_GOTO(cudaMemcpy2DAsync(o->dst.op.ptr.ptr, o->dst.op.ptr.rowLength, o->src.op.ptr.ptr,
                                    o->src.op.ptr.rowLength, o->extent.width, o->extent.height,
                                    cudaMemcpyDefault, q->stream),
                  st, fail);
    } else if (n2d > 1) {
        CUDA_GOTO(cudaMemcpy3DBatchAsync(n2d, q->ops3d, 0, q->stream), st, fail);
    }
#endif
    if ((st = finish_record(b, q, r, n, done, arg)) != KVF_OK)
        goto fail;
    return KVF_OK;
fail:
    CUDA_IGNORE(cudaStreamSynchronize(q->stream));
    unreserve(r);
    return st;
}

/* ---- staged path --------------------------------------------------------
 *
 * PyTorch's shape (gather in HBM, one large DMA) for batches whose host
 * sides tile one pinned range: every copy has the same shape (`rows` rows
 * of `width` bytes, `hpitch` apart on the host side, `dpitch` on the
 * device side; a contiguous copy is one row) and the host blocks are all
 * of lo + k * stride for k < count, stride = rows * hpitch, each once, in
 * any order (the secondary slots of an engine part). Offload: a kernel on
 * `aux` packs the blocks of chunk k into a staging slot in device memory,
 * then one DMA on the queue's stream (2-D when the host rows are strided)
 * writes them to the host while the kernel packs chunk k + 1. Onboard: one
 * DMA per chunk into a slot, then a kernel scatters it. The copy engines
 * see runs of up to STAGE_CHUNK bytes; the kernels move bytes inside HBM.
 */

typedef struct stage_plan {
    uintptr_t lo; /* host address of block 0 */
    size_t rows, width, hpitch, dpitch;
    size_t stride, count;
} stage_plan;

static kvf_status grow_scratch(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return KVF_OK;
    size_t c = *cap ? *cap : 256;
    while (c < n)
        c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: cannot grow staging scratch to %zu", c);
    *p = np;
    *cap = c;
    return KVF_OK;
}

/* Whether copies[0..n) fit the staged path (see above); fills *pl and
 * q->kidx[i], the host block of copy i. q->lock held. */
static bool staged_fits(cuda_backend *b, cuda_queue *q, const kvf__copy *copies, size_t n,
                        bool to_host, stage_plan *pl)
{
    size_t rows = 0, width = 0, hp = 0, dp = 0, count = 0;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (!c->width || !c->rows)
            continue;
        size_t r = c->rows, w = c->width;
        size_t h = to_host ? c->dpitch : c->spitch, d = to_host ? c->spitch : c->dpitch;
        if (copy_contiguous(c)) {
            w *= r;
            r = 1;
            h = d = w;
        }
        if (count == 0) {
            rows = r;
            width = w;
            hp = h;
            dp = d;
        } else if (r != rows || w != width || (r > 1 && (h != hp || d != dp))) {
            return false;
        }
        uintptr_t a = (uintptr_t)(to_host ? c->dst : c->src);
        lo = a < lo ? a : lo;
        hi = a > hi ? a : hi;
        count++;
    }
    size_t block = rows * width, stride = rows * hp;
    /* a chunk holds whole blocks, and no more of them than one launch takes */
    if (count < 2 || count > UINT32_MAX || block < STAGE_CHUNK / CHUNK_DESCS ||
        block > STAGE_CHUNK || hi - lo != (count - 1) * stride)
        return false;
    if (grow_scratch((void **)&q->bits, &q->bits_cap, (count + 63) / 64, sizeof *q->bits) !=
            KVF_OK ||
        grow_scratch((void **)&q->kidx, &q->kidx_cap, n, sizeof *q->kidx) != KVF_OK ||
        grow_scratch((void **)&q->kinv, &q->kinv_cap, count, sizeof *q->kinv) != KVF_OK)
        return false;
    memset(q->bits, 0, (count + 63) / 64 * sizeof *q->bits);
    /* block index by a reciprocal (a 64-bit division per copy costs more
     * than the rest of the pass), checked exactly */
    double inv = 1.0 / (double)stride;
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (!c->width || !c->rows)
            continue;
        size_t off = (uintptr_t)(to_host ? c->dst : c->src) - lo;
        size_t k = (size_t)((double)off * inv + 0.5);
        if (k >= count || k * stride != off || (q->bits[k / 64] >> (k % 64) & 1u))
            return false;
        q->bits[k / 64] |= (uint64_t)1 << (k % 64);
        q->kidx[i] = (uint32_t)k;
        q->kinv[k] = (uint32_t)i;
    }
    /* count distinct blocks in [0, count): all of them; the DMAs stay
     * inside one pinned allocation */
    if (!pinned_covers(b, lo, hi + (rows - 1) * hp + width))
        return false;
    *pl = (stage_plan){lo, rows, width, hp, dp, stride, count};
    return true;
}

/* The DMA of nb blocks between the host range and a staging slot: one
 * contiguous run, or rows of `width` at the host's pitch (packed in the
 * slot). */
static cudaError_t stage_dma(const stage_plan *pl, bool to_host, char *host, uint8_t *stage,
                             size_t nb, cudaStream_t s)
{
    if (pl->rows == 1 || pl->hpitch == pl->width) {
        size_t len = nb * pl->rows * pl->width;
        return to_host ? cudaMemcpyAsync(host, stage, len, cudaMemcpyDeviceToHost, s)
                       : cudaMemcpyAsync(stage, host, len, cudaMemcpyHostToDevice, s);
    }
    size_t w = pl->width, h = nb * pl->rows;
    return to_host ? cudaMemcpy2DAsync(host, pl->hpitch, stage, w, w, h, cudaMemcpyDeviceToHost, s)
                   : cudaMemcpy2DAsync(stage, w, host, pl->hpitch, w, h, cudaMemcpyHostToDevice, s);
}

static kvf_status submit_staged(cuda_backend *b, cuda_queue *q, const kvf__copy *copies, size_t n,
                                bool to_host, const stage_plan *pl, kvf__copy_done_fn done,
                                void *arg)
{
    kvf_status st;
    const size_t C = STAGE_CHUNK, block = pl->rows * pl->width;
    const size_t bpc = C / block; /* blocks per chunk */
    const size_t nchunks = (pl->count + bpc - 1) / bpc;
    /* chunks per launch group: their descriptors fit one ring reservation */
    const size_t cpg = CHUNK_DESCS / bpc;
    const uint32_t tpr = (uint32_t)((pl->width + KVF_CUDA_TILE_BYTES - 1) / KVF_CUDA_TILE_BYTES);
    const uint64_t tiles_per_block = (uint64_t)tpr * pl->rows;
    if (!q->stage)
        CUDA_RET(cudaMalloc((void **)&q->stage, (size_t)STAGE_SLOTS * C));

    /* the kernels follow everything queued before on this queue; after a
     * staged batch there is nothing to wait for: its DMAs touched only host
     * memory and staging slots (ordered by ev_free), its kernels ran on aux */
    if (q->main_dirty) {
        CUDA_RET(cudaEventRecord(q->ev_start, q->stream));
        CUDA_RET(cudaStreamWaitEvent(q->aux, q->ev_start, 0));
        q->main_dirty = false;
    }
    for (size_t k = 0; k < nchunks;) {
        /* groups of 1, 1, 2, 4... chunks: the GPU starts on the first
         * chunk while the descriptors of the rest are written */
        size_t grp = k == 0 ? 1 : k < cpg ? k : cpg;
        size_t k1 = k + grp < nchunks ? k + grp : nchunks;
        size_t b0 = k * bpc, b1 = k1 * bpc < pl->count ? k1 * bpc : pl->count;
        uint32_t nd = (uint32_t)(b1 - b0), idx;
        batch_record *r = reserve(q, nd, &idx);
        /* descriptor j of the group is host block b0 + j: chunk by chunk,
         * each block's tiles after those of the blocks before it */
        kvf__cuda_desc *ring = q->ring_host + idx;
        uint64_t slot0 = q->stage_next;
        for (size_t kb = b0; kb < b1; kb++) {
            const kvf__copy *c = &copies[q->kinv[kb]];
            size_t ck = kb / bpc, in = kb - ck * bpc;
            uint64_t sp =
                (uint64_t)(uintptr_t)(q->stage + ((slot0 + ck - k) % STAGE_SLOTS) * C + in * block);
            uint64_t dv = (uint64_t)(uintptr_t)(to_host ? c->src : c->dst);
            kvf__cuda_desc *d = &ring[kb - b0];
            d->dst = to_host ? sp : dv;
            d->src = to_host ? dv : sp;
            d->dpitch = to_host ? pl->width : pl->dpitch;
            d->spitch = to_host ? pl->dpitch : pl->width;
            d->tile_begin = in * tiles_per_block;
            d->width = (uint32_t)pl->width;
            d->tiles_per_row = tpr;
        }
        CUDA_GOTO(cudaMemcpyAsync(q->ring_dev + idx, ring, nd * sizeof *ring,
                                  cudaMemcpyHostToDevice, q->aux),
                  st, fail);
        for (; k < k1; k++) {
            size_t slot = q->stage_next++ % STAGE_SLOTS;
            uint8_t *stage = q->stage + slot * C;
            size_t first = k * bpc, nb = pl->count - first < bpc ? pl->count - first : bpc;
            char *host = (char *)pl->lo + first * pl->stride;
            const kvf__cuda_desc *descs = q->ring_dev + idx + (first - b0);
            uint64_t tiles = nb * tiles_per_block;
            cudaStream_t ds = q->stream;
            if (to_host) {
                CUDA_GOTO(cudaStreamWaitEvent(q->aux, q->ev_free[slot], 0), st, fail);
                CUDA_GOTO(kvf__cuda_copy_launch(descs, (uint32_t)nb, tiles, b->grid, q->aux), st,
                          fail);
                CUDA_GOTO(cudaEventRecord(q->ev_ready, q->aux), st, fail);
                CUDA_GOTO(cudaStreamWaitEvent(ds, q->ev_ready, 0), st, fail);
                CUDA_GOTO(stage_dma(pl, true, host, stage, nb, ds), st, fail);
                CUDA_GOTO(cudaEventRecord(q->ev_free[slot], ds), st, fail);
            } else {
                CUDA_GOTO(cudaStreamWaitEvent(ds, q->ev_free[slot], 0), st, fail);
                CUDA_GOTO(stage_dma(pl, false, host, stage, nb, ds), st, fail);
                CUDA_GOTO(cudaEventRecord(q->ev_ready, ds), st, fail);
                CUDA_GOTO(cudaStreamWaitEvent(q->aux, q->ev_ready, 0), st, fail);
                CUDA_GOTO(kvf__cuda_copy_launch(descs, (uint32_t)nb, tiles, b->grid, q->aux), st,
                          fail);
                CUDA_GOTO(cudaEventRecord(q->ev_free[slot], q->aux), st, fail);
            }
        }
        /* the record's callback (and the batch's end) after the last
         * step: offload's last DMA (which waited for every gather), or
         * onboard's last scatter on aux, where the next DMAs need not wait
         * for it */
        if ((st = finish_record_on(b, q, to_host ? q->stream : q->aux, r, nd,
                                   k == nchunks ? done : NULL, arg)) != KVF_OK)
            goto fail;
        if (!to_host)
            q->aux_open = true;
        continue;
    fail:
        CUDA_IGNORE(cudaStreamSynchronize(q->aux));
        CUDA_IGNORE(cudaStreamSynchronize(q->stream));
        unreserve(r);
        return st;
    }
    return KVF_OK;
}

/* AUTO's rule. Each threshold is where one path overtakes another in
 * bench/cuda_paths.c (the paths alone) and `kvferry bench --compare`
 * (through the engine); docs/performance.md has the figures.
 *  - whole blocks below AUTO_STAGED_BELOW whose host blocks tile one
 *    pinned range (an engine part of secondary slots): staged, because one
 *    DMA per chunk beats both per-block DMA setup and the kernel's mapped
 *    accesses there. From that size dma moves as much, both ways at once
 *    too (staged stops short both ways), and leaves the SMs free.
 *  - other host<->device batches whose mean contiguous run is below
 *    AUTO_KERNEL_BELOW: kernel, because each batched DMA copy costs engine
 *    setup and host time that small copies cannot hide; a few SMs already
 *    reach the one-way rate.
 *  - 2-D partial copies: kernel while rows are short, dma (wide rows sent
 *    as flat batched copies) from AUTO_ROWS_DMA_FROM, where the copy
 *    engines win, above all with both directions in flight.
 *  - device<->device: kernel, which beats batched copies at every block
 *    size, unless the mean run reaches AUTO_D2D_DMA_FROM, where one copy
 *    nears the rate of a single large copy.
 * Pageable memory always goes by dma: the kernel cannot reach it. */
#define AUTO_KERNEL_BELOW (256u * 1024u)
#define AUTO_STAGED_BELOW ((size_t)256 << 10)
#define AUTO_ROWS_DMA_FROM ((size_t)128 << 10)
#define AUTO_D2D_DMA_FROM ((size_t)64 << 20)

/* *stage_p: 1 when the batch moves device->host and 0 host->device, with
 * pinned host memory, where the staged path may take it; -1 otherwise. */
static int choose_path(cuda_backend *b, const kvf__copy *copies, size_t n, int *stage_p)
{
    *stage_p = -1;
    if (!b->kernel_ok || b->mode == KVF_CUDA_COPY_DMA)
        return PATH_DMA;
    /* the first copy's pointers classify the batch: the engine's batches
     * move between one pair of pool kinds */
    const kvf__copy *first = NULL;
    for (size_t i = 0; i < n && !first; i++)
        if (copies[i].width && copies[i].rows)
            first = &copies[i];
    if (!first)
        return PATH_DMA;
    enum cudaMemoryType td = pointer_type(first->dst), ts = pointer_type(first->src);
    if (td == cudaMemoryTypeUnregistered || ts == cudaMemoryTypeUnregistered ||
        batch_touches_pageable(b, copies, n)) {
        if (b->mode == KVF_CUDA_COPY_KERNEL)
            KVF_LOG(KVF_LOG_DEBUG, "cuda: batch touches pageable memory: dma instead of kernel");
        return PATH_DMA;
    }
    if (b->mode == KVF_CUDA_COPY_KERNEL)
        return PATH_KERNEL;
    if (td == cudaMemoryTypeHost && ts == cudaMemoryTypeDevice)
        *stage_p = 1;
    else if (td == cudaMemoryTypeDevice && ts == cudaMemoryTypeHost)
        *stage_p = 0;
    size_t runs = 0, bytes = 0, strided = 0;
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (!c->width || !c->rows)
            continue;
        if (copy_contiguous(c)) {
            runs++;
        } else {
            runs += c->rows;
            strided++;
        }
        bytes += c->width * c->rows;
    }
    if (td == cudaMemoryTypeDevice && ts == cudaMemoryTypeDevice)
        return !strided && bytes / runs >= AUTO_D2D_DMA_FROM ? PATH_DMA : PATH_KERNEL;
    /* AUTO stages whole blocks below AUTO_STAGED_BELOW; the staged mode
     * (tests, benchmarks) whatever fits */
    if (b->mode != MODE_STAGED && (strided || bytes / runs >= AUTO_STAGED_BELOW))
        *stage_p = -1;
    if (strided)
        return bytes / runs < AUTO_ROWS_DMA_FROM ? PATH_KERNEL : PATH_DMA;
    return bytes / runs < AUTO_KERNEL_BELOW ? PATH_KERNEL : PATH_DMA;
}

static kvf_status cuda_copy_async(kvf__backend *base, kvf__queue queue, const kvf__copy *copies,
                                  size_t n, kvf__copy_done_fn done, void *arg)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    if ((unsigned)queue >= KVF_QUEUE_COUNT)
        return kvf__fail(KVF_ERR_INVALID, "cuda: queue %d", (int)queue);
    if ((st = check_copies(copies, n)) != KVF_OK)
        return st;
    if ((st = dev_enter(b, &g)) != KVF_OK)
        return st;
    cuda_queue *q = &b->q[queue];
    int to_host;
    int path = choose_path(b, copies, n, &to_host);
    stage_plan pl;
    pthread_mutex_lock(&q->lock);
    if (to_host >= 0 && staged_fits(b, q, copies, n, to_host == 1, &pl))
        path = PATH_STAGED;
    if (path == PATH_STAGED) {
        st = submit_staged(b, q, copies, n, to_host == 1, &pl, done, arg);
    } else {
        st = KVF_OK;
        if (q->aux_open) {
            /* after staged scatters: this batch's copies follow them */
            cudaError_t e1 = cudaEventRecord(q->ev_done, q->aux);
            cudaError_t e2 = e1 == cudaSuccess ? cudaStreamWaitEvent(q->stream, q->ev_done, 0) : e1;
            if (e2 != cudaSuccess)
                st = cuda_fail(e2, "cudaStreamWaitEvent(join)", __FILE__, __LINE__);
            else
                q->aux_open = false;
        }
        if (st == KVF_OK && path == PATH_KERNEL)
            st = submit_kernel(b, q, copies, n, done, arg);
        else if (st == KVF_OK)
            st = submit_dma(b, q, copies, n, done, arg);
        q->main_dirty = true;
    }
    atomic_store_explicit(&q->last_path, path, memory_order_relaxed);
    pthread_mutex_unlock(&q->lock);
    dev_leave(&g);
    return st;
}

static kvf_status cuda_sync_stream(kvf__backend *base, void *stream)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    if ((st = dev_enter(b, &g)) != KVF_OK)
        return st;
    for (int i = 0; i < KVF_QUEUE_COUNT && st == KVF_OK; i++) {
        cuda_queue *q = &b->q[i];
        pthread_mutex_lock(&q->lock);
        CUDA_GOTO(cudaEventRecord(q->sync_event, q->stream), st, unlock);
        CUDA_GOTO(cudaStreamWaitEvent((cudaStream_t)stream, q->sync_event, 0), st, unlock);
        CUDA_GOTO(cudaEventRecord(q->sync_event_aux, q->aux), st, unlock);
        CUDA_GOTO(cudaStreamWaitEvent((cudaStream_t)stream, q->sync_event_aux, 0), st, unlock);
    unlock:
        pthread_mutex_unlock(&q->lock);
    }
    dev_leave(&g);
    return st;
}

/* ---- create / destroy -------------------------------------------------- */

static void queue_drain(cuda_queue *q)
{
    if (q->aux)
        CUDA_IGNORE(cudaStreamSynchronize(q->aux));
    if (q->stream)
        CUDA_IGNORE(cudaStreamSynchronize(q->stream));
}

static void queue_destroy(cuda_queue *q, const char *name)
{
    queue_drain(q);
    if (q->full_waits)
        KVF_LOG(KVF_LOG_DEBUG, "cuda: %s queue: full %llu times, %.3f ms waited", name,
                (unsigned long long)q->full_waits, (double)q->full_wait_ns / 1e6);
    for (size_t i = 0; i < BATCH_RECORDS; i++)
        if (q->records[i].ev)
            CUDA_IGNORE(cudaEventDestroy(q->records[i].ev));
    cudaEvent_t *evs[] = {&q->ev_start, &q->ev_ready, &q->ev_done, &q->sync_event_aux};
    for (size_t i = 0; i < 4; i++)
        if (*evs[i])
            CUDA_IGNORE(cudaEventDestroy(*evs[i]));
    for (size_t i = 0; i < STAGE_SLOTS; i++)
        if (q->ev_free[i])
            CUDA_IGNORE(cudaEventDestroy(q->ev_free[i]));
    if (q->aux)
        CUDA_IGNORE(cudaStreamDestroy(q->aux));
    if (q->stage)
        CUDA_IGNORE(cudaFree(q->stage));
    free(q->bits);
    free(q->kidx);
    free(q->kinv);
    if (q->sync_event)
        CUDA_IGNORE(cudaEventDestroy(q->sync_event));
    if (q->stream)
        CUDA_IGNORE(cudaStreamDestroy(q->stream));
    if (q->ring_host)
        CUDA_IGNORE(cudaFreeHost(q->ring_host));
    if (q->ring_dev)
        CUDA_IGNORE(cudaFree(q->ring_dev));
    free(q->dsts);
    free(q->srcs);
    free(q->sizes);
#if KVF_CUDA_3D_BATCH
    free(q->ops3d);
#endif
    pthread_mutex_destroy(&q->lock);
}

static kvf_status queue_init(cuda_queue *q, int index, int priority)
{
    kvf_status st;
    q->index = index;
    pthread_mutex_init(&q->lock, NULL);
    CUDA_RET(cudaStreamCreateWithPriority(&q->stream, cudaStreamNonBlocking, priority));
    CUDA_RET(cudaStreamCreateWithPriority(&q->aux, cudaStreamNonBlocking, priority));
    CUDA_RET(cudaEventCreateWithFlags(&q->sync_event, cudaEventDisableTiming));
    CUDA_RET(cudaEventCreateWithFlags(&q->sync_event_aux, cudaEventDisableTiming));
    CUDA_RET(cudaEventCreateWithFlags(&q->ev_start, cudaEventDisableTiming));
    CUDA_RET(cudaEventCreateWithFlags(&q->ev_ready, cudaEventDisableTiming));
    CUDA_RET(cudaEventCreateWithFlags(&q->ev_done, cudaEventDisableTiming));
    for (size_t i = 0; i < STAGE_SLOTS; i++)
        CUDA_RET(cudaEventCreateWithFlags(&q->ev_free[i], cudaEventDisableTiming));
    for (size_t i = 0; i < BATCH_RECORDS; i++)
        CUDA_RET(cudaEventCreateWithFlags(&q->records[i].ev, cudaEventDisableTiming));
    CUDA_RET(cudaHostAlloc((void **)&q->ring_host, RING_DESCS * sizeof(kvf__cuda_desc),
                           cudaHostAllocPortable));
    CUDA_RET(cudaMalloc((void **)&q->ring_dev, RING_DESCS * sizeof(kvf__cuda_desc)));
    if ((st = grow_flat(q, 1024)) != KVF_OK)
        return st;
    return KVF_OK;
}

static void cuda_destroy(kvf__backend *base)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    if (!b)
        return;
    bool entered = dev_enter(b, &g) == KVF_OK;
    /* the watcher calls the last `done`s once the streams have drained */
    for (int i = 0; i < KVF_QUEUE_COUNT; i++)
        queue_drain(&b->q[i]);
    watcher_stop(b);
    for (int i = 0; i < KVF_QUEUE_COUNT; i++)
        queue_destroy(&b->q[i], i == KVF_QUEUE_OFFLOAD ? "offload" : "onboard");
    for (int i = 0; i < b->sync_free; i++) {
        CUDA_IGNORE(cudaEventDestroy(b->sync_events[i]));
        CUDA_IGNORE(cudaStreamDestroy(b->sync_streams[i]));
    }
    if (entered)
        dev_leave(&g);
    pthread_mutex_destroy(&b->sync_lock);
    pthread_mutex_destroy(&b->range_lock);
    pthread_mutex_destroy(&b->watch_mu);
    pthread_cond_destroy(&b->watch_cv);
    free(b->ranges);
    free(b->pinned);
    free(b);
}

void *kvf__cuda_queue_stream(struct kvf__backend *base, int queue)
{
    cuda_backend *b = (cuda_backend *)base;
    return (void *)b->q[queue].stream;
}

int kvf__cuda_last_path(struct kvf__backend *base, int queue)
{
    cuda_backend *b = (cuda_backend *)base;
    return atomic_load(&b->q[queue].last_path);
}

static const kvf__backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_register = cuda_mem_register,
    .mem_unregister = cuda_mem_unregister,
    .copy_sync = cuda_copy_sync,
    .copy_async = cuda_copy_async,
    .sync_stream = cuda_sync_stream,
};

static int copy_mode(const kvf_engine_config *cfg)
{
    int mode = KVF_CUDA_COPY_AUTO;
    if (cfg && cfg->struct_size >= offsetof(kvf_engine_config, cuda_copy) + sizeof cfg->cuda_copy)
        mode = cfg->cuda_copy;
    if (mode == KVF_CUDA_COPY_AUTO) {
        static const char *const names[] = {"kernel", "dma", "staged"};
        static const int values[] = {KVF_CUDA_COPY_KERNEL, KVF_CUDA_COPY_DMA, MODE_STAGED};
        int i = kvf__env_choice("KVF_CUDA_COPY", names, 3);
        if (i >= 0)
            mode = values[i];
    }
    return mode;
}

kvf_status kvf__cuda_backend_create(const kvf_engine_config *cfg, kvf__backend **backend_p)
{
    int count = 0;
    int device = cfg ? cfg->device : 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvf__fail(KVF_ERR_NO_DEVICE, "cuda: cudaGetDeviceCount: %s", cudaGetErrorString(e));
    }
    if (count == 0)
        return kvf__fail(KVF_ERR_NO_DEVICE, "cuda: no CUDA device");
    if (device < 0 || device >= count)
        return kvf__fail(KVF_ERR_NO_DEVICE, "cuda: device %d: only %d device(s)", device, count);

    cuda_backend *b = calloc(1, sizeof *b);
    if (!b)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: out of memory");
    b->base.ops = &cuda_ops;
    b->device = device;
    b->mode = copy_mode(cfg);
    b->grid = 32;
    if (cfg &&
        cfg->struct_size >=
            offsetof(kvf_engine_config, cuda_copy_sms) + sizeof cfg->cuda_copy_sms &&
        cfg->cuda_copy_sms)
        b->grid = cfg->cuda_copy_sms > 1024 ? 1024 : cfg->cuda_copy_sms;
    pthread_mutex_init(&b->sync_lock, NULL);
    pthread_mutex_init(&b->range_lock, NULL);
    pthread_mutex_init(&b->watch_mu, NULL);
    pthread_cond_init(&b->watch_cv, NULL);

    kvf_status st;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {
        (void)cudaGetLastError();
        prev = -1;
    }
    e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = kvf__fail(KVF_ERR_NO_DEVICE, "cuda: cudaSetDevice(%d): %s", device,
                       cudaGetErrorString(e));
        goto out_free;
    }
    int least = 0, greatest = 0, host_ptr_ok = 0, unified = 0;
    CUDA_GOTO(cudaDeviceGetStreamPriorityRange(&least, &greatest), st, out_free);
    CUDA_GOTO(
        cudaDeviceGetAttribute(&host_ptr_ok, cudaDevAttrCanUseHostPointerForRegisteredMem, device),
        st, out_free);
    CUDA_GOTO(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device), st, out_free);
    b->kernel_ok = host_ptr_ok && unified;
    if (!b->kernel_ok && b->mode == KVF_CUDA_COPY_KERNEL)
        KVF_LOG(KVF_LOG_WARN, "cuda: device %d cannot use host pointers directly: dma copies",
                device);
    if ((st = queue_init(&b->q[KVF_QUEUE_OFFLOAD], KVF_QUEUE_OFFLOAD, least)) != KVF_OK)
        goto out_free;
    if ((st = queue_init(&b->q[KVF_QUEUE_ONBOARD], KVF_QUEUE_ONBOARD, greatest)) != KVF_OK)
        goto out_free;
    int perr = pthread_create(&b->watcher, NULL, watcher_main, b);
    if (perr != 0) {
        st = kvf__fail(kvf__errno_status(perr), "cuda: cannot start the completion thread: %s",
                       strerror(perr));
        goto out_free;
    }
    b->watcher_started = true;
    /* leave the creating thread on the device it was on */
    if (prev >= 0 && prev != device)
        CUDA_IGNORE(cudaSetDevice(prev));
    KVF_LOG(KVF_LOG_INFO, "cuda: device %d, copies by %s, kernel grid %u", device,
            b->mode == KVF_CUDA_COPY_KERNEL ? "kernel"
            : b->mode == KVF_CUDA_COPY_DMA  ? "dma"
            : b->mode == MODE_STAGED        ? "staged"
                                            : "auto",
            b->grid);
    *backend_p = &b->base;
    return KVF_OK;
out_free:
    cuda_destroy(&b->base);
    if (prev >= 0 && prev != device)
        CUDA_IGNORE(cudaSetDevice(prev));
    return st;
}

/* ---- machine information ----------------------------------------------- */

void kvf__cuda_info(kvf_info *info)
{
    info->cuda_built = 1;
    info->cuda_runtime = CUDART_VERSION;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        info->cuda_devices = 0;
        snprintf(info->cuda_error, sizeof info->cuda_error, "%s", cudaGetErrorString(e));
    } else {
        info->cuda_devices = count;
        if (count == 0) {
            snprintf(info->cuda_error, sizeof info->cuda_error, "no CUDA device");
        } else {
            struct cudaDeviceProp p;
            e = cudaGetDeviceProperties(&p, 0);
            if (e == cudaSuccess) {
                snprintf(info->device_name, sizeof info->device_name, "%.127s", p.name);
            } else {
                (void)cudaGetLastError();
                snprintf(info->cuda_error, sizeof info->cuda_error, "%s", cudaGetErrorString(e));
            }
        }
    }
    void *h = dlopen("libcufile.so.0", RTLD_LAZY | RTLD_LOCAL);
    info->cufile_present = h != NULL;
    if (h)
        dlclose(h);
}
