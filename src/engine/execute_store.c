/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunks of moves between slots (primary; secondary for demote and
 * promote) and the remote tier's store.
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

/* The remote tier's store, opened (connected) first when needed. The
 * store lives as long as the engine once opened. */
kvf_status kvf__remote_handle(kvf_engine *e, kvf__store **s_p)
{
    if (!e->remote_url)
        return kvf__fail(KVF_ERR_INVALID, "engine: no remote tier");
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
                e->remote_url,       e->file_namespace,        e->dir.fingerprint,
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

/* The remote key a move of a remote batch writes or reads. */
static uint64_t remote_key(const batch *b, size_t i)
{
    return tier_keyed(kind_writes(b->kind)) ? b->moves[i].dst : b->moves[i].src;
}

/* Checks one block fetched from a remote store against the engine (its
 * pools, tokens and bytes) and appends its scatter copies at cp. */
static kvf_status remote_fetched(kvf_engine *e, const batch *b, const kvf__store_block *blk,
                                 const kvf_move *mv, kvf__copy *cp)
{
    uint32_t tokens = eff_tokens(e, mv->tokens);
    unsigned long long key = (unsigned long long)mv->src;
    if (blk->pools != e->npools)
        return kvf__fail(KVF_ERR_MISMATCH,
                         "block 0x%llx: stored remotely with %u pools, engine has %u", key,
                         blk->pools, e->npools);
    if (blk->tokens < tokens)
        return kvf__fail(KVF_ERR_RANGE, "block 0x%llx: holds %u tokens, %u asked", key, blk->tokens,
                         tokens);
    size_t bytes = kvf__file_copies(e, b->kind, mv, blk->buf, tokens, blk->tokens, cp);
    if (bytes != blk->payload_bytes)
        return kvf__fail(KVF_ERR_MISMATCH,
                         "block 0x%llx: %zu payload bytes stored remotely, %zu expected", key,
                         blk->payload_bytes, bytes);
    return KVF_OK;
}

/* Copies between slots and a chunk's staging: host memory on both sides
 * for secondary slots (demote, promote), the backend's otherwise. */
static kvf_status remote_copy(const kvf_engine *e, const batch *b, kvf__copy *cp, size_t n)
{
    n = kvf__sel_compact(e, b, cp, n);
    return kind_uses_secondary(b->kind) ? kvf__host_copy(cp, n)
                                        : e->backend->ops->copy_sync(e->backend, b->queue, cp, n);
}

/* Gathers the blocks of an offload or demote into staging (blk[j].buf) and stores
 * them. */
static kvf_status remote_store_blocks(worker *w, batch *b, const size_t *idx, size_t m,
                                      kvf__store *s, kvf__store_block *blk, kvf__copy *cp,
                                      uint64_t deadline_ns)
{
    kvf_engine *e = w->engine;
    for (size_t j = 0; j < m; j++) {
        const kvf_move *mv = &b->moves[idx[j]];
        uint32_t tokens = eff_tokens(e, mv->tokens);
        uint8_t *payload = w->rstaging + j * e->all_block_bytes;
        size_t bytes =
            kvf__file_copies(e, b->kind, mv, payload, tokens, tokens, cp + j * e->npools);
        blk[j] = (kvf__store_block){.key = mv->dst,
                                    .tokens = tokens,
                                    .pools = e->npools,
                                    .buf = payload,
                                    .payload_bytes = bytes};
    }
    kvf_status st = remote_copy(e, b, cp, m * e->npools);
    if (st == KVF_OK)
        return s->ops->write(s, blk, m, deadline_ns);
    kvf_status ret = kvf__fail(st, "gathering the blocks: %s", kvf_last_error());
    for (size_t j = 0; j < m; j++)
        blk[j].status = st;
    return ret;
}

/* Fetches the blocks of an onboard or promote into staging, checks them and scatters
 * them into their slots. A block refused here is failed at once
 * (noted[j]); *why_p keeps the first failure's detail. */
static kvf_status remote_fetch_blocks(worker *w, batch *b, const size_t *idx, size_t m,
                                      kvf__store *s, kvf__store_block *blk, kvf__copy *cp,
                                      uint64_t deadline_ns, bool *noted, char *why, size_t why_cap)
{
    kvf_engine *e = w->engine;
    for (size_t j = 0; j < m; j++)
        blk[j] = (kvf__store_block){.key = b->moves[idx[j]].src,
                                    .buf = w->rstaging + j * e->all_block_bytes,
                                    .cap = e->all_block_bytes};
    kvf_status ret = s->ops->read(s, blk, m, deadline_ns);
    if (ret != KVF_OK)
        snprintf(why, why_cap, "%s", kvf_last_error());
    size_t ncp = 0;
    for (size_t j = 0; j < m; j++) {
        if (blk[j].status != KVF_OK)
            continue;
        kvf_status st = remote_fetched(e, b, &blk[j], &b->moves[idx[j]], cp + ncp);
        if (st == KVF_OK) {
            ncp += e->npools;
            continue;
        }
        blk[j].status = st;
        KVF_LOG(KVF_LOG_WARN, "%s: %s", op_name(b->kind), kvf_last_error());
        kvf__move_failed(b, idx[j], st, "%s: %s", op_name(b->kind), kvf_last_error());
        noted[j] = true;
    }
    kvf_status st = ncp ? remote_copy(e, b, cp, ncp) : KVF_OK;
    if (st != KVF_OK) {
        ret = kvf__fail(st, "scattering the blocks: %s", kvf_last_error());
        snprintf(why, why_cap, "%s", kvf_last_error());
        for (size_t j = 0; j < m; j++)
            if (blk[j].status == KVF_OK) {
                blk[j].status = st;
                blk[j].msg[0] = '\0';
            }
    }
    return ret;
}

/* Fails every block of a chunk that could not start (no store, no
 * staging). */
static void remote_chunk_failed(batch *b, const size_t *idx, size_t m, kvf_status st)
{
    char why[KVF_MOVE_ERROR_MESSAGE];
    KVF_LOG(KVF_LOG_WARN, "%s: %zu blocks: %s", op_name(b->kind), m, kvf_last_error());
    snprintf(why, sizeof why, "%s", kvf_last_error());
    for (size_t j = 0; j < m; j++)
        kvf__move_failed(b, idx[j], st, "%s: remote block 0x%llx: %s", op_name(b->kind),
                         (unsigned long long)remote_key(b, idx[j]), why);
}

/* Runs moves [first, last) of a remote batch as one batch call of the
 * remote store: the blocks are gathered into staging and stored, or
 * fetched into staging, checked and scattered to their slots, all by
 * `deadline_ns` (see remote_deadline). Statuses go to b->status. */
static void run_remote_chunk(worker *w, batch *b, size_t first, size_t last, uint64_t deadline_ns)
{
    kvf_engine *e = w->engine;
    size_t m = 0;
    size_t idx[REMOTE_CHUNK_MOVES];
    for (size_t i = first; i < last; i++)
        if (b->status[i] == KVF_INPROGRESS)
            idx[m++] = i;
    if (m == 0)
        return;
    kvf__store *s = NULL;
    kvf_status st = kvf__remote_handle(e, &s);
    if (st == KVF_OK && !kind_removes(b->kind))
        st = kvf__staging_grow(e, &w->rstaging, &w->rstaging_bytes, m * e->all_block_bytes);
    kvf__copy *cp = st == KVF_OK ? malloc(m * e->npools * sizeof *cp) : NULL;
    kvf__store_block *blk = cp ? malloc(m * sizeof *blk) : NULL;
    if (st == KVF_OK && !blk)
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", op_name(b->kind));
    if (st != KVF_OK) {
        remote_chunk_failed(b, idx, m, st);
        free(cp);
        return;
    }
    /* the detail of the call's first failed block (a store may name no
     * other): every failed block's message quotes it */
    char first_why[KVF_MOVE_ERROR_MESSAGE] = "";
    bool noted[REMOTE_CHUNK_MOVES] = {false};
    kvf_status ret;
    if (kind_removes(b->kind)) {
        for (size_t j = 0; j < m; j++)
            blk[j] = (kvf__store_block){.key = b->moves[idx[j]].src};
        ret = s->ops->remove(s, blk, m, deadline_ns);
    } else if (tier_keyed(kind_writes(b->kind))) {
        ret = remote_store_blocks(w, b, idx, m, s, blk, cp, deadline_ns);
    } else {
        ret = remote_fetch_blocks(w, b, idx, m, s, blk, cp, deadline_ns, noted, first_why,
                                  sizeof first_why);
    }
    if (ret != KVF_OK && !first_why[0])
        snprintf(first_why, sizeof first_why, "%s", kvf_last_error());
    if (ret != KVF_OK) /* names the first failed block's key and node */
        KVF_LOG(KVF_LOG_WARN, "%s: %zu blocks: %s", op_name(b->kind), m, first_why);
    /* a store names each failed block itself, or only the call's first
     * failure: the others then quote it */
    kvf__store_name_failures(s, blk, m, first_why);
    for (size_t j = 0; j < m; j++)
        if (blk[j].status != KVF_OK && !noted[j])
            kvf__move_failed(b, idx[j], blk[j].status, "%s: %s", op_name(b->kind), blk[j].msg);
    free(blk);
    free(cp);
}

/* Blocks of one round trip: REMOTE_CHUNK_BYTES, at most REMOTE_CHUNK_MOVES. */
static size_t remote_chunk_moves(const kvf_engine *e)
{
    size_t per = e->all_block_bytes ? REMOTE_CHUNK_BYTES / e->all_block_bytes : 1;
    return per < 1 ? 1 : per > REMOTE_CHUNK_MOVES ? REMOTE_CHUNK_MOVES : per;
}

const tier_ops kvf__remote_tier_ops = {run_remote_chunk, remote_chunk_moves, remote_deadline, NULL};
