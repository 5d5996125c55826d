/* SPDX-License-Identifier: Apache-2.0 */
/* copy_async: a path per batch (cuda_paths.c), run with the queue's lock
 * held, the queue's two streams kept in order; sync_stream, which makes
 * a caller's stream wait for both queues; and marks, which order a queue
 * after a caller's stream, or a caller's stream after a queue (a pool's
 * arrival in a layer-wise batch). */
#include "cuda_private.h"

kvf_status kvf__cuda_check_copies(const kvf__copy *copies, size_t n)
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

/* Makes q's main stream wait for what its aux stream holds that it has
 * not waited for (staged scatters), so that what is queued next on the
 * main stream follows them. q->lock held. */
static kvf_status join_aux(cuda_queue *q)
{
    if (!q->aux_open)
        return KVF_OK;
    cudaError_t e1 = cudaEventRecord(q->ev_done, q->aux);
    cudaError_t e2 = e1 == cudaSuccess ? cudaStreamWaitEvent(q->stream, q->ev_done, 0) : e1;
    if (e2 != cudaSuccess)
        return kvf__cuda_fail(e2, "cudaStreamWaitEvent(join)", __FILE__, __LINE__);
    q->aux_open = false;
    return KVF_OK;
}

kvf_status kvf__cuda_main_only(cuda_queue *q)
{
    /* after staged scatters: this batch's copies follow them */
    kvf_status st = join_aux(q);
    q->main_dirty = true;
    return st;
}

kvf_status kvf__cuda_aux_after_main(cuda_queue *q)
{
    if (!q->main_dirty)
        return KVF_OK;
    CUDA_RET(cudaEventRecord(q->ev_start, q->stream));
    CUDA_RET(cudaStreamWaitEvent(q->aux, q->ev_start, 0));
    q->main_dirty = false;
    return KVF_OK;
}

kvf_status kvf__cuda_copy_async(kvf__backend *base, kvf__queue queue, const kvf__copy *copies,
                                size_t n, unsigned flags, kvf__copy_done_fn done, void *arg)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    if ((unsigned)queue >= KVF_QUEUE_COUNT)
        return kvf__fail(KVF_ERR_INVALID, "cuda: queue %d", (int)queue);
    if ((st = kvf__cuda_check_copies(copies, n)) != KVF_OK)
        return st;
    if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
        return st;
    cuda_queue *q = &b->q[queue];
    cuda_batch bt;
    kvf__cuda_batch_classify(b, &bt, copies, n, flags);
    pthread_mutex_lock(&q->lock);
    int path = kvf__cuda_path_pick(b, q, &bt);
    KVF_TIMELINE(KVF_TL_GPU_PICKED, (uint64_t)queue, (uint64_t)path);
    st = kvf__cuda_path_table[path].submit(b, q, &bt, done, arg);
    atomic_store_explicit(&q->last_path, path, memory_order_relaxed);
    pthread_mutex_unlock(&q->lock);
    kvf__cuda_dev_leave(&g);
    return st;
}

kvf_status kvf__cuda_sync_stream(kvf__backend *base, void *stream)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
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
    kvf__cuda_dev_leave(&g);
    return st;
}

kvf_status kvf__cuda_mark(kvf__backend *base, void *stream, void **mark_p)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    cudaEvent_t ev = NULL;
    if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
        return st;
    /* blocking sync: a worker waiting for it (mark_wait) sleeps rather
     * than spin on a core its I/O needs */
    CUDA_GOTO(cudaEventCreateWithFlags(&ev, cudaEventBlockingSync | cudaEventDisableTiming), st,
              out);
    CUDA_GOTO(cudaEventRecord(ev, (cudaStream_t)stream), st, out);
    *mark_p = ev;
    ev = NULL;
out:
    if (ev)
        CUDA_IGNORE(cudaEventDestroy(ev));
    kvf__cuda_dev_leave(&g);
    return st;
}

kvf_status kvf__cuda_mark_gate(kvf__backend *base, kvf__queue queue, void *mark)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    if ((unsigned)queue >= KVF_QUEUE_COUNT)
        return kvf__fail(KVF_ERR_INVALID, "cuda: queue %d", (int)queue);
    if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
        return st;
    cuda_queue *q = &b->q[queue];
    /* both streams: a batch's copies may start on either (the staged
     * path gathers on `aux`) */
    pthread_mutex_lock(&q->lock);
    CUDA_GOTO(cudaStreamWaitEvent(q->stream, (cudaEvent_t)mark, 0), st, unlock);
    if (q->aux)
        CUDA_GOTO(cudaStreamWaitEvent(q->aux, (cudaEvent_t)mark, 0), st, unlock);
unlock:
    pthread_mutex_unlock(&q->lock);
    kvf__cuda_dev_leave(&g);
    return st;
}

kvf_status kvf__cuda_mark_wait(kvf__backend *base, void *mark)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
        return st;
    CUDA_GOTO(cudaEventSynchronize((cudaEvent_t)mark), st, out);
out:
    kvf__cuda_dev_leave(&g);
    return st;
}

void kvf__cuda_mark_free(kvf__backend *base, void *mark)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    if (kvf__cuda_dev_enter(b, &g) != KVF_OK)
        return;
    CUDA_IGNORE(cudaEventDestroy((cudaEvent_t)mark));
    kvf__cuda_dev_leave(&g);
}

kvf_status kvf__cuda_queue_mark(kvf__backend *base, kvf__queue queue, void **mark_p)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    cudaEvent_t ev = NULL;
    if ((unsigned)queue >= KVF_QUEUE_COUNT)
        return kvf__fail(KVF_ERR_INVALID, "cuda: queue %d", (int)queue);
    if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
        return st;
    cuda_queue *q = &b->q[queue];
    CUDA_GOTO(cudaEventCreateWithFlags(&ev, cudaEventBlockingSync | cudaEventDisableTiming), st,
              out);
    pthread_mutex_lock(&q->lock);
    /* the last batch may have ended on `aux`: the mark follows its copies */
    st = join_aux(q);
    if (st == KVF_OK) {
        cudaError_t e3 = cudaEventRecord(ev, q->stream);
        if (e3 != cudaSuccess)
            st = kvf__cuda_fail(e3, "cudaEventRecord(queue mark)", __FILE__, __LINE__);
    }
    pthread_mutex_unlock(&q->lock);
    if (st == KVF_OK) {
        *mark_p = ev;
        ev = NULL;
    }
out:
    if (ev)
        CUDA_IGNORE(cudaEventDestroy(ev));
    kvf__cuda_dev_leave(&g);
    return st;
}

kvf_status kvf__cuda_mark_join(kvf__backend *base, void *mark, void *stream)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    kvf_status st;
    if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
        return st;
    CUDA_GOTO(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)mark, 0), st, out);
out:
    kvf__cuda_dev_leave(&g);
    return st;
}
