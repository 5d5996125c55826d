/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend's staged path (dense host ranges, whole and 2-D,
 * batches in flight) and its refusals. Exits 77 without a GPU.
 */
#include "cuda_backend_fixture.h"

/* ---- the staged path ------------------------------------------------------
 * Batches whose host blocks tile one pinned allocation (each once, any
 * order) are gathered or scattered in device memory around one DMA per
 * 16 MiB chunk. Whole permutations of many block sizes (chunk borders inside
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
                int want = forced ? KVF__CUDA_PATH_STAGED : 0;
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
                    int want = forced ? KVF__CUDA_PATH_STAGED : 0;
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
                    run_batches(b, q, &h, &A_D2, c, n, per, what,
                                forced ? KVF__CUDA_PATH_STAGED : 0);
                else
                    run_batches(b, q, &A_D2, &h, c, n, per, what,
                                forced ? KVF__CUDA_PATH_STAGED : 0);
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
                    CHECK(kvf__cuda_last_path(b, (int)q) != KVF__CUDA_PATH_STAGED);
                }
                n = dense(&h, 0, &A_D1, bytes, count, to_host, c);
                c[3].width = c[3].dpitch = c[3].spitch = bytes - 512;
                snprintf(what, sizeof what, "staged %s unequal sizes", to_host ? "d2h" : "h2d");
                if (to_host)
                    run_batches(b, q, &h, &A_D1, c, n, n, what, 0);
                else
                    run_batches(b, q, &A_D1, &h, c, n, n, what, 0);
                CHECK(kvf__cuda_last_path(b, (int)q) != KVF__CUDA_PATH_STAGED);
            }
        }
        free(c);
        b->ops->mem_free(b, KVF_MEMORY_HOST_PINNED, hp);
        b->ops->destroy(b);
    }
    return 0;
}

int main(void)
{
    arenas_init();
    RUN(test_staged_path);
    arenas_fini();
    return TEST_RESULT();
}
