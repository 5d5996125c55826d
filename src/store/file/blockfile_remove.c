/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Removing blocks: on request (kvf__blockfile_remove), and after a failed
 * write (kvf__blockfile_discard), where a file the directory will not let
 * go is emptied in place so that no reader takes it for the block.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* unlinkat, hooked as "unlink" on `path`; 0 (removed, or nothing there)
 * or an errno. */
static int unlink_block(kvf__blockfile_dir *dir, const char *name, const char *path)
{
    for (;;) {
        int err = kvf__io_fault("unlink", path, NULL);
        if (err == 0 && unlinkat(dir->dir_fd, name, 0) == 0)
            return 0;
        if (err == 0)
            err = errno;
        if (err == ENOENT)
            return 0;
        if (err != EINTR)
            return err;
    }
}

/* Cuts a block file that cannot be removed to 0 bytes, hooked as
 * "truncate": a directory that refuses unlink (read-only, sticky, not
 * ours) still lets the file's owner write the file itself, and an empty
 * file is never read as a block, by this process or any later one.
 * 0 or an errno; a name that is not a regular file is left alone (it is
 * never read as a block either). */
static int empty_block(kvf__blockfile_dir *dir, const char *name, const char *path)
{
    int err = kvf__io_fault("truncate", path, NULL);
    if (err)
        return err;
    int fd = openat(dir->dir_fd, name, O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        mode_t mode;
        err = errno;
        return err == ENOENT || kvf__bf_is_foreign(dir->dir_fd, name, &mode) ? 0 : err;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        err = errno;
    else if (S_ISREG(sb.st_mode) && ftruncate(fd, 0) != 0)
        err = errno;
    /* for a crash: without it the cut may not outlive one (best effort,
     * the cut itself is what every reader sees from now on) */
    if (err == 0)
        fsync(fd);
    close(fd);
    return err;
}

/* Makes sure no version of a block is left readable after a failed write:
 * removed; else, when the directory refuses (EACCES, EPERM, EROFS...),
 * emptied in place (*emptied_p). KVF_OK when the file is gone; else the
 * failure, its message saying whether the file remains empty or, where
 * emptying failed too, with its old bytes. */
kvf_status kvf__bf_discard_block(kvf__blockfile_dir *dir, kvf_key key, const char *name,
                                 const char *path, bool *emptied_p)
{
    char eb[128], eb2[128];
    *emptied_p = false;
    int err = unlink_block(dir, name, path);
    if (err == 0)
        return KVF_OK;
    int err2 = empty_block(dir, name, path);
    if (err2 == 0) {
        *emptied_p = true;
        return kvf__fail(kvf__bf_write_errno_status(err),
                         "block " KVF_KEY_FMT
                         ": %s: unlink: %s; emptied in place instead (the file "
                         "remains, 0 bytes, never read as the block)",
                         KVF_KEY_ARGS(key), path, kvf__bf_errstr(err, eb, sizeof eb));
    }
    return kvf__fail(kvf__bf_write_errno_status(err),
                     "block " KVF_KEY_FMT
                     ": %s: unlink: %s; emptying it in place: %s: THE FILE REMAINS "
                     "with the block's previous bytes",
                     KVF_KEY_ARGS(key), path, kvf__bf_errstr(err, eb, sizeof eb),
                     kvf__bf_errstr(err2, eb2, sizeof eb2));
}

kvf_status kvf__blockfile_discard(kvf__blockfile_dir *dir, kvf_key key, bool *emptied_p)
{
    bool emptied = false;
    if (emptied_p)
        *emptied_p = false;
    if (!dir || !dir->root)
        return kvf__fail(KVF_ERR_INVALID, "block file discard: directory not open");
    char name[NAME_MAX_BYTES], path[PATH_MAX];
    kvf__bf_block_file_name(key, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir->root, name);
    kvf_status st = kvf__bf_discard_block(dir, key, name, path, &emptied);
    if (emptied_p)
        *emptied_p = emptied;
    return st;
}

/* ---- for the cache: removal and a fast listing ---------------------------- */

kvf_status kvf__blockfile_remove(kvf__blockfile_dir *dir, kvf_key key)
{
    char eb[128];
    if (!dir || !dir->root)
        return kvf__fail(KVF_ERR_INVALID, "block file remove: directory not open");
    char name[NAME_MAX_BYTES], path[PATH_MAX];
    kvf__bf_block_file_name(key, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", dir->root, name);
    /* nothing stored (ENOENT) is what removal wants: 0 */
    int err = unlink_block(dir, name, path);
    if (err == 0)
        return KVF_OK;
    return kvf__fail(kvf__errno_status(err), "block " KVF_KEY_FMT ": %s: unlink: %s",
                     KVF_KEY_ARGS(key), path, kvf__bf_errstr(err, eb, sizeof eb));
}
