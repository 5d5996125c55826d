/* SPDX-License-Identifier: Apache-2.0 */
/* A transfer queue: its streams, its descriptor ring and its FIFO of batch
 * records (FREE -> BUILT -> ARMED -> FREE, see cuda_private.h). */
#include "cuda_private.h"

#include <sched.h>
#include <stdlib.h>
#include <time.h>

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

batch_record *kvf__cuda_reserve(cuda_queue *q, uint32_t ndesc, uint32_t *index_p)
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

void kvf__cuda_unreserve(batch_record *r)
{
    atomic_store_explicit(&r->state, REC_FREE, memory_order_release);
}

kvf_status kvf__cuda_finish_record_on(cuda_backend *b, cuda_queue *q, cudaStream_t s,
                                      batch_record *r, size_t ncopies, kvf__copy_done_fn done,
                                      void *arg)
{
    r->done = done;
    r->arg = arg;
    CUDA_RET(cudaEventRecord(r->ev, s));
    KVF_TIMELINE(KVF_TL_GPU_QUEUED, record_tl_id(q, r), ncopies);
    atomic_store(&r->state, REC_ARMED);
    kvf__cuda_watcher_wake(b);
    return KVF_OK;
}

kvf_status kvf__cuda_finish_record(cuda_backend *b, cuda_queue *q, batch_record *r, size_t ncopies,
                                   kvf__copy_done_fn done, void *arg)
{
    return kvf__cuda_finish_record_on(b, q, q->stream, r, ncopies, done, arg);
}

void kvf__cuda_queue_drain(cuda_queue *q)
{
    if (q->aux)
        CUDA_IGNORE(cudaStreamSynchronize(q->aux));
    if (q->stream)
        CUDA_IGNORE(cudaStreamSynchronize(q->stream));
}

void kvf__cuda_queue_destroy(cuda_queue *q, const char *name)
{
    kvf__cuda_queue_drain(q);
    if (q->full_waits)
        KVF_LOG(KVF_LOG_DEBUG, "cuda: %s queue: full %llu times, %.3f ms waited", name,
                (unsigned long long)q->full_waits, (double)q->full_wait_ns / 1e6);
    for (size_t i = 0; i < BATCH_RECORDS; i++)
        if (q->records[i].ev)
            CUDA_IGNORE(cudaEventDestroy(q->records[i].ev));
    for (int p = KVF__CUDA_PATH_NONE + 1; p < KVF__CUDA_PATH_END; p++)
        kvf__cuda_path_table[p].fini(q->path_state[p]);
    cudaEvent_t *evs[] = {&q->ev_start, &q->ev_done, &q->sync_event_aux};
    for (size_t i = 0; i < 3; i++)
        if (*evs[i])
            CUDA_IGNORE(cudaEventDestroy(*evs[i]));
    if (q->aux)
        CUDA_IGNORE(cudaStreamDestroy(q->aux));
    if (q->sync_event)
        CUDA_IGNORE(cudaEventDestroy(q->sync_event));
    if (q->stream)
        CUDA_IGNORE(cudaStreamDestroy(q->stream));
    if (q->ring_host)
        CUDA_IGNORE(cudaFreeHost(q->ring_host));
    if (q->ring_dev)
        CUDA_IGNORE(cudaFree(q->ring_dev));
    pthread_mutex_destroy(&q->lock);
}

kvf_status kvf__cuda_queue_init(cuda_queue *q, int index, int priority)
{
    q->index = index;
    pthread_mutex_init(&q->lock, NULL);
    CUDA_RET(cudaStreamCreateWithPriority(&q->stream, cudaStreamNonBlocking, priority));
    CUDA_RET(cudaStreamCreateWithPriority(&q->aux, cudaStreamNonBlocking, priority));
    CUDA_RET(cudaEventCreateWithFlags(&q->sync_event, cudaEventDisableTiming));
    CUDA_RET(cudaEventCreateWithFlags(&q->sync_event_aux, cudaEventDisableTiming));
    CUDA_RET(cudaEventCreateWithFlags(&q->ev_start, cudaEventDisableTiming));
    CUDA_RET(cudaEventCreateWithFlags(&q->ev_done, cudaEventDisableTiming));
    for (size_t i = 0; i < BATCH_RECORDS; i++)
        CUDA_RET(cudaEventCreateWithFlags(&q->records[i].ev, cudaEventDisableTiming));
    CUDA_RET(cudaHostAlloc((void **)&q->ring_host, RING_DESCS * sizeof(kvf__cuda_desc),
                           cudaHostAllocPortable));
    CUDA_RET(cudaMalloc((void **)&q->ring_dev, RING_DESCS * sizeof(kvf__cuda_desc)));
    return KVF_OK;
}
