/* SPDX-License-Identifier: Apache-2.0 */
/* Layout math against a brute-force reference: every element of a block is
 * placed by its indices, and the bytes of the first N tokens found that way
 * must be exactly the region kvf_geometry_region describes. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

/* Bit offset of element (l, k, h, t, d) inside a block. */
static size_t element_bit(const kvf_geometry *g, size_t l, size_t k, size_t h, size_t t, size_t d)
{
    size_t idx;
    if (g->order == KVF_ORDER_HEAD_MAJOR)
        idx =
            (((l * g->kv_factor + k) * g->kv_heads + h) * g->tokens_per_block + t) * g->head_size +
            d;
    else
        idx =
            (((l * g->kv_factor + k) * g->tokens_per_block + t) * g->kv_heads + h) * g->head_size +
            d;
    return idx * kvf_dtype_bits(g->dtype);
}

/* mark[byte]: 1 if it holds an element of the first n tokens, 2 if one of
 * the others, 3 if both (a byte the region cannot split). */
static int check_one(const kvf_geometry *g, uint32_t n)
{
    size_t bytes;
    CHECK_STATUS(kvf_geometry_block_bytes(g, &bytes), KVF_OK);
    unsigned bits = kvf_dtype_bits(g->dtype);
    size_t total_bits =
        (size_t)g->layers * g->kv_factor * g->kv_heads * g->tokens_per_block * g->head_size * bits;
    CHECK(total_bits % 8 == 0);
    CHECK(bytes == total_bits / 8);
    uint8_t *mark = calloc(bytes, 1);
    uint32_t limit = (n == 0 || n >= g->tokens_per_block) ? g->tokens_per_block : n;
    for (size_t l = 0; l < g->layers; l++)
        for (size_t k = 0; k < g->kv_factor; k++)
            for (size_t h = 0; h < g->kv_heads; h++)
                for (size_t t = 0; t < g->tokens_per_block; t++)
                    for (size_t d = 0; d < g->head_size; d++) {
                        size_t bit = element_bit(g, l, k, h, t, d);
                        for (size_t b = bit; b < bit + bits; b += 8)
                            mark[b / 8] |= t < limit ? 1 : 2;
                        CHECK((bit + bits - 1) / 8 < bytes);
                    }
    bool splittable = true;
    for (size_t i = 0; i < bytes; i++)
        if (mark[i] == 3)
            splittable = false;
    kvf_region r;
    kvf_status st = kvf_geometry_region(g, n, &r);
    if (!splittable) {
        CHECK_STATUS(st, KVF_ERR_UNSUPPORTED);
        free(mark);
        return 0;
    }
    CHECK_STATUS(st, KVF_OK);
    uint8_t *in = calloc(bytes, 1);
    CHECK(r.rows >= 1 && r.row_bytes >= 1);
    CHECK(r.rows == 1 || r.pitch >= r.row_bytes);
    for (size_t row = 0; row < r.rows; row++)
        for (size_t b = 0; b < r.row_bytes; b++) {
            size_t off = row * r.pitch + b;
            CHECK(off < bytes);
            CHECK(in[off] == 0); /* rows never overlap */
            in[off] = 1;
        }
    for (size_t i = 0; i < bytes; i++)
        if ((mark[i] == 1) != (in[i] == 1)) {
            fprintf(stderr, "byte %zu: brute force says %s, region says %s (n=%u)\n", i,
                    mark[i] == 1 ? "in" : "out", in[i] ? "in" : "out", n);
            CHECK(0);
        }
    free(in);
    free(mark);
    return 0;
}

static int test_random_geometries(void)
{
    uint64_t s = 0x1234567;
    for (int iter = 0; iter < 3000; iter++) {
        kvf_geometry g;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        g.layers = 1 + (s >> 33) % 3;
        g.kv_factor = 1 + (s >> 40) % 2;
        g.kv_heads = 1 + (s >> 45) % 4;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        g.tokens_per_block = 1 + (s >> 33) % 9;
        g.head_size = 1 + (s >> 40) % 7;
        g.dtype = (kvf_dtype)((s >> 50) % KVF_DTYPE_COUNT);
        g.order = (kvf_token_order)((s >> 60) % 2);
        kvf_status st = kvf_geometry_check(&g);
        if (st != KVF_OK) {
            /* only 4-bit blocks whose rows are not whole bytes are refused */
            CHECK(kvf_dtype_bits(g.dtype) == 4);
            CHECK_STATUS(st, KVF_ERR_UNSUPPORTED);
            continue;
        }
        for (uint32_t n = 0; n <= g.tokens_per_block + 1; n++)
            if (check_one(&g, n))
                return 1;
    }
    return 0;
}

static int test_every_dtype(void)
{
    for (int dt = 0; dt < KVF_DTYPE_COUNT; dt++) {
        for (int order = 0; order < 2; order++) {
            kvf_geometry g = {2, 2, 3, 8, 4, (kvf_dtype)dt, (kvf_token_order)order};
            CHECK_STATUS(kvf_geometry_check(&g), KVF_OK);
            for (uint32_t n = 0; n <= 8; n++)
                if (check_one(&g, n))
                    return 1;
            kvf_dtype back;
            CHECK_STATUS(kvf_dtype_parse(kvf_dtype_name((kvf_dtype)dt), &back), KVF_OK);
            CHECK(back == (kvf_dtype)dt);
        }
    }
    return 0;
}

static int test_reference_shape(void)
{
    /* TensorRT-LLM's [layers][kv][heads][tokens][head]: 32x2x8x32x128 fp16 */
    kvf_geometry g = {32, 2, 8, 32, 128, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
    size_t bytes;
    kvf_region r;
    CHECK_STATUS(kvf_geometry_block_bytes(&g, &bytes), KVF_OK);
    CHECK(bytes == 4u << 20);
    CHECK_STATUS(kvf_geometry_region(&g, 8, &r), KVF_OK);
    CHECK(r.rows == 512 && r.row_bytes == 8 * 128 * 2 && r.pitch == 32 * 128 * 2);
    /* 4-bit with an odd head: 3 tokens of a 3-element head is 9 nibbles */
    kvf_geometry q = {1, 1, 1, 4, 3, KVF_DTYPE_INT4, KVF_ORDER_HEAD_MAJOR};
    CHECK_STATUS(kvf_geometry_check(&q), KVF_OK);
    CHECK_STATUS(kvf_geometry_region(&q, 3, &r), KVF_ERR_UNSUPPORTED);
    CHECK(strstr(kvf_last_error(), "whole bytes") != NULL);
    CHECK_STATUS(kvf_geometry_region(&q, 2, &r), KVF_OK);
    CHECK(r.rows == 1 && r.row_bytes == 3);
    /* the per-layer layout: one tensor [blocks][tokens][heads][head] */
    kvf_geometry v = {1, 1, 8, 16, 128, KVF_DTYPE_BF16, KVF_ORDER_TOKEN_MAJOR};
    CHECK_STATUS(kvf_geometry_region(&v, 5, &r), KVF_OK);
    CHECK(r.rows == 1 && r.row_bytes == 5 * 8 * 128 * 2);
    return 0;
}

static int test_bad_input(void)
{
    kvf_geometry g = {1, 2, 1, 16, 64, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
    size_t bytes;
    CHECK_STATUS(kvf_geometry_check(NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_geometry_block_bytes(&g, NULL), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_geometry_region(&g, 1, NULL), KVF_ERR_INVALID);
    kvf_geometry z = g;
    z.tokens_per_block = 0;
    CHECK_STATUS(kvf_geometry_block_bytes(&z, &bytes), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "tokens_per_block 0") != NULL);
    z = g;
    z.kv_factor = 3;
    CHECK_STATUS(kvf_geometry_check(&z), KVF_ERR_INVALID);
    z = g;
    z.dtype = KVF_DTYPE_COUNT;
    CHECK_STATUS(kvf_geometry_check(&z), KVF_ERR_INVALID);
    z = g;
    z.order = (kvf_token_order)7;
    CHECK_STATUS(kvf_geometry_check(&z), KVF_ERR_INVALID);
    z = (kvf_geometry){UINT32_MAX,          2, UINT32_MAX, UINT32_MAX, UINT32_MAX, KVF_DTYPE_FP32,
                       KVF_ORDER_HEAD_MAJOR};
    CHECK_STATUS(kvf_geometry_block_bytes(&z, &bytes), KVF_ERR_RANGE);
    CHECK(strstr(kvf_last_error(), "overflow") != NULL);
    kvf_dtype d;
    CHECK_STATUS(kvf_dtype_parse("fp5", &d), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_dtype_parse(NULL, &d), KVF_ERR_INVALID);
    CHECK(kvf_dtype_bits((kvf_dtype)99) == 0);
    CHECK(strcmp(kvf_dtype_name((kvf_dtype)99), "?") == 0);
    /* a 4-bit block of an odd number of elements per row is refused whole */
    kvf_geometry o = {1, 1, 1, 1, 3, KVF_DTYPE_FP4, KVF_ORDER_HEAD_MAJOR};
    CHECK_STATUS(kvf_geometry_check(&o), KVF_ERR_UNSUPPORTED);
    return 0;
}

static int test_status_strings(void)
{
    for (int s = -60; s <= 2; s++)
        CHECK(kvf_status_str((kvf_status)s) != NULL);
    CHECK(strcmp(kvf_status_str(KVF_OK), "success") == 0);
    CHECK(strcmp(kvf_status_str((kvf_status)-999), "unknown status") == 0);
    return 0;
}

int main(void)
{
    RUN(test_reference_shape);
    RUN(test_every_dtype);
    RUN(test_random_geometries);
    RUN(test_bad_input);
    RUN(test_status_strings);
    return TEST_RESULT();
}
