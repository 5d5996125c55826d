/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 store through a fault-injecting TCP proxy between it and a real
 * SeaweedFS: a 503 SlowDown retried with backoff until it passes; a 403
 * midway failing every block of the batch, each named, without a retry; a
 * body altered on the way refused for that block only; bodies cut short
 * failing their blocks after the retries; a trickling server failing the
 * batch by its deadline. After each, every block stored before reads back
 * byte for byte straight from the server: nothing stored is lost. Skips
 * (77) without libcurl or SeaweedFS.
 */
#include "testutil.h"

#ifndef KVF_HAVE_S3
int main(void)
{
    TEST_SKIP_ALL("built without libcurl / expat");
}
#else

#include "s3_server.h"
#include "store.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#define NS "faults"
#define FP 0x5full
#define BYTES (64u << 10)

enum { PASS, SLOWDOWN, FORBIDDEN, ALTER, TRUNCATE, TRICKLE };

typedef struct proxy {
    int lfd, port, upstream;
    atomic_int mode;
    atomic_int slowdowns;  /* SLOWDOWN: how many requests still get a 503 */
    atomic_long requests;  /* requests answered by the proxy itself */
    atomic_int generation; /* a mode's: connections of an older one are closed */
} proxy;

typedef struct conn {
    proxy *p;
    int cfd, ufd;
} conn;

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static bool send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

/* client -> server, as it comes */
static void *upward(void *arg)
{
    conn *c = arg;
    char buf[65536];
    ssize_t r;
    while ((r = recv(c->cfd, buf, sizeof buf, 0)) > 0)
        if (!send_all(c->ufd, buf, (size_t)r))
            break;
    shutdown(c->ufd, SHUT_WR);
    return NULL;
}

/* One whole request (headers and Content-Length body) read from fd into
 * buf; its length, or -1 at the end of the connection. */
static ssize_t read_request(int fd, char *buf, size_t cap)
{
    size_t got = 0;
    char *end = NULL;
    while (!end) {
        ssize_t r = recv(fd, buf + got, cap - 1 - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
        buf[got] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    size_t head = (size_t)(end + 4 - buf), body = 0;
    const char *cl = strcasestr(buf, "\r\ncontent-length:");
    if (cl && cl < end)
        body = strtoul(cl + 17, NULL, 10);
    if (strcasestr(buf, "\r\nexpect: 100-continue"))
        send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    while (got < head + body) {
        ssize_t r = recv(fd, buf + got, cap - 1 - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static void answer(int fd, int code, const char *reason, const char *s3code)
{
    char body[256], msg[512];
    int blen = snprintf(body, sizeof body,
                        "<Error><Code>%s</Code><Message>injected</Message></Error>", s3code);
    int n =
        snprintf(msg, sizeof msg,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s",
                 code, reason, blen, body);
    send_all(fd, msg, (size_t)n);
}

static void *serve(void *arg)
{
    conn *c = arg;
    proxy *p = c->p;
    int gen = atomic_load(&p->generation);
    int mode = atomic_load(&p->mode);
    char *req = malloc(4u << 20);
    ssize_t first = 0;
    /* answered here: 403 always, 503 for the first few */
    while (mode == FORBIDDEN || (mode == SLOWDOWN && atomic_load(&p->slowdowns) > 0)) {
        first = read_request(c->cfd, req, 4u << 20);
        if (first < 0)
            goto done;
        atomic_fetch_add(&p->requests, 1);
        if (mode == FORBIDDEN)
            answer(c->cfd, 403, "Forbidden", "AccessDenied");
        else if (atomic_fetch_sub(&p->slowdowns, 1) > 0)
            answer(c->cfd, 503, "Slow Down", "SlowDown");
        else
            break; /* this request goes on to the server */
        first = 0;
    }
    c->ufd = dial(p->upstream);
    if (c->ufd < 0 || (first > 0 && !send_all(c->ufd, req, (size_t)first)))
        goto done;
    pthread_t up;
    pthread_create(&up, NULL, upward, c);
    char buf[65536];
    size_t total = 0;
    ssize_t r;
    for (;;) {
        struct pollfd pf = {.fd = c->ufd, .events = POLLIN};
        if (atomic_load(&p->generation) != gen)
            break; /* set up for another mode: the client connects anew */
        if (poll(&pf, 1, 10) == 0)
            continue;
        if ((r = recv(c->ufd, buf, mode == TRICKLE ? 1 : sizeof buf, 0)) <= 0)
            break;
        if (mode == ALTER && total < 2048 && total + (size_t)r > 2048)
            buf[2048 - total] ^= 0x20; /* in the first answer's body */
        if (mode == TRUNCATE && total + (size_t)r > 4096)
            break; /* the connection ends mid-body */
        if (mode == TRICKLE)
            usleep(2000);
        if (!send_all(c->cfd, buf, (size_t)r))
            break;
        total += (size_t)r;
    }
    shutdown(c->cfd, SHUT_RDWR);
    shutdown(c->ufd, SHUT_RDWR);
    pthread_join(up, NULL);
done:
    close(c->cfd);
    if (c->ufd >= 0)
        close(c->ufd);
    free(req);
    free(c);
    return NULL;
}

static void *accept_loop(void *arg)
{
    proxy *p = arg;
    for (;;) {
        int fd = accept(p->lfd, NULL, NULL);
        if (fd < 0)
            return NULL;
        conn *c = calloc(1, sizeof *c);
        c->p = p;
        c->cfd = fd;
        c->ufd = -1;
        pthread_t t;
        pthread_create(&t, NULL, serve, c);
        pthread_detach(t);
    }
}

static int proxy_start(proxy *p, int upstream)
{
    p->upstream = upstream;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(p->lfd, 64) != 0 || getsockname(p->lfd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    p->port = ntohs(a.sin_port);
    pthread_t t;
    pthread_create(&t, NULL, accept_loop, p);
    pthread_detach(t);
    return 0;
}

static s3_server server;
static proxy px;

/* The proxy's mode from now on, its connections of the last mode closed. */
static void proxy_mode(int mode)
{
    atomic_store(&px.mode, mode);
    atomic_fetch_add(&px.generation, 1);
}

/* A store at the proxy (or, direct, at the server) on prefix "f". */
static kvf__store *open_at(bool direct, uint32_t timeout_ms, uint32_t conns)
{
    char url[512];
    snprintf(url, sizeof url, "s3://%s:%s@kvf/f?endpoint=http://127.0.0.1:%d&conns=%u", S3_ACCESS,
             S3_SECRET_ESCAPED, direct ? server.port : px.port, conns);
    kvf__store_config cfg = {.url = url, .ns = NS, .fingerprint = FP, .timeout_ms = timeout_ms};
    kvf__store *s = NULL;
    if (kvf__store_open(&cfg, &s) != KVF_OK)
        fprintf(stderr, "open %s: %s\n", url, kvf_last_error());
    return s;
}

typedef struct blocks {
    kvf__store_block b[16];
    uint8_t *buf;
    size_t n;
} blocks;

static void blocks_make(blocks *k, uint64_t base, size_t n, bool write)
{
    k->n = n;
    k->buf = malloc(n * BYTES);
    s3_blocks(k->b, k->buf, base, n, BYTES, write);
}

static bool block_right(const blocks *k, size_t i)
{
    return s3_block_exact(&k->b[i], BYTES);
}

/* the blocks stored at the start are all there, straight from the server */
static int all_still_stored(void)
{
    kvf__store *s = open_at(true, 5000, 16);
    REQUIRE(s != NULL);
    blocks k;
    blocks_make(&k, 0x700, 8, false);
    CHECK_STATUS(s->ops->read(s, k.b, k.n, 0), KVF_OK);
    for (size_t i = 0; i < k.n; i++)
        CHECK(block_right(&k, i));
    free(k.buf);
    kvf__store_close(s);
    return 0;
}

static int test_slowdown_retried(void)
{
    proxy_mode(PASS);
    kvf__store *s = open_at(false, 3000, 4);
    REQUIRE(s != NULL);
    atomic_store(&px.requests, 0);
    atomic_store(&px.slowdowns, 3);
    proxy_mode(SLOWDOWN);
    blocks k;
    blocks_make(&k, 0x700, 8, false);
    CHECK_STATUS(s->ops->read(s, k.b, k.n, 0), KVF_OK);
    for (size_t i = 0; i < k.n; i++)
        CHECK(block_right(&k, i));
    CHECK(atomic_load(&px.requests) >= 3); /* the 503s were answered, then retried */
    free(k.buf);
    kvf__store_close(s);
    return all_still_stored();
}

static int test_forbidden_midway(void)
{
    proxy_mode(PASS);
    kvf__store *s = open_at(false, 3000, 4);
    REQUIRE(s != NULL);
    atomic_store(&px.requests, 0);
    proxy_mode(FORBIDDEN);
    blocks k;
    blocks_make(&k, 0x900, 6, true);
    CHECK_STATUS(s->ops->write(s, k.b, k.n, 0), KVF_ERR_REMOTE);
    for (size_t i = 0; i < k.n; i++) {
        CHECK_STATUS(k.b[i].status, KVF_ERR_REMOTE);
        char name[64];
        snprintf(name, sizeof name, "remote block " KVF_KEY_FMT, KVF_KEY_ARGS(TKEY(k.b[i].key)));
        CHECK(strstr(k.b[i].msg, name) && strstr(k.b[i].msg, "HTTP 403 AccessDenied"));
    }
    CHECK_EQ_INT(atomic_load(&px.requests), 6); /* never retried */
    free(k.buf);
    kvf__store_close(s);
    return all_still_stored();
}

static int test_altered_body(void)
{
    proxy_mode(PASS);
    kvf__store *s = open_at(false, 3000, 4);
    REQUIRE(s != NULL);
    proxy_mode(ALTER); /* each new connection's first answer */
    blocks k;
    blocks_make(&k, 0x700, 8, false);
    s->ops->read(s, k.b, k.n, 0);
    size_t corrupt = 0;
    for (size_t i = 0; i < k.n; i++) {
        CHECK(block_right(&k, i) || k.b[i].status == KVF_ERR_CORRUPT);
        corrupt += k.b[i].status == KVF_ERR_CORRUPT;
    }
    CHECK(corrupt >= 1 && corrupt < k.n + 1);
    free(k.buf);
    kvf__store_close(s);
    return all_still_stored();
}

static int test_truncated_body(void)
{
    proxy_mode(PASS);
    kvf__store *s = open_at(false, 3000, 4);
    REQUIRE(s != NULL);
    proxy_mode(TRUNCATE);
    blocks k;
    blocks_make(&k, 0x700, 4, false);
    CHECK_STATUS(s->ops->read(s, k.b, k.n, 0), KVF_ERR_REMOTE);
    for (size_t i = 0; i < k.n; i++) {
        CHECK_STATUS(k.b[i].status, KVF_ERR_REMOTE);
        CHECK(strstr(k.b[i].msg, "(after retries)") != NULL);
    }
    fprintf(stderr, "truncated: %s\n", k.b[0].msg);
    free(k.buf);
    kvf__store_close(s);
    return all_still_stored();
}

static int test_trickle_deadline(void)
{
    proxy_mode(PASS);
    kvf__store *s = open_at(false, 1000, 4);
    REQUIRE(s != NULL);
    proxy_mode(TRICKLE);
    blocks k;
    blocks_make(&k, 0x700, 4, false);
    uint64_t t0 = kvf__now_ns();
    CHECK_STATUS(s->ops->read(s, k.b, k.n, 0), KVF_ERR_TIMEOUT);
    double took = (double)(kvf__now_ns() - t0) / 1e9;
    /* the timeout plus the batch's bytes at the floor rate, and a little */
    CHECK(took > 0.9 && took < 1.0 + 4.0 * BYTES / (256 << 20) + 0.5);
    for (size_t i = 0; i < k.n; i++)
        CHECK_STATUS(k.b[i].status, KVF_ERR_TIMEOUT);
    fprintf(stderr, "trickle: %.2f s: %s\n", took, k.b[0].msg);
    free(k.buf);
    kvf__store_close(s);
    proxy_mode(PASS);
    return all_still_stored();
}

int main(void)
{
    if (!s3_weed_found(server.weed, sizeof server.weed))
        TEST_SKIP_ALL("SeaweedFS not installed (sh scripts/install-seaweedfs.sh)");
    REQUIRE(s3_server_start(&server) == 0);
    REQUIRE(proxy_start(&px, server.port) == 0);
    kvf__store *s = open_at(true, 5000, 16);
    REQUIRE(s != NULL);
    blocks k;
    blocks_make(&k, 0x700, 8, true);
    REQUIRE(s->ops->write(s, k.b, k.n, 0) == KVF_OK);
    free(k.buf);
    kvf__store_close(s);
    RUN(test_slowdown_retried);
    RUN(test_forbidden_midway);
    RUN(test_altered_body);
    RUN(test_truncated_body);
    RUN(test_trickle_deadline);
    s3_server_stop(&server);
    test_rmtree(server.dir);
    return TEST_RESULT();
}
#endif
