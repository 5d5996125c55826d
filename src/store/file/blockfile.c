/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block files: one file per block key under <file_dir>/<namespace>/.
 *
 * File name: <32 lower-case hex digits of the key>.kvf. A writer first
 * writes .<key>.<pid>.<sequence>.tmp and renames it over the final name,
 * so a file under the final name is always complete; a leftover .tmp file
 * is a write that was interrupted (a crash) and is never read. An engine
 * opening the directory removes the leftovers of writers that are gone
 * (kvf__blockfile_remove_stale: their pid no longer exists); those of live
 * processes, e.g. another engine sharing the namespace, are theirs and
 * stay. fsck leaves them and reports them as torn.
 *
 * The format of a stored block (header, then payload) is blockhdr.c's,
 * shared with the remote tier. The file holds exactly one such block.
 *
 * Length rule: a file holds the block exactly, or padded with zeros to a
 * multiple of 4096 bytes for O_DIRECT (blockfile_names.c).
 *
 * Durability (KVF_FSYNC_BATCH, the default method). A batch's files are
 * written with O_DIRECT (the data is on the device when the write
 * completes, possibly in its volatile cache), renamed into place, and then
 * one syncfs() of the file system flushes that cache and commits the
 * journal holding the renames, before any move of the batch is reported.
 * A crash before syncfs returns promised nothing; what it can leave is a
 * final name whose data did not reach the platter (ext4's data=ordered
 * orders newly allocated blocks before the commit that names them, but
 * not blocks written over in place, as spares are, nor page-cache data on
 * the buffered fallback). Such a file fails its checksums: KVF_ERR_CORRUPT,
 * never other bytes. syncfs also flushes other writers' dirty data on the
 * same file system, which can make one batch pay for another process's
 * writes; KVF_FSYNC_METHOD=fsync restores an fsync per file plus one of
 * the directory per batch.
 *
 * Batches. kvf__blockfile_write_many and _read_many take many blocks at
 * once and run their reads, writes and fsyncs through a file I/O runner
 * (fileio.c), so a batch is in flight at the runner's queue depth; the
 * single-block calls are the same code with one block.
 *
 * The code, a job per file: this one opens, syncs and closes a namespace's
 * directory; blockfile_names.c has the names and the length rule,
 * blockfile_sys.c the system calls (each hooked for fault injection),
 * blockfile_write.c and blockfile_read.c a block's write and read,
 * blockfile_batch.c what a batch's blocks share, blockfile_scan.c the walks
 * of fsck and the cache's restore, blockfile_remove.c removal, and
 * blockfile_spare.c the spare files and the cleanup of temporary ones.
 * blockfile_private.h is what they share.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "log.h"
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

/* mkdir -p: a component that exists (as a directory) is fine. */
static kvf_status make_dirs(const char *path)
{
    char eb[128];
    size_t n = strlen(path);
    char *p = malloc(n + 1);
    if (!p)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", path);
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        if (p[i - 1] == '/')
            continue;
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            /* e.g. EACCES on a parent that exists but is not ours */
            int err = errno;
            struct stat st;
            if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
                kvf_status s = kvf__fail(kvf__bf_write_errno_status(err), "%s: mkdir: %s", p,
                                         kvf__bf_errstr(err, eb, sizeof eb));
                free(p);
                return s;
            }
        }
        p[i] = saved;
    }
    free(p);
    return KVF_OK;
}

kvf_status kvf__blockfile_open_dir(const char *file_dir, const char *ns, uint64_t fingerprint,
                                   kvf_fsync fsync_mode, kvf__blockfile_dir *dir)
{
    char eb[128];
    if (!dir)
        return kvf__fail(KVF_ERR_INVALID, "block files: NULL directory");
    /* closed state first: close_dir after a failed open is harmless */
    dir->root = NULL;
    dir->spares = NULL;
    dir->fio = NULL;
    dir->dir_fd = -1;
    if (!file_dir || !*file_dir)
        return kvf__fail(KVF_ERR_INVALID, "file directory: NULL or empty");
    if (!ns)
        ns = "default";
    if (!kvf__ns_valid(ns))
        return kvf__fail(KVF_ERR_INVALID,
                         "namespace \"%.80s\": want 1 to 64 of [A-Za-z0-9._-], not . or ..", ns);
    if (fsync_mode != KVF_FSYNC_NONE && fsync_mode != KVF_FSYNC_BATCH &&
        fsync_mode != KVF_FSYNC_BLOCK)
        return kvf__fail(KVF_ERR_INVALID, "fsync mode %d unknown", (int)fsync_mode);

    size_t dlen = strlen(file_dir);
    while (dlen > 1 && file_dir[dlen - 1] == '/')
        dlen--;
    size_t rlen = dlen + 1 + strlen(ns);
    if (rlen + NAME_MAX_BYTES >= PATH_MAX)
        return kvf__fail(KVF_ERR_INVALID, "%.*s: path too long", (int)dlen, file_dir);
    char *root = malloc(rlen + 1);
    if (!root)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", file_dir);
    snprintf(root, rlen + 1, "%.*s%s%s", (int)dlen, file_dir, file_dir[dlen - 1] == '/' ? "" : "/",
             ns);

    kvf_status st = make_dirs(root);
    if (st != KVF_OK)
        goto free_root;

    int fd;
    int err = kvf__io_fault("open", root, NULL);
    if (err == 0) {
        fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        err = fd < 0 ? errno : 0;
    } else {
        fd = -1;
    }
    if (fd < 0) {
        st = kvf__fail(kvf__bf_write_errno_status(err), "%s: open: %s", root,
                       kvf__bf_errstr(err, eb, sizeof eb));
        goto free_root;
    }

    dir->root = root;
    dir->ns_hash = kvf__ns_hash(ns);
    dir->fingerprint = fingerprint;
    dir->fsync = fsync_mode;
    dir->dir_fd = fd;
    kvf__bf_spares_create(dir);
    atomic_init(&dir->exchange, dir->spares != NULL);
    atomic_init(&dir->direct, kvf__env_knob("KVF_FILE_DIRECT") != 0);
    dir->use_syncfs = kvf__env_knob("KVF_FSYNC_METHOD") == 0; /* syncfs, fsync */
    KVF_LOG(KVF_LOG_DEBUG, "%s: block files open (namespace hash 0x%016llx)", root,
            (unsigned long long)dir->ns_hash);
    return KVF_OK;

free_root:
    free(root);
    return st;
}

void kvf__blockfile_close_dir(kvf__blockfile_dir *dir)
{
    if (!dir)
        return;
    /* root says whether the struct is open: a zeroed one has dir_fd 0,
     * which is not ours to close */
    if (dir->root) {
        kvf__bf_spares_destroy(dir);
        if (dir->dir_fd >= 0)
            close(dir->dir_fd);
        free(dir->root);
    }
    dir->spares = NULL;
    dir->root = NULL;
    dir->dir_fd = -1;
}

kvf_status kvf__blockfile_fsync_dir(kvf__blockfile_dir *dir)
{
    char eb[128];
    if (!dir || !dir->root)
        return kvf__fail(KVF_ERR_INVALID, "block files: directory not open");
    bool whole_fs = dir->fsync == KVF_FSYNC_BATCH && dir->use_syncfs;
    if (kvf__bf_sync_with(whole_fs ? syncfs : fsync, dir->dir_fd, dir->root) != 0) {
        int err = errno;
        return kvf__fail(kvf__bf_write_errno_status(err), "%s: fsync: %s", dir->root,
                         kvf__bf_errstr(err, eb, sizeof eb));
    }
    return KVF_OK;
}
