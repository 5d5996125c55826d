/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lookup, put and get, and the checks of the keys and slots callers give.
 */
#include "cache_private.h"

#include <stdlib.h>
#include <string.h>

kvf_status kvf__cache_check_keys(const char *fn, const kvf_key *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (kvf_key_is_root(keys[i]))
            return kvf__fail(KVF_ERR_INVALID, "%s: key %zu is 0 (KVF_KEY_ROOT names no block)", fn,
                             i);
    return KVF_OK;
}

typedef struct key_at {
    kvf_key key;
    size_t index;
} key_at;

static int cmp_key_at(const void *a, const void *b)
{
    const key_at *x = a, *y = b;
    int k = kvf_key_cmp(x->key, y->key);
    if (k)
        return k;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* A call names each block once: the order of two moves of one key inside
 * a batch is not defined. The error names the key and both indexes. */
kvf_status kvf__cache_check_unique(const char *fn, const kvf_key *keys, size_t n)
{
    key_at *v = malloc(n * sizeof *v);
    if (!v)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    for (size_t i = 0; i < n; i++)
        v[i] = (key_at){keys[i], i};
    qsort(v, n, sizeof *v, cmp_key_at);
    kvf_status st = KVF_OK;
    for (size_t i = 1; i < n && st == KVF_OK; i++)
        if (kvf_key_eq(v[i].key, v[i - 1].key))
            st = kvf__fail(KVF_ERR_INVALID,
                           "%s: block " KVF_KEY_FMT " given twice, as keys %zu and %zu", fn,
                           KVF_KEY_ARGS(v[i].key), v[i - 1].index, v[i].index);
    free(v);
    return st;
}

kvf_status kvf__cache_check_slots(const kvf_cache *c, const char *fn, const uint32_t *slots,
                                  size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (slots[i] >= c->primary_slots)
            return kvf__fail(KVF_ERR_RANGE,
                             "%s: block %zu: primary slot %u out of range (%u slots)", fn, i,
                             slots[i], c->primary_slots);
    return KVF_OK;
}

kvf_status kvf_cache_lookup(kvf_cache *c, const kvf_key *keys, size_t n, size_t *hits_p,
                            kvf_tier *tiers)
{
    kvf__clear_error();
    if (!c || !hits_p || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_lookup: NULL argument");
    pthread_mutex_lock(&c->mu);
    c->stats.lookups++;
    c->stats.lookup_blocks += n;
    size_t i = 0;
    for (; i < n; i++) {
        const entry *e = kvf__cache_find(c, keys[i]);
        if (!e || e->removing)
            break;
        if (tiers)
            tiers[i] = (kvf_tier)e->tier;
        c->stats.hits[e->tier]++;
    }
    pthread_mutex_unlock(&c->mu);
    if (i < n && c->cfg.remote != KVF_CACHE_REMOTE_OFF)
        i += kvf__cache_remote_prefix(c, keys + i, n - i, tiers ? tiers + i : NULL);
    if (i < n) {
        pthread_mutex_lock(&c->mu);
        c->stats.misses++;
        pthread_mutex_unlock(&c->mu);
    }
    *hits_p = i;
    return KVF_OK;
}

static void set_priority(kvf_cache *c, entry *e, uint32_t priority)
{
    if (e->pins == 0)
        kvf__cache_lru_unlink(c, e);
    e->priority = (uint8_t)priority;
    if (e->pins == 0)
        kvf__cache_lru_append(c, e);
}

/* A put of a block held on disk: the engine hands its bytes back, so it
 * returns to the host tier (hot blocks do not stay on disk), copied from
 * the primary slot; its file goes. Stays on disk when every host block is
 * pinned. */
static void promote(kvf_cache *c, put_batches *pb, entry *e, uint32_t src_slot, size_t index)
{
    /* pinned while room is made: a demotion it causes must not take it */
    kvf__cache_pin_one(c, e);
    uint32_t hs;
    bool room = kvf__cache_host_slot(c, pb, &hs);
    e->pins--;
    if (!room) {
        kvf__cache_lru_append(c, e);
        return;
    }
    if (e->round == c->round)
        kvf__cache_flush(c, pb); /* its file's write is queued before the file's removal */
    kvf__cache_pending_add(&pb->remove, (kvf_move){.key = e->key}, e->key, 0, 0);
    c->used[KVF_TIER_DISK]--;
    e->tier = KVF_TIER_HOST;
    e->slot = hs;
    e->gen = ++c->next_gen;
    e->round = c->round;
    kvf__cache_lru_append(c, e);
    kvf__cache_pending_add(&pb->to_host, (kvf_move){.src = src_slot, .dst = hs}, e->key, e->gen,
                           index);
    c->stats.bytes_in[KVF_TIER_HOST] += c->block_bytes;
    kvf__cache_emit(c, KVF_EVENT_UPDATED, e, KVF_TIER_DISK);
}

/* A put of a block cached already: its priority updated, promoted from
 * disk. The block's status, KVF_OK or an error. */
static kvf_status put_cached(kvf_cache *c, put_batches *pb, entry *e, uint32_t src_slot, size_t i,
                             uint32_t priority)
{
    c->stats.put_duplicates++;
    if (e->removing)
        return KVF_ERR_STATE; /* still read by a get, and going: not stored again now */
    set_priority(c, e, priority);
    if (e->tier == KVF_TIER_DISK && c->capacity[KVF_TIER_HOST] && e->pins == 0)
        promote(c, pb, e, src_slot, i);
    return KVF_OK;
}

/* A put of a block not cached: placed in the host tier, else on disk, its
 * write queued. The block's status: KVF_INPROGRESS (the write decides) or
 * an error; *e_p the new entry, or NULL. */
static kvf_status put_new(kvf_cache *c, put_batches *pb, kvf_key key, uint32_t src_slot, size_t i,
                          uint32_t priority, entry **e_p)
{
    uint32_t slot = 0;
    kvf_tier tier = KVF_TIER_COUNT;
    entry *e = NULL;
    *e_p = NULL;
    if (c->capacity[KVF_TIER_HOST] && kvf__cache_host_slot(c, pb, &slot))
        tier = KVF_TIER_HOST;
    else if (c->capacity[KVF_TIER_DISK] && kvf__cache_disk_room(c, pb))
        tier = KVF_TIER_DISK;
    if (tier == KVF_TIER_COUNT) {
        KVF_LOG(KVF_LOG_INFO, "cache: block " KVF_KEY_FMT " not stored: every block is pinned",
                KVF_KEY_ARGS(key));
        return KVF_ERR_NO_SPACE; /* every block of every tier is pinned */
    }
    if (!(e = kvf__cache_place(c, key, tier, slot, priority))) {
        if (tier == KVF_TIER_HOST) {
            c->free_slots[c->nfree++] = slot;
            c->used[KVF_TIER_HOST]--;
        }
        return KVF_ERR_NOMEM;
    }
    if (tier == KVF_TIER_HOST)
        kvf__cache_pending_add(&pb->to_host, (kvf_move){.src = src_slot, .dst = slot}, e->key,
                               e->gen, i);
    else
        kvf__cache_pending_add(&pb->to_file, (kvf_move){.src = src_slot, .key = e->key}, e->key,
                               e->gen, i);
    if (tier == KVF_TIER_DISK)
        c->used[KVF_TIER_DISK]++;
    c->stats.bytes_in[tier] += c->block_bytes;
    kvf__cache_emit(c, KVF_EVENT_STORED, e, tier);
    *e_p = e;
    return KVF_INPROGRESS;
}

/* A block's status decided at once: into the put's call, or the log
 * without one. */
static void put_status(call *k, size_t i, kvf_key key, kvf_status bst)
{
    if (k) {
        k->status[i] = bst;
        if (bst != KVF_INPROGRESS && bst != KVF_OK)
            kvf__cache_call_note(k, i, bst, "block " KVF_KEY_FMT ": not stored: %s",
                                 KVF_KEY_ARGS(key),
                                 bst == KVF_ERR_STATE ? "being removed while a get still pins it"
                                 : bst == KVF_ERR_NO_SPACE ? "every block of every tier is pinned"
                                                           : kvf_status_str(bst));
    } else if (bst != KVF_INPROGRESS && bst != KVF_OK)
        KVF_LOG(KVF_LOG_WARN, "cache: put of block " KVF_KEY_FMT ": %s", KVF_KEY_ARGS(key),
                kvf_status_str(bst));
}

kvf_status kvf_cache_put(kvf_cache *c, const kvf_key *keys, const uint32_t *slots, size_t n,
                         uint32_t priority, kvf_cache_ticket *ticket_p)
{
    static const char fn[] = "kvf_cache_put";
    kvf__clear_error();
    if (!c || !keys || !slots || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or empty batch", fn);
    if (priority > MAX_PRIORITY)
        return kvf__fail(KVF_ERR_RANGE, "%s: priority %u (0-100)", fn, priority);
    kvf_status st = kvf__cache_check_keys(fn, keys, n);
    if (st == KVF_OK)
        st = kvf__cache_check_unique(fn, keys, n);
    if (st == KVF_OK)
        st = kvf__cache_check_slots(c, fn, slots, n);
    if (st != KVF_OK)
        return st;

    put_batches pb = {0};
    /* a block may cost two files: a disk victim dropped, and its own on a promotion */
    if (!kvf__cache_pending_reserve(&pb.remove, 2 * n) ||
        !kvf__cache_pending_reserve(&pb.demote, n) || !kvf__cache_pending_reserve(&pb.to_file, n) ||
        !kvf__cache_pending_reserve(&pb.to_host, n) ||
        !kvf__cache_pending_reserve(&pb.to_remote, n)) {
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    call *k = NULL;
    if (ticket_p && !(k = kvf__cache_call_new(c, n))) {
        kvf__cache_release_doomed(c);
        pthread_mutex_unlock(&c->mu);
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    kvf__cache_reap(c);
    pb.k = k;
    c->round++;
    for (size_t i = 0; i < n; i++) {
        c->stats.puts++;
        entry *e = kvf__cache_find(c, keys[i]);
        bool fresh = !e;
        kvf_status bst = e ? put_cached(c, &pb, e, slots[i], i, priority)
                           : put_new(c, &pb, keys[i], slots[i], i, priority, &e);
        /* a block stored here goes to the store too (a call names each
         * key once: kvf__cache_check_unique) */
        if (fresh && e && c->cfg.remote == KVF_CACHE_REMOTE_WRITE_THROUGH)
            kvf__cache_pending_add(&pb.to_remote, (kvf_move){.src = slots[i], .key = keys[i]},
                                   keys[i], 0, i);
        put_status(k, i, keys[i], bst);
    }
    kvf__cache_flush(c, &pb);
    if (k) {
        k->next = c->calls;
        c->calls = k;
        *ticket_p = (kvf_cache_ticket){k->id};
    }
    kvf__cache_release_doomed(c);
    pthread_mutex_unlock(&c->mu);
out:
    kvf__cache_pending_free(&pb.remove);
    kvf__cache_pending_free(&pb.demote);
    kvf__cache_pending_free(&pb.to_file);
    kvf__cache_pending_free(&pb.to_host);
    kvf__cache_pending_free(&pb.to_remote);
    return st;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* A get's destinations are distinct primary slots: refused here rather
 * than by the engine, which could refuse one tier's batch after queueing
 * the other's. */
static kvf_status check_destinations(const char *fn, const uint32_t *slots, size_t n)
{
    uint32_t *sorted = malloc(n * sizeof *sorted);
    if (!sorted)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    memcpy(sorted, slots, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_u32);
    kvf_status st = KVF_OK;
    for (size_t i = 1; i < n && st == KVF_OK; i++)
        if (sorted[i] == sorted[i - 1])
            st = kvf__fail(KVF_ERR_INVALID, "%s: primary slot %u is the destination of two blocks",
                           fn, sorted[i]);
    free(sorted);
    return st;
}

/* A get's blocks can be read into its slots: no slot is the GPU tier's
 * unless handed out, and without a remote tier every block is cached. */
static kvf_status check_gettable(const kvf_cache *c, const char *fn, const kvf_key *keys,
                                 const uint32_t *slots, size_t n)
{
    /* a GPU-tier slot is a destination only while handed out to the caller */
    for (size_t i = 0; i < n && c->gpu_state; i++)
        if (slots[i] < c->capacity[KVF_TIER_GPU] && c->gpu_state[slots[i]] != GPU_HANDED_OUT)
            return kvf__fail(
                KVF_ERR_INVALID, "%s: block %zu: primary slot %u is the GPU tier's (%s)", fn, i,
                slots[i],
                c->gpu_state[slots[i]] == GPU_CACHED ? "a cached block" : "not handed out");
    bool remote = c->cfg.remote != KVF_CACHE_REMOTE_OFF;
    for (size_t i = 0; i < n && !remote; i++) {
        const entry *e = kvf__cache_find(c, keys[i]);
        if (!e || e->removing)
            return kvf__fail(KVF_ERR_NOT_FOUND,
                             "%s: block " KVF_KEY_FMT " (block %zu) is not cached", fn,
                             KVF_KEY_ARGS(keys[i]), i);
    }
    return KVF_OK;
}

/* kvf_cache_get of pools[0..n_pools) (NULL: every pool). */
static kvf_status get_pools(kvf_cache *c, const char *fn, const kvf_key *keys,
                            const uint32_t *slots, size_t n, const uint32_t *pools, size_t n_pools,
                            kvf_cache_ticket *ticket_p)
{
    kvf__clear_error();
    if (!c || !keys || !slots || n == 0 || !ticket_p)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or empty batch", fn);
    kvf_status st = kvf__cache_check_keys(fn, keys, n);
    if (st == KVF_OK)
        st = kvf__cache_check_slots(c, fn, slots, n);
    if (st == KVF_OK)
        st = check_destinations(fn, slots, n);
    if (st != KVF_OK)
        return st;

    pending by_tier[KVF_TIER_COUNT] = {{0}};
    bool reserved = true;
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        reserved = reserved && kvf__cache_pending_reserve(&by_tier[t], n);
    if (!reserved) {
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    kvf__cache_reap(c);
    st = check_gettable(c, fn, keys, slots, n);
    if (st != KVF_OK) {
        kvf__cache_release_doomed(c);
        pthread_mutex_unlock(&c->mu);
        goto out;
    }
    call *k = kvf__cache_call_new(c, n);
    if (k && pools && (k->pools = malloc(n_pools * sizeof *k->pools)) != NULL) {
        memcpy(k->pools, pools, n_pools * sizeof *pools);
        k->n_pools = n_pools;
    }
    if (!k || (pools && !k->pools)) {
        if (k)
            kvf__cache_call_free(k);
        kvf__cache_release_doomed(c);
        pthread_mutex_unlock(&c->mu);
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    for (int t = 0; t < KVF_TIER_COUNT; t++) {
        by_tier[t].pools = pools;
        by_tier[t].n_pools = n_pools;
    }
    for (size_t i = 0; i < n; i++) {
        entry *e = kvf__cache_find(c, keys[i]);
        c->stats.gets++;
        if (!e || e->removing) {
            /* not cached here: the remote tier's, if it has it */
            kvf__cache_pending_add(&by_tier[KVF_TIER_REMOTE],
                                   (kvf_move){.dst = slots[i], .key = keys[i]}, keys[i], 0, i);
            continue;
        }
        kvf__cache_pin_one(c, e);
        e->reads++;
        e->uses++;
        kvf_move mv = e->tier == KVF_TIER_DISK ? (kvf_move){.dst = slots[i], .key = e->key}
                                               : (kvf_move){.src = e->slot, .dst = slots[i]};
        kvf__cache_pending_add(&by_tier[e->tier], mv, e->key, e->gen, i);
    }
    kvf__cache_submit_into(c, OPK_GET, KVF_TIER_HOST, &by_tier[KVF_TIER_HOST], k);
    kvf__cache_submit_into(c, OPK_GET, KVF_TIER_DISK, &by_tier[KVF_TIER_DISK], k);
    kvf__cache_submit_into(c, OPK_GET, KVF_TIER_REMOTE, &by_tier[KVF_TIER_REMOTE], k);
    kvf__cache_submit_into(c, OPK_GET, KVF_TIER_GPU, &by_tier[KVF_TIER_GPU], k);
    k->next = c->calls;
    c->calls = k;
    *ticket_p = (kvf_cache_ticket){k->id};
    kvf__cache_release_doomed(c);
    pthread_mutex_unlock(&c->mu);
out:
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        kvf__cache_pending_free(&by_tier[t]);
    return st;
}

kvf_status kvf_cache_get(kvf_cache *c, const kvf_key *keys, const uint32_t *slots, size_t n,
                         kvf_cache_ticket *ticket_p)
{
    return get_pools(c, "kvf_cache_get", keys, slots, n, NULL, 0, ticket_p);
}

kvf_status kvf_cache_get_pools(kvf_cache *c, const kvf_key *keys, const uint32_t *slots, size_t n,
                               const uint32_t *pools, size_t n_pools, kvf_cache_ticket *ticket_p)
{
    static const char fn[] = "kvf_cache_get_pools";
    kvf__clear_error();
    if (!c)
        return kvf__fail(KVF_ERR_INVALID, "%s: cache is NULL", fn);
    if (!pools || n_pools == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: no pools listed (kvf_cache_get moves them all)", fn);
    /* checked here, not by each tier's batch: a refused list queues nothing */
    kvf_status st = kvf__engine_pools_check(c->engine, fn, pools, n_pools);
    return st != KVF_OK ? st : get_pools(c, fn, keys, slots, n, pools, n_pools, ticket_p);
}
