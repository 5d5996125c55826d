/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The keyed hash table every index of the library uses (core/keymap.h):
 * what goes in is found, through many doublings and with dense keys; a
 * key held by several objects yields each once; removal takes exactly the
 * object named; iteration and clearing visit every object once.
 */
#include "keymap.h"
#include "testutil.h"

typedef struct obj {
    uint32_t tag;
    uint64_t key;
    struct obj *chain;
    int seen;
} obj;

enum { N = 20000 };
static obj objs[N];

static kvf__keymap fresh(size_t first)
{
    memset(objs, 0, sizeof objs);
    return (kvf__keymap)KVF_KEYMAP_INIT(obj, key, chain, first);
}

static int test_insert_find_grow(void)
{
    kvf__keymap m = fresh(4);
    CHECK(kvf__keymap_find(&m, 1, NULL) == NULL); /* no buckets yet */
    for (uint32_t i = 0; i < N; i++) {
        objs[i].key = i; /* dense small keys, as slot numbers are */
        objs[i].tag = i;
        CHECK(kvf__keymap_insert(&m, &objs[i]));
    }
    CHECK_EQ_U64(m.count, N);
    CHECK(m.nbuckets >= N && (m.nbuckets & (m.nbuckets - 1)) == 0);
    for (uint32_t i = 0; i < N; i++) {
        obj *o = kvf__keymap_find(&m, i, NULL);
        CHECK(o == &objs[i]);
        CHECK(kvf__keymap_find(&m, i, o) == NULL);
    }
    CHECK(kvf__keymap_find(&m, N + 7, NULL) == NULL);
    kvf__keymap_free(&m);
    CHECK(m.count == 0 && m.nbuckets == 0 && kvf__keymap_find(&m, 3, NULL) == NULL);
    /* usable again after free: the offsets stay */
    CHECK(kvf__keymap_insert(&m, &objs[3]));
    CHECK(kvf__keymap_find(&m, 3, NULL) == &objs[3]);
    kvf__keymap_free(&m);
    return 0;
}

static int test_repeated_keys_and_remove(void)
{
    kvf__keymap m = fresh(0);
    /* three objects under one key (another namespace's block, say) among others */
    for (uint32_t i = 0; i < 100; i++) {
        objs[i].key = 0xabcdef0000000000ull + (i % 10 == 0 ? 1 : i);
        objs[i].tag = i;
        CHECK(kvf__keymap_insert(&m, &objs[i]));
    }
    uint64_t k = 0xabcdef0000000001ull; /* objects 0, 1, 10, 20, ..., 90 */
    size_t n = 0;
    for (obj *o = kvf__keymap_find(&m, k, NULL); o; o = kvf__keymap_find(&m, k, o)) {
        CHECK(o->key == k);
        CHECK(o->seen++ == 0);
        n++;
    }
    CHECK_EQ_U64(n, 11);
    kvf__keymap_remove(&m, &objs[20]);
    CHECK_EQ_U64(m.count, 99);
    n = 0;
    for (obj *o = kvf__keymap_find(&m, k, NULL); o; o = kvf__keymap_find(&m, k, o)) {
        CHECK(o != &objs[20]);
        n++;
    }
    CHECK_EQ_U64(n, 10);
    for (uint32_t i = 0; i < 100; i++)
        if (i != 20)
            kvf__keymap_remove(&m, &objs[i]);
    CHECK_EQ_U64(m.count, 0);
    CHECK(kvf__keymap_find(&m, k, NULL) == NULL);
    kvf__keymap_free(&m);
    return 0;
}

static int dropped;
static void drop(void *o)
{
    ((obj *)o)->seen += 100;
    dropped++;
}

static int test_iterate_and_clear(void)
{
    kvf__keymap m = fresh(8);
    for (uint32_t i = 0; i < 1000; i++) {
        objs[i].key = (uint64_t)i * 0x9E3779B97F4A7C15ull;
        CHECK(kvf__keymap_insert(&m, &objs[i]));
    }
    size_t pos = 0, n = 0;
    for (obj *o = kvf__keymap_next(&m, &pos, NULL); o; o = kvf__keymap_next(&m, &pos, o)) {
        CHECK(o->seen++ == 0);
        n++;
    }
    CHECK_EQ_U64(n, 1000);
    kvf__keymap_clear(&m, drop);
    CHECK_EQ_INT(dropped, 1000);
    for (uint32_t i = 0; i < 1000; i++)
        CHECK_EQ_INT(objs[i].seen, 101);
    CHECK(m.count == 0 && m.buckets == NULL);
    pos = 0;
    CHECK(kvf__keymap_next(&m, &pos, NULL) == NULL);
    return 0;
}

int main(void)
{
    RUN(test_insert_find_grow);
    RUN(test_repeated_keys_and_remove);
    RUN(test_iterate_and_clear);
    return TEST_RESULT();
}
