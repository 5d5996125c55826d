/* SPDX-License-Identifier: Apache-2.0 */
/* The copy-engine path: no SMs taken from the model. It takes every batch
 * the paths before it leave: pageable memory, which the kernel cannot reach;
 * long runs, where the copy engines move as much as the SMs would; and
 * host<->device batches beside the forward pass (KVF__COPY_BESIDE_COMPUTE),
 * where the kernel-driven paths would share the model's SMs and the copy
 * engines take nothing from it. */
#include "cuda_private.h"

#include <stdlib.h>
#include <string.h>

/* A queue's scratch for this path, grown on demand and kept. */
typedef struct dma_state {
    void **dsts;
    const void **srcs;
    size_t *sizes;
    size_t flat_cap;
#if KVF_CUDA_3D_BATCH
    struct cudaMemcpy3DBatchOp *ops3d;
    size_t ops3d_cap;
#endif
} dma_state;

bool kvf__cuda_dma_fits(cuda_backend *b, cuda_queue *q, const cuda_batch *bt, bool forced)
{
    (void)b, (void)q, (void)bt, (void)forced;
    return true;
}

void kvf__cuda_dma_fini(void *state)
{
    dma_state *ds = state;
    if (!ds)
        return;
    free(ds->dsts);
    free(ds->srcs);
    free(ds->sizes);
#if KVF_CUDA_3D_BATCH
    free(ds->ops3d);
#endif
    free(ds);
}

/* Grows ds's lists of flat copies to n entries at least. */
static kvf_status grow_flat(dma_state *ds, size_t n)
{
    if (n <= ds->flat_cap)
        return KVF_OK;
    size_t cap = ds->flat_cap ? ds->flat_cap : 256;
    while (cap < n)
        cap *= 2;
    void **d = realloc(ds->dsts, cap * sizeof *d);
    if (d)
        ds->dsts = d;
    const void **s = realloc(ds->srcs, cap * sizeof *s);
    if (s)
        ds->srcs = s;
    size_t *z = realloc(ds->sizes, cap * sizeof *z);
    if (z)
        ds->sizes = z;
    if (!d || !s || !z)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: cannot grow copy lists to %zu", cap);
    ds->flat_cap = cap;
    return KVF_OK;
}

#if KVF_CUDA_3D_BATCH
static kvf_status grow_3d(dma_state *ds, size_t n)
{
    if (n <= ds->ops3d_cap)
        return KVF_OK;
    size_t cap = ds->ops3d_cap ? ds->ops3d_cap : 64;
    while (cap < n)
        cap *= 2;
    struct cudaMemcpy3DBatchOp *o = realloc(ds->ops3d, cap * sizeof *o);
    if (!o)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: cannot grow 2-D copy list to %zu", cap);
    ds->ops3d = o;
    ds->ops3d_cap = cap;
    return KVF_OK;
}
#endif

/* Flat copies k..k+m-1 of ds's lists, one call on stream s. */
static kvf_status dma_flat(dma_state *ds, cudaStream_t s, size_t k, size_t m)
{
    if (m == 1) {
        CUDA_RET(cudaMemcpyAsync(ds->dsts[k], ds->srcs[k], ds->sizes[k], cudaMemcpyDefault, s));
        return KVF_OK;
    }
#if CUDART_VERSION >= 12080
    {
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof attr);
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
        CUDA_RET(cudaMemcpyBatchAsync(ds->dsts + k, ds->srcs + k, ds->sizes + k, m, &attr,
                                      &attr_idx, 1, s));
#else
        size_t fail_idx = 0;
        CUDA_RET(cudaMemcpyBatchAsync(ds->dsts + k, (void **)(ds->srcs + k), ds->sizes + k, m,
                                      &attr, &attr_idx, 1, &fail_idx, s));
#endif
    }
#else
    for (size_t i = k; i < k + m; i++)
        CUDA_RET(cudaMemcpyAsync(ds->dsts[i], ds->srcs[i], ds->sizes[i], cudaMemcpyDefault, s));
#endif
    return KVF_OK;
}

/* Copy-engine path: merged contiguous copies (and the rows of wide 2-D
 * copies) in batched calls (see dma_send), other 2-D copies in one 3-D
 * batch call. */
#define DMA_FLAT_ROWS_FROM ((size_t)64 << 10)

/* Appends copy c, contiguous or of wide rows, to ds's flat lists (nflat
 * entries so far), merged with the entry before where they continue each
 * other on both sides. Returns the new count. */
static size_t dma_add_flat(dma_state *ds, const kvf__copy *c, size_t nflat)
{
    bool flat = copy_contiguous(c);
    size_t nrows = flat ? 1 : c->rows, len = flat ? c->width * c->rows : c->width;
    for (size_t row = 0; row < nrows; row++) {
        char *d = (char *)c->dst + row * c->dpitch;
        const char *sr = (const char *)c->src + row * c->spitch;
        if (nflat > 0 && (char *)ds->dsts[nflat - 1] + ds->sizes[nflat - 1] == d &&
            (const char *)ds->srcs[nflat - 1] + ds->sizes[nflat - 1] == sr) {
            ds->sizes[nflat - 1] += len;
            continue;
        }
        ds->dsts[nflat] = d;
        ds->srcs[nflat] = sr;
        ds->sizes[nflat] = len;
        nflat++;
    }
    return nflat;
}

/* 2-D copy c as the n2d-th op of ds's 3-D batch, or (before CUDA 13) queued
 * at once on stream s. */
static kvf_status dma_add_2d(dma_state *ds, cudaStream_t s, const kvf__copy *c, size_t n2d)
{
#if KVF_CUDA_3D_BATCH
    (void)s;
#endif
#if KVF_CUDA_3D_BATCH
    struct cudaMemcpy3DBatchOp *o = &ds->ops3d[n2d];
    memset(o, 0, sizeof *o);
    o->src.type = cudaMemcpyOperandTypePointer;
    o->src.op.ptr.ptr = (void *)c->src;
    o->src.op.ptr.rowLength = c->spitch;
    o->src.op.ptr.layerHeight = 0;
    o->dst.type = cudaMemcpyOperandTypePointer;
    o->dst.op.ptr.ptr = c->dst;
    o->dst.op.ptr.rowLength = c->dpitch;
    o->dst.op.ptr.layerHeight = 0;
    o->extent = make_cudaExtent(c->width, c->rows, 1);
    o->srcAccessOrder = cudaMemcpySrcAccessOrderStream;
#else
    CUDA_RET(cudaMemcpy2DAsync(c->dst, c->dpitch, c->src, c->spitch, c->width, c->rows,
                               cudaMemcpyDefault, s));
#endif
    return KVF_OK;
}

/* Queues on stream s the nflat flat copies and the n2d 2-D ops collected
 * in ds. */
static kvf_status dma_send(dma_state *ds, cudaStream_t s, size_t nflat, size_t n2d)
{
    kvf_status st;
    /* in calls of 2, 2, 4, 8... copies: cudaMemcpyBatchAsync takes host
     * time per copy before the engines start, so the first copies go on
     * their way while the rest are handed over (a gain at 1-4 MiB blocks
     * in `kvferry bench --compare`) */
    for (size_t k = 0, grp = 2; k < nflat;) {
        size_t m = nflat - k < grp ? nflat - k : grp;
        if ((st = dma_flat(ds, s, k, m)) != KVF_OK)
            return st;
        k += m;
        if (k > 2)
            grp *= 2;
    }
#if KVF_CUDA_3D_BATCH
    if (n2d == 1) {
        const struct cudaMemcpy3DBatchOp *o = &ds->ops3d[0];
        CUDA_RET(cudaMemcpy2DAsync(o->dst.op.ptr.ptr, o->dst.op.ptr.rowLength, o->src.op.ptr.ptr,
                                   o->src.op.ptr.rowLength, o->extent.width, o->extent.height,
                                   cudaMemcpyDefault, s));
    } else if (n2d > 1) {
        CUDA_RET(cudaMemcpy3DBatchAsync(n2d, ds->ops3d, 0, s));
    }
#else
    (void)n2d;
#endif
    return KVF_OK;
}

kvf_status kvf__cuda_dma_submit(cuda_backend *b, cuda_queue *q, const cuda_batch *bt,
                                kvf__copy_done_fn done, void *arg)
{
    const kvf__copy *copies = bt->copies;
    size_t n = bt->n;
    kvf_status st;
    size_t nflat = 0, n2d = 0, flat_need = 0;
    dma_state *ds = queue_path_state(q, KVF__CUDA_PATH_DMA, sizeof *ds);
    if (!ds)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: no memory for the dma path's lists");
    if ((st = kvf__cuda_main_only(q)) != KVF_OK)
        return st;
    /* 2-D copies of wide rows go as one flat copy per row: the copy engines
     * move a batch of flat copies faster than the same rows as 2-D ops */
    for (size_t i = 0; i < n; i++)
        flat_need += copy_contiguous(&copies[i]) || copies[i].width < DMA_FLAT_ROWS_FROM
                         ? 1
                         : copies[i].rows;
    if ((st = grow_flat(ds, flat_need)) != KVF_OK)
        return st;
#if KVF_CUDA_3D_BATCH
    if ((st = grow_3d(ds, n)) != KVF_OK)
        return st;
#endif
    uint32_t idx;
    batch_record *r = kvf__cuda_reserve(q, 0, &idx);
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (c->width == 0 || c->rows == 0)
            continue;
        if (copy_contiguous(c) || c->width >= DMA_FLAT_ROWS_FROM) {
            nflat = dma_add_flat(ds, c, nflat);
            continue;
        }
        if ((st = dma_add_2d(ds, q->stream, c, n2d)) != KVF_OK)
            goto fail;
        n2d++;
    }
    if ((st = dma_send(ds, q->stream, nflat, n2d)) != KVF_OK)
        goto fail;
    if ((st = kvf__cuda_finish_record(b, q, r, n, done, arg)) != KVF_OK)
        goto fail;
    return KVF_OK;
fail:
    CUDA_IGNORE(cudaStreamSynchronize(q->stream));
    kvf__cuda_unreserve(r);
    return st;
}
