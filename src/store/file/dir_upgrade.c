/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvf_dir_upgrade: rewrites the block files of format version 1 (64-bit
 * keys, <16 hex digits>.kvf, a 64-byte header; the key zero-extended) and
 * version 2 (one checksum for the payload, no pool table) in the current
 * format. The old formats do not record each pool's bytes: the payload is
 * split evenly among its pools (kvf__block_prefix_begin's rule), which is
 * the layout of an engine whose pools have one shape; a block of pools of
 * other shapes still reads whole (every byte is under one of the table's
 * checksums), and a layer-wise read refuses it (execute_store.c).
 * Each old file is checked whole as its own version's
 * reader would (header, namespace, key against its name, length, padding,
 * checksum) before a byte of it is rewritten: a damaged block is reported
 * and left, never carried into the new format with a fresh checksum.
 * Per file: new file written under a temporary name, fsynced, renamed into
 * place (version 1: without replacing anything, RENAME_NOREPLACE, and only
 * then the old file removed; version 2, under the same name: over the old
 * file, only while the name still holds the file that was read), and the
 * directory fsynced.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "checksum.h"
#include "dir_walk.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define V1_HDR KVF_BLOCK_V1_HEADER_BYTES

static _Atomic unsigned long long upgrade_seq;

typedef struct upgrade {
    kvf__blockfile_dir *d;
    char msg[PATH_MAX + 256];
} upgrade;

/* One old block to upgrade: its key and format version. */
typedef struct old_block {
    kvf_key key;
    uint32_t version;
} old_block;

/* Reads the old file `name` whole into *buf_p and checks it as its
 * version's reader would; fills *h, and the file's inode. The entry's kind
 * on failure in *kind_p. */
static kvf_status read_old(upgrade *u, const char *name, const old_block *ob, const char *what,
                           uint8_t **buf_p, kvf__block_header *h, ino_t *ino_p,
                           kvf_dir_entry_kind *kind_p)
{
    *kind_p = KVF_DIR_ENTRY_CORRUPT;
    uint32_t hdr = ob->version == KVF_BLOCK_FORMAT_V1 ? V1_HDR : HDR;
    int fd = openat(u->d->dir_fd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        int err = errno;
        mode_t mode;
        if (kvf__bf_is_foreign(u->d->dir_fd, name, &mode)) {
            *kind_p = KVF_DIR_ENTRY_FOREIGN;
            return kvf__fail(KVF_ERR_CORRUPT, "%s: %s, not a block file (foreign: left alone)",
                             what, kvf__bf_file_kind(mode));
        }
        *kind_p = KVF_DIR_ENTRY_UNREADABLE;
        return kvf__fail(err == ENOENT ? KVF_ERR_NOT_FOUND : kvf__errno_status(err), "%s: open: %s",
                         what, strerror(err));
    }
    struct stat sb;
    kvf_status st = KVF_OK;
    uint8_t hb[HDR];
    if (fstat(fd, &sb) != 0) {
        *kind_p = KVF_DIR_ENTRY_UNREADABLE;
        st = kvf__fail(kvf__errno_status(errno), "%s: fstat: %s", what, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        *kind_p = KVF_DIR_ENTRY_FOREIGN;
        st = kvf__fail(KVF_ERR_CORRUPT, "%s: %s, not a block file (foreign: left alone)", what,
                       kvf__bf_file_kind(sb.st_mode));
    } else if (sb.st_size < (off_t)hdr || pread(fd, hb, hdr, 0) != (ssize_t)hdr) {
        st = kvf__fail(KVF_ERR_CORRUPT, "%s: truncated: shorter than a version-%u header", what,
                       ob->version);
    } else if ((st = ob->version == KVF_BLOCK_FORMAT_V1
                         ? kvf__block_header_parse_v1(hb, what, h)
                         : kvf__block_header_parse_v2(hb, what, h)) == KVF_OK) {
        if (h->ns_hash != u->d->ns_hash) {
            *kind_p = KVF_DIR_ENTRY_MISMATCH;
            st = kvf__fail(KVF_ERR_MISMATCH,
                           "%s: stored under another namespace (hash 0x%016llx, expected "
                           "0x%016llx)",
                           what, (unsigned long long)h->ns_hash, (unsigned long long)u->d->ns_hash);
        } else if (!kvf_key_eq(h->key, ob->key)) {
            st = kvf__fail(KVF_ERR_CORRUPT, "%s: header names block " KVF_KEY_FMT, what,
                           KVF_KEY_ARGS(h->key));
        } else if (h->pools > KVF_BLOCK_POOLS_MAX || (h->pools == 0 && h->payload_bytes)) {
            st = kvf__fail(
                KVF_ERR_RANGE, "%s: %u pools for %llu bytes: not a block format %u holds", what,
                h->pools, (unsigned long long)h->payload_bytes, KVF_BLOCK_FORMAT_VERSION);
        } else {
            st = kvf__bf_check_file_size((uint64_t)sb.st_size, hdr, h->payload_bytes, what);
        }
    }
    uint8_t *buf = NULL;
    size_t size = (size_t)sb.st_size;
    if (st == KVF_OK && !(buf = malloc(size ? size : 1))) {
        *kind_p = KVF_DIR_ENTRY_UNREADABLE;
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for %zu bytes", what, size);
    }
    if (st == KVF_OK && pread(fd, buf, size, 0) != (ssize_t)size)
        st = kvf__fail(KVF_ERR_CORRUPT, "%s: truncated: short read", what);
    if (st == KVF_OK)
        st = kvf__block_old_payload_check(h, what, buf + hdr);
    if (st == KVF_OK)
        st = kvf__bf_check_padding(buf + hdr + h->payload_bytes,
                                   size - hdr - (size_t)h->payload_bytes, what);
    close(fd);
    if (st != KVF_OK) {
        free(buf);
        return st;
    }
    *ino_p = sb.st_ino;
    *buf_p = buf;
    return KVF_OK;
}

/* Writes the block of *h (payload at `payload`) as a current-format file
 * under the temporary name `tmp`, synced. */
static kvf_status write_new(upgrade *u, const kvf__block_header *old, const uint8_t *payload,
                            const char *tmp, const char *what)
{
    kvf__block_header h = *old;
    size_t pre = kvf__block_prefix_bytes(h.pools), len = pre + (size_t)h.payload_bytes;
    uint8_t *img = malloc(len);
    if (!img)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for %zu bytes", what, len);
    memcpy(img + pre, payload, h.payload_bytes);
    kvf_status st = kvf__block_prefix_make(&h, NULL, img + pre, what, img);
    int fd = st == KVF_OK ? openat(u->d->dir_fd, tmp,
                                   O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644)
                          : -1;
    if (st == KVF_OK && fd < 0) {
        st = kvf__fail(kvf__bf_write_errno_status(errno), "%s: create %s: %s", what, tmp,
                       strerror(errno));
    } else if (st == KVF_OK) {
        size_t done = 0;
        while (done < len) {
            ssize_t w = write(fd, img + done, len - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                st = kvf__fail(kvf__bf_write_errno_status(w < 0 ? errno : ENOSPC),
                               "%s: write %s: %s", what, tmp, strerror(w < 0 ? errno : ENOSPC));
                break;
            }
            done += (size_t)w;
        }
        if (st == KVF_OK && kvf__bf_sync_with(fsync, fd, tmp) != 0)
            st =
                kvf__fail(kvf__errno_status(errno), "%s: fsync %s: %s", what, tmp, strerror(errno));
        close(fd);
        if (st != KVF_OK)
            unlinkat(u->d->dir_fd, tmp, 0);
    }
    free(img);
    return st;
}

/* The directory's entries made durable (renames, removals). */
static kvf_status sync_dir(upgrade *u, const char *what)
{
    if (kvf__bf_sync_with(fsync, u->d->dir_fd, u->d->root) != 0)
        return kvf__fail(kvf__errno_status(errno), "%s: fsync of %s: %s", what, u->d->root,
                         strerror(errno));
    return KVF_OK;
}

/* Puts the new file `tmp` under the name of a version-2 file read as
 * inode `ino`: only while the name still holds that file (an engine of
 * this version may have stored the block again meanwhile: its file
 * stays, and the new one goes). */
static kvf_status place_over(upgrade *u, const char *tmp, const char *name, ino_t ino,
                             const char *what)
{
    struct stat sb;
    if (fstatat(u->d->dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || sb.st_ino != ino) {
        unlinkat(u->d->dir_fd, tmp, 0);
        return kvf__fail(KVF_ERR_NOT_FOUND, "%s: stored again or removed meanwhile", what);
    }
    if (renameat(u->d->dir_fd, tmp, u->d->dir_fd, name) != 0) {
        int err = errno;
        unlinkat(u->d->dir_fd, tmp, 0);
        return kvf__fail(kvf__bf_write_errno_status(err), "%s: rename over it: %s", what,
                         strerror(err));
    }
    return KVF_OK;
}

/* Puts the new file `tmp` of a version-1 file under its new name, then
 * removes the old file. */
static kvf_status place_beside(upgrade *u, const char *tmp, const char *old_name,
                               const char *new_name, const kvf__block_header *h, kvf_key key,
                               const char *what, kvf_dir_entry_kind *kind_p)
{
    kvf_status st = KVF_OK;
    bool placed = false;
    if (renameat2(u->d->dir_fd, tmp, u->d->dir_fd, new_name, RENAME_NOREPLACE) == 0) {
        placed = true;
    } else if (errno == EEXIST) {
        /* stored again meanwhile (an engine of this version): the old
         * file goes only if the new one holds a sound block */
        unlinkat(u->d->dir_fd, tmp, 0);
        size_t cap = kvf__block_prefix_bytes(h->pools) + (size_t)h->payload_bytes;
        uint8_t *check = malloc(cap);
        kvf__blockfile_meta m;
        st = check ? kvf__blockfile_read(u->d, key, check, cap, &m)
                   : kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", what);
        free(check);
        if (st != KVF_OK) {
            *kind_p = KVF_DIR_ENTRY_OLD_FORMAT;
            st = kvf__fail(KVF_ERR_MISMATCH,
                           "%s: %s exists and does not read as the block (%s): old file left", what,
                           new_name, kvf_last_error());
        }
    } else {
        int err = errno;
        unlinkat(u->d->dir_fd, tmp, 0);
        st = kvf__fail(kvf__bf_write_errno_status(err), "%s: rename to %s: %s", what, new_name,
                       strerror(err));
    }
    if (st == KVF_OK && placed)
        st = sync_dir(u, what);
    if (st == KVF_OK && unlinkat(u->d->dir_fd, old_name, 0) != 0 && errno != ENOENT)
        st = kvf__fail(kvf__errno_status(errno), "%s: rewritten as %s, but unlink: %s", what,
                       new_name, strerror(errno));
    return st;
}

/* Upgrades one old file; fills *e (kind OLD_FORMAT and KVF_OK once done). */
static void upgrade_one(upgrade *u, const old_block *ob, kvf_dir_entry *e)
{
    char old_name[NAME_MAX_BYTES], new_name[NAME_MAX_BYTES], tmp[NAME_MAX_BYTES];
    char what[PATH_MAX + 64];
    e->key = ob->key;
    kvf__bf_block_file_name(e->key, new_name, sizeof new_name);
    if (ob->version == KVF_BLOCK_FORMAT_V1)
        snprintf(old_name, sizeof old_name, "%016llx.kvf", (unsigned long long)ob->key.lo);
    else
        snprintf(old_name, sizeof old_name, "%s", new_name);
    snprintf(tmp, sizeof tmp, "." KVF_KEY_FMT ".%ld.%llu.tmp", KVF_KEY_ARGS(e->key), (long)getpid(),
             (unsigned long long)atomic_fetch_add(&upgrade_seq, 1));
    snprintf(what, sizeof what, "%s/%s", u->d->root, old_name);
    uint8_t *buf = NULL;
    kvf__block_header h;
    kvf_dir_entry_kind kind;
    ino_t ino = 0;
    kvf_status st = read_old(u, old_name, ob, what, &buf, &h, &ino, &kind);
    if (st == KVF_OK) {
        kind = KVF_DIR_ENTRY_UNREADABLE; /* a failure from here on says nothing of the block */
        st = write_new(u, &h, buf + (ob->version == KVF_BLOCK_FORMAT_V1 ? V1_HDR : HDR), tmp, what);
    }
    free(buf);
    if (st == KVF_OK)
        st = ob->version == KVF_BLOCK_FORMAT_V1
                 ? place_beside(u, tmp, old_name, new_name, &h, e->key, what, &kind)
                 : place_over(u, tmp, old_name, ino, what);
    if (st == KVF_OK)
        st = sync_dir(u, what);
    e->status = st;
    e->kind = st == KVF_OK ? KVF_DIR_ENTRY_OLD_FORMAT : kind;
    if (st == KVF_OK)
        snprintf(u->msg, sizeof u->msg, "%s: upgraded to %s/%s (format %u)", what, u->d->root,
                 new_name, KVF_BLOCK_FORMAT_VERSION);
    else
        snprintf(u->msg, sizeof u->msg, "%s", kvf_last_error());
    e->message = u->msg;
}

/* Whether block file `name` is of format version 2 (its header says so;
 * the rest is read_old's to check). */
static bool is_v2(kvf__blockfile_dir *d, const char *name)
{
    int fd = openat(d->dir_fd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0)
        return false;
    uint8_t hb[HDR];
    struct stat sb;
    kvf__block_header h;
    bool v2 = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && pread(fd, hb, HDR, 0) == HDR &&
              kvf__block_header_parse_v2(hb, name, &h) == KVF_OK;
    close(fd);
    kvf__clear_error();
    return v2;
}

/* The namespace's old files, read before any is renamed (a rename during
 * readdir may show a name twice or not at all). */
static kvf_status old_blocks(kvf__blockfile_dir *d, old_block **obs_p, size_t *n_p)
{
    DIR *walk;
    kvf_status st = kvf__dir_open_walk(d, &walk);
    if (st != KVF_OK)
        return st;
    old_block *obs = NULL, ob;
    size_t n = 0, cap = 0;
    const char *name;
    uint64_t key;
    while ((name = kvf__dir_walk_next(d, walk, &st))) {
        if (kvf__bf_old_block_name(name, &key))
            ob = (old_block){{0, key}, KVF_BLOCK_FORMAT_V1};
        else if (kvf__bf_block_name(name, &ob.key) && is_v2(d, name))
            ob.version = KVF_BLOCK_FORMAT_V2;
        else
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            old_block *no = realloc(obs, cap * sizeof *no);
            if (!no) {
                st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory listing old blocks", d->root);
                break;
            }
            obs = no;
        }
        obs[n++] = ob;
    }
    closedir(walk);
    if (st != KVF_OK) {
        free(obs);
        return st;
    }
    *obs_p = obs;
    *n_p = n;
    return KVF_OK;
}

kvf_status kvf_dir_upgrade(const char *dir, const char *ns, kvf_dir_check_fn visit, void *arg,
                           kvf_dir_counts *counts_p)
{
    kvf__blockfile_dir d;
    kvf_status st = kvf__dir_open_namespace(dir, ns, NULL, 0, &d);
    old_block *obs = NULL;
    size_t n = 0;
    if (st == KVF_OK)
        st = old_blocks(&d, &obs, &n);
    upgrade *u = st == KVF_OK ? calloc(1, sizeof *u) : NULL;
    if (st == KVF_OK && !u)
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", d.root);
    for (size_t i = 0; st == KVF_OK && i < n; i++) {
        u->d = &d;
        kvf_dir_entry e = {0};
        upgrade_one(u, &obs[i], &e);
        if (e.status == KVF_ERR_NOT_FOUND)
            continue; /* removed since the listing */
        if (counts_p) {
            if (e.status == KVF_OK)
                counts_p->upgraded++;
            else
                kvf__dir_count_entry(counts_p, e.kind);
        }
        if (visit)
            visit(arg, &e);
    }
    free(u);
    free(obs);
    kvf__blockfile_close_dir(&d);
    if (st == KVF_OK)
        kvf__clear_error();
    return st;
}
