/* SPDX-License-Identifier: Apache-2.0 */
/* Prefix reuse through the cache, as a serving engine wires it: a request
 * finishes and its blocks go to the cache (put); a later request with the
 * same system prompt finds them (lookup) and has them copied into its own
 * blocks (get) instead of recomputing them. Host backend, host and disk
 * tiers. Build against an installed kvferry:
 *   cc cache_prefix.c $(pkg-config --cflags --libs kvferry) -o cache_prefix */
#include <kvferry.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                                  \
    do {                                                                                           \
        kvf_status st_ = (call);                                                                   \
        if (st_ != KVF_OK) {                                                                       \
            fprintf(stderr, "%s: %s (%s)\n", #call, kvf_status_str(st_), kvf_last_error());        \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

enum { TPB = 16, GPU_BLOCKS = 16, MAX_BLOCKS = 8 };

/* What "computing" a block's KV means here: bytes that depend on its key. */
static void prefill(uint8_t *block, size_t bytes, kvf_key key)
{
    for (size_t i = 0; i < bytes; i++)
        block[i] = (uint8_t)(((key.lo ^ key.hi) >> (8 * (i % 8))) + i * 31 + 1);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/tmp/kvferry-cache-example";
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.dir = dir;
    cfg.file.namespace_ = "example";
    kvf_engine *e;
    TRY(kvf_engine_create(&cfg, &e));
    kvf_geometry g = {.layers = 4,
                      .kv_factor = 2,
                      .kv_heads = 2,
                      .tokens_per_block = TPB,
                      .head_size = 64,
                      .dtype = KVF_DTYPE_BF16,
                      .order = KVF_ORDER_HEAD_MAJOR};
    size_t bytes;
    TRY(kvf_geometry_block_bytes(&g, &bytes));
    kvf_pool_desc gpu = {KVF_MEMORY_HOST, NULL, 0, GPU_BLOCKS}; /* "the engine's GPU blocks" */
    kvf_pool_desc host = {KVF_MEMORY_HOST, NULL, 0, 8};
    TRY(kvf_engine_add_pool(e, &g, &gpu, &host, NULL));

    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 8;
    cc.disk.blocks = 64;
    kvf_cache *cache;
    TRY(kvf_cache_create(e, &cc, &cache));

    /* two requests sharing a 64-token system prompt, then their own text */
    uint32_t req[2][100];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 100; i++)
            req[r][i] = i < 64 ? (uint32_t)(1000 + i) : (uint32_t)(r * 5000 + i);

    for (int r = 0; r < 2; r++) {
        kvf_key keys[MAX_BLOCKS];
        size_t n = kvf_key_chain_all(req[r], 100, TPB, 0, keys, MAX_BLOCKS);
        size_t hits;
        TRY(kvf_cache_lookup(cache, keys, n, &hits, NULL));
        uint32_t slots[MAX_BLOCKS];
        for (size_t b = 0; b < n; b++)
            slots[b] = (uint32_t)(r * MAX_BLOCKS + b); /* the blocks the engine gave it */
        if (hits) {
            kvf_cache_ticket t;
            TRY(kvf_cache_get(cache, keys, slots, hits, &t));
            if (kvf_cache_wait(cache, t, NULL) != KVF_OK)
                hits = 0; /* a block could not be read back whole: recompute all */
        }
        for (size_t b = 0; b < n; b++) {
            void *p;
            TRY(kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, slots[b], &p));
            if (b >= hits) {
                prefill(p, bytes, keys[b]);
                continue;
            }
            uint8_t *want = malloc(bytes);
            prefill(want, bytes, keys[b]);
            if (memcmp(p, want, bytes) != 0) {
                fprintf(stderr, "request %d block %zu: wrong bytes\n", r, b);
                return 1;
            }
            free(want);
        }
        printf("request %d: %zu blocks, %zu from the cache, %zu tokens not recomputed\n", r, n,
               hits, hits * TPB);
        /* the request is done: its blocks go to the cache */
        kvf_cache_ticket t;
        TRY(kvf_cache_put(cache, keys, slots, n, 50, &t));
        TRY(kvf_cache_wait(cache, t, NULL));
    }
    kvf_cache_destroy(cache);
    kvf_engine_destroy(e);
    return 0;
}
