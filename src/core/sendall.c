/* SPDX-License-Identifier: Apache-2.0 */
/* Socket writes and waits by a deadline: see sendall.h. */
#include "sendall.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sys/socket.h>

uint32_t kvf__ms_left(uint64_t deadline_ns, uint32_t fallback_ms)
{
    if (!deadline_ns)
        return fallback_ms;
    uint64_t now = kvf__now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

int kvf__wait_fd(int fd, short events, uint32_t ms)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int timeout = ms > INT_MAX ? INT_MAX : (int)ms;
        int ready = poll(&p, 1, timeout);
        if (ready >= 0 || errno != EINTR)
            return ready;
    }
}

int kvf__send_all(int fd, struct iovec *iov, size_t n, uint64_t deadline_ns)
{
    while (n > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = n < IOV_MAX ? n : IOV_MAX};
        /* MSG_NOSIGNAL: a peer that closed the connection is an error, not
         * SIGPIPE; MSG_DONTWAIT: a full socket waits in poll, for the time
         * left, not for a send timeout per call */
        ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int ready = kvf__wait_fd(fd, POLLOUT, kvf__ms_left(deadline_ns, UINT32_MAX));
            if (ready == 0)
                errno = ETIMEDOUT;
            if (ready <= 0)
                return -1;
            continue;
        }
        if (sent < 0)
            return -1;
        size_t left = (size_t)sent;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (left > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}
