/* SPDX-License-Identifier: Apache-2.0 */
/*
 * remote_arrival: when a layer-wise onboard from the remote tier hands
 * over its first pool, against the whole batch, for the remote group size
 * of $KVF_REMOTE_GROUP_BYTES (unset: the default). Blocks of a
 * Llama-3-8B-shaped layout (a pool per layer: K and V of 8 heads of 128,
 * bf16, token-major, 16 tokens a block: 64 KiB a pool, 2 MiB a block over
 * 32 pools) are stored at URL, then read back into poisoned slots, each
 * run:
 *
 *   whole     kvf_onboard of every block, to kvf_wait
 *   first     kvf_onboard_pools of every pool, to kvf_wait_pool of pool 0
 *   pools     the same batch: each pool's arrival (kvf_wait_pool in order),
 *             the last one's being the batch's end
 *
 * Median of the runs after one warm-up, then every byte of every slot
 * checked against what was stored. Host backend (the remote store's reads
 * are the same on either).
 *
 * Usage: remote_arrival URL [blocks (32)] [runs (5)] [tokens a block (16)]
 */
#define _POSIX_C_SOURCE 200809L
#include <kvferry.h>

#include "bench_stats.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POOLS 32
#define POISON 0xA5

#define KV(expr)                                                                                   \
    do {                                                                                           \
        kvf_status st_ = (expr);                                                                   \
        if (st_ != KVF_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #expr,                     \
                    kvf_status_str(st_), kvf_last_error());                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static kvf_geometry G = {1, 2, 8, 16, 128, KVF_DTYPE_BF16, KVF_ORDER_TOKEN_MAJOR};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint8_t byte_of(uint32_t s, uint32_t p, size_t i)
{
    uint64_t x = (uint64_t)s * 0x9e3779b97f4a7c15ull ^ (uint64_t)p * 0xbf58476d1ce4e5b9ull ^ i;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    return (uint8_t)(x >> 32);
}

static kvf_engine *open_engine(const char *url, uint32_t slots)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.namespace_ = "remote-arrival";
    cfg.remote.url = url;
    cfg.remote.timeout_ms = 30000;
    kvf_engine *e;
    KV(kvf_engine_create(&cfg, &e));
    for (uint32_t p = 0; p < POOLS; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, slots};
        uint32_t idx;
        KV(kvf_engine_add_pool(e, &G, &prim, NULL, &idx));
    }
    return e;
}

/* Every pool of slot s holds block s's bytes: the mismatches. */
static size_t check(kvf_engine *e, uint32_t blocks, size_t bytes)
{
    size_t bad = 0;
    for (uint32_t s = 0; s < blocks; s++)
        for (uint32_t p = 0; p < POOLS; p++) {
            void *ptr;
            KV(kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, s, &ptr));
            const uint8_t *b = ptr;
            for (size_t i = 0; i < bytes; i++)
                bad += b[i] != byte_of(s, p, i);
        }
    return bad;
}

static void poison(kvf_engine *e, uint32_t blocks, size_t bytes)
{
    for (uint32_t s = 0; s < blocks; s++)
        for (uint32_t p = 0; p < POOLS; p++) {
            void *ptr;
            KV(kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, s, &ptr));
            memset(ptr, POISON, bytes);
        }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: remote_arrival URL [blocks] [runs]\n");
        return 2;
    }
    const char *url = argv[1];
    uint32_t blocks = argc > 2 ? (uint32_t)atoi(argv[2]) : 32;
    int runs = argc > 3 ? atoi(argv[3]) : 5;
    int tokens = argc > 4 ? atoi(argv[4]) : 16;
    if (blocks == 0 || runs < 1 || runs > 99 || tokens < 1 || tokens > 1024) {
        fprintf(stderr, "remote_arrival: blocks > 0, runs 1..99, tokens 1..1024\n");
        return 2;
    }
    G.tokens_per_block = (uint32_t)tokens;
    size_t bytes;
    KV(kvf_geometry_block_bytes(&G, &bytes));
    kvf_engine *e = open_engine(url, blocks);
    kvf_move *mv = calloc(blocks, sizeof *mv);
    kvf_ticket t;
    for (uint32_t s = 0; s < blocks; s++) {
        for (uint32_t p = 0; p < POOLS; p++) {
            void *ptr;
            KV(kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, s, &ptr));
            for (size_t i = 0; i < bytes; i++)
                ((uint8_t *)ptr)[i] = byte_of(s, p, i);
        }
        mv[s] = (kvf_move){.src = s, .key = {0x5eed, 1 + s}};
    }
    KV(kvf_offload(e, KVF_TIER_REMOTE, mv, blocks, &t));
    KV(kvf_wait(e, t, NULL));
    for (uint32_t s = 0; s < blocks; s++)
        mv[s] = (kvf_move){.dst = s, .key = {0x5eed, 1 + s}};
    uint32_t order[POOLS];
    for (uint32_t p = 0; p < POOLS; p++)
        order[p] = p;
    double whole[100], first[100], last[100], at[POOLS][100];
    for (int r = -1; r < runs; r++) {
        poison(e, blocks, bytes);
        double t0 = now_ms();
        KV(kvf_onboard(e, KVF_TIER_REMOTE, mv, blocks, &t));
        KV(kvf_wait(e, t, NULL));
        double t1 = now_ms();
        poison(e, blocks, bytes);
        double t2 = now_ms();
        KV(kvf_onboard_pools(e, KVF_TIER_REMOTE, order, POOLS, mv, blocks, &t));
        for (uint32_t p = 0; p < POOLS; p++) {
            KV(kvf_wait_pool(e, t, p));
            if (r >= 0)
                at[p][r] = now_ms() - t2;
        }
        KV(kvf_wait(e, t, NULL));
        double t3 = now_ms();
        if (r < 0)
            continue; /* warm-up */
        whole[r] = t1 - t0;
        first[r] = at[0][r];
        last[r] = t3 - t2;
    }
    size_t bad = check(e, blocks, bytes);
    double mb = (double)blocks * POOLS * (double)bytes / 1e6;
    const char *set = getenv("KVF_REMOTE_GROUP_BYTES");
    printf("remote_arrival: %u blocks of %u pools x %zu bytes (%.0f MB), %d runs (median), "
           "%u pool groups (KVF_REMOTE_GROUP_BYTES=%s)\n",
           blocks, POOLS, bytes, mb, runs, kvf_engine_arrival_groups(e, KVF_TIER_REMOTE),
           set && *set ? set : "default");
    double wm = median(whole, runs), fm = median(first, runs), lm = median(last, runs);
    printf("  whole batch (kvf_onboard)      %8.2f ms  %6.2f GB/s\n", wm, mb / wm);
    printf("  layer-wise, first pool arrived %8.2f ms  (%.3f of whole)\n", fm, fm / wm);
    printf("  layer-wise, last pool arrived  %8.2f ms  %6.2f GB/s  (%.3f of whole)\n", lm, mb / lm,
           lm / wm);
    printf("  pool arrivals (ms):");
    for (uint32_t p = 0; p < POOLS; p++)
        printf("%s%.1f", p % 8 ? " " : "\n   ", median(at[p], runs));
    printf("\n  verified: %s (%zu bytes differ)\n", bad ? "NO" : "every byte", bad);
    kvf_engine_destroy(e);
    free(mv);
    return bad ? 1 : 0;
}
