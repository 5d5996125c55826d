/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Opening a file named by a setting: see namedfile.h. O_NONBLOCK makes the
 * open itself return at once (a FIFO's open waits for its other end
 * otherwise); the type is then read from the descriptor, so the file
 * checked is the file opened, and a regular file gets its blocking mode
 * back before stdio uses it.
 */
#include "namedfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *type_name(mode_t mode)
{
    return S_ISFIFO(mode)   ? "not a regular file (a FIFO)"
           : S_ISSOCK(mode) ? "not a regular file (a socket)"
           : S_ISCHR(mode)  ? "not a regular file (a character device)"
           : S_ISBLK(mode)  ? "not a regular file (a block device)"
           : S_ISDIR(mode)  ? "not a regular file (a directory)"
                            : "not a regular file";
}

FILE *kvf__named_file_open(const char *path, bool append, const char **why_p)
{
    struct stat sb;
    /* typed first: a FIFO opened for writing without O_NONBLOCK waits for
     * a reader, and with it fails ENXIO, which would name the wrong cause */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        *why_p = type_name(sb.st_mode);
        errno = EINVAL;
        return NULL;
    }
    int flags = (append ? O_WRONLY | O_APPEND | O_CREAT : O_RDONLY) | O_CLOEXEC | O_NONBLOCK;
    int fd = open(path, flags, 0644);
    if (fd < 0) {
        *why_p = strerror(errno);
        return NULL;
    }
    int err = 0;
    const char *why = NULL;
    if (fstat(fd, &sb) != 0)
        err = errno;
    else if (!S_ISREG(sb.st_mode)) { /* replaced since the stat */
        why = type_name(sb.st_mode);
        err = EINVAL;
    } else if (fcntl(fd, F_SETFL, flags & O_APPEND) != 0)
        err = errno;
    FILE *f = err ? NULL : fdopen(fd, append ? "a" : "r");
    if (!f) {
        err = err ? err : errno;
        close(fd);
        *why_p = why ? why : strerror(err);
        errno = err;
    }
    return f;
}
