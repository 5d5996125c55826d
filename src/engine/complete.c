/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Completion of batches, tickets (wait, poll) and sync with a caller's
 * stream.
 */
#include "engine_private.h"

/* ---- completion ------------------------------------------------------------ */

static void hazard_drop_reader(hazard *h, uint64_t id)
{
    for (uint32_t k = 0; k < h->nreaders; k++)
        if (hazard_reader(h, k) == id) {
            hazard_set_entry(h, k, hazard_entry(h, h->nreaders - 1));
            h->nreaders--;
            return;
        }
}

/* A group whose parts have all completed: its moves still in progress
 * are those its parts completed without a failure. Lock held. */
void kvf__release_after(kvf_engine *e, batch *b)
{
    if (b->after && !b->group) {
        e->backend->ops->mark_free(e->backend, b->after);
        b->after = NULL;
    }
}

void kvf__group_done(kvf_engine *e, batch *g)
{
    kvf__release_after(e, g);
    for (size_t i = 0; i < g->n; i++)
        if (g->status[i] == KVF_INPROGRESS)
            g->status[i] = KVF_OK;
    kvf__costs_batch_done(e, g);
    g->state = B_DONE;
    pthread_cond_broadcast(&e->done_cv);
    kvf__batch_release(g);
}

/* Marks a batch done: records poison for failed writes, leaves the keyed
 * hazard tables (slots' entries name it by id, and need nothing: see
 * hazard), releases its dependents, wakes waiters. Lock held. */
void kvf__complete_batch(kvf_engine *e, batch *b)
{
    kvf_tier rs = kind_reads(b->kind);
    kvf_tier ws = kind_writes(b->kind);
    bool keyed_read = tier_keyed(rs);
    bool keyed_write = tier_keyed(ws);
    kvf__release_after(e, b);
    for (size_t i = 0; i < b->n; i++) {
        const kvf_move *mv = &b->moves[i];
        if (b->status[i] == KVF_INPROGRESS)
            b->status[i] = KVF_OK;
        bool failed = b->status[i] != KVF_OK;
        if (keyed_read) {
            hazard *r = hazard_of(e, rs, mv->src, mv->key, false);
            if (r)
                hazard_drop_reader(r, b->id);
        }
        if (i >= b->nregistered) {
            /* never queued as a writer there: its write changes nothing */
        } else if (keyed_write) {
            hazard *w = hazard_of(e, ws, mv->dst, mv->key, false);
            if (w) {
                if (w->writer == b->id)
                    w->writer = 0;
                w->poison = failed ? b->id : 0;
            }
        } else if (failed) {
            hazard_of(e, ws, mv->dst, mv->key, false)->poison = b->id;
            if (ws == KVF_TIER_HOST)
                e->sec[mv->dst].lost_pool =
                    b->sel && !b->sel->whole ? b->sel->order[0] : UINT32_MAX;
        }
        if (failed && !b->ticketed && !(b->group && b->group->ticketed))
            KVF_LOG(KVF_LOG_WARN, "%s: move %zu (src %llu, dst %llu, key " KVF_KEY_FMT "): %s",
                    op_name(b->kind), i, (unsigned long long)mv->src, (unsigned long long)mv->dst,
                    KVF_KEY_ARGS(mv->key), kvf_status_str(b->status[i]));
    }
    /* keyed entries go once nothing is pending on them */
    for (size_t i = 0; i < b->n && (keyed_read || keyed_write); i++) {
        if (keyed_read)
            kvf__key_hazard_prune(&tier_of(e, rs)->hazards, b->moves[i].key);
        if (keyed_write && ws != rs)
            kvf__key_hazard_prune(&tier_of(e, ws)->hazards, b->moves[i].key);
    }
    if (!b->group)
        kvf__costs_batch_done(e, b);
    kvf__pool_sel_done(e, b);
    KVF_TIMELINE(KVF_TL_COMPLETE, b->id, b->n);
    if (e->live_cap && e->live[b->id & (e->live_cap - 1)] == b)
        e->live[b->id & (e->live_cap - 1)] = NULL;
    for (size_t k = 0; k < b->ndependents; k++) {
        batch *d = b->dependents[k].b;
        if (--d->deps_left == 0)
            kvf__ready_push(e, d);
    }
    b->ndependents = 0;
    b->state = B_DONE;
    if (b->prev_undone)
        b->prev_undone->next_undone = b->next_undone;
    else
        e->undone_head = b->next_undone;
    if (b->next_undone)
        b->next_undone->prev_undone = b->prev_undone;
    else
        e->undone_tail = b->prev_undone;
    e->undone_count--;
    if (b->group) {
        batch *g = b->group;
        /* the part's messages, renumbered into the caller's batch */
        for (kvf__move_error *r = atomic_exchange(&b->errors, NULL), *next; r; r = next) {
            next = r->next;
            r->index = g->sorted ? g->order[b->group_off + r->index] : b->group_off + r->index;
            kvf__push_error(g, r);
        }
        if (g->sorted) {
            /* failures only (scattered stores, each a cache miss): the
             * others become KVF_OK in kvf__group_done */
            const uint32_t *ord = g->order + b->group_off;
            for (size_t i = 0; i < b->n; i++)
                if (b->status[i] != KVF_OK)
                    g->status[ord[i]] = b->status[i];
        } else {
            memcpy(g->status + b->group_off, b->status, b->n * sizeof *b->status);
        }
        if (--g->parts_left == 0)
            kvf__group_done(e, g);
    }
    pthread_cond_broadcast(&e->done_cv);
    kvf__batch_release(b);
}

void kvf__release_copied(kvf_engine *e, batch *b, size_t upto)
{
    if (upto <= b->copied)
        return;
    b->copied = upto;
    /* in order: add_dependency finds the edge of the batch registering
     * last at the end */
    size_t kept = 0;
    for (size_t k = 0; k < b->ndependents; k++) {
        dep_edge ed = b->dependents[k];
        if (ed.need != DEP_WHOLE && ed.need < upto) {
            if (--ed.b->deps_left == 0)
                kvf__ready_push(e, ed.b);
        } else {
            b->dependents[kept++] = ed;
        }
    }
    b->ndependents = kept;
}

/* A move whose source was written by a move that failed: lost. Lock held. */
bool kvf__source_lost(kvf_engine *e, const batch *b, size_t i)
{
    if (!b->src_dep[i])
        return false;
    kvf_tier rs = kind_reads(b->kind);
    const hazard *h = hazard_of(e, rs, b->moves[i].src, b->moves[i].key, false);
    return h && h->poison == b->src_dep[i];
}

bool kvf__dest_lost(kvf_engine *e, const batch *b, size_t i)
{
    if (!b->sel || b->sel->whole || i >= b->nregistered || !b->dst_dep[i])
        return false;
    const hazard *h = hazard_of(e, kind_writes(b->kind), b->moves[i].dst, b->moves[i].key, false);
    return h && h->poison == b->dst_dep[i];
}

/* What a move reads or writes, for its message: "block 0x2a",
 * "primary slot 3". */
static void name_place(char *out, size_t cap, kvf_tier sp, uint64_t v, kvf_key key)
{
    if (tier_keyed(sp))
        snprintf(out, cap, "%s " KVF_KEY_FMT, kvf__tiers[sp].place, KVF_KEY_ARGS(key));
    else
        snprintf(out, cap, "%s %llu", kvf__tiers[sp].place, (unsigned long long)v);
}

/* A move whose source a failed move was to write (kvf__source_lost). */
void kvf__fail_lost_source(batch *b, size_t i)
{
    char src[64], which[32] = "";
    kvf_tier rs = kind_reads(b->kind);
    name_place(src, sizeof src, rs, b->moves[i].src, b->moves[i].key);
    if (rs == KVF_TIER_HOST) {
        uint32_t p = b->engine->sec[b->moves[i].src].lost_pool;
        if (p == UINT32_MAX)
            snprintf(which, sizeof which, ", every pool");
        else
            snprintf(which, sizeof which, ", pool %u", p);
    }
    kvf__move_failed(b, i, KVF_ERR_LOST, "%s: %s%s: the move of batch %llu that wrote it failed",
                     op_name(b->kind), src, which, (unsigned long long)b->src_dep[i]);
}

void kvf__fail_lost_dest(batch *b, size_t i)
{
    char dst[64];
    name_place(dst, sizeof dst, kind_writes(b->kind), b->moves[i].dst, b->moves[i].key);
    kvf__move_failed_dest(
        b, i, KVF_ERR_LOST,
        "%s: %s: the move of batch %llu that wrote it failed, and this one writes "
        "only %u of its pools",
        op_name(b->kind), dst, (unsigned long long)b->dst_dep[i], b->sel->n);
}

/* A move whose copy between slots failed, as `why` says. */
void kvf__fail_copy(batch *b, size_t i, kvf_status st, const char *why)
{
    char src[64], dst[64];
    name_place(src, sizeof src, kind_reads(b->kind), b->moves[i].src, b->moves[i].key);
    name_place(dst, sizeof dst, kind_writes(b->kind), b->moves[i].dst, b->moves[i].key);
    kvf__move_failed(b, i, st, "%s: %s to %s: %s", op_name(b->kind), src, dst, why);
}

/* ---- tickets and sync ------------------------------------------------------ */

batch **kvf__ticket_slot(kvf_engine *e, kvf_ticket t)
{
    batch **pp = &e->tickets[t.id % TICKET_BUCKETS];
    while (*pp && (*pp)->id != t.id)
        pp = &(*pp)->next_ticket;
    return pp;
}

/* Retires a completed ticket: its statuses into per_move, its failed
 * moves' messages (kvf__collect_errors) into *errors_p, or freed with NULL.
 * Lock held. */
static kvf_status finish_ticket(kvf_engine *e, batch **pp, kvf_status *per_move,
                                kvf__move_error **errors_p)
{
    batch *b = *pp;
    kvf_status ret = KVF_OK;
    size_t failed = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (per_move)
            per_move[i] = b->status[i];
        if (b->status[i] != KVF_OK && failed++ == 0)
            ret = b->status[i];
    }
    kvf__move_error *errors = kvf__collect_errors(b, failed);
    uint64_t id = b->id;
    size_t n = b->n;
    *pp = b->next_ticket;
    b->retired = true;
    kvf__batch_release(b);
    if (ret != KVF_OK) {
        if (errors)
            kvf__fail(ret, "ticket %llu: %zu of %zu moves failed; move %zu: %s",
                      (unsigned long long)id, failed, n, errors->index, errors->message);
        else
            kvf__fail(ret, "ticket %llu: %zu moves failed (%s); see the per-move statuses",
                      (unsigned long long)id, failed, kvf_status_str(ret));
    }
    if (errors_p)
        *errors_p = errors;
    else
        kvf__move_errors_free(errors);
    return ret;
}

/* *done_p (may be NULL): the ticket completed and was retired here. */
static kvf_status ticket_result(kvf_engine *e, kvf_ticket t, kvf_status *per_move, bool block,
                                kvf__move_error **errors_p, bool *done_p)
{
    kvf__clear_error();
    if (!e)
        return kvf__fail(KVF_ERR_INVALID, "ticket %llu: engine is NULL", (unsigned long long)t.id);
    engine_lock(e);
    batch **pp = kvf__ticket_slot(e, t);
    if (!*pp) {
        pthread_mutex_unlock(&e->mu);
        return kvf__fail(KVF_ERR_UNKNOWN_TICKET, "ticket %llu: unknown or already retired",
                         (unsigned long long)t.id);
    }
    batch *b = *pp;
    if (b->state != B_DONE && !block) {
        pthread_mutex_unlock(&e->mu);
        return KVF_INPROGRESS;
    }
    b->waiters++;
    while (b->state != B_DONE)
        pthread_cond_wait(&e->done_cv, &e->mu);
    b->waiters--;
    if (b->retired) {
        /* another thread's wait or poll retired it meanwhile: its result
         * went there; this waiter only lets go of the batch */
        kvf__batch_release(b);
        pthread_mutex_unlock(&e->mu);
        return kvf__fail(KVF_ERR_UNKNOWN_TICKET,
                         "ticket %llu: already retired by a wait or poll on another thread",
                         (unsigned long long)t.id);
    }
    pp = kvf__ticket_slot(e, t); /* the chain may have changed while waiting */
    kvf_status st = finish_ticket(e, pp, per_move, errors_p);
    pthread_mutex_unlock(&e->mu);
    if (done_p)
        *done_p = true;
    return st;
}

kvf_status kvf_poll(kvf_engine *e, kvf_ticket t, kvf_status *per_move)
{
    return ticket_result(e, t, per_move, false, NULL, NULL);
}

kvf_status kvf_wait(kvf_engine *e, kvf_ticket t, kvf_status *per_move)
{
    return ticket_result(e, t, per_move, true, NULL, NULL);
}

kvf_status kvf__engine_ticket_errors(kvf_engine *e, kvf_ticket t, bool block, kvf_status *per_move,
                                     kvf__move_error **errors_p)
{
    *errors_p = NULL;
    return ticket_result(e, t, per_move, block, errors_p, NULL);
}

static kvf_status ticket_errors(kvf_engine *e, kvf_ticket t, bool block, kvf_status *per_move,
                                kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    if (!errors && cap) {
        kvf__clear_error();
        return kvf__fail(KVF_ERR_INVALID, "ticket %llu: errors is NULL with cap = %zu",
                         (unsigned long long)t.id, cap);
    }
    kvf__move_error *list = NULL;
    bool done = false;
    kvf_status st = ticket_result(e, t, per_move, block, &list, &done);
    if (done)
        kvf__move_errors_deliver(list, errors, cap, n_errors_p);
    return st;
}

kvf_status kvf_wait_errors(kvf_engine *e, kvf_ticket t, kvf_status *per_move,
                           kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    return ticket_errors(e, t, true, per_move, errors, cap, n_errors_p);
}

kvf_status kvf_poll_errors(kvf_engine *e, kvf_ticket t, kvf_status *per_move,
                           kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    return ticket_errors(e, t, false, per_move, errors, cap, n_errors_p);
}

/* Whether every batch up to `last_id` is done or, with an asynchronous
 * backend, already on its stream. Lock held. */
static bool all_issued(const kvf_engine *e, uint64_t last_id, bool host_only)
{
    for (const batch *b = e->undone_head; b && b->id <= last_id; b = b->next_undone)
        if (host_only || !b->on_stream)
            return false;
    return true;
}

kvf_status kvf_sync_stream(kvf_engine *e, void *stream)
{
    kvf__clear_error();
    if (!e)
        return kvf__fail(KVF_ERR_INVALID, "kvf_sync_stream: engine is NULL");
    bool gpu = stream && e->backend->ops->sync_stream;
    engine_lock(e);
    uint64_t last = e->next_id - 1;
    /* batches still waiting for their dependencies, or going to files, are
     * not on a stream yet: wait for them on the host */
    while (!all_issued(e, last, !gpu))
        pthread_cond_wait(&e->done_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (gpu)
        return e->backend->ops->sync_stream(e->backend, stream);
    return KVF_OK;
}
