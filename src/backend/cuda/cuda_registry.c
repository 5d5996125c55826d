/* SPDX-License-Identifier: Apache-2.0 */
/* The host ranges the backend knows of: pageable ones (HOST kind), which
 * the kernel path cannot reach, and pinned ones, inside which one DMA of the
 * staged path stays; and what kind of memory a pointer is. */
#include "cuda_private.h"

#include <stdlib.h>

/* A list of host ranges (pageable or pinned); range_lock held. */
static bool range_push(host_range **list, size_t *n, size_t *cap, void *ptr, size_t bytes)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 16;
        host_range *r = realloc(*list, nc * sizeof *r);
        if (!r)
            return false;
        *list = r;
        *cap = nc;
    }
    (*list)[*n].begin = (uintptr_t)ptr;
    (*list)[*n].end = (uintptr_t)ptr + bytes;
    (*n)++;
    return true;
}

static void range_drop(host_range *list, size_t *n, void *ptr)
{
    for (size_t i = 0; i < *n; i++) {
        if (list[i].begin == (uintptr_t)ptr) {
            list[i] = list[--*n];
            break;
        }
    }
}

void kvf__cuda_ranges_add(cuda_backend *b, void *ptr, size_t bytes)
{
    pthread_mutex_lock(&b->range_lock);
    if (!range_push(&b->ranges, &b->nranges, &b->ranges_cap, ptr, bytes))
        KVF_LOG(KVF_LOG_WARN, "cuda: cannot track pageable range %p", ptr);
    atomic_store(&b->nranges_pub, b->nranges);
    pthread_mutex_unlock(&b->range_lock);
}

void kvf__cuda_ranges_remove(cuda_backend *b, void *ptr)
{
    pthread_mutex_lock(&b->range_lock);
    range_drop(b->ranges, &b->nranges, ptr);
    atomic_store(&b->nranges_pub, b->nranges);
    pthread_mutex_unlock(&b->range_lock);
}

static bool in_ranges(const cuda_backend *b, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < b->nranges; i++)
        if (a >= b->ranges[i].begin && a < b->ranges[i].end)
            return true;
    return false;
}

/* Pinned ranges: not fatal when one cannot be recorded, batches there
 * just do not take the staged path. */
void kvf__cuda_pinned_add(cuda_backend *b, void *ptr, size_t bytes)
{
    pthread_mutex_lock(&b->range_lock);
    (void)range_push(&b->pinned, &b->npinned, &b->pinned_cap, ptr, bytes);
    pthread_mutex_unlock(&b->range_lock);
}

void kvf__cuda_pinned_remove(cuda_backend *b, void *ptr)
{
    pthread_mutex_lock(&b->range_lock);
    range_drop(b->pinned, &b->npinned, ptr);
    pthread_mutex_unlock(&b->range_lock);
}

bool kvf__cuda_pinned_covers(cuda_backend *b, uintptr_t lo, uintptr_t hi)
{
    bool ok = false;
    pthread_mutex_lock(&b->range_lock);
    for (size_t i = 0; i < b->npinned && !ok; i++)
        ok = lo >= b->pinned[i].begin && hi <= b->pinned[i].end;
    pthread_mutex_unlock(&b->range_lock);
    return ok;
}

bool kvf__cuda_touches_pageable(cuda_backend *b, const kvf__copy *copies, size_t n)
{
    if (atomic_load_explicit(&b->nranges_pub, memory_order_relaxed) == 0)
        return false;
    bool hit = false;
    pthread_mutex_lock(&b->range_lock);
    for (size_t i = 0; i < n && !hit; i++)
        hit = in_ranges(b, copies[i].dst) || in_ranges(b, copies[i].src);
    pthread_mutex_unlock(&b->range_lock);
    return hit;
}

enum cudaMemoryType kvf__cuda_pointer_type(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return cudaMemoryTypeUnregistered;
    }
    if (a.type == cudaMemoryTypeManaged)
        return cudaMemoryTypeDevice;
    /* pinned but not mapped at its own address (registered elsewhere
     * without cudaHostRegisterMapped): the kernel cannot reach it */
    if (a.type == cudaMemoryTypeHost && a.devicePointer != p)
        return cudaMemoryTypeUnregistered;
    return a.type;
}
