/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis store's listing checked on many blocks, more than one SCAN
 * page holds (redis_scan.c asks for 1000 keys a call): header-only, for the
 * single-server and the cluster tests.
 */
#ifndef KVF_TEST_REDIS_LIST_CHECK_H
#define KVF_TEST_REDIS_LIST_CHECK_H

#include "redis.h"
#include "testutil.h"

typedef struct list_seen {
    uint64_t base;
    size_t n;
    uint8_t *count; /* visits of key base + i */
    size_t strangers;
    bool ordered;
    uint64_t last;
} list_seen;

static inline void list_seen_visit(void *arg, const kvf__store_entry *e)
{
    list_seen *l = arg;
    if (e->key.hi != 0 || e->key.lo < l->base || e->key.lo - l->base >= l->n) {
        l->strangers++;
        return;
    }
    size_t i = (size_t)(e->key.lo - l->base);
    if (l->count[i] < 255)
        l->count[i]++;
    CHECK(e->payload_bytes == 16 + i % 7 && e->tokens == (uint32_t)(i % 32 + 1) && e->pools == 2);
    if (l->last && e->key.lo <= l->last)
        l->ordered = false;
    l->last = e->key.lo;
}

/* Stores n small blocks under keys base.. through r, lists r's namespace,
 * and checks each was visited once, with its header's fields, and nothing
 * else was. */
static inline void redis_check_list_many(kvf__redis *r, uint64_t base, size_t n)
{
    enum { BATCH = 500 };
    kvf__redis_put p[BATCH];
    kvf_status st[BATCH];
    uint8_t payload[32];
    test_fill_random(payload, sizeof payload, base);
    for (size_t first = 0; first < n; first += BATCH) {
        size_t m = n - first < BATCH ? n - first : BATCH;
        for (size_t i = 0; i < m; i++)
            p[i] = (kvf__redis_put){KEY(base + first + i), (uint32_t)((first + i) % 32 + 1), 2,
                                    payload, 16 + (first + i) % 7};
        REQUIRE(kvf__redis_put_batch(r, p, m, st) == KVF_OK);
    }
    list_seen l = {.base = base, .n = n, .count = calloc(n, 1), .ordered = true};
    REQUIRE(l.count);
    CHECK_STATUS(kvf__redis_list(r, list_seen_visit, &l), KVF_OK);
    size_t once = 0;
    for (size_t i = 0; i < n; i++)
        once += l.count[i] == 1;
    if (once != n || l.strangers)
        fprintf(stderr, "list: %zu of %zu blocks visited once, %zu others\n", once, n, l.strangers);
    CHECK(once == n);
    CHECK(l.strangers == 0);
    CHECK(l.ordered);
    free(l.count);
}

#endif /* KVF_TEST_REDIS_LIST_CHECK_H */
