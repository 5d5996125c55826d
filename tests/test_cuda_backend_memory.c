/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend's mem_register: the caller's device memory, pinned and
 * pageable host ranges, and what is refused. Exits 77 without a GPU.
 */
#include "cuda_backend_fixture.h"

/* ---- memory ------------------------------------------------------------ */

static int test_mem_register(void)
{
    kvf__backend *b = backend_new(KVF_CUDA_COPY_KERNEL);
    bool reg = true;
    size_t bytes = (size_t)4 << 20;

    /* caller's cudaMalloc'd memory as DEVICE: checked, nothing to undo */
    void *dev = NULL;
    CUDA_OK(cudaMalloc(&dev, bytes));
    CHECK_STATUS(b->ops->mem_register(b, KVF_MEMORY_DEVICE, dev, bytes, &reg), KVF_OK);
    CHECK(!reg);

    /* host memory claimed to be DEVICE */
    uint8_t *host = aligned_alloc(4096, bytes);
    REQUIRE(host);
    reg = true;
    CHECK_STATUS(b->ops->mem_register(b, KVF_MEMORY_DEVICE, host, bytes, &reg), KVF_ERR_INVALID);
    CHECK_STATUS(b->ops->mem_register(b, KVF_MEMORY_DEVICE, A_H.p, bytes, &reg), KVF_ERR_INVALID);
    /* device memory claimed to be pinned host memory */
    CHECK_STATUS(b->ops->mem_register(b, KVF_MEMORY_HOST_PINNED, dev, bytes, &reg),
                 KVF_ERR_INVALID);

    /* malloc'd memory as HOST_PINNED: pinned by the backend, then usable by
     * the kernel path in both directions */
    CHECK_STATUS(b->ops->mem_register(b, KVF_MEMORY_HOST_PINNED, host, bytes, &reg), KVF_OK);
    CHECK(reg);
    arena ha = {KVF_MEMORY_HOST_PINNED, host, bytes};
    arena da = {KVF_MEMORY_DEVICE, dev, bytes};
    kvf__copy c[64];
    size_t n = scattered(&da, &ha, 65536, 32, c);
    run_batches(b, KVF_QUEUE_ONBOARD, &da, &ha, c, n, n, "h2d from registered malloc memory",
                KVF__CUDA_PATH_KERNEL);
    n = scattered(&ha, &da, 65536, 32, c);
    run_batches(b, KVF_QUEUE_OFFLOAD, &ha, &da, c, n, n, "d2h into registered malloc memory",
                KVF__CUDA_PATH_KERNEL);
    b->ops->mem_unregister(b, KVF_MEMORY_HOST_PINNED, host);

    /* memory pinned already (cudaMallocHost): nothing to undo */
    void *pinned = NULL;
    CUDA_OK(cudaMallocHost(&pinned, bytes));
    reg = true;
    CHECK_STATUS(b->ops->mem_register(b, KVF_MEMORY_HOST_PINNED, pinned, bytes, &reg), KVF_OK);
    CHECK(!reg);

    /* pageable memory as HOST: copies still right, by copy engines */
    reg = false;
    CHECK_STATUS(b->ops->mem_register(b, KVF_MEMORY_HOST, host, bytes, &reg), KVF_OK);
    CHECK(reg);
    n = scattered(&da, &ha, 65536, 32, c);
    run_batches(b, KVF_QUEUE_ONBOARD, &da, &ha, c, n, n, "h2d from pageable memory",
                KVF__CUDA_PATH_DMA);
    b->ops->mem_unregister(b, KVF_MEMORY_HOST, host);

    /* the backend's own allocations are zeroed */
    void *p[3] = {NULL, NULL, NULL};
    kvf_memory kinds[3] = {KVF_MEMORY_DEVICE, KVF_MEMORY_HOST_PINNED, KVF_MEMORY_HOST};
    uint8_t *img = malloc(bytes), *zero = calloc(1, bytes);
    for (int k = 0; k < 3; k++) {
        CHECK_STATUS(b->ops->mem_alloc(b, kinds[k], bytes, &p[k]), KVF_OK);
        arena a = {kinds[k], p[k], bytes};
        arena_get(&a, img);
        CHECK_MEM_EQ(img, zero, bytes);
        b->ops->mem_free(b, kinds[k], p[k]);
    }
    CHECK_STATUS(b->ops->mem_alloc(b, KVF_MEMORY_DEVICE, 0, &p[0]), KVF_ERR_INVALID);
    free(img);
    free(zero);

    CUDA_OK(cudaFreeHost(pinned));
    free(host);
    CUDA_OK(cudaFree(dev));
    b->ops->destroy(b);
    return 0;
}

int main(void)
{
    arenas_init();
    RUN(test_mem_register);
    arenas_fini();
    return TEST_RESULT();
}
