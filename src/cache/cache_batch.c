/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batches: the moves a call assembles (pending, put_batches), and the ops
 * they become when submitted to the engine.
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
