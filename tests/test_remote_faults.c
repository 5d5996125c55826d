/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier against one real redis-server when things go wrong:
 * values overwritten behind kvferry's back, a value too large to take,
 * AUTH, and a server that stops answering. Skipped without hiredis.
 */
#include "remote_fixture.h"

#ifdef KVF_HAVE_HIREDIS

/* Values overwritten behind kvferry's back: CORRUPT for those blocks only. */
static int test_corrupt_values(void)
{
    kvf__redis *r = open_default("corrupt", FP);
    REQUIRE(r);
    uint8_t *bufs[5];
    REQUIRE(put_blocks(r, 40, 5, 4096, bufs) == 0);
    /* 41: garbage; 42: a flipped payload byte; 43: a flipped header byte;
     * 44: the value of another key */
    CHECK(redis_run(server.port, NULL, REDIS_REPLY_STATUS,
                    "SET kvf:corrupt:0000000000000000%016x garbage", 41) == 0);
    redisContext *c = redis_connect(server.port, NULL);
    REQUIRE(c);
    for (int k = 42; k <= 44; k++) {
        redisReply *rep =
            redisCommand(c, "GET kvf:corrupt:0000000000000000%016x", k == 44 ? 40 : k);
        REQUIRE(rep && rep->type == REDIS_REPLY_STRING);
        if (k == 42)
            rep->str[256 + 100] ^= 0x10; /* in the payload */
        if (k == 43)
            rep->str[30] ^= 0x01;
        redisReply *set =
            redisCommand(c, "SET kvf:corrupt:0000000000000000%016x %b", k, rep->str, rep->len);
        CHECK(set && set->type == REDIS_REPLY_STATUS);
        freeReplyObject(set);
        freeReplyObject(rep);
    }
    redisFree(c);
    kvf__redis_get g[5];
    kvf_status st[5];
    get_blocks(r, 40, 5, 4096, g, st);
    CHECK_STATUS(st[0], KVF_OK);
    CHECK_MEM_EQ(g[0].dst, bufs[0], 4096);
    for (int i = 1; i < 5; i++)
        CHECK_STATUS(st[i], KVF_ERR_CORRUPT);
    free_gets(g, 5);
    /* the batch's error names the first bad block and the node */
    get_blocks(r, 41, 1, 4096, g, st);
    CHECK_STR_HAS(kvf_last_error(), "block 00000000000000000000000000000029");
    CHECK_STR_HAS(kvf_last_error(), "kvf:corrupt:00000000000000000000000000000029");
    char node[32];
    snprintf(node, sizeof node, "127.0.0.1:%d", server.port);
    CHECK_STR_HAS(kvf_last_error(), node);
    free_gets(g, 1);
    for (int i = 0; i < 5; i++)
        free(bufs[i]);
    kvf__redis_close(r);
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
    kvf__redis *r = open_default("big", FP);
    if (!r)
        return 2;
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    kvf__redis_get g[1];
    kvf_status st[1];
    get_blocks(r, 0x60, 1, 4096, g, st);
    getrusage(RUSAGE_SELF, &after);
    CHECK_STATUS(st[0], KVF_ERR_CORRUPT);
    CHECK_STR_HAS(kvf_last_error(), "kvf:big:00000000000000000000000000000060");
    char node[32];
    snprintf(node, sizeof node, "127.0.0.1:%d", port);
    CHECK_STR_HAS(kvf_last_error(), node);
    long grew_kib = after.ru_maxrss - before.ru_maxrss;
    fprintf(stderr, "  64 MiB value refused; peak RSS grew by %ld KiB\n", grew_kib);
    CHECK(grew_kib < 8 * 1024);
    free_gets(g, 1);
    kvf__redis_close(r);
    return TEST_RESULT();
}

static const char *self_path;

static int test_oversize_value(void)
{
    kvf__redis *r = open_default("big", FP);
    REQUIRE(r);
    uint8_t *bufs[1];
    REQUIRE(put_blocks(r, 0x60, 1, 4096, bufs) == 0);
    /* SETRANGE pads the valid block with zeros up to 64 MiB, without the
     * value passing through this process */
    CHECK(redis_run(server.port, NULL, REDIS_REPLY_INTEGER,
                    "SETRANGE kvf:big:0000000000000000%016x %d x", 0x60, BIG - 1) == 0);
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
    CHECK(redis_run(server.port, NULL, REDIS_REPLY_INTEGER, "STRLEN kvf:big:0000000000000000%016x",
                    0x60) == 0);
    /* an empty value is no block: a miss */
    CHECK(redis_run(server.port, NULL, REDIS_REPLY_STATUS, "SET kvf:big:0000000000000000%016x %s",
                    0x61, "") == 0);
    kvf__redis_get g[1];
    kvf_status st[1];
    get_blocks(r, 0x61, 1, 4096, g, st);
    CHECK_STATUS(st[0], KVF_ERR_NOT_FOUND);
    free_gets(g, 1);
    free(bufs[0]);
    kvf__redis_close(r);
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
    kvf__redis *r = open_remote(url, "auth", FP, 0);
    CHECK(r != NULL);
    uint8_t *bufs[2];
    if (r)
        CHECK(put_blocks(r, 1, 2, 512, bufs) == 0);
    kvf__redis_close(r);
    for (int i = 0; r && i < 2; i++)
        free(bufs[i]);
    snprintf(url, sizeof url, "redis://:rootpw@127.0.0.1:%d/1", s.port);
    r = open_remote(url, "auth", FP, 0);
    CHECK(r != NULL);
    kvf__redis_close(r);

    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    cfg.url = url;
    cfg.ns = "auth";
    snprintf(url, sizeof url, "redis://alice:rabbit@127.0.0.1:%d", s.port);
    CHECK_STATUS(kvf__redis_open(&cfg, &r), KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "AUTH as user 'alice' refused");
    CHECK(!strstr(kvf_last_error(), "rabbit"));
    snprintf(url, sizeof url, "redis://:nope@127.0.0.1:%d", s.port);
    CHECK_STATUS(kvf__redis_open(&cfg, &r), KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "AUTH");
    /* no password at all: the first command is refused */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/2", s.port);
    CHECK_STATUS(kvf__redis_open(&cfg, &r), KVF_ERR_REMOTE);
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
    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    cfg.url = url;
    cfg.ns = "stall";
    cfg.timeout_ms = 400;
    cfg.connect_timeout_ms = 400;
    cfg.down_ms = 300;
    kvf__redis *r = NULL;
    REQUIRE(kvf__redis_open(&cfg, &r) == KVF_OK);
    uint8_t *bufs[4];
    REQUIRE(put_blocks(r, 1, 4, 8192, bufs) == 0);
    REQUIRE(kill(s.pid, SIGSTOP) == 0);
    kvf__redis_get g[4];
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
    kvf__redis_put p = {KEY(9), 1, 1, bufs[0], 8192};
    CHECK_STATUS(kvf__redis_put_batch(r, &p, 1, st), KVF_ERR_TIMEOUT);
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
    CHECK(kvf__redis_probe(url, 300, detail, sizeof detail) != KVF_OK);
    CHECK_STR_HAS(detail, node);
    REQUIRE(redis_server_start(&s, NULL) == 0);
    usleep(350 * 1000); /* the down window passes */
    get_blocks(r, 1, 1, 8192, g, st);
    CHECK_STATUS(st[0], KVF_ERR_NOT_FOUND); /* nothing kept on disk */
    free_gets(g, 1);
    REQUIRE(put_blocks(r, 1, 2, 100, bufs) == 0);
    free(bufs[0]);
    free(bufs[1]);
    CHECK_STATUS(kvf__redis_probe(url, 300, detail, sizeof detail), KVF_OK);
    CHECK_STR_HAS(detail, node);
    kvf__redis_close(r);
    redis_server_stop(&s);
    return 0;
}

#endif /* KVF_HAVE_HIREDIS */

int main(int argc, char **argv)
{
#ifdef KVF_HAVE_HIREDIS
    self_path = argv[0];
    if (argc == 3 && strcmp(argv[1], "--oversize") == 0)
        return oversize_child(atoi(argv[2]));
    redis_skip_unless_installed();
    REQUIRE(redis_server_start(&server, NULL) == 0);
    RUN(test_corrupt_values);
    RUN(test_oversize_value);
    RUN(test_auth);
    RUN(test_stalled_server);
    redis_server_stop(&server);
    return TEST_RESULT();
#else
    (void)argc;
    (void)argv;
    TEST_SKIP_ALL("built without hiredis: test_remote_blocks tests the URL parser");
#endif
}
