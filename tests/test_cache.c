/* The tiered cache on the host backend: keys, round trips through each
 * tier, eviction order against a reference model on random workloads,
 * pins, events, restart with a disk tier, faults and bad input. */
#include "backend.h"
#include "checksum.h"
#include "testutil.h"

#include <pthread.h>

#define POISON 0x5A

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

static int fx_engine(fixture *f, bool files)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    cfg.file_dir = files ? f->dir : NULL;
    cfg.file_namespace = "cache";
    cfg.fsync = KVF_FSYNC_NONE;
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
static int fx_init(fixture *f, uint32_t primary, uint32_t secondary, bool files,
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

static void fx_close(fixture *f)
{
    kvf_cache_destroy(f->c);
    kvf_engine_destroy(f->e);
    f->c = NULL;
    f->e = NULL;
}

static void fx_done(fixture *f)
{
    fx_close(f);
    if (f->dir[0])
        test_rmtree(f->dir);
}

static uint8_t *prim(fixture *f, int p, uint32_t slot)
{
    void *ptr = NULL;
    REQUIRE(kvf_engine_slot_ptr(f->e, (uint32_t)p, KVF_LEVEL_PRIMARY, slot, &ptr) == KVF_OK);
    return ptr;
}

/* The bytes of the block under `key`: derived from the key alone. */
static void fill(fixture *f, uint32_t slot, kvf_key key)
{
    for (int p = 0; p < 2; p++)
        test_fill_random(prim(f, p, slot), f->bytes[p], key * 2 + (uint64_t)p);
}

static void poison(fixture *f, uint32_t slot)
{
    for (int p = 0; p < 2; p++)
        memset(prim(f, p, slot), POISON, f->bytes[p]);
}

static int expect(fixture *f, uint32_t slot, kvf_key key)
{
    for (int p = 0; p < 2; p++) {
        uint8_t *want = malloc(f->bytes[p]);
        test_fill_random(want, f->bytes[p], key * 2 + (uint64_t)p);
        size_t off = test_mem_diff(prim(f, p, slot), want, f->bytes[p]);
        free(want);
        if (off != (size_t)-1) {
            fprintf(stderr, "slot %u pool %d: block 0x%llx differs at byte %zu\n", slot, p,
                    (unsigned long long)key, off);
            return 1;
        }
    }
    return 0;
}

static kvf_status put1(fixture *f, kvf_key key, uint32_t slot, uint32_t prio)
{
    kvf_ticket t;
    kvf_status st = kvf_cache_put(f->c, &key, &slot, 1, prio, &t);
    return st == KVF_OK ? kvf_cache_wait(f->c, t, NULL) : st;
}

static kvf_status get1(fixture *f, kvf_key key, uint32_t slot)
{
    kvf_ticket t;
    kvf_status st = kvf_cache_get(f->c, &key, &slot, 1, &t);
    return st == KVF_OK ? kvf_cache_wait(f->c, t, NULL) : st;
}

/* The tier a key is in, or -1. */
static int tier_of(fixture *f, kvf_key key)
{
    size_t hits = 0;
    kvf_cache_tier t = KVF_CACHE_TIERS;
    REQUIRE(kvf_cache_lookup(f->c, &key, 1, &hits, &t) == KVF_OK);
    return hits ? (int)t : -1;
}

/* ---- keys ------------------------------------------------------------------- */

static int test_keys(void)
{
    /* XXH64 itself, against the published test vectors */
    CHECK_EQ_U64(kvf__xxh64("", 0), 0xef46db3751d8e999ull);
    CHECK_EQ_U64(kvf__xxh64("abc", 3), 0x44bc2cf5ad770999ull);
    uint8_t seq[100];
    for (int i = 0; i < 100; i++)
        seq[i] = (uint8_t)i;
    CHECK_EQ_U64(kvf__xxh64(seq, 100), 0x6ac1e58032166597ull);
    /* the chain, as computed by the python xxhash package over the
     * documented bytes: parent, salt, tokens, little-endian */
    uint32_t toks[32];
    for (uint32_t i = 0; i < 32; i++)
        toks[i] = i;
    kvf_key k1 = kvf_key_chain(KVF_KEY_ROOT, toks, 16, 0);
    CHECK_EQ_U64(k1, 0x396e79d9bff76216ull);
    CHECK_EQ_U64(kvf_key_chain(k1, toks + 16, 16, 0), 0xa856aed7ab913c9eull);
    uint32_t abc[3] = {1, 2, 3};
    CHECK_EQ_U64(kvf_key_chain(KVF_KEY_ROOT, abc, 3, 0x1234), 0x4bb0223f218f8abcull);
    CHECK_EQ_U64(kvf_key_salt("llama-3-8b"), 0xe39251d9742ebb6dull);
    CHECK_EQ_U64(kvf_key_salt(NULL), 0);
    /* all blocks at once; the partial tail has no key */
    kvf_key keys[4] = {0};
    CHECK_EQ_INT(kvf_key_chain_all(toks, 31, 16, 0, keys, 4), 1);
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 16, 0, keys, 4), 2);
    CHECK_EQ_U64(keys[0], k1);
    CHECK_EQ_U64(keys[1], 0xa856aed7ab913c9eull);
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 8, 0, keys, 1), 4); /* counts past cap */
    CHECK_EQ_INT(kvf_key_chain_all(toks, 32, 0, 0, keys, 4), 0);
    /* a salt separates equal tokens; a token changes the key */
    CHECK(kvf_key_chain(0, toks, 16, 1) != k1);
    toks[5] ^= 1;
    CHECK(kvf_key_chain(0, toks, 16, 0) != k1);
    /* long blocks go through the incremental path in pieces */
    uint32_t *many = malloc(1000 * sizeof *many);
    for (uint32_t i = 0; i < 1000; i++)
        many[i] = i * 2654435761u;
    kvf_key a = kvf_key_chain(7, many, 1000, 9);
    uint8_t *bytes = malloc(16 + 4000);
    for (int i = 0; i < 8; i++) {
        bytes[i] = (uint8_t)(7ull >> (8 * i));
        bytes[8 + i] = (uint8_t)(9ull >> (8 * i));
    }
    for (int i = 0; i < 1000; i++)
        for (int b = 0; b < 4; b++)
            bytes[16 + 4 * i + b] = (uint8_t)(many[i] >> (8 * b));
    CHECK_EQ_U64(a, kvf__xxh64(bytes, 16 + 4000));
    free(bytes);
    free(many);
    return 0;
}

/* ---- round trips -------------------------------------------------------------- */

static int round_trip(uint32_t host, uint32_t disk)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = host;
    cc.disk_blocks = disk;
    if (fx_init(&f, 64, host ? 32 : 0, disk > 0, &cc))
        return 1;
    enum { N = 24 };
    kvf_key keys[N];
    uint32_t src[N], dst[N];
    for (uint32_t i = 0; i < N; i++) {
        keys[i] = 0xc0ffee00ull + i * 7919;
        src[i] = i;
        dst[i] = 63 - i;
        fill(&f, i, keys[i]);
    }
    kvf_ticket t;
    kvf_status per[N];
    CHECK_STATUS(kvf_cache_put(f.c, keys, src, N, 50, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, per), KVF_OK);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_STATUS(per[i], KVF_OK);
        poison(&f, src[i]);
        poison(&f, dst[i]);
    }
    size_t hits = 0;
    kvf_cache_tier tiers[N];
    CHECK_STATUS(kvf_cache_lookup(f.c, keys, N, &hits, tiers), KVF_OK);
    CHECK_EQ_INT(hits, N);
    CHECK_STATUS(kvf_cache_get(f.c, keys, dst, N, &t), KVF_OK);
    kvf_status st;
    while ((st = kvf_cache_poll(f.c, t, per)) == KVF_INPROGRESS)
        usleep(100);
    CHECK_STATUS(st, KVF_OK);
    for (uint32_t i = 0; i < N; i++)
        if (expect(&f, dst[i], keys[i]))
            return 1;
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(f.c, &s), KVF_OK);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_HOST] + s.blocks[KVF_CACHE_DISK], N);
    CHECK_EQ_INT(s.gets, N);
    CHECK_EQ_INT(s.puts, N);
    uint64_t bb = f.bytes[0] + f.bytes[1];
    CHECK_EQ_U64(s.bytes_out[KVF_CACHE_HOST] + s.bytes_out[KVF_CACHE_DISK], N * bb);
    CHECK_EQ_INT(s.latency_count, 2);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_ERR_UNKNOWN_TICKET);
    fx_done(&f);
    return 0;
}

static int test_host_only(void)
{
    return round_trip(32, 0);
}

static int test_disk_only(void)
{
    return round_trip(0, 64);
}

static int test_host_and_disk(void)
{
    /* 24 blocks into 8 host + 64 disk: 16 demoted on the way */
    return round_trip(8, 64);
}

/* ---- eviction order -------------------------------------------------------------- */

/* The reference model: the rules of kvferry.h written plainly. */
#define MODEL_KEYS 48

typedef struct model_entry {
    bool present;
    int tier;
    uint32_t prio, uses, pins;
    uint64_t last; /* position in its tier's LRU order */
} model_entry;

typedef struct model {
    model_entry e[MODEL_KEYS];
    uint64_t cap[2];
    uint32_t min_prio, admit;
    uint64_t clock;
} model;

static uint64_t model_count(const model *m, int tier)
{
    uint64_t n = 0;
    for (int k = 0; k < MODEL_KEYS; k++)
        n += m->e[k].present && m->e[k].tier == tier;
    return n;
}

static int model_victim(const model *m, int tier)
{
    int best = -1;
    for (int k = 0; k < MODEL_KEYS; k++) {
        const model_entry *x = &m->e[k];
        if (!x->present || x->tier != tier || x->pins)
            continue;
        if (best < 0 || x->prio < m->e[best].prio ||
            (x->prio == m->e[best].prio && x->last < m->e[best].last))
            best = k;
    }
    return best;
}

static bool model_disk_room(model *m)
{
    if (model_count(m, KVF_CACHE_DISK) < m->cap[KVF_CACHE_DISK])
        return true;
    int v = model_victim(m, KVF_CACHE_DISK);
    if (v < 0)
        return false;
    m->e[v].present = false;
    return true;
}

static bool model_host_room(model *m)
{
    if (model_count(m, KVF_CACHE_HOST) < m->cap[KVF_CACHE_HOST])
        return true;
    int v = model_victim(m, KVF_CACHE_HOST);
    if (v < 0)
        return false;
    model_entry *x = &m->e[v];
    if (m->cap[KVF_CACHE_DISK] && x->prio >= m->min_prio && x->uses >= m->admit &&
        model_disk_room(m)) {
        x->tier = KVF_CACHE_DISK;
        x->last = ++m->clock;
    } else {
        x->present = false;
    }
    return true;
}

static void model_put(model *m, int k, uint32_t prio)
{
    model_entry *x = &m->e[k];
    if (x->present) {
        x->prio = prio;
        if (!x->pins)
            x->last = ++m->clock;
        /* a block on disk handed back by the engine returns to host */
        if (x->tier == KVF_CACHE_DISK && m->cap[KVF_CACHE_HOST] && !x->pins) {
            x->pins++;
            bool room = model_host_room(m);
            x->pins--;
            if (room) {
                x->tier = KVF_CACHE_HOST;
                x->last = ++m->clock;
            }
        }
        return;
    }
    int tier = -1;
    if (m->cap[KVF_CACHE_HOST] && model_host_room(m))
        tier = KVF_CACHE_HOST;
    else if (m->cap[KVF_CACHE_DISK] && model_disk_room(m))
        tier = KVF_CACHE_DISK;
    if (tier < 0)
        return;
    *x = (model_entry){true, tier, prio, 0, 0, ++m->clock};
}

static int compare_model(fixture *f, const model *m, const char *after, int step)
{
    for (int k = 0; k < MODEL_KEYS; k++) {
        int want = m->e[k].present ? m->e[k].tier : -1;
        int got = tier_of(f, 1000 + (kvf_key)k);
        if (got != want) {
            fprintf(stderr, "step %d (%s): key %d in tier %d, model says %d\n", step, after, k, got,
                    want);
            return 1;
        }
    }
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f->c, &s);
    for (int t = 0; t < 2; t++)
        if (s.blocks[t] != model_count(m, t)) {
            fprintf(stderr, "step %d: tier %d counts %llu blocks, model %llu\n", step, t,
                    (unsigned long long)s.blocks[t], (unsigned long long)model_count(m, t));
            return 1;
        }
    return 0;
}

/* Random puts (with duplicates), gets, pins, unpins and removals, checked
 * after every step against the model: the tier of every key, the block
 * counts, and the bytes of every block got. */
static int eviction_vs_model(uint32_t host, uint32_t disk, uint32_t min_prio, uint32_t admit,
                             uint64_t seed)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = host;
    cc.disk_blocks = disk;
    cc.offload_min_priority = min_prio;
    cc.disk_admit_uses = admit;
    if (fx_init(&f, 16, host ? host : 0, disk > 0, &cc))
        return 1;
    model m = {0};
    m.cap[0] = host;
    m.cap[1] = disk;
    m.min_prio = min_prio;
    m.admit = admit;
    uint64_t rng = seed;
    static const uint32_t prios[] = {0, 10, 50, 50, 50, 90, 100};
    for (int step = 0; step < 600; step++) {
        int k = (int)(test_xorshift64(&rng) % MODEL_KEYS);
        kvf_key key = 1000 + (kvf_key)k;
        unsigned op = (unsigned)(test_xorshift64(&rng) % 10);
        const char *what;
        if (op < 5) {
            what = "put";
            uint32_t prio = prios[test_xorshift64(&rng) % 7];
            fill(&f, 0, key);
            CHECK_STATUS(put1(&f, key, 0, prio), KVF_OK);
            model_put(&m, k, prio);
        } else if (op < 8) {
            what = "get";
            if (!m.e[k].present) {
                CHECK_STATUS(get1(&f, key, 1), KVF_ERR_NOT_FOUND);
                continue;
            }
            poison(&f, 1);
            CHECK_STATUS(get1(&f, key, 1), KVF_OK);
            if (expect(&f, 1, key))
                return 1;
            m.e[k].uses++;
            if (!m.e[k].pins)
                m.e[k].last = ++m.clock;
        } else if (op == 8) {
            what = "pin";
            size_t pinned = 9;
            if (m.e[k].present && m.e[k].pins < 2) {
                CHECK_STATUS(kvf_cache_pin(f.c, &key, 1, &pinned), KVF_OK);
                CHECK_EQ_INT(pinned, 1);
                m.e[k].pins++;
            } else if (m.e[k].present) {
                CHECK_STATUS(kvf_cache_unpin(f.c, &key, 1), KVF_OK);
                if (--m.e[k].pins == 0)
                    m.e[k].last = ++m.clock;
            } else {
                CHECK_STATUS(kvf_cache_unpin(f.c, &key, 1), KVF_ERR_STATE);
            }
        } else {
            what = "remove";
            if (m.e[k].pins)
                continue; /* deferred removal: covered by test_pins */
            size_t removed = 9;
            CHECK_STATUS(kvf_cache_remove(f.c, &key, 1, &removed), KVF_OK);
            CHECK_EQ_INT(removed, m.e[k].present ? 1 : 0);
            m.e[k].present = false;
        }
        if (compare_model(&f, &m, what, step))
            return 1;
    }
    fx_done(&f);
    return 0;
}

static int test_eviction_lru_priorities(void)
{
    return eviction_vs_model(6, 10, 0, 0, 11);
}

static int test_eviction_min_priority(void)
{
    return eviction_vs_model(6, 10, 50, 0, 12);
}

static int test_eviction_disk_admission(void)
{
    return eviction_vs_model(5, 8, 0, 2, 13);
}

static int test_eviction_single_tier(void)
{
    if (eviction_vs_model(7, 0, 0, 0, 14))
        return 1;
    return eviction_vs_model(0, 7, 0, 0, 15);
}

/* A block that fell to disk and is handed back by the engine (a put of a
 * key cached on disk) returns to the host tier: hot blocks do not stay on
 * disk. Its file goes; the bytes are the ones put. */
static int test_promotion(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = 2;
    cc.disk_blocks = 8;
    if (fx_init(&f, 8, 2, true, &cc))
        return 1;
    for (kvf_key k = 1; k <= 3; k++) {
        fill(&f, (uint32_t)k, k);
        CHECK_STATUS(put1(&f, k, (uint32_t)k, 50), KVF_OK);
    }
    CHECK_EQ_INT(tier_of(&f, 1), KVF_CACHE_DISK);
    CHECK_STATUS(put1(&f, 1, 1, 50), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, 1), KVF_CACHE_HOST);
    CHECK_EQ_INT(tier_of(&f, 2), KVF_CACHE_DISK); /* the host victim it displaced */
    char path[600];
    snprintf(path, sizeof path, "%s/cache/%016llx.kvf", f.dir, 1ull);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_HOST], 2);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_DISK], 1);
    poison(&f, 6);
    CHECK_STATUS(get1(&f, 1, 6), KVF_OK);
    CHECK(expect(&f, 6, 1) == 0);
    fx_close(&f); /* waits for the file's removal */
    CHECK(access(path, F_OK) != 0);
    test_rmtree(f.dir);
    return 0;
}

/* ---- pins ---------------------------------------------------------------------- */

static int test_pins(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = 4;
    if (fx_init(&f, 8, 4, false, &cc))
        return 1;
    kvf_key keys[4] = {11, 12, 13, 14};
    for (int i = 0; i < 4; i++) {
        fill(&f, 0, keys[i]);
        CHECK_STATUS(put1(&f, keys[i], 0, 10), KVF_OK);
    }
    size_t pinned = 0;
    CHECK_STATUS(kvf_cache_pin(f.c, keys, 4, &pinned), KVF_OK);
    CHECK_EQ_INT(pinned, 4);
    /* every block pinned: nothing can be stored, nothing is evicted */
    fill(&f, 1, 99);
    kvf_key k99 = 99;
    uint32_t s1 = 1;
    kvf_ticket t;
    kvf_status per;
    CHECK_STATUS(kvf_cache_put(f.c, &k99, &s1, 1, 100, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, &per), KVF_ERR_NO_SPACE);
    CHECK_STATUS(per, KVF_ERR_NO_SPACE);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(tier_of(&f, keys[i]), KVF_CACHE_HOST);
    CHECK_EQ_INT(tier_of(&f, 99), -1);
    /* a removal of a pinned block waits for its unpin */
    size_t removed = 0;
    CHECK_STATUS(kvf_cache_remove(f.c, &keys[0], 1, &removed), KVF_OK);
    CHECK_EQ_INT(removed, 1);
    CHECK_EQ_INT(tier_of(&f, keys[0]), -1); /* no longer found */
    CHECK_STATUS(get1(&f, keys[0], 2), KVF_ERR_NOT_FOUND);
    /* unpin is all or nothing */
    kvf_key bad[2] = {keys[1], 777};
    CHECK_STATUS(kvf_cache_unpin(f.c, bad, 2), KVF_ERR_STATE);
    CHECK_STR_HAS(kvf_last_error(), "0x0000000000000309");
    kvf_key twice[2] = {keys[1], keys[1]};
    CHECK_STATUS(kvf_cache_unpin(f.c, twice, 2), KVF_ERR_STATE); /* one pin only */
    CHECK_STATUS(kvf_cache_unpin(f.c, keys, 4), KVF_OK);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_HOST], 3); /* keys[0] went at its unpin */
    /* now the put evicts the LRU of the lowest priority */
    CHECK_STATUS(put1(&f, 99, 1, 100), KVF_OK);
    CHECK_STATUS(put1(&f, 98, 1, 100), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, keys[1]), -1);
    CHECK_EQ_INT(tier_of(&f, keys[2]), KVF_CACHE_HOST);
    /* a get pins its blocks until it completes: a put racing it cannot
     * take their slots (checked by the bytes) */
    poison(&f, 3);
    kvf_key k2 = keys[2];
    uint32_t s3 = 3;
    CHECK_STATUS(kvf_cache_get(f.c, &k2, &s3, 1, &t), KVF_OK);
    kvf_key fresh[3] = {201, 202, 203};
    uint32_t src[3] = {4, 5, 6};
    for (int i = 0; i < 3; i++)
        fill(&f, src[i], fresh[i]);
    kvf_ticket t2;
    CHECK_STATUS(kvf_cache_put(f.c, fresh, src, 3, 100, &t2), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t2, NULL), KVF_OK);
    CHECK(expect(&f, 3, keys[2]) == 0);
    fx_done(&f);
    return 0;
}

/* ---- events -------------------------------------------------------------------- */

static int cb_count;
static uint64_t cb_last_seq;
static void on_event(void *arg, const kvf_cache_event *ev)
{
    (void)arg;
    if (ev->seq != cb_last_seq + 1)
        fprintf(stderr, "callback: event %llu after %llu\n", (unsigned long long)ev->seq,
                (unsigned long long)cb_last_seq);
    cb_last_seq = ev->seq;
    cb_count++;
}

/* Replaying the events rebuilds exactly what the cache holds. */
static int test_events(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = 5;
    cc.disk_blocks = 7;
    cc.event_queue = 4096;
    cc.on_event = on_event;
    cb_count = 0;
    cb_last_seq = 0;
    if (fx_init(&f, 8, 5, true, &cc))
        return 1;
    int where[MODEL_KEYS];
    for (int k = 0; k < MODEL_KEYS; k++)
        where[k] = -1;
    uint64_t rng = 99, seq = 0;
    kvf_cache_event evs[64];
    for (int step = 0; step < 400; step++) {
        kvf_key key = 1000 + test_xorshift64(&rng) % MODEL_KEYS;
        if (test_xorshift64(&rng) % 4) {
            fill(&f, 0, key);
            CHECK_STATUS(put1(&f, key, 0, (uint32_t)(test_xorshift64(&rng) % 101)), KVF_OK);
        } else {
            CHECK_STATUS(kvf_cache_remove(f.c, &key, 1, NULL), KVF_OK);
        }
        size_t n;
        while ((n = kvf_cache_events(f.c, evs, 64)) > 0)
            for (size_t i = 0; i < n; i++) {
                const kvf_cache_event *ev = &evs[i];
                int k = (int)(ev->key - 1000);
                REQUIRE(k >= 0 && k < MODEL_KEYS);
                CHECK_EQ_U64(ev->seq, seq + 1);
                seq = ev->seq;
                if (ev->kind == KVF_EVENT_STORED) {
                    CHECK_EQ_INT(where[k], -1);
                    where[k] = (int)ev->tier;
                } else if (ev->kind == KVF_EVENT_UPDATED) {
                    CHECK_EQ_INT(where[k], (int)ev->from);
                    CHECK(ev->from != ev->tier); /* down on eviction, up on a put */
                    where[k] = (int)ev->tier;
                } else {
                    CHECK_EQ_INT(where[k], (int)ev->tier);
                    where[k] = -1;
                }
            }
        for (int k = 0; k < MODEL_KEYS; k++)
            if (tier_of(&f, 1000 + (kvf_key)k) != where[k]) {
                fprintf(stderr, "step %d: key %d: cache %d, events %d\n", step, k,
                        tier_of(&f, 1000 + (kvf_key)k), where[k]);
                return 1;
            }
    }
    CHECK_EQ_U64(cb_last_seq, seq);
    CHECK_EQ_INT(cb_count, (int)seq);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.events_dropped, 0);
    fx_close(&f);

    /* a small queue drops and counts; seq still counts every event */
    kvf_cache_config small = cc;
    small.event_queue = 3;
    small.on_event = NULL;
    fx_engine(&f, true);
    CHECK_STATUS(kvf_cache_create(f.e, &small, &f.c), KVF_OK);
    size_t n = kvf_cache_events(f.c, evs, 64); /* the blocks found on disk */
    CHECK_EQ_INT(n, 3);
    CHECK(evs[0].kind == KVF_EVENT_STORED && evs[0].tier == KVF_CACHE_DISK);
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.events_dropped, s.blocks[KVF_CACHE_DISK] - 3);
    CHECK_EQ_INT(kvf_cache_events(f.c, evs, 64), 0);
    fx_done(&f);
    return 0;
}

/* ---- restart ------------------------------------------------------------------- */

static int test_restart(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = 4;
    cc.disk_blocks = 32;
    if (fx_init(&f, 8, 4, true, &cc))
        return 1;
    enum { N = 20 };
    for (uint32_t i = 0; i < N; i++) {
        fill(&f, 0, 500 + i);
        CHECK_STATUS(put1(&f, 500 + i, 0, 50), KVF_OK);
        usleep(2000); /* distinct modification times: the restart order */
    }
    /* the last 4 are in the host tier, and are lost with the process */
    fx_close(&f);

    fx_engine(&f, true);
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    for (uint32_t i = 0; i < N; i++) {
        int want = i < N - 4 ? KVF_CACHE_DISK : -1;
        CHECK_EQ_INT(tier_of(&f, 500 + i), want);
        if (want < 0)
            continue;
        poison(&f, 2);
        CHECK_STATUS(get1(&f, 500 + i, 2), KVF_OK);
        CHECK(expect(&f, 2, 500 + i) == 0);
    }
    fx_close(&f);

    /* a smaller disk tier keeps the newest and removes the oldest files */
    kvf_cache_config smaller = cc;
    smaller.disk_blocks = 10;
    fx_engine(&f, true);
    CHECK_STATUS(kvf_cache_create(f.e, &smaller, &f.c), KVF_OK);
    for (uint32_t i = 0; i < N - 4; i++)
        CHECK_EQ_INT(tier_of(&f, 500 + i), i < N - 4 - 10 ? -1 : KVF_CACHE_DISK);
    fx_close(&f);
    fx_engine(&f, true);
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_DISK], 10); /* the files are gone, not hidden */
    fx_close(&f);

    /* another layout does not see them */
    kvf_engine_config ec = KVF_ENGINE_CONFIG_INIT;
    ec.backend = KVF_BACKEND_HOST;
    ec.file_dir = f.dir;
    ec.file_namespace = "cache";
    REQUIRE(kvf_engine_create(&ec, &f.e) == KVF_OK);
    kvf_pool_desc p = {KVF_MEMORY_HOST, NULL, 0, 8};
    REQUIRE(kvf_engine_add_pool(f.e, &G_A, &p, &p, NULL) == KVF_OK);
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_DISK], 0);
    fx_done(&f);
    return 0;
}

/* ---- faults -------------------------------------------------------------------- */

/* Damages a stored block behind the cache's back. */
static void flip_byte(const char *path, long off)
{
    FILE *fp = fopen(path, "r+b");
    REQUIRE(fp);
    fseek(fp, off, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, off, SEEK_SET);
    fputc(ch ^ 0x40, fp);
    fclose(fp);
}

static int block_path(fixture *f, kvf_key key, char *out, size_t cap)
{
    return snprintf(out, cap, "%s/cache/%016llx.kvf", f->dir, (unsigned long long)key) < (int)cap
               ? 0
               : 1;
}

/* A file damaged behind the cache's back fails its get with
 * KVF_ERR_CORRUPT, is removed, and nothing else is touched; a tier whose
 * directory vanished fails the blocks in it, which are then forgotten. */
static int test_faults(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk_blocks = 16;
    if (fx_init(&f, 8, 0, true, &cc))
        return 1;
    for (kvf_key k = 1; k <= 6; k++) {
        fill(&f, 0, k);
        CHECK_STATUS(put1(&f, k, 0, 50), KVF_OK);
    }
    char path[600];
    REQUIRE(block_path(&f, 3, path, sizeof path) == 0);
    flip_byte(path, 200);
    kvf_key keys[3] = {2, 3, 4};
    uint32_t slots[3] = {5, 6, 7};
    kvf_ticket t;
    kvf_status per[3];
    for (int i = 0; i < 3; i++)
        poison(&f, slots[i]);
    CHECK_STATUS(kvf_cache_get(f.c, keys, slots, 3, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, per), KVF_ERR_CORRUPT);
    CHECK_STATUS(per[0], KVF_OK);
    CHECK_STATUS(per[1], KVF_ERR_CORRUPT);
    CHECK_STATUS(per[2], KVF_OK);
    CHECK(expect(&f, 5, 2) == 0);
    CHECK(expect(&f, 7, 4) == 0);
    CHECK_EQ_INT(tier_of(&f, 3), -1);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.failures, 1);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_DISK], 5);
    /* the directory removed underneath */
    char ns[600];
    snprintf(ns, sizeof ns, "%s/cache", f.dir);
    test_rmtree(ns);
    CHECK_STATUS(get1(&f, 1, 5), KVF_ERR_NOT_FOUND);
    CHECK_EQ_INT(tier_of(&f, 1), -1);
    fill(&f, 0, 77);
    CHECK_STATUS(put1(&f, 77, 0, 50), KVF_ERR_IO);
    CHECK_EQ_INT(tier_of(&f, 77), -1);
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.failures, 3);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_DISK], 4);
    fx_done(&f);
    return 0;
}

/* An offload that fails (a copy fault) leaves no entry naming its slot: a
 * get of that key is refused or fails, never served from a stale slot. */
static int fail_all_copies;
static kvf_status copy_fault(const kvf__copy *c)
{
    (void)c;
    if (!__atomic_load_n(&fail_all_copies, __ATOMIC_ACQUIRE))
        return KVF_OK;
    usleep(50000); /* long enough for the get to queue behind it */
    return KVF_ERR_IO;
}

static int test_failed_put(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = 2;
    if (fx_init(&f, 8, 2, false, &cc))
        return 1;
    fill(&f, 0, 41);
    CHECK_STATUS(put1(&f, 41, 0, 50), KVF_OK);
    fill(&f, 0, 42);
    CHECK_STATUS(put1(&f, 42, 0, 50), KVF_OK);
    kvf__set_copy_hook(copy_fault);
    __atomic_store_n(&fail_all_copies, 1, __ATOMIC_RELEASE);
    fill(&f, 0, 43); /* evicts 41, whose slot it then fails to write */
    kvf_key k43 = 43;
    uint32_t s0 = 0;
    CHECK_STATUS(kvf_cache_put(f.c, &k43, &s0, 1, 50, NULL), KVF_OK);
    /* queued behind the failing put: fails with it, never reads 41's bytes */
    kvf_ticket t;
    uint32_t s4 = 4;
    CHECK_STATUS(kvf_cache_get(f.c, &k43, &s4, 1, &t), KVF_OK);
    kvf_status st = kvf_cache_wait(f.c, t, NULL);
    CHECK(st == KVF_ERR_IO || st == KVF_ERR_LOST);
    __atomic_store_n(&fail_all_copies, 0, __ATOMIC_RELEASE);
    kvf__set_copy_hook(NULL);
    CHECK_EQ_INT(tier_of(&f, 43), -1);
    CHECK_EQ_INT(tier_of(&f, 41), -1);
    CHECK_EQ_INT(tier_of(&f, 42), KVF_CACHE_HOST);
    poison(&f, 5);
    CHECK_STATUS(get1(&f, 42, 5), KVF_OK);
    CHECK(expect(&f, 5, 42) == 0);
    /* the slot is usable again */
    CHECK_STATUS(put1(&f, 43, 0, 50), KVF_OK);
    poison(&f, 5);
    CHECK_STATUS(get1(&f, 43, 5), KVF_OK);
    CHECK(expect(&f, 5, 43) == 0);
    fx_done(&f);
    return 0;
}

/* ---- bad input ----------------------------------------------------------------- */

static int test_bad_input(void)
{
    fixture f;
    memset(&f, 0, sizeof f);
    f.primary = 8;
    f.secondary = 4;
    fx_engine(&f, false);
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    kvf_cache *c = (kvf_cache *)&f; /* must stay untouched on failure */
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_ERR_INVALID); /* capacity 0 */
    CHECK_STR_HAS(kvf_last_error(), "capacity 0");
    CHECK(c == (kvf_cache *)&f);
    cc.host_blocks = 5;
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "4 secondary slots");
    cc.host_blocks = 4;
    cc.disk_blocks = 10;
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "file tier");
    cc.disk_blocks = 0;
    cc.offload_min_priority = 500;
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &c), KVF_ERR_RANGE);
    cc.offload_min_priority = 0;
    kvf_cache_config tiny = cc;
    tiny.struct_size = 4;
    CHECK_STATUS(kvf_cache_create(f.e, &tiny, &c), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_create(NULL, &cc, &c), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    kvf_cache_destroy(NULL);

    kvf_key k = 5, zero = 0;
    uint32_t s = 0, big = 8;
    kvf_ticket t = 0;
    CHECK_STATUS(kvf_cache_put(f.c, &zero, &s, 1, 50, &t), KVF_ERR_INVALID);
    CHECK_STATUS(kvf_cache_put(f.c, &k, &big, 1, 50, &t), KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "primary slot 8");
    CHECK_STATUS(kvf_cache_put(f.c, &k, &s, 1, 101, &t), KVF_ERR_RANGE);
    CHECK_STATUS(kvf_cache_put(f.c, &k, &s, 0, 50, &t), KVF_ERR_INVALID);
    CHECK(t == 0);
    /* unknown keys: refused whole, named */
    kvf_key two[2] = {5, 6};
    uint32_t ss[2] = {1, 2};
    fill(&f, 0, 5);
    CHECK_STATUS(put1(&f, 5, 0, 50), KVF_OK);
    CHECK_STATUS(kvf_cache_get(f.c, two, ss, 2, &t), KVF_ERR_NOT_FOUND);
    CHECK_STR_HAS(kvf_last_error(), "0x0000000000000006");
    CHECK_STATUS(kvf_cache_get(f.c, &k, &s, 1, NULL), KVF_ERR_INVALID);
    kvf_key same[2] = {5, 5};
    uint32_t dup[2] = {3, 3};
    CHECK_STATUS(kvf_cache_get(f.c, same, dup, 2, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "primary slot 3");
    /* a key twice in one put: refused whole (as kvf_cache_commit), named
     * with both its indexes */
    kvf_key again[3] = {5, 7, 7};
    uint32_t from[3] = {0, 1, 1};
    fill(&f, 1, 7);
    kvf_status per[3];
    t = 0;
    CHECK_STATUS(kvf_cache_put(f.c, again, from, 3, 50, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "0x0000000000000007");
    CHECK_STR_HAS(kvf_last_error(), "keys 1 and 2");
    CHECK(t == 0);
    size_t found = 9;
    CHECK_STATUS(kvf_cache_lookup(f.c, again + 1, 1, &found, NULL), KVF_OK);
    CHECK_EQ_INT(found, 0);
    /* a key cached before: stored once, counted */
    CHECK_STATUS(kvf_cache_put(f.c, again, from, 2, 50, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, per), KVF_OK);
    kvf_cache_stats st = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(f.c, &st), KVF_OK);
    CHECK_EQ_INT(st.put_duplicates, 1);
    CHECK_EQ_INT(st.blocks[KVF_CACHE_HOST], 2);
    /* tickets */
    CHECK_STATUS(kvf_cache_wait(f.c, 12345, NULL), KVF_ERR_UNKNOWN_TICKET);
    CHECK_STATUS(kvf_cache_poll(f.c, 0, NULL), KVF_ERR_UNKNOWN_TICKET);
    /* a short stats struct gets its prefix */
    struct {
        size_t struct_size;
        uint64_t blocks[KVF_CACHE_TIERS];
    } old = {sizeof old, {0}};
    CHECK_STATUS(kvf_cache_stats_get(f.c, (kvf_cache_stats *)&old), KVF_OK);
    CHECK_EQ_INT(old.blocks[KVF_CACHE_HOST], 2);
    size_t hits = 9;
    CHECK_STATUS(kvf_cache_lookup(f.c, NULL, 0, &hits, NULL), KVF_OK);
    CHECK_EQ_INT(hits, 0);
    CHECK_STATUS(kvf_cache_lookup(f.c, &k, 1, NULL, NULL), KVF_ERR_INVALID);
    CHECK(strcmp(kvf_cache_tier_name(KVF_CACHE_DISK), "disk") == 0);
    CHECK(strcmp(kvf_cache_tier_name((kvf_cache_tier)9), "?") == 0);
    fx_done(&f);
    return 0;
}

/* ---- stats text ---------------------------------------------------------------- */

static int test_prometheus(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = 2;
    if (fx_init(&f, 8, 2, false, &cc))
        return 1;
    for (kvf_key k = 1; k <= 3; k++) {
        fill(&f, 0, k);
        CHECK_STATUS(put1(&f, k, 0, 50), KVF_OK);
    }
    kvf_key ks[3] = {2, 3, 1};
    size_t hits;
    CHECK_STATUS(kvf_cache_lookup(f.c, ks, 3, &hits, NULL), KVF_OK);
    CHECK_EQ_INT(hits, 2);
    size_t len = 0;
    CHECK_STATUS(kvf_cache_stats_prometheus(f.c, NULL, 0, &len), KVF_OK);
    char *buf = malloc(len + 1);
    size_t len2 = 0;
    CHECK_STATUS(kvf_cache_stats_prometheus(f.c, buf, len + 1, &len2), KVF_OK);
    CHECK_EQ_INT(len2, len);
    CHECK_EQ_INT(strlen(buf), len);
    CHECK_STR_HAS(buf, "# TYPE kvferry_cache_blocks gauge\n");
    CHECK_STR_HAS(buf, "kvferry_cache_blocks{tier=\"host\"} 2\n");
    CHECK_STR_HAS(buf, "kvferry_cache_hits_total{tier=\"host\"} 2\n");
    CHECK_STR_HAS(buf, "kvferry_cache_misses_total 1\n");
    CHECK_STR_HAS(buf, "kvferry_cache_evictions_total{tier=\"host\"} 1\n");
    CHECK_STR_HAS(buf, "kvferry_cache_transfer_seconds_bucket{le=\"+Inf\"} 3\n");
    CHECK_STR_HAS(buf, "kvferry_cache_transfer_seconds_count 3\n");
    /* cut short: NUL-terminated, and the length says how much is needed */
    char small[40];
    CHECK_STATUS(kvf_cache_stats_prometheus(f.c, small, sizeof small, &len2), KVF_OK);
    CHECK_EQ_INT(len2, len);
    CHECK_EQ_INT(strlen(small), sizeof small - 1);
    free(buf);
    fx_done(&f);
    return 0;
}

/* ---- the GPU tier ------------------------------------------------------------ */

static kvf_status wait_ok(fixture *f, kvf_ticket t, kvf_status *per)
{
    return kvf_cache_wait(f->c, t, per);
}

/* A request's life with a cache that owns the GPU blocks: alloc, prefill,
 * commit, unpin; later requests acquire the prefix (from the GPU tier, or
 * brought back up from host and disk) while their own allocations evict
 * unpinned GPU blocks down the tiers. Every block acquired is checked. */
static int test_gpu_tier(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu_blocks = 6;
    cc.host_blocks = 4;
    cc.disk_blocks = 16;
    cc.event_queue = 256;
    /* primary slots 0..5 are the cache's; 6..15 the engine's own */
    if (fx_init(&f, 16, 4, true, &cc))
        return 1;
    kvf_ticket t;
    uint32_t slots[6];
    kvf_key keys[6];
    for (int r = 0; r < 4; r++) {
        /* a request of 4 new blocks */
        CHECK_STATUS(kvf_cache_alloc(f.c, 4, slots, &t), KVF_OK);
        CHECK_STATUS(wait_ok(&f, t, NULL), KVF_OK);
        for (int i = 0; i < 4; i++) {
            CHECK(slots[i] < 6);
            keys[i] = 0x600 + (kvf_key)(r * 4 + i);
            fill(&f, slots[i], keys[i]);
        }
        CHECK_STATUS(kvf_cache_commit(f.c, keys, slots, 4, 50, NULL), KVF_OK);
        CHECK_EQ_INT(tier_of(&f, keys[0]), KVF_CACHE_GPU);
        CHECK_STATUS(kvf_cache_unpin(f.c, keys, 4), KVF_OK);
    }
    /* 16 blocks: 6 fit the GPU tier, the rest went down to host and disk */
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_GPU] + s.blocks[KVF_CACHE_HOST] + s.blocks[KVF_CACHE_DISK], 16);
    CHECK_EQ_INT(s.blocks[KVF_CACHE_GPU], 6); /* full: allocations evict only as needed */
    CHECK(s.blocks[KVF_CACHE_DISK] > 0);

    /* acquire the oldest request's prefix: from disk, up into GPU slots */
    kvf_key first[4] = {0x600, 0x601, 0x602, 0x603};
    CHECK(tier_of(&f, 0x600) == KVF_CACHE_DISK);
    size_t hits = 0;
    uint32_t got[4];
    kvf_status per[4];
    CHECK_STATUS(kvf_cache_acquire(f.c, first, 4, got, &hits, &t), KVF_OK);
    CHECK_EQ_INT(hits, 4);
    CHECK_STATUS(wait_ok(&f, t, per), KVF_OK);
    for (int i = 0; i < 4; i++) {
        CHECK(got[i] < 6);
        CHECK_EQ_INT(tier_of(&f, first[i]), KVF_CACHE_GPU);
        if (expect(&f, got[i], first[i]))
            return 1;
    }
    /* pinned: an allocation of more than the free and unpinned slots fails
     * whole; a smaller one evicts the unpinned ones */
    CHECK_STATUS(kvf_cache_alloc(f.c, 3, slots, &t), KVF_ERR_NO_SPACE);
    CHECK_STATUS(kvf_cache_alloc(f.c, 2, slots, &t), KVF_OK);
    CHECK_STATUS(wait_ok(&f, t, NULL), KVF_OK);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(tier_of(&f, first[i]), KVF_CACHE_GPU);
    /* handed-out slots: commit or free them, nothing else */
    kvf_key k2[2] = {0x700, 0x701};
    uint32_t bogus = 7;
    CHECK_STATUS(kvf_cache_commit(f.c, k2, &bogus, 1, 50, NULL), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "slot 7");
    /* in use by this request in the GPU tier: the new copy stays private */
    kvf_status cs;
    CHECK_STATUS(kvf_cache_commit(f.c, first, slots, 1, 50, &cs), KVF_ERR_STATE);
    CHECK_STATUS(cs, KVF_ERR_STATE);
    CHECK_STATUS(kvf_cache_free(f.c, slots, 2), KVF_OK);
    CHECK_STATUS(kvf_cache_free(f.c, slots, 1), KVF_ERR_INVALID); /* twice */
    /* a get copies a GPU block to the engine's own slot; a get into a
     * cached GPU slot is refused */
    poison(&f, 10);
    uint32_t s10 = 10;
    kvf_ticket tg;
    CHECK_STATUS(kvf_cache_get(f.c, &first[1], &s10, 1, &tg), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, tg, NULL), KVF_OK);
    CHECK(expect(&f, 10, first[1]) == 0);
    CHECK_STATUS(kvf_cache_get(f.c, &first[2], &got[0], 1, &tg), KVF_ERR_INVALID);
    /* unpinned and re-acquired where they are */
    CHECK_STATUS(kvf_cache_unpin(f.c, first, 4), KVF_OK);
    uint32_t again[4];
    CHECK_STATUS(kvf_cache_acquire(f.c, first, 4, again, &hits, &t), KVF_OK);
    CHECK_EQ_INT(hits, 4);
    CHECK_STATUS(wait_ok(&f, t, NULL), KVF_OK);
    CHECK(memcmp(again, got, sizeof got) == 0);
    CHECK_STATUS(kvf_cache_unpin(f.c, first, 4), KVF_OK);
    /* an unknown key ends the prefix */
    kvf_key mixed[3] = {0x600, 0x999, 0x601};
    CHECK_STATUS(kvf_cache_acquire(f.c, mixed, 3, again, &hits, &t), KVF_OK);
    CHECK_EQ_INT(hits, 1);
    CHECK_STATUS(wait_ok(&f, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, mixed, 1), KVF_OK);
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.failures, 0);
    CHECK(s.evictions[KVF_CACHE_GPU] > 0);
    /* no GPU tier: refused */
    fx_close(&f);
    kvf_cache_config plain = KVF_CACHE_CONFIG_INIT;
    plain.host_blocks = 4;
    fx_engine(&f, false);
    CHECK_STATUS(kvf_cache_create(f.e, &plain, &f.c), KVF_OK);
    CHECK_STATUS(kvf_cache_alloc(f.c, 1, slots, &t), KVF_ERR_INVALID);
    CHECK_STR_HAS(kvf_last_error(), "gpu_blocks");
    fx_close(&f);
    plain.gpu_blocks = 17;
    fx_engine(&f, false);
    CHECK_STATUS(kvf_cache_create(f.e, &plain, &f.c), KVF_ERR_RANGE);
    kvf_engine_destroy(f.e);
    test_rmtree(f.dir);
    return 0;
}

/* Two requests acquire the same blocks while the first one's copy up from
 * the host tier is still running (slowed down here): the second ticket
 * must not complete before the bytes are in place (found by kvferry
 * replay --gpu-tier --clients 3). */
static int slow_copies;
static kvf_status slow_copy(const kvf__copy *cp)
{
    (void)cp;
    if (__atomic_load_n(&slow_copies, __ATOMIC_ACQUIRE))
        usleep(20000);
    return KVF_OK;
}

static int test_gpu_tier_acquire_race(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu_blocks = 4;
    cc.host_blocks = 8; /* room for both sets: acquiring one evicts nothing */
    if (fx_init(&f, 8, 8, false, &cc))
        return 1;
    kvf_key a[4] = {0xa1, 0xa2, 0xa3, 0xa4}, b[4] = {0xb1, 0xb2, 0xb3, 0xb4};
    uint32_t slots[4];
    kvf_ticket t;
    for (int round = 0; round < 2; round++) {
        kvf_key *keys = round ? b : a;
        CHECK_STATUS(kvf_cache_alloc(f.c, 4, slots, &t), KVF_OK);
        CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
        for (int i = 0; i < 4; i++)
            fill(&f, slots[i], keys[i]);
        CHECK_STATUS(kvf_cache_commit(f.c, keys, slots, 4, 50, NULL), KVF_OK);
        CHECK_STATUS(kvf_cache_unpin(f.c, keys, 4), KVF_OK);
    }
    CHECK_EQ_INT(tier_of(&f, a[0]), KVF_CACHE_HOST); /* pushed down by b */
    kvf__set_copy_hook(slow_copy);
    __atomic_store_n(&slow_copies, 1, __ATOMIC_RELEASE);
    uint32_t s1[4], s2[4];
    size_t h1 = 0, h2 = 0;
    kvf_ticket t1, t2;
    kvf_status per[4];
    CHECK_STATUS(kvf_cache_acquire(f.c, a, 4, s1, &h1, &t1), KVF_OK);
    CHECK_STATUS(kvf_cache_acquire(f.c, a, 4, s2, &h2, &t2), KVF_OK);
    CHECK_EQ_INT(h1, 4);
    CHECK_EQ_INT(h2, 4);
    CHECK_STATUS(kvf_cache_wait(f.c, t2, per), KVF_OK);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(s2[i], s1[i]);
        CHECK(expect(&f, s2[i], a[i]) == 0); /* in place once t2 completed */
    }
    CHECK_STATUS(kvf_cache_wait(f.c, t1, NULL), KVF_OK);
    __atomic_store_n(&slow_copies, 0, __ATOMIC_RELEASE);
    kvf__set_copy_hook(NULL);
    CHECK_STATUS(kvf_cache_unpin(f.c, a, 4), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, a, 4), KVF_OK);
    fx_done(&f);
    return 0;
}

/* Random requests against a GPU tier with host and disk below: each
 * acquires a random prefix of a shared chain of keys, allocates and commits
 * the rest, and ends (unpins); some give allocations back. After every
 * request, every acquired block's bytes are checked, and the blocks found
 * per tier equal the counts. */
static int test_gpu_tier_random(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu_blocks = 10;
    cc.host_blocks = 6;
    cc.disk_blocks = 12;
    cc.offload_min_priority = 20;
    if (fx_init(&f, 16, 6, true, &cc))
        return 1;
    enum { MAXREQ = 8 };
    uint64_t rng = 2024;
    for (int step = 0; step < 300; step++) {
        /* a request: a prefix of one of 5 chains, 1..MAXREQ blocks long */
        size_t len = 1 + test_xorshift64(&rng) % MAXREQ;
        kvf_key base = 10000 + (test_xorshift64(&rng) % 5) * 100;
        kvf_key keys[MAXREQ];
        for (size_t i = 0; i < len; i++)
            keys[i] = base + i;
        uint32_t slots[MAXREQ];
        size_t hits = 0;
        kvf_ticket t;
        kvf_status per[MAXREQ];
        CHECK_STATUS(kvf_cache_acquire(f.c, keys, len, slots, &hits, &t), KVF_OK);
        CHECK_STATUS(kvf_cache_wait(f.c, t, per), KVF_OK);
        for (size_t i = 0; i < hits; i++)
            if (expect(&f, slots[i], keys[i])) {
                fprintf(stderr, "step %d: acquired block %zu wrong\n", step, i);
                return 1;
            }
        size_t rest = len - hits;
        if (rest) {
            kvf_status st = kvf_cache_alloc(f.c, rest, slots + hits, &t);
            if (st == KVF_ERR_NO_SPACE) {
                CHECK_STATUS(kvf_cache_unpin(f.c, keys, hits), KVF_OK);
                continue;
            }
            CHECK_STATUS(st, KVF_OK);
            CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
            for (size_t i = hits; i < len; i++)
                fill(&f, slots[i], keys[i]);
            if (test_xorshift64(&rng) % 8 == 0) {
                CHECK_STATUS(kvf_cache_free(f.c, slots + hits, rest), KVF_OK);
                len = hits;
            } else {
                /* blocks after a prefix miss may be cached already: those
                 * in use stay private, the others are replaced */
                uint32_t prio = (uint32_t)(test_xorshift64(&rng) % 101);
                kvf_status cs[MAXREQ];
                kvf_cache_commit(f.c, keys + hits, slots + hits, rest, prio, cs);
                size_t kept = hits;
                for (size_t i = hits; i < len; i++) {
                    if (cs[i - hits] == KVF_OK) {
                        keys[kept] = keys[i];
                        kept++;
                    } else {
                        CHECK_STATUS(cs[i - hits], KVF_ERR_STATE);
                        CHECK_STATUS(kvf_cache_free(f.c, &slots[i], 1), KVF_OK);
                    }
                }
                len = kept;
            }
        }
        if (kvf_cache_unpin(f.c, keys, len) != KVF_OK) {
            fprintf(stderr, "step %d: len %zu hits %zu rest %zu: %s\n", step, len, hits, rest,
                    kvf_last_error());
            for (size_t i = 0; i < len; i++)
                fprintf(stderr, "  key %zu tier %d\n", i, tier_of(&f, keys[i]));
            return 1;
        }
        kvf_cache_stats s = KVF_CACHE_STATS_INIT;
        kvf_cache_stats_get(f.c, &s);
        uint64_t found[KVF_CACHE_TIERS] = {0};
        for (kvf_key b = 10000; b < 10500; b += 100)
            for (kvf_key i = 0; i < MAXREQ; i++) {
                int tier = tier_of(&f, b + i);
                if (tier >= 0)
                    found[tier]++;
            }
        for (int tier = 0; tier < KVF_CACHE_TIERS; tier++)
            if (found[tier] != s.blocks[tier]) {
                fprintf(stderr, "step %d: tier %d: %llu found, %llu counted\n", step, tier,
                        (unsigned long long)found[tier], (unsigned long long)s.blocks[tier]);
                return 1;
            }
        CHECK(s.blocks[KVF_CACHE_GPU] <= 10 && s.blocks[KVF_CACHE_HOST] <= 6 &&
              s.blocks[KVF_CACHE_DISK] <= 12);
        CHECK_EQ_INT(s.failures, 0);
    }
    fx_done(&f);
    return 0;
}

/* Found in review. A get of a GPU-tier block whose acquire copy failed
 * (the engine done, the cache not yet told): fails, never OK with bytes
 * that are not the block's. */
static int test_gpu_get_after_failed_acquire(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu_blocks = 4;
    cc.disk_blocks = 16;
    if (fx_init(&f, 16, 0, true, &cc))
        return 1;
    kvf_key K = 0x77;
    fill(&f, 8, K);
    CHECK_STATUS(put1(&f, K, 8, 50), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, K), KVF_CACHE_DISK);
    char path[600];
    block_path(&f, K, path, sizeof path);
    flip_byte(path, 200);
    uint32_t s;
    size_t hits;
    kvf_ticket ta, tg;
    CHECK_STATUS(kvf_cache_acquire(f.c, &K, 1, &s, &hits, &ta), KVF_OK);
    CHECK_EQ_INT(hits, 1);
    usleep(200000); /* the engine completes the failed read */
    poison(&f, 9);
    uint32_t d = 9;
    CHECK_STATUS(kvf_cache_get(f.c, &K, &d, 1, &tg), KVF_OK);
    kvf_status gs = kvf_cache_wait(f.c, tg, NULL);
    CHECK(gs == KVF_ERR_LOST || (gs == KVF_OK && expect(&f, 9, K) == 0));
    CHECK(gs != KVF_OK); /* the copy into the GPU slot failed: so does the get */
    CHECK_STATUS(kvf_cache_wait(f.c, ta, NULL), KVF_ERR_CORRUPT);
    kvf_cache_unpin(f.c, &K, 1);
    fx_done(&f);
    return 0;
}

/* A get in flight, then an acquire moving the same key: the get's pin is released all the same. */
static int test_get_pin_released_after_acquire(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu_blocks = 4;
    cc.host_blocks = 4;
    if (fx_init(&f, 16, 4, false, &cc))
        return 1;
    kvf_key K = 0x88;
    fill(&f, 8, K);
    CHECK_STATUS(put1(&f, K, 8, 50), KVF_OK);
    uint32_t d = 9, s;
    size_t hits;
    kvf_ticket tg, ta;
    CHECK_STATUS(kvf_cache_get(f.c, &K, &d, 1, &tg), KVF_OK);
    CHECK_STATUS(kvf_cache_acquire(f.c, &K, 1, &s, &hits, &ta), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, tg, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, ta, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK);
    /* K should now be unpinned: a second unpin must fail */
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_ERR_STATE);
    CHECK_STATUS(kvf_cache_pin(f.c, &K, 1, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK);
    uint32_t sl[4];
    kvf_ticket t;
    CHECK_STATUS(kvf_cache_alloc(f.c, 4, sl, &t), KVF_OK); /* K evictable again */
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    fx_done(&f);
    return 0;
}

/* Unpinned before its acquire is waited, a block whose copy failed is not copied down as good. */
static int test_gpu_failed_acquire_not_passed_down(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu_blocks = 1;
    cc.host_blocks = 1;
    cc.disk_blocks = 16;
    if (fx_init(&f, 16, 1, true, &cc))
        return 1;
    kvf_key K = 0x99, K2 = 0x9a;
    fill(&f, 8, K);
    CHECK_STATUS(put1(&f, K, 8, 50), KVF_OK);
    fill(&f, 8, K2);
    CHECK_STATUS(put1(&f, K2, 8, 50), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, K), KVF_CACHE_DISK);
    char path[600];
    block_path(&f, K, path, sizeof path);
    flip_byte(path, 200);
    uint32_t s;
    size_t hits;
    kvf_ticket ta, t;
    poison(&f, 0);
    CHECK_STATUS(kvf_cache_acquire(f.c, &K, 1, &s, &hits, &ta), KVF_OK);
    usleep(200000);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK); /* request cancelled */
    uint32_t s2;
    CHECK_STATUS(kvf_cache_alloc(f.c, 1, &s2, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, ta, NULL), KVF_ERR_CORRUPT);
    poison(&f, 9);
    kvf_status gs = get1(&f, K, 9);
    CHECK(gs != KVF_OK || expect(&f, 9, K) == 0); /* never another block's bytes */
    kvf_cache_free(f.c, &s2, 1);
    fx_done(&f);
    return 0;
}

/* A failed copy long gone does not fail a good block later committed into the same slot. */
static int test_gpu_stale_failure_forgotten(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu_blocks = 1;
    cc.disk_blocks = 16;
    if (fx_init(&f, 16, 0, true, &cc))
        return 1;
    kvf_key K = 0x55, K2 = 0x56;
    fill(&f, 8, K);
    CHECK_STATUS(put1(&f, K, 8, 50), KVF_OK);
    char path[600];
    block_path(&f, K, path, sizeof path);
    flip_byte(path, 200);
    uint32_t s;
    size_t hits;
    kvf_ticket t;
    CHECK_STATUS(kvf_cache_acquire(f.c, &K, 1, &s, &hits, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_ERR_CORRUPT);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK);
    CHECK_STATUS(kvf_cache_alloc(f.c, 1, &s, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    fill(&f, s, K2);
    CHECK_STATUS(kvf_cache_commit(f.c, &K2, &s, 1, 50, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K2, 1), KVF_OK);
    CHECK_STATUS(kvf_cache_acquire(f.c, &K2, 1, &s, &hits, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K2, 1), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, K2), KVF_CACHE_GPU);
    fx_done(&f);
    return 0;
}

static int test_gpu_acquire_duplicate_keys(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.gpu_blocks = 2;
    cc.host_blocks = 2;
    if (fx_init(&f, 16, 2, false, &cc))
        return 1;
    kvf_key K = 0x33;
    uint32_t s;
    kvf_ticket t;
    CHECK_STATUS(kvf_cache_alloc(f.c, 1, &s, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    fill(&f, s, K);
    CHECK_STATUS(kvf_cache_commit(f.c, &K, &s, 1, 50, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_unpin(f.c, &K, 1), KVF_OK);
    kvf_key kk[2] = {K, K};
    uint32_t ss[2];
    size_t hits;
    /* refused up front: a request names each block once */
    CHECK_STATUS(kvf_cache_acquire(f.c, kk, 2, ss, &hits, &t), KVF_ERR_INVALID);
    CHECK_EQ_INT(tier_of(&f, K), KVF_CACHE_GPU);
    fx_done(&f);
    return 0;
}

/* ---- threads ------------------------------------------------------------------- */

typedef struct worker_arg {
    fixture *f;
    uint32_t first_slot; /* each thread owns two primary slots */
    uint64_t seed;
    int failures;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    fixture *f = a->f;
    uint64_t rng = a->seed;
    for (int i = 0; i < 300; i++) {
        kvf_key key = 1 + test_xorshift64(&rng) % 64;
        size_t hits = 0;
        kvf_cache_lookup(f->c, &key, 1, &hits, NULL);
        if (hits && test_xorshift64(&rng) % 2) {
            uint32_t slot = a->first_slot + 1;
            poison(f, slot);
            kvf_ticket t;
            /* it may be evicted between lookup and get: then not found */
            kvf_status st = kvf_cache_get(f->c, &key, &slot, 1, &t);
            if (st == KVF_OK && kvf_cache_wait(f->c, t, NULL) == KVF_OK && expect(f, slot, key))
                a->failures++;
            else if (st != KVF_OK && st != KVF_ERR_NOT_FOUND)
                a->failures++;
        } else {
            uint32_t slot = a->first_slot;
            fill(f, slot, key);
            if (put1(f, key, slot, (uint32_t)(test_xorshift64(&rng) % 101)) != KVF_OK)
                a->failures++;
        }
    }
    return NULL;
}

static int test_threads(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host_blocks = 8;
    cc.disk_blocks = 24;
    cc.event_queue = 64;
    if (fx_init(&f, 8, 8, true, &cc))
        return 1;
    enum { T = 4 };
    pthread_t th[T];
    worker_arg args[T];
    for (int i = 0; i < T; i++) {
        args[i] = (worker_arg){&f, (uint32_t)(2 * i), 1000 + (uint64_t)i, 0};
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(args[i].failures, 0);
    }
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK(s.blocks[KVF_CACHE_HOST] <= 8 && s.blocks[KVF_CACHE_DISK] <= 24);
    uint64_t found = 0;
    for (kvf_key k = 1; k <= 64; k++)
        found += tier_of(&f, k) >= 0;
    CHECK_EQ_U64(found, s.blocks[KVF_CACHE_HOST] + s.blocks[KVF_CACHE_DISK]);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_keys);
    RUN(test_host_only);
    RUN(test_disk_only);
    RUN(test_host_and_disk);
    RUN(test_eviction_lru_priorities);
    RUN(test_eviction_min_priority);
    RUN(test_eviction_disk_admission);
    RUN(test_eviction_single_tier);
    RUN(test_promotion);
    RUN(test_pins);
    RUN(test_events);
    RUN(test_restart);
    RUN(test_faults);
    RUN(test_failed_put);
    RUN(test_bad_input);
    RUN(test_prometheus);
    RUN(test_gpu_tier);
    RUN(test_gpu_tier_random);
    RUN(test_gpu_tier_acquire_race);
    RUN(test_gpu_get_after_failed_acquire);
    RUN(test_get_pin_released_after_acquire);
    RUN(test_gpu_failed_acquire_not_passed_down);
    RUN(test_gpu_stale_failure_forgotten);
    RUN(test_gpu_acquire_duplicate_keys);
    RUN(test_threads);
    return TEST_RESULT();
}
