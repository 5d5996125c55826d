/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The copy paths as a table (made from KVF_CUDA_PATHS, cuda_paths.h), as
 * NCCL tries its transports in order and takes the first whose canConnect
 * says yes: a batch is described once (what its rules read), then each path
 * in order is asked whether it takes it. Each path's rule and its
 * thresholds are in its own file:
 *  - staged (cuda_path_staged.c): whole blocks below 256 KiB whose host
 *    blocks tile one pinned range, host<->device;
 *  - kernel (cuda_path_kernel.c): short runs between memory it can reach;
 *  - dma (cuda_path_dma.c): everything else, pageable memory and batches
 *    beside the forward pass among them.
 * KVF_CUDA_COPY (or cuda.copy) forces a path wherever that path can take
 * the batch; elsewhere AUTO's order decides.
 */
#include "cuda_private.h"

#include <stddef.h>

#define KVF__CUDA_PATH_ENTRY(ID, name)                                                             \
    [KVF__CUDA_PATH_##ID] = {#name, kvf__cuda_##name##_fits, kvf__cuda_##name##_submit,            \
                             kvf__cuda_##name##_fini},
const cuda_path_ops kvf__cuda_path_table[KVF__CUDA_PATH_END] = {
    [KVF__CUDA_PATH_NONE] = {"auto", NULL, NULL, NULL}, KVF_CUDA_PATHS(KVF__CUDA_PATH_ENTRY)};
#undef KVF__CUDA_PATH_ENTRY

const char *kvf__cuda_path_name(int path)
{
    return path >= 0 && path < KVF__CUDA_PATH_END ? kvf__cuda_path_table[path].name : "?";
}

void kvf__cuda_batch_describe(cuda_batch *bt, const kvf__copy *copies, size_t n, unsigned flags,
                              enum cudaMemoryType dst_kind, enum cudaMemoryType src_kind,
                              bool pageable)
{
    *bt = (cuda_batch){.copies = copies, .n = n, .flags = flags};
    bt->dst_kind = dst_kind;
    bt->src_kind = src_kind;
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (!c->width || !c->rows)
            continue;
        if (copy_contiguous(c)) {
            bt->runs++;
        } else {
            bt->runs += c->rows;
            bt->strided++;
        }
        bt->bytes += c->width * c->rows;
    }
    bt->empty = bt->runs == 0;
    bt->reachable = !bt->empty && dst_kind != cudaMemoryTypeUnregistered &&
                    src_kind != cudaMemoryTypeUnregistered && !pageable;
}

void kvf__cuda_batch_classify(cuda_backend *b, cuda_batch *bt, const kvf__copy *copies, size_t n,
                              unsigned flags)
{
    const kvf__copy *first = NULL;
    for (size_t i = 0; i < n && !first; i++)
        if (copies[i].width && copies[i].rows)
            first = &copies[i];
    enum cudaMemoryType td = cudaMemoryTypeUnregistered, ts = cudaMemoryTypeUnregistered;
    bool pageable = false;
    if (first) {
        td = kvf__cuda_pointer_type(first->dst);
        ts = kvf__cuda_pointer_type(first->src);
        /* the ranges are looked through only where CUDA knows both sides */
        pageable = td != cudaMemoryTypeUnregistered && ts != cudaMemoryTypeUnregistered &&
                   kvf__cuda_touches_pageable(b, copies, n);
    }
    kvf__cuda_batch_describe(bt, copies, n, flags, td, ts, pageable);
}

int kvf__cuda_path_pick(cuda_backend *b, cuda_queue *q, const cuda_batch *bt)
{
    int f = b->forced;
    if (f > KVF__CUDA_PATH_NONE && f < KVF__CUDA_PATH_END) {
        if (kvf__cuda_path_table[f].fits(b, q, bt, true))
            return f;
        KVF_LOG(KVF_LOG_DEBUG, "cuda: the %s path cannot take a batch of %zu copies",
                kvf__cuda_path_name(f), bt->n);
    }
    for (int p = KVF__CUDA_PATH_NONE + 1; p < KVF__CUDA_PATH_END - 1; p++)
        if (kvf__cuda_path_table[p].fits(b, q, bt, false))
            return p;
    return KVF__CUDA_PATH_END - 1; /* the last path takes every batch */
}

int kvf__cuda_forced_path(const kvf_engine_config *cfg)
{
    int mode = KVF_CUDA_COPY_AUTO;
    if (cfg && cfg->struct_size >= offsetof(kvf_engine_config, cuda.copy) + sizeof cfg->cuda.copy)
        mode = cfg->cuda.copy;
    if (mode == KVF_CUDA_COPY_KERNEL)
        return KVF__CUDA_PATH_KERNEL;
    if (mode == KVF_CUDA_COPY_DMA)
        return KVF__CUDA_PATH_DMA;
    /* the environment names any path (the staged one is not in the API:
     * tests and benchmarks force it) */
    const char *names[KVF__CUDA_PATH_END - 1];
    for (int p = 1; p < KVF__CUDA_PATH_END; p++)
        names[p - 1] = kvf__cuda_path_table[p].name;
    int i = kvf__env_choice("KVF_CUDA_COPY", names, KVF__CUDA_PATH_END - 1);
    return i >= 0 ? i + 1 : KVF__CUDA_PATH_NONE;
}
