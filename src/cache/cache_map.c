/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The key map: a hash table of entries by content key, grown by doubling.
 */
#include "cache_private.h"

#include <stdlib.h>

static size_t bucket_of(const kvf_cache *c, kvf_key key)
{
    key ^= key >> 31;
    key *= 0x9E3779B97F4A7C15ull;
    return (size_t)(key >> 17) & (c->nbuckets - 1);
}

entry *kvf__cache_find(const kvf_cache *c, kvf_key key)
{
    for (entry *e = c->buckets[bucket_of(c, key)]; e; e = e->hnext)
        if (e->key == key)
            return e;
    return NULL;
}

static bool table_grow(kvf_cache *c)
{
    size_t nb = c->nbuckets * 2;
    entry **b = calloc(nb, sizeof *b);
    if (!b)
        return false;
    entry **old = c->buckets;
    size_t oldn = c->nbuckets;
    c->buckets = b;
    c->nbuckets = nb;
    for (size_t i = 0; i < oldn; i++)
        for (entry *e = old[i], *next; e; e = next) {
            next = e->hnext;
            size_t k = bucket_of(c, e->key);
            e->hnext = b[k];
            b[k] = e;
        }
    free(old);
    return true;
}

entry *kvf__cache_place(kvf_cache *c, kvf_key key, kvf_tier tier, uint32_t slot, uint32_t priority)
{
    entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->key = key;
    e->tier = (uint8_t)tier;
    e->slot = slot;
    e->priority = (uint8_t)priority;
    e->gen = ++c->next_gen;
    e->round = c->round;
    size_t b = bucket_of(c, key);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    c->count++;
    kvf__cache_lru_append(c, e);
    if (c->count > c->nbuckets)
        table_grow(c); /* a failed grow only lengthens the chains */
    return e;
}

/* Takes an entry out of the map and its tier; its slot is free again and
 * its file, if any, is the caller's to remove. */
void kvf__cache_unplace(kvf_cache *c, entry *e)
{
    if (e->pins == 0)
        kvf__cache_lru_unlink(c, e);
    c->used[e->tier]--;
    if (e->tier == KVF_TIER_HOST)
        c->free_slots[c->nfree++] = e->slot;
    if (e->tier == KVF_TIER_GPU) {
        c->gpu_state[e->slot] = GPU_FREE;
        c->gpu_free[c->ngpu_free++] = e->slot;
    }
    entry **pp = &c->buckets[bucket_of(c, e->key)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    c->count--;
}

void kvf__cache_free_entries(kvf_cache *c)
{
    for (size_t b = 0; b < c->nbuckets; b++)
        for (entry *e = c->buckets[b], *next; e; e = next) {
            next = e->hnext;
            free(e);
        }
}
