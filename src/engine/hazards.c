/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The hazard tables of keyed objects (one per store) and the readers of a
 * slot.
 */
#include "engine_private.h"

void kvf__key_table_init(key_table *t)
{
    *t = (key_table)KVF_KEYMAP_INIT(file_hazard, key, next, 256);
}

hazard *kvf__key_hazard(key_table *t, kvf_key key, bool create)
{
    file_hazard *f = kvf__keymap_find(t, key, NULL);
    if (f || !create)
        return f ? &f->hz : NULL;
    if (!(f = calloc(1, sizeof *f)))
        return NULL;
    f->key = key;
    if (!kvf__keymap_insert(t, f)) {
        free(f);
        return NULL;
    }
    return &f->hz;
}

static void hazard_drop(void *obj)
{
    file_hazard *f = obj;
    free(f->hz.more);
    free(f);
}

void kvf__key_table_free(key_table *t)
{
    kvf__keymap_clear(t, hazard_drop);
}

/* Leaves in a slot's readers only those not done yet. */
void kvf__hazard_prune_readers(const kvf_engine *e, hazard *h)
{
    uint32_t kept = 0;
    for (uint32_t k = 0; k < h->nreaders; k++) {
        if (pending_batch(e, hazard_reader(h, k)))
            hazard_set_entry(h, kept++, hazard_entry(h, k));
    }
    h->nreaders = kept;
}

/* Drops a keyed entry with nothing pending and nothing to remember. */
void kvf__key_hazard_prune(key_table *t, kvf_key key)
{
    file_hazard *f = kvf__keymap_find(t, key, NULL);
    if (!f || f->hz.writer || f->hz.nreaders)
        return;
    kvf__keymap_remove(t, f);
    hazard_drop(f);
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

bool kvf__push_edge(dep_edge **arr, size_t *n, size_t *cap, dep_edge ed)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        dep_edge *na = realloc(*arr, nc * sizeof *na);
        if (!na)
            return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = ed;
    return true;
}
