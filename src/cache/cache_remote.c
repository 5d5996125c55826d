/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's lookups, asked of the engine's remote store (Redis,
 * mem://, whichever it is). With cache_restore.c, the only file that asks
 * a store; the remote tier's reads, writes and removals are engine
 * batches (cache_batch.c).
 */
#include "cache_private.h"
#include "store.h"

#include <stdlib.h>

bool kvf__cache_remote_usable(const kvf_engine *engine)
{
    return kvf__engine_has_remote(engine);
}

/* Asks the remote tier which of keys[0..n) it holds, into st[] (absent
 * blocks are no error). *asked_p: a connection to ask was had. */
static kvf_status remote_exists(kvf_cache *c, const kvf_key *keys, size_t n, kvf_status *st,
                                bool *asked_p)
{
    /* NULL while the store cannot be reached: kvf_last_error() says why */
    kvf__store *s = kvf__engine_store(c->engine, KVF_TIER_REMOTE);
    *asked_p = s != NULL;
    if (!s)
        return KVF_ERR_REMOTE;
    return kvf__store_exists(s, keys, n, 0, st);
}

/* Extends a lookup's prefix past the first local miss: keys[0..n) are
 * asked of the remote tier in one round trip, without the cache's lock,
 * then each key counts as a hit in its local tier if it is cached here
 * again, else in the remote one if the store has it. An unreachable store
 * is a miss. */
size_t kvf__cache_remote_prefix(kvf_cache *c, const kvf_key *keys, size_t n, kvf_tier *tiers)
{
    kvf_status *st = malloc(n * sizeof *st);
    if (!st)
        return 0;
    bool asked;
    kvf_status rs = remote_exists(c, keys, n, st, &asked);
    if (rs != KVF_OK)
        KVF_LOG(KVF_LOG_WARN, "cache: remote lookup of %zu blocks: %s", n, kvf_last_error());
    size_t hits = 0;
    pthread_mutex_lock(&c->mu);
    if (rs != KVF_OK)
        c->stats.remote_errors++;
    for (; hits < n; hits++) {
        const entry *e = kvf__cache_find(c, keys[hits]);
        kvf_tier t;
        if (e && !e->removing)
            t = (kvf_tier)e->tier;
        else if (asked && st[hits] == KVF_OK)
            t = KVF_TIER_REMOTE;
        else
            break;
        if (tiers)
            tiers[hits] = t;
        c->stats.hits[t]++;
    }
    pthread_mutex_unlock(&c->mu);
    free(st);
    return hits;
}
