/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The keyed hash table every index of the library uses (core/keymap.h):
 * what goes in is found, through many doublings and with dense keys; a
 * key held by several objects yields each once; removal takes exactly the
 * object named; iteration and clearing visit every object once; keys
 * chosen to share a bucket under an unkeyed hash spread out.
 */
#include "keymap.h"
#include "testutil.h"

typedef struct obj {
    uint32_t tag;
    kvf_key key;
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
    CHECK(kvf__keymap_find(&m, TKEY(1), NULL) == NULL); /* no buckets yet */
    for (uint32_t i = 0; i < N; i++) {
        objs[i].key = TKEY(i); /* dense small keys, as slot numbers are */
        objs[i].tag = i;
        CHECK(kvf__keymap_insert(&m, &objs[i]));
    }
    CHECK_EQ_U64(m.count, N);
    CHECK(m.nbuckets >= N && (m.nbuckets & (m.nbuckets - 1)) == 0);
    for (uint32_t i = 0; i < N; i++) {
        obj *o = kvf__keymap_find(&m, TKEY(i), NULL);
        CHECK(o == &objs[i]);
        CHECK(kvf__keymap_find(&m, TKEY(i), o) == NULL);
    }
    CHECK(kvf__keymap_find(&m, TKEY(N + 7), NULL) == NULL);
    kvf__keymap_free(&m);
    CHECK(m.count == 0 && m.nbuckets == 0 && kvf__keymap_find(&m, TKEY(3), NULL) == NULL);
    /* usable again after free: the offsets stay */
    CHECK(kvf__keymap_insert(&m, &objs[3]));
    CHECK(kvf__keymap_find(&m, TKEY(3), NULL) == &objs[3]);
    kvf__keymap_free(&m);
    return 0;
}

static int test_repeated_keys_and_remove(void)
{
    kvf__keymap m = fresh(0);
    /* three objects under one key (another namespace's block, say) among others */
    for (uint32_t i = 0; i < 100; i++) {
        objs[i].key = TKEY(0xabcdef0000000000ull + (i % 10 == 0 ? 1 : i));
        objs[i].tag = i;
        CHECK(kvf__keymap_insert(&m, &objs[i]));
    }
    kvf_key k = KEY(0xabcdef0000000001ull); /* objects 0, 1, 10, 20, ..., 90 */
    size_t n = 0;
    for (obj *o = kvf__keymap_find(&m, TKEY(k), NULL); o; o = kvf__keymap_find(&m, TKEY(k), o)) {
        CHECK(kvf_key_eq(o->key, k));
        CHECK(o->seen++ == 0);
        n++;
    }
    CHECK_EQ_U64(n, 11);
    kvf__keymap_remove(&m, &objs[20]);
    CHECK_EQ_U64(m.count, 99);
    n = 0;
    for (obj *o = kvf__keymap_find(&m, TKEY(k), NULL); o; o = kvf__keymap_find(&m, TKEY(k), o)) {
        CHECK(o != &objs[20]);
        n++;
    }
    CHECK_EQ_U64(n, 10);
    for (uint32_t i = 0; i < 100; i++)
        if (i != 20)
            kvf__keymap_remove(&m, &objs[i]);
    CHECK_EQ_U64(m.count, 0);
    CHECK(kvf__keymap_find(&m, TKEY(k), NULL) == NULL);
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
        objs[i].key = TKEY((uint64_t)i * 0x9E3779B97F4A7C15ull);
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

/* The inverse of a 64-bit odd multiplier, mod 2^64 (Newton's iteration:
 * each step doubles the bits that are right). */
static uint64_t inverse(uint64_t c)
{
    uint64_t x = c;
    for (int i = 0; i < 6; i++)
        x *= 2 - c * x;
    return x;
}

/* MurmurHash3's 64-bit finaliser, the unkeyed mix the buckets were picked
 * by, and its inverse: whoever knows it can choose keys for any bucket. */
static uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static uint64_t fmix64_inverse(uint64_t h)
{
    h ^= h >> 33; /* x ^= x >> 33 undoes itself: the shift is over half */
    h *= inverse(0xc4ceb9fe1a85ec53ull);
    h ^= h >> 33;
    h *= inverse(0xff51afd7ed558ccdull);
    h ^= h >> 33;
    return h;
}

/* The longest chain: how many keys one lookup may compare. */
static size_t longest_chain(const kvf__keymap *m)
{
    size_t worst = 0;
    for (size_t b = 0; b < m->nbuckets; b++) {
        size_t len = 0;
        for (obj *o = m->buckets[b]; o; o = o->chain)
            len++;
        if (len > worst)
            worst = len;
    }
    return worst;
}

/* N keys whose unkeyed mix is a multiple of 2^32: one bucket for every
 * table of up to 2^32 buckets. Keyed, they spread as random keys do: N
 * keys in N or more buckets, the longest chain a handful (about 8 for
 * uniform hashing; 24 is beyond any chance) and each lookup quick. */
static int test_chosen_keys(void)
{
    kvf__keymap m = fresh(0);
    for (uint32_t i = 0; i < N; i++) {
        objs[i].key = TKEY(fmix64_inverse((uint64_t)(i + 1) << 32));
        REQUIRE(fmix64(objs[i].key.lo) == (uint64_t)(i + 1) << 32); /* the construction holds */
        CHECK(kvf__keymap_insert(&m, &objs[i]));
    }
    CHECK(m.nbuckets >= N);
    size_t worst = longest_chain(&m);
    printf("%u chosen keys in %zu buckets: longest chain %zu\n", N, m.nbuckets, worst);
    CHECK(worst <= 24);
    uint64_t t0 = kvf__now_ns();
    for (int round = 0; round < 10; round++)
        for (uint32_t i = 0; i < N; i++)
            CHECK(kvf__keymap_find(&m, TKEY(objs[i].key), NULL) == &objs[i]);
    double ns = (double)(kvf__now_ns() - t0) / (10.0 * N);
    printf("lookup of a chosen key: %.0f ns\n", ns);
    /* an unkeyed table walks all N per lookup (N / 2 on average); what a
     * bounded chain costs, even under a sanitizer, is far less */
    CHECK(ns < 2000);
    kvf__keymap_free(&m);
    return 0;
}

/* Both halves of a key are the key: keys equal in one half and different
 * in the other are different objects, whichever half differs. */
static int test_key_halves(void)
{
    kvf__keymap m = fresh(0);
    const kvf_key keys[4] = {{1, 5}, {2, 5}, {1, 6}, {0, 5}};
    for (uint32_t i = 0; i < 4; i++) {
        objs[i].key = keys[i];
        CHECK(kvf__keymap_insert(&m, &objs[i]));
    }
    for (uint32_t i = 0; i < 4; i++) {
        obj *o = kvf__keymap_find(&m, keys[i], NULL);
        CHECK(o == &objs[i]);
        CHECK(kvf__keymap_find(&m, keys[i], o) == NULL);
    }
    CHECK(kvf__keymap_find(&m, (kvf_key){2, 6}, NULL) == NULL);
    CHECK(kvf__keymap_find(&m, (kvf_key){5, 1}, NULL) == NULL);
    kvf__keymap_free(&m);
    return 0;
}

int main(void)
{
    RUN(test_insert_find_grow);
    RUN(test_key_halves);
    RUN(test_repeated_keys_and_remove);
    RUN(test_iterate_and_clear);
    RUN(test_chosen_keys);
    return TEST_RESULT();
}
