/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The key map: the cache's entries by content key (core/keymap.h).
 */
#include "cache_private.h"

#include <stdlib.h>

entry *kvf__cache_find(const kvf_cache *c, kvf_key key)
{
    return kvf__keymap_find(&c->map, key, NULL);
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
    if (!kvf__keymap_insert(&c->map, e)) {
        free(e);
        return NULL;
    }
    e->gen = ++c->next_gen;
    e->round = c->round;
    kvf__cache_lru_append(c, e);
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
    kvf__keymap_remove(&c->map, e);
}

void kvf__cache_free_entries(kvf_cache *c)
{
    kvf__keymap_clear(&c->map, free);
}
