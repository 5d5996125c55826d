/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A hash table of objects by a block key (kvf_key, keymap.c), for every keyed
 * index of the library: the cache's entries, the engine's per-key hazards,
 * the in-memory remote store's values. Keys come from callers (block keys
 * are hashes of their tokens, chosen by whoever chooses the tokens), so
 * the buckets are picked by a hash keyed with a random key per process:
 * nobody outside it can choose keys that share a bucket. Intrusive: an object keeps its own
 * key and a chain pointer, at offsets given once, so the table allocates
 * nothing per object and an insert cannot fail once buckets exist. The
 * buckets double when the objects outnumber them; where that allocation
 * fails the chains only grow longer. Not thread-safe: its owner's lock
 * guards it.
 */
#ifndef KVF_CORE_KEYMAP_H
#define KVF_CORE_KEYMAP_H

#include "common.h"

typedef struct kvf__keymap {
    void **buckets;
    size_t nbuckets, count;
    size_t key_off;  /* offsetof the object's kvf_key */
    size_t next_off; /* offsetof its chain pointer (void *) */
    size_t first;    /* buckets made on the first insert (a power of two) */
    uint64_t k0, k1; /* the bucket hash's key, the process's, taken with the buckets */
} kvf__keymap;

/* A map of objects whose key and chain pointer sit at key_off and
 * next_off; its `first` buckets are allocated by the first insert. */
#define KVF_KEYMAP_INIT(type, key_field, next_field, first_buckets)                                \
    {                                                                                              \
        .key_off = offsetof(type, key_field), .next_off = offsetof(type, next_field),              \
        .first = (first_buckets)                                                                   \
    }

/* The first object with `key` after `after` in its chain (NULL: the first
 * of all), or NULL: keys may repeat, for an owner that tells its objects
 * apart by more than the key. */
KVF_INTERNAL void *kvf__keymap_find(const kvf__keymap *m, kvf_key key, const void *after);
/* Adds obj (its key set). false only when the map has no buckets and
 * none could be allocated. */
KVF_INTERNAL bool kvf__keymap_insert(kvf__keymap *m, void *obj);
/* Takes obj, which the map holds, out of it. */
KVF_INTERNAL void kvf__keymap_remove(kvf__keymap *m, void *obj);
/* Calls drop (NULL: none) on every object, which it may free, then
 * empties the map as kvf__keymap_free does. */
KVF_INTERNAL void kvf__keymap_clear(kvf__keymap *m, void (*drop)(void *obj));
/* Every object in turn: start with *pos = 0 and obj NULL, pass each
 * result back; NULL at the end. The map must not change meanwhile. */
KVF_INTERNAL void *kvf__keymap_next(const kvf__keymap *m, size_t *pos, const void *obj);
/* Frees the buckets (not the objects) and empties the map, keeping its
 * offsets. */
KVF_INTERNAL void kvf__keymap_free(kvf__keymap *m);

#endif /* KVF_CORE_KEYMAP_H */
