/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The file store: block files (blockfile.c) behind the store ops, their
 * system calls in flight together through the fileio runner; on the
 * GPUDirect Storage path blocks may be device memory (device_staging).
 * Local I/O has no deadline: calls ignore deadline_ns.
 */
#include "blockfile.h"
#include "blockfile_private.h"
#include "gds.h"
#include "keymap.h"
#include "log.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct file_store {
    kvf__store base;
    kvf__blockfile_dir *dir;
    kvf__blockfile_dir owned; /* the directory, when the store opened it */
    kvf__fileio_runner *fio;  /* the runner (an engine's tier's, owned); NULL: inline */
    bool gds;                 /* blocks may be device images: cuFile's driver held */
    /* Keys whose last write failed and whose old file could not be removed
     * (file_discard): refused with KVF_ERR_LOST until written or removed
     * again, so that the old bytes are never served. lost_mu guards. */
    kvf__keymap lost;
    pthread_mutex_t lost_mu;
} file_store;

typedef struct lost_key {
    kvf_key key;
    struct lost_key *next;
} lost_key;

/* Where a block of a batch call stands: done, or waiting for a pass of
 * the kind named (see file_call). */
enum { DONE, RETRY_RESOURCE, RETRY_CHECK };

/* How long a call waits before its one retry of the blocks that found the
 * process out of a resource (descriptors, above all, when many transfers
 * run at once): long enough for other threads' transfers to close their
 * files, short against a recompute. */
#define RESOURCE_RETRY_NS 5000000L

/* Re-reads of a block whose check failed, and the pause before each after
 * the first. Another process writing the namespace replaces a file by
 * swapping a new one in, and later writes over the old inode in place
 * (the directory's spares): a read still open on it then sees another
 * version half written, a checksum or header that fails, while the file
 * under the key's name is whole. Opened again by name, it reads whole; a
 * block that fails every time is what the file holds. */
#define REREADS 3
#define REREAD_PAUSE_NS 1000000L

static size_t aligned(size_t n)
{
    return (n + KVF_FILE_ALIGN - 1) / KVF_FILE_ALIGN * KVF_FILE_ALIGN;
}

static void pause_ns(long ns)
{
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

/* ---- keys refused until written again ------------------------------------ */

/* Fails the blocks of a read whose key is lost (state DONE). */
static void lost_refuse(file_store *s, kvf__store_block *blocks, size_t n, uint8_t *state)
{
    pthread_mutex_lock(&s->lost_mu);
    for (size_t i = 0; i < n && s->lost.count; i++) {
        kvf_key key = blocks[i].key;
        if (!kvf__keymap_find(&s->lost, key, NULL))
            continue;
        state[i] = DONE;
        kvf__store_block_fail(&blocks[i], KVF_ERR_LOST,
                              "block " KVF_KEY_FMT ": %s/" KVF_KEY_FMT
                              ".kvf: its last write failed and the old "
                              "file could not be removed: refused until written again",
                              KVF_KEY_ARGS(key), s->dir->root, KVF_KEY_ARGS(key));
    }
    pthread_mutex_unlock(&s->lost_mu);
}

static void lost_set(file_store *s, kvf_key key)
{
    pthread_mutex_lock(&s->lost_mu);
    lost_key *k = kvf__keymap_find(&s->lost, key, NULL);
    if (!k && (k = malloc(sizeof *k)) != NULL) {
        k->key = key;
        if (!kvf__keymap_insert(&s->lost, k)) {
            free(k);
            k = NULL;
        }
    }
    pthread_mutex_unlock(&s->lost_mu);
    if (!k)
        KVF_LOG(KVF_LOG_ERROR,
                "block " KVF_KEY_FMT
                ": out of memory to remember it lost: its old file may be served",
                KVF_KEY_ARGS(key));
}

/* The keys of blocks[0..n) stored (written or removed) are no longer lost. */
static void lost_clear(file_store *s, const kvf__store_block *blocks, size_t n)
{
    pthread_mutex_lock(&s->lost_mu);
    for (size_t i = 0; i < n && s->lost.count; i++) {
        lost_key *k =
            blocks[i].status == KVF_OK ? kvf__keymap_find(&s->lost, blocks[i].key, NULL) : NULL;
        if (k) {
            kvf__keymap_remove(&s->lost, k);
            free(k);
        }
    }
    pthread_mutex_unlock(&s->lost_mu);
}

/* ---- batch reads and writes ---------------------------------------------- */

/* One batch call, as its passes over the blocks see it: ios[k] moves
 * blocks[at[k]] in the current pass; state[i] says whether block i is
 * done (DONE) or waits for a pass of the kind named. */
typedef struct file_call {
    file_store *s;
    kvf__store_block *blocks;
    const kvf__store_hooks *h;
    kvf__blockfile_io *ios;
    size_t *at;
    uint8_t *state;
    bool retry_resource, retry_check; /* this pass's failures of that kind are tried again */
    size_t n;                         /* blocks of the call */
    bool grouped;                     /* read by pool groups (read_groups) */
} file_call;

static kvf_status call_begin(file_call *c, file_store *s, kvf__store_block *blocks, size_t n,
                             const kvf__store_hooks *h)
{
    *c = (file_call){s,
                     blocks,
                     h,
                     malloc(n * sizeof *c->ios),
                     malloc(n * sizeof *c->at),
                     malloc(n),
                     false,
                     false,
                     n,
                     false};
    if (c->ios && c->at && c->state) {
        memset(c->state, RETRY_RESOURCE, n); /* every block waits for the first pass */
        return KVF_OK;
    }
    free(c->ios);
    free(c->at);
    free(c->state);
    for (size_t i = 0; i < n; i++)
        kvf__store_block_fail(&blocks[i], KVF_ERR_NOMEM, "block " KVF_KEY_FMT ": %s: out of memory",
                              KVF_KEY_ARGS(blocks[i].key), s->dir->root);
    return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", s->dir->root);
}

static void call_end(file_call *c)
{
    free(c->ios);
    free(c->at);
    free(c->state);
}

/* Whether block b's image is the caller's (staged), not one of the
 * store's own. */
static bool caller_image(const kvf__store_block *b)
{
    return b->staged || b->img;
}

/* A payload a hook filled in into the store's own image of it. */
static kvf_status copy_in(kvf__blockfile_io *io, const kvf__store_block *b, file_store *s)
{
    size_t pre = kvf__block_prefix_bytes(b->pools);
    if (b->pools > KVF_BLOCK_POOLS_MAX || pre + b->payload_bytes > io->cap)
        return kvf__fail(KVF_ERR_RANGE,
                         "block " KVF_KEY_FMT ": %s: %zu payload bytes in %u pools, room for %zu",
                         KVF_KEY_ARGS(b->key), s->dir->root, b->payload_bytes, b->pools, io->cap);
    memcpy(io->buf + pre, b->buf, b->payload_bytes);
    return KVF_OK;
}

/* Block i's record for this pass: the caller's staged image, or one of the
 * store's own (filled from the caller's payload unless a hook fills it
 * later). false when out of memory. */
static bool io_setup(file_call *c, size_t k, size_t i, bool write)
{
    kvf__store_block *b = &c->blocks[i];
    kvf__blockfile_io *io = &c->ios[k];
    c->at[k] = i;
    io->meta = (kvf__blockfile_meta){b->key, b->tokens, b->pools, b->payload_bytes};
    io->fill = NULL;
    io->on_done = NULL;
    io->arg = c;
    io->img = b->img;
    io->img_arg = b->img_arg;
    io->pool_bytes = b->pool_bytes;
    if (caller_image(b)) {
        size_t pre = kvf__block_prefix_bytes(b->pools);
        io->buf = (uint8_t *)b->buf - pre;
        io->cap = pre + b->cap;
        return true;
    }
    /* a read's prefix is known once read, a filled write's once filled:
     * room for the largest */
    bool now = write && !(c->h && c->h->fill);
    size_t pre = now && b->pools <= KVF_BLOCK_POOLS_MAX ? kvf__block_prefix_bytes(b->pools)
                                                        : KVF_BLOCK_PREFIX_MAX;
    io->cap = aligned(pre + (now ? b->payload_bytes : b->cap));
    io->buf = aligned_alloc(KVF_FILE_ALIGN, io->cap);
    if (io->buf && now)
        memcpy(io->buf + pre, b->buf, b->payload_bytes);
    return io->buf != NULL;
}

static void ios_release(file_call *c, size_t k)
{
    for (size_t j = 0; j < k; j++)
        if (!caller_image(&c->blocks[c->at[j]]))
            free(c->ios[j].buf);
}

/* Sets up the records of the blocks in `state`, marking those it cannot
 * set up failed; their count. */
static size_t pass_setup(file_call *c, size_t n, uint8_t state, bool write)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (c->state[i] != state)
            continue;
        if (io_setup(c, k, i, write)) {
            k++;
            continue;
        }
        c->state[i] = DONE;
        kvf__store_block_fail(&c->blocks[i], KVF_ERR_NOMEM,
                              "block " KVF_KEY_FMT ": %s: out of memory",
                              KVF_KEY_ARGS(c->blocks[i].key), c->s->dir->root);
        if (!write && c->h && c->h->done)
            c->h->done(c->h->arg, &c->blocks[i], 1);
    }
    return k;
}

/* The pass's verdict on block i: DONE, or another pass of a kind. */
static uint8_t verdict(const file_call *c, kvf_status st)
{
    if (st == KVF_ERR_RESOURCE && c->retry_resource)
        return RETRY_RESOURCE;
    if ((st == KVF_ERR_CORRUPT || st == KVF_ERR_MISMATCH) && c->retry_check)
        return RETRY_CHECK;
    return DONE;
}

static void take_result(kvf__store_block *b, const kvf__blockfile_io *io)
{
    b->status = io->status;
    b->msg[0] = '\0';
    if (io->status != KVF_OK) /* cut to what a move's message holds */
        snprintf(b->msg, sizeof b->msg, "%.*s", (int)sizeof b->msg - 1, io->msg);
}

/* A write's payload, filled in by the caller's hook just before the write
 * starts (so that it overlaps the writes in flight). */
static kvf_status write_fill(kvf__blockfile_io *io)
{
    file_call *c = io->arg;
    kvf__store_block *b = &c->blocks[c->at[io - c->ios]];
    kvf_status st = c->h->fill(c->h->arg, b, 1);
    if (st != KVF_OK)
        return kvf__fail(st, "block " KVF_KEY_FMT ": %s", KVF_KEY_ARGS(b->key), kvf_last_error());
    io->meta = (kvf__blockfile_meta){b->key, b->tokens, b->pools, b->payload_bytes};
    io->pool_bytes = b->pool_bytes;
    return caller_image(b) ? KVF_OK : copy_in(io, b, c->s);
}

static void write_pass(file_call *c, size_t n, uint8_t state)
{
    size_t k = pass_setup(c, n, state, true);
    for (size_t j = 0; j < k; j++)
        c->ios[j].fill = c->h && c->h->fill ? write_fill : NULL;
    kvf__blockfile_write_many(c->s->dir, c->s->fio, c->ios, k);
    for (size_t j = 0; j < k; j++) {
        size_t i = c->at[j];
        c->state[i] = verdict(c, c->ios[j].status);
        take_result(&c->blocks[i], &c->ios[j]);
    }
    ios_release(c, k);
}

/* Writes every block; one that finds the process out of a resource is
 * tried once more after a short wait, and then reported with
 * KVF_ERR_RESOURCE. A block that fails here leaves no file (the file
 * layer removes it); one whose fill failed was not written at all. */
static kvf_status file_write_hooked(kvf__store *base, kvf__store_block *blocks, size_t n,
                                    uint64_t deadline_ns, const kvf__store_hooks *h)
{
    (void)deadline_ns;
    file_store *s = (file_store *)base;
    file_call c;
    kvf_status st = call_begin(&c, s, blocks, n, h);
    if (st != KVF_OK)
        return st;
    c.retry_resource = true;
    write_pass(&c, n, RETRY_RESOURCE);
    c.retry_resource = false;
    if (memchr(c.state, RETRY_RESOURCE, n)) {
        pause_ns(RESOURCE_RETRY_NS);
        write_pass(&c, n, RETRY_RESOURCE);
    }
    call_end(&c);
    lost_clear(s, blocks, n);
    return kvf__store_first_failure(blocks, n, false);
}

/* A block read: its result, unless this pass tries it again; checked
 * against the caller's buffer, copied out of the store's own image, and
 * handed to the caller's hook while the call's other reads are still in
 * flight. */
static void read_done(kvf__blockfile_io *io)
{
    file_call *c = io->arg;
    size_t i = c->at[io - c->ios];
    kvf__store_block *b = &c->blocks[i];
    if ((c->state[i] = verdict(c, io->status)) != DONE)
        return;
    /* read by groups, a block the caller's hook failed stays failed */
    if (!c->grouped || b->status == KVF_OK)
        take_result(b, io);
    const kvf__blockfile_meta *m = &io->meta;
    if (b->status == KVF_OK && !caller_image(b) && m->payload_bytes > b->cap)
        kvf__store_block_fail(
            b, KVF_ERR_RANGE, "block " KVF_KEY_FMT ": %s: %llu bytes, buffer of %zu",
            KVF_KEY_ARGS(b->key), c->s->dir->root, (unsigned long long)m->payload_bytes, b->cap);
    if (b->status == KVF_OK) {
        if (!caller_image(b))
            memcpy(b->buf, io->buf + kvf__block_prefix_bytes(m->pools), m->payload_bytes);
        b->tokens = m->tokens;
        b->pools = m->pools;
        b->payload_bytes = m->payload_bytes;
    }
    if (c->h && c->h->done)
        c->h->done(c->h->arg, b, 1);
}

static void read_pass(file_call *c, size_t n, uint8_t state)
{
    size_t k = pass_setup(c, n, state, false);
    for (size_t j = 0; j < k; j++)
        c->ios[j].on_done = read_done;
    kvf__blockfile_read_many(c->s->dir, c->s->fio, c->ios, k);
    ios_release(c, k);
}

/* The file layer's group g of one block done: its status (and header's
 * view) as the caller's hook sees it, then the hook, for that block. */
static void group_done(void *arg, kvf__blockfile_io *io, uint32_t g)
{
    file_call *c = arg;
    kvf__store_block *b = &c->blocks[c->at[io - c->ios]];
    /* a block the caller's hook failed in an earlier group stays failed */
    if (g == 0 || b->status == KVF_OK)
        take_result(b, io);
    if (b->status == KVF_OK) {
        b->tokens = io->meta.tokens;
        b->pools = io->meta.pools;
        b->payload_bytes = io->meta.payload_bytes;
    }
    b->table = b->status == KVF_OK ? io->table : NULL;
    c->h->part(c->h->arg, b, 1, g);
    b->table = NULL;
}

/* Whether a read can go group by group: the caller takes groups, and every
 * block is its own staged image (the groups land where the caller reads
 * them; the store's own images are copied out whole). */
static bool by_groups(const kvf__store_block *blocks, size_t n, const kvf__store_hooks *h)
{
    if (!h || !h->part || h->n_groups < 2)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!caller_image(&blocks[i]))
            return false;
    return true;
}

/* Reads every block group by group (by_groups). No block is read again:
 * its first groups may be in use by the time a later one fails, and a
 * second reading could be of another version of the file. */
static void read_groups(file_call *c, size_t n)
{
    c->grouped = true;
    size_t k = pass_setup(c, n, RETRY_RESOURCE, false);
    /* the blocks refused already (lost keys, no memory) count in every
     * group as failed */
    for (size_t i = 0; i < n; i++)
        for (uint32_t g = 0; c->state[i] == DONE && g < c->h->n_groups; g++)
            c->h->part(c->h->arg, &c->blocks[i], 1, g);
    for (size_t j = 0; j < k; j++)
        c->ios[j].on_done = read_done;
    kvf__blockfile_groups gr = {c->h->n_groups, c->h->group_end, c->h->first_bytes, group_done, c};
    kvf__blockfile_read_groups(c->s->dir, c->s->fio, c->ios, k, &gr);
    ios_release(c, k);
}

/* Reads every block. A key whose old file could not be removed after a
 * failed write is refused (KVF_ERR_LOST). A block that finds the process
 * out of a resource is tried once more after a short wait; one whose check
 * fails is read again, alone, up to REREADS times (see there): a verdict
 * against stored bytes only once they read the same way again. */
static kvf_status file_read_hooked(kvf__store *base, kvf__store_block *blocks, size_t n,
                                   uint64_t deadline_ns, const kvf__store_hooks *h)
{
    (void)deadline_ns;
    file_store *s = (file_store *)base;
    file_call c;
    kvf_status st = call_begin(&c, s, blocks, n, h);
    if (st != KVF_OK) {
        if (h && h->done)
            h->done(h->arg, blocks, n);
        return st;
    }
    lost_refuse(s, blocks, n, c.state);
    for (size_t i = 0; i < n && h && h->done; i++)
        if (c.state[i] == DONE)
            h->done(h->arg, &blocks[i], 1);
    if (by_groups(blocks, n, h)) {
        read_groups(&c, n);
        call_end(&c);
        return kvf__store_first_failure(blocks, n, true);
    }
    c.retry_resource = c.retry_check = true;
    read_pass(&c, n, RETRY_RESOURCE);
    c.retry_resource = false;
    if (memchr(c.state, RETRY_RESOURCE, n)) {
        pause_ns(RESOURCE_RETRY_NS);
        read_pass(&c, n, RETRY_RESOURCE);
    }
    for (int k = 0; k < REREADS && memchr(c.state, RETRY_CHECK, n); k++) {
        if (k)
            pause_ns(REREAD_PAUSE_NS * k * k);
        c.retry_check = k + 1 < REREADS;
        read_pass(&c, n, RETRY_CHECK);
    }
    call_end(&c);
    return kvf__store_first_failure(blocks, n, true);
}

static kvf_status file_write(kvf__store *base, kvf__store_block *blocks, size_t n,
                             uint64_t deadline_ns)
{
    return file_write_hooked(base, blocks, n, deadline_ns, NULL);
}

static kvf_status file_read(kvf__store *base, kvf__store_block *blocks, size_t n,
                            uint64_t deadline_ns)
{
    return file_read_hooked(base, blocks, n, deadline_ns, NULL);
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
    lost_clear(s, blocks, n); /* absent now, as promised */
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

/* Under KVF_FSYNC_BATCH, one sync for the batch's files and renames;
 * the other modes made each write as durable as they promise already. */
static kvf_status file_commit(kvf__store *base)
{
    kvf__blockfile_dir *dir = ((file_store *)base)->dir;
    return dir->fsync == KVF_FSYNC_BATCH ? kvf__blockfile_fsync_dir(dir) : KVF_OK;
}

/* One rule for every write that fails, however it fails (before its I/O:
 * a lost source, no staging; in it: the fill, the write, its fsync; after
 * it: the batch's commit): the key's file is removed, so that a later read
 * finds no block rather than an old or unsynced version. The file layer
 * removes it where its own write or fsync fails; this covers the rest.
 * Where the directory refuses the removal, the file is emptied in place
 * (no reader takes it for the block, after a restart either) and the key
 * is refused here until written again: the old bytes are never served. */
static kvf_status file_discard(kvf__store *base, kvf_key key, bool *emptied_p)
{
    file_store *s = (file_store *)base;
    kvf_status st = kvf__blockfile_discard(s->dir, key, emptied_p);
    if (st == KVF_OK)
        return KVF_OK;
    lost_set(s, key);
    KVF_LOG(KVF_LOG_ERROR,
            "after a failed write: %s; the key is refused (KVF_ERR_LOST) until written again%s",
            kvf_last_error(),
            *emptied_p ? ""
                       : "; an engine opened on this directory later would serve the old bytes");
    return st;
}

static bool file_device_staging(const kvf__store *base)
{
    return ((const file_store *)base)->gds;
}

static void file_close(kvf__store *base)
{
    file_store *s = (file_store *)base;
    kvf__fileio_runner_destroy(s->fio);
    if (s->gds)
        kvf__gds_release();
    if (s->dir == &s->owned)
        kvf__blockfile_close_dir(&s->owned);
    kvf__keymap_clear(&s->lost, free);
    pthread_mutex_destroy(&s->lost_mu);
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
    .write_hooked = file_write_hooked,
    .read_hooked = file_read_hooked,
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
    s->lost = (kvf__keymap)KVF_KEYMAP_INIT(lost_key, key, next, 16);
    pthread_mutex_init(&s->lost_mu, NULL);
    return s;
}

/* Whether the disk tier takes the GPUDirect Storage path (see
 * kvf_gds_compat), cuFile's driver then held until the store closes. */
static bool gds_choose(const kvf__file_tier_config *cfg, const char *root)
{
    static atomic_bool warned;
    if (cfg->io == KVF_FILE_IO_POSIX)
        return false;
    kvf_gds_compat compat = kvf__gds_compat_of(cfg->gds_compat);
    kvf__gds_probe probe;
    char why[sizeof probe.detail + 96];
    kvf_status st = KVF_ERR_UNSUPPORTED;
    if (!cfg->device_slots) {
        snprintf(why, sizeof why, "the host backend keeps no block in device memory");
    } else {
        st = kvf__gds_acquire(compat, &probe);
        /* a file system cuFile refuses would send every block through host
         * memory twice: the POSIX path instead, unless compat mode is on */
        if (kvf__gds_choose(cfg->io, compat, &probe, why, sizeof why) &&
            (compat == KVF_GDS_COMPAT_ON || kvf__gds_dir_usable(root, why, sizeof why))) {
            KVF_LOG(KVF_LOG_INFO, "file tier: GPUDirect Storage, cuFile %s", probe.detail);
            return true;
        }
    }
    if (st == KVF_OK)
        kvf__gds_release();
    kvf__clear_error();
    if (cfg->io == KVF_FILE_IO_GDS && !atomic_exchange(&warned, true))
        KVF_LOG(KVF_LOG_WARN, "file tier: GPUDirect Storage not used (%s): POSIX path", why);
    else
        KVF_LOG(KVF_LOG_INFO, "file tier: POSIX path (%s)", why);
    return false;
}

kvf_status kvf__file_store_open_tier(const kvf__file_tier_config *cfg, kvf__store **store_p)
{
    char where[PATH_MAX];
    snprintf(where, sizeof where, "%s/%s", cfg->dir, cfg->ns);
    file_store *s = file_store_new(where);
    if (!s)
        return kvf__fail(KVF_ERR_NOMEM, "file tier %s: out of memory", where);
    kvf_status st = kvf__blockfile_open_dir(cfg->dir, cfg->ns, 0, cfg->fsync, &s->owned);
    if (st != KVF_OK) {
        file_close(&s->base);
        return st;
    }
    s->dir = &s->owned;
    free(s->base.where);
    s->base.where = strdup(s->dir->root);
    kvf__blockfile_remove_stale(s->dir);
    s->gds = gds_choose(cfg, s->dir->root);
    /* cuFile's calls run on the thread runner's threads (not io_uring) */
    st = kvf__fileio_runner_create(s->gds ? KVF_FILE_RUNNER_THREADS : cfg->runner, cfg->queue_depth,
                                   cfg->lanes, &s->fio);
    if (st != KVF_OK || !s->base.where) {
        file_close(&s->base);
        return st != KVF_OK ? st : kvf__fail(KVF_ERR_NOMEM, "file tier %s: out of memory", where);
    }
    s->dir->fio = s->fio;
    *store_p = &s->base;
    return KVF_OK;
}

kvf__blockfile_dir *kvf__file_store_dir(kvf__store *s)
{
    return s && s->ops == &file_ops ? ((file_store *)s)->dir : NULL;
}

uint32_t kvf__file_store_depth(const kvf__store *s)
{
    return kvf__fileio_runner_depth(((const file_store *)s)->fio);
}

const char *kvf__file_store_runner_name(const kvf__store *s)
{
    const file_store *f = (const file_store *)s;
    return !f->fio                                                    ? "inline"
           : kvf__fileio_runner_type(f->fio) == KVF_FILE_RUNNER_URING ? "io_uring"
                                                                      : "threads";
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
        file_close(&s->base);
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
