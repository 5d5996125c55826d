/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tiered cache's own header, shared by the files of src/cache/ only:
 * content keys mapped to blocks in the engine's secondary slots (host
 * tier), block files (disk tier) and primary slots (GPU tier), with
 * eviction down the tiers, pins, events and counters.
 *
 * Every copy is an engine batch, so the engine's hazard tracking orders
 * them: a get queued after a put reads what the put wrote, a victim's slot
 * is rewritten only after its demote has read it, a file is removed only
 * after the write before it. The cache therefore changes its map at once,
 * when it queues a batch, and learns of failures later, when the batch
 * completes: each queued batch is an `op` that remembers, per move, the key
 * and the placement generation it made, so a failure removes the entry it
 * was about and not a later placement of the same key.
 *
 * One mutex guards the cache. Engine calls are made with it held (the
 * engine never calls back into the cache), except blocking waits. The
 * functions below that take a kvf_cache expect its lock held unless they
 * say otherwise.
 *
 * The files, one job each, in rooms listed from the bottom up. Calls run
 * one way: a file calls its own functions and those of the files listed
 * before it, never one of a file listed after it, so the front calls
 * batching, batching calls the entries, and nothing calls back up
 * (tests/check_cache_calls.py reads this list and checks it).
 *
 * Records, which every room keeps:
 *   cache_events.c   the event ring
 *   cache_stats.c    counters, latency histogram, Prometheus text
 *   plan.c           the load-or-recompute planner's arithmetic
 * An entry's lifecycle (no moves queued):
 *   cache_entries.c  the key map, LRU lists, victims, pins, doomed entries
 *   cache_restore.c  the disk tier's blocks entered at create
 *   cache_remote.c   the remote tier's lookups
 * Batching and submission:
 *   cache_batch.c    batches being assembled (pending), submitted to the
 *                    engine as ops
 *   cache_call.c     the caller's tickets: a call's ops and per-block
 *                    statuses and messages
 *   cache_drop.c     entries dropped, their files' removal queued
 *   cache_apply.c    a completed op applied to the map
 *   cache_queue.c    ops into their call or the background, a put's rounds
 *                    (flush), background ops applied (reap)
 *   cache_evict.c    room made in a tier: its victim moved down or dropped
 * The call front, the public kvf_cache_* calls:
 *   cache_ops.c      lookup, put, get, and the checks of keys and slots
 *   cache_gpu.c      the GPU tier's slots: alloc, commit, free
 *   cache_acquire.c  acquire: hits moved into GPU-tier slots
 *   cache_pin.c      pin, unpin, remove
 *   cache_wait.c     wait and poll: a call's ops applied, the call retired
 *   cache_layers.c   a get's pools waited for one at a time
 *   cache_plan.c     the planner over the cache's lookup
 *   cache.c          create (config checks, restore) and destroy
 * Only cache_restore.c and cache_remote.c reach below the engine (its file
 * directory, its remote connection).
 */
#ifndef KVF_CACHE_PRIVATE_H
#define KVF_CACHE_PRIVATE_H

#include "config.h"
#include "engine.h"
#include "keymap.h"
#include "log.h"
#include "status.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define PRIORITIES 101u
#define MAX_PRIORITY 100u

/* States of a GPU-tier slot. */
enum { GPU_FREE = 0, GPU_HANDED_OUT = 1, GPU_CACHED = 2 };

typedef struct entry entry;
struct entry {
    kvf_key key;
    entry *hnext;       /* the map's chain */
    entry *prev, *next; /* its (tier, priority) LRU list, while unpinned */
    uint64_t gen;       /* changes with every placement */
    uint64_t round;     /* the put round that placed it (see kvf__cache_flush) */
    uint32_t slot;      /* host tier: the secondary slot */
    uint32_t pins;      /* kvf_cache_pin, acquires, and gets in flight */
    uint32_t reads;     /* of those, gets in flight (not the caller's to unpin) */
    uint32_t uses;      /* gets, for disk admission */
    uint8_t tier;
    uint8_t priority;
    bool removing; /* kvf_cache_remove while pinned: removed at the last unpin */
};

typedef struct lru {
    entry *head, *tail; /* head: least recently used */
} lru;

typedef enum op_kind {
    OPK_PUT,
    OPK_GET,
    OPK_ACQUIRE, /* a get into the GPU tier: the block stays pinned for the caller */
    OPK_EVICT,   /* a GPU victim copied down: part of a call, not of its statuses */
    OPK_FENCE,   /* an acquire of a block in place: waits for the copy into its slot */
    OPK_DEMOTE,
    OPK_REMOVE,
    OPK_REMOTE_PUT, /* write-through: part of the put's call, not of its statuses */
    OPK_REMOTE_REMOVE
} op_kind;

/* One engine batch queued by the cache. */
typedef struct op op;
struct op {
    op_kind kind;
    kvf_tier tier;     /* the tier written (put, demote) or read (get) */
    kvf_ticket ticket; /* the engine's; id 0 when the submit failed */
    size_t n;
    kvf_key *keys;
    uint64_t *gens;
    size_t *index;           /* put, get: the block's position in the caller's call */
    kvf_status *status;      /* per move, filled by the engine */
    kvf__move_error *errors; /* per failed move, by move index: the engine's messages */
    kvf_status submit_status;
    bool done;
    op *next;
};

/* A caller's put or get: the ops it queued and the blocks' statuses. */
typedef struct call call;
struct call {
    uint64_t id; /* the caller's kvf_cache_ticket */
    size_t n;
    kvf_status *status;      /* KVF_INPROGRESS where an op decides */
    kvf__move_error *errors; /* per failed block, by block index (kvf_cache_wait_errors) */
    op *ops;
    uint64_t t0_ns;
    bool waited;     /* a thread waits for it: a second wait is refused */
    uint32_t *pools; /* kvf_cache_get_pools: the pools it moves; NULL: all */
    size_t n_pools;
    call *next;
};

struct kvf_cache {
    kvf_engine *engine;
    kvf_cache_config cfg;
    kvf_setting *settings; /* cfg as resolved, with sources */
    size_t nsettings;
    pthread_mutex_t mu;

    kvf__keymap map; /* entries by key */
    lru lists[KVF_TIER_COUNT][PRIORITIES];
    uint64_t listed[KVF_TIER_COUNT]; /* entries on the lists: the unpinned ones */
    uint64_t capacity[KVF_TIER_COUNT];
    uint64_t used[KVF_TIER_COUNT];
    uint32_t *free_slots; /* host tier: secondary slots not in use */
    uint32_t nfree;
    /* GPU tier: primary slots 0 .. gpu.blocks-1, each free, handed out
     * (the caller's until commit or free) or holding a cached block */
    uint32_t *gpu_free;
    uint32_t ngpu_free;
    uint8_t *gpu_state;
    uint64_t next_gen;
    uint64_t round; /* see kvf__cache_flush */
    bool deferring; /* a call is assembling batches: see kvf__cache_doom */
    entry **doomed;
    size_t ndoomed, doomed_cap;
    size_t block_bytes;
    uint32_t primary_slots;

    op *background; /* ops nobody waits for, reaped by later calls */
    call *calls;
    uint64_t next_call;

    kvf_cache_event *events; /* ring of cfg.events.queue */
    size_t ev_head, ev_count;
    uint64_t ev_seq;

    kvf_cache_stats stats;

    /* kvf_cache_set_prefill_cost's, with the table copied into prefill_mem
     * (one allocation); prefill_mu, not mu, guards them (cache_plan.c) */
    pthread_mutex_t prefill_mu;
    kvf_prefill_cost prefill;
    bool has_prefill;
    void *prefill_mem;
    /* kvf_cache_observe_plan's window, the latest requests first at
     * learn_next - 1 (prefill_mu guards it too): each one's measured over
     * predicted time to the first token, and whether its plan loaded */
    double learn_ratio[KVF_PLAN_LEARN_WINDOW];
    bool learn_load[KVF_PLAN_LEARN_WINDOW];
    uint32_t learn_n, learn_next;
};

/* Batches being assembled by one put (or by create's restore). */
typedef struct pending {
    kvf_move *moves;
    kvf_key *keys;
    uint64_t *gens;
    size_t *index;
    size_t n, cap;
    bool checked; /* reads GPU-tier slots: heed a failed write into them */
    /* a get of some pools (kvf_cache_get_pools): the caller's list, not
     * owned; NULL: every pool */
    const uint32_t *pools;
    size_t n_pools;
} pending;

typedef struct put_batches {
    pending remove; /* disk victims' files */
    pending demote; /* host victims to disk */
    pending to_file, to_host;
    pending to_remote;              /* write-through */
    pending evict_file, evict_host; /* GPU victims moving down */
    struct call *k;                 /* the put's call, or NULL */
} put_batches;

/* ---- cache_entries.c: an entry's lifecycle ------------------------------------- */

KVF_INTERNAL entry *kvf__cache_find(const kvf_cache *c, kvf_key key);
/* A new entry, on its LRU list; NULL when out of memory. The caller counts
 * it in its tier's `used`. */
KVF_INTERNAL entry *kvf__cache_place(kvf_cache *c, kvf_key key, kvf_tier tier, uint32_t slot,
                                     uint32_t priority);
KVF_INTERNAL void kvf__cache_unplace(kvf_cache *c, entry *e);
KVF_INTERNAL void kvf__cache_free_entries(kvf_cache *c);
KVF_INTERNAL void kvf__cache_lru_unlink(kvf_cache *c, entry *e);
KVF_INTERNAL void kvf__cache_lru_append(kvf_cache *c, entry *e);
KVF_INTERNAL entry *kvf__cache_victim_of(kvf_cache *c, kvf_tier t);
KVF_INTERNAL void kvf__cache_pin_one(kvf_cache *c, entry *e);
/* Takes one pin off. true: that was the last pin of an entry being
 * removed, which the caller now discards (kvf__cache_release_pin). */
KVF_INTERNAL bool kvf__cache_unpin_one(kvf_cache *c, entry *e);
KVF_INTERNAL void kvf__cache_doom(kvf_cache *c, entry *e);

/* ---- cache_batch.c: batches and ops ---------------------------------------------- */

KVF_INTERNAL void kvf__cache_pending_add(pending *p, kvf_move mv, kvf_key key, uint64_t gen,
                                         size_t index);
KVF_INTERNAL bool kvf__cache_pending_reserve(pending *p, size_t n);
KVF_INTERNAL void kvf__cache_pending_free(pending *p);
KVF_INTERNAL void kvf__cache_put_batches_free(put_batches *pb);
KVF_INTERNAL bool kvf__cache_put_batches_reserve(put_batches *pb, size_t n);
KVF_INTERNAL void kvf__cache_op_free(op *o);
KVF_INTERNAL op *kvf__cache_op_submit(kvf_cache *c, op_kind kind, kvf_tier tier, pending *p);
KVF_INTERNAL void kvf__cache_background_push(kvf_cache *c, op *o);

/* ---- cache_call.c: the caller's tickets ------------------------------------------ */

KVF_INTERNAL void kvf__cache_call_note(call *k, size_t i, kvf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
KVF_INTERNAL call *kvf__cache_call_new(kvf_cache *c, size_t n);
KVF_INTERNAL void kvf__cache_call_free(call *k);
/* Where ticket t's call is linked in c->calls (*slot NULL: none). Lock held. */
KVF_INTERNAL call **kvf__cache_call_slot(kvf_cache *c, kvf_cache_ticket t);

/* ---- cache_drop.c: entries dropped ----------------------------------------------- */

KVF_INTERNAL void kvf__cache_drop(kvf_cache *c, entry *e, put_batches *pb);
KVF_INTERNAL void kvf__cache_discard(kvf_cache *c, entry *e);
KVF_INTERNAL void kvf__cache_release_pin(kvf_cache *c, entry *e);
KVF_INTERNAL void kvf__cache_release_doomed(kvf_cache *c);

/* ---- cache_apply.c ---------------------------------------------------------------- */

KVF_INTERNAL void kvf__cache_op_apply(kvf_cache *c, op *o, call *k);

/* ---- cache_queue.c: where queued ops go ------------------------------------------ */

KVF_INTERNAL void kvf__cache_submit_into(kvf_cache *c, op_kind kind, kvf_tier tier, pending *p,
                                         call *k);
KVF_INTERNAL void kvf__cache_flush(kvf_cache *c, put_batches *pb);
KVF_INTERNAL void kvf__cache_reap(kvf_cache *c);

/* ---- cache_evict.c: eviction ------------------------------------------------------ */

KVF_INTERNAL bool kvf__cache_disk_room(kvf_cache *c, put_batches *pb);
KVF_INTERNAL bool kvf__cache_host_slot(kvf_cache *c, put_batches *pb, uint32_t *slot_p);
KVF_INTERNAL bool kvf__cache_gpu_slot(kvf_cache *c, put_batches *pb, uint32_t *slot_p);

/* ---- cache_ops.c: arguments' checks ----------------------------------------------- */

KVF_INTERNAL kvf_status kvf__cache_check_keys(const char *fn, const kvf_key *keys, size_t n);
KVF_INTERNAL kvf_status kvf__cache_check_unique(const char *fn, const kvf_key *keys, size_t n);
/* No lock needed: reads only what create fixed. */
KVF_INTERNAL kvf_status kvf__cache_check_slots(const kvf_cache *c, const char *fn,
                                               const uint32_t *slots, size_t n);

/* ---- cache_gpu.c ------------------------------------------------------------------ */

/* No lock needed: reads only what create fixed. */
KVF_INTERNAL kvf_status kvf__cache_need_gpu_tier(const kvf_cache *c, const char *fn);

/* ---- cache_events.c, cache_stats.c ------------------------------------------------ */

KVF_INTERNAL void kvf__cache_emit(kvf_cache *c, kvf_cache_event_kind kind, const entry *e,
                                  kvf_tier from);
KVF_INTERNAL void kvf__cache_record_latency(kvf_cache *c, uint64_t ns);

/* ---- cache_restore.c, cache_remote.c: below the engine ---------------------------- */

/* Whether the engine has the file tier a disk tier needs (lock not needed). */
KVF_INTERNAL bool kvf__cache_disk_usable(kvf_engine *engine);
/* Enters the blocks the engine's file tier holds (lock not needed: the
 * cache is not yet shared). */
KVF_INTERNAL kvf_status kvf__cache_restore(kvf_cache *c);
/* Whether the engine has the remote tier a remote cache tier needs. */
KVF_INTERNAL bool kvf__cache_remote_usable(const kvf_engine *engine);
/* Called WITHOUT the lock: it asks the remote tier first. */
KVF_INTERNAL size_t kvf__cache_remote_prefix(kvf_cache *c, const kvf_key *keys, size_t n,
                                             kvf_tier *tiers);

/* ---- plan.c, cache_plan.c: the planner ------------------------------------------- */

/* Checks `in` (kvf_prefill_cost_check) into *out, sized to this library. */
KVF_INTERNAL kvf_status kvf__prefill_check(const kvf_prefill_cost *in, kvf_prefill_cost *out);
/* The prefill cost of new_tokens after prefix (a checked cost). */
KVF_INTERNAL kvf_status kvf__prefill_seconds(const kvf_prefill_cost *p, uint64_t new_tokens,
                                             uint64_t prefix, double *seconds_p);
/* Frees what kvf_cache_set_prefill_cost kept. */
KVF_INTERNAL void kvf__cache_prefill_free(kvf_cache *c);

#endif /* KVF_CACHE_PRIVATE_H */
