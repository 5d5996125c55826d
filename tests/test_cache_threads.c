/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache from several threads at once: puts and gets of random keys,
 * every block got checked byte for byte, the counts per tier agreeing
 * with the blocks found.
 */
#include "cache_fixture.h"

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
        kvf_key key = KEY(1 + test_xorshift64(&rng) % 64);
        size_t hits = 0;
        kvf_cache_lookup(f->c, &key, 1, &hits, NULL);
        if (hits && test_xorshift64(&rng) % 2) {
            uint32_t slot = a->first_slot + 1;
            poison(f, slot);
            kvf_cache_ticket t;
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
    cc.host.blocks = 8;
    cc.disk.blocks = 24;
    cc.events.queue = 64;
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
    CHECK(s.blocks[KVF_TIER_HOST] <= 8 && s.blocks[KVF_TIER_DISK] <= 24);
    uint64_t found = 0;
    for (uint64_t k = 1; k <= 64; k++)
        found += tier_of(&f, k) >= 0;
    CHECK_EQ_U64(found, s.blocks[KVF_TIER_HOST] + s.blocks[KVF_TIER_DISK]);
    fx_done(&f);
    return 0;
}

int main(void)
{
    RUN(test_threads);
    return TEST_RESULT();
}
