/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The staged path: PyTorch's shape (gather in HBM, one large DMA) for batches whose host
 * sides tile one pinned range: every copy has the same shape (`rows` rows
 * of `width` bytes, `hpitch` apart on the host side, `dpitch` on the
 * device side; a contiguous copy is one row) and the host blocks are all
 * of lo + k * stride for k < count, stride = rows * hpitch, each once, in
 * any order (the secondary slots of an engine part). Offload: a kernel on
 * `aux` packs the blocks of chunk k into a staging slot in device memory,
 * then one DMA on the queue's stream (2-D when the host rows are strided)
 * writes them to the host while the kernel packs chunk k + 1. Onboard: one
 * DMA per chunk into a slot, then a kernel scatters it. The copy engines
 * see runs of up to STAGE_CHUNK bytes; the kernels move bytes inside HBM.
 */
#include "cuda_private.h"

#include <stdlib.h>
#include <string.h>

/* A ring of STAGE_SLOTS chunks of STAGE_CHUNK bytes of device memory per
 * queue (allocated at the first staged batch), so the gather of one chunk
 * overlaps the DMA of the one before. */
#define STAGE_CHUNK ((size_t)16 << 20)
#define STAGE_SLOTS 4u

/* AUTO stages host<->device batches of whole blocks below STAGED_BELOW
 * whose host blocks tile one pinned range (an engine part of secondary
 * slots): one DMA per chunk beats both per-block DMA setup and the kernel's
 * mapped accesses there. From that size the dma path moves as much, both
 * ways at once too (staged stops short both ways), and leaves the SMs free.
 * Never beside the forward pass: its kernels would share the model's SMs.
 * Forced (KVF_CUDA_COPY=staged), it takes whatever batch tiles a range. */
#define STAGED_BELOW ((size_t)256 << 10)

/* A batch whose copies share one shape and whose host blocks are
 * lo + k * stride for k < count, each once. */
typedef struct stage_plan {
    uintptr_t lo; /* host address of block 0 */
    size_t rows, width, hpitch, dpitch;
    size_t stride, count;
} stage_plan;

/* The path's state on a queue. */
typedef struct staged_state {
    stage_plan plan; /* of the batch fits took, for submit */
    bool to_host;
    uint8_t *stage;                   /* STAGE_SLOTS * STAGE_CHUNK, device */
    uint64_t stage_next;              /* chunks staged so far */
    cudaEvent_t ev_ready;             /* a chunk's first step is done */
    cudaEvent_t ev_free[STAGE_SLOTS]; /* a slot's last use is over */
    /* scratch of fits: host blocks seen, the copy of each host block */
    uint64_t *bits;
    size_t bits_cap;
    uint32_t *kinv;
    size_t kinv_cap;
} staged_state;

void kvf__cuda_staged_fini(void *state)
{
    staged_state *ss = state;
    if (!ss)
        return;
    if (ss->ev_ready)
        CUDA_IGNORE(cudaEventDestroy(ss->ev_ready));
    for (size_t i = 0; i < STAGE_SLOTS; i++)
        if (ss->ev_free[i])
            CUDA_IGNORE(cudaEventDestroy(ss->ev_free[i]));
    if (ss->stage)
        CUDA_IGNORE(cudaFree(ss->stage));
    free(ss->bits);
    free(ss->kinv);
    free(ss);
}

static kvf_status grow_scratch(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return KVF_OK;
    size_t c = *cap ? *cap : 256;
    while (c < n)
        c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: cannot grow staging scratch to %zu", c);
    *p = np;
    *cap = c;
    return KVF_OK;
}

/* Whether copies[0..n) tile one pinned host range (see above); fills *pl
 * and ss->kinv[k], the copy of host block k. q->lock held. */
static bool plan_batch(cuda_backend *b, staged_state *ss, const kvf__copy *copies, size_t n,
                       bool to_host, stage_plan *pl)
{
    size_t rows = 0, width = 0, hp = 0, dp = 0, count = 0;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (!c->width || !c->rows)
            continue;
        size_t r = c->rows, w = c->width;
        size_t h = to_host ? c->dpitch : c->spitch, d = to_host ? c->spitch : c->dpitch;
        if (copy_contiguous(c)) {
            w *= r;
            r = 1;
            h = d = w;
        }
        if (count == 0) {
            rows = r;
            width = w;
            hp = h;
            dp = d;
        } else if (r != rows || w != width || (r > 1 && (h != hp || d != dp))) {
            return false;
        }
        uintptr_t a = (uintptr_t)(to_host ? c->dst : c->src);
        lo = a < lo ? a : lo;
        hi = a > hi ? a : hi;
        count++;
    }
    size_t block = rows * width, stride = rows * hp;
    /* a chunk holds whole blocks, and no more of them than one launch takes */
    if (count < 2 || count > UINT32_MAX || block < STAGE_CHUNK / CHUNK_DESCS ||
        block > STAGE_CHUNK || hi - lo != (count - 1) * stride)
        return false;
    if (grow_scratch((void **)&ss->bits, &ss->bits_cap, (count + 63) / 64, sizeof *ss->bits) !=
            KVF_OK ||
        grow_scratch((void **)&ss->kinv, &ss->kinv_cap, count, sizeof *ss->kinv) != KVF_OK)
        return false;
    memset(ss->bits, 0, (count + 63) / 64 * sizeof *ss->bits);
    /* block index by a reciprocal (a 64-bit division per copy costs more
     * than the rest of the pass), checked exactly */
    double inv = 1.0 / (double)stride;
    for (size_t i = 0; i < n; i++) {
        const kvf__copy *c = &copies[i];
        if (!c->width || !c->rows)
            continue;
        size_t off = (uintptr_t)(to_host ? c->dst : c->src) - lo;
        size_t k = (size_t)((double)off * inv + 0.5);
        if (k >= count || k * stride != off || (ss->bits[k / 64] >> (k % 64) & 1u))
            return false;
        ss->bits[k / 64] |= (uint64_t)1 << (k % 64);
        ss->kinv[k] = (uint32_t)i;
    }
    /* count distinct blocks in [0, count): all of them; the DMAs stay
     * inside one pinned allocation */
    if (!kvf__cuda_pinned_covers(b, lo, hi + (rows - 1) * hp + width))
        return false;
    *pl = (stage_plan){lo, rows, width, hp, dp, stride, count};
    return true;
}

bool kvf__cuda_staged_fits(cuda_backend *b, cuda_queue *q, const cuda_batch *bt, bool forced)
{
    if (!b->kernel_ok || !bt->reachable || (bt->flags & KVF__COPY_BESIDE_COMPUTE))
        return false;
    bool to_host = batch_between(bt, cudaMemoryTypeHost, cudaMemoryTypeDevice);
    if (!to_host && !batch_between(bt, cudaMemoryTypeDevice, cudaMemoryTypeHost))
        return false;
    if (!forced && (bt->strided || batch_mean_run(bt) >= STAGED_BELOW))
        return false;
    staged_state *ss = queue_path_state(q, KVF__CUDA_PATH_STAGED, sizeof *ss);
    if (!ss || !plan_batch(b, ss, bt->copies, bt->n, to_host, &ss->plan))
        return false;
    ss->to_host = to_host;
    return true;
}

/* The DMA of nb blocks between the host range and a staging slot: one
 * contiguous run, or rows of `width` at the host's pitch (packed in the
 * slot). */
static cudaError_t stage_dma(const stage_plan *pl, bool to_host, char *host, uint8_t *stage,
                             size_t nb, cudaStream_t s)
{
    if (pl->rows == 1 || pl->hpitch == pl->width) {
        size_t len = nb * pl->rows * pl->width;
        return to_host ? cudaMemcpyAsync(host, stage, len, cudaMemcpyDeviceToHost, s)
                       : cudaMemcpyAsync(stage, host, len, cudaMemcpyHostToDevice, s);
    }
    size_t w = pl->width, h = nb * pl->rows;
    return to_host ? cudaMemcpy2DAsync(host, pl->hpitch, stage, w, w, h, cudaMemcpyDeviceToHost, s)
                   : cudaMemcpy2DAsync(stage, w, host, pl->hpitch, w, h, cudaMemcpyHostToDevice, s);
}

/* How a plan's blocks fall into staging chunks and kernel tiles. */
typedef struct stage_geom {
    size_t block;             /* bytes of one block */
    size_t bpc;               /* blocks per chunk */
    uint32_t tpr;             /* kernel tiles per row */
    uint64_t tiles_per_block; /* kernel tiles per block */
} stage_geom;

/* Writes into ring[0..b1 - b0) the descriptors of host blocks b0..b1, the
 * group of chunks that starts at chunk k; descriptor j of the group is host
 * block b0 + j: chunk by chunk, each block's tiles after those of the
 * blocks before it. */
static void stage_fill(const staged_state *ss, const kvf__copy *copies, bool to_host,
                       const stage_plan *pl, const stage_geom *g, size_t k, size_t b0, size_t b1,
                       kvf__cuda_desc *ring)
{
    const size_t C = STAGE_CHUNK;
    uint64_t slot0 = ss->stage_next;
    for (size_t kb = b0; kb < b1; kb++) {
        const kvf__copy *c = &copies[ss->kinv[kb]];
        size_t ck = kb / g->bpc, in = kb - ck * g->bpc;
        uint64_t sp =
            (uint64_t)(uintptr_t)(ss->stage + ((slot0 + ck - k) % STAGE_SLOTS) * C + in * g->block);
        uint64_t dv = (uint64_t)(uintptr_t)(to_host ? c->src : c->dst);
        kvf__cuda_desc *d = &ring[kb - b0];
        d->dst = to_host ? sp : dv;
        d->src = to_host ? dv : sp;
        d->dpitch = to_host ? pl->width : pl->dpitch;
        d->spitch = to_host ? pl->dpitch : pl->width;
        d->tile_begin = in * g->tiles_per_block;
        d->width = (uint32_t)pl->width;
        d->tiles_per_row = g->tpr;
    }
}

/* Queues chunk k, whose group starts at host block b0 with its descriptors
 * at group_descs (device memory): offload gathers it on aux into the next
 * staging slot and DMAs the slot to the host on the queue's stream;
 * onboard the reverse. */
static kvf_status stage_chunk(cuda_backend *b, cuda_queue *q, staged_state *ss, bool to_host,
                              const stage_plan *pl, const stage_geom *g, size_t k,
                              const kvf__cuda_desc *group_descs, size_t b0)
{
    const size_t C = STAGE_CHUNK, bpc = g->bpc;
    size_t slot = ss->stage_next++ % STAGE_SLOTS;
    uint8_t *stage = ss->stage + slot * C;
    size_t first = k * bpc, nb = pl->count - first < bpc ? pl->count - first : bpc;
    char *host = (char *)pl->lo + first * pl->stride;
    const kvf__cuda_desc *descs = group_descs + (first - b0);
    uint64_t tiles = nb * g->tiles_per_block;
    cudaStream_t ds = q->stream;
    if (to_host) {
        CUDA_RET(cudaStreamWaitEvent(q->aux, ss->ev_free[slot], 0));
        CUDA_RET(kvf__cuda_copy_launch(descs, (uint32_t)nb, tiles, b->grid, q->aux));
        CUDA_RET(cudaEventRecord(ss->ev_ready, q->aux));
        CUDA_RET(cudaStreamWaitEvent(ds, ss->ev_ready, 0));
        CUDA_RET(stage_dma(pl, true, host, stage, nb, ds));
        CUDA_RET(cudaEventRecord(ss->ev_free[slot], ds));
    } else {
        CUDA_RET(cudaStreamWaitEvent(ds, ss->ev_free[slot], 0));
        CUDA_RET(stage_dma(pl, false, host, stage, nb, ds));
        CUDA_RET(cudaEventRecord(ss->ev_ready, ds));
        CUDA_RET(cudaStreamWaitEvent(q->aux, ss->ev_ready, 0));
        CUDA_RET(kvf__cuda_copy_launch(descs, (uint32_t)nb, tiles, b->grid, q->aux));
        CUDA_RET(cudaEventRecord(ss->ev_free[slot], q->aux));
    }
    return KVF_OK;
}

/* The staging ring and its events, at the first staged batch of a queue. */
static kvf_status stage_ring(staged_state *ss)
{
    if (!ss->stage)
        CUDA_RET(cudaMalloc((void **)&ss->stage, (size_t)STAGE_SLOTS * STAGE_CHUNK));
    if (!ss->ev_ready)
        CUDA_RET(cudaEventCreateWithFlags(&ss->ev_ready, cudaEventDisableTiming));
    for (size_t i = 0; i < STAGE_SLOTS; i++)
        if (!ss->ev_free[i])
            CUDA_RET(cudaEventCreateWithFlags(&ss->ev_free[i], cudaEventDisableTiming));
    return KVF_OK;
}

kvf_status kvf__cuda_staged_submit(cuda_backend *b, cuda_queue *q, const cuda_batch *bt,
                                   kvf__copy_done_fn done, void *arg)
{
    staged_state *ss = q->path_state[KVF__CUDA_PATH_STAGED]; /* made by fits */
    const kvf__copy *copies = bt->copies;
    const stage_plan *pl = &ss->plan;
    bool to_host = ss->to_host;
    kvf_status st;
    const size_t C = STAGE_CHUNK, block = pl->rows * pl->width;
    const size_t bpc = C / block; /* blocks per chunk */
    const size_t nchunks = (pl->count + bpc - 1) / bpc;
    /* chunks per launch group: their descriptors fit one ring reservation */
    const size_t cpg = CHUNK_DESCS / bpc;
    const uint32_t tpr = (uint32_t)((pl->width + KVF_CUDA_TILE_BYTES - 1) / KVF_CUDA_TILE_BYTES);
    const stage_geom g = {block, bpc, tpr, (uint64_t)tpr * pl->rows};
    if ((st = stage_ring(ss)) != KVF_OK)
        return st;

    /* the kernels follow everything queued before on this queue; after a
     * staged batch there is nothing to wait for: its DMAs touched only host
     * memory and staging slots (ordered by ev_free), its kernels ran on aux */
    if ((st = kvf__cuda_aux_after_main(q)) != KVF_OK)
        return st;
    for (size_t k = 0; k < nchunks;) {
        /* groups of 1, 1, 2, 4... chunks: the GPU starts on the first
         * chunk while the descriptors of the rest are written */
        size_t grp = k == 0 ? 1 : k < cpg ? k : cpg;
        size_t k1 = k + grp < nchunks ? k + grp : nchunks;
        size_t b0 = k * bpc, b1 = k1 * bpc < pl->count ? k1 * bpc : pl->count;
        uint32_t nd = (uint32_t)(b1 - b0), idx;
        batch_record *r = kvf__cuda_reserve(q, nd, &idx);
        kvf__cuda_desc *ring = q->ring_host + idx;
        stage_fill(ss, copies, to_host, pl, &g, k, b0, b1, ring);
        CUDA_GOTO(cudaMemcpyAsync(q->ring_dev + idx, ring, nd * sizeof *ring,
                                  cudaMemcpyHostToDevice, q->aux),
                  st, fail);
        for (; k < k1; k++)
            if ((st = stage_chunk(b, q, ss, to_host, pl, &g, k, q->ring_dev + idx, b0)) != KVF_OK)
                goto fail;
        /* the record's callback (and the batch's end) after the last
         * step: offload's last DMA (which waited for every gather), or
         * onboard's last scatter on aux, where the next DMAs need not wait
         * for it */
        if ((st = kvf__cuda_finish_record_on(b, q, to_host ? q->stream : q->aux, r, nd,
                                             k == nchunks ? done : NULL, arg)) != KVF_OK)
            goto fail;
        if (!to_host)
            q->aux_open = true;
        continue;
    fail:
        CUDA_IGNORE(cudaStreamSynchronize(q->aux));
        CUDA_IGNORE(cudaStreamSynchronize(q->stream));
        kvf__cuda_unreserve(r);
        return st;
    }
    return KVF_OK;
}
