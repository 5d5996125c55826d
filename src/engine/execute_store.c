/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunks of moves between slots (primary; secondary for demote and
 * promote) and a keyed tier's store, run the same way for every store:
 * each block gathered from its slots into the worker's staging and
 * written, or read into staging, checked and scattered into its slots,
 * through the store's batch calls and their hooks (kvf__store_hooks), so
 * that the copies overlap the store's I/O where it moves blocks one by
 * one. The store owns everything about its medium: for files O_DIRECT,
 * io_uring, GPUDirect Storage images, fsync, torn and lost files; for a
 * server its nodes and round trips. Also the remote tier's part: its
 * store, opened on first use, its chunks and deadline.
 */
#include "engine_private.h"

/* A remote batch's deadline allows its bytes at this rate on top of the
 * timeout: far below what a Redis node moves, so only a stalled or
 * trickling node reaches it, yet a batch of many blocks is not failed
 * for its size alone. */
#define REMOTE_FLOOR_BYTES_PER_S ((uint64_t)256 << 20)

/* The deadline of remote batch b, fixed when its first chunk is claimed
 * (the caller holds e->mu): every chunk, on whichever worker, ends by
 * then, so the batch takes the timeout plus its bytes at the floor rate,
 * however many chunks it has. A group's parts share the group's. */
static uint64_t remote_deadline(const kvf_engine *e, batch *b)
{
    batch *root = b->group ? b->group : b;
    if (!root->remote_deadline_ns) {
        uint64_t timeout_ms =
            e->cfg.remote.timeout_ms ? e->cfg.remote.timeout_ms : REMOTE_DEFAULT_TIMEOUT_MS;
        uint64_t bytes = kind_removes(b->kind) ? 0 : (uint64_t)root->n * e->all_block_bytes;
        root->remote_deadline_ns =
            kvf__now_ns() + timeout_ms * 1000000u + bytes / REMOTE_FLOOR_BYTES_PER_S * 1000000000u +
            bytes % REMOTE_FLOOR_BYTES_PER_S * 1000000000u / REMOTE_FLOOR_BYTES_PER_S;
    }
    return root->remote_deadline_ns;
}

/* The remote tier's store, opened (connected) first when needed (NULL
 * without a remote tier). The store lives as long as the engine once
 * opened. */
kvf_status kvf__remote_handle(kvf_engine *e, kvf__store **s_p)
{
    *s_p = NULL;
    if (!e->remote_url)
        return KVF_OK;
    pthread_mutex_lock(&e->remote_mu);
    kvf_status st = KVF_OK;
    if (!e->remote) {
        uint64_t now = kvf__now_ns();
        if (now < e->remote_retry_ns) {
            st = kvf__fail(KVF_ERR_REMOTE,
                           "remote tier: not connected (the last attempt, less than a second "
                           "ago: %s)",
                           e->remote_why);
        } else {
            kvf__store_config sc = {
                e->remote_url,       e->file_namespace,        e->fingerprint,
                e->cfg.remote.ttl_s, e->cfg.remote.timeout_ms, e->cfg.remote_mem_bytes};
            st = kvf__store_open(&sc, &e->remote);
            if (st != KVF_OK) {
                e->remote = NULL;
                e->remote_retry_ns = now + 1000000000u;
                snprintf(e->remote_why, sizeof e->remote_why, "%s", kvf_last_error());
                KVF_LOG(KVF_LOG_WARN, "remote tier: %s", kvf_last_error());
            }
        }
    }
    *s_p = e->remote;
    pthread_mutex_unlock(&e->remote_mu);
    return st;
}

/* The key a move of a keyed batch writes or reads. */
static kvf_key move_key(const batch *b, size_t i)
{
    return b->moves[i].key;
}

/* A chunk as the store's hooks see it: block j of the call moves
 * b->moves[idx[j]], its copies at cp[j * npools]. */
typedef struct chunk {
    worker *w;
    batch *b;
    const kvf__store *s;
    const size_t *idx;
    kvf__store_block *blk;
    kvf__copy *cp;
    uint32_t *pool_bytes;
    size_t first, last;     /* the chunk's moves of the batch */
    _Atomic uint32_t parts; /* blocks' pool groups handed over by the store (chunk_part) */
} chunk;

static const kvf_move *chunk_move(const chunk *c, const kvf__store_block *blk)
{
    return &c->b->moves[c->idx[blk - c->blk]];
}

/* The hook before a write: blocks[0..n) gathered from their slots. */
static kvf_status chunk_gather(void *arg, kvf__store_block *blocks, size_t n)
{
    chunk *c = arg;
    kvf_engine *e = c->w->engine;
    size_t j0 = (size_t)(blocks - c->blk);
    for (size_t j = 0; j < n; j++) {
        const kvf_move *mv = chunk_move(c, &blocks[j]);
        uint32_t tokens = eff_tokens(e, mv->tokens);
        blocks[j].tokens = tokens;
        blocks[j].pools = e->npools;
        blocks[j].payload_bytes =
            kvf__file_copies(e, c->b->kind, mv, blocks[j].buf, tokens, tokens,
                             c->cp + (j0 + j) * e->npools, c->pool_bytes + (j0 + j) * e->npools);
        blocks[j].pool_bytes = c->pool_bytes + (j0 + j) * e->npools;
    }
    kvf_status st = kvf__staging_copy(c->w, c->b, c->cp + j0 * e->npools, n * e->npools);
    if (st == KVF_OK)
        return KVF_OK;
    /* the store names the block */
    if (n == 1)
        return kvf__fail(st, "gathering slot %llu: %s",
                         (unsigned long long)chunk_move(c, blocks)->src, kvf_last_error());
    return kvf__fail(st, "gathering %zu blocks from their slots: %s", n, kvf_last_error());
}

/* Checks one block read against the engine (its pools, tokens and bytes)
 * and makes its scatter copies at cp. */
static kvf_status chunk_check(const chunk *c, const kvf__store_block *blk, const kvf_move *mv,
                              kvf__copy *cp)
{
    kvf_engine *e = c->w->engine;
    uint32_t tokens = eff_tokens(e, mv->tokens);
    char key[KVF_KEY_STR_BYTES];
    kvf_key_format(mv->key, key);
    const char *noun = c->s->noun;
    if (blk->pools != e->npools)
        return kvf__fail(KVF_ERR_MISMATCH, "%s %s: stored with %u pools, engine has %u", noun, key,
                         blk->pools, e->npools);
    if (blk->tokens < tokens)
        return kvf__fail(KVF_ERR_RANGE, "%s %s: holds %u tokens, %u asked", noun, key, blk->tokens,
                         tokens);
    if (kvf__file_copies(e, c->b->kind, mv, blk->buf, tokens, blk->tokens, cp, NULL) !=
        blk->payload_bytes)
        return kvf__fail(KVF_ERR_MISMATCH,
                         "%s %s: %zu payload bytes stored, not what %u tokens take", noun, key,
                         blk->payload_bytes, blk->tokens);
    return KVF_OK;
}

/* A block read group by group is handed over a group at a time, each
 * group's pools checked against the pool table: that covers the bytes
 * this engine scatters only where the table splits the payload as this
 * engine's pools do. A table written by this engine's layout does; one
 * kvf_dir_upgrade wrote for a format that did not record the split
 * (evenly) may not. Such a block is not handed over in groups: the move
 * fails with KVF_ERR_UNSUPPORTED, which says nothing against the block
 * (it stays stored, and a whole read, which checks every pool, takes
 * it). */
static kvf_status chunk_table_check(const chunk *c, const kvf__store_block *blk, const kvf_move *mv)
{
    kvf_engine *e = c->w->engine;
    for (uint32_t p = 0; blk->table && p < e->npools; p++) {
        kvf_region stored = kvf__pool_region(&e->pools[p], blk->tokens);
        size_t want = kvf__region_bytes(&stored);
        kvf__block_span sp = kvf__block_prefix_span(blk->table, p);
        if (sp.bytes != want)
            return kvf__fail(KVF_ERR_UNSUPPORTED,
                             "%s " KVF_KEY_FMT ": its pool table gives pool %u %llu bytes, this "
                             "engine's pool holds %zu: the table does not split the payload by "
                             "these pools (a block kvf_dir_upgrade rewrote from an older format), "
                             "so it is not read layer by layer; a whole read takes it",
                             c->s->noun, KVF_KEY_ARGS(mv->key), p, (unsigned long long)sp.bytes,
                             want);
    }
    return KVF_OK;
}

/* Fails the move of a block that failed now, at once (a later group's
 * waiters are to see it before the chunk ends); chunk_failures passes it
 * over. */
static void fail_now(chunk *c, const kvf__store_block *blk)
{
    size_t i = c->idx[blk - c->blk];
    if (c->b->status[i] == KVF_INPROGRESS)
        kvf__move_failed(c->b, i, blk->status, "%s: %s", op_name(c->b->kind), blk->msg);
}

/* The hook after pool group g of a read, for blocks[0..n) (one at a
 * time from the file store, on its I/O threads; every block of the call
 * at once from a remote store): the
 * blocks that read well have that group checked; their selected pools of
 * it are scattered into their slots (after group 0 each block is checked
 * against the engine first), blocks failed now fail their moves, and the
 * group is counted in for their moves. */
static void chunk_part(void *arg, kvf__store_block *blocks, size_t n, uint32_t g)
{
    chunk *c = arg;
    kvf_engine *e = c->w->engine;
    const arrival_groups *a = kvf__arrival_of(e, c->b->kind.tier);
    uint32_t first = g ? a->end[g - 1] : 0, last = a->end[g];
    if (g + 1 == a->n)
        last = e->npools;
    /* one block's group from the file store (the common case) fits on
     * the stack: no allocation per block per group on the I/O threads */
    kvf__copy local[64];
    size_t need = (n ? n : 1) * (last - first);
    kvf__copy *cp = need <= sizeof local / sizeof local[0] ? local : malloc(need * sizeof *cp);
    size_t ncp = 0;
    for (size_t j = 0; j < n; j++) {
        /* a block refused in an earlier group (its move failed then) has
         * no copies to make, whatever the store says of this group */
        if (g > 0 && blocks[j].status == KVF_OK &&
            c->b->status[c->idx[&blocks[j] - c->blk]] != KVF_INPROGRESS)
            kvf__store_block_fail(&blocks[j], c->b->status[c->idx[&blocks[j] - c->blk]],
                                  "refused in an earlier pool group");
        if (blocks[j].status != KVF_OK)
            continue;
        kvf__copy *all = c->cp + (size_t)(&blocks[j] - c->blk) * e->npools;
        kvf_status st =
            g == 0 ? chunk_check(c, &blocks[j], chunk_move(c, &blocks[j]), all) : KVF_OK;
        if (st == KVF_OK && g == 0)
            st = chunk_table_check(c, &blocks[j], chunk_move(c, &blocks[j]));
        if (st == KVF_OK && !cp)
            st = kvf__fail(KVF_ERR_NOMEM, "out of memory for a pool group's copies");
        if (st != KVF_OK) {
            kvf__store_block_fail(&blocks[j], st, "%s", kvf_last_error());
            continue;
        }
        for (uint32_t p = first; p < last; p++)
            if (sel_has(c->b, p))
                cp[ncp++] = all[p];
    }
    kvf_status st = ncp ? kvf__staging_copy_run(c->w, c->b, cp, ncp) : KVF_OK;
    if (cp != local)
        free(cp);
    if (st != KVF_OK) {
        char why[KVF_MOVE_ERROR_MESSAGE];
        snprintf(why, sizeof why, "%s", kvf_last_error());
        for (size_t j = 0; j < n; j++)
            if (blocks[j].status == KVF_OK) {
                const kvf_move *mv = chunk_move(c, &blocks[j]);
                kvf__store_block_fail(
                    &blocks[j], st,
                    "%s " KVF_KEY_FMT ": scattering pools %u..%u into slot %llu: %s", c->s->noun,
                    KVF_KEY_ARGS(mv->key), first, last - 1, (unsigned long long)mv->dst, why);
            }
    }
    for (size_t j = 0; j < n; j++)
        if (blocks[j].status != KVF_OK)
            fail_now(c, &blocks[j]);
    atomic_fetch_add(&c->parts, 1);
    kvf__arrival_mark(e, c->b, g, n);
}

/* The hook after a read: blocks[0..n) that read well checked and
 * scattered into their slots; one refused fails here. Where the store
 * handed every pool group over (chunk_part), there is nothing left. */
static void chunk_scatter(void *arg, kvf__store_block *blocks, size_t n)
{
    chunk *c = arg;
    kvf_engine *e = c->w->engine;
    if (c->parts)
        return;
    kvf__copy *cp = c->cp + (size_t)(blocks - c->blk) * e->npools;
    size_t ncp = 0;
    for (size_t j = 0; j < n; j++) {
        if (blocks[j].status != KVF_OK)
            continue;
        kvf_status st = chunk_check(c, &blocks[j], chunk_move(c, &blocks[j]), cp + ncp);
        if (st == KVF_OK)
            ncp += e->npools;
        else
            kvf__store_block_fail(&blocks[j], st, "%s", kvf_last_error());
    }
    kvf_status st = ncp ? kvf__staging_copy(c->w, c->b, cp, ncp) : KVF_OK;
    if (st == KVF_OK)
        return;
    char why[KVF_MOVE_ERROR_MESSAGE];
    snprintf(why, sizeof why, "%s", kvf_last_error());
    for (size_t j = 0; j < n; j++)
        if (blocks[j].status == KVF_OK) {
            const kvf_move *mv = chunk_move(c, &blocks[j]);
            kvf__store_block_fail(&blocks[j], st,
                                  "%s " KVF_KEY_FMT ": scattering into slot %llu: %s", c->s->noun,
                                  KVF_KEY_ARGS(mv->key), (unsigned long long)mv->dst, why);
        }
}

/* Sets hooks h to take pool groups where batch b is a layer-wise onboard
 * (its pools arrive group by group: arrival.c). */
static void root_sel_groups(const kvf_engine *e, const batch *b, kvf__store_hooks *h)
{
    if (!kvf__arrival_grouped(e, b))
        return;
    const arrival_groups *a = kvf__arrival_of(e, b->kind.tier);
    h->part = chunk_part;
    h->group_end = a->end;
    h->n_groups = a->n;
    h->first_bytes = a->first_bytes;
}

/* After a write of a move failed, here or before its chunk: the store
 * removes what it left (kvf__store_ops.discard). */
static void discard_failed(kvf__store *s, const batch *b, size_t first, size_t last)
{
    if (!s || !s->ops->discard || !tier_keyed(kind_writes(b->kind)) || kind_removes(b->kind))
        return;
    for (size_t i = first; i < last; i++)
        if (b->status[i] != KVF_INPROGRESS && b->status[i] != KVF_OK) {
            bool emptied;
            s->ops->discard(s, b->moves[i].key, &emptied);
        }
}

/* Fails the moves of a chunk still in progress that could not start (no
 * store, no staging), as kvf_last_error() says. */
static void chunk_refused(batch *b, size_t first, size_t last, kvf_status st)
{
    char why[KVF_MOVE_ERROR_MESSAGE];
    KVF_LOG(KVF_LOG_WARN, "%s: %zu blocks: %s", op_name(b->kind), last - first, kvf_last_error());
    snprintf(why, sizeof why, "%s", kvf_last_error());
    for (size_t i = first; i < last; i++)
        if (b->status[i] == KVF_INPROGRESS)
            kvf__move_failed(b, i, st, "%s: %s " KVF_KEY_FMT ": %s", op_name(b->kind),
                             kvf__tiers[b->kind.tier].place, KVF_KEY_ARGS(move_key(b, i)), why);
}

/* Fails the moves whose blocks failed, with the store's message, and
 * logs the chunk's failures once: a block not stored is no failure of the
 * store's. */
static void chunk_failures(batch *b, const size_t *idx, const kvf__store_block *blk, size_t m)
{
    size_t failed = 0, first = m;
    for (size_t j = 0; j < m; j++) {
        if (blk[j].status == KVF_OK)
            continue;
        if (b->status[idx[j]] == KVF_INPROGRESS) /* else failed already (fail_now) */
            kvf__move_failed(b, idx[j], blk[j].status, "%s: %s", op_name(b->kind), blk[j].msg);
        if (blk[j].status != KVF_ERR_NOT_FOUND && failed++ == 0)
            first = j;
    }
    if (failed)
        KVF_LOG(KVF_LOG_WARN, "%s: %zu of %zu blocks failed, the first: %s", op_name(b->kind),
                failed, m, blk[first].msg);
}

/* Sets up the chunk's blocks: keys, and for moves of blocks their images
 * in staging. */
static void chunk_blocks(worker *w, batch *b, const size_t *idx, size_t m, bool dev)
{
    kvf_engine *e = w->engine;
    bool images = !kind_removes(b->kind);
    size_t room = kvf__staging_slot_bytes(e) - kvf__staging_prefix_bytes(e);
    for (size_t j = 0; j < m; j++) {
        w->blocks[j] = (kvf__store_block){.key = move_key(b, idx[j])};
        if (!images)
            continue;
        w->blocks[j].pools = e->npools; /* the prefix's room is for these */
        w->blocks[j].buf = kvf__staging_payload(w, j, dev);
        w->blocks[j].cap = room;
        w->blocks[j].staged = true;
        w->blocks[j].img = dev ? kvf__gds_image_ops() : NULL;
        w->blocks[j].img_arg = dev ? w->gstaging : NULL;
    }
}

void kvf__run_store_chunk(worker *w, batch *b, size_t first, size_t last, uint64_t deadline_ns)
{
    kvf_engine *e = w->engine;
    uint64_t t0 = kvf__now_ns();
    kvf__store *s = NULL;
    kvf_status st = kind_ops(b->kind)->store(e, &s);
    if (st == KVF_OK && !s) /* refused at submit: cannot happen */
        st = kvf__fail(KVF_ERR_INVALID, "the engine has no %s tier", kvf_tier_name(b->kind.tier));
    /* device slots go straight to a store that takes device images (the
     * file store on the GDS path); secondary slots are host memory */
    bool dev = st == KVF_OK && s->ops->device_staging && s->ops->device_staging(s) &&
               !kind_uses_secondary(b->kind);
    if (st == KVF_OK)
        st = kvf__ensure_staging(w, last - first, !kind_removes(b->kind), dev);
    size_t *idx = st == KVF_OK ? w->moves : NULL;
    size_t m = 0;
    for (size_t i = first; i < last && idx; i++)
        if (b->status[i] == KVF_INPROGRESS)
            idx[m++] = i;
    if (st != KVF_OK) {
        chunk_refused(b, first, last, st);
    } else if (m) {
        chunk_blocks(w, b, idx, m, dev);
        chunk c = {w, b, s, idx, w->blocks, w->copies, w->pool_bytes, first, last, 0};
        kvf__store_hooks h = {chunk_gather, chunk_scatter, &c, NULL, NULL, 0, 0};
        /* a layer-wise onboard from DISK or REMOTE: pool group by pool group; the
         * chunk's moves that failed before count in every group */
        root_sel_groups(e, b, &h);
        for (uint32_t g = 0; h.part && g < h.n_groups; g++)
            kvf__arrival_mark(e, b, g, (last - first) - m);
        kvf__store_block *blk = w->blocks;
        kvf_status ret = kind_removes(b->kind) ? s->ops->remove(s, blk, m, deadline_ns)
                         : tier_keyed(kind_writes(b->kind))
                             ? kvf__store_write(s, blk, m, deadline_ns, &h)
                             : kvf__store_read(s, blk, m, deadline_ns, &h);
        /* the detail of the call's first failed block (a store may name no
         * other): every failed block's message quotes it */
        char first_why[KVF_MOVE_ERROR_MESSAGE] = "";
        if (ret != KVF_OK)
            snprintf(first_why, sizeof first_why, "%s", kvf_last_error());
        kvf__store_name_failures(s, blk, m, first_why);
        chunk_failures(b, idx, blk, m);
    }
    discard_failed(s, b, first, last);
    w->store_ns += kvf__now_ns() - t0;
    w->store_chunks++;
    w->store_moves += last - first;
}

void kvf__store_batch_wrote(kvf_engine *e, batch *b)
{
    /* nothing written, nothing to commit (and a store that could not be
     * reached is not tried again for it) */
    size_t written = 0;
    while (written < b->n && b->status[written] != KVF_INPROGRESS)
        written++;
    kvf__store *s = NULL;
    if (written == b->n || kind_ops(b->kind)->store(e, &s) != KVF_OK || !s || !s->ops->commit)
        return;
    kvf_status st = s->ops->commit(s);
    if (st == KVF_OK)
        return;
    /* every move of the batch is done: their statuses are this thread's
     * to write; what the moves that failed before left is gone already */
    char why[KVF_MOVE_ERROR_MESSAGE];
    snprintf(why, sizeof why, "%s", kvf_last_error());
    for (size_t i = 0; i < b->n; i++)
        if (b->status[i] == KVF_INPROGRESS) {
            kvf__move_failed(b, i, st, "%s: %s " KVF_KEY_FMT ": %s", op_name(b->kind), s->noun,
                             KVF_KEY_ARGS(b->moves[i].key), why);
            discard_failed(s, b, i, i + 1);
        }
}

/* Blocks of one round trip: REMOTE_CHUNK_BYTES, at most REMOTE_CHUNK_MOVES. */
static size_t remote_chunk_moves(const kvf_engine *e)
{
    size_t per = e->all_block_bytes ? REMOTE_CHUNK_BYTES / e->all_block_bytes : 1;
    return per < 1 ? 1 : per > REMOTE_CHUNK_MOVES ? REMOTE_CHUNK_MOVES : per;
}

const tier_ops kvf__remote_tier_ops = {kvf__remote_handle, remote_chunk_moves, remote_deadline};
