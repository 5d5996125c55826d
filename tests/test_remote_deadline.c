/* SPDX-License-Identifier: Apache-2.0 */
/* A remote batch ends by its deadline (remote.timeout_ms plus its bytes
 * at the floor rate), however many chunks it has and however slowly the
 * node sends: a redis-server stopped (SIGSTOP) under an onboard of 2048
 * blocks, and a fake server that sends one byte every 100 ms. An
 * unreachable server does not flood the log. Skips (77) without hiredis
 * or redis-server. */
#include "testutil.h"

#ifndef KVF_HAVE_HIREDIS
int main(void)
{
    TEST_SKIP_ALL("built without hiredis");
}
#else

#include "redis_server.h"

#include <arpa/inet.h>
#include <poll.h>

#define POISON 0xC3
#define TIMEOUT_MS 300
/* what the engine adds to the timeout for a batch's bytes */
#define FLOOR_BYTES_PER_S (256.0 * 1024 * 1024)
/* scheduling slack on a loaded machine */
#define SLACK_S 0.5

static const kvf_geometry G = {2, 2, 2, 16, 32, KVF_DTYPE_BF16, KVF_ORDER_HEAD_MAJOR};

typedef struct capture {
    pthread_mutex_t mu;
    size_t warnings;
    char text[8192];
} capture;

static capture cap = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void capture_line(void *user, kvf_log_level level, const char *line)
{
    capture *c = user;
    pthread_mutex_lock(&c->mu);
    c->warnings += level == KVF_LOG_WARN;
    size_t len = strlen(c->text);
    snprintf(c->text + len, sizeof c->text - len, "%s\n", line);
    pthread_mutex_unlock(&c->mu);
}

static void capture_reset(void)
{
    pthread_mutex_lock(&cap.mu);
    cap.warnings = 0;
    cap.text[0] = '\0';
    pthread_mutex_unlock(&cap.mu);
}

static kvf_engine *open_engine(const char *url, const char *ns, uint32_t slots, uint32_t timeout_ms)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 2;
    cfg.file.namespace_ = ns;
    cfg.remote.url = url;
    cfg.remote.timeout_ms = timeout_ms;
    kvf_engine *e = NULL;
    if (kvf_engine_create(&cfg, &e) != KVF_OK)
        return NULL;
    kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, slots};
    if (kvf_engine_add_pool(e, &G, &prim, NULL, NULL) != KVF_OK) {
        kvf_engine_destroy(e);
        return NULL;
    }
    return e;
}

static uint8_t *slot(kvf_engine *e, uint32_t s)
{
    void *p = NULL;
    kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, s, &p);
    return p;
}

static double now_s(void)
{
    return redis_now_s();
}

/* (a) A stopped server under a batch of many chunks: the wait ends within
 * the batch's deadline, not a timeout per chunk; once running again, the
 * next batch reconnects and reads the blocks back whole. */
static int test_stopped_server(void)
{
    enum { N = 2048 };
    redis_server s = {0};
    REQUIRE(redis_server_start(&s, NULL) == 0);
    char url[128];
    redis_url(url, sizeof url, &s, NULL);
    /* stored by an engine with the default timeout: under a sanitizer,
     * 16 MiB may take longer than this test's short one */
    kvf_engine *e = open_engine(url, "deadline", N, 0);
    REQUIRE(e);
    size_t bb;
    REQUIRE(kvf_geometry_block_bytes(&G, &bb) == KVF_OK);
    kvf_move *mv = calloc(N, sizeof *mv);
    kvf_status *per = calloc(N, sizeof *per);
    uint8_t *want = malloc((size_t)N * bb);
    REQUIRE(mv && per && want);
    test_fill_random(want, (size_t)N * bb, 17);
    for (uint32_t i = 0; i < N; i++) {
        memcpy(slot(e, i), want + (size_t)i * bb, bb);
        mv[i] = TO_KEY(i, 0x9000 + i);
    }
    kvf_ticket t;
    REQUIRE(kvf_offload(e, KVF_TIER_REMOTE, mv, N, &t) == KVF_OK);
    REQUIRE(kvf_wait(e, t, NULL) == KVF_OK);
    kvf_engine_destroy(e);
    e = open_engine(url, "deadline", N, TIMEOUT_MS);
    REQUIRE(e);
    for (uint32_t i = 0; i < N; i++) {
        memset(slot(e, i), POISON, bb);
        mv[i] = FROM_KEY(0x9000 + i, i);
    }

    capture_reset();
    REQUIRE(kill(s.pid, SIGSTOP) == 0);
    double t0 = now_s();
    REQUIRE(kvf_onboard(e, KVF_TIER_REMOTE, mv, N, &t) == KVF_OK);
    kvf_status st = kvf_wait(e, t, per);
    double took = now_s() - t0;
    kill(s.pid, SIGCONT);
    CHECK_STATUS(st, KVF_ERR_TIMEOUT);
    size_t timed_out = 0;
    for (uint32_t i = 0; i < N; i++)
        timed_out += per[i] == KVF_ERR_TIMEOUT;
    CHECK_EQ_INT(timed_out, N);
    double deadline = TIMEOUT_MS * 1e-3 + (double)N * (double)bb / FLOOR_BYTES_PER_S;
    fprintf(stderr, "  stopped server: %d blocks timed out in %.3f s (deadline %.3f s)\n", N, took,
            deadline);
    CHECK(took < deadline + SLACK_S);
    /* the log names a key and the node */
    char node[32];
    snprintf(node, sizeof node, "127.0.0.1:%d", s.port);
    pthread_mutex_lock(&cap.mu);
    CHECK_STR_HAS(cap.text, node);
    CHECK_STR_HAS(cap.text, "kvf:deadline:000000000000000000000000000090");
    pthread_mutex_unlock(&cap.mu);

    /* running again: the timed-out connections were dropped, new ones work */
    enum { AGAIN = 64 };
    REQUIRE(kvf_onboard(e, KVF_TIER_REMOTE, mv, AGAIN, &t) == KVF_OK);
    CHECK_STATUS(kvf_wait(e, t, NULL), KVF_OK);
    for (uint32_t i = 0; i < AGAIN; i++)
        CHECK_MEM_EQ(slot(e, i), want + (size_t)i * bb, bb);
    kvf_engine_destroy(e);
    redis_server_stop(&s);
    free(mv);
    free(per);
    free(want);
    return 0;
}

/* A fake node on loopback: accepts one connection, then answers whatever
 * it is asked with a bulk string, one byte every 100 ms. Ends by itself:
 * when the client hangs up, or after TRICKLE_BYTES. */
#define TRICKLE_BYTES 60

typedef struct trickle {
    int listen_fd, port;
    int sent;
} trickle;

static void *trickle_main(void *arg)
{
    trickle *t = arg;
    struct pollfd p = {.fd = t->listen_fd, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1)
        return NULL;
    int fd = accept(t->listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    static const char reply[] = "$100000\r\n";
    for (int i = 0; i < TRICKLE_BYTES; i++) {
        usleep(100 * 1000);
        char b = i < (int)sizeof reply - 1 ? reply[i] : 'x';
        if (send(fd, &b, 1, MSG_NOSIGNAL) != 1)
            break;
        t->sent++;
        /* the client closed: stop */
        struct pollfd q = {.fd = fd, .events = POLLIN};
        char junk[4096];
        if (poll(&q, 1, 0) == 1 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) == 0)
            break;
    }
    close(fd);
    return NULL;
}

/* (b) A node that sends one byte every 100 ms (each recv well within the
 * timeout): the batch still ends by its deadline. */
static int test_trickling_server(void)
{
    trickle t = {0};
    t.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(t.listen_fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    REQUIRE(bind(t.listen_fd, (struct sockaddr *)&a, sizeof a) == 0);
    REQUIRE(listen(t.listen_fd, 4) == 0);
    REQUIRE(getsockname(t.listen_fd, (struct sockaddr *)&a, &alen) == 0);
    t.port = ntohs(a.sin_port);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, trickle_main, &t) == 0);

    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", t.port);
    kvf_engine *e = open_engine(url, "trickle", 4, TIMEOUT_MS);
    REQUIRE(e);
    kvf_move mv[2] = {FROM_KEY(0x51, 0), FROM_KEY(0x52, 1)};
    kvf_status per[2];
    capture_reset();
    double t0 = now_s();
    kvf_ticket tk;
    REQUIRE(kvf_onboard(e, KVF_TIER_REMOTE, mv, 2, &tk) == KVF_OK);
    CHECK_STATUS(kvf_wait(e, tk, per), KVF_ERR_TIMEOUT);
    double took = now_s() - t0;
    fprintf(stderr, "  trickling server: timed out in %.3f s\n", took);
    CHECK(took < TIMEOUT_MS * 1e-3 + SLACK_S);
    CHECK_STATUS(per[0], KVF_ERR_TIMEOUT);
    CHECK_STATUS(per[1], KVF_ERR_TIMEOUT);
    pthread_mutex_lock(&cap.mu);
    CHECK_STR_HAS(cap.text, "kvf:trickle:00000000000000000000000000000051");
    pthread_mutex_unlock(&cap.mu);
    kvf_engine_destroy(e);
    pthread_join(th, NULL);
    close(t.listen_fd);
    CHECK(t.sent < TRICKLE_BYTES); /* the engine hung up */
    return 0;
}

/* An unreachable server: twenty single-block requests, a few warnings. */
static int test_unreachable_log(void)
{
    int port = redis_pick_port();
    REQUIRE(port > 0);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    kvf_engine *e = open_engine(url, "unreachable", 4, TIMEOUT_MS);
    REQUIRE(e);
    kvf_log_set_rate_limit(5, 10000); /* the default */
    capture_reset();
    for (uint32_t i = 0; i < 20; i++) {
        kvf_move m = FROM_KEY(0x70 + i, i % 4);
        kvf_ticket tk;
        REQUIRE(kvf_onboard(e, KVF_TIER_REMOTE, &m, 1, &tk) == KVF_OK);
        CHECK_STATUS(kvf_wait(e, tk, NULL), KVF_ERR_REMOTE);
    }
    kvf_engine_destroy(e);
    pthread_mutex_lock(&cap.mu);
    fprintf(stderr, "  unreachable server: %zu warnings for 20 requests\n", cap.warnings);
    CHECK(cap.warnings >= 1);
    CHECK(cap.warnings <= 12);
    pthread_mutex_unlock(&cap.mu);
    return 0;
}

int main(void)
{
    redis_skip_unless_installed();
    kvf_log_set_handler(capture_line, &cap);
    /* every line, so that each test finds its own */
    kvf_log_set_rate_limit(0, 0);
    RUN(test_stopped_server);
    RUN(test_trickling_server);
    RUN(test_unreachable_log);
    kvf_log_set_handler(NULL, NULL);
    return TEST_RESULT();
}
#endif
