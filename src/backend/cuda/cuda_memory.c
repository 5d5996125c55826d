/* SPDX-License-Identifier: Apache-2.0 */
/* The backend's memory: device memory, mapped pinned host memory and
 * pageable host memory, allocated or registered, and recorded in the
 * registry where a copy path needs to know of it. */
#include "cuda_private.h"

#include <stdlib.h>
#include <string.h>

kvf_status kvf__cuda_mem_alloc(kvf__backend *base, kvf_memory kind, size_t bytes, void **ptr_p)
{
    cuda_backend *b = (cuda_backend *)base;
    void *p = NULL;
    dev_guard g;
    kvf_status st;
    if (bytes == 0)
        return kvf__fail(KVF_ERR_INVALID, "cuda: allocation of 0 bytes");
    switch (kind) {
    case KVF_MEMORY_DEVICE: {
        if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
            return st;
        cudaStream_t s = NULL;
        cudaEvent_t ev = NULL;
        CUDA_GOTO(cudaMalloc(&p, bytes), st, out_leave);
        if ((st = kvf__cuda_sync_stream_get(b, &s, &ev)) != KVF_OK)
            goto out_free;
        /* on a stream of ours: the legacy stream would not order it
         * before our non-blocking transfer streams */
        CUDA_GOTO(cudaMemsetAsync(p, 0, bytes, s), st, out_put);
        if ((st = kvf__cuda_sync_stream_wait(s, ev)) != KVF_OK)
            goto out_put;
        kvf__cuda_sync_stream_put(b, s, ev);
        kvf__cuda_dev_leave(&g);
        *ptr_p = p;
        return KVF_OK;
    out_put:
        kvf__cuda_sync_stream_put(b, s, ev);
    out_free:
        CUDA_IGNORE(cudaFree(p));
    out_leave:
        kvf__cuda_dev_leave(&g);
        return st;
    }
    case KVF_MEMORY_HOST_PINNED:
        if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
            return st;
        CUDA_GOTO(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable), st,
                  out_pinned);
        memset(p, 0, bytes);
        kvf__cuda_pinned_add(b, p, bytes);
        st = KVF_OK;
        *ptr_p = p;
    out_pinned:
        kvf__cuda_dev_leave(&g);
        return st;
    case KVF_MEMORY_HOST:
        p = calloc(1, bytes);
        if (!p)
            return kvf__fail(KVF_ERR_NOMEM, "cuda: cannot allocate %zu bytes of host memory",
                             bytes);
        kvf__cuda_ranges_add(b, p, bytes);
        *ptr_p = p;
        return KVF_OK;
    }
    return kvf__fail(KVF_ERR_INVALID, "cuda: unknown memory kind %d", (int)kind);
}

void kvf__cuda_mem_free(kvf__backend *base, kvf_memory kind, void *ptr)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    if (!ptr)
        return;
    switch (kind) {
    case KVF_MEMORY_DEVICE:
        if (kvf__cuda_dev_enter(b, &g) == KVF_OK) {
            CUDA_IGNORE(cudaFree(ptr));
            kvf__cuda_dev_leave(&g);
        }
        break;
    case KVF_MEMORY_HOST_PINNED:
        kvf__cuda_pinned_remove(b, ptr);
        CUDA_IGNORE(cudaFreeHost(ptr));
        break;
    case KVF_MEMORY_HOST:
        kvf__cuda_ranges_remove(b, ptr);
        free(ptr);
        break;
    }
}

kvf_status kvf__cuda_mem_register(kvf__backend *base, kvf_memory kind, void *ptr, size_t bytes,
                                  bool *registered_p)
{
    cuda_backend *b = (cuda_backend *)base;
    struct cudaPointerAttributes a, z;
    dev_guard g;
    kvf_status st = KVF_OK;
    if (!ptr || bytes == 0)
        return kvf__fail(KVF_ERR_INVALID, "cuda: register %p of %zu bytes", ptr, bytes);
    const void *last = (const char *)ptr + bytes - 1;
    switch (kind) {
    case KVF_MEMORY_DEVICE:
        if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
            return st;
        CUDA_GOTO(cudaPointerGetAttributes(&a, ptr), st, out_leave);
        CUDA_GOTO(cudaPointerGetAttributes(&z, last), st, out_leave);
        if (a.type != cudaMemoryTypeDevice || a.device != b->device ||
            z.type != cudaMemoryTypeDevice || z.device != b->device) {
            st = kvf__fail(KVF_ERR_INVALID,
                           "cuda: %p (%zu bytes) is not memory of device %d (type %d, device %d)",
                           ptr, bytes, b->device, (int)a.type, a.device);
            goto out_leave;
        }
        *registered_p = false;
        break;
    case KVF_MEMORY_HOST_PINNED:
        if ((st = kvf__cuda_dev_enter(b, &g)) != KVF_OK)
            return st;
        CUDA_GOTO(cudaPointerGetAttributes(&a, ptr), st, out_leave);
        CUDA_GOTO(cudaPointerGetAttributes(&z, last), st, out_leave);
        if (a.type == cudaMemoryTypeHost && z.type == cudaMemoryTypeHost) {
            /* pinned by the caller, who may free it without telling us:
             * not recorded, so the staged path never DMAs across it */
            *registered_p = false;
            break;
        }
        if (a.type == cudaMemoryTypeDevice || z.type == cudaMemoryTypeDevice) {
            st = kvf__fail(KVF_ERR_INVALID, "cuda: %p is device memory, not host memory", ptr);
            goto out_leave;
        }
        CUDA_GOTO(cudaHostRegister(ptr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
                  st, out_leave);
        kvf__cuda_pinned_add(b, ptr, bytes);
        *registered_p = true;
        break;
    case KVF_MEMORY_HOST:
        if (kvf__cuda_pointer_type(ptr) == cudaMemoryTypeDevice)
            return kvf__fail(KVF_ERR_INVALID, "cuda: %p is device memory, not host memory", ptr);
        kvf__cuda_ranges_add(b, ptr, bytes);
        /* the range must be forgotten again: mem_unregister is needed */
        *registered_p = true;
        return KVF_OK;
    default:
        return kvf__fail(KVF_ERR_INVALID, "cuda: unknown memory kind %d", (int)kind);
    }
out_leave:
    kvf__cuda_dev_leave(&g);
    return st;
}

void kvf__cuda_mem_unregister(kvf__backend *base, kvf_memory kind, void *ptr)
{
    cuda_backend *b = (cuda_backend *)base;
    if (kind == KVF_MEMORY_HOST_PINNED) {
        kvf__cuda_pinned_remove(b, ptr);
        CUDA_IGNORE(cudaHostUnregister(ptr));
    } else if (kind == KVF_MEMORY_HOST)
        kvf__cuda_ranges_remove(b, ptr);
}
