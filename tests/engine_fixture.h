/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine tests' fixture: an engine on the host backend with three pools
 * of different shapes (primary and secondary slots), optionally over a file
 * tier in a fresh temporary directory; blocks of random data derived from a
 * tag, poisoned slots, and checks byte for byte (poison outside the tokens
 * moved included). Shared by the test_engine_* programs; one program per
 * translation unit (the helpers keep static state).
 */
#ifndef KVF_ENGINE_FIXTURE_H
#define KVF_ENGINE_FIXTURE_H

#include "backend.h"
#include "fileio.h"
#include "testutil.h"
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define POISON 0xA5

typedef struct fixture {
    kvf_engine *e;
    kvf_geometry g[3];
    size_t bytes[3];
    uint32_t pools, slots;
    char dir[512];
} fixture;

static const kvf_geometry G_REF = {2, 2, 2, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
static const kvf_geometry G_TOK = {1, 1, 4, 16, 8, KVF_DTYPE_BF16, KVF_ORDER_TOKEN_MAJOR};
static const kvf_geometry G_I4 = {3, 2, 1, 16, 6, KVF_DTYPE_INT4, KVF_ORDER_HEAD_MAJOR};

/* The remote tier of the engines fx_open opens next (NULL: none), e.g.
 * "mem://name". */
static const char *fx_remote;

static inline int fx_open(fixture *f, const char *dir, const char *ns, uint32_t threads)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = threads;
    cfg.file.dir = dir;
    cfg.file.namespace_ = ns;
    cfg.remote.url = fx_remote;
    CHECK_STATUS(kvf_engine_create(&cfg, &f->e), KVF_OK);
    CHECK(kvf_engine_backend(f->e) == KVF_BACKEND_HOST);
    for (uint32_t p = 0; p < f->pools; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, f->slots};
        kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, f->slots};
        uint32_t idx = 99;
        CHECK_STATUS(kvf_engine_add_pool(f->e, &f->g[p], &prim, &sec, &idx), KVF_OK);
        CHECK(idx == p);
        CHECK_STATUS(kvf_geometry_block_bytes(&f->g[p], &f->bytes[p]), KVF_OK);
    }
    return 0;
}

/* Three pools of different shapes, as TensorRT-LLM iterates over several. */
static inline int fx_init(fixture *f, bool files, uint32_t slots)
{
    memset(f, 0, sizeof *f);
    f->g[0] = G_REF;
    f->g[1] = G_TOK;
    f->g[2] = G_I4;
    f->pools = 3;
    f->slots = slots;
    if (files)
        CHECK(test_tmpdir(f->dir, sizeof f->dir) == 0);
    return fx_open(f, files ? f->dir : NULL, "test", 0);
}

static inline void fx_done(fixture *f)
{
    kvf_engine_destroy(f->e);
    f->e = NULL;
    if (f->dir[0])
        test_rmtree(f->dir);
}

static inline uint8_t *slot(fixture *f, uint32_t p, kvf_level lv, uint32_t s)
{
    void *ptr = NULL;
    if (kvf_engine_slot_ptr(f->e, p, lv, s, &ptr) != KVF_OK)
        return NULL;
    return ptr;
}

/* Fills primary slot s of every pool with data derived from `tag`. */
static inline void fill_block(fixture *f, uint32_t s, uint64_t tag)
{
    for (uint32_t p = 0; p < f->pools; p++)
        test_fill_random(slot(f, p, KVF_LEVEL_PRIMARY, s), f->bytes[p], tag * 31 + p + 1);
}

static inline void poison_block(fixture *f, uint32_t s)
{
    for (uint32_t p = 0; p < f->pools; p++)
        memset(slot(f, p, KVF_LEVEL_PRIMARY, s), POISON, f->bytes[p]);
}

/* Primary slot s holds the first `tokens` tokens of the block made from
 * `tag`, and poison everywhere else. */
static inline int expect_block(fixture *f, uint32_t s, uint64_t tag, uint32_t tokens)
{
    for (uint32_t p = 0; p < f->pools; p++) {
        uint8_t *want = malloc(f->bytes[p]);
        test_fill_random(want, f->bytes[p], tag * 31 + p + 1);
        kvf_region r;
        CHECK_STATUS(kvf_geometry_region(&f->g[p], tokens, &r), KVF_OK);
        const uint8_t *got = slot(f, p, KVF_LEVEL_PRIMARY, s);
        for (size_t off = 0; off < f->bytes[p]; off++) {
            size_t row = off / r.pitch, in_row = off % r.pitch;
            bool moved = r.rows == 1 ? off < r.row_bytes : (row < r.rows && in_row < r.row_bytes);
            uint8_t e = moved ? want[off] : POISON;
            if (got[off] != e) {
                fprintf(stderr, "slot %u pool %u byte %zu: 0x%02x, want 0x%02x (tag %llu)\n", s, p,
                        off, got[off], e, (unsigned long long)tag);
                free(want);
                return 1;
            }
        }
        free(want);
    }
    return 0;
}

/* One move, waited for; on DISK and REMOTE the key's side is a number n,
 * the block KEY(n). */
static inline kvf_status run1(kvf_engine *e, bool offload, kvf_tier tier, uint64_t src,
                              uint64_t dst, uint32_t tokens)
{
    kvf_move m = test_move(tier, offload, src, dst, tokens);
    kvf_ticket t;
    kvf_status st = offload ? kvf_offload(e, tier, &m, 1, &t) : kvf_onboard(e, tier, &m, 1, &t);
    if (st != KVF_OK)
        return st;
    return kvf_wait(e, t, NULL);
}

/* A failure is never hidden behind a later success: a move queued to read
 * what a failed move wrote is lost too, and so is every later read of that
 * secondary slot until it is written again. */
static uint8_t *fail_dst;
static inline kvf_status fail_copy(const kvf__copy *c)
{
    return c->dst == fail_dst ? KVF_ERR_IO : KVF_OK;
}

#endif /* KVF_ENGINE_FIXTURE_H */
