/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the engine's files share (src/engine/). The engine: pools and
 * slots, batches of moves, hazards between them, completion with a status
 * per move, and sync with a caller's stream. A slow tier is a store
 * (store.h) the engine runs chunks against (tier_ops); what differs
 * between tiers is a line of kvf__tiers (tiers.c).
 *
 * Scheduling. Every batch is checked and registered under the engine lock:
 * for each slot or file it reads it depends on the pending writer (read
 * after write); for each one it writes, on the pending writer and on every
 * pending reader (write after write, write after read). A batch whose
 * dependencies have all completed is ready. Where a batch depends on
 * another only to write over slots that one reads, it waits for that
 * one's moves there, not the whole batch: the reader releases it once the
 * chunk holding the last such move has finished copying
 * (kvf__release_copied), so an onboard into a slot being evicted waits for
 * the slot's own copy. Ready batches wait in one FIFO per queue (onboards
 * first); worker threads take chunks of a ready batch's moves, so one
 * large batch is spread across all workers. A backend with asynchronous
 * copies (CUDA) gets a ready copy batch in calls of 1-4 MiB instead
 * (async.c), each reported done from the backend's completion thread.
 *
 * Lost data is never served. A move that fails marks what it wrote as
 * poisoned with its batch id; a move that was queued to read that data
 * (it recorded the writer's id at submit time) then fails with
 * KVF_ERR_LOST instead of copying it. Secondary slots stay poisoned until
 * rewritten; a failed file write removes the file.
 */
#ifndef KVF_ENGINE_PRIVATE_H
#define KVF_ENGINE_PRIVATE_H

#include "backend.h"
#include "blockfile.h"
#include "blockhdr.h"
#include "config.h"
#include "engine.h"
#include "engine_costs.h"
#include "fileio.h"
#include "gds.h"
#include "keymap.h"
#include "layout.h"
#include "log.h"
#include "status.h"
#include "store.h"
#include "timeline.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The remote tier's timeout where remote.timeout_ms is 0: a move's, and
 * the probe at create of a store that asks for one. */
#define REMOTE_DEFAULT_TIMEOUT_MS 2000u

/* What a batch does. With the tier it moves to or from, its kind. */
typedef enum op_dir {
    OP_OFFLOAD, /* primary slot -> the tier (a secondary slot, or a key) */
    OP_ONBOARD, /* the tier -> primary slot */
    OP_DEMOTE,  /* secondary slot -> a keyed tier's key */
    OP_PROMOTE, /* a keyed tier's key -> secondary slot */
    OP_REMOVE,  /* a keyed tier's block removed: the move's key (src = dst = 0) */
    OP_COPY,    /* primary slot -> primary slot (tier KVF_TIER_GPU) */
    OP_FENCE,   /* nothing moved (tier KVF_TIER_GPU): completes once the primary
                   slot src = dst is written by what was queued before */
    OP_DIR_COUNT
} op_dir;

/* A batch's kind: its direction and the tier it moves to or from. What
 * differs between tiers is a line of kvf__tiers (tiers.c), so that no
 * switch on a kind names a tier. Where a move reads or writes is a tier
 * too: KVF_TIER_GPU the primary slots, KVF_TIER_HOST the secondary slots,
 * a keyed tier (one with tier_ops: disk, remote) its store's keys. */
typedef struct op_kind {
    op_dir dir;
    kvf_tier tier;
} op_kind;
#define KIND_COPY ((op_kind){OP_COPY, KVF_TIER_GPU})
#define KIND_FENCE ((op_kind){OP_FENCE, KVF_TIER_GPU})

typedef enum batch_state { B_WAITING, B_READY, B_RUNNING, B_DONE } batch_state;

typedef struct batch batch;

/* A batch waiting for another: for the latter's move `need` and those
 * before it only (it writes over what they read), or DEP_WHOLE. */
typedef struct dep_edge {
    batch *b;
    uint32_t need;
} dep_edge;
#define DEP_WHOLE UINT32_MAX

/* The pools a batch of kvf_onboard_pools / kvf_offload_pools moves (layer_batches.c).
 * Owned by an unsplit batch or a group, shared by the group's parts. */
typedef struct pool_sel {
    uint32_t n;      /* pools moved, in the order they arrive */
    uint32_t *order; /* their indices */
    uint8_t *in;     /* per engine pool: moved by the batch */
    bool whole;      /* every pool is moved: its writes are whole blocks */
    /* an unsplit batch on an asynchronous backend: marks[k] is reached
     * once pool order[k] of every move has arrived. Published (nmarks)
     * when the batch is on its stream; released at completion, or by the
     * last of `busy` waiters holding one outside the lock */
    void **marks;
    uint32_t nmarks;
    uint32_t busy;
    /* a layer-wise onboard from DISK or REMOTE (arrival.c): per pool group, the
     * moves whose group is in their slots (or failed), and the groups
     * arrived for every move, a prefix of them; e->mu guards both. NULL:
     * the batch arrives whole */
    size_t *group_moves;
    uint32_t arrived;
} pool_sel;

/* The pool groups a layer-wise read from a slow tier hands over together
 * (arrival.c): n of them, group g ending before pool end[g]; each pool's
 * group; the bytes of a stored block up to group 0's end (its prefix and
 * group 0's pools: the first read). */
typedef struct arrival_groups {
    uint32_t n;
    uint32_t *end, *pool_group;
    size_t first_bytes;
} arrival_groups;

/* What was queued on one slot or file, by batch id (see pending_batch).
 * Slots' entries are left as they are when a batch completes, so that a
 * completion touches none of them: the ids of batches since done are
 * told apart when the entry is next registered on. Files' and remote
 * blocks' entries are cleared at completion, and dropped once empty. */
typedef struct hazard {
    uint64_t writer; /* the last batch queued to write here, 0: none */
    /* readers queued since `writer`, as reader entries (reader_entry): the
     * first inline (the common case, and one cache miss fewer per move),
     * the others in `more` */
    uint64_t reader0;
    uint64_t *more;
    uint32_t nreaders, cap;
    /* the last batch whose write here failed, 0: none. A slot's is only
     * current while that batch is still `writer` (see slot_poison). */
    uint64_t poison;
} hazard;

typedef struct file_hazard {
    kvf_key key;
    hazard hz;
    struct file_hazard *next; /* the key_table's chain */
} file_hazard;

/* The hazards of keyed objects (files, remote blocks): an entry exists
 * only while something is pending on its key, or its last write failed.
 * Zeroed, a table is not ready: kvf__key_table_init makes it so. */
typedef kvf__keymap key_table;

struct batch {
    uint64_t id;
    op_kind kind;
    kvf__queue queue;
    size_t n, cap; /* moves, and room for them in the arrays below */
    kvf_move *moves;
    kvf_status *status; /* KVF_INPROGRESS until the move is done */
    uint64_t *src_dep;  /* per move: id of the write it reads, 0: none */
    /* per move of a batch writing some pools of a slot (sel, not whole):
     * id of the write before it there, whose loss its other pools share */
    uint64_t *dst_dep;
    batch_state state;
    uint32_t deps_left;
    dep_edge *dependents; /* the batches waiting for this one */
    size_t ndependents, dependents_cap;
    /* moves [0, copied) have finished copying: dependents waiting for
     * none of the others have gone (kvf__release_copied). On the workers,
     * chunks of chunk_moves are claimed in order but end in any order:
     * bit k of chunks_ended is the chunk k after the one at `copied` */
    size_t copied, chunk_moves;
    uint64_t chunks_ended;
    size_t nregistered; /* moves [0, nregistered) were registered as writers */
    size_t next_move;   /* first move no worker has claimed */
    size_t moves_done;
    kvf_engine *engine;
    /* A large batch is queued as parts of at most PART_MOVES moves, so the
     * first part is copying while the next is registered: the caller's
     * batch is then a group, which has no hazards of its own and completes
     * when its last part does. */
    batch *group;     /* a part: the group it belongs to */
    size_t group_off; /* a part: where its moves start in the group */
    bool sorted;      /* a group: parts take its moves in `order` */
    uint32_t *order;  /* a group: move indices in part order */
    size_t order_cap;
    size_t parts_left;       /* a group: parts not yet complete */
    bool ticketed;           /* the caller holds a ticket for it */
    bool checked;            /* reads of primary slots heed their poison (the cache's slots) */
    bool retired;            /* its ticket was waited for */
    uint32_t async_left;     /* chunks on the GPU, plus one while issuing */
    kvf_status async_status; /* the first failure of an async batch */
    char async_msg[160];     /* and its detail, for the moves it fails */
    bool async;              /* handed to the backend's copy_async */
    bool on_stream;          /* copy_async accepted it: the GPU orders it */
    kvf__copy *copies;       /* the copies of an async batch */
    size_t copies_cap;
    struct async_chunk *chunks; /* an async batch's chunks handed over, in order */
    size_t chunks_cap;
    batch *next_ready;
    batch *prev_undone, *next_undone; /* every batch not done, in id order */
    batch *next_ticket;
    uint64_t remote_deadline_ns; /* remote kinds: set when the first chunk is claimed */
    /* kvf_offload_after: the backend's mark of the caller's stream, which
     * the batch's reads wait for; a part shares its group's, which the
     * group (or an unsplit batch) releases when it completes */
    void *after;
    pool_sel *sel; /* NULL: every pool, in pool order */
    /* the failed moves' messages, for the ticket's caller (kvf__move_failed):
     * pushed by whichever thread fails a move, so a lock-free stack */
    _Atomic(kvf__move_error *) errors;
    uint64_t submit_ns; /* when the caller submitted it: the costs' clock (costs.c) */
    /* its moves' tokens, summed when checked: a group keeps no moves of its
     * own (its parts copy them), so the costs read this instead */
    uint64_t tokens_total;
    /* threads blocked on it (kvf_wait, kvf_wait_pool, ...): it is not
     * freed, nor reused by another batch, until the last has looked at it
     * again, even after another thread retired its ticket. Lock held. */
    uint32_t waiters;
};

typedef struct mem_array {
    kvf_memory kind;
    uint8_t *base;
    size_t stride;
    uint32_t slots;
    bool owned, registered;
} mem_array;

typedef struct pool {
    kvf_geometry g;
    size_t block_bytes;
    /* the block as rows of tokens, so a move's region costs no checks:
     * rows, their pitch, and bits per token in a row */
    size_t rows, pitch, token_bits;
    mem_array primary, secondary;
    bool has_secondary;
} pool;

/* What a secondary slot will hold once the writes queued there land. */
typedef struct sec_slot {
    uint32_t tokens;
    /* its pools written, npools once every one has been (a whole write);
     * from the first write of some pools (kvf_offload_pools),
     * e->sec_pool_bits has a bit per slot and pool for the slots short of
     * npools (sec_bit). A read of a pool never written finds no block: a
     * slot is never served in part. */
    uint32_t pools;
    /* the first pool the last failed write here moved (UINT32_MAX: every
     * pool), for the messages of the reads it fails; e->mu guards it */
    uint32_t lost_pool;
} sec_slot;

typedef struct worker {
    kvf_engine *engine;
    pthread_t thread;
    /* a chunk of moves against a keyed tier's store: each move's block as
     * the store keeps it, its prefix (header and pool table) and one block
     * of every pool, padded to the O_DIRECT alignment
     * (kvf__staging_slot_bytes), back to back */
    uint8_t *staging;
    size_t staging_bytes;
    kvf__gds_buf *gstaging; /* the same in device memory, registered with cuFile (GDS) */
    /* per move of the chunk: its index in the batch, its store block, and
     * its copies between slots and staging (npools each); nmoves of each */
    size_t *moves;
    kvf__store_block *blocks;
    kvf__copy *copies;
    uint32_t *pool_bytes; /* each block's pools' bytes in staging, npools each */
    size_t nmoves;
    /* keyed-tier time, logged at KVF_LOG=debug when the engine ends: where
     * a chunk's wall time goes (its slot <-> staging copies run inside it,
     * on a store's I/O threads too, hence the atomic) */
    uint64_t store_chunks, store_moves, store_ns;
    _Atomic uint64_t copy_ns;
} worker;

/* A keyed tier's part in running its moves (execute_store.c runs them,
 * the same for every store): its store, how many moves make a worker's
 * chunk, and the time a batch's chunks have. */
typedef struct tier_ops {
    /* The tier's store, opened first where needed (NULL where the engine
     * has no such tier); a failure to open it names why. */
    kvf_status (*store)(kvf_engine *e, kvf__store **s_p);
    size_t (*chunk_moves)(const kvf_engine *e);
    uint64_t (*deadline)(const kvf_engine *e, batch *b); /* NULL: none */
} tier_ops;

/* What the engine knows of a tier, in kvf__tiers (tiers.c), indexed by
 * kvf_tier: a new tier is a line there. */
typedef struct tier_info {
    const char *name;  /* kvf_tier_name's */
    const char *place; /* what a message calls one of its slots or blocks */
    /* each direction's name, for messages ("offload to file"); NULL: the
     * public calls do not take the tier in that direction */
    const char *op_names[OP_DIR_COUNT];
    const tier_ops *ops; /* a keyed tier's (a store's blocks); NULL: slots */
    /* KVF_OK where the engine has the tier (e->mu held), else a failure
     * naming the call `op`; NULL: every engine has it */
    kvf_status (*ready)(kvf_engine *e, const char *op);
} tier_info;

KVF_INTERNAL extern const tier_info kvf__tiers[KVF_TIER_COUNT];

/* A keyed tier's hazards (one table per store). */
typedef struct engine_tier {
    key_table hazards;
} engine_tier;

#define TICKET_BUCKETS 1024u
/* Blocks of one remote round trip: a worker's pipelined batch. */
#define REMOTE_CHUNK_BYTES ((size_t)8 << 20)
#define REMOTE_CHUNK_MOVES 64u
/* File staging of one worker, at most: bounds a chunk of file moves. */
#define FILE_STAGING_BUDGET ((size_t)64 << 20)

/* A chunk of an async copy batch handed to the backend: its moves end
 * before move `end` (CHUNK_NO_END: the chunk ends none, as a pass of one
 * pool of a batch moving several does not). */
typedef struct async_chunk {
    batch *b;
    size_t end;
} async_chunk;
#define CHUNK_NO_END SIZE_MAX

/* One finished chunk of an async copy batch, as the backend reported it. */
typedef struct async_event {
    async_chunk *c;
    kvf_status status;
} async_event;

struct kvf_engine {
    kvf_engine_config cfg;
    kvf_setting *settings; /* cfg as resolved, with sources; cfg's strings point here */
    size_t nsettings;
    char *file_dir, *file_namespace;
    kvf__backend *backend;
    kvf_backend backend_kind;

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* a batch became ready, or stop */
    pthread_cond_t done_cv; /* a batch completed, or an async batch was issued */

    pool *pools;
    uint32_t npools, pools_cap;
    bool frozen;                             /* pools fixed: the first transfer was queued */
    uint32_t primary_slots, secondary_slots; /* slots valid in every pool */
    size_t all_block_bytes;                  /* one block of every pool */
    /* the pool groups a layer-wise onboard from DISK ([0]) or REMOTE
     * ([1]) reads and hands over together (arrival.c), fixed with the
     * pools: see arrival_groups; kvf__arrival_of picks a tier's */
    arrival_groups arrival[2];

    hazard *hz_primary, *hz_secondary;
    sec_slot *sec;                     /* per secondary slot, what queued writes leave there */
    uint8_t *sec_pool_bits;            /* see sec_slot.pools */
    engine_tier tiers[KVF_TIER_COUNT]; /* the keyed ones' used: see tier_of */
    uint64_t *mark_primary, *mark_secondary; /* batch checks' stamps, see kvf__check_moves */

    bool file_enabled;
    kvf__store *file_store; /* the disk tier's: every choice about files is its own */
    /* the pools' layout, fixed with them: what every stored block carries */
    uint64_t fingerprint;

    /* The remote tier: connected on first use, and again (at most once a
     * second) after that failed. */
    char *remote_url;
    kvf__store *remote;
    pthread_mutex_t remote_mu;
    uint64_t remote_retry_ns;
    char remote_why[192]; /* why the last connection failed, for the moves it fails */

    /* KVF_DEVICE_CALL_BYTES at create (async.c); 0: the engine's rule */
    uint64_t device_call_bytes;

    uint64_t next_id;
    batch *ready_head[KVF_QUEUE_COUNT], *ready_tail[KVF_QUEUE_COUNT];
    batch *undone_head, *undone_tail;
    /* every batch not done, at live[id & (live_cap - 1)]: the ids between
     * the oldest and the newest of them fit, so none share an entry */
    batch **live;
    size_t live_cap;
    size_t undone_count;
    batch *tickets[TICKET_BUCKETS];

    uint64_t check_epoch; /* stamps hazard marks while a batch is checked */
    uint32_t *sort_count; /* secondary_slots + 1 counters (submit_mu held) */

    /* Batches are recycled: a batch of thousands of moves would otherwise
     * cost fresh pages from the kernel on every kvf__submit. */
    pthread_mutex_t spare_mu;
    /* held across a whole kvf__submit, so the parts of a batch are registered
     * with nothing in between even while `mu` is dropped to issue one */
    pthread_mutex_t submit_mu;
    batch *spare[40]; /* room for a large batch's parts in both directions */
    uint32_t nspare;

    worker *workers;
    uint32_t nworkers;
    bool stop;

    /* Completions of async copy batches. The backend's callback runs on
     * its completion thread, which watches every queue, so it must not
     * wait for `mu` (held for a while by a kvf__submit registering a large
     * batch): it completes a chunk itself when `mu` is free and otherwise
     * queues it here, for the engine's completion thread to take. */
    pthread_mutex_t cb_mu;
    pthread_cond_t cb_cv;
    async_event *cb_events, *cb_spare;
    size_t cb_n, cb_cap, cb_spare_cap;
    bool cb_stop, cb_started;
    pthread_t cb_thread;

    kvf__costs costs; /* read costs per tier (costs.c) */
};

/* ---- shared between the engine's files ---------------------------------- */

/* engine.c */
KVF_INTERNAL void kvf__mem_array_release(kvf_engine *e, mem_array *m);

/* pool_setup.c */
KVF_INTERNAL kvf_status kvf__freeze(kvf_engine *e);

/* hazards.c */
KVF_INTERNAL void kvf__key_table_init(key_table *t);
KVF_INTERNAL hazard *kvf__key_hazard(key_table *t, kvf_key key, bool create);
KVF_INTERNAL void kvf__key_table_free(key_table *t);
KVF_INTERNAL void kvf__hazard_prune_readers(const kvf_engine *e, hazard *h);
KVF_INTERNAL void kvf__key_hazard_prune(key_table *t, kvf_key key);
KVF_INTERNAL bool kvf__push_id(uint64_t **arr, uint32_t n, uint32_t *cap, uint64_t id);
KVF_INTERNAL bool kvf__push_edge(dep_edge **arr, size_t *n, size_t *cap, dep_edge ed);

/* batch.c */
KVF_INTERNAL void kvf__batch_destroy(batch *b);
KVF_INTERNAL batch *kvf__batch_get(kvf_engine *e, size_t n, bool group);
KVF_INTERNAL void kvf__batch_free(batch *b);
KVF_INTERNAL void kvf__batch_release(batch *b);

/* move_errors.c */
KVF_INTERNAL void kvf__push_error(batch *b, kvf__move_error *r);
KVF_INTERNAL void kvf__move_failed(batch *b, size_t i, kvf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* As kvf__move_failed, for a failure about the move's destination, not
 * what it reads (kvf__move_error.about_dest). */
KVF_INTERNAL void kvf__move_failed_dest(batch *b, size_t i, kvf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
KVF_INTERNAL kvf__move_error *kvf__collect_errors(batch *b, size_t failed);

/* check.c */
KVF_INTERNAL kvf_status kvf__check_moves(kvf_engine *e, op_kind kind, const kvf_move *moves,
                                         size_t n, batch *b, uint32_t *cnt, size_t *failed_p);

/* submit.c */
KVF_INTERNAL void kvf__ready_push(kvf_engine *e, batch *b);
KVF_INTERNAL void kvf__ready_pop(kvf_engine *e, kvf__queue q);
KVF_INTERNAL void kvf__sort_parts(kvf_engine *e, batch *b, const kvf_move *moves, uint32_t *cnt);
KVF_INTERNAL kvf_status kvf__submit(kvf_engine *e, op_kind kind, const kvf_move *moves, size_t n,
                                    kvf_ticket *ticket_p);
/* kvf__submit_batch whose reads wait for the work queued on `after` (a
 * caller's stream; NULL: none) when the call is made. */
KVF_INTERNAL kvf_status kvf__submit_after(kvf_engine *e, op_kind kind, bool checked, void *after,
                                          const kvf_move *moves, size_t n, kvf_ticket *ticket_p);
/* kvf_offload_after and kvf_offload_pools, as `fn` names them. */
KVF_INTERNAL kvf_status kvf__offload_after(kvf_engine *e, const char *fn, void *stream, kvf_tier to,
                                           const uint32_t *pools, size_t n_pools,
                                           const kvf_move *moves, size_t n, kvf_ticket *ticket_p);
/* The same, moving only the pools listed (NULL: all; see pool_sel). */
KVF_INTERNAL kvf_status kvf__submit_pools(kvf_engine *e, op_kind kind, bool checked, void *after,
                                          const uint32_t *pools, size_t n_pools,
                                          const kvf_move *moves, size_t n, kvf_ticket *ticket_p);
KVF_INTERNAL kvf_status kvf__submit_batch(kvf_engine *e, op_kind kind, bool checked,
                                          const kvf_move *moves, size_t n, kvf_ticket *ticket_p);
/* The kind of public call `fn` moving `dir` on `tier`: KVF_ERR_INVALID,
 * naming the tier, where the tier does not take that direction. */
KVF_INTERNAL kvf_status kvf__tier_kind(const char *fn, kvf_tier tier, op_dir dir, op_kind *kind_p);

/* complete.c */
KVF_INTERNAL void kvf__group_done(kvf_engine *e, batch *g);
KVF_INTERNAL void kvf__complete_batch(kvf_engine *e, batch *b);
/* Moves [0, upto) of running batch b have finished copying: the batches
 * that wait only for some of them go. Lock held. */
KVF_INTERNAL void kvf__release_copied(kvf_engine *e, batch *b, size_t upto);
KVF_INTERNAL bool kvf__source_lost(kvf_engine *e, const batch *b, size_t i);
KVF_INTERNAL void kvf__fail_lost_source(batch *b, size_t i);
/* A move writing some pools of a slot whose earlier write failed: the
 * slot's other pools stay lost, so this move fails too (dst_dep). */
KVF_INTERNAL bool kvf__dest_lost(kvf_engine *e, const batch *b, size_t i);
KVF_INTERNAL void kvf__fail_lost_dest(batch *b, size_t i);
KVF_INTERNAL void kvf__fail_copy(batch *b, size_t i, kvf_status st, const char *why);
/* Where ticket t's batch is linked in e->tickets (*slot NULL: none). Lock held. */
KVF_INTERNAL batch **kvf__ticket_slot(kvf_engine *e, kvf_ticket t);

/* async.c */
KVF_INTERNAL kvf_region kvf__pool_region(const pool *pl, uint32_t tokens);
KVF_INTERNAL kvf__copy kvf__move_copy(const kvf_engine *e, op_kind kind, uint32_t p,
                                      const kvf_move *mv);
KVF_INTERNAL void *kvf__completion_main(void *arg);
KVF_INTERNAL void kvf__completion_stop(kvf_engine *e);
KVF_INTERNAL void kvf__issue_async(kvf_engine *e, batch *b);
/* Releases an unsplit batch's or a group's mark (batch.after). Lock held. */
KVF_INTERNAL void kvf__release_after(kvf_engine *e, batch *b);

/* arrival.c */
/* The pool groups of a layer-wise read from `tier` (DISK or REMOTE) for
 * the engine's pools, their ends into end[] (npools entries; NULL: counted
 * only); their count. */
KVF_INTERNAL uint32_t kvf__arrival_groups(const kvf_engine *e, kvf_tier tier, uint32_t *end);
/* At freeze: e->arrival of both tiers. */
KVF_INTERNAL kvf_status kvf__arrival_setup(kvf_engine *e);
/* Frees e->arrival (accepts an engine that never set it up). */
KVF_INTERNAL void kvf__arrival_free(kvf_engine *e);
/* The pool groups of a layer-wise onboard from `tier`; NULL for a tier
 * read otherwise. */
KVF_INTERNAL const arrival_groups *kvf__arrival_of(const kvf_engine *e, kvf_tier tier);
/* `moves` moves of batch b (a part counts for its group) have pool group
 * g in their slots, or failed: marks the groups every move has as
 * arrived, waking their pools' waiters. Takes the lock. */
KVF_INTERNAL void kvf__arrival_mark(kvf_engine *e, batch *b, uint32_t g, size_t moves);
/* Whether batch b (or its group) is a layer-wise onboard from DISK or
 * REMOTE read pool group by pool group. */
KVF_INTERNAL bool kvf__arrival_grouped(const kvf_engine *e, const batch *b);
/* A worker's chunk of such a batch: an even share, within its budget. */
KVF_INTERNAL size_t kvf__arrival_chunk_moves(const kvf_engine *e, const batch *b);
/* Whether pool pi of ticket batch b has arrived for every move. Lock held. */
KVF_INTERNAL bool kvf__pool_arrived(const kvf_engine *e, const batch *b, uint32_t pi);

/* staging.c */
KVF_INTERNAL kvf_status kvf__staging_grow(kvf_engine *e, uint8_t **buf, size_t *cap, size_t need);
KVF_INTERNAL size_t kvf__staging_slot_bytes(const kvf_engine *e);
/* Bytes before a block's payload in staging: its stored prefix (header
 * and pool table, kvf__block_prefix_bytes of the engine's pools). */
KVF_INTERNAL size_t kvf__staging_prefix_bytes(const kvf_engine *e);
/* Room for a chunk of n moves: the worker's per-move arrays, and with
 * `images` their blocks' images, in device memory for the GDS path
 * (`dev`), else on the host. */
KVF_INTERNAL kvf_status kvf__ensure_staging(worker *w, size_t n, bool images, bool dev);
/* Block image k of the worker's staging: where its payload starts. */
KVF_INTERNAL uint8_t *kvf__staging_payload(worker *w, size_t k, bool dev);
/* The copies of a move between its slots and a stored payload of
 * file_tokens tokens, pool after pool, into out[0..npools); each pool's
 * stored bytes into pool_bytes (NULL: not wanted); the payload's bytes. */
KVF_INTERNAL size_t kvf__file_copies(const kvf_engine *e, op_kind kind, const kvf_move *mv,
                                     uint8_t *payload, uint32_t tokens, uint32_t file_tokens,
                                     kvf__copy *out, uint32_t *pool_bytes);
/* Runs n copies between slots and staging as they are (no pool
 * selection applied). */
KVF_INTERNAL kvf_status kvf__staging_copy_run(worker *w, const batch *b, kvf__copy *cp, size_t n);
/* Runs n copies made a block at a time between slots and staging (those of
 * the pools batch b moves). */
KVF_INTERNAL kvf_status kvf__staging_copy(worker *w, const batch *b, kvf__copy *cp, size_t n);

/* execute_store.c */
/* Runs moves [first, last) of a batch on a keyed tier through its store. */
KVF_INTERNAL void kvf__run_store_chunk(worker *w, batch *b, size_t first, size_t last,
                                       uint64_t deadline_ns);
/* Every move of batch b, which wrote to a keyed tier, is done: the store
 * commits them (its durability policy); the lock not held. */
KVF_INTERNAL void kvf__store_batch_wrote(kvf_engine *e, batch *b);
KVF_INTERNAL kvf_status kvf__remote_handle(kvf_engine *e, kvf__store **s_p);
KVF_INTERNAL extern const tier_ops kvf__remote_tier_ops;

/* file_tier.c */
KVF_INTERNAL extern const tier_ops kvf__file_tier_ops;

/* costs.c: a batch (or group) completed; lock held */
KVF_INTERNAL void kvf__costs_batch_done(kvf_engine *e, const batch *b);

/* workers.c */
KVF_INTERNAL void *kvf__worker_main(void *arg);

/* layer_batches.c */
/* Whether move copies of pool p belong to batch b. */
static inline bool sel_has(const batch *b, uint32_t p)
{
    return !b->sel || b->sel->in[p];
}
/* Checks a caller's pool list against the engine (e->mu held: pools are
 * fixed) and builds the selection; NULL with KVF_OK for "every pool". */
KVF_INTERNAL kvf_status kvf__pool_sel_make(kvf_engine *e, const char *fn, op_kind kind,
                                           const uint32_t *pools, size_t n_pools, pool_sel **sel_p);
KVF_INTERNAL void kvf__pool_sel_free(kvf_engine *e, pool_sel *s);
/* Keeps, of n copies made a block at a time (a copy per pool, in pool
 * order), those of the pools batch b moves; returns how many. */
KVF_INTERNAL size_t kvf__sel_compact(const kvf_engine *e, const batch *b, kvf__copy *cp, size_t n);
/* Drops the marks of a completed batch's selection unless a waiter holds
 * them (it drops them then). Lock held. */
KVF_INTERNAL void kvf__pool_sel_done(kvf_engine *e, batch *b);

/* ---- small helpers -------------------------------------------------------- */

static inline uint32_t eff_tokens(const kvf_engine *e, uint32_t tokens)
{
    uint32_t tpb = e->pools[0].g.tokens_per_block;
    return (tokens == 0 || tokens >= tpb) ? tpb : tokens;
}

static inline uint8_t *slot_addr(const mem_array *m, uint64_t slot)
{
    return m->base + (size_t)slot * m->stride;
}

/* Each kind's name, for messages: "offload to file". */
static inline const char *op_name(op_kind k)
{
    return kvf__tiers[k.tier].op_names[k.dir];
}

/* Whether a tier's blocks are a store's, by key (disk, remote), rather
 * than slots. */
static inline bool tier_keyed(kvf_tier t)
{
    return kvf__tiers[t].ops != NULL;
}

/* The tier a kind's moves read: their sources' space. */
static inline kvf_tier kind_reads(op_kind k)
{
    switch (k.dir) {
    case OP_ONBOARD:
    case OP_PROMOTE:
    case OP_REMOVE:
        return k.tier;
    case OP_DEMOTE:
        return KVF_TIER_HOST;
    default:
        return KVF_TIER_GPU;
    }
}

/* The tier a kind's moves write: their destinations' space. */
static inline kvf_tier kind_writes(op_kind k)
{
    switch (k.dir) {
    case OP_OFFLOAD:
    case OP_DEMOTE:
    case OP_REMOVE:
        return k.tier;
    case OP_PROMOTE:
        return KVF_TIER_HOST;
    default:
        return KVF_TIER_GPU;
    }
}

static inline kvf__queue kind_queue(op_kind k)
{
    switch (k.dir) {
    case OP_OFFLOAD:
    case OP_DEMOTE:
    case OP_REMOVE:
        return KVF_QUEUE_OFFLOAD;
    default:
        return KVF_QUEUE_ONBOARD;
    }
}

/* The engine's state of keyed tier t. */
static inline engine_tier *tier_of(kvf_engine *e, kvf_tier t)
{
    return &e->tiers[t];
}

/* How a kind's moves run against its keyed tier; NULL for moves between
 * slots. */
static inline const tier_ops *kind_ops(op_kind k)
{
    return kvf__tiers[k.tier].ops;
}

/* Kinds whose moves run on the worker threads through a staging buffer,
 * never as asynchronous backend copies. */
static inline bool kind_on_workers(op_kind k)
{
    return tier_keyed(k.tier) || k.dir == OP_FENCE;
}

/* Kinds that only remove a keyed object: they read nothing, so a failed
 * write before them is no loss. */
static inline bool kind_removes(op_kind k)
{
    return k.dir == OP_REMOVE;
}

/* Whether a kind touches secondary slots, which every pool must then have. */
static inline bool kind_uses_secondary(op_kind k)
{
    return kind_reads(k) == KVF_TIER_HOST || kind_writes(k) == KVF_TIER_HOST;
}

/* Whether a kind is k.dir on tier t. */
static inline bool kind_is(op_kind k, op_dir dir, kvf_tier t)
{
    return k.dir == dir && k.tier == t;
}

/* The hazard of one slot (idx) or keyed object (key: a move's own); keyed
 * ones get an entry on demand when `create` is set (NULL when out of
 * memory or absent). */
static inline __attribute__((always_inline)) hazard *
hazard_of(kvf_engine *e, kvf_tier sp, uint64_t idx, kvf_key key, bool create)
{
    if (sp == KVF_TIER_GPU)
        return &e->hz_primary[idx];
    if (sp == KVF_TIER_HOST)
        return &e->hz_secondary[idx];
    return kvf__key_hazard(&tier_of(e, sp)->hazards, key, create);
}

/* Moves ahead that the hazard passes prefetch: their slots are scattered,
 * and each entry is a cache miss that the loop would otherwise wait for. */
#define PREFETCH_AHEAD 16u

/* always inlined: GCC finds an out-of-line prefetch function free of side
 * effects, and drops its calls */
static inline __attribute__((always_inline)) void hazard_prefetch(const kvf_engine *e, kvf_tier sp,
                                                                  uint64_t idx)
{
    /* both ends: an entry is 40 bytes, and 3 in 8 of them cross a line
     * whose miss the loop then waits for (kvferry bench, many small moves
     * device to host: about a quarter faster with both prefetches) */
    const hazard *h = sp == KVF_TIER_GPU    ? &e->hz_primary[idx]
                      : sp == KVF_TIER_HOST ? &e->hz_secondary[idx]
                                            : NULL;
    if (h) {
        __builtin_prefetch(h);
        __builtin_prefetch((const char *)(h + 1) - 1);
    }
}

/* Prefetches the entries of move i + PREFETCH_AHEAD of moves[0..n). */
static inline __attribute__((always_inline)) void move_prefetch(const kvf_engine *e, kvf_tier rs,
                                                                kvf_tier ws, const kvf_move *moves,
                                                                size_t i, size_t n)
{
    if (i + PREFETCH_AHEAD < n) {
        const kvf_move *m = &moves[i + PREFETCH_AHEAD];
        hazard_prefetch(e, rs, m->src);
        hazard_prefetch(e, ws, m->dst);
        if (ws == KVF_TIER_HOST)
            __builtin_prefetch(&e->sec[m->dst].tokens);
    }
}

/* A reader entry: the reading batch's id in the low READER_ID_BITS bits
 * (2^51 batches: 70 years at a million a second), and above them the last
 * of its moves that reads there, which a writer queued next waits for
 * (dep_edge.need). A batch has at most PART_MOVES moves (submit.c). */
#define READER_ID_BITS 51
#define READER_ID_MASK ((UINT64_C(1) << READER_ID_BITS) - 1)
#define READER_MOVE_MAX ((UINT64_C(1) << (64 - READER_ID_BITS)) - 1)

static inline uint64_t reader_entry(uint64_t id, size_t move)
{
    return id | (uint64_t)(move < READER_MOVE_MAX ? move : READER_MOVE_MAX) << READER_ID_BITS;
}

static inline uint64_t hazard_entry(const hazard *h, uint32_t k)
{
    return k == 0 ? h->reader0 : h->more[k - 1];
}

static inline void hazard_set_entry(hazard *h, uint32_t k, uint64_t entry)
{
    if (k == 0)
        h->reader0 = entry;
    else
        h->more[k - 1] = entry;
}

/* The id of reader k. */
static inline uint64_t hazard_reader(const hazard *h, uint32_t k)
{
    return hazard_entry(h, k) & READER_ID_MASK;
}

/* The last move of reader k that reads here (DEP_WHOLE: not known). */
static inline uint32_t hazard_reader_move(const hazard *h, uint32_t k)
{
    uint64_t m = hazard_entry(h, k) >> READER_ID_BITS;
    return m == READER_MOVE_MAX ? DEP_WHOLE : (uint32_t)m;
}

/* The batch of id `id` while it is not done, else NULL. Ids older than the
 * oldest batch not done are done; the others not done are in e->live. */
static inline batch *pending_batch(const kvf_engine *e, uint64_t id)
{
    if (!id || !e->undone_head || id < e->undone_head->id)
        return NULL;
    batch *b = e->live[id & (e->live_cap - 1)];
    return b && b->id == id ? b : NULL;
}

/* Bit (slot s, pool p) of e->sec_pool_bits. */
static inline size_t sec_bit(const kvf_engine *e, uint64_t s, uint32_t p)
{
    return (size_t)s * e->npools + p;
}

static inline bool sec_pool_written(const kvf_engine *e, uint64_t s, uint32_t p)
{
    if (e->sec[s].pools == e->npools)
        return true;
    size_t bit = sec_bit(e, s, p);
    return e->sec_pool_bits && (e->sec_pool_bits[bit / 8] >> (bit % 8) & 1u);
}

/* The first pool of secondary slot s that batch b's move reads and no
 * write has written, or UINT32_MAX: every one it reads was written. */
static inline uint32_t sec_unwritten(const kvf_engine *e, const batch *b, uint64_t s)
{
    if (e->sec[s].pools == e->npools)
        return UINT32_MAX;
    bool some = b->sel && !b->sel->whole;
    uint32_t n = some ? b->sel->n : e->npools;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t p = some ? b->sel->order[k] : k;
        if (!sec_pool_written(e, s, p))
            return p;
    }
    return UINT32_MAX;
}

/* The failed write a slot's data comes from, 0 if it is good: a failure
 * counts until a later write was queued there (and is pending or done). */
static inline uint64_t slot_poison(const hazard *h)
{
    return h->poison == h->writer ? h->poison : 0;
}
/* ---- engine lifetime ----------------------------------------------------- */

/* Takes the engine lock. With the timeline on, a wait of more than 20 us
 * is recorded with the line that waited: who holds the lock up. */
#define engine_lock(e) engine_lock_at((e), __LINE__)
static inline void engine_lock_at(kvf_engine *e, int line)
{
    if (!kvf__timeline_on || pthread_mutex_trylock(&e->mu) != 0) {
        uint64_t t0 = kvf__timeline_on ? kvf__now_ns() : 0;
        pthread_mutex_lock(&e->mu);
        if (t0) {
            uint64_t waited = kvf__now_ns() - t0;
            if (waited > 20000)
                KVF_TIMELINE(KVF_TL_LOCKWAIT, (uint64_t)line, waited);
        }
    }
}

#endif /* KVF_ENGINE_PRIVATE_H */
