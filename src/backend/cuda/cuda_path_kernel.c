/* SPDX-License-Identifier: Apache-2.0 */
/* The kernel path: a batch's copies as descriptors in the queue's ring, one
 * upload and one launch of the gather/scatter kernel per ring chunk. */
#include "cuda_private.h"

kvf_status kvf__cuda_submit_kernel(cuda_backend *b, cuda_queue *q, const kvf__copy *copies,
                                   size_t n, kvf__copy_done_fn done, void *arg)
{
    size_t i = 0;
    kvf_status st;
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
                                      q->stream),
                      st, fail);
            CUDA_GOTO(kvf__cuda_copy_launch(q->ring_dev + idx, nd, tiles, b->grid, q->stream), st,
                      fail);
        }
        if ((st = kvf__cuda_finish_record(b, q, r, nd, i == n ? done : NULL, arg)) != KVF_OK)
            goto fail;
        continue;
    fail:
        CUDA_IGNORE(cudaStreamSynchronize(q->stream));
        kvf__cuda_unreserve(r);
        return st;
    } while (i < n);
    return KVF_OK;
}
