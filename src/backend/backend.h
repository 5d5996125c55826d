/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory backends (host.c, cuda/): a backend says where bytes live and how
 * they are copied. The engine asks it for memory, for copies of strided
 * regions, and for ordering with a caller's stream. Copies are described
 * as 2-D copies: `rows` runs of `width` bytes, `spitch`/`dpitch` apart; a
 * contiguous copy has rows = 1.
 */
#ifndef KVF_BACKEND_H
#define KVF_BACKEND_H

#include "common.h"

typedef struct kvf__copy {
    void *dst;
    const void *src;
    size_t width;
    size_t rows;
    size_t dpitch;
    size_t spitch;
} kvf__copy;

typedef enum kvf__queue {
    KVF_QUEUE_OFFLOAD = 0,
    KVF_QUEUE_ONBOARD = 1,
    KVF_QUEUE_COUNT = 2
} kvf__queue;

typedef struct kvf__backend kvf__backend;

/* copy_async's flags: hints, never needed for correctness */
enum {
    /* the copies run beside the caller's compute (a layer-wise batch read
     * while the forward pass runs): where a backend has a choice of path
     * it leaves the compute units to the forward pass */
    KVF__COPY_BESIDE_COMPUTE = 1u << 0,
};

/* Called once when an asynchronous copy batch has finished, on a thread of
 * the backend's (CUDA: its completion watcher), which it should not hold
 * up for long. The batches of one queue are called back in the order they
 * were queued, each once its copies and those of every batch queued
 * before it there have ended: the engine releases the slots of a large
 * batch call by call on that. It must not call back into the backend, but
 * for mark_free (the batch it ends may hold a mark; mark_free takes no
 * lock of the backend's). */
typedef void (*kvf__copy_done_fn)(void *arg, kvf_status status);

typedef struct kvf__backend_ops {
    const char *name;
    void (*destroy)(kvf__backend *b);

    /* Memory of `kind`, `bytes` long, zero-filled. */
    kvf_status (*mem_alloc)(kvf__backend *b, kvf_memory kind, size_t bytes, void **ptr_p);
    void (*mem_free)(kvf__backend *b, kvf_memory kind, void *ptr);
    /* Checks that caller memory is of `kind` and makes it usable for copies
     * (e.g. cudaHostRegister). *registered_p says whether mem_unregister
     * must undo something. */
    kvf_status (*mem_register)(kvf__backend *b, kvf_memory kind, void *ptr, size_t bytes,
                               bool *registered_p);
    void (*mem_unregister)(kvf__backend *b, kvf_memory kind, void *ptr);

    /* Copies synchronously on the calling thread; `queue` picks the
     * stream where the backend has streams. Used by the file tier to
     * gather a block into a host staging buffer and scatter it back. */
    kvf_status (*copy_sync)(kvf__backend *b, kvf__queue queue, const kvf__copy *copies, size_t n);

    /* Optional: queues copies and returns at once; `done` is called when
     * they have finished. A backend without it has the engine run
     * copy_sync on its worker threads, split across them. */
    kvf_status (*copy_async)(kvf__backend *b, kvf__queue queue, const kvf__copy *copies, size_t n,
                             unsigned flags, kvf__copy_done_fn done, void *arg);

    /* Optional: makes `stream` wait for everything queued so far with
     * copy_async on every queue, without blocking the host. */
    kvf_status (*sync_stream)(kvf__backend *b, void *stream);

    /* Optional, all four or none (kvf_offload_after): `mark` records in
     * *mark_p a point of `stream` (a CUDA event), reached once the work
     * queued on it so far has finished; it does not wait. `mark_gate`
     * makes everything queued on `queue` from now on wait for the mark on
     * the device, without blocking the host; `mark_wait` blocks the
     * calling thread (a worker's, never the submitter's) until the mark is
     * reached; `mark_free` releases it (work still waiting on it keeps
     * waiting; callable from a copy_done_fn). */
    kvf_status (*mark)(kvf__backend *b, void *stream, void **mark_p);
    kvf_status (*mark_gate)(kvf__backend *b, kvf__queue queue, void *mark);
    kvf_status (*mark_wait)(kvf__backend *b, void *mark);
    void (*mark_free)(kvf__backend *b, void *mark);
    /* Optional, both or none (layer-wise batches): `queue_mark` records a
     * mark reached once everything queued on `queue` so far with copy_async
     * has finished; `mark_join` makes `stream` wait for a mark on the
     * device, without blocking the host. Marks from either are released
     * with mark_free and waited for with mark_wait. */
    kvf_status (*queue_mark)(kvf__backend *b, kvf__queue queue, void **mark_p);
    kvf_status (*mark_join)(kvf__backend *b, void *mark, void *stream);
} kvf__backend_ops;

struct kvf__backend {
    const kvf__backend_ops *ops;
};

/* The host backend: plain or pinned host memory, memcpy. */
KVF_INTERNAL kvf_status kvf__host_backend_create(kvf__backend **backend_p);
/* Fault injection for tests: called before each host-backend copy; a status
 * other than KVF_OK fails that copy. It may also sleep, to widen races. */
typedef kvf_status (*kvf__copy_hook_fn)(const kvf__copy *copy);
KVF_INTERNAL void kvf__set_copy_hook(kvf__copy_hook_fn fn);
/* For tests: called by a submitter between the slices of a batch it
 * registers, with the engine lock dropped (see register_batch). */
typedef void (*kvf__register_hook_fn)(void);
KVF_INTERNAL void kvf__set_register_hook(kvf__register_hook_fn fn);
/* The host backend's copy (memcpy, hook included): also used for copies
 * between host buffers on any backend, e.g. secondary slots to staging. */
KVF_INTERNAL kvf_status kvf__host_copy(const kvf__copy *copies, size_t n);

/* The CUDA backend on cfg->device, copying as cfg->cuda.copy says. KVF_ERR_NO_DEVICE when the build
 * has no CUDA, no driver is loaded or the device is absent (kvf_last_error says which). */
KVF_INTERNAL kvf_status kvf__cuda_backend_create(const kvf_engine_config *cfg,
                                                 kvf__backend **backend_p);
/* Fills the CUDA fields of kvf_info; harmless without CUDA. */
KVF_INTERNAL void kvf__cuda_info(kvf_info *info);

#endif /* KVF_BACKEND_H */
