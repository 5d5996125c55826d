/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pins (a pinned block is on no LRU list, so it is never evicted) and
 * removal, which waits for a pinned block's last unpin.
 */
#include "cache_private.h"

#include <stdlib.h>
#include <string.h>

kvf_status kvf_cache_pin(kvf_cache *c, const kvf_key *keys, size_t n, size_t *pinned_p)
{
    kvf__clear_error();
    if (!c || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_pin: NULL argument");
    size_t pinned = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        entry *e = kvf__cache_find(c, keys[i]);
        if (!e || e->removing)
            continue;
        kvf__cache_pin_one(c, e);
        pinned++;
    }
    pthread_mutex_unlock(&c->mu);
    if (pinned_p)
        *pinned_p = pinned;
    return KVF_OK;
}

kvf_status kvf_cache_unpin(kvf_cache *c, const kvf_key *keys, size_t n)
{
    kvf__clear_error();
    if (!c || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_unpin: NULL argument");
    kvf_status st = KVF_OK;
    pthread_mutex_lock(&c->mu);
    /* all or nothing: count what each key needs before changing any */
    for (size_t i = 0; i < n && st == KVF_OK; i++) {
        entry *e = kvf__cache_find(c, keys[i]);
        uint32_t need = 0;
        for (size_t j = 0; j <= i; j++)
            need += kvf_key_eq(keys[j], keys[i]);
        if (!e || e->pins - e->reads < need)
            st = kvf__fail(KVF_ERR_STATE, "kvf_cache_unpin: block " KVF_KEY_FMT " (key %zu) is %s",
                           KVF_KEY_ARGS(keys[i]), i, e ? "not pinned" : "not cached");
    }
    for (size_t i = 0; i < n && st == KVF_OK; i++)
        kvf__cache_release_pin(c, kvf__cache_find(c, keys[i]));
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* Orders keys. */
static int cmp_key(const void *a, const void *b)
{
    return kvf_key_cmp(*(const kvf_key *)a, *(const kvf_key *)b);
}

kvf_status kvf_cache_remove(kvf_cache *c, const kvf_key *keys, size_t n, size_t *removed_p)
{
    kvf__clear_error();
    if (!c || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_remove: NULL argument");
    size_t removed = 0;
    /* write-through blocks are removed from the store as well, each key once */
    pending remote = {0};
    bool through = c->cfg.remote == KVF_CACHE_REMOTE_WRITE_THROUGH && n;
    kvf_key *uniq = through ? malloc(n * sizeof *uniq) : NULL;
    if (through && (!uniq || !kvf__cache_pending_reserve(&remote, n))) {
        free(uniq);
        kvf__cache_pending_free(&remote);
        return kvf__fail(KVF_ERR_NOMEM, "kvf_cache_remove: out of memory");
    }
    pthread_mutex_lock(&c->mu);
    kvf__cache_reap(c);
    for (size_t i = 0; i < n; i++) {
        entry *e = kvf__cache_find(c, keys[i]);
        if (!e || e->removing)
            continue;
        removed++;
        e->removing = true;
        if (e->pins == 0)
            kvf__cache_discard(c, e);
    }
    if (through) {
        memcpy(uniq, keys, n * sizeof *uniq);
        qsort(uniq, n, sizeof *uniq, cmp_key);
        for (size_t i = 0; i < n; i++)
            if (i == 0 || !kvf_key_eq(uniq[i], uniq[i - 1]))
                kvf__cache_pending_add(&remote, (kvf_move){.key = uniq[i]}, uniq[i], 0, 0);
        kvf__cache_submit_into(c, OPK_REMOTE_REMOVE, KVF_TIER_REMOTE, &remote, NULL);
    }
    kvf__cache_release_doomed(c);
    pthread_mutex_unlock(&c->mu);
    free(uniq);
    kvf__cache_pending_free(&remote);
    if (removed_p)
        *removed_p = removed;
    return KVF_OK;
}
