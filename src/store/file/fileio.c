/* SPDX-License-Identifier: Apache-2.0 */
/*
 * File I/O runners: run many reads, writes and fsyncs at once, each to
 * completion.
 *
 * io_uring (through liburing, where the build has it and the kernel lets
 * this process set up a ring; containers often refuse with EPERM) keeps up
 * to `queue depth` calls in flight from one thread. The thread runner, used
 * where io_uring is not built or refused, hands the calls to a pool of
 * threads doing plain pread/pwrite/fsync. Both continue short transfers,
 * retry EINTR and EAGAIN, and call the block files' fault-injection hook
 * before every call, with the same op names, so a test injects the same
 * faults into either runner.
 *
 * O_DIRECT: a call on a descriptor opened with O_DIRECT must be aligned
 * (buffer, offset, length). When a piece of a transfer is not (a short
 * transfer left an odd remainder, or a test shortened it), O_DIRECT is
 * cleared on that descriptor and the rest goes through the page cache.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fileio.h"
#include "log.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KVF_HAVE_URING
#include <liburing.h>
#endif

/* Linux moves at most 0x7ffff000 bytes per call; stay below it. */
#define IO_CHUNK ((size_t)1 << 30)
#define MAX_POOL_THREADS 64u

/* ---- the fault hook -------------------------------------------------------- */

static _Atomic(kvf__io_fault_fn) io_fault_fn;
static atomic_bool refuse_uring, refuse_direct;
static atomic_bool fallback_logged; /* the threads fallback is said once a process */

void kvf__set_io_fault(kvf__io_fault_fn fn)
{
    atomic_store(&io_fault_fn, fn);
}

int kvf__io_fault(const char *op, const char *path, size_t *len_p)
{
    kvf__io_fault_fn fn = atomic_load_explicit(&io_fault_fn, memory_order_relaxed);
    if (!fn)
        return 0;
    size_t dummy = 0;
    size_t want = len_p ? *len_p : 0;
    int err = fn(op, path, len_p ? len_p : &dummy);
    if (len_p && *len_p > want)
        *len_p = want;
    return err;
}

void kvf__fileio_test_refuse(bool uring, bool direct)
{
    atomic_store(&refuse_uring, uring);
    atomic_store(&refuse_direct, direct);
}

bool kvf__fileio_direct_refused(void)
{
    return atomic_load_explicit(&refuse_direct, memory_order_relaxed);
}

/* ---- one piece of an op ------------------------------------------------------ */

static const char *const op_names[] = {"read", "write", "fsync"};

static bool aligned(uintptr_t v)
{
    return (v & (KVF_FILE_ALIGN - 1)) == 0;
}

static bool op_finished(const kvf__fio_op *op)
{
    if (op->err)
        return true;
    switch (op->kind) {
    case KVF_FIO_READ:
        return op->done >= op->need || op->eof;
    case KVF_FIO_WRITE:
        return op->done >= op->len;
    default:
        return op->synced;
    }
}

/* Decides the next call of `op`: false when the op is finished (done, or
 * failed with op->err), else true with *len_p the bytes to ask for. The
 * hook runs here, once per call; an injected EINTR is retried. */
static bool next_piece(kvf__fio_op *op, size_t *len_p)
{
    if (!op->started) {
        /* on_start fills in the op (fd, buf, len) just before its first
         * call, so its own work overlaps the calls already in flight */
        op->started = true;
        if (op->on_start && !op->on_start(op)) {
            if (!op->err)
                op->err = ECANCELED;
            return false;
        }
    }
    for (;;) {
        if (op_finished(op))
            return false;
        size_t len = 0;
        if (op->kind != KVF_FIO_FSYNC) {
            len = op->len - op->done;
            if (len > IO_CHUNK)
                len = IO_CHUNK;
        }
        int err =
            kvf__io_fault(op_names[op->kind], op->path, op->kind == KVF_FIO_FSYNC ? NULL : &len);
        if (err == EINTR)
            continue;
        if (err) {
            op->err = err;
            return false;
        }
        if (op->direct && op->kind != KVF_FIO_FSYNC &&
            !(aligned((uintptr_t)(op->buf + op->done)) && aligned(op->off + op->done) &&
              aligned(len))) {
            int fl = fcntl(op->fd, F_GETFL);
            if (fl < 0 || fcntl(op->fd, F_SETFL, fl & ~O_DIRECT) != 0) {
                op->err = errno;
                return false;
            }
            op->direct = false;
        }
        *len_p = len;
        return true;
    }
}

/* Accounts for a call's result (bytes, or -errno). */
static void piece_done(kvf__fio_op *op, long long res)
{
    if (res < 0) {
        int err = (int)-res;
        if (err == EINTR || err == EAGAIN)
            return;
        if (err == EINVAL && op->direct && op->kind != KVF_FIO_FSYNC) {
            /* a file system that takes O_DIRECT opens but not the call:
             * the rest goes through the page cache */
            int fl = fcntl(op->fd, F_GETFL);
            if (fl >= 0 && fcntl(op->fd, F_SETFL, fl & ~O_DIRECT) == 0) {
                op->direct = false;
                return;
            }
        }
        op->err = err;
        return;
    }
    switch (op->kind) {
    case KVF_FIO_FSYNC:
        op->synced = true;
        break;
    case KVF_FIO_READ:
        if (res == 0)
            op->eof = true;
        op->done += (size_t)res;
        break;
    case KVF_FIO_WRITE:
        if (res == 0)
            op->err = EIO; /* never for a regular file with room; do not spin */
        op->done += (size_t)res;
        break;
    }
}

static void finish(kvf__fio_op *op)
{
    if (op->on_done)
        op->on_done(op);
}

static void run_one_sync(kvf__fio_op *op)
{
    size_t len;
    while (next_piece(op, &len)) {
        ssize_t r;
        if (op->xfer && op->kind != KVF_FIO_FSYNC) {
            piece_done(op, op->xfer(op, len));
            continue;
        }
        if (op->kind == KVF_FIO_READ)
            r = pread(op->fd, op->buf + op->done, len, (off_t)(op->off + op->done));
        else if (op->kind == KVF_FIO_WRITE)
            r = pwrite(op->fd, op->buf + op->done, len, (off_t)(op->off + op->done));
        else
            r = fsync(op->fd);
        piece_done(op, r < 0 ? -(long long)errno : (long long)r);
    }
    finish(op);
}

/* Clears the results of a list; returns its length. */
static size_t reset_results(kvf__fio_op *list)
{
    size_t n = 0;
    for (kvf__fio_op *op = list; op; op = op->next, n++) {
        op->done = 0;
        op->err = 0;
        op->eof = false;
        op->synced = false;
        op->started = false;
    }
    return n;
}

/* ---- the runners ----------------------------------------------------------- */

#ifdef KVF_HAVE_URING
typedef struct lane {
    pthread_mutex_t mu;
    struct io_uring ring;
    unsigned entries;
} lane;
#endif

struct kvf__fileio_runner {
    kvf_file_runner type; /* URING or THREADS */
    uint32_t depth;
#ifdef KVF_HAVE_URING
    lane *lanes;
    uint32_t nlanes;
    atomic_uint next_lane;
#endif
    /* the thread runner */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    kvf__fio_op *head, *tail;
    pthread_t *threads;
    uint32_t nthreads;
    bool stop;
};

/* Runs the op at the head of the pool's queue, if any; io->mu held (and
 * dropped while the op runs). false when the queue is empty. */
static bool run_queued(kvf__fileio_runner *io)
{
    kvf__fio_op *op = io->head;
    if (!op)
        return false;
    io->head = op->next;
    if (!io->head)
        io->tail = NULL;
    pthread_mutex_unlock(&io->mu);
    run_one_sync(op);
    pthread_mutex_lock(&io->mu);
    (*op->left_p)--;
    pthread_cond_broadcast(&io->done_cv);
    return true;
}

static void *pool_main(void *arg)
{
    kvf__fileio_runner *io = arg;
    pthread_mutex_lock(&io->mu);
    while (run_queued(io) || !io->stop)
        if (!io->head && !io->stop)
            pthread_cond_wait(&io->work_cv, &io->mu);
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

static void pool_stop(kvf__fileio_runner *io)
{
    pthread_mutex_lock(&io->mu);
    io->stop = true;
    pthread_cond_broadcast(&io->work_cv);
    pthread_mutex_unlock(&io->mu);
    for (uint32_t i = 0; i < io->nthreads; i++)
        pthread_join(io->threads[i], NULL);
    free(io->threads);
    io->threads = NULL;
    io->nthreads = 0;
}

static kvf_status pool_start(kvf__fileio_runner *io)
{
    /* the calling thread works too: depth - 1 helpers keep depth calls going */
    uint32_t n = io->depth > MAX_POOL_THREADS ? MAX_POOL_THREADS : io->depth - 1;
    io->threads = calloc(n ? n : 1, sizeof *io->threads);
    if (!io->threads)
        return kvf__fail(KVF_ERR_NOMEM, "file i/o: out of memory for %u threads", n);
    for (uint32_t i = 0; i < n; i++) {
        int rc = pthread_create(&io->threads[i], NULL, pool_main, io);
        if (rc != 0) {
            pool_stop(io);
            return kvf__fail(kvf__errno_status(rc), "file i/o: pthread_create: %s", strerror(rc));
        }
        io->nthreads++;
    }
    return KVF_OK;
}

static void pool_run(kvf__fileio_runner *io, kvf__fio_op *list, size_t n)
{
    size_t left = n - 1;
    kvf__fio_op *first = list, *rest = list->next, *last = rest;
    for (kvf__fio_op *op = rest; op; op = op->next) {
        op->left_p = &left;
        last = op;
    }
    pthread_mutex_lock(&io->mu);
    if (io->tail)
        io->tail->next = rest;
    else
        io->head = rest;
    io->tail = last;
    pthread_cond_broadcast(&io->work_cv);
    pthread_mutex_unlock(&io->mu);
    run_one_sync(first);
    pthread_mutex_lock(&io->mu);
    /* help with whatever is queued (ours or another caller's) until ours are done */
    while (left)
        if (!run_queued(io))
            pthread_cond_wait(&io->done_cv, &io->mu);
    pthread_mutex_unlock(&io->mu);
}

#ifdef KVF_HAVE_URING
static void fifo_push(kvf__fio_op **head, kvf__fio_op **tail, kvf__fio_op *op)
{
    op->next = NULL;
    if (*tail)
        (*tail)->next = op;
    else
        *head = op;
    *tail = op;
}

/* One run on a ring: ops still to issue (a FIFO), ops finished whose
 * callbacks are still to run, and the counts. */
typedef struct ring_run_state {
    lane *ln;
    kvf__fio_op *head, *tail; /* to issue: new, or continuing a short call */
    kvf__fio_op *done, *done_tail;
    size_t left;               /* ops not finished */
    unsigned inflight, queued; /* submitted; prepared, not yet submitted */
} ring_run_state;

static kvf__fio_op *fifo_pop(kvf__fio_op **head, kvf__fio_op **tail)
{
    kvf__fio_op *op = *head;
    *head = op->next;
    if (!*head)
        *tail = NULL;
    return op;
}

static void account(ring_run_state *r, int submitted)
{
    if (submitted > 0) {
        r->inflight += (unsigned)submitted;
        r->queued -= (unsigned)submitted;
    }
}

/* Prepares calls for ops waiting to issue while the ring has room. */
static void ring_fill(ring_run_state *r)
{
    while (r->head && r->inflight + r->queued < r->ln->entries) {
        kvf__fio_op *op = fifo_pop(&r->head, &r->tail);
        size_t len;
        if (!next_piece(op, &len)) {
            fifo_push(&r->done, &r->done_tail, op);
            continue;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ln->ring);
        if (op->kind == KVF_FIO_READ)
            io_uring_prep_read(sqe, op->fd, op->buf + op->done, (unsigned)len, op->off + op->done);
        else if (op->kind == KVF_FIO_WRITE)
            io_uring_prep_write(sqe, op->fd, op->buf + op->done, (unsigned)len, op->off + op->done);
        else
            io_uring_prep_fsync(sqe, op->fd, 0);
        io_uring_sqe_set_data(sqe, op);
        r->queued++;
        if (op->on_start && op->done == 0)
            /* its start took time: get it going before starting the next */
            account(r, io_uring_submit(&r->ln->ring));
    }
}

/* Takes every completion there is: finished ops to `done`, the others
 * back to issue the rest of their transfer. */
static void ring_reap(ring_run_state *r)
{
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&r->ln->ring, &cqe) == 0) {
        kvf__fio_op *op = io_uring_cqe_get_data(cqe);
        piece_done(op, cqe->res);
        io_uring_cqe_seen(&r->ln->ring, cqe);
        r->inflight--;
        if (op_finished(op))
            fifo_push(&r->done, &r->done_tail, op);
        else
            fifo_push(&r->head, &r->tail, op);
    }
}

/* Runs the callbacks of finished ops: after the ring was refilled, so the
 * disk has work while they run (a read's checksum and copy). */
static void ring_finish_done(ring_run_state *r)
{
    while (r->done) {
        finish(fifo_pop(&r->done, &r->done_tail));
        r->left--;
    }
}

static void ring_run(lane *ln, kvf__fio_op *list, size_t n)
{
    ring_run_state r = {ln, list, list, NULL, NULL, n, 0, 0};
    while (r.tail->next)
        r.tail = r.tail->next;
    while (r.left) {
        ring_fill(&r);
        if (!r.inflight && !r.queued) {
            ring_finish_done(&r); /* every op taken finished without a call */
            continue;
        }
        int rc;
        do
            rc = io_uring_submit_and_wait(&ln->ring, 1);
        while (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY);
        account(&r, rc);
        ring_reap(&r);
        if (rc < 0 && r.inflight) {
            /* the ring itself failed: wait for what it holds, then finish
             * the rest on this thread */
            KVF_LOG(KVF_LOG_ERROR, "file i/o: io_uring_submit_and_wait: %s", strerror(-rc));
            struct io_uring_cqe *cqe;
            while (r.inflight && io_uring_wait_cqe(&ln->ring, &cqe) == 0) {
                kvf__fio_op *op = io_uring_cqe_get_data(cqe);
                piece_done(op, cqe->res);
                io_uring_cqe_seen(&ln->ring, cqe);
                r.inflight--;
                fifo_push(&r.head, &r.tail, op);
            }
            ring_finish_done(&r);
            while (r.head)
                run_one_sync(fifo_pop(&r.head, &r.tail));
            return;
        }
        ring_fill(&r);
        account(&r, io_uring_submit(&ln->ring));
        ring_finish_done(&r);
    }
}

static void rings_destroy(kvf__fileio_runner *io)
{
    for (uint32_t i = 0; i < io->nlanes; i++) {
        io_uring_queue_exit(&io->lanes[i].ring);
        pthread_mutex_destroy(&io->lanes[i].mu);
    }
    free(io->lanes);
    io->lanes = NULL;
    io->nlanes = 0;
}

/* One ring per lane (a worker thread), depth / lanes entries each: KVF_OK, or the
 * reason io_uring cannot be used. */
static kvf_status rings_create(kvf__fileio_runner *io, uint32_t lanes)
{
    io->lanes = calloc(lanes, sizeof *io->lanes);
    if (!io->lanes)
        return kvf__fail(KVF_ERR_NOMEM, "file i/o: out of memory");
    /* the runner's depth shared by its lanes: a lane given more ops than
     * its ring holds keeps the ring full, submitting as calls complete */
    unsigned entries = (io->depth + lanes - 1) / lanes;
    for (uint32_t i = 0; i < lanes; i++) {
        lane *ln = &io->lanes[i];
        int rc = atomic_load(&refuse_uring) ? -EPERM : io_uring_queue_init(entries, &ln->ring, 0);
        if (rc < 0) {
            rings_destroy(io);
            /* out of memory or descriptors says nothing of io_uring's
             * support: the caller falls back either way, and reports it */
            kvf_status why = kvf__errno_status(-rc);
            return kvf__fail(why == KVF_ERR_NOMEM || why == KVF_ERR_RESOURCE ? why
                                                                             : KVF_ERR_UNSUPPORTED,
                             "io_uring_queue_init: %s", strerror(-rc));
        }
        pthread_mutex_init(&ln->mu, NULL);
        ln->entries = entries;
        io->nlanes++;
    }
    return KVF_OK;
}

static void uring_run(kvf__fileio_runner *io, kvf__fio_op *list, size_t n)
{
    /* a free ring if there is one, else wait for one */
    uint32_t start = atomic_fetch_add(&io->next_lane, 1) % io->nlanes;
    for (uint32_t k = 0; k < io->nlanes; k++) {
        lane *ln = &io->lanes[(start + k) % io->nlanes];
        if (pthread_mutex_trylock(&ln->mu) == 0) {
            ring_run(ln, list, n);
            pthread_mutex_unlock(&ln->mu);
            return;
        }
    }
    lane *ln = &io->lanes[start];
    pthread_mutex_lock(&ln->mu);
    ring_run(ln, list, n);
    pthread_mutex_unlock(&ln->mu);
}
#endif

kvf_status kvf__fileio_runner_create(kvf_file_runner want, uint32_t depth, uint32_t lanes,
                                     kvf__fileio_runner **io_p)
{
    if ((unsigned)want > KVF_FILE_RUNNER_THREADS || !io_p)
        return kvf__fail(KVF_ERR_INVALID, "file i/o: engine %d unknown", (int)want);
    kvf__fileio_runner *io = calloc(1, sizeof *io);
    if (!io)
        return kvf__fail(KVF_ERR_NOMEM, "file i/o: out of memory");
    io->depth = depth ? depth : KVF_FILE_QUEUE_DEPTH_DEFAULT;
    if (io->depth > 4096)
        io->depth = 4096;
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->work_cv, NULL);
    pthread_cond_init(&io->done_cv, NULL);
    kvf_status st;
    if (want != KVF_FILE_RUNNER_THREADS) {
#ifdef KVF_HAVE_URING
        st = rings_create(io, lanes ? lanes : 1);
        if (st == KVF_OK) {
            io->type = KVF_FILE_RUNNER_URING;
            *io_p = io;
            return KVF_OK;
        }
        if (!atomic_exchange(&fallback_logged, true))
            KVF_LOG(KVF_LOG_WARN, "file tier: io_uring refused (%s): using a pool of threads",
                    kvf_last_error());
#else
        if (want == KVF_FILE_RUNNER_URING && !atomic_exchange(&fallback_logged, true))
            KVF_LOG(KVF_LOG_WARN, "file tier: built without liburing: using a pool of threads");
#endif
    }
    io->type = KVF_FILE_RUNNER_THREADS;
    st = pool_start(io);
    if (st != KVF_OK) {
        kvf__fileio_runner_destroy(io);
        return st;
    }
    *io_p = io;
    return KVF_OK;
}

void kvf__fileio_runner_destroy(kvf__fileio_runner *io)
{
    if (!io)
        return;
    pool_stop(io);
#ifdef KVF_HAVE_URING
    rings_destroy(io);
#endif
    pthread_cond_destroy(&io->done_cv);
    pthread_cond_destroy(&io->work_cv);
    pthread_mutex_destroy(&io->mu);
    free(io);
}

kvf_file_runner kvf__fileio_runner_type(const kvf__fileio_runner *io)
{
    return io ? io->type : KVF_FILE_RUNNER_THREADS;
}

uint32_t kvf__fileio_runner_depth(const kvf__fileio_runner *io)
{
    return io ? io->depth : 1;
}

void kvf__fileio_runner_run(kvf__fileio_runner *io, kvf__fio_op *list)
{
    size_t n = reset_results(list);
    if (!n)
        return;
#ifdef KVF_HAVE_URING
    /* ops with their own calls (xfer) cannot go through the ring: the
     * engine (engine.c) runs those on a thread runner; here they run one by one */
    if (io && io->type == KVF_FILE_RUNNER_URING && !list->xfer) {
        uring_run(io, list, n);
        return;
    }
#endif
    if (io && io->nthreads && n > 1) {
        pool_run(io, list, n);
        return;
    }
    /* next is read before the op runs: nothing here writes it, but the
     * runners own it while an op runs */
    for (kvf__fio_op *op = list, *next; op; op = next) {
        next = op->next;
        run_one_sync(op);
    }
}
