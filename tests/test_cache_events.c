/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's events (replayed, they rebuild exactly what the cache holds)
 * and its statistics as Prometheus text.
 */
#include "cache_fixture.h"

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
    cc.host.blocks = 5;
    cc.disk.blocks = 7;
    cc.events.queue = 4096;
    cc.events.fn = on_event;
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
        kvf_key key = KEY(1000 + test_xorshift64(&rng) % MODEL_KEYS);
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
                int k = (int)(ev->key.lo - 1000);
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
            if (tier_of(&f, 1000 + (uint64_t)k) != where[k]) {
                fprintf(stderr, "step %d: key %d: cache %d, events %d\n", step, k,
                        tier_of(&f, 1000 + (uint64_t)k), where[k]);
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
    small.events.queue = 3;
    small.events.fn = NULL;
    fx_engine(&f, true);
    CHECK_STATUS(kvf_cache_create(f.e, &small, &f.c), KVF_OK);
    size_t n = kvf_cache_events(f.c, evs, 64); /* the blocks found on disk */
    CHECK_EQ_INT(n, 3);
    CHECK(evs[0].kind == KVF_EVENT_STORED && evs[0].tier == KVF_TIER_DISK);
    kvf_cache_stats_get(f.c, &s);
    CHECK_EQ_INT(s.events_dropped, s.blocks[KVF_TIER_DISK] - 3);
    CHECK_EQ_INT(kvf_cache_events(f.c, evs, 64), 0);
    fx_done(&f);
    return 0;
}

/* ---- stats text ---------------------------------------------------------------- */

static int test_prometheus(void)
{
    fixture f;
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 2;
    if (fx_init(&f, 8, 2, false, &cc))
        return 1;
    for (uint64_t k = 1; k <= 3; k++) {
        fill(&f, 0, k);
        CHECK_STATUS(put1(&f, k, 0, 50), KVF_OK);
    }
    kvf_key ks[3] = {KEY(2), KEY(3), KEY(1)};
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

int main(void)
{
    RUN(test_events);
    RUN(test_prometheus);
    return TEST_RESULT();
}
