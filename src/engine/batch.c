/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Batches: allocated, recycled, freed.
 */
#include "engine_private.h"

void kvf__batch_destroy(batch *b)
{
    if (!b)
        return;
    kvf__move_errors_free(atomic_load(&b->errors));
    free(b->moves);
    free(b->status);
    free(b->src_dep);
    free(b->dst_dep);
    free(b->dependents);
    free(b->copies);
    free(b->chunks);
    free(b->order);
    free(b);
}

/* A batch with room for n moves, reset, from the spares when one fits. A
 * group's src_dep is not used (its parts have their own). */
batch *kvf__batch_get(kvf_engine *e, size_t n, bool group)
{
    batch *b = NULL;
    pthread_mutex_lock(&e->spare_mu);
    for (uint32_t i = 0; i < e->nspare; i++)
        if (e->spare[i]->cap >= n) {
            b = e->spare[i];
            e->spare[i] = e->spare[--e->nspare];
            break;
        }
    pthread_mutex_unlock(&e->spare_mu);
    if (b) {
        batch keep = *b;
        memset(b, 0, sizeof *b);
        b->moves = keep.moves;
        b->status = keep.status;
        b->src_dep = keep.src_dep;
        b->dst_dep = keep.dst_dep;
        b->cap = keep.cap;
        b->dependents = keep.dependents;
        b->dependents_cap = keep.dependents_cap;
        b->copies = keep.copies;
        b->copies_cap = keep.copies_cap;
        b->chunks = keep.chunks;
        b->chunks_cap = keep.chunks_cap;
        b->order = keep.order;
        b->order_cap = keep.order_cap;
        if (!group)
            memset(b->src_dep, 0, n * sizeof *b->src_dep);
        return b;
    }
    b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->moves = malloc(n * sizeof *b->moves);
    b->status = malloc(n * sizeof *b->status);
    b->src_dep = calloc(n, sizeof *b->src_dep);
    b->dst_dep = malloc(n * sizeof *b->dst_dep);
    b->cap = n;
    if (!b->moves || !b->status || !b->src_dep || !b->dst_dep) {
        kvf__batch_destroy(b);
        return NULL;
    }
    return b;
}

void kvf__batch_free(batch *b)
{
    kvf_engine *e = b->engine;
    kvf__move_errors_free(atomic_exchange(&b->errors, NULL));
    if (!b->group)
        kvf__pool_sel_free(e, b->sel); /* a part shares its group's */
    b->sel = NULL;
    pthread_mutex_lock(&e->spare_mu);
    if (e->nspare < sizeof e->spare / sizeof e->spare[0]) {
        e->spare[e->nspare++] = b;
        b = NULL;
    }
    pthread_mutex_unlock(&e->spare_mu);
    kvf__batch_destroy(b);
}

/* Frees a batch once nothing refers to it any more. Lock held. */
void kvf__batch_release(batch *b)
{
    /* a pool's waiter may hold it outside the lock (kvf_wait_pool), and
     * a waiter woken after another thread retired it still reads it */
    if (b->state == B_DONE && (!b->ticketed || b->retired) && !b->waiters &&
        !(b->sel && b->sel->busy))
        kvf__batch_free(b);
}
