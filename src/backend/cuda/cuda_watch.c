/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The completion watcher. A batch ends with an event recorded after its
 * last step. One thread per backend watches the oldest unfinished record of
 * each queue and, once its event has completed, frees the record and calls
 * its `done`. It replaced a CUDA host function, which took far longer from
 * the last copy to a waiting caller than polling every few microseconds
 * does, and held up the next work of its stream while it ran
 * (bench/latency.c; figures in docs/performance.md). While records are in
 * flight the thread polls with short sleeps; with none it sleeps until a
 * submit wakes it.
 */
#include "cuda_private.h"

#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define WATCH_POLL_NS 4000

void kvf__cuda_watcher_wake(cuda_backend *b)
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
            st = kvf__cuda_fail(e, "cudaEventQuery(batch end)", __FILE__, __LINE__);
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

kvf_status kvf__cuda_watcher_start(cuda_backend *b)
{
    int perr = pthread_create(&b->watcher, NULL, watcher_main, b);
    if (perr != 0)
        return kvf__fail(kvf__errno_status(perr), "cuda: cannot start the completion thread: %s",
                         strerror(perr));
    b->watcher_started = true;
    return KVF_OK;
}

void kvf__cuda_watcher_stop(cuda_backend *b)
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
