/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A completed op applied to the map: each move's status given to its
 * block in the caller's call, and a block that a failed move left not
 * whole removed (or, read for an acquire and spared, put back on disk).
 */
#include "cache_private.h"

/* An acquire that could not read a block's file for a reason that says
 * nothing against the file (the process out of descriptors, an I/O error)
 * puts the block back on disk, its file untouched; the GPU slot it was to
 * fill is free again. The disk tier may so hold one block over its
 * capacity until its next eviction. */
static void back_to_disk(kvf_cache *c, entry *e, kvf_status st)
{
    if (e->pins == 0)
        kvf__cache_lru_unlink(c, e);
    c->gpu_state[e->slot] = GPU_FREE;
    c->gpu_free[c->ngpu_free++] = e->slot;
    c->used[KVF_TIER_GPU]--;
    e->tier = KVF_TIER_DISK;
    e->slot = 0;
    e->gen = ++c->next_gen;
    c->used[KVF_TIER_DISK]++;
    if (e->pins == 0)
        kvf__cache_lru_append(c, e);
    kvf__cache_emit(c, KVF_EVENT_UPDATED, e, KVF_TIER_GPU);
    KVF_LOG(KVF_LOG_WARN,
            "cache: block " KVF_KEY_FMT ": not read into the GPU tier: %s; kept on disk",
            KVF_KEY_ARGS(e->key), kvf_status_str(st));
}

/* Gives move i's outcome to its block in the caller's call. */
static void note_in_call(const op *o, call *k, size_t i, kvf_status st, const kvf__move_error *why)
{
    if (k && o->index[i] < k->n &&
        (o->kind == OPK_PUT || o->kind == OPK_GET || o->kind == OPK_ACQUIRE ||
         o->kind == OPK_FENCE)) {
        k->status[o->index[i]] = st;
        if (st != KVF_OK)
            kvf__cache_call_note(k, o->index[i], st, "block " KVF_KEY_FMT ": %s tier: %s",
                                 KVF_KEY_ARGS(o->keys[i]), kvf_tier_name((kvf_tier)o->tier),
                                 why && why->index == i ? why->message : kvf_status_str(st));
    }
}

/* The store's blocks are not in the map: a remote move is only counted. */
static void count_remote(kvf_cache *c, const op *o, kvf_status st)
{
    bool read = o->kind == OPK_GET, write = o->kind == OPK_REMOTE_PUT;
    if (st == KVF_OK && read)
        c->stats.bytes_out[KVF_TIER_REMOTE] += c->block_bytes;
    else if (st == KVF_OK && write)
        c->stats.bytes_in[KVF_TIER_REMOTE] += c->block_bytes;
    else if (st != KVF_OK && !(read && st == KVF_ERR_NOT_FOUND))
        c->stats.remote_errors++;
}

/* The cache's one rule for what a failed read says about the block it
 * read: only evidence about the stored copy itself condemns it, namely a
 * verdict on its bytes or its presence (kvf__status_condemns_block:
 * corrupt, another layout, not found, its write lost), reached by the move
 * that read it. Not evidence: a failure of the process, a disk or a
 * device; a get the engine refused (it read nothing); a failure about the
 * get's destination, the caller's slot (why->about_dest: a layer-wise get
 * into a primary slot whose last write failed). A verdict that may be
 * transient (a file rewritten in place by another process) is re-read by
 * the engine before it is reported. `why`: move i's message, or NULL. */
static bool read_condemns(const op *o, size_t i, kvf_status st, const kvf__move_error *why)
{
    if (st == KVF_OK || !kvf__status_condemns_block(st))
        return false;
    if (o->kind == OPK_GET && o->ticket.id == 0)
        return false;
    return !(why && why->index == i && why->about_dest);
}

/* Applies move i of a completed op to the entry it was about. `stale`:
 * an acquire from disk's list of files to remove, else NULL. */
static void apply_move(kvf_cache *c, const op *o, size_t i, kvf_status st,
                       const kvf__move_error *why, pending *stale)
{
    entry *e = kvf__cache_find(c, o->keys[i]);
    if (e && o->kind == OPK_GET && o->tier != KVF_TIER_REMOTE) {
        /* the get's pin kept this very entry alive, whatever moved it
         * since (an acquire to the GPU tier): release it by key */
        e->reads--;
        if (--e->pins == 0)
            kvf__cache_lru_append(c, e);
    }
    bool current = e && e->gen == o->gens[i];
    /* a read whose failure is no evidence against its block leaves it
     * whole where it is. An acquire from the host tier gave away the
     * slot it read: its block goes whatever the failure. */
    bool spared = st != KVF_OK && !read_condemns(o, i, st, why);
    bool kept = false;
    if (stale) {
        if (current && spared) {
            back_to_disk(c, e, st);
            kept = true;
        } else if (!(e && e->tier == KVF_TIER_DISK)) { /* else the file is that entry's */
            kvf__cache_pending_add(stale, (kvf_move){.key = o->keys[i]}, o->keys[i], 0, 0);
        }
    }
    if (!current)
        return; /* removed or placed again since: not this op's business */
    if ((o->kind == OPK_GET || o->kind == OPK_ACQUIRE) && st == KVF_OK)
        c->stats.bytes_out[o->tier] += c->block_bytes;
    if (o->kind == OPK_GET && spared) {
        if (o->ticket.id != 0)
            KVF_LOG(KVF_LOG_WARN, "cache: block " KVF_KEY_FMT ": %s tier: read failed: %s; kept",
                    KVF_KEY_ARGS(e->key), kvf_tier_name((kvf_tier)e->tier), kvf_status_str(st));
    } else if (st != KVF_OK && !kept) {
        /* the block this move wrote or read is not there whole */
        c->stats.failures++;
        e->removing = true;
        KVF_LOG(KVF_LOG_WARN, "cache: block " KVF_KEY_FMT ": %s tier: %s; removed",
                KVF_KEY_ARGS(e->key), kvf_tier_name((kvf_tier)e->tier), kvf_status_str(st));
    }
    if (e->removing && e->pins == 0) {
        if (c->deferring)
            kvf__cache_doom(c, e);
        else
            kvf__cache_discard(c, e);
    }
}

/* Applies a completed op to the map. Lock held. */
void kvf__cache_op_apply(kvf_cache *c, op *o, call *k)
{
    /* an acquire from disk removes the files it read only now, once it
     * knows each read's outcome; out of memory for the list, they stay
     * (each holds its key's own bytes, and is checked again when read) */
    pending stale = {0};
    bool from_file = o->kind == OPK_ACQUIRE && o->tier == KVF_TIER_DISK &&
                     kvf__cache_pending_reserve(&stale, o->n);
    /* the engine's messages come in move order (kvf__move_errors_sorted) */
    if (o->errors)
        o->errors = kvf__move_errors_sorted(o->errors, o->status, o->n, "cache: block");
    const kvf__move_error *why = o->errors;
    for (size_t i = 0; i < o->n; i++) {
        kvf_status st = o->status[i];
        while (why && why->index < i)
            why = why->next;
        note_in_call(o, k, i, st, why);
        if (o->tier == KVF_TIER_REMOTE) {
            count_remote(c, o, st);
            continue;
        }
        if (o->kind == OPK_REMOVE) {
            if (st != KVF_OK)
                KVF_LOG(KVF_LOG_WARN, "cache: block " KVF_KEY_FMT ": file not removed: %s",
                        KVF_KEY_ARGS(o->keys[i]), kvf_last_error());
            continue;
        }
        apply_move(c, o, i, st, why, from_file ? &stale : NULL);
    }
    if (stale.n)
        kvf__cache_background_push(c, kvf__cache_op_submit(c, OPK_REMOVE, KVF_TIER_DISK, &stale));
    kvf__cache_pending_free(&stale);
}
