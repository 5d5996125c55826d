/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batches: the moves a call assembles (pending, put_batches), queued with
 * the engine as ops; a put's rounds (kvf__cache_flush); and the background
 * ops nobody waits for, applied by later calls (kvf__cache_reap).
 */
#include "cache_private.h"

#include <stdlib.h>
#include <string.h>

/* Adds a move to a batch reserved with pending_reserve. */
void kvf__cache_pending_add(pending *p, kvf_move mv, kvf_key key, uint64_t gen, size_t index)
{
    p->moves[p->n] = mv;
    p->keys[p->n] = key;
    p->gens[p->n] = gen;
    p->index[p->n] = index;
    p->n++;
}

/* Room for `n` more moves, so that pending_add cannot fail after it. */
bool kvf__cache_pending_reserve(pending *p, size_t n)
{
    if (p->cap >= p->n + n)
        return true;
    size_t cap = p->n + n;
    kvf_move *m = realloc(p->moves, cap * sizeof *m);
    if (m)
        p->moves = m;
    kvf_key *k = realloc(p->keys, cap * sizeof *k);
    if (k)
        p->keys = k;
    uint64_t *g = realloc(p->gens, cap * sizeof *g);
    if (g)
        p->gens = g;
    size_t *x = realloc(p->index, cap * sizeof *x);
    if (x)
        p->index = x;
    if (!m || !k || !g || !x)
        return false;
    p->cap = cap;
    return true;
}

void kvf__cache_pending_free(pending *p)
{
    free(p->moves);
    free(p->keys);
    free(p->gens);
    free(p->index);
}

void kvf__cache_put_batches_free(put_batches *pb)
{
    kvf__cache_pending_free(&pb->remove);
    kvf__cache_pending_free(&pb->demote);
    kvf__cache_pending_free(&pb->to_file);
    kvf__cache_pending_free(&pb->to_host);
    kvf__cache_pending_free(&pb->to_remote);
    kvf__cache_pending_free(&pb->evict_file);
    kvf__cache_pending_free(&pb->evict_host);
}

/* Room for `n` more of each kind of move a call can make. */
bool kvf__cache_put_batches_reserve(put_batches *pb, size_t n)
{
    return kvf__cache_pending_reserve(&pb->remove, n) &&
           kvf__cache_pending_reserve(&pb->demote, n) &&
           kvf__cache_pending_reserve(&pb->to_file, n) &&
           kvf__cache_pending_reserve(&pb->to_host, n) &&
           kvf__cache_pending_reserve(&pb->to_remote, n) &&
           kvf__cache_pending_reserve(&pb->evict_file, n) &&
           kvf__cache_pending_reserve(&pb->evict_host, n);
}

void kvf__cache_op_free(op *o)
{
    if (!o)
        return;
    free(o->keys);
    free(o->gens);
    free(o->index);
    free(o->status);
    kvf__move_errors_free(o->errors);
    free(o);
}

/* Keeps why move i of an op failed, for its call's kvf_cache_wait_errors. */
static void op_note(op *o, size_t i, kvf_status st, const char *why)
{
    kvf__move_error *r = kvf__move_error_new(i, st, why);
    if (r) {
        r->next = o->errors;
        o->errors = r;
    }
}

/* Queues one assembled batch with the engine and empties it. NULL when out
 * of memory for the op (the batch is left as it was);
 * an op the engine refused comes back with ticket 0 and every move failed
 * with the engine's status. */
op *kvf__cache_op_submit(kvf_cache *c, op_kind kind, kvf_tier tier, pending *p)
{
    op *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->kind = kind;
    o->tier = tier;
    o->n = p->n;
    o->keys = malloc(p->n * sizeof *o->keys);
    o->gens = malloc(p->n * sizeof *o->gens);
    o->index = malloc(p->n * sizeof *o->index);
    o->status = malloc(p->n * sizeof *o->status);
    if (!o->keys || !o->gens || !o->index || !o->status) {
        kvf__cache_op_free(o);
        return NULL;
    }
    memcpy(o->keys, p->keys, p->n * sizeof *o->keys);
    memcpy(o->gens, p->gens, p->n * sizeof *o->gens);
    memcpy(o->index, p->index, p->n * sizeof *o->index);
    kvf_engine *eng = c->engine;
    kvf_status st;
    /* an op on the GPU tier moves between primary slots (kvf_copy) */
    kvf_tier to = tier == KVF_TIER_GPU ? KVF_TIER_HOST : tier;
    switch (kind) {
    case OPK_PUT:
    case OPK_REMOTE_PUT:
    case OPK_EVICT:
        /* GPU-tier slots are read checked: a copy into one that failed must
         * not pass its bytes on */
        st = p->checked || kind == OPK_EVICT
                 ? kvf__engine_move_checked(eng, to, false, NULL, 0, p->moves, p->n, &o->ticket)
                 : kvf_offload(eng, to, p->moves, p->n, &o->ticket);
        break;
    case OPK_GET:
    case OPK_ACQUIRE:
        st = tier == KVF_TIER_GPU
                 ? kvf__engine_move_checked(eng, KVF_TIER_HOST, true, p->pools, p->n_pools,
                                            p->moves, p->n, &o->ticket)
                 : kvf_onboard_pools(eng, to, p->pools, p->n_pools, p->moves, p->n, &o->ticket);
        break;
    case OPK_DEMOTE:
        st = kvf_demote(eng, KVF_TIER_DISK, p->moves, p->n, &o->ticket);
        break;
    case OPK_REMOVE:
        st = kvf_remove(eng, KVF_TIER_DISK, o->keys, p->n, &o->ticket);
        break;
    case OPK_FENCE: {
        uint32_t *fs = malloc(p->n * sizeof *fs);
        st = fs ? KVF_OK : kvf__fail(KVF_ERR_NOMEM, "cache: out of memory");
        for (size_t i = 0; fs && i < p->n; i++)
            fs[i] = (uint32_t)p->moves[i].src;
        if (fs)
            st = kvf__engine_fence(eng, fs, p->n, &o->ticket);
        free(fs);
        break;
    }
    default:
        st = kvf_remove(eng, KVF_TIER_REMOTE, o->keys, p->n, &o->ticket);
        break;
    }
    if (st != KVF_OK) {
        KVF_LOG(KVF_LOG_WARN, "cache: a batch of %zu blocks was refused: %s", p->n,
                kvf_last_error());
        o->ticket = (kvf_ticket){0};
        for (size_t i = 0; i < o->n; i++) {
            o->status[i] = st;
            op_note(o, i, st, kvf_last_error());
        }
        o->done = true;
    }
    p->n = 0;
    return o;
}

void kvf__cache_background_push(kvf_cache *c, op *o)
{
    if (o) {
        o->next = c->background;
        c->background = o;
    }
}

/* Queues a batch of the cache's: it joins the call `k`, or the background
 * without one. A batch refused, or not queued for want of memory, has its
 * failures applied at once: a refused put must not leave entries naming
 * slots it never wrote. */
void kvf__cache_submit_into(kvf_cache *c, op_kind kind, kvf_tier tier, pending *p, call *k)
{
    if (p->n == 0)
        return;
    op *o = kvf__cache_op_submit(c, kind, tier, p);
    if (!o) {
        kvf__fail(KVF_ERR_NOMEM, "cache: out of memory for a batch of %zu blocks", p->n);
        kvf_status st[64];
        op stack_op = {.kind = kind,
                       .tier = tier,
                       .keys = p->keys,
                       .gens = p->gens,
                       .index = p->index,
                       .status = st};
        bool was = c->deferring;
        c->deferring = true;
        for (size_t off = 0; off < p->n; off += 64) {
            stack_op.n = p->n - off < 64 ? p->n - off : 64;
            for (size_t i = 0; i < stack_op.n; i++)
                st[i] = KVF_ERR_NOMEM;
            kvf__cache_op_apply(c, &stack_op, k);
            stack_op.keys += 64;
            stack_op.gens += 64;
            stack_op.index += 64;
        }
        c->deferring = was;
        p->n = 0;
        return;
    }
    if (o->ticket.id == 0) {
        bool was = c->deferring;
        c->deferring = true; /* the caller may be holding an entry this frees */
        kvf__cache_op_apply(c, o, k);
        c->deferring = was;
        kvf__cache_op_free(o);
    } else if (k) {
        /* in submission order, so completion applies them in that order */
        op **pp = &k->ops;
        while (*pp)
            pp = &(*pp)->next;
        *pp = o;
    } else {
        kvf__cache_background_push(c, o);
    }
}

/* Queues what a put has assembled so far. Within one batch the order of
 * moves is not defined, so a put that must evict a block it placed itself
 * (a put of more blocks than a tier holds) first queues that block's write,
 * then starts a new round. Order: files removed before keys are written
 * again, victims read before their slots are rewritten. */
void kvf__cache_flush(kvf_cache *c, put_batches *pb)
{
    kvf__cache_submit_into(c, OPK_REMOVE, KVF_TIER_DISK, &pb->remove, NULL);
    kvf__cache_submit_into(c, OPK_DEMOTE, KVF_TIER_DISK, &pb->demote, NULL);
    kvf__cache_submit_into(c, OPK_EVICT, KVF_TIER_DISK, &pb->evict_file, pb->k);
    kvf__cache_submit_into(c, OPK_EVICT, KVF_TIER_HOST, &pb->evict_host, pb->k);
    kvf__cache_submit_into(c, OPK_PUT, KVF_TIER_DISK, &pb->to_file, pb->k);
    kvf__cache_submit_into(c, OPK_PUT, KVF_TIER_HOST, &pb->to_host, pb->k);
    kvf__cache_submit_into(c, OPK_REMOTE_PUT, KVF_TIER_REMOTE, &pb->to_remote, pb->k);
    c->round++;
}

/* Applies the background ops that have completed. Lock held. */
void kvf__cache_reap(kvf_cache *c)
{
    op *list = c->background;
    c->background = NULL;
    while (list) {
        op *o = list;
        list = o->next;
        kvf_status st = kvf_poll(c->engine, o->ticket, o->status);
        if (st == KVF_INPROGRESS) {
            o->next = c->background;
            c->background = o;
            continue;
        }
        if (st == KVF_ERR_UNKNOWN_TICKET) /* cannot happen: the cache holds it */
            for (size_t i = 0; i < o->n; i++)
                o->status[i] = st;
        kvf__cache_op_apply(c, o, NULL);
        kvf__cache_op_free(o);
    }
}
