/* SPDX-License-Identifier: Apache-2.0 */
/* Status codes, their text, and the per-thread detail of the last failure. */
#include "status.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];

const char *kvf_status_str(kvf_status status)
{
    switch (status) {
    case KVF_OK:
        return "success";
    case KVF_INPROGRESS:
        return "in progress";
    case KVF_ERR_INVALID:
        return "invalid argument";
    case KVF_ERR_RANGE:
        return "out of range";
    case KVF_ERR_UNSUPPORTED:
        return "not supported";
    case KVF_ERR_STATE:
        return "not allowed in this state";
    case KVF_ERR_UNKNOWN_TICKET:
        return "unknown or already retired ticket";
    case KVF_ERR_NOMEM:
        return "out of memory";
    case KVF_ERR_RESOURCE:
        return "the process is out of a resource (file descriptors, threads, ...); the block is "
               "intact, retry";
    case KVF_ERR_NO_DEVICE:
        return "no usable GPU";
    case KVF_ERR_DEVICE:
        return "GPU error";
    case KVF_ERR_IO:
        return "I/O error";
    case KVF_ERR_NOT_FOUND:
        return "block not found";
    case KVF_ERR_NO_SPACE:
        return "no space left";
    case KVF_ERR_REMOTE:
        return "remote store error";
    case KVF_ERR_TIMEOUT:
        return "timed out";
    case KVF_ERR_CORRUPT:
        return "stored block is corrupt";
    case KVF_ERR_MISMATCH:
        return "stored block has another layout or namespace";
    case KVF_ERR_LOST:
        return "block lost: the move it depends on failed, or its last write failed";
    }
    return "unknown status";
}

const char *kvf_last_error(void)
{
    return last_error;
}

kvf_status kvf__fail(kvf_status status, const char *fmt, ...)
{
    /* the message may quote the previous one ("%s", kvf_last_error()):
     * format aside, then replace */
    char buf[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(last_error, buf, sizeof buf);
    KVF_LOG(KVF_LOG_DEBUG, "%s (%s)", last_error, kvf_status_str(status));
    return status;
}

void kvf__clear_error(void)
{
    last_error[0] = '\0';
}

kvf_status kvf__errno_status(int err)
{
    switch (err) {
    case ENOSPC:
    case EDQUOT:
        return KVF_ERR_NO_SPACE;
    case ENOMEM:
        return KVF_ERR_NOMEM;
    case EMFILE:
    case ENFILE:
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case ENOBUFS:
        return KVF_ERR_RESOURCE;
    case ENOENT:
        return KVF_ERR_NOT_FOUND;
    default:
        return KVF_ERR_IO;
    }
}

bool kvf__status_condemns_block(kvf_status status)
{
    /* only what was found in the stored copy itself, or its absence:
     * everything else (an exhausted process, an I/O error, a device) may
     * pass, and the copy may still be whole */
    switch (status) {
    case KVF_ERR_CORRUPT:
    case KVF_ERR_MISMATCH:
    case KVF_ERR_NOT_FOUND:
    case KVF_ERR_LOST:
        return true;
    default:
        return false;
    }
}
