/* The host backend: block slots in plain host memory, copies by memcpy on
 * the engine's worker threads. It is the whole backend on a machine without
 * a GPU, for CPU inference engines and for CI. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static void host_destroy(kvf__backend *b)
{
    free(b);
}

static kvf_status host_mem_alloc(kvf__backend *b, kvf_memory kind, size_t bytes, void **ptr_p)
{
    if (kind == KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED, "host backend: no device memory");
    /* page-aligned, so O_DIRECT staging and huge copies behave */
    void *p = NULL;
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    if (rounded < bytes || posix_memalign(&p, 4096, rounded ? rounded : 4096) != 0)
        return kvf__fail(KVF_ERR_NOMEM, "host backend: cannot allocate %zu bytes", bytes);
    memset(p, 0, rounded);
    *ptr_p = p;
    return KVF_OK;
}

static void host_mem_free(kvf__backend *b, kvf_memory kind, void *ptr)
{
    free(ptr);
}

static kvf_status host_mem_register(kvf__backend *b, kvf_memory kind, void *ptr, size_t bytes,
                                    bool *registered_p)
{
    if (kind == KVF_MEMORY_DEVICE)
        return kvf__fail(KVF_ERR_UNSUPPORTED, "host backend: no device memory");
    *registered_p = false;
    return KVF_OK;
}

static void host_mem_unregister(kvf__backend *b, kvf_memory kind, void *ptr) {}

static kvf__copy_hook_fn copy_hook;

void kvf__set_copy_hook(kvf__copy_hook_fn fn)
{
    __atomic_store_n(&copy_hook, fn, __ATOMIC_RELEASE);
}

kvf_status kvf__host_copy(const kvf__copy *copies, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        kvf__copy_hook_fn hook = __atomic_load_n(&copy_hook, __ATOMIC_ACQUIRE);
        if (hook) {
            kvf_status st = hook(c);
            if (st != KVF_OK)
                return kvf__fail(st, "host backend: copy of %zu x %zu bytes failed (injected)",
                                 c->rows, c->width);
        }
        if (c->rows == 1 || (c->width == c->dpitch && c->width == c->spitch)) {
            memcpy(c->dst, c->src, c->width * c->rows);
            continue;
        }
        uint8_t *d = c->dst;
        const uint8_t *s = c->src;
        for (size_t r = 0; r < c->rows; r++)
            memcpy(d + r * c->dpitch, s + r * c->spitch, c->width);
    }
    return KVF_OK;
}

static kvf_status host_copy_sync(kvf__backend *b, kvf__queue queue, const kvf__copy *copies,
                                 size_t n)
{
    return kvf__host_copy(copies, n);
}

static const kvf__backend_ops host_ops = {
    .name = "host",
    .destroy = host_destroy,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .mem_register = host_mem_register,
    .mem_unregister = host_mem_unregister,
    .copy_sync = host_copy_sync,
    .copy_async = NULL,
    .sync_stream = NULL,
};

kvf_status kvf__host_backend_create(kvf__backend **backend_p)
{
    kvf__backend *b = calloc(1, sizeof *b);
    if (!b)
        return kvf__fail(KVF_ERR_NOMEM, "host backend: out of memory");
    b->ops = &host_ops;
    *backend_p = b;
    return KVF_OK;
}
