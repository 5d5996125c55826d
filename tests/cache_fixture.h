/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache tests' fixture: a cache over an engine on the host backend (two
 * pools, primary slots as the GPU's, a host tier and optionally a disk tier
 * in a fresh temporary directory); blocks of random data derived from their
 * key, poisoned slots checked byte for byte, single puts and gets waited
 * for, and the tier a key is in. Shared by the test_cache_* programs; one
 * program per translation unit (the helpers keep static state).
 */
#ifndef KVF_CACHE_FIXTURE_H
#define KVF_CACHE_FIXTURE_H

#include "backend.h"
#include "checksum.h"
#include "testutil.h"
#include <pthread.h>

#define POISON 0x5A
/* The keys of a random workload (test_cache_lru's model, the events' replay). */
#define MODEL_KEYS 48

/* Two pools of different shapes: 2 KiB + 512 B per block. */
static const kvf_geometry G_A = {2, 2, 2, 16, 16, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
static const kvf_geometry G_B = {1, 1, 1, 16, 32, KVF_DTYPE_INT8, KVF_ORDER_TOKEN_MAJOR};

typedef struct fixture {
    kvf_engine *e;
    kvf_cache *c;
    char dir[512];
    size_t bytes[2];
    uint32_t primary, secondary;
} fixture;

static inline int fx_engine(fixture *f, bool files)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    cfg.file.dir = files ? f->dir : NULL;
    cfg.file.namespace_ = "cache";
    cfg.file.fsync = KVF_FSYNC_NONE;
    REQUIRE(kvf_engine_create(&cfg, &f->e) == KVF_OK);
    const kvf_geometry *g[2] = {&G_A, &G_B};
    for (int p = 0; p < 2; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, f->primary};
        kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, f->secondary};
        REQUIRE(kvf_engine_add_pool(f->e, g[p], &prim, f->secondary ? &sec : NULL, NULL) == KVF_OK);
        REQUIRE(kvf_geometry_block_bytes(g[p], &f->bytes[p]) == KVF_OK);
    }
    return 0;
}

/* An engine with `primary` slots, `secondary` of them below, an optional
 * file tier, and a cache of the given capacities. */
static inline int fx_init(fixture *f, uint32_t primary, uint32_t secondary, bool files,
                          const kvf_cache_config *cc)
{
    memset(f, 0, sizeof *f);
    f->primary = primary;
    f->secondary = secondary;
    if (files)
        REQUIRE(test_tmpdir(f->dir, sizeof f->dir) == 0);
    fx_engine(f, files);
    CHECK_STATUS(kvf_cache_create(f->e, cc, &f->c), KVF_OK);
    return f->c ? 0 : 1;
}

static inline void fx_close(fixture *f)
{
    kvf_cache_destroy(f->c);
    kvf_engine_destroy(f->e);
    f->c = NULL;
    f->e = NULL;
}

static inline void fx_done(fixture *f)
{
    fx_close(f);
    if (f->dir[0])
        test_rmtree(f->dir);
}

static inline uint8_t *prim(fixture *f, int p, uint32_t slot)
{
    void *ptr = NULL;
    REQUIRE(kvf_engine_slot_ptr(f->e, (uint32_t)p, KVF_LEVEL_PRIMARY, slot, &ptr) == KVF_OK);
    return ptr;
}

/* The bytes of the block under `key`: derived from the key alone. */
static inline void fill_(fixture *f, uint32_t slot, kvf_key key)
{
    for (int p = 0; p < 2; p++)
        test_fill_random(prim(f, p, slot), f->bytes[p], KEY_SEED(key) * 2 + (uint64_t)p);
}
#define fill(f, slot, key) fill_((f), (slot), TKEY(key))

static inline void poison(fixture *f, uint32_t slot)
{
    for (int p = 0; p < 2; p++)
        memset(prim(f, p, slot), POISON, f->bytes[p]);
}

static inline int expect_(fixture *f, uint32_t slot, kvf_key key)
{
    for (int p = 0; p < 2; p++) {
        uint8_t *want = malloc(f->bytes[p]);
        test_fill_random(want, f->bytes[p], KEY_SEED(key) * 2 + (uint64_t)p);
        size_t off = test_mem_diff(prim(f, p, slot), want, f->bytes[p]);
        free(want);
        if (off != (size_t)-1) {
            fprintf(stderr, "slot %u pool %d: block " KVF_KEY_FMT " differs at byte %zu\n", slot, p,
                    KVF_KEY_ARGS(TKEY(key)), off);
            return 1;
        }
    }
    return 0;
}
#define expect(f, slot, key) expect_((f), (slot), TKEY(key))

static inline kvf_status put1_(fixture *f, kvf_key key, uint32_t slot, uint32_t prio)
{
    kvf_cache_ticket t;
    kvf_status st = kvf_cache_put(f->c, &key, &slot, 1, prio, &t);
    return st == KVF_OK ? kvf_cache_wait(f->c, t, NULL) : st;
}
#define put1(f, key, slot, prio) put1_((f), TKEY(key), (slot), (prio))

static inline kvf_status get1_(fixture *f, kvf_key key, uint32_t slot)
{
    kvf_cache_ticket t;
    kvf_status st = kvf_cache_get(f->c, &key, &slot, 1, &t);
    return st == KVF_OK ? kvf_cache_wait(f->c, t, NULL) : st;
}
#define get1(f, key, slot) get1_((f), TKEY(key), (slot))

/* The tier a key is in, or -1. */
static inline int tier_of_(fixture *f, kvf_key key)
{
    size_t hits = 0;
    kvf_tier t = KVF_TIER_COUNT;
    REQUIRE(kvf_cache_lookup(f->c, &key, 1, &hits, &t) == KVF_OK);
    return hits ? (int)t : -1;
}
#define tier_of(f, key) tier_of_((f), TKEY(key))

/* Damages a stored block behind the cache's back. */
static inline void flip_byte(const char *path, long off)
{
    FILE *fp = fopen(path, "r+b");
    REQUIRE(fp);
    fseek(fp, off, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, off, SEEK_SET);
    fputc(ch ^ 0x40, fp);
    fclose(fp);
}

static inline int block_path_(fixture *f, kvf_key key, char *out, size_t cap)
{
    return snprintf(out, cap, "%s/cache/" KVF_KEY_FMT ".kvf", f->dir, KVF_KEY_ARGS(TKEY(key))) <
                   (int)cap
               ? 0
               : 1;
}
#define block_path(f, key, out, cap) block_path_((f), TKEY(key), (out), (cap))

#endif /* KVF_CACHE_FIXTURE_H */
