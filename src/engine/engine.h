/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the cache needs of the engine: its pools frozen, fences, checked
 * moves, failed moves' messages, and its tiers.
 */
#ifndef KVF_ENGINE_H
#define KVF_ENGINE_H

#include "blockfile.h"
#include "status.h"
#include "store.h"

/* Fixes the engine's pools (as its first transfer would) so that its slot
 * counts are known; KVF_ERR_STATE without pools. */
KVF_INTERNAL kvf_status kvf__engine_freeze(kvf_engine *e);
/* A batch that moves nothing and completes once every write queued before
 * it into primary slots[0..n) has landed; a move whose write failed
 * completes with KVF_ERR_LOST. Orders a caller after copies it did not
 * queue itself. */
KVF_INTERNAL kvf_status kvf__engine_fence(kvf_engine *e, const uint32_t *slots, size_t n,
                                          kvf_ticket *ticket_p);
/* kvf_offload to `to` (or kvf_copy when `copy`) whose reads of primary
 * slots heed a failed earlier write into them (KVF_ERR_LOST), as reads of
 * secondary slots and files always do: for slots the cache owns, which no
 * caller writes behind the engine's back. pools, n_pools: as for
 * kvf_offload_pools (NULL, 0: every pool). */
/* kvf_stream_wait_pool that gives up with KVF_ERR_TIMEOUT (the ticket
 * untouched) once `deadline_ns` (kvf__now_ns time; 0: never) passes with
 * the pool neither arrived nor queued on the device: a late load the
 * caller stops waiting for (kvf_cache_wait_pool_by). */
KVF_INTERNAL kvf_status kvf__stream_wait_pool_by(kvf_engine *e, kvf_ticket t, uint32_t pool,
                                                 void *stream, uint64_t deadline_ns);
/* A caller's pool list (kvf_onboard_pools): each index below the engine's
 * pool count and listed once, n_pools > 0; KVF_ERR_RANGE / KVF_ERR_INVALID
 * naming the entry otherwise. Pools must all be added. */
KVF_INTERNAL kvf_status kvf__engine_pools_check(const kvf_engine *e, const char *fn,
                                                const uint32_t *pools, size_t n_pools);
KVF_INTERNAL kvf_status kvf__engine_move_checked(kvf_engine *e, kvf_tier to, bool copy,
                                                 const uint32_t *pools, size_t n_pools,
                                                 const kvf_move *moves, size_t n,
                                                 kvf_ticket *ticket_p);
/* One failed move's message (kvf_move_error), kept until its ticket
 * retires; a list of them is in index order once the batch completes. */
typedef struct kvf__move_error {
    struct kvf__move_error *next;
    size_t index;
    kvf_status status;
    /* the failure is about where the move writes (a slot whose last write
     * failed, KVF_ERR_LOST), not about what it reads: no evidence against
     * a stored block it was to read (see kvf__cache's failure rule) */
    bool about_dest;
    char message[]; /* NUL-terminated, shorter than KVF_MOVE_ERROR_MESSAGE */
} kvf__move_error;
/* A record of `message` cut to KVF_MOVE_ERROR_MESSAGE - 1 bytes; NULL when
 * out of memory. */
KVF_INTERNAL kvf__move_error *kvf__move_error_new(size_t index, kvf_status status,
                                                  const char *message);
KVF_INTERNAL void kvf__move_errors_free(kvf__move_error *list);
/* A list as a completed batch's (or cache call's) n statuses give it: in
 * index order, one record per failed status (duplicates freed, and for a
 * failure without one, "<what> <index>: <status text>"), statuses as
 * status[] says. Consumes `list`; NULL when nothing failed (or out of
 * memory: the statuses still say what failed). */
KVF_INTERNAL kvf__move_error *kvf__move_errors_sorted(kvf__move_error *list,
                                                      const kvf_status *status, size_t n,
                                                      const char *what);
/* Hands a retired ticket's list to the caller of a *_errors call: its
 * first `cap` records into out[], how many it holds into *n_p (may be
 * NULL); frees the list. */
KVF_INTERNAL void kvf__move_errors_deliver(kvf__move_error *list, kvf_move_error *out, size_t cap,
                                           size_t *n_p);
/* As kvf_wait (block) or kvf_poll, handing over the failed moves' records
 * (a record for every failed move, in index order; the caller frees them):
 * for the cache, which renumbers them into its calls' blocks. */
KVF_INTERNAL kvf_status kvf__engine_ticket_errors(kvf_engine *e, kvf_ticket t, bool block,
                                                  kvf_status *per_move, kvf__move_error **errors_p);
/* Forgets failed writes into primary slots: the cache hands them to a
 * caller who writes them whole. */
KVF_INTERNAL void kvf__engine_clear_poison(kvf_engine *e, const uint32_t *slots, size_t n);
/* Slots valid in every pool at `level` (0 before freezing, or without
 * secondary slots in every pool). */
KVF_INTERNAL uint32_t kvf__engine_slots(const kvf_engine *e, kvf_level level);
/* Bytes of one block of every pool. */
KVF_INTERNAL size_t kvf__engine_block_bytes(const kvf_engine *e);
/* Tokens of a block (every pool's), 0 before the first pool. */
KVF_INTERNAL uint32_t kvf__engine_tokens_per_block(const kvf_engine *e);
/* Whether moves between the engine's primary slots and files go through
 * cuFile (the GDS path). */
KVF_INTERNAL bool kvf__engine_gds(const kvf_engine *e);
/* The engine's block directory, or NULL without a file tier: for tests
 * that look at the files under a store's interface. Everything else asks
 * kvf__engine_store(e, KVF_TIER_DISK). */
KVF_INTERNAL kvf__blockfile_dir *kvf__engine_dir(kvf_engine *e);
/* Whether the engine has a remote tier configured (remote.url), reached or
 * not. */
KVF_INTERNAL bool kvf__engine_has_remote(const kvf_engine *e);

/* The store of a slow tier (KVF_TIER_DISK, KVF_TIER_REMOTE), for callers
 * asking what a tier holds (kvf__store_list, kvf__store_exists,
 * kvf__store_remove): NULL where the tier is not configured, or (the
 * remote tier) cannot be connected to now, kvf_last_error() saying why.
 * The engine keeps it while it lives; its moves go through the engine. */
KVF_INTERNAL kvf__store *kvf__engine_store(kvf_engine *e, kvf_tier tier);

/* The config file the engine read at create (NULL: none), for its caches. */
KVF_INTERNAL const char *kvf__engine_config_file(const kvf_engine *e);

#endif /* KVF_ENGINE_H */
