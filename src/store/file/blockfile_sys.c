/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The system calls of the block files: each preceded by the fault hook
 * (kvf__io_fault, with the op names of fileio.h) and retried on EINTR,
 * real or injected; their errors told as text and as a kvf_status. Opening
 * a block file never blocks and never follows a link, and falls back from
 * O_DIRECT to buffered I/O where the file system refuses it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "blockfile_private.h"
#include "log.h"
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static atomic_bool direct_refusal_logged;

/* fsync (or syncfs: `sync`) with the hook before it, as "fsync"; EINTR,
 * real or injected, is retried. 0, or -1 with errno set. */
int kvf__bf_sync_with(int (*sync)(int), int fd, const char *path)
{
    for (;;) {
        int err = kvf__io_fault("fsync", path, NULL);
        if (err == 0 && sync(fd) == 0)
            return 0;
        if (err == 0)
            err = errno;
        if (err != EINTR) {
            errno = err;
            return -1;
        }
    }
}

const char *kvf__bf_errstr(int err, char *buf, size_t cap)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    return strerror_r(err, buf, cap);
#else
    if (strerror_r(err, buf, cap) != 0)
        snprintf(buf, cap, "errno %d", err);
    return buf;
#endif
}

/* A write that fails for a missing directory is an I/O failure of the
 * tier, not a missing block. */
kvf_status kvf__bf_write_errno_status(int err)
{
    kvf_status st = kvf__errno_status(err);
    return st == KVF_ERR_NOT_FOUND ? KVF_ERR_IO : st;
}

static int open_at(int dir_fd, const char *name, const char *path, int flags, mode_t mode)
{
    for (;;) {
        int err = kvf__io_fault("open", path, NULL);
        int fd;
        if (err) {
            errno = err;
            fd = -1;
        } else {
            fd = openat(dir_fd, name, flags, mode);
        }
        if (fd >= 0 || errno != EINTR)
            return fd;
    }
}

/* What a file that is not a regular file is, for messages. */
const char *kvf__bf_file_kind(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISLNK(mode))
        return "a symbolic link";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    return "not a regular file";
}

/* Whether `name` exists and is something other than a regular file (its
 * mode in *mode_p): a FIFO, directory, link... that kvferry never wrote. */
bool kvf__bf_is_foreign(int dir_fd, const char *name, mode_t *mode_p)
{
    struct stat sb;
    if (fstatat(dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || S_ISREG(sb.st_mode))
        return false;
    *mode_p = sb.st_mode;
    return true;
}

/* Opens `name`, with O_DIRECT when *direct_p. A file system that refuses
 * O_DIRECT (EINVAL: tmpfs, some FUSE) gets buffered I/O from then on,
 * said once; a FIFO or directory under the name refuses it too (EINVAL),
 * which says nothing about the file system. */
int kvf__bf_open_file(kvf__blockfile_dir *dir, const char *name, const char *path, int flags,
                      bool *direct_p)
{
    if (*direct_p) {
        int fd;
        mode_t mode;
        if (kvf__fileio_direct_refused()) {
            errno = EINVAL;
            fd = -1;
        } else {
            fd = open_at(dir->dir_fd, name, path, flags | O_DIRECT, 0644);
        }
        if (fd >= 0 || errno != EINVAL)
            return fd;
        if (kvf__bf_is_foreign(dir->dir_fd, name, &mode)) {
            errno = EINVAL;
            return -1;
        }
        char eb[128];
        const char *why = kvf__bf_errstr(EINVAL, eb, sizeof eb);
        atomic_store(&dir->direct, false);
        if (!atomic_exchange(&direct_refusal_logged, true))
            KVF_LOG(KVF_LOG_WARN, "%s: O_DIRECT refused (%s): buffered file i/o", dir->root, why);
        *direct_p = false;
    }
    return open_at(dir->dir_fd, name, path, flags, 0644);
}

/* Opens an existing block file for reading without ever blocking: a FIFO
 * under a block's name would wait for a writer forever, a link would be
 * followed to whatever it names. *mode_p is 0, or the mode of a file that
 * is not a regular file (foreign: never read, never removed). -1 with
 * errno set on failure; else the descriptor, a regular file, blocking
 * again (io_uring answers EAGAIN on O_NONBLOCK files instead of waiting),
 * *sb its fstat. */
int kvf__bf_open_block(kvf__blockfile_dir *dir, const char *name, const char *path, bool *direct_p,
                       struct stat *sb, mode_t *mode_p)
{
    *mode_p = 0;
    int fd = kvf__bf_open_file(dir, name, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW,
                               direct_p);
    if (fd < 0) {
        /* ELOOP (a link), ENXIO (a socket), EINVAL (O_DIRECT on a FIFO) */
        int err = errno;
        if (err != ENOENT && kvf__bf_is_foreign(dir->dir_fd, name, mode_p))
            return -1;
        errno = err;
        return -1;
    }
    int err = 0;
    if (fstat(fd, sb) != 0)
        err = errno;
    else if (!S_ISREG(sb->st_mode))
        *mode_p = sb->st_mode;
    else if (fcntl(fd, F_SETFL, *direct_p ? O_DIRECT : 0) != 0)
        err = errno;
    if (err || *mode_p) {
        close(fd);
        errno = err ? err : EINVAL;
        return -1;
    }
    return fd;
}
