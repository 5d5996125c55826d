/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the layer-wise arrival benchmarks (disk_arrival.c, remote_arrival.c)
 * share: the Llama-3-8B-shaped layout (a pool per layer: K and V of 8
 * heads of 128, bf16, token-major, 16 tokens a block: 64 KiB a pool, 2 MiB
 * a block over 32 pools), each block's bytes, and the checks.
 */
#ifndef KVF_BENCH_ARRIVAL_BENCH_H
#define KVF_BENCH_ARRIVAL_BENCH_H

#include <kvferry.h>

#include "bench_stats.h"

#include <stdbool.h>
#include <stdint.h>
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

/* The layout; a benchmark may change its tokens a block before use. */
static kvf_geometry G = {1, 2, 8, 16, 128, KVF_DTYPE_BF16, KVF_ORDER_TOKEN_MAJOR};

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Byte i of pool p of block s. */
static inline uint8_t byte_of(uint32_t s, uint32_t p, size_t i)
{
    uint64_t x = (uint64_t)s * 0x9e3779b97f4a7c15ull ^ (uint64_t)p * 0xbf58476d1ce4e5b9ull ^ i;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    return (uint8_t)(x >> 32);
}

/* Slot s's pools of level lv filled with block s's bytes, s < blocks. */
static inline void fill(kvf_engine *e, kvf_level lv, uint32_t blocks, size_t bytes)
{
    for (uint32_t s = 0; s < blocks; s++)
        for (uint32_t p = 0; p < POOLS; p++) {
            void *ptr;
            KV(kvf_engine_slot_ptr(e, p, lv, s, &ptr));
            for (size_t i = 0; i < bytes; i++)
                ((uint8_t *)ptr)[i] = byte_of(s, p, i);
        }
}

/* Every pool of slot s of level lv holds block s's bytes: the mismatches. */
static inline size_t check(kvf_engine *e, kvf_level lv, uint32_t blocks, size_t bytes)
{
    size_t bad = 0;
    for (uint32_t s = 0; s < blocks; s++)
        for (uint32_t p = 0; p < POOLS; p++) {
            void *ptr;
            KV(kvf_engine_slot_ptr(e, p, lv, s, &ptr));
            const uint8_t *b = ptr;
            for (size_t i = 0; i < bytes; i++)
                bad += b[i] != byte_of(s, p, i);
        }
    return bad;
}

/* The primary slots of blocks [0, blocks) poisoned (host memory). */
static inline void poison_host(kvf_engine *e, uint32_t blocks, size_t bytes)
{
    for (uint32_t s = 0; s < blocks; s++)
        for (uint32_t p = 0; p < POOLS; p++) {
            void *ptr;
            KV(kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, s, &ptr));
            memset(ptr, POISON, bytes);
        }
}

/* The stored block of poison bytes device slots are poisoned from. */
static const kvf_key POISON_KEY = {0xbad, 0xbad};

/* A block of poison bytes stored under POISON_KEY on `tier`, from slot 0
 * of e's primary (host) slots, which it overwrites. */
static inline void store_poison(kvf_engine *e, kvf_tier tier, size_t bytes)
{
    for (uint32_t p = 0; p < POOLS; p++) {
        void *ptr;
        KV(kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, 0, &ptr));
        memset(ptr, POISON, bytes);
    }
    kvf_move mv = {.src = 0, .key = POISON_KEY};
    kvf_ticket t;
    KV(kvf_offload(e, tier, &mv, 1, &t));
    KV(kvf_wait(e, t, NULL));
}

/* Poisons the slots the runs write: host slots in place; device slots
 * (which a benchmark does not reach) from the host tier's slots, which
 * the first call fills with the poison block stored on `tier` (read whole
 * into every device slot, then offloaded). */
static inline void poison_slots(kvf_engine *e, kvf_tier tier, uint32_t blocks, size_t bytes,
                                bool device)
{
    static bool host_tier_poisoned;
    if (!device) {
        poison_host(e, blocks, bytes);
        return;
    }
    kvf_move *mv = calloc(blocks, sizeof *mv);
    kvf_ticket t;
    if (!host_tier_poisoned) {
        for (uint32_t s = 0; s < blocks; s++)
            mv[s] = (kvf_move){.dst = s, .key = POISON_KEY};
        KV(kvf_onboard(e, tier, mv, blocks, &t));
        KV(kvf_wait(e, t, NULL));
        for (uint32_t s = 0; s < blocks; s++)
            mv[s] = (kvf_move){.src = s, .dst = s};
        KV(kvf_offload(e, KVF_TIER_HOST, mv, blocks, &t));
        KV(kvf_wait(e, t, NULL));
        host_tier_poisoned = true;
        free(mv);
        return;
    }
    for (uint32_t s = 0; s < blocks; s++)
        mv[s] = (kvf_move){.src = s, .dst = s};
    KV(kvf_onboard(e, KVF_TIER_HOST, mv, blocks, &t));
    KV(kvf_wait(e, t, NULL));
    free(mv);
}

/* Every slot holds its block: host slots checked in place, device slots
 * offloaded to the host tier and checked there. The mismatches. */
static inline size_t check_slots(kvf_engine *e, uint32_t blocks, size_t bytes, bool device)
{
    if (!device)
        return check(e, KVF_LEVEL_PRIMARY, blocks, bytes);
    kvf_move *back = calloc(blocks, sizeof *back);
    kvf_ticket t;
    for (uint32_t s = 0; s < blocks; s++)
        back[s] = (kvf_move){.src = s, .dst = s};
    KV(kvf_offload(e, KVF_TIER_HOST, back, blocks, &t));
    free(back);
    KV(kvf_wait(e, t, NULL));
    return check(e, KVF_LEVEL_SECONDARY, blocks, bytes);
}

/* An engine of `cfg` (its backend, file or remote tier set) with a pool
 * per layer of `slots` slots: device slots on the CUDA backend, else host
 * ones; with host_tier, host secondary slots too. */
static inline kvf_engine *open_pools(const kvf_engine_config *cfg, uint32_t slots, bool host_tier)
{
    kvf_engine *e;
    KV(kvf_engine_create(cfg, &e));
    kvf_memory m = cfg->backend == KVF_BACKEND_CUDA ? KVF_MEMORY_DEVICE : KVF_MEMORY_HOST;
    for (uint32_t p = 0; p < POOLS; p++) {
        kvf_pool_desc prim = {m, NULL, 0, slots};
        kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, slots};
        uint32_t idx;
        KV(kvf_engine_add_pool(e, &G, &prim, host_tier ? &sec : NULL, &idx));
    }
    return e;
}

/* What arrival_measure's poison callback needs: poison_slots's arguments. */
typedef struct poison_args {
    kvf_engine *e;
    kvf_tier tier;
    uint32_t blocks;
    size_t bytes;
    bool device;
} poison_args;

static inline void poison_all(void *arg)
{
    poison_args *a = arg;
    poison_slots(a->e, a->tier, a->blocks, a->bytes, a->device);
}

/* The runs' times: the whole batch, the layer-wise batch's first pool,
 * its end, and each pool's arrival (ms), run r of m->runs. */
typedef struct arrival_runs {
    int runs;
    double whole[100], first[100], last[100], at[POOLS][100];
} arrival_runs;

/* One warm-up, then m->runs runs of: poison, kvf_onboard of moves mv from
 * `tier` to kvf_wait; poison, kvf_onboard_pools of every pool, each pool's
 * kvf_wait_pool in order, kvf_wait. */
static inline void arrival_measure(kvf_engine *e, kvf_tier tier, const kvf_move *mv,
                                   uint32_t blocks, void (*poison)(void *arg), void *arg,
                                   arrival_runs *m)
{
    uint32_t order[POOLS];
    for (uint32_t p = 0; p < POOLS; p++)
        order[p] = p;
    kvf_ticket t;
    for (int r = -1; r < m->runs; r++) {
        poison(arg);
        double t0 = now_ms();
        KV(kvf_onboard(e, tier, mv, blocks, &t));
        KV(kvf_wait(e, t, NULL));
        double t1 = now_ms();
        poison(arg);
        double t2 = now_ms();
        KV(kvf_onboard_pools(e, tier, order, POOLS, mv, blocks, &t));
        for (uint32_t p = 0; p < POOLS; p++) {
            KV(kvf_wait_pool(e, t, p));
            if (r >= 0)
                m->at[p][r] = now_ms() - t2;
        }
        KV(kvf_wait(e, t, NULL));
        double t3 = now_ms();
        if (r < 0)
            continue; /* warm-up */
        m->whole[r] = t1 - t0;
        m->first[r] = m->at[0][r];
        m->last[r] = t3 - t2;
    }
}

/* The medians of m (mb: the batch's MB), and the check's verdict. */
static inline void arrival_print(arrival_runs *m, double mb, size_t bad)
{
    double wm = median(m->whole, m->runs), fm = median(m->first, m->runs);
    double lm = median(m->last, m->runs);
    printf("  whole batch (kvf_onboard)      %8.2f ms  %6.2f GB/s\n", wm, mb / wm);
    printf("  layer-wise, first pool arrived %8.2f ms  (%.3f of whole)\n", fm, fm / wm);
    printf("  layer-wise, last pool arrived  %8.2f ms  %6.2f GB/s  (%.3f of whole)\n", lm, mb / lm,
           lm / wm);
    printf("  pool arrivals (ms):");
    for (uint32_t p = 0; p < POOLS; p++)
        printf("%s%.1f", p % 8 ? " " : "\n   ", median(m->at[p], m->runs));
    printf("\n  verified: %s (%zu bytes differ)\n", bad ? "NO" : "every byte", bad);
}

#endif /* KVF_BENCH_ARRIVAL_BENCH_H */
