/* The remote tier against one real redis-server: round trips, checks of
 * what comes back, namespaces, two processes, TTL, AUTH, timeouts,
 * restarts and threads. */
#include "remote.h"
#include "testutil.h"

#ifdef KVF_HAVE_HIREDIS
#include "blockhdr.h"
#include "redis_server.h"

#include <sys/resource.h>

#include <pthread.h>
#endif

#define FP 0x1234abcd5678ef01ull

static int test_url_parse(void)
{
    kvf__remote_url u;
    CHECK_STATUS(kvf__remote_url_parse("redis://localhost", &u), KVF_OK);
    CHECK(!u.cluster && u.seeds == 1 && u.seed[0].port == 6379 && u.db == 0);
    CHECK(!strcmp(u.seed[0].host, "localhost") && !u.user[0] && !u.pass[0]);
    CHECK_STATUS(kvf__remote_url_parse("redis://al%40ice:p%3Ass@10.0.0.1:7000/5", &u), KVF_OK);
    CHECK(!strcmp(u.user, "al@ice") && !strcmp(u.pass, "p:ss"));
    CHECK(!strcmp(u.seed[0].host, "10.0.0.1") && u.seed[0].port == 7000 && u.db == 5);
    CHECK_STATUS(kvf__remote_url_parse("redis://:secret@h/", &u), KVF_OK);
    CHECK(!u.user[0] && !strcmp(u.pass, "secret") && u.db == 0);
    CHECK_STATUS(kvf__remote_url_parse("redis://[::1]:6380", &u), KVF_OK);
    CHECK(!strcmp(u.seed[0].host, "::1") && u.seed[0].port == 6380);
    CHECK_STATUS(kvf__remote_url_parse("redis-cluster://h1:7000,h2:7001,[::1]:7002", &u), KVF_OK);
    CHECK(u.cluster && u.seeds == 3 && u.seed[1].port == 7001 && !strcmp(u.seed[2].host, "::1"));
    const char *bad[] = {"http://h",       "redis://",       "redis://h:0", "redis://h:99999",
                         "redis://h:x",    "redis://h/abc",  "redis://a,b", "redis-cluster://a,b/1",
                         "redis://user@h", "redis://:p%4@h", "redis://[::1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvf_status st = kvf__remote_url_parse(bad[i], &u);
        if (st != KVF_ERR_INVALID)
            TEST_FAIL_AT(__FILE__, __LINE__, "'%s' parsed (%d)", bad[i], (int)st);
    }
    /* a refused URL never repeats its password */
    kvf__remote_url_parse("redis://u:topsecret@h:bad", &u);
    CHECK(!strstr(kvf_last_error(), "topsecret"));
    /* mutated URLs: parsed or refused, never a crash (ASan watches) */
    const char *seeds[] = {"redis://al%40ice:p%3Ass@10.0.0.1:7000/5",
                           "redis-cluster://h1:7000,[::1]:7002"};
    uint64_t rs = 42;
    for (int i = 0; i < 20000; i++) {
        char m[64];
        snprintf(m, sizeof m, "%s", seeds[i % 2]);
        size_t len = strlen(m);
        for (int k = 0; k < 3; k++)
            m[test_xorshift64(&rs) % len] = (char)(test_xorshift64(&rs) % 96 + 32);
        m[test_xorshift64(&rs) % (len + 1)] = '\0';
        kvf_status st = kvf__remote_url_parse(m, &u);
        if (st != KVF_OK && st != KVF_ERR_INVALID)
            TEST_FAIL_AT(__FILE__, __LINE__, "'%s': status %d", m, (int)st);
    }
    setenv(KVF_REMOTE_URL_ENV, "", 1);
    CHECK(kvf__remote_url_from_env() == NULL);
    setenv(KVF_REMOTE_URL_ENV, "redis://h", 1);
    CHECK(kvf__remote_url_from_env() && !strcmp(kvf__remote_url_from_env(), "redis://h"));
    unsetenv(KVF_REMOTE_URL_ENV);
    kvf__remote_close(NULL);
    return 0;
}

#ifdef KVF_HAVE_HIREDIS
static redis_server server;

static kvf__remote *open_remote(const char *url, const char *ns, uint64_t fp, uint32_t ttl)
{
    kvf__remote_config cfg = KVF_REMOTE_CONFIG_INIT;
    cfg.url = url;
    cfg.ns = ns;
    cfg.fingerprint = fp;
    cfg.ttl_s = ttl;
    cfg.timeout_ms = 5000;
    kvf__remote *r = NULL;
    kvf_status st = kvf__remote_open(&cfg, &r);
    if (st != KVF_OK)
        fprintf(stderr, "open %s: %s\n", url, kvf_last_error());
    return r;
}

static kvf__remote *open_default(const char *ns, uint64_t fp)
{
    char url[128];
    redis_url(url, sizeof url, &server, NULL);
    return open_remote(url, ns, fp, 0);
}

/* Stores n blocks of `bytes` under keys base.. with seeds base..; 0 or -1. */
static int put_blocks(kvf__remote *r, uint64_t base, size_t n, size_t bytes, uint8_t **bufs)
{
    kvf__remote_put *p = calloc(n, sizeof *p);
    kvf_status *st = calloc(n, sizeof *st);
    for (size_t i = 0; i < n; i++) {
        bufs[i] = malloc(bytes ? bytes : 1);
        test_fill_random(bufs[i], bytes, base + i);
        p[i] = (kvf__remote_put){base + i, (uint32_t)(i % 32 + 1), 2, bufs[i], bytes};
    }
    kvf_status rc = kvf__remote_put_batch(r, p, n, st);
    CHECK_STATUS(rc, KVF_OK);
    for (size_t i = 0; i < n; i++)
        CHECK_STATUS(st[i], KVF_OK);
    free(p);
    free(st);
    return rc == KVF_OK ? 0 : -1;
}

/* Gets blocks base..base+n into fresh buffers; statuses in st. */
static void get_blocks(kvf__remote *r, uint64_t base, size_t n, size_t cap, kvf__remote_get *g,
                       kvf_status *st)
{
    for (size_t i = 0; i < n; i++)
        g[i] = (kvf__remote_get){.key = base + i, .dst = malloc(cap ? cap : 1), .cap = cap};
    kvf__remote_get_batch(r, g, n, st);
}

static void free_gets(kvf__remote_get *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(g[i].dst);
}

static int test_round_trip_sizes(void)
{
    kvf__remote *r = open_default("rt", FP);
    REQUIRE(r);
    const size_t sizes[] = {0, 1, 100, 4096 + 3, 16384, 1 << 20, (4 << 20) + 7};
    enum { N = 9 };
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        uint64_t base = 0x100000ull * (s + 1);
        uint8_t *bufs[N];
        CHECK(put_blocks(r, base, N, sizes[s], bufs) == 0);
        kvf__remote_get g[N];
        kvf_status st[N];
        get_blocks(r, base, N, sizes[s] + 11, g, st);
        for (size_t i = 0; i < N; i++) {
            CHECK_STATUS(st[i], KVF_OK);
            CHECK_EQ_U64(g[i].payload_bytes, sizes[s]);
            CHECK_EQ_INT(g[i].tokens, i % 32 + 1);
            CHECK_EQ_INT(g[i].pools, 2);
            CHECK_MEM_EQ(g[i].dst, bufs[i], sizes[s]);
            free(bufs[i]);
        }
        free_gets(g, N);
    }
    kvf__remote_close(r);
    return 0;
}

static int test_miss_exists_delete_range(void)
{
    kvf__remote *r = open_default("med", FP);
    REQUIRE(r);
    uint8_t *bufs[4];
    REQUIRE(put_blocks(r, 10, 4, 1000, bufs) == 0);
    uint64_t keys[6] = {10, 11, 12, 13, 99, 100};
    kvf_status st[6];
    CHECK_STATUS(kvf__remote_exists_batch(r, keys, 6, st), KVF_OK);
    CHECK_STATUS(st[0], KVF_OK);
    CHECK_STATUS(st[3], KVF_OK);
    CHECK_STATUS(st[4], KVF_ERR_NOT_FOUND);
    CHECK_STATUS(kvf__remote_delete_batch(r, keys + 2, 4, st), KVF_OK);
    CHECK_STATUS(st[0], KVF_OK);
    CHECK_STATUS(st[3], KVF_OK); /* absent before: still fine */
    kvf__remote_get g[4];
    kvf_status gs[4];
    get_blocks(r, 10, 4, 1000, g, gs);
    CHECK_STATUS(gs[0], KVF_OK);
    CHECK_MEM_EQ(g[1].dst, bufs[1], 1000);
    CHECK_STATUS(gs[2], KVF_ERR_NOT_FOUND);
    CHECK_STATUS(gs[3], KVF_ERR_NOT_FOUND);
    free_gets(g, 4);
    /* a buffer too small: RANGE for that block, nothing else harmed */
    get_blocks(r, 10, 2, 999, g, gs);
    CHECK_STATUS(gs[0], KVF_ERR_RANGE);
    CHECK_STR_HAS(kvf_last_error(), "0xa");
    free_gets(g, 2);
    CHECK_STATUS(kvf__remote_get_batch(r, NULL, 1, gs), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__remote_put_batch(r, NULL, 0, gs), KVF_ERR_INVALID);
    for (int i = 0; i < 4; i++)
        free(bufs[i]);
    kvf__remote_close(r);
    return 0;
}

static int test_namespace_and_layout(void)
{
    kvf__remote *a = open_default("team-a", FP);
    kvf__remote *b = open_default("team-b", FP);
    kvf__remote *other_layout = open_default("team-a", FP + 1);
    kvf__remote *any_layout = open_default("team-a", 0);
    REQUIRE(a && b && other_layout && any_layout);
    uint8_t *bufs[3];
    REQUIRE(put_blocks(a, 500, 3, 2048, bufs) == 0);
    kvf__remote_get g[3];
    kvf_status st[3];
    get_blocks(b, 500, 3, 2048, g, st);
    for (int i = 0; i < 3; i++)
        CHECK_STATUS(st[i], KVF_ERR_NOT_FOUND);
    free_gets(g, 3);
    get_blocks(other_layout, 500, 3, 2048, g, st);
    for (int i = 0; i < 3; i++)
        CHECK_STATUS(st[i], KVF_ERR_MISMATCH);
    CHECK_STR_HAS(kvf_last_error(), "kvf:team-a:00000000000001f4");
    free_gets(g, 3);
    get_blocks(any_layout, 500, 3, 2048, g, st);
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(st[i], KVF_OK);
        CHECK_MEM_EQ(g[i].dst, bufs[i], 2048);
        free(bufs[i]);
    }
    free_gets(g, 3);
    kvf__remote_close(a);
    kvf__remote_close(b);
    kvf__remote_close(other_layout);
    kvf__remote_close(any_layout);
    return 0;
}

/* A child process stores blocks; the parent, another handle, finds them. */
static int test_two_processes(void)
{
    enum { N = 16 };
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        kvf__remote *r = open_default("shared", FP);
        uint8_t *bufs[N];
        int rc = r && put_blocks(r, 7000, N, 65536, bufs) == 0 ? 0 : 1;
        kvf__remote_close(r);
        _exit(rc || test_failures ? 1 : 0);
    }
    int wstatus;
    REQUIRE(waitpid(pid, &wstatus, 0) == pid);
    CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
    kvf__remote *r = open_default("shared", FP);
    REQUIRE(r);
    kvf__remote_get g[N];
    kvf_status st[N];
    get_blocks(r, 7000, N, 65536, g, st);
    uint8_t *want = malloc(65536);
    for (int i = 0; i < N; i++) {
        CHECK_STATUS(st[i], KVF_OK);
        test_fill_random(want, 65536, 7000 + (uint64_t)i);
        CHECK_MEM_EQ(g[i].dst, want, 65536);
    }
    free(want);
    free_gets(g, N);
    kvf__remote_close(r);
    return 0;
}

/* Values overwritten behind kvferry's back: CORRUPT for those blocks only. */
static int test_corrupt_values(void)
{
    kvf__remote *r = open_default("corrupt", FP);
    REQUIRE(r);
    uint8_t *bufs[5];
    REQUIRE(put_blocks(r, 40, 5, 4096, bufs) == 0);
    /* 41: garbage; 42: a flipped payload byte; 43: a flipped header byte;
     * 44: the value of another key */
    CHECK(redis_run(server.port, NULL, REDIS_REPLY_STATUS, "SET kvf:corrupt:%016x garbage", 41) ==
          0);
    redisContext *c = redis_connect(server.port, NULL);
    REQUIRE(c);
    for (int k = 42; k <= 44; k++) {
        redisReply *rep = redisCommand(c, "GET kvf:corrupt:%016x", k == 44 ? 40 : k);
        REQUIRE(rep && rep->type == REDIS_REPLY_STRING);
        if (k == 42)
            rep->str[KVF_BLOCKFILE_HEADER_BYTES + 100] ^= 0x10;
        if (k == 43)
            rep->str[30] ^= 0x01;
        redisReply *set = redisCommand(c, "SET kvf:corrupt:%016x %b", k, rep->str, rep->len);
        CHECK(set && set->type == REDIS_REPLY_STATUS);
        freeReplyObject(set);
        freeReplyObject(rep);
    }
    redisFree(c);
    kvf__remote_get g[5];
    kvf_status st[5];
    get_blocks(r, 40, 5, 4096, g, st);
    CHECK_STATUS(st[0], KVF_OK);
    CHECK_MEM_EQ(g[0].dst, bufs[0], 4096);
    for (int i = 1; i < 5; i++)
        CHECK_STATUS(st[i], KVF_ERR_CORRUPT);
    free_gets(g, 5);
    /* the batch's error names the first bad block and the node */
    get_blocks(r, 41, 1, 4096, g, st);
    CHECK_STR_HAS(kvf_last_error(), "block 0x29");
    CHECK_STR_HAS(kvf_last_error(), "kvf:corrupt:0000000000000029");
    char node[32];
    snprintf(node, sizeof node, "127.0.0.1:%d", server.port);
    CHECK_STR_HAS(kvf_last_error(), node);
    free_gets(g, 1);
    for (int i = 0; i < 5; i++)
        free(bufs[i]);
    kvf__remote_close(r);
    return 0;
}

/* A value far larger than any block under a block key (stored behind
 * kvferry's back) is refused without being read whole: the peak memory
 * of a fresh process (this program run with --oversize PORT) that gets
 * it does not grow by its size; the value stays. */
enum { BIG = 64 << 20 };

static int oversize_child(int port)
{
    server.port = port;
    kvf__remote *r = open_default("big", FP);
    if (!r)
        return 2;
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    kvf__remote_get g[1];
    kvf_status st[1];
    get_blocks(r, 0x60, 1, 4096, g, st);
    getrusage(RUSAGE_SELF, &after);
    CHECK_STATUS(st[0], KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "kvf:big:0000000000000060");
    char node[32];
    snprintf(node, sizeof node, "127.0.0.1:%d", port);
    CHECK_STR_HAS(kvf_last_error(), node);
    long grew_kib = after.ru_maxrss - before.ru_maxrss;
    fprintf(stderr, "  64 MiB value refused; peak RSS grew by %ld KiB\n", grew_kib);
    CHECK(grew_kib < 8 * 1024);
    free_gets(g, 1);
    kvf__remote_close(r);
    return TEST_RESULT();
}

static const char *self_path;

static int test_oversize_value(void)
{
    kvf__remote *r = open_default("big", FP);
    REQUIRE(r);
    uint8_t *bufs[1];
    REQUIRE(put_blocks(r, 0x60, 1, 4096, bufs) == 0);
    /* SETRANGE pads the valid block with zeros up to 64 MiB, without the
     * value passing through this process */
    CHECK(redis_run(server.port, NULL, REDIS_REPLY_INTEGER, "SETRANGE kvf:big:%016x %d x", 0x60,
                    BIG - 1) == 0);
    char port[16];
    snprintf(port, sizeof port, "%d", server.port);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        execl(self_path, self_path, "--oversize", port, (char *)NULL);
        _exit(127);
    }
    int ws;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    CHECK(redis_run(server.port, NULL, REDIS_REPLY_INTEGER, "STRLEN kvf:big:%016x", 0x60) == 0);
    /* an empty value is no block: a miss */
    CHECK(redis_run(server.port, NULL, REDIS_REPLY_STATUS, "SET kvf:big:%016x %s", 0x61, "") == 0);
    kvf__remote_get g[1];
    kvf_status st[1];
    get_blocks(r, 0x61, 1, 4096, g, st);
    CHECK_STATUS(st[0], KVF_ERR_NOT_FOUND);
    free_gets(g, 1);
    free(bufs[0]);
    kvf__remote_close(r);
    return 0;
}

static int test_ttl_and_db(void)
{
    char url[128];
    redis_url(url, sizeof url, &server, "/3");
    kvf__remote *r = open_remote(url, "ttl", FP, 120);
    REQUIRE(r);
    uint8_t *bufs[1];
    REQUIRE(put_blocks(r, 1, 1, 300, bufs) == 0);
    free(bufs[0]);
    redisContext *c = redis_connect(server.port, NULL);
    REQUIRE(c);
    redisReply *rep = redisCommand(c, "SELECT 3");
    freeReplyObject(rep);
    rep = redisCommand(c, "TTL kvf:ttl:0000000000000001");
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 100 && rep->integer <= 120);
    freeReplyObject(rep);
    rep = redisCommand(c, "SELECT 0");
    freeReplyObject(rep);
    rep = redisCommand(c, "EXISTS kvf:ttl:0000000000000001");
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 0); /* db 3, not 0 */
    freeReplyObject(rep);
    redisFree(c);
    kvf__remote_close(r);
    return 0;
}

static int test_auth(void)
{
    redis_server s = {.extras = 2};
    strcpy(s.extra[0], "--requirepass");
    strcpy(s.extra[1], "rootpw");
    REQUIRE(redis_server_start(&s, "rootpw") == 0);
    CHECK(redis_run(s.port, "rootpw", REDIS_REPLY_STATUS,
                    "ACL SETUSER alice on >wonderland ~kvf:* +@all") == 0);
    char url[160];
    snprintf(url, sizeof url, "redis://alice:wonderland@127.0.0.1:%d", s.port);
    kvf__remote *r = open_remote(url, "auth", FP, 0);
    CHECK(r != NULL);
    uint8_t *bufs[2];
    if (r)
        CHECK(put_blocks(r, 1, 2, 512, bufs) == 0);
    kvf__remote_close(r);
    for (int i = 0; r && i < 2; i++)
        free(bufs[i]);
    snprintf(url, sizeof url, "redis://:rootpw@127.0.0.1:%d/1", s.port);
    r = open_remote(url, "auth", FP, 0);
    CHECK(r != NULL);
    kvf__remote_close(r);

    kvf__remote_config cfg = KVF_REMOTE_CONFIG_INIT;
    cfg.url = url;
    cfg.ns = "auth";
    snprintf(url, sizeof url, "redis://alice:rabbit@127.0.0.1:%d", s.port);
    CHECK_STATUS(kvf__remote_open(&cfg, &r), KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "AUTH as user 'alice' refused");
    CHECK(!strstr(kvf_last_error(), "rabbit"));
    snprintf(url, sizeof url, "redis://:nope@127.0.0.1:%d", s.port);
    CHECK_STATUS(kvf__remote_open(&cfg, &r), KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "AUTH");
    /* no password at all: the first command is refused */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/2", s.port);
    CHECK_STATUS(kvf__remote_open(&cfg, &r), KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "NOAUTH");
    redis_server_stop(&s);
    return 0;
}

/* A server that stops answering (SIGSTOP): TIMEOUT within the configured
 * timeout, then the tier works again once it answers. */
static int test_stalled_server(void)
{
    redis_server s = {0};
    REQUIRE(redis_server_start(&s, NULL) == 0);
    char url[128];
    redis_url(url, sizeof url, &s, NULL);
    kvf__remote_config cfg = KVF_REMOTE_CONFIG_INIT;
    cfg.url = url;
    cfg.ns = "stall";
    cfg.timeout_ms = 400;
    cfg.connect_timeout_ms = 400;
    cfg.down_ms = 300;
    kvf__remote *r = NULL;
    REQUIRE(kvf__remote_open(&cfg, &r) == KVF_OK);
    uint8_t *bufs[4];
    REQUIRE(put_blocks(r, 1, 4, 8192, bufs) == 0);
    REQUIRE(kill(s.pid, SIGSTOP) == 0);
    kvf__remote_get g[4];
    kvf_status st[4];
    double t0 = redis_now_s();
    get_blocks(r, 1, 4, 8192, g, st);
    double waited = redis_now_s() - t0;
    for (int i = 0; i < 4; i++)
        CHECK_STATUS(st[i], KVF_ERR_TIMEOUT);
    CHECK_STR_HAS(kvf_last_error(), "400 ms");
    CHECK(waited >= 0.35 && waited < 3.0);
    free_gets(g, 4);
    /* a new connection (the stalled one was dropped) times out too */
    t0 = redis_now_s();
    kvf__remote_put p = {9, 1, 1, bufs[0], 8192};
    CHECK_STATUS(kvf__remote_put_batch(r, &p, 1, st), KVF_ERR_TIMEOUT);
    CHECK(redis_now_s() - t0 < 3.0);
    kill(s.pid, SIGCONT);
    get_blocks(r, 1, 4, 8192, g, st);
    for (int i = 0; i < 4; i++) {
        CHECK_STATUS(st[i], KVF_OK);
        CHECK_MEM_EQ(g[i].dst, bufs[i], 8192);
        free(bufs[i]);
    }
    free_gets(g, 4);

    /* killed: REMOTE naming the node; restarted on the same port: recovers */
    redis_server_kill(&s);
    get_blocks(r, 1, 1, 8192, g, st);
    CHECK_STATUS(st[0], KVF_ERR_REMOTE);
    char node[32];
    snprintf(node, sizeof node, "127.0.0.1:%d", s.port);
    CHECK_STR_HAS(kvf_last_error(), node);
    /* left alone a while: the next batch fails at once, saying so */
    t0 = redis_now_s();
    get_blocks(r, 1, 1, 8192, g + 1, st);
    CHECK_STATUS(st[0], KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "down, next attempt in");
    CHECK(redis_now_s() - t0 < 0.2);
    free_gets(g, 2);
    char detail[256];
    CHECK(kvf__remote_probe(url, 300, detail, sizeof detail) != KVF_OK);
    CHECK_STR_HAS(detail, node);
    REQUIRE(redis_server_start(&s, NULL) == 0);
    usleep(350 * 1000); /* the down window passes */
    get_blocks(r, 1, 1, 8192, g, st);
    CHECK_STATUS(st[0], KVF_ERR_NOT_FOUND); /* nothing kept on disk */
    free_gets(g, 1);
    REQUIRE(put_blocks(r, 1, 2, 100, bufs) == 0);
    free(bufs[0]);
    free(bufs[1]);
    CHECK_STATUS(kvf__remote_probe(url, 300, detail, sizeof detail), KVF_OK);
    CHECK_STR_HAS(detail, node);
    kvf__remote_close(r);
    redis_server_stop(&s);
    return 0;
}

typedef struct worker {
    kvf__remote *r;
    uint64_t base;
    int errors;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    enum { N = 8, BYTES = 24 * 1024 };
    uint8_t *bufs[N];
    kvf__remote_put p[N];
    kvf__remote_get g[N];
    kvf_status st[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(BYTES);
        g[i].dst = malloc(BYTES);
    }
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < N; i++) {
            uint64_t key = w->base + (uint64_t)i;
            test_fill_random(bufs[i], BYTES, key * 1000 + (uint64_t)round);
            p[i] = (kvf__remote_put){key, 4, 1, bufs[i], BYTES};
        }
        if (kvf__remote_put_batch(w->r, p, N, st) != KVF_OK)
            w->errors++;
        for (int i = 0; i < N; i++) {
            g[i].key = w->base + (uint64_t)i;
            g[i].cap = BYTES;
        }
        if (kvf__remote_get_batch(w->r, g, N, st) != KVF_OK)
            w->errors++;
        for (int i = 0; i < N; i++)
            if (st[i] != KVF_OK || memcmp(g[i].dst, bufs[i], BYTES) != 0)
                w->errors++;
    }
    for (int i = 0; i < N; i++) {
        free(bufs[i]);
        free(g[i].dst);
    }
    return NULL;
}

static int test_threads(void)
{
    kvf__remote *r = open_default("threads", FP);
    REQUIRE(r);
    enum { T = 4 };
    pthread_t th[T];
    worker w[T];
    for (int i = 0; i < T; i++) {
        w[i] = (worker){r, 1000u * (uint64_t)(i + 1), 0};
        REQUIRE(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(w[i].errors, 0);
    }
    CHECK_STATUS(kvf__remote_ping(r), KVF_OK);
    kvf__remote_close(r);
    return 0;
}

static int test_open_errors(void)
{
    kvf__remote_config cfg = KVF_REMOTE_CONFIG_INIT;
    kvf__remote *r = NULL;
    CHECK_STATUS(kvf__remote_open(&cfg, &r), KVF_ERR_INVALID);
    cfg.url = "redis://127.0.0.1:1";
    cfg.ns = "bad/ns";
    CHECK_STATUS(kvf__remote_open(&cfg, &r), KVF_ERR_INVALID);
    cfg.ns = "ok";
    CHECK_STATUS(kvf__remote_open(&cfg, &r), KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "127.0.0.1:1");
    CHECK(r == NULL);
    return 0;
}

#endif /* KVF_HAVE_HIREDIS */

int main(int argc, char **argv)
{
#ifdef KVF_HAVE_HIREDIS
    self_path = argv[0];
    if (argc == 3 && strcmp(argv[1], "--oversize") == 0)
        return oversize_child(atoi(argv[2]));
#else
    (void)argc;
    (void)argv;
#endif
    RUN(test_url_parse);
#ifndef KVF_HAVE_HIREDIS
    kvf__remote_config cfg = KVF_REMOTE_CONFIG_INIT;
    cfg.url = "redis://127.0.0.1";
    cfg.ns = "x";
    kvf__remote *r = NULL;
    CHECK_STATUS(kvf__remote_open(&cfg, &r), KVF_ERR_UNSUPPORTED);
    CHECK_STR_HAS(kvf_last_error(), "hiredis");
    if (test_failures)
        return 1;
    TEST_SKIP_ALL("built without hiredis: the URL parser alone was tested");
#else
    redis_skip_unless_installed();
    RUN(test_open_errors);
    REQUIRE(redis_server_start(&server, NULL) == 0);
    RUN(test_round_trip_sizes);
    RUN(test_miss_exists_delete_range);
    RUN(test_namespace_and_layout);
    RUN(test_two_processes);
    RUN(test_corrupt_values);
    RUN(test_oversize_value);
    RUN(test_ttl_and_db);
    RUN(test_threads);
    RUN(test_auth);
    RUN(test_stalled_server);
    redis_server_stop(&server);
    return TEST_RESULT();
#endif
}
