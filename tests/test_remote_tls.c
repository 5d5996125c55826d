/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rediss:// against a real redis-server speaking TLS on loopback, started
 * here with certificates made here (redis_tls_server.h): blocks round trip
 * byte for byte, with and without a client certificate; a server
 * certificate from another CA, a name it was not issued for and a server
 * without TLS are refused when the store is opened, naming the node and
 * never the password; an ACL user with its password works, a wrong
 * password is refused; a TLS setting that cannot work is refused at
 * kvf_engine_create, naming the parameter. The password never appears in
 * a log line, an error, a move's message, a probe's detail or a listed
 * setting. A Redis Cluster over TLS (clients and bus) round trips and
 * lists. Skips (77) without TLS in this build, redis-server or openssl.
 */
#include "redis_list_check.h"
#include "redis_tls_server.h"
#include "store.h"

#define PASSWORD "pw-9f2c7e1d"
#define NS "tls"
#define FP 0x7157ull

static redis_tls_server server;

/* Every log line, kept to look for the password in. */
static char logged[1 << 16];
static size_t logged_len;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static void keep_log(void *user, kvf_log_level level, const char *line)
{
    (void)user;
    (void)level;
    pthread_mutex_lock(&log_mu);
    int n = snprintf(logged + logged_len, sizeof logged - logged_len, "%s\n", line);
    if (n > 0 && logged_len + (size_t)n < sizeof logged)
        logged_len += (size_t)n;
    pthread_mutex_unlock(&log_mu);
}

/* Whatever kvferry said so far, and `text`, hold no password. */
static void check_no_password(const char *text)
{
    CHECK(strstr(text, PASSWORD) == NULL);
    CHECK(strstr(text, "wrong-" PASSWORD) == NULL);
    CHECK(strstr(kvf_last_error(), PASSWORD) == NULL);
    pthread_mutex_lock(&log_mu);
    CHECK(strstr(logged, PASSWORD) == NULL);
    pthread_mutex_unlock(&log_mu);
}

static void tls_url(char *out, size_t cap, const char *userinfo, int port, const char *params)
{
    int n = snprintf(out, cap, "rediss://%s%s127.0.0.1:%d?tls_ca=%s", userinfo ? userinfo : "",
                     userinfo ? "@" : "", port, server.ca);
    if (n > 0 && (size_t)n < cap && params)
        snprintf(out + n, cap - (size_t)n, "%s", params);
}

static kvf_status open_store(const char *url, kvf__store **s_p)
{
    kvf__store_config cfg = {.url = url, .ns = NS, .fingerprint = FP, .timeout_ms = 3000};
    *s_p = NULL;
    return kvf__store_open(&cfg, s_p);
}

/* n random blocks written through s and read back byte for byte into
 * poisoned buffers. */
static void round_trip(kvf__store *s, size_t n, size_t bytes, uint64_t seed)
{
    kvf__store_block *w = calloc(n, sizeof *w), *r = calloc(n, sizeof *r);
    uint8_t **src = calloc(n, sizeof *src), **dst = calloc(n, sizeof *dst);
    for (size_t i = 0; i < n; i++) {
        size_t b = bytes + i * 4099;
        src[i] = malloc(b);
        dst[i] = malloc(b);
        test_fill_random(src[i], b, seed + i);
        memset(dst[i], 0xe7, b);
        w[i] = (kvf__store_block){
            .key = TKEY(seed + i), .tokens = 16, .pools = 2, .buf = src[i], .payload_bytes = b};
        r[i] = (kvf__store_block){.key = TKEY(seed + i), .buf = dst[i], .cap = b};
    }
    CHECK_STATUS(s->ops->write(s, w, n, 0), KVF_OK);
    CHECK_STATUS(s->ops->read(s, r, n, 0), KVF_OK);
    for (size_t i = 0; i < n; i++) {
        CHECK_STATUS(r[i].status, KVF_OK);
        CHECK(r[i].payload_bytes == bytes + i * 4099 && r[i].tokens == 16 && r[i].pools == 2);
        CHECK(test_mem_diff(dst[i], src[i], bytes + i * 4099) == SIZE_MAX);
        free(src[i]);
        free(dst[i]);
    }
    free(src);
    free(dst);
    free(w);
    free(r);
}

static int test_round_trip(void)
{
    char url[1024];
    kvf__store *s;
    /* batches larger than a TLS record and than a socket buffer */
    tls_url(url, sizeof url, NULL, server.tls_port, NULL);
    REQUIRE(open_store(url, &s) == KVF_OK);
    round_trip(s, 40, 100000, 0x1000);
    round_trip(s, 3, 1, 0x2000);
    kvf__store_close(s);
    /* with a client certificate */
    char params[700];
    snprintf(params, sizeof params, "&tls_cert=%s&tls_key=%s", server.client_cert,
             server.client_key);
    tls_url(url, sizeof url, NULL, server.tls_port, params);
    REQUIRE(open_store(url, &s) == KVF_OK);
    round_trip(s, 8, 70000, 0x3000);
    kvf__store_close(s);
    /* the name sent and verified: localhost is on the certificate too */
    tls_url(url, sizeof url, NULL, server.tls_port, "&tls_sni=localhost");
    REQUIRE(open_store(url, &s) == KVF_OK);
    round_trip(s, 2, 5000, 0x4000);
    kvf__store_close(s);
    return 0;
}

/* Opening fails with `want`, the message naming the node and `why`. */
static void refused(const char *url, kvf_status want, const char *why)
{
    kvf__store *s = NULL;
    CHECK_STATUS(open_store(url, &s), want);
    CHECK(s == NULL);
    CHECK_STR_HAS(kvf_last_error(), why);
    CHECK_STR_HAS(kvf_last_error(), "127.0.0.1:");
    check_no_password("");
}

static int test_refused(void)
{
    char url[1024];
    /* a CA that signed nothing of this server's */
    snprintf(url, sizeof url, "rediss://u:" PASSWORD "@127.0.0.1:%d?tls_ca=%s", server.tls_port,
             server.other_ca);
    refused(url, KVF_ERR_REMOTE, "certificate");
    CHECK_STR_HAS(kvf_last_error(), "other-ca.pem");
    char node[64];
    snprintf(node, sizeof node, "127.0.0.1:%d", server.tls_port);
    CHECK_STR_HAS(kvf_last_error(), node);
    /* a name the certificate was not issued for */
    tls_url(url, sizeof url, NULL, server.tls_port, "&tls_sni=elsewhere.example");
    refused(url, KVF_ERR_REMOTE, "elsewhere.example");
    /* the same name, not verified: taken */
    snprintf(url, sizeof url, "rediss://127.0.0.1:%d?tls_verify=no&tls_sni=elsewhere.example",
             server.tls_port);
    kvf__store *s;
    CHECK_STATUS(open_store(url, &s), KVF_OK);
    kvf__store_close(s);
    /* the plain port: no TLS there (a Redis server waits for the rest of a
     * command it cannot parse, so this is a timeout, or a refusal) */
    tls_url(url, sizeof url, NULL, server.plain.port, NULL);
    kvf_status st = open_store(url, &s);
    CHECK(st == KVF_ERR_TIMEOUT || st == KVF_ERR_REMOTE);
    CHECK_STR_HAS(kvf_last_error(), "TLS handshake");
    CHECK_STR_HAS(kvf_last_error(), "speak TLS on this port");
    /* plain redis:// on the TLS port: nothing stored, a failure in time */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", server.tls_port);
    if (open_store(url, &s) == KVF_OK) {
        uint8_t b[16] = {0};
        kvf__store_block w = {
            .key = TKEY(1), .tokens = 1, .pools = 1, .buf = b, .payload_bytes = 16};
        double t0 = redis_now_s();
        CHECK(s->ops->write(s, &w, 1, 0) != KVF_OK);
        CHECK(redis_now_s() - t0 < 10);
        kvf__store_close(s);
    }
    return 0;
}

/* A server that takes the connection and never answers the handshake:
 * refused in the connect timeout, as a timeout. */
static int test_silent_server(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    char url[1024];
    tls_url(url, sizeof url, NULL, ntohs(a.sin_port), NULL);
    kvf__store_config cfg = {.url = url, .ns = NS, .fingerprint = FP, .timeout_ms = 300};
    kvf__store *s = NULL;
    double t0 = redis_now_s();
    CHECK_STATUS(kvf__store_open(&cfg, &s), KVF_ERR_TIMEOUT);
    CHECK(redis_now_s() - t0 < 3);
    CHECK_STR_HAS(kvf_last_error(), "TLS handshake");
    close(fd);
    return 0;
}

static int test_acl_user(void)
{
    REQUIRE(redis_run(server.plain.port, NULL, REDIS_REPLY_STATUS,
                      "ACL SETUSER alice on >" PASSWORD " ~* &* +@all") == 0);
    char url[1024];
    kvf__store *s;
    tls_url(url, sizeof url, "alice:" PASSWORD, server.tls_port, NULL);
    REQUIRE(open_store(url, &s) == KVF_OK);
    CHECK(strstr(s->where, PASSWORD) == NULL);
    CHECK_STR_HAS(s->where, "alice:***@");
    round_trip(s, 4, 30000, 0x5000);
    kvf__store_close(s);
    tls_url(url, sizeof url, "alice:wrong-" PASSWORD, server.tls_port, NULL);
    refused(url, KVF_ERR_REMOTE, "AUTH as user 'alice' refused");
    /* a probe names what answered, never the password */
    char detail[512];
    tls_url(url, sizeof url, "alice:" PASSWORD, server.tls_port, NULL);
    CHECK_STATUS(kvf_remote_probe(url, 2000, detail, sizeof detail), KVF_OK);
    check_no_password(detail);
    tls_url(url, sizeof url, "alice:wrong-" PASSWORD, server.tls_port, NULL);
    CHECK(kvf_remote_probe(url, 2000, detail, sizeof detail) != KVF_OK);
    check_no_password(detail);
    return 0;
}

/* An engine over the TLS server: moves with the right password, failed
 * moves with a wrong one, the settings it lists; the password is in none
 * of what it says. */
static int test_engine_says_no_password(void)
{
    static const kvf_geometry g = {1, 1, 1, 16, 64, KVF_DTYPE_BF16, KVF_ORDER_HEAD_MAJOR};
    const char *pws[2] = {PASSWORD, "wrong-" PASSWORD};
    for (int k = 0; k < 2; k++) {
        char userinfo[128], url[1024];
        snprintf(userinfo, sizeof userinfo, "alice:%s", pws[k]);
        tls_url(url, sizeof url, userinfo, server.tls_port, NULL);
        kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
        cfg.backend = KVF_BACKEND_HOST;
        cfg.file.namespace_ = NS;
        cfg.remote.url = url;
        kvf_engine *e = NULL;
        REQUIRE(kvf_engine_create(&cfg, &e) == KVF_OK);
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, 4};
        REQUIRE(kvf_engine_add_pool(e, &g, &prim, NULL, NULL) == KVF_OK);
        void *slot = NULL;
        kvf_engine_slot_ptr(e, 0, KVF_LEVEL_PRIMARY, 0, &slot);
        size_t bb = 0;
        kvf_geometry_block_bytes(&g, &bb);
        test_fill_random(slot, bb, 77);
        kvf_move mv = TO_KEY(0, 0x77);
        kvf_ticket t;
        kvf_status st = kvf_offload(e, KVF_TIER_REMOTE, &mv, 1, &t);
        if (st == KVF_OK)
            st = kvf_wait(e, t, NULL);
        CHECK_STATUS(st, k == 0 ? KVF_OK : KVF_ERR_REMOTE);
        check_no_password("");
        const kvf_setting *set = NULL;
        size_t n = 0;
        REQUIRE(kvf_engine_settings(e, &set, &n) == KVF_OK);
        for (size_t i = 0; i < n; i++) {
            check_no_password(set[i].value);
            if (!strcmp(set[i].name, "remote_url"))
                CHECK_STR_HAS(set[i].value, "alice:***@");
        }
        kvf_engine_destroy(e);
    }
    return 0;
}

/* Create refuses, without connecting, a TLS setting that cannot work,
 * naming it. */
static int test_settings_at_create(void)
{
    char missing[400];
    snprintf(missing, sizeof missing, "%s/nowhere.pem", server.plain.dir);
    struct {
        const char *fmt; /* %s: a path */
        const char *path;
        const char *named;
    } bad[] = {
        {"rediss://127.0.0.1:1?tls_ca=%s", missing, "tls_ca"},
        {"rediss://127.0.0.1:1?tls_cert=%s", server.client_cert, "tls_key"},
        {"rediss://127.0.0.1:1?tls_cert=%s&tls_key=/dev/null", server.client_cert, "tls_key"},
        {"rediss://127.0.0.1:1?tls_ca=%s&tls_verify=no", server.ca, "tls_verify"},
        {"redis://127.0.0.1:1?tls_ca=%s", server.ca, "rediss://"},
        {"rediss://127.0.0.1:1?tls_ca=%s&tls_verify=maybe", server.ca, "tls_verify"},
        {"rediss://127.0.0.1:1?tls_ca=%s&tls_cafile=x", server.ca, "tls_cafile"},
        {"rediss://127.0.0.1:1?tls_ca=%s&tls_ca=x", server.ca, "tls_ca given twice"},
        {"rediss://127.0.0.1:1?tls_sni=&x=%s", server.ca, "tls_sni"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char url[1024];
        snprintf(url, sizeof url, bad[i].fmt, bad[i].path);
        kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
        cfg.backend = KVF_BACKEND_HOST;
        cfg.file.namespace_ = NS;
        cfg.remote.url = url;
        kvf_engine *e = NULL;
        double t0 = redis_now_s();
        CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
        CHECK(redis_now_s() - t0 < 2); /* nothing was connected to */
        CHECK_STR_HAS(kvf_last_error(), bad[i].named);
        if (e)
            kvf_engine_destroy(e);
    }
    return 0;
}

/* Whether the node answering on plain `port` sees the cluster whole. */
static bool cluster_ok(int port)
{
    redisContext *c = redis_connect(port, NULL);
    redisReply *r = c ? redisCommand(c, "CLUSTER INFO") : NULL;
    bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

/* rediss-cluster://: three masters whose clients and bus speak TLS (made
 * with redis-cli over TLS, so that the nodes meet on their TLS ports);
 * CLUSTER SLOTS gives a TLS client the TLS ports. Blocks spread over the
 * nodes round trip, a listing finds them all, a probe counts the masters. */
static int test_cluster(void)
{
    enum { NODES = 3 };
    redis_server nodes[NODES];
    int tls_ports[NODES];
    char cmd[1024];
    int n = snprintf(cmd, sizeof cmd, "redis-cli --tls --cacert %s --cluster create", server.ca);
    memset(nodes, 0, sizeof nodes);
    for (int i = 0; i < NODES; i++) {
        tls_ports[i] = redis_pick_port();
        const char *dir = server.plain.dir;
        const char *opts[][2] = {{"--tls-port", NULL},
                                 {"--tls-cluster", "yes"},
                                 {"--tls-cert-file", "server.pem"},
                                 {"--tls-key-file", "server.key"},
                                 {"--tls-ca-cert-file", "ca.pem"},
                                 {"--tls-auth-clients", "no"}};
        for (size_t k = 0; k < sizeof opts / sizeof *opts; k++) {
            snprintf(nodes[i].extra[2 * k], sizeof nodes[i].extra[0], "%s", opts[k][0]);
            if (k == 0)
                snprintf(nodes[i].extra[1], sizeof nodes[i].extra[1], "%d", tls_ports[i]);
            else if (strstr(opts[k][0], "-file")) /* the main server's certificates */
                snprintf(nodes[i].extra[2 * k + 1], sizeof nodes[i].extra[0], "%.200s/%s", dir,
                         opts[k][1]);
            else
                snprintf(nodes[i].extra[2 * k + 1], sizeof nodes[i].extra[0], "%s", opts[k][1]);
        }
        nodes[i].extras = 12;
        nodes[i].cluster = true;
        REQUIRE(redis_server_start(&nodes[i], NULL) == 0);
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " 127.0.0.1:%d", tls_ports[i]);
    }
    snprintf(cmd + n, sizeof cmd - (size_t)n,
             " --cluster-replicas 0 --cluster-yes >%s/create.log 2>&1", nodes[0].dir);
    REQUIRE(system(cmd) == 0);
    double deadline = redis_now_s() + 30;
    bool ok = false;
    while (!ok && redis_now_s() < deadline) {
        ok = true;
        for (int i = 0; i < NODES; i++)
            ok = ok && cluster_ok(nodes[i].port);
        if (!ok)
            usleep(100000);
    }
    REQUIRE(ok);
    char url[1024];
    snprintf(url, sizeof url, "rediss-cluster://127.0.0.1:%d,127.0.0.1:%d?tls_ca=%s", tls_ports[0],
             tls_ports[2], server.ca);
    kvf__store *s;
    REQUIRE(open_store(url, &s) == KVF_OK);
    round_trip(s, 60, 20000, 0x6000);
    kvf__store_close(s);
    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    cfg.url = url;
    cfg.ns = "tls-scan";
    cfg.fingerprint = FP;
    cfg.timeout_ms = 5000;
    kvf__redis *r = NULL;
    REQUIRE(kvf__redis_open(&cfg, &r) == KVF_OK);
    redis_check_list_many(r, 0x9000000, 2500);
    kvf__redis_close(r);
    char detail[256];
    CHECK_STATUS(kvf_remote_probe(url, 2000, detail, sizeof detail), KVF_OK);
    CHECK_STR_HAS(detail, "3 master(s)");
    for (int i = 0; i < NODES; i++)
        redis_server_stop(&nodes[i]);
    return 0;
}

int main(void)
{
    alarm(240);
    if (!redis_tls_available())
        return TEST_SKIP;
    kvf_log_set_handler(keep_log, NULL);
    kvf_log_set_level(KVF_LOG_DEBUG);
    REQUIRE(redis_tls_server_start(&server, NULL) == 0);
    RUN(test_round_trip);
    RUN(test_refused);
    RUN(test_silent_server);
    RUN(test_acl_user);
    RUN(test_engine_says_no_password);
    RUN(test_settings_at_create);
    RUN(test_cluster);
    redis_tls_server_stop(&server);
    kvf_log_set_handler(NULL, NULL);
    return TEST_RESULT();
}
