/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunks of moves between slots and block files: staging, the file I/O,
 * lost and failed files.
 */
#include "engine_private.h"

static void file_move_failed(batch *b, size_t i, kvf_status st, const char *msg)
{
    KVF_LOG(KVF_LOG_WARN, "%s: %s", op_name(b->kind), msg);
    kvf__move_failed(b, i, st, "%s: %s", op_name(b->kind), msg);
}

/* Marks a file key lost (its old file could not be removed), or clears
 * the mark once the key was written or removed. */
static void lost_file_set(kvf_engine *e, uint64_t key, bool lost)
{
    pthread_mutex_lock(&e->lost_mu);
    if (lost) {
        if (!kvf__key_hazard(&e->lost_files, key, true))
            KVF_LOG(KVF_LOG_ERROR,
                    "block 0x%llx: out of memory to remember it lost: its old file may be served",
                    (unsigned long long)key);
    } else if (e->lost_files.count) {
        kvf__key_hazard_prune(&e->lost_files, key);
    }
    pthread_mutex_unlock(&e->lost_mu);
}

/* Clears the lost marks of the keys of ios[0..n) written: stored again. */
static void lost_files_written(kvf_engine *e, const kvf__blockfile_io *ios, size_t n)
{
    pthread_mutex_lock(&e->lost_mu);
    for (size_t j = 0; j < n && e->lost_files.count; j++)
        if (ios[j].status == KVF_OK)
            kvf__key_hazard_prune(&e->lost_files, ios[j].meta.key);
    pthread_mutex_unlock(&e->lost_mu);
}

/* Fails the reads of moves [first, last) whose key is marked lost. */
static void refuse_lost_files(kvf_engine *e, batch *b, size_t first, size_t last)
{
    pthread_mutex_lock(&e->lost_mu);
    for (size_t i = first; i < last && e->lost_files.count; i++) {
        uint64_t key = b->moves[i].src;
        if (b->status[i] != KVF_INPROGRESS || !kvf__key_hazard(&e->lost_files, key, false))
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
void kvf__drop_failed_file(kvf_engine *e, const batch *b, size_t i)
{
    bool emptied;
    uint64_t key = b->moves[i].dst;
    if (e->file_store->ops->discard(e->file_store, key, &emptied) == KVF_OK)
        return;
    lost_file_set(e, key, true);
    KVF_LOG(KVF_LOG_ERROR,
            "%s: after a failed write: %s; the key is refused (KVF_ERR_LOST) until written again%s",
            op_name(b->kind), kvf_last_error(),
            emptied ? "" : "; an engine opened on this directory later would serve the old bytes");
}

static void drop_failed_files(kvf_engine *e, const batch *b, size_t first, size_t last)
{
    for (size_t i = first; i < last; i++)
        if (b->status[i] != KVF_INPROGRESS && b->status[i] != KVF_OK)
            kvf__drop_failed_file(e, b, i);
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
        kvf__file_copies(e, b->kind, mv, io->buf + KVF_BLOCK_HEADER_BYTES, tokens, tokens, cp);
    kvf_status st = kvf__staging_copy(w, b, cp);
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
    else if (kvf__file_copies(e, b->kind, mv, io->buf + KVF_BLOCK_HEADER_BYTES, tokens,
                              meta->tokens, cp) != meta->payload_bytes)
        st = kvf__fail(
            KVF_ERR_MISMATCH, "block 0x%llx: %llu payload bytes stored, not what %u tokens take",
            (unsigned long long)mv->src, (unsigned long long)meta->payload_bytes, meta->tokens);
    else if ((st = kvf__staging_copy(w, b, cp)) != KVF_OK)
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
    size_t slot_bytes = kvf__staging_slot_bytes(e);
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
                op_name(b->kind), n);
    return n > 0;
}

/* Re-reads of a block whose check failed, and the pause before each
 * after the first. Another process writing the namespace replaces a file
 * by swapping a new one in, and later writes over the old inode in place
 * (the store's spares): a read still open on it then sees another
 * version half written, a checksum or header that fails, while the file
 * under the key's name is whole. Opened again by name, it reads whole; a
 * block that fails every time is what the file holds. */
#define REREADS 3
#define REREAD_PAUSE_NS 1000000L

/* Settles the reads of first..last-1 that succeeded (KVF_OK) and puts
 * those whose stored bytes failed their checks back in progress, for a
 * pass that reads them alone; false when there are none. */
static bool reread_verdicts(const batch *b, size_t first, size_t last)
{
    size_t n = 0;
    for (size_t i = first; i < last; i++) {
        kvf_status st = b->status[i];
        if (st == KVF_INPROGRESS)
            b->status[i] = KVF_OK;
        else if (st == KVF_ERR_CORRUPT || st == KVF_ERR_MISMATCH) {
            b->status[i] = KVF_INPROGRESS;
            n++;
        }
    }
    if (n)
        KVF_LOG(KVF_LOG_INFO,
                "%s: reading %zu blocks again whose check failed (a writer in another process "
                "may be rewriting their files)",
                op_name(b->kind), n);
    return n > 0;
}

/* Removes the files of moves first..last-1 through the file store, a
 * slice of blocks per call. */
static void remove_files(kvf_engine *e, batch *b, size_t first, size_t last)
{
    enum { SLICE = 16 };
    kvf__store *s = e->file_store;
    kvf__store_block blk[SLICE];
    size_t idx[SLICE];
    for (size_t i = first; i < last;) {
        size_t k = 0;
        for (; i < last && k < SLICE; i++)
            if (b->status[i] == KVF_INPROGRESS) {
                blk[k] = (kvf__store_block){.key = b->moves[i].src};
                idx[k++] = i;
            }
        if (k == 0)
            break;
        s->ops->remove(s, blk, k, 0);
        for (size_t j = 0; j < k; j++) {
            if (blk[j].status != KVF_OK)
                file_move_failed(b, idx[j], blk[j].status, blk[j].msg);
            else
                lost_file_set(e, blk[j].key, false); /* absent now, as promised */
        }
    }
}

/* The file half of moves first..last-1 of a batch. A move that finds the
 * process out of a resource (descriptors, above all, when many transfers
 * run at once) is tried once more after a short wait, and then reported
 * with KVF_ERR_RESOURCE: the block it read stays stored. */
static void run_file_moves(worker *w, batch *b, size_t first, size_t last)
{
    kvf_engine *e = w->engine;
    if (kind_removes(b->kind)) {
        remove_files(e, b, first, last);
        return;
    }
    /* device slots take cuFile; secondary slots are host memory */
    bool dev = e->gds && !kind_uses_secondary(b->kind);
    bool to_file = tier_keyed(kind_writes(b->kind));
    if (!to_file)
        refuse_lost_files(e, b, first, last);
    kvf_status st = kvf__ensure_staging(w, last - first, dev);
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
    if (to_file) {
        drop_failed_files(e, b, first, last);
        return;
    }
    /* a verdict against stored bytes only once they read the same way
     * again: never on a read that met another writer mid-rewrite */
    for (int k = 0; k < REREADS && reread_verdicts(b, first, last); k++) {
        struct timespec pause = {0, REREAD_PAUSE_NS * k * k};
        if (k)
            nanosleep(&pause, NULL);
        file_io_pass(w, b, first, last, dev, to_file);
    }
}

/* A chunk of file moves, its time kept for the engine's debug log. */
static void file_chunk(worker *w, batch *b, size_t first, size_t last, uint64_t deadline_ns)
{
    (void)deadline_ns;
    uint64_t t0 = kvf__now_ns();
    run_file_moves(w, b, first, last);
    w->file_ns += kvf__now_ns() - t0;
    w->file_chunks++;
    w->file_moves += last - first;
}

/* A few times a worker's share of the queue depth, so that its queue
 * stays full (the I/O engine submits as calls complete) and drains only
 * at the end of a chunk; within a staging budget. */
static size_t file_chunk_moves(const kvf_engine *e)
{
    size_t nw = e->nworkers, depth = kvf__fileio_runner_depth(e->fio);
    size_t budget = FILE_STAGING_BUDGET / kvf__staging_slot_bytes(e);
    size_t per = 4 * ((depth + nw - 1) / nw);
    return per > budget ? budget : per;
}

/* After a batch wrote block files: under KVF_FSYNC_BATCH, one commit
 * makes them durable, or fails every move not failed already (and drops
 * its file, as for any failed write). */
static void file_wrote(kvf_engine *e, batch *b)
{
    if (e->cfg.file.fsync != KVF_FSYNC_BATCH)
        return;
    kvf_status st = e->file_store->ops->commit(e->file_store);
    if (st == KVF_OK)
        return;
    /* every move of the batch is done: their statuses are this thread's
     * to write; the files of those failed before are gone already */
    char why[KVF_MOVE_ERROR_MESSAGE];
    snprintf(why, sizeof why, "%s", kvf_last_error());
    for (size_t i = 0; i < b->n; i++)
        if (b->status[i] == KVF_INPROGRESS) {
            kvf__move_failed(b, i, st, "%s: block 0x%llx: %s", op_name(b->kind),
                             (unsigned long long)b->moves[i].dst, why);
            kvf__drop_failed_file(e, b, i);
        }
}

const tier_ops kvf__file_tier_ops = {file_chunk, file_chunk_moves, NULL, file_wrote};
