/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An entry's lifecycle: the key map (core/keymap.h), the LRU lists, one per
 * (tier, priority), the next victim of a tier, pins, and entries doomed
 * while a call assembles its batches. Nothing here queues a move: what an
 * entry's end asks of the engine (its file's removal) is batching's
 * (kvf__cache_drop, kvf__cache_discard).
 */
#include "cache_private.h"

#include <stdlib.h>

entry *kvf__cache_find(const kvf_cache *c, kvf_key key)
{
    return kvf__keymap_find(&c->map, key, NULL);
}

void kvf__cache_lru_unlink(kvf_cache *c, entry *e)
{
    lru *l = &c->lists[e->tier][e->priority];
    c->listed[e->tier]--;
    if (e->prev)
        e->prev->next = e->next;
    else
        l->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = NULL;
}

/* Appends as the most recently used of its list. */
void kvf__cache_lru_append(kvf_cache *c, entry *e)
{
    lru *l = &c->lists[e->tier][e->priority];
    c->listed[e->tier]++;
    e->next = NULL;
    e->prev = l->tail;
    if (l->tail)
        l->tail->next = e;
    else
        l->head = e;
    l->tail = e;
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

/* The next victim of a tier: lowest priority, then least recently used.
 * Pinned entries are on no list, so are never returned. */
entry *kvf__cache_victim_of(kvf_cache *c, kvf_tier t)
{
    /* an entry already going (a refused batch's, see kvf__cache_doom) is no victim */
    for (uint32_t p = 0; p < PRIORITIES; p++)
        for (entry *e = c->lists[t][p].head; e; e = e->next)
            if (!e->removing)
                return e;
    return NULL;
}

/* A pinned entry is on no LRU list, so it is never a victim. */
void kvf__cache_pin_one(kvf_cache *c, entry *e)
{
    if (e->pins++ == 0)
        kvf__cache_lru_unlink(c, e);
}

bool kvf__cache_unpin_one(kvf_cache *c, entry *e)
{
    if (--e->pins)
        return false;
    kvf__cache_lru_append(c, e);
    return e->removing;
}

/* While a call assembles its batches, an entry a refused batch was about
 * is marked going but kept (the call's loop may still hold it) and freed
 * when the call ends (kvf__cache_release_doomed). */
void kvf__cache_doom(kvf_cache *c, entry *e)
{
    if (c->ndoomed == c->doomed_cap) {
        size_t cap = c->doomed_cap ? 2 * c->doomed_cap : 16;
        entry **v = realloc(c->doomed, cap * sizeof *v);
        if (!v)
            return; /* stays marked going: no victim, no hit; freed never (out of memory) */
        c->doomed = v;
        c->doomed_cap = cap;
    }
    kvf__cache_pin_one(c, e); /* (its pins were 0: see op_apply) */
    c->doomed[c->ndoomed++] = e;
}
