/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier against one real redis-server: URLs parsed, errors on
 * open, round trips of every size, misses, exists and range deletes,
 * namespaces and layouts, two processes, TTL and databases, threads.
 * Built without hiredis, the URL parser alone is tested.
 */
#include "remote_fixture.h"
#ifdef KVF_HAVE_HIREDIS
#include "redis_list_check.h"
#endif

static int test_url_parse(void)
{
    kvf__redis_url u;
    CHECK_STATUS(kvf__redis_url_parse("redis://localhost", &u), KVF_OK);
    CHECK(!u.cluster && u.seeds == 1 && u.seed[0].port == 6379 && u.db == 0);
    CHECK(!strcmp(u.seed[0].host, "localhost") && !u.user[0] && !u.pass[0]);
    CHECK_STATUS(kvf__redis_url_parse("redis://al%40ice:p%3Ass@10.0.0.1:7000/5", &u), KVF_OK);
    CHECK(!strcmp(u.user, "al@ice") && !strcmp(u.pass, "p:ss"));
    CHECK(!strcmp(u.seed[0].host, "10.0.0.1") && u.seed[0].port == 7000 && u.db == 5);
    CHECK_STATUS(kvf__redis_url_parse("redis://:secret@h/", &u), KVF_OK);
    CHECK(!u.user[0] && !strcmp(u.pass, "secret") && u.db == 0);
    CHECK_STATUS(kvf__redis_url_parse("redis://[::1]:6380", &u), KVF_OK);
    CHECK(!strcmp(u.seed[0].host, "::1") && u.seed[0].port == 6380);
    CHECK_STATUS(kvf__redis_url_parse("redis-cluster://h1:7000,h2:7001,[::1]:7002", &u), KVF_OK);
    CHECK(u.cluster && u.seeds == 3 && u.seed[1].port == 7001 && !strcmp(u.seed[2].host, "::1"));
    const char *bad[] = {"http://h",       "redis://",       "redis://h:0", "redis://h:99999",
                         "redis://h:x",    "redis://h/abc",  "redis://a,b", "redis-cluster://a,b/1",
                         "redis://user@h", "redis://:p%4@h", "redis://[::1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvf_status st = kvf__redis_url_parse(bad[i], &u);
        if (st != KVF_ERR_INVALID)
            TEST_FAIL_AT(__FILE__, __LINE__, "'%s' parsed (%d)", bad[i], (int)st);
    }
    /* a refused URL never repeats its password */
    kvf__redis_url_parse("redis://u:topsecret@h:bad", &u);
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
        kvf_status st = kvf__redis_url_parse(m, &u);
        if (st != KVF_OK && st != KVF_ERR_INVALID)
            TEST_FAIL_AT(__FILE__, __LINE__, "'%s': status %d", m, (int)st);
    }
    setenv(KVF_REMOTE_URL_ENV, "", 1);
    CHECK(kvf__store_url_from_env() == NULL);
    setenv(KVF_REMOTE_URL_ENV, "redis://h", 1);
    CHECK(kvf__store_url_from_env() && !strcmp(kvf__store_url_from_env(), "redis://h"));
    unsetenv(KVF_REMOTE_URL_ENV);
    kvf__redis_close(NULL);
    return 0;
}

#ifdef KVF_HAVE_HIREDIS

static int test_round_trip_sizes(void)
{
    kvf__redis *r = open_default("rt", FP);
    REQUIRE(r);
    const size_t sizes[] = {0, 1, 100, 4096 + 3, 16384, 1 << 20, (4 << 20) + 7};
    enum { N = 9 };
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        uint64_t base = 0x100000ull * (s + 1);
        uint8_t *bufs[N];
        CHECK(put_blocks(r, base, N, sizes[s], bufs) == 0);
        kvf__redis_get g[N];
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
    kvf__redis_close(r);
    return 0;
}

static int test_miss_exists_delete_range(void)
{
    kvf__redis *r = open_default("med", FP);
    REQUIRE(r);
    uint8_t *bufs[4];
    REQUIRE(put_blocks(r, 10, 4, 1000, bufs) == 0);
    kvf_key keys[6] = {KEY(10), KEY(11), KEY(12), KEY(13), KEY(99), KEY(100)};
    kvf_status st[6];
    CHECK_STATUS(kvf__redis_exists_batch(r, keys, 6, st), KVF_OK);
    CHECK_STATUS(st[0], KVF_OK);
    CHECK_STATUS(st[3], KVF_OK);
    CHECK_STATUS(st[4], KVF_ERR_NOT_FOUND);
    CHECK_STATUS(kvf__redis_delete_batch(r, keys + 2, 4, st), KVF_OK);
    CHECK_STATUS(st[0], KVF_OK);
    CHECK_STATUS(st[3], KVF_OK); /* absent before: still fine */
    kvf__redis_get g[4];
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
    CHECK_STR_HAS(kvf_last_error(), "0000000000000000000000000000000a");
    free_gets(g, 2);
    CHECK_STATUS(kvf__redis_get_batch(r, NULL, 1, gs), KVF_ERR_INVALID);
    CHECK_STATUS(kvf__redis_put_batch(r, NULL, 0, gs), KVF_ERR_INVALID);
    for (int i = 0; i < 4; i++)
        free(bufs[i]);
    kvf__redis_close(r);
    return 0;
}

static int test_namespace_and_layout(void)
{
    kvf__redis *a = open_default("team-a", FP);
    kvf__redis *b = open_default("team-b", FP);
    kvf__redis *other_layout = open_default("team-a", FP + 1);
    kvf__redis *any_layout = open_default("team-a", 0);
    REQUIRE(a && b && other_layout && any_layout);
    uint8_t *bufs[3];
    REQUIRE(put_blocks(a, 500, 3, 2048, bufs) == 0);
    kvf__redis_get g[3];
    kvf_status st[3];
    get_blocks(b, 500, 3, 2048, g, st);
    for (int i = 0; i < 3; i++)
        CHECK_STATUS(st[i], KVF_ERR_NOT_FOUND);
    free_gets(g, 3);
    get_blocks(other_layout, 500, 3, 2048, g, st);
    for (int i = 0; i < 3; i++)
        CHECK_STATUS(st[i], KVF_ERR_MISMATCH);
    CHECK_STR_HAS(kvf_last_error(), "kvf:team-a:000000000000000000000000000001f4");
    free_gets(g, 3);
    get_blocks(any_layout, 500, 3, 2048, g, st);
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(st[i], KVF_OK);
        CHECK_MEM_EQ(g[i].dst, bufs[i], 2048);
        free(bufs[i]);
    }
    free_gets(g, 3);
    kvf__redis_close(a);
    kvf__redis_close(b);
    kvf__redis_close(other_layout);
    kvf__redis_close(any_layout);
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
        kvf__redis *r = open_default("shared", FP);
        uint8_t *bufs[N];
        int rc = r && put_blocks(r, 7000, N, 65536, bufs) == 0 ? 0 : 1;
        kvf__redis_close(r);
        _exit(rc || test_failures ? 1 : 0);
    }
    int wstatus;
    REQUIRE(waitpid(pid, &wstatus, 0) == pid);
    CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
    kvf__redis *r = open_default("shared", FP);
    REQUIRE(r);
    kvf__redis_get g[N];
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
    kvf__redis_close(r);
    return 0;
}

/* Listing a namespace with more blocks than one SCAN page, on a server
 * whose KEYS is disabled (a listing that walks the whole keyspace in one
 * blocking call would fail): each block once; another namespace's blocks,
 * a value that is no block and one cut short under block names are not
 * listed. */
static int test_list_scan(void)
{
    redis_server s = {0};
    strcpy(s.extra[0], "--rename-command");
    strcpy(s.extra[1], "KEYS");
    s.extra[2][0] = '\0';
    s.extras = 3;
    REQUIRE(redis_server_start(&s, NULL) == 0);
    REQUIRE(redis_run(s.port, NULL, REDIS_REPLY_ERROR, "KEYS *") == 0); /* KEYS is gone */
    char url[128];
    redis_url(url, sizeof url, &s, NULL);
    kvf__redis *r = open_remote(url, "scan", FP, 0), *other = open_remote(url, "scan2", FP, 0);
    REQUIRE(r && other);
    uint8_t *bufs[3];
    REQUIRE(put_blocks(other, 0x5ca0000, 3, 100, bufs) == 0); /* another namespace */
    for (int i = 0; i < 3; i++)
        free(bufs[i]);
    REQUIRE(put_blocks(r, 0xbad0000, 1, 100, bufs) == 0);
    free(bufs[0]);
    REQUIRE(redis_run(s.port, NULL, REDIS_REPLY_STATUS,
                      "SET kvf:scan:000000000000000000000000000000ff junk") == 0);
    REQUIRE(redis_run(s.port, NULL, REDIS_REPLY_INTEGER,
                      "SETRANGE kvf:scan:0000000000000000%016llx 400 x",
                      0xbad0000ull) == 0); /* longer than its header says */
    REQUIRE(redis_run(s.port, NULL, REDIS_REPLY_STATUS, "SET kvf:scan:notakey x") == 0);
    redis_check_list_many(r, 0x7000000, 2500);
    kvf__redis_close(r);
    kvf__redis_close(other);
    redis_server_stop(&s);
    return 0;
}

static int test_ttl_and_db(void)
{
    char url[128];
    redis_url(url, sizeof url, &server, "/3");
    kvf__redis *r = open_remote(url, "ttl", FP, 120);
    REQUIRE(r);
    uint8_t *bufs[1];
    REQUIRE(put_blocks(r, 1, 1, 300, bufs) == 0);
    free(bufs[0]);
    redisContext *c = redis_connect(server.port, NULL);
    REQUIRE(c);
    redisReply *rep = redisCommand(c, "SELECT 3");
    freeReplyObject(rep);
    rep = redisCommand(c, "TTL kvf:ttl:00000000000000000000000000000001");
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 100 && rep->integer <= 120);
    freeReplyObject(rep);
    rep = redisCommand(c, "SELECT 0");
    freeReplyObject(rep);
    rep = redisCommand(c, "EXISTS kvf:ttl:00000000000000000000000000000001");
    CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 0); /* db 3, not 0 */
    freeReplyObject(rep);
    redisFree(c);
    kvf__redis_close(r);
    return 0;
}

typedef struct worker {
    kvf__redis *r;
    uint64_t base;
    int errors;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    enum { N = 8, BYTES = 24 * 1024 };
    uint8_t *bufs[N];
    kvf__redis_put p[N];
    kvf__redis_get g[N];
    kvf_status st[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(BYTES);
        g[i].dst = malloc(BYTES);
    }
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < N; i++) {
            uint64_t key = w->base + (uint64_t)i;
            test_fill_random(bufs[i], BYTES, key * 1000 + (uint64_t)round);
            p[i] = (kvf__redis_put){KEY(key), 4, 1, bufs[i], BYTES};
        }
        if (kvf__redis_put_batch(w->r, p, N, st) != KVF_OK)
            w->errors++;
        for (int i = 0; i < N; i++) {
            g[i].key = TKEY(w->base + (uint64_t)i);
            g[i].cap = BYTES;
        }
        if (kvf__redis_get_batch(w->r, g, N, st) != KVF_OK)
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
    kvf__redis *r = open_default("threads", FP);
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
    CHECK_STATUS(kvf__redis_ping(r), KVF_OK);
    kvf__redis_close(r);
    return 0;
}

static int test_open_errors(void)
{
    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    kvf__redis *r = NULL;
    CHECK_STATUS(kvf__redis_open(&cfg, &r), KVF_ERR_INVALID);
    cfg.url = "redis://127.0.0.1:1";
    cfg.ns = "bad/ns";
    CHECK_STATUS(kvf__redis_open(&cfg, &r), KVF_ERR_INVALID);
    cfg.ns = "ok";
    CHECK_STATUS(kvf__redis_open(&cfg, &r), KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "127.0.0.1:1");
    CHECK(r == NULL);
    return 0;
}

#endif /* KVF_HAVE_HIREDIS */

int main(void)
{
    RUN(test_url_parse);
#ifndef KVF_HAVE_HIREDIS
    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    cfg.url = "redis://127.0.0.1";
    cfg.ns = "x";
    kvf__redis *r = NULL;
    CHECK_STATUS(kvf__redis_open(&cfg, &r), KVF_ERR_UNSUPPORTED);
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
    RUN(test_ttl_and_db);
    RUN(test_threads);
    RUN(test_list_scan);
    redis_server_stop(&server);
    return TEST_RESULT();
#endif
}
