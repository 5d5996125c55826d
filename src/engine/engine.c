/*
 * The engine: pools and slots, batches of moves, hazards between them,
 * completion with a status per move, and sync with a caller's stream.
 *
 * Scheduling. Every batch is checked and registered under the engine lock:
 * for each slot or file it reads it depends on the pending writer (read
 * after write); for each one it writes, on the pending writer and on every
 * pending reader (write after write, write after read). A batch whose
 * dependencies have all completed is ready. Ready batches wait in one FIFO
 * per queue (onboards first); worker threads take chunks of a ready batch's
 * moves, so one large batch is spread across all workers. A backend with
 * asynchronous copies (CUDA) gets a ready copy batch in one call instead,
 * and reports its completion from a driver callback.
 *
 * Lost data is never served. A move that fails marks what it wrote as
 * poisoned with its batch id; a move that was queued to read that data
 * (it recorded the writer's id at submit time) then fails with
 * KVF_ERR_LOST instead of copying it. Secondary slots stay poisoned until
 * rewritten; a failed file write removes the file.
 */
#include "engine.h"
#include "backend.h"
#include "blockfile.h"
#include "blockhdr.h"
#include "config.h"
#include "fileio.h"
#include "gds.h"
#include "layout.h"
#include "log.h"
#include "remote.h"
#include "status.h"
#include "timeline.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef enum op_kind {
    OP_OFFLOAD_HOST,
    OP_OFFLOAD_FILE,
    OP_ONBOARD_HOST,
    OP_ONBOARD_FILE,
    OP_COPY,
    OP_DEMOTE,         /* secondary slot -> file */
    OP_PROMOTE,        /* file -> secondary slot */
    OP_REMOVE,         /* file removed: src = dst = key */
    OP_OFFLOAD_REMOTE, /* primary slot -> remote key */
    OP_ONBOARD_REMOTE, /* remote key -> primary slot */
    OP_REMOVE_REMOTE,  /* remote key removed: src = dst = key */
    OP_FENCE           /* nothing moved: completes once the primary slot src = dst
                          is written by what was queued before */
} op_kind;

static const char *const op_names[] = {"offload to host",
                                       "offload to file",
                                       "onboard from host",
                                       "onboard from file",
                                       "copy",
                                       "demote to file",
                                       "promote from file",
                                       "remove file",
                                       "offload to remote",
                                       "onboard from remote",
                                       "remove remote",
                                       "fence"};

/* The three spaces a move addresses: primary slots, secondary slots, files. */
typedef enum space { SP_PRIMARY, SP_SECONDARY, SP_FILE, SP_REMOTE } space;

typedef enum batch_state { B_WAITING, B_READY, B_RUNNING, B_DONE } batch_state;

typedef struct batch batch;

/* What was queued on one slot or file, by batch id (see pending_batch).
 * Slots' entries are left as they are when a batch completes, so that a
 * completion touches none of them: the ids of batches since done are
 * told apart when the entry is next registered on. Files' and remote
 * blocks' entries are cleared at completion, and dropped once empty. */
typedef struct hazard {
    uint64_t writer; /* the last batch queued to write here, 0: none */
    /* readers queued since `writer`: the first inline (the common case,
     * and one cache miss fewer per move), the others in `more` */
    uint64_t reader0;
    uint64_t *more;
    uint32_t nreaders, cap;
    /* the last batch whose write here failed, 0: none. A slot's is only
     * current while that batch is still `writer` (see slot_poison). */
    uint64_t poison;
} hazard;

typedef struct file_hazard {
    uint64_t key;
    hazard hz;
    struct file_hazard *next;
} file_hazard;

/* The hazards of keyed objects (files, remote blocks): an entry exists
 * only while something is pending on its key, or its last write failed. */
typedef struct key_table {
    file_hazard **buckets;
    size_t nbuckets, count;
} key_table;

struct batch {
    uint64_t id;
    op_kind kind;
    kvf__queue queue;
    size_t n, cap; /* moves, and room for them in the arrays below */
    kvf_move *moves;
    kvf_status *status; /* KVF_INPROGRESS until the move is done */
    uint64_t *src_dep;  /* per move: id of the write it reads, 0: none */
    batch_state state;
    uint32_t deps_left;
    uint64_t dep_mark; /* the last batch that counted this one as a dependency */
    batch **dependents;
    size_t ndependents, dependents_cap;
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
    batch *next_ready;
    batch *prev_undone, *next_undone; /* every batch not done, in id order */
    batch *next_ticket;
    uint64_t remote_deadline_ns; /* remote kinds: set when the first chunk is claimed */
    /* the failed moves' messages, for the ticket's caller (move_failed):
     * pushed by whichever thread fails a move, so a lock-free stack */
    _Atomic(kvf__move_error *) errors;
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

typedef struct worker {
    kvf_engine *engine;
    pthread_t thread;
    /* file I/O: room for a chunk of moves, each a header + one block of
     * every pool padded to the O_DIRECT alignment */
    uint8_t *staging;
    size_t staging_bytes;
    kvf__gds_buf *gstaging; /* the GDS path's: device memory, registered with cuFile */
    uint8_t *rstaging;      /* blocks of a remote batch, back to back */
    size_t rstaging_bytes;
    kvf__blockfile_io *ios;
    kvf__copy *copies;
    size_t *io_moves;
    size_t nios;
    struct batch *file_batch; /* the batch run_file_moves works on */
    /* file-tier time, logged at KVF_LOG=debug when the engine ends: where a
     * chunk's wall time goes (its slot <-> staging copies run inside it,
     * on the I/O runner's threads too, hence the atomic) */
    uint64_t file_chunks, file_moves, file_ns;
    _Atomic uint64_t copy_ns;
} worker;

#define TICKET_BUCKETS 1024u
/* File staging of one worker, at most: bounds a chunk of file moves. */
#define FILE_STAGING_BUDGET ((size_t)64 << 20)

/* One finished chunk of an async copy batch, as the backend reported it. */
typedef struct async_event {
    batch *b;
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

    hazard *hz_primary, *hz_secondary;
    uint32_t *sec_tokens; /* tokens a secondary slot will hold once queued writes land */
    key_table files, remotes;
    uint64_t *mark_primary, *mark_secondary; /* batch checks' stamps, see check_moves */

    bool file_enabled;
    kvf__blockfile_dir dir;
    kvf__fileio_runner *fio;
    bool gds; /* moves between primary slots and files go through cuFile */
    kvf__gds_probe gds_probe;

    /* The remote tier: connected on first use, and again (at most once a
     * second) after that failed. */
    char *remote_url;
    kvf__remote *remote;
    pthread_mutex_t remote_mu;
    uint64_t remote_retry_ns;
    char remote_why[192]; /* why the last connection failed, for the moves it fails */

    /* File keys whose last write failed and whose old file could not be
     * removed (kvf__blockfile_discard): refused with KVF_ERR_LOST until
     * written (or removed) again. Entries have no hazard; lost_mu guards. */
    key_table lost_files;
    pthread_mutex_t lost_mu;

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
     * cost fresh pages from the kernel on every submit. */
    pthread_mutex_t spare_mu;
    /* held across a whole submit, so the parts of a batch are registered
     * with nothing in between even while `mu` is dropped to issue one */
    pthread_mutex_t submit_mu;
    batch *spare[40]; /* room for a large batch's parts in both directions */
    uint32_t nspare;

    worker *workers;
    uint32_t nworkers;
    bool stop;

    /* Completions of async copy batches. The backend's callback runs on
     * its completion thread, which watches every queue, so it must not
     * wait for `mu` (held for a while by a submit registering a large
     * batch): it completes a chunk itself when `mu` is free and otherwise
     * queues it here, for the engine's completion thread to take. */
    pthread_mutex_t cb_mu;
    pthread_cond_t cb_cv;
    async_event *cb_events, *cb_spare;
    size_t cb_n, cb_cap, cb_spare_cap;
    bool cb_stop, cb_started;
    pthread_t cb_thread;
};

/* ---- small helpers -------------------------------------------------------- */

static uint32_t eff_tokens(const kvf_engine *e, uint32_t tokens)
{
    uint32_t tpb = e->pools[0].g.tokens_per_block;
    return (tokens == 0 || tokens >= tpb) ? tpb : tokens;
}

static uint8_t *slot_addr(const mem_array *m, uint64_t slot)
{
    return m->base + (size_t)slot * m->stride;
}

static space kind_reads(op_kind k)
{
    switch (k) {
    case OP_ONBOARD_HOST:
    case OP_DEMOTE:
        return SP_SECONDARY;
    case OP_ONBOARD_FILE:
    case OP_PROMOTE:
    case OP_REMOVE:
        return SP_FILE;
    case OP_ONBOARD_REMOTE:
    case OP_REMOVE_REMOTE:
        return SP_REMOTE;
    default:
        return SP_PRIMARY;
    }
}

static space kind_writes(op_kind k)
{
    switch (k) {
    case OP_OFFLOAD_HOST:
    case OP_PROMOTE:
        return SP_SECONDARY;
    case OP_OFFLOAD_FILE:
    case OP_DEMOTE:
    case OP_REMOVE:
        return SP_FILE;
    case OP_OFFLOAD_REMOTE:
    case OP_REMOVE_REMOTE:
        return SP_REMOTE;
    default:
        return SP_PRIMARY;
    }
}

static kvf__queue kind_queue(op_kind k)
{
    switch (k) {
    case OP_OFFLOAD_HOST:
    case OP_OFFLOAD_FILE:
    case OP_DEMOTE:
    case OP_REMOVE:
    case OP_OFFLOAD_REMOTE:
    case OP_REMOVE_REMOTE:
        return KVF_QUEUE_OFFLOAD;
    default:
        return KVF_QUEUE_ONBOARD;
    }
}

static bool kind_is_file(op_kind k)
{
    return kind_reads(k) == SP_FILE || kind_writes(k) == SP_FILE;
}

static bool kind_is_remote(op_kind k)
{
    return kind_reads(k) == SP_REMOTE || kind_writes(k) == SP_REMOTE;
}

/* Kinds whose moves run on the worker threads through a staging buffer,
 * never as asynchronous backend copies. */
static bool kind_on_workers(op_kind k)
{
    return kind_is_file(k) || kind_is_remote(k) || k == OP_FENCE;
}

/* Kinds that only remove a keyed object: they read nothing, so a failed
 * write before them is no loss. */
static bool kind_removes(op_kind k)
{
    return k == OP_REMOVE || k == OP_REMOVE_REMOTE;
}

/* Whether a kind touches secondary slots, which every pool must then have. */
static bool kind_uses_secondary(op_kind k)
{
    return kind_reads(k) == SP_SECONDARY || kind_writes(k) == SP_SECONDARY;
}

static size_t key_bucket(const key_table *t, uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)(key & (t->nbuckets - 1));
}

static kvf_status key_table_grow(key_table *t)
{
    size_t nb = t->nbuckets ? t->nbuckets * 2 : 256;
    file_hazard **nbk = calloc(nb, sizeof *nbk);
    if (!nbk)
        return kvf__fail(KVF_ERR_NOMEM, "engine: out of memory for a hazard table");
    size_t old_nb = t->nbuckets;
    file_hazard **old = t->buckets;
    t->buckets = nbk;
    t->nbuckets = nb;
    for (size_t i = 0; i < old_nb; i++) {
        for (file_hazard *f = old[i], *next; f; f = next) {
            next = f->next;
            size_t b = key_bucket(t, f->key);
            f->next = nbk[b];
            nbk[b] = f;
        }
    }
    free(old);
    return KVF_OK;
}

static hazard *key_hazard(key_table *t, uint64_t key, bool create)
{
    if (t->nbuckets) {
        for (file_hazard *f = t->buckets[key_bucket(t, key)]; f; f = f->next)
            if (f->key == key)
                return &f->hz;
    }
    if (!create)
        return NULL;
    if (t->count + 1 > t->nbuckets && key_table_grow(t) != KVF_OK)
        return NULL;
    file_hazard *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->key = key;
    size_t b = key_bucket(t, key);
    f->next = t->buckets[b];
    t->buckets[b] = f;
    t->count++;
    return &f->hz;
}

static void key_table_free(key_table *t)
{
    for (size_t i = 0; i < t->nbuckets; i++)
        for (file_hazard *f = t->buckets[i], *next; f; f = next) {
            next = f->next;
            free(f->hz.more);
            free(f);
        }
    free(t->buckets);
    *t = (key_table){0};
}

/* The hazard of one slot or keyed object; keyed ones get an entry on
 * demand when `create` is set (NULL when out of memory or absent). */
static inline __attribute__((always_inline)) hazard *hazard_of(kvf_engine *e, space sp,
                                                               uint64_t idx, bool create)
{
    if (sp == SP_PRIMARY)
        return &e->hz_primary[idx];
    if (sp == SP_SECONDARY)
        return &e->hz_secondary[idx];
    return key_hazard(sp == SP_FILE ? &e->files : &e->remotes, idx, create);
}

/* Moves ahead that the hazard passes prefetch: their slots are scattered,
 * and each entry is a cache miss that the loop would otherwise wait for. */
#define PREFETCH_AHEAD 16u

/* always inlined: GCC finds an out-of-line prefetch function free of side
 * effects, and drops its calls */
static inline __attribute__((always_inline)) void hazard_prefetch(const kvf_engine *e, space sp,
                                                                  uint64_t idx)
{
    /* both ends: an entry is 40 bytes, and 3 in 8 of them cross a line
     * whose miss the loop then waits for (H200, 65536 moves of 4 KiB
     * through the engine: 27-29 GB/s d2h with one prefetch, 35-37 with two) */
    const hazard *h = sp == SP_PRIMARY     ? &e->hz_primary[idx]
                      : sp == SP_SECONDARY ? &e->hz_secondary[idx]
                                           : NULL;
    if (h) {
        __builtin_prefetch(h);
        __builtin_prefetch((const char *)(h + 1) - 1);
    }
}

/* Prefetches the entries of move i + PREFETCH_AHEAD of moves[0..n). */
static inline __attribute__((always_inline)) void
move_prefetch(const kvf_engine *e, space rs, space ws, const kvf_move *moves, size_t i, size_t n)
{
    if (i + PREFETCH_AHEAD < n) {
        const kvf_move *m = &moves[i + PREFETCH_AHEAD];
        hazard_prefetch(e, rs, m->src);
        hazard_prefetch(e, ws, m->dst);
        if (ws == SP_SECONDARY)
            __builtin_prefetch(&e->sec_tokens[m->dst]);
    }
}

static uint64_t hazard_reader(const hazard *h, uint32_t k)
{
    return k == 0 ? h->reader0 : h->more[k - 1];
}

static void hazard_set_reader(hazard *h, uint32_t k, uint64_t id)
{
    if (k == 0)
        h->reader0 = id;
    else
        h->more[k - 1] = id;
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

/* The failed write a slot's data comes from, 0 if it is good: a failure
 * counts until a later write was queued there (and is pending or done). */
static uint64_t slot_poison(const hazard *h)
{
    return h->poison == h->writer ? h->poison : 0;
}

/* Leaves in a slot's readers only those not done yet. */
static void hazard_prune_readers(const kvf_engine *e, hazard *h)
{
    uint32_t kept = 0;
    for (uint32_t k = 0; k < h->nreaders; k++) {
        uint64_t id = hazard_reader(h, k);
        if (pending_batch(e, id))
            hazard_set_reader(h, kept++, id);
    }
    h->nreaders = kept;
}

/* Drops a keyed entry with nothing pending and nothing to remember. */
static void key_hazard_prune(key_table *t, uint64_t key)
{
    file_hazard **pp = &t->buckets[key_bucket(t, key)];
    for (; *pp; pp = &(*pp)->next) {
        file_hazard *f = *pp;
        if (f->key != key)
            continue;
        if (f->hz.writer || f->hz.nreaders)
            return;
        *pp = f->next;
        free(f->hz.more);
        free(f);
        t->count--;
        return;
    }
}

static bool push_id(uint64_t **arr, uint32_t n, uint32_t *cap, uint64_t id)
{
    if (n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 4;
        uint64_t *na = realloc(*arr, nc * sizeof *na);
        if (!na)
            return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[n] = id;
    return true;
}

static bool push_ptr(batch ***arr, size_t *n, size_t *cap, batch *b)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        batch **na = realloc(*arr, nc * sizeof *na);
        if (!na)
            return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = b;
    return true;
}

static void batch_destroy(batch *b)
{
    if (!b)
        return;
    kvf__move_errors_free(atomic_load(&b->errors));
    free(b->moves);
    free(b->status);
    free(b->src_dep);
    free(b->dependents);
    free(b->copies);
    free(b->order);
    free(b);
}

/* A batch with room for n moves, reset, from the spares when one fits. A
 * group's src_dep is not used (its parts have their own). */
static batch *batch_get(kvf_engine *e, size_t n, bool group)
{
    batch *b = NULL;
    pthread_mutex_lock(&e->spare_mu);
    for (uint32_t i = 0; i < e->nspare; i++)
        if (e->spare[i]->cap >= n) {
            b = e->spare[i];
            e->spare[i] = e->spare[--e->nspare];
            break;
        }
    pthread_mutex_unlock(&e->spare_mu);
    if (b) {
        batch keep = *b;
        memset(b, 0, sizeof *b);
        b->moves = keep.moves;
        b->status = keep.status;
        b->src_dep = keep.src_dep;
        b->cap = keep.cap;
        b->dependents = keep.dependents;
        b->dependents_cap = keep.dependents_cap;
        b->copies = keep.copies;
        b->copies_cap = keep.copies_cap;
        b->order = keep.order;
        b->order_cap = keep.order_cap;
        if (!group)
            memset(b->src_dep, 0, n * sizeof *b->src_dep);
        return b;
    }
    b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->moves = malloc(n * sizeof *b->moves);
    b->status = malloc(n * sizeof *b->status);
    b->src_dep = calloc(n, sizeof *b->src_dep);
    b->cap = n;
    if (!b->moves || !b->status || !b->src_dep) {
        batch_destroy(b);
        return NULL;
    }
    return b;
}

static void batch_free(batch *b)
{
    kvf_engine *e = b->engine;
    kvf__move_errors_free(atomic_exchange(&b->errors, NULL));
    pthread_mutex_lock(&e->spare_mu);
    if (e->nspare < sizeof e->spare / sizeof e->spare[0]) {
        e->spare[e->nspare++] = b;
        b = NULL;
    }
    pthread_mutex_unlock(&e->spare_mu);
    batch_destroy(b);
}

/* Frees a batch once nothing refers to it any more. Lock held. */
static void batch_release(batch *b)
{
    if (b->state == B_DONE && (!b->ticketed || b->retired))
        batch_free(b);
}

/* ---- failed moves' messages ----------------------------------------------- */

kvf__move_error *kvf__move_error_new(size_t index, kvf_status status, const char *message)
{
    size_t len = strnlen(message, KVF_MOVE_ERROR_MESSAGE - 1);
    kvf__move_error *r = malloc(sizeof *r + len + 1);
    if (!r)
        return NULL;
    r->next = NULL;
    r->index = index;
    r->status = status;
    memcpy(r->message, message, len);
    r->message[len] = '\0';
    return r;
}

void kvf__move_errors_free(kvf__move_error *list)
{
    while (list) {
        kvf__move_error *next = list->next;
        free(list);
        list = next;
    }
}

void kvf__move_errors_deliver(kvf__move_error *list, kvf_move_error *out, size_t cap, size_t *n_p)
{
    size_t n = 0;
    for (const kvf__move_error *r = list; r; r = r->next, n++) {
        if (n >= cap)
            continue;
        out[n].index = r->index;
        out[n].status = r->status;
        memcpy(out[n].message, r->message, strlen(r->message) + 1);
    }
    if (n_p)
        *n_p = n;
    kvf__move_errors_free(list);
}

/* Whether anyone will read a failed move's message: a ticket's holder. */
static bool keeps_errors(const batch *b)
{
    return b->ticketed || (b->group && b->group->ticketed);
}

static void push_error(batch *b, kvf__move_error *r)
{
    r->next = atomic_load(&b->errors);
    while (!atomic_compare_exchange_weak(&b->errors, &r->next, r))
        ;
}

/* Fails move i with `st` and, for a ticket's holder, keeps why (the
 * specific detail: kvf_wait_errors). Called by whoever owns the move's
 * status; a message that finds no memory is replaced by the status's
 * text when the ticket retires. */
static void move_failed(batch *b, size_t i, kvf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void move_failed(batch *b, size_t i, kvf_status st, const char *fmt, ...)
{
    b->status[i] = st;
    if (!keeps_errors(b))
        return;
    char msg[KVF_MOVE_ERROR_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvf__move_error *r = kvf__move_error_new(i, st, msg);
    if (r)
        push_error(b, r);
}

static int cmp_error_index(const void *a, const void *b)
{
    const kvf__move_error *x = *(kvf__move_error *const *)a, *y = *(kvf__move_error *const *)b;
    return x->index < y->index ? -1 : x->index > y->index;
}

kvf__move_error *kvf__move_errors_sorted(kvf__move_error *list, const kvf_status *status, size_t n,
                                         const char *what)
{
    size_t nrec = 0;
    for (const kvf__move_error *r = list; r; r = r->next)
        nrec++;
    kvf__move_error **v = malloc((nrec ? nrec : 1) * sizeof *v);
    if (!v) {
        kvf__move_errors_free(list);
        return NULL;
    }
    nrec = 0;
    for (kvf__move_error *r = list; r; r = r->next)
        v[nrec++] = r;
    qsort(v, nrec, sizeof *v, cmp_error_index);
    kvf__move_error *head = NULL, **tail = &head;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        kvf__move_error *r = NULL;
        for (; k < nrec && v[k]->index <= i; k++) {
            if (v[k]->index == i && !r && status[i] != KVF_OK)
                r = v[k];
            else
                free(v[k]);
        }
        if (status[i] == KVF_OK)
            continue;
        if (!r) {
            char msg[128];
            snprintf(msg, sizeof msg, "%s %zu: %s", what, i, kvf_status_str(status[i]));
            r = kvf__move_error_new(i, status[i], msg);
            if (!r)
                continue;
        }
        r->status = status[i];
        *tail = r;
        tail = &r->next;
    }
    *tail = NULL;
    for (; k < nrec; k++)
        free(v[k]);
    free(v);
    return head;
}

/* A completed batch's messages (kvf__move_errors_sorted); NULL when
 * nothing failed. */
static kvf__move_error *collect_errors(batch *b, size_t failed)
{
    kvf__move_error *list = atomic_exchange(&b->errors, NULL);
    if (failed == 0) {
        kvf__move_errors_free(list);
        return NULL;
    }
    char what[64];
    snprintf(what, sizeof what, "%s: move", op_names[b->kind]);
    return kvf__move_errors_sorted(list, b->status, b->n, what);
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

static void *worker_main(void *arg);
static void *completion_main(void *arg);
static void completion_stop(kvf_engine *e);

/* Chooses the file tier's path (see kvf_gds_compat): e->gds set when
 * cuFile is taken, its driver then held until the engine is destroyed.
 * Never fails: where GDS was asked for and is not to be had, the POSIX
 * path serves, with one warning a process naming why. */
static void gds_setup(kvf_engine *e)
{
    static atomic_bool warned;
    kvf_file_io io = e->cfg.file_io;
    if (io == KVF_FILE_IO_POSIX)
        return;
    kvf_gds_compat compat = kvf__gds_compat_of(e->cfg.gds_compat);
    char why[sizeof e->gds_probe.detail + 96];
    kvf_status st = KVF_ERR_UNSUPPORTED;
    if (e->backend_kind != KVF_BACKEND_CUDA) {
        e->gds_probe.found = KVF_GDS_STATE_ABSENT;
        snprintf(e->gds_probe.detail, sizeof e->gds_probe.detail,
                 "the host backend keeps no block in device memory");
        snprintf(why, sizeof why, "%s", e->gds_probe.detail);
    } else {
        st = kvf__gds_acquire(compat, &e->gds_probe);
        /* a file system cuFile refuses would send every block through host
         * memory twice: the POSIX path instead, unless compat mode is on */
        if (kvf__gds_choose(io, compat, &e->gds_probe, why, sizeof why) &&
            (compat == KVF_GDS_COMPAT_ON || kvf__gds_dir_usable(e->dir.root, why, sizeof why))) {
            e->gds = true;
            KVF_LOG(KVF_LOG_INFO, "file tier: GPUDirect Storage, cuFile %s", e->gds_probe.detail);
            return;
        }
    }
    if (st == KVF_OK)
        kvf__gds_release();
    kvf__clear_error();
    if (io == KVF_FILE_IO_GDS && !atomic_exchange(&warned, true))
        KVF_LOG(KVF_LOG_WARN, "file tier: GPUDirect Storage not used (%s): POSIX path", why);
    else
        KVF_LOG(KVF_LOG_INFO, "file tier: POSIX path (%s)", why);
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Checks the remote tier's URL (the resolved config's) and keeps it for
 * the first use. A URL the caller or the file names that this build cannot
 * serve is an error; one from the environment only a warning. */
static kvf_status remote_setup(kvf_engine *e, const kvf_engine_config *c)
{
    const char *url = c->remote_url;
    if (!url)
        return KVF_OK;
    bool from_env = kvf__setting_source(e->settings, e->nsettings, "remote_url") == KVF_SOURCE_ENV;
    if (!kvf__remote_built()) {
        if (from_env) {
            KVF_LOG(KVF_LOG_WARN,
                    "%s is set, but this build has no Redis client (hiredis): "
                    "no remote tier",
                    KVF_REMOTE_URL_ENV);
            return KVF_OK;
        }
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "kvf_engine_create: remote_url set, but this build has no Redis client "
                         "(hiredis)");
    }
    kvf__remote_url parsed;
    kvf_status st = kvf__remote_url_parse(url, &parsed);
    if (st != KVF_OK)
        return kvf__fail(st, "kvf_engine_create: %s%s", from_env ? KVF_REMOTE_URL_ENV ": " : "",
                         kvf_last_error());
    if (!kvf__ns_valid(e->file_namespace))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_engine_create: namespace \"%s\" (the remote tier needs "
                         "[A-Za-z0-9._-]{1,64})",
                         e->file_namespace);
    e->remote_url = strdup(url);
    if (!e->remote_url)
        return kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: out of memory");
    return KVF_OK;
}

kvf_status kvf_engine_create(const kvf_engine_config *cfg, kvf_engine **engine_p)
{
    kvf__clear_error();
    kvf__timeline_setup();
    if (!engine_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_create: engine_p is NULL");
    kvf_engine_config c = KVF_ENGINE_CONFIG_INIT;
    if (cfg) {
        /* a caller built against an older, shorter struct gets defaults
         * for the fields it does not know */
        if (cfg->struct_size < offsetof(kvf_engine_config, backend) + sizeof cfg->backend ||
            cfg->struct_size > 4096)
            return kvf__fail(KVF_ERR_INVALID,
                             "kvf_engine_create: struct_size %zu (start from "
                             "KVF_ENGINE_CONFIG_INIT)",
                             cfg->struct_size);
        memcpy(&c, cfg, cfg->struct_size < sizeof c ? cfg->struct_size : sizeof c);
        c.struct_size = sizeof c;
    }
    if ((unsigned)c.backend > KVF_BACKEND_CUDA || (unsigned)c.file_io > KVF_FILE_IO_GDS ||
        (unsigned)c.fsync > KVF_FSYNC_BLOCK || (unsigned)c.cuda_copy > KVF_CUDA_COPY_DMA ||
        (unsigned)c.file_engine > KVF_FILE_ENGINE_THREADS ||
        (unsigned)c.gds_compat > KVF_GDS_COMPAT_ON)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_create: an enum field is out of range");
    if (c.threads > 256)
        return kvf__fail(KVF_ERR_RANGE, "kvf_engine_create: threads %u (at most 256)", c.threads);
    /* fields left at their defaults: from the environment or config file */
    kvf_setting *settings;
    size_t nsettings;
    kvf_status st = kvf__engine_config_resolve(&c, &c, &settings, &nsettings);
    if (st != KVF_OK) {
        /* a setting the operator got wrong: said where they will look */
        kvf__fail(st, "kvf_engine_create: %s", kvf_last_error());
        KVF_LOG(KVF_LOG_ERROR, "%s", kvf_last_error());
        return st;
    }

    kvf_engine *e = calloc(1, sizeof *e);
    if (!e) {
        free(settings);
        return kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: out of memory");
    }
    st = KVF_ERR_NOMEM;
    e->settings = settings;
    e->nsettings = nsettings;
    e->cfg = c;
    e->next_id = 1;
    e->file_dir = dup_or_null(c.file_dir);
    e->file_namespace = strdup(c.file_namespace ? c.file_namespace : "default");
    if ((c.file_dir && !e->file_dir) || !e->file_namespace) {
        kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: out of memory");
        goto free_engine;
    }
    e->cfg.file_dir = e->file_dir;
    e->cfg.file_namespace = e->file_namespace;
    e->dir.dir_fd = -1;

    if (c.backend == KVF_BACKEND_CUDA || c.backend == KVF_BACKEND_AUTO) {
        st = kvf__cuda_backend_create(&e->cfg, &e->backend);
        if (st == KVF_OK) {
            e->backend_kind = KVF_BACKEND_CUDA;
        } else if (c.backend == KVF_BACKEND_CUDA) {
            goto free_engine;
        } else {
            KVF_LOG(KVF_LOG_INFO, "no usable GPU (%s): host backend", kvf_last_error());
        }
    }
    if (!e->backend) {
        st = kvf__host_backend_create(&e->backend);
        if (st != KVF_OK)
            goto free_engine;
        e->backend_kind = KVF_BACKEND_HOST;
    }

    if (e->file_dir) {
        st = kvf__blockfile_open_dir(e->file_dir, e->file_namespace, 0, c.fsync, &e->dir);
        if (st != KVF_OK)
            goto destroy_backend;
        kvf__blockfile_remove_stale(&e->dir);
        e->file_enabled = true;
        gds_setup(e);
    }

    st = remote_setup(e, &c);
    if (st != KVF_OK)
        goto close_dir;

    if (pthread_mutex_init(&e->mu, NULL) != 0 || pthread_mutex_init(&e->spare_mu, NULL) != 0 ||
        pthread_mutex_init(&e->submit_mu, NULL) != 0 ||
        pthread_mutex_init(&e->remote_mu, NULL) != 0 ||
        pthread_mutex_init(&e->lost_mu, NULL) != 0) {
        st = kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: pthread_mutex_init failed");
        goto close_dir;
    }
    pthread_cond_init(&e->work_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    pthread_mutex_init(&e->cb_mu, NULL);
    pthread_cond_init(&e->cb_cv, NULL);
    if (e->backend->ops->copy_async) {
        int rc = pthread_create(&e->cb_thread, NULL, completion_main, e);
        if (rc != 0) {
            st = kvf__fail(kvf__errno_status(rc), "kvf_engine_create: pthread_create: %s",
                           strerror(rc));
            goto destroy_sync;
        }
        e->cb_started = true;
    }

    uint32_t nthreads = c.threads;
    if (nthreads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = cores < 1 ? 1 : cores > 4 ? 4 : (uint32_t)cores;
    }
    if (e->file_enabled) {
        /* cuFile's calls run on the thread runner's threads (not io_uring) */
        st = kvf__fileio_runner_create(e->gds ? KVF_FILE_ENGINE_THREADS : c.file_engine,
                                       c.file_queue_depth, nthreads, &e->fio);
        if (st != KVF_OK)
            goto destroy_sync;
        e->dir.fio = e->fio;
    }
    e->workers = calloc(nthreads, sizeof *e->workers);
    if (!e->workers) {
        st = kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: out of memory");
        goto destroy_sync;
    }
    for (uint32_t i = 0; i < nthreads; i++) {
        e->workers[i].engine = e;
        int rc = pthread_create(&e->workers[i].thread, NULL, worker_main, &e->workers[i]);
        if (rc != 0) {
            st = kvf__fail(kvf__errno_status(rc), "kvf_engine_create: pthread_create: %s",
                           strerror(rc));
            goto stop_workers;
        }
        e->nworkers++;
    }
    KVF_LOG(KVF_LOG_INFO, "engine: %s backend, %u workers%s%s%s", e->backend->ops->name,
            e->nworkers, e->file_enabled ? ", files in " : "", e->file_enabled ? e->dir.root : "",
            !e->fio                                                    ? ""
            : kvf__fileio_runner_type(e->fio) == KVF_FILE_ENGINE_URING ? " (io_uring)"
                                                                       : " (threads)");
    *engine_p = e;
    return KVF_OK;

stop_workers:
    engine_lock(e);
    e->stop = true;
    pthread_cond_broadcast(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    for (uint32_t i = 0; i < e->nworkers; i++)
        pthread_join(e->workers[i].thread, NULL);
    free(e->workers);
destroy_sync:
    completion_stop(e);
    kvf__fileio_runner_destroy(e->fio);
    pthread_cond_destroy(&e->done_cv);
    pthread_cond_destroy(&e->work_cv);
    pthread_mutex_destroy(&e->mu);
close_dir:
    if (e->gds)
        kvf__gds_release();
    free(e->remote_url);
    kvf__blockfile_close_dir(&e->dir);
destroy_backend:
    e->backend->ops->destroy(e->backend);
free_engine:
    free(e->file_dir);
    free(e->file_namespace);
    free(e->settings);
    free(e);
    return st;
}

static void mem_array_release(kvf_engine *e, mem_array *m)
{
    if (m->owned)
        e->backend->ops->mem_free(e->backend, m->kind, m->base);
    else if (m->registered)
        e->backend->ops->mem_unregister(e->backend, m->kind, m->base);
}

void kvf_engine_destroy(kvf_engine *e)
{
    if (!e)
        return;
    engine_lock(e);
    while (e->undone_count)
        pthread_cond_wait(&e->done_cv, &e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    for (uint32_t i = 0; i < e->nworkers; i++)
        pthread_join(e->workers[i].thread, NULL);
    completion_stop(e);
    kvf_memory staging_kind =
        e->backend_kind == KVF_BACKEND_CUDA ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST;
    for (uint32_t i = 0; i < e->nworkers; i++) {
        const worker *w = &e->workers[i];
        if (w->file_chunks)
            KVF_LOG(KVF_LOG_DEBUG,
                    "engine: worker %u: %llu file chunks, %llu moves, %.1f ms in them, of "
                    "which %.1f ms copying between slots and staging",
                    i, (unsigned long long)w->file_chunks, (unsigned long long)w->file_moves,
                    (double)w->file_ns / 1e6, (double)atomic_load(&w->copy_ns) / 1e6);
        if (e->workers[i].staging)
            e->backend->ops->mem_free(e->backend, staging_kind, e->workers[i].staging);
        if (e->workers[i].rstaging)
            e->backend->ops->mem_free(e->backend, staging_kind, e->workers[i].rstaging);
        kvf__gds_buf_destroy(e->workers[i].gstaging);
        free(e->workers[i].ios);
        free(e->workers[i].copies);
        free(e->workers[i].io_moves);
    }
    free(e->workers);
    kvf__fileio_runner_destroy(e->fio);
    if (e->gds)
        kvf__gds_release();
    for (size_t i = 0; i < TICKET_BUCKETS; i++)
        for (batch *b = e->tickets[i], *next; b; b = next) {
            next = b->next_ticket;
            batch_destroy(b);
        }
    for (uint32_t i = 0; i < e->nspare; i++)
        batch_destroy(e->spare[i]);
    pthread_mutex_destroy(&e->spare_mu);
    pthread_mutex_destroy(&e->submit_mu);
    for (uint32_t p = 0; p < e->npools; p++) {
        mem_array_release(e, &e->pools[p].primary);
        if (e->pools[p].has_secondary)
            mem_array_release(e, &e->pools[p].secondary);
    }
    free(e->pools);
    if (e->hz_primary)
        for (uint32_t i = 0; i < e->primary_slots; i++)
            free(e->hz_primary[i].more);
    if (e->hz_secondary)
        for (uint32_t i = 0; i < e->secondary_slots; i++)
            free(e->hz_secondary[i].more);
    free(e->hz_primary);
    free(e->hz_secondary);
    free(e->live);
    free(e->sec_tokens);
    key_table_free(&e->files);
    key_table_free(&e->remotes);
    kvf__remote_close(e->remote);
    free(e->remote_url);
    pthread_mutex_destroy(&e->remote_mu);
    key_table_free(&e->lost_files);
    pthread_mutex_destroy(&e->lost_mu);
    free(e->mark_primary);
    free(e->mark_secondary);
    free(e->sort_count);
    kvf__blockfile_close_dir(&e->dir);
    e->backend->ops->destroy(e->backend);
    pthread_cond_destroy(&e->done_cv);
    pthread_cond_destroy(&e->work_cv);
    pthread_mutex_destroy(&e->mu);
    free(e->file_dir);
    free(e->file_namespace);
    free(e->settings);
    free(e);
    kvf__timeline_flush();
}

kvf_backend kvf_engine_backend(const kvf_engine *e)
{
    return e ? e->backend_kind : KVF_BACKEND_AUTO;
}

const char *kvf_tier_name(kvf_tier tier)
{
    switch (tier) {
    case KVF_TIER_HOST:
        return "host";
    case KVF_TIER_DISK:
        return "disk";
    case KVF_TIER_REMOTE:
        return "remote";
    case KVF_TIER_GPU:
        return "gpu";
    case KVF_TIER_COUNT:
        break;
    }
    return "?";
}

const char *kvf_backend_name(kvf_backend backend)
{
    switch (backend) {
    case KVF_BACKEND_AUTO:
        return "auto";
    case KVF_BACKEND_HOST:
        return "host";
    case KVF_BACKEND_CUDA:
        return "cuda";
    }
    return "?";
}

/* ---- pools ----------------------------------------------------------------- */

static kvf_status mem_array_setup(kvf_engine *e, uint32_t pool_idx, const char *what,
                                  const kvf_pool_desc *d, size_t block_bytes, bool primary,
                                  mem_array *m)
{
    if ((unsigned)d->memory > KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_INVALID, "pool %u: %s memory kind %d unknown", pool_idx, what,
                         (int)d->memory);
    if (d->slots == 0)
        return kvf__fail(KVF_ERR_INVALID, "pool %u: %s has 0 slots", pool_idx, what);
    bool cuda = e->backend_kind == KVF_BACKEND_CUDA;
    if (!cuda && d->memory == KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "pool %u: %s in device memory, but the engine runs on the host "
                         "backend",
                         pool_idx, what);
    if (cuda && primary && d->memory != KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "pool %u: the CUDA backend keeps primary slots in device memory",
                         pool_idx);
    if (cuda && !primary && d->memory == KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED, "pool %u: secondary slots live in host memory",
                         pool_idx);
    size_t stride = d->slot_stride ? d->slot_stride : block_bytes;
    if (stride < block_bytes)
        return kvf__fail(KVF_ERR_RANGE,
                         "pool %u: %s slot_stride %zu is below the block's %zu bytes", pool_idx,
                         what, stride, block_bytes);
    size_t bytes;
    if (kvf__mul_overflows(stride, d->slots, &bytes))
        return kvf__fail(KVF_ERR_RANGE, "pool %u: %s of %u slots of %zu bytes overflows", pool_idx,
                         what, d->slots, stride);
    memset(m, 0, sizeof *m);
    m->kind = d->memory;
    m->stride = stride;
    m->slots = d->slots;
    kvf_status st;
    if (d->base) {
        st = e->backend->ops->mem_register(e->backend, d->memory, d->base, bytes, &m->registered);
        if (st != KVF_OK)
            return kvf__fail(st, "pool %u: %s: %s", pool_idx, what, kvf_last_error());
        m->base = d->base;
    } else {
        void *p;
        st = e->backend->ops->mem_alloc(e->backend, d->memory, bytes, &p);
        if (st != KVF_OK)
            return kvf__fail(st, "pool %u: %s of %zu bytes: %s", pool_idx, what, bytes,
                             kvf_last_error());
        m->base = p;
        m->owned = true;
    }
    return KVF_OK;
}

kvf_status kvf_engine_add_pool(kvf_engine *e, const kvf_geometry *g, const kvf_pool_desc *primary,
                               const kvf_pool_desc *secondary, uint32_t *pool_p)
{
    kvf__clear_error();
    if (!e || !g || !primary)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_add_pool: engine, geometry and primary "
                                          "are required");
    pool p;
    memset(&p, 0, sizeof p);
    kvf_status st = kvf_geometry_block_bytes(g, &p.block_bytes);
    if (st != KVF_OK)
        return st;
    p.g = *g;
    p.rows =
        (size_t)g->layers * g->kv_factor * (g->order == KVF_ORDER_HEAD_MAJOR ? g->kv_heads : 1);
    p.pitch = p.block_bytes / p.rows;
    p.token_bits = p.pitch * 8 / g->tokens_per_block;

    engine_lock(e);
    uint32_t idx = e->npools;
    if (e->frozen) {
        st =
            kvf__fail(KVF_ERR_STATE, "pool %u: pools must be added before the first transfer", idx);
        goto unlock;
    }
    if (idx && e->pools[0].g.tokens_per_block != g->tokens_per_block) {
        st = kvf__fail(KVF_ERR_INVALID, "pool %u: tokens_per_block %u differs from pool 0's %u",
                       idx, g->tokens_per_block, e->pools[0].g.tokens_per_block);
        goto unlock;
    }
    if (idx == e->pools_cap) {
        uint32_t nc = e->pools_cap ? e->pools_cap * 2 : 4;
        pool *np = realloc(e->pools, nc * sizeof *np);
        if (!np) {
            st = kvf__fail(KVF_ERR_NOMEM, "pool %u: out of memory", idx);
            goto unlock;
        }
        e->pools = np;
        e->pools_cap = nc;
    }
    st = mem_array_setup(e, idx, "primary", primary, p.block_bytes, true, &p.primary);
    if (st != KVF_OK)
        goto unlock;
    if (secondary) {
        st = mem_array_setup(e, idx, "secondary", secondary, p.block_bytes, false, &p.secondary);
        if (st != KVF_OK) {
            mem_array_release(e, &p.primary);
            goto unlock;
        }
        p.has_secondary = true;
    }
    e->pools[e->npools++] = p;
    if (pool_p)
        *pool_p = idx;
unlock:
    pthread_mutex_unlock(&e->mu);
    return st;
}

uint32_t kvf_engine_pool_count(const kvf_engine *e)
{
    return e ? e->npools : 0;
}

kvf_status kvf_engine_slot_ptr(kvf_engine *e, uint32_t pool_idx, kvf_level level, uint32_t slot,
                               void **ptr_p)
{
    kvf__clear_error();
    if (!e || !ptr_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_slot_ptr: NULL argument");
    if (pool_idx >= e->npools)
        return kvf__fail(KVF_ERR_RANGE, "pool %u: no such pool (%u pools)", pool_idx, e->npools);
    const pool *p = &e->pools[pool_idx];
    if (level != KVF_LEVEL_PRIMARY && level != KVF_LEVEL_SECONDARY)
        return kvf__fail(KVF_ERR_INVALID, "pool %u: level %d unknown", pool_idx, (int)level);
    if (level == KVF_LEVEL_SECONDARY && !p->has_secondary)
        return kvf__fail(KVF_ERR_INVALID, "pool %u: no secondary slots", pool_idx);
    const mem_array *m = level == KVF_LEVEL_PRIMARY ? &p->primary : &p->secondary;
    if (slot >= m->slots)
        return kvf__fail(KVF_ERR_RANGE, "pool %u: %s slot %u out of range (%u slots)", pool_idx,
                         level == KVF_LEVEL_PRIMARY ? "primary" : "secondary", slot, m->slots);
    *ptr_p = slot_addr(m, slot);
    return KVF_OK;
}

/* Fixes the pools at the first transfer: the hazard tables and the file
 * layout fingerprint depend on them. Called with the lock held. */
static kvf_status freeze(kvf_engine *e)
{
    if (e->frozen)
        return KVF_OK;
    if (e->npools == 0)
        return kvf__fail(KVF_ERR_STATE, "engine: no pools added");
    uint32_t prim = UINT32_MAX, sec = UINT32_MAX;
    size_t all = 0;
    bool any_secondary = false;
    kvf_geometry *gs = malloc(e->npools * sizeof *gs);
    if (!gs)
        return kvf__fail(KVF_ERR_NOMEM, "engine: out of memory");
    for (uint32_t p = 0; p < e->npools; p++) {
        const pool *pl = &e->pools[p];
        gs[p] = pl->g;
        prim = pl->primary.slots < prim ? pl->primary.slots : prim;
        if (pl->has_secondary) {
            any_secondary = true;
            sec = pl->secondary.slots < sec ? pl->secondary.slots : sec;
        } else {
            sec = 0;
        }
        all += pl->block_bytes;
    }
    if (!any_secondary)
        sec = 0;
    e->hz_primary = calloc(prim, sizeof *e->hz_primary);
    e->hz_secondary = sec ? calloc(sec, sizeof *e->hz_secondary) : NULL;
    e->sec_tokens = sec ? calloc(sec, sizeof *e->sec_tokens) : NULL;
    e->mark_primary = calloc(prim, sizeof *e->mark_primary);
    e->mark_secondary = sec ? calloc(sec, sizeof *e->mark_secondary) : NULL;
    if (!e->hz_primary || !e->mark_primary ||
        (sec && (!e->hz_secondary || !e->sec_tokens || !e->mark_secondary))) {
        free(gs);
        free(e->hz_primary);
        free(e->hz_secondary);
        free(e->sec_tokens);
        free(e->mark_primary);
        free(e->mark_secondary);
        e->hz_primary = e->hz_secondary = NULL;
        e->sec_tokens = NULL;
        e->mark_primary = e->mark_secondary = NULL;
        return kvf__fail(KVF_ERR_NOMEM, "engine: out of memory for hazard tables");
    }
    e->dir.fingerprint = kvf__geometry_fingerprint(gs, e->npools);
    free(gs);
    e->primary_slots = prim;
    e->secondary_slots = sec;
    e->all_block_bytes = all;
    e->frozen = true;
    return KVF_OK;
}

/* ---- submission ----------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A batch may not write one destination twice, nor (kvf_copy) read a slot
 * that it also writes: the order inside a batch is not defined. File and
 * remote keys are sorted here; slots are stamped in check_moves. */
static kvf_status check_key_collisions(const kvf_move *moves, size_t n)
{
    uint64_t *v = malloc(n * sizeof *v);
    if (!v)
        return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory");
    for (size_t i = 0; i < n; i++)
        v[i] = moves[i].dst;
    qsort(v, n, sizeof *v, cmp_u64);
    kvf_status st = KVF_OK;
    for (size_t i = 1; i < n && st == KVF_OK; i++)
        if (v[i] == v[i - 1])
            st = kvf__fail(KVF_ERR_INVALID,
                           "batch: two moves write block 0x%llx; a batch writes each "
                           "destination once",
                           (unsigned long long)v[i]);
    free(v);
    return st;
}

static kvf_status check_move(kvf_engine *e, op_kind kind, size_t i, const kvf_move *mv)
{
    space rs = kind_reads(kind);
    space ws = kind_writes(kind);
    const uint64_t idx[2] = {mv->src, mv->dst};
    const space sp[2] = {rs, ws};
    for (int k = 0; k < 2; k++) {
        if (sp[k] == SP_PRIMARY && idx[k] >= e->primary_slots)
            return kvf__fail(KVF_ERR_RANGE,
                             "move %zu: primary slot %llu out of range (%u slots in every pool)", i,
                             (unsigned long long)idx[k], e->primary_slots);
        if (sp[k] == SP_SECONDARY && idx[k] >= e->secondary_slots)
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
 * slot for sort_parts. Sets status[i], and *failed_p to the number of
 * moves failed that way. Needs submit_mu only: what it reads and stamps
 * is fixed once frozen or written only by a submit. */
static kvf_status check_moves(kvf_engine *e, op_kind kind, const kvf_move *moves, size_t n,
                              batch *b, uint32_t *cnt, size_t *failed_p)
{
    kvf_status *status = b->status;
    space ws = kind_writes(kind);
    bool keyed_write = ws == SP_FILE || ws == SP_REMOTE;
    bool reads_secondary = kind_reads(kind) == SP_SECONDARY;
    bool off = kind == OP_OFFLOAD_HOST;
    uint64_t stamp = ++e->check_epoch;
    uint64_t *wm = ws == SP_PRIMARY ? e->mark_primary : e->mark_secondary;
    size_t short_reads = 0;
    uint64_t wslots = ws == SP_PRIMARY ? e->primary_slots : e->secondary_slots;
    /* an offload's counts are per destination: a second move writing one
     * shows there, and its stamps are not needed */
    bool stamps = !keyed_write && !(cnt && off);
    for (size_t i = 0; i < n; i++) {
        const kvf_move *mv = &moves[i];
        kvf_status st = check_move(e, kind, i, mv);
        if (st != KVF_OK)
            return st;
        status[i] = KVF_INPROGRESS;
        if (cnt && cnt[(off ? mv->dst : mv->src) + 1]++ && off)
            return kvf__fail(KVF_ERR_INVALID,
                             "batch: move %zu writes secondary slot %llu, which another move of "
                             "the batch reads or writes",
                             i, (unsigned long long)mv->dst);
        if (reads_secondary) {
            uint32_t have = e->sec_tokens[mv->src], want = eff_tokens(e, mv->tokens);
            if (have < want) {
                status[i] = have == 0 ? KVF_ERR_NOT_FOUND : KVF_ERR_RANGE;
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
                __builtin_prefetch(&e->sec_tokens[ah->src < e->secondary_slots ? ah->src : 0]);
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
                             i, ws == SP_PRIMARY ? "primary" : "secondary",
                             (unsigned long long)mv->dst);
        *w = stamp << 1 | 1u;
        if (kind == OP_COPY) {
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
        if (status[i] == KVF_ERR_NOT_FOUND)
            snprintf(msg, sizeof msg, "%s: secondary slot %llu holds no block", op_names[kind],
                     (unsigned long long)moves[i].src);
        else
            snprintf(msg, sizeof msg, "%s: secondary slot %llu holds %u tokens, %u asked",
                     op_names[kind], (unsigned long long)moves[i].src, e->sec_tokens[moves[i].src],
                     eff_tokens(e, moves[i].tokens));
        KVF_LOG(KVF_LOG_WARN, "%s", msg);
        move_failed(b, i, status[i], "%s", msg);
    }
    return st;
}

static kvf_status add_dependency(batch *b, batch *dep)
{
    if (dep == b || dep->dep_mark == b->id)
        return KVF_OK;
    if (!push_ptr(&dep->dependents, &dep->ndependents, &dep->dependents_cap, b))
        return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory");
    dep->dep_mark = b->id;
    b->deps_left++;
    return KVF_OK;
}

static void ready_push(kvf_engine *e, batch *b)
{
    b->state = B_READY;
    b->next_ready = NULL;
    kvf__queue q = b->queue;
    if (e->ready_tail[q])
        e->ready_tail[q]->next_ready = b;
    else
        e->ready_head[q] = b;
    e->ready_tail[q] = b;
    pthread_cond_signal(&e->work_cv);
}

static void ready_pop(kvf_engine *e, kvf__queue q)
{
    batch *b = e->ready_head[q];
    e->ready_head[q] = b->next_ready;
    if (!e->ready_head[q])
        e->ready_tail[q] = NULL;
    b->next_ready = NULL;
}

static void issue_async(kvf_engine *e, batch *b);

/* Moves registered per hold of the engine lock: the lock is dropped
 * between slices, so that workers issuing earlier parts and completions
 * are not held up for a whole part (about 30 ns a move on the H200). */
#define REGISTER_SLICE 1024u

static kvf__register_hook_fn register_hook;

void kvf__set_register_hook(kvf__register_hook_fn fn)
{
    __atomic_store_n(&register_hook, fn, __ATOMIC_RELEASE);
}

/* Registers a checked batch in the hazard tables. Lock held; dropped
 * between slices of moves (only the submitter, holding submit_mu,
 * registers; the caller holds the batch back from starting meanwhile).
 * Only allocation can fail here, and then the tables are left as they were
 * except for entries the batch would have been added to (undone below). */
static kvf_status register_batch(kvf_engine *e, batch *b)
{
    space rs = kind_reads(b->kind);
    space ws = kind_writes(b->kind);
    bool keyed_read = rs == SP_FILE || rs == SP_REMOTE;
    for (size_t i = 0; i < b->n; i++) {
        kvf_move *mv = &b->moves[i];
        if (i && i % REGISTER_SLICE == 0) {
            pthread_mutex_unlock(&e->mu);
            kvf__register_hook_fn hook = __atomic_load_n(&register_hook, __ATOMIC_ACQUIRE);
            if (hook)
                hook();
            engine_lock(e);
        }
        move_prefetch(e, rs, ws, b->moves, i, b->n);
        hazard *r = hazard_of(e, rs, mv->src, true);
        hazard *w = hazard_of(e, ws, mv->dst, true);
        if (!r || !w)
            return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory for hazards");
        /* read after write: remember whose data this move will read */
        batch *dep = pending_batch(e, r->writer);
        if (dep) {
            b->src_dep[i] = dep->id;
            if (add_dependency(b, dep) != KVF_OK)
                return KVF_ERR_NOMEM;
        } else if (rs != SP_PRIMARY || b->kind == OP_FENCE || b->checked) {
            /* (a fence asks whether the slot's last write landed, too) */
            /* kvferry owns secondary slots and files: a failed write
             * there is known bad until rewritten */
            b->src_dep[i] = keyed_read ? r->poison : slot_poison(r);
        }
        if (!(r->nreaders && hazard_reader(r, r->nreaders - 1) == b->id)) {
            if (r->nreaders && !keyed_read)
                hazard_prune_readers(e, r);
            if (r->nreaders > 0 && !push_id(&r->more, r->nreaders - 1, &r->cap, b->id))
                return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory for hazards");
            if (r->nreaders == 0)
                r->reader0 = b->id;
            r->nreaders++;
        }
        /* write after write, write after read */
        if ((dep = pending_batch(e, w->writer)) && add_dependency(b, dep) != KVF_OK)
            return KVF_ERR_NOMEM;
        for (uint32_t k = 0; k < w->nreaders; k++)
            if ((dep = pending_batch(e, hazard_reader(w, k))) && add_dependency(b, dep) != KVF_OK)
                return KVF_ERR_NOMEM;
        w->nreaders = 0;
        w->writer = b->id;
        b->nregistered = i + 1;
        if (ws == SP_SECONDARY)
            e->sec_tokens[mv->dst] = eff_tokens(e, mv->tokens);
    }
    return KVF_OK;
}

/* Room in e->live for batch b, the newest on the undone list, next to the
 * oldest there. */
static kvf_status live_add(kvf_engine *e, batch *b)
{
    uint64_t span = b->id - e->undone_head->id + 1;
    if (span > e->live_cap) {
        size_t cap = e->live_cap ? e->live_cap : 1024;
        while (cap < 2 * span)
            cap *= 2;
        batch **t = calloc(cap, sizeof *t);
        if (!t)
            return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory for the table of batches");
        for (batch *u = e->undone_head; u; u = u->next_undone)
            t[u->id & (cap - 1)] = u;
        free(e->live);
        e->live = t;
        e->live_cap = cap;
    }
    e->live[b->id & (e->live_cap - 1)] = b;
    return KVF_OK;
}

static void complete_batch(kvf_engine *e, batch *b);
static void group_done(kvf_engine *e, batch *g);

/* Moves of a batch registered and queued in one piece; larger batches are
 * split into parts (see batch.group) of at most this size. The first parts
 * are smaller (FIRST_PART_MOVES, doubling): the GPU starts on the first
 * while the next are registered. On the H200 a part of 4096 moves took
 * about 300 us to register and hand to the GPU (bench/timeline.py). */
#define PART_MOVES 4096u
#define FIRST_PART_MOVES 512u

/* The size of part k of a group. */
static size_t part_moves(size_t k)
{
    return k >= 3 ? PART_MOVES : FIRST_PART_MOVES << k;
}

/* Registers a checked batch (or part), puts it on the undone list and
 * starts it if nothing holds it back. Lock held; an asynchronous start
 * drops it for a while. Returns the registration's status. */
static kvf_status enqueue(kvf_engine *e, batch *b)
{
    if (!b->id)
        b->id = e->next_id++;
    /* on the undone list (in id order) before registering: its hazard
     * entries name it by id, which pending_batch finds there */
    b->prev_undone = e->undone_tail;
    if (e->undone_tail)
        e->undone_tail->next_undone = b;
    else
        e->undone_head = b;
    e->undone_tail = b;
    e->undone_count++;
    /* held back while registering: a batch it comes to depend on may
     * complete while the lock is dropped between slices, and must not
     * start it then */
    b->deps_left++;
    kvf_status st = live_add(e, b);
    if (st == KVF_OK)
        st = register_batch(e, b);
    b->deps_left--;
    if (st != KVF_OK) {
        /* out of memory half way: fail the batch's moves but keep the
         * hazards it did register consistent by running it as failed */
        for (size_t i = 0; i < b->n; i++)
            move_failed(b, i, KVF_ERR_NOMEM, "%s: out of memory for the batch's hazards",
                        op_names[b->kind]);
    }
    if (b->deps_left == 0) {
        /* a large batch's first part is issued here; the others go to the
         * workers, which issue each while the submitter registers the next */
        bool later_part = b->group && b->group_off > 0 && e->nworkers > 0;
        if (e->backend->ops->copy_async && !kind_on_workers(b->kind) && !later_part) {
            b->state = B_RUNNING;
            b->async = true;
            issue_async(e, b); /* releases and retakes the lock */
        } else {
            ready_push(e, b);
        }
    } else {
        b->state = B_WAITING;
    }
    return st;
}

/* A large batch between primary and secondary slots is cut into parts in
 * the order of its secondary slots (a counting sort): each part then holds
 * a run of them, which the CUDA backend moves as one pinned range (its
 * staged path) when the run is dense, and the secondary side's hazard
 * entries are touched in order. The moves of a batch have no order of
 * their own. sort_counts gives the zeroed counters that check_moves fills,
 * or NULL when the sort would not pay (or memory is short); sort_parts
 * then fills b->order. submit_mu held. */
static uint32_t *sort_counts(kvf_engine *e, batch *b)
{
    if (b->n <= PART_MOVES || (b->kind != OP_OFFLOAD_HOST && b->kind != OP_ONBOARD_HOST))
        return NULL;
    size_t slots = e->secondary_slots;
    if (slots / 8 > b->n || b->n > UINT32_MAX)
        return NULL;
    if (!e->sort_count && !(e->sort_count = malloc((slots + 1) * sizeof *e->sort_count)))
        return NULL;
    if (b->order_cap < b->n) {
        uint32_t *o = realloc(b->order, b->n * sizeof *o);
        if (!o)
            return NULL;
        b->order = o;
        b->order_cap = b->n;
    }
    memset(e->sort_count, 0, (slots + 1) * sizeof *e->sort_count);
    return e->sort_count;
}

static void sort_parts(kvf_engine *e, batch *b, const kvf_move *moves, uint32_t *cnt)
{
    bool off = b->kind == OP_OFFLOAD_HOST;
    for (size_t k = 0; k < e->secondary_slots; k++)
        cnt[k + 1] += cnt[k];
    for (size_t i = 0; i < b->n; i++)
        b->order[cnt[off ? moves[i].dst : moves[i].src]++] = (uint32_t)i;
    b->sorted = true;
}

static kvf_status submit_batch(kvf_engine *e, op_kind kind, bool checked, const kvf_move *moves,
                               size_t n, kvf_ticket *ticket_p);

static kvf_status submit(kvf_engine *e, op_kind kind, const kvf_move *moves, size_t n,
                         kvf_ticket *ticket_p)
{
    return submit_batch(e, kind, false, moves, n, ticket_p);
}

/* Fills part c of group b with moves off..off+len-1 of the caller's
 * array (in secondary-slot order when sorted). `fresh`: every status of
 * the group is still KVF_INPROGRESS (none failed its checks). */
static void make_part(kvf_engine *e, batch *b, const kvf_move *moves, batch *c, bool sorted,
                      bool fresh, size_t off, size_t len)
{
    if (sorted) {
        const uint32_t *ord = b->order + off;
        for (size_t j = 0; j < len; j++) {
            if (j + PREFETCH_AHEAD < len) {
                __builtin_prefetch(&moves[ord[j + PREFETCH_AHEAD]]);
                if (!fresh)
                    __builtin_prefetch(&b->status[ord[j + PREFETCH_AHEAD]]);
            }
            c->moves[j] = moves[ord[j]];
            c->status[j] = fresh ? KVF_INPROGRESS : b->status[ord[j]];
        }
    } else {
        memcpy(c->moves, moves + off, len * sizeof *c->moves);
        memcpy(c->status, b->status + off, len * sizeof *c->status);
    }
    c->n = len;
    c->kind = b->kind;
    c->queue = b->queue;
    c->engine = e;
    c->group = b;
    c->checked = b->checked;
    c->group_off = off;
}

static kvf_status submit_batch(kvf_engine *e, op_kind kind, bool checked, const kvf_move *moves,
                               size_t n, kvf_ticket *ticket_p)
{
    kvf__clear_error();
    KVF_TIMELINE(KVF_TL_SUBMIT, 0, n);
    if (!e)
        return kvf__fail(KVF_ERR_INVALID, "%s: engine is NULL", op_names[kind]);
    if (n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: empty batch (n = 0)", op_names[kind]);
    if (!moves)
        return kvf__fail(KVF_ERR_INVALID, "%s: moves is NULL with n = %zu", op_names[kind], n);
    if (n > (SIZE_MAX / 4) / sizeof(kvf__copy))
        return kvf__fail(KVF_ERR_RANGE, "%s: batch of %zu moves is too large", op_names[kind], n);

    /* a group's moves stay in the caller's array: its parts copy them */
    bool group = n > PART_MOVES;
    batch *b = batch_get(e, n, group);
    if (!b)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", op_names[kind]);
    if (!group)
        memcpy(b->moves, moves, n * sizeof *moves);
    b->n = n;
    b->kind = kind;
    b->queue = kind_queue(kind);
    b->ticketed = ticket_p != NULL;
    b->checked = checked;
    b->engine = e;

    pthread_mutex_lock(&e->submit_mu);
    engine_lock(e);
    kvf_status st = freeze(e);
    if (st != KVF_OK)
        goto refuse;
    if (kind_is_remote(kind) && !e->remote_url) {
        st = kvf__fail(KVF_ERR_INVALID, "%s: the engine has no remote tier (set remote_url or %s)",
                       op_names[kind], KVF_REMOTE_URL_ENV);
        goto refuse;
    }
    if (kind_is_file(kind) && !e->file_enabled) {
        st = kvf__fail(KVF_ERR_INVALID, "%s: the engine has no file tier (set file_dir)",
                       op_names[kind]);
        goto refuse;
    }
    if (kind_uses_secondary(kind)) {
        for (uint32_t p = 0; p < e->npools; p++)
            if (!e->pools[p].has_secondary) {
                st = kvf__fail(KVF_ERR_INVALID, "%s: pool %u has no secondary slots",
                               op_names[kind], p);
                goto refuse;
            }
    }
    /* The checks need only submit_mu (see check_moves); completions take
     * `mu` meanwhile. */
    pthread_mutex_unlock(&e->mu);
    uint32_t *cnt = sort_counts(e, b);
    size_t failed = 0;
    st = check_moves(e, kind, moves, n, b, cnt, &failed);
    if (st != KVF_OK) {
        st = kvf__fail(st, "%s: %s", op_names[kind], kvf_last_error());
        goto refuse_checked;
    }
    if (cnt)
        sort_parts(e, b, moves, cnt);
    KVF_TIMELINE(KVF_TL_CHECKED, 0, n);

    engine_lock(e);
    if (b->ticketed) {
        b->id = e->next_id++;
        size_t bk = b->id % TICKET_BUCKETS;
        b->next_ticket = e->tickets[bk];
        e->tickets[bk] = b;
        *ticket_p = (kvf_ticket){b->id};
    }
    kvf_status ret = KVF_OK;
    if (!group) {
        st = enqueue(e, b);
        KVF_TIMELINE(KVF_TL_PART, b->id, n);
        if (st != KVF_OK && !b->ticketed)
            ret = st; /* nobody would hear of it otherwise */
    } else {
        if (!b->id)
            b->id = e->next_id++;
        b->state = B_WAITING;
        size_t nparts = 0;
        for (size_t off = 0; off < n; off += part_moves(nparts++))
            ;
        b->parts_left = nparts;
        bool sorted = b->sorted;
        size_t k = 0;
        for (size_t off = 0; off < n; off += part_moves(k++)) {
            size_t len = n - off < part_moves(k) ? n - off : part_moves(k);
            /* a part is made without the lock, so that workers (issuing
             * the parts before it) and completions get it meanwhile; the
             * statuses read here are this part's, which nothing else
             * writes before it is queued */
            pthread_mutex_unlock(&e->mu);
            batch *c = batch_get(e, len, false);
            if (c)
                make_part(e, b, moves, c, sorted, failed == 0, off, len);
            engine_lock(e);
            if (!c) {
                /* the parts not made fail; those queued run on */
                for (size_t i = off; i < n; i++)
                    b->status[sorted ? b->order[i] : i] = KVF_ERR_NOMEM;
                b->parts_left -= nparts - k;
                if (!b->ticketed)
                    ret = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", op_names[kind]);
                break;
            }
            if (enqueue(e, c) != KVF_OK && !b->ticketed)
                ret = KVF_ERR_NOMEM;
            KVF_TIMELINE(KVF_TL_PART, c->id, len);
        }
        if (b->parts_left == 0)
            group_done(e, b);
    }
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_unlock(&e->submit_mu);
    KVF_TIMELINE(KVF_TL_SUBMITTED, 0, n);
    return ret;

refuse:
    pthread_mutex_unlock(&e->mu);
refuse_checked:
    pthread_mutex_unlock(&e->submit_mu);
    batch_free(b);
    return st;
}

/* The op kind of an engine call on `tier`: kinds[tier], one per tier below
 * the primary slots in kvf_tier's order; a negative entry (-1: the tier
 * cannot be taken, -2: not by this engine) or a tier outside them refuses
 * the call, naming the tier. */
static kvf_status tier_kind(const char *fn, kvf_tier tier, const int kinds[3], op_kind *kind_p)
{
    if ((unsigned)tier >= KVF_TIER_COUNT)
        return kvf__fail(KVF_ERR_INVALID, "%s: tier %d unknown", fn, (int)tier);
    int k = (unsigned)tier < 3 ? kinds[tier] : -1;
    if (k == -2)
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "%s: tier %s: the %s tier moves primary slots only (offload to it, "
                         "onboard from it)",
                         fn, kvf_tier_name(tier), kvf_tier_name(tier));
    if (k < 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: tier %s is not one this call takes", fn,
                         kvf_tier_name(tier));
    *kind_p = (op_kind)k;
    return KVF_OK;
}

static kvf_status submit_tier(kvf_engine *e, const char *fn, kvf_tier tier, const int kinds[3],
                              const kvf_move *moves, size_t n, kvf_ticket *ticket_p)
{
    kvf__clear_error();
    op_kind kind;
    kvf_status st = tier_kind(fn, tier, kinds, &kind);
    return st != KVF_OK ? st : submit(e, kind, moves, n, ticket_p);
}

kvf_status kvf_offload(kvf_engine *e, kvf_tier to, const kvf_move *moves, size_t n,
                       kvf_ticket *ticket_p)
{
    static const int kinds[3] = {OP_OFFLOAD_HOST, OP_OFFLOAD_FILE, OP_OFFLOAD_REMOTE};
    return submit_tier(e, "kvf_offload", to, kinds, moves, n, ticket_p);
}

kvf_status kvf_onboard(kvf_engine *e, kvf_tier from, const kvf_move *moves, size_t n,
                       kvf_ticket *ticket_p)
{
    static const int kinds[3] = {OP_ONBOARD_HOST, OP_ONBOARD_FILE, OP_ONBOARD_REMOTE};
    return submit_tier(e, "kvf_onboard", from, kinds, moves, n, ticket_p);
}

kvf_status kvf_copy(kvf_engine *e, const kvf_move *moves, size_t n, kvf_ticket *ticket_p)
{
    return submit(e, OP_COPY, moves, n, ticket_p);
}

kvf_status kvf_demote(kvf_engine *e, kvf_tier to, const kvf_move *moves, size_t n,
                      kvf_ticket *ticket_p)
{
    static const int kinds[3] = {-1, OP_DEMOTE, -2};
    return submit_tier(e, "kvf_demote", to, kinds, moves, n, ticket_p);
}

kvf_status kvf_promote(kvf_engine *e, kvf_tier from, const kvf_move *moves, size_t n,
                       kvf_ticket *ticket_p)
{
    static const int kinds[3] = {-1, OP_PROMOTE, -2};
    return submit_tier(e, "kvf_promote", from, kinds, moves, n, ticket_p);
}

kvf_status kvf_remove(kvf_engine *e, kvf_tier tier, const uint64_t *keys, size_t n,
                      kvf_ticket *ticket_p)
{
    static const int kinds[3] = {-1, OP_REMOVE, OP_REMOVE_REMOTE};
    kvf__clear_error();
    op_kind kind;
    kvf_status st = tier_kind("kvf_remove", tier, kinds, &kind);
    if (st != KVF_OK)
        return st;
    if (!e || n == 0)
        return submit(e, kind, NULL, n, ticket_p);
    if (!keys)
        return kvf__fail(KVF_ERR_INVALID, "%s: keys is NULL with n = %zu", op_names[kind], n);
    if (n > SIZE_MAX / sizeof(kvf_move))
        return kvf__fail(KVF_ERR_RANGE, "%s: batch of %zu keys is too large", op_names[kind], n);
    kvf_move *moves = malloc(n * sizeof *moves);
    if (!moves)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", op_names[kind]);
    for (size_t i = 0; i < n; i++)
        moves[i] = (kvf_move){keys[i], keys[i], 0};
    st = submit(e, kind, moves, n, ticket_p);
    free(moves);
    return st;
}

/* ---- for the cache ----------------------------------------------------------- */

kvf_status kvf__engine_move_checked(kvf_engine *e, kvf_tier to, bool copy, const kvf_move *moves,
                                    size_t n, kvf_ticket *ticket_p)
{
    static const int kinds[3] = {OP_OFFLOAD_HOST, OP_OFFLOAD_FILE, OP_OFFLOAD_REMOTE};
    op_kind kind = OP_COPY;
    if (!copy) {
        kvf_status st = tier_kind("offload", to, kinds, &kind);
        if (st != KVF_OK)
            return st;
    }
    return submit_batch(e, kind, true, moves, n, ticket_p);
}

void kvf__engine_clear_poison(kvf_engine *e, const uint32_t *slots, size_t n)
{
    engine_lock(e);
    for (size_t i = 0; i < n && e->hz_primary; i++)
        if (slots[i] < e->primary_slots)
            e->hz_primary[slots[i]].poison = 0;
    pthread_mutex_unlock(&e->mu);
}

kvf_status kvf__engine_fence(kvf_engine *e, const uint32_t *slots, size_t n, kvf_ticket *ticket_p)
{
    if (!slots || n == 0 || n > SIZE_MAX / sizeof(kvf_move))
        return submit(e, OP_FENCE, NULL, 0, ticket_p);
    kvf_move *moves = malloc(n * sizeof *moves);
    if (!moves)
        return kvf__fail(KVF_ERR_NOMEM, "fence: out of memory");
    for (size_t i = 0; i < n; i++)
        moves[i] = (kvf_move){slots[i], slots[i], 0};
    kvf_status st = submit(e, OP_FENCE, moves, n, ticket_p);
    free(moves);
    return st;
}

kvf_status kvf__engine_freeze(kvf_engine *e)
{
    engine_lock(e);
    kvf_status st = freeze(e);
    pthread_mutex_unlock(&e->mu);
    return st;
}

uint32_t kvf__engine_slots(const kvf_engine *e, kvf_level level)
{
    return level == KVF_LEVEL_PRIMARY ? e->primary_slots : e->secondary_slots;
}

size_t kvf__engine_block_bytes(const kvf_engine *e)
{
    return e->all_block_bytes;
}

const char *kvf__engine_config_file(const kvf_engine *e)
{
    return e->cfg.config_file;
}

kvf_status kvf_engine_settings(const kvf_engine *engine, const kvf_setting **settings_p,
                               size_t *n_p)
{
    if (!engine || !settings_p || !n_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_settings: NULL argument");
    *settings_p = engine->settings;
    *n_p = engine->nsettings;
    return KVF_OK;
}

bool kvf__engine_gds(const kvf_engine *e)
{
    return e->gds;
}

kvf__blockfile_dir *kvf__engine_dir(kvf_engine *e)
{
    return e->file_enabled ? &e->dir : NULL;
}

static kvf_status remote_handle(kvf_engine *e, kvf__remote **r_p);

bool kvf__engine_has_remote(const kvf_engine *e)
{
    return e->remote_url != NULL;
}

kvf_status kvf__engine_remote(kvf_engine *e, struct kvf__remote **remote_p)
{
    return remote_handle(e, remote_p);
}

/* ---- completion ------------------------------------------------------------ */

static void hazard_drop_reader(hazard *h, uint64_t id)
{
    for (uint32_t k = 0; k < h->nreaders; k++)
        if (hazard_reader(h, k) == id) {
            hazard_set_reader(h, k, hazard_reader(h, h->nreaders - 1));
            h->nreaders--;
            return;
        }
}

/* A group whose parts have all completed: its moves still in progress
 * are those its parts completed without a failure. Lock held. */
static void group_done(kvf_engine *e, batch *g)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->status[i] == KVF_INPROGRESS)
            g->status[i] = KVF_OK;
    g->state = B_DONE;
    pthread_cond_broadcast(&e->done_cv);
    batch_release(g);
}

/* Marks a batch done: records poison for failed writes, leaves the keyed
 * hazard tables (slots' entries name it by id, and need nothing: see
 * hazard), releases its dependents, wakes waiters. Lock held. */
static void complete_batch(kvf_engine *e, batch *b)
{
    space rs = kind_reads(b->kind);
    space ws = kind_writes(b->kind);
    bool keyed_read = rs == SP_FILE || rs == SP_REMOTE;
    bool keyed_write = ws == SP_FILE || ws == SP_REMOTE;
    for (size_t i = 0; i < b->n; i++) {
        const kvf_move *mv = &b->moves[i];
        if (b->status[i] == KVF_INPROGRESS)
            b->status[i] = KVF_OK;
        bool failed = b->status[i] != KVF_OK;
        if (keyed_read) {
            hazard *r = hazard_of(e, rs, mv->src, false);
            if (r)
                hazard_drop_reader(r, b->id);
        }
        if (i >= b->nregistered) {
            /* never queued as a writer there: its write changes nothing */
        } else if (keyed_write) {
            hazard *w = hazard_of(e, ws, mv->dst, false);
            if (w) {
                if (w->writer == b->id)
                    w->writer = 0;
                w->poison = failed ? b->id : 0;
            }
        } else if (failed) {
            hazard_of(e, ws, mv->dst, false)->poison = b->id;
        }
        if (failed && !b->ticketed && !(b->group && b->group->ticketed))
            KVF_LOG(KVF_LOG_WARN, "%s: move %zu (src %llu, dst %llu): %s", op_names[b->kind], i,
                    (unsigned long long)mv->src, (unsigned long long)mv->dst,
                    kvf_status_str(b->status[i]));
    }
    /* keyed entries go once nothing is pending on them */
    for (size_t i = 0; i < b->n && (keyed_read || keyed_write); i++) {
        if (keyed_read)
            key_hazard_prune(rs == SP_FILE ? &e->files : &e->remotes, b->moves[i].src);
        if (keyed_write && !(ws == rs && b->moves[i].dst == b->moves[i].src))
            key_hazard_prune(ws == SP_FILE ? &e->files : &e->remotes, b->moves[i].dst);
    }
    KVF_TIMELINE(KVF_TL_COMPLETE, b->id, b->n);
    if (e->live_cap && e->live[b->id & (e->live_cap - 1)] == b)
        e->live[b->id & (e->live_cap - 1)] = NULL;
    for (size_t k = 0; k < b->ndependents; k++) {
        batch *d = b->dependents[k];
        if (--d->deps_left == 0)
            ready_push(e, d);
    }
    b->ndependents = 0;
    b->state = B_DONE;
    if (b->prev_undone)
        b->prev_undone->next_undone = b->next_undone;
    else
        e->undone_head = b->next_undone;
    if (b->next_undone)
        b->next_undone->prev_undone = b->prev_undone;
    else
        e->undone_tail = b->prev_undone;
    e->undone_count--;
    if (b->group) {
        batch *g = b->group;
        /* the part's messages, renumbered into the caller's batch */
        for (kvf__move_error *r = atomic_exchange(&b->errors, NULL), *next; r; r = next) {
            next = r->next;
            r->index = g->sorted ? g->order[b->group_off + r->index] : b->group_off + r->index;
            push_error(g, r);
        }
        if (g->sorted) {
            /* failures only (scattered stores, each a cache miss): the
             * others become KVF_OK in group_done */
            const uint32_t *ord = g->order + b->group_off;
            for (size_t i = 0; i < b->n; i++)
                if (b->status[i] != KVF_OK)
                    g->status[ord[i]] = b->status[i];
        } else {
            memcpy(g->status + b->group_off, b->status, b->n * sizeof *b->status);
        }
        if (--g->parts_left == 0)
            group_done(e, g);
    }
    pthread_cond_broadcast(&e->done_cv);
    batch_release(b);
}

/* A move whose source was written by a move that failed: lost. Lock held. */
static bool source_lost(kvf_engine *e, const batch *b, size_t i)
{
    if (!b->src_dep[i])
        return false;
    space rs = kind_reads(b->kind);
    const hazard *h = hazard_of(e, rs, b->moves[i].src, false);
    return h && h->poison == b->src_dep[i];
}

/* What a move reads or writes, for its message: "block 0x2a",
 * "primary slot 3". */
static void name_place(char *out, size_t cap, space sp, uint64_t v)
{
    if (sp == SP_FILE || sp == SP_REMOTE)
        snprintf(out, cap, "%sblock 0x%llx", sp == SP_REMOTE ? "remote " : "",
                 (unsigned long long)v);
    else
        snprintf(out, cap, "%s slot %llu", sp == SP_PRIMARY ? "primary" : "secondary",
                 (unsigned long long)v);
}

/* A move whose source a failed move was to write (source_lost). */
static void fail_lost_source(batch *b, size_t i)
{
    char src[48];
    name_place(src, sizeof src, kind_reads(b->kind), b->moves[i].src);
    move_failed(b, i, KVF_ERR_LOST, "%s: %s: the move of batch %llu that wrote it failed",
                op_names[b->kind], src, (unsigned long long)b->src_dep[i]);
}

/* A move whose copy between slots failed, as `why` says. */
static void fail_copy(batch *b, size_t i, kvf_status st, const char *why)
{
    char src[48], dst[48];
    name_place(src, sizeof src, kind_reads(b->kind), b->moves[i].src);
    name_place(dst, sizeof dst, kind_writes(b->kind), b->moves[i].dst);
    move_failed(b, i, st, "%s: %s to %s: %s", op_names[b->kind], src, dst, why);
}

/* ---- execution -------------------------------------------------------------- */

/* What kvf_geometry_region gives for a checked token count, without the
 * checks (done at submit): this runs for every move of every pool. */
static kvf_region pool_region(const pool *pl, uint32_t tokens)
{
    if (tokens == 0 || tokens >= pl->g.tokens_per_block)
        return (kvf_region){1, pl->block_bytes, pl->block_bytes};
    size_t row_bytes = tokens * pl->token_bits / 8;
    if (pl->rows == 1)
        return (kvf_region){1, row_bytes, row_bytes};
    return (kvf_region){pl->rows, row_bytes, pl->pitch};
}

/* The copy of pool p for one move in host or copy mode: the region of the
 * first `tokens` tokens, at the same place in source and destination. */
static kvf__copy move_copy(const kvf_engine *e, op_kind kind, uint32_t p, const kvf_move *mv)
{
    const pool *pl = &e->pools[p];
    const mem_array *src = kind == OP_ONBOARD_HOST ? &pl->secondary : &pl->primary;
    const mem_array *dst = kind == OP_OFFLOAD_HOST ? &pl->secondary : &pl->primary;
    kvf_region r = pool_region(pl, mv->tokens);
    kvf__copy c = {
        slot_addr(dst, mv->dst), slot_addr(src, mv->src), r.row_bytes, r.rows, r.pitch, r.pitch};
    return c;
}

/* Copies handed to the backend per call: the GPU starts on the first
 * chunk while the next is described, so submission overlaps the copy. */
#define ASYNC_CHUNK_COPIES 4096u

/* Ends an async batch once its last chunk and its issuer are done. Lock held. */
static void async_release(kvf_engine *e, batch *b)
{
    if (--b->async_left)
        return;
    for (size_t i = 0; i < b->n && b->async_status != KVF_OK; i++)
        if (b->status[i] == KVF_INPROGRESS)
            fail_copy(b, i, b->async_status, b->async_msg);
    complete_batch(e, b);
}

/* `why`: the backend's detail of a failure, or NULL for its status's text. */
static void async_finish(kvf_engine *e, batch *b, kvf_status status, const char *why)
{
    if (status != KVF_OK && b->async_status == KVF_OK) {
        b->async_status = status;
        snprintf(b->async_msg, sizeof b->async_msg, "the device copy failed: %.130s",
                 why && *why ? why : kvf_status_str(status));
    }
    async_release(e, b);
}

/* The backend's callback: completes the chunk here when the engine lock
 * is free, else hands it to the completion thread (a submitter can hold
 * the lock for hundreds of microseconds, and the backend's thread has
 * other batches to end). */
static void async_done(void *arg, kvf_status status)
{
    batch *b = arg;
    kvf_engine *e = b->engine;
    KVF_TIMELINE(KVF_TL_COPIED, b->id, 0);
    if (status != KVF_OK) {
        /* the backend set this thread's detail just before calling: kept
         * for the moves' messages, so a failure (rare) waits for the lock
         * rather than travel through the queue without it */
        char why[sizeof b->async_msg];
        snprintf(why, sizeof why, "%s", kvf_last_error());
        engine_lock(e);
        async_finish(e, b, status, why);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (pthread_mutex_trylock(&e->mu) == 0) {
        async_finish(e, b, status, NULL);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    pthread_mutex_lock(&e->cb_mu);
    if (e->cb_n == e->cb_cap) {
        size_t cap = e->cb_cap ? 2 * e->cb_cap : 64;
        async_event *ev = realloc(e->cb_events, cap * sizeof *ev);
        if (!ev) {
            /* no room: complete it here, waiting for the lock after all */
            pthread_mutex_unlock(&e->cb_mu);
            engine_lock(e);
            async_finish(e, b, status, NULL);
            pthread_mutex_unlock(&e->mu);
            return;
        }
        e->cb_events = ev;
        e->cb_cap = cap;
    }
    e->cb_events[e->cb_n++] = (async_event){b, status};
    pthread_cond_signal(&e->cb_cv);
    pthread_mutex_unlock(&e->cb_mu);
}

static void *completion_main(void *arg)
{
    kvf_engine *e = arg;
    pthread_mutex_lock(&e->cb_mu);
    for (;;) {
        while (e->cb_n == 0 && !e->cb_stop)
            pthread_cond_wait(&e->cb_cv, &e->cb_mu);
        if (e->cb_n == 0)
            break;
        /* take every queued event; the callback fills the spare array */
        async_event *ev = e->cb_events;
        size_t n = e->cb_n, cap = e->cb_cap;
        e->cb_events = e->cb_spare;
        e->cb_cap = e->cb_spare_cap;
        e->cb_n = 0;
        e->cb_spare = NULL;
        e->cb_spare_cap = 0;
        pthread_mutex_unlock(&e->cb_mu);
        engine_lock(e);
        for (size_t i = 0; i < n; i++)
            async_finish(e, ev[i].b, ev[i].status, NULL);
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&e->cb_mu);
        if (!e->cb_spare) {
            e->cb_spare = ev;
            e->cb_spare_cap = cap;
        } else {
            free(ev);
        }
    }
    pthread_mutex_unlock(&e->cb_mu);
    return NULL;
}

/* Ends the completion thread (every batch already complete). */
static void completion_stop(kvf_engine *e)
{
    if (e->cb_started) {
        pthread_mutex_lock(&e->cb_mu);
        e->cb_stop = true;
        pthread_cond_signal(&e->cb_cv);
        pthread_mutex_unlock(&e->cb_mu);
        pthread_join(e->cb_thread, NULL);
        e->cb_started = false;
    }
    free(e->cb_events);
    free(e->cb_spare);
    e->cb_events = e->cb_spare = NULL;
    pthread_mutex_destroy(&e->cb_mu);
    pthread_cond_destroy(&e->cb_cv);
}

/* Hands a ready copy batch to an asynchronous backend, in chunks. Called
 * with the lock held; drops it while the backend queues the copies. The
 * issuer holds one count of async_left, so the batch cannot complete (and
 * be freed) before the last chunk is queued. */
static void issue_async(kvf_engine *e, batch *b)
{
    KVF_TIMELINE(KVF_TL_ISSUE, b->id, b->n);
    size_t live = 0; /* moves still to copy */
    for (size_t i = 0; i < b->n; i++) {
        if (b->status[i] != KVF_INPROGRESS)
            continue;
        if (source_lost(e, b, i))
            fail_lost_source(b, i);
        else
            live++;
    }
    size_t need = b->n * e->npools < ASYNC_CHUNK_COPIES + e->npools
                      ? b->n * e->npools
                      : ASYNC_CHUNK_COPIES + e->npools;
    if (b->copies_cap < need) {
        free(b->copies);
        b->copies = malloc(need * sizeof *b->copies);
        b->copies_cap = b->copies ? need : 0;
    }
    if (!b->copies) {
        for (size_t i = 0; i < b->n; i++)
            if (b->status[i] == KVF_INPROGRESS)
                fail_copy(b, i, KVF_ERR_NOMEM, "out of memory for the batch's copies");
        complete_batch(e, b);
        return;
    }
    /* a count for each chunk to be handed over, taken now so that the
     * chunks go without the lock; those of chunks that never reached the
     * backend are given back below */
    size_t per_chunk = (ASYNC_CHUNK_COPIES + e->npools - 1) / e->npools;
    uint32_t planned = (uint32_t)((live + per_chunk - 1) / per_chunk), issued = 0;
    b->async_left = 1 + planned;
    b->async_status = KVF_OK;
    pthread_mutex_unlock(&e->mu);
    /* statuses still KVF_INPROGRESS change only at completion, which the
     * issuer's count holds off: reading them unlocked is safe */
    kvf_status st = KVF_OK;
    char why[sizeof b->async_msg - 32] = "";
    for (size_t i = 0; i < b->n && st == KVF_OK;) {
        size_t ncopies = 0;
        for (; i < b->n && ncopies < ASYNC_CHUNK_COPIES; i++) {
            if (b->status[i] != KVF_INPROGRESS)
                continue;
            for (uint32_t p = 0; p < e->npools; p++)
                b->copies[ncopies++] = move_copy(e, b->kind, p, &b->moves[i]);
        }
        if (ncopies == 0)
            break;
        st = e->backend->ops->copy_async(e->backend, b->queue, b->copies, ncopies, async_done, b);
        if (st == KVF_OK) {
            issued++;
        } else {
            snprintf(why, sizeof why, "%s", kvf_last_error());
            KVF_LOG(KVF_LOG_ERROR, "%s: batch %llu: %s", op_names[b->kind],
                    (unsigned long long)b->id, why);
        }
    }
    engine_lock(e);
    b->async_left -= planned - issued;
    KVF_TIMELINE(KVF_TL_ISSUED, b->id, issued);
    if (st != KVF_OK && b->async_status == KVF_OK) {
        b->async_status = st;
        snprintf(b->async_msg, sizeof b->async_msg, "not queued on the device: %s", why);
    }
    if (b->async_left > 1) {
        b->on_stream = true;
        /* a sync_stream waiting for this batch to reach the GPU may go on */
        pthread_cond_broadcast(&e->done_cv);
    }
    async_release(e, b);
}

/* Bytes of one move's file image in staging: header and payload, padded
 * so that every image starts and ends on the O_DIRECT alignment. */
static size_t staging_slot_bytes(const kvf_engine *e)
{
    size_t n = KVF_BLOCKFILE_HEADER_BYTES + e->all_block_bytes;
    return (n + KVF_FILE_ALIGN - 1) & ~(size_t)(KVF_FILE_ALIGN - 1);
}

/* Room for `n` moves' file images, their I/O records and copies; the
 * images in device memory for the GDS path (`dev`), else on the host. */
static kvf_status ensure_staging(worker *w, size_t n, bool dev)
{
    kvf_engine *e = w->engine;
    /* the per-move arrays only grow: w->nios is what all three hold, so a
     * staging allocation that fails below leaves them usable */
    if (w->nios < n) {
        kvf__blockfile_io *ios = realloc(w->ios, n * sizeof *ios);
        if (ios) {
            /* the records' fields run_file_moves does not set start zeroed
             * (NULL hooks), never as realloc left them */
            memset(ios + w->nios, 0, (n - w->nios) * sizeof *ios);
            w->ios = ios;
        }
        kvf__copy *copies = realloc(w->copies, n * e->npools * sizeof *copies);
        if (copies)
            w->copies = copies;
        size_t *io_moves = realloc(w->io_moves, n * sizeof *io_moves);
        if (io_moves)
            w->io_moves = io_moves;
        if (!ios || !copies || !io_moves)
            return kvf__fail(KVF_ERR_NOMEM, "file staging: out of memory for %zu moves", n);
        w->nios = n;
    }
    if (dev) {
        if (w->gstaging && kvf__gds_buf_slots(w->gstaging) >= n)
            return KVF_OK;
        kvf__gds_buf *g;
        kvf_status st = kvf__gds_buf_create(e->cfg.device, staging_slot_bytes(e), n, &g);
        if (st != KVF_OK)
            return st;
        kvf__gds_buf_destroy(w->gstaging);
        w->gstaging = g;
        return KVF_OK;
    }
    size_t need = staging_slot_bytes(e) * n;
    if (w->staging && w->staging_bytes >= need)
        return KVF_OK;
    kvf_memory kind =
        e->backend_kind == KVF_BACKEND_CUDA ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST;
    void *p;
    kvf_status st = e->backend->ops->mem_alloc(e->backend, kind, need, &p);
    if (st != KVF_OK)
        return st;
    if (w->staging)
        e->backend->ops->mem_free(e->backend, kind, w->staging);
    w->staging = p;
    w->staging_bytes = need;
    return KVF_OK;
}

/* Copies of a move between its slot (primary, or secondary for demote and
 * promote) and a packed file image: each pool's rows of `file_tokens`
 * tokens, back to back. `tokens` of them are moved (tokens <= file_tokens). */
static size_t file_copies(const kvf_engine *e, op_kind kind, const kvf_move *mv, uint8_t *payload,
                          uint32_t tokens, uint32_t file_tokens, kvf__copy *out)
{
    bool to_file = kind_writes(kind) == SP_FILE || kind_writes(kind) == SP_REMOTE;
    bool secondary = kind_uses_secondary(kind);
    size_t off = 0;
    for (uint32_t p = 0; p < e->npools; p++) {
        const pool *pl = &e->pools[p];
        kvf_region want = pool_region(pl, tokens), stored = pool_region(pl, file_tokens);
        /* a whole stored block is rows of the full pitch, like the slot */
        size_t rows = want.rows, width = want.row_bytes;
        size_t file_pitch = stored.rows == 1 && want.rows > 1 ? want.pitch : stored.row_bytes;
        if (want.rows == 1)
            file_pitch = width;
        uint8_t *slot =
            slot_addr(secondary ? &pl->secondary : &pl->primary, to_file ? mv->src : mv->dst);
        if (to_file)
            out[p] = (kvf__copy){payload + off, slot, width, rows, file_pitch, want.pitch};
        else
            out[p] = (kvf__copy){slot, payload + off, width, rows, want.pitch, file_pitch};
        off += kvf__region_bytes(&stored);
    }
    return off;
}

/* Copies between slots and staging: host memory on both sides for
 * secondary slots (no backend, no GPU stream), the backend's otherwise. */
static kvf_status staging_copy(worker *w, const batch *b, const kvf__copy *cp)
{
    kvf_engine *e = w->engine;
    uint64_t t0 = kvf__now_ns();
    kvf_status st = kind_uses_secondary(b->kind)
                        ? kvf__host_copy(cp, e->npools)
                        : e->backend->ops->copy_sync(e->backend, b->queue, cp, e->npools);
    atomic_fetch_add_explicit(&w->copy_ns, kvf__now_ns() - t0, memory_order_relaxed);
    return st;
}

static void file_move_failed(batch *b, size_t i, kvf_status st, const char *msg)
{
    KVF_LOG(KVF_LOG_WARN, "%s: %s", op_names[b->kind], msg);
    move_failed(b, i, st, "%s: %s", op_names[b->kind], msg);
}

/* Marks a file key lost (its old file could not be removed), or clears
 * the mark once the key was written or removed. */
static void lost_file_set(kvf_engine *e, uint64_t key, bool lost)
{
    pthread_mutex_lock(&e->lost_mu);
    if (lost) {
        if (!key_hazard(&e->lost_files, key, true))
            KVF_LOG(KVF_LOG_ERROR,
                    "block 0x%llx: out of memory to remember it lost: its old file may be served",
                    (unsigned long long)key);
    } else if (e->lost_files.count) {
        key_hazard_prune(&e->lost_files, key);
    }
    pthread_mutex_unlock(&e->lost_mu);
}

/* Clears the lost marks of the keys of ios[0..n) written: stored again. */
static void lost_files_written(kvf_engine *e, const kvf__blockfile_io *ios, size_t n)
{
    pthread_mutex_lock(&e->lost_mu);
    for (size_t j = 0; j < n && e->lost_files.count; j++)
        if (ios[j].status == KVF_OK)
            key_hazard_prune(&e->lost_files, ios[j].meta.key);
    pthread_mutex_unlock(&e->lost_mu);
}

/* Fails the reads of moves [first, last) whose key is marked lost. */
static void refuse_lost_files(kvf_engine *e, batch *b, size_t first, size_t last)
{
    pthread_mutex_lock(&e->lost_mu);
    for (size_t i = first; i < last && e->lost_files.count; i++) {
        uint64_t key = b->moves[i].src;
        if (b->status[i] != KVF_INPROGRESS || !key_hazard(&e->lost_files, key, false))
            continue;
        file_move_failed(b, i,
                         kvf__fail(KVF_ERR_LOST,
                                   "block 0x%llx: %s/%016llx.kvf: its last write failed and the "
                                   "old file could not be removed: refused until written again",
                                   (unsigned long long)key, e->dir.root, (unsigned long long)key),
                         kvf_last_error());
    }
    pthread_mutex_unlock(&e->lost_mu);
}

/* One rule for every write to a file that fails, however it fails
 * (before its I/O: a lost source, no staging; in it: the gather into
 * staging, the write, its fsync; after it: the batch's fsync): the key's
 * file is removed, so a later read finds no block rather than an old or
 * unsynced version (kvf_offload's contract). The file layer already
 * removes it where its own write or fsync fails; this covers the rest.
 * Where the directory refuses the removal, the file is emptied in place
 * (no reader takes it for the block, after a restart either) and the key
 * is refused here until written again: the old bytes are never served. */
static void drop_failed_file(kvf_engine *e, const batch *b, size_t i)
{
    bool emptied;
    uint64_t key = b->moves[i].dst;
    if (kvf__blockfile_discard(&e->dir, key, &emptied) == KVF_OK)
        return;
    lost_file_set(e, key, true);
    KVF_LOG(KVF_LOG_ERROR,
            "%s: after a failed write: %s; the key is refused (KVF_ERR_LOST) until written again%s",
            op_names[b->kind], kvf_last_error(),
            emptied ? "" : "; an engine opened on this directory later would serve the old bytes");
}

static void drop_failed_files(kvf_engine *e, const batch *b, size_t first, size_t last)
{
    for (size_t i = first; i < last; i++)
        if (b->status[i] != KVF_INPROGRESS && b->status[i] != KVF_OK)
            drop_failed_file(e, b, i);
}

/* Gathers one offload's or demote's block into its staging image, just
 * before its write starts. */
static kvf_status offload_fill(kvf__blockfile_io *io)
{
    worker *w = io->arg;
    kvf_engine *e = w->engine;
    const batch *b = w->file_batch;
    size_t j = (size_t)(io - w->ios);
    const kvf_move *mv = &b->moves[w->io_moves[j]];
    uint32_t tokens = eff_tokens(e, mv->tokens);
    kvf__copy *cp = &w->copies[j * e->npools];
    size_t bytes =
        file_copies(e, b->kind, mv, io->buf + KVF_BLOCKFILE_HEADER_BYTES, tokens, tokens, cp);
    kvf_status st = staging_copy(w, b, cp);
    if (st != KVF_OK)
        return kvf__fail(st, "block 0x%llx: gathering slot %llu: %s", (unsigned long long)mv->dst,
                         (unsigned long long)mv->src, kvf_last_error());
    io->meta = (kvf__blockfile_meta){mv->dst, tokens, e->npools, bytes};
    return KVF_OK;
}

/* One block read for an onboard or promote: checked against the engine's
 * layout and scattered into its slots, while the chunk's other reads are
 * still in flight. */
static void onboard_done(kvf__blockfile_io *io)
{
    worker *w = io->arg;
    kvf_engine *e = w->engine;
    batch *b = w->file_batch;
    size_t j = (size_t)(io - w->ios), i = w->io_moves[j];
    const kvf_move *mv = &b->moves[i];
    if (io->status != KVF_OK) {
        file_move_failed(b, i, io->status, io->msg);
        return;
    }
    uint32_t tokens = eff_tokens(e, mv->tokens);
    const kvf__blockfile_meta *meta = &io->meta;
    kvf__copy *cp = &w->copies[j * e->npools];
    kvf_status st;
    if (meta->pools != e->npools)
        st = kvf__fail(KVF_ERR_MISMATCH, "block 0x%llx: stored with %u pools, engine has %u",
                       (unsigned long long)mv->src, meta->pools, e->npools);
    else if (meta->tokens < tokens)
        st = kvf__fail(KVF_ERR_RANGE, "block 0x%llx: holds %u tokens, %u asked",
                       (unsigned long long)mv->src, meta->tokens, tokens);
    else if (file_copies(e, b->kind, mv, io->buf + KVF_BLOCKFILE_HEADER_BYTES, tokens, meta->tokens,
                         cp) != meta->payload_bytes)
        st = kvf__fail(
            KVF_ERR_MISMATCH, "block 0x%llx: %llu payload bytes stored, not what %u tokens take",
            (unsigned long long)mv->src, (unsigned long long)meta->payload_bytes, meta->tokens);
    else if ((st = staging_copy(w, b, cp)) != KVF_OK)
        kvf__fail(st, "block 0x%llx: scattering into slot %llu: %s", (unsigned long long)mv->src,
                  (unsigned long long)mv->dst, kvf_last_error());
    if (st != KVF_OK)
        file_move_failed(b, i, st, kvf_last_error());
}

/* One pass of file I/O over the moves of first..last-1 still in progress,
 * all in flight at once: gather into staging and write, or read and
 * scatter from staging. Each move gets its own status. */
static void file_io_pass(worker *w, batch *b, size_t first, size_t last, bool dev, bool to_file)
{
    kvf_engine *e = w->engine;
    size_t slot_bytes = staging_slot_bytes(e);
    size_t k = 0;
    for (size_t i = first; i < last; i++) {
        if (b->status[i] != KVF_INPROGRESS)
            continue;
        const kvf_move *mv = &b->moves[i];
        kvf__blockfile_io *io = &w->ios[k];
        io->buf = dev ? kvf__gds_buf_slot(w->gstaging, k) : w->staging + k * slot_bytes;
        io->cap = slot_bytes;
        io->img = dev ? kvf__gds_image_ops() : NULL;
        io->img_arg = w->gstaging;
        io->on_done = to_file ? NULL : onboard_done;
        io->fill = to_file ? offload_fill : NULL;
        io->arg = w;
        io->meta.key = to_file ? mv->dst : mv->src;
        w->io_moves[k++] = i;
    }
    w->file_batch = b;
    if (to_file) {
        kvf__blockfile_write_many(&e->dir, e->fio, w->ios, k);
        for (size_t j = 0; j < k; j++)
            if (w->ios[j].status != KVF_OK)
                file_move_failed(b, w->io_moves[j], w->ios[j].status, w->ios[j].msg);
        lost_files_written(e, w->ios, k);
    } else {
        kvf__blockfile_read_many(&e->dir, e->fio, w->ios, k);
    }
}

/* How long a worker waits before its one retry of the moves that found the
 * process out of a resource: long enough for other threads' transfers to
 * close their files, short against a recompute. */
#define RESOURCE_RETRY_NS 5000000L

/* Puts the moves of first..last-1 that failed for want of a resource back
 * in progress, for one more pass; false when there are none. */
static bool retry_resource_failures(const batch *b, size_t first, size_t last)
{
    size_t n = 0;
    for (size_t i = first; i < last; i++)
        if (b->status[i] == KVF_ERR_RESOURCE) {
            b->status[i] = KVF_INPROGRESS;
            n++;
        }
    if (n)
        KVF_LOG(KVF_LOG_INFO, "%s: retrying %zu moves that found the process out of a resource",
                op_names[b->kind], n);
    return n > 0;
}

/* The file half of moves first..last-1 of a batch. A move that finds the
 * process out of a resource (descriptors, above all, when many transfers
 * run at once) is tried once more after a short wait, and then reported
 * with KVF_ERR_RESOURCE: the block it read stays stored. */
static void run_file_moves(worker *w, batch *b, size_t first, size_t last)
{
    kvf_engine *e = w->engine;
    if (b->kind == OP_REMOVE) {
        for (size_t i = first; i < last; i++) {
            if (b->status[i] != KVF_INPROGRESS)
                continue;
            kvf_status rs = kvf__blockfile_remove(&e->dir, b->moves[i].src);
            if (rs != KVF_OK)
                file_move_failed(b, i, rs, kvf_last_error());
            else
                lost_file_set(e, b->moves[i].src, false); /* absent now, as promised */
        }
        return;
    }
    /* device slots take cuFile; secondary slots are host memory */
    bool dev = e->gds && !kind_uses_secondary(b->kind);
    bool to_file = kind_writes(b->kind) == SP_FILE;
    if (!to_file)
        refuse_lost_files(e, b, first, last);
    kvf_status st = ensure_staging(w, last - first, dev);
    if (st != KVF_OK) {
        char why[KVF_MOVE_ERROR_MESSAGE];
        snprintf(why, sizeof why, "%s", kvf_last_error());
        for (size_t i = first; i < last; i++) {
            if (b->status[i] != KVF_INPROGRESS)
                continue;
            uint64_t key = to_file ? b->moves[i].dst : b->moves[i].src;
            kvf__fail(st, "block 0x%llx: %s", (unsigned long long)key, why);
            file_move_failed(b, i, st, kvf_last_error());
        }
        if (to_file)
            drop_failed_files(e, b, first, last);
        return;
    }
    file_io_pass(w, b, first, last, dev, to_file);
    if (retry_resource_failures(b, first, last)) {
        struct timespec pause = {0, RESOURCE_RETRY_NS};
        nanosleep(&pause, NULL);
        file_io_pass(w, b, first, last, dev, to_file);
    }
    if (to_file)
        drop_failed_files(e, b, first, last);
}

static kvf_status run_copy_move(kvf_engine *e, const batch *b, size_t i)
{
    kvf__copy copies[64];
    kvf_status st = KVF_OK;
    for (uint32_t p = 0; p < e->npools && st == KVF_OK; p += 64) {
        uint32_t k = 0;
        for (; k < 64 && p + k < e->npools; k++)
            copies[k] = move_copy(e, b->kind, p + k, &b->moves[i]);
        st = e->backend->ops->copy_sync(e->backend, b->queue, copies, k);
    }
    return st;
}

/* How many moves one worker takes from a batch at a time: about 4 MiB, and
 * no more than an even share, so a large batch spreads over all workers. */
/* ---- the remote tier ---------------------------------------------------------- */

/* Blocks of one remote round trip: a worker's pipelined batch. */
#define REMOTE_CHUNK_BYTES ((size_t)8 << 20)
#define REMOTE_CHUNK_MOVES 64u
/* A remote batch's deadline allows its bytes at this rate on top of the
 * timeout: far below what a Redis node moves, so only a stalled or
 * trickling node reaches it, yet a batch of many blocks is not failed
 * for its size alone. */
#define REMOTE_FLOOR_BYTES_PER_S ((uint64_t)256 << 20)
#define REMOTE_DEFAULT_TIMEOUT_MS 2000u

/* The deadline of remote batch b, fixed when its first chunk is claimed
 * (the caller holds e->mu): every chunk, on whichever worker, ends by
 * then, so the batch takes the timeout plus its bytes at the floor rate,
 * however many chunks it has. A group's parts share the group's. */
static uint64_t remote_deadline(const kvf_engine *e, batch *b)
{
    batch *root = b->group ? b->group : b;
    if (!root->remote_deadline_ns) {
        uint64_t timeout_ms =
            e->cfg.remote_timeout_ms ? e->cfg.remote_timeout_ms : REMOTE_DEFAULT_TIMEOUT_MS;
        uint64_t bytes = kind_removes(b->kind) ? 0 : (uint64_t)root->n * e->all_block_bytes;
        root->remote_deadline_ns =
            kvf__now_ns() + timeout_ms * 1000000u + bytes / REMOTE_FLOOR_BYTES_PER_S * 1000000000u +
            bytes % REMOTE_FLOOR_BYTES_PER_S * 1000000000u / REMOTE_FLOOR_BYTES_PER_S;
    }
    return root->remote_deadline_ns;
}

/* The connected remote tier, connecting first when needed. The handle
 * lives as long as the engine once made. */
static kvf_status remote_handle(kvf_engine *e, kvf__remote **r_p)
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
            kvf__remote_config rc = KVF_REMOTE_CONFIG_INIT;
            rc.url = e->remote_url;
            rc.ns = e->file_namespace;
            rc.fingerprint = e->dir.fingerprint;
            rc.ttl_s = e->cfg.remote_ttl_s;
            if (e->cfg.remote_timeout_ms)
                rc.connect_timeout_ms = rc.timeout_ms = e->cfg.remote_timeout_ms;
            st = kvf__remote_open(&rc, &e->remote);
            if (st != KVF_OK) {
                e->remote = NULL;
                e->remote_retry_ns = now + 1000000000u;
                snprintf(e->remote_why, sizeof e->remote_why, "%s", kvf_last_error());
                KVF_LOG(KVF_LOG_WARN, "remote tier: %s", kvf_last_error());
            }
        }
    }
    *r_p = e->remote;
    pthread_mutex_unlock(&e->remote_mu);
    return st;
}

/* Grows a worker's host staging buffer (pinned on the CUDA backend, so
 * its copies run at PCIe speed) to at least `need` bytes. */
static kvf_status staging_grow(kvf_engine *e, uint8_t **buf, size_t *cap, size_t need)
{
    if (*buf && *cap >= need)
        return KVF_OK;
    kvf_memory kind =
        e->backend_kind == KVF_BACKEND_CUDA ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST;
    void *p;
    kvf_status st = e->backend->ops->mem_alloc(e->backend, kind, need, &p);
    if (st != KVF_OK)
        return st;
    if (*buf)
        e->backend->ops->mem_free(e->backend, kind, *buf);
    *buf = p;
    *cap = need;
    return KVF_OK;
}

/* The remote key a move of a remote batch writes or reads. */
static uint64_t remote_key(const batch *b, size_t i)
{
    return kind_writes(b->kind) == SP_REMOTE ? b->moves[i].dst : b->moves[i].src;
}

/* Runs moves [first, last) of a remote batch as one pipelined batch: the
 * blocks are gathered into staging and stored, or fetched into staging,
 * checked and scattered to their slots, all by `deadline_ns` (see
 * remote_deadline). Statuses go to b->status. */
static void run_remote_chunk(worker *w, batch *b, size_t first, size_t last, uint64_t deadline_ns)
{
    kvf_engine *e = w->engine;
    size_t bb = e->all_block_bytes, m = 0;
    size_t idx[REMOTE_CHUNK_MOVES];
    for (size_t i = first; i < last; i++)
        if (b->status[i] == KVF_INPROGRESS)
            idx[m++] = i;
    if (m == 0)
        return;
    kvf__remote *r = NULL;
    kvf_status st = remote_handle(e, &r);
    if (st == KVF_OK && !kind_removes(b->kind))
        st = staging_grow(e, &w->rstaging, &w->rstaging_bytes, m * bb);
    kvf__copy *cp = st == KVF_OK ? malloc(m * e->npools * sizeof *cp) : NULL;
    kvf_status rs[REMOTE_CHUNK_MOVES];
    if (st == KVF_OK && !cp)
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", op_names[b->kind]);
    /* the detail of the round trip's first failed block (the store names
     * no other): every failed block's message quotes it */
    char first_why[KVF_MOVE_ERROR_MESSAGE] = "";
    bool noted[REMOTE_CHUNK_MOVES] = {false};
    if (st != KVF_OK) {
        KVF_LOG(KVF_LOG_WARN, "%s: %zu blocks: %s", op_names[b->kind], m, kvf_last_error());
        snprintf(first_why, sizeof first_why, "%s", kvf_last_error());
        for (size_t j = 0; j < m; j++)
            move_failed(b, idx[j], st, "%s: remote block 0x%llx: %s", op_names[b->kind],
                        (unsigned long long)remote_key(b, idx[j]), first_why);
        free(cp);
        return;
    }
    kvf_status ret = KVF_OK;
    if (b->kind == OP_REMOVE_REMOTE) {
        uint64_t keys[REMOTE_CHUNK_MOVES];
        for (size_t j = 0; j < m; j++)
            keys[j] = b->moves[idx[j]].src;
        ret = kvf__remote_delete_batch_until(r, keys, m, deadline_ns, rs);
    } else if (b->kind == OP_OFFLOAD_REMOTE) {
        kvf__remote_put puts[REMOTE_CHUNK_MOVES];
        for (size_t j = 0; j < m; j++) {
            const kvf_move *mv = &b->moves[idx[j]];
            uint32_t tokens = eff_tokens(e, mv->tokens);
            uint8_t *payload = w->rstaging + j * bb;
            size_t bytes = file_copies(e, b->kind, mv, payload, tokens, tokens, cp + j * e->npools);
            puts[j] = (kvf__remote_put){mv->dst, tokens, e->npools, payload, bytes};
        }
        st = e->backend->ops->copy_sync(e->backend, b->queue, cp, m * e->npools);
        if (st == KVF_OK) {
            ret = kvf__remote_put_batch_until(r, puts, m, deadline_ns, rs);
        } else {
            ret = kvf__fail(st, "gathering the blocks: %s", kvf_last_error());
            for (size_t j = 0; j < m; j++)
                rs[j] = st;
        }
    } else {
        kvf__remote_get gets[REMOTE_CHUNK_MOVES];
        for (size_t j = 0; j < m; j++)
            gets[j] = (kvf__remote_get){b->moves[idx[j]].src, w->rstaging + j * bb, bb, 0, 0, 0};
        ret = kvf__remote_get_batch_until(r, gets, m, deadline_ns, rs);
        if (ret != KVF_OK)
            snprintf(first_why, sizeof first_why, "%s", kvf_last_error());
        size_t ncp = 0;
        for (size_t j = 0; j < m; j++) {
            if (rs[j] != KVF_OK)
                continue;
            const kvf_move *mv = &b->moves[idx[j]];
            uint32_t tokens = eff_tokens(e, mv->tokens);
            unsigned long long key = (unsigned long long)mv->src;
            if (gets[j].pools != e->npools) {
                rs[j] = kvf__fail(KVF_ERR_MISMATCH,
                                  "block 0x%llx: stored remotely with %u pools, engine has %u", key,
                                  gets[j].pools, e->npools);
            } else if (gets[j].tokens < tokens) {
                rs[j] = kvf__fail(KVF_ERR_RANGE, "block 0x%llx: holds %u tokens, %u asked", key,
                                  gets[j].tokens, tokens);
            } else {
                size_t bytes =
                    file_copies(e, b->kind, mv, gets[j].dst, tokens, gets[j].tokens, cp + ncp);
                if (bytes != gets[j].payload_bytes)
                    rs[j] = kvf__fail(KVF_ERR_MISMATCH,
                                      "block 0x%llx: %zu payload bytes stored remotely, %zu "
                                      "expected",
                                      key, gets[j].payload_bytes, bytes);
                else
                    ncp += e->npools;
            }
            if (rs[j] != KVF_OK) {
                KVF_LOG(KVF_LOG_WARN, "%s: %s", op_names[b->kind], kvf_last_error());
                move_failed(b, idx[j], rs[j], "%s: %s", op_names[b->kind], kvf_last_error());
                noted[j] = true;
            }
        }
        st = ncp ? e->backend->ops->copy_sync(e->backend, b->queue, cp, ncp) : KVF_OK;
        if (st != KVF_OK) {
            ret = kvf__fail(st, "scattering the blocks: %s", kvf_last_error());
            snprintf(first_why, sizeof first_why, "%s", kvf_last_error());
            for (size_t j = 0; j < m; j++)
                if (rs[j] == KVF_OK)
                    rs[j] = st;
        }
    }
    if (ret != KVF_OK && !first_why[0])
        snprintf(first_why, sizeof first_why, "%s", kvf_last_error());
    if (ret != KVF_OK) /* names the first failed block's key and node */
        KVF_LOG(KVF_LOG_WARN, "%s: %zu blocks: %s", op_names[b->kind], m, first_why);
    for (size_t j = 0; j < m; j++)
        if (rs[j] != KVF_OK && !noted[j])
            move_failed(b, idx[j], rs[j], "%s: remote block 0x%llx: %s%s%s", op_names[b->kind],
                        (unsigned long long)remote_key(b, idx[j]), kvf_status_str(rs[j]),
                        first_why[0] ? "; the round trip's first failure: " : "", first_why);
    free(cp);
}

static size_t chunk_of(const kvf_engine *e, const batch *b)
{
    size_t per = e->all_block_bytes ? (4u << 20) / e->all_block_bytes : 1;
    if (kind_is_file(b->kind)) {
        /* a few times a worker's share of the queue depth, so that its
         * queue stays full (the I/O runner submits as calls complete)
         * and drains only at the end of a chunk; within a staging budget */
        size_t nw = e->nworkers, depth = kvf__fileio_runner_depth(e->fio);
        size_t budget = FILE_STAGING_BUDGET / staging_slot_bytes(e);
        per = 4 * ((depth + nw - 1) / nw);
        if (per > budget)
            per = budget;
    }
    if (kind_is_remote(b->kind)) {
        per = e->all_block_bytes ? REMOTE_CHUNK_BYTES / e->all_block_bytes : 1;
        per = per < 1 ? 1 : per > REMOTE_CHUNK_MOVES ? REMOTE_CHUNK_MOVES : per;
    }
    size_t share = (b->n + e->nworkers - 1) / e->nworkers;
    size_t c = per < share ? per : share;
    return c ? c : 1;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    kvf_engine *e = w->engine;
    engine_lock(e);
    for (;;) {
        batch *b = e->ready_head[KVF_QUEUE_ONBOARD];
        if (!b)
            b = e->ready_head[KVF_QUEUE_OFFLOAD];
        if (!b) {
            if (e->stop)
                break;
            pthread_cond_wait(&e->work_cv, &e->mu);
            continue;
        }
        if (e->backend->ops->copy_async && !kind_on_workers(b->kind)) {
            ready_pop(e, b->queue);
            b->state = B_RUNNING;
            b->async = true;
            issue_async(e, b);
            continue;
        }
        size_t first = b->next_move;
        size_t last = first + chunk_of(e, b);
        if (first == 0)
            KVF_TIMELINE(KVF_TL_ISSUE, b->id, b->n);
        if (last >= b->n) {
            last = b->n;
            ready_pop(e, b->queue);
            b->state = B_RUNNING;
        } else {
            /* chunks remain: an idle worker takes the next meanwhile (a
             * batch is shared by the workers, see chunk_of; only a batch
             * becoming ready wakes one otherwise) */
            pthread_cond_signal(&e->work_cv);
        }
        b->next_move = last;
        /* a removal reads nothing: a failed write before it is no loss */
        for (size_t i = first; i < last && !kind_removes(b->kind); i++)
            if (b->status[i] == KVF_INPROGRESS && source_lost(e, b, i))
                fail_lost_source(b, i);
        uint64_t deadline_ns = kind_is_remote(b->kind) ? remote_deadline(e, b) : 0;
        pthread_mutex_unlock(&e->mu);

        /* each move's status is written by the one worker that claimed it */
        if (kind_is_remote(b->kind))
            run_remote_chunk(w, b, first, last, deadline_ns);
        else if (kind_is_file(b->kind)) {
            uint64_t t0 = kvf__now_ns();
            run_file_moves(w, b, first, last);
            w->file_ns += kvf__now_ns() - t0;
            w->file_chunks++;
            w->file_moves += last - first;
        }
        for (size_t i = first; i < last && !kind_on_workers(b->kind); i++) {
            if (b->status[i] != KVF_INPROGRESS)
                continue;
            kvf_status st = run_copy_move(e, b, i);
            if (st != KVF_OK)
                fail_copy(b, i, st, kvf_last_error());
        }

        KVF_TIMELINE(KVF_TL_CHUNK, b->id, last - first);
        engine_lock(e);
        b->moves_done += last - first;
        if (b->moves_done == b->n) {
            if (kind_writes(b->kind) == SP_FILE && !kind_removes(b->kind) &&
                e->cfg.fsync == KVF_FSYNC_BATCH) {
                pthread_mutex_unlock(&e->mu);
                kvf_status st = kvf__blockfile_fsync_dir(&e->dir);
                if (st != KVF_OK) {
                    /* every move of the batch is done: their statuses are
                     * this thread's to write; the files of those failed
                     * before are gone already */
                    char why[KVF_MOVE_ERROR_MESSAGE];
                    snprintf(why, sizeof why, "%s", kvf_last_error());
                    for (size_t i = 0; i < b->n; i++)
                        if (b->status[i] == KVF_INPROGRESS) {
                            move_failed(b, i, st, "%s: block 0x%llx: %s", op_names[b->kind],
                                        (unsigned long long)b->moves[i].dst, why);
                            drop_failed_file(e, b, i);
                        }
                }
                engine_lock(e);
            }
            complete_batch(e, b);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- tickets and sync ------------------------------------------------------ */

static batch **ticket_slot(kvf_engine *e, kvf_ticket t)
{
    batch **pp = &e->tickets[t.id % TICKET_BUCKETS];
    while (*pp && (*pp)->id != t.id)
        pp = &(*pp)->next_ticket;
    return pp;
}

/* Retires a completed ticket: its statuses into per_move, its failed
 * moves' messages (collect_errors) into *errors_p, or freed with NULL.
 * Lock held. */
static kvf_status finish_ticket(kvf_engine *e, batch **pp, kvf_status *per_move,
                                kvf__move_error **errors_p)
{
    batch *b = *pp;
    kvf_status ret = KVF_OK;
    size_t failed = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (per_move)
            per_move[i] = b->status[i];
        if (b->status[i] != KVF_OK && failed++ == 0)
            ret = b->status[i];
    }
    kvf__move_error *errors = collect_errors(b, failed);
    uint64_t id = b->id;
    size_t n = b->n;
    *pp = b->next_ticket;
    b->retired = true;
    batch_release(b);
    if (ret != KVF_OK) {
        if (errors)
            kvf__fail(ret, "ticket %llu: %zu of %zu moves failed; move %zu: %s",
                      (unsigned long long)id, failed, n, errors->index, errors->message);
        else
            kvf__fail(ret, "ticket %llu: %zu moves failed (%s); see the per-move statuses",
                      (unsigned long long)id, failed, kvf_status_str(ret));
    }
    if (errors_p)
        *errors_p = errors;
    else
        kvf__move_errors_free(errors);
    return ret;
}

/* *done_p (may be NULL): the ticket completed and was retired here. */
static kvf_status ticket_result(kvf_engine *e, kvf_ticket t, kvf_status *per_move, bool block,
                                kvf__move_error **errors_p, bool *done_p)
{
    kvf__clear_error();
    if (!e)
        return kvf__fail(KVF_ERR_INVALID, "ticket %llu: engine is NULL", (unsigned long long)t.id);
    engine_lock(e);
    batch **pp = ticket_slot(e, t);
    if (!*pp) {
        pthread_mutex_unlock(&e->mu);
        return kvf__fail(KVF_ERR_UNKNOWN_TICKET, "ticket %llu: unknown or already retired",
                         (unsigned long long)t.id);
    }
    batch *b = *pp;
    while (b->state != B_DONE) {
        if (!block) {
            pthread_mutex_unlock(&e->mu);
            return KVF_INPROGRESS;
        }
        pthread_cond_wait(&e->done_cv, &e->mu);
    }
    pp = ticket_slot(e, t); /* the chain may have changed while waiting */
    kvf_status st = finish_ticket(e, pp, per_move, errors_p);
    pthread_mutex_unlock(&e->mu);
    if (done_p)
        *done_p = true;
    return st;
}

kvf_status kvf_poll(kvf_engine *e, kvf_ticket t, kvf_status *per_move)
{
    return ticket_result(e, t, per_move, false, NULL, NULL);
}

kvf_status kvf_wait(kvf_engine *e, kvf_ticket t, kvf_status *per_move)
{
    return ticket_result(e, t, per_move, true, NULL, NULL);
}

kvf_status kvf__engine_ticket_errors(kvf_engine *e, kvf_ticket t, bool block, kvf_status *per_move,
                                     kvf__move_error **errors_p)
{
    *errors_p = NULL;
    return ticket_result(e, t, per_move, block, errors_p, NULL);
}

static kvf_status ticket_errors(kvf_engine *e, kvf_ticket t, bool block, kvf_status *per_move,
                                kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    if (!errors && cap) {
        kvf__clear_error();
        return kvf__fail(KVF_ERR_INVALID, "ticket %llu: errors is NULL with cap = %zu",
                         (unsigned long long)t.id, cap);
    }
    kvf__move_error *list = NULL;
    bool done = false;
    kvf_status st = ticket_result(e, t, per_move, block, &list, &done);
    if (done)
        kvf__move_errors_deliver(list, errors, cap, n_errors_p);
    return st;
}

kvf_status kvf_wait_errors(kvf_engine *e, kvf_ticket t, kvf_status *per_move,
                           kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    return ticket_errors(e, t, true, per_move, errors, cap, n_errors_p);
}

kvf_status kvf_poll_errors(kvf_engine *e, kvf_ticket t, kvf_status *per_move,
                           kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    return ticket_errors(e, t, false, per_move, errors, cap, n_errors_p);
}

/* Whether every batch up to `last_id` is done or, with an asynchronous
 * backend, already on its stream. Lock held. */
static bool all_issued(const kvf_engine *e, uint64_t last_id, bool host_only)
{
    for (const batch *b = e->undone_head; b && b->id <= last_id; b = b->next_undone)
        if (host_only || !b->on_stream)
            return false;
    return true;
}

kvf_status kvf_sync_stream(kvf_engine *e, void *stream)
{
    kvf__clear_error();
    if (!e)
        return kvf__fail(KVF_ERR_INVALID, "kvf_sync_stream: engine is NULL");
    bool gpu = stream && e->backend->ops->sync_stream;
    engine_lock(e);
    uint64_t last = e->next_id - 1;
    /* batches still waiting for their dependencies, or going to files, are
     * not on a stream yet: wait for them on the host */
    while (!all_issued(e, last, !gpu))
        pthread_cond_wait(&e->done_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (gpu)
        return e->backend->ops->sync_stream(e->backend, stream);
    return KVF_OK;
}
