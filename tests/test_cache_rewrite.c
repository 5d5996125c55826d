/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Another writer of the namespace rewriting its block files while the
 * cache reads them. A writer replaces a file by swapping a new one in and
 * later writes over the replaced inode in place (blockfile_spare.c), so a
 * read still open on it can see another version's bytes half written:
 * KVF_ERR_CORRUPT for bytes that are valid under the file's name. The
 * engine reads such a block again before it reports a verdict, so every
 * get succeeds, byte for byte, and the cache keeps every block. The
 * writer is a second engine on the same directory and namespace, on its
 * own thread, writing the same keys (same bytes: a key names its
 * content) as fast as it can.
 */
#include "cache_fixture.h"

#include <stdatomic.h>

/* at least GETS gets, and on until the writer has rewritten the files
 * MIN_ROUNDS times (a loaded machine may not run it at first), at most
 * GETS_MAX */
enum { KEYS = 8, GETS = 300, MIN_ROUNDS = 3, GETS_MAX = 200000 };

typedef struct writer_arg {
    fixture *w;
    kvf_key keys[KEYS];
    atomic_bool stop;
    atomic_int rounds;
    int failures;
} writer_arg;

static void *writer_main(void *p)
{
    writer_arg *a = p;
    kvf_move mv[KEYS];
    for (uint32_t i = 0; i < KEYS; i++)
        mv[i] = TO_KEY(i, a->keys[i]);
    while (!atomic_load(&a->stop)) {
        kvf_ticket t;
        if (kvf_offload(a->w->e, KVF_TIER_DISK, mv, KEYS, &t) != KVF_OK ||
            kvf_wait(a->w->e, t, NULL) != KVF_OK) {
            fprintf(stderr, "writer: %s\n", kvf_last_error());
            a->failures++;
            break;
        }
        atomic_fetch_add(&a->rounds, 1);
    }
    return NULL;
}

static int test_reads_under_a_rewriter(void)
{
    /* the writer first: the cache finds its blocks on disk when created */
    fixture w;
    memset(&w, 0, sizeof w);
    w.primary = KEYS;
    REQUIRE(test_tmpdir(w.dir, sizeof w.dir) == 0);
    REQUIRE(fx_engine(&w, true) == 0);
    writer_arg *a = calloc(1, sizeof *a);
    a->w = &w;
    for (uint32_t i = 0; i < KEYS; i++) {
        a->keys[i] = KEY(0xB00 + i);
        fill(&w, i, a->keys[i]);
    }
    kvf_move mv[KEYS];
    for (uint32_t i = 0; i < KEYS; i++)
        mv[i] = TO_KEY(i, a->keys[i]);
    kvf_ticket et;
    CHECK_STATUS(kvf_offload(w.e, KVF_TIER_DISK, mv, KEYS, &et), KVF_OK);
    CHECK_STATUS(kvf_wait(w.e, et, NULL), KVF_OK);

    fixture f;
    memset(&f, 0, sizeof f);
    f.primary = 2 * KEYS;
    memcpy(f.dir, w.dir, sizeof f.dir);
    REQUIRE(fx_engine(&f, true) == 0);
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.disk.blocks = 64;
    CHECK_STATUS(kvf_cache_create(f.e, &cc, &f.c), KVF_OK);
    for (uint32_t i = 0; i < KEYS; i++)
        CHECK(tier_of(&f, a->keys[i]) == KVF_TIER_DISK);

    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, writer_main, a) == 0);
    uint32_t slots[KEYS];
    int bad = 0;
    for (int g = 0; !bad && g < GETS_MAX && (g < GETS || atomic_load(&a->rounds) < MIN_ROUNDS);
         g++) {
        for (uint32_t i = 0; i < KEYS; i++) {
            slots[i] = KEYS + i;
            poison(&f, slots[i]);
        }
        kvf_cache_ticket t;
        kvf_status per[KEYS];
        kvf_status st = kvf_cache_get(f.c, a->keys, slots, KEYS, &t);
        if (st == KVF_OK)
            st = kvf_cache_wait(f.c, t, per);
        if (st != KVF_OK) {
            fprintf(stderr, "get %d: %s: %s\n", g, kvf_status_str(st), kvf_last_error());
            bad++;
            break;
        }
        for (uint32_t i = 0; i < KEYS; i++)
            bad += expect(&f, slots[i], a->keys[i]);
    }
    atomic_store(&a->stop, true);
    pthread_join(th, NULL);
    CHECK(bad == 0);
    CHECK(a->failures == 0);
    CHECK(atomic_load(&a->rounds) > 0);
    /* every block stays cached, on disk */
    for (uint32_t i = 0; i < KEYS; i++)
        CHECK(tier_of(&f, a->keys[i]) == KVF_TIER_DISK);
    kvf_cache_stats stats = KVF_CACHE_STATS_INIT;
    CHECK_STATUS(kvf_cache_stats_get(f.c, &stats), KVF_OK);
    CHECK(stats.failures == 0);
    fx_close(&f);
    kvf_engine_destroy(w.e);
    test_rmtree(w.dir);
    free(a);
    return 0;
}

int main(void)
{
    return test_reads_under_a_rewriter() ? 1 : 0;
}
