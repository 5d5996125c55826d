/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Spare files: the inodes of replaced blocks, kept under temporary names
 * to be written over by later writes. Replacing a file by rename frees
 * its blocks and a new file allocates others; on this project's disk
 * (ext4, online discard) freeing a 1 MiB file took 1.2-1.7 ms, more than
 * writing it (docs/PERFORMANCE.md). Swapping the new file in with
 * RENAME_EXCHANGE instead leaves the old inode under the temporary name,
 * renamed .<key>.<pid>.<sequence>.spare: never read, and not a torn
 * write. The next write opens a spare (no O_TRUNC), writes over its blocks
 * in place and swaps it in in turn, which leaves the file it replaces
 * under the same spare name. Spares of a writer that is gone (a crash)
 * are removed like its temporary files; an engine removes its own when
 * it closes the directory. Within an engine, a read of a key is ordered
 * before a write that replaces it, so no read is left on an inode that
 * became a spare; a reader in another process sharing the namespace can
 * be, and then sees the spare rewritten: it gets KVF_ERR_CORRUPT (the
 * checksums), never another block's bytes.
 *
 * Also here: the removal of the temporary and spare files that writers
 * now gone left behind (kvf__blockfile_remove_stale).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SPARES 256

struct kvf__blockfile_spares {
    pthread_mutex_t mu;
    size_t n;
    char names[MAX_SPARES][NAME_MAX_BYTES];
};

void kvf__bf_spares_create(kvf__blockfile_dir *dir)
{
    dir->spares = calloc(1, sizeof *dir->spares);
    if (dir->spares)
        pthread_mutex_init(&dir->spares->mu, NULL);
}

void kvf__bf_spares_destroy(kvf__blockfile_dir *dir)
{
    if (dir->spares) {
        for (size_t i = 0; i < dir->spares->n; i++)
            unlinkat(dir->dir_fd, dir->spares->names[i], 0);
        pthread_mutex_destroy(&dir->spares->mu);
        free(dir->spares);
    }
}

static bool spare_take(kvf__blockfile_dir *dir, char *name)
{
    struct kvf__blockfile_spares *sp = dir->spares;
    bool got = false;
    pthread_mutex_lock(&sp->mu);
    if (sp->n) {
        memcpy(name, sp->names[--sp->n], NAME_MAX_BYTES);
        got = true;
    }
    pthread_mutex_unlock(&sp->mu);
    return got;
}

/* Keeps the file under `name` as a spare: one that held a write's data
 * (".tmp") is renamed ".spare" first, so that a spare is never taken for
 * a torn write; one already a spare stays as it is. */
static void spare_give(kvf__blockfile_dir *dir, const char *from)
{
    struct kvf__blockfile_spares *sp = dir->spares;
    char name[NAME_MAX_BYTES];
    snprintf(name, sizeof name, "%s", from);
    size_t n = strlen(name);
    if (n > 4 && strcmp(name + n - 4, ".tmp") == 0) {
        snprintf(name + n - 4, sizeof name - (n - 4), ".spare");
        if (renameat(dir->dir_fd, from, dir->dir_fd, name) != 0) {
            unlinkat(dir->dir_fd, from, 0);
            return;
        }
    }
    pthread_mutex_lock(&sp->mu);
    bool kept = sp->n < MAX_SPARES;
    if (kept)
        snprintf(sp->names[sp->n++], NAME_MAX_BYTES, "%s", name);
    pthread_mutex_unlock(&sp->mu);
    if (!kept)
        unlinkat(dir->dir_fd, name, 0);
}

/* Moves the temporary file `from` to the final name `to` atomically,
 * hooked as "rename" on the final path; a file it replaces becomes a
 * spare. 0, or -1 with errno set. */
int kvf__bf_rename_in(kvf__blockfile_dir *dir, const char *from, const char *to,
                      const char *to_path)
{
    int dir_fd = dir->dir_fd;
    for (;;) {
        int err = kvf__io_fault("rename", to_path, NULL);
        if (err == 0 && atomic_load_explicit(&dir->exchange, memory_order_relaxed)) {
            if (renameat2(dir_fd, from, dir_fd, to, RENAME_EXCHANGE) == 0) {
                spare_give(dir, from);
                return 0;
            }
            /* ENOENT: nothing to replace; EINVAL: not on this file system */
            if (errno == EINVAL || errno == ENOSYS)
                atomic_store(&dir->exchange, false);
            else if (errno != ENOENT)
                err = errno;
        }
        if (err == 0 && renameat(dir_fd, from, dir_fd, to) == 0)
            return 0;
        if (err == 0)
            err = errno;
        if (err != EINTR) {
            errno = err;
            return -1;
        }
    }
}

/* A spare file to write over, cut to `len`, under io->tmp; -1 when there
 * is none (or it is gone or unusable: the caller creates a file). */
int kvf__bf_open_spare(kvf__blockfile_dir *dir, kvf__blockfile_io *io, size_t len, bool *direct_p)
{
    char name[NAME_MAX_BYTES];
    while (dir->spares && spare_take(dir, name)) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir->root, name);
        /* not blocking: a rename exchange may have made anything that
         * stood under a block's name a spare, a FIFO too */
        int fd = kvf__bf_open_file(dir, name, path, O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW,
                                   direct_p);
        struct stat sb;
        if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
            fcntl(fd, F_SETFL, *direct_p ? O_DIRECT : 0) == 0 &&
            ((uint64_t)sb.st_size == len || ftruncate(fd, (off_t)len) == 0)) {
            snprintf(io->tmp, sizeof io->tmp, "%s", name);
            snprintf(io->tmp_path, sizeof io->tmp_path, "%s", path);
            return fd;
        }
        if (fd >= 0)
            close(fd);
        unlinkat(dir->dir_fd, name, 0);
    }
    return -1;
}

/* Removes the temporary files of writers that no longer exist: writes a
 * crash (kill -9, power loss) interrupted, which nobody will rename. A
 * file whose pid is alive (this process, another engine on the same
 * directory) or whose liveness cannot be told (EPERM: alive, not ours)
 * stays. Best effort: a failure here is logged, never fatal. */
static void remove_stale_tmp(int dir_fd, const char *root)
{
    char eb[128];
    int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        KVF_LOG(KVF_LOG_WARN, "%s: cannot list for stale temporary files: %s", root,
                kvf__bf_errstr(err, eb, sizeof eb));
        return;
    }
    unsigned long removed = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) {
                int err = errno;
                KVF_LOG(KVF_LOG_WARN, "%s: readdir: %s", root, kvf__bf_errstr(err, eb, sizeof eb));
            }
            break;
        }
        pid_t pid;
        /* a FIFO or directory under such a name is not a writer's: left */
        if (!kvf__bf_parse_tmp_name(e->d_name, &pid) ||
            (e->d_type != DT_REG && e->d_type != DT_UNKNOWN))
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        if (unlinkat(dir_fd, e->d_name, 0) != 0) {
            int err = errno;
            if (err != ENOENT) /* another opener removed it first */
                KVF_LOG(KVF_LOG_WARN, "%s/%s: cannot remove stale temporary file: %s", root,
                        e->d_name, kvf__bf_errstr(err, eb, sizeof eb));
            continue;
        }
        removed++;
        KVF_LOG(KVF_LOG_INFO,
                "%s/%s: removed the temporary file of an interrupted write (pid %ld gone)", root,
                e->d_name, (long)pid);
    }
    closedir(d);
    if (removed)
        KVF_LOG(KVF_LOG_WARN, "%s: removed %lu stale temporary file%s of interrupted writes", root,
                removed, removed == 1 ? "" : "s");
}

void kvf__blockfile_remove_stale(kvf__blockfile_dir *dir)
{
    if (dir && dir->root)
        remove_stale_tmp(dir->dir_fd, dir->root);
}
