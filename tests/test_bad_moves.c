/* SPDX-License-Identifier: Apache-2.0 */
/* Batches the engine must refuse whole, on every submit path: a token
 * count above the block's (not "the whole block"), moves NULL with n > 0
 * (not "empty"), and keys chained from tokens that are not there. A
 * refused batch queues nothing: its destination keeps its poison. */
#include "engine.h"
#include "testutil.h"

enum { SLOTS = 8, TPB = 8 };

static const kvf_geometry G[2] = {
    {2, 2, 2, TPB, 16, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
    {1, 1, 4, TPB, 8, KVF_DTYPE_INT4, KVF_ORDER_TOKEN_MAJOR},
};

typedef struct fixture {
    char dir[256];
    kvf_engine *e;
    bool remote;
} fixture;

static int fx_init(fixture *f)
{
    REQUIRE(test_tmpdir(f->dir, sizeof f->dir) == 0);
    f->remote = test_store_built("redis");
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.dir = f->dir;
    /* never reached: the batches below are refused before any connection */
    cfg.remote.url = f->remote ? "redis://127.0.0.1:1" : NULL;
    REQUIRE(kvf_engine_create(&cfg, &f->e) == KVF_OK);
    for (int p = 0; p < 2; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, SLOTS};
        kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, SLOTS};
        REQUIRE(kvf_engine_add_pool(f->e, &G[p], &prim, &sec, NULL) == KVF_OK);
    }
    return 0;
}

static void fx_done(fixture *f)
{
    kvf_engine_destroy(f->e);
    test_rmtree(f->dir);
}

typedef enum path {
    OFFLOAD_HOST,
    OFFLOAD_FILE,
    OFFLOAD_REMOTE,
    ONBOARD_HOST,
    ONBOARD_FILE,
    ONBOARD_REMOTE,
    COPY,
    DEMOTE,
    PROMOTE,
    CACHE_OFFLOAD, /* the cache's checked moves */
    CACHE_COPY,
    PATHS
} path;

static const char *const path_names[PATHS] = {"offload host",  "offload file", "offload remote",
                                              "onboard host",  "onboard file", "onboard remote",
                                              "copy",          "demote",       "promote",
                                              "cache offload", "cache copy"};

static kvf_status submit(kvf_engine *e, path p, const kvf_move *mv, size_t n, kvf_ticket *t)
{
    switch (p) {
    case OFFLOAD_HOST:
        return kvf_offload(e, KVF_TIER_HOST, mv, n, t);
    case OFFLOAD_FILE:
        return kvf_offload(e, KVF_TIER_DISK, mv, n, t);
    case OFFLOAD_REMOTE:
        return kvf_offload(e, KVF_TIER_REMOTE, mv, n, t);
    case ONBOARD_HOST:
        return kvf_onboard(e, KVF_TIER_HOST, mv, n, t);
    case ONBOARD_FILE:
        return kvf_onboard(e, KVF_TIER_DISK, mv, n, t);
    case ONBOARD_REMOTE:
        return kvf_onboard(e, KVF_TIER_REMOTE, mv, n, t);
    case COPY:
        return kvf_copy(e, mv, n, t);
    case DEMOTE:
        return kvf_demote(e, KVF_TIER_DISK, mv, n, t);
    case PROMOTE:
        return kvf_promote(e, KVF_TIER_DISK, mv, n, t);
    case CACHE_OFFLOAD:
        return kvf__engine_move_checked(e, KVF_TIER_HOST, false, NULL, 0, mv, n, t);
    default:
        return kvf__engine_move_checked(e, KVF_TIER_HOST, true, NULL, 0, mv, n, t);
    }
}

/* Two moves whose slots and keys are valid on path p; the second's src
 * and dst differ from the first's. */
static void good_moves(path p, kvf_move mv[2])
{
    bool keyed_src = p == ONBOARD_FILE || p == ONBOARD_REMOTE || p == PROMOTE;
    bool keyed_dst = p == OFFLOAD_FILE || p == OFFLOAD_REMOTE || p == DEMOTE;
    for (uint64_t i = 0; i < 2; i++) {
        mv[i].src = keyed_src ? 0 : i;
        mv[i].dst = keyed_dst ? 0 : 4 + i;
        mv[i].tokens = 0;
        mv[i].key = keyed_src ? KEY(0x100 + i) : keyed_dst ? KEY(0x200 + i) : KVF_KEY_ROOT;
    }
}

/* Whether slot s of `level` in pool 0 still holds the poison byte. */
static bool poisoned(kvf_engine *e, kvf_level level, uint32_t s, size_t bytes)
{
    uint8_t *ptr = NULL;
    if (kvf_engine_slot_ptr(e, 0, level, s, (void **)&ptr) != KVF_OK)
        return false;
    for (size_t i = 0; i < bytes; i++)
        if (ptr[i] != 0xa5)
            return false;
    return true;
}

static int test_tokens_above_block(void)
{
    fixture f;
    fx_init(&f);
    size_t bytes;
    REQUIRE(kvf_geometry_block_bytes(&G[0], &bytes) == KVF_OK);
    static const uint32_t bad_tokens[] = {TPB + 1, 1000, UINT32_MAX};
    for (path p = 0; p < PATHS; p++) {
        if ((p == OFFLOAD_REMOTE || p == ONBOARD_REMOTE) && !f.remote)
            continue;
        kvf_level dst_level = p == OFFLOAD_HOST || p == CACHE_OFFLOAD || p == PROMOTE
                                  ? KVF_LEVEL_SECONDARY
                                  : KVF_LEVEL_PRIMARY;
        for (size_t k = 0; k < sizeof bad_tokens / sizeof *bad_tokens; k++) {
            kvf_move mv[2];
            good_moves(p, mv);
            mv[1].tokens = bad_tokens[k];
            for (uint32_t s = 0; s < SLOTS; s++) {
                uint8_t *ptr;
                REQUIRE(kvf_engine_slot_ptr(f.e, 0, dst_level, s, (void **)&ptr) == KVF_OK);
                memset(ptr, 0xa5, bytes);
            }
            kvf_ticket t = {0};
            kvf_status st = submit(f.e, p, mv, 2, &t);
            if (st != KVF_ERR_RANGE)
                TEST_FAIL_AT(__FILE__, __LINE__, "%s, %u tokens: got %s (%s)", path_names[p],
                             bad_tokens[k], kvf_status_str(st), kvf_last_error());
            CHECK_STR_HAS(kvf_last_error(), "move 1");
            CHECK_STR_HAS(kvf_last_error(), "pool 0");
            CHECK_STR_HAS(kvf_last_error(), "tokens_per_block");
            CHECK(t.id == 0);
            /* nothing queued: the good move did not run either */
            CHECK_STATUS(kvf_sync_stream(f.e, NULL), KVF_OK);
            if (p != OFFLOAD_FILE && p != OFFLOAD_REMOTE && p != DEMOTE)
                CHECK(poisoned(f.e, dst_level, (uint32_t)mv[0].dst, bytes));
        }
    }
    /* a whole block spelled out is a whole block */
    kvf_move whole = {0, 1, TPB};
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &whole, 1, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(f.e, t, NULL), KVF_OK);
    fx_done(&f);
    return 0;
}

static int test_null_moves(void)
{
    fixture f;
    fx_init(&f);
    kvf_ticket t = {0};
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, NULL, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "moves is NULL with n = 1");
    CHECK_STATUS(kvf_onboard(f.e, KVF_TIER_HOST, NULL, 3, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "moves is NULL with n = 3");
    CHECK_STATUS(kvf_copy(f.e, NULL, 1, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "moves is NULL");
    CHECK_STATUS(kvf_remove(f.e, KVF_TIER_DISK, NULL, 2, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "keys is NULL with n = 2");
    kvf_move mv = {0, 1, 0};
    CHECK_STATUS(kvf_offload(f.e, KVF_TIER_HOST, &mv, 0, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "empty batch");
    CHECK(t.id == 0);
    fx_done(&f);
    return 0;
}

static int test_key_chain_refusals(void)
{
    uint32_t toks[16];
    for (uint32_t i = 0; i < 16; i++)
        toks[i] = i * 7 + 1;
    kvf_key keys[4] = {KEY(0)};
    /* tokens that are not there: 0, the key no block has, and a reason */
    CHECK(kvf_key_is_root(kvf_key_chain(KVF_KEY_ROOT, NULL, 5, 0)));
    CHECK_STR_HAS(kvf_last_error(), "tokens is NULL with n = 5");
    CHECK(
        !kvf_key_is_root(kvf_key_chain(KVF_KEY_ROOT, NULL, 0, 0))); /* an empty block is a block */
    CHECK_EQ_INT(kvf_key_chain_all(NULL, 16, 8, 0, keys, 4), 0);
    CHECK_STR_HAS(kvf_last_error(), "tokens is NULL with n_tokens = 16");
    CHECK_EQ_INT(kvf_key_chain_all(toks, 16, 8, 0, NULL, 4), 0);
    CHECK_STR_HAS(kvf_last_error(), "keys is NULL with cap = 4");
    CHECK_EQ_INT(kvf_key_chain_all(toks, 16, 0, 0, keys, 4), 0);
    CHECK_STR_HAS(kvf_last_error(), "tokens_per_block is 0");
    CHECK(kvf_key_is_root(keys[0])); /* nothing written */
    /* valid calls: counted, and the error cleared */
    CHECK_EQ_INT(kvf_key_chain_all(toks, 16, 8, 0, NULL, 0), 2);
    CHECK(kvf_last_error()[0] == '\0');
    CHECK_EQ_INT(kvf_key_chain_all(NULL, 7, 8, 0, keys, 4), 0);
    CHECK(kvf_last_error()[0] == '\0');
    CHECK_EQ_INT(kvf_key_chain_all(toks, 16, 8, 0, keys, 4), 2);
    CHECK(kvf_key_eq(keys[0], kvf_key_chain(KVF_KEY_ROOT, toks, 8, 0)));
    return 0;
}

int main(void)
{
    RUN(test_tokens_above_block);
    RUN(test_null_moves);
    RUN(test_key_chain_refusals);
    return TEST_RESULT();
}
