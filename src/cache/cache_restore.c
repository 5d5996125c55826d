/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier's blocks found at create: the file tier is listed, the
 * oldest blocks beyond the tier's capacity are removed, the others entered.
 * With cache_remote.c, the only file that asks a store (never a file or
 * directory: the disk tier is whatever store the engine keeps for it).
 */
#include "cache_private.h"
#include "store.h"

#include <stdlib.h>

typedef struct restored {
    kvf_key key;
    int64_t mtime_ns;
} restored;

typedef struct restore_list {
    restored *v;
    size_t n, cap;
    size_t block_bytes;
    uint32_t pools;
    bool nomem;
} restore_list;

static void restore_visit(void *arg, const kvf__store_entry *meta)
{
    restore_list *l = arg;
    /* the cache keeps whole blocks of this engine's pools only */
    if (meta->pools != l->pools || meta->payload_bytes != l->block_bytes)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        restored *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->nomem = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (restored){meta->key, meta->mtime_ns};
}

static int cmp_restored(const void *a, const void *b)
{
    const restored *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns)
        return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return kvf_key_cmp(x->key, y->key);
}

/* Priority of blocks found on disk at create: their own is not stored. */
#define RESTORED_PRIORITY 50u

bool kvf__cache_disk_usable(kvf_engine *engine)
{
    return kvf__engine_store(engine, KVF_TIER_DISK) != NULL;
}

/* Where the disk tier keeps its blocks, for messages. */
static const char *disk_name(kvf_cache *c)
{
    return kvf__engine_store(c->engine, KVF_TIER_DISK)->where;
}

/* Every block of this engine's pools the disk tier's store holds, into *l. */
static kvf_status disk_list(kvf_cache *c, restore_list *l)
{
    kvf_status st = kvf__store_list(kvf__engine_store(c->engine, KVF_TIER_DISK), restore_visit, l);
    if (st == KVF_OK && l->nomem)
        st = kvf__fail(KVF_ERR_NOMEM, "cache: out of memory listing %s", disk_name(c));
    return st;
}

/* Removes the `extra` oldest blocks of a sorted list, and waits. */
static kvf_status remove_oldest(kvf_cache *c, const restore_list *l, size_t extra)
{
    kvf_key *keys = malloc(extra * sizeof *keys);
    kvf_ticket t;
    if (!keys)
        return kvf__fail(KVF_ERR_NOMEM, "cache: out of memory");
    for (size_t i = 0; i < extra; i++)
        keys[i] = l->v[i].key;
    kvf_status st = kvf_remove(c->engine, KVF_TIER_DISK, keys, extra, &t);
    if (st == KVF_OK)
        st = kvf_wait(c->engine, t, NULL);
    free(keys);
    if (st != KVF_OK)
        return kvf__fail(st, "cache: removing %zu blocks beyond the disk tier's capacity: %s",
                         extra, kvf_last_error());
    KVF_LOG(KVF_LOG_INFO, "cache: %s: removed the %zu oldest blocks beyond %llu", disk_name(c),
            extra, (unsigned long long)c->capacity[KVF_TIER_DISK]);
    return KVF_OK;
}

/* Enters the blocks stored before, oldest first; those beyond the disk
 * tier's capacity are removed, oldest first. */
kvf_status kvf__cache_restore(kvf_cache *c)
{
    restore_list l = {NULL, 0, 0, c->block_bytes, kvf_engine_pool_count(c->engine), false};
    kvf_status st = disk_list(c, &l);
    if (st != KVF_OK) {
        free(l.v);
        return st;
    }
    if (l.n)
        qsort(l.v, l.n, sizeof *l.v, cmp_restored);
    size_t extra = l.n > c->capacity[KVF_TIER_DISK] ? l.n - c->capacity[KVF_TIER_DISK] : 0;
    if (extra && (st = remove_oldest(c, &l, extra)) != KVF_OK) {
        free(l.v);
        return st;
    }
    for (size_t i = extra; i < l.n; i++) {
        if (kvf__cache_find(c, l.v[i].key))
            continue;
        entry *e = kvf__cache_place(c, l.v[i].key, KVF_TIER_DISK, 0, RESTORED_PRIORITY);
        if (!e) {
            free(l.v);
            return kvf__fail(KVF_ERR_NOMEM, "cache: out of memory");
        }
        c->used[KVF_TIER_DISK]++;
        kvf__cache_emit(c, KVF_EVENT_STORED, e, KVF_TIER_DISK);
    }
    KVF_LOG(KVF_LOG_INFO, "cache: %s: %zu blocks found", disk_name(c), l.n - extra);
    free(l.v);
    return KVF_OK;
}
