/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writing to and waiting on a socket by a deadline (sendall.c): what a
 * networked store pipelines its requests with (the Redis store today),
 * and what the CLI's benchmark ceilings write with, so both pay the same.
 */
#ifndef KVF_SENDALL_H
#define KVF_SENDALL_H

#include "common.h"

#include <sys/uio.h>

/* Milliseconds left before `deadline_ns` (kvf__now_ns time, rounded up), 0
 * once it passed; without a deadline (0), `fallback_ms`. */
KVF_INTERNAL uint32_t kvf__ms_left(uint64_t deadline_ns, uint32_t fallback_ms);
/* Waits until `fd` is ready for `events` (poll's): 1, 0 when `ms` passed
 * first, -1 with errno set. */
KVF_INTERNAL int kvf__wait_fd(int fd, short events, uint32_t ms);
/* Writes every byte of iov[0..n) to a socket (the array is consumed),
 * waiting for room no later than `deadline_ns` (kvf__now_ns time; 0: no
 * limit). 0, or -1 with errno set (ETIMEDOUT: the deadline passed). */
KVF_INTERNAL int kvf__send_all(int fd, struct iovec *iov, size_t n, uint64_t deadline_ns);

#endif /* KVF_SENDALL_H */
