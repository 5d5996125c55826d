/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 store: blocks as objects PREFIX/NAMESPACE/<key, 32 hex digits>.kvf
 * in the stored form of blockhdr.h, moved by s3_http.h's batches: every
 * block of a call in flight together over the URL's connections, each
 * block's failure its own.
 */
#include "blockhdr.h"
#include "checksum.h"
#include "log.h"
#include "s3_http.h"
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR KVF_BLOCK_HEADER_BYTES
#define PREFIX_MAX KVF_BLOCK_PREFIX_MAX
#define DEFAULT_TIMEOUT_MS 2000u
/* A call without a deadline allows its bytes at this rate on top of the
 * timeout, the engine's rule for a remote batch: only a stalled or
 * trickling server reaches it. */
#define FLOOR_BYTES_PER_S ((uint64_t)256 << 20)
#define LIST_PAGE_BYTES ((size_t)4 << 20)
#define LIST_HEADERS_AT_ONCE 256u

typedef struct s3_store {
    kvf__store base;
    kvf__s3_client *client;
    char dir[600]; /* "PREFIX/NS/" or "NS/" */
    uint64_t ns_hash, fingerprint;
    uint32_t timeout_ms;
} s3_store;

static bool s3_built(void)
{
    return true;
}

/* The URL and where its keys come from, without a request: what an
 * engine refuses at create. */
static kvf_status s3_check_url(const char *url)
{
    kvf__s3_url u;
    char shown[640];
    kvf__url_redact(url, shown, sizeof shown);
    kvf_status st = kvf__s3_url_parse(url, &u);
    if (st == KVF_OK)
        st = kvf__s3_creds_resolve(&u, shown);
    kvf__s3_url_wipe(&u);
    return st;
}

static uint64_t deadline(const s3_store *s, uint64_t bytes, uint64_t deadline_ns)
{
    if (deadline_ns)
        return deadline_ns;
    return kvf__now_ns() + (uint64_t)s->timeout_ms * 1000000u +
           bytes / FLOOR_BYTES_PER_S * 1000000000u +
           bytes % FLOOR_BYTES_PER_S * 1000000000u / FLOOR_BYTES_PER_S;
}

static void object_of(const s3_store *s, kvf_key key, char *out, size_t cap)
{
    snprintf(out, cap, "%s" KVF_KEY_FMT ".kvf", s->dir, KVF_KEY_ARGS(key));
}

static const char *method_name(kvf__s3_method m)
{
    return m == KVF_S3_PUT ? "PUT" : m == KVF_S3_GET ? "GET" : m == KVF_S3_HEAD ? "HEAD" : "DELETE";
}

/* Block b's answer from its request: the status, and for a failure a
 * message naming the block, the URL, the object and why. */
static void answer(const s3_store *s, kvf__store_block *b, const kvf__s3_req *r)
{
    b->msg[0] = '\0';
    b->status = r->status;
    if (r->status != KVF_OK && r->status != KVF_ERR_NOT_FOUND)
        kvf__store_block_fail(b, r->status, "remote block " KVF_KEY_FMT ": %s: %s %s: %s",
                              KVF_KEY_ARGS(b->key), s->base.where, method_name(r->method),
                              r->object, r->why);
}

static kvf_status out_of_memory(const s3_store *s, kvf__store_block *blocks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvf__store_block_fail(&blocks[i], KVF_ERR_NOMEM,
                              "remote block " KVF_KEY_FMT ": %s: out of memory",
                              KVF_KEY_ARGS(blocks[i].key), s->base.where);
    return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", s->base.where);
}

static kvf_status s3_write(kvf__store *base, kvf__store_block *blocks, size_t n,
                           uint64_t deadline_ns)
{
    s3_store *s = (s3_store *)base;
    kvf__s3_req *reqs = calloc(n, sizeof *reqs);
    uint8_t *heads = reqs ? malloc(n * PREFIX_MAX) : NULL;
    if (!heads) {
        free(reqs);
        return out_of_memory(s, blocks, n);
    }
    uint64_t bytes = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        kvf__store_block *b = &blocks[i];
        char what[KVF_KEY_STR_BYTES + 320];
        snprintf(what, sizeof what, "remote block " KVF_KEY_FMT ": %s", KVF_KEY_ARGS(b->key),
                 s->base.where);
        kvf__block_header h = {s->fingerprint, s->ns_hash,       b->key, b->tokens,
                               b->pools,       b->payload_bytes, 0};
        uint8_t *head = heads + i * PREFIX_MAX;
        kvf_status st = b->pools > KVF_BLOCK_POOLS_MAX
                            ? kvf__fail(KVF_ERR_RANGE, "%s: %u pools, at most %u", what, b->pools,
                                        KVF_BLOCK_POOLS_MAX)
                            : kvf__block_prefix_make(&h, b->pool_bytes, b->buf, what, head);
        if (st != KVF_OK) {
            /* refused before a byte is sent: the call's others go on */
            kvf__store_block_fail(b, st, "%s", kvf_last_error());
            continue;
        }
        b->status = KVF_INPROGRESS;
        reqs[k].method = KVF_S3_PUT;
        object_of(s, b->key, reqs[k].object, sizeof reqs[k].object);
        reqs[k].head = head;
        reqs[k].head_len = kvf__block_prefix_bytes(b->pools);
        reqs[k].body = b->buf;
        reqs[k].body_len = b->payload_bytes;
        bytes += reqs[k].head_len + b->payload_bytes;
        k++;
    }
    if (k)
        kvf__s3_run(s->client, reqs, k, deadline(s, bytes, deadline_ns));
    for (size_t i = 0, j = 0; i < n; i++)
        if (blocks[i].status == KVF_INPROGRESS)
            answer(s, &blocks[i], &reqs[j++]);
    free(heads);
    free(reqs);
    return kvf__store_first_failure(blocks, n, false);
}

static kvf_status s3_read(kvf__store *base, kvf__store_block *blocks, size_t n,
                          uint64_t deadline_ns)
{
    s3_store *s = (s3_store *)base;
    kvf__s3_req *reqs = calloc(n, sizeof *reqs);
    uint64_t bytes = 0;
    bool ok = reqs != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        kvf__store_block *b = &blocks[i];
        reqs[i].method = KVF_S3_GET;
        object_of(s, b->key, reqs[i].object, sizeof reqs[i].object);
        /* the whole value, or the largest prefix and cap payload bytes: a
         * longer one is refused, never read on */
        reqs[i].cap = PREFIX_MAX + b->cap;
        ok = reqs[i].cap > b->cap && (reqs[i].dst = malloc(reqs[i].cap)) != NULL;
        bytes += reqs[i].cap;
    }
    if (!ok) {
        for (size_t i = 0; reqs && i < n; i++)
            free(reqs[i].dst);
        free(reqs);
        return out_of_memory(s, blocks, n);
    }
    kvf__s3_run(s->client, reqs, n, deadline(s, bytes, deadline_ns));
    for (size_t i = 0; i < n; i++) {
        kvf__store_block *b = &blocks[i];
        answer(s, b, &reqs[i]);
        if (b->status == KVF_OK) {
            char what[700];
            snprintf(what, sizeof what, "remote block " KVF_KEY_FMT ": %s: %s",
                     KVF_KEY_ARGS(b->key), s->base.where, reqs[i].object);
            kvf__block_header h;
            b->status = kvf__block_value_take(reqs[i].dst, reqs[i].got, what, s->fingerprint,
                                              s->ns_hash, b->key, b->buf, b->cap, &h);
            if (b->status != KVF_OK)
                snprintf(b->msg, sizeof b->msg, "%s", kvf_last_error());
            else {
                b->tokens = h.tokens;
                b->pools = h.pools;
                b->payload_bytes = h.payload_bytes;
            }
        }
        free(reqs[i].dst);
    }
    free(reqs);
    return kvf__store_first_failure(blocks, n, true);
}

/* Ranged reads (kvf__store_read_groups): a GET with `Range: bytes=a-b`
 * per block, in flight together. 206 brings the range; a server that
 * answers 200 with the whole object is read to the range's end and the
 * rest dropped (s3_http.c); a range past the object's end (416) or cut
 * short reads as fewer bytes, which the caller refuses naming the object. */
static void s3_ranges(kvf__store *base, kvf__store_range *r, size_t n, uint64_t deadline_ns)
{
    s3_store *s = (s3_store *)base;
    kvf__s3_req *reqs = calloc(n, sizeof *reqs);
    if (!reqs) {
        kvf__store_ranges_nomem(base, r, n);
        return;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        reqs[i].method = KVF_S3_GET;
        object_of(s, r[i].block->key, reqs[i].object, sizeof reqs[i].object);
        reqs[i].dst = r[i].dst;
        reqs[i].cap = reqs[i].range = r[i].len;
        reqs[i].range_off = r[i].off;
        bytes += r[i].len;
    }
    kvf__s3_run(s->client, reqs, n, deadline(s, bytes, deadline_ns));
    for (size_t i = 0; i < n; i++) {
        snprintf(r[i].about, sizeof r[i].about, "object %.*s", (int)sizeof r[i].about - 8,
                 reqs[i].object);
        r[i].got = reqs[i].status == KVF_OK ? reqs[i].got : 0;
        if (reqs[i].status != KVF_OK && reqs[i].status != KVF_ERR_NOT_FOUND)
            kvf__store_block_fail(r[i].block, reqs[i].status,
                                  "remote block " KVF_KEY_FMT ": %s: GET %s bytes=%llu-%llu: %s",
                                  KVF_KEY_ARGS(r[i].block->key), base->where, reqs[i].object,
                                  (unsigned long long)r[i].off,
                                  (unsigned long long)(r[i].off + r[i].len - 1), reqs[i].why);
        else if (reqs[i].status == KVF_ERR_NOT_FOUND)
            r[i].block->status = KVF_ERR_NOT_FOUND;
    }
    free(reqs);
}

static kvf_status s3_read_hooked(kvf__store *base, kvf__store_block *blocks, size_t n,
                                 uint64_t deadline_ns, const kvf__store_hooks *h)
{
    s3_store *s = (s3_store *)base;
    return kvf__store_read_groups(base, blocks, n, deadline_ns, h, s3_ranges, s->fingerprint,
                                  s->ns_hash);
}

/* remove (DELETE) or exists (HEAD) of every block */
static kvf_status keyed(kvf__store *base, kvf__store_block *blocks, size_t n, uint64_t deadline_ns,
                        kvf__s3_method m)
{
    s3_store *s = (s3_store *)base;
    kvf__s3_req *reqs = calloc(n, sizeof *reqs);
    if (!reqs)
        return out_of_memory(s, blocks, n);
    for (size_t i = 0; i < n; i++) {
        reqs[i].method = m;
        object_of(s, blocks[i].key, reqs[i].object, sizeof reqs[i].object);
    }
    kvf__s3_run(s->client, reqs, n, deadline(s, 0, deadline_ns));
    for (size_t i = 0; i < n; i++)
        answer(s, &blocks[i], &reqs[i]);
    free(reqs);
    return kvf__store_first_failure(blocks, n, m == KVF_S3_HEAD);
}

static kvf_status s3_remove(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns)
{
    return keyed(s, blocks, n, deadline_ns, KVF_S3_DELETE);
}

static kvf_status s3_exists(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns)
{
    return keyed(s, blocks, n, deadline_ns, KVF_S3_HEAD);
}

/* %-escapes s for a SigV4 query value (everything but A-Za-z0-9-._~). */
static void escape(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    for (; *s && o + 4 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '.' || c == '_' || c == '~')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "%%%02X", c);
    }
    out[o] = '\0';
}

/* One ListObjectsV2 page under the store's directory, starting at
 * `token` ("": the first); max_keys 0: the server's page. */
static kvf_status list_page(s3_store *s, const char *token, uint32_t max_keys, char *page,
                            kvf__s3_req *r)
{
    char prefix[700], tok[3200];
    escape(s->dir, prefix, sizeof prefix);
    escape(token, tok, sizeof tok);
    size_t qcap = strlen(prefix) + strlen(tok) + 96;
    char *query = malloc(qcap);
    if (!query)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", s->base.where);
    /* sorted by name, as SigV4 signs them */
    char max[32] = "";
    if (max_keys)
        snprintf(max, sizeof max, "&max-keys=%u", max_keys);
    snprintf(query, qcap, "%s%s%slist-type=2%s&prefix=%s", token[0] ? "continuation-token=" : "",
             tok, token[0] ? "&" : "", max, prefix);
    memset(r, 0, sizeof *r);
    r->method = KVF_S3_GET;
    r->query = query;
    r->dst = page;
    r->cap = LIST_PAGE_BYTES;
    kvf__s3_run(s->client, r, 1, deadline(s, LIST_PAGE_BYTES, 0));
    free(query);
    if (r->status == KVF_OK && r->overflow)
        return kvf__fail(KVF_ERR_REMOTE, "%s: list: a page larger than %zu bytes", s->base.where,
                         LIST_PAGE_BYTES);
    if (r->status != KVF_OK)
        return kvf__fail(r->status == KVF_ERR_NOT_FOUND ? KVF_ERR_REMOTE : r->status,
                         "%s: list: %s", s->base.where,
                         r->status == KVF_ERR_NOT_FOUND ? "no such bucket" : r->why);
    return KVF_OK;
}

typedef struct listed {
    s3_store *s;
    kvf__store_entry *ents;
    size_t n, cap;
    size_t old_format; /* NS/<16 hex>.kvf: blocks of format version 1 */
    bool nomem;
} listed;

/* A listed object that may be a block: NS/<32 hex>.kvf, at least a header */
static void on_object(void *arg, const char *name, uint64_t size, int64_t mtime_ns)
{
    listed *l = arg;
    size_t dlen = strlen(l->s->dir);
    const char *rest = name + dlen;
    kvf_key key;
    uint64_t old;
    if (strncmp(name, l->s->dir, dlen) == 0 && strlen(rest) == 20 &&
        strcmp(rest + 16, ".kvf") == 0 && kvf__hex_u64(rest, 16, false, &old))
        l->old_format++;
    if (strncmp(name, l->s->dir, dlen) != 0 || strlen(rest) != 36 || strcmp(rest + 32, ".kvf") ||
        !kvf__key_from_name(rest, &key) || size < HDR)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        kvf__store_entry *e = realloc(l->ents, cap * sizeof *e);
        if (!e) {
            l->nomem = true;
            return;
        }
        l->ents = e;
        l->cap = cap;
    }
    /* payload_bytes holds the object's size until its header is read */
    l->ents[l->n++] = (kvf__store_entry){key, 0, 0, size, mtime_ns};
}

/* Reads the headers of ents[0..n) (ranged GETs, in flight together) and
 * visits those that check and match their object's size. */
static kvf_status visit_checked(s3_store *s, kvf__store_entry *ents, size_t n,
                                kvf__store_visit_fn visit, void *arg)
{
    kvf__s3_req *reqs = calloc(n, sizeof *reqs);
    uint8_t *heads = reqs ? malloc(n * HDR) : NULL;
    if (!heads) {
        free(reqs);
        return kvf__fail(KVF_ERR_NOMEM, "%s: list: out of memory", s->base.where);
    }
    for (size_t i = 0; i < n; i++) {
        reqs[i].method = KVF_S3_GET;
        object_of(s, ents[i].key, reqs[i].object, sizeof reqs[i].object);
        reqs[i].dst = heads + i * HDR;
        reqs[i].cap = reqs[i].range = HDR;
    }
    kvf__s3_run(s->client, reqs, n, deadline(s, n * HDR, 0));
    kvf_status ret = KVF_OK;
    for (size_t i = 0; i < n; i++) {
        kvf__block_header h;
        if (reqs[i].status != KVF_OK) {
            if (reqs[i].status != KVF_ERR_NOT_FOUND && ret == KVF_OK) /* removed since */
                ret = kvf__fail(reqs[i].status, "%s: list: %s: %s", s->base.where, reqs[i].object,
                                reqs[i].why);
            continue;
        }
        if (reqs[i].got != HDR || kvf__block_header_parse(heads + i * HDR, "s3", &h) != KVF_OK ||
            kvf__block_header_expect(&h, "s3", s->fingerprint, s->ns_hash, ents[i].key) != KVF_OK ||
            h.payload_bytes + kvf__block_prefix_bytes(h.pools) != ents[i].payload_bytes)
            continue;
        ents[i].payload_bytes = h.payload_bytes;
        ents[i].tokens = h.tokens;
        ents[i].pools = h.pools;
        visit(arg, &ents[i]);
    }
    free(heads);
    free(reqs);
    return ret;
}

static kvf_status s3_list(kvf__store *base, kvf__store_visit_fn visit, void *arg)
{
    s3_store *s = (s3_store *)base;
    char *page = malloc(LIST_PAGE_BYTES);
    kvf__s3_req *r = malloc(sizeof *r);
    char token[1100] = "";
    listed l = {.s = s};
    kvf_status st =
        page && r ? KVF_OK : kvf__fail(KVF_ERR_NOMEM, "%s: list: out of memory", base->where);
    do {
        if (st == KVF_OK)
            st = list_page(s, token, 0, page, r);
        if (st == KVF_OK)
            st = kvf__s3_xml_list(page, r->got, on_object, &l, token, sizeof token);
        if (st == KVF_OK && l.nomem)
            st = kvf__fail(KVF_ERR_NOMEM, "%s: list: out of memory", base->where);
        /* the headers of this page's blocks, a bounded number at a time */
        for (size_t i = 0; st == KVF_OK && i < l.n; i += LIST_HEADERS_AT_ONCE)
            st = visit_checked(s, l.ents + i,
                               l.n - i < LIST_HEADERS_AT_ONCE ? l.n - i : LIST_HEADERS_AT_ONCE,
                               visit, arg);
        l.n = 0;
    } while (st == KVF_OK && token[0]);
    free(l.ents);
    free(r);
    free(page);
    if (l.old_format)
        KVF_LOG(KVF_LOG_WARN,
                "%s: %zu block%s of " KVF_BLOCK_V1_WORDS
                " (<16 hex digits>.kvf) not served: they are stored again on their next offload",
                base->where, l.old_format, l.old_format == 1 ? "" : "s");
    if (st == KVF_OK)
        kvf__clear_error();
    return st;
}

static void s3_close(kvf__store *base)
{
    s3_store *s = (s3_store *)base;
    kvf__s3_client_free(s->client);
    free(base->where);
    free(s);
}

static const kvf__store_ops s3_ops = {
    .write = s3_write,
    .read = s3_read,
    .remove = s3_remove,
    .exists = s3_exists,
    .list = s3_list,
    .read_hooked = s3_read_hooked,
    .close = s3_close,
};

/* One listing of at most one object: the bucket is there and the keys
 * are taken, or the error says which is not. */
static kvf_status reach(s3_store *s, const char *shown, uint64_t *took_ns)
{
    char *page = malloc(LIST_PAGE_BYTES);
    kvf__s3_req *r = malloc(sizeof *r);
    if (!page || !r) {
        free(page);
        free(r);
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", shown);
    }
    uint64_t t0 = kvf__now_ns();
    kvf_status st = list_page(s, "", 1, page, r);
    *took_ns = kvf__now_ns() - t0;
    char token[8];
    if (st == KVF_OK)
        st = kvf__s3_xml_list(page, r->got, NULL, NULL, token, sizeof token);
    else if (r->status == KVF_ERR_NOT_FOUND || (r->http >= 400 && r->http < 500))
        /* no such bucket, keys refused, no permission: the URL's fault */
        st = kvf__fail(KVF_ERR_INVALID, "remote URL \"%s\": %s", shown,
                       r->status == KVF_ERR_NOT_FOUND ? "no such bucket" : r->why);
    else
        st = kvf__fail(st, "remote URL \"%s\": %s", shown, r->why);
    free(page);
    free(r);
    return st;
}

/* The store for cfg; when `check`, reached once (see reach). */
static kvf_status s3_make(const kvf__store_config *cfg, s3_store **s_p, uint64_t *took_ns)
{
    char shown[640];
    kvf__url_redact(cfg->url, shown, sizeof shown);
    if (!cfg->ns || !kvf__ns_valid(cfg->ns))
        return kvf__fail(KVF_ERR_INVALID, "%s: namespace \"%s\" is not [A-Za-z0-9._-]{1,64}", shown,
                         cfg->ns ? cfg->ns : "(null)");
    kvf__s3_url u;
    kvf_status st = kvf__s3_url_parse(cfg->url, &u);
    if (st == KVF_OK)
        st = kvf__s3_creds_resolve(&u, shown);
    s3_store *s = st == KVF_OK ? calloc(1, sizeof *s) : NULL;
    if (st == KVF_OK && (!s || !(s->base.where = strdup(shown))))
        st = kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", shown);
    if (st == KVF_OK) {
        s->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
        st = kvf__s3_client_new(&u, s->timeout_ms, &s->client);
    }
    if (st == KVF_OK) {
        snprintf(s->dir, sizeof s->dir, "%s%s%s/", u.prefix, u.prefix[0] ? "/" : "", cfg->ns);
        s->base.ops = &s3_ops;
        s->base.kind = "s3";
        s->base.noun = "remote block";
        s->ns_hash = kvf__ns_hash(cfg->ns);
        s->fingerprint = cfg->fingerprint;
        st = reach(s, shown, took_ns);
    }
    kvf__s3_url_wipe(&u);
    if (st != KVF_OK && s) {
        kvf__s3_client_free(s->client);
        free(s->base.where);
        free(s);
        s = NULL;
    }
    *s_p = s;
    return st;
}

static kvf_status s3_open(const kvf__store_config *cfg, kvf__store **store_p)
{
    s3_store *s;
    uint64_t took;
    kvf_status st = s3_make(cfg, &s, &took);
    *store_p = st == KVF_OK ? &s->base : NULL;
    return st;
}

static kvf_status s3_probe(const char *url, uint32_t timeout_ms, char *detail, size_t cap)
{
    kvf__store_config cfg = {.url = url, .ns = "probe", .timeout_ms = timeout_ms};
    s3_store *s;
    uint64_t took = 0;
    kvf_status st = s3_make(&cfg, &s, &took);
    if (st == KVF_OK) {
        snprintf(detail, cap, "%s: bucket listed in %.1f ms", s->base.where, (double)took / 1e6);
        s3_close(&s->base);
    } else
        snprintf(detail, cap, "%s", kvf_last_error());
    return st;
}

static void s3_describe(char *line, size_t cap)
{
    char libs[200];
    kvf__s3_libraries(libs, sizeof libs);
    snprintf(line, cap, "%s, SigV4 by libcurl", libs);
}

static const char *const s3_schemes[] = {"s3", NULL};

const kvf__store_kind kvf__s3_store_kind = {
    .name = "s3",
    .schemes = s3_schemes,
    .remote = true,
    .built = s3_built,
    .missing = KVF_S3_MISSING,
    .describe = s3_describe,
    .check_url = s3_check_url,
    .open = s3_open,
    .probe = s3_probe,
    .probe_at_create = true,
    /* a group is a signed ranged GET per block, and on SeaweedFS loopback
     * (bench/results/remote_groups.txt) one costs about as much as the
     * object's whole read: 2 groups of a 2 MiB block ended 1.48x and 4 of
     * an 8 MiB block 2.5x after the whole batch's read. So a group is 32
     * MiB at least: a block of any common model is one group, read whole
     * as before; KVF_REMOTE_GROUP_BYTES turns groups on for a server
     * whose ranged reads cost less */
    .group_bytes = (size_t)32 << 20,
};
