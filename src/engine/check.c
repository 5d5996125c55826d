/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Checks of a batch's moves before it is queued: ranges, collisions,
 * hazards.
 */
#include "engine_private.h"

/* ---- submission ----------------------------------------------------------- */

static int cmp_key(const void *a, const void *b)
{
    return kvf_key_cmp(*(const kvf_key *)a, *(const kvf_key *)b);
}

/* A batch may not write one destination twice, nor (kvf_copy) read a slot
 * that it also writes: the order inside a batch is not defined. File and
 * remote keys are sorted here; slots are stamped in kvf__check_moves. */
static kvf_status check_key_collisions(const kvf_move *moves, size_t n)
{
    kvf_key *v = malloc(n * sizeof *v);
    if (!v)
        return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory");
    for (size_t i = 0; i < n; i++)
        v[i] = moves[i].key;
    qsort(v, n, sizeof *v, cmp_key);
    kvf_status st = KVF_OK;
    for (size_t i = 1; i < n && st == KVF_OK; i++)
        if (kvf_key_eq(v[i], v[i - 1]))
            st = kvf__fail(KVF_ERR_INVALID,
                           "batch: two moves write block " KVF_KEY_FMT "; a batch writes each "
                           "destination once",
                           KVF_KEY_ARGS(v[i]));
    free(v);
    return st;
}

static kvf_status check_move(kvf_engine *e, op_kind kind, size_t i, const kvf_move *mv)
{
    kvf_tier rs = kind_reads(kind);
    kvf_tier ws = kind_writes(kind);
    const uint64_t idx[2] = {mv->src, mv->dst};
    const kvf_tier sp[2] = {rs, ws};
    bool keyed = tier_keyed(rs) || tier_keyed(ws);
    /* a block key has a member of its own: a slot where the key belongs,
     * or a key beside two slots, is a caller who mixed them up */
    if (keyed && kvf_key_is_root(mv->key))
        return kvf__fail(KVF_ERR_INVALID,
                         "move %zu: no block key (.key is KVF_KEY_ROOT): a move to or from the "
                         "%s tier names its block by .key",
                         i, kvf_tier_name(tier_keyed(rs) ? rs : ws));
    if (!keyed && !kvf_key_is_root(mv->key))
        return kvf__fail(KVF_ERR_INVALID,
                         "move %zu: block key " KVF_KEY_FMT " given to a move between slots, "
                         "which takes src and dst only",
                         i, KVF_KEY_ARGS(mv->key));
    for (int k = 0; k < 2; k++) {
        if (tier_keyed(sp[k]) && idx[k] != 0)
            return kvf__fail(KVF_ERR_INVALID,
                             "move %zu: %s is %llu, but the %s side names its block by .key "
                             "(block " KVF_KEY_FMT "): %s must be 0",
                             i, k ? "dst" : "src", (unsigned long long)idx[k], kvf_tier_name(sp[k]),
                             KVF_KEY_ARGS(mv->key), k ? "dst" : "src");
        if (sp[k] == KVF_TIER_GPU && idx[k] >= e->primary_slots)
            return kvf__fail(KVF_ERR_RANGE,
                             "move %zu: primary slot %llu out of range (%u slots in every pool)", i,
                             (unsigned long long)idx[k], e->primary_slots);
        if (sp[k] == KVF_TIER_HOST && idx[k] >= e->secondary_slots)
            return kvf__fail(KVF_ERR_RANGE,
                             "move %zu: secondary slot %llu out of range (%u slots in every "
                             "pool)",
                             i, (unsigned long long)idx[k], e->secondary_slots);
    }
    /* every pool has the same tokens_per_block (kvf_engine_add_pool): more
     * than a block holds is a caller's mistake, not "the whole block" */
    uint32_t tpb = e->pools[0].g.tokens_per_block;
    if (mv->tokens > tpb)
        return kvf__fail(KVF_ERR_RANGE,
                         "move %zu: %u tokens, more than pool 0's tokens_per_block (%u, shared "
                         "by every pool)",
                         i, mv->tokens, tpb);
    /* the geometry was checked when the pool was added: a token count can
     * only fail by cutting a 4-bit row inside a byte */
    if (mv->tokens != 0 && mv->tokens < tpb) {
        for (uint32_t p = 0; p < e->npools; p++) {
            const pool *pl = &e->pools[p];
            if (mv->tokens * pl->token_bits % 8 != 0)
                return kvf__fail(KVF_ERR_UNSUPPORTED,
                                 "move %zu: pool %u: the first %u tokens of a row are not whole "
                                 "bytes of %s",
                                 i, p, mv->tokens, kvf_dtype_name(pl->g.dtype));
        }
    }
    return KVF_OK;
}

/* Every check of a batch's moves in one pass (the first part of a large
 * batch waits for all of them): each move's slots and token count
 * (check_move); collisions between its slots, by stamps in a compact
 * array per space (the hazard entries are larger and scattered): the
 * batch's stamp times two, plus one for a write; a read of a secondary
 * slot holding fewer tokens than asked, or none, which fails that move
 * (kvferry does not hand back bytes it never stored; files carry their
 * token count in the header); and, with `cnt`, the moves per secondary
 * slot for kvf__sort_parts. Sets status[i], and *failed_p to the number of
 * moves failed that way. Needs submit_mu only: what it reads and stamps
 * is fixed once frozen or written only by a kvf__submit. */
kvf_status kvf__check_moves(kvf_engine *e, op_kind kind, const kvf_move *moves, size_t n, batch *b,
                            uint32_t *cnt, size_t *failed_p)
{
    kvf_status *status = b->status;
    kvf_tier ws = kind_writes(kind);
    bool keyed_write = tier_keyed(ws);
    bool reads_secondary = kind_reads(kind) == KVF_TIER_HOST;
    bool off = kind_is(kind, OP_OFFLOAD, KVF_TIER_HOST);
    uint64_t stamp = ++e->check_epoch;
    uint64_t *wm = ws == KVF_TIER_GPU ? e->mark_primary : e->mark_secondary;
    size_t short_reads = 0;
    uint64_t wslots = ws == KVF_TIER_GPU ? e->primary_slots : e->secondary_slots;
    /* an offload's counts are per destination: a second move writing one
     * shows there, and its stamps are not needed */
    bool stamps = !keyed_write && !(cnt && off);
    for (size_t i = 0; i < n; i++) {
        const kvf_move *mv = &moves[i];
        kvf_status st = check_move(e, kind, i, mv);
        if (st != KVF_OK)
            return st;
        status[i] = KVF_INPROGRESS;
        b->tokens_total += eff_tokens(e, mv->tokens);
        if (cnt && cnt[(off ? mv->dst : mv->src) + 1]++ && off)
            return kvf__fail(KVF_ERR_INVALID,
                             "batch: move %zu writes secondary slot %llu, which another move of "
                             "the batch reads or writes",
                             i, (unsigned long long)mv->dst);
        if (reads_secondary) {
            uint32_t have = e->sec[mv->src].tokens, want = eff_tokens(e, mv->tokens);
            if (have == 0 || sec_unwritten(e, b, mv->src) != UINT32_MAX) {
                status[i] = KVF_ERR_NOT_FOUND;
                short_reads++;
            } else if (have < want) {
                status[i] = KVF_ERR_RANGE;
                short_reads++;
            }
        }
        if (i + PREFETCH_AHEAD < n) {
            /* the scattered entries of a move ahead (a slot past the end
             * is refused before anything of it is read) */
            const kvf_move *ah = &moves[i + PREFETCH_AHEAD];
            uint64_t sec = off ? ah->dst : ah->src;
            if (cnt)
                __builtin_prefetch(&cnt[sec < e->secondary_slots ? sec : 0], 1);
            if (reads_secondary)
                __builtin_prefetch(&e->sec[ah->src < e->secondary_slots ? ah->src : 0].tokens);
            if (stamps)
                __builtin_prefetch(&wm[ah->dst < wslots ? ah->dst : 0], 1);
        }
        if (!stamps)
            continue;
        uint64_t *w = &wm[mv->dst];
        if (*w >> 1 == stamp)
            return kvf__fail(KVF_ERR_INVALID,
                             "batch: move %zu writes %s slot %llu, which another move of the "
                             "batch reads or writes",
                             i, ws == KVF_TIER_GPU ? "primary" : "secondary",
                             (unsigned long long)mv->dst);
        *w = stamp << 1 | 1u;
        if (kind.dir == OP_COPY) {
            uint64_t *r = &e->mark_primary[mv->src];
            if (*r == (stamp << 1 | 1u))
                return kvf__fail(KVF_ERR_INVALID,
                                 "batch: move %zu reads primary slot %llu, which the batch "
                                 "also writes",
                                 i, (unsigned long long)mv->src);
            *r = stamp << 1;
        }
    }
    kvf_status st = keyed_write ? check_key_collisions(moves, n) : KVF_OK;
    *failed_p = short_reads;
    for (size_t i = 0; i < n && short_reads && st == KVF_OK; i++) {
        if (status[i] == KVF_INPROGRESS)
            continue;
        short_reads--;
        char msg[160];
        uint32_t p = status[i] == KVF_ERR_NOT_FOUND ? sec_unwritten(e, b, moves[i].src) : 0;
        if (status[i] == KVF_ERR_NOT_FOUND && e->sec[moves[i].src].pools == 0)
            snprintf(msg, sizeof msg, "%s: secondary slot %llu holds no block", op_name(kind),
                     (unsigned long long)moves[i].src);
        else if (status[i] == KVF_ERR_NOT_FOUND)
            snprintf(msg, sizeof msg,
                     "%s: secondary slot %llu: pool %u was never written (%u of %u pools were): "
                     "no whole block",
                     op_name(kind), (unsigned long long)moves[i].src, p, e->sec[moves[i].src].pools,
                     e->npools);
        else
            snprintf(msg, sizeof msg, "%s: secondary slot %llu holds %u tokens, %u asked",
                     op_name(kind), (unsigned long long)moves[i].src, e->sec[moves[i].src].tokens,
                     eff_tokens(e, moves[i].tokens));
        KVF_LOG(KVF_LOG_WARN, "%s", msg);
        kvf__move_failed(b, i, status[i], "%s", msg);
    }
    return st;
}
