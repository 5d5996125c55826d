/* SPDX-License-Identifier: Apache-2.0 */
/* AUTO: which copy path takes a batch. */
#include "cuda_private.h"

/* AUTO's rule. Each threshold is where one path overtakes another in
 * bench/cuda_paths.c (the paths alone) and `kvferry bench --compare`
 * (through the engine); docs/performance.md has the figures.
 *  - whole blocks below AUTO_STAGED_BELOW whose host blocks tile one
 *    pinned range (an engine part of secondary slots): staged, because one
 *    DMA per chunk beats both per-block DMA setup and the kernel's mapped
 *    accesses there. From that size dma moves as much, both ways at once
 *    too (staged stops short both ways), and leaves the SMs free.
 *  - other host<->device batches whose mean contiguous run is below
 *    AUTO_KERNEL_BELOW: kernel, because each batched DMA copy costs engine
 *    setup and host time that small copies cannot hide; a few SMs already
 *    reach the one-way rate.
 *  - 2-D partial copies: kernel while rows are short, dma (wide rows sent
 *    as flat batched copies) from AUTO_ROWS_DMA_FROM, where the copy
 *    engines win, above all with both directions in flight.
 *  - device<->device: kernel, which beats batched copies at every block
 *    size, unless the mean run reaches AUTO_D2D_DMA_FROM, where one copy
 *    nears the rate of a single large copy.
 *  - host<->device batches that run beside the forward pass (layer-wise,
 *    KVF__COPY_BESIDE_COMPUTE): dma at every size. Alone the kernel and
 *    staged paths win on small runs, but beside a forward pass they share
 *    its SMs and slow both; the copy engines take nothing from it
 *    (bench/plan_ttft.py: 32k tokens loaded layer by layer in 85 ms by
 *    dma against 114 ms by kernel).
 * Pageable memory always goes by dma: the kernel cannot reach it. */
#define AUTO_KERNEL_BELOW (256u * 1024u)
#define AUTO_STAGED_BELOW ((size_t)256 << 10)
#define AUTO_ROWS_DMA_FROM ((size_t)128 << 10)
#define AUTO_D2D_DMA_FROM ((size_t)64 << 20)

int kvf__cuda_choose_path(cuda_backend *b, const kvf__copy *copies, size_t n, unsigned flags,
                          int *stage_p)
{
    *stage_p = -1;
    if (!b->kernel_ok || b->mode == KVF_CUDA_COPY_DMA)
        return PATH_DMA;
    /* the first copy's pointers classify the batch: the engine's batches
     * move between one pair of pool kinds */
    const kvf__copy *first = NULL;
    for (size_t i = 0; i < n && !first; i++)
        if (copies[i].width && copies[i].rows)
            first = &copies[i];
    if (!first)
        return PATH_DMA;
    enum cudaMemoryType td = kvf__cuda_pointer_type(first->dst),
                        ts = kvf__cuda_pointer_type(first->src);
    if (td == cudaMemoryTypeUnregistered || ts == cudaMemoryTypeUnregistered ||
        kvf__cuda_touches_pageable(b, copies, n)) {
        if (b->mode == KVF_CUDA_COPY_KERNEL)
            KVF_LOG(KVF_LOG_DEBUG, "cuda: batch touches pageable memory: dma instead of kernel");
        return PATH_DMA;
    }
    if (b->mode == KVF_CUDA_COPY_KERNEL)
        return PATH_KERNEL;
    if (td == cudaMemoryTypeHost && ts == cudaMemoryTypeDevice)
        *stage_p = 1;
    else if (td == cudaMemoryTypeDevice && ts == cudaMemoryTypeHost)
        *stage_p = 0;
    size_t runs = 0, bytes = 0, strided = 0;
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (!c->width || !c->rows)
            continue;
        if (copy_contiguous(c)) {
            runs++;
        } else {
            runs += c->rows;
            strided++;
        }
        bytes += c->width * c->rows;
    }
    if (td == cudaMemoryTypeDevice && ts == cudaMemoryTypeDevice)
        return !strided && bytes / runs >= AUTO_D2D_DMA_FROM ? PATH_DMA : PATH_KERNEL;
    if (flags & KVF__COPY_BESIDE_COMPUTE) {
        *stage_p = -1;
        return PATH_DMA;
    }
    /* AUTO stages whole blocks below AUTO_STAGED_BELOW; the staged mode
     * (tests, benchmarks) whatever fits */
    if (b->mode != MODE_STAGED && (strided || bytes / runs >= AUTO_STAGED_BELOW))
        *stage_p = -1;
    if (strided)
        return bytes / runs < AUTO_ROWS_DMA_FROM ? PATH_KERNEL : PATH_DMA;
    return bytes / runs < AUTO_KERNEL_BELOW ? PATH_KERNEL : PATH_DMA;
}
