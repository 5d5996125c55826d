/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An entry dropped: out of the map and its tier, with its file's removal
 * queued; at once (discard), or at its last pin when it was removed while
 * pinned, or when the call that doomed it ends.
 */
#include "cache_private.h"

#include <stdlib.h>

/* Takes an entry out of the map and frees it; a file of its own is queued
 * for removal in pb->remove (pb NULL: the file stays). */
void kvf__cache_drop(kvf_cache *c, entry *e, put_batches *pb)
{
    kvf__cache_unplace(c, e);
    if (e->tier == KVF_TIER_DISK && pb)
        kvf__cache_pending_add(&pb->remove, (kvf_move){.key = e->key}, e->key, 0, 0);
    kvf__cache_emit(c, KVF_EVENT_REMOVED, e, (kvf_tier)e->tier);
    free(e);
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
