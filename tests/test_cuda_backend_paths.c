/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend's copy paths (kernel, dma, auto) in every direction
 * (host->device, device->host, device->device) over whole blocks of 4 KiB
 * to 4 MiB, odd sizes at unaligned offsets, scattered order, contiguous
 * and 2-D partial copies, long batches and many batches in flight; AUTO's
 * choice for batches beside a forward pass; and the probe of a device. Exits 77 without a GPU.
 */
#include "cuda_backend_fixture.h"

static const char *dir_name[] = {"h2d", "d2h", "d2d"};
static const char *mode_name[] = {"auto", "kernel", "dma"};

static int path_cases(kvf_cuda_copy mode, arena *h, arena *d1, arena *d2)
{
    kvf__backend *b = backend_new(mode);
    size_t cap = ARENA_BYTES / 512;
    kvf__copy *c = malloc(cap * sizeof *c);
    REQUIRE(c);
    char what[160];
    int want = mode == KVF_CUDA_COPY_KERNEL ? KVF__CUDA_PATH_KERNEL
               : mode == KVF_CUDA_COPY_DMA  ? KVF__CUDA_PATH_DMA
                                            : 0;
    for (int dir = 0; dir < 3; dir++) {
        const arena *d = dir == 0 ? d1 : dir == 1 ? h : d2;
        const arena *s = dir == 0 ? h : d1;
        kvf__queue q = dir == 1 ? KVF_QUEUE_OFFLOAD : KVF_QUEUE_ONBOARD;

        /* whole blocks, 4 KiB .. 4 MiB, scattered */
        for (size_t bytes = 4096; bytes <= ((size_t)4 << 20); bytes *= 4) {
            size_t n = scattered(d, s, bytes, bytes <= 65536 ? 1024 : 6, c);
            snprintf(what, sizeof what, "%s %s %zu-byte blocks x%zu", mode_name[mode],
                     dir_name[dir], bytes, n);
            /* AUTO (the arena is not the backend's pinned memory, so
             * nothing stages): the kernel device to device and below
             * 256 KiB, the copy engines from there */
            int path = want                                      ? want
                       : dir == 2 || bytes < ((size_t)256 << 10) ? KVF__CUDA_PATH_KERNEL
                                                                 : KVF__CUDA_PATH_DMA;
            run_batches(b, q, d, s, c, n, n, what, path);
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

        /* the engine's partial moves (the first 8 of 32 tokens of K and of
         * V of 64 KiB head-major blocks: 2 rows of 8 KiB, 32 KiB apart)
         * in consecutive calls of 16, as it hands a large batch over:
         * each call's launch follows the one before with its descriptors
         * uploaded beside it */
        n = scattered(d, s, (size_t)64 << 10, 400, c);
        for (size_t i = 0; i < n; i++) {
            c[i].width = 8192;
            c[i].rows = 2;
            c[i].dpitch = c[i].spitch = 32768;
        }
        snprintf(what, sizeof what, "%s %s 2-d partial in calls of 16", mode_name[mode],
                 dir_name[dir]);
        run_batches(b, q, d, s, c, n, 16, what, want);

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
            CHECK_STATUS(b->ops->copy_async(b, KVF_QUEUE_ONBOARD, c, 256, 0, on_done, &w), KVF_OK);
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
        CHECK_STATUS(b->ops->copy_async(b, KVF_QUEUE_OFFLOAD, c, 0, 0, on_done, &w), KVF_OK);
        waiter_wait(&w, 1);
        waiter_fini(&w);
    }

    free(c);
    b->ops->destroy(b);
    return 0;
}

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

/* AUTO with batches that run beside a forward pass (layer-wise): the copy
 * engines at every size, both ways, leaving the SMs to the model; the
 * same small blocks alone take a kernel-driven path. */
static int test_auto_beside_compute(void)
{
    kvf__backend *b = backend_new(KVF_CUDA_COPY_AUTO);
    kvf__copy *c = malloc(1024 * sizeof *c);
    REQUIRE(c);
    for (int dir = 0; dir < 2; dir++) {
        const arena *d = dir == 0 ? &A_D1 : &A_H, *s = dir == 0 ? &A_H : &A_D1;
        kvf__queue q = dir == 0 ? KVF_QUEUE_ONBOARD : KVF_QUEUE_OFFLOAD;
        size_t n = scattered(d, s, 32768, 512, c);
        char what[96];
        snprintf(what, sizeof what, "auto %s 32 KiB blocks beside compute", dir_name[dir]);
        run_batches_flags(b, q, d, s, c, n, n, KVF__COPY_BESIDE_COMPUTE, what, KVF__CUDA_PATH_DMA);
        snprintf(what, sizeof what, "auto %s 32 KiB blocks alone", dir_name[dir]);
        run_batches(b, q, d, s, c, n, n, what, 0);
        CHECK(kvf__cuda_last_path(b, (int)q) != KVF__CUDA_PATH_DMA);
    }
    free(c);
    b->ops->destroy(b);
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
    arenas_init();
    RUN(test_probe);
    RUN(test_kernel_path);
    RUN(test_dma_path);
    RUN(test_auto_path);
    RUN(test_auto_beside_compute);
    arenas_fini();
    return TEST_RESULT();
}
