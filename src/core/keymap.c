/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The keyed hash table (keymap.h): chained buckets, a power of two of
 * them, picked by SipHash-1-3 of the key under a key drawn once per
 * process. An unkeyed mix (MurmurHash3's finaliser, used before) is a
 * bijection anyone can invert: keys chosen as the inverses of multiples of
 * the bucket count all land in one bucket, and every lookup walks them
 * all. SipHash is a keyed PRF, cheap on one 64-bit word (bench/keymap.c
 * measures chosen keys beside random ones), and mixes dense small keys
 * (slot numbers, test keys) as well.
 */
#include "keymap.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static uint64_t process_key[2];
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void key_init(void)
{
    if (getrandom(process_key, sizeof process_key, GRND_NONBLOCK) == (ssize_t)sizeof process_key)
        return;
    /* no entropy yet (early boot) or no getrandom: what differs between
     * processes and runs, mixed below by SipHash itself */
    int local;
    process_key[0] = kvf__now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&local;
    process_key[1] = (uint64_t)(uintptr_t)&process_key ^ (uint64_t)time(NULL) << 20;
}

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = ROTL(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = ROTL(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = ROTL(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = ROTL(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = ROTL(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = ROTL(v2, 32);                                                                         \
    } while (0)

/* SipHash-1-3 of the 16-byte message `key` (lo's little-endian bytes,
 * then hi's). */
static uint64_t siphash13_key(uint64_t k0, uint64_t k1, kvf_key key)
{
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
    v3 ^= key.lo;
    SIPROUND;
    v0 ^= key.lo;
    v3 ^= key.hi;
    SIPROUND;
    v0 ^= key.hi;
    const uint64_t last = 16ull << 56; /* the message's length, no bytes left */
    v3 ^= last;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static kvf_key key_of(const kvf__keymap *m, const void *obj)
{
    kvf_key k;
    memcpy(&k, (const char *)obj + m->key_off, sizeof k);
    return k;
}

static void **next_of(const kvf__keymap *m, const void *obj)
{
    return (void **)((char *)(uintptr_t)obj + m->next_off);
}

static size_t bucket_of(const kvf__keymap *m, kvf_key key)
{
    return (size_t)siphash13_key(m->k0, m->k1, key) & (m->nbuckets - 1);
}

void *kvf__keymap_find(const kvf__keymap *m, kvf_key key, const void *after)
{
    if (!m->nbuckets)
        return NULL;
    void *o = after ? *next_of(m, after) : m->buckets[bucket_of(m, key)];
    while (o && !kvf_key_eq(key_of(m, o), key))
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
    if (!m->buckets) { /* empty: its objects were hashed under no key yet */
        pthread_once(&key_once, key_init);
        m->k0 = process_key[0];
        m->k1 = process_key[1];
    }
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
