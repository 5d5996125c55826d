/*
 * The tiered cache: content keys mapped to blocks in the engine's secondary
 * slots (host tier) and block files (disk tier), with eviction down the
 * tiers, pins, events and counters.
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
 * engine never calls back into the cache), except blocking waits.
 */
#include "blockfile.h"
#include "config.h"
#include "engine.h"
#include "log.h"
#include "remote.h"
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PRIORITIES 101u
#define MAX_PRIORITY 100u

/* States of a GPU-tier slot. */
enum { GPU_FREE = 0, GPU_HANDED_OUT = 1, GPU_CACHED = 2 };

typedef struct entry entry;
struct entry {
    kvf_key key;
    entry *hnext;       /* hash chain */
    entry *prev, *next; /* its (tier, priority) LRU list, while unpinned */
    uint64_t gen;       /* changes with every placement */
    uint64_t round;     /* the put round that placed it (see flush) */
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
    kvf_cache_tier tier; /* the tier written (put, demote) or read (get) */
    kvf_ticket ticket;   /* the engine's; 0 when the submit failed */
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
    kvf_ticket id;
    size_t n;
    kvf_status *status;      /* KVF_INPROGRESS where an op decides */
    kvf__move_error *errors; /* per failed block, by block index (kvf_cache_wait_errors) */
    op *ops;
    uint64_t t0_ns;
    bool waited; /* a thread waits for it: a second wait is refused */
    call *next;
};

struct kvf_cache {
    kvf_engine *engine;
    kvf_cache_config cfg;
    kvf_setting *settings; /* cfg as resolved, with sources */
    size_t nsettings;
    pthread_mutex_t mu;

    entry **buckets;
    size_t nbuckets, count;
    lru lists[KVF_CACHE_TIERS][PRIORITIES];
    uint64_t listed[KVF_CACHE_TIERS]; /* entries on the lists: the unpinned ones */
    uint64_t capacity[KVF_CACHE_TIERS];
    uint64_t used[KVF_CACHE_TIERS];
    uint32_t *free_slots; /* host tier: secondary slots not in use */
    uint32_t nfree;
    /* GPU tier: primary slots 0 .. gpu_blocks-1, each free, handed out
     * (the caller's until commit or free) or holding a cached block */
    uint32_t *gpu_free;
    uint32_t ngpu_free;
    uint8_t *gpu_state;
    uint64_t next_gen;
    uint64_t round; /* see flush */
    bool deferring; /* a call is assembling batches: see doom */
    entry **doomed;
    size_t ndoomed, doomed_cap;
    size_t block_bytes;
    uint32_t primary_slots;

    op *background; /* ops nobody waits for, reaped by later calls */
    call *calls;
    kvf_ticket next_call;

    kvf_cache_event *events; /* ring of cfg.event_queue */
    size_t ev_head, ev_count;
    uint64_t ev_seq;

    kvf_cache_stats stats;
};

/* ---- small helpers ---------------------------------------------------------- */

const char *kvf_cache_tier_name(kvf_cache_tier tier)
{
    switch (tier) {
    case KVF_CACHE_HOST:
        return "host";
    case KVF_CACHE_DISK:
        return "disk";
    case KVF_CACHE_REMOTE:
        return "remote";
    case KVF_CACHE_GPU:
        return "gpu";
    default:
        return "?";
    }
}

static size_t bucket_of(const kvf_cache *c, kvf_key key)
{
    key ^= key >> 31;
    key *= 0x9E3779B97F4A7C15ull;
    return (size_t)(key >> 17) & (c->nbuckets - 1);
}

static entry *find(const kvf_cache *c, kvf_key key)
{
    for (entry *e = c->buckets[bucket_of(c, key)]; e; e = e->hnext)
        if (e->key == key)
            return e;
    return NULL;
}

static bool table_grow(kvf_cache *c)
{
    size_t nb = c->nbuckets * 2;
    entry **b = calloc(nb, sizeof *b);
    if (!b)
        return false;
    entry **old = c->buckets;
    size_t oldn = c->nbuckets;
    c->buckets = b;
    c->nbuckets = nb;
    for (size_t i = 0; i < oldn; i++)
        for (entry *e = old[i], *next; e; e = next) {
            next = e->hnext;
            size_t k = bucket_of(c, e->key);
            e->hnext = b[k];
            b[k] = e;
        }
    free(old);
    return true;
}

static void lru_unlink(kvf_cache *c, entry *e)
{
    lru *l = &c->lists[e->tier][e->priority];
    c->listed[e->tier]--;
    if (e->prev)
        e->prev->next = e->next;
    else
        l->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = NULL;
}

/* Appends as the most recently used of its list. */
static void lru_append(kvf_cache *c, entry *e)
{
    lru *l = &c->lists[e->tier][e->priority];
    c->listed[e->tier]++;
    e->next = NULL;
    e->prev = l->tail;
    if (l->tail)
        l->tail->next = e;
    else
        l->head = e;
    l->tail = e;
}

/* The next victim of a tier: lowest priority, then least recently used.
 * Pinned entries are on no list, so are never returned. */
static entry *victim_of(kvf_cache *c, kvf_cache_tier t)
{
    /* an entry already going (a refused batch's, see doom) is no victim */
    for (uint32_t p = 0; p < PRIORITIES; p++)
        for (entry *e = c->lists[t][p].head; e; e = e->next)
            if (!e->removing)
                return e;
    return NULL;
}

/* ---- events ---------------------------------------------------------------- */

static void emit(kvf_cache *c, kvf_cache_event_kind kind, const entry *e, kvf_cache_tier from)
{
    kvf_cache_event ev = {++c->ev_seq,
                          kind,
                          e->key,
                          (kvf_cache_tier)e->tier,
                          kind == KVF_EVENT_UPDATED ? from : (kvf_cache_tier)e->tier,
                          e->priority};
    if (c->cfg.on_event)
        c->cfg.on_event(c->cfg.on_event_arg, &ev);
    if (!c->events)
        return;
    if (c->ev_count == c->cfg.event_queue) {
        c->stats.events_dropped++;
        return;
    }
    c->events[(c->ev_head + c->ev_count) % c->cfg.event_queue] = ev;
    c->ev_count++;
}

/* ---- placement -------------------------------------------------------------- */

/* Batches being assembled by one put (or by create's restore). */
typedef struct pending {
    kvf_move *moves;
    kvf_key *keys;
    uint64_t *gens;
    size_t *index;
    size_t n, cap;
    bool checked; /* reads GPU-tier slots: heed a failed write into them */
} pending;

/* Adds a move to a batch reserved with pending_reserve. */
static void pending_add(pending *p, kvf_move mv, kvf_key key, uint64_t gen, size_t index)
{
    p->moves[p->n] = mv;
    p->keys[p->n] = key;
    p->gens[p->n] = gen;
    p->index[p->n] = index;
    p->n++;
}

/* Room for `n` more moves, so that pending_add cannot fail after it. */
static bool pending_reserve(pending *p, size_t n)
{
    if (p->cap >= p->n + n)
        return true;
    size_t cap = p->n + n;
    kvf_move *m = realloc(p->moves, cap * sizeof *m);
    if (m)
        p->moves = m;
    kvf_key *k = realloc(p->keys, cap * sizeof *k);
    if (k)
        p->keys = k;
    uint64_t *g = realloc(p->gens, cap * sizeof *g);
    if (g)
        p->gens = g;
    size_t *x = realloc(p->index, cap * sizeof *x);
    if (x)
        p->index = x;
    if (!m || !k || !g || !x)
        return false;
    p->cap = cap;
    return true;
}

static void pending_free(pending *p)
{
    free(p->moves);
    free(p->keys);
    free(p->gens);
    free(p->index);
}

typedef struct put_batches {
    pending remove; /* disk victims' files */
    pending demote; /* host victims to disk */
    pending to_file, to_host;
    pending to_remote;              /* write-through */
    pending evict_file, evict_host; /* GPU victims moving down */
    struct call *k;                 /* the put's call, or NULL */
} put_batches;

static void flush(kvf_cache *c, put_batches *pb);

/* Takes an entry out of the map and its tier; its slot is free again and
 * its file, if any, is the caller's to remove. */
static void unplace(kvf_cache *c, entry *e)
{
    if (e->pins == 0)
        lru_unlink(c, e);
    c->used[e->tier]--;
    if (e->tier == KVF_CACHE_HOST)
        c->free_slots[c->nfree++] = e->slot;
    if (e->tier == KVF_CACHE_GPU) {
        c->gpu_state[e->slot] = GPU_FREE;
        c->gpu_free[c->ngpu_free++] = e->slot;
    }
    entry **pp = &c->buckets[bucket_of(c, e->key)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    c->count--;
}

static void drop(kvf_cache *c, entry *e, put_batches *pb)
{
    unplace(c, e);
    if (e->tier == KVF_CACHE_DISK && pb)
        pending_add(&pb->remove, (kvf_move){e->key, e->key, 0}, e->key, 0, 0);
    emit(c, KVF_EVENT_REMOVED, e, (kvf_cache_tier)e->tier);
    free(e);
}

/* Makes room for one block on disk: drops the disk victim. */
static bool disk_room(kvf_cache *c, put_batches *pb)
{
    if (c->used[KVF_CACHE_DISK] < c->capacity[KVF_CACHE_DISK])
        return true;
    entry *v = victim_of(c, KVF_CACHE_DISK);
    if (!v)
        return false;
    if (v->round == c->round)
        flush(c, pb); /* its file's write must be queued before its removal */
    c->stats.evictions[KVF_CACHE_DISK]++;
    c->stats.dropped++;
    drop(c, v, pb);
    return true;
}

/* A free host slot, evicting the host victim (down to disk, or dropped)
 * when none is free. false: every host block is pinned. */
static bool host_slot(kvf_cache *c, put_batches *pb, uint32_t *slot_p)
{
    if (c->nfree) {
        *slot_p = c->free_slots[--c->nfree];
        c->used[KVF_CACHE_HOST]++;
        return true;
    }
    entry *v = victim_of(c, KVF_CACHE_HOST);
    if (!v)
        return false;
    if (v->round == c->round)
        flush(c, pb); /* its slot's write must be queued before it is read or reused */
    c->stats.evictions[KVF_CACHE_HOST]++;
    bool move_down = c->capacity[KVF_CACHE_DISK] > 0 &&
                     v->priority >= c->cfg.offload_min_priority &&
                     v->uses >= c->cfg.disk_admit_uses && disk_room(c, pb);
    if (!move_down) {
        c->stats.dropped++;
        uint32_t slot = v->slot;
        drop(c, v, pb);
        c->nfree--; /* drop freed the slot: it is taken again at once */
        c->used[KVF_CACHE_HOST]++;
        *slot_p = slot;
        return true;
    }
    uint32_t slot = v->slot;
    lru_unlink(c, v);
    v->tier = KVF_CACHE_DISK;
    v->gen = ++c->next_gen;
    v->round = c->round;
    c->used[KVF_CACHE_DISK]++;
    lru_append(c, v);
    pending_add(&pb->demote, (kvf_move){slot, v->key, 0}, v->key, v->gen, 0);
    c->stats.bytes_in[KVF_CACHE_DISK] += c->block_bytes;
    emit(c, KVF_EVENT_UPDATED, v, KVF_CACHE_HOST);
    *slot_p = slot; /* used[HOST] unchanged: the slot passes to the new block */
    return true;
}

static entry *place(kvf_cache *c, kvf_key key, kvf_cache_tier tier, uint32_t slot,
                    uint32_t priority)
{
    entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->key = key;
    e->tier = (uint8_t)tier;
    e->slot = slot;
    e->priority = (uint8_t)priority;
    e->gen = ++c->next_gen;
    e->round = c->round;
    size_t b = bucket_of(c, key);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    c->count++;
    lru_append(c, e);
    if (c->count > c->nbuckets)
        table_grow(c); /* a failed grow only lengthens the chains */
    return e;
}

/* ---- ops: queueing and completion ----------------------------------------- */

static void op_free(op *o)
{
    if (!o)
        return;
    free(o->keys);
    free(o->gens);
    free(o->index);
    free(o->status);
    kvf__move_errors_free(o->errors);
    free(o);
}

/* Keeps why move i of an op failed, for its call's kvf_cache_wait_errors. */
static void op_note(op *o, size_t i, kvf_status st, const char *why)
{
    kvf__move_error *r = kvf__move_error_new(i, st, why);
    if (r) {
        r->next = o->errors;
        o->errors = r;
    }
}

/* Keeps why block i of a call failed; a record that finds no memory
 * becomes the status's text (kvf__move_errors_sorted). */
static void call_note(call *k, size_t i, kvf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void call_note(call *k, size_t i, kvf_status st, const char *fmt, ...)
{
    char msg[KVF_MOVE_ERROR_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvf__move_error *r = kvf__move_error_new(i, st, msg);
    if (r) {
        r->next = k->errors;
        k->errors = r;
    }
}

/* Queues one assembled batch with the engine and empties it. NULL when out
 * of memory for the op (the batch is left as it was);
 * an op the engine refused comes back with ticket 0 and every move failed
 * with the engine's status. */
static op *op_submit(kvf_cache *c, op_kind kind, kvf_cache_tier tier, pending *p)
{
    op *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->kind = kind;
    o->tier = tier;
    o->n = p->n;
    o->keys = malloc(p->n * sizeof *o->keys);
    o->gens = malloc(p->n * sizeof *o->gens);
    o->index = malloc(p->n * sizeof *o->index);
    o->status = malloc(p->n * sizeof *o->status);
    if (!o->keys || !o->gens || !o->index || !o->status) {
        op_free(o);
        return NULL;
    }
    memcpy(o->keys, p->keys, p->n * sizeof *o->keys);
    memcpy(o->gens, p->gens, p->n * sizeof *o->gens);
    memcpy(o->index, p->index, p->n * sizeof *o->index);
    kvf_engine *eng = c->engine;
    kvf_status st;
    static const kvf_tier engine_tier[KVF_CACHE_TIERS] = {KVF_TIER_HOST, KVF_TIER_FILE,
                                                          KVF_TIER_REMOTE, KVF_TIER_HOST};
    switch (kind) {
    case OPK_PUT:
    case OPK_REMOTE_PUT:
    case OPK_EVICT:
        /* GPU-tier slots are read checked: a copy into one that failed must
         * not pass its bytes on */
        st = p->checked || kind == OPK_EVICT
                 ? kvf__engine_move_checked(eng, engine_tier[tier], false, p->moves, p->n,
                                            &o->ticket)
                 : kvf_offload(eng, engine_tier[tier], p->moves, p->n, &o->ticket);
        break;
    case OPK_GET:
    case OPK_ACQUIRE:
        st = tier == KVF_CACHE_GPU
                 ? kvf__engine_move_checked(eng, KVF_TIER_HOST, true, p->moves, p->n, &o->ticket)
                 : kvf_onboard(eng, engine_tier[tier], p->moves, p->n, &o->ticket);
        break;
    case OPK_DEMOTE:
        st = kvf_demote(eng, p->moves, p->n, &o->ticket);
        break;
    case OPK_REMOVE:
        st = kvf_file_remove(eng, o->keys, p->n, &o->ticket);
        break;
    case OPK_FENCE: {
        uint32_t *fs = malloc(p->n * sizeof *fs);
        st = fs ? KVF_OK : kvf__fail(KVF_ERR_NOMEM, "cache: out of memory");
        for (size_t i = 0; fs && i < p->n; i++)
            fs[i] = (uint32_t)p->moves[i].src;
        if (fs)
            st = kvf__engine_fence(eng, fs, p->n, &o->ticket);
        free(fs);
        break;
    }
    default:
        st = kvf_remote_remove(eng, o->keys, p->n, &o->ticket);
        break;
    }
    if (st != KVF_OK) {
        KVF_LOG(KVF_LOG_WARN, "cache: a batch of %zu blocks was refused: %s", p->n,
                kvf_last_error());
        o->ticket = 0;
        for (size_t i = 0; i < o->n; i++) {
            o->status[i] = st;
            op_note(o, i, st, kvf_last_error());
        }
        o->done = true;
    }
    p->n = 0;
    return o;
}

static void background_push(kvf_cache *c, op *o)
{
    if (o) {
        o->next = c->background;
        c->background = o;
    }
}

/* Drops an entry and queues the removal of its file, if it has one. */
static void discard(kvf_cache *c, entry *e)
{
    put_batches pb = {0};
    if (e->tier == KVF_CACHE_DISK && !pending_reserve(&pb.remove, 1)) {
        /* the file stays: it holds this key's own bytes, and is found
         * (and checked) again only by a cache opened later */
        drop(c, e, NULL);
        return;
    }
    drop(c, e, &pb);
    if (pb.remove.n)
        background_push(c, op_submit(c, OPK_REMOVE, KVF_CACHE_DISK, &pb.remove));
    pending_free(&pb.remove);
}

/* A pinned entry is on no LRU list, so it is never a victim. */
static void pin_one(kvf_cache *c, entry *e)
{
    if (e->pins++ == 0)
        lru_unlink(c, e);
}

/* While a call assembles its batches, an entry a refused batch was about
 * is marked going but kept (the call's loop may still hold it) and freed
 * when the call ends (release_doomed). */
static void doom(kvf_cache *c, entry *e)
{
    if (c->ndoomed == c->doomed_cap) {
        size_t cap = c->doomed_cap ? 2 * c->doomed_cap : 16;
        entry **v = realloc(c->doomed, cap * sizeof *v);
        if (!v)
            return; /* stays marked going: no victim, no hit; freed never (out of memory) */
        c->doomed = v;
        c->doomed_cap = cap;
    }
    pin_one(c, e); /* (its pins were 0: see op_apply) */
    c->doomed[c->ndoomed++] = e;
}

static void unpin_one(kvf_cache *c, entry *e);

/* Frees the entries doomed during the call now ending. Lock held. */
static void release_doomed(kvf_cache *c)
{
    c->deferring = false;
    while (c->ndoomed)
        unpin_one(c, c->doomed[--c->ndoomed]);
}

/* An acquire that could not read a block's file for a reason that says
 * nothing against the file (the process out of descriptors, an I/O error)
 * puts the block back on disk, its file untouched; the GPU slot it was to
 * fill is free again. The disk tier may so hold one block over its
 * capacity until its next eviction. */
static void back_to_disk(kvf_cache *c, entry *e, kvf_status st)
{
    if (e->pins == 0)
        lru_unlink(c, e);
    c->gpu_state[e->slot] = GPU_FREE;
    c->gpu_free[c->ngpu_free++] = e->slot;
    c->used[KVF_CACHE_GPU]--;
    e->tier = KVF_CACHE_DISK;
    e->slot = 0;
    e->gen = ++c->next_gen;
    c->used[KVF_CACHE_DISK]++;
    if (e->pins == 0)
        lru_append(c, e);
    emit(c, KVF_EVENT_UPDATED, e, KVF_CACHE_GPU);
    KVF_LOG(KVF_LOG_WARN, "cache: block 0x%016llx: not read into the GPU tier: %s; kept on disk",
            (unsigned long long)e->key, kvf_status_str(st));
}

/* Applies a completed op to the map. Lock held. */
static void op_apply(kvf_cache *c, op *o, call *k)
{
    /* an acquire from disk removes the files it read only now, once it
     * knows each read's outcome; out of memory for the list, they stay
     * (each holds its key's own bytes, and is checked again when read) */
    pending stale = {0};
    bool from_file =
        o->kind == OPK_ACQUIRE && o->tier == KVF_CACHE_DISK && pending_reserve(&stale, o->n);
    /* the engine's messages come in move order (kvf__move_errors_sorted) */
    if (o->errors)
        o->errors = kvf__move_errors_sorted(o->errors, o->status, o->n, "cache: block");
    const kvf__move_error *why = o->errors;
    for (size_t i = 0; i < o->n; i++) {
        kvf_status st = o->status[i];
        while (why && why->index < i)
            why = why->next;
        if (k && o->index[i] < k->n &&
            (o->kind == OPK_PUT || o->kind == OPK_GET || o->kind == OPK_ACQUIRE ||
             o->kind == OPK_FENCE)) {
            k->status[o->index[i]] = st;
            if (st != KVF_OK)
                call_note(k, o->index[i], st, "block 0x%016llx: %s tier: %s",
                          (unsigned long long)o->keys[i],
                          kvf_cache_tier_name((kvf_cache_tier)o->tier),
                          why && why->index == i ? why->message : kvf_status_str(st));
        }
        if (o->tier == KVF_CACHE_REMOTE) {
            /* the store's blocks are not in the map: only counted */
            bool read = o->kind == OPK_GET, write = o->kind == OPK_REMOTE_PUT;
            if (st == KVF_OK && read)
                c->stats.bytes_out[KVF_CACHE_REMOTE] += c->block_bytes;
            else if (st == KVF_OK && write)
                c->stats.bytes_in[KVF_CACHE_REMOTE] += c->block_bytes;
            else if (st != KVF_OK && !(read && st == KVF_ERR_NOT_FOUND))
                c->stats.remote_errors++;
            continue;
        }
        if (o->kind == OPK_REMOVE) {
            if (st != KVF_OK)
                KVF_LOG(KVF_LOG_WARN, "cache: block 0x%016llx: file not removed: %s",
                        (unsigned long long)o->keys[i], kvf_last_error());
            continue;
        }
        entry *e = find(c, o->keys[i]);
        if (e && o->kind == OPK_GET && o->tier != KVF_CACHE_REMOTE) {
            /* the get's pin kept this very entry alive, whatever moved it
             * since (an acquire to the GPU tier): release it by key */
            e->reads--;
            if (--e->pins == 0)
                lru_append(c, e);
        }
        bool current = e && e->gen == o->gens[i];
        /* a read that failed for want of a resource, or of a working disk
         * or device, leaves its block whole where it is; a get the engine
         * refused read nothing. An acquire from the host tier gave away
         * the slot it read: its block goes whatever the failure. */
        bool spared = st != KVF_OK &&
                      (!kvf__status_condemns_block(st) || (o->kind == OPK_GET && o->ticket == 0));
        bool kept = false;
        if (from_file) {
            if (current && spared) {
                back_to_disk(c, e, st);
                kept = true;
            } else if (!(e && e->tier == KVF_CACHE_DISK)) { /* else the file is that entry's */
                pending_add(&stale, (kvf_move){o->keys[i], o->keys[i], 0}, o->keys[i], 0, 0);
            }
        }
        if (!current)
            continue; /* removed or placed again since: not this op's business */
        if ((o->kind == OPK_GET || o->kind == OPK_ACQUIRE) && st == KVF_OK)
            c->stats.bytes_out[o->tier] += c->block_bytes;
        if (o->kind == OPK_GET && spared) {
            if (o->ticket != 0)
                KVF_LOG(KVF_LOG_WARN, "cache: block 0x%016llx: %s tier: read failed: %s; kept",
                        (unsigned long long)e->key, kvf_cache_tier_name((kvf_cache_tier)e->tier),
                        kvf_status_str(st));
        } else if (st != KVF_OK && !kept) {
            /* the block this move wrote or read is not there whole */
            c->stats.failures++;
            e->removing = true;
            KVF_LOG(KVF_LOG_WARN, "cache: block 0x%016llx: %s tier: %s; removed",
                    (unsigned long long)e->key, kvf_cache_tier_name((kvf_cache_tier)e->tier),
                    kvf_status_str(st));
        }
        if (e->removing && e->pins == 0) {
            if (c->deferring)
                doom(c, e);
            else
                discard(c, e);
        }
    }
    if (stale.n)
        background_push(c, op_submit(c, OPK_REMOVE, KVF_CACHE_DISK, &stale));
    pending_free(&stale);
}

/* Queues a batch of the cache's: it joins the call `k`, or the background
 * without one. A batch refused, or not queued for want of memory, has its
 * failures applied at once: a refused put must not leave entries naming
 * slots it never wrote. */
static void submit_into(kvf_cache *c, op_kind kind, kvf_cache_tier tier, pending *p, call *k)
{
    if (p->n == 0)
        return;
    op *o = op_submit(c, kind, tier, p);
    if (!o) {
        kvf__fail(KVF_ERR_NOMEM, "cache: out of memory for a batch of %zu blocks", p->n);
        kvf_status st[64];
        op stack_op = {.kind = kind,
                       .tier = tier,
                       .keys = p->keys,
                       .gens = p->gens,
                       .index = p->index,
                       .status = st};
        bool was = c->deferring;
        c->deferring = true;
        for (size_t off = 0; off < p->n; off += 64) {
            stack_op.n = p->n - off < 64 ? p->n - off : 64;
            for (size_t i = 0; i < stack_op.n; i++)
                st[i] = KVF_ERR_NOMEM;
            op_apply(c, &stack_op, k);
            stack_op.keys += 64;
            stack_op.gens += 64;
            stack_op.index += 64;
        }
        c->deferring = was;
        p->n = 0;
        return;
    }
    if (o->ticket == 0) {
        bool was = c->deferring;
        c->deferring = true; /* the caller may be holding an entry this frees */
        op_apply(c, o, k);
        c->deferring = was;
        op_free(o);
    } else if (k) {
        /* in submission order, so completion applies them in that order */
        op **pp = &k->ops;
        while (*pp)
            pp = &(*pp)->next;
        *pp = o;
    } else {
        background_push(c, o);
    }
}

/* Queues what a put has assembled so far. Within one batch the order of
 * moves is not defined, so a put that must evict a block it placed itself
 * (a put of more blocks than a tier holds) first queues that block's write,
 * then starts a new round. Order: files removed before keys are written
 * again, victims read before their slots are rewritten. */
static void flush(kvf_cache *c, put_batches *pb)
{
    submit_into(c, OPK_REMOVE, KVF_CACHE_DISK, &pb->remove, NULL);
    submit_into(c, OPK_DEMOTE, KVF_CACHE_DISK, &pb->demote, NULL);
    submit_into(c, OPK_EVICT, KVF_CACHE_DISK, &pb->evict_file, pb->k);
    submit_into(c, OPK_EVICT, KVF_CACHE_HOST, &pb->evict_host, pb->k);
    submit_into(c, OPK_PUT, KVF_CACHE_DISK, &pb->to_file, pb->k);
    submit_into(c, OPK_PUT, KVF_CACHE_HOST, &pb->to_host, pb->k);
    submit_into(c, OPK_REMOTE_PUT, KVF_CACHE_REMOTE, &pb->to_remote, pb->k);
    c->round++;
}

/* Applies the background ops that have completed. Lock held. */
static void reap(kvf_cache *c)
{
    op *list = c->background;
    c->background = NULL;
    while (list) {
        op *o = list;
        list = o->next;
        kvf_status st = kvf_poll(c->engine, o->ticket, o->status);
        if (st == KVF_INPROGRESS) {
            o->next = c->background;
            c->background = o;
            continue;
        }
        if (st == KVF_ERR_UNKNOWN_TICKET) /* cannot happen: the cache holds it */
            for (size_t i = 0; i < o->n; i++)
                o->status[i] = st;
        op_apply(c, o, NULL);
        op_free(o);
    }
}

/* ---- calls (the caller's tickets) ------------------------------------------ */

static call *call_new(kvf_cache *c, size_t n)
{
    call *k = calloc(1, sizeof *k);
    kvf_status *st = n ? malloc(n * sizeof *st) : NULL;
    if (!k || (n && !st)) {
        free(k);
        free(st);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        st[i] = KVF_INPROGRESS;
    k->n = n;
    k->status = st;
    k->t0_ns = kvf__now_ns();
    k->id = ++c->next_call;
    return k;
}

static void call_free(call *k)
{
    for (op *o = k->ops, *next; o; o = next) {
        next = o->next;
        op_free(o);
    }
    free(k->status);
    kvf__move_errors_free(k->errors);
    free(k);
}

static call **call_slot(kvf_cache *c, kvf_ticket t)
{
    call **pp = &c->calls;
    while (*pp && (*pp)->id != t)
        pp = &(*pp)->next;
    return pp;
}

static void record_latency(kvf_cache *c, uint64_t ns)
{
    uint64_t us = ns / 1000;
    unsigned b = 0;
    while (b < KVF_CACHE_LATENCY_BUCKETS - 1 && us > (1ull << (4 + b)))
        b++;
    c->stats.latency_us[b]++;
    c->stats.latency_count++;
    c->stats.latency_sum_us += us;
}

/* Applies a completed call's ops, retires it and gives its result, and
 * its failed blocks' messages in *errors_p (or frees them with NULL).
 * Lock held. */
static kvf_status call_finish(kvf_cache *c, call **pp, kvf_status *per_block,
                              kvf__move_error **errors_p)
{
    call *k = *pp;
    for (op *o = k->ops; o; o = o->next)
        op_apply(c, o, k);
    kvf_status ret = KVF_OK;
    for (size_t i = 0; i < k->n; i++) {
        if (k->status[i] == KVF_INPROGRESS) /* cannot happen: every block was decided */
            k->status[i] = KVF_ERR_STATE;
        if (ret == KVF_OK && k->status[i] != KVF_OK)
            ret = k->status[i];
    }
    if (per_block)
        memcpy(per_block, k->status, k->n * sizeof *per_block);
    if (k->ops)
        record_latency(c, kvf__now_ns() - k->t0_ns);
    kvf__move_error *errors = NULL;
    if (ret != KVF_OK) {
        errors = kvf__move_errors_sorted(k->errors, k->status, k->n, "cache: block");
        k->errors = NULL;
        if (errors)
            kvf__fail(ret, "cache ticket %llu: block %zu: %s", (unsigned long long)k->id,
                      errors->index, errors->message);
    }
    *pp = k->next;
    call_free(k);
    if (errors_p)
        *errors_p = errors;
    else
        kvf__move_errors_free(errors);
    return ret;
}

/* kvf_cache_wait (block) or kvf_cache_poll; *done_p (may be NULL): the
 * call completed and was retired here. */
static kvf_status call_result(kvf_cache *c, kvf_ticket t, bool block, kvf_status *per_block,
                              kvf__move_error **errors_p, bool *done_p)
{
    const char *fn = block ? "kvf_cache_wait" : "kvf_cache_poll";
    kvf__clear_error();
    if (!c)
        return kvf__fail(KVF_ERR_INVALID, "%s: cache is NULL", fn);
    pthread_mutex_lock(&c->mu);
    call *k = *call_slot(c, t);
    if (!k || k->waited) {
        pthread_mutex_unlock(&c->mu);
        return kvf__fail(k ? KVF_ERR_STATE : KVF_ERR_UNKNOWN_TICKET, "%s: ticket %llu %s", fn,
                         (unsigned long long)t,
                         k ? "is waited for by another thread" : "unknown or already retired");
    }
    bool running = false;
    if (block) {
        k->waited = true;
        pthread_mutex_unlock(&c->mu);
    }
    /* waiting, only the thread that set `waited` touches the call's ops;
     * polling, the lock is held throughout */
    for (op *o = k->ops; o; o = o->next) {
        if (o->done)
            continue;
        kvf__move_error *why = NULL;
        if (kvf__engine_ticket_errors(c->engine, o->ticket, block, o->status, &why) ==
            KVF_INPROGRESS) {
            running = true;
            continue;
        }
        o->errors = why;
        o->done = true;
    }
    if (block)
        pthread_mutex_lock(&c->mu);
    kvf_status st = running ? KVF_INPROGRESS : call_finish(c, call_slot(c, t), per_block, errors_p);
    pthread_mutex_unlock(&c->mu);
    if (done_p)
        *done_p = !running;
    return st;
}

kvf_status kvf_cache_wait(kvf_cache *c, kvf_ticket t, kvf_status *per_block)
{
    return call_result(c, t, true, per_block, NULL, NULL);
}

kvf_status kvf_cache_poll(kvf_cache *c, kvf_ticket t, kvf_status *per_block)
{
    return call_result(c, t, false, per_block, NULL, NULL);
}

static kvf_status call_errors(kvf_cache *c, kvf_ticket t, bool block, kvf_status *per_block,
                              kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    if (!errors && cap) {
        kvf__clear_error();
        return kvf__fail(KVF_ERR_INVALID, "%s: errors is NULL with cap = %zu",
                         block ? "kvf_cache_wait_errors" : "kvf_cache_poll_errors", cap);
    }
    kvf__move_error *list = NULL;
    bool done = false;
    kvf_status st = call_result(c, t, block, per_block, &list, &done);
    if (done)
        kvf__move_errors_deliver(list, errors, cap, n_errors_p);
    return st;
}

kvf_status kvf_cache_wait_errors(kvf_cache *c, kvf_ticket t, kvf_status *per_block,
                                 kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    return call_errors(c, t, true, per_block, errors, cap, n_errors_p);
}

kvf_status kvf_cache_poll_errors(kvf_cache *c, kvf_ticket t, kvf_status *per_block,
                                 kvf_move_error *errors, size_t cap, size_t *n_errors_p)
{
    return call_errors(c, t, false, per_block, errors, cap, n_errors_p);
}

/* ---- create and destroy ------------------------------------------------------ */

typedef struct restored {
    kvf_key key;
    int64_t mtime_ns;
} restored;

typedef struct restore_list {
    restored *v;
    size_t n, cap;
    size_t block_bytes;
    uint32_t pools;
    bool nomem;
} restore_list;

static void restore_visit(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns)
{
    restore_list *l = arg;
    /* the cache keeps whole blocks of this engine's pools only */
    if (meta->pools != l->pools || meta->payload_bytes != l->block_bytes)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        restored *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->nomem = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (restored){meta->key, mtime_ns};
}

static int cmp_restored(const void *a, const void *b)
{
    const restored *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns)
        return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* Priority of blocks found on disk at create: their own is not stored. */
#define RESTORED_PRIORITY 50u

/* Enters the blocks stored before, oldest first; those beyond the disk
 * tier's capacity are removed, oldest first. */
static kvf_status restore(kvf_cache *c, kvf__blockfile_dir *dir)
{
    restore_list l = {NULL, 0, 0, c->block_bytes, kvf_engine_pool_count(c->engine), false};
    kvf_status st = kvf__blockfile_list(dir, restore_visit, &l);
    if (st == KVF_OK && l.nomem)
        st = kvf__fail(KVF_ERR_NOMEM, "cache: out of memory listing %s", dir->root);
    if (st != KVF_OK) {
        free(l.v);
        return st;
    }
    if (l.n)
        qsort(l.v, l.n, sizeof *l.v, cmp_restored);
    size_t extra = l.n > c->capacity[KVF_CACHE_DISK] ? l.n - c->capacity[KVF_CACHE_DISK] : 0;
    if (extra) {
        uint64_t *keys = malloc(extra * sizeof *keys);
        kvf_ticket t;
        if (!keys) {
            free(l.v);
            return kvf__fail(KVF_ERR_NOMEM, "cache: out of memory");
        }
        for (size_t i = 0; i < extra; i++)
            keys[i] = l.v[i].key;
        st = kvf_file_remove(c->engine, keys, extra, &t);
        if (st == KVF_OK)
            st = kvf_wait(c->engine, t, NULL);
        free(keys);
        if (st != KVF_OK) {
            free(l.v);
            return kvf__fail(st, "cache: removing %zu blocks beyond the disk tier's capacity: %s",
                             extra, kvf_last_error());
        }
        KVF_LOG(KVF_LOG_INFO, "cache: %s: removed the %zu oldest blocks beyond %llu", dir->root,
                extra, (unsigned long long)c->capacity[KVF_CACHE_DISK]);
    }
    for (size_t i = extra; i < l.n; i++) {
        if (find(c, l.v[i].key))
            continue;
        entry *e = place(c, l.v[i].key, KVF_CACHE_DISK, 0, RESTORED_PRIORITY);
        if (!e) {
            free(l.v);
            return kvf__fail(KVF_ERR_NOMEM, "cache: out of memory");
        }
        c->used[KVF_CACHE_DISK]++;
        emit(c, KVF_EVENT_STORED, e, KVF_CACHE_DISK);
    }
    KVF_LOG(KVF_LOG_INFO, "cache: %s: %zu blocks found", dir->root, l.n - extra);
    free(l.v);
    return KVF_OK;
}

static void free_entries(kvf_cache *c)
{
    for (size_t b = 0; b < c->nbuckets; b++)
        for (entry *e = c->buckets[b], *next; e; e = next) {
            next = e->hnext;
            free(e);
        }
}

/* The checks of a resolved config against the engine. */
static kvf_status cache_check(kvf_engine *engine, const kvf_cache_config *k)
{
    if (k->host_blocks == 0 && k->disk_blocks == 0 && k->gpu_blocks == 0 &&
        k->remote == KVF_CACHE_REMOTE_OFF)
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: every tier has capacity 0 (set host_blocks or "
                         "disk_blocks)");
    if (k->remote != KVF_CACHE_REMOTE_OFF && !kvf__engine_has_remote(engine))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: a remote tier needs the engine's remote tier "
                         "(remote_url or KVF_REMOTE_URL)");
    if (k->offload_min_priority > MAX_PRIORITY + 1)
        return kvf__fail(KVF_ERR_RANGE, "kvf_cache_create: offload_min_priority %u (0-101)",
                         k->offload_min_priority);
    if (k->event_queue > (1u << 24))
        return kvf__fail(KVF_ERR_RANGE, "kvf_cache_create: event_queue %u (at most 2^24)",
                         k->event_queue);
    uint32_t sec = kvf__engine_slots(engine, KVF_LEVEL_SECONDARY);
    if (k->host_blocks && sec == 0)
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: a host tier needs secondary slots in every pool");
    if (k->host_blocks > sec)
        return kvf__fail(KVF_ERR_RANGE,
                         "kvf_cache_create: host_blocks %llu, but the pools have %u secondary "
                         "slots",
                         (unsigned long long)k->host_blocks, sec);
    uint32_t prim = kvf__engine_slots(engine, KVF_LEVEL_PRIMARY);
    if (k->gpu_blocks > prim)
        return kvf__fail(KVF_ERR_RANGE,
                         "kvf_cache_create: gpu_blocks %llu, but the pools have %u primary slots",
                         (unsigned long long)k->gpu_blocks, prim);
    kvf__blockfile_dir *dir = kvf__engine_dir(engine);
    if (k->disk_blocks && !dir)
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: a disk tier needs the engine's file tier (file_dir)");
    return KVF_OK;
}

kvf_status kvf_cache_create(kvf_engine *engine, const kvf_cache_config *cfg, kvf_cache **cache_p)
{
    kvf__clear_error();
    if (!engine || !cfg || !cache_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_create: NULL argument");
    if (cfg->struct_size < offsetof(kvf_cache_config, disk_blocks) + sizeof cfg->disk_blocks ||
        cfg->struct_size > 4096)
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: struct_size %zu (start from KVF_CACHE_CONFIG_INIT)",
                         cfg->struct_size);
    kvf_cache_config k = KVF_CACHE_CONFIG_INIT;
    memcpy(&k, cfg, cfg->struct_size < sizeof k ? cfg->struct_size : sizeof k);
    k.struct_size = sizeof k;
    if ((unsigned)k.remote > KVF_CACHE_REMOTE_READ)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_create: remote mode %d unknown",
                         (int)k.remote);
    /* the pools are fixed first: a tier in bytes becomes blocks of them */
    kvf_status st = kvf__engine_freeze(engine);
    if (st != KVF_OK)
        return kvf__fail(st, "kvf_cache_create: %s", kvf_last_error());
    /* fields left at their defaults: from the environment or config file */
    kvf_setting *settings;
    size_t nsettings;
    st = kvf__cache_config_resolve(&k, kvf__engine_config_file(engine),
                                   kvf__engine_block_bytes(engine), &k, &settings, &nsettings);
    if (st != KVF_OK) {
        /* a setting the operator got wrong: said where they will look */
        kvf__fail(st, "kvf_cache_create: %s", kvf_last_error());
        KVF_LOG(KVF_LOG_ERROR, "%s", kvf_last_error());
        return st;
    }
    st = cache_check(engine, &k);
    if (st != KVF_OK) {
        free(settings);
        return st;
    }
    kvf__blockfile_dir *dir = kvf__engine_dir(engine);

    kvf_cache *c = calloc(1, sizeof *c);
    if (!c) {
        free(settings);
        return kvf__fail(KVF_ERR_NOMEM, "kvf_cache_create: out of memory");
    }
    c->settings = settings;
    c->nsettings = nsettings;
    c->engine = engine;
    c->cfg = k;
    c->capacity[KVF_CACHE_HOST] = k.host_blocks;
    c->capacity[KVF_CACHE_DISK] = k.disk_blocks;
    c->capacity[KVF_CACHE_GPU] = k.gpu_blocks;
    c->block_bytes = kvf__engine_block_bytes(engine);
    c->primary_slots = kvf__engine_slots(engine, KVF_LEVEL_PRIMARY);
    c->nbuckets = 1024;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    c->free_slots = k.host_blocks ? malloc(k.host_blocks * sizeof *c->free_slots) : NULL;
    c->events = k.event_queue ? malloc(k.event_queue * sizeof *c->events) : NULL;
    c->gpu_free = k.gpu_blocks ? malloc(k.gpu_blocks * sizeof *c->gpu_free) : NULL;
    c->gpu_state = k.gpu_blocks ? calloc(k.gpu_blocks, 1) : NULL;
    if (!c->buckets || (k.host_blocks && !c->free_slots) || (k.event_queue && !c->events) ||
        (k.gpu_blocks && (!c->gpu_free || !c->gpu_state))) {
        st = kvf__fail(KVF_ERR_NOMEM, "kvf_cache_create: out of memory");
        goto fail;
    }
    /* taken from the end: slot 0 first */
    for (uint64_t i = 0; i < k.host_blocks; i++)
        c->free_slots[i] = (uint32_t)(k.host_blocks - 1 - i);
    c->nfree = (uint32_t)k.host_blocks;
    for (uint64_t i = 0; i < k.gpu_blocks; i++)
        c->gpu_free[i] = (uint32_t)(k.gpu_blocks - 1 - i);
    c->ngpu_free = (uint32_t)k.gpu_blocks;
    c->stats.struct_size = sizeof c->stats;
    pthread_mutex_init(&c->mu, NULL);
    if (k.disk_blocks) {
        st = restore(c, dir);
        if (st != KVF_OK) {
            pthread_mutex_destroy(&c->mu);
            goto fail;
        }
    }
    *cache_p = c;
    return KVF_OK;

fail:
    free_entries(c);
    free(c->buckets);
    free(c->free_slots);
    free(c->gpu_free);
    free(c->gpu_state);
    free(c->events);
    free(c->settings);
    free(c);
    return st;
}

kvf_status kvf_cache_settings(const kvf_cache *cache, const kvf_setting **settings_p, size_t *n_p)
{
    if (!cache || !settings_p || !n_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_settings: NULL argument");
    *settings_p = cache->settings;
    *n_p = cache->nsettings;
    return KVF_OK;
}

void kvf_cache_destroy(kvf_cache *c)
{
    if (!c)
        return;
    for (op *o = c->background, *next; o; o = next) {
        next = o->next;
        kvf_wait(c->engine, o->ticket, NULL);
        op_free(o);
    }
    for (call *k = c->calls, *next; k; k = next) {
        next = k->next;
        for (op *o = k->ops; o; o = o->next)
            if (!o->done)
                kvf_wait(c->engine, o->ticket, NULL);
        call_free(k);
    }
    free_entries(c);
    free(c->buckets);
    free(c->free_slots);
    free(c->gpu_free);
    free(c->gpu_state);
    free(c->events);
    free(c->doomed);
    free(c->settings);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* ---- lookup, put, get ------------------------------------------------------- */

/* Orders keys (and any uint64_t). */
static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static kvf_status check_keys(const char *fn, const kvf_key *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (keys[i] == KVF_KEY_ROOT)
            return kvf__fail(KVF_ERR_INVALID, "%s: key %zu is 0 (KVF_KEY_ROOT names no block)", fn,
                             i);
    return KVF_OK;
}

typedef struct key_at {
    kvf_key key;
    size_t index;
} key_at;

static int cmp_key_at(const void *a, const void *b)
{
    const key_at *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* A call names each block once: the order of two moves of one key inside
 * a batch is not defined. The error names the key and both indexes. */
static kvf_status check_unique(const char *fn, const kvf_key *keys, size_t n)
{
    key_at *v = malloc(n * sizeof *v);
    if (!v)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    for (size_t i = 0; i < n; i++)
        v[i] = (key_at){keys[i], i};
    qsort(v, n, sizeof *v, cmp_key_at);
    kvf_status st = KVF_OK;
    for (size_t i = 1; i < n && st == KVF_OK; i++)
        if (v[i].key == v[i - 1].key)
            st = kvf__fail(KVF_ERR_INVALID, "%s: block 0x%016llx given twice, as keys %zu and %zu",
                           fn, (unsigned long long)v[i].key, v[i - 1].index, v[i].index);
    free(v);
    return st;
}

static kvf_status check_slots(const kvf_cache *c, const char *fn, const uint32_t *slots, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (slots[i] >= c->primary_slots)
            return kvf__fail(KVF_ERR_RANGE,
                             "%s: block %zu: primary slot %u out of range (%u slots)", fn, i,
                             slots[i], c->primary_slots);
    return KVF_OK;
}

/* Extends a lookup's prefix past the first local miss: keys[0..n) are
 * asked of the remote tier in one round trip, without the cache's lock,
 * then each key counts as a hit in its local tier if it is cached here
 * again, else in the remote one if the store has it. An unreachable store
 * is a miss. */
static size_t remote_prefix(kvf_cache *c, const kvf_key *keys, size_t n, kvf_cache_tier *tiers)
{
    kvf_status *st = malloc(n * sizeof *st);
    if (!st)
        return 0;
    kvf__remote *r;
    kvf_status rs = kvf__engine_remote(c->engine, &r);
    bool asked = rs == KVF_OK;
    if (asked)
        rs = kvf__remote_exists_batch(r, keys, n, st); /* absent blocks are no error */
    if (rs != KVF_OK)
        KVF_LOG(KVF_LOG_WARN, "cache: remote lookup of %zu blocks: %s", n, kvf_last_error());
    size_t hits = 0;
    pthread_mutex_lock(&c->mu);
    if (rs != KVF_OK)
        c->stats.remote_errors++;
    for (; hits < n; hits++) {
        const entry *e = find(c, keys[hits]);
        kvf_cache_tier t;
        if (e && !e->removing)
            t = (kvf_cache_tier)e->tier;
        else if (asked && st[hits] == KVF_OK)
            t = KVF_CACHE_REMOTE;
        else
            break;
        if (tiers)
            tiers[hits] = t;
        c->stats.hits[t]++;
    }
    pthread_mutex_unlock(&c->mu);
    free(st);
    return hits;
}

kvf_status kvf_cache_lookup(kvf_cache *c, const kvf_key *keys, size_t n, size_t *hits_p,
                            kvf_cache_tier *tiers)
{
    kvf__clear_error();
    if (!c || !hits_p || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_lookup: NULL argument");
    pthread_mutex_lock(&c->mu);
    c->stats.lookups++;
    c->stats.lookup_blocks += n;
    size_t i = 0;
    for (; i < n; i++) {
        const entry *e = find(c, keys[i]);
        if (!e || e->removing)
            break;
        if (tiers)
            tiers[i] = (kvf_cache_tier)e->tier;
        c->stats.hits[e->tier]++;
    }
    pthread_mutex_unlock(&c->mu);
    if (i < n && c->cfg.remote != KVF_CACHE_REMOTE_OFF)
        i += remote_prefix(c, keys + i, n - i, tiers ? tiers + i : NULL);
    if (i < n) {
        pthread_mutex_lock(&c->mu);
        c->stats.misses++;
        pthread_mutex_unlock(&c->mu);
    }
    *hits_p = i;
    return KVF_OK;
}

static void set_priority(kvf_cache *c, entry *e, uint32_t priority)
{
    if (e->pins == 0)
        lru_unlink(c, e);
    e->priority = (uint8_t)priority;
    if (e->pins == 0)
        lru_append(c, e);
}

/* A put of a block held on disk: the engine hands its bytes back, so it
 * returns to the host tier (hot blocks do not stay on disk), copied from
 * the primary slot; its file goes. Stays on disk when every host block is
 * pinned. */
static void promote(kvf_cache *c, put_batches *pb, entry *e, uint32_t src_slot, size_t index)
{
    /* pinned while room is made: a demotion it causes must not take it */
    pin_one(c, e);
    uint32_t hs;
    bool room = host_slot(c, pb, &hs);
    e->pins--;
    if (!room) {
        lru_append(c, e);
        return;
    }
    if (e->round == c->round)
        flush(c, pb); /* its file's write is queued before the file's removal */
    pending_add(&pb->remove, (kvf_move){e->key, e->key, 0}, e->key, 0, 0);
    c->used[KVF_CACHE_DISK]--;
    e->tier = KVF_CACHE_HOST;
    e->slot = hs;
    e->gen = ++c->next_gen;
    e->round = c->round;
    lru_append(c, e);
    pending_add(&pb->to_host, (kvf_move){src_slot, hs, 0}, e->key, e->gen, index);
    c->stats.bytes_in[KVF_CACHE_HOST] += c->block_bytes;
    emit(c, KVF_EVENT_UPDATED, e, KVF_CACHE_DISK);
}

kvf_status kvf_cache_put(kvf_cache *c, const kvf_key *keys, const uint32_t *slots, size_t n,
                         uint32_t priority, kvf_ticket *ticket_p)
{
    static const char fn[] = "kvf_cache_put";
    kvf__clear_error();
    if (!c || !keys || !slots || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or empty batch", fn);
    if (priority > MAX_PRIORITY)
        return kvf__fail(KVF_ERR_RANGE, "%s: priority %u (0-100)", fn, priority);
    kvf_status st = check_keys(fn, keys, n);
    if (st == KVF_OK)
        st = check_unique(fn, keys, n);
    if (st == KVF_OK)
        st = check_slots(c, fn, slots, n);
    if (st != KVF_OK)
        return st;

    put_batches pb = {0};
    /* a block may cost two files: a disk victim dropped, and its own on a promotion */
    if (!pending_reserve(&pb.remove, 2 * n) || !pending_reserve(&pb.demote, n) ||
        !pending_reserve(&pb.to_file, n) || !pending_reserve(&pb.to_host, n) ||
        !pending_reserve(&pb.to_remote, n)) {
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    call *k = NULL;
    if (ticket_p && !(k = call_new(c, n))) {
        release_doomed(c);
        pthread_mutex_unlock(&c->mu);
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    reap(c);
    pb.k = k;
    c->round++;
    for (size_t i = 0; i < n; i++) {
        kvf_status bst = KVF_INPROGRESS;
        c->stats.puts++;
        entry *e = find(c, keys[i]);
        bool fresh = !e;
        if (e) {
            c->stats.put_duplicates++;
            if (e->removing) {
                /* still read by a get, and going: not stored again now */
                bst = KVF_ERR_STATE;
            } else {
                set_priority(c, e, priority);
                bst = KVF_OK;
                if (e->tier == KVF_CACHE_DISK && c->capacity[KVF_CACHE_HOST] && e->pins == 0)
                    promote(c, &pb, e, slots[i], i);
            }
        } else {
            uint32_t slot = 0;
            kvf_cache_tier tier = KVF_CACHE_TIERS;
            if (c->capacity[KVF_CACHE_HOST] && host_slot(c, &pb, &slot))
                tier = KVF_CACHE_HOST;
            else if (c->capacity[KVF_CACHE_DISK] && disk_room(c, &pb))
                tier = KVF_CACHE_DISK;
            if (tier == KVF_CACHE_TIERS) {
                bst = KVF_ERR_NO_SPACE; /* every block of every tier is pinned */
                KVF_LOG(KVF_LOG_INFO, "cache: block 0x%016llx not stored: every block is pinned",
                        (unsigned long long)keys[i]);
            } else if (!(e = place(c, keys[i], tier, slot, priority))) {
                bst = KVF_ERR_NOMEM;
                if (tier == KVF_CACHE_HOST) {
                    c->free_slots[c->nfree++] = slot;
                    c->used[KVF_CACHE_HOST]--;
                }
            } else {
                if (tier == KVF_CACHE_HOST)
                    pending_add(&pb.to_host, (kvf_move){slots[i], slot, 0}, e->key, e->gen, i);
                else
                    pending_add(&pb.to_file, (kvf_move){slots[i], e->key, 0}, e->key, e->gen, i);
                if (tier == KVF_CACHE_DISK)
                    c->used[KVF_CACHE_DISK]++;
                c->stats.bytes_in[tier] += c->block_bytes;
                emit(c, KVF_EVENT_STORED, e, tier);
            }
        }
        /* a block stored here goes to the store too (a call names each
         * key once: check_unique) */
        if (fresh && e && c->cfg.remote == KVF_CACHE_REMOTE_WRITE_THROUGH)
            pending_add(&pb.to_remote, (kvf_move){slots[i], keys[i], 0}, keys[i], 0, i);
        if (k) {
            k->status[i] = bst;
            if (bst != KVF_INPROGRESS && bst != KVF_OK)
                call_note(k, i, bst, "block 0x%016llx: not stored: %s", (unsigned long long)keys[i],
                          bst == KVF_ERR_STATE      ? "being removed while a get still pins it"
                          : bst == KVF_ERR_NO_SPACE ? "every block of every tier is pinned"
                                                    : kvf_status_str(bst));
        } else if (bst != KVF_INPROGRESS && bst != KVF_OK)
            KVF_LOG(KVF_LOG_WARN, "cache: put of block 0x%016llx: %s", (unsigned long long)keys[i],
                    kvf_status_str(bst));
    }
    flush(c, &pb);
    if (k) {
        k->next = c->calls;
        c->calls = k;
        *ticket_p = k->id;
    }
    release_doomed(c);
    pthread_mutex_unlock(&c->mu);
out:
    pending_free(&pb.remove);
    pending_free(&pb.demote);
    pending_free(&pb.to_file);
    pending_free(&pb.to_host);
    pending_free(&pb.to_remote);
    return st;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

kvf_status kvf_cache_get(kvf_cache *c, const kvf_key *keys, const uint32_t *slots, size_t n,
                         kvf_ticket *ticket_p)
{
    static const char fn[] = "kvf_cache_get";
    kvf__clear_error();
    if (!c || !keys || !slots || n == 0 || !ticket_p)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or empty batch", fn);
    kvf_status st = check_keys(fn, keys, n);
    if (st == KVF_OK)
        st = check_slots(c, fn, slots, n);
    if (st != KVF_OK)
        return st;
    /* refused here rather than by the engine, which could refuse one
     * tier's batch after queueing the other's */
    uint32_t *sorted = malloc(n * sizeof *sorted);
    if (!sorted)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    memcpy(sorted, slots, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_u32);
    for (size_t i = 1; i < n && st == KVF_OK; i++)
        if (sorted[i] == sorted[i - 1])
            st = kvf__fail(KVF_ERR_INVALID, "%s: primary slot %u is the destination of two blocks",
                           fn, sorted[i]);
    free(sorted);
    if (st != KVF_OK)
        return st;

    pending by_tier[KVF_CACHE_TIERS] = {{0}};
    bool reserved = true;
    for (int t = 0; t < KVF_CACHE_TIERS; t++)
        reserved = reserved && pending_reserve(&by_tier[t], n);
    if (!reserved) {
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    reap(c);
    /* a GPU-tier slot is a destination only while handed out to the caller */
    for (size_t i = 0; i < n && c->gpu_state; i++)
        if (slots[i] < c->capacity[KVF_CACHE_GPU] && c->gpu_state[slots[i]] != GPU_HANDED_OUT) {
            release_doomed(c);
            pthread_mutex_unlock(&c->mu);
            st = kvf__fail(KVF_ERR_INVALID, "%s: block %zu: primary slot %u is the GPU tier's (%s)",
                           fn, i, slots[i],
                           c->gpu_state[slots[i]] == GPU_CACHED ? "a cached block"
                                                                : "not handed out");
            goto out;
        }
    bool remote = c->cfg.remote != KVF_CACHE_REMOTE_OFF;
    for (size_t i = 0; i < n && !remote; i++) {
        const entry *e = find(c, keys[i]);
        if (!e || e->removing) {
            release_doomed(c);
            pthread_mutex_unlock(&c->mu);
            st = kvf__fail(KVF_ERR_NOT_FOUND, "%s: block 0x%016llx (block %zu) is not cached", fn,
                           (unsigned long long)keys[i], i);
            goto out;
        }
    }
    call *k = call_new(c, n);
    if (!k) {
        release_doomed(c);
        pthread_mutex_unlock(&c->mu);
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        entry *e = find(c, keys[i]);
        c->stats.gets++;
        if (!e || e->removing) {
            /* not cached here: the remote tier's, if it has it */
            pending_add(&by_tier[KVF_CACHE_REMOTE], (kvf_move){keys[i], slots[i], 0}, keys[i], 0,
                        i);
            continue;
        }
        pin_one(c, e);
        e->reads++;
        e->uses++;
        kvf_move mv = e->tier == KVF_CACHE_DISK ? (kvf_move){e->key, slots[i], 0}
                                                : (kvf_move){e->slot, slots[i], 0};
        pending_add(&by_tier[e->tier], mv, e->key, e->gen, i);
    }
    submit_into(c, OPK_GET, KVF_CACHE_HOST, &by_tier[KVF_CACHE_HOST], k);
    submit_into(c, OPK_GET, KVF_CACHE_DISK, &by_tier[KVF_CACHE_DISK], k);
    submit_into(c, OPK_GET, KVF_CACHE_REMOTE, &by_tier[KVF_CACHE_REMOTE], k);
    submit_into(c, OPK_GET, KVF_CACHE_GPU, &by_tier[KVF_CACHE_GPU], k);
    k->next = c->calls;
    c->calls = k;
    *ticket_p = k->id;
    release_doomed(c);
    pthread_mutex_unlock(&c->mu);
out:
    for (int t = 0; t < KVF_CACHE_TIERS; t++)
        pending_free(&by_tier[t]);
    return st;
}

/* ---- the GPU tier ------------------------------------------------------------ */

static void put_batches_free(put_batches *pb)
{
    pending_free(&pb->remove);
    pending_free(&pb->demote);
    pending_free(&pb->to_file);
    pending_free(&pb->to_host);
    pending_free(&pb->to_remote);
    pending_free(&pb->evict_file);
    pending_free(&pb->evict_host);
}

/* Room for `n` more of each kind of move a call can make. */
static bool put_batches_reserve(put_batches *pb, size_t n)
{
    return pending_reserve(&pb->remove, n) && pending_reserve(&pb->demote, n) &&
           pending_reserve(&pb->to_file, n) && pending_reserve(&pb->to_host, n) &&
           pending_reserve(&pb->to_remote, n) && pending_reserve(&pb->evict_file, n) &&
           pending_reserve(&pb->evict_host, n);
}

/* A free GPU slot, evicting the GPU victim when none is free: it is copied
 * down to a host slot or a file (dropped below offload_min_priority or
 * without room). false: every GPU block is pinned or handed out. */
static bool gpu_slot(kvf_cache *c, put_batches *pb, uint32_t *slot_p)
{
    if (!c->ngpu_free) {
        entry *v = victim_of(c, KVF_CACHE_GPU);
        if (!v)
            return false;
        if (v->round == c->round)
            flush(c, pb);
        c->stats.evictions[KVF_CACHE_GPU]++;
        bool keep = v->priority >= c->cfg.offload_min_priority;
        uint32_t hs = 0;
        kvf_cache_tier to = KVF_CACHE_TIERS;
        if (keep && c->capacity[KVF_CACHE_HOST] && host_slot(c, pb, &hs))
            to = KVF_CACHE_HOST;
        else if (keep && c->capacity[KVF_CACHE_DISK] && disk_room(c, pb))
            to = KVF_CACHE_DISK;
        if (to == KVF_CACHE_TIERS) {
            c->stats.dropped++;
            drop(c, v, pb); /* frees its GPU slot */
        } else {
            uint32_t src = v->slot;
            lru_unlink(c, v);
            c->used[KVF_CACHE_GPU]--;
            c->gpu_state[src] = GPU_FREE;
            c->gpu_free[c->ngpu_free++] = src;
            v->tier = (uint8_t)to;
            v->slot = hs;
            v->gen = ++c->next_gen;
            v->round = c->round;
            if (to == KVF_CACHE_DISK)
                c->used[KVF_CACHE_DISK]++; /* host_slot counted the host one */
            lru_append(c, v);
            if (to == KVF_CACHE_HOST)
                pending_add(&pb->evict_host, (kvf_move){src, hs, 0}, v->key, v->gen, 0);
            else
                pending_add(&pb->evict_file, (kvf_move){src, v->key, 0}, v->key, v->gen, 0);
            c->stats.bytes_in[to] += c->block_bytes;
            emit(c, KVF_EVENT_UPDATED, v, KVF_CACHE_GPU);
        }
    }
    *slot_p = c->gpu_free[--c->ngpu_free];
    return true;
}

static kvf_status need_gpu_tier(const kvf_cache *c, const char *fn)
{
    if (!c->capacity[KVF_CACHE_GPU])
        return kvf__fail(KVF_ERR_INVALID, "%s: the cache has no GPU tier (set gpu_blocks)", fn);
    return KVF_OK;
}

/* Queues the call's batches and hands its ticket over. Lock held. */
static void call_start(kvf_cache *c, call *k, put_batches *pb, kvf_ticket *ticket_p)
{
    flush(c, pb);
    k->next = c->calls;
    c->calls = k;
    *ticket_p = k->id;
}

kvf_status kvf_cache_alloc(kvf_cache *c, size_t n, uint32_t *slots, kvf_ticket *ticket_p)
{
    static const char fn[] = "kvf_cache_alloc";
    kvf__clear_error();
    if (!c || !slots || !ticket_p || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or n == 0", fn);
    kvf_status st = need_gpu_tier(c, fn);
    if (st != KVF_OK)
        return st;
    put_batches pb = {0};
    if (!put_batches_reserve(&pb, n)) {
        put_batches_free(&pb);
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    }
    pthread_mutex_lock(&c->mu);
    reap(c);
    call *k = NULL;
    if (c->ngpu_free + c->listed[KVF_CACHE_GPU] < n) {
        st = kvf__fail(KVF_ERR_NO_SPACE,
                       "%s: %zu GPU slots asked, %llu free or evictable (the others are pinned "
                       "or handed out)",
                       fn, n, (unsigned long long)(c->ngpu_free + c->listed[KVF_CACHE_GPU]));
    } else if (!(k = call_new(c, 0))) {
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    } else {
        c->round++;
        pb.k = k;
        for (size_t i = 0; i < n; i++) {
            gpu_slot(c, &pb, &slots[i]); /* cannot fail: counted above */
            c->gpu_state[slots[i]] = GPU_HANDED_OUT;
        }
        /* every copy still reading or writing one (an evicted block's, a
         * write-through of it) must end before the caller writes it: the
         * fence waits for them. (A failed copy into one is forgotten at
         * commit, once the caller has written it whole.) */
        pending fence = {0};
        if (pending_reserve(&fence, n)) {
            for (size_t i = 0; i < n; i++)
                pending_add(&fence, (kvf_move){slots[i], slots[i], 0}, KVF_KEY_ROOT, 0, 0);
            flush(c, &pb); /* the evictions first: the fence waits for their reads */
            submit_into(c, OPK_FENCE, KVF_CACHE_GPU, &fence, k);
        } else {
            st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        }
        pending_free(&fence);
        call_start(c, k, &pb, ticket_p);
    }
    release_doomed(c);
    pthread_mutex_unlock(&c->mu);
    put_batches_free(&pb);
    return st;
}

/* Slots handed out, each once: what commit and free accept. */
static kvf_status check_handed_out(const kvf_cache *c, const char *fn, const uint32_t *slots,
                                   size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (slots[i] >= c->capacity[KVF_CACHE_GPU] || c->gpu_state[slots[i]] != GPU_HANDED_OUT)
            return kvf__fail(KVF_ERR_INVALID,
                             "%s: slot %u (block %zu) was not handed out by "
                             "kvf_cache_alloc",
                             fn, slots[i], i);
        for (size_t j = 0; j < i; j++)
            if (slots[j] == slots[i])
                return kvf__fail(KVF_ERR_INVALID, "%s: slot %u given twice", fn, slots[i]);
    }
    return KVF_OK;
}

kvf_status kvf_cache_commit(kvf_cache *c, const kvf_key *keys, const uint32_t *slots, size_t n,
                            uint32_t priority, kvf_status *per_block)
{
    static const char fn[] = "kvf_cache_commit";
    kvf__clear_error();
    if (!c || !keys || !slots || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or empty batch", fn);
    kvf_status st = need_gpu_tier(c, fn);
    if (st == KVF_OK && priority > MAX_PRIORITY)
        st = kvf__fail(KVF_ERR_RANGE, "%s: priority %u (0-100)", fn, priority);
    if (st == KVF_OK)
        st = check_keys(fn, keys, n);
    if (st != KVF_OK)
        return st;
    put_batches pb = {0};
    if (!put_batches_reserve(&pb, n)) {
        put_batches_free(&pb);
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
    }
    pthread_mutex_lock(&c->mu);
    reap(c);
    st = check_handed_out(c, fn, slots, n);
    for (size_t i = 0; i < n && st == KVF_OK; i++)
        for (size_t j = 0; j < i && st == KVF_OK; j++)
            if (keys[j] == keys[i])
                st = kvf__fail(KVF_ERR_INVALID, "%s: block 0x%016llx given twice", fn,
                               (unsigned long long)keys[i]);
    kvf_status first = KVF_OK;
    if (st == KVF_OK) {
        /* the caller wrote these whole: failed copies into them are history
         * (the alloc's ticket, waited for, ended every read of them) */
        kvf__engine_clear_poison(c->engine, slots, n);
        c->round++;
        pb.to_remote.checked = true; /* from GPU-tier slots */
        for (size_t i = 0; i < n; i++) {
            kvf_status bst = KVF_OK;
            entry *old = find(c, keys[i]);
            if (old && old->pins) {
                /* another request holds its copy: this one stays private */
                bst = kvf__fail(KVF_ERR_STATE,
                                "%s: block 0x%016llx is in use in the %s tier: slot %u stays "
                                "the caller's",
                                fn, (unsigned long long)keys[i],
                                kvf_cache_tier_name((kvf_cache_tier)old->tier), slots[i]);
            } else {
                if (old)
                    discard(c, old); /* a block lives in one tier, in one slot */
                entry *e = place(c, keys[i], KVF_CACHE_GPU, slots[i], priority);
                if (!e) {
                    bst = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
                } else {
                    lru_unlink(c, e);
                    e->pins = 1; /* the request that computed it */
                    c->used[KVF_CACHE_GPU]++;
                    c->gpu_state[slots[i]] = GPU_CACHED;
                    c->stats.bytes_in[KVF_CACHE_GPU] += c->block_bytes;
                    emit(c, KVF_EVENT_STORED, e, KVF_CACHE_GPU);
                    if (c->cfg.remote == KVF_CACHE_REMOTE_WRITE_THROUGH)
                        pending_add(&pb.to_remote, (kvf_move){slots[i], keys[i], 0}, keys[i], 0, i);
                }
            }
            if (per_block)
                per_block[i] = bst;
            if (first == KVF_OK)
                first = bst;
        }
        flush(c, &pb); /* the write-through, in the background */
        st = first;
    }
    release_doomed(c);
    pthread_mutex_unlock(&c->mu);
    put_batches_free(&pb);
    return st;
}

kvf_status kvf_cache_free(kvf_cache *c, const uint32_t *slots, size_t n)
{
    static const char fn[] = "kvf_cache_free";
    kvf__clear_error();
    if (!c || (n && !slots))
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument", fn);
    kvf_status st = need_gpu_tier(c, fn);
    if (st != KVF_OK)
        return st;
    pthread_mutex_lock(&c->mu);
    st = check_handed_out(c, fn, slots, n);
    for (size_t i = 0; i < n && st == KVF_OK; i++) {
        c->gpu_state[slots[i]] = GPU_FREE;
        c->gpu_free[c->ngpu_free++] = slots[i];
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

kvf_status kvf_cache_acquire(kvf_cache *c, const kvf_key *keys, size_t n, uint32_t *slots,
                             size_t *hits_p, kvf_ticket *ticket_p)
{
    static const char fn[] = "kvf_cache_acquire";
    kvf__clear_error();
    if (!c || !keys || !slots || !hits_p || !ticket_p || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: NULL argument or empty batch", fn);
    kvf_status st = need_gpu_tier(c, fn);
    if (st == KVF_OK)
        st = check_keys(fn, keys, n);
    if (st == KVF_OK)
        st = check_unique(fn, keys, n);
    if (st != KVF_OK)
        return st;
    put_batches pb = {0};
    pending up[2] = {{0}, {0}}; /* reads from the host tier, from files */
    pending fence = {0};        /* blocks already in the GPU tier */
    uint32_t *freed = malloc(n * sizeof *freed);
    size_t nfreed = 0;
    if (!freed || !put_batches_reserve(&pb, n) || !pending_reserve(&up[0], n) ||
        !pending_reserve(&up[1], n) || !pending_reserve(&fence, n)) {
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    reap(c);
    call *k = call_new(c, n);
    if (!k) {
        release_doomed(c);
        pthread_mutex_unlock(&c->mu);
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", fn);
        goto out;
    }
    c->round++;
    pb.k = k;
    size_t h = 0;
    for (; h < n; h++) {
        entry *e = find(c, keys[h]);
        if (!e || e->removing)
            break;
        /* pinned first: the evictions below must not take it */
        pin_one(c, e);
        c->stats.gets++;
        e->uses++;
        if (e->tier == KVF_CACHE_GPU) {
            /* in place; but the copy that put it there (another request's
             * acquire, or an eviction's refill) may still be running: the
             * ticket waits for it, and fails the block if it failed */
            slots[h] = e->slot;
            pending_add(&fence, (kvf_move){e->slot, e->slot, 0}, e->key, e->gen, h);
            continue;
        }
        uint32_t s;
        if (!gpu_slot(c, &pb, &s)) {
            if (--e->pins == 0)
                lru_append(c, e);
            break;
        }
        kvf_cache_tier from = (kvf_cache_tier)e->tier;
        uint32_t old_slot = e->slot;
        c->used[from]--;
        e->tier = KVF_CACHE_GPU;
        e->slot = s;
        e->gen = ++c->next_gen;
        e->round = c->round;
        c->used[KVF_CACHE_GPU]++;
        c->gpu_state[s] = GPU_CACHED;
        if (from == KVF_CACHE_HOST) {
            pending_add(&up[0], (kvf_move){old_slot, s, 0}, e->key, e->gen, h);
            freed[nfreed++] = old_slot; /* reused only once the read is queued */
        } else {
            pending_add(&up[1], (kvf_move){e->key, s, 0}, e->key, e->gen, h);
        }
        emit(c, KVF_EVENT_UPDATED, e, from);
        slots[h] = s;
    }
    k->n = h;
    /* victims out of their GPU slots first, then the reads into them; the
     * vacated host slots are reused only after those reads, and the files
     * read are removed once read (op_apply) */
    flush(c, &pb);
    submit_into(c, OPK_ACQUIRE, KVF_CACHE_HOST, &up[0], k);
    submit_into(c, OPK_ACQUIRE, KVF_CACHE_DISK, &up[1], k);
    submit_into(c, OPK_FENCE, KVF_CACHE_GPU, &fence, k);
    for (size_t i = 0; i < nfreed; i++)
        c->free_slots[c->nfree++] = freed[i];
    k->next = c->calls;
    c->calls = k;
    *ticket_p = k->id;
    *hits_p = h;
    release_doomed(c);
    pthread_mutex_unlock(&c->mu);
out:
    free(freed);
    put_batches_free(&pb);
    pending_free(&up[0]);
    pending_free(&up[1]);
    pending_free(&fence);
    return st;
}

/* ---- pins and removal -------------------------------------------------------- */

kvf_status kvf_cache_pin(kvf_cache *c, const kvf_key *keys, size_t n, size_t *pinned_p)
{
    kvf__clear_error();
    if (!c || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_pin: NULL argument");
    size_t pinned = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        entry *e = find(c, keys[i]);
        if (!e || e->removing)
            continue;
        pin_one(c, e);
        pinned++;
    }
    pthread_mutex_unlock(&c->mu);
    if (pinned_p)
        *pinned_p = pinned;
    return KVF_OK;
}

static void unpin_one(kvf_cache *c, entry *e)
{
    if (--e->pins)
        return;
    lru_append(c, e);
    if (e->removing)
        discard(c, e);
}

kvf_status kvf_cache_unpin(kvf_cache *c, const kvf_key *keys, size_t n)
{
    kvf__clear_error();
    if (!c || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_unpin: NULL argument");
    kvf_status st = KVF_OK;
    pthread_mutex_lock(&c->mu);
    /* all or nothing: count what each key needs before changing any */
    for (size_t i = 0; i < n && st == KVF_OK; i++) {
        entry *e = find(c, keys[i]);
        uint32_t need = 0;
        for (size_t j = 0; j <= i; j++)
            need += keys[j] == keys[i];
        if (!e || e->pins - e->reads < need)
            st = kvf__fail(KVF_ERR_STATE, "kvf_cache_unpin: block 0x%016llx (key %zu) is %s",
                           (unsigned long long)keys[i], i, e ? "not pinned" : "not cached");
    }
    for (size_t i = 0; i < n && st == KVF_OK; i++)
        unpin_one(c, find(c, keys[i]));
    pthread_mutex_unlock(&c->mu);
    return st;
}

kvf_status kvf_cache_remove(kvf_cache *c, const kvf_key *keys, size_t n, size_t *removed_p)
{
    kvf__clear_error();
    if (!c || (n && !keys))
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_remove: NULL argument");
    size_t removed = 0;
    /* write-through blocks are removed from the store as well, each key once */
    pending remote = {0};
    bool through = c->cfg.remote == KVF_CACHE_REMOTE_WRITE_THROUGH && n;
    uint64_t *uniq = through ? malloc(n * sizeof *uniq) : NULL;
    if (through && (!uniq || !pending_reserve(&remote, n))) {
        free(uniq);
        pending_free(&remote);
        return kvf__fail(KVF_ERR_NOMEM, "kvf_cache_remove: out of memory");
    }
    pthread_mutex_lock(&c->mu);
    reap(c);
    for (size_t i = 0; i < n; i++) {
        entry *e = find(c, keys[i]);
        if (!e || e->removing)
            continue;
        removed++;
        e->removing = true;
        if (e->pins == 0)
            discard(c, e);
    }
    if (through) {
        memcpy(uniq, keys, n * sizeof *uniq);
        qsort(uniq, n, sizeof *uniq, cmp_u64);
        for (size_t i = 0; i < n; i++)
            if (i == 0 || uniq[i] != uniq[i - 1])
                pending_add(&remote, (kvf_move){uniq[i], uniq[i], 0}, uniq[i], 0, 0);
        submit_into(c, OPK_REMOTE_REMOVE, KVF_CACHE_REMOTE, &remote, NULL);
    }
    release_doomed(c);
    pthread_mutex_unlock(&c->mu);
    free(uniq);
    pending_free(&remote);
    if (removed_p)
        *removed_p = removed;
    return KVF_OK;
}

/* ---- events and stats -------------------------------------------------------- */

size_t kvf_cache_events(kvf_cache *c, kvf_cache_event *out, size_t cap)
{
    if (!c || !out)
        return 0;
    pthread_mutex_lock(&c->mu);
    size_t n = c->ev_count < cap ? c->ev_count : cap;
    for (size_t i = 0; i < n; i++)
        out[i] = c->events[(c->ev_head + i) % c->cfg.event_queue];
    if (n) {
        c->ev_head = (c->ev_head + n) % c->cfg.event_queue;
        c->ev_count -= n;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

static void stats_now(kvf_cache *c, kvf_cache_stats *s)
{
    pthread_mutex_lock(&c->mu);
    *s = c->stats;
    for (int t = 0; t < KVF_CACHE_TIERS; t++) {
        s->blocks[t] = c->used[t];
        s->capacity[t] = c->capacity[t];
    }
    _Static_assert(KVF_CACHE_TIERS <= KVF_CACHE_TIER_SLOTS, "a tier without a stats slot");
    pthread_mutex_unlock(&c->mu);
}

kvf_status kvf_cache_stats_get(kvf_cache *c, kvf_cache_stats *stats)
{
    kvf__clear_error();
    if (!c || !stats)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_stats_get: NULL argument");
    if (stats->struct_size < sizeof(size_t) || stats->struct_size > 65536)
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_stats_get: struct_size %zu (start from KVF_CACHE_STATS_INIT)",
                         stats->struct_size);
    kvf_cache_stats s;
    stats_now(c, &s);
    size_t size = stats->struct_size < sizeof s ? stats->struct_size : sizeof s;
    s.struct_size = size;
    memcpy(stats, &s, size);
    return KVF_OK;
}

/* Appends to a text buffer, counting what did not fit. */
typedef struct text {
    char *buf;
    size_t cap, len;
} text;

static void __attribute__((format(printf, 2, 3))) put_text(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->len < t->cap ? t->cap - t->len : 0;
    int w = vsnprintf(room ? t->buf + t->len : NULL, room, fmt, ap);
    va_end(ap);
    if (w > 0)
        t->len += (size_t)w;
}

static void metric_head(text *t, const char *name, const char *type, const char *help)
{
    put_text(t, "# HELP kvferry_cache_%s %s\n# TYPE kvferry_cache_%s %s\n", name, help, name, type);
}

static void per_tier(text *t, const char *name, const char *type, const char *help,
                     const uint64_t *v)
{
    metric_head(t, name, type, help);
    for (int i = 0; i < KVF_CACHE_TIERS; i++)
        put_text(t, "kvferry_cache_%s{tier=\"%s\"} %llu\n", name,
                 kvf_cache_tier_name((kvf_cache_tier)i), (unsigned long long)v[i]);
}

static void scalar(text *t, const char *name, const char *type, const char *help, uint64_t v)
{
    metric_head(t, name, type, help);
    put_text(t, "kvferry_cache_%s %llu\n", name, (unsigned long long)v);
}

kvf_status kvf_cache_stats_prometheus(kvf_cache *c, char *buf, size_t cap, size_t *len_p)
{
    kvf__clear_error();
    if (!c || (!buf && cap) || !len_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_stats_prometheus: NULL argument");
    kvf_cache_stats s;
    stats_now(c, &s);
    text t = {buf, cap, 0};
    per_tier(&t, "blocks", "gauge", "Blocks in each tier.", s.blocks);
    per_tier(&t, "capacity_blocks", "gauge", "Capacity of each tier in blocks.", s.capacity);
    scalar(&t, "lookups_total", "counter", "Lookups.", s.lookups);
    scalar(&t, "lookup_blocks_total", "counter", "Block keys asked for by lookups.",
           s.lookup_blocks);
    per_tier(&t, "hits_total", "counter", "Blocks found by lookups, by tier.", s.hits);
    scalar(&t, "misses_total", "counter", "Lookups that stopped at a block not cached.", s.misses);
    scalar(&t, "puts_total", "counter", "Blocks handed to put.", s.puts);
    scalar(&t, "put_duplicates_total", "counter", "Blocks handed to put that were cached.",
           s.put_duplicates);
    scalar(&t, "gets_total", "counter", "Blocks asked for by get.", s.gets);
    per_tier(&t, "bytes_in_total", "counter", "Bytes written into each tier.", s.bytes_in);
    per_tier(&t, "bytes_out_total", "counter", "Bytes read from each tier into primary slots.",
             s.bytes_out);
    per_tier(&t, "evictions_total", "counter", "Victims leaving each tier.", s.evictions);
    scalar(&t, "dropped_total", "counter", "Blocks that left the cache by eviction.", s.dropped);
    scalar(&t, "failures_total", "counter", "Blocks removed because a transfer failed.",
           s.failures);
    scalar(&t, "events_dropped_total", "counter", "Events lost to a full queue.", s.events_dropped);
    scalar(&t, "remote_errors_total", "counter",
           "Remote operations that failed (unreachable, timeout, damaged value).", s.remote_errors);
    metric_head(&t, "transfer_seconds", "histogram",
                "Get and put transfers, submit to completion.");
    uint64_t cum = 0;
    for (int b = 0; b < KVF_CACHE_LATENCY_BUCKETS; b++) {
        cum += s.latency_us[b];
        if (b == KVF_CACHE_LATENCY_BUCKETS - 1)
            put_text(&t, "kvferry_cache_transfer_seconds_bucket{le=\"+Inf\"} %llu\n",
                     (unsigned long long)cum);
        else
            put_text(&t, "kvferry_cache_transfer_seconds_bucket{le=\"%.6f\"} %llu\n",
                     (double)(1ull << (4 + b)) / 1e6, (unsigned long long)cum);
    }
    put_text(&t, "kvferry_cache_transfer_seconds_sum %.6f\n", (double)s.latency_sum_us / 1e6);
    put_text(&t, "kvferry_cache_transfer_seconds_count %llu\n",
             (unsigned long long)s.latency_count);
    if (cap && t.len >= cap)
        buf[cap - 1] = '\0';
    *len_p = t.len;
    return KVF_OK;
}
