/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Workers' staging: host or device images of blocks between slots and a
 * keyed tier's store, laid out as the store keeps them (a header's room,
 * the payload, padding to the O_DIRECT alignment), so that the file store
 * writes and reads them in place and the others send the payload.
 */
#include "engine_private.h"

size_t kvf__staging_prefix_bytes(const kvf_engine *e)
{
    return kvf__block_prefix_bytes(e->npools);
}

/* Bytes of one move's block image in staging: prefix and payload, padded
 * so that every image starts and ends on the O_DIRECT alignment. */
size_t kvf__staging_slot_bytes(const kvf_engine *e)
{
    size_t n = kvf__staging_prefix_bytes(e) + e->all_block_bytes;
    return (n + KVF_FILE_ALIGN - 1) & ~(size_t)(KVF_FILE_ALIGN - 1);
}

/* Grows a worker's host staging buffer (pinned on the CUDA backend, so
 * its copies run at PCIe speed) to at least `need` bytes. */
kvf_status kvf__staging_grow(kvf_engine *e, uint8_t **buf, size_t *cap, size_t need)
{
    if (*buf && *cap >= need)
        return KVF_OK;
    kvf_memory kind =
        e->backend_kind == KVF_BACKEND_CUDA ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST;
    void *p;
    kvf_status st = e->backend->ops->mem_alloc(e->backend, kind, need, &p);
    if (st != KVF_OK)
        return st;
    if (*buf)
        e->backend->ops->mem_free(e->backend, kind, *buf);
    *buf = p;
    *cap = need;
    return KVF_OK;
}

kvf_status kvf__ensure_staging(worker *w, size_t n, bool images, bool dev)
{
    kvf_engine *e = w->engine;
    /* the per-move arrays only grow: w->nmoves is what all three hold, so
     * a staging allocation that fails below leaves them usable */
    if (w->nmoves < n) {
        size_t *moves = realloc(w->moves, n * sizeof *moves);
        if (moves)
            w->moves = moves;
        kvf__store_block *blocks = realloc(w->blocks, n * sizeof *blocks);
        if (blocks)
            w->blocks = blocks;
        kvf__copy *copies = realloc(w->copies, n * e->npools * sizeof *copies);
        if (copies)
            w->copies = copies;
        uint32_t *pool_bytes = realloc(w->pool_bytes, n * e->npools * sizeof *pool_bytes);
        if (pool_bytes)
            w->pool_bytes = pool_bytes;
        if (!moves || !blocks || !copies || !pool_bytes)
            return kvf__fail(KVF_ERR_NOMEM, "staging: out of memory for %zu moves", n);
        w->nmoves = n;
    }
    if (!images)
        return KVF_OK;
    if (dev) {
        if (w->gstaging && kvf__gds_buf_slots(w->gstaging) >= n)
            return KVF_OK;
        kvf__gds_buf *g;
        kvf_status st = kvf__gds_buf_create(e->cfg.device, kvf__staging_slot_bytes(e), n, &g);
        if (st != KVF_OK)
            return st;
        kvf__gds_buf_destroy(w->gstaging);
        w->gstaging = g;
        return KVF_OK;
    }
    return kvf__staging_grow(e, &w->staging, &w->staging_bytes, kvf__staging_slot_bytes(e) * n);
}

uint8_t *kvf__staging_payload(worker *w, size_t k, bool dev)
{
    uint8_t *image = dev ? kvf__gds_buf_slot(w->gstaging, k)
                         : w->staging + k * kvf__staging_slot_bytes(w->engine);
    return image + kvf__staging_prefix_bytes(w->engine);
}

/* Copies of a move between its slot (primary, or secondary for demote and
 * promote) and a packed file image: each pool's rows of `file_tokens`
 * tokens, back to back. `tokens` of them are moved (tokens <= file_tokens). */
size_t kvf__file_copies(const kvf_engine *e, op_kind kind, const kvf_move *mv, uint8_t *payload,
                        uint32_t tokens, uint32_t file_tokens, kvf__copy *out, uint32_t *pool_bytes)
{
    bool to_file = tier_keyed(kind_writes(kind));
    bool secondary = kind_uses_secondary(kind);
    size_t off = 0;
    for (uint32_t p = 0; p < e->npools; p++) {
        const pool *pl = &e->pools[p];
        kvf_region want = kvf__pool_region(pl, tokens), stored = kvf__pool_region(pl, file_tokens);
        /* a whole stored block is rows of the full pitch, like the slot */
        size_t rows = want.rows, width = want.row_bytes;
        size_t file_pitch = stored.rows == 1 && want.rows > 1 ? want.pitch : stored.row_bytes;
        if (want.rows == 1)
            file_pitch = width;
        uint8_t *slot =
            slot_addr(secondary ? &pl->secondary : &pl->primary, to_file ? mv->src : mv->dst);
        if (to_file)
            out[p] = (kvf__copy){payload + off, slot, width, rows, file_pitch, want.pitch};
        else
            out[p] = (kvf__copy){slot, payload + off, width, rows, want.pitch, file_pitch};
        if (pool_bytes)
            pool_bytes[p] = (uint32_t)kvf__region_bytes(&stored);
        off += kvf__region_bytes(&stored);
    }
    return off;
}

/* Copies between slots and staging: host memory on both sides for
 * secondary slots (no backend, no GPU stream), the backend's otherwise. */
kvf_status kvf__staging_copy(worker *w, const batch *b, kvf__copy *cp, size_t n)
{
    return kvf__staging_copy_run(w, b, cp, kvf__sel_compact(w->engine, b, cp, n));
}

kvf_status kvf__staging_copy_run(worker *w, const batch *b, kvf__copy *cp, size_t n)
{
    kvf_engine *e = w->engine;
    uint64_t t0 = kvf__now_ns();
    kvf_status st = kind_uses_secondary(b->kind)
                        ? kvf__host_copy(cp, n)
                        : e->backend->ops->copy_sync(e->backend, b->queue, cp, n);
    atomic_fetch_add_explicit(&w->copy_ns, kvf__now_ns() - t0, memory_order_relaxed);
    return st;
}
