/*
 * Worker threads: each takes a chunk of a ready batch and runs it.
 */
#include "engine_private.h"

static size_t chunk_of(const kvf_engine *e, const batch *b)
{
    size_t per = e->all_block_bytes ? (4u << 20) / e->all_block_bytes : 1;
    if (kind_is_file(b->kind)) {
        /* a few times a worker's share of the queue depth, so that its
         * queue stays full (the I/O engine submits as calls complete)
         * and drains only at the end of a chunk; within a staging budget */
        size_t nw = e->nworkers, depth = kvf__fileio_depth(e->fio);
        size_t budget = FILE_STAGING_BUDGET / kvf__staging_slot_bytes(e);
        per = 4 * ((depth + nw - 1) / nw);
        if (per > budget)
            per = budget;
    }
    if (kind_is_remote(b->kind)) {
        per = e->all_block_bytes ? REMOTE_CHUNK_BYTES / e->all_block_bytes : 1;
        per = per < 1 ? 1 : per > REMOTE_CHUNK_MOVES ? REMOTE_CHUNK_MOVES : per;
    }
    size_t share = (b->n + e->nworkers - 1) / e->nworkers;
    size_t c = per < share ? per : share;
    return c ? c : 1;
}

void *kvf__worker_main(void *arg)
{
    worker *w = arg;
    kvf_engine *e = w->engine;
    engine_lock(e);
    for (;;) {
        batch *b = e->ready_head[KVF_QUEUE_ONBOARD];
        if (!b)
            b = e->ready_head[KVF_QUEUE_OFFLOAD];
        if (!b) {
            if (e->stop)
                break;
            pthread_cond_wait(&e->work_cv, &e->mu);
            continue;
        }
        if (e->backend->ops->copy_async && !kind_on_workers(b->kind)) {
            kvf__ready_pop(e, b->queue);
            b->state = B_RUNNING;
            b->async = true;
            kvf__issue_async(e, b);
            continue;
        }
        size_t first = b->next_move;
        size_t last = first + chunk_of(e, b);
        if (first == 0)
            KVF_TIMELINE(KVF_TL_ISSUE, b->id, b->n);
        if (last >= b->n) {
            last = b->n;
            kvf__ready_pop(e, b->queue);
            b->state = B_RUNNING;
        } else {
            /* chunks remain: an idle worker takes the next meanwhile (a
             * batch is shared by the workers, see chunk_of; only a batch
             * becoming ready wakes one otherwise) */
            pthread_cond_signal(&e->work_cv);
        }
        b->next_move = last;
        /* a removal reads nothing: a failed write before it is no loss */
        for (size_t i = first; i < last && !kind_removes(b->kind); i++)
            if (b->status[i] == KVF_INPROGRESS && kvf__source_lost(e, b, i))
                kvf__fail_lost_source(b, i);
        uint64_t deadline_ns = kind_is_remote(b->kind) ? kvf__remote_deadline(e, b) : 0;
        pthread_mutex_unlock(&e->mu);

        /* each move's status is written by the one worker that claimed it */
        if (kind_is_remote(b->kind))
            kvf__run_remote_chunk(w, b, first, last, deadline_ns);
        else if (kind_is_file(b->kind)) {
            uint64_t t0 = kvf__now_ns();
            kvf__run_file_moves(w, b, first, last);
            w->file_ns += kvf__now_ns() - t0;
            w->file_chunks++;
            w->file_moves += last - first;
        }
        for (size_t i = first; i < last && !kind_on_workers(b->kind); i++) {
            if (b->status[i] != KVF_INPROGRESS)
                continue;
            kvf_status st = kvf__run_copy_move(e, b, i);
            if (st != KVF_OK)
                kvf__fail_copy(b, i, st, kvf_last_error());
        }

        KVF_TIMELINE(KVF_TL_CHUNK, b->id, last - first);
        engine_lock(e);
        b->moves_done += last - first;
        if (b->moves_done == b->n) {
            if (kind_writes(b->kind) == SP_FILE && !kind_removes(b->kind) &&
                e->cfg.fsync == KVF_FSYNC_BATCH) {
                pthread_mutex_unlock(&e->mu);
                kvf_status st = kvf__blockfile_fsync_dir(&e->dir);
                if (st != KVF_OK) {
                    /* every move of the batch is done: their statuses are
                     * this thread's to write; the files of those failed
                     * before are gone already */
                    char why[KVF_MOVE_ERROR_MESSAGE];
                    snprintf(why, sizeof why, "%s", kvf_last_error());
                    for (size_t i = 0; i < b->n; i++)
                        if (b->status[i] == KVF_INPROGRESS) {
                            kvf__move_failed(b, i, st, "%s: block 0x%llx: %s",
                                             kvf__op_names[b->kind],
                                             (unsigned long long)b->moves[i].dst, why);
                            kvf__drop_failed_file(e, b, i);
                        }
                }
                engine_lock(e);
            }
            kvf__complete_batch(e, b);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}
