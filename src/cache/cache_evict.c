/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Eviction: room made in a tier by moving its victim (kvf__cache_victim_of)
 * down the tiers, GPU to host or disk, host to disk, or dropping it; each
 * move queued in the caller's batches.
 */
#include "cache_private.h"

/* Makes room for one block on disk: drops the disk victim. */
bool kvf__cache_disk_room(kvf_cache *c, put_batches *pb)
{
    if (c->used[KVF_TIER_DISK] < c->capacity[KVF_TIER_DISK])
        return true;
    entry *v = kvf__cache_victim_of(c, KVF_TIER_DISK);
    if (!v)
        return false;
    if (v->round == c->round)
        kvf__cache_flush(c, pb); /* its file's write must be queued before its removal */
    c->stats.evictions[KVF_TIER_DISK]++;
    c->stats.dropped++;
    kvf__cache_drop(c, v, pb);
    return true;
}

/* A free host slot, evicting the host victim (down to disk, or dropped)
 * when none is free. false: every host block is pinned. */
bool kvf__cache_host_slot(kvf_cache *c, put_batches *pb, uint32_t *slot_p)
{
    if (c->nfree) {
        *slot_p = c->free_slots[--c->nfree];
        c->used[KVF_TIER_HOST]++;
        return true;
    }
    entry *v = kvf__cache_victim_of(c, KVF_TIER_HOST);
    if (!v)
        return false;
    if (v->round == c->round)
        kvf__cache_flush(c, pb); /* its slot's write must be queued before it is read or reused */
    c->stats.evictions[KVF_TIER_HOST]++;
    bool move_down = c->capacity[KVF_TIER_DISK] > 0 && v->priority >= c->cfg.offload_min_priority &&
                     v->uses >= c->cfg.disk.admit_uses && kvf__cache_disk_room(c, pb);
    if (!move_down) {
        c->stats.dropped++;
        uint32_t slot = v->slot;
        kvf__cache_drop(c, v, pb);
        c->nfree--; /* drop freed the slot: it is taken again at once */
        c->used[KVF_TIER_HOST]++;
        *slot_p = slot;
        return true;
    }
    uint32_t slot = v->slot;
    kvf__cache_lru_unlink(c, v);
    v->tier = KVF_TIER_DISK;
    v->gen = ++c->next_gen;
    v->round = c->round;
    c->used[KVF_TIER_DISK]++;
    kvf__cache_lru_append(c, v);
    kvf__cache_pending_add(&pb->demote, (kvf_move){.src = slot, .key = v->key}, v->key, v->gen, 0);
    c->stats.bytes_in[KVF_TIER_DISK] += c->block_bytes;
    kvf__cache_emit(c, KVF_EVENT_UPDATED, v, KVF_TIER_HOST);
    *slot_p = slot; /* used[HOST] unchanged: the slot passes to the new block */
    return true;
}

/* A free GPU slot, evicting the GPU victim when none is free: it is copied
 * down to a host slot or a file (dropped below offload_min_priority or
 * without room). false: every GPU block is pinned or handed out. */
bool kvf__cache_gpu_slot(kvf_cache *c, put_batches *pb, uint32_t *slot_p)
{
    if (!c->ngpu_free) {
        entry *v = kvf__cache_victim_of(c, KVF_TIER_GPU);
        if (!v)
            return false;
        if (v->round == c->round)
            kvf__cache_flush(c, pb);
        c->stats.evictions[KVF_TIER_GPU]++;
        bool keep = v->priority >= c->cfg.offload_min_priority;
        uint32_t hs = 0;
        kvf_tier to = KVF_TIER_COUNT;
        if (keep && c->capacity[KVF_TIER_HOST] && kvf__cache_host_slot(c, pb, &hs))
            to = KVF_TIER_HOST;
        else if (keep && c->capacity[KVF_TIER_DISK] && kvf__cache_disk_room(c, pb))
            to = KVF_TIER_DISK;
        if (to == KVF_TIER_COUNT) {
            c->stats.dropped++;
            kvf__cache_drop(c, v, pb); /* frees its GPU slot */
        } else {
            uint32_t src = v->slot;
            kvf__cache_lru_unlink(c, v);
            c->used[KVF_TIER_GPU]--;
            c->gpu_state[src] = GPU_FREE;
            c->gpu_free[c->ngpu_free++] = src;
            v->tier = (uint8_t)to;
            v->slot = hs;
            v->gen = ++c->next_gen;
            v->round = c->round;
            if (to == KVF_TIER_DISK)
                c->used[KVF_TIER_DISK]++; /* host_slot counted the host one */
            kvf__cache_lru_append(c, v);
            if (to == KVF_TIER_HOST)
                kvf__cache_pending_add(&pb->evict_host, (kvf_move){.src = src, .dst = hs}, v->key,
                                       v->gen, 0);
            else
                kvf__cache_pending_add(&pb->evict_file, (kvf_move){.src = src, .key = v->key},
                                       v->key, v->gen, 0);
            c->stats.bytes_in[to] += c->block_bytes;
            kvf__cache_emit(c, KVF_EVENT_UPDATED, v, KVF_TIER_GPU);
        }
    }
    *slot_p = c->gpu_free[--c->ngpu_free];
    return true;
}
