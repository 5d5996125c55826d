/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The in-memory store: see mem_store.h.
 */
#include "mem_store.h"
#include "blockhdr.h"
#include "checksum.h"
#include "keymap.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR KVF_BLOCK_HEADER_BYTES
#define NAME_MAX_LEN 64

/* 0 in remote_mem_bytes: a store holds at most this */
#define DEFAULT_CAPACITY (1ull << 30)

typedef struct mem_value {
    uint64_t ns_hash;
    kvf_key key;
    uint8_t *bytes; /* the stored form: header, then payload */
    size_t len;
    int64_t mtime_ns;
    uint64_t expires_ns;             /* kvf__now_ns() past which it is gone; 0: never */
    struct mem_value *next;          /* the map's chain */
    struct mem_value *older, *newer; /* the map's age list, by last put */
} mem_value;

/* One mem://NAME: its blocks of every namespace, by key, and by age (the
 * oldest put is evicted first when a put would pass the capacity). */
typedef struct mem_map {
    char name[NAME_MAX_LEN + 1];
    pthread_mutex_t mu;
    kvf__keymap values;
    mem_value *oldest, *newest;
    uint64_t bytes, capacity; /* of the values' stored forms */
    bool full_logged;
    struct mem_map *next;
} mem_map;

static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;
static mem_map *maps;

typedef struct mem_store {
    kvf__store base;
    mem_map *map;
    uint64_t ns_hash, fingerprint;
    uint32_t ttl_s; /* each put's expiry; 0: none */
} mem_store;

static bool name_valid(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > NAME_MAX_LEN)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!(n[i] == '.' || n[i] == '_' || n[i] == '-' || (n[i] >= '0' && n[i] <= '9') ||
              (n[i] >= 'a' && n[i] <= 'z') || (n[i] >= 'A' && n[i] <= 'Z')))
            return false;
    return true;
}

static kvf_status mem_check_url(const char *url)
{
    if (!url || strncmp(url, "mem://", 6) != 0 || !name_valid(url + 6))
        return kvf__fail(KVF_ERR_INVALID,
                         "remote URL \"%s\": a mem:// URL is mem://NAME, NAME "
                         "[A-Za-z0-9._-]{1,64}",
                         url ? url : "(null)");
    return KVF_OK;
}

/* The map named `name`, made when `create` (capacity > 0: at least that
 * many bytes, the largest any of its engines asked for, so that no engine
 * shrinks it under another); NULL when absent or out of memory. */
static mem_map *map_of(const char *name, bool create, uint64_t capacity)
{
    pthread_mutex_lock(&maps_mu);
    mem_map *m = maps;
    while (m && strcmp(m->name, name) != 0)
        m = m->next;
    if (!m && create && (m = calloc(1, sizeof *m)) != NULL) {
        snprintf(m->name, sizeof m->name, "%s", name);
        pthread_mutex_init(&m->mu, NULL);
        m->values = (kvf__keymap)KVF_KEYMAP_INIT(mem_value, key, next, 64);
        m->next = maps;
        maps = m;
    }
    if (m && create) {
        pthread_mutex_lock(&m->mu);
        if (capacity > m->capacity)
            m->capacity = capacity;
        pthread_mutex_unlock(&m->mu);
    }
    pthread_mutex_unlock(&maps_mu);
    return m;
}

/* Takes v out of its map's index and age list; the map's lock held. The
 * caller frees it (value_drop), after unlocking where it can. */
static void unlink_value(mem_map *m, mem_value *v)
{
    kvf__keymap_remove(&m->values, v);
    *(v->older ? &v->older->newer : &m->oldest) = v->newer;
    *(v->newer ? &v->newer->older : &m->newest) = v->older;
    v->older = v->newer = NULL;
    m->bytes -= v->len;
}

static bool expired(const mem_value *v, uint64_t now)
{
    return v->expires_ns && now >= v->expires_ns;
}

/* Frees a value taken out of its map (or the whole map being cleared). */
static void value_drop(void *obj)
{
    mem_value *v = obj;
    free(v->bytes);
    free(v);
}

/* The live value under (ns_hash, key); the map's lock held. One whose TTL
 * has passed is gone: taken out and put on *dead (chained by `newer`) for
 * the caller to free. */
static mem_value *find(mem_map *m, uint64_t ns_hash, kvf_key key, mem_value **dead)
{
    mem_value *v = kvf__keymap_find(&m->values, key, NULL);
    while (v && v->ns_hash != ns_hash)
        v = kvf__keymap_find(&m->values, key, v);
    if (v && expired(v, kvf__now_ns())) {
        unlink_value(m, v);
        v->newer = *dead;
        *dead = v;
        v = NULL;
    }
    return v;
}

static void drop_all(mem_value *dead)
{
    for (mem_value *next; dead; dead = next) {
        next = dead->newer;
        value_drop(dead);
    }
}

static int64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static kvf_status put_one(mem_store *s, kvf__store_block *b)
{
    const char *url = s->base.where;
    char what[KVF_KEY_STR_BYTES + 320];
    snprintf(what, sizeof what, "remote block " KVF_KEY_FMT ": %s", KVF_KEY_ARGS(b->key), url);
    if (b->pools > KVF_BLOCK_POOLS_MAX)
        return kvf__fail(KVF_ERR_RANGE, "%s: %u pools, a stored block holds at most %u", what,
                         b->pools, KVF_BLOCK_POOLS_MAX);
    size_t pre = kvf__block_prefix_bytes(b->pools), len = pre + b->payload_bytes;
    uint8_t *bytes = malloc(len ? len : 1);
    if (!bytes)
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", what);
    kvf__block_header h = {s->fingerprint, s->ns_hash,       b->key, b->tokens,
                           b->pools,       b->payload_bytes, 0};
    kvf_status st = kvf__block_prefix_make(&h, b->pool_bytes, b->buf, what, bytes);
    if (st != KVF_OK) {
        free(bytes);
        return st;
    }
    memcpy(bytes + pre, b->buf, b->payload_bytes);
    mem_map *m = s->map;
    mem_value *dead = NULL, *evicted = NULL;
    uint64_t capacity, held;
    bool first_full = false;
    pthread_mutex_lock(&m->mu);
    capacity = m->capacity;
    mem_value *v = len > capacity ? NULL : find(m, s->ns_hash, b->key, &dead);
    if (v) /* put anew: the newest, its old bytes no longer counted */
        unlink_value(m, v);
    else if (len <= capacity && (v = calloc(1, sizeof *v)) != NULL) {
        v->ns_hash = s->ns_hash;
        v->key = b->key;
    }
    /* the oldest puts make room, those whose TTL has passed first */
    while (v && m->oldest && expired(m->oldest, kvf__now_ns())) {
        mem_value *o = m->oldest;
        unlink_value(m, o);
        o->newer = dead;
        dead = o;
    }
    while (v && m->oldest && m->bytes + len > capacity) {
        mem_value *o = m->oldest;
        unlink_value(m, o);
        o->newer = evicted;
        evicted = o;
        first_full |= !m->full_logged;
        m->full_logged = true;
    }
    if (v && !kvf__keymap_insert(&m->values, v)) {
        free(v->bytes);
        free(v);
        v = NULL;
    }
    if (v) {
        free(v->bytes);
        v->bytes = bytes;
        v->len = len;
        v->mtime_ns = realtime_ns();
        v->expires_ns = s->ttl_s ? kvf__now_ns() + (uint64_t)s->ttl_s * 1000000000u : 0;
        v->older = m->newest;
        *(m->newest ? &m->newest->newer : &m->oldest) = v;
        m->newest = v;
        m->bytes += len;
    }
    held = m->bytes;
    pthread_mutex_unlock(&m->mu);
    drop_all(dead);
    /* said outside the lock: a log handler may call the store */
    if (first_full)
        KVF_LOG(KVF_LOG_WARN,
                "%s: full at %llu bytes: the oldest blocks are evicted to make room "
                "(remote_mem_bytes sets the capacity)",
                url, (unsigned long long)capacity);
    for (mem_value *o = evicted; o; o = o->newer)
        KVF_LOG(KVF_LOG_INFO,
                "remote block " KVF_KEY_FMT ": %s: evicted, the oldest, for block " KVF_KEY_FMT " "
                "(%llu of %llu bytes held)",
                KVF_KEY_ARGS(o->key), url, KVF_KEY_ARGS(b->key), (unsigned long long)held,
                (unsigned long long)capacity);
    drop_all(evicted);
    if (len > capacity) {
        free(bytes);
        return kvf__fail(KVF_ERR_NO_SPACE,
                         "remote block " KVF_KEY_FMT ": %s: %zu bytes stored, more than the "
                         "store's capacity (%llu bytes; remote_mem_bytes)",
                         KVF_KEY_ARGS(b->key), url, len, (unsigned long long)capacity);
    }
    if (!v) {
        free(bytes);
        return kvf__fail(KVF_ERR_NOMEM, "remote block " KVF_KEY_FMT ": %s: out of memory",
                         KVF_KEY_ARGS(b->key), url);
    }
    return KVF_OK;
}

/* A value, copied out under the map's lock, checked as every store's are. */
static kvf_status take_value(mem_store *s, kvf__store_block *b, const uint8_t *value, size_t len)
{
    char what[160];
    snprintf(what, sizeof what, "remote block " KVF_KEY_FMT ": %s", KVF_KEY_ARGS(b->key),
             s->base.where);
    kvf__block_header h;
    kvf_status st = kvf__block_value_take(value, len, what, s->fingerprint, s->ns_hash, b->key,
                                          b->buf, b->cap, &h);
    if (st != KVF_OK)
        return st;
    b->tokens = h.tokens;
    b->pools = h.pools;
    b->payload_bytes = h.payload_bytes;
    return KVF_OK;
}

static kvf_status get_one(mem_store *s, kvf__store_block *b)
{
    mem_map *m = s->map;
    mem_value *dead = NULL;
    pthread_mutex_lock(&m->mu);
    mem_value *v = find(m, s->ns_hash, b->key, &dead);
    uint8_t *copy = NULL;
    size_t len = v ? v->len : 0;
    if (v && (copy = malloc(len ? len : 1)) != NULL)
        memcpy(copy, v->bytes, len);
    pthread_mutex_unlock(&m->mu);
    drop_all(dead);
    if (!v)
        return KVF_ERR_NOT_FOUND;
    if (!copy)
        return kvf__fail(KVF_ERR_NOMEM, "remote block " KVF_KEY_FMT ": %s: out of memory",
                         KVF_KEY_ARGS(b->key), s->base.where);
    kvf_status st = take_value(s, b, copy, len);
    free(copy);
    return st;
}

/* Ranged reads (kvf__store_read_groups), each copied under the map's
 * lock from the value stored at that moment: a value put again between
 * two of them is read as it is then, as a server's would be. */
static void mem_ranges(kvf__store *base, kvf__store_range *r, size_t n, uint64_t deadline_ns)
{
    mem_store *s = (mem_store *)base;
    mem_map *m = s->map;
    for (size_t i = 0; i < n; i++) {
        kvf__store_block *b = r[i].block;
        if (deadline_ns && kvf__now_ns() > deadline_ns) {
            kvf__store_block_fail(b, KVF_ERR_TIMEOUT,
                                  "remote block " KVF_KEY_FMT ": %s: deadline passed",
                                  KVF_KEY_ARGS(b->key), base->where);
            continue;
        }
        mem_value *dead = NULL;
        pthread_mutex_lock(&m->mu);
        mem_value *v = find(m, s->ns_hash, b->key, &dead);
        if (v && r[i].off < v->len) {
            size_t left = v->len - (size_t)r[i].off;
            r[i].got = left < r[i].len ? left : r[i].len;
            memcpy(r[i].dst, v->bytes + r[i].off, r[i].got);
        }
        pthread_mutex_unlock(&m->mu);
        drop_all(dead);
        if (!v)
            b->status = KVF_ERR_NOT_FOUND;
    }
}

static kvf_status mem_read_hooked(kvf__store *base, kvf__store_block *blocks, size_t n,
                                  uint64_t deadline_ns, const kvf__store_hooks *h)
{
    mem_store *s = (mem_store *)base;
    return kvf__store_read_groups(base, blocks, n, deadline_ns, h, mem_ranges, s->fingerprint,
                                  s->ns_hash);
}

/* remove (drop) or exists of one block. */
static kvf_status keyed_one(mem_store *s, kvf__store_block *b, bool drop)
{
    mem_map *m = s->map;
    mem_value *dead = NULL;
    pthread_mutex_lock(&m->mu);
    mem_value *v = find(m, s->ns_hash, b->key, &dead);
    if (v && drop)
        unlink_value(m, v);
    pthread_mutex_unlock(&m->mu);
    drop_all(dead);
    if (v && drop)
        value_drop(v);
    return v || drop ? KVF_OK : KVF_ERR_NOT_FOUND;
}

static kvf_status drop_one(mem_store *s, kvf__store_block *b)
{
    return keyed_one(s, b, true);
}

static kvf_status exists_one(mem_store *s, kvf__store_block *b)
{
    return keyed_one(s, b, false);
}

/* A batch call: `one` on every block, until the deadline. */
static kvf_status each(kvf__store *base, kvf__store_block *blocks, size_t n, uint64_t deadline_ns,
                       kvf_status (*one)(mem_store *s, kvf__store_block *b), bool miss_ok)
{
    for (size_t i = 0; i < n; i++) {
        kvf__store_block *b = &blocks[i];
        b->msg[0] = '\0';
        if (deadline_ns && kvf__now_ns() > deadline_ns) {
            kvf__store_block_fail(b, KVF_ERR_TIMEOUT,
                                  "remote block " KVF_KEY_FMT ": %s: deadline passed",
                                  KVF_KEY_ARGS(b->key), base->where);
            continue;
        }
        b->status = one((mem_store *)base, b);
        if (b->status != KVF_OK && b->status != KVF_ERR_NOT_FOUND)
            snprintf(b->msg, sizeof b->msg, "%s", kvf_last_error());
    }
    return kvf__store_first_failure(blocks, n, miss_ok);
}

static kvf_status mem_write(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns)
{
    return each(s, blocks, n, deadline_ns, put_one, false);
}

static kvf_status mem_read(kvf__store *s, kvf__store_block *blocks, size_t n, uint64_t deadline_ns)
{
    return each(s, blocks, n, deadline_ns, get_one, true);
}

static kvf_status mem_remove(kvf__store *s, kvf__store_block *blocks, size_t n,
                             uint64_t deadline_ns)
{
    return each(s, blocks, n, deadline_ns, drop_one, false);
}

static kvf_status mem_exists(kvf__store *s, kvf__store_block *blocks, size_t n,
                             uint64_t deadline_ns)
{
    return each(s, blocks, n, deadline_ns, exists_one, true);
}

/* Visits the namespace's blocks whose header checks, from a snapshot taken
 * under the lock (visit may call the store). */
static kvf_status mem_list(kvf__store *base, kvf__store_visit_fn visit, void *arg)
{
    mem_store *s = (mem_store *)base;
    mem_map *m = s->map;
    pthread_mutex_lock(&m->mu);
    kvf__store_entry *ents = calloc(m->values.count ? m->values.count : 1, sizeof *ents);
    size_t k = 0, pos = 0;
    uint64_t now = kvf__now_ns();
    for (mem_value *v = ents ? kvf__keymap_next(&m->values, &pos, NULL) : NULL; v;
         v = kvf__keymap_next(&m->values, &pos, v)) {
        kvf__block_header h;
        if (v->ns_hash != s->ns_hash || expired(v, now) || v->len < HDR ||
            kvf__block_header_parse(v->bytes, "mem", &h) != KVF_OK ||
            kvf__block_header_expect(&h, "mem", s->fingerprint, s->ns_hash, v->key) != KVF_OK ||
            h.payload_bytes + kvf__block_prefix_bytes(h.pools) != v->len)
            continue;
        ents[k++] = (kvf__store_entry){v->key, h.tokens, h.pools, h.payload_bytes, v->mtime_ns};
    }
    pthread_mutex_unlock(&m->mu);
    if (!ents)
        return kvf__fail(KVF_ERR_NOMEM, "%s: list: out of memory", base->where);
    for (size_t i = 0; i < k; i++)
        visit(arg, &ents[i]);
    free(ents);
    kvf__clear_error();
    return KVF_OK;
}

static void mem_close(kvf__store *base)
{
    free(base->where);
    free(base);
}

static const kvf__store_ops mem_ops = {
    .write = mem_write,
    .read = mem_read,
    .remove = mem_remove,
    .exists = mem_exists,
    .list = mem_list,
    .read_hooked = mem_read_hooked,
    .close = mem_close,
};

static kvf_status mem_open(const kvf__store_config *cfg, kvf__store **store_p)
{
    kvf_status st = mem_check_url(cfg->url);
    if (st != KVF_OK)
        return st;
    if (!cfg->ns || !kvf__ns_valid(cfg->ns))
        return kvf__fail(KVF_ERR_INVALID, "%s: namespace \"%s\" is not [A-Za-z0-9._-]{1,64}",
                         cfg->url, cfg->ns ? cfg->ns : "(null)");
    mem_store *s = calloc(1, sizeof *s);
    if (s)
        s->base.where = strdup(cfg->url);
    if (s && s->base.where)
        s->map = map_of(cfg->url + 6, true, cfg->mem_bytes ? cfg->mem_bytes : DEFAULT_CAPACITY);
    if (!s || !s->base.where || !s->map) {
        if (s)
            free(s->base.where);
        free(s);
        return kvf__fail(KVF_ERR_NOMEM, "%s: out of memory", cfg->url);
    }
    s->base.ops = &mem_ops;
    s->base.kind = "mem";
    s->base.noun = "remote block";
    s->ns_hash = kvf__ns_hash(cfg->ns);
    s->fingerprint = cfg->fingerprint;
    s->ttl_s = cfg->ttl_s;
    *store_p = &s->base;
    return KVF_OK;
}

static void mem_describe(char *line, size_t cap)
{
    snprintf(line, cap, "blocks in this process's memory, for tests (mem://NAME)");
}

static const char *const mem_schemes[] = {"mem", NULL};

const kvf__store_kind kvf__mem_store_kind = {
    .name = "mem",
    .schemes = mem_schemes,
    .remote = true,
    .describe = mem_describe,
    .check_url = mem_check_url,
    .open = mem_open,
    /* the in-process store as Redis, whose tests it stands in for */
    .group_bytes = (size_t)256 << 10,
};

/* Runs fn on bytes [offset, offset + len) of the value stored under
 * (namespace, key) in mem://`name`, under the map's lock. */
static kvf_status at_value(const char *name, const char *ns, kvf_key key, size_t offset, size_t len,
                           void (*fn)(uint8_t *at, size_t len, void *arg), void *arg)
{
    mem_map *m = map_of(name, false, 0);
    if (!m)
        return KVF_ERR_NOT_FOUND;
    mem_value *dead = NULL;
    pthread_mutex_lock(&m->mu);
    mem_value *v = find(m, kvf__ns_hash(ns), key, &dead);
    bool ok = v && offset <= v->len && len <= v->len - offset;
    if (ok)
        fn(v->bytes + offset, len, arg);
    pthread_mutex_unlock(&m->mu);
    drop_all(dead);
    return ok ? KVF_OK : KVF_ERR_NOT_FOUND;
}

static void xor_byte(uint8_t *at, size_t len, void *arg)
{
    (void)len;
    *at ^= *(const uint8_t *)arg;
}

static void copy_out(uint8_t *at, size_t len, void *arg)
{
    memcpy(arg, at, len);
}

kvf_status kvf__mem_store_poke(const char *name, const char *ns, kvf_key key, size_t offset,
                               uint8_t mask)
{
    return at_value(name, ns, key, offset, 1, xor_byte, &mask);
}

kvf_status kvf__mem_store_peek(const char *name, const char *ns, kvf_key key, size_t offset,
                               void *out, size_t len)
{
    return at_value(name, ns, key, offset, len, copy_out, out);
}

void kvf__mem_store_clear(const char *name)
{
    mem_map *m = map_of(name, false, 0);
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    kvf__keymap_clear(&m->values, value_drop);
    m->oldest = m->newest = NULL;
    m->bytes = 0;
    m->full_logged = false;
    pthread_mutex_unlock(&m->mu);
}
