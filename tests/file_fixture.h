/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An engine of one pool (primary and secondary slots, host memory) over a
 * file tier in a fresh temporary directory, namespace "ns": for the tests
 * of the file tier's corner cases, which need a real engine and little
 * else. Include after testutil.h.
 */
#ifndef KVF_FILE_FIXTURE_H
#define KVF_FILE_FIXTURE_H

#define FF_SLOTS 8

typedef struct file_fixture {
    char dir[256], ns_dir[300];
    kvf_engine *e;
    size_t bytes; /* of one block */
} file_fixture;

static const kvf_geometry FF_GEOMETRY = {2, 2, 2, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};

/* (Re)opens the engine on f->dir, as a restart does. */
static inline void ff_open(file_fixture *f)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.dir = f->dir;
    cfg.file.namespace_ = "ns";
    REQUIRE(kvf_engine_create(&cfg, &f->e) == KVF_OK);
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, FF_SLOTS};
    kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, FF_SLOTS};
    uint32_t idx;
    REQUIRE(kvf_engine_add_pool(f->e, &FF_GEOMETRY, &prim, &sec, &idx) == KVF_OK);
    REQUIRE(kvf_geometry_block_bytes(&FF_GEOMETRY, &f->bytes) == KVF_OK);
}

static inline void ff_init(file_fixture *f)
{
    memset(f, 0, sizeof *f);
    REQUIRE(test_tmpdir(f->dir, sizeof f->dir) == 0);
    snprintf(f->ns_dir, sizeof f->ns_dir, "%s/ns", f->dir);
    ff_open(f);
}

static inline void ff_done(file_fixture *f)
{
    kvf_engine_destroy(f->e);
    f->e = NULL;
    test_rmtree(f->dir);
}

static inline uint8_t *ff_slot(file_fixture *f, kvf_level lv, uint32_t s)
{
    void *p = NULL;
    CHECK_STATUS(kvf_engine_slot_ptr(f->e, 0, lv, s, &p), KVF_OK);
    return (uint8_t *)p;
}

/* One offload of primary slot src to file key KEY(dst), or onboard of key
 * KEY(src) to primary slot dst, waited for. */
static inline kvf_status ff_move1(file_fixture *f, bool offload, uint64_t src, uint64_t dst)
{
    kvf_move m = offload ? TO_KEY(src, KEY(dst)) : FROM_KEY(KEY(src), dst);
    kvf_ticket t;
    kvf_status st = offload ? kvf_offload(f->e, KVF_TIER_DISK, &m, 1, &t)
                            : kvf_onboard(f->e, KVF_TIER_DISK, &m, 1, &t);
    return st == KVF_OK ? kvf_wait(f->e, t, NULL) : st;
}

/* The path of key's block file. */
static inline void ff_key_path(const file_fixture *f, uint64_t key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/" KVF_KEY_FMT ".kvf", f->ns_dir, KVF_KEY_ARGS(KEY(key)));
}

#endif /* KVF_FILE_FIXTURE_H */
