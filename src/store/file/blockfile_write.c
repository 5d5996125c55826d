/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writing blocks: the image (header, payload, zero padding) written to a
 * temporary file, or over a spare, then renamed over the key's name, so a
 * file under the final name is always complete; fsynced as the directory's
 * fsync mode asks (blockfile.c says what each promises). A write that
 * fails leaves no version of the key readable.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "blockhdr.h"
#include "checksum.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_uint_fast64_t tmp_seq;

/* Undoes a failed write: no temporary file, and no old version of the key
 * (the engine has already told its caller the old bytes are gone); where
 * the old file cannot be removed, the block's message says what became
 * of it. */
static void write_failed(kvf__blockfile_dir *dir, kvf__blockfile_io *io, const char *op, int err)
{
    char eb[128];
    if (io->fd >= 0)
        close(io->fd);
    io->fd = -1;
    unlinkat(dir->dir_fd, io->tmp, 0);
    bool emptied;
    char left[PATH_MAX + 160] = "";
    if (kvf__bf_discard_block(dir, io->meta.key, io->name, io->path, &emptied) != KVF_OK)
        snprintf(left, sizeof left, "; %s", kvf_last_error());
    kvf__bf_io_fail(io, kvf__bf_write_errno_status(err), "block " KVF_KEY_FMT ": %s: %s: %s%s",
                    KVF_KEY_ARGS(io->meta.key), io->path, op, kvf__bf_errstr(err, eb, sizeof eb),
                    left);
}

/* Sets up one block's write: header, padding, names, the temporary file
 * opened. false when it failed (io->status says why). */
static bool write_begin(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    const kvf__blockfile_meta *meta = &io->meta;
    char key[KVF_KEY_STR_BYTES];
    kvf_key_format(meta->key, key);
    kvf__bf_block_file_name(meta->key, io->name, sizeof io->name);
    snprintf(io->path, sizeof io->path, "%s/%s", dir->root, io->name);
    size_t pre = kvf__block_prefix_bytes(meta->pools);
    if (meta->payload_bytes > BLOCK_PAYLOAD_MAX || pre + meta->payload_bytes > io->cap) {
        /* a failed write leaves no old version behind, whatever the cause */
        bool emptied;
        kvf__bf_discard_block(dir, meta->key, io->name, io->path, &emptied);
        kvf__bf_io_fail(io, KVF_ERR_RANGE,
                        "block %s: payload of %llu bytes too large (a block holds at most %llu, "
                        "the buffer %zu with the prefix)",
                        key, (unsigned long long)meta->payload_bytes,
                        (unsigned long long)BLOCK_PAYLOAD_MAX, io->cap);
        return false;
    }
    size_t total = pre + (size_t)meta->payload_bytes;
    /* pid and a process-wide sequence: concurrent writers of one key,
     * in this process or another, never share a temporary file */
    snprintf(io->tmp, sizeof io->tmp, ".%s.%ld.%llu.tmp", key, (long)getpid(),
             (unsigned long long)atomic_fetch_add(&tmp_seq, 1));
    snprintf(io->tmp_path, sizeof io->tmp_path, "%s/%s", dir->root, io->tmp);

    kvf__block_header h = {dir->fingerprint, dir->ns_hash,        meta->key, meta->tokens,
                           meta->pools,      meta->payload_bytes, 0};
    /* the aligned image when the buffer has room for it: see
     * blockfile_names.c for the length rule */
    size_t len = round_up_align(total) <= io->cap ? round_up_align(total) : total;
    char what[KVF_KEY_STR_BYTES + 8];
    snprintf(what, sizeof what, "block %s", key);
    kvf_status st;
    if (io->img) {
        /* an image in device memory: each pool checksummed there, the
         * prefix completed on the host; nothing is written yet, so the
         * key's file stays as it was */
        uint8_t *hb = malloc(pre);
        st = hb ? kvf__block_prefix_begin(&h, io->pool_bytes, what, hb)
                : kvf__fail(KVF_ERR_NOMEM, "block %s: out of memory", key);
        for (uint32_t p = 0; st == KVF_OK && p < h.pools; p++) {
            kvf__block_span sp = kvf__block_prefix_span(hb, p);
            uint32_t crc = 0;
            st = io->img->crc(io->img_arg, io->buf + pre + sp.off, (size_t)sp.bytes, &crc);
            kvf__block_prefix_set_crc(hb, p, crc);
        }
        if (st == KVF_OK) {
            kvf__block_prefix_seal(&h, hb);
            st = io->img->put(io->img_arg, io->buf, hb, pre);
        }
        free(hb);
        if (st == KVF_OK)
            st = io->img->put(io->img_arg, io->buf + total, NULL, len - total);
    } else {
        st = kvf__block_prefix_make(&h, io->pool_bytes, io->buf + pre, what, io->buf);
        if (st == KVF_OK)
            memset(io->buf + total, 0, len - total);
    }
    if (st != KVF_OK) {
        kvf__bf_io_fail(io, st, "block %s: %s", key, kvf_last_error());
        return false;
    }
    bool direct = atomic_load_explicit(&dir->direct, memory_order_relaxed) &&
                  buf_aligned(io->buf) && len % KVF_FILE_ALIGN == 0;
    io->fd = kvf__bf_open_spare(dir, io, len, &direct);
    if (io->fd < 0)
        io->fd = kvf__bf_open_file(dir, io->tmp, io->tmp_path,
                                   O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, &direct);
    if (io->fd < 0) {
        write_failed(dir, io, "open", errno);
        return false;
    }
    /* field by field: the rest of the op is the I/O runner's while it runs */
    io->io.fd = io->fd;
    io->io.buf = io->buf;
    io->io.len = io->io.need = len;
    io->io.off = 0;
    io->io.path = io->tmp_path;
    io->io.direct = direct;
    io->io.xfer = io->img ? io->img->xfer : NULL;
    io->io.xfer_arg = io->img_arg;
    return true;
}

/* Closes and renames a written temporary file: the block is stored. */
static bool write_commit(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    int rc = close(io->fd);
    io->fd = -1; /* closed even when close() fails; never retried */
    if (rc != 0) {
        write_failed(dir, io, "close", errno);
        return false;
    }
    if (kvf__bf_rename_in(dir, io->tmp, io->name, io->path) != 0) {
        write_failed(dir, io, "rename", errno);
        return false;
    }
    return true;
}

/* A write finished with no fsync of its own to wait for: committed at
 * once, while the batch's other writes are still in flight. */
/* Just before a block's write: its payload filled in by the caller (a
 * gather from slots, overlapping the writes in flight), then header and
 * temporary file. A failed fill leaves the key's file as it was: nothing
 * was written. */
static bool write_op_start(kvf__fio_op *op)
{
    kvf__blockfile_io *io = kvf__bf_io_of(op);
    if (io->fill) {
        kvf_status st = io->fill(io);
        if (st != KVF_OK) {
            kvf__bf_io_fail(io, st, "%s", kvf_last_error());
            return false;
        }
    }
    return write_begin(io->dir, io);
}

static void write_op_done(kvf__fio_op *op)
{
    kvf__blockfile_io *io = kvf__bf_io_of(op);
    kvf__blockfile_dir *dir = io->dir;
    if (io->status != KVF_OK)
        ; /* failed before its write */
    else if (op->err)
        write_failed(dir, io, "write", op->err);
    else
        write_commit(dir, io);
    kvf__bf_io_finished(io);
}

void kvf__blockfile_write_many(kvf__blockfile_dir *dir, kvf__fileio_runner *fio,
                               kvf__blockfile_io *ios, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ios[i].dir = dir;
        ios[i].fd = -1;
        ios[i].status = KVF_OK;
        ios[i].reported = false;
        ios[i].msg[0] = '\0';
    }
    /* under NONE, and BATCH with syncfs (the batch's one syncfs makes the
     * data durable with the renames), nothing waits between write and
     * rename; otherwise each file is fsynced first, and under BLOCK the
     * directory after the renames */
    bool fsync_files =
        dir->fsync == KVF_FSYNC_BLOCK || (dir->fsync == KVF_FSYNC_BATCH && !dir->use_syncfs);
    if (!fsync_files) {
        kvf__fileio_runner_run(
            fio, kvf__bf_live_ops(ios, n, KVF_FIO_WRITE, write_op_start, write_op_done));
        return;
    }
    kvf__fileio_runner_run(fio, kvf__bf_live_ops(ios, n, KVF_FIO_WRITE, write_op_start, NULL));
    for (size_t i = 0; i < n; i++)
        if (ios[i].status == KVF_OK && ios[i].io.err)
            write_failed(dir, &ios[i], "write", ios[i].io.err);
    kvf__fileio_runner_run(fio, kvf__bf_live_ops(ios, n, KVF_FIO_FSYNC, NULL, NULL));
    size_t renamed = 0;
    for (size_t i = 0; i < n; i++) {
        kvf__blockfile_io *io = &ios[i];
        if (io->status != KVF_OK)
            continue;
        if (io->io.err)
            write_failed(dir, io, "fsync", io->io.err);
        else if (write_commit(dir, io))
            renamed++;
    }
    if (renamed && dir->fsync == KVF_FSYNC_BLOCK &&
        kvf__bf_sync_with(fsync, dir->dir_fd, dir->root) != 0) {
        /* the renames are durable before any of them is reported */
        int err = errno;
        for (size_t i = 0; i < n; i++)
            if (ios[i].status == KVF_OK)
                write_failed(dir, &ios[i], "fsync", err);
    }
    for (size_t i = 0; i < n; i++)
        kvf__bf_io_finished(&ios[i]);
}

kvf_status kvf__blockfile_write(kvf__blockfile_dir *dir, const kvf__blockfile_meta *meta,
                                uint8_t *buf)
{
    if (!dir || !dir->root || !meta || !buf)
        return kvf__fail(KVF_ERR_INVALID, "block file write: NULL argument or directory not open");
    kvf__blockfile_io *io = malloc(sizeof *io);
    if (!io)
        return kvf__fail(KVF_ERR_NOMEM, "block " KVF_KEY_FMT ": out of memory",
                         KVF_KEY_ARGS(meta->key));
    io->meta = *meta;
    io->fill = NULL;
    io->on_done = NULL;
    io->img = NULL;
    io->img_arg = NULL;
    io->pool_bytes = NULL;
    io->buf = buf;
    size_t pre = kvf__block_prefix_bytes(meta->pools);
    io->cap = meta->payload_bytes > SIZE_MAX - pre ? SIZE_MAX : pre + (size_t)meta->payload_bytes;
    kvf__blockfile_write_many(dir, dir->fio, io, 1);
    kvf_status st = io->status;
    free(io);
    return st;
}
