/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A get's pools, one at a time (kvf_cache_wait_pool,
 * kvf_cache_stream_wait_pool, kvf_cache_wait_pool_by): the engine's
 * per-pool waits over each tier's batch of the call.
 */
#include "cache_private.h"

#include <math.h> /* isfinite, a macro: nothing to link */
#include <stdlib.h>

/* The call of ticket t, refused with a status when another thread waits
 * for it or retired it. Lock held. */
static kvf_status waitable_call(kvf_cache *c, const char *fn, kvf_cache_ticket t, call **k_p)
{
    call *k = *kvf__cache_call_slot(c, t);
    *k_p = k && !k->waited ? k : NULL;
    if (*k_p)
        return KVF_OK;
    return kvf__fail(k ? KVF_ERR_STATE : KVF_ERR_UNKNOWN_TICKET, "%s: ticket %llu %s", fn,
                     (unsigned long long)t.id,
                     k ? "is waited for by another thread" : "unknown or already retired");
}

/* The first failure among an op's blocks already known. Lock held. */
static kvf_status op_failure(const char *fn, kvf_cache_ticket t, const op *o)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->status[i] != KVF_OK && o->status[i] != KVF_INPROGRESS)
            return kvf__fail(o->status[i], "%s: ticket %llu: block " KVF_KEY_FMT " failed (%s)", fn,
                             (unsigned long long)t.id, KVF_KEY_ARGS(o->keys[i]),
                             kvf_status_str(o->status[i]));
    return KVF_OK;
}

/* An engine ticket of the call found retired: another thread polled the
 * call (the op's statuses are in, under the lock), waits for it or
 * retired it. Never "arrived" on its own: the batch may have failed. */
static kvf_status retired_meanwhile(kvf_cache *c, const char *fn, kvf_cache_ticket t, kvf_ticket et)
{
    pthread_mutex_lock(&c->mu);
    call *k;
    kvf_status st = waitable_call(c, fn, t, &k);
    for (op *o = k ? k->ops : NULL; o && st == KVF_OK; o = o->next)
        if (o->ticket.id == et.id)
            st = o->done ? op_failure(fn, t, o)
                         : kvf__fail(KVF_ERR_STATE, "%s: ticket %llu: batch %llu retired elsewhere",
                                     fn, (unsigned long long)t.id, (unsigned long long)et.id);
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* within_s < 0: no limit; else counted from the get's submission */
static kvf_status wait_pool(kvf_cache *c, const char *fn, kvf_cache_ticket t, uint32_t pool,
                            void *stream, double within_s)
{
    kvf__clear_error();
    if (!c)
        return kvf__fail(KVF_ERR_INVALID, "%s: cache is NULL", fn);
    kvf_ticket tickets[KVF_TIER_COUNT]; /* a get queues a batch per tier at most */
    size_t nt = 0;
    pthread_mutex_lock(&c->mu);
    call *k;
    kvf_status st = waitable_call(c, fn, t, &k);
    if (st != KVF_OK) {
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    bool moves_it = !k->pools;
    for (size_t i = 0; i < k->n_pools; i++)
        moves_it = moves_it || k->pools[i] == pool;
    if (!moves_it || pool >= kvf_engine_pool_count(c->engine)) {
        pthread_mutex_unlock(&c->mu);
        return kvf__fail(KVF_ERR_RANGE, "%s: ticket %llu: pool %u is not one the get moves", fn,
                         (unsigned long long)t.id, pool);
    }
    uint64_t deadline_ns = 0;
    if (within_s >= 0) {
        /* at least 1 ns past the submission: 0 means no limit */
        double at = (double)k->t0_ns + within_s * 1e9;
        deadline_ns = at >= 1.8e19 ? UINT64_MAX : at < 1 ? 1 : (uint64_t)at;
    }
    for (op *o = k->ops; o && st == KVF_OK; o = o->next) {
        if (o->kind != OPK_GET && o->kind != OPK_ACQUIRE)
            continue;
        if (!o->done && o->ticket.id && nt < sizeof tickets / sizeof tickets[0])
            tickets[nt++] = o->ticket;
        else
            st = op_failure(fn, t, o);
    }
    pthread_mutex_unlock(&c->mu);
    /* the engine's tickets stay valid until this call is waited for or
     * polled to completion: one retired meanwhile is asked about again */
    for (size_t i = 0; i < nt && st == KVF_OK; i++) {
        kvf_status s = kvf__stream_wait_pool_by(c->engine, tickets[i], pool, stream, deadline_ns);
        if (s == KVF_ERR_TIMEOUT)
            st = kvf__fail(s,
                           "%s: ticket %llu: pool %u not arrived %.6f s after the get (the get "
                           "runs on: wait for it or poll it to completion)",
                           fn, (unsigned long long)t.id, pool, within_s);
        else if (s == KVF_ERR_UNKNOWN_TICKET)
            st = retired_meanwhile(c, fn, t, tickets[i]);
        else if (s != KVF_OK)
            st =
                kvf__fail(s, "%s: ticket %llu: %s", fn, (unsigned long long)t.id, kvf_last_error());
    }
    if (st == KVF_OK)
        kvf__clear_error();
    return st;
}

kvf_status kvf_cache_wait_pool(kvf_cache *c, kvf_cache_ticket t, uint32_t pool)
{
    return wait_pool(c, "kvf_cache_wait_pool", t, pool, NULL, -1);
}

kvf_status kvf_cache_stream_wait_pool(kvf_cache *c, kvf_cache_ticket t, uint32_t pool, void *stream)
{
    return wait_pool(c, "kvf_cache_stream_wait_pool", t, pool, stream, -1);
}

kvf_status kvf_cache_wait_pool_by(kvf_cache *c, kvf_cache_ticket t, uint32_t pool, void *stream,
                                  double within_s)
{
    static const char fn[] = "kvf_cache_wait_pool_by";
    if (!isfinite(within_s) || within_s < 0) {
        kvf__clear_error();
        return kvf__fail(KVF_ERR_INVALID, "%s: ticket %llu: within_s %g (must be finite, >= 0)", fn,
                         (unsigned long long)t.id, within_s);
    }
    return wait_pool(c, fn, t, pool, stream, within_s);
}
