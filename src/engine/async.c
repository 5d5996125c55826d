/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Copy batches handed whole to a backend with asynchronous copies
 * (copy_async), and their completions.
 */
#include "engine_private.h"

/* ---- execution -------------------------------------------------------------- */

/* What kvf_geometry_region gives for a checked token count, without the
 * checks (done at kvf__submit): this runs for every move of every pool. */
kvf_region kvf__pool_region(const pool *pl, uint32_t tokens)
{
    if (tokens == 0 || tokens >= pl->g.tokens_per_block)
        return (kvf_region){1, pl->block_bytes, pl->block_bytes};
    size_t row_bytes = tokens * pl->token_bits / 8;
    if (pl->rows == 1)
        return (kvf_region){1, row_bytes, row_bytes};
    return (kvf_region){pl->rows, row_bytes, pl->pitch};
}

/* The copy of pool p for one move in host or copy mode: the region of the
 * first `tokens` tokens, at the same place in source and destination. */
kvf__copy kvf__move_copy(const kvf_engine *e, op_kind kind, uint32_t p, const kvf_move *mv)
{
    const pool *pl = &e->pools[p];
    const mem_array *src = kind_reads(kind) == KVF_TIER_HOST ? &pl->secondary : &pl->primary;
    const mem_array *dst = kind_writes(kind) == KVF_TIER_HOST ? &pl->secondary : &pl->primary;
    kvf_region r = kvf__pool_region(pl, mv->tokens);
    kvf__copy c = {
        slot_addr(dst, mv->dst), slot_addr(src, mv->src), r.row_bytes, r.rows, r.pitch, r.pitch};
    return c;
}

/* Copies handed to the backend per call: the GPU starts on the first
 * chunk while the next is described, so submission overlaps the copy. */
#define ASYNC_CHUNK_COPIES 4096u
/* Bytes per call, at most (but one move), for a batch moving every pool.
 * Its moves are released chunk by chunk (kvf__release_copied): an onboard
 * into a slot that a large offload reads waits for the slot's chunk, not
 * for the whole batch. Small copies go in calls of ASYNC_CHUNK_BYTES, or
 * 1/ASYNC_SMALL_CALLS of their batch up to ASYNC_CHUNK_BYTES_MAX: each
 * call is a kernel launch whose start and drain cost a few microseconds of
 * the GPU's copy time, which larger calls of a large batch spread thinner
 * (docs/performance.md: LMCache's layout moved about 5 % faster in 16 MiB
 * calls than in 4 MiB ones), while an onboard behind such a batch waits
 * for at most one call. */
#define ASYNC_CHUNK_BYTES ((size_t)4 << 20)
#define ASYNC_CHUNK_BYTES_MAX ((size_t)16 << 20)
#define ASYNC_SMALL_CALLS 64u
/* Batches whose copies average ASYNC_RETIRE_FROM and more (the copy
 * engines' share, where a call costs a few microseconds of host time and
 * the engines run calls back to back) go in calls of ASYNC_RETIRE_BYTES,
 * about 20 us of PCIe, instead: a 4 MiB call is 16 moves of 256 KiB, and
 * an onboard into one of them would wait for all 16 copies. Smaller
 * copies keep 4 MiB calls: there a call is a kernel launch, whose fixed
 * cost a shorter call would show. A call also holds at least
 * 1/ASYNC_CALLS_MAX of its batch (up to 4 MiB), so a 1 GiB batch of 2 MiB
 * moves still goes in 256 calls of two and two such batches in flight stay
 * within the backend's records. */
#define ASYNC_RETIRE_FROM ((size_t)256 << 10)
#define ASYNC_RETIRE_BYTES ((size_t)1 << 20)
#define ASYNC_CALLS_MAX 256u

/* The bytes after which a call of a batch moving every pool ends: `bytes`
 * useful bytes in `ncopies` copies. The setting (KVF_DEVICE_CALL_BYTES,
 * read at create: `set`) overrides the rule: larger calls cost less host
 * and device time per byte, smaller ones release their moves sooner. */
static size_t chunk_bytes_for(uint64_t set, size_t bytes, size_t ncopies)
{
    if (set)
        return set > SIZE_MAX ? SIZE_MAX : (size_t)set;
    if (ncopies == 0 || bytes / ncopies < ASYNC_RETIRE_FROM) {
        size_t c = bytes / ASYNC_SMALL_CALLS;
        c = c > ASYNC_CHUNK_BYTES ? c : ASYNC_CHUNK_BYTES;
        return c < ASYNC_CHUNK_BYTES_MAX ? c : ASYNC_CHUNK_BYTES_MAX;
    }
    size_t c = bytes / ASYNC_CALLS_MAX;
    c = c > ASYNC_RETIRE_BYTES ? c : ASYNC_RETIRE_BYTES;
    return c < ASYNC_CHUNK_BYTES ? c : ASYNC_CHUNK_BYTES;
}

/* A move's useful bytes in every pool; `whole`: a whole block's. Most
 * moves are whole blocks, and the pass that sums them runs before a
 * batch's first call (summing pool by pool took a few hundred ns a move
 * at 64 pools). */
static size_t move_bytes(const kvf_engine *e, uint32_t tokens, size_t whole)
{
    if (tokens == 0 || tokens >= e->pools[0].g.tokens_per_block)
        return whole;
    size_t bytes = 0;
    for (uint32_t p = 0; p < e->npools; p++) {
        kvf_region r = kvf__pool_region(&e->pools[p], tokens);
        bytes += kvf__region_bytes(&r);
    }
    return bytes;
}

/* Ends an async batch once its last chunk and its issuer are done. Lock held. */
static void async_release(kvf_engine *e, batch *b)
{
    if (--b->async_left)
        return;
    for (size_t i = 0; i < b->n && b->async_status != KVF_OK; i++)
        if (b->status[i] == KVF_INPROGRESS)
            kvf__fail_copy(b, i, b->async_status, b->async_msg);
    kvf__complete_batch(e, b);
}

/* Chunk c has finished. The backend calls the chunks of a queue back in
 * the order they were queued, each once its copies have ended: those of
 * every chunk before it have too, though the events of two chunks may be
 * taken here in either order (async_done). `why`: the backend's detail of
 * a failure, or NULL for its status's text. */
static void async_finish(kvf_engine *e, async_chunk *c, kvf_status status, const char *why)
{
    batch *b = c->b;
    /* after a failure, what the GPU still read is not known: the moves
     * go with the batch */
    if (status == KVF_OK && b->async_status == KVF_OK && c->end != CHUNK_NO_END)
        kvf__release_copied(e, b, c->end);
    if (status != KVF_OK && b->async_status == KVF_OK) {
        b->async_status = status;
        snprintf(b->async_msg, sizeof b->async_msg, "the device copy failed: %.130s",
                 why && *why ? why : kvf_status_str(status));
    }
    async_release(e, b);
}

/* The backend's callback: completes the chunk here when the engine lock
 * is free, else hands it to the completion thread (a submitter can hold
 * the lock for hundreds of microseconds, and the backend's thread has
 * other batches to end). */
static void async_done(void *arg, kvf_status status)
{
    async_chunk *c = arg;
    batch *b = c->b;
    kvf_engine *e = b->engine;
    KVF_TIMELINE(KVF_TL_COPIED, b->id, 0);
    if (status != KVF_OK) {
        /* the backend set this thread's detail just before calling: kept
         * for the moves' messages, so a failure (rare) waits for the lock
         * rather than travel through the queue without it */
        char why[sizeof b->async_msg];
        snprintf(why, sizeof why, "%s", kvf_last_error());
        engine_lock(e);
        async_finish(e, c, status, why);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (pthread_mutex_trylock(&e->mu) == 0) {
        async_finish(e, c, status, NULL);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    pthread_mutex_lock(&e->cb_mu);
    if (e->cb_n == e->cb_cap) {
        size_t cap = e->cb_cap ? 2 * e->cb_cap : 64;
        async_event *ev = realloc(e->cb_events, cap * sizeof *ev);
        if (!ev) {
            /* no room: complete it here, waiting for the lock after all */
            pthread_mutex_unlock(&e->cb_mu);
            engine_lock(e);
            async_finish(e, c, status, NULL);
            pthread_mutex_unlock(&e->mu);
            return;
        }
        e->cb_events = ev;
        e->cb_cap = cap;
    }
    e->cb_events[e->cb_n++] = (async_event){c, status};
    pthread_cond_signal(&e->cb_cv);
    pthread_mutex_unlock(&e->cb_mu);
}

void *kvf__completion_main(void *arg)
{
    kvf_engine *e = arg;
    pthread_mutex_lock(&e->cb_mu);
    for (;;) {
        while (e->cb_n == 0 && !e->cb_stop)
            pthread_cond_wait(&e->cb_cv, &e->cb_mu);
        if (e->cb_n == 0)
            break;
        /* take every queued event; the callback fills the spare array */
        async_event *ev = e->cb_events;
        size_t n = e->cb_n, cap = e->cb_cap;
        e->cb_events = e->cb_spare;
        e->cb_cap = e->cb_spare_cap;
        e->cb_n = 0;
        e->cb_spare = NULL;
        e->cb_spare_cap = 0;
        pthread_mutex_unlock(&e->cb_mu);
        engine_lock(e);
        for (size_t i = 0; i < n; i++)
            async_finish(e, ev[i].c, ev[i].status, NULL);
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&e->cb_mu);
        if (!e->cb_spare) {
            e->cb_spare = ev;
            e->cb_spare_cap = cap;
        } else {
            free(ev);
        }
    }
    pthread_mutex_unlock(&e->cb_mu);
    return NULL;
}

/* Ends the completion thread (every batch already complete). */
void kvf__completion_stop(kvf_engine *e)
{
    if (e->cb_started) {
        pthread_mutex_lock(&e->cb_mu);
        e->cb_stop = true;
        pthread_cond_signal(&e->cb_cv);
        pthread_mutex_unlock(&e->cb_mu);
        pthread_join(e->cb_thread, NULL);
        e->cb_started = false;
    }
    free(e->cb_events);
    free(e->cb_spare);
    e->cb_events = e->cb_spare = NULL;
    pthread_mutex_destroy(&e->cb_mu);
    pthread_cond_destroy(&e->cb_cv);
}

/* Hands a ready copy batch to an asynchronous backend, in chunks. Called
 * with the lock held; drops it while the backend queues the copies. The
 * issuer holds one count of async_left, so the batch cannot complete (and
 * be freed) before the last chunk is queued. */
void kvf__issue_async(kvf_engine *e, batch *b)
{
    KVF_TIMELINE(KVF_TL_ISSUE, b->id, b->n);
    /* a batch naming its pools goes pool by pool, in the caller's order,
     * each pool's arrival marked on the queue (kvf_wait_pool) */
    const pool_sel *sel = b->sel;
    size_t live = 0;        /* moves still to copy */
    size_t live_bytes = 0;  /* their useful bytes, moving every pool */
    size_t whole_bytes = 0; /* a whole block's, every pool */
    for (uint32_t p = 0; !sel && p < e->npools; p++)
        whole_bytes += e->pools[p].block_bytes;
    for (size_t i = 0; i < b->n; i++) {
        if (b->status[i] != KVF_INPROGRESS)
            continue;
        if (kvf__source_lost(e, b, i)) {
            kvf__fail_lost_source(b, i);
        } else if (kvf__dest_lost(e, b, i)) {
            kvf__fail_lost_dest(b, i);
        } else {
            live++;
            if (!sel)
                live_bytes += move_bytes(e, b->moves[i].tokens, whole_bytes);
        }
    }
    const size_t chunk_bytes = chunk_bytes_for(e->device_call_bytes, live_bytes, live * e->npools);
    uint32_t passes = sel ? sel->n : 1;
    bool marking = sel && !b->group && e->backend->ops->queue_mark;
    size_t per_copy = sel ? 1 : e->npools; /* copies per move and pass */
    size_t need = b->n * per_copy < ASYNC_CHUNK_COPIES + per_copy ? b->n * per_copy
                                                                  : ASYNC_CHUNK_COPIES + per_copy;
    if (b->copies_cap < need) {
        free(b->copies);
        b->copies = malloc(need * sizeof *b->copies);
        b->copies_cap = b->copies ? need : 0;
    }
    /* a count for each chunk to be handed over, taken now so that the
     * chunks go without the lock; those of chunks that never reached the
     * backend are given back below. A chunk ends at ASYNC_CHUNK_COPIES
     * copies or (moving every pool) chunk_bytes bytes, the last one
     * short: at most this many */
    size_t per_pass = live * per_copy / ASYNC_CHUNK_COPIES + 1;
    if (!sel)
        per_pass += live_bytes / chunk_bytes;
    size_t planned = passes * per_pass, issued = 0;
    if (b->chunks_cap < planned) {
        free(b->chunks);
        b->chunks = malloc(planned * sizeof *b->chunks);
        b->chunks_cap = b->chunks ? planned : 0;
    }
    if (!b->copies || !b->chunks) {
        for (size_t i = 0; i < b->n; i++)
            if (b->status[i] == KVF_INPROGRESS)
                kvf__fail_copy(b, i, KVF_ERR_NOMEM, "out of memory for the batch's copies");
        kvf__complete_batch(e, b);
        return;
    }
    uint32_t marked = 0;
    b->async_left = 1 + (uint32_t)planned;
    b->async_status = KVF_OK;
    pthread_mutex_unlock(&e->mu);
    /* statuses still KVF_INPROGRESS change only at completion, which the
     * issuer's count holds off: reading them unlocked is safe */
    kvf_status st = KVF_OK;
    char why[sizeof b->async_msg - 32] = "";
    /* kvf_offload_after: the copies queued next wait on the device for
     * the caller's stream (later batches on the queue too: they come after) */
    if (b->after && live &&
        (st = e->backend->ops->mark_gate(e->backend, b->queue, b->after)) != KVF_OK) {
        snprintf(why, sizeof why, "ordering after the caller's stream: %s", kvf_last_error());
        KVF_LOG(KVF_LOG_ERROR, "%s: batch %llu: %s", op_name(b->kind), (unsigned long long)b->id,
                why);
    }
    for (uint32_t pass = 0; pass < passes && st == KVF_OK; pass++) {
        for (size_t i = 0; i < b->n && st == KVF_OK;) {
            size_t ncopies = 0, bytes = 0;
            for (; i < b->n && ncopies < ASYNC_CHUNK_COPIES && (sel || bytes < chunk_bytes); i++) {
                if (b->status[i] != KVF_INPROGRESS)
                    continue;
                if (sel) {
                    b->copies[ncopies++] =
                        kvf__move_copy(e, b->kind, sel->order[pass], &b->moves[i]);
                    continue;
                }
                for (uint32_t p = 0; p < e->npools; p++) {
                    kvf__copy *cp = &b->copies[ncopies++];
                    *cp = kvf__move_copy(e, b->kind, p, &b->moves[i]);
                    bytes += cp->width * cp->rows;
                }
            }
            if (ncopies == 0)
                break;
            /* the moves before i have copied once this chunk has; those
             * of a pass of some pools only once every pass has */
            async_chunk *c = &b->chunks[issued];
            *c = (async_chunk){b, sel ? CHUNK_NO_END : i};
            KVF_TIMELINE(KVF_TL_CALL, b->id, ncopies);
            st = e->backend->ops->copy_async(e->backend, b->queue, b->copies, ncopies,
                                             sel ? KVF__COPY_BESIDE_COMPUTE : 0u, async_done, c);
            if (st == KVF_OK) {
                issued++;
            } else {
                snprintf(why, sizeof why, "%s", kvf_last_error());
                KVF_LOG(KVF_LOG_ERROR, "%s: batch %llu: %s", op_name(b->kind),
                        (unsigned long long)b->id, why);
            }
        }
        /* unpublished until the lock is retaken: no waiter reads it yet */
        if (marking && st == KVF_OK) {
            if (e->backend->ops->queue_mark(e->backend, b->queue, &b->sel->marks[pass]) == KVF_OK) {
                marked = pass + 1;
            } else {
                /* its waiters wait for the whole batch instead */
                KVF_LOG(KVF_LOG_WARN, "%s: batch %llu: marking pool %u's arrival: %s",
                        op_name(b->kind), (unsigned long long)b->id, sel->order[pass],
                        kvf_last_error());
                marking = false;
            }
        }
    }
    engine_lock(e);
    b->async_left -= (uint32_t)(planned - issued);
    KVF_TIMELINE(KVF_TL_ISSUED, b->id, issued);
    if (st != KVF_OK && b->async_status == KVF_OK) {
        b->async_status = st;
        snprintf(b->async_msg, sizeof b->async_msg, "not queued on the device: %s", why);
    }
    if (b->sel && !b->group)
        b->sel->nmarks = marked;
    if (b->async_left > 1) {
        b->on_stream = true;
        /* a sync_stream waiting for this batch to reach the GPU may go on */
        pthread_cond_broadcast(&e->done_cv);
    }
    async_release(e, b);
}
