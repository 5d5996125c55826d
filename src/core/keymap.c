/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The keyed hash table (keymap.h): chained buckets, a power of two of
 * them, indexed by a 64-bit mix of the key (block keys are hashes already,
 * but slot numbers and test keys are small and dense).
 */
#include "keymap.h"

#include <stdlib.h>

static uint64_t key_of(const kvf__keymap *m, const void *obj)
{
    return *(const uint64_t *)((const char *)obj + m->key_off);
}

static void **next_of(const kvf__keymap *m, const void *obj)
{
    return (void **)((char *)(uintptr_t)obj + m->next_off);
}

/* The finaliser of MurmurHash3: every key bit moves every bucket bit. */
static size_t bucket_of(const kvf__keymap *m, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    key ^= key >> 33;
    return (size_t)key & (m->nbuckets - 1);
}

void *kvf__keymap_find(const kvf__keymap *m, uint64_t key, const void *after)
{
    if (!m->nbuckets)
        return NULL;
    void *o = after ? *next_of(m, after) : m->buckets[bucket_of(m, key)];
    while (o && key_of(m, o) != key)
        o = *next_of(m, o);
    return o;
}

static void link_in(kvf__keymap *m, void *obj)
{
    size_t b = bucket_of(m, key_of(m, obj));
    *next_of(m, obj) = m->buckets[b];
    m->buckets[b] = obj;
}

/* Doubles the buckets (or makes the first); false when out of memory,
 * the map as it was. */
static bool grow(kvf__keymap *m)
{
    size_t nb = m->nbuckets ? m->nbuckets * 2 : (m->first ? m->first : 64);
    void **nbk = calloc(nb, sizeof *nbk);
    if (!nbk)
        return false;
    void **old = m->buckets;
    size_t oldn = m->nbuckets;
    m->buckets = nbk;
    m->nbuckets = nb;
    for (size_t i = 0; i < oldn; i++)
        for (void *o = old[i], *next; o; o = next) {
            next = *next_of(m, o);
            link_in(m, o);
        }
    free(old);
    return true;
}

bool kvf__keymap_insert(kvf__keymap *m, void *obj)
{
    if (m->count >= m->nbuckets && !grow(m) && !m->nbuckets)
        return false;
    link_in(m, obj);
    m->count++;
    return true;
}

void kvf__keymap_remove(kvf__keymap *m, void *obj)
{
    void **pp = &m->buckets[bucket_of(m, key_of(m, obj))];
    while (*pp != obj)
        pp = next_of(m, *pp);
    *pp = *next_of(m, obj);
    m->count--;
}

void kvf__keymap_clear(kvf__keymap *m, void (*drop)(void *obj))
{
    for (size_t i = 0; i < m->nbuckets; i++)
        for (void *o = m->buckets[i], *next; o; o = next) {
            next = *next_of(m, o);
            if (drop)
                drop(o);
        }
    kvf__keymap_free(m);
}

void *kvf__keymap_next(const kvf__keymap *m, size_t *pos, const void *obj)
{
    void *o = obj ? *next_of(m, obj) : NULL;
    if (o)
        return o;
    if (obj)
        ++*pos;
    for (; *pos < m->nbuckets; ++*pos)
        if (m->buckets[*pos])
            return m->buckets[*pos];
    return NULL;
}

void kvf__keymap_free(kvf__keymap *m)
{
    free(m->buckets);
    m->buckets = NULL;
    m->nbuckets = m->count = 0;
}
