/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A caller's sized struct: every public struct a call reads or fills
 * starts with size_t struct_size, so a program built against an older,
 * shorter header still works. In: the fields the caller's struct lacks
 * keep their defaults. Out: the caller gets only the fields its struct
 * has, and its struct_size says how many bytes were filled. Each call
 * checks the size itself (its bounds and message are its own) before it
 * copies.
 */
#ifndef KVF_CORE_SIZED_H
#define KVF_CORE_SIZED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The struct_size a caller's struct declares (read by bytes: the struct
 * may be shorter than the library's). */
static inline size_t kvf__sized_size(const void *in)
{
    size_t have;
    memcpy(&have, in, sizeof have);
    return have;
}

/* Whether a caller's struct declares a size in [min, max]: a bigger one
 * is not a struct_size at all (uninitialised, or another struct). */
static inline bool kvf__sized_ok(const void *in, size_t min, size_t max)
{
    size_t have = kvf__sized_size(in);
    return have >= min && have <= max;
}

/* Copies the caller's struct `in` over `out` (out_size bytes, holding the
 * defaults): the fields past the caller's size keep them. out's
 * struct_size becomes out_size, the struct now being whole. */
static inline void kvf__sized_copy_in(void *out, size_t out_size, const void *in)
{
    size_t have = kvf__sized_size(in);
    memcpy(out, in, have < out_size ? have : out_size);
    memcpy(out, &out_size, sizeof out_size);
}

/* Copies the library's whole struct `full` (full_size bytes) into the
 * caller's `out` up to the caller's size, which must be at least
 * sizeof(size_t); out's struct_size becomes the bytes filled. */
static inline void kvf__sized_copy_out(void *out, const void *full, size_t full_size)
{
    size_t have = kvf__sized_size(out);
    size_t n = have < full_size ? have : full_size;
    memcpy((char *)out + sizeof n, (const char *)full + sizeof n, n - sizeof n);
    memcpy(out, &n, sizeof n);
}

#endif /* KVF_CORE_SIZED_H */
