/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-wise batches: a batch that moves some pools (an engine with a pool
 * per layer moves a layer at a time), in the order the caller lists them,
 * and the waits for one pool's arrival (kvf_wait_pool on the host,
 * kvf_stream_wait_pool on a caller's stream).
 *
 * On an asynchronous backend an unsplit batch is issued pool by pool, and
 * a backend mark (a CUDA event) after each pool's copies tells its
 * arrival. An onboard from DISK reads each block's file pool group by
 * pool group, every block's group before the next (arrival.c): a pool
 * arrives with its group, on every backend. Elsewhere (the host backend
 * between slots, the remote tier, a batch between slots large enough to
 * be cut into parts) a pool arrives with its whole batch: the same
 * answers, later.
 */
#include "engine_private.h"

/* pools[0..n_pools) against the engine's pools, marking each in `in`
 * (e->npools flags, zeroed). Counts first: a list longer than the pool
 * count is read no further than its first npools + 1 entries, which by
 * then hold an index out of range or one listed twice (never allocated
 * for, whatever n_pools claims). */
static kvf_status pools_mark(const kvf_engine *e, const char *fn, const uint32_t *pools,
                             size_t n_pools, uint8_t *in)
{
    if (n_pools == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: n_pools is 0 (NULL pools moves every pool)", fn);
    size_t scan = n_pools > e->npools ? (size_t)e->npools + 1 : n_pools;
    for (size_t k = 0; k < scan; k++) {
        uint32_t p = pools[k];
        if (p >= e->npools)
            return kvf__fail(KVF_ERR_RANGE, "%s: pools[%zu]: pool %u out of range (%u pools)", fn,
                             k, p, e->npools);
        if (in[p])
            return kvf__fail(KVF_ERR_INVALID, "%s: pools[%zu]: pool %u listed twice", fn, k, p);
        in[p] = 1;
    }
    return KVF_OK;
}

kvf_status kvf__engine_pools_check(const kvf_engine *e, const char *fn, const uint32_t *pools,
                                   size_t n_pools)
{
    uint8_t *in = calloc(e->npools ? e->npools : 1, 1);
    if (!in)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for the pool list", fn);
    kvf_status st = pools_mark(e, fn, pools, n_pools, in);
    free(in);
    return st;
}

kvf_status kvf__pool_sel_make(kvf_engine *e, const char *fn, op_kind kind, const uint32_t *pools,
                              size_t n_pools, pool_sel **sel_p)
{
    *sel_p = NULL;
    if (!pools) {
        if (n_pools)
            return kvf__fail(KVF_ERR_INVALID, "%s: pools is NULL with n_pools = %zu", fn, n_pools);
        return KVF_OK;
    }
    /* the list is checked before anything is sized by n_pools, which is
     * then at most the pool count */
    pool_sel *s = calloc(1, sizeof *s);
    if (s)
        s->in = calloc(e->npools ? e->npools : 1, 1);
    kvf_status st = s && s->in ? pools_mark(e, fn, pools, n_pools, s->in) : KVF_ERR_NOMEM;
    if (st == KVF_OK) {
        s->order = malloc(n_pools * sizeof *s->order);
        s->marks = calloc(n_pools, sizeof *s->marks);
        if (!s->order || !s->marks)
            st = KVF_ERR_NOMEM;
    }
    if (st != KVF_OK) {
        kvf__pool_sel_free(e, s);
        return st == KVF_ERR_NOMEM ? kvf__fail(st, "%s: out of memory for the pool list", fn) : st;
    }
    /* a layer-wise onboard from DISK, or from a REMOTE store that reads
     * in groups, arrives pool group by pool group (arrival.c): at most a
     * group per pool */
    if (kind.dir == OP_ONBOARD && kvf__arrival_of(e, kind.tier) &&
        (kvf_engine_layerwise_tiers(e) >> kind.tier & 1u) &&
        !(s->group_moves = calloc(e->npools, sizeof *s->group_moves))) {
        kvf__pool_sel_free(e, s);
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for the pool list", fn);
    }
    memcpy(s->order, pools, n_pools * sizeof *pools);
    s->n = (uint32_t)n_pools;
    s->whole = n_pools == e->npools;
    kvf_tier ws = kind_writes(kind);
    if (!s->whole && tier_keyed(ws)) {
        kvf__pool_sel_free(e, s);
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "%s: %zu of %u pools to the %s tier: a stored block holds every pool "
                         "(offload the pools to the host tier, then the whole block)",
                         fn, n_pools, e->npools, kvf_tier_name(ws));
    }
    if (!s->whole && ws == KVF_TIER_HOST && !e->sec_pool_bits && e->secondary_slots) {
        /* which pools of each slot were written, from the first write of
         * some of them (sec_slot.pools) */
        size_t bits = (size_t)e->secondary_slots * e->npools;
        if (!(e->sec_pool_bits = calloc((bits + 7) / 8, 1))) {
            kvf__pool_sel_free(e, s);
            return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for the secondary slots' pools", fn);
        }
    }
    *sel_p = s;
    return KVF_OK;
}

size_t kvf__sel_compact(const kvf_engine *e, const batch *b, kvf__copy *cp, size_t n)
{
    if (!b->sel || b->sel->whole)
        return n;
    size_t kept = 0;
    for (size_t k = 0; k < n; k++)
        if (b->sel->in[k % e->npools])
            cp[kept++] = cp[k];
    return kept;
}

static void drop_marks(kvf_engine *e, pool_sel *s)
{
    for (uint32_t k = 0; k < s->n; k++)
        if (s->marks[k]) {
            e->backend->ops->mark_free(e->backend, s->marks[k]);
            s->marks[k] = NULL;
        }
    s->nmarks = 0;
}

void kvf__pool_sel_free(kvf_engine *e, pool_sel *s)
{
    if (!s)
        return;
    if (s->marks)
        drop_marks(e, s);
    free(s->order);
    free(s->in);
    free(s->marks);
    free(s->group_moves);
    free(s);
}

void kvf__pool_sel_done(kvf_engine *e, batch *b)
{
    if (b->sel && !b->group && !b->sel->busy)
        drop_marks(e, b->sel);
}

/* ---- submission ---------------------------------------------------------- */

kvf_status kvf_onboard_pools(kvf_engine *e, kvf_tier from, const uint32_t *pools, size_t n_pools,
                             const kvf_move *moves, size_t n, kvf_ticket *ticket_p)
{
    kvf__clear_error();
    op_kind kind = KIND_FENCE; /* set when the tier is taken */
    kvf_status st = kvf__tier_kind("kvf_onboard_pools", from, OP_ONBOARD, &kind);
    return st != KVF_OK
               ? st
               : kvf__submit_pools(e, kind, false, NULL, pools, n_pools, moves, n, ticket_p);
}

kvf_status kvf_offload_pools(kvf_engine *e, void *stream, kvf_tier to, const uint32_t *pools,
                             size_t n_pools, const kvf_move *moves, size_t n, kvf_ticket *ticket_p)
{
    return kvf__offload_after(e, "kvf_offload_pools", stream, to, pools, n_pools, moves, n,
                              ticket_p);
}

/* ---- waiting for one pool ------------------------------------------------ */

/* The ticket's batch, moving pool `pi`. Lock held. */
static kvf_status ticket_batch(kvf_engine *e, const char *fn, kvf_ticket t, uint32_t pi,
                               batch **b_p)
{
    batch *b = *kvf__ticket_slot(e, t);
    *b_p = NULL;
    if (!b)
        return kvf__fail(KVF_ERR_UNKNOWN_TICKET, "%s: ticket %llu: unknown or already retired", fn,
                         (unsigned long long)t.id);
    if (pi >= e->npools || !sel_has(b, pi))
        return kvf__fail(KVF_ERR_RANGE,
                         "%s: ticket %llu: pool %u is not one the batch moves (%u of %u pools)", fn,
                         (unsigned long long)t.id, pi, b->sel ? b->sel->n : e->npools, e->npools);
    *b_p = b;
    return KVF_OK;
}

/* The first failure among the batch's moves so far, naming it. Lock held. */
static kvf_status known_failure(const char *fn, const batch *b, uint32_t pi)
{
    for (size_t i = 0; i < b->n; i++) {
        kvf_status st = b->status[i];
        if (st != KVF_OK && st != KVF_INPROGRESS)
            return kvf__fail(st, "%s: ticket %llu: pool %u: move %zu failed (%s); see kvf_wait", fn,
                             (unsigned long long)b->id, pi, i, kvf_status_str(st));
    }
    return KVF_OK;
}

/* The mark after pool `pi`'s copies, once the batch is on its stream;
 * NULL while it is not (yet), or where it has none. Lock held. */
static void *pool_mark(const batch *b, uint32_t pi)
{
    const pool_sel *s = b->sel;
    if (!s || b->group || !b->on_stream)
        return NULL;
    for (uint32_t k = 0; k < s->nmarks; k++)
        if (s->order[k] == pi)
            return s->marks[k];
    return NULL;
}

/* Blocks on the engine's completion signal, at most until `deadline_ns`
 * (kvf__now_ns time; 0: no limit). false once the deadline has passed.
 * Lock held. */
static bool wait_done_by(kvf_engine *e, uint64_t deadline_ns)
{
    if (!deadline_ns) {
        pthread_cond_wait(&e->done_cv, &e->mu);
        return true;
    }
    uint64_t now = kvf__now_ns();
    if (now >= deadline_ns)
        return false;
    /* done_cv runs on the realtime clock: the time left, from it */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t at = (uint64_t)ts.tv_nsec + (deadline_ns - now);
    ts.tv_sec += (time_t)(at / 1000000000u);
    ts.tv_nsec = (long)(at % 1000000000u);
    pthread_cond_timedwait(&e->done_cv, &e->mu, &ts);
    return true;
}

/* Waits for pool `pi` of ticket t: on `stream` when it is non-NULL and
 * the backend can (the host returns once the batch is on the GPU), else
 * on the calling thread. Gives up with KVF_ERR_TIMEOUT once `deadline_ns`
 * passes (0: never) while the batch is neither done nor on its stream;
 * a pool whose copies are already queued on the device is waited for. */
static kvf_status wait_pool(kvf_engine *e, const char *fn, kvf_ticket t, uint32_t pi, void *stream,
                            uint64_t deadline_ns)
{
    kvf__clear_error();
    if (!e)
        return kvf__fail(KVF_ERR_INVALID, "%s: engine is NULL", fn);
    engine_lock(e);
    batch *b;
    kvf_status st = ticket_batch(e, fn, t, pi, &b);
    if (!b) {
        pthread_mutex_unlock(&e->mu);
        return st;
    }
    /* held until this waiter is done with it, whoever retires the ticket
     * meanwhile: its statuses stay its own */
    b->waiters++;
    void *mark = NULL;
    bool in_time = true, arrived = false;
    while (b->state != B_DONE && !(mark = pool_mark(b, pi)) &&
           !(arrived = kvf__pool_arrived(e, b, pi)) && in_time)
        in_time = wait_done_by(e, deadline_ns);
    /* a pool found arrived as the time ran out is not late: this thread
     * may itself have run late, its timed wait long over */
    in_time = in_time || b->state == B_DONE || mark || arrived;
    if (!in_time)
        st = kvf__fail(KVF_ERR_TIMEOUT, "%s: ticket %llu: pool %u has not arrived by the deadline",
                       fn, (unsigned long long)t.id, pi);
    else if (b->state == B_DONE || arrived)
        /* arrived: its group is in every move's slots, copied and checked
         * (a synchronous copy: nothing left to join on a stream) */
        st = known_failure(fn, b, pi);
    else if ((st = known_failure(fn, b, pi)) == KVF_OK) {
        if (stream && e->backend->ops->mark_join) {
            /* under the lock: completion cannot release the mark meanwhile */
            st = e->backend->ops->mark_join(e->backend, mark, stream);
        } else {
            b->sel->busy++;
            pthread_mutex_unlock(&e->mu);
            st = e->backend->ops->mark_wait(e->backend, mark);
            engine_lock(e);
            b->sel->busy--;
            if (st == KVF_OK)
                st = known_failure(fn, b, pi);
        }
        if (st != KVF_OK && kvf_last_error()[0] == '\0')
            kvf__fail(st, "%s: ticket %llu: pool %u", fn, (unsigned long long)t.id, pi);
    }
    b->waiters--;
    if (b->state == B_DONE) {
        /* completion (or a retiring wait) may have left the marks, and the
         * batch, to this waiter */
        kvf__pool_sel_done(e, b);
        kvf__batch_release(b);
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

kvf_status kvf_wait_pool(kvf_engine *e, kvf_ticket t, uint32_t pi)
{
    return wait_pool(e, "kvf_wait_pool", t, pi, NULL, 0);
}

kvf_status kvf_stream_wait_pool(kvf_engine *e, kvf_ticket t, uint32_t pi, void *stream)
{
    return wait_pool(e, "kvf_stream_wait_pool", t, pi, stream, 0);
}

kvf_status kvf__stream_wait_pool_by(kvf_engine *e, kvf_ticket t, uint32_t pi, void *stream,
                                    uint64_t deadline_ns)
{
    return wait_pool(e, "kvf_stream_wait_pool", t, pi, stream, deadline_ns);
}
