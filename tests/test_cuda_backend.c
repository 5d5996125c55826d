/* The CUDA backend on its own: every copy path (kernel, dma, auto) in every
 * direction (host->device, device->host, device->device) over whole blocks
 * of 4 KiB to 4 MiB, odd sizes at unaligned offsets, scattered order,
 * contiguous and 2-D partial copies, long batches and many batches in
 * flight; copy_sync from several threads at once; mem_register; sync_stream.
 * The staged path (dense host ranges, whole and 2-D, batches in flight)
 * and its refusals. Every check is byte for byte against an image computed
 * on the host, poison outside the copied regions included. Exits 77
 * without a GPU. */
#include "testutil_cuda.h"

#include "backend.h"
#include "cuda_kernels.h"

#include <cuda_runtime.h>
#include <pthread.h>

#define ARENA_BYTES ((size_t)32 << 20)

typedef struct arena {
    kvf_memory kind;
    uint8_t *p;
    size_t bytes;
} arena;

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    kvf_status status;
} waiter;

static void waiter_init(waiter *w)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->done = 0;
    w->status = KVF_OK;
}

static void on_done(void *arg, kvf_status st)
{
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done++;
    if (st != KVF_OK)
        w->status = st;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void waiter_wait(waiter *w, int count)
{
    pthread_mutex_lock(&w->mu);
    while (w->done < count)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static void waiter_fini(waiter *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static kvf__backend *backend_new(kvf_cuda_copy mode)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.cuda_copy = mode;
    kvf__backend *b = NULL;
    kvf_status st = kvf__cuda_backend_create(&cfg, &b);
    if (st == KVF_ERR_NO_DEVICE)
        TEST_SKIP_ALL("no CUDA device: %s", kvf_last_error());
    REQUIRE(st == KVF_OK);
    return b;
}

static void arena_put(const arena *a, const uint8_t *img)
{
    /* cudaMemcpy from pageable memory may return before the device has
     * the bytes, and the backend's streams do not wait for the legacy
     * stream: synchronize */
    if (a->kind == KVF_MEMORY_DEVICE) {
        CUDA_OK(cudaMemcpy(a->p, img, a->bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaDeviceSynchronize());
    } else
        memcpy(a->p, img, a->bytes);
}

static void arena_get(const arena *a, uint8_t *img)
{
    if (a->kind == KVF_MEMORY_DEVICE)
        CUDA_OK(cudaMemcpy(img, a->p, a->bytes, cudaMemcpyDeviceToHost));
    else
        memcpy(img, a->p, a->bytes);
}

/* The host's idea of the copies: applied to images of the two arenas. */
static void apply(uint8_t *dimg, const arena *d, const uint8_t *simg, const arena *s,
                  const kvf__copy *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t doff = (size_t)((const uint8_t *)c[i].dst - d->p);
        size_t soff = (size_t)((const uint8_t *)c[i].src - s->p);
        for (size_t r = 0; r < c[i].rows; r++)
            memmove(dimg + doff + r * c[i].dpitch, simg + soff + r * c[i].spitch, c[i].width);
    }
}

static uint64_t seed_counter = 1;

/* Fills src with random bytes and dst with random poison, runs the copies
 * as batches of `per_batch` copies (all queued before any is waited for),
 * and compares all of dst with the host's image. */
static int run_batches(kvf__backend *b, kvf__queue q, const arena *d, const arena *s,
                       const kvf__copy *c, size_t n, size_t per_batch, const char *what,
                       int want_path)
{
    uint8_t *simg = malloc(s->bytes), *dimg = malloc(d->bytes), *got = malloc(d->bytes);
    REQUIRE(simg && dimg && got);
    test_fill_random(simg, s->bytes, seed_counter++);
    test_fill_random(dimg, d->bytes, seed_counter++);
    arena_put(s, simg);
    arena_put(d, dimg);
    apply(dimg, d, simg, s, c, n);

    waiter w;
    waiter_init(&w);
    int batches = 0;
    for (size_t i = 0; i < n || (n == 0 && batches == 0); i += per_batch) {
        size_t k = n - i < per_batch ? n - i : per_batch;
        kvf_status st = b->ops->copy_async(b, q, c + i, k, on_done, &w);
        CHECK_STATUS(st, KVF_OK);
        if (st == KVF_OK)
            batches++;
        if (n == 0)
            break;
    }
    waiter_wait(&w, batches);
    CHECK_STATUS(w.status, KVF_OK);
    waiter_fini(&w);
    if (want_path)
        CHECK_EQ_INT(kvf__cuda_last_path(b, (int)q), want_path);

    arena_get(d, got);
    size_t off = test_mem_diff(got, dimg, d->bytes);
    int rc = 0;
    if (off != (size_t)-1) {
        fprintf(stderr, "%s: byte %zu differs: 0x%02x, want 0x%02x\n", what, off, got[off],
                dimg[off]);
        test_note_failure_();
        rc = 1;
    }
    free(simg);
    free(dimg);
    free(got);
    return rc;
}

/* `count` whole blocks of `bytes`, from shuffled source slots to shuffled
 * destination slots. */
static size_t scattered(const arena *d, const arena *s, size_t bytes, size_t count, kvf__copy *out)
{
    size_t slots = d->bytes / bytes;
    uint32_t *ps = malloc(slots * sizeof *ps), *pd = malloc(slots * sizeof *pd);
    for (size_t i = 0; i < slots; i++)
        ps[i] = pd[i] = (uint32_t)i;
    test_shuffle_u32(ps, slots, seed_counter++);
    test_shuffle_u32(pd, slots, seed_counter++);
    if (count > slots)
        count = slots;
    for (size_t i = 0; i < count; i++)
        out[i] = (kvf__copy){d->p + pd[i] * bytes, s->p + ps[i] * bytes, bytes, 1, bytes, bytes};
    free(ps);
    free(pd);
    return count;
}

static const char *dir_name[] = {"h2d", "d2h", "d2d"};
static const char *mode_name[] = {"auto", "kernel", "dma"};

static int path_cases(kvf_cuda_copy mode, arena *h, arena *d1, arena *d2)
{
    kvf__backend *b = backend_new(mode);
    size_t cap = ARENA_BYTES / 512;
    kvf__copy *c = malloc(cap * sizeof *c);
    REQUIRE(c);
    char what[160];
    int want = mode == KVF_CUDA_COPY_KERNEL ? 1 : mode == KVF_CUDA_COPY_DMA ? 2 : 0;
    for (int dir = 0; dir < 3; dir++) {
        const arena *d = dir == 0 ? d1 : dir == 1 ? h : d2;
        const arena *s = dir == 0 ? h : d1;
        kvf__queue q = dir == 1 ? KVF_QUEUE_OFFLOAD : KVF_QUEUE_ONBOARD;

        /* whole blocks, 4 KiB .. 4 MiB, scattered */
        for (size_t bytes = 4096; bytes <= ((size_t)4 << 20); bytes *= 4) {
            size_t n = scattered(d, s, bytes, bytes <= 65536 ? 1024 : 6, c);
            snprintf(what, sizeof what, "%s %s %zu-byte blocks x%zu", mode_name[mode],
                     dir_name[dir], bytes, n);
            run_batches(b, q, d, s, c, n, n, what, want);
        }

        /* odd sizes at unaligned offsets, both sides misaligned differently */
        static const size_t widths[] = {1,     2,     3,      7,      15,      16,    17,   31,
                                        33,    255,   1000,   4095,   4096,    4097,  8191, 12289,
                                        65535, 65537, 100003, 262147, 1 << 20, 999999};
        size_t n = 0;
        uint64_t rs = seed_counter++;
        for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) {
            size_t slot = (size_t)1 << 20; /* 1 MiB apart: no overlaps */
            size_t so = (size_t)(test_xorshift64(&rs) % 61),
                   dof = (size_t)(test_xorshift64(&rs) % 53);
            size_t w = widths[i] + 2 * 61 < slot ? widths[i] : slot - 128;
            c[n++] =
                (kvf__copy){d->p + ((i * 7) % 30) * slot + dof, s->p + i * slot + so, w, 1, w, w};
        }
        snprintf(what, sizeof what, "%s %s odd sizes", mode_name[mode], dir_name[dir]);
        run_batches(b, q, d, s, c, n, n, what, want);

        /* 2-D partial: the first 8 of 32 tokens of 256 KiB blocks (64 rows
         * of 4 KiB, 1 KiB of each), scattered */
        n = scattered(d, s, (size_t)256 << 10, 40, c);
        for (size_t i = 0; i < n; i++) {
            c[i].width = 1024;
            c[i].rows = 64;
            c[i].dpitch = c[i].spitch = 4096;
        }
        snprintf(what, sizeof what, "%s %s 2-d partial", mode_name[mode], dir_name[dir]);
        run_batches(b, q, d, s, c, n, n, what, want);

        /* 2-D with wide rows (the dma path sends them as flat copies):
         * 4 rows of 100003 bytes of 1 MiB blocks, 256 KiB apart, scattered */
        n = scattered(d, s, (size_t)1 << 20, 8, c);
        for (size_t i = 0; i < n; i++) {
            c[i].width = 100003;
            c[i].rows = 4;
            c[i].dpitch = c[i].spitch = (size_t)256 << 10;
        }
        snprintf(what, sizeof what, "%s %s 2-d wide rows", mode_name[mode], dir_name[dir]);
        run_batches(b, q, d, s, c, n, n, what, want);

        /* 2-D with different pitches on each side, odd widths, odd offsets:
         * strided into packed and packed into strided */
        n = 0;
        for (size_t i = 0; i < 12; i++) {
            size_t width = 100 + 37 * i, rows = 3 + i, spitch = width + 1 + 13 * i;
            size_t dpitch = i % 2 ? width : width + 29;
            c[n++] = (kvf__copy){d->p + i * 65536 + (i % 5),
                                 s->p + i * 65536 + (i % 3),
                                 width,
                                 rows,
                                 dpitch,
                                 spitch};
        }
        snprintf(what, sizeof what, "%s %s 2-d mixed pitches", mode_name[mode], dir_name[dir]);
        run_batches(b, q, d, s, c, n, n, what, want);

        /* adjacent copies (merged by the dma path), one empty copy among
         * them, and a contiguous copy given as rows == pitch */
        n = 0;
        for (size_t i = 0; i < 64; i++)
            c[n++] = (kvf__copy){d->p + 4096 * 1024 + i * 16384,
                                 s->p + 8192 * 1024 + i * 16384,
                                 16384,
                                 1,
                                 16384,
                                 16384};
        c[n++] = (kvf__copy){d->p, s->p, 0, 1, 0, 0};
        c[n++] = (kvf__copy){d->p + 64, s->p + 64, 512, 8, 512, 512};
        snprintf(what, sizeof what, "%s %s adjacent", mode_name[mode], dir_name[dir]);
        run_batches(b, q, d, s, c, n, n, what, want);
    }

    /* one batch longer than a kernel launch takes (chunked), and many
     * batches queued at once (descriptor ring and record wrap) */
    size_t n = scattered(d1, h, 512, 40000, c);
    snprintf(what, sizeof what, "%s h2d 40000 copies in one batch", mode_name[mode]);
    run_batches(b, KVF_QUEUE_ONBOARD, d1, h, c, n, n, what, want);
    n = scattered(h, d1, 2048, 12000, c);
    snprintf(what, sizeof what, "%s d2h 1500 batches of 8", mode_name[mode]);
    run_batches(b, KVF_QUEUE_OFFLOAD, h, d1, c, n, 8, what, want);

    /* stream order inside a queue: the same destinations written by many
     * batches in a row; the last one wins */
    {
        uint8_t *simg = malloc(h->bytes), *dimg = malloc(d1->bytes), *got = malloc(d1->bytes);
        test_fill_random(simg, h->bytes, seed_counter++);
        test_fill_random(dimg, d1->bytes, seed_counter++);
        arena_put(h, simg);
        arena_put(d1, dimg);
        waiter w;
        waiter_init(&w);
        int rounds = 300;
        for (int r = 0; r < rounds; r++) {
            for (size_t i = 0; i < 256; i++)
                c[i] = (kvf__copy){
                    d1->p + i * 8192, h->p + (size_t)r * 65536 + i * 256, 256, 1, 256, 256};
            if (r == rounds - 1)
                apply(dimg, d1, simg, h, c, 256);
            CHECK_STATUS(b->ops->copy_async(b, KVF_QUEUE_ONBOARD, c, 256, on_done, &w), KVF_OK);
        }
        waiter_wait(&w, rounds);
        waiter_fini(&w);
        arena_get(d1, got);
        CHECK_MEM_EQ(got, dimg, d1->bytes);
        free(simg);
        free(dimg);
        free(got);
    }

    /* an empty batch still completes */
    {
        waiter w;
        waiter_init(&w);
        CHECK_STATUS(b->ops->copy_async(b, KVF_QUEUE_OFFLOAD, c, 0, on_done, &w), KVF_OK);
        waiter_wait(&w, 1);
        waiter_fini(&w);
    }

    free(c);
    b->ops->destroy(b);
    return 0;
}

static arena A_H, A_D1, A_D2;

static int test_kernel_path(void)
{
    return path_cases(KVF_CUDA_COPY_KERNEL, &A_H, &A_D1, &A_D2);
}

static int test_dma_path(void)
{
    return path_cases(KVF_CUDA_COPY_DMA, &A_H, &A_D1, &A_D2);
}

static int test_auto_path(void)
{
    return path_cases(KVF_CUDA_COPY_AUTO, &A_H, &A_D1, &A_D2);
}

/* ---- the staged path ------------------------------------------------------
 * Batches whose host blocks tile one pinned allocation (each once, any
 * order) are gathered or scattered in device memory around one DMA per
 * 4 MiB chunk. Whole permutations of many block sizes (chunk borders inside
 * blocks included), both directions, the staging ring reused inside one
 * batch and across batches in flight, and batches that must not take it. */

/* count blocks of `bytes`: host block i <-> device slot perm[i] at offset
 * doff in the device arena; host blocks from hoff on, all of them once. */
static size_t dense(const arena *h, size_t hoff, const arena *dv, size_t bytes, size_t count,
                    bool to_host, kvf__copy *out)
{
    size_t slots = dv->bytes / bytes;
    uint32_t *pd = malloc(slots * sizeof *pd), *ph = malloc(count * sizeof *ph);
    REQUIRE(pd && ph && count <= slots);
    for (size_t i = 0; i < slots; i++)
        pd[i] = (uint32_t)i;
    for (size_t i = 0; i < count; i++)
        ph[i] = (uint32_t)i;
    test_shuffle_u32(pd, slots, seed_counter++);
    test_shuffle_u32(ph, count, seed_counter++);
    for (size_t i = 0; i < count; i++) {
        uint8_t *hp = h->p + hoff + (size_t)ph[i] * bytes, *dp = dv->p + (size_t)pd[i] * bytes;
        out[i] = to_host ? (kvf__copy){hp, dp, bytes, 1, bytes, bytes}
                         : (kvf__copy){dp, hp, bytes, 1, bytes, bytes};
    }
    free(pd);
    free(ph);
    return count;
}

/* The same with 2-D copies: the first `width` bytes of each of `rows` rows
 * `pitch` apart (the first tokens of a block), on both sides. */
static size_t dense_2d(const arena *h, const arena *dv, size_t rows, size_t width, size_t pitch,
                       size_t count, bool to_host, kvf__copy *out)
{
    size_t n = dense(h, 0, dv, rows * pitch, count, to_host, out);
    for (size_t i = 0; i < n; i++) {
        out[i].width = width;
        out[i].rows = rows;
        out[i].dpitch = out[i].spitch = pitch;
    }
    return n;
}

static int test_staged_path(void)
{
    for (int forced = 0; forced < 2; forced++) {
        if (forced)
            setenv("KVF_CUDA_COPY", "staged", 1);
        kvf__backend *b = backend_new(KVF_CUDA_COPY_AUTO);
        unsetenv("KVF_CUDA_COPY");
        arena h = {KVF_MEMORY_HOST_PINNED, NULL, ARENA_BYTES};
        void *hp = NULL;
        REQUIRE(b->ops->mem_alloc(b, KVF_MEMORY_HOST_PINNED, ARENA_BYTES, &hp) == KVF_OK);
        h.p = hp;
        size_t cap = ARENA_BYTES / 512;
        kvf__copy *c = malloc(cap * sizeof *c);
        REQUIRE(c);
        char what[160];
        static const size_t sizes[] = {512,    4096,   12288 + 512, 65536,
                                       262144, 999936, 1 << 20,     (size_t)3 << 20};
        for (int to_host = 0; to_host < 2; to_host++) {
            kvf__queue q = to_host ? KVF_QUEUE_OFFLOAD : KVF_QUEUE_ONBOARD;
            for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
                size_t bytes = sizes[k];
                /* all of 24 MiB of host blocks, or 6 of the largest */
                size_t count = ((size_t)24 << 20) / bytes;
                count = count > ARENA_BYTES / bytes ? ARENA_BYTES / bytes : count;
                size_t n = dense(&h, 4096 * (k % 3), &A_D1, bytes, count, to_host, c);
                snprintf(what, sizeof what, "staged%s %s %zu-byte blocks x%zu",
                         forced ? " (forced)" : "", to_host ? "d2h" : "h2d", bytes, n);
                int want = forced ? 3 : 0;
                if (to_host)
                    run_batches(b, q, &h, &A_D1, c, n, n, what, want);
                else
                    run_batches(b, q, &A_D1, &h, c, n, n, what, want);
            }
            /* 2-D: 8 of 32 tokens of 4 KiB blocks (2 rows), of 64 KiB
             * blocks (16 rows), and a block of 2 rows of 12 KiB + 1 */
            {
                static const size_t shapes[][4] = {
                    {2, 512, 2048, 8192}, {16, 1024, 4096, 384}, {2, 12289, 16384, 700}};
                for (size_t k = 0; k < 3; k++) {
                    size_t n = dense_2d(&h, &A_D1, shapes[k][0], shapes[k][1], shapes[k][2],
                                        shapes[k][3], to_host, c);
                    snprintf(what, sizeof what, "staged%s %s 2-d %zux%zu of pitch %zu x%zu",
                             forced ? " (forced)" : "", to_host ? "d2h" : "h2d", shapes[k][0],
                             shapes[k][1], shapes[k][2], n);
                    int want = forced ? 3 : 0;
                    if (to_host)
                        run_batches(b, q, &h, &A_D1, c, n, n, what, want);
                    else
                        run_batches(b, q, &A_D1, &h, c, n, n, what, want);
                }
            }
            /* dense batches in flight over one staging ring: 15 batches of
             * 4 MiB, one chunk each (the ring has 4 slots), host windows
             * disjoint, then the same shifted by 2 MiB (other bytes);
             * the last write of a byte wins */
            {
                size_t bytes = 65536, per = ((size_t)4 << 20) / bytes, n = 0;
                for (int r = 0; r < 15; r++) {
                    size_t off = (size_t)(r % 8) * (4 << 20) + (r >= 8 ? (size_t)2 << 20 : 0);
                    arena ds = {A_D2.kind, A_D2.p + off, (size_t)4 << 20};
                    n += dense(&h, off, &ds, bytes, per, to_host, c + n);
                }
                snprintf(what, sizeof what, "staged%s %s 15 dense batches in flight",
                         forced ? " (forced)" : "", to_host ? "d2h" : "h2d");
                if (to_host)
                    run_batches(b, q, &h, &A_D2, c, n, per, what, forced ? 3 : 0);
                else
                    run_batches(b, q, &A_D2, &h, c, n, per, what, forced ? 3 : 0);
            }
            /* not dense: one block missing, one twice (h2d), unequal
             * sizes; each must still copy right by another path */
            {
                size_t bytes = 65536, count = 64;
                size_t n = dense(&h, 0, &A_D1, bytes, count, to_host, c);
                c[5] = c[--n]; /* drop one: a hole in the host range */
                snprintf(what, sizeof what, "staged %s with a hole", to_host ? "d2h" : "h2d");
                if (to_host)
                    run_batches(b, q, &h, &A_D1, c, n, n, what, 0);
                else
                    run_batches(b, q, &A_D1, &h, c, n, n, what, 0);
                if (!to_host) {
                    n = dense(&h, 0, &A_D1, bytes, count, false, c);
                    /* the same host block read into two slots, and one
                     * host block not read at all: count and span still
                     * match */
                    c[7].src = c[9].src;
                    snprintf(what, sizeof what, "staged h2d with a duplicate");
                    run_batches(b, q, &A_D1, &h, c, n, n, what, 0);
                    CHECK(kvf__cuda_last_path(b, (int)q) != 3);
                }
                n = dense(&h, 0, &A_D1, bytes, count, to_host, c);
                c[3].width = c[3].dpitch = c[3].spitch = bytes - 512;
                snprintf(what, sizeof what, "staged %s unequal sizes", to_host ? "d2h" : "h2d");
                if (to_host)
                    run_batches(b, q, &h, &A_D1, c, n, n, what, 0);
                else
                    run_batches(b, q, &A_D1, &h, c, n, n, what, 0);
                CHECK(kvf__cuda_last_path(b, (int)q) != 3);
            }
        }
        free(c);
        b->ops->mem_free(b, KVF_MEMORY_HOST_PINNED, hp);
        b->ops->destroy(b);
    }
    return 0;
}

/* ---- copy_sync from several threads ------------------------------------- */

#define SYNC_THREADS 8
#define SYNC_PART (ARENA_BYTES / SYNC_THREADS)

typedef struct sync_arg {
    kvf__backend *b;
    int id;
    int failures;
} sync_arg;

static void *sync_thread(void *p)
{
    sync_arg *a = p;
    uint8_t *src = A_H.p + (size_t)a->id * SYNC_PART; /* first half of the part */
    uint8_t *back = src + SYNC_PART / 2;              /* second half */
    uint8_t *dev = A_D1.p + (size_t)a->id * SYNC_PART;
    size_t bs = 16384, nb = SYNC_PART / 2 / bs;
    uint32_t perm[256];
    kvf__copy c[256];
    for (int it = 0; it < 40; it++) {
        test_fill_random(src, SYNC_PART / 2, (uint64_t)a->id * 1000 + (uint64_t)it + 7);
        memset(back, 0xA5, SYNC_PART / 2);
        for (size_t i = 0; i < nb; i++)
            perm[i] = (uint32_t)i;
        test_shuffle_u32(perm, nb, (uint64_t)it * 77 + (uint64_t)a->id);
        for (size_t i = 0; i < nb; i++)
            c[i] = (kvf__copy){dev + perm[i] * bs, src + i * bs, bs, 1, bs, bs};
        if (a->b->ops->copy_sync(a->b, it % 2 ? KVF_QUEUE_ONBOARD : KVF_QUEUE_OFFLOAD, c, nb) !=
            KVF_OK)
            a->failures++;
        for (size_t i = 0; i < nb; i++)
            c[i] = (kvf__copy){back + i * bs, dev + perm[i] * bs, bs / 2, 2, bs / 2, bs / 2};
        if (a->b->ops->copy_sync(a->b, KVF_QUEUE_OFFLOAD, c, nb) != KVF_OK)
            a->failures++;
        if (memcmp(src, back, SYNC_PART / 2) != 0)
            a->failures++;
    }
    return NULL;
}

static int test_copy_sync_threads(void)
{
    kvf__backend *b = backend_new(KVF_CUDA_COPY_AUTO);
    pthread_t t[SYNC_THREADS];
    sync_arg a[SYNC_THREADS];
    for (int i = 0; i < SYNC_THREADS; i++) {
        a[i] = (sync_arg){b, i, 0};
        REQUIRE(pthread_create(&t[i], NULL, sync_thread, &a[i]) == 0);
    }
    for (int i = 0; i < SYNC_THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_INT(a[i].failures, 0);
    }
    b->ops->destroy(b);
    return 0;
}

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
    run_batches(b, KVF_QUEUE_ONBOARD, &da, &ha, c, n, n, "h2d from registered malloc memory", 1);
    n = scattered(&ha, &da, 65536, 32, c);
    run_batches(b, KVF_QUEUE_OFFLOAD, &ha, &da, c, n, n, "d2h into registered malloc memory", 1);
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
    run_batches(b, KVF_QUEUE_ONBOARD, &da, &ha, c, n, n, "h2d from pageable memory", 2);
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

/* ---- sync_stream -------------------------------------------------------- */

/* Work queued on the caller's stream after sync_stream sees the copies
 * queued before it on both queues, without the host waiting for them. */
static int test_sync_stream(void)
{
    kvf__backend *b = backend_new(KVF_CUDA_COPY_AUTO);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t half = ARENA_BYTES / 2;
    uint8_t *out = NULL, *want = malloc(ARENA_BYTES), *d1img = malloc(ARENA_BYTES);
    CUDA_OK(cudaMallocHost((void **)&out, ARENA_BYTES));
    arena d2 = {KVF_MEMORY_DEVICE, A_D2.p, half};
    arena d2hi = {KVF_MEMORY_DEVICE, A_D2.p + half, half};
    arena h = {KVF_MEMORY_HOST_PINNED, A_H.p, half};
    test_fill_random(d1img, ARENA_BYTES, seed_counter++);
    arena_put(&A_D1, d1img);
    arena d1 = {KVF_MEMORY_DEVICE, A_D1.p, half};
    kvf__copy *c = malloc(1024 * sizeof *c);
    for (int round = 0; round < 20; round++) {
        test_fill_random(A_H.p, half, seed_counter++);
        test_fill_random(want, ARENA_BYTES, seed_counter++);
        arena_put(&A_D2, want);
        waiter w;
        waiter_init(&w);
        /* onboard from pinned memory, and device->device on the other queue */
        size_t n = scattered(&d2, &h, 32768, 256, c);
        apply(want, &A_D2, A_H.p, &A_H, c, n);
        CHECK_STATUS(b->ops->copy_async(b, KVF_QUEUE_ONBOARD, c, n, on_done, &w), KVF_OK);
        n = scattered(&d2hi, &d1, 65536, 128, c);
        apply(want, &A_D2, d1img, &A_D1, c, n);
        CHECK_STATUS(b->ops->copy_async(b, KVF_QUEUE_OFFLOAD, c, n, on_done, &w), KVF_OK);
        CHECK_STATUS(b->ops->sync_stream(b, (void *)s), KVF_OK);
        CUDA_OK(cudaMemcpyAsync(out, A_D2.p, ARENA_BYTES, cudaMemcpyDeviceToHost, s));
        CUDA_OK(cudaStreamSynchronize(s));
        CHECK_MEM_EQ(out, want, ARENA_BYTES);
        waiter_wait(&w, 2);
        waiter_fini(&w);
    }
    free(c);
    free(want);
    free(d1img);
    CUDA_OK(cudaFreeHost(out));
    CUDA_OK(cudaStreamDestroy(s));
    const kvf__backend_ops *ops = b->ops;
    ops->destroy(b);
    ops->destroy(NULL); /* harmless */
    return 0;
}

static int test_probe(void)
{
    /* a bad ordinal is "no device", with a reason */
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.device = 4096;
    kvf__backend *b = NULL;
    CHECK_STATUS(kvf__cuda_backend_create(&cfg, &b), KVF_ERR_NO_DEVICE);
    CHECK(b == NULL);
    CHECK_STR_HAS(kvf_last_error(), "device");
    kvf_info info = KVF_INFO_INIT;
    CHECK_STATUS(kvf_info_get(&info), KVF_OK);
    CHECK(info.cuda_built == 1);
    CHECK(info.cuda_devices >= 1);
    return 0;
}

int main(void)
{
    unsetenv("KVF_CUDA_COPY");
    kvf__backend *b = backend_new(KVF_CUDA_COPY_AUTO); /* skips without a GPU */
    A_H.kind = KVF_MEMORY_HOST_PINNED;
    A_D1.kind = A_D2.kind = KVF_MEMORY_DEVICE;
    A_H.bytes = A_D1.bytes = A_D2.bytes = ARENA_BYTES;
    /* arenas outlive the backend that allocated them: plain CUDA calls */
    CUDA_OK(
        cudaHostAlloc((void **)&A_H.p, ARENA_BYTES, cudaHostAllocMapped | cudaHostAllocPortable));
    CUDA_OK(cudaMalloc((void **)&A_D1.p, ARENA_BYTES));
    CUDA_OK(cudaMalloc((void **)&A_D2.p, ARENA_BYTES));
    b->ops->destroy(b);

    RUN(test_probe);
    RUN(test_kernel_path);
    RUN(test_dma_path);
    RUN(test_auto_path);
    RUN(test_staged_path);
    RUN(test_copy_sync_threads);
    RUN(test_mem_register);
    RUN(test_sync_stream);

    CUDA_OK(cudaFreeHost(A_H.p));
    CUDA_OK(cudaFree(A_D1.p));
    CUDA_OK(cudaFree(A_D2.p));
    return TEST_RESULT();
}
