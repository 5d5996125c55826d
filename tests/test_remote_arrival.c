/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-wise arrival from the remote tier: kvf_onboard_pools from REMOTE
 * reads every block's value pool group by pool group in ranged reads
 * (KVF_REMOTE_GROUP_BYTES=1 here: a group per pool), against the
 * in-process store, a real redis-server and a real S3 server (SeaweedFS),
 * each where it is to be had. Pools of uneven sizes, random data into
 * poisoned slots, byte-exact:
 *   - pool 0 is in every slot while the reads of later groups are held
 *     (the store's group gate holds them), the others still poison;
 *   - a pool of one block damaged in a later group fails that block alone
 *     (KVF_ERR_CORRUPT naming block, pool and URL), its earlier pools
 *     handed over checked, its later ones never written;
 *   - the key written again by another engine between two group reads:
 *     the block fails, nothing of the new value reaches its slot;
 *   - the key removed between two group reads: a miss, no stale bytes;
 *   - groups of two pools arrive two pools at a time;
 *   - a value of format version 2 is refused naming the format;
 *   - the cache's get of pools from the remote tier arrives pool by pool;
 *   - an S3 server answering ranged GETs with whole objects (200) is read
 *     right, a range it cuts short fails its block naming the object.
 */
#include "blockhdr.h"
#include "checksum.h"
#include "engine.h"
#include "hold_gate.h"
#include "mem_store.h"
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef KVF_HAVE_HIREDIS
#include "redis_server.h"
#endif
#ifdef KVF_HAVE_S3
#include "s3_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#endif

#define POOLS 4
#define BLOCKS 8
#define POISON 0xA5
#define NS "arrival"
/* pools of uneven sizes: 8, 4, 16 and 2 KiB a block */
static const kvf_geometry G[POOLS] = {
    {1, 2, 4, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
    {1, 2, 2, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
    {1, 2, 8, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
    {1, 1, 2, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
};
static size_t pool_bytes[POOLS], pool_off[POOLS];

/* ---- the store under test, reached around kvferry ------------------------ */

typedef struct backend {
    const char *name;
    char url[512];
    /* value bytes [off, off + len) of key into out; XOR mask into one */
    bool (*peek)(kvf_key key, size_t off, void *out, size_t len);
    bool (*poke)(kvf_key key, size_t off, uint8_t mask);
} backend;

static backend *be;

static bool mem_peek(kvf_key key, size_t off, void *out, size_t len)
{
    return kvf__mem_store_peek("arrival", NS, key, off, out, len) == KVF_OK;
}

static bool mem_poke(kvf_key key, size_t off, uint8_t mask)
{
    return kvf__mem_store_poke("arrival", NS, key, off, mask) == KVF_OK;
}

#ifdef KVF_HAVE_HIREDIS
/* one server, or the three masters of a cluster */
#define RNODES 3
static redis_server rservers[RNODES];
static int rnodes;

/* A command on the key's node (in a cluster, the one that does not
 * redirect it): its reply, or NULL. */
static redisReply *redis_on_key(const char *fmt, const char *k, const char *a, const void *b,
                                size_t blen)
{
    for (int i = 0; i < rnodes; i++) {
        redisContext *c = redis_connect(rservers[i].port, NULL);
        redisReply *r = !c     ? NULL
                        : blen ? redisCommand(c, fmt, k, a, b, blen)
                               : redisCommand(c, fmt, k, a, (const char *)b);
        if (c)
            redisFree(c);
        if (r && r->type != REDIS_REPLY_ERROR)
            return r;
        if (r)
            freeReplyObject(r);
    }
    return NULL;
}

static bool redis_peek(kvf_key key, size_t off, void *out, size_t len)
{
    char k[128], from[24], to[24];
    snprintf(k, sizeof k, "kvf:" NS ":" KVF_KEY_FMT, KVF_KEY_ARGS(key));
    snprintf(from, sizeof from, "%zu", off);
    snprintf(to, sizeof to, "%zu", off + len - 1);
    redisReply *r = redis_on_key("GETRANGE %s %s %s", k, from, to, 0);
    bool ok = r && r->type == REDIS_REPLY_STRING && r->len == len;
    if (ok)
        memcpy(out, r->str, len);
    if (r)
        freeReplyObject(r);
    return ok;
}

static bool redis_poke(kvf_key key, size_t off, uint8_t mask)
{
    uint8_t b;
    if (!redis_peek(key, off, &b, 1))
        return false;
    b ^= mask;
    char k[128], at[24];
    snprintf(k, sizeof k, "kvf:" NS ":" KVF_KEY_FMT, KVF_KEY_ARGS(key));
    snprintf(at, sizeof at, "%zu", off);
    redisReply *r = redis_on_key("SETRANGE %s %s %b", k, at, &b, 1);
    bool ok = r && r->type == REDIS_REPLY_INTEGER;
    if (r)
        freeReplyObject(r);
    return ok;
}

/* A three-master cluster on loopback: 0, or -1. */
static int redis_cluster_start(char *url, size_t cap)
{
    char cmd[512];
    int n = snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    for (int i = 0; i < RNODES; i++) {
        rservers[i].cluster = true;
        if (redis_server_start(&rservers[i], NULL))
            return -1;
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " 127.0.0.1:%d", rservers[i].port);
    }
    rnodes = RNODES;
    snprintf(cmd + n, sizeof cmd - (size_t)n,
             " --cluster-replicas 0 --cluster-yes >%s/create.log 2>&1", rservers[0].dir);
    if (system(cmd) != 0)
        return -1;
    double deadline = redis_now_s() + 60;
    for (int ok = 0; ok < RNODES && redis_now_s() < deadline;) {
        ok = 0;
        for (int i = 0; i < RNODES; i++) {
            redisContext *c = redis_connect(rservers[i].port, NULL);
            redisReply *r = c ? redisCommand(c, "CLUSTER INFO") : NULL;
            ok += r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
            if (r)
                freeReplyObject(r);
            if (c)
                redisFree(c);
        }
        if (ok < RNODES)
            usleep(100000);
        else
            break;
    }
    snprintf(url, cap, "redis-cluster://127.0.0.1:%d", rservers[1].port);
    return 0;
}
#endif

#ifdef KVF_HAVE_S3
static s3_server sserver;

static void s3_path(kvf_key key, char *out, size_t cap)
{
    snprintf(out, cap, "kvf/arrival/" NS "/" KVF_KEY_FMT ".kvf", KVF_KEY_ARGS(key));
}

static bool s3_peek(kvf_key key, size_t off, void *out, size_t len)
{
    char path[256];
    s3_path(key, path, sizeof path);
    s3_buf_ b = {malloc(4u << 20), 0, 4u << 20, 0};
    bool ok = b.p && s3_request(&sserver, "GET", path, NULL, &b) == 200 && off + len <= b.len;
    if (ok)
        memcpy(out, b.p + off, len);
    free(b.p);
    return ok;
}

static bool s3_poke_key(kvf_key key, size_t off, uint8_t mask)
{
    char path[256];
    s3_path(key, path, sizeof path);
    return s3_poke(&sserver, path, off, mask) == 0;
}
#endif

#ifdef KVF_HAVE_S3
/* ---- an S3 endpoint that ignores Range ------------------------------------ */

/* Answers every GET of an object with 200 and the whole value (as a
 * server that does not serve ranges does), but a later range of block
 * `short_key` with 206 and half of what was asked (a range cut short),
 * and an unknown object with 404; a listing with an empty one. One
 * connection at a time, each closed after its answer. */
#define FAKE_VALUES 3
static struct {
    int fd, port;
    kvf_key keys[FAKE_VALUES];
    uint8_t *values[FAKE_VALUES];
    size_t lens[FAKE_VALUES];
    kvf_key short_key;
    int gets, ranged;
} fake;

static void fake_answer(int c, const char *req)
{
    char head[256];
    if (strstr(req, "list-type=2")) {
        static const char list[] = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult>"
                                   "<Name>kvf</Name><KeyCount>0</KeyCount><IsTruncated>false"
                                   "</IsTruncated></ListBucketResult>";
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: "
                         "%zu\r\nConnection: close\r\n\r\n",
                         sizeof list - 1);
        (void)!write(c, head, (size_t)n);
        (void)!write(c, list, sizeof list - 1);
        return;
    }
    fake.gets++;
    unsigned long long a = 0, b = 0;
    const char *range = strcasestr(req, "\r\nRange: bytes=");
    if (range && sscanf(range, "\r\nRange: bytes=%llu-%llu", &a, &b) == 2)
        fake.ranged++;
    for (int i = 0; i < FAKE_VALUES; i++) {
        char hex[KVF_KEY_STR_BYTES];
        if (!strstr(req, kvf_key_format(fake.keys[i], hex)))
            continue;
        const uint8_t *body = fake.values[i];
        size_t len = fake.lens[i];
        const char *status = "200 OK";
        if (kvf_key_eq(fake.keys[i], fake.short_key) && range && a > 0) {
            body += a;
            len = (size_t)(b - a + 1) / 2;
            status = "206 Partial Content";
        }
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", status,
                         len);
        (void)!write(c, head, (size_t)n);
        for (size_t off = 0; off < len;) {
            ssize_t w = write(c, body + off, len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        return;
    }
    static const char nf[] = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: "
                             "close\r\n\r\n";
    (void)!write(c, nf, sizeof nf - 1);
}

static void *fake_main(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(fake.fd, NULL, NULL);
        if (c < 0)
            return NULL;
        char req[8192];
        size_t got = 0;
        while (got < sizeof req - 1) {
            ssize_t r = read(c, req + got, sizeof req - 1 - got);
            if (r <= 0)
                break;
            got += (size_t)r;
            req[got] = '\0';
            if (strstr(req, "\r\n\r\n"))
                break;
        }
        req[got] = '\0';
        fake_answer(c, req);
        close(c);
    }
}

/* part's view of a store-level read: calls per group, in order. */
typedef struct parts {
    uint32_t calls[POOLS];
    uint32_t next;
    bool out_of_order;
    int done;
} parts;

static void parts_part(void *arg, kvf__store_block *blocks, size_t n, uint32_t g)
{
    parts *p = arg;
    (void)blocks;
    p->out_of_order |= g != p->next && g != p->next - 1;
    p->next = g + 1;
    p->calls[g] += (uint32_t)n;
}

static void parts_done(void *arg, kvf__store_block *blocks, size_t n)
{
    (void)blocks;
    ((parts *)arg)->done += (int)n;
}

/* Ranged reads from a server that answers 200 with whole objects: each
 * block's groups taken from the whole answers, byte-exact; a range cut
 * short (206, half the bytes) fails its block naming the object, and so
 * does an object longer than its header says; an absent object is a miss; part ran once for every
 * block and group, in order, done once a block. */
static int test_s3_server_ignoring_range(void)
{
    fake.fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    REQUIRE(fake.fd >= 0 && bind(fake.fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
            listen(fake.fd, 64) == 0 && getsockname(fake.fd, (struct sockaddr *)&sa, &sl) == 0);
    fake.port = ntohs(sa.sin_port);
    uint32_t pb[POOLS];
    size_t payload = 0;
    for (uint32_t p = 0; p < POOLS; p++) {
        REQUIRE(kvf_geometry_block_bytes(&G[p], &pool_bytes[p]) == KVF_OK);
        pb[p] = (uint32_t)pool_bytes[p];
        payload += pool_bytes[p];
    }
    size_t pre = kvf__block_prefix_bytes(POOLS);
    for (int i = 0; i < FAKE_VALUES; i++) {
        fake.keys[i] = TKEY(0xfa0 + (uint64_t)i);
        /* value 2 is served with 16 bytes more than its header says */
        fake.lens[i] = pre + payload + (i == 2 ? 16 : 0);
        REQUIRE((fake.values[i] = calloc(1, fake.lens[i])) != NULL);
        test_fill_random(fake.values[i] + pre, payload, 0xfa0 + (uint64_t)i);
        kvf__block_header h = {0, kvf__ns_hash(NS), fake.keys[i], 16, POOLS, payload, 0};
        REQUIRE(kvf__block_prefix_make(&h, pb, fake.values[i] + pre, "test", fake.values[i]) ==
                KVF_OK);
    }
    fake.short_key = fake.keys[1];
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, fake_main, NULL) == 0);

    char url[256];
    snprintf(url, sizeof url, "s3://%s:%s@kvf/fake?endpoint=http://127.0.0.1:%d&region=us-east-1",
             S3_ACCESS, S3_SECRET_ESCAPED, fake.port);
    kvf__store_config sc = {.url = url, .ns = NS, .timeout_ms = 5000};
    kvf__store *st = NULL;
    REQUIRE(kvf__store_open(&sc, &st) == KVF_OK);
    enum { N = FAKE_VALUES + 1 };
    kvf__store_block b[N];
    /* room for a byte past the payload: where the last read asks one */
    size_t each = pre + payload + 64;
    uint8_t *room = malloc(N * each);
    REQUIRE(room);
    memset(room, POISON, N * each);
    for (int i = 0; i < N; i++)
        b[i] = (kvf__store_block){.key = i < FAKE_VALUES ? fake.keys[i] : TKEY(0xfff),
                                  .pools = POOLS,
                                  .buf = room + i * each + pre,
                                  .cap = payload + 64,
                                  .staged = true};
    const uint32_t ends[POOLS] = {1, 2, 3, 4};
    parts seen = {0};
    kvf__store_hooks h = {NULL, parts_done, &seen, parts_part, ends, POOLS, pre + pool_bytes[0]};
    CHECK_STATUS(kvf__store_read(st, b, N, 0, &h), KVF_ERR_CORRUPT);
    CHECK(!seen.out_of_order);
    for (uint32_t g = 0; g < POOLS; g++)
        CHECK_EQ_INT((int)seen.calls[g], N);
    CHECK_EQ_INT(seen.done, N);
    CHECK(fake.ranged > 0);
    CHECK_STATUS(b[0].status, KVF_OK);
    CHECK_EQ_U64(b[0].payload_bytes, payload);
    CHECK(memcmp(b[0].buf, fake.values[0] + pre, payload) == 0);
    CHECK_STATUS(b[2].status, KVF_ERR_CORRUPT);
    CHECK_STR_HAS(b[2].msg, "more than the");
    CHECK_STATUS(b[1].status, KVF_ERR_CORRUPT);
    CHECK_STR_HAS(b[1].msg, "object fake/" NS "/");
    CHECK_STR_HAS(b[1].msg, "the value ends at byte");
    CHECK_STATUS(b[3].status, KVF_ERR_NOT_FOUND);
    kvf__store_close(st);
    shutdown(fake.fd, SHUT_RDWR);
    close(fake.fd);
    pthread_join(th, NULL);
    for (int i = 0; i < FAKE_VALUES; i++)
        free(fake.values[i]);
    free(room);
    return 0;
}
#endif

/* ---- the group gate ------------------------------------------------------- */

/* Holds the ranged reads of groups from hold_from on until released; runs
 * act once before the reads of group act_at. */
static hold_gate hold = HOLD_GATE_INIT;
static struct {
    uint32_t hold_from, act_at;
    void (*act)(void);
} gate = {1u << 30, 0, NULL};

static void gate_fn(kvf__store *s, uint32_t g)
{
    (void)s;
    pthread_mutex_lock(&hold.mu);
    void (*act)(void) = g == gate.act_at ? gate.act : NULL;
    if (act)
        gate.act = NULL;
    pthread_mutex_unlock(&hold.mu);
    if (act)
        act();
    pthread_mutex_lock(&hold.mu);
    if (g >= gate.hold_from)
        hold_gate_wait(&hold);
    pthread_mutex_unlock(&hold.mu);
}

static void gate_close(uint32_t hold_from)
{
    pthread_mutex_lock(&hold.mu);
    gate.hold_from = hold_from;
    hold.release = false;
    pthread_mutex_unlock(&hold.mu);
}

static void gate_open(void)
{
    pthread_mutex_lock(&hold.mu);
    gate.hold_from = 1u << 30;
    hold_gate_release(&hold);
    pthread_mutex_unlock(&hold.mu);
}

static void gate_act(uint32_t g, void (*act)(void))
{
    pthread_mutex_lock(&hold.mu);
    gate.act_at = g;
    gate.act = act;
    pthread_mutex_unlock(&hold.mu);
}

static bool gate_holding(void)
{
    return hold_gate_holding(&hold);
}

/* ---- engines -------------------------------------------------------------- */

static uint64_t key_base; /* each test's own keys */

static uint8_t *slot_of(kvf_engine *e, uint32_t p, uint32_t s)
{
    void *ptr = NULL;
    return kvf_engine_slot_ptr(e, p, KVF_LEVEL_PRIMARY, s, &ptr) == KVF_OK ? ptr : NULL;
}

/* Pool p of slot s holds the bytes of `tag` (want) or poison. */
static bool pool_is(kvf_engine *e, uint32_t p, uint32_t s, uint64_t tag, bool want)
{
    uint8_t *exp = malloc(pool_bytes[p]);
    REQUIRE(exp);
    if (want)
        test_fill_random(exp, pool_bytes[p], tag * 31 + p + 1);
    else
        memset(exp, POISON, pool_bytes[p]);
    bool same = memcmp(slot_of(e, p, s), exp, pool_bytes[p]) == 0;
    free(exp);
    return same;
}

#define ALL_SLOTS UINT32_MAX

/* Slot `bad` (ALL_SLOTS: every slot) holds its block's pools below `upto`
 * and poison above; every other slot its whole block. */
static void expect_slots(kvf_engine *e, uint32_t bad, uint32_t upto)
{
    for (uint32_t s = 0; s < BLOCKS; s++)
        for (uint32_t p = 0; p < POOLS; p++)
            CHECK(pool_is(e, p, s, key_base + s, (bad != ALL_SLOTS && s != bad) || p < upto));
}

static kvf_engine *engine_open(uint32_t threads)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    /* one worker: a batch is one chunk, its rounds held on its thread */
    cfg.threads = threads;
    cfg.file.namespace_ = NS;
    cfg.remote.url = be->url;
    cfg.remote.timeout_ms = 20000;
    kvf_engine *e = NULL;
    REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
    size_t off = 0;
    for (uint32_t p = 0; p < POOLS; p++) {
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, BLOCKS};
        REQUIRE(kvf_engine_add_pool(e, &G[p], &prim, NULL, NULL) == KVF_OK);
        REQUIRE(kvf_geometry_block_bytes(&G[p], &pool_bytes[p]) == KVF_OK);
        pool_off[p] = off;
        off += pool_bytes[p];
    }
    return e;
}

/* Slot s's pools filled with tag's bytes and offloaded under `key`. */
static void store_as(kvf_engine *e, uint32_t s, uint64_t key, uint64_t tag)
{
    for (uint32_t p = 0; p < POOLS; p++)
        test_fill_random(slot_of(e, p, s), pool_bytes[p], tag * 31 + p + 1);
    kvf_move mv = TO_KEY(s, key);
    kvf_ticket t;
    REQUIRE(kvf_offload(e, KVF_TIER_REMOTE, &mv, 1, &t) == KVF_OK);
    REQUIRE(kvf_wait(e, t, NULL) == KVF_OK);
}

/* An engine whose blocks key_base + s were offloaded from slot s (tag the
 * key), every slot poisoned after. */
static kvf_engine *open_stored(void)
{
    key_base += 100;
    kvf_engine *e = engine_open(1);
    for (uint32_t s = 0; s < BLOCKS; s++)
        store_as(e, s, key_base + s, key_base + s);
    for (uint32_t s = 0; s < BLOCKS; s++)
        for (uint32_t p = 0; p < POOLS; p++)
            memset(slot_of(e, p, s), POISON, pool_bytes[p]);
    CHECK(kvf_engine_layerwise_tiers(e) >> KVF_TIER_REMOTE & 1u);
    return e;
}

static void onboard_all(kvf_engine *e, kvf_ticket *t)
{
    kvf_move mv[BLOCKS];
    for (uint32_t s = 0; s < BLOCKS; s++)
        mv[s] = FROM_KEY(key_base + s, s);
    const uint32_t pools[POOLS] = {0, 1, 2, 3};
    REQUIRE(kvf_onboard_pools(e, KVF_TIER_REMOTE, pools, POOLS, mv, BLOCKS, t) == KVF_OK);
}

/* The moves' statuses and the first errors of ticket t. */
static kvf_status wait_errors(kvf_engine *e, kvf_ticket t, kvf_status *per, kvf_move_error *errs,
                              size_t *nerr)
{
    return kvf_wait_errors(e, t, per, errs, 4, nerr);
}

/* ---- the tests ------------------------------------------------------------ */

/* Pool 0's wait returns while every later group's reads are held: pool 0
 * is in every slot, byte-exact, the others still poison; released, the
 * rest arrives. */
static int test_first_group_first(void)
{
    kvf_engine *e = open_stored();
    CHECK_EQ_INT(kvf_engine_arrival_groups(e, KVF_TIER_REMOTE), POOLS);
    gate_close(1);
    kvf_ticket t;
    onboard_all(e, &t);
    CHECK_STATUS(kvf__stream_wait_pool_by(e, t, 0, NULL, kvf__now_ns() + 20000000000ull), KVF_OK);
    CHECK(gate_holding());
    expect_slots(e, ALL_SLOTS, 1);
    /* pool 1 has not arrived: a wait by a deadline gives up */
    CHECK_STATUS(kvf__stream_wait_pool_by(e, t, 1, NULL, kvf__now_ns() + 50000000ull),
                 KVF_ERR_TIMEOUT);
    gate_open();
    CHECK_STATUS(kvf_wait_pool(e, t, 3), KVF_OK);
    CHECK_STATUS(kvf_wait_pool(e, t, 1), KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    expect_slots(e, ALL_SLOTS, POOLS);
    kvf_engine_destroy(e);
    return 0;
}

/* Block 3's pool 2 damaged in the store: pools 0 and 1 of every block
 * arrive (checked) while group 2 is held; pool 2's wait fails, the move's
 * message names the block, pool 2 and the URL; block 3's pools 2 and 3
 * stay poison, the others arrive whole. */
static int test_damaged_later_pool(void)
{
    kvf_engine *e = open_stored();
    size_t at = kvf__block_prefix_bytes(POOLS) + pool_off[2] + pool_bytes[2] / 2;
    REQUIRE(be->poke(TKEY(key_base + 3), at, 0x20));
    gate_close(2);
    kvf_ticket t;
    onboard_all(e, &t);
    CHECK_STATUS(kvf__stream_wait_pool_by(e, t, 1, NULL, kvf__now_ns() + 20000000000ull), KVF_OK);
    CHECK_STATUS(kvf_wait_pool(e, t, 0), KVF_OK);
    CHECK(gate_holding());
    expect_slots(e, ALL_SLOTS, 2);
    gate_open();
    CHECK_STATUS(kvf_wait_pool(e, t, 2), KVF_ERR_CORRUPT);
    CHECK_STATUS(kvf_wait_pool(e, t, 3), KVF_ERR_CORRUPT);
    kvf_status per[BLOCKS];
    kvf_move_error errs[4];
    size_t nerr = 0;
    CHECK_STATUS(wait_errors(e, t, per, errs, &nerr), KVF_ERR_CORRUPT);
    CHECK_EQ_INT((int)nerr, 1);
    CHECK_EQ_INT((int)errs[0].index, 3);
    char key[KVF_KEY_STR_BYTES];
    CHECK_STR_HAS(errs[0].message, kvf_key_format(TKEY(key_base + 3), key));
    CHECK_STR_HAS(errs[0].message, "pool 2: checksum mismatch");
    CHECK_STR_HAS(errs[0].message, strncmp(be->url, "s3://", 5) ? be->url : "s3://");
    for (uint32_t s = 0; s < BLOCKS; s++)
        CHECK_STATUS(per[s], s == 3 ? KVF_ERR_CORRUPT : KVF_OK);
    expect_slots(e, 3, 2);
    kvf_engine_destroy(e);
    return 0;
}

/* Another engine sharing the store: writes block 5's key again, or
 * removes block 6's, from inside the reading engine's group gate. */
static kvf_engine *peer;

static void peer_overwrite(void)
{
    store_as(peer, 0, key_base + 5, 0xbad0000 + key_base);
}

static void peer_remove(void)
{
    kvf_key k = TKEY(key_base + 6);
    kvf_ticket t;
    REQUIRE(kvf_remove(peer, KVF_TIER_REMOTE, &k, 1, &t) == KVF_OK);
    REQUIRE(kvf_wait(peer, t, NULL) == KVF_OK);
}

/* Block 5's key written again (new random bytes, the same layout) between
 * the reads of groups 1 and 2: the block fails KVF_ERR_CORRUPT, its pools
 * 0 and 1 are the old value's (read before, checked), 2 and 3 still
 * poison: never a byte of the new value in its slot. The other blocks
 * arrive whole; read again, the key gives the new value whole. */
static int test_overwritten_between_groups(void)
{
    kvf_engine *e = open_stored();
    peer = engine_open(1);
    gate_act(2, peer_overwrite);
    kvf_ticket t;
    onboard_all(e, &t);
    kvf_status per[BLOCKS];
    kvf_move_error errs[4];
    size_t nerr = 0;
    CHECK_STATUS(wait_errors(e, t, per, errs, &nerr), KVF_ERR_CORRUPT);
    CHECK_EQ_INT((int)nerr, 1);
    CHECK_EQ_INT((int)errs[0].index, 5);
    CHECK_STR_HAS(errs[0].message, "pool 2: checksum mismatch");
    CHECK_STR_HAS(errs[0].message, "written again");
    for (uint32_t s = 0; s < BLOCKS; s++)
        CHECK_STATUS(per[s], s == 5 ? KVF_ERR_CORRUPT : KVF_OK);
    expect_slots(e, 5, 2);
    for (uint32_t p = 2; p < POOLS; p++)
        CHECK(!pool_is(e, p, 5, 0xbad0000 + key_base, true));
    /* the new value, read now, is whole */
    kvf_move mv = FROM_KEY(key_base + 5, 5);
    const uint32_t pools[POOLS] = {0, 1, 2, 3};
    REQUIRE(kvf_onboard_pools(e, KVF_TIER_REMOTE, pools, POOLS, &mv, 1, &t) == KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    for (uint32_t p = 0; p < POOLS; p++)
        CHECK(pool_is(e, p, 5, 0xbad0000 + key_base, true));
    kvf_engine_destroy(peer);
    kvf_engine_destroy(e);
    return 0;
}

/* Block 6's key removed between the reads of groups 0 and 1: a miss
 * (KVF_ERR_NOT_FOUND, saying it was removed while read), pool 0 the
 * value's, the rest poison; the other blocks whole. */
static int test_removed_between_groups(void)
{
    kvf_engine *e = open_stored();
    peer = engine_open(1);
    gate_act(1, peer_remove);
    kvf_ticket t;
    onboard_all(e, &t);
    kvf_status per[BLOCKS];
    kvf_move_error errs[4];
    size_t nerr = 0;
    CHECK_STATUS(wait_errors(e, t, per, errs, &nerr), KVF_ERR_NOT_FOUND);
    for (uint32_t s = 0; s < BLOCKS; s++)
        CHECK_STATUS(per[s], s == 6 ? KVF_ERR_NOT_FOUND : KVF_OK);
    expect_slots(e, 6, 1);
    kvf_engine_destroy(peer);
    kvf_engine_destroy(e);
    return 0;
}

/* Groups of at least pools 0 and 1's bytes (12 KiB): pools {0, 1} and
 * {2, 3}; pool 1 arrives with pool 0 while the second group is held. */
static int test_groups_of_two(void)
{
    char set[32];
    snprintf(set, sizeof set, "%zu", (size_t)12 << 10);
    setenv("KVF_REMOTE_GROUP_BYTES", set, 1);
    kvf_engine *e = open_stored();
    CHECK_EQ_INT(kvf_engine_arrival_groups(e, KVF_TIER_REMOTE), 2);
    gate_close(1);
    kvf_ticket t;
    onboard_all(e, &t);
    CHECK_STATUS(kvf__stream_wait_pool_by(e, t, 1, NULL, kvf__now_ns() + 20000000000ull), KVF_OK);
    CHECK(gate_holding());
    expect_slots(e, ALL_SLOTS, 2);
    gate_open();
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    expect_slots(e, ALL_SLOTS, POOLS);
    kvf_engine_destroy(e);
    setenv("KVF_REMOTE_GROUP_BYTES", "1", 1);
    return 0;
}

/* Block 2's value made a version-2 header (the version and the header's
 * CRC rewritten in the store): its move fails KVF_ERR_MISMATCH naming the
 * format, nothing of it in its slot; the others whole. */
static int test_version_2_refused(void)
{
    kvf_engine *e = open_stored();
    kvf_key k = TKEY(key_base + 2);
    uint8_t h[KVF_BLOCK_HEADER_BYTES], v2[KVF_BLOCK_HEADER_BYTES];
    REQUIRE(be->peek(k, 0, h, sizeof h));
    memcpy(v2, h, sizeof h);
    v2[8] = 2; /* the version, little-endian */
    uint32_t crc = kvf__crc32c(0, v2, sizeof v2 - 4);
    for (int i = 0; i < 4; i++)
        v2[sizeof v2 - 4 + i] = (uint8_t)(crc >> (8 * i));
    for (size_t i = 0; i < sizeof h; i++)
        if (h[i] != v2[i])
            REQUIRE(be->poke(k, i, h[i] ^ v2[i]));
    kvf_ticket t;
    onboard_all(e, &t);
    kvf_status per[BLOCKS];
    kvf_move_error errs[4];
    size_t nerr = 0;
    CHECK_STATUS(wait_errors(e, t, per, errs, &nerr), KVF_ERR_MISMATCH);
    CHECK_EQ_INT((int)nerr, 1);
    CHECK_STR_HAS(errs[0].message, "format version 2");
    for (uint32_t s = 0; s < BLOCKS; s++)
        CHECK_STATUS(per[s], s == 2 ? KVF_ERR_MISMATCH : KVF_OK);
    expect_slots(e, 2, 0);
    kvf_engine_destroy(e);
    return 0;
}

/* Two workers, each its chunk's groups in order, and a key never stored
 * among them: a miss for that move alone, the rest byte-exact. */
static int test_two_workers_and_a_miss(void)
{
    key_base += 100;
    kvf_engine *e = engine_open(2);
    for (uint32_t s = 0; s < BLOCKS; s++)
        if (s != 4)
            store_as(e, s, key_base + s, key_base + s);
    for (uint32_t s = 0; s < BLOCKS; s++)
        for (uint32_t p = 0; p < POOLS; p++)
            memset(slot_of(e, p, s), POISON, pool_bytes[p]);
    kvf_ticket t;
    onboard_all(e, &t);
    kvf_status per[BLOCKS];
    CHECK_STATUS(kvf_wait(e, t, per), KVF_ERR_NOT_FOUND);
    for (uint32_t s = 0; s < BLOCKS; s++)
        CHECK_STATUS(per[s], s == 4 ? KVF_ERR_NOT_FOUND : KVF_OK);
    expect_slots(e, 4, 0);
    kvf_engine_destroy(e);
    return 0;
}

/* The cache's get of pools, of blocks it holds only remotely: pool 0's
 * wait returns while the later groups' reads are held, pool 0 byte-exact
 * in every slot and the rest poison; a wait by a deadline on pool 2 gives
 * up; released, every pool arrives. */
static int test_cache_get_pools(void)
{
    kvf_engine *e = open_stored();
    kvf_cache_config cc = KVF_CACHE_CONFIG_INIT;
    cc.host.blocks = 0;
    cc.remote = KVF_CACHE_REMOTE_READ;
    kvf_cache *c = NULL;
    REQUIRE(kvf_cache_create(e, &cc, &c) == KVF_OK);
    kvf_key keys[BLOCKS];
    uint32_t slots[BLOCKS];
    for (uint32_t s = 0; s < BLOCKS; s++) {
        keys[s] = TKEY(key_base + s);
        slots[s] = s;
    }
    const uint32_t pools[POOLS] = {0, 1, 2, 3};
    gate_close(1);
    kvf_cache_ticket t;
    REQUIRE(kvf_cache_get_pools(c, keys, slots, BLOCKS, pools, POOLS, &t) == KVF_OK);
    CHECK_STATUS(kvf_cache_wait_pool_by(c, t, 0, NULL, 20.0), KVF_OK);
    CHECK(gate_holding());
    expect_slots(e, ALL_SLOTS, 1);
    CHECK_STATUS(kvf_cache_wait_pool_by(c, t, 2, NULL, 0.05), KVF_ERR_TIMEOUT);
    gate_open();
    CHECK_STATUS(kvf_cache_wait_pool(c, t, 3), KVF_OK);
    kvf_status per[BLOCKS];
    CHECK_STATUS(kvf_cache_wait(c, t, per), KVF_OK);
    expect_slots(e, ALL_SLOTS, POOLS);
    kvf_cache_destroy(c);
    kvf_engine_destroy(e);
    return 0;
}

/* Without KVF_REMOTE_GROUP_BYTES, the store's own minimum: these small
 * blocks are one group, read whole; onboard_pools still delivers them. */
static int test_default_one_group(void)
{
    unsetenv("KVF_REMOTE_GROUP_BYTES");
    kvf_engine *e = open_stored();
    CHECK_EQ_INT(kvf_engine_arrival_groups(e, KVF_TIER_REMOTE), 1);
    kvf_ticket t;
    onboard_all(e, &t);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    expect_slots(e, ALL_SLOTS, POOLS);
    kvf_engine_destroy(e);
    setenv("KVF_REMOTE_GROUP_BYTES", "1", 1);
    return 0;
}

#ifdef KVF_HAVE_HIREDIS
static void server_killed(void)
{
    redis_server_kill(&rservers[0]);
}

/* The one server killed between the reads of groups 1 and 2: every move
 * fails with a failure of the server (KVF_ERR_REMOTE or, mid-reply,
 * KVF_ERR_TIMEOUT), never a verdict against the blocks, naming the node;
 * pools 0 and 1 of every slot were handed over checked, 2 and 3 are still
 * poison. The server restarted (empty: it saves nothing), once the client
 * tries the node again the blocks are misses. */
static int test_server_killed_between_groups(void)
{
    kvf_engine *e = open_stored();
    gate_act(2, server_killed);
    kvf_ticket t;
    onboard_all(e, &t);
    kvf_status per[BLOCKS];
    kvf_move_error errs[4];
    size_t nerr = 0;
    kvf_status st = wait_errors(e, t, per, errs, &nerr);
    CHECK(st == KVF_ERR_REMOTE || st == KVF_ERR_TIMEOUT);
    CHECK(nerr > 0);
    char node[64];
    snprintf(node, sizeof node, "127.0.0.1:%d", rservers[0].port);
    CHECK_STR_HAS(errs[0].message, node);
    for (uint32_t s = 0; s < BLOCKS; s++)
        CHECK(per[s] == KVF_ERR_REMOTE || per[s] == KVF_ERR_TIMEOUT);
    expect_slots(e, ALL_SLOTS, 2);
    REQUIRE(redis_server_start(&rservers[0], NULL) == 0);
    /* the node is left alone for a while after a failed connect (down_ms) */
    kvf_status back = KVF_ERR_REMOTE;
    for (uint64_t until = kvf__now_ns() + 10000000000ull;
         back == KVF_ERR_REMOTE && kvf__now_ns() < until;) {
        usleep(100000);
        onboard_all(e, &t);
        back = kvf_wait(e, t, per);
    }
    CHECK_STATUS(back, KVF_ERR_NOT_FOUND);
    for (uint32_t s = 0; s < BLOCKS; s++)
        CHECK_STATUS(per[s], KVF_ERR_NOT_FOUND);
    kvf_engine_destroy(e);
    return 0;
}
#endif

static void run_all(void)
{
    fprintf(stderr, "---- %s\n", be->name);
    RUN(test_first_group_first);
    RUN(test_damaged_later_pool);
    RUN(test_overwritten_between_groups);
    RUN(test_removed_between_groups);
    RUN(test_groups_of_two);
    RUN(test_version_2_refused);
    RUN(test_two_workers_and_a_miss);
    RUN(test_cache_get_pools);
    RUN(test_default_one_group);
}

int main(void)
{
    setenv("KVF_REMOTE_GROUP_BYTES", "1", 1);
    kvf__store_set_group_gate(gate_fn);
    backend mem = {"mem", "mem://arrival", mem_peek, mem_poke};
    be = &mem;
    run_all();
#ifdef KVF_HAVE_HIREDIS
    if (redis_tool_found("redis-server") && redis_tool_found("redis-cli")) {
        REQUIRE(redis_server_start(&rservers[0], NULL) == 0);
        rnodes = 1;
        backend rb = {"redis", "", redis_peek, redis_poke};
        snprintf(rb.url, sizeof rb.url, "redis://127.0.0.1:%d", rservers[0].port);
        be = &rb;
        run_all();
        RUN(test_server_killed_between_groups);
        redis_server_stop(&rservers[0]);
        /* the blocks spread over three masters: each round a pipeline per
         * node */
        memset(rservers, 0, sizeof rservers);
        backend cb = {"redis cluster", "", redis_peek, redis_poke};
        REQUIRE(redis_cluster_start(cb.url, sizeof cb.url) == 0);
        be = &cb;
        run_all();
        for (int i = 0; i < RNODES; i++)
            redis_server_stop(&rservers[i]);
    } else {
        fprintf(stderr, "redis: skipped: redis-server not installed\n");
    }
#endif
#ifdef KVF_HAVE_S3
    RUN(test_s3_server_ignoring_range);
    if (s3_weed_found(sserver.weed, sizeof sserver.weed)) {
        REQUIRE(s3_server_start(&sserver) == 0);
        backend sb = {"s3", "", s3_peek, s3_poke_key};
        s3_url(sb.url, sizeof sb.url, &sserver, "arrival");
        be = &sb;
        run_all();
        s3_server_stop(&sserver);
        test_rmtree(sserver.dir);
    }
#endif
    kvf__store_set_group_gate(NULL);
    return TEST_RESULT();
}
