/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The registry of stores: one name per store in KVF_STORES, and what the
 * callers above ask of it (which store serves a URL, which are built).
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every store, in the order `kvferry info` lists them: adding one is its
 * folder (defining kvf__<name>_store_kind) and its name here. */
#define KVF_STORES(X) X(file) X(redis) X(s3) X(mem)

#define KVF_STORE_DECLARE(name) KVF_INTERNAL extern const kvf__store_kind kvf__##name##_store_kind;
KVF_STORES(KVF_STORE_DECLARE)
#define KVF_STORE_ENTRY(name) &kvf__##name##_store_kind,
static const kvf__store_kind *const stores[] = {KVF_STORES(KVF_STORE_ENTRY)};
#define NSTORES (sizeof stores / sizeof *stores)

const kvf__store_kind *kvf__store_kind_at(size_t i)
{
    return i < NSTORES ? stores[i] : NULL;
}

const kvf__store_kind *kvf__store_kind_of(const char *url)
{
    const char *sep = url ? strstr(url, "://") : NULL;
    if (!sep)
        return NULL;
    size_t len = (size_t)(sep - url);
    for (size_t i = 0; i < NSTORES; i++)
        for (const char *const *sch = stores[i]->schemes; *sch; sch++)
            if (strlen(*sch) == len && !strncmp(url, *sch, len))
                return stores[i];
    return NULL;
}

void kvf__store_remote_schemes(char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < NSTORES; i++) {
        if (!stores[i]->remote || (stores[i]->built && !stores[i]->built()))
            continue;
        for (const char *const *sch = stores[i]->schemes; *sch && used < cap; sch++) {
            int w = snprintf(out + used, cap - used, "%s%s://", used ? ", " : "", *sch);
            used += w > 0 ? (size_t)w : 0;
        }
    }
}

bool kvf__store_remote_built(void)
{
    for (size_t i = 0; i < NSTORES; i++)
        if (stores[i]->remote && stores[i]->built && !stores[i]->built())
            return false;
    return true;
}

const char *kvf__store_url_from_env(void)
{
    const char *v = getenv(KVF_REMOTE_URL_ENV);
    return v && *v ? v : NULL;
}

static kvf_status no_store(const char *url)
{
    const char *sep = url ? strstr(url, "://") : NULL;
    char schemes[256];
    kvf__store_remote_schemes(schemes, sizeof schemes);
    return kvf__fail(KVF_ERR_INVALID,
                     "URL \"%.*s...\": no store serves this scheme (this build: %s)",
                     sep ? (int)(sep - url) : 0, sep ? url : "", schemes);
}

kvf_status kvf__store_check_url(const char *url)
{
    const kvf__store_kind *k = kvf__store_kind_of(url);
    if (!k)
        return no_store(url);
    if (k->built && !k->built())
        return kvf__fail(KVF_ERR_UNSUPPORTED, "%.*s URLs: this build has no %s store: it needs %s",
                         (int)(strstr(url, "://") + 3 - url), url, k->name, k->missing);
    return k->check_url(url);
}

kvf_status kvf__store_open(const kvf__store_config *cfg, kvf__store **store_p)
{
    if (!cfg || !store_p)
        return kvf__fail(KVF_ERR_INVALID, "store open: NULL argument");
    *store_p = NULL;
    kvf_status st = kvf__store_check_url(cfg->url);
    if (st != KVF_OK)
        return st;
    return kvf__store_kind_of(cfg->url)->open(cfg, store_p);
}

void kvf__store_close(kvf__store *s)
{
    if (s)
        s->ops->close(s);
}

/* exists or remove over an array of keys: one batch call, so a remote store
 * answers them in one round trip under one deadline */
static kvf_status keyed(kvf__store *s, const kvf_key *keys, size_t n, uint64_t deadline_ns,
                        kvf_status *status, bool drop)
{
    if (!s || !keys || !status || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "store %s: NULL argument or no key",
                         drop ? "remove" : "exists");
    size_t bytes;
    kvf__store_block *blk = NULL;
    if (!kvf__mul_overflows(n, sizeof *blk, &bytes))
        blk = malloc(bytes);
    if (!blk)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory for %zu keys", s->where, n);
    for (size_t i = 0; i < n; i++)
        blk[i] = (kvf__store_block){.key = keys[i]};
    kvf_status st =
        drop ? s->ops->remove(s, blk, n, deadline_ns) : s->ops->exists(s, blk, n, deadline_ns);
    for (size_t i = 0; i < n; i++)
        status[i] = blk[i].status;
    free(blk);
    if (st == KVF_OK)
        kvf__clear_error();
    return st;
}

kvf_status kvf__store_exists(kvf__store *s, const kvf_key *keys, size_t n, uint64_t deadline_ns,
                             kvf_status *status)
{
    return keyed(s, keys, n, deadline_ns, status, false);
}

kvf_status kvf__store_remove(kvf__store *s, const kvf_key *keys, size_t n, uint64_t deadline_ns,
                             kvf_status *status)
{
    return keyed(s, keys, n, deadline_ns, status, true);
}

kvf_status kvf__store_list(kvf__store *s, kvf__store_visit_fn visit, void *arg)
{
    if (!s || !visit)
        return kvf__fail(KVF_ERR_INVALID, "store list: NULL argument");
    return s->ops->list(s, visit, arg);
}

kvf_status kvf__store_write(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns,
                            const kvf__store_hooks *h)
{
    if (h && s->ops->write_hooked)
        return s->ops->write_hooked(s, blocks, n, deadline_ns, h);
    kvf_status st = h && h->fill ? h->fill(h->arg, blocks, n) : KVF_OK;
    if (st == KVF_OK)
        return s->ops->write(s, blocks, n, deadline_ns);
    char why[KVF_MOVE_ERROR_MESSAGE];
    snprintf(why, sizeof why, "%s", kvf_last_error());
    for (size_t i = 0; i < n; i++)
        kvf__store_block_fail(&blocks[i], st, "%s " KVF_KEY_FMT ": %s", s->noun,
                              KVF_KEY_ARGS(blocks[i].key), why);
    return kvf__fail(st, "%s", blocks[0].msg);
}

kvf_status kvf__store_read(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns,
                           const kvf__store_hooks *h)
{
    if (h && s->ops->read_hooked)
        return s->ops->read_hooked(s, blocks, n, deadline_ns, h);
    kvf_status st = s->ops->read(s, blocks, n, deadline_ns);
    if (h && h->done) {
        /* the hook's own failures are kvf_last_error() no longer */
        char why[KVF_MOVE_ERROR_MESSAGE];
        snprintf(why, sizeof why, "%s", kvf_last_error());
        h->done(h->arg, blocks, n);
        if (st != KVF_OK)
            kvf__fail(st, "%s", why);
    }
    return st;
}

kvf_status kvf__store_first_failure(const kvf__store_block *blocks, size_t n, bool miss_ok)
{
    for (size_t i = 0; i < n; i++)
        if (blocks[i].status != KVF_OK && !(miss_ok && blocks[i].status == KVF_ERR_NOT_FOUND))
            return kvf__fail(blocks[i].status, "%s", blocks[i].msg);
    kvf__clear_error();
    return KVF_OK;
}

void kvf__store_block_fail(kvf__store_block *b, kvf_status st, const char *fmt, ...)
{
    b->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
}

void kvf__store_name_failures(const kvf__store *s, kvf__store_block *blocks, size_t n,
                              const char *why)
{
    for (size_t i = 0; i < n; i++) {
        kvf__store_block *b = &blocks[i];
        if (b->status == KVF_OK || b->msg[0])
            continue;
        snprintf(b->msg, sizeof b->msg, "%s " KVF_KEY_FMT ": %s%s%s", s->noun, KVF_KEY_ARGS(b->key),
                 kvf_status_str(b->status),
                 why && why[0] ? "; the round trip's first failure: " : "", why ? why : "");
    }
}
