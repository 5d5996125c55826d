/* SPDX-License-Identifier: Apache-2.0 */
/* The cache over a CUDA engine: device primary slots, pinned host tier,
 * disk tier, so puts from GPU memory, demotions from pinned slots to files
 * (host-only copies on a CUDA engine) and gets into GPU memory from each
 * tier, on random data with poisoned device destinations, checked byte for
 * byte. Exits 77 without a GPU. */
#include "testutil_cuda.h"
#ifdef KVF_HAVE_HIREDIS
#include "redis_server.h"
#endif

#define POISON 0x3C
#define GPU_SLOTS 64

/* fp16 head-major and int4, as an engine with two kinds of layer would */
static const kvf_geometry G_A = {4, 2, 2, 32, 64, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR};
static const kvf_geometry G_B = {2, 2, 2, 32, 64, KVF_DTYPE_INT4, KVF_ORDER_HEAD_MAJOR};

static kvf_engine *engine;
static kvf_cache *cache;
static size_t bytes[2];
static uint8_t *dev[2];
static char dir[512];

static void block_bytes_of(kvf_key key, int p, uint8_t *out)
{
    test_fill_random(out, bytes[p], KEY_SEED(key) * 3 + (uint64_t)p);
}

static void upload(uint32_t slot, kvf_key key)
{
    for (int p = 0; p < 2; p++) {
        uint8_t *h = malloc(bytes[p]);
        block_bytes_of(key, p, h);
        CUDA_OK(cudaMemcpy(dev[p] + slot * bytes[p], h, bytes[p], cudaMemcpyHostToDevice));
        free(h);
    }
}

static void poison(uint32_t slot)
{
    for (int p = 0; p < 2; p++)
        CUDA_OK(cudaMemset(dev[p] + slot * bytes[p], POISON, bytes[p]));
    CUDA_OK(cudaDeviceSynchronize());
}

static int expect(uint32_t slot, kvf_key key)
{
    for (int p = 0; p < 2; p++) {
        uint8_t *want = malloc(bytes[p]), *got = malloc(bytes[p]);
        block_bytes_of(key, p, want);
        CUDA_OK(cudaMemcpy(got, dev[p] + slot * bytes[p], bytes[p], cudaMemcpyDeviceToHost));
        size_t off = test_mem_diff(got, want, bytes[p]);
        free(want);
        free(got);
        if (off != (size_t)-1) {
            fprintf(stderr, "gpu slot %u pool %d: block " KVF_KEY_FMT " differs at byte %zu\n",
                    slot, p, KVF_KEY_ARGS(TKEY(key)), off);
            return 1;
        }
    }
    return 0;
}

static int setup(void)
{
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_CUDA;
    cfg.file.dir = dir;
    cfg.file.namespace_ = "cuda-cache";
    cfg.file.fsync = KVF_FSYNC_NONE;
    kvf_status st = kvf_engine_create(&cfg, &engine);
    if (st == KVF_ERR_NO_DEVICE) {
        test_rmtree(dir);
        TEST_SKIP_ALL("no CUDA device: %s", kvf_last_error());
    }
    REQUIRE(st == KVF_OK);
    const kvf_geometry *g[2] = {&G_A, &G_B};
    for (int p = 0; p < 2; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_DEVICE, NULL, 0, GPU_SLOTS};
        kvf_pool_desc sec = {KVF_MEMORY_HOST_PINNED, NULL, 0, 16};
        REQUIRE(kvf_engine_add_pool(engine, g[p], &prim, &sec, NULL) == KVF_OK);
        REQUIRE(kvf_geometry_block_bytes(g[p], &bytes[p]) == KVF_OK);
        void *ptr;
        REQUIRE(kvf_engine_slot_ptr(engine, (uint32_t)p, KVF_LEVEL_PRIMARY, 0, &ptr) == KVF_OK);
        dev[p] = ptr;
    }
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 16;
    cc.disk.blocks = 256;
    REQUIRE(kvf_cache_create(engine, &cc, &cache) == KVF_OK);
    return 0;
}

/* Rounds of: a request's 24 blocks filled on the GPU and put (most of the
 * host tier's content moves to disk each round), then every block put so
 * far got back into poisoned GPU slots in a random order, from whichever
 * tier holds it. */
static int test_rounds(void)
{
    enum { ROUNDS = 4, PER = 24 };
    kvf_key all[ROUNDS * PER];
    size_t nall = 0;
    for (int r = 0; r < ROUNDS; r++) {
        kvf_key keys[PER];
        uint32_t slots[PER];
        for (uint32_t i = 0; i < PER; i++) {
            keys[i] = KEY(0xa000 + (uint64_t)(r * PER + i));
            slots[i] = i;
            upload(i, keys[i]);
            all[nall++] = keys[i];
        }
        kvf_cache_ticket t;
        kvf_status per[PER];
        CHECK_STATUS(kvf_cache_put(cache, keys, slots, PER, 50, &t), KVF_OK);
        CHECK_STATUS(kvf_cache_wait(cache, t, per), KVF_OK);

        uint32_t order[ROUNDS * PER];
        for (uint32_t i = 0; i < nall; i++)
            order[i] = i;
        test_shuffle_u32(order, nall, 77 + (uint64_t)r);
        for (size_t off = 0; off < nall; off += 32) {
            size_t n = nall - off < 32 ? nall - off : 32;
            kvf_key k[32];
            uint32_t s[32];
            for (size_t i = 0; i < n; i++) {
                k[i] = all[order[off + i]];
                s[i] = 32 + (uint32_t)i;
                poison(s[i]);
            }
            size_t hits = 0;
            kvf_tier tiers[32];
            CHECK_STATUS(kvf_cache_lookup(cache, k, n, &hits, tiers), KVF_OK);
            CHECK_EQ_INT(hits, n);
            kvf_status gs[32];
            CHECK_STATUS(kvf_cache_get(cache, k, s, n, &t), KVF_OK);
            CHECK_STATUS(kvf_cache_wait(cache, t, gs), KVF_OK);
            for (size_t i = 0; i < n; i++)
                if (expect(s[i], k[i]))
                    return 1;
        }
    }
    kvf_cache_stats st = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(cache, &st), KVF_OK);
    CHECK_EQ_INT(st.blocks[KVF_TIER_HOST], 16);
    CHECK_EQ_INT(st.blocks[KVF_TIER_DISK], ROUNDS * PER - 16);
    CHECK(st.bytes_out[KVF_TIER_DISK] > 0 && st.bytes_out[KVF_TIER_HOST] > 0);
    CHECK_EQ_INT(st.failures, 0);
    return 0;
}

#ifdef KVF_HAVE_HIREDIS
/* The remote tier on a CUDA engine: blocks offloaded from device slots to a
 * real redis-server and onboarded back (whole and partial), and a cache
 * writing through to it and reading back what it dropped locally. Skips
 * without redis-server. */
static int test_remote(void)
{
    if (!redis_tool_found("redis-server") || !redis_tool_found("redis-cli"))
        return TEST_SKIP;
    redis_server srv = {0};
    REQUIRE(redis_server_start(&srv, NULL) == 0);
    char url[128];
    redis_url(url, sizeof url, &srv, NULL);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_CUDA;
    cfg.file.namespace_ = "cuda-remote";
    cfg.remote.url = url;
    kvf_engine *e;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    const kvf_geometry *g[2] = {&G_A, &G_B};
    uint8_t *saved[2] = {dev[0], dev[1]};
    for (int p = 0; p < 2; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_DEVICE, NULL, 0, GPU_SLOTS};
        kvf_pool_desc sec = {KVF_MEMORY_HOST_PINNED, NULL, 0, 4};
        REQUIRE(kvf_engine_add_pool(e, g[p], &prim, &sec, NULL) == KVF_OK);
        void *ptr;
        REQUIRE(kvf_engine_slot_ptr(e, (uint32_t)p, KVF_LEVEL_PRIMARY, 0, &ptr) == KVF_OK);
        dev[p] = ptr; /* upload/poison/expect act on this engine now */
    }
    enum { N = 16 };
    kvf_move off[N], on[N];
    for (uint32_t i = 0; i < N; i++) {
        upload(i, TKEY(0xd000 + i));
        off[i] = TO_KEY(i, 0xd000 + i);
        on[i] = FROM_KEY(0xd000 + i, 63 - i);
        poison(63 - i);
    }
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(e, KVF_TIER_REMOTE, off, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_onboard(e, KVF_TIER_REMOTE, on, N, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        CHECK(expect(63 - i, TKEY(0xd000 + i)) == 0);

    /* a cache writing through: 4 host slots, 16 blocks; all come back */
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 4;
    cc.remote = KVF_CACHE_REMOTE_WRITE_THROUGH;
    kvf_cache *rc;
    REQUIRE(kvf_cache_create(e, &cc, &rc) == KVF_OK);
    kvf_key keys[N];
    uint32_t src[N], dst[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = KEY(0xe000 + i);
        src[i] = i;
        dst[i] = 32 + i;
        upload(i, keys[i]);
        poison(dst[i]);
    }
    kvf_status per[N];
    kvf_cache_ticket ct;
    CHECK_STATUS(kvf_cache_put(rc, keys, src, N, 50, &ct), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(rc, ct, per), KVF_OK);
    size_t hits = 0;
    CHECK_STATUS(kvf_cache_lookup(rc, keys, N, &hits, NULL), KVF_OK);
    CHECK_EQ_INT(hits, N);
    CHECK_STATUS(kvf_cache_get(rc, keys, dst, N, &ct), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(rc, ct, per), KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        CHECK(expect(dst[i], keys[i]) == 0);
    kvf_cache_stats st = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(rc, &st);
    CHECK(st.bytes_out[KVF_TIER_REMOTE] > 0);
    CHECK_EQ_INT(st.remote_errors, 0);
    kvf_cache_destroy(rc);
    kvf_engine_destroy(e);
    dev[0] = saved[0];
    dev[1] = saved[1];
    redis_server_stop(&srv);
    return 0;
}
#endif

int main(void)
{
    setup();
    RUN(test_rounds);
#ifdef KVF_HAVE_HIREDIS
    RUN(test_remote);
#endif
    kvf_cache_destroy(cache);
    kvf_engine_destroy(engine);
    test_rmtree(dir);
    return TEST_RESULT();
}
