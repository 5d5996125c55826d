/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Eviction: the victims kvf__cache_victim_of chooses, host victims moved
 * down to disk or dropped; an entry dropped queues its file's removal.
 */
#include "cache_private.h"

#include <stdlib.h>

void kvf__cache_drop(kvf_cache *c, entry *e, put_batches *pb)
{
    kvf__cache_unplace(c, e);
    if (e->tier == KVF_TIER_DISK && pb)
        kvf__cache_pending_add(&pb->remove, (kvf_move){e->key, e->key, 0}, e->key, 0, 0);
    kvf__cache_emit(c, KVF_EVENT_REMOVED, e, (kvf_tier)e->tier);
    free(e);
}

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
    kvf__cache_pending_add(&pb->demote, (kvf_move){slot, v->key, 0}, v->key, v->gen, 0);
    c->stats.bytes_in[KVF_TIER_DISK] += c->block_bytes;
    kvf__cache_emit(c, KVF_EVENT_UPDATED, v, KVF_TIER_HOST);
    *slot_p = slot; /* used[HOST] unchanged: the slot passes to the new block */
    return true;
}

/* Drops an entry and queues the removal of its file, if it has one. */
void kvf__cache_discard(kvf_cache *c, entry *e)
{
    put_batches pb = {0};
    if (e->tier == KVF_TIER_DISK && !kvf__cache_pending_reserve(&pb.remove, 1)) {
        /* the file stays: it holds this key's own bytes, and is found
         * (and checked) again only by a cache opened later */
        kvf__cache_drop(c, e, NULL);
        return;
    }
    kvf__cache_drop(c, e, &pb);
    if (pb.remove.n)
        kvf__cache_background_push(c,
                                   kvf__cache_op_submit(c, OPK_REMOVE, KVF_TIER_DISK, &pb.remove));
    kvf__cache_pending_free(&pb.remove);
}

/* Takes one pin off; a block removed while pinned goes at its last. */
void kvf__cache_release_pin(kvf_cache *c, entry *e)
{
    if (kvf__cache_unpin_one(c, e))
        kvf__cache_discard(c, e);
}

/* Frees the entries doomed during the call now ending. Lock held. */
void kvf__cache_release_doomed(kvf_cache *c)
{
    c->deferring = false;
    while (c->ndoomed)
        kvf__cache_release_pin(c, c->doomed[--c->ndoomed]);
}
