/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Worker threads: each takes a chunk of a ready batch and runs it.
 */
#include "engine_private.h"

/* A move between slots, run on a worker (the host backend). */
static kvf_status run_copy_move(kvf_engine *e, const batch *b, size_t i)
{
    kvf__copy copies[64];
    kvf_status st = KVF_OK;
    uint32_t k = 0;
    for (uint32_t p = 0; p < e->npools && st == KVF_OK; p++) {
        if (sel_has(b, p))
            copies[k++] = kvf__move_copy(e, b->kind, p, &b->moves[i]);
        if (k == 64 || (k && p + 1 == e->npools)) {
            st = e->backend->ops->copy_sync(e->backend, b->queue, copies, k);
            k = 0;
        }
    }
    return st;
}

/* Waits for the mark of a batch from kvf_offload_after before its chunk
 * [first, last) reads its sources; where that fails, the chunk's moves
 * fail rather than read what the caller's stream may still be writing. */
static void wait_after(kvf_engine *e, batch *b, size_t first, size_t last)
{
    kvf_status st = e->backend->ops->mark_wait(e->backend, b->after);
    if (st == KVF_OK)
        return;
    char why[KVF_MOVE_ERROR_MESSAGE];
    snprintf(why, sizeof why, "waiting for the caller's stream: %s", kvf_last_error());
    for (size_t i = first; i < last; i++)
        if (b->status[i] == KVF_INPROGRESS)
            kvf__fail_copy(b, i, st, why);
}

/* How many moves one worker takes from a batch at a time: its slow
 * tier's chunk, or about 4 MiB of copies; no more than an even share, so
 * a large batch spreads over all workers. */
static size_t chunk_of(kvf_engine *e, const batch *b)
{
    if (kvf__arrival_grouped(e, b))
        return kvf__arrival_chunk_moves(e, b);
    const tier_ops *t = kind_ops(b->kind);
    size_t per = t ? t->chunk_moves(e) : e->all_block_bytes ? (4u << 20) / e->all_block_bytes : 1;
    size_t share = (b->n + e->nworkers - 1) / e->nworkers;
    size_t c = per < share ? per : share;
    return c ? c : 1;
}

/* Worker chunk [first, last) of b (a chunk of b->chunk_moves, claimed in
 * order) has finished: the moves before the first chunk still running
 * have copied. A chunk more than 64 ahead of that one is not recorded:
 * its moves are released with the batch instead. Lock held. */
static void chunk_ended(kvf_engine *e, batch *b, size_t first, size_t last)
{
    size_t c = b->chunk_moves;
    size_t base = b->copied / c, k = first / c;
    if (last <= b->copied || k - base >= 64)
        return;
    b->chunks_ended |= UINT64_C(1) << (k - base);
    if (!(b->chunks_ended & 1))
        return;
    unsigned run =
        b->chunks_ended == UINT64_MAX ? 64u : (unsigned)__builtin_ctzll(~b->chunks_ended);
    b->chunks_ended = run == 64 ? 0 : b->chunks_ended >> run;
    size_t upto = (base + run) * c;
    kvf__release_copied(e, b, upto < b->n ? upto : b->n);
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
        if (first == 0) {
            b->chunk_moves = chunk_of(e, b);
            KVF_TIMELINE(KVF_TL_ISSUE, b->id, b->n);
        }
        size_t last = first + b->chunk_moves;
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
            else if (b->status[i] == KVF_INPROGRESS && kvf__dest_lost(e, b, i))
                kvf__fail_lost_dest(b, i);
        const tier_ops *t = kind_ops(b->kind);
        uint64_t deadline_ns = t && t->deadline ? t->deadline(e, b) : 0;
        pthread_mutex_unlock(&e->mu);

        /* kvf_offload_after: this thread waits for the caller's stream,
         * never the caller */
        if (b->after)
            wait_after(e, b, first, last);
        /* each move's status is written by the one worker that claimed it */
        if (t)
            kvf__run_store_chunk(w, b, first, last, deadline_ns);
        for (size_t i = first; i < last && !kind_on_workers(b->kind); i++) {
            if (b->status[i] != KVF_INPROGRESS)
                continue;
            kvf_status st = run_copy_move(e, b, i);
            if (st != KVF_OK)
                kvf__fail_copy(b, i, st, kvf_last_error());
        }

        KVF_TIMELINE(KVF_TL_CHUNK, b->id, last - first);
        engine_lock(e);
        b->moves_done += last - first;
        if (b->moves_done < b->n)
            chunk_ended(e, b, first, last);
        if (b->moves_done == b->n) {
            if (t && !kind_removes(b->kind) && tier_keyed(kind_writes(b->kind))) {
                pthread_mutex_unlock(&e->mu);
                kvf__store_batch_wrote(e, b);
                engine_lock(e);
            }
            kvf__complete_batch(e, b);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}
