/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Where an assembled batch goes once queued: into its call, or into the
 * background when nobody waits for it (a refused one applied at once); a
 * put's rounds (kvf__cache_flush); background ops applied by later calls
 * (kvf__cache_reap).
 */
#include "cache_private.h"

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
