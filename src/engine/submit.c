/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Submission: a batch registered on its hazards, queued in parts, and the
 * public calls that queue moves.
 */
#include "engine_private.h"

/* Batch b waits for dep's moves up to `need` (DEP_WHOLE: all of dep). Only
 * the submitter adds dependents, one batch at a time, so an edge from b
 * already there is dep's last: it then waits for the later of the two. */
static kvf_status add_dependency(batch *b, batch *dep, uint32_t need)
{
    if (dep == b || (need != DEP_WHOLE && need < dep->copied))
        return KVF_OK;
    if (dep->ndependents && dep->dependents[dep->ndependents - 1].b == b) {
        dep_edge *last = &dep->dependents[dep->ndependents - 1];
        if (need > last->need)
            last->need = need;
        return KVF_OK;
    }
    if (!kvf__push_edge(&dep->dependents, &dep->ndependents, &dep->dependents_cap,
                        (dep_edge){b, need}))
        return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory");
    b->deps_left++;
    return KVF_OK;
}

void kvf__ready_push(kvf_engine *e, batch *b)
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

void kvf__ready_pop(kvf_engine *e, kvf__queue q)
{
    batch *b = e->ready_head[q];
    e->ready_head[q] = b->next_ready;
    if (!e->ready_head[q])
        e->ready_tail[q] = NULL;
    b->next_ready = NULL;
}

/* Moves registered per hold of the engine lock: the lock is dropped
 * between slices, so that workers issuing earlier parts and completions
 * are not held up for a whole part (registering costs tens of ns a move). */
#define REGISTER_SLICE 1024u

static kvf__register_hook_fn register_hook;

void kvf__set_register_hook(kvf__register_hook_fn fn)
{
    __atomic_store_n(&register_hook, fn, __ATOMIC_RELEASE);
}

/* The pools batch b writes in secondary slot s are written (sec_slot.pools). */
static void mark_pools_written(kvf_engine *e, const batch *b, uint64_t s)
{
    if (!b->sel || b->sel->whole) {
        e->sec[s].pools = e->npools;
        return;
    }
    for (uint32_t k = 0; k < b->sel->n && e->sec[s].pools < e->npools; k++) {
        size_t bit = sec_bit(e, s, b->sel->order[k]);
        uint8_t m = (uint8_t)(1u << (bit % 8));
        if (!(e->sec_pool_bits[bit / 8] & m)) {
            e->sec_pool_bits[bit / 8] |= m;
            e->sec[s].pools++;
        }
    }
}

/* Registers a checked batch in the hazard tables. Lock held; dropped
 * between slices of moves (only the submitter, holding submit_mu,
 * registers; the caller holds the batch back from starting meanwhile).
 * Only allocation can fail here, and then the tables are left as they were
 * except for entries the batch would have been added to (undone below). */
static kvf_status register_batch(kvf_engine *e, batch *b)
{
    kvf_tier rs = kind_reads(b->kind);
    kvf_tier ws = kind_writes(b->kind);
    bool keyed_read = tier_keyed(rs);
    bool keyed_write = tier_keyed(ws);
    bool partial = b->sel && !b->sel->whole;
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
        hazard *r = hazard_of(e, rs, mv->src, mv->key, true);
        hazard *w = hazard_of(e, ws, mv->dst, mv->key, true);
        if (!r || !w)
            return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory for hazards");
        /* read after write: remember whose data this move will read */
        batch *dep = pending_batch(e, r->writer);
        if (dep) {
            b->src_dep[i] = dep->id;
            if (add_dependency(b, dep, DEP_WHOLE) != KVF_OK)
                return KVF_ERR_NOMEM;
        } else if (rs != KVF_TIER_GPU || b->kind.dir == OP_FENCE || b->checked) {
            /* (a fence asks whether the slot's last write landed, too) */
            /* kvferry owns secondary slots and files: a failed write
             * there is known bad until rewritten */
            b->src_dep[i] = keyed_read ? r->poison : slot_poison(r);
        }
        /* moves are registered in order: the entry names the last of
         * this batch's that reads here */
        uint64_t entry = reader_entry(b->id, i);
        if (r->nreaders && hazard_reader(r, r->nreaders - 1) == b->id) {
            hazard_set_entry(r, r->nreaders - 1, entry);
        } else {
            if (r->nreaders && !keyed_read)
                kvf__hazard_prune_readers(e, r);
            if (r->nreaders > 0 && !kvf__push_id(&r->more, r->nreaders - 1, &r->cap, entry))
                return kvf__fail(KVF_ERR_NOMEM, "batch: out of memory for hazards");
            if (r->nreaders == 0)
                r->reader0 = entry;
            r->nreaders++;
        }
        /* write after write: the whole writer (its failure is recorded
         * when it completes); write after read: a slot's reader only until
         * its move here has copied (a keyed one is read whole) */
        if ((dep = pending_batch(e, w->writer)) && add_dependency(b, dep, DEP_WHOLE) != KVF_OK)
            return KVF_ERR_NOMEM;
        for (uint32_t k = 0; k < w->nreaders; k++)
            if ((dep = pending_batch(e, hazard_reader(w, k))) &&
                add_dependency(b, dep, keyed_write ? DEP_WHOLE : hazard_reader_move(w, k)) !=
                    KVF_OK)
                return KVF_ERR_NOMEM;
        if (partial) {
            /* some pools of the slot: the rest keep what the last write
             * left, lost too if it failed */
            dep = pending_batch(e, w->writer);
            b->dst_dep[i] = dep ? dep->id : slot_poison(w);
        }
        w->nreaders = 0;
        w->writer = b->id;
        b->nregistered = i + 1;
        if (ws == KVF_TIER_HOST) {
            /* a partial write leaves the other pools' tokens as they were:
             * the slot holds the fewer of the two */
            uint32_t now = eff_tokens(e, mv->tokens), had = e->sec[mv->dst].tokens;
            e->sec[mv->dst].tokens = partial && had && had < now ? had : now;
            mark_pools_written(e, b, mv->dst);
        }
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

/* Moves of a batch registered and queued in one piece; larger batches are
 * split into parts (see batch.group) of at most this size. The first parts
 * are smaller (FIRST_PART_MOVES, doubling): the GPU starts on the first
 * while the next are registered (bench/timeline.py shows a part's
 * registration beside its copies). A batch that the backend copies
 * asynchronously is split from FIRST_PART_MOVES on: registering and
 * preparing the calls of 4096 moves took 80-160 us, before any byte
 * moved, against about 1.2 ms to copy 64 MiB of them (docs/performance.md,
 * partial copies). A batch naming its pools is split only above PART_MOVES: its
 * parts could not mark each pool's arrival (kvf_wait_pool). */
#define PART_MOVES 4096u
#define FIRST_PART_MOVES 512u
/* a reader entry names any move of a batch (hazard_reader_move) */
_Static_assert(PART_MOVES < READER_MOVE_MAX, "reader entries name a batch's moves");

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
            kvf__move_failed(b, i, KVF_ERR_NOMEM, "%s: out of memory for the batch's hazards",
                             op_name(b->kind));
    }
    if (b->deps_left == 0) {
        /* a large batch's first part is issued here; the others go to the
         * workers, which issue each while the submitter registers the
         * next. A group of at most PART_MOVES moves issues every part here:
         * a part of it takes less time to register than the GPU takes to
         * copy the part before, while handing it to a worker left the GPU
         * idle 80-160 us per part (a worker picking it up) and mixed the
         * parts' calls on the queue (bench/timeline.py --gpu) */
        bool later_part =
            b->group && b->group_off > 0 && e->nworkers > 0 && b->group->n > PART_MOVES;
        if (e->backend->ops->copy_async && !kind_on_workers(b->kind) && !later_part) {
            b->state = B_RUNNING;
            b->async = true;
            kvf__issue_async(e, b); /* releases and retakes the lock */
        } else {
            kvf__ready_push(e, b);
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
 * their own. sort_counts gives the zeroed counters that kvf__check_moves fills,
 * or NULL when the sort would not pay (or memory is short); kvf__sort_parts
 * then fills b->order. submit_mu held. */
static uint32_t *sort_counts(kvf_engine *e, batch *b)
{
    if (b->n <= PART_MOVES || b->kind.tier != KVF_TIER_HOST)
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

void kvf__sort_parts(kvf_engine *e, batch *b, const kvf_move *moves, uint32_t *cnt)
{
    bool off = b->kind.dir == OP_OFFLOAD;
    for (size_t k = 0; k < e->secondary_slots; k++)
        cnt[k + 1] += cnt[k];
    for (size_t i = 0; i < b->n; i++)
        b->order[cnt[off ? moves[i].dst : moves[i].src]++] = (uint32_t)i;
    b->sorted = true;
}

kvf_status kvf__submit(kvf_engine *e, op_kind kind, const kvf_move *moves, size_t n,
                       kvf_ticket *ticket_p)
{
    return kvf__submit_batch(e, kind, false, moves, n, ticket_p);
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
    c->after = b->after;
    c->sel = b->sel;
    c->group_off = off;
}

/* The tiers a kind moves between are configured (e->mu held): its own,
 * then the secondary slots a demote or promote moves them through. */
static kvf_status tiers_ready(kvf_engine *e, op_kind kind)
{
    const tier_info *t = &kvf__tiers[kind.tier];
    kvf_status st = t->ready ? t->ready(e, op_name(kind)) : KVF_OK;
    if (st == KVF_OK && kind.tier != KVF_TIER_HOST && kind_uses_secondary(kind))
        st = kvf__tiers[KVF_TIER_HOST].ready(e, op_name(kind));
    return st;
}

/* Queues group b (checked; e->mu held, dropped while each part is made)
 * as its parts. What the caller is told: KVF_OK, or for a batch without a
 * ticket, the failure nobody would hear of otherwise. */
static kvf_status enqueue_group(kvf_engine *e, batch *b, const kvf_move *moves, bool all_good)
{
    size_t n = b->n;
    kvf_status ret = KVF_OK;
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
        /* a part is made without the lock, so that workers (issuing the
         * parts before it) and completions get it meanwhile; the statuses
         * read here are this part's, which nothing else writes before it
         * is queued */
        pthread_mutex_unlock(&e->mu);
        batch *c = kvf__batch_get(e, len, false);
        if (c)
            make_part(e, b, moves, c, sorted, all_good, off, len);
        engine_lock(e);
        if (!c) {
            /* the parts not made fail; those queued run on */
            for (size_t i = off; i < n; i++)
                b->status[sorted ? b->order[i] : i] = KVF_ERR_NOMEM;
            b->parts_left -= nparts - k;
            if (!b->ticketed)
                ret = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", op_name(b->kind));
            break;
        }
        if (enqueue(e, c) != KVF_OK && !b->ticketed)
            ret = KVF_ERR_NOMEM;
        KVF_TIMELINE(KVF_TL_PART, c->id, len);
    }
    if (b->parts_left == 0)
        kvf__group_done(e, b);
    return ret;
}

kvf_status kvf__submit_batch(kvf_engine *e, op_kind kind, bool checked, const kvf_move *moves,
                             size_t n, kvf_ticket *ticket_p)
{
    return kvf__submit_after(e, kind, checked, NULL, moves, n, ticket_p);
}

kvf_status kvf__submit_after(kvf_engine *e, op_kind kind, bool checked, void *after,
                             const kvf_move *moves, size_t n, kvf_ticket *ticket_p)
{
    return kvf__submit_pools(e, kind, checked, after, NULL, 0, moves, n, ticket_p);
}

kvf_status kvf__submit_pools(kvf_engine *e, op_kind kind, bool checked, void *after,
                             const uint32_t *pools, size_t n_pools, const kvf_move *moves, size_t n,
                             kvf_ticket *ticket_p)
{
    kvf__clear_error();
    KVF_TIMELINE(KVF_TL_SUBMIT, 0, n);
    if (!e)
        return kvf__fail(KVF_ERR_INVALID, "%s: engine is NULL", op_name(kind));
    if (n == 0)
        return kvf__fail(KVF_ERR_INVALID, "%s: empty batch (n = 0)", op_name(kind));
    if (!moves)
        return kvf__fail(KVF_ERR_INVALID, "%s: moves is NULL with n = %zu", op_name(kind), n);
    if (n > (SIZE_MAX / 4) / sizeof(kvf__copy))
        return kvf__fail(KVF_ERR_RANGE, "%s: batch of %zu moves is too large", op_name(kind), n);

    /* a group's moves stay in the caller's array: its parts copy them */
    bool early_parts = e->backend->ops->copy_async && !kind_on_workers(kind) && !n_pools;
    bool group = n > (early_parts ? FIRST_PART_MOVES : PART_MOVES);
    batch *b = kvf__batch_get(e, n, group);
    if (!b)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", op_name(kind));
    if (!group)
        memcpy(b->moves, moves, n * sizeof *moves);
    b->n = n;
    b->kind = kind;
    b->queue = kind_queue(kind);
    b->ticketed = ticket_p != NULL;
    b->checked = checked;
    b->engine = e;
    b->submit_ns = kvf__now_ns();

    pthread_mutex_lock(&e->submit_mu);
    engine_lock(e);
    kvf_status st = kvf__freeze(e);
    if (st != KVF_OK)
        goto refuse;
    if ((st = tiers_ready(e, kind)) != KVF_OK)
        goto refuse;
    if ((st = kvf__pool_sel_make(e, op_name(kind), kind, pools, n_pools, &b->sel)) != KVF_OK)
        goto refuse;
    /* The checks need only submit_mu (see kvf__check_moves); completions take
     * `mu` meanwhile. */
    pthread_mutex_unlock(&e->mu);
    uint32_t *cnt = sort_counts(e, b);
    size_t failed = 0;
    st = kvf__check_moves(e, kind, moves, n, b, cnt, &failed);
    if (st != KVF_OK) {
        st = kvf__fail(st, "%s: %s", op_name(kind), kvf_last_error());
        goto refuse_checked;
    }
    if (cnt)
        kvf__sort_parts(e, b, moves, cnt);
    /* the mark last: once it exists the batch is accepted, and it releases
     * it when it completes */
    if (after && (st = e->backend->ops->mark(e->backend, after, &b->after)) != KVF_OK) {
        st = kvf__fail(st, "%s: marking the caller's stream: %s", op_name(kind), kvf_last_error());
        goto refuse_checked;
    }
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
        ret = enqueue_group(e, b, moves, failed == 0);
    }
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_unlock(&e->submit_mu);
    KVF_TIMELINE(KVF_TL_SUBMITTED, 0, n);
    return ret;

refuse:
    pthread_mutex_unlock(&e->mu);
refuse_checked:
    pthread_mutex_unlock(&e->submit_mu);
    kvf__batch_free(b);
    return st;
}

static kvf_status submit_tier(kvf_engine *e, const char *fn, kvf_tier tier, op_dir dir,
                              const kvf_move *moves, size_t n, kvf_ticket *ticket_p)
{
    kvf__clear_error();
    op_kind kind = KIND_FENCE; /* set when the tier is taken */
    kvf_status st = kvf__tier_kind(fn, tier, dir, &kind);
    return st != KVF_OK ? st : kvf__submit(e, kind, moves, n, ticket_p);
}

kvf_status kvf_offload(kvf_engine *e, kvf_tier to, const kvf_move *moves, size_t n,
                       kvf_ticket *ticket_p)
{
    return submit_tier(e, "kvf_offload", to, OP_OFFLOAD, moves, n, ticket_p);
}

kvf_status kvf__offload_after(kvf_engine *e, const char *fn, void *stream, kvf_tier to,
                              const uint32_t *pools, size_t n_pools, const kvf_move *moves,
                              size_t n, kvf_ticket *ticket_p)
{
    kvf__clear_error();
    if (stream && !e)
        return kvf__fail(KVF_ERR_INVALID, "%s: engine is NULL", fn);
    if (stream && !e->backend->ops->mark)
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "%s: the %s backend has no stream to order after (stream must be NULL)",
                         fn, e->backend->ops->name);
    op_kind kind = KIND_FENCE; /* set when the tier is taken */
    kvf_status st = kvf__tier_kind(fn, to, OP_OFFLOAD, &kind);
    return st != KVF_OK
               ? st
               : kvf__submit_pools(e, kind, false, stream, pools, n_pools, moves, n, ticket_p);
}

kvf_status kvf_offload_after(kvf_engine *e, void *stream, kvf_tier to, const kvf_move *moves,
                             size_t n, kvf_ticket *ticket_p)
{
    return kvf__offload_after(e, "kvf_offload_after", stream, to, NULL, 0, moves, n, ticket_p);
}

kvf_status kvf_onboard(kvf_engine *e, kvf_tier from, const kvf_move *moves, size_t n,
                       kvf_ticket *ticket_p)
{
    return submit_tier(e, "kvf_onboard", from, OP_ONBOARD, moves, n, ticket_p);
}

kvf_status kvf_copy(kvf_engine *e, const kvf_move *moves, size_t n, kvf_ticket *ticket_p)
{
    return kvf__submit(e, KIND_COPY, moves, n, ticket_p);
}

kvf_status kvf_demote(kvf_engine *e, kvf_tier to, const kvf_move *moves, size_t n,
                      kvf_ticket *ticket_p)
{
    return submit_tier(e, "kvf_demote", to, OP_DEMOTE, moves, n, ticket_p);
}

kvf_status kvf_promote(kvf_engine *e, kvf_tier from, const kvf_move *moves, size_t n,
                       kvf_ticket *ticket_p)
{
    return submit_tier(e, "kvf_promote", from, OP_PROMOTE, moves, n, ticket_p);
}

kvf_status kvf_remove(kvf_engine *e, kvf_tier tier, const kvf_key *keys, size_t n,
                      kvf_ticket *ticket_p)
{
    kvf__clear_error();
    op_kind kind = KIND_FENCE; /* set when the tier is taken */
    kvf_status st = kvf__tier_kind("kvf_remove", tier, OP_REMOVE, &kind);
    if (st != KVF_OK)
        return st;
    if (!e || n == 0)
        return kvf__submit(e, kind, NULL, n, ticket_p);
    if (!keys)
        return kvf__fail(KVF_ERR_INVALID, "%s: keys is NULL with n = %zu", op_name(kind), n);
    if (n > SIZE_MAX / sizeof(kvf_move))
        return kvf__fail(KVF_ERR_RANGE, "%s: batch of %zu keys is too large", op_name(kind), n);
    kvf_move *moves = malloc(n * sizeof *moves);
    if (!moves)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", op_name(kind));
    for (size_t i = 0; i < n; i++)
        moves[i] = (kvf_move){.key = keys[i]};
    st = kvf__submit(e, kind, moves, n, ticket_p);
    free(moves);
    return st;
}
