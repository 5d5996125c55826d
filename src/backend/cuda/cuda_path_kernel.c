/* SPDX-License-Identifier: Apache-2.0 */
/* The kernel path: a batch's copies as descriptors in the queue's ring, one
 * upload and one launch of the gather/scatter kernel per ring chunk. The
 * uploads go on a stream of their own, so the launches of consecutive
 * calls (the engine hands a large batch over in calls of a few MiB) follow
 * each other on the queue's stream with no copy between them: an upload
 * on the queue's stream would wait for the kernel before it to end, and
 * the next kernel for the upload, idling PCIe at every call. */
#include "cuda_private.h"

#include <stdlib.h>

/* AUTO's rule for the kernel, where it can reach both sides (pinned host
 * memory mapped at its own address, or device memory; never pageable).
 * Each threshold is where another path overtakes it in bench/cuda_paths.c
 * (the paths alone) and `kvferry bench --compare` (through the engine);
 * docs/performance.md has the figures.
 *  - host<->device batches whose mean contiguous run is below
 *    KERNEL_BELOW: each batched DMA copy costs engine setup and host time
 *    that small copies cannot hide, and a few SMs already reach the one-way
 *    rate; from there the copy engines move as much and leave the SMs free.
 *  - 2-D partial copies while rows are short (below KERNEL_ROWS_BELOW);
 *    wide rows go faster as the dma path's flat batched copies, above all
 *    with both directions in flight.
 *  - device<->device: the kernel beats batched copies at every block size,
 *    unless the mean run reaches KERNEL_D2D_BELOW, where one copy nears the
 *    rate of a single large copy.
 *  - never beside the forward pass (KVF__COPY_BESIDE_COMPUTE, host<->device):
 *    alone the kernel wins on small runs, but there it shares the model's
 *    SMs and slows both (bench/plan_ttft.py: 32k tokens loaded layer by
 *    layer in 85 ms by dma against 114 ms by kernel). */
#define KERNEL_BELOW ((size_t)256 << 10)
#define KERNEL_ROWS_BELOW ((size_t)128 << 10)
#define KERNEL_D2D_BELOW ((size_t)64 << 20)

bool kvf__cuda_kernel_fits(cuda_backend *b, cuda_queue *q, const cuda_batch *bt, bool forced)
{
    (void)q;
    if (!b->kernel_ok || !bt->reachable)
        return false;
    if (forced)
        return true;
    size_t run = batch_mean_run(bt);
    if (batch_between(bt, cudaMemoryTypeDevice, cudaMemoryTypeDevice))
        return bt->strided || run < KERNEL_D2D_BELOW;
    if (bt->flags & KVF__COPY_BESIDE_COMPUTE)
        return false;
    return run < (bt->strided ? KERNEL_ROWS_BELOW : KERNEL_BELOW);
}

/* The path's state on a queue: its descriptors live in the queue's ring,
 * uploaded on `up`; `ev_up` marks an upload's end for the launch that
 * reads it. */
typedef struct kernel_state {
    cudaStream_t up;
    cudaEvent_t ev_up;
} kernel_state;

void kvf__cuda_kernel_fini(void *state)
{
    kernel_state *ks = state;
    if (!ks)
        return;
    if (ks->up) {
        CUDA_IGNORE(cudaStreamSynchronize(ks->up));
        CUDA_IGNORE(cudaStreamDestroy(ks->up));
    }
    if (ks->ev_up)
        CUDA_IGNORE(cudaEventDestroy(ks->ev_up));
    free(ks);
}

/* The upload stream (at the queue's priority) and its event, at the
 * path's first batch on q. A ring range is reserved only once the
 * kernels that read it before have ended (their records are free), so an
 * upload may run ahead of the queue's stream. */
static kvf_status kernel_state_of(cuda_queue *q, kernel_state **ks_p)
{
    kernel_state *ks = queue_path_state(q, KVF__CUDA_PATH_KERNEL, sizeof *ks);
    if (!ks)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: no memory for the kernel path's state");
    if (!ks->up) {
        int prio = 0;
        CUDA_RET(cudaStreamGetPriority(q->stream, &prio));
        CUDA_RET(cudaStreamCreateWithPriority(&ks->up, cudaStreamNonBlocking, prio));
    }
    if (!ks->ev_up)
        CUDA_RET(cudaEventCreateWithFlags(&ks->ev_up, cudaEventDisableTiming));
    *ks_p = ks;
    return KVF_OK;
}

/* The batch's copies (no empty ones among them after filtering) as ring
 * chunks, one upload and one launch each. */
kvf_status kvf__cuda_kernel_submit(cuda_backend *b, cuda_queue *q, const cuda_batch *bt,
                                   kvf__copy_done_fn done, void *arg)
{
    const kvf__copy *copies = bt->copies;
    size_t n = bt->n, i = 0;
    kernel_state *ks = NULL;
    kvf_status st = kernel_state_of(q, &ks);
    if (st != KVF_OK || (st = kvf__cuda_main_only(q)) != KVF_OK)
        return st;
    do {
        uint32_t idx;
        uint32_t want = n - i < CHUNK_DESCS ? (uint32_t)(n - i) : CHUNK_DESCS;
        batch_record *r = kvf__cuda_reserve(q, want, &idx);
        kvf__cuda_desc *d = q->ring_host + idx;
        uint32_t nd = 0;
        uint64_t tiles = 0;
        for (; i < n && nd < want; i++) {
            const kvf__copy *c = &copies[i];
            if (c->width == 0 || c->rows == 0)
                continue;
            size_t width = c->width, rows = c->rows;
            size_t dp = c->dpitch, sp = c->spitch;
            if (copy_contiguous(c)) {
                width = c->width * c->rows;
                rows = 1;
                dp = sp = 0;
            }
            /* a row longer than 2^31 bytes is cut into rows of 2^30 */
            if (width > (1u << 31) && rows == 1) {
                size_t piece = (size_t)1 << 30;
                if (width % piece == 0) {
                    rows = width / piece;
                    width = piece;
                    dp = sp = piece;
                } else {
                    kvf__cuda_unreserve(r);
                    return kvf__fail(KVF_ERR_UNSUPPORTED,
                                     "cuda: copy %zu: %zu bytes too long for the kernel", i, width);
                }
            } else if (width > (1u << 31)) {
                kvf__cuda_unreserve(r);
                return kvf__fail(KVF_ERR_UNSUPPORTED,
                                 "cuda: copy %zu: row of %zu bytes too long for the kernel", i,
                                 width);
            }
            uint32_t tpr = (uint32_t)((width + KVF_CUDA_TILE_BYTES - 1) / KVF_CUDA_TILE_BYTES);
            d[nd].dst = (uint64_t)(uintptr_t)c->dst;
            d[nd].src = (uint64_t)(uintptr_t)c->src;
            d[nd].dpitch = dp;
            d[nd].spitch = sp;
            d[nd].tile_begin = tiles;
            d[nd].width = (uint32_t)width;
            d[nd].tiles_per_row = tpr;
            tiles += (uint64_t)tpr * rows;
            nd++;
        }
        if (nd > 0) {
            CUDA_GOTO(cudaMemcpyAsync(q->ring_dev + idx, d, nd * sizeof *d, cudaMemcpyHostToDevice,
                                      ks->up),
                      st, fail);
            CUDA_GOTO(cudaEventRecord(ks->ev_up, ks->up), st, fail);
            CUDA_GOTO(cudaStreamWaitEvent(q->stream, ks->ev_up, 0), st, fail);
            KVF_TIMELINE(KVF_TL_GPU_UPLOADED, (uint64_t)q->index, nd);
            CUDA_GOTO(kvf__cuda_copy_launch(q->ring_dev + idx, nd, tiles, b->grid, q->stream), st,
                      fail);
        }
        if ((st = kvf__cuda_finish_record(b, q, r, nd, i == n ? done : NULL, arg)) != KVF_OK)
            goto fail;
        continue;
    fail:
        CUDA_IGNORE(cudaStreamSynchronize(ks->up));
        CUDA_IGNORE(cudaStreamSynchronize(q->stream));
        kvf__cuda_unreserve(r);
        return st;
    } while (i < n);
    return KVF_OK;
}
