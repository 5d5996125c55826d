/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The GPU tier's calls: primary slots 0 .. gpu.blocks-1, each free,
 * handed out to the caller (kvf_cache_alloc) until kvf_cache_commit or
 * kvf_cache_free, or holding a cached block (kvf__cache_gpu_slot, in
 * cache_evict.c, copies a victim down to make room).
 */
#include "cache_private.h"

kvf_status kvf__cache_need_gpu_tier(const kvf_cache *c, const char *fn)
{
    if (!c->capacity[KVF_TIER_GPU])
        return kvf__fail(KVF_ERR_INVALID, "%s: the cache has no GPU tier (set gpu.blocks)", fn);
    return KVF_OK;
}

/* Queues the call's batches and hands its ticket over. Lock held. */
static void call_start(kvf_cache *c, call *k, put_batches *pb, kvf_cache_ticket *ticket_p)
{
    kvf__cache_flush(c, pb);
    k->next = c->calls;
    c->calls = k;
    *ticket_p = (kvf_cache_ticket){k->id};
}

kvf_status kvf_cache_alloc(kvf_cache *c, uint32_t *slots, size_t n, kvf_cache_ticket *ticket_p)
{
    static const char fn[] = "kvf_cache_alloc";
    kvf__clear_error();
    if (!c || !slots || !ticket_p || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or n == 0", fn);
    kvf_status st = kvf__cache_need_gpu_tier(c, fn);
    if (st != KVF_OK)
        return st;
    put_batches pb = {0};
    if (!kvf__cache_put_batches_reserve(&pb, n)) {
        kvf__cache_put_batches_free(&pb);
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    }
    pthread_mutex_lock(&c->mu);
    kvf__cache_reap(c);
    call *k = NULL;
    if (c->ngpu_free + c->listed[KVF_TIER_GPU] < n) {
        st = kvf__fail(KVF_ERR_NO_SPACE,
                       "%s: %zu GPU slots asked, %llu free or evictable (the others are pinned "
                       "or handed out)",
                       fn, n, (unsigned long long)(c->ngpu_free + c->listed[KVF_TIER_GPU]));
    } else if (!(k = kvf__cache_call_new(c, 0))) {
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    } else {
        c->round++;
        pb.k = k;
        for (size_t i = 0; i < n; i++) {
            kvf__cache_gpu_slot(c, &pb, &slots[i]); /* cannot fail: counted above */
            c->gpu_state[slots[i]] = GPU_HANDED_OUT;
        }
        /* every copy still reading or writing one (an evicted block's, a
         * write-through of it) must end before the caller writes it: the
         * fence waits for them. (A failed copy into one is forgotten at
         * commit, once the caller has written it whole.) */
        pending fence = {0};
        if (kvf__cache_pending_reserve(&fence, n)) {
            for (size_t i = 0; i < n; i++)
                kvf__cache_pending_add(&fence, (kvf_move){.src = slots[i], .dst = slots[i]},
                                       KVF_KEY_ROOT, 0, 0);
            kvf__cache_flush(c, &pb); /* the evictions first: the fence waits for their reads */
            kvf__cache_submit_into(c, OPK_FENCE, KVF_TIER_GPU, &fence, k);
        } else {
            st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        }
        kvf__cache_pending_free(&fence);
        call_start(c, k, &pb, ticket_p);
    }
    kvf__cache_release_doomed(c);
    pthread_mutex_unlock(&c->mu);
    kvf__cache_put_batches_free(&pb);
    return st;
}

/* Slots handed out, each once: what commit and free accept. */
static kvf_status check_handed_out(const kvf_cache *c, const char *fn, const uint32_t *slots,
                                   size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (slots[i] >= c->capacity[KVF_TIER_GPU] || c->gpu_state[slots[i]] != GPU_HANDED_OUT)
            return kvf__fail(KVF_ERR_INVALID,
                             "%s: slot %u (block %zu) was not handed out by "
                             "kvf_cache_alloc",
                             fn, slots[i], i);
        for (size_t j = 0; j < i; j++)
            if (slots[j] == slots[i])
                return kvf__fail(KVF_ERR_INVALID, "%s: slot %u given twice", fn, slots[i]);
    }
    return KVF_OK;
}

kvf_status kvf_cache_commit(kvf_cache *c, const kvf_key *keys, const uint32_t *slots, size_t n,
                            uint32_t priority, kvf_status *per_block)
{
    static const char fn[] = "kvf_cache_commit";
    kvf__clear_error();
    if (!c || !keys || !slots || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or empty batch", fn);
    kvf_status st = kvf__cache_need_gpu_tier(c, fn);
    if (st == KVF_OK && priority > MAX_PRIORITY)
        st = kvf__fail(KVF_ERR_RANGE, "%s: priority %u (0-100)", fn, priority);
    if (st == KVF_OK)
        st = kvf__cache_check_keys(fn, keys, n);
    if (st != KVF_OK)
        return st;
    put_batches pb = {0};
    if (!kvf__cache_put_batches_reserve(&pb, n)) {
        kvf__cache_put_batches_free(&pb);
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    }
    pthread_mutex_lock(&c->mu);
    kvf__cache_reap(c);
    st = check_handed_out(c, fn, slots, n);
    for (size_t i = 0; i < n && st == KVF_OK; i++)
        for (size_t j = 0; j < i && st == KVF_OK; j++)
            if (kvf_key_eq(keys[j], keys[i]))
                st = kvf__fail(KVF_ERR_INVALID, "%s: block " KVF_KEY_FMT " given twice", fn,
                               KVF_KEY_ARGS(keys[i]));
    kvf_status first = KVF_OK;
    if (st == KVF_OK) {
        /* the caller wrote these whole: failed copies into them are history
         * (the alloc's ticket, waited for, ended every read of them) */
        kvf__engine_clear_poison(c->engine, slots, n);
        c->round++;
        pb.to_remote.checked = true; /* from GPU-tier slots */
        for (size_t i = 0; i < n; i++) {
            kvf_status bst = KVF_OK;
            entry *old = kvf__cache_find(c, keys[i]);
            if (old && old->pins) {
                /* another request holds its copy: this one stays private */
                bst = kvf__fail(KVF_ERR_STATE,
                                "%s: block " KVF_KEY_FMT " is in use in the %s tier: slot %u stays "
                                "the caller's",
                                fn, KVF_KEY_ARGS(keys[i]), kvf_tier_name((kvf_tier)old->tier),
                                slots[i]);
            } else {
                if (old)
                    kvf__cache_discard(c, old); /* a block lives in one tier, in one slot */
                entry *e = kvf__cache_place(c, keys[i], KVF_TIER_GPU, slots[i], priority);
                if (!e) {
                    bst = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
                } else {
                    kvf__cache_lru_unlink(c, e);
                    e->pins = 1; /* the request that computed it */
                    c->used[KVF_TIER_GPU]++;
                    c->gpu_state[slots[i]] = GPU_CACHED;
                    c->stats.bytes_in[KVF_TIER_GPU] += c->block_bytes;
                    kvf__cache_emit(c, KVF_EVENT_STORED, e, KVF_TIER_GPU);
                    if (c->cfg.remote == KVF_CACHE_REMOTE_WRITE_THROUGH)
                        kvf__cache_pending_add(&pb.to_remote,
                                               (kvf_move){.src = slots[i], .key = keys[i]}, keys[i],
                                               0, i);
                }
            }
            if (per_block)
                per_block[i] = bst;
            if (first == KVF_OK)
                first = bst;
        }
        kvf__cache_flush(c, &pb); /* the write-through, in the background */
        st = first;
    }
    kvf__cache_release_doomed(c);
    pthread_mutex_unlock(&c->mu);
    kvf__cache_put_batches_free(&pb);
    return st;
}

kvf_status kvf_cache_free(kvf_cache *c, const uint32_t *slots, size_t n)
{
    static const char fn[] = "kvf_cache_free";
    kvf__clear_error();
    if (!c || (n && !slots))
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument", fn);
    kvf_status st = kvf__cache_need_gpu_tier(c, fn);
    if (st != KVF_OK)
        return st;
    pthread_mutex_lock(&c->mu);
    st = check_handed_out(c, fn, slots, n);
    for (size_t i = 0; i < n && st == KVF_OK; i++) {
        c->gpu_state[slots[i]] = GPU_FREE;
        c->gpu_free[c->ngpu_free++] = slots[i];
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}
