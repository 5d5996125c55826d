/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading blocks pool group by pool group, so that a caller can use the
 * first pools of every block of a batch while the later ones are still
 * on the disk (a forward pass computing layer l while later layers
 * stream in). Each block's file is read as a growing prefix: the first
 * read takes the header, the pool table and, as far as the caller
 * expects them, the first group's pools; each later read continues where
 * the last ended up to the end of the next group's pools (by the table
 * the first read brought), rounded up to the O_DIRECT unit, so every read
 * but the last is aligned and starts where the one before ended: one
 * sequential pass over the file in a few large reads. After group g of
 * every block is read, its pools are checked against the table (header
 * CRC, then the table's, then each pool's) and the caller is told; only
 * then is group g + 1 read. Each block's group is checked and handed to
 * the caller as its read lands, while the others' are still in flight,
 * so the checks and the caller's copies overlap the I/O. A block whose
 * check fails is failed for good (its earlier groups were checked and may
 * be in use); its later groups are not read, but still reported (failed)
 * so that the caller's count of each group is whole.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "blockhdr.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether io takes part in the group passes: read by them, not failed. */
static bool live(const kvf__blockfile_io *io)
{
    return io->status == KVF_OK && !io->slow;
}

static void what_of(const kvf__blockfile_io *io, char *what, size_t cap)
{
    snprintf(what, cap, "block " KVF_KEY_FMT ": %s", KVF_KEY_ARGS(io->meta.key), io->path);
}

/* The file's bytes a read of io ends at, once pools [0, end) are in: the
 * prefix and their bytes, rounded up to the O_DIRECT unit, never past
 * what read_begin would read whole (io->total). */
static size_t want_for(const kvf__blockfile_io *io, uint32_t end)
{
    if (end >= io->bh.pools)
        return io->total;
    kvf__block_span sp = kvf__block_prefix_span(io->table, end - 1);
    size_t w = round_up_align(kvf__block_prefix_bytes(io->bh.pools) + sp.off + sp.bytes);
    return w < io->total ? w : io->total;
}

/* Sets io's op to read [io->have, want). */
static void read_to(kvf__blockfile_io *io, size_t want)
{
    io->io.buf = io->buf + io->have;
    io->io.off = io->have;
    io->io.len = want - io->have;
    io->io.need = (want < io->size ? want : io->size) - io->have;
}

/* A read of io has finished (on whichever thread): its bytes join what it
 * holds; a failed or short read fails io. */
static void take_read(kvf__blockfile_io *io, size_t want)
{
    char what[PATH_MAX + 48], eb[128];
    what_of(io, what, sizeof what);
    if (io->io.err)
        kvf__bf_io_fail(io, kvf__errno_status(io->io.err), "%s: read: %s", what,
                        kvf__bf_errstr(io->io.err, eb, sizeof eb));
    else if (io->io.done < io->io.need)
        /* the file shrank after fstat: never hand back the bytes not read */
        kvf__bf_io_fail(io, KVF_ERR_CORRUPT, "%s: truncated: short read, %zu of %zu bytes", what,
                        io->have + io->io.done, io->size);
    else
        io->have = want;
}

/* Runs the reads of the live blocks whose want[i] is past what they hold,
 * each calling on_done (its io's `want` set) as it finishes, on whichever
 * thread finished it, while the others are still in flight. */
static void run_reads(kvf__fileio_runner *fio, kvf__blockfile_io *ios, size_t n, const size_t *want,
                      void (*on_done)(kvf__fio_op *op))
{
    /* the blocks with nothing to read now out of the list, as failed ones */
    bool *idle = calloc(n ? n : 1, sizeof *idle);
    if (!idle) {
        for (size_t i = 0; i < n; i++)
            if (live(&ios[i]))
                kvf__bf_io_fail(&ios[i], KVF_ERR_NOMEM, "block " KVF_KEY_FMT ": out of memory",
                                KVF_KEY_ARGS(ios[i].meta.key));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!live(&ios[i]) || want[i] <= ios[i].have) {
            idle[i] = ios[i].status == KVF_OK;
            if (idle[i])
                ios[i].status = KVF_INPROGRESS;
            continue;
        }
        read_to(&ios[i], want[i]);
        ios[i].want = want[i];
    }
    kvf__fileio_runner_run(fio, kvf__bf_live_ops(ios, n, KVF_FIO_READ, NULL, on_done));
    for (size_t i = 0; i < n; i++)
        if (idle[i])
            ios[i].status = KVF_OK;
    free(idle);
}

/* After the first read: io's header checked and its pool table brought to
 * io->table (the image's own bytes on the host; a copy for a device
 * image), the prefix whole in what was read. */
static void take_prefix(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    char what[PATH_MAX + 48];
    what_of(io, what, sizeof what);
    uint8_t hb[HDR];
    const uint8_t *hdr = io->buf;
    kvf_status st = KVF_OK;
    if (io->have < HDR)
        st = kvf__fail(KVF_ERR_CORRUPT, "%s: truncated: %zu bytes, less than a header", what,
                       io->have);
    if (st == KVF_OK && io->img) {
        st = io->img->get(io->img_arg, io->buf, hb, HDR);
        hdr = hb;
    }
    if (st == KVF_OK)
        st = kvf__block_header_parse(hdr, what, &io->bh);
    if (st == KVF_OK)
        st = kvf__block_header_expect(&io->bh, what, dir->fingerprint, dir->ns_hash, io->meta.key);
    size_t pre = st == KVF_OK ? kvf__block_prefix_bytes(io->bh.pools) : 0;
    if (st == KVF_OK)
        st = kvf__bf_check_file_size(io->size, (uint32_t)pre, io->bh.payload_bytes, what);
    if (st == KVF_OK && io->have < pre)
        st = kvf__fail(KVF_ERR_CORRUPT, "%s: %zu bytes read, the prefix of %u pools is %zu", what,
                       io->have, io->bh.pools, pre);
    io->table = io->buf;
    if (st == KVF_OK && io->img) {
        io->table = malloc(pre);
        st = io->table ? io->img->get(io->img_arg, io->buf, io->table, pre)
                       : kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for the pool table", what);
    }
    if (st == KVF_OK)
        st = kvf__block_table_check(&io->bh, io->table, what);
    if (st != KVF_OK) {
        kvf__bf_io_fail(io, st, "%s", kvf_last_error());
        return;
    }
    io->meta.tokens = io->bh.tokens;
    io->meta.pools = io->bh.pools;
    io->meta.payload_bytes = io->bh.payload_bytes;
}

/* Pools [first, last) of io, read: checked (the padding too after the
 * last pool); a failure fails io. */
static void check_pools(kvf__blockfile_io *io, uint32_t first, uint32_t last)
{
    if (last > io->bh.pools)
        last = io->bh.pools;
    if (first >= last)
        return;
    char what[PATH_MAX + 48];
    what_of(io, what, sizeof what);
    kvf_status st = kvf__bf_image_check(io, &io->bh, io->table, first, last, what);
    if (st != KVF_OK)
        kvf__bf_io_fail(io, st, "%s", kvf_last_error());
}

/* Hands group g of io over (checked first when io is still live), and
 * moves io on to the next group. */
static void hand_over(kvf__blockfile_io *io, uint32_t g)
{
    const kvf__blockfile_groups *gr = io->groups;
    if (live(io))
        check_pools(io, g ? gr->end[g - 1] : 0, g + 1 == gr->n ? io->bh.pools : gr->end[g]);
    io->next_group = g + 1;
    gr->on_block(gr->arg, io, g);
}

/* The first read done: prefix taken, and group 0 handed over where the
 * read brought all of it. */
static void first_done(kvf__fio_op *op)
{
    kvf__blockfile_io *io = kvf__bf_io_of(op);
    take_read(io, io->want);
    if (live(io))
        take_prefix(io->dir, io);
    if (live(io) && io->have >= (io->groups->n > 1 ? want_for(io, io->groups->end[0]) : io->total))
        hand_over(io, 0);
}

/* A later read done: its group handed over. */
static void group_read_done(kvf__fio_op *op)
{
    kvf__blockfile_io *io = kvf__bf_io_of(op);
    take_read(io, io->want);
    hand_over(io, io->next_group);
}

void kvf__blockfile_read_groups(kvf__blockfile_dir *dir, kvf__fileio_runner *fio,
                                kvf__blockfile_io *ios, size_t n, const kvf__blockfile_groups *gr)
{
    size_t *want = calloc(n ? n : 1, sizeof *want);
    for (size_t i = 0; i < n; i++) {
        kvf__blockfile_io *io = &ios[i];
        io->dir = dir;
        io->have = 0;
        io->table = NULL;
        io->groups = gr;
        io->next_group = 0;
        if (!want) {
            io->fd = -1;
            io->reported = false;
            io->slow = false;
            kvf__bf_io_fail(io, KVF_ERR_NOMEM, "block " KVF_KEY_FMT ": out of memory",
                            KVF_KEY_ARGS(io->meta.key));
            continue;
        }
        if (!kvf__bf_read_begin(dir, io)) {
            if (io->slow)
                kvf__bf_read_slow(dir, io); /* whole: every group is in */
            continue;
        }
        io->total = io->io.len;
        size_t first = round_up_align(gr->first_bytes);
        want[i] = first < io->total ? first : io->total;
    }
    if (want)
        run_reads(fio, ios, n, want, first_done);
    for (uint32_t g = 0; g < gr->n; g++) {
        /* blocks done with (failed, or read whole by the careful reader)
         * and those holding group g already: handed over now; the others'
         * reads run, each handed over as it lands */
        for (size_t i = 0; i < n; i++) {
            kvf__blockfile_io *io = &ios[i];
            if (io->next_group != g)
                continue;
            size_t w = live(io) ? g + 1 == gr->n ? io->total : want_for(io, gr->end[g]) : 0;
            if (!live(io) || w <= io->have)
                hand_over(io, g);
            else if (want)
                want[i] = w;
        }
        if (want) {
            for (size_t i = 0; i < n; i++)
                if (ios[i].next_group != g)
                    want[i] = 0; /* nothing to read for it */
            run_reads(fio, ios, n, want, group_read_done);
        }
        /* a read refused before it ran (out of memory) still hands over */
        for (size_t i = 0; i < n; i++)
            if (ios[i].next_group == g)
                hand_over(&ios[i], g);
    }
    for (size_t i = 0; i < n; i++) {
        kvf__blockfile_io *io = &ios[i];
        if (io->fd >= 0) {
            char key[KVF_KEY_STR_BYTES];
            kvf_status st = kvf__bf_close_read_fd(io->fd, io->status,
                                                  kvf_key_format(io->meta.key, key), io->path);
            io->fd = -1;
            if (st != io->status)
                kvf__bf_io_fail(io, st, "%s", kvf_last_error());
        }
        if (io->img && io->table && io->table != io->buf)
            free(io->table);
        io->table = NULL;
        kvf__bf_io_finished(io);
    }
    free(want);
}
