/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A block directory seen from outside an engine (kvf_dir_check,
 * kvf_dir_list, kvf_dir_namespaces): what fsck, stats and a user's own
 * tooling ask of it. Reads only, through blockfile_read.c's reader, so a block
 * is judged here exactly as an engine's read would judge it; what this
 * file adds is naming each entry's kind from the file itself (its type,
 * its name), never from a message's text.
 */
#include "blockfile.h"
#include "blockfile_private.h"
#include "dir_walk.h"
#include "layout.h"
#include "status.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HDR KVF_BLOCK_HEADER_BYTES

const char *kvf_dir_entry_kind_name(kvf_dir_entry_kind kind)
{
    static const char *const names[] = {"good",    "corrupt",    "torn",      "mismatch",
                                        "foreign", "unreadable", "old-format"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "?";
}

/* Opens <dir>/<ns> for reading with the layout of `g` (NULL: any), without
 * creating it (kvf__blockfile_open_dir would). */
kvf_status kvf__dir_open_namespace(const char *dir, const char *ns, const kvf_geometry *g,
                                   size_t n_pools, kvf__blockfile_dir *d)
{
    memset(d, 0, sizeof *d);
    d->dir_fd = -1;
    if (!dir || !*dir || !ns || (n_pools && !g) || (!n_pools && g))
        return kvf__fail(KVF_ERR_INVALID, "block directory: NULL directory or namespace, or "
                                          "geometries and their count disagree");
    if (!kvf__ns_valid(ns))
        return kvf__fail(KVF_ERR_INVALID, "%s: namespace '%s' is not [A-Za-z0-9._-]{1,64}", dir,
                         ns);
    for (size_t p = 0; p < n_pools; p++)
        if (kvf_geometry_check(&g[p]) != KVF_OK)
            return kvf__fail(KVF_ERR_INVALID, "%s/%s: pool %zu: %s", dir, ns, p, kvf_last_error());
    char path[PATH_MAX];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, ns);
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kvf__fail(KVF_ERR_NOT_FOUND, "%s: no such block directory", path);
    uint64_t fingerprint = n_pools ? kvf__geometry_fingerprint(g, n_pools) : 0;
    kvf_status st = kvf__blockfile_open_dir(dir, ns, fingerprint, KVF_FSYNC_NONE, d);
    /* buffered reads: no alignment asked of the buffers here */
    if (st == KVF_OK)
        atomic_store(&d->direct, false);
    return st;
}

/* A walk of the namespace on a description of its own (readdir moves the
 * offset of the one it reads). */
kvf_status kvf__dir_open_walk(const kvf__blockfile_dir *d, DIR **w_p)
{
    int fd = openat(d->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *w = fd >= 0 ? fdopendir(fd) : NULL;
    if (!w) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return kvf__fail(kvf__errno_status(err), "%s: opendir: %s", d->root, strerror(err));
    }
    *w_p = w;
    return KVF_OK;
}

/* The next name, NULL at the end; a readdir failure in *st_p. */
const char *kvf__dir_walk_next(const kvf__blockfile_dir *d, DIR *w, kvf_status *st_p)
{
    errno = 0;
    struct dirent *e = readdir(w);
    if (!e && errno) {
        int err = errno;
        *st_p = kvf__fail(kvf__errno_status(err), "%s: readdir: %s", d->root, strerror(err));
    }
    return e ? e->d_name : NULL;
}

/* The most payload a block may claim before anything is read: with the
 * engine's geometries, a slot of every pool (no block of that layout holds
 * more); without them, a bound no model's block reaches (256 tokens of a
 * 405B-parameter model in fp32 are under it). A longer claim in a header
 * whose checksum holds is no reason to allocate and read gigabytes of a
 * sparse file: it is refused from the header alone. */
#define ANY_LAYOUT_MAX_PAYLOAD (256ull << 20)

static kvf_status largest_block(const kvf_geometry *g, size_t n_pools, uint64_t *max_p)
{
    uint64_t sum = n_pools ? 0 : ANY_LAYOUT_MAX_PAYLOAD;
    for (size_t p = 0; p < n_pools; p++) {
        size_t bytes;
        kvf_status st = kvf_geometry_block_bytes(&g[p], &bytes);
        if (st != KVF_OK)
            return st;
        if (__builtin_add_overflow(sum, (uint64_t)bytes, &sum))
            return kvf__fail(KVF_ERR_RANGE, "geometries: a block of %zu pools overflows", n_pools);
    }
    *max_p = sum;
    return KVF_OK;
}

typedef struct check_walk {
    kvf__blockfile_dir *d;
    uint8_t *buf;
    size_t cap;
    uint64_t max_payload; /* largest_block's */
    bool any_layout;
    bool v2; /* the block block_room looked at is of format version 2 */
    char msg[PATH_MAX + 256];
} check_walk;

/* Room for the block in `name`: the length its header gives, when the
 * header reads and checks (so a damaged length never sizes a buffer);
 * else room for a header only, enough for the reader to say what is
 * wrong. Opened without blocking and without following a link.
 * KVF_ERR_CORRUPT / KVF_ERR_RANGE (w->msg the reason) when the header
 * claims more than w->max_payload. */
static kvf_status block_room(check_walk *w, const char *name, kvf_key key, size_t *room_p)
{
    size_t room = HDR;
    int fd = openat(w->d->dir_fd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    struct stat sb;
    uint8_t h[HDR];
    kvf__block_header bh;
    bool got = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && pread(fd, h, HDR, 0) == HDR;
    bool parsed = got && kvf__block_header_parse(h, name, &bh) == KVF_OK &&
                  bh.payload_bytes <= SIZE_MAX - KVF_BLOCK_PREFIX_MAX &&
                  bh.payload_bytes <= (uint64_t)sb.st_size;
    if (fd >= 0)
        close(fd);
    kvf__clear_error();
    /* a block of format version 2 (the header names it) is one to upgrade */
    w->v2 = got && !parsed && kvf__block_header_parse_v2(h, name, &bh) == KVF_OK;
    kvf__clear_error();
    /* another layout's block is the reader's to name (a mismatch) */
    if (parsed && (w->any_layout || bh.fingerprint == w->d->fingerprint)) {
        if (bh.payload_bytes > w->max_payload) {
            snprintf(w->msg, sizeof w->msg,
                     "block " KVF_KEY_FMT
                     ": %s/%s: header claims %llu payload bytes, more than %s (%llu); "
                     "not read",
                     KVF_KEY_ARGS(key), w->d->root, name, (unsigned long long)bh.payload_bytes,
                     w->any_layout ? "a block of any layout is checked to"
                                   : "a block of this layout holds",
                     (unsigned long long)w->max_payload);
            /* the layout known, no block of it is that long: the header
             * lies; unknown, the block is left unchecked */
            return w->any_layout ? KVF_ERR_RANGE : KVF_ERR_CORRUPT;
        }
        room = kvf__block_prefix_bytes(bh.pools) + (size_t)bh.payload_bytes;
    }
    *room_p = room;
    return KVF_OK;
}

/* Reads the block file `name` as an engine would and fills *e; false when
 * there is nothing to report (the file was removed since readdir). */
static bool check_block(check_walk *w, const char *name, kvf_key key, kvf_dir_entry *e)
{
    size_t room = 0;
    kvf_status claim = block_room(w, name, key, &room);
    if (claim != KVF_OK) {
        e->status = claim;
        e->kind = claim == KVF_ERR_RANGE ? KVF_DIR_ENTRY_UNREADABLE : KVF_DIR_ENTRY_CORRUPT;
        e->message = w->msg;
        return true;
    }
    if (room > w->cap) {
        uint8_t *nb = realloc(w->buf, room);
        if (nb) {
            w->buf = nb;
            w->cap = room;
        }
    }
    kvf__blockfile_meta meta;
    kvf_status st =
        w->cap >= room
            ? kvf__blockfile_read(w->d, key, w->buf, w->cap, &meta)
            : kvf__fail(KVF_ERR_NOMEM, "block " KVF_KEY_FMT ": %s/%s: no memory for %zu bytes",
                        KVF_KEY_ARGS(key), w->d->root, name, room);
    if (st == KVF_ERR_NOT_FOUND)
        return false;
    e->status = st;
    if (st == KVF_OK) {
        e->kind = KVF_DIR_ENTRY_GOOD;
        e->message = "ok";
        e->tokens = meta.tokens;
        e->pools = meta.pools;
        e->payload_bytes = meta.payload_bytes;
        return true;
    }
    snprintf(w->msg, sizeof w->msg, "%s", kvf_last_error());
    e->message = w->msg;
    struct stat sb;
    if (fstatat(w->d->dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(sb.st_mode))
        e->kind = KVF_DIR_ENTRY_FOREIGN;
    else if (st == KVF_ERR_MISMATCH && w->v2)
        e->kind = KVF_DIR_ENTRY_OLD_FORMAT;
    else if (st == KVF_ERR_MISMATCH)
        e->kind = KVF_DIR_ENTRY_MISMATCH;
    else if (!kvf__status_condemns_block(st))
        e->kind = KVF_DIR_ENTRY_UNREADABLE;
    else
        e->kind = KVF_DIR_ENTRY_CORRUPT;
    return true;
}

void kvf__dir_count_entry(kvf_dir_counts *c, kvf_dir_entry_kind kind)
{
    uint64_t *slot[] = {&c->good,    &c->corrupt,    &c->torn,      &c->mismatch,
                        &c->foreign, &c->unreadable, &c->old_format};
    (*slot[kind])++;
}

kvf_status kvf_dir_check(const char *dir, const char *ns, const kvf_geometry *geometries,
                         size_t n_pools, kvf_dir_check_fn visit, void *arg,
                         kvf_dir_counts *counts_p)
{
    check_walk w = {0};
    kvf__blockfile_dir d;
    kvf_status ret = kvf__dir_open_namespace(dir, ns, geometries, n_pools, &d);
    w.any_layout = n_pools == 0;
    if (ret == KVF_OK)
        ret = largest_block(geometries, n_pools, &w.max_payload);
    DIR *walk = NULL;
    if (ret == KVF_OK)
        ret = kvf__dir_open_walk(&d, &walk);
    if (ret != KVF_OK) {
        kvf__blockfile_close_dir(&d);
        return ret;
    }
    w.d = &d;
    const char *n;
    while ((n = kvf__dir_walk_next(&d, walk, &ret))) {
        kvf_dir_entry e = {0};
        uint64_t old_key;
        if (kvf__bf_block_name(n, &e.key)) {
            if (!check_block(&w, n, e.key, &e))
                continue;
        } else if (kvf__bf_old_block_name(n, &old_key)) {
            e.key = (kvf_key){0, old_key};
            snprintf(w.msg, sizeof w.msg,
                     "%s/%s: " KVF_BLOCK_V1_WORDS ", not served: rewrite it with `kvferry fsck "
                     "--upgrade`",
                     d.root, n);
            e.kind = KVF_DIR_ENTRY_OLD_FORMAT;
            e.status = KVF_ERR_MISMATCH;
            e.message = w.msg;
        } else if (kvf__bf_torn_name(n, &e.key)) {
            snprintf(w.msg, sizeof w.msg,
                     "block " KVF_KEY_FMT ": %s/%s: torn write (temporary file of a write that did "
                     "not finish)",
                     KVF_KEY_ARGS(e.key), d.root, n);
            e.kind = KVF_DIR_ENTRY_TORN;
            e.status = KVF_ERR_CORRUPT;
            e.message = w.msg;
        } else {
            continue;
        }
        if (counts_p)
            kvf__dir_count_entry(counts_p, e.kind);
        if (visit)
            visit(arg, &e);
    }
    free(w.buf);
    closedir(walk);
    kvf__blockfile_close_dir(&d);
    if (ret == KVF_OK)
        kvf__clear_error();
    return ret;
}

typedef struct list_walk {
    kvf_dir_list_fn visit;
    void *arg;
    uint64_t n;
} list_walk;

static void list_one(void *arg, const kvf__blockfile_meta *meta, int64_t mtime_ns)
{
    list_walk *l = arg;
    kvf_dir_block b = {meta->key, meta->tokens, meta->pools, meta->payload_bytes, mtime_ns};
    l->n++;
    if (l->visit)
        l->visit(l->arg, &b);
}

kvf_status kvf_dir_list(const char *dir, const char *ns, const kvf_geometry *geometries,
                        size_t n_pools, kvf_dir_list_fn visit, void *arg, uint64_t *n_p)
{
    kvf__blockfile_dir d;
    kvf_status st = kvf__dir_open_namespace(dir, ns, geometries, n_pools, &d);
    list_walk l = {visit, arg, 0};
    if (st == KVF_OK)
        st = kvf__blockfile_list(&d, list_one, &l);
    kvf__blockfile_close_dir(&d);
    if (st == KVF_OK && n_p)
        *n_p = l.n;
    return st;
}

static int name_order(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of the namespaces under `d` (its directory file `path`) into
 * *names_p, *n_p of them: one allocation each, and the array. */
static kvf_status collect_namespaces(DIR *d, const char *path, char ***names_p, size_t *n_p)
{
    char **names = NULL;
    size_t n = 0, cap = 0;
    kvf_status st = KVF_OK;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno)
                st = kvf__fail(kvf__errno_status(errno), "%s: readdir: %s", path, strerror(errno));
            break;
        }
        struct stat sb;
        if (!kvf__ns_valid(e->d_name) ||
            fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for namespaces", path);
                break;
            }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) {
            st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for namespaces", path);
            break;
        }
        n++;
    }
    *names_p = names;
    *n_p = n;
    return st;
}

kvf_status kvf_dir_namespaces(const char *dir, void (*visit)(void *arg, const char *ns), void *arg,
                              size_t *n_p)
{
    if (!dir || !*dir)
        return kvf__fail(KVF_ERR_INVALID, "block directory: NULL or empty");
    DIR *d = opendir(dir);
    if (!d) {
        int err = errno;
        return kvf__fail(err == ENOENT || err == ENOTDIR ? KVF_ERR_NOT_FOUND
                                                         : kvf__errno_status(err),
                         "%s: not a readable block directory: %s", dir, strerror(err));
    }
    char **names;
    size_t n;
    kvf_status st = collect_namespaces(d, dir, &names, &n);
    closedir(d);
    if (st == KVF_OK) {
        qsort(names, n, sizeof *names, name_order);
        for (size_t i = 0; visit && i < n; i++)
            visit(arg, names[i]);
        if (n_p)
            *n_p = n;
        kvf__clear_error();
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return st;
}
