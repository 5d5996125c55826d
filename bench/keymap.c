/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The keyed hash table every index uses (src/core/keymap.c), under keys an
 * adversary chose beside random keys: n keys {0, lo} whose low half's
 * MurmurHash3 finaliser (the unkeyed mix a table could pick buckets by,
 * after folding the halves) is a multiple of 2^32, so that such a table
 * puts them all in one bucket. Prints, for each set,
 * the median over `reps` runs of ns per insert and per lookup, and the
 * longest chain.
 *   build/bench/keymap [n] [reps]
 */
#include "keymap.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct item {
    kvf_key key;
    struct item *chain;
} item;

static uint64_t fmix64_inverse(uint64_t h)
{
    const uint64_t c1 = 0xff51afd7ed558ccdull, c2 = 0xc4ceb9fe1a85ec53ull;
    uint64_t i1 = c1, i2 = c2;
    for (int i = 0; i < 6; i++) { /* inverses mod 2^64, by Newton's iteration */
        i1 *= 2 - c1 * i1;
        i2 *= 2 - c2 * i2;
    }
    h ^= h >> 33;
    h *= i2;
    h ^= h >> 33;
    h *= i1;
    h ^= h >> 33;
    return h;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct result {
    double insert_ns, find_ns;
    size_t chain;
} result;

static result run(item *items, size_t n, int reps)
{
    double *ins = malloc((size_t)reps * sizeof *ins), *fnd = malloc((size_t)reps * sizeof *fnd);
    result r = {0, 0, 0};
    if (!ins || !fnd)
        exit(1);
    for (int rep = 0; rep < reps; rep++) {
        kvf__keymap m = (kvf__keymap)KVF_KEYMAP_INIT(item, key, chain, 0);
        uint64_t t0 = kvf__now_ns();
        for (size_t i = 0; i < n; i++)
            if (!kvf__keymap_insert(&m, &items[i]))
                exit(1);
        uint64_t t1 = kvf__now_ns();
        size_t found = 0;
        for (size_t i = 0; i < n; i++)
            found += kvf__keymap_find(&m, items[i].key, NULL) == &items[i];
        uint64_t t2 = kvf__now_ns();
        if (found != n)
            exit(1);
        ins[rep] = (double)(t1 - t0) / (double)n;
        fnd[rep] = (double)(t2 - t1) / (double)n;
        r.chain = 0;
        for (size_t b = 0; b < m.nbuckets; b++) {
            size_t len = 0;
            for (item *o = m.buckets[b]; o; o = o->chain)
                len++;
            r.chain = len > r.chain ? len : r.chain;
        }
        kvf__keymap_free(&m);
    }
    qsort(ins, (size_t)reps, sizeof *ins, by_value);
    qsort(fnd, (size_t)reps, sizeof *fnd, by_value);
    r.insert_ns = ins[reps / 2];
    r.find_ns = fnd[reps / 2];
    free(ins);
    free(fnd);
    return r;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000;
    int reps = argc > 2 ? atoi(argv[2]) : 21;
    if (n < 1)
        n = 1;
    if (reps < 1)
        reps = 1;
    item *random = calloc(n, sizeof *random), *chosen = calloc(n, sizeof *chosen);
    if (!random || !chosen)
        return 1;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; /* xorshift64 */
        x ^= x >> 7;
        x ^= x << 17;
        random[i].key.hi = x * 0x9E3779B97F4A7C15ull;
        random[i].key.lo = x;
        chosen[i].key = (kvf_key){0, fmix64_inverse((uint64_t)(i + 1) << 32)};
    }
    result r = run(random, n, reps), c = run(chosen, n, reps);
    printf("keys     n        insert ns  lookup ns  longest chain  (median of %d runs)\n", reps);
    printf("random   %-8zu %9.1f %10.1f %14zu\n", n, r.insert_ns, r.find_ns, r.chain);
    printf("chosen   %-8zu %9.1f %10.1f %14zu\n", n, c.insert_ns, c.find_ns, c.chain);
    free(random);
    free(chosen);
    return 0;
}
