/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A get's pools, one at a time (kvf_cache_wait_pool,
 * kvf_cache_stream_wait_pool): the engine's per-pool waits over each tier's
 * batch of the call.
 */
#include "cache_private.h"

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

static kvf_status wait_pool(kvf_cache *c, const char *fn, kvf_cache_ticket t, uint32_t pool,
                            void *stream)
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
        kvf_status s = kvf_stream_wait_pool(c->engine, tickets[i], pool, stream);
        if (s == KVF_ERR_UNKNOWN_TICKET)
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
    return wait_pool(c, "kvf_cache_wait_pool", t, pool, NULL);
}

kvf_status kvf_cache_stream_wait_pool(kvf_cache *c, kvf_cache_ticket t, uint32_t pool, void *stream)
{
    return wait_pool(c, "kvf_cache_stream_wait_pool", t, pool, stream);
}
