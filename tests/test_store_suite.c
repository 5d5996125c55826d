/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One suite for every store, written against the store ops (store.h) and
 * run over each fixture of the table below: block files, mem://, a real
 * redis-server, and the same over TLS (rediss://). A store added later gets the suite by its line
 * in `fixtures`: how to start one, and how to damage a stored byte.
 *
 * Each store is asked the same: random payloads round trip byte for byte
 * into poisoned buffers, with their tokens and pools; a miss, a buffer too
 * small, an overwrite, a removal; a damaged header or payload is refused
 * for that block only, its neighbours in the batch still read; another
 * layout is refused, another namespace does not see the blocks; list
 * visits exactly what was stored; and the way the engine writes and reads
 * every store, staged images and hooks (test_staged_hooks).
 *
 * `test_store_suite NAME` runs one fixture; without an argument, all (a
 * fixture whose server or client is missing is skipped, and said so).
 */
#include "store.h"
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>

#include "mem_store.h"
#ifdef KVF_HAVE_HIREDIS
#include "redis_tls_server.h"
#endif
#ifdef KVF_HAVE_S3
#include "s3_server.h"
#endif

/* Where the payload starts in the stored form of the tests' blocks (1 to
 * 16 pools): kvf__block_prefix_bytes, a constant for arrays */
#define PRE 256u
#define NS "suite"
#define OTHER_NS "suite-other"
#define FP 0x5317e5ull
#define NBLK 24

typedef struct store_fixture store_fixture;
struct store_fixture {
    const char *name;
    /* Makes a store to test and writes its URL: 0, TEST_SKIP (why said),
     * or -1. */
    int (*start)(store_fixture *f, char *url, size_t cap);
    void (*stop)(store_fixture *f);
    /* XORs mask into byte `offset` of the stored value of (ns, key),
     * offset 0 the header's first byte: 0 or -1. */
    int (*poke)(store_fixture *f, const char *ns, kvf_key key, size_t offset, uint8_t mask);
    /* whether its list visits the stored blocks (else it refuses to list) */
    bool lists;
    char dir[256];
#ifdef KVF_HAVE_HIREDIS
    redis_tls_server tls; /* its plain server: redis:// and the pokes of both */
#endif
#ifdef KVF_HAVE_S3
    s3_server s3;
#endif
};

/* ---- block files ---------------------------------------------------------- */

static int file_start(store_fixture *f, char *url, size_t cap)
{
    if (test_tmpdir(f->dir, sizeof f->dir))
        return -1;
    snprintf(url, cap, "file://%s", f->dir);
    return 0;
}

static void file_stop(store_fixture *f)
{
    test_rmtree(f->dir);
}

static int file_poke(store_fixture *f, const char *ns, kvf_key key, size_t offset, uint8_t mask)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/" KVF_KEY_FMT ".kvf", f->dir, ns, KVF_KEY_ARGS(TKEY(key)));
    int fd = open(path, O_RDWR);
    uint8_t b;
    int rc = fd >= 0 && pread(fd, &b, 1, (off_t)offset) == 1 ? 0 : -1;
    b ^= mask;
    if (rc == 0 && pwrite(fd, &b, 1, (off_t)offset) != 1)
        rc = -1;
    if (fd >= 0)
        close(fd);
    return rc;
}

/* ---- mem:// ------------------------------------------------------------------ */

static int mem_start(store_fixture *f, char *url, size_t cap)
{
    (void)f;
    kvf__mem_store_clear("suite");
    snprintf(url, cap, "mem://suite");
    return 0;
}

static int mem_poke(store_fixture *f, const char *ns, kvf_key key, size_t offset, uint8_t mask)
{
    (void)f;
    return kvf__mem_store_poke("suite", ns, TKEY(key), offset, mask) == KVF_OK ? 0 : -1;
}

/* ---- redis:// on a real server ------------------------------------------------ */

#ifdef KVF_HAVE_HIREDIS
static int redis_start(store_fixture *f, char *url, size_t cap)
{
    if (!redis_tool_found("redis-server")) {
        fprintf(stderr, "redis: skipped: redis-server not installed\n");
        return TEST_SKIP;
    }
    if (redis_server_start(&f->tls.plain, NULL))
        return -1;
    redis_url(url, cap, &f->tls.plain, NULL);
    return 0;
}

static void redis_stop(store_fixture *f)
{
    redis_server_stop(&f->tls.plain);
}

/* rediss://: the same server speaking TLS, its certificate checked */
static int rediss_start(store_fixture *f, char *url, size_t cap)
{
    if (!redis_tls_available())
        return TEST_SKIP;
    if (redis_tls_server_start(&f->tls, NULL))
        return -1;
    snprintf(url, cap, "rediss://127.0.0.1:%d?tls_ca=%s", f->tls.tls_port, f->tls.ca);
    return 0;
}

static int redis_poke(store_fixture *f, const char *ns, kvf_key key, size_t offset, uint8_t mask)
{
    char name[128];
    snprintf(name, sizeof name, "kvf:%s:" KVF_KEY_FMT, ns, KVF_KEY_ARGS(TKEY(key)));
    redisContext *c = redis_connect(f->tls.plain.port, NULL);
    if (!c)
        return -1;
    char at[32];
    snprintf(at, sizeof at, "%zu", offset);
    redisReply *r = redisCommand(c, "GETRANGE %s %s %s", name, at, at);
    int rc = r && r->type == REDIS_REPLY_STRING && r->len == 1 ? 0 : -1;
    char b = rc == 0 ? (char)(r->str[0] ^ (char)mask) : 0;
    if (r)
        freeReplyObject(r);
    if (rc == 0) {
        r = redisCommand(c, "SETRANGE %s %s %b", name, at, &b, (size_t)1);
        rc = r && r->type == REDIS_REPLY_INTEGER ? 0 : -1;
        if (r)
            freeReplyObject(r);
    }
    redisFree(c);
    return rc;
}
#endif

/* ---- s3:// on a real SeaweedFS ------------------------------------------------ */

#ifdef KVF_HAVE_S3
static int s3_start(store_fixture *f, char *url, size_t cap)
{
    if (!s3_weed_found(f->s3.weed, sizeof f->s3.weed))
        return TEST_SKIP;
    if (s3_server_start(&f->s3))
        return -1;
    s3_url(url, cap, &f->s3, "suite/blocks");
    return 0;
}

static void s3_stop(store_fixture *f)
{
    s3_server_stop(&f->s3);
    test_rmtree(f->s3.dir);
}

static int s3_poke_block(store_fixture *f, const char *ns, kvf_key key, size_t offset, uint8_t mask)
{
    char path[256];
    snprintf(path, sizeof path, "kvf/suite/blocks/%s/" KVF_KEY_FMT ".kvf", ns,
             KVF_KEY_ARGS(TKEY(key)));
    return s3_poke(&f->s3, path, offset, mask);
}
#endif

/* Every store the suite runs over: adding a store is a line here. */
static store_fixture fixtures[] = {
    {.name = "file", .start = file_start, .stop = file_stop, .poke = file_poke, .lists = true},
    {.name = "mem", .start = mem_start, .poke = mem_poke, .lists = true},
#ifdef KVF_HAVE_HIREDIS
    {.name = "redis", .start = redis_start, .stop = redis_stop, .poke = redis_poke, .lists = true},
    {.name = "rediss",
     .start = rediss_start,
     .stop = redis_stop,
     .poke = redis_poke,
     .lists = true},
#endif
#ifdef KVF_HAVE_S3
    {.name = "s3", .start = s3_start, .stop = s3_stop, .poke = s3_poke_block, .lists = true},
#endif
};

/* ---- the suite -------------------------------------------------------------- */

typedef struct suite {
    store_fixture *f;
    const char *url;
    kvf__store *s;
    uint8_t *payload[NBLK]; /* what was stored under key(i) */
    size_t bytes[NBLK];
} suite;

/* Block i's key. Blocks come in pairs whose keys share the low half and
 * differ in the high one, and the pairs share their high halves: a store
 * that kept 64 bits of a key anywhere (a name, a map, a header) would give
 * one block's bytes for the other. */
static kvf_key key_of(size_t i)
{
    return (kvf_key){i % 2 ? 0x5e1f0000a11ceull : 0, 0x5e1f000000ull + i / 2 * 0x10001ull};
}

static kvf__store *open_store(const char *url, const char *ns, uint64_t fp)
{
    kvf__store_config cfg = {.url = url, .ns = ns, .fingerprint = fp, .timeout_ms = 5000};
    kvf__store *s = NULL;
    kvf_status st = kvf__store_open(&cfg, &s);
    if (st != KVF_OK)
        fprintf(stderr, "open %s: %s\n", url, kvf_last_error());
    return s;
}

/* Writes blocks [first, last) with fresh random payloads (sizes from 1
 * byte to 96 KiB, one empty), seeded by `seed`. */
static void write_blocks(suite *t, size_t first, size_t last, uint64_t seed)
{
    kvf__store_block blk[NBLK];
    for (size_t i = first; i < last; i++) {
        size_t n = i == 3 ? 0 : (size_t)(test_xorshift64(&seed) % (96 << 10)) + 1;
        free(t->payload[i]);
        t->payload[i] = malloc(n ? n : 1);
        test_fill_random(t->payload[i], n, seed + i);
        t->bytes[i] = n;
        blk[i - first] = (kvf__store_block){.key = key_of(i),
                                            .tokens = (uint32_t)(i + 1),
                                            .pools = (uint32_t)(i % 3 + 1),
                                            .buf = t->payload[i],
                                            .payload_bytes = n};
    }
    CHECK_STATUS(t->s->ops->write(t->s, blk, last - first, 0), KVF_OK);
    for (size_t i = 0; i < last - first; i++)
        CHECK_STATUS(blk[i].status, KVF_OK);
    if (t->s->ops->commit)
        CHECK_STATUS(t->s->ops->commit(t->s), KVF_OK);
}

/* Reads keys[0..n) into poisoned buffers of `cap` bytes (0: each block's
 * own size) with store s; fills status. */
static void read_blocks(kvf__store *s, const kvf_key *keys, size_t n, size_t cap,
                        kvf__store_block *blk, uint8_t **bufs)
{
    for (size_t i = 0; i < n; i++) {
        bufs[i] = malloc(cap ? cap : (96 << 10) + 1);
        memset(bufs[i], 0xcd, cap ? cap : (96 << 10) + 1);
        blk[i] = (kvf__store_block){
            .key = TKEY(keys[i]), .buf = bufs[i], .cap = cap ? cap : (96 << 10) + 1};
    }
    s->ops->read(s, blk, n, 0);
}

static void free_bufs(uint8_t **bufs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
}

/* Every stored block comes back byte for byte with its tokens and pools. */
static void check_all_read(suite *t)
{
    kvf_key keys[NBLK];
    kvf__store_block blk[NBLK];
    uint8_t *bufs[NBLK];
    for (size_t i = 0; i < NBLK; i++)
        keys[i] = key_of(i);
    read_blocks(t->s, keys, NBLK, 0, blk, bufs);
    for (size_t i = 0; i < NBLK; i++) {
        CHECK_STATUS(blk[i].status, KVF_OK);
        CHECK(blk[i].payload_bytes == t->bytes[i]);
        CHECK(blk[i].tokens == i + 1 && blk[i].pools == i % 3 + 1);
        CHECK(test_mem_diff(bufs[i], t->payload[i], t->bytes[i]) == SIZE_MAX);
    }
    free_bufs(bufs, NBLK);
}

static void test_round_trip(suite *t)
{
    write_blocks(t, 0, NBLK, 0x1234);
    check_all_read(t);
    /* an overwrite is read back, never the old bytes */
    write_blocks(t, 5, 9, 0x9876);
    check_all_read(t);
}

static void test_miss_and_exists(suite *t)
{
    kvf_key keys[3] = {key_of(0), KEY(0xab5e47ull), key_of(1)};
    kvf__store_block blk[3];
    uint8_t *bufs[3];
    read_blocks(t->s, keys, 3, 0, blk, bufs);
    CHECK_STATUS(blk[0].status, KVF_OK);
    CHECK_STATUS(blk[1].status, KVF_ERR_NOT_FOUND);
    CHECK_STATUS(blk[2].status, KVF_OK);
    free_bufs(bufs, 3);
    for (size_t i = 0; i < 3; i++)
        blk[i] = (kvf__store_block){.key = TKEY(keys[i])};
    CHECK_STATUS(t->s->ops->exists(t->s, blk, 3, 0), KVF_OK); /* a miss is no failure */
    CHECK_STATUS(blk[0].status, KVF_OK);
    CHECK_STATUS(blk[1].status, KVF_ERR_NOT_FOUND);
    CHECK_STATUS(blk[2].status, KVF_OK);
}

/* A buffer too small is RANGE for that block; the block stays stored. */
static void test_range(suite *t)
{
    size_t big = 0;
    for (size_t i = 1; i < NBLK; i++)
        if (t->bytes[i] > t->bytes[big])
            big = i;
    kvf_key key = key_of(big);
    kvf__store_block blk[1];
    uint8_t *bufs[1];
    read_blocks(t->s, &key, 1, t->bytes[big] - 1, blk, bufs);
    CHECK_STATUS(blk[0].status, KVF_ERR_RANGE);
    CHECK(blk[0].msg[0] != '\0');
    free_bufs(bufs, 1);
    check_all_read(t);
}

/* A damaged byte (header, payload) fails its block only, as CORRUPT. */
static void test_damage(suite *t)
{
    const size_t offsets[] = {0, 20, 33, 59, 60, PRE, PRE + 7};
    for (size_t k = 0; k < sizeof offsets / sizeof *offsets; k++) {
        size_t victim = 10 + k;
        if (offsets[k] >= PRE + t->bytes[victim])
            continue;
        REQUIRE(t->f->poke(t->f, NS, key_of(victim), offsets[k], 0x41) == 0);
        kvf_key keys[3] = {key_of(victim - 1), key_of(victim), key_of(victim + 1)};
        kvf__store_block blk[3];
        uint8_t *bufs[3];
        read_blocks(t->s, keys, 3, 0, blk, bufs);
        CHECK_STATUS(blk[0].status, KVF_OK);
        if (blk[1].status != KVF_ERR_CORRUPT)
            fprintf(stderr, "%s: byte %zu damaged: %s (%s)\n", t->f->name, offsets[k],
                    kvf_status_str(blk[1].status), blk[1].msg);
        CHECK_STATUS(blk[1].status, KVF_ERR_CORRUPT);
        CHECK(strstr(blk[1].msg, "0x") != NULL || blk[1].msg[0]);
        CHECK_STATUS(blk[2].status, KVF_OK);
        CHECK(test_mem_diff(bufs[0], t->payload[victim - 1], t->bytes[victim - 1]) == SIZE_MAX);
        free_bufs(bufs, 3);
        REQUIRE(t->f->poke(t->f, NS, key_of(victim), offsets[k], 0x41) == 0); /* mended */
    }
    check_all_read(t);
}

/* Pools of given, uneven sizes: each checked on its own. A block whose
 * middle pool is damaged fails alone, CORRUPT naming that pool; a damaged
 * pool table fails it too; pools that do not add up to the payload are
 * refused before anything is stored. */
static void test_pools(suite *t)
{
    const uint32_t split[3] = {100, 5000, 77};
    const size_t n = 100 + 5000 + 77;
    uint8_t *want = malloc(n);
    REQUIRE(want);
    test_fill_random(want, n, 0x9001);
    kvf__store_block blk[2];
    for (int k = 0; k < 2; k++)
        blk[k] = (kvf__store_block){.key = TKEY(0x9000 + k),
                                    .tokens = 4,
                                    .pools = 3,
                                    .buf = want,
                                    .payload_bytes = n,
                                    .pool_bytes = split};
    CHECK_STATUS(t->s->ops->write(t->s, blk, 2, 0), KVF_OK);
    if (t->s->ops->commit)
        CHECK_STATUS(t->s->ops->commit(t->s), KVF_OK);
    kvf_key keys[2] = {KEY(0x9000), KEY(0x9001)};
    uint8_t *bufs[2];
    read_blocks(t->s, keys, 2, 0, blk, bufs);
    for (int k = 0; k < 2; k++) {
        CHECK_STATUS(blk[k].status, KVF_OK);
        CHECK(blk[k].pools == 3 && blk[k].payload_bytes == n);
        CHECK(test_mem_diff(bufs[k], want, n) == SIZE_MAX);
    }
    free_bufs(bufs, 2);
    /* a byte of pool 1 (of 0, 1, 2), then one of the table's */
    const size_t at[2] = {PRE + 100 + 2500, KVF_BLOCK_HEADER_BYTES + 8 + 4};
    const char *says[2] = {"pool 1: checksum mismatch", "pool table checksum mismatch"};
    for (int d = 0; d < 2; d++) {
        REQUIRE(t->f->poke(t->f, NS, TKEY(0x9000), at[d], 0x41) == 0);
        read_blocks(t->s, keys, 2, 0, blk, bufs);
        CHECK_STATUS(blk[0].status, KVF_ERR_CORRUPT);
        CHECK_STR_HAS(blk[0].msg, says[d]);
        CHECK_STR_HAS(blk[0].msg, "0000000000000000000000000000900");
        CHECK_STATUS(blk[1].status, KVF_OK);
        CHECK(test_mem_diff(bufs[1], want, n) == SIZE_MAX);
        free_bufs(bufs, 2);
        REQUIRE(t->f->poke(t->f, NS, TKEY(0x9000), at[d], 0x41) == 0); /* mended */
    }
    /* pools that do not add up: refused, nothing stored */
    const uint32_t short_split[3] = {100, 5000, 76};
    kvf__store_block bad = {.key = TKEY(0x9002),
                            .tokens = 4,
                            .pools = 3,
                            .buf = want,
                            .payload_bytes = n,
                            .pool_bytes = short_split};
    CHECK(t->s->ops->write(t->s, &bad, 1, 0) != KVF_OK);
    CHECK_STATUS(bad.status, KVF_ERR_INVALID);
    kvf_key gone = TKEY(0x9002);
    kvf_status st;
    CHECK_STATUS(kvf__store_exists(t->s, &gone, 1, 0, &st), KVF_OK);
    CHECK_STATUS(st, KVF_ERR_NOT_FOUND);
    kvf_key both[2] = {TKEY(0x9000), TKEY(0x9001)};
    kvf_status rs[2];
    kvf__store_remove(t->s, both, 2, 0, rs);
    free(want);
}

/* Another layout is refused (MISMATCH); another namespace sees nothing. */
static void test_foreign(suite *t)
{
    kvf__store *other_layout = open_store(t->url, NS, FP + 1);
    kvf__store *other_ns = open_store(t->url, OTHER_NS, FP);
    REQUIRE(other_layout && other_ns);
    kvf_key key = key_of(0);
    kvf__store_block blk[1];
    uint8_t *bufs[1];
    read_blocks(other_layout, &key, 1, 0, blk, bufs);
    CHECK_STATUS(blk[0].status, KVF_ERR_MISMATCH);
    free_bufs(bufs, 1);
    read_blocks(other_ns, &key, 1, 0, blk, bufs);
    CHECK_STATUS(blk[0].status, KVF_ERR_NOT_FOUND);
    free_bufs(bufs, 1);
    kvf__store_close(other_layout);
    kvf__store_close(other_ns);
}

typedef struct listed {
    suite *t;
    size_t seen[NBLK];
    size_t strangers;
} listed;

static void list_visit(void *arg, const kvf__store_entry *e)
{
    listed *l = arg;
    for (size_t i = 0; i < NBLK; i++)
        if (kvf_key_eq(e->key, key_of(i))) {
            l->seen[i]++;
            CHECK(e->payload_bytes == l->t->bytes[i]);
            CHECK(e->tokens == i + 1 && e->pools == i % 3 + 1);
            return;
        }
    l->strangers++;
}

/* list visits each stored block once, removed ones not at all. */
static void test_list(suite *t, size_t removed_below)
{
    listed l = {.t = t};
    kvf_status st = kvf__store_list(t->s, list_visit, &l);
    if (!t->f->lists) {
        CHECK_STATUS(st, KVF_ERR_UNSUPPORTED);
        return;
    }
    CHECK_STATUS(st, KVF_OK);
    for (size_t i = 0; i < NBLK; i++)
        CHECK_EQ_INT(l.seen[i], i < removed_below ? 0 : 1);
    CHECK_EQ_INT(l.strangers, 0);
}

static void test_remove(suite *t)
{
    kvf_key keys[4] = {key_of(0), key_of(1), key_of(2), KEY(0xab5e47ull)};
    kvf_status status[4];
    CHECK_STATUS(kvf__store_remove(t->s, keys, 4, 0, status), KVF_OK);
    for (size_t i = 0; i < 4; i++)
        CHECK_STATUS(status[i], KVF_OK);
    CHECK_STATUS(kvf__store_exists(t->s, keys, 4, 0, status), KVF_OK);
    for (size_t i = 0; i < 4; i++)
        CHECK_STATUS(status[i], KVF_ERR_NOT_FOUND);
    kvf__store_block blk[4];
    uint8_t *bufs[4];
    read_blocks(t->s, keys, 4, 0, blk, bufs);
    for (size_t i = 0; i < 4; i++)
        CHECK_STATUS(blk[i].status, KVF_ERR_NOT_FOUND);
    free_bufs(bufs, 4);
}

/* ---- the engine's way in: staged images and hooks ---------------------------- */

#define STAGED 6

/* Blocks in one staging buffer laid out as the engine lays it out: an
 * image per block (the header's room, the payload, padding to 4096). */
typedef struct staged {
    uint8_t *buf;
    size_t slot;
    kvf__store_block blk[STAGED];
    _Atomic unsigned calls[STAGED]; /* hook calls per block */
    uint8_t *want[STAGED];          /* what each block's fill wrote */
    size_t fail_at;                 /* the block whose fill fails, or whose read the hook refuses */
} staged;

static void staged_init(staged *g, uint64_t key0, size_t fail_at)
{
    memset(g, 0, sizeof *g);
    g->slot = (PRE + (40 << 10) + 4095) / 4096 * 4096;
    g->buf = aligned_alloc(4096, STAGED * g->slot);
    REQUIRE(g->buf);
    memset(g->buf, 0xcd, STAGED * g->slot);
    g->fail_at = fail_at;
    for (size_t j = 0; j < STAGED; j++)
        g->blk[j] = (kvf__store_block){.key = KEY(key0 + j),
                                       .buf = g->buf + j * g->slot + PRE,
                                       .cap = g->slot - PRE,
                                       .pools = 2, /* the prefix's room is for 2 */
                                       .staged = true};
}

static void staged_free(staged *g)
{
    for (size_t j = 0; j < STAGED; j++)
        free(g->want[j]);
    free(g->buf);
}

/* The engine's gather: a random payload of its own size per block. */
static kvf_status staged_fill(void *arg, kvf__store_block *blocks, size_t n)
{
    staged *g = arg;
    for (size_t k = 0; k < n; k++) {
        size_t j = (size_t)(&blocks[k] - g->blk);
        g->calls[j]++;
        if (j == g->fail_at)
            return kvf__fail(KVF_ERR_IO, "gathering slot %zu: poisoned source", j);
        size_t bytes = (j * 7919 + 1) % (40 << 10) + 1;
        free(g->want[j]);
        g->want[j] = malloc(bytes);
        test_fill_random(g->want[j], bytes, 0x57a6ed + j);
        memcpy(blocks[k].buf, g->want[j], bytes);
        blocks[k].payload_bytes = bytes;
        blocks[k].tokens = (uint32_t)j + 1;
        blocks[k].pools = 2;
    }
    return KVF_OK;
}

/* The engine's scatter: every block once, its result final; one refused. */
static void staged_done(void *arg, kvf__store_block *blocks, size_t n)
{
    staged *g = arg;
    for (size_t k = 0; k < n; k++) {
        size_t j = (size_t)(&blocks[k] - g->blk);
        g->calls[j]++;
        if (j == g->fail_at && blocks[k].status == KVF_OK)
            kvf__store_block_fail(&blocks[k], KVF_ERR_MISMATCH, "block %zu: refused", j);
    }
}

/* Staged blocks written and read through the hooks, as the engine runs
 * every store: each hook once per block, the payloads byte for byte out
 * of and into poisoned staging, a failed fill stores nothing and names its
 * block, a miss reaches the hook as a miss. */
static void test_staged_hooks(suite *t)
{
    const uint64_t key0 = 0x57a6000000ull;
    staged w;
    staged_init(&w, key0, SIZE_MAX);
    const kvf__store_hooks wh = {staged_fill, staged_done, &w};
    CHECK_STATUS(kvf__store_write(t->s, w.blk, STAGED, 0, &wh), KVF_OK);
    for (size_t j = 0; j < STAGED; j++) {
        CHECK_STATUS(w.blk[j].status, KVF_OK);
        CHECK_EQ_INT(w.calls[j], 1);
    }
    if (t->s->ops->commit)
        CHECK_STATUS(t->s->ops->commit(t->s), KVF_OK);

    /* a fill that fails: its block (and, for a store filling the whole
     * call at once, the others) fails, naming its key; nothing of it is
     * stored */
    staged bad;
    staged_init(&bad, key0 + 0x100, 1);
    const kvf__store_hooks bh = {staged_fill, NULL, &bad};
    CHECK(kvf__store_write(t->s, bad.blk, 2, 0, &bh) != KVF_OK);
    CHECK_STATUS(bad.blk[1].status, KVF_ERR_IO);
    char key_hex[KVF_KEY_STR_BYTES];
    kvf_key_format(KEY(key0 + 0x101), key_hex);
    CHECK_STR_HAS(bad.blk[1].msg, key_hex);
    CHECK_STR_HAS(bad.blk[1].msg, "poisoned source");
    kvf_key gone = KEY(key0 + 0x101);
    kvf_status st;
    CHECK_STATUS(kvf__store_exists(t->s, &gone, 1, 0, &st), KVF_OK);
    CHECK_STATUS(st, KVF_ERR_NOT_FOUND);

    /* read back into poisoned staging, one key never stored, one block
     * refused by the hook */
    staged r;
    staged_init(&r, key0, 4);
    r.blk[3].key = KEY(0x57a6ffffffull);
    const kvf__store_hooks rh = {staged_fill, staged_done, &r};
    kvf__store_read(t->s, r.blk, STAGED, 0, &rh);
    for (size_t j = 0; j < STAGED; j++) {
        CHECK_EQ_INT(r.calls[j], 1);
        if (j == 3) {
            CHECK_STATUS(r.blk[j].status, KVF_ERR_NOT_FOUND);
            continue;
        }
        if (j == 4) {
            CHECK_STATUS(r.blk[j].status, KVF_ERR_MISMATCH);
            continue;
        }
        CHECK_STATUS(r.blk[j].status, KVF_OK);
        CHECK(r.blk[j].payload_bytes == w.blk[j].payload_bytes);
        CHECK(r.blk[j].tokens == j + 1 && r.blk[j].pools == 2);
        CHECK(test_mem_diff(r.blk[j].buf, w.want[j], w.blk[j].payload_bytes) == SIZE_MAX);
    }
    kvf_key keys[STAGED + 1];
    for (size_t j = 0; j < STAGED; j++)
        keys[j] = KEY(key0 + j);
    keys[STAGED] = KEY(key0 + 0x100); /* stored where the store filled it alone */
    kvf_status status[STAGED + 1];
    CHECK_STATUS(kvf__store_remove(t->s, keys, STAGED + 1, 0, status), KVF_OK);
    staged_free(&w);
    staged_free(&bad);
    staged_free(&r);
}

/* ---- reads pool group by pool group (kvf__store_hooks.part) --------------- */

#define GBLK 5
#define GPOOLS 3
static const uint32_t gsplit[GPOOLS] = {4096, 12288, 8192};

/* What part saw: calls per block and group, the groups' order, and each
 * handed-over group's bytes against what was written. */
typedef struct grouped {
    pthread_mutex_t mu;
    kvf__store_block blk[GBLK];
    uint8_t *want[GBLK];
    unsigned calls[GBLK][GPOOLS], done[GBLK];
    unsigned group_calls[GPOOLS];
    bool out_of_order, wrong_bytes, no_table;
    kvf_status seen[GBLK][GPOOLS];
} grouped;

static void grouped_part(void *arg, kvf__store_block *blocks, size_t n, uint32_t g)
{
    grouped *r = arg;
    pthread_mutex_lock(&r->mu);
    /* every block's group g - 1 was handed over before any group g */
    r->out_of_order |= g > 0 && r->group_calls[g - 1] != GBLK;
    r->group_calls[g] += (unsigned)n;
    for (size_t k = 0; k < n; k++) {
        size_t j = (size_t)(&blocks[k] - r->blk);
        r->calls[j][g]++;
        r->seen[j][g] = blocks[k].status;
        if (blocks[k].status != KVF_OK)
            continue;
        r->no_table |= !blocks[k].table;
        size_t off = 0;
        for (uint32_t p = 0; p < g; p++)
            off += gsplit[p];
        r->wrong_bytes |= memcmp((uint8_t *)blocks[k].buf + off, r->want[j] + off, gsplit[g]) != 0;
    }
    pthread_mutex_unlock(&r->mu);
}

static void grouped_done(void *arg, kvf__store_block *blocks, size_t n)
{
    grouped *r = arg;
    pthread_mutex_lock(&r->mu);
    for (size_t k = 0; k < n; k++)
        r->done[&blocks[k] - r->blk]++;
    pthread_mutex_unlock(&r->mu);
}

/* Blocks of three uneven pools read a group per pool into staged images
 * (the engine's layer-wise onboard), on every store that reads by groups:
 * part once for every block and group, every block's group g before any
 * g + 1, each group byte-exact when handed over (with the pool table);
 * block 2's pool 2 damaged fails it there alone (its first groups sound),
 * block 4 never stored is a miss in every group; done once a block. */
static void test_grouped_read(suite *t)
{
    const kvf__store_kind *k = kvf__store_kind_of(t->url);
    bool groups = (k && k->group_bytes) || !strncmp(t->s->kind, "file", 4);
    if (!groups)
        return;
    const uint64_t key0 = 0x96000000ull;
    size_t payload = gsplit[0] + gsplit[1] + gsplit[2];
    size_t pre = kvf__block_prefix_bytes(GPOOLS);
    grouped r = {.mu = PTHREAD_MUTEX_INITIALIZER};
    kvf__store_block w[GBLK - 1];
    for (size_t j = 0; j < GBLK; j++) {
        r.want[j] = malloc(payload);
        REQUIRE(r.want[j]);
        test_fill_random(r.want[j], payload, key0 + j);
        if (j < GBLK - 1)
            w[j] = (kvf__store_block){.key = KEY(key0 + j),
                                      .tokens = 16,
                                      .pools = GPOOLS,
                                      .buf = r.want[j],
                                      .payload_bytes = payload,
                                      .pool_bytes = gsplit};
    }
    CHECK_STATUS(t->s->ops->write(t->s, w, GBLK - 1, 0), KVF_OK);
    if (t->s->ops->commit)
        CHECK_STATUS(t->s->ops->commit(t->s), KVF_OK);
    REQUIRE(t->f->poke(t->f, NS, KEY(key0 + 2), pre + gsplit[0] + gsplit[1] + 100, 0x10) == 0);
    size_t slot = (pre + payload + 4095) / 4096 * 4096;
    uint8_t *img = aligned_alloc(4096, GBLK * slot);
    REQUIRE(img);
    memset(img, 0xcd, GBLK * slot);
    for (size_t j = 0; j < GBLK; j++)
        r.blk[j] = (kvf__store_block){.key = KEY(key0 + j),
                                      .buf = img + j * slot + pre,
                                      .cap = slot - pre,
                                      .pools = GPOOLS,
                                      .staged = true};
    const uint32_t ends[GPOOLS] = {1, 2, 3};
    kvf__store_hooks h = {NULL, grouped_done, &r, grouped_part, ends, GPOOLS, pre + gsplit[0]};
    CHECK_STATUS(kvf__store_read(t->s, r.blk, GBLK, 0, &h), KVF_ERR_CORRUPT);
    CHECK(!r.out_of_order);
    CHECK(!r.wrong_bytes);
    CHECK(!r.no_table);
    for (size_t j = 0; j < GBLK; j++) {
        CHECK_EQ_INT(r.done[j], 1);
        for (uint32_t g = 0; g < GPOOLS; g++) {
            CHECK_EQ_INT(r.calls[j][g], 1);
            kvf_status want = j == 4             ? KVF_ERR_NOT_FOUND
                              : j == 2 && g == 2 ? KVF_ERR_CORRUPT
                                                 : KVF_OK;
            CHECK_STATUS(r.seen[j][g], want);
        }
    }
    CHECK_STR_HAS(r.blk[2].msg, "pool 2: checksum mismatch");
    kvf_key keys[GBLK];
    kvf_status st[GBLK];
    for (size_t j = 0; j < GBLK; j++) {
        keys[j] = KEY(key0 + j);
        free(r.want[j]);
    }
    kvf__store_remove(t->s, keys, GBLK, 0, st);
    free(img);
}

static int run_fixture(store_fixture *f)
{
    char url[512];
    int rc = f->start(f, url, sizeof url);
    if (rc == TEST_SKIP)
        return TEST_SKIP;
    REQUIRE(rc == 0);
    int failures = test_failures;
    suite t = {.f = f, .url = url, .s = open_store(url, NS, FP)};
    REQUIRE(t.s);
    test_round_trip(&t);
    test_miss_and_exists(&t);
    test_range(&t);
    test_damage(&t);
    test_pools(&t);
    test_foreign(&t);
    test_list(&t, 0);
    test_remove(&t);
    test_list(&t, 3);
    test_staged_hooks(&t);
    test_grouped_read(&t);
    kvf__store_close(t.s);
    for (size_t i = 0; i < NBLK; i++)
        free(t.payload[i]);
    if (f->stop)
        f->stop(f);
    fprintf(stderr, "%s: %s\n", f->name, test_failures == failures ? "passed" : "FAILED");
    return 0;
}

int main(int argc, char **argv)
{
    alarm(240);
    size_t ran = 0;
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        if (argc > 1 && strcmp(argv[1], fixtures[i].name) != 0)
            continue;
        ran += run_fixture(&fixtures[i]) == 0;
    }
    if (argc > 1 && ran == 0 && test_failures == 0)
        TEST_SKIP_ALL("store %s: not in this build, or its server is missing", argv[1]);
    return TEST_RESULT();
}
