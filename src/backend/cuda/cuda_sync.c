/* SPDX-License-Identifier: Apache-2.0 */
/* copy_sync: copies on a stream from a pool, waited for on the calling
 * thread. */
#include "cuda_private.h"

kvf_status kvf__cuda_sync_stream_get(cuda_backend *b, cudaStream_t *s_p, cudaEvent_t *ev_p)
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
        return kvf__cuda_fail(e, "cudaEventCreateWithFlags(blocking)", __FILE__, __LINE__);
    }
    return KVF_OK;
}

void kvf__cuda_sync_stream_put(cuda_backend *b, cudaStream_t s, cudaEvent_t ev)
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
kvf_status kvf__cuda_sync_stream_wait(cudaStream_t s, cudaEvent_t ev)
{
    CUDA_RET(cudaEventRecord(ev, s));
    CUDA_RET(cudaEventSynchronize(ev));
    return KVF_OK;
}

kvf_status kvf__cuda_copy_sync(kvf__backend *base, kvf__queue queue, const kvf__copy *copies,
                               size_t n)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    cudaStream_t s = NULL;
    cudaEvent_t ev = NULL;
    kvf_status st = kvf__cuda_check_copies(copies, n);
    if (st != KVF_OK || n == 0)
        return st;
    if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
        return st;
    if ((st = kvf__cuda_sync_stream_get(b, &s, &ev)) != KVF_OK)
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
        st = kvf__cuda_sync_stream_wait(s, ev);
    if (st != KVF_OK)
        CUDA_IGNORE(cudaStreamSynchronize(s));
    kvf__cuda_sync_stream_put(b, s, ev);
out_leave:
    kvf__cuda_dev_leave(&g);
    return st;
}
