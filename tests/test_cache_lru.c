/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's eviction order against a model: LRU within priorities, the
 * minimum priority, the disk tier's admission, a single tier; and pins,
 * which keep a block from eviction.
 */
#include "cache_fixture.h"

/* The model: the rules of kvferry.h written plainly, checked against the cache. */
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
    if (model_count(m, KVF_TIER_DISK) < m->cap[KVF_TIER_DISK])
        return true;
    int v = model_victim(m, KVF_TIER_DISK);
    if (v < 0)
        return false;
    m->e[v].present = false;
    return true;
}

static bool model_host_room(model *m)
{
    if (model_count(m, KVF_TIER_HOST) < m->cap[KVF_TIER_HOST])
        return true;
    int v = model_victim(m, KVF_TIER_HOST);
    if (v < 0)
        return false;
    model_entry *x = &m->e[v];
    if (m->cap[KVF_TIER_DISK] && x->prio >= m->min_prio && x->uses >= m->admit &&
        model_disk_room(m)) {
        x->tier = KVF_TIER_DISK;
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
        if (x->tier == KVF_TIER_DISK && m->cap[KVF_TIER_HOST] && !x->pins) {
            x->pins++;
            bool room = model_host_room(m);
            x->pins--;
            if (room) {
                x->tier = KVF_TIER_HOST;
                x->last = ++m->clock;
            }
        }
        return;
    }
    int tier = -1;
    if (m->cap[KVF_TIER_HOST] && model_host_room(m))
        tier = KVF_TIER_HOST;
    else if (m->cap[KVF_TIER_DISK] && model_disk_room(m))
        tier = KVF_TIER_DISK;
    if (tier < 0)
        return;
    *x = (model_entry){true, tier, prio, 0, 0, ++m->clock};
}

static int compare_model(fixture *f, const model *m, const char *after, int step)
{
    for (int k = 0; k < MODEL_KEYS; k++) {
        int want = m->e[k].present ? m->e[k].tier : -1;
        int got = tier_of(f, 1000 + (uint64_t)k);
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
    cc.host.blocks = host;
    cc.disk.blocks = disk;
    cc.offload_min_priority = min_prio;
    cc.disk.admit_uses = admit;
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
        kvf_key key = KEY(1000 + (uint64_t)k);
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

/* ---- pins ---------------------------------------------------------------------- */

static int test_pins(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 4;
    if (fx_init(&f, 8, 4, false, &cc))
        return 1;
    kvf_key keys[4] = {KEY(11), KEY(12), KEY(13), KEY(14)};
    for (int i = 0; i < 4; i++) {
        fill(&f, 0, keys[i]);
        CHECK_STATUS(put1(&f, keys[i], 0, 10), KVF_OK);
    }
    size_t pinned = 0;
    CHECK_STATUS(kvf_cache_pin(f.c, keys, 4, &pinned), KVF_OK);
    CHECK_EQ_INT(pinned, 4);
    /* every block pinned: nothing can be stored, nothing is evicted */
    fill(&f, 1, 99);
    kvf_key k99 = KEY(99);
    uint32_t s1 = 1;
    kvf_cache_ticket t;
    kvf_status per;
    CHECK_STATUS(kvf_cache_put(f.c, &k99, &s1, 1, 100, &t), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, &per), KVF_ERR_NO_SPACE);
    CHECK_STATUS(per, KVF_ERR_NO_SPACE);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(tier_of(&f, keys[i]), KVF_TIER_HOST);
    CHECK_EQ_INT(tier_of(&f, 99), -1);
    /* a removal of a pinned block waits for its unpin */
    size_t removed = 0;
    CHECK_STATUS(kvf_cache_remove(f.c, &keys[0], 1, &removed), KVF_OK);
    CHECK_EQ_INT(removed, 1);
    CHECK_EQ_INT(tier_of(&f, keys[0]), -1); /* no longer found */
    CHECK_STATUS(get1(&f, keys[0], 2), KVF_ERR_NOT_FOUND);
    /* unpin is all or nothing */
    kvf_key bad[2] = {keys[1], KEY(777)};
    CHECK_STATUS(kvf_cache_unpin(f.c, bad, 2), KVF_ERR_STATE);
    CHECK_STR_HAS(kvf_last_error(), "00000000000000000000000000000309");
    kvf_key twice[2] = {keys[1], keys[1]};
    CHECK_STATUS(kvf_cache_unpin(f.c, twice, 2), KVF_ERR_STATE); /* one pin only */
    CHECK_STATUS(kvf_cache_unpin(f.c, keys, 4), KVF_OK);
    kvf_cache_stats s = KVF_CACHE_STATS_INIT;
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.blocks[KVF_TIER_HOST], 3); /* keys[0] went at its unpin */
    /* now the put evicts the LRU of the lowest priority */
    CHECK_STATUS(put1(&f, 99, 1, 100), KVF_OK);
    CHECK_STATUS(put1(&f, 98, 1, 100), KVF_OK);
    CHECK_EQ_INT(tier_of(&f, keys[1]), -1);
    CHECK_EQ_INT(tier_of(&f, keys[2]), KVF_TIER_HOST);
    /* a get pins its blocks until it completes: a put racing it cannot
     * take their slots (checked by the bytes) */
    poison(&f, 3);
    kvf_key k2 = keys[2];
    uint32_t s3 = 3;
    CHECK_STATUS(kvf_cache_get(f.c, &k2, &s3, 1, &t), KVF_OK);
    kvf_key fresh[3] = {KEY(201), KEY(202), KEY(203)};
    uint32_t src[3] = {4, 5, 6};
    for (int i = 0; i < 3; i++)
        fill(&f, src[i], fresh[i]);
    kvf_cache_ticket t2;
    CHECK_STATUS(kvf_cache_put(f.c, fresh, src, 3, 100, &t2), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t, NULL), KVF_OK);
    CHECK_STATUS(kvf_cache_wait(f.c, t2, NULL), KVF_OK);
    CHECK(expect(&f, 3, keys[2]) == 0);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_eviction_lru_priorities);
    RUN(test_eviction_min_priority);
    RUN(test_eviction_disk_admission);
    RUN(test_eviction_single_tier);
    RUN(test_pins);
    return TEST_RESULT();
}
