/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading blocks. The fast reader (read_begin, read_end) reads a whole
 * file in one call of a batch and checks it after; the careful reader
 * (kvf__bf_read_block) reads the header first and sizes everything from
 * it once checked: for files whose size is wrong for the buffer, and for
 * fsck. Either checks header, layout, namespace, length, padding and
 * checksum before a block is handed back.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "blockhdr.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Linux moves at most 0x7ffff000 bytes per call; stay below it. */
#define IO_CHUNK ((size_t)1 << 30)

/* Reads n bytes at offset off into p. 0: all read; -1: a failed call,
 * errno set; 1: end of file after *got bytes. */
static int read_full(int fd, const char *path, uint8_t *p, size_t n, uint64_t off, size_t *got)
{
    size_t done = 0;
    while (done < n) {
        size_t len = n - done < IO_CHUNK ? n - done : IO_CHUNK;
        int err = kvf__io_fault("read", path, &len);
        ssize_t r;
        if (err) {
            errno = err;
            r = -1;
        } else {
            r = pread(fd, p + done, len, (off_t)(off + done));
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            *got = done;
            return -1;
        }
        if (r == 0) {
            *got = done;
            return 1;
        }
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

/* Closes a descriptor, reporting a failure unless one is already being
 * returned: a read-only descriptor has nothing to flush, but a failing
 * close still says the file system is in trouble. */
kvf_status kvf__bf_close_read_fd(int fd, kvf_status st, const char *key, const char *path)
{
    char eb[128];
    /* Linux releases the descriptor even when close fails (EINTR too):
     * never retried */
    if (close(fd) != 0 && st == KVF_OK && errno != EINTR) {
        int err = errno;
        st = kvf__fail(kvf__errno_status(err), "block %s: %s: close: %s", key, path,
                       kvf__bf_errstr(err, eb, sizeof eb));
    }
    return st;
}

/* The careful reader's open: a missing file is KVF_ERR_NOT_FOUND, a
 * foreign one KVF_ERR_CORRUPT (and left alone). */
static kvf_status careful_open(kvf__blockfile_dir *dir, const char *key, const char *name,
                               const char *path, struct stat *sb, int *fd_p)
{
    char eb[128];
    mode_t foreign;
    bool direct = false;
    int fd = kvf__bf_open_block(dir, name, path, &direct, sb, &foreign);
    if (fd < 0) {
        int err = errno;
        if (foreign)
            return kvf__fail(KVF_ERR_CORRUPT,
                             "block %s: %s: %s, not a block file (foreign: left alone)", key, path,
                             kvf__bf_file_kind(foreign));
        if (err == ENOENT)
            return kvf__fail(KVF_ERR_NOT_FOUND, "block %s: %s: not stored", key, path);
        return kvf__fail(kvf__errno_status(err), "block %s: %s: open: %s", key, path,
                         kvf__bf_errstr(err, eb, sizeof eb));
    }
    *fd_p = fd;
    return KVF_OK;
}

/* Reads the header of a file of `size` bytes into h and checks it (layout
 * too unless any_layout) and the file's length against it. */
static kvf_status careful_header(kvf__blockfile_dir *dir, int fd, const char *path, kvf_key key_in,
                                 uint64_t size, bool any_layout, const char *what, uint8_t *h,
                                 kvf__block_header *bh)
{
    char eb[128], key[KVF_KEY_STR_BYTES];
    kvf_key_format(key_in, key);
    if (size < HDR)
        return kvf__fail(KVF_ERR_CORRUPT,
                         "block %s: %s: truncated: %llu bytes, less than the %u-byte header", key,
                         path, (unsigned long long)size, HDR);
    size_t got;
    int r = read_full(fd, path, h, HDR, 0, &got);
    if (r < 0) {
        int err = errno;
        return kvf__fail(kvf__errno_status(err), "block %s: %s: read: %s", key, path,
                         kvf__bf_errstr(err, eb, sizeof eb));
    }
    if (r > 0)
        return kvf__fail(KVF_ERR_CORRUPT, "block %s: %s: truncated: short read, %zu of %u bytes",
                         key, path, got, HDR);
    kvf_status st = kvf__block_header_parse(h, what, bh);
    if (st == KVF_OK)
        st = kvf__block_header_expect(bh, what, any_layout ? 0 : dir->fingerprint, dir->ns_hash,
                                      key_in);
    if (st == KVF_OK)
        st = kvf__bf_check_file_size(size, (uint32_t)kvf__block_prefix_bytes(bh->pools),
                                     bh->payload_bytes, what);
    return st;
}

/* Makes *buf_p hold prefix and payload: with `grow`, reallocated when too
 * small; without it, the block not fitting is KVF_ERR_RANGE. */
static kvf_status careful_fit(const char *key, const char *path, size_t pre, uint64_t payload,
                              uint64_t size, bool grow, uint8_t **buf_p, size_t *cap_p)
{
    /* payload <= st_size - pre: pre + payload fits an off_t, hence a size_t
     * on the 64-bit systems this runs on */
    if (payload > SIZE_MAX - pre)
        return kvf__fail(KVF_ERR_RANGE, "block %s: %s: %llu bytes do not fit in memory", key, path,
                         (unsigned long long)size);
    size_t need = pre + (size_t)payload;
    if (need <= *cap_p)
        return KVF_OK;
    if (!grow)
        return kvf__fail(KVF_ERR_RANGE,
                         "block %s: %s: block of %zu bytes does not fit a %zu-byte buffer", key,
                         path, need, *cap_p);
    uint8_t *nb = realloc(*buf_p, need);
    if (!nb)
        return kvf__fail(KVF_ERR_NOMEM, "block %s: %s: out of memory for %zu bytes", key, path,
                         need);
    *buf_p = nb;
    *cap_p = need;
    return KVF_OK;
}

/* Reads pool table and payload after the checked header (already at buf)
 * and checks them, then the padding after them, if any. */
static kvf_status careful_payload(int fd, const char *path, const char *key, uint64_t size,
                                  const kvf__block_header *bh, const char *what, uint8_t *buf)
{
    char eb[128];
    uint64_t payload = bh->payload_bytes;
    size_t pre = kvf__block_prefix_bytes(bh->pools), got;
    int r = read_full(fd, path, buf + HDR, pre - HDR + (size_t)payload, HDR, &got);
    if (r < 0) {
        int err = errno;
        return kvf__fail(kvf__errno_status(err), "block %s: %s: read: %s", key, path,
                         kvf__bf_errstr(err, eb, sizeof eb));
    }
    if (r > 0)
        /* the file shrank after fstat: never hand back the bytes not read */
        return kvf__fail(KVF_ERR_CORRUPT, "block %s: %s: truncated: short read, %llu of %llu bytes",
                         key, path, (unsigned long long)(HDR + got), (unsigned long long)size);
    kvf_status st = kvf__block_table_check(bh, buf, what);
    if (st == KVF_OK)
        st = kvf__block_pools_check(bh, buf, what, buf + pre);
    if (st != KVF_OK || size <= pre + payload)
        return st;
    uint8_t pad[KVF_FILE_ALIGN];
    size_t npad = (size_t)(size - pre - payload);
    r = read_full(fd, path, pad, npad, pre + payload, &got);
    if (r != 0) {
        int err = errno;
        return r < 0 ? kvf__fail(kvf__errno_status(err), "%s: read: %s", what,
                                 kvf__bf_errstr(err, eb, sizeof eb))
                     : kvf__fail(KVF_ERR_CORRUPT, "%s: truncated: short read in the padding", what);
    }
    return kvf__bf_check_padding(pad, npad, what);
}

/* Reads and checks the block under key_in into *buf_p (*cap_p bytes). With
 * `grow`, a buffer too small is reallocated to fit, once the header has been
 * checked (so a damaged length never sizes an allocation); without it, the
 * block not fitting is KVF_ERR_RANGE. any_layout: for fsck, which checks
 * files without knowing their layout. */
kvf_status kvf__bf_read_block(kvf__blockfile_dir *dir, kvf_key key_in, uint8_t **buf_p,
                              size_t *cap_p, bool grow, kvf__blockfile_meta *meta, bool any_layout)
{
    char key[KVF_KEY_STR_BYTES];
    kvf_key_format(key_in, key);
    char name[NAME_MAX_BYTES], path[PATH_MAX];
    kvf__bf_block_file_name(key_in, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir->root, name);

    struct stat sb;
    int fd = -1;
    kvf_status st = careful_open(dir, key, name, path, &sb, &fd);
    if (st != KVF_OK)
        return st;
    uint64_t size = (uint64_t)sb.st_size;
    char what[PATH_MAX + 48];
    snprintf(what, sizeof what, "block %s: %s", key, path);

    /* the header goes to the stack first: the caller's buffer is sized
     * only once the header has been checked */
    uint8_t h[HDR];
    kvf__block_header bh;
    st = careful_header(dir, fd, path, key_in, size, any_layout, what, h, &bh);
    if (st == KVF_OK)
        st = careful_fit(key, path, kvf__block_prefix_bytes(bh.pools), bh.payload_bytes, size, grow,
                         buf_p, cap_p);
    if (st == KVF_OK) {
        memcpy(*buf_p, h, HDR);
        st = careful_payload(fd, path, key, size, &bh, what, *buf_p);
    }
    if (st == KVF_OK && meta) {
        meta->key = key_in;
        meta->tokens = bh.tokens;
        meta->pools = bh.pools;
        meta->payload_bytes = bh.payload_bytes;
    }
    return kvf__bf_close_read_fd(fd, st, key, path);
}

bool kvf__bf_read_begin(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    char eb[128], key[KVF_KEY_STR_BYTES];
    kvf_key_format(io->meta.key, key);
    io->fd = -1;
    io->status = KVF_OK;
    io->reported = false;
    io->slow = false;
    io->msg[0] = '\0';
    kvf__bf_block_file_name(io->meta.key, io->name, sizeof io->name);
    snprintf(io->path, sizeof io->path, "%s/%s", dir->root, io->name);
    bool direct = atomic_load_explicit(&dir->direct, memory_order_relaxed) &&
                  buf_aligned(io->buf) && io->cap >= KVF_FILE_ALIGN;
    struct stat sb;
    mode_t foreign;
    io->fd = kvf__bf_open_block(dir, io->name, io->path, &direct, &sb, &foreign);
    if (io->fd < 0) {
        int err = errno;
        if (foreign)
            kvf__bf_io_fail(io, KVF_ERR_CORRUPT,
                            "block %s: %s: %s, not a block file (foreign: left alone)", key,
                            io->path, kvf__bf_file_kind(foreign));
        else if (err == ENOENT)
            kvf__bf_io_fail(io, KVF_ERR_NOT_FOUND, "block %s: %s: not stored", key, io->path);
        else
            kvf__bf_io_fail(io, kvf__errno_status(err), "block %s: %s: open: %s", key, io->path,
                            kvf__bf_errstr(err, eb, sizeof eb));
        return false;
    }
    if (sb.st_size < (off_t)HDR || (uint64_t)sb.st_size > io->cap) {
        /* the careful reader says what is wrong, header first */
        close(io->fd);
        io->fd = -1;
        io->slow = true;
        return false;
    }
    io->size = (size_t)sb.st_size;
    size_t len = round_up_align(io->size);
    if (!direct || len > io->cap)
        len = io->size; /* unaligned: the runner drops O_DIRECT for it */
    io->io.fd = io->fd;
    io->io.buf = io->buf;
    io->io.len = len;
    io->io.need = io->size;
    io->io.off = 0;
    io->io.path = io->path;
    io->io.direct = direct;
    io->io.xfer = io->img ? io->img->xfer : NULL;
    io->io.xfer_arg = io->img_arg;
    return true;
}

kvf_status kvf__bf_image_check(const kvf__blockfile_io *io, const kvf__block_header *bh,
                               const uint8_t *table, uint32_t first, uint32_t last,
                               const char *what)
{
    size_t pre = kvf__block_prefix_bytes(bh->pools);
    const uint8_t *prefix = table ? table : io->buf;
    uint8_t *copy = NULL;
    kvf_status st = KVF_OK;
    if (io->img && !table) {
        if (!(copy = malloc(pre)))
            return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for the pool table", what);
        st = io->img->get(io->img_arg, io->buf, copy, pre);
        prefix = copy;
    }
    if (st == KVF_OK && first == 0)
        st = kvf__block_table_check(bh, prefix, what);
    for (uint32_t p = first; st == KVF_OK && p < last; p++) {
        kvf__block_span sp = kvf__block_prefix_span(prefix, p);
        const uint8_t *seg = io->buf + pre + sp.off;
        if (!io->img) {
            st = kvf__block_pool_check(prefix, p, what, seg);
            continue;
        }
        uint32_t crc = 0;
        st = io->img->crc(io->img_arg, seg, (size_t)sp.bytes, &crc);
        if (st == KVF_OK)
            st = kvf__block_pool_crc_check(prefix, p, what, crc);
    }
    /* the padding once the last pool is in */
    size_t end = pre + (size_t)bh->payload_bytes, npad = io->size > end ? io->size - end : 0;
    uint8_t pad[KVF_FILE_ALIGN];
    if (st == KVF_OK && last == bh->pools && npad) {
        if (io->img)
            st = io->img->get(io->img_arg, io->buf + end, pad, npad);
        if (st == KVF_OK)
            st = kvf__bf_check_padding(io->img ? pad : io->buf + end, npad, what);
    }
    free(copy);
    return st;
}

/* Checks what kvf__bf_read_begin's read brought in. */
static void read_end(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    char eb[128], key[KVF_KEY_STR_BYTES];
    kvf_key_format(io->meta.key, key);
    char what[PATH_MAX + 48];
    snprintf(what, sizeof what, "block %s: %s", key, io->path);
    kvf__block_header bh;
    kvf_status st = KVF_OK;
    if (io->io.err) {
        int err = io->io.err;
        kvf__bf_io_fail(io, kvf__errno_status(err), "%s: read: %s", what,
                        kvf__bf_errstr(err, eb, sizeof eb));
        return;
    }
    if (io->io.done < io->size) {
        /* the file shrank after fstat: never hand back the bytes not read */
        kvf__bf_io_fail(io, KVF_ERR_CORRUPT, "%s: truncated: short read, %zu of %zu bytes", what,
                        io->io.done, io->size);
        return;
    }
    /* an image in device memory: prefix and padding come to the host,
     * the pools are checksummed where they are */
    uint8_t hb[HDR];
    const uint8_t *hdr = io->buf;
    if (io->img) {
        st = io->img->get(io->img_arg, io->buf, hb, HDR);
        hdr = hb;
    }
    if (st == KVF_OK)
        st = kvf__block_header_parse(hdr, what, &bh);
    if (st == KVF_OK)
        st = kvf__block_header_expect(&bh, what, dir->fingerprint, dir->ns_hash, io->meta.key);
    size_t pre = st == KVF_OK ? kvf__block_prefix_bytes(bh.pools) : 0;
    if (st == KVF_OK)
        st = kvf__bf_check_file_size(io->size, (uint32_t)pre, bh.payload_bytes, what);
    if (st == KVF_OK)
        st = kvf__bf_image_check(io, &bh, NULL, 0, bh.pools, what);
    if (st != KVF_OK) {
        kvf__bf_io_fail(io, st, "%s", kvf_last_error());
        return;
    }
    io->meta.tokens = bh.tokens;
    io->meta.pools = bh.pools;
    io->meta.payload_bytes = bh.payload_bytes;
}

/* A read finished: checked, closed and reported while the batch's other
 * reads are still in flight. */
static void read_op_done(kvf__fio_op *op)
{
    kvf__blockfile_io *io = kvf__bf_io_of(op);
    read_end(io->dir, io);
    char key[KVF_KEY_STR_BYTES];
    kvf_status st =
        kvf__bf_close_read_fd(io->fd, io->status, kvf_key_format(io->meta.key, key), io->path);
    io->fd = -1;
    if (st != io->status)
        kvf__bf_io_fail(io, st, "%s", kvf_last_error());
    kvf__bf_io_finished(io);
}

void kvf__bf_read_slow(kvf__blockfile_dir *dir, kvf__blockfile_io *io)
{
    /* an image in device memory is read on the host first */
    uint8_t *buf = io->img ? malloc(io->cap) : io->buf;
    size_t cap = io->cap;
    kvf__blockfile_meta m;
    kvf_status st = buf ? kvf__bf_read_block(dir, io->meta.key, &buf, &cap, false, &m, false)
                        : kvf__fail(KVF_ERR_NOMEM, "block " KVF_KEY_FMT ": out of memory",
                                    KVF_KEY_ARGS(io->meta.key));
    if (st == KVF_OK && io->img)
        st = io->img->put(io->img_arg, io->buf, buf,
                          kvf__block_prefix_bytes(m.pools) + (size_t)m.payload_bytes);
    if (io->img)
        free(buf);
    if (st == KVF_OK)
        io->meta = m;
    else
        kvf__bf_io_fail(io, st, "%s", kvf_last_error());
}

void kvf__blockfile_read_many(kvf__blockfile_dir *dir, kvf__fileio_runner *fio,
                              kvf__blockfile_io *ios, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ios[i].dir = dir;
        if (kvf__bf_read_begin(dir, &ios[i]))
            continue;
        if (ios[i].slow)
            kvf__bf_read_slow(dir, &ios[i]);
        kvf__bf_io_finished(&ios[i]);
        /* out of the list below */
        if (ios[i].status == KVF_OK)
            ios[i].status = KVF_INPROGRESS;
    }
    kvf__fileio_runner_run(fio, kvf__bf_live_ops(ios, n, KVF_FIO_READ, NULL, read_op_done));
    for (size_t i = 0; i < n; i++)
        if (ios[i].status == KVF_INPROGRESS)
            ios[i].status = KVF_OK;
}

kvf_status kvf__blockfile_read(kvf__blockfile_dir *dir, kvf_key key, uint8_t *buf, size_t cap,
                               kvf__blockfile_meta *meta)
{
    if (!dir || !dir->root || !buf)
        return kvf__fail(KVF_ERR_INVALID, "block file read: NULL argument or directory not open");
    kvf__blockfile_io *io = malloc(sizeof *io);
    if (!io)
        return kvf__fail(KVF_ERR_NOMEM, "block " KVF_KEY_FMT ": out of memory", KVF_KEY_ARGS(key));
    io->meta.key = key;
    io->on_done = NULL;
    io->img = NULL;
    io->img_arg = NULL;
    io->pool_bytes = NULL;
    io->buf = buf;
    io->cap = cap;
    kvf__blockfile_read_many(dir, dir->fio, io, 1);
    kvf_status st = io->status;
    /* set only on success */
    if (st == KVF_OK && meta)
        *meta = io->meta;
    free(io);
    return st;
}
