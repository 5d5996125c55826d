/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Acquire: the longest prefix of cached blocks brought into GPU-tier slots
 * (read from the host tier or from files, or fenced where they already
 * are), each pinned for the caller.
 */
#include "cache_private.h"

#include <stdlib.h>

/* The batches one acquire assembles. */
typedef struct acquire_batches {
    put_batches pb;  /* GPU victims moving down */
    pending up[2];   /* reads from the host tier, from files */
    pending fence;   /* blocks already in the GPU tier */
    uint32_t *freed; /* host slots read from, free once their reads are queued */
    size_t nfreed;
} acquire_batches;

static bool acquire_reserve(acquire_batches *ab, size_t n)
{
    ab->freed = malloc(n * sizeof *ab->freed);
    return ab->freed && kvf__cache_put_batches_reserve(&ab->pb, n) &&
           kvf__cache_pending_reserve(&ab->up[0], n) && kvf__cache_pending_reserve(&ab->up[1], n) &&
           kvf__cache_pending_reserve(&ab->fence, n);
}

static void acquire_free(acquire_batches *ab)
{
    free(ab->freed);
    kvf__cache_put_batches_free(&ab->pb);
    kvf__cache_pending_free(&ab->up[0]);
    kvf__cache_pending_free(&ab->up[1]);
    kvf__cache_pending_free(&ab->fence);
}

/* Brings hit h, entry e, into a GPU-tier slot, *slot_p. false: every GPU
 * block is pinned or handed out (e is left as it was). */
static bool acquire_one(kvf_cache *c, acquire_batches *ab, entry *e, size_t h, uint32_t *slot_p)
{
    /* pinned first: the evictions below must not take it */
    kvf__cache_pin_one(c, e);
    c->stats.gets++;
    e->uses++;
    if (e->tier == KVF_TIER_GPU) {
        /* in place; but the copy that put it there (another request's
         * acquire, or an eviction's refill) may still be running: the
         * ticket waits for it, and fails the block if it failed */
        *slot_p = e->slot;
        kvf__cache_pending_add(&ab->fence, (kvf_move){.src = e->slot, .dst = e->slot}, e->key,
                               e->gen, h);
        return true;
    }
    uint32_t s;
    if (!kvf__cache_gpu_slot(c, &ab->pb, &s)) {
        if (--e->pins == 0)
            kvf__cache_lru_append(c, e);
        return false;
    }
    kvf_tier from = (kvf_tier)e->tier;
    uint32_t old_slot = e->slot;
    c->used[from]--;
    e->tier = KVF_TIER_GPU;
    e->slot = s;
    e->gen = ++c->next_gen;
    e->round = c->round;
    c->used[KVF_TIER_GPU]++;
    c->gpu_state[s] = GPU_CACHED;
    if (from == KVF_TIER_HOST) {
        kvf__cache_pending_add(&ab->up[0], (kvf_move){.src = old_slot, .dst = s}, e->key, e->gen,
                               h);
        ab->freed[ab->nfreed++] = old_slot; /* reused only once the read is queued */
    } else {
        kvf__cache_pending_add(&ab->up[1], (kvf_move){.dst = s, .key = e->key}, e->key, e->gen, h);
    }
    kvf__cache_emit(c, KVF_EVENT_UPDATED, e, from);
    *slot_p = s;
    return true;
}

kvf_status kvf_cache_acquire(kvf_cache *c, const kvf_key *keys, size_t n, uint32_t *slots,
                             size_t *hits_p, kvf_cache_ticket *ticket_p)
{
    static const char fn[] = "kvf_cache_acquire";
    kvf__clear_error();
    if (!c || !keys || !slots || !hits_p || !ticket_p || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or empty batch", fn);
    kvf_status st = kvf__cache_need_gpu_tier(c, fn);
    if (st == KVF_OK)
        st = kvf__cache_check_keys(fn, keys, n);
    if (st == KVF_OK)
        st = kvf__cache_check_unique(fn, keys, n);
    if (st != KVF_OK)
        return st;
    acquire_batches ab = {0};
    if (!acquire_reserve(&ab, n)) {
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    kvf__cache_reap(c);
    call *k = kvf__cache_call_new(c, n);
    if (!k) {
        kvf__cache_release_doomed(c);
        pthread_mutex_unlock(&c->mu);
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    c->round++;
    ab.pb.k = k;
    size_t h = 0;
    for (; h < n; h++) {
        entry *e = kvf__cache_find(c, keys[h]);
        if (!e || e->removing || !acquire_one(c, &ab, e, h, &slots[h]))
            break;
    }
    k->n = h;
    /* victims out of their GPU slots first, then the reads into them; the
     * vacated host slots are reused only after those reads, and the files
     * read are removed once read (kvf__cache_op_apply) */
    kvf__cache_flush(c, &ab.pb);
    kvf__cache_submit_into(c, OPK_ACQUIRE, KVF_TIER_HOST, &ab.up[0], k);
    kvf__cache_submit_into(c, OPK_ACQUIRE, KVF_TIER_DISK, &ab.up[1], k);
    kvf__cache_submit_into(c, OPK_FENCE, KVF_TIER_GPU, &ab.fence, k);
    for (size_t i = 0; i < ab.nfreed; i++)
        c->free_slots[c->nfree++] = ab.freed[i];
    k->next = c->calls;
    c->calls = k;
    *ticket_p = (kvf_cache_ticket){k->id};
    *hits_p = h;
    kvf__cache_release_doomed(c);
    pthread_mutex_unlock(&c->mu);
out:
    acquire_free(&ab);
    return st;
}
