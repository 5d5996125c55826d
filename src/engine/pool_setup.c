/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pools: their memory, slots, and freezing them at the first transfer.
 */
#include "engine_private.h"

/* ---- pools ----------------------------------------------------------------- */

static kvf_status mem_array_setup(kvf_engine *e, uint32_t pool_idx, const char *what,
                                  const kvf_pool_desc *d, size_t block_bytes, bool primary,
                                  mem_array *m)
{
    if ((unsigned)d->memory > KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_INVALID, "pool %u: %s memory kind %d unknown", pool_idx, what,
                         (int)d->memory);
    if (d->slots == 0)
        return kvf__fail(KVF_ERR_INVALID, "pool %u: %s has 0 slots", pool_idx, what);
    bool cuda = e->backend_kind == KVF_BACKEND_CUDA;
    if (!cuda && d->memory == KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "pool %u: %s in device memory, but the engine runs on the host "
                         "backend",
                         pool_idx, what);
    if (cuda && primary && d->memory != KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "pool %u: the CUDA backend keeps primary slots in device memory",
                         pool_idx);
    if (cuda && !primary && d->memory == KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED, "pool %u: secondary slots live in host memory",
                         pool_idx);
    size_t stride = d->slot_stride ? d->slot_stride : block_bytes;
    if (stride < block_bytes)
        return kvf__fail(KVF_ERR_RANGE,
                         "pool %u: %s slot_stride %zu is below the block's %zu bytes", pool_idx,
                         what, stride, block_bytes);
    size_t bytes;
    if (kvf__mul_overflows(stride, d->slots, &bytes))
        return kvf__fail(KVF_ERR_RANGE, "pool %u: %s of %u slots of %zu bytes overflows", pool_idx,
                         what, d->slots, stride);
    memset(m, 0, sizeof *m);
    m->kind = d->memory;
    m->stride = stride;
    m->slots = d->slots;
    kvf_status st;
    if (d->base) {
        st = e->backend->ops->mem_register(e->backend, d->memory, d->base, bytes, &m->registered);
        if (st != KVF_OK)
            return kvf__fail(st, "pool %u: %s: %s", pool_idx, what, kvf_last_error());
        m->base = d->base;
    } else {
        void *p;
        st = e->backend->ops->mem_alloc(e->backend, d->memory, bytes, &p);
        if (st != KVF_OK)
            return kvf__fail(st, "pool %u: %s of %zu bytes: %s", pool_idx, what, bytes,
                             kvf_last_error());
        m->base = p;
        m->owned = true;
    }
    return KVF_OK;
}

kvf_status kvf_engine_add_pool(kvf_engine *e, const kvf_geometry *g, const kvf_pool_desc *primary,
                               const kvf_pool_desc *secondary, uint32_t *pool_p)
{
    kvf__clear_error();
    if (!e || !g || !primary)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_add_pool: engine, geometry and primary "
                                          "are required");
    pool p;
    memset(&p, 0, sizeof p);
    kvf_status st = kvf_geometry_block_bytes(g, &p.block_bytes);
    if (st != KVF_OK)
        return st;
    p.g = *g;
    p.rows =
        (size_t)g->layers * g->kv_factor * (g->order == KVF_ORDER_HEAD_MAJOR ? g->kv_heads : 1);
    p.pitch = p.block_bytes / p.rows;
    p.token_bits = p.pitch * 8 / g->tokens_per_block;

    engine_lock(e);
    uint32_t idx = e->npools;
    if (e->frozen) {
        st =
            kvf__fail(KVF_ERR_STATE, "pool %u: pools must be added before the first transfer", idx);
        goto unlock;
    }
    if (idx && e->pools[0].g.tokens_per_block != g->tokens_per_block) {
        st = kvf__fail(KVF_ERR_INVALID, "pool %u: tokens_per_block %u differs from pool 0's %u",
                       idx, g->tokens_per_block, e->pools[0].g.tokens_per_block);
        goto unlock;
    }
    if (idx == e->pools_cap) {
        uint32_t nc = e->pools_cap ? e->pools_cap * 2 : 4;
        pool *np = realloc(e->pools, nc * sizeof *np);
        if (!np) {
            st = kvf__fail(KVF_ERR_NOMEM, "pool %u: out of memory", idx);
            goto unlock;
        }
        e->pools = np;
        e->pools_cap = nc;
    }
    st = mem_array_setup(e, idx, "primary", primary, p.block_bytes, true, &p.primary);
    if (st != KVF_OK)
        goto unlock;
    if (secondary) {
        st = mem_array_setup(e, idx, "secondary", secondary, p.block_bytes, false, &p.secondary);
        if (st != KVF_OK) {
            kvf__mem_array_release(e, &p.primary);
            goto unlock;
        }
        p.has_secondary = true;
    }
    e->pools[e->npools++] = p;
    if (pool_p)
        *pool_p = idx;
unlock:
    pthread_mutex_unlock(&e->mu);
    return st;
}

uint32_t kvf_engine_pool_count(const kvf_engine *e)
{
    return e ? e->npools : 0;
}

kvf_status kvf_engine_slot_ptr(kvf_engine *e, uint32_t pool_idx, kvf_level level, uint32_t slot,
                               void **ptr_p)
{
    kvf__clear_error();
    if (!e || !ptr_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_slot_ptr: NULL argument");
    if (pool_idx >= e->npools)
        return kvf__fail(KVF_ERR_RANGE, "pool %u: no such pool (%u pools)", pool_idx, e->npools);
    const pool *p = &e->pools[pool_idx];
    if (level != KVF_LEVEL_PRIMARY && level != KVF_LEVEL_SECONDARY)
        return kvf__fail(KVF_ERR_INVALID, "pool %u: level %d unknown", pool_idx, (int)level);
    if (level == KVF_LEVEL_SECONDARY && !p->has_secondary)
        return kvf__fail(KVF_ERR_INVALID, "pool %u: no secondary slots", pool_idx);
    const mem_array *m = level == KVF_LEVEL_PRIMARY ? &p->primary : &p->secondary;
    if (slot >= m->slots)
        return kvf__fail(KVF_ERR_RANGE, "pool %u: %s slot %u out of range (%u slots)", pool_idx,
                         level == KVF_LEVEL_PRIMARY ? "primary" : "secondary", slot, m->slots);
    *ptr_p = slot_addr(m, slot);
    return KVF_OK;
}

/* Fixes the pools at the first transfer: the hazard tables and the file
 * layout fingerprint depend on them. Called with the lock held. */
kvf_status kvf__freeze(kvf_engine *e)
{
    if (e->frozen)
        return KVF_OK;
    if (e->npools == 0)
        return kvf__fail(KVF_ERR_STATE, "engine: no pools added");
    kvf_status st = kvf__arrival_setup(e);
    if (st != KVF_OK)
        return st;
    uint32_t prim = UINT32_MAX, sec = UINT32_MAX;
    size_t all = 0;
    bool any_secondary = false;
    kvf_geometry *gs = malloc(e->npools * sizeof *gs);
    if (!gs)
        return kvf__fail(KVF_ERR_NOMEM, "engine: out of memory");
    for (uint32_t p = 0; p < e->npools; p++) {
        const pool *pl = &e->pools[p];
        gs[p] = pl->g;
        prim = pl->primary.slots < prim ? pl->primary.slots : prim;
        if (pl->has_secondary) {
            any_secondary = true;
            sec = pl->secondary.slots < sec ? pl->secondary.slots : sec;
        } else {
            sec = 0;
        }
        all += pl->block_bytes;
    }
    if (!any_secondary)
        sec = 0;
    e->hz_primary = calloc(prim, sizeof *e->hz_primary);
    e->hz_secondary = sec ? calloc(sec, sizeof *e->hz_secondary) : NULL;
    e->sec = sec ? calloc(sec, sizeof *e->sec) : NULL;
    e->mark_primary = calloc(prim, sizeof *e->mark_primary);
    e->mark_secondary = sec ? calloc(sec, sizeof *e->mark_secondary) : NULL;
    if (!e->hz_primary || !e->mark_primary ||
        (sec && (!e->hz_secondary || !e->sec || !e->mark_secondary))) {
        free(gs);
        free(e->hz_primary);
        free(e->hz_secondary);
        free(e->sec);
        free(e->mark_primary);
        free(e->mark_secondary);
        e->hz_primary = e->hz_secondary = NULL;
        e->sec = NULL;
        e->mark_primary = e->mark_secondary = NULL;
        kvf__arrival_free(e);
        return kvf__fail(KVF_ERR_NOMEM, "engine: out of memory for hazard tables");
    }
    e->fingerprint = kvf__geometry_fingerprint(gs, e->npools);
    if (e->file_store) /* before the first transfer, which this freeze precedes */
        kvf__file_store_dir(e->file_store)->fingerprint = e->fingerprint;
    free(gs);
    e->primary_slots = prim;
    e->secondary_slots = sec;
    e->all_block_bytes = all;
    e->frozen = true;
    return KVF_OK;
}
