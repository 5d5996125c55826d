/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's remote tier on the in-memory store (mem://NAME), so the
 * remote path runs without a Redis server: offload and onboard, exists and
 * remove through the store, a corrupted value refused for its block only,
 * demote and promote between secondary slots and the store,
 * batches of many chunks in flight at once, blocks shared by two engines
 * and kept across an engine's restart, namespaces apart, and the store
 * ops called directly (list, short buffers, bad URLs), on mem:// and on a
 * file store; a cache whose remote tier is mem://; the TTL honoured and
 * the capacity held, the oldest puts evicted and logged. */
#include "blockhdr.h"
#include "engine.h"
#include "mem_store.h"
#include "testutil.h"

#define POISON 0xC3

static const kvf_geometry G = {2, 2, 2, 16, 32, KVF_DTYPE_BF16, KVF_ORDER_HEAD_MAJOR};

static kvf_engine *open_engine(const char *url, const char *ns, uint32_t slots)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 3;
    cfg.file.namespace_ = ns;
    cfg.remote.url = url;
    kvf_engine *e = NULL;
    if (kvf_engine_create(&cfg, &e) != KVF_OK)
        return NULL;
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, slots};
    if (kvf_engine_add_pool(e, &G, &prim, NULL, NULL) != KVF_OK) {
        kvf_engine_destroy(e);
        return NULL;
    }
    return e;
}

static uint8_t *slot(kvf_engine *e, uint32_t s)
{
    void *p = NULL;
    kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, s, &p);
    return p;
}

static size_t block_bytes(void)
{
    size_t bb = 0;
    kvf_geometry_block_bytes(&G, &bb);
    return bb;
}

/* Slots [0, n) filled from `seed` and offloaded to keys base + i. */
static kvf_status offload_all(kvf_engine *e, uint32_t n, uint64_t base, uint64_t seed)
{
    size_t bb = block_bytes();
    kvf_move *mv = calloc(n, sizeof *mv);
    if (!mv)
        return KVF_ERR_NOMEM;
    for (uint32_t i = 0; i < n; i++) {
        test_fill_random(slot(e, i), bb, seed + i);
        mv[i] = TO_KEY(i, base + i);
    }
    kvf_ticket t;
    kvf_status st = kvf_offload(e, KVF_TIER_REMOTE, mv, n, &t);
    if (st == KVF_OK)
        st = kvf_wait(e, t, NULL);
    free(mv);
    return st;
}

/* Keys base + i onboarded into poisoned slots [0, n); per[] the statuses;
 * the number of slots holding what offload_all(seed) stored. */
static uint32_t onboard_all(kvf_engine *e, uint32_t n, uint64_t base, uint64_t seed,
                            kvf_status *per)
{
    size_t bb = block_bytes();
    kvf_move *mv = calloc(n, sizeof *mv);
    uint8_t *want = malloc(bb);
    REQUIRE(mv && want);
    for (uint32_t i = 0; i < n; i++) {
        memset(slot(e, i), POISON, bb);
        mv[i] = FROM_KEY(base + i, i);
    }
    kvf_ticket t;
    REQUIRE(kvf_onboard(e, KVF_TIER_REMOTE, mv, n, &t) == KVF_OK);
    kvf_wait(e, t, per);
    uint32_t same = 0;
    for (uint32_t i = 0; i < n; i++) {
        test_fill_random(want, bb, seed + i);
        same += memcmp(slot(e, i), want, bb) == 0;
    }
    free(want);
    free(mv);
    return same;
}

static int test_round_trip(void)
{
    enum { N = 8 };
    kvf__mem_store_clear("rt");
    kvf_engine *e = open_engine("mem://rt", "ns1", N);
    REQUIRE(e);
    CHECK_STATUS(offload_all(e, N, 0x100, 1), KVF_OK);
    kvf_status per[N];
    CHECK_EQ_INT(onboard_all(e, N, 0x100, 1, per), N);
    for (int i = 0; i < N; i++)
        CHECK_STATUS(per[i], KVF_OK);

    /* exists and remove through the engine's store */
    kvf__store *s = kvf__engine_store(e, KVF_TIER_REMOTE);
    REQUIRE(s);
    CHECK(kvf__engine_store(e, KVF_TIER_DISK) == NULL);
    CHECK(kvf__engine_store(e, KVF_TIER_HOST) == NULL);
    kvf_key keys[3] = {KEY(0x100), KEY(0x107), KEY(0x108)};
    kvf_status st[3];
    CHECK_STATUS(kvf__store_exists(s, keys, 3, 0, st), KVF_OK);
    CHECK_STATUS(st[0], KVF_OK);
    CHECK_STATUS(st[1], KVF_OK);
    CHECK_STATUS(st[2], KVF_ERR_NOT_FOUND);
    kvf_ticket t;
    REQUIRE(kvf_remove(e, KVF_TIER_REMOTE, keys, 1, &t) == KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    CHECK_STATUS(kvf__store_remove(s, keys + 1, 2, 0, st), KVF_OK);
    CHECK_STATUS(kvf__store_exists(s, keys, 3, 0, st), KVF_OK);
    for (int i = 0; i < 3; i++)
        CHECK_STATUS(st[i], KVF_ERR_NOT_FOUND);

    /* a removed block is a miss on onboard, with its key named */
    kvf_move mv = FROM_KEY(0x100, 0);
    kvf_move_error err[2];
    size_t nerr = 0;
    REQUIRE(kvf_onboard(e, KVF_TIER_REMOTE, &mv, 1, &t) == KVF_OK);
    CHECK_STATUS(kvf_wait_errors(e, t, per, err, 2, &nerr), KVF_ERR_NOT_FOUND);
    CHECK_EQ_INT(nerr, 1);
    CHECK_STR_HAS(err[0].message, "remote block 00000000000000000000000000000100");
    kvf_engine_destroy(e);
    kvf__mem_store_clear("rt");
    return 0;
}

/* One value corrupted (payload, header, a foreign namespace's header):
 * that block fails with the right status and a message naming it; the
 * others of the same batch land. */
static int test_corrupt_one(void)
{
    enum { N = 6 };
    kvf__mem_store_clear("bad");
    kvf_engine *e = open_engine("mem://bad", "ns1", N);
    REQUIRE(e);
    REQUIRE(offload_all(e, N, 0x200, 7) == KVF_OK);
    REQUIRE(kvf__mem_store_poke("bad", "ns1", TKEY(0x202), kvf__block_prefix_bytes(2) + 5, 0x01) ==
            KVF_OK);
    REQUIRE(kvf__mem_store_poke("bad", "ns1", TKEY(0x204), 3, 0x40) == KVF_OK);
    CHECK_STATUS(kvf__mem_store_poke("bad", "ns2", TKEY(0x204), 3, 0x40), KVF_ERR_NOT_FOUND);
    kvf_status per[N];
    kvf_move mv[N];
    for (uint32_t i = 0; i < N; i++) {
        memset(slot(e, i), POISON, block_bytes());
        mv[i] = FROM_KEY(0x200 + i, i);
    }
    kvf_ticket t;
    kvf_move_error err[N];
    size_t nerr = 0;
    REQUIRE(kvf_onboard(e, KVF_TIER_REMOTE, mv, N, &t) == KVF_OK);
    CHECK_STATUS(kvf_wait_errors(e, t, per, err, N, &nerr), KVF_ERR_CORRUPT);
    CHECK_EQ_INT(nerr, 2);
    CHECK_STATUS(per[2], KVF_ERR_CORRUPT);
    CHECK_STATUS(per[4], KVF_ERR_CORRUPT);
    CHECK_EQ_INT(err[0].index, 2);
    CHECK_STR_HAS(err[0].message, "00000000000000000000000000000202");
    CHECK_STR_HAS(err[0].message, "mem://bad");
    CHECK_STR_HAS(err[1].message, "00000000000000000000000000000204");
    uint8_t *want = malloc(block_bytes());
    REQUIRE(want);
    for (uint32_t i = 0; i < N; i++) {
        test_fill_random(want, block_bytes(), 7 + i);
        bool ok = per[i] == KVF_OK;
        CHECK(ok == (i != 2 && i != 4));
        /* a refused block's slot is never written with its bytes */
        if (ok)
            CHECK_MEM_EQ(slot(e, i), want, block_bytes());
        else
            CHECK(memcmp(slot(e, i), want, block_bytes()) != 0);
    }
    free(want);
    kvf_engine_destroy(e);
    kvf__mem_store_clear("bad");
    return 0;
}

/* Batches of many chunks (a remote chunk is at most 64 blocks) in flight
 * together on three workers, then read back; a second engine on the same
 * name and namespace sees the blocks, one restarted too, another
 * namespace does not. */
static int test_many_chunks_shared(void)
{
    enum { N = 700 };
    kvf__mem_store_clear("shared");
    kvf_engine *a = open_engine("mem://shared", "ns1", N);
    REQUIRE(a);
    size_t bb = block_bytes();
    kvf_move *mv = calloc(N, sizeof *mv);
    REQUIRE(mv);
    kvf_ticket t[2];
    for (uint32_t i = 0; i < N; i++) {
        test_fill_random(slot(a, i), bb, 1000 + i);
        mv[i] = TO_KEY(i, 0x5000 + i);
    }
    /* two batches queued before either is waited for: both spread over
     * the workers in chunks */
    REQUIRE(kvf_offload(a, KVF_TIER_REMOTE, mv, N / 2, &t[0]) == KVF_OK);
    REQUIRE(kvf_offload(a, KVF_TIER_REMOTE, mv + N / 2, N - N / 2, &t[1]) == KVF_OK);
    CHECK_STATUS(kvf_wait(a, t[1], NULL), KVF_OK);
    CHECK_STATUS(kvf_wait(a, t[0], NULL), KVF_OK);

    kvf_engine *b = open_engine("mem://shared", "ns1", N);
    REQUIRE(b);
    kvf_status *per = calloc(N, sizeof *per);
    REQUIRE(per);
    CHECK_EQ_INT(onboard_all(b, N, 0x5000, 1000, per), N);
    kvf_engine_destroy(b);
    kvf_engine_destroy(a);
    a = open_engine("mem://shared", "ns1", N);
    REQUIRE(a);
    CHECK_EQ_INT(onboard_all(a, N, 0x5000, 1000, per), N);
    kvf_engine_destroy(a);

    kvf_engine *other = open_engine("mem://shared", "ns2", 4);
    REQUIRE(other);
    CHECK_EQ_INT(onboard_all(other, 4, 0x5000, 1000, per), 0);
    for (int i = 0; i < 4; i++)
        CHECK_STATUS(per[i], KVF_ERR_NOT_FOUND);
    kvf_engine_destroy(other);
    free(per);
    free(mv);
    kvf__mem_store_clear("shared");
    return 0;
}

typedef struct listed {
    size_t n;
    uint64_t keys_sum;
    uint32_t tokens_bad;
} listed;

static uint8_t *level_slot(kvf_engine *e, kvf_level level, uint32_t s)
{
    void *p = NULL;
    kvf_engine_slot_ptr(e, 0, level, s, &p);
    return p;
}

static kvf_status run(kvf_engine *e, kvf_status st, kvf_ticket t, kvf_status *per)
{
    return st == KVF_OK ? kvf_wait(e, t, per) : st;
}

/* Secondary slots to the store and back (kvf_demote / kvf_promote on
 * KVF_TIER_REMOTE), in the format an onboard reads; a missing key, an
 * empty slot and a short block fail their own move only. */
static int test_demote_promote(void)
{
    enum { N = 4 };
    kvf__mem_store_clear("dp");
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.namespace_ = "dp";
    cfg.remote.url = "mem://dp";
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, N}, sec = {KVF_MEMORY_HOST, NULL, 0, N + 1};
    REQUIRE(kvf_engine_add_pool(e, &G, &prim, &sec, NULL) == KVF_OK);
    size_t bb = block_bytes();
    kvf_move mv[N];
    kvf_status per[N];
    kvf_ticket t;
    for (uint32_t i = 0; i < N; i++) {
        test_fill_random(slot(e, i), bb, 40 + i);
        mv[i] = (kvf_move){i, i, 0};
    }
    CHECK_STATUS(run(e, kvf_offload(e, KVF_TIER_HOST, mv, N, &t), t, NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        mv[i] = TO_KEY(i, 0x300 + i);
    CHECK_STATUS(run(e, kvf_demote(e, KVF_TIER_REMOTE, mv, N, &t), t, NULL), KVF_OK);

    /* a demoted block onboards into a primary slot */
    CHECK_EQ_INT(onboard_all(e, N, 0x300, 40, per), N);

    /* promoted into emptied secondary slots, then onboarded from them */
    for (uint32_t i = 0; i < N; i++) {
        memset(level_slot(e, KVF_LEVEL_SECONDARY, i), POISON, bb);
        memset(slot(e, i), POISON, bb);
        mv[i] = FROM_KEY(0x300 + i, i);
    }
    CHECK_STATUS(run(e, kvf_promote(e, KVF_TIER_REMOTE, mv, N, &t), t, NULL), KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        mv[i] = (kvf_move){i, i, 0};
    CHECK_STATUS(run(e, kvf_onboard(e, KVF_TIER_HOST, mv, N, &t), t, NULL), KVF_OK);
    uint8_t *want = malloc(bb);
    REQUIRE(want);
    for (uint32_t i = 0; i < N; i++) {
        test_fill_random(want, bb, 40 + i);
        CHECK(memcmp(slot(e, i), want, bb) == 0);
    }
    free(want);

    /* a missing key; a block stored with 8 tokens promoted whole; an
     * empty slot demoted: each fails alone */
    kvf_move half = test_move(KVF_TIER_REMOTE, true, 1, 0x400, 8);
    CHECK_STATUS(run(e, kvf_demote(e, KVF_TIER_REMOTE, &half, 1, &t), t, NULL), KVF_OK);
    kvf_move pro[3] = {FROM_KEY(0x3FF, 0), FROM_KEY(0x400, 1), FROM_KEY(0x301, 2)};
    CHECK_STATUS(run(e, kvf_promote(e, KVF_TIER_REMOTE, pro, 3, &t), t, per), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(per[0], KVF_ERR_NOT_FOUND);
    CHECK_STATUS(per[1], KVF_ERR_RANGE);
    CHECK_STATUS(per[2], KVF_OK);
    kvf_move dem[2] = {TO_KEY(N, 0x500), TO_KEY(3, 0x501)};
    CHECK_STATUS(run(e, kvf_demote(e, KVF_TIER_REMOTE, dem, 2, &t), t, per), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(per[0], KVF_ERR_NOT_FOUND);
    CHECK_STATUS(per[1], KVF_OK);
    kvf_engine_destroy(e);
    kvf__mem_store_clear("dp");
    return 0;
}

static void list_visit(void *arg, const kvf__store_entry *ent)
{
    listed *l = arg;
    l->n++;
    l->keys_sum += ent->key.lo + ent->key.hi;
    l->tokens_bad += ent->tokens != 5 || ent->pools != 1 || ent->mtime_ns <= 0;
}

/* The store ops on their own: list skips a corrupt header, a short buffer
 * is KVF_ERR_RANGE, a bad URL is refused. */
static int test_store_ops(void)
{
    kvf__mem_store_clear("ops");
    kvf__store_config cfg = {"mem://ops", "nsx", 0x77, 0, 0, 0};
    kvf__store *s = NULL;
    REQUIRE(kvf__store_open(&cfg, &s) == KVF_OK);
    CHECK(!strcmp(s->kind, "mem") && !strcmp(s->where, "mem://ops"));
    uint8_t payload[3][40], back[40];
    kvf__store_block blk[3];
    for (int i = 0; i < 3; i++) {
        test_fill_random(payload[i], sizeof payload[i], 50 + (uint64_t)i);
        blk[i] = (kvf__store_block){.key = TKEY(10 + (uint64_t)i),
                                    .tokens = 5,
                                    .pools = 1,
                                    .buf = payload[i],
                                    .payload_bytes = sizeof payload[i]};
    }
    CHECK_STATUS(s->ops->write(s, blk, 3, 0), KVF_OK);
    listed l = {0};
    CHECK_STATUS(kvf__store_list(s, list_visit, &l), KVF_OK);
    CHECK_EQ_INT(l.n, 3);
    CHECK_EQ_U64(l.keys_sum, 33);
    CHECK_EQ_INT(l.tokens_bad, 0);
    REQUIRE(kvf__mem_store_poke("ops", "nsx", TKEY(11), 0, 0xff) == KVF_OK);
    l = (listed){0};
    CHECK_STATUS(kvf__store_list(s, list_visit, &l), KVF_OK);
    CHECK_EQ_INT(l.n, 2);

    blk[0] = (kvf__store_block){.key = TKEY(10), .buf = back, .cap = 39};
    blk[1] = (kvf__store_block){.key = TKEY(11), .buf = back, .cap = sizeof back};
    blk[2] = (kvf__store_block){.key = TKEY(12), .buf = back, .cap = sizeof back};
    CHECK_STATUS(s->ops->read(s, blk, 3, 0), KVF_ERR_RANGE);
    CHECK_STATUS(blk[0].status, KVF_ERR_RANGE);
    CHECK_STATUS(blk[1].status, KVF_ERR_CORRUPT);
    CHECK_STR_HAS(blk[1].msg, "remote block 0000000000000000000000000000000b");
    CHECK_STATUS(blk[2].status, KVF_OK);
    CHECK_MEM_EQ(back, payload[2], sizeof back);
    CHECK_EQ_INT(blk[2].tokens, 5);
    kvf__store_close(s);

    /* another layout's reader refuses the block as foreign */
    cfg.fingerprint = 0x78;
    REQUIRE(kvf__store_open(&cfg, &s) == KVF_OK);
    blk[0] = (kvf__store_block){.key = TKEY(12), .buf = back, .cap = sizeof back};
    CHECK_STATUS(s->ops->read(s, blk, 1, 0), KVF_ERR_MISMATCH);
    kvf__store_close(s);

    const char *bad[] = {"mem://", "mem://a/b", "mem://a b", "nosuch://x", "mem:/x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cfg.url = bad[i];
        CHECK_STATUS(kvf__store_open(&cfg, &s), KVF_ERR_INVALID);
        CHECK_STATUS(kvf__store_check_url(bad[i]), KVF_ERR_INVALID);
    }
    kvf_engine_config ec = KVF_ENGINE_CONFIG_INIT;
    ec.backend = KVF_BACKEND_HOST;
    ec.remote.url = "mem://a/b";
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(&ec, &e), KVF_ERR_INVALID);
    kvf__mem_store_clear("ops");
    return 0;
}

/* The file tier's store, as the cache will ask it: what the engine wrote
 * is listed and found, and removed through it. */
static int test_file_store(void)
{
    char dir[256];
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.file.dir = dir;
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, 4};
    REQUIRE(kvf_engine_add_pool(e, &G, &prim, NULL, NULL) == KVF_OK);
    kvf_move mv[2] = {TO_KEY(0, 0x31), test_move(KVF_TIER_DISK, true, 1, 0x32, 8)};
    kvf_ticket t;
    REQUIRE(kvf_offload(e, KVF_TIER_DISK, mv, 2, &t) == KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    kvf__store *s = kvf__engine_store(e, KVF_TIER_DISK);
    REQUIRE(s && !strcmp(s->kind, "file"));
    CHECK(kvf__engine_store(e, KVF_TIER_REMOTE) == NULL);
    kvf_key keys[3] = {KEY(0x31), KEY(0x32), KEY(0x33)};
    kvf_status st[3];
    CHECK_STATUS(kvf__store_exists(s, keys, 3, 0, st), KVF_OK);
    CHECK(st[0] == KVF_OK && st[1] == KVF_OK && st[2] == KVF_ERR_NOT_FOUND);
    listed l = {0};
    CHECK_STATUS(kvf__store_list(s, list_visit, &l), KVF_OK);
    CHECK_EQ_INT(l.n, 2);
    CHECK_EQ_U64(l.keys_sum, 0x63);
    /* a block read back through the store: the slot's first 8 tokens */
    size_t cap = block_bytes();
    uint8_t *buf = malloc(cap);
    REQUIRE(buf);
    kvf__store_block blk = {.key = TKEY(0x32), .buf = buf, .cap = cap};
    CHECK_STATUS(s->ops->read(s, &blk, 1, 0), KVF_OK);
    CHECK_EQ_INT(blk.tokens, 8);
    CHECK_STATUS(kvf__store_remove(s, keys, 2, 0, st), KVF_OK);
    CHECK_STATUS(kvf__store_exists(s, keys, 2, 0, st), KVF_OK);
    CHECK(st[0] == KVF_ERR_NOT_FOUND && st[1] == KVF_ERR_NOT_FOUND);
    free(buf);
    kvf_engine_destroy(e);
    test_rmtree(dir);
    return 0;
}

/* A store opened from a file:// URL: every op on its own directory, the
 * host images copied in and out by the store; no remote tier. */
static int test_file_url_store(void)
{
    char dir[256], url[300];
    REQUIRE(test_tmpdir(dir, sizeof dir) == 0);
    snprintf(url, sizeof url, "file://%s", dir);
    kvf__store_config cfg = {url, "nsf", 0x99, 0, 0, 0};
    kvf__store *s = NULL;
    REQUIRE(kvf__store_open(&cfg, &s) == KVF_OK);
    CHECK(!strcmp(s->kind, "file") && s->ops->commit && s->ops->discard);
    uint8_t payload[2][5000], back[5000];
    kvf__store_block blk[2];
    for (int i = 0; i < 2; i++) {
        test_fill_random(payload[i], sizeof payload[i], 80 + (uint64_t)i);
        blk[i] = (kvf__store_block){.key = TKEY(0x70 + (uint64_t)i),
                                    .tokens = 3,
                                    .pools = 2,
                                    .buf = payload[i],
                                    .payload_bytes = sizeof payload[i]};
    }
    CHECK_STATUS(s->ops->write(s, blk, 2, 0), KVF_OK);
    CHECK_STATUS(s->ops->commit(s), KVF_OK);
    listed l = {0};
    CHECK_STATUS(kvf__store_list(s, list_visit, &l), KVF_OK);
    CHECK_EQ_INT(l.n, 2);
    blk[0] = (kvf__store_block){.key = TKEY(0x71), .buf = back, .cap = sizeof back};
    blk[1] = (kvf__store_block){.key = TKEY(0x72), .buf = back, .cap = sizeof back};
    CHECK_STATUS(s->ops->read(s, blk, 2, 0), KVF_OK);
    CHECK_STATUS(blk[0].status, KVF_OK);
    CHECK_STATUS(blk[1].status, KVF_ERR_NOT_FOUND);
    CHECK_MEM_EQ(back, payload[1], sizeof back);
    CHECK(blk[0].tokens == 3 && blk[0].pools == 2 && blk[0].payload_bytes == sizeof back);
    /* a buffer too small for the block */
    blk[0] = (kvf__store_block){.key = TKEY(0x70), .buf = back, .cap = 100};
    CHECK_STATUS(s->ops->read(s, blk, 1, 0), KVF_ERR_RANGE);
    CHECK_STR_HAS(blk[0].msg, "00000000000000000000000000000070");
    bool emptied = true;
    CHECK_STATUS(s->ops->discard(s, TKEY(0x70), &emptied), KVF_OK);
    kvf_key keys[2] = {KEY(0x70), KEY(0x71)};
    kvf_status st[2];
    CHECK_STATUS(kvf__store_exists(s, keys, 2, 0, st), KVF_OK);
    CHECK(st[0] == KVF_ERR_NOT_FOUND && st[1] == KVF_OK);
    kvf__store_close(s);

    /* a file store is no remote tier */
    kvf_engine_config ec = KVF_ENGINE_CONFIG_INIT;
    ec.backend = KVF_BACKEND_HOST;
    ec.remote.url = url;
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(&ec, &e), KVF_ERR_INVALID);
    test_rmtree(dir);
    return 0;
}

/* A cache whose remote tier is mem://: write-through puts reach the store,
 * lookups past the host tier find them there (the cache asks the store,
 * whichever it is), gets bring them back byte for byte, a damaged value
 * fails its block alone, and a second engine's cache on the same name
 * finds every block. */
static kvf_engine *open_cache_engine(const char *url, uint32_t host_slots)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    cfg.file.namespace_ = "cache";
    cfg.remote.url = url;
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, 16};
    kvf_pool_desc sec = {KVF_MEMORY_HOST, NULL, 0, host_slots};
    REQUIRE(kvf_engine_add_pool(e, &G, &prim, &sec, NULL) == KVF_OK);
    return e;
}

static kvf_cache *open_cache(kvf_engine *e, kvf_cache_remote mode)
{
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 4;
    cc.remote = mode;
    kvf_cache *c = NULL;
    REQUIRE(kvf_cache_create(e, &cc, &c) == KVF_OK);
    return c;
}

static int test_cache_on_mem(void)
{
    enum { N = 10 };
    size_t bb = block_bytes();
    kvf__mem_store_clear("cachetier");
    kvf_engine *e = open_cache_engine("mem://cachetier", 4);
    kvf_cache *c = open_cache(e, KVF_CACHE_REMOTE_WRITE_THROUGH);
    kvf_key keys[N];
    uint32_t slots[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = KEY(0x900 + i);
        slots[i] = i;
        test_fill_random(slot(e, i), bb, KEY_SEED(TKEY(keys[i])));
    }
    kvf_cache_ticket ct;
    REQUIRE(kvf_cache_put(c, keys, slots, N, 1, &ct) == KVF_OK);
    CHECK_STATUS(kvf_cache_wait(c, ct, NULL), KVF_OK);
    size_t hits = 0;
    kvf_tier tiers[N];
    CHECK_STATUS(kvf_cache_lookup(c, keys, N, &hits, tiers), KVF_OK);
    CHECK_EQ_INT(hits, N);
    int remote = 0;
    for (int i = 0; i < N; i++)
        remote += tiers[i] == KVF_TIER_REMOTE;
    CHECK_EQ_INT(remote, N - 4);
    /* one remote-only block damaged in the store */
    kvf_key bad = KVF_KEY_ROOT;
    for (int i = 0; i < N && kvf_key_is_root(bad); i++)
        if (tiers[i] == KVF_TIER_REMOTE)
            bad = keys[i];
    REQUIRE(!kvf_key_is_root(bad));
    REQUIRE(kvf__mem_store_poke("cachetier", "cache", TKEY(bad), kvf__block_prefix_bytes(1) + 9,
                                0x10) == KVF_OK);
    kvf_status per[N];
    for (uint32_t i = 0; i < N; i++)
        memset(slot(e, i), POISON, bb);
    REQUIRE(kvf_cache_get(c, keys, slots, N, &ct) == KVF_OK);
    CHECK_STATUS(kvf_cache_wait(c, ct, per), KVF_ERR_CORRUPT);
    uint8_t *want = malloc(bb);
    REQUIRE(want);
    for (uint32_t i = 0; i < N; i++) {
        test_fill_random(want, bb, KEY_SEED(TKEY(keys[i])));
        if (kvf_key_eq(keys[i], bad)) {
            CHECK_STATUS(per[i], KVF_ERR_CORRUPT);
            CHECK(slot(e, i)[0] == POISON || memcmp(slot(e, i), want, bb) != 0);
        } else {
            CHECK_STATUS(per[i], KVF_OK);
            CHECK_MEM_EQ(slot(e, i), want, bb);
        }
    }
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(c, &s), KVF_OK);
    CHECK_EQ_INT(s.remote_errors, 1);
    /* another engine and cache on the same store find the stored blocks */
    kvf_engine *e2 = open_cache_engine("mem://cachetier", 4);
    kvf_cache *c2 = open_cache(e2, KVF_CACHE_REMOTE_READ);
    CHECK_STATUS(kvf_cache_lookup(c2, keys, N, &hits, tiers), KVF_OK);
    CHECK(hits >= 1);
    for (size_t i = 0; i < hits; i++)
        CHECK(tiers[i] == KVF_TIER_REMOTE);
    kvf_cache_destroy(c2);
    kvf_engine_destroy(e2);
    free(want);
    kvf_cache_destroy(c);
    kvf_engine_destroy(e);
    kvf__mem_store_clear("cachetier");
    return 0;
}

/* Log lines kept for the checks: how many name `what`. */
static char log_lines[64][512];
static int n_log;
static void keep_line(void *arg, kvf_log_level level, const char *msg)
{
    (void)arg;
    (void)level;
    if (n_log < 64)
        snprintf(log_lines[n_log], sizeof log_lines[0], "%s", msg);
    n_log++;
}

static int lines_with(const char *what)
{
    int n = 0;
    for (int i = 0; i < n_log && i < 64; i++)
        n += strstr(log_lines[i], what) != NULL;
    return n;
}

#define CAP_PAYLOAD 1000
#define CAP_BLOCKS 10

/* One block of n random bytes, generated from its key, under key. */
static kvf_status put_key(kvf__store *s, uint64_t key, uint8_t *payload, size_t n)
{
    test_fill_random(payload, n, key);
    kvf__store_block b = {
        .key = TKEY(key), .tokens = 1, .pools = 1, .buf = payload, .payload_bytes = n};
    kvf_status st = s->ops->write(s, &b, 1, 0);
    if (st != KVF_OK)
        CHECK_STR_HAS(b.msg, "remote block 0000000000000000");
    return st;
}

/* Whether key holds what put_key stored, byte for byte. */
static kvf_status get_key(kvf__store *s, uint64_t key)
{
    uint8_t back[CAP_PAYLOAD], want[CAP_PAYLOAD];
    memset(back, POISON, sizeof back);
    kvf__store_block b = {.key = TKEY(key), .buf = back, .cap = sizeof back};
    kvf_status st = s->ops->read(s, &b, 1, 0); /* OK for a miss: b.status says */
    if (st == KVF_OK && b.status == KVF_OK) {
        test_fill_random(want, sizeof want, key);
        CHECK_MEM_EQ(back, want, sizeof want);
    }
    return st == KVF_OK ? b.status : st;
}

/* A store of CAP_BLOCKS blocks' capacity: puts past it evict the oldest
 * first, one warning and a line per block evicted; a re-put block is new
 * again; a block larger than all of it is refused and evicts nothing;
 * thousands of puts hold no more than the capacity. */
static int test_capacity(void)
{
    kvf__mem_store_clear("cap");
    kvf__store_config cfg = {
        "mem://cap", "nsc", 0x77, 0, 0, CAP_BLOCKS * (kvf__block_prefix_bytes(1) + CAP_PAYLOAD)};
    kvf__store *s = NULL;
    REQUIRE(kvf__store_open(&cfg, &s) == KVF_OK);
    kvf_log_level level = kvf_log_get_level();
    kvf_log_set_level(KVF_LOG_INFO);
    kvf_log_set_handler(keep_line, NULL);
    n_log = 0;
    uint8_t payload[CAP_PAYLOAD * (CAP_BLOCKS + 3)]; /* the last put: more than all of it */
    for (uint64_t k = 100; k < 125; k++)
        CHECK_STATUS(put_key(s, k, payload, CAP_PAYLOAD), KVF_OK);
    for (uint64_t k = 100; k < 125; k++)
        CHECK_STATUS(get_key(s, k), k < 115 ? KVF_ERR_NOT_FOUND : KVF_OK);
    listed l = {0};
    CHECK_STATUS(kvf__store_list(s, list_visit, &l), KVF_OK);
    CHECK_EQ_INT(l.n, CAP_BLOCKS);
    char said[128];
    snprintf(said, sizeof said, "mem://cap: full at %llu bytes", (unsigned long long)cfg.mem_bytes);
    CHECK_EQ_INT(lines_with(said), 1);
    CHECK_EQ_INT(lines_with(": evicted, the oldest"), 15);
    CHECK_EQ_INT(lines_with("remote block 00000000000000000000000000000064: mem://cap: evicted"),
                 1); /* key 100 first */

    /* 115 put again is the newest: the next put evicts 116 */
    CHECK_STATUS(put_key(s, 115, payload, CAP_PAYLOAD), KVF_OK);
    CHECK_STATUS(put_key(s, 200, payload, CAP_PAYLOAD), KVF_OK);
    CHECK_STATUS(get_key(s, 115), KVF_OK);
    CHECK_STATUS(get_key(s, 116), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(get_key(s, 117), KVF_OK);

    /* larger than the whole store: refused, nothing evicted */
    n_log = 0;
    CHECK_STATUS(put_key(s, 300, payload, sizeof payload), KVF_ERR_NO_SPACE);
    snprintf(said, sizeof said, "capacity (%llu bytes", (unsigned long long)cfg.mem_bytes);
    CHECK_STR_HAS(kvf_last_error(), said);
    CHECK_EQ_INT(lines_with("evicted"), 0);
    l = (listed){0};
    CHECK_STATUS(kvf__store_list(s, list_visit, &l), KVF_OK);
    CHECK_EQ_INT(l.n, CAP_BLOCKS);

    /* memory stays bounded: 3000 more puts, still CAP_BLOCKS held */
    for (uint64_t k = 1000; k < 4000; k++)
        REQUIRE(put_key(s, k, payload, CAP_PAYLOAD) == KVF_OK);
    l = (listed){0};
    CHECK_STATUS(kvf__store_list(s, list_visit, &l), KVF_OK);
    CHECK_EQ_INT(l.n, CAP_BLOCKS);
    CHECK_STATUS(get_key(s, 3999), KVF_OK);
    CHECK_STATUS(get_key(s, 3989), KVF_ERR_NOT_FOUND);
    kvf_log_set_handler(NULL, NULL);
    kvf_log_set_level(level);
    kvf__store_close(s);
    kvf__mem_store_clear("cap");
    return 0;
}

/* remote.ttl_s and remote_mem_bytes through an engine: a block expires
 * after its TTL (read, exists and list alike), and the engine's capacity
 * bounds the store. */
static int test_ttl(void)
{
    kvf__mem_store_clear("ttl");
    kvf__store_config cfg = {"mem://ttl", "nst", 0x77, 1, 0, 0};
    kvf__store *s = NULL;
    REQUIRE(kvf__store_open(&cfg, &s) == KVF_OK);
    uint8_t payload[CAP_PAYLOAD];
    CHECK_STATUS(put_key(s, 7, payload, sizeof payload), KVF_OK);
    CHECK_STATUS(get_key(s, 7), KVF_OK);
    kvf_key key = KEY(7);
    kvf_status st;
    CHECK_STATUS(kvf__store_exists(s, &key, 1, 0, &st), KVF_OK);
    CHECK_STATUS(st, KVF_OK);
    usleep(1100 * 1000);
    CHECK_STATUS(get_key(s, 7), KVF_ERR_NOT_FOUND);
    CHECK_STATUS(kvf__store_exists(s, &key, 1, 0, &st), KVF_OK);
    CHECK_STATUS(st, KVF_ERR_NOT_FOUND);
    listed l = {0};
    CHECK_STATUS(kvf__store_list(s, list_visit, &l), KVF_OK);
    CHECK_EQ_INT(l.n, 0);
    kvf__store_close(s);
    kvf__mem_store_clear("ttl");

    /* the engine's settings reach its store */
    kvf_engine_config ec = KVF_ENGINE_CONFIG_INIT;
    ec.backend = KVF_BACKEND_HOST;
    ec.remote.url = "mem://ttl-engine";
    ec.remote.ttl_s = 1;
    ec.remote_mem_bytes = 3 * (kvf__block_prefix_bytes(1) + block_bytes());
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(&ec, &e) == KVF_OK);
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, 5};
    REQUIRE(kvf_engine_add_pool(e, &G, &prim, NULL, NULL) == KVF_OK);
    kvf_status per[5];
    for (uint32_t i = 0; i < 5; i++) { /* one at a time: an order of age */
        kvf_move mv = TO_KEY(i, 0x900 + i);
        kvf_ticket t;
        test_fill_random(slot(e, i), block_bytes(), 60 + i);
        REQUIRE(kvf_offload(e, KVF_TIER_REMOTE, &mv, 1, &t) == KVF_OK);
        CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    }
    CHECK_EQ_INT(onboard_all(e, 5, 0x900, 60, per), 3);
    CHECK(per[0] == KVF_ERR_NOT_FOUND && per[1] == KVF_ERR_NOT_FOUND && per[4] == KVF_OK);
    usleep(1100 * 1000);
    CHECK_EQ_INT(onboard_all(e, 5, 0x900, 60, per), 0);
    CHECK(per[2] == KVF_ERR_NOT_FOUND && per[4] == KVF_ERR_NOT_FOUND);
    kvf_engine_destroy(e);
    kvf__mem_store_clear("ttl-engine");
    return 0;
}

int main(void)
{
    RUN(test_round_trip);
    RUN(test_corrupt_one);
    RUN(test_many_chunks_shared);
    RUN(test_demote_promote);
    RUN(test_store_ops);
    RUN(test_file_store);
    RUN(test_file_url_store);
    RUN(test_cache_on_mem);
    RUN(test_capacity);
    RUN(test_ttl);
    return TEST_RESULT();
}
