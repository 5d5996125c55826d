/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every file of the library shares: the public header, the mark of an
 * internal symbol (internal names carry a double underscore, kvf__), sized
 * arithmetic, the clock and little-endian byte access. Nothing here is
 * part of the API.
 */
#ifndef KVF_CORE_COMMON_H
#define KVF_CORE_COMMON_H

#include "kvferry.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define KVF_INTERNAL __attribute__((visibility("hidden")))

/* Overflow-checked arithmetic on sizes. */
static inline bool kvf__mul_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}
static inline bool kvf__add_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_add_overflow(a, b, out);
}

/* Monotonic clock, nanoseconds. */
static inline uint64_t kvf__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Little-endian integers in byte buffers (the stored header, hashes). */
static inline void kvf__put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t kvf__get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint32_t kvf__get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif /* KVF_CORE_COMMON_H */
