/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis store: the remote tier's client (redis.h) behind the store
 * ops. One round trip per node for a whole batch; the client names only
 * the first failed block, so every failed block's message quotes it.
 */
#include "blockhdr.h"
#include "redis.h"
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct redis_store {
    kvf__store base;
    kvf__redis *remote;
    uint64_t fingerprint, ns_hash; /* what a value's header is to say */
} redis_store;

static bool redis_built(void)
{
    return kvf__redis_built() != 0;
}

static kvf_status redis_check_url(const char *url)
{
    kvf__redis_url parsed;
    kvf_status st = kvf__redis_url_parse(url, &parsed);
    /* at create: a TLS setting that cannot work is said now, not at the
     * first connection */
    if (st == KVF_OK)
        st = kvf__redis_tls_check(&parsed);
    memset(&parsed, 0, sizeof parsed); /* the password */
    return st;
}

/* statuses as the client left them, messages for the failed ones */
static kvf_status finish(redis_store *s, kvf__store_block *blocks, size_t n, const kvf_status *st,
                         kvf_status ret)
{
    char why[KVF_MOVE_ERROR_MESSAGE] = "";
    if (ret != KVF_OK)
        snprintf(why, sizeof why, "%s", kvf_last_error());
    for (size_t i = 0; i < n; i++) {
        blocks[i].status = st[i];
        blocks[i].msg[0] = '\0';
    }
    kvf__store_name_failures(&s->base, blocks, n, why);
    if (ret != KVF_OK)
        kvf__fail(ret, "%s", why);
    return ret;
}

/* One call's arrays: statuses, and the client's view of the blocks
 * (zeroed: calloc also checks n * size for overflow). */
static void *arrays(size_t n, size_t each, kvf_status **st_p)
{
    void *p = calloc(n, each + sizeof(kvf_status));
    *st_p = p ? (kvf_status *)((char *)p + n * each) : NULL;
    return p;
}

static kvf_status out_of_memory(redis_store *s, kvf__store_block *blocks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvf__store_block_fail(&blocks[i], KVF_ERR_NOMEM,
                              "remote block " KVF_KEY_FMT ": out of memory",
                              KVF_KEY_ARGS(blocks[i].key));
    return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", s->base.where);
}

/* Whether block b's pools split its payload, as the stored prefix needs
 * (the client builds it when it sends): else b fails here, alone. */
static bool pools_sound(kvf__store_block *b)
{
    static _Thread_local uint8_t scratch[KVF_BLOCK_PREFIX_MAX];
    kvf__block_header h = {.pools = b->pools, .payload_bytes = b->payload_bytes};
    char what[KVF_KEY_STR_BYTES + 16];
    snprintf(what, sizeof what, "remote block " KVF_KEY_FMT, KVF_KEY_ARGS(b->key));
    kvf_status st = kvf__block_prefix_begin(&h, b->pool_bytes, what, scratch);
    if (st != KVF_OK)
        kvf__store_block_fail(b, st, "%s", kvf_last_error());
    return st == KVF_OK;
}

static kvf_status redis_write(kvf__store *base, kvf__store_block *blocks, size_t n,
                              uint64_t deadline_ns)
{
    redis_store *s = (redis_store *)base;
    kvf_status *st;
    kvf__redis_put *puts = arrays(n, sizeof *puts, &st);
    size_t *at = puts ? malloc(n * sizeof *at) : NULL;
    if (!at) {
        free(puts);
        return out_of_memory(s, blocks, n);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (pools_sound(&blocks[i])) {
            at[k] = i;
            puts[k++] =
                (kvf__redis_put){blocks[i].key, blocks[i].tokens,        blocks[i].pools,
                                 blocks[i].buf, blocks[i].payload_bytes, blocks[i].pool_bytes};
        }
    kvf_status ret = k ? kvf__redis_put_batch_until(s->remote, puts, k, deadline_ns, st) : KVF_OK;
    /* the blocks sent take their statuses; those refused keep theirs */
    kvf__store_block *sent = k ? malloc(k * sizeof *sent) : NULL;
    if (k && !sent) {
        free(at);
        free(puts);
        return out_of_memory(s, blocks, n);
    }
    for (size_t j = 0; j < k; j++)
        sent[j] = blocks[at[j]];
    if (k)
        ret = finish(s, sent, k, st, ret);
    for (size_t j = 0; j < k; j++)
        blocks[at[j]] = sent[j];
    free(sent);
    free(at);
    free(puts);
    return ret != KVF_OK ? ret : kvf__store_first_failure(blocks, n, false);
}

static kvf_status redis_read(kvf__store *base, kvf__store_block *blocks, size_t n,
                             uint64_t deadline_ns)
{
    redis_store *s = (redis_store *)base;
    kvf_status *st;
    kvf__redis_get *gets = arrays(n, sizeof *gets, &st);
    if (!gets)
        return out_of_memory(s, blocks, n);
    for (size_t i = 0; i < n; i++)
        gets[i] = (kvf__redis_get){blocks[i].key, blocks[i].buf, blocks[i].cap, 0, 0, 0};
    kvf_status ret = kvf__redis_get_batch_until(s->remote, gets, n, deadline_ns, st);
    for (size_t i = 0; i < n; i++)
        if (st[i] == KVF_OK) {
            blocks[i].tokens = gets[i].tokens;
            blocks[i].pools = gets[i].pools;
            blocks[i].payload_bytes = gets[i].payload_bytes;
        }
    ret = finish(s, blocks, n, st, ret);
    free(gets);
    return ret;
}

/* Ranged reads (kvf__store_read_groups): one pipelined GETRANGE per
 * block, a round trip per node for the call's blocks, through the client
 * every other call takes (cluster redirections, TLS, retries alike). */
static void redis_ranges(kvf__store *base, kvf__store_range *r, size_t n, uint64_t deadline_ns)
{
    redis_store *s = (redis_store *)base;
    kvf_status *st;
    kvf__redis_range *rr = arrays(n, sizeof *rr, &st);
    if (!rr) {
        kvf__store_ranges_nomem(base, r, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        rr[i] = (kvf__redis_range){r[i].block->key, r[i].off, r[i].len, r[i].dst, 0};
    kvf_status ret = kvf__redis_range_batch_until(s->remote, rr, n, deadline_ns, st);
    char why[KVF_MOVE_ERROR_MESSAGE] = "";
    if (ret != KVF_OK)
        snprintf(why, sizeof why, "%s", kvf_last_error());
    for (size_t i = 0; i < n; i++) {
        kvf__store_block *b = r[i].block;
        r[i].got = rr[i].got;
        if (st[i] == KVF_OK || st[i] == KVF_ERR_NOT_FOUND) {
            b->status = st[i];
            continue;
        }
        /* the client names the call's first failure only */
        b->status = st[i];
        b->msg[0] = '\0';
        kvf__store_name_failures(base, b, 1, why);
    }
    free(rr);
}

static kvf_status redis_read_hooked(kvf__store *base, kvf__store_block *blocks, size_t n,
                                    uint64_t deadline_ns, const kvf__store_hooks *h)
{
    redis_store *s = (redis_store *)base;
    return kvf__store_read_groups(base, blocks, n, deadline_ns, h, redis_ranges, s->fingerprint,
                                  s->ns_hash);
}

static kvf_status keyed(kvf__store *base, kvf__store_block *blocks, size_t n, uint64_t deadline_ns,
                        bool drop)
{
    redis_store *s = (redis_store *)base;
    kvf_status *st;
    kvf_key *keys = arrays(n, sizeof *keys, &st);
    if (!keys)
        return out_of_memory(s, blocks, n);
    for (size_t i = 0; i < n; i++)
        keys[i] = blocks[i].key;
    kvf_status ret = drop ? kvf__redis_delete_batch_until(s->remote, keys, n, deadline_ns, st)
                          : kvf__redis_exists_batch_until(s->remote, keys, n, deadline_ns, st);
    ret = finish(s, blocks, n, st, ret);
    free(keys);
    return ret;
}

static kvf_status redis_remove(kvf__store *s, kvf__store_block *blocks, size_t n,
                               uint64_t deadline_ns)
{
    return keyed(s, blocks, n, deadline_ns, true);
}

static kvf_status redis_exists(kvf__store *s, kvf__store_block *blocks, size_t n,
                               uint64_t deadline_ns)
{
    return keyed(s, blocks, n, deadline_ns, false);
}

/* SCAN, never KEYS (redis_scan.c). A cache restores from files only: a
 * shared Redis may hold millions of other processes' blocks, found by
 * exists when asked for; listing is for the callers that ask. */
static kvf_status redis_list(kvf__store *base, kvf__store_visit_fn visit, void *arg)
{
    return kvf__redis_list(((redis_store *)base)->remote, visit, arg);
}

static void redis_close(kvf__store *base)
{
    redis_store *s = (redis_store *)base;
    kvf__redis_close(s->remote);
    free(base->where);
    free(s);
}

static const kvf__store_ops redis_ops = {
    .write = redis_write,
    .read = redis_read,
    .remove = redis_remove,
    .exists = redis_exists,
    .list = redis_list,
    .read_hooked = redis_read_hooked,
    .close = redis_close,
};

static kvf_status redis_open(const kvf__store_config *cfg, kvf__store **store_p)
{
    kvf__redis_config rc = KVF_REDIS_CONFIG_INIT;
    rc.url = cfg->url;
    rc.ns = cfg->ns;
    rc.fingerprint = cfg->fingerprint;
    rc.ttl_s = cfg->ttl_s;
    if (cfg->timeout_ms)
        rc.connect_timeout_ms = rc.timeout_ms = cfg->timeout_ms;
    redis_store *s = calloc(1, sizeof *s);
    char shown[512];
    kvf__url_redact(cfg->url, shown, sizeof shown);
    if (s)
        s->base.where = strdup(shown);
    if (!s || !s->base.where) {
        free(s);
        return kvf__fail(KVF_ERR_NOMEM, "remote tier: out of memory");
    }
    kvf_status st = kvf__redis_open(&rc, &s->remote);
    if (st != KVF_OK) {
        free(s->base.where);
        free(s);
        return st;
    }
    s->fingerprint = cfg->fingerprint;
    s->ns_hash = kvf__ns_hash(cfg->ns);
    s->base.ops = &redis_ops;
    s->base.kind = "redis";
    s->base.noun = "remote block";
    *store_p = &s->base;
    return KVF_OK;
}

static const char *const redis_schemes[] = {"redis", "redis-cluster", "rediss", "rediss-cluster",
                                            NULL};

const kvf__store_kind kvf__redis_store_kind = {
    .name = "redis",
    .schemes = redis_schemes,
    .remote = true,
    .built = redis_built,
    .missing = "the Redis client hiredis at build time (libhiredis-dev, or "
               "scripts/install-deps.sh)",
    .describe = kvf__redis_describe,
    .check_url = redis_check_url,
    .open = redis_open,
    .probe = kvf__redis_probe,
    /* a group is one pipelined GETRANGE per block, a round trip per node:
     * on loopback (bench/results/remote_groups.txt) 256 KiB groups (8 for
     * a Llama-3-8B block of 2 MiB) hand the first pool over at 0.19-0.22
     * of the whole read and end within 0.93-1.06x of it; a group per 64
     * KiB pool ends 1.10-1.23x later, 512 KiB groups hold the first pool
     * back to 0.33 */
    .group_bytes = (size_t)256 << 10,
};
