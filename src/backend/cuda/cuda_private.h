/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the files of the CUDA backend share; nothing here is part of the API.
 *
 * The backend keeps device memory and pinned host memory, two transfer
 * queues (offload at normal priority, onboard at the highest), each with a
 * stream, a descriptor ring and a FIFO of batch records, and the ways to
 * move a batch of scattered 2-D copies (cuda_paths.h lists them, in the
 * order AUTO tries them):
 *
 *  kernel  a gather/scatter kernel (cuda_kernels.cu) that walks an array of
 *          copy descriptors, reading and writing mapped pinned host memory
 *          directly. Descriptors are written into a pinned ring and uploaded
 *          with one copy per batch; nothing is allocated per call.
 *  dma     copy engines only: adjacent copies merged, contiguous ones in one
 *          cudaMemcpyBatchAsync, 2-D ones in one cudaMemcpy3DBatchAsync
 *          (per-copy cudaMemcpy2DAsync before CUDA 13).
 *  staged  blocks that tile one pinned range are gathered (or scattered) in
 *          device memory by the kernel around one DMA per staging chunk.
 *
 * AUTO gives a batch to the first path whose rule (its `fits`) takes it;
 * each rule's thresholds are set by bench/cuda_paths.c and `kvferry bench
 * --compare` (figures in docs/performance.md).
 *
 * Files, one job each:
 *   cuda.c              the ops table, create and destroy
 *   cuda_error.c        cudaError_t to kvf_status (the CUDA_* macros below)
 *   cuda_device.c       the device guard of every entry point
 *   cuda_registry.c     pageable and pinned host ranges, pointer kinds
 *   cuda_memory.c       mem_alloc / mem_free / mem_register / mem_unregister
 *   cuda_sync.c         copy_sync on pooled streams
 *   cuda_queue.c        a transfer queue: streams, ring, batch records
 *   cuda_watch.c        the completion watcher thread
 *   cuda_copy.c         copy_async (a path per batch) and sync_stream
 *   cuda_paths.c        the table of paths, a batch's description, the pick
 *   cuda_path_kernel.c  the kernel path
 *   cuda_path_dma.c     the copy-engine path
 *   cuda_path_staged.c  the staged path
 *   cuda_info.c         kvf_info's CUDA fields
 *
 * Every CUDA call goes through CUDA_RET / CUDA_GOTO / CUDA_IGNORE, which
 * translate cudaError_t to kvf_status once, record the detail for
 * kvf_last_error() and clear CUDA's sticky error.
 *
 * Contract of copy_async beyond backend.h: copies within one batch must not
 * overlap each other (they may run in any order); on KVF_OK `done` is called
 * exactly once, on the backend's completion thread; on an error nothing of
 * the batch is left in flight and `done` is not called.
 */
#ifndef KVF_CUDA_PRIVATE_H
#define KVF_CUDA_PRIVATE_H

#include "backend.h"
#include "log.h"
#include "status.h"
#include "timeline.h"

#include "cuda_kernels.h"

#include "cuda_paths.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* ---- error translation (cuda_error.c) ---------------------------------- */

/* Translates err, raised by the call `expr` at file:line, into a status
 * with its detail recorded; clears CUDA's sticky error. */
KVF_INTERNAL kvf_status kvf__cuda_fail(cudaError_t err, const char *expr, const char *file,
                                       int line);
/* The same, only logged as a warning (cleanup keeps the first error). */
KVF_INTERNAL void kvf__cuda_warn(cudaError_t err, const char *expr, const char *file, int line);
/* cudaGetErrorString, but "no NVIDIA driver" where there is none. */
KVF_INTERNAL const char *kvf__cuda_error_str(cudaError_t err);

#define CUDA_RET(expr)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return kvf__cuda_fail(e_, #expr, __FILE__, __LINE__);                                  \
    } while (0)

#define CUDA_GOTO(expr, st, label)                                                                 \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (st) = kvf__cuda_fail(e_, #expr, __FILE__, __LINE__);                                  \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* For cleanup: logs, keeps the first error's detail. */
#define CUDA_IGNORE(expr)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            kvf__cuda_warn(e_, #expr, __FILE__, __LINE__);                                         \
    } while (0)

/* ---- the backend's state ----------------------------------------------- */

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
    /* each path's own state on this queue (its scratch, staging memory),
     * made at its first use (queue_path_state), ended by its fini */
    void *path_state[KVF__CUDA_PATH_END];
    atomic_int last_path; /* kvf__cuda_path */
    /* reserve() found the queue full: times, and nanoseconds waited
     * (reported at destroy with KVF_LOG=debug) */
    uint64_t full_waits, full_wait_ns;
    /* a second stream, for a path that overlaps two kinds of work (the
     * staged path's kernels run on `aux`, its DMAs on `stream`) */
    cudaStream_t aux;
    cudaEvent_t ev_start, ev_done;
    /* stream order of the queue across both streams: main_dirty, work on
     * `stream` that may touch device memory and that `aux` has not waited
     * for; aux_open, work on `aux` that `stream` has not waited for */
    bool main_dirty, aux_open;
    cudaEvent_t sync_event_aux;
} cuda_queue;

typedef struct host_range {
    uintptr_t begin, end;
} host_range;

struct cuda_backend {
    kvf__backend base;
    int device;
    int forced; /* the path KVF_CUDA_COPY names; NONE: AUTO's choice */
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

/* ---- the device guard (cuda_device.c) ---------------------------------- */

/* Makes b's device current on the calling thread and restores the
 * caller's device afterwards, so an application thread is left as it was. */
typedef struct dev_guard {
    int prev;
} dev_guard;

KVF_INTERNAL kvf_status kvf__cuda_dev_enter(const cuda_backend *b, dev_guard *g);
KVF_INTERNAL void kvf__cuda_dev_leave(const dev_guard *g);

/* ---- host ranges and pointer kinds (cuda_registry.c) ------------------- */

/* Pageable ranges (HOST kind), which the kernel path cannot touch. */
KVF_INTERNAL void kvf__cuda_ranges_add(cuda_backend *b, void *ptr, size_t bytes);
KVF_INTERNAL void kvf__cuda_ranges_remove(cuda_backend *b, void *ptr);
/* Whether any of copies[0..n) touches pageable memory the backend knows of. */
KVF_INTERNAL bool kvf__cuda_touches_pageable(cuda_backend *b, const kvf__copy *copies, size_t n);
/* Pinned ranges the backend allocated or registered: one DMA of the staged
 * path stays inside one of them. */
KVF_INTERNAL void kvf__cuda_pinned_add(cuda_backend *b, void *ptr, size_t bytes);
KVF_INTERNAL void kvf__cuda_pinned_remove(cuda_backend *b, void *ptr);
/* Whether [lo, hi) lies inside one known pinned range. */
KVF_INTERNAL bool kvf__cuda_pinned_covers(cuda_backend *b, uintptr_t lo, uintptr_t hi);
/* cudaMemoryTypeDevice, cudaMemoryTypeHost (pinned, mapped at its own
 * address), or cudaMemoryTypeUnregistered (pageable, or unknown to CUDA). */
KVF_INTERNAL enum cudaMemoryType kvf__cuda_pointer_type(const void *p);

/* ---- the backend's operations (cuda_memory.c, cuda_sync.c, cuda_copy.c) */

KVF_INTERNAL kvf_status kvf__cuda_mem_alloc(kvf__backend *base, kvf_memory kind, size_t bytes,
                                            void **ptr_p);
KVF_INTERNAL void kvf__cuda_mem_free(kvf__backend *base, kvf_memory kind, void *ptr);
KVF_INTERNAL kvf_status kvf__cuda_mem_register(kvf__backend *base, kvf_memory kind, void *ptr,
                                               size_t bytes, bool *registered_p);
KVF_INTERNAL void kvf__cuda_mem_unregister(kvf__backend *base, kvf_memory kind, void *ptr);
KVF_INTERNAL kvf_status kvf__cuda_copy_sync(kvf__backend *base, kvf__queue queue,
                                            const kvf__copy *copies, size_t n);
KVF_INTERNAL kvf_status kvf__cuda_copy_async(kvf__backend *base, kvf__queue queue,
                                             const kvf__copy *copies, size_t n, unsigned flags,
                                             kvf__copy_done_fn done, void *arg);
KVF_INTERNAL kvf_status kvf__cuda_sync_stream(kvf__backend *base, void *stream);
KVF_INTERNAL kvf_status kvf__cuda_mark(kvf__backend *base, void *stream, void **mark_p);
KVF_INTERNAL kvf_status kvf__cuda_mark_gate(kvf__backend *base, kvf__queue queue, void *mark);
KVF_INTERNAL kvf_status kvf__cuda_mark_wait(kvf__backend *base, void *mark);
KVF_INTERNAL void kvf__cuda_mark_free(kvf__backend *base, void *mark);
KVF_INTERNAL kvf_status kvf__cuda_queue_mark(kvf__backend *base, kvf__queue queue, void **mark_p);
KVF_INTERNAL kvf_status kvf__cuda_mark_join(kvf__backend *base, void *mark, void *stream);

/* ---- copies: common ---------------------------------------------------- */

static inline bool copy_contiguous(const kvf__copy *c)
{
    return c->rows == 1 || (c->width == c->dpitch && c->width == c->spitch);
}

/* KVF_ERR_INVALID for a non-empty copy with a NULL pointer or a pitch
 * below its width. */
KVF_INTERNAL kvf_status kvf__cuda_check_copies(const kvf__copy *copies, size_t n);

/* ---- pooled streams of copy_sync (cuda_sync.c) ------------------------- */

/* A stream and its blocking-sync event, from the pool or new. */
KVF_INTERNAL kvf_status kvf__cuda_sync_stream_get(cuda_backend *b, cudaStream_t *s_p,
                                                  cudaEvent_t *ev_p);
/* Back to the pool, or destroyed when the pool is full. */
KVF_INTERNAL void kvf__cuda_sync_stream_put(cuda_backend *b, cudaStream_t s, cudaEvent_t ev);
/* Waits for everything queued on s, asleep. */
KVF_INTERNAL kvf_status kvf__cuda_sync_stream_wait(cudaStream_t s, cudaEvent_t ev);

/* ---- transfer queues (cuda_queue.c) ------------------------------------ */

KVF_INTERNAL kvf_status kvf__cuda_queue_init(cuda_queue *q, int index, int priority);
/* Waits for both streams of q. */
KVF_INTERNAL void kvf__cuda_queue_drain(cuda_queue *q);
KVF_INTERNAL void kvf__cuda_queue_destroy(cuda_queue *q, const char *name);
/* Reserves a batch record and, when ndesc > 0, ndesc contiguous ring
 * entries; waits (without CUDA calls) while the queue is full. Returns the
 * ring index of the first entry. Called with q->lock held. */
KVF_INTERNAL batch_record *kvf__cuda_reserve(cuda_queue *q, uint32_t ndesc, uint32_t *index_p);
/* A reserved record whose work never got queued: retire it in place. */
KVF_INTERNAL void kvf__cuda_unreserve(batch_record *r);
/* Ends record r of q, holding `ncopies` copies, after the work queued so
 * far on `s`: its event, then the watcher's eye on it. On failure the
 * caller unwinds. */
KVF_INTERNAL kvf_status kvf__cuda_finish_record_on(cuda_backend *b, cuda_queue *q, cudaStream_t s,
                                                   batch_record *r, size_t ncopies,
                                                   kvf__copy_done_fn done, void *arg);
/* The same on q's main stream. */
KVF_INTERNAL kvf_status kvf__cuda_finish_record(cuda_backend *b, cuda_queue *q, batch_record *r,
                                                size_t ncopies, kvf__copy_done_fn done, void *arg);

/* A record's name in the timeline. */
static inline uint64_t record_tl_id(const cuda_queue *q, const batch_record *r)
{
    return (uint64_t)q->index << 56 | atomic_load_explicit(&r->pos, memory_order_relaxed);
}

/* ---- the completion watcher (cuda_watch.c) ----------------------------- */

KVF_INTERNAL kvf_status kvf__cuda_watcher_start(cuda_backend *b);
/* Wakes the watcher when it sleeps: a record has been armed. */
KVF_INTERNAL void kvf__cuda_watcher_wake(cuda_backend *b);
/* Ends the watcher once every record has ended (the streams drained). */
KVF_INTERNAL void kvf__cuda_watcher_stop(cuda_backend *b);

/* ---- the order of a queue's two streams (cuda_copy.c) ----------------- */

/* For a path that queues a batch on q's main stream only: the batch
 * follows the work on `aux` that the main stream has not waited for, and
 * the next work on `aux` will follow it. q->lock held. */
KVF_INTERNAL kvf_status kvf__cuda_main_only(cuda_queue *q);
/* The next work on `aux` follows what the main stream holds that may touch
 * device memory. q->lock held. */
KVF_INTERNAL kvf_status kvf__cuda_aux_after_main(cuda_queue *q);

/* ---- the copy paths (cuda_paths.c, cuda_path_*.c) ---------------------- */

/* What the paths' rules read of a batch, found once per batch before the
 * queue's lock is taken (kvf__cuda_batch_classify). */
typedef struct cuda_batch {
    const kvf__copy *copies;
    size_t n;
    unsigned flags; /* copy_async's */
    /* the memory of the first non-empty copy's two sides (the engine's
     * batches move between one pair of pool kinds) */
    enum cudaMemoryType dst_kind, src_kind;
    bool empty;     /* no copy moves a byte */
    bool reachable; /* the kernel can touch both sides of every copy: none is
                       pageable or unknown to CUDA */
    size_t runs;    /* contiguous runs: a copy each, or a row each if strided */
    size_t bytes;   /* moved in all */
    size_t strided; /* copies whose rows lie apart */
} cuda_batch;

/* Whether bt moves memory of kind `dst` from memory of kind `src`. */
static inline bool batch_between(const cuda_batch *bt, enum cudaMemoryType dst,
                                 enum cudaMemoryType src)
{
    return bt->dst_kind == dst && bt->src_kind == src;
}

/* Bytes per contiguous run; bt not empty. */
static inline size_t batch_mean_run(const cuda_batch *bt)
{
    return bt->bytes / bt->runs;
}

/* Describes copies[0..n) whose first non-empty copy moves between memory
 * of kinds dst_kind and src_kind; pageable: some copy touches pageable
 * memory. A pure function: a test describes batches without a GPU. */
KVF_INTERNAL void kvf__cuda_batch_describe(cuda_batch *bt, const kvf__copy *copies, size_t n,
                                           unsigned flags, enum cudaMemoryType dst_kind,
                                           enum cudaMemoryType src_kind, bool pageable);
/* The same, with the memory's kinds asked of CUDA and of b's ranges. */
KVF_INTERNAL void kvf__cuda_batch_classify(cuda_backend *b, cuda_batch *bt, const kvf__copy *copies,
                                           size_t n, unsigned flags);

/* Each path (cuda_paths.h) defines:
 *  fits    whether it takes bt on q: where `forced` (KVF_CUDA_COPY names
 *          it), whenever it can; else by AUTO's rule. It may plan the batch
 *          in its state on q for submit. q->lock held.
 *  submit  queues bt on q (after its fits said yes, q->lock still held) and
 *          arranges `done` as copy_async promises; on an error nothing of
 *          the batch is left in flight.
 *  fini    frees its state on a queue (NULL if never made), after the
 *          queue's streams have drained, on the backend's device. */
#define KVF__CUDA_PATH_DECL(ID, name)                                                              \
    KVF_INTERNAL bool kvf__cuda_##name##_fits(cuda_backend *b, cuda_queue *q,                      \
                                              const cuda_batch *bt, bool forced);                  \
    KVF_INTERNAL kvf_status kvf__cuda_##name##_submit(                                             \
        cuda_backend *b, cuda_queue *q, const cuda_batch *bt, kvf__copy_done_fn done, void *arg);  \
    KVF_INTERNAL void kvf__cuda_##name##_fini(void *state);
KVF_CUDA_PATHS(KVF__CUDA_PATH_DECL)
#undef KVF__CUDA_PATH_DECL

typedef struct cuda_path_ops {
    const char *name;
    bool (*fits)(cuda_backend *b, cuda_queue *q, const cuda_batch *bt, bool forced);
    kvf_status (*submit)(cuda_backend *b, cuda_queue *q, const cuda_batch *bt,
                         kvf__copy_done_fn done, void *arg);
    void (*fini)(void *state);
} cuda_path_ops;

/* The paths by number (cuda_paths.h); entry NONE names AUTO and has no
 * functions. */
KVF_INTERNAL extern const cuda_path_ops kvf__cuda_path_table[KVF__CUDA_PATH_END];

/* The path that takes bt on q: the forced one where it fits, else the first
 * in order whose rule takes it. q->lock held. */
KVF_INTERNAL int kvf__cuda_path_pick(cuda_backend *b, cuda_queue *q, const cuda_batch *bt);

/* The path the configuration (cuda.copy) or KVF_CUDA_COPY forces; NONE for
 * AUTO. */
KVF_INTERNAL int kvf__cuda_forced_path(const kvf_engine_config *cfg);

/* Path `id`'s state on q, zeroed at its first use; NULL when out of
 * memory. q->lock held. */
static inline void *queue_path_state(cuda_queue *q, int id, size_t size)
{
    if (!q->path_state[id])
        q->path_state[id] = calloc(1, size);
    return q->path_state[id];
}

#endif /* KVF_CUDA_PRIVATE_H */
