/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The file store: block files (blockfile.c) behind the store ops, their
 * system calls in flight together through the fileio runner; on the
 * GPUDirect Storage path blocks may be device memory (device_staging).
 * Local I/O has no deadline: calls ignore deadline_ns.
 */
#include "blockfile.h"
#include "blockfile_private.h"
#include "log.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HDR KVF_BLOCK_HEADER_BYTES

typedef struct file_store {
    kvf__store base;
    kvf__blockfile_dir *dir;
    kvf__blockfile_dir owned; /* the directory, when the store opened it */
    kvf__fileio_runner *fio;
    bool gds;
} file_store;

static size_t aligned(size_t n)
{
    return (n + KVF_FILE_ALIGN - 1) / KVF_FILE_ALIGN * KVF_FILE_ALIGN;
}

static kvf_status out_of_memory(file_store *s, kvf__store_block *blocks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvf__store_block_fail(&blocks[i], KVF_ERR_NOMEM, "block " KVF_KEY_FMT ": %s: out of memory",
                              KVF_KEY_ARGS(blocks[i].key), s->dir->root);
    return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", s->dir->root);
}

/* The blockfile view of blocks[0..n): each a host image (header room, the
 * payload, O_DIRECT padding) of its own, or, for device blocks, the
 * caller's image itself. `payload` copies the caller's payloads in. */
static kvf__blockfile_io *ios_of(kvf__store_block *blocks, size_t n, bool payload)
{
    kvf__blockfile_io *ios = calloc(n, sizeof *ios);
    for (size_t i = 0; ios && i < n; i++) {
        kvf__store_block *b = &blocks[i];
        kvf__blockfile_io *io = &ios[i];
        io->meta = (kvf__blockfile_meta){b->key, b->tokens, b->pools, b->payload_bytes};
        if (b->img) {
            io->buf = b->buf;
            io->cap = b->cap;
            io->img = b->img;
            io->img_arg = b->img_arg;
            continue;
        }
        io->cap = aligned(HDR + (payload ? b->payload_bytes : b->cap));
        io->buf = aligned_alloc(KVF_FILE_ALIGN, io->cap);
        if (!io->buf) {
            while (i--)
                if (!blocks[i].img)
                    free(ios[i].buf);
            free(ios);
            return NULL;
        }
        if (payload) {
            memcpy(io->buf + HDR, b->buf, b->payload_bytes);
            memset(io->buf + HDR + b->payload_bytes, 0, io->cap - HDR - b->payload_bytes);
        }
    }
    return ios;
}

static void ios_free(kvf__store_block *blocks, kvf__blockfile_io *ios, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!blocks[i].img)
            free(ios[i].buf);
    free(ios);
}

static void take_result(kvf__store_block *b, const kvf__blockfile_io *io)
{
    b->status = io->status;
    b->msg[0] = '\0';
    if (io->status != KVF_OK)
        snprintf(b->msg, sizeof b->msg, "%s", io->msg);
}

static kvf_status file_write(kvf__store *base, kvf__store_block *blocks, size_t n,
                             uint64_t deadline_ns)
{
    (void)deadline_ns;
    file_store *s = (file_store *)base;
    kvf__blockfile_io *ios = ios_of(blocks, n, true);
    if (!ios)
        return out_of_memory(s, blocks, n);
    kvf__blockfile_write_many(s->dir, s->fio, ios, n);
    for (size_t i = 0; i < n; i++)
        take_result(&blocks[i], &ios[i]);
    ios_free(blocks, ios, n);
    return kvf__store_first_failure(blocks, n, false);
}

static kvf_status file_read(kvf__store *base, kvf__store_block *blocks, size_t n,
                            uint64_t deadline_ns)
{
    (void)deadline_ns;
    file_store *s = (file_store *)base;
    kvf__blockfile_io *ios = ios_of(blocks, n, false);
    if (!ios)
        return out_of_memory(s, blocks, n);
    kvf__blockfile_read_many(s->dir, s->fio, ios, n);
    for (size_t i = 0; i < n; i++) {
        kvf__store_block *b = &blocks[i];
        take_result(b, &ios[i]);
        if (b->status != KVF_OK)
            continue;
        const kvf__blockfile_meta *m = &ios[i].meta;
        if (!b->img && m->payload_bytes > b->cap) {
            kvf__store_block_fail(
                b, KVF_ERR_RANGE, "block " KVF_KEY_FMT ": %s: %llu bytes, buffer of %zu",
                KVF_KEY_ARGS(b->key), s->dir->root, (unsigned long long)m->payload_bytes, b->cap);
            continue;
        }
        if (!b->img)
            memcpy(b->buf, ios[i].buf + HDR, m->payload_bytes);
        b->tokens = m->tokens;
        b->pools = m->pools;
        b->payload_bytes = m->payload_bytes;
    }
    ios_free(blocks, ios, n);
    return kvf__store_first_failure(blocks, n, true);
}

static kvf_status file_remove(kvf__store *base, kvf__store_block *blocks, size_t n,
                              uint64_t deadline_ns)
{
    (void)deadline_ns;
    file_store *s = (file_store *)base;
    for (size_t i = 0; i < n; i++) {
        blocks[i].msg[0] = '\0';
        blocks[i].status = kvf__blockfile_remove(s->dir, blocks[i].key);
        if (blocks[i].status != KVF_OK)
            snprintf(blocks[i].msg, sizeof blocks[i].msg, "%s", kvf_last_error());
    }
    return kvf__store_first_failure(blocks, n, false);
}

static kvf_status file_exists(kvf__store *base, kvf__store_block *blocks, size_t n,
                              uint64_t deadline_ns)
{
    (void)deadline_ns;
    file_store *s = (file_store *)base;
    for (size_t i = 0; i < n; i++) {
        kvf__store_block *b = &blocks[i];
        char name[NAME_MAX_BYTES];
        kvf__bf_block_file_name(b->key, name, sizeof name);
        struct stat sb;
        b->msg[0] = '\0';
        if (fstatat(s->dir->dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            b->status = S_ISREG(sb.st_mode) && sb.st_size > 0 ? KVF_OK : KVF_ERR_NOT_FOUND;
        else if (errno == ENOENT)
            b->status = KVF_ERR_NOT_FOUND;
        else
            kvf__store_block_fail(b, kvf__errno_status(errno),
                                  "block " KVF_KEY_FMT ": %s/%s: stat: %s", KVF_KEY_ARGS(b->key),
                                  s->dir->root, name, strerror(errno));
    }
    return kvf__store_first_failure(blocks, n, true);
}

typedef struct list_arg {
    kvf__store_visit_fn visit;
    void *arg;
} list_arg;

static void list_visit(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns)
{
    list_arg *la = arg;
    kvf__store_entry ent = {meta->key, meta->tokens, meta->pools, meta->payload_bytes, mtime_ns};
    la->visit(la->arg, &ent);
}

static kvf_status file_list(kvf__store *base, kvf__store_visit_fn visit, void *arg)
{
    list_arg la = {visit, arg};
    return kvf__blockfile_list(((file_store *)base)->dir, list_visit, &la);
}

static kvf_status file_commit(kvf__store *base)
{
    return kvf__blockfile_fsync_dir(((file_store *)base)->dir);
}

static kvf_status file_discard(kvf__store *base, kvf_key key, bool *emptied_p)
{
    return kvf__blockfile_discard(((file_store *)base)->dir, key, emptied_p);
}

static bool file_device_staging(const kvf__store *base)
{
    return ((const file_store *)base)->gds;
}

static void file_close(kvf__store *base)
{
    file_store *s = (file_store *)base;
    if (s->dir == &s->owned)
        kvf__blockfile_close_dir(&s->owned);
    free(base->where);
    free(s);
}

static const kvf__store_ops file_ops = {
    .write = file_write,
    .read = file_read,
    .remove = file_remove,
    .exists = file_exists,
    .list = file_list,
    .commit = file_commit,
    .discard = file_discard,
    .device_staging = file_device_staging,
    .close = file_close,
};

static file_store *file_store_new(const char *where)
{
    file_store *s = calloc(1, sizeof *s);
    if (s && !(s->base.where = strdup(where))) {
        free(s);
        s = NULL;
    }
    if (!s)
        return NULL;
    s->base.ops = &file_ops;
    s->base.kind = "file";
    s->base.noun = "block";
    return s;
}

kvf_status kvf__file_store_wrap(kvf__blockfile_dir *dir, kvf__fileio_runner *fio, bool gds,
                                kvf__store **store_p)
{
    if (!dir || !dir->root || !store_p)
        return kvf__fail(KVF_ERR_INVALID, "file store: directory not open");
    file_store *s = file_store_new(dir->root);
    if (!s)
        return kvf__fail(KVF_ERR_NOMEM, "file store %s: out of memory", dir->root);
    s->dir = dir;
    s->fio = fio;
    s->gds = gds;
    *store_p = &s->base;
    return KVF_OK;
}

static kvf_status file_check_url(const char *url)
{
    if (!url || strncmp(url, "file://", 7) != 0 || url[7] != '/')
        return kvf__fail(KVF_ERR_INVALID, "\"%s\": a file store's URL is file:///DIRECTORY",
                         url ? url : "(null)");
    return KVF_OK;
}

/* file:///DIR: block files under DIR/<namespace>, written inline, synced
 * per file (the engine's file tier opens its own directory instead, with
 * its runner and fsync policy, and wraps it). */
static kvf_status file_open(const kvf__store_config *cfg, kvf__store **store_p)
{
    kvf_status st = file_check_url(cfg->url);
    if (st != KVF_OK)
        return st;
    file_store *s = file_store_new(cfg->url);
    if (!s)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", cfg->url);
    st = kvf__blockfile_open_dir(cfg->url + 7, cfg->ns, cfg->fingerprint, KVF_FSYNC_BLOCK,
                                 &s->owned);
    if (st != KVF_OK) {
        free(s->base.where);
        free(s);
        return st;
    }
    s->dir = &s->owned;
    *store_p = &s->base;
    return KVF_OK;
}

static void file_describe(char *line, size_t cap)
{
    snprintf(line, cap, "block files under a directory (the disk tier)");
}

static const char *const file_schemes[] = {"file", NULL};

const kvf__store_kind kvf__file_store_kind = {
    .name = "file",
    .schemes = file_schemes,
    .describe = file_describe,
    .check_url = file_check_url,
    .open = file_open,
};
