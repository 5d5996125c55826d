/* SPDX-License-Identifier: Apache-2.0 */
/* Block geometry: element sizes, a block's bytes, and where its first N
 * tokens lie. Everything here is pure arithmetic, checked for overflow. */
#include "layout.h"
#include "status.h"

#include <string.h>

static const struct {
    const char *name;
    unsigned bits;
} dtypes[KVF_DTYPE_COUNT] = {
    [KVF_DTYPE_FP32] = {"fp32", 32},        [KVF_DTYPE_FP16] = {"fp16", 16},
    [KVF_DTYPE_BF16] = {"bf16", 16},        [KVF_DTYPE_FP8_E4M3] = {"fp8_e4m3", 8},
    [KVF_DTYPE_FP8_E5M2] = {"fp8_e5m2", 8}, [KVF_DTYPE_INT8] = {"int8", 8},
    [KVF_DTYPE_INT4] = {"int4", 4},         [KVF_DTYPE_FP4] = {"fp4", 4},
};

unsigned kvf_dtype_bits(kvf_dtype dtype)
{
    if ((unsigned)dtype >= KVF_DTYPE_COUNT)
        return 0;
    return dtypes[dtype].bits;
}

const char *kvf_dtype_name(kvf_dtype dtype)
{
    if ((unsigned)dtype >= KVF_DTYPE_COUNT)
        return "?";
    return dtypes[dtype].name;
}

kvf_status kvf_dtype_parse(const char *name, kvf_dtype *dtype_p)
{
    if (!name || !dtype_p)
        return kvf__fail(KVF_ERR_INVALID, "dtype: NULL argument");
    for (unsigned i = 0; i < KVF_DTYPE_COUNT; i++) {
        if (strcmp(name, dtypes[i].name) == 0) {
            *dtype_p = (kvf_dtype)i;
            return KVF_OK;
        }
    }
    return kvf__fail(KVF_ERR_INVALID, "unknown dtype '%s'", name);
}

/* Bits of one token's row segment (the innermost run that scales with the
 * token count) and the number of such rows in a block. */
static void shape_of(const kvf_geometry *g, size_t *token_elems, size_t *rows)
{
    if (g->order == KVF_ORDER_HEAD_MAJOR) {
        *token_elems = g->head_size;
        *rows = (size_t)g->layers * g->kv_factor * g->kv_heads;
    } else {
        *token_elems = (size_t)g->kv_heads * g->head_size;
        *rows = (size_t)g->layers * g->kv_factor;
    }
}

kvf_status kvf_geometry_check(const kvf_geometry *g)
{
    if (!g)
        return kvf__fail(KVF_ERR_INVALID, "geometry: NULL");
    if (!g->layers || !g->kv_heads || !g->tokens_per_block || !g->head_size)
        return kvf__fail(KVF_ERR_INVALID,
                         "geometry: layers %u, kv_heads %u, tokens_per_block %u, head_size %u: "
                         "each must be at least 1",
                         g->layers, g->kv_heads, g->tokens_per_block, g->head_size);
    if (g->kv_factor != 1 && g->kv_factor != 2)
        return kvf__fail(KVF_ERR_INVALID, "geometry: kv_factor %u (must be 1 or 2)", g->kv_factor);
    if (kvf_dtype_bits(g->dtype) == 0)
        return kvf__fail(KVF_ERR_INVALID, "geometry: unknown dtype %d", (int)g->dtype);
    if (g->order != KVF_ORDER_HEAD_MAJOR && g->order != KVF_ORDER_TOKEN_MAJOR)
        return kvf__fail(KVF_ERR_INVALID, "geometry: unknown token order %d", (int)g->order);
    size_t elems = 1, bits;
    const uint32_t dims[] = {g->layers, g->kv_factor, g->kv_heads, g->tokens_per_block,
                             g->head_size};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (kvf__mul_overflows(elems, dims[i], &elems))
            return kvf__fail(KVF_ERR_RANGE, "geometry: block size overflows");
    if (kvf__mul_overflows(elems, kvf_dtype_bits(g->dtype), &bits))
        return kvf__fail(KVF_ERR_RANGE, "geometry: block size overflows");
    /* A 4-bit block must still start every row on a byte, or whole-block
     * slots could not be addressed by byte offsets either. */
    size_t token_elems, rows;
    shape_of(g, &token_elems, &rows);
    if ((token_elems * g->tokens_per_block * kvf_dtype_bits(g->dtype)) % 8 != 0)
        return kvf__fail(KVF_ERR_UNSUPPORTED,
                         "geometry: a row of %u tokens x %zu %s elements is not whole bytes",
                         g->tokens_per_block, token_elems, kvf_dtype_name(g->dtype));
    return KVF_OK;
}

kvf_status kvf_geometry_block_bytes(const kvf_geometry *g, size_t *bytes_p)
{
    kvf_status st = kvf_geometry_check(g);
    if (st != KVF_OK)
        return st;
    if (!bytes_p)
        return kvf__fail(KVF_ERR_INVALID, "geometry: NULL output");
    size_t token_elems, rows;
    shape_of(g, &token_elems, &rows);
    /* checked above: rows * token_elems * tokens * bits fits */
    *bytes_p = rows * (token_elems * g->tokens_per_block * kvf_dtype_bits(g->dtype) / 8);
    return KVF_OK;
}

kvf_status kvf_geometry_region(const kvf_geometry *g, uint32_t tokens, kvf_region *region_p)
{
    kvf_status st = kvf_geometry_check(g);
    if (st != KVF_OK)
        return st;
    if (!region_p)
        return kvf__fail(KVF_ERR_INVALID, "geometry: NULL output");
    size_t token_elems, rows;
    shape_of(g, &token_elems, &rows);
    unsigned bits = kvf_dtype_bits(g->dtype);
    size_t pitch = token_elems * g->tokens_per_block * bits / 8;
    kvf_region r;
    if (tokens == 0 || tokens >= g->tokens_per_block) {
        r.rows = 1;
        r.row_bytes = rows * pitch;
        r.pitch = r.row_bytes;
    } else {
        size_t row_bits = token_elems * tokens * bits;
        if (row_bits % 8 != 0)
            return kvf__fail(KVF_ERR_UNSUPPORTED,
                             "geometry: first %u tokens of a row are %zu %s elements, "
                             "not whole bytes",
                             tokens, token_elems * tokens, kvf_dtype_name(g->dtype));
        r.rows = rows;
        r.row_bytes = row_bits / 8;
        r.pitch = pitch;
        /* one row left: the region is contiguous */
        if (rows == 1)
            r.pitch = r.row_bytes;
    }
    *region_p = r;
    return KVF_OK;
}

uint64_t kvf__geometry_fingerprint(const kvf_geometry *g, size_t n)
{
    /* FNV-1a over the fields, not the struct, so padding never matters */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        const uint32_t f[] = {g[i].layers,           g[i].kv_factor, g[i].kv_heads,
                              g[i].tokens_per_block, g[i].head_size, (uint32_t)g[i].dtype,
                              (uint32_t)g[i].order};
        for (size_t j = 0; j < sizeof f / sizeof f[0]; j++)
            for (int b = 0; b < 4; b++) {
                h ^= (f[j] >> (8 * b)) & 0xff;
                h *= 0x100000001b3ull;
            }
    }
    return h;
}
