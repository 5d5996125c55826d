/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier tests' fixture: one real redis-server
 * (tests/redis_server.h) and the remote tier opened on it, blocks of random
 * data put and got in batches. Shared by the test_remote_* programs; one
 * program per translation unit (the helpers keep static state).
 */
#ifndef KVF_REMOTE_FIXTURE_H
#define KVF_REMOTE_FIXTURE_H

#include "redis.h"
#include "testutil.h"
#ifdef KVF_HAVE_HIREDIS
#include "blockhdr.h"
#include "redis_server.h"
#include <pthread.h>
#include <sys/resource.h>
#endif
#define FP 0x1234abcd5678ef01ull

#ifdef KVF_HAVE_HIREDIS

static redis_server server;

static inline kvf__redis *open_remote(const char *url, const char *ns, uint64_t fp, uint32_t ttl)
{
    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    cfg.url = url;
    cfg.ns = ns;
    cfg.fingerprint = fp;
    cfg.ttl_s = ttl;
    cfg.timeout_ms = 5000;
    kvf__redis *r = NULL;
    kvf_status st = kvf__redis_open(&cfg, &r);
    if (st != KVF_OK)
        fprintf(stderr, "open %s: %s\n", url, kvf_last_error());
    return r;
}

static inline kvf__redis *open_default(const char *ns, uint64_t fp)
{
    char url[128];
    redis_url(url, sizeof url, &server, NULL);
    return open_remote(url, ns, fp, 0);
}

/* Stores n blocks of `bytes` under keys base.. with seeds base..; 0 or -1. */
static inline int put_blocks(kvf__redis *r, uint64_t base, size_t n, size_t bytes, uint8_t **bufs)
{
    kvf__redis_put *p = calloc(n, sizeof *p);
    kvf_status *st = calloc(n, sizeof *st);
    for (size_t i = 0; i < n; i++) {
        bufs[i] = malloc(bytes ? bytes : 1);
        test_fill_random(bufs[i], bytes, base + i);
        p[i] = (kvf__redis_put){KEY(base + i), (uint32_t)(i % 32 + 1), 2, bufs[i], bytes};
    }
    kvf_status rc = kvf__redis_put_batch(r, p, n, st);
    CHECK_STATUS(rc, KVF_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_STATUS(st[i], KVF_OK);
    free(p);
    free(st);
    return rc == KVF_OK ? 0 : -1;
}

/* Gets blocks base..base+n into fresh buffers; statuses in st. */
static inline void get_blocks(kvf__redis *r, uint64_t base, size_t n, size_t cap, kvf__redis_get *g,
                              kvf_status *st)
{
    for (size_t i = 0; i < n; i++)
        g[i] = (kvf__redis_get){.key = KEY(base + i), .dst = malloc(cap ? cap : 1), .cap = cap};
    kvf__redis_get_batch(r, g, n, st);
}

static inline void free_gets(kvf__redis_get *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(g[i].dst);
}

#endif /* KVF_HAVE_HIREDIS */

#endif /* KVF_REMOTE_FIXTURE_H */
