/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hazard tables of keyed objects (one per store) and the readers of a
 * slot.
 */
#include "engine_private.h"

static size_t key_bucket(const key_table *t, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)(key & (t->nbuckets - 1));
}

static kvf_status key_table_grow(key_table *t)
{
    size_t nb = t->nbuckets ? t->nbuckets * 2 : 256;
    file_hazard **nbk = calloc(nb, sizeof *nbk);
    if (!nbk)
        return kvf__fail(KVF_ERR_NOMEM, "engine: out of memory for a hazard table");
    size_t old_nb = t->nbuckets;
    file_hazard **old = t->buckets;
    t->buckets = nbk;
    t->nbuckets = nb;
    for (size_t i = 0; i < old_nb; i++) {
        for (file_hazard *f = old[i], *next; f; f = next) {
            next = f->next;
            size_t b = key_bucket(t, f->key);
            f->next = nbk[b];
            nbk[b] = f;
        }
    }
    free(old);
    return KVF_OK;
}

hazard *kvf__key_hazard(key_table *t, uint64_t key, bool create)
{
    if (t->nbuckets) {
        for (file_hazard *f = t->buckets[key_bucket(t, key)]; f; f = f->next)
            if (f->key == key)
                return &f->hz;
    }
    if (!create)
        return NULL;
    if (t->count + 1 > t->nbuckets && key_table_grow(t) != KVF_OK)
        return NULL;
    file_hazard *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->key = key;
    size_t b = key_bucket(t, key);
    f->next = t->buckets[b];
    t->buckets[b] = f;
    t->count++;
    return &f->hz;
}

void kvf__key_table_free(key_table *t)
{
    for (size_t i = 0; i < t->nbuckets; i++)
        for (file_hazard *f = t->buckets[i], *next; f; f = next) {
            next = f->next;
            free(f->hz.more);
            free(f);
        }
    free(t->buckets);
    *t = (key_table){0};
}

/* Leaves in a slot's readers only those not done yet. */
void kvf__hazard_prune_readers(const kvf_engine *e, hazard *h)
{
    uint32_t kept = 0;
    for (uint32_t k = 0; k < h->nreaders; k++) {
        uint64_t id = hazard_reader(h, k);
        if (pending_batch(e, id))
            hazard_set_reader(h, kept++, id);
    }
    h->nreaders = kept;
}

/* Drops a keyed entry with nothing pending and nothing to remember. */
void kvf__key_hazard_prune(key_table *t, uint64_t key)
{
    file_hazard **pp = &t->buckets[key_bucket(t, key)];
    for (; *pp; pp = &(*pp)->next) {
        file_hazard *f = *pp;
        if (f->key != key)
            continue;
        if (f->hz.writer || f->hz.nreaders)
            return;
        *pp = f->next;
        free(f->hz.more);
        free(f);
        t->count--;
        return;
    }
}

bool kvf__push_id(uint64_t **arr, uint32_t n, uint32_t *cap, uint64_t id)
{
    if (n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 4;
        uint64_t *na = realloc(*arr, nc * sizeof *na);
        if (!na)
            return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[n] = id;
    return true;
}

bool kvf__push_ptr(batch ***arr, size_t *n, size_t *cap, batch *b)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        batch **na = realloc(*arr, nc * sizeof *na);
        if (!na)
            return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = b;
    return true;
}
