/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvf_cache_wait and kvf_cache_poll (and their _errors forms): a call's
 * ops waited for or polled with the engine, then applied, and the call
 * retired with its per-block statuses and messages.
 */
#include "cache_private.h"

#include <string.h>

/* Applies a completed call's ops, retires it and gives its result, and
 * its failed blocks' messages in *errors_p (or frees them with NULL).
 * Lock held. */
static kvf_status call_finish(kvf_cache *c, call **pp, kvf_status *per_block,
                              kvf__move_error **errors_p)
{
    call *k = *pp;
    for (op *o = k->ops; o; o = o->next)
        kvf__cache_op_apply(c, o, k);
    kvf_status ret = KVF_OK;
    for (size_t i = 0; i < k->n; i++) {
        if (k->status[i] == KVF_INPROGRESS) /* cannot happen: every block was decided */
            k->status[i] = KVF_ERR_STATE;
        if (ret == KVF_OK && k->status[i] != KVF_OK)
            ret = k->status[i];
    }
    if (per_block)
        memcpy(per_block, k->status, k->n * sizeof *per_block);
    if (k->ops)
        kvf__cache_record_latency(c, kvf__now_ns() - k->t0_ns);
    kvf__move_error *errors = NULL;
    if (ret != KVF_OK) {
        errors = kvf__move_errors_sorted(k->errors, k->status, k->n, "cache: block");
        k->errors = NULL;
        if (errors)
            kvf__fail(ret, "cache ticket %llu: block %zu: %s", (unsigned long long)k->id,
                      errors->index, errors->message);
    }
    *pp = k->next;
    kvf__cache_call_free(k);
    if (errors_p)
        *errors_p = errors;
    else
        kvf__move_errors_free(errors);
    return ret;
}

/* kvf_cache_wait (block) or kvf_cache_poll; *done_p (may be NULL): the
 * call completed and was retired here. */
static kvf_status call_result(kvf_cache *c, kvf_cache_ticket t, bool block, kvf_status *per_block,
                              kvf__move_error **errors_p, bool *done_p)
{
    const char *fn = block ? "kvf_cache_wait" : "kvf_cache_poll";
    kvf__clear_error();
    if (!c)
        return kvf__fail(KVF_ERR_INVALID, "%s: cache is NULL", fn);
    pthread_mutex_lock(&c->mu);
    call *k = *kvf__cache_call_slot(c, t);
    if (!k || k->waited) {
        pthread_mutex_unlock(&c->mu);
        return kvf__fail(k ? KVF_ERR_STATE : KVF_ERR_UNKNOWN_TICKET, "%s: ticket %llu %s", fn,
                         (unsigned long long)t.id,
                         k ? "is waited for by another thread" : "unknown or already retired");
    }
    bool running = false;
    if (block) {
        k->waited = true;
        pthread_mutex_unlock(&c->mu);
    }
    /* waiting, only the thread that set `waited` touches the call's ops;
     * polling, the lock is held throughout */
    for (op *o = k->ops; o; o = o->next) {
        if (o->done)
            continue;
        kvf__move_error *why = NULL;
        if (kvf__engine_ticket_errors(c->engine, o->ticket, block, o->status, &why) ==
            KVF_INPROGRESS) {
            running = true;
            continue;
        }
        o->errors = why;
        o->done = true;
    }
    if (block)
        pthread_mutex_lock(&c->mu);
    kvf_status st =
        running ? KVF_INPROGRESS : call_finish(c, kvf__cache_call_slot(c, t), per_block, errors_p);
    pthread_mutex_unlock(&c->mu);
    if (done_p)
        *done_p = !running;
    return st;
}

kvf_status kvf_cache_wait(kvf_cache *c, kvf_cache_ticket t, kvf_status *per_block)
{
    return call_result(c, t, true, per_block, NULL, NULL);
}

kvf_status kvf_cache_poll(kvf_cache *c, kvf_cache_ticket t, kvf_status *per_block)
{
    return call_result(c, t, false, per_block, NULL, NULL);
}

static kvf_status call_errors(kvf_cache *c, kvf_cache_ticket t, bool block, kvf_status *per_block,
                              kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    if (!errors && cap) {
        kvf__clear_error();
        return kvf__fail(KVF_ERR_INVALID, "%s: errors is NULL with cap = %zu",
                         block ? "kvf_cache_wait_errors" : "kvf_cache_poll_errors", cap);
    }
    kvf__move_error *list = NULL;
    bool done = false;
    kvf_status st = call_result(c, t, block, per_block, &list, &done);
    if (done)
        kvf__move_errors_deliver(list, errors, cap, n_errors_p);
    return st;
}

kvf_status kvf_cache_wait_errors(kvf_cache *c, kvf_cache_ticket t, kvf_status *per_block,
                                 kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    return call_errors(c, t, true, per_block, errors, cap, n_errors_p);
}

kvf_status kvf_cache_poll_errors(kvf_cache *c, kvf_cache_ticket t, kvf_status *per_block,
                                 kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    return call_errors(c, t, false, per_block, errors, cap, n_errors_p);
}
