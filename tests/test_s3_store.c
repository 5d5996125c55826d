/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 store against a real SeaweedFS (tests/s3_server.h), beyond the
 * store suite: bad URLs, a missing bucket and wrong keys refused at open
 * with the URL named and the secret nowhere; keys from the environment and
 * the shared credentials file; a listing longer than one page; the
 * engine's remote tier on s3:// shared by a second engine; a server killed
 * mid-use failing only the blocks it touched, by the deadline, and every
 * block stored before it still there after a restart. Skips (77) without
 * libcurl or SeaweedFS.
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

#define NS "s3test"
#define FP 0x53ull

static s3_server server;

static kvf__store *open_store(const char *url, const char *ns, kvf_status *st_p)
{
    kvf__store_config cfg = {.url = url, .ns = ns, .fingerprint = FP, .timeout_ms = 3000};
    kvf__store *s = NULL;
    *st_p = kvf__store_open(&cfg, &s);
    return s;
}

/* opening `url` fails with `want`, the message naming `expect` and never
 * the secret */
static int refused(const char *url, kvf_status want, const char *expect)
{
    kvf_status st;
    kvf__store *s = open_store(url, NS, &st);
    CHECK(s == NULL);
    kvf__store_close(s);
    CHECK_STATUS(st, want);
    const char *msg = kvf_last_error();
    CHECK(strstr(msg, expect) != NULL);
    CHECK(strstr(msg, S3_SECRET) == NULL && strstr(msg, S3_SECRET_ESCAPED) == NULL);
    if (!strstr(msg, expect))
        fprintf(stderr, "message: %s\n", msg);
    return 0;
}

static int test_bad_input_at_open(void)
{
    char url[512];
    snprintf(url, sizeof url, "s3://%s:%s@kvf/p?endpoint=http://127.0.0.1:%d&style=sideways",
             S3_ACCESS, S3_SECRET_ESCAPED, server.port);
    refused(url, KVF_ERR_INVALID, "style is neither path nor virtual");
    CHECK_STATUS(kvf__store_check_url(url), KVF_ERR_INVALID);
    refused("s3:///prefix", KVF_ERR_INVALID, "no bucket");
    refused("s3://Bad_Bucket/p", KVF_ERR_INVALID, "bucket");
    refused("s3://bucket/p?colour=red", KVF_ERR_INVALID, "unknown setting");
    refused("s3://bucket/a//b", KVF_ERR_INVALID, "prefix");
    /* the server answers: no such bucket, keys it does not know */
    snprintf(url, sizeof url, "s3://%s:%s@nobucket/p?endpoint=http://127.0.0.1:%d", S3_ACCESS,
             S3_SECRET_ESCAPED, server.port);
    refused(url, KVF_ERR_INVALID, "no such bucket");
    refused(url, KVF_ERR_INVALID, "s3://kvfaccess:***@nobucket/p");
    snprintf(url, sizeof url, "s3://%s:wrong%s@kvf/p?endpoint=http://127.0.0.1:%d", S3_ACCESS,
             S3_SECRET_ESCAPED, server.port);
    refused(url, KVF_ERR_INVALID, "HTTP 403");
    /* an engine refuses a malformed URL at create, not at its first move */
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.remote.url = "s3://kvf/p?style=sideways";
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    CHECK(e == NULL);
    return 0;
}

/* keys from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, then from the
 * shared credentials file's profile */
static int test_credentials_from_environment(void)
{
    char url[512], path[300];
    snprintf(url, sizeof url, "s3://kvf/env?endpoint=http://127.0.0.1:%d", server.port);
    snprintf(path, sizeof path, "%s/credentials", server.dir);
    setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
    unsetenv("AWS_PROFILE");
    setenv("AWS_ACCESS_KEY_ID", S3_ACCESS, 1);
    setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET, 1);
    kvf_status st;
    kvf__store *s = open_store(url, NS, &st);
    CHECK_STATUS(st, KVF_OK);
    kvf__store_close(s);
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    refused(url, KVF_ERR_INVALID, "no credentials");
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT; /* at create, not at the first move */
    cfg.backend = KVF_BACKEND_HOST;
    cfg.remote.url = url;
    kvf_engine *e = NULL;
    CHECK_STATUS(kvf_engine_create(&cfg, &e), KVF_ERR_INVALID);
    CHECK(strstr(kvf_last_error(), "no credentials") != NULL);
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fprintf(f,
            "[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n\n"
            "[kvf]\naws_access_key_id = %s\naws_secret_access_key = %s\n",
            S3_ACCESS, S3_SECRET);
    fclose(f);
    refused(url, KVF_ERR_INVALID, "HTTP 403"); /* [default]'s keys */
    setenv("AWS_PROFILE", "kvf", 1);
    s = open_store(url, NS, &st);
    CHECK_STATUS(st, KVF_OK);
    kvf__store_close(s);
    unsetenv("AWS_PROFILE");
    unsetenv("AWS_SHARED_CREDENTIALS_FILE");
    return 0;
}

static void count_visit(void *arg, const kvf__store_entry *e)
{
    (void)e;
    (*(size_t *)arg)++;
}

static char v1_warning[512];

static void keep_v1_warning(void *arg, kvf_log_level level, const char *msg)
{
    (void)arg;
    if (level == KVF_LOG_WARN && strstr(msg, "format version 1"))
        snprintf(v1_warning, sizeof v1_warning, "%s", msg);
}

/* 1100 blocks: two pages of ListObjectsV2, continued by its token; an
 * object under a version-1 name (16 hex digits) is not listed as a block,
 * and the listing says so */
static int test_list_continues(void)
{
    char url[512];
    s3_url(url, sizeof url, &server, "many");
    kvf_status st;
    kvf__store *s = open_store(url, NS, &st);
    REQUIRE(s != NULL);
    enum { N = 1100 };
    kvf__store_block *blk = calloc(N, sizeof *blk);
    uint64_t *payload = calloc(N, sizeof *payload);
    for (size_t i = 0; i < N; i++) {
        payload[i] = i * 0x9e3779b97f4a7c15ull;
        blk[i] = (kvf__store_block){.key = TKEY(0x1000 + i),
                                    .tokens = 1,
                                    .pools = 1,
                                    .buf = &payload[i],
                                    .payload_bytes = sizeof *payload};
    }
    CHECK_STATUS(s->ops->write(s, blk, N, 0), KVF_OK);
    uint8_t old[64] = {0}; /* a version-1 header's size */
    s3_buf_ body = {.p = old, .len = sizeof old, .cap = sizeof old};
    long code = s3_request(&server, "PUT", "kvf/many/" NS "/0000000000005a5a.kvf", &body, NULL);
    CHECK(code == 200);
    size_t seen = 0;
    v1_warning[0] = 0;
    kvf_log_set_handler(keep_v1_warning, NULL);
    CHECK_STATUS(kvf__store_list(s, count_visit, &seen), KVF_OK);
    kvf_log_set_handler(NULL, NULL);
    CHECK_EQ_INT(seen, N);
    CHECK_STR_HAS(v1_warning, "1 block of format version 1 (64-bit keys)");
    free(blk);
    free(payload);
    kvf__store_close(s);
    return 0;
}

/* Writes (or reads back and checks) keys base..base+n of 256 KiB. */
static kvf_status batch(kvf__store *s, uint64_t base, size_t n, bool write, size_t *ok_p,
                        char *first_msg, size_t cap)
{
    size_t bytes = 256u << 10;
    kvf__store_block *blk = calloc(n, sizeof *blk);
    uint8_t *buf = malloc(n * bytes);
    s3_blocks(blk, buf, base, n, bytes, write);
    kvf_status st = write ? s->ops->write(s, blk, n, 0) : s->ops->read(s, blk, n, 0);
    *ok_p = 0;
    for (size_t i = 0; i < n; i++) {
        if (blk[i].status != KVF_OK && first_msg && !first_msg[0])
            snprintf(first_msg, cap, "%s", blk[i].msg);
        *ok_p += blk[i].status == KVF_OK && (write || s3_block_exact(&blk[i], bytes));
    }
    free(blk);
    free(buf);
    return st;
}

/* kill -9 of the server: the batch then fails every block it touched,
 * each named, by the deadline; after a restart everything stored before
 * reads back byte for byte */
static int test_server_killed(void)
{
    char url[512];
    s3_url(url, sizeof url, &server, "killed");
    kvf_status st;
    kvf__store *s = open_store(url, NS, &st);
    REQUIRE(s != NULL);
    size_t ok;
    CHECK_STATUS(batch(s, 0x100, 16, true, &ok, NULL, 0), KVF_OK);
    CHECK_EQ_INT(ok, 16);
    s3_server_stop(&server);
    char msg[KVF_MOVE_ERROR_MESSAGE] = "";
    uint64_t t0 = kvf__now_ns();
    st = batch(s, 0x200, 8, true, &ok, msg, sizeof msg);
    double took = (double)(kvf__now_ns() - t0) / 1e9;
    CHECK(st == KVF_ERR_REMOTE || st == KVF_ERR_TIMEOUT);
    CHECK_EQ_INT(ok, 0);
    CHECK(strstr(msg, "remote block 0000000000000000000000000000020") != NULL &&
          strstr(msg, "PUT") != NULL);
    CHECK(strstr(msg, S3_SECRET_ESCAPED) == NULL);
    /* a refused connection is retried with backoff and then fails, long
     * before the 3 s timeout */
    CHECK(took < 1.5);
    fprintf(stderr, "server down: %.2f s: %s\n", took, msg);
    REQUIRE(s3_server_start(&server) == 0);
    msg[0] = '\0';
    CHECK_STATUS(batch(s, 0x100, 16, false, &ok, msg, sizeof msg), KVF_OK);
    CHECK_EQ_INT(ok, 16);
    if (msg[0])
        fprintf(stderr, "after restart: %s\n", msg);
    kvf__store_close(s);
    return 0;
}

/* The engine's remote tier on s3://: one engine offloads, a second one
 * (another instance sharing the bucket) onboards byte for byte. */
static int test_engine_remote_tier(void)
{
    char url[512];
    s3_url(url, sizeof url, &server, "engines");
    static const kvf_geometry g = {2, 2, 2, 16, 32, KVF_DTYPE_BF16, KVF_ORDER_HEAD_MAJOR};
    kvf_engine *e[2] = {NULL, NULL};
    size_t bytes = 0;
    for (int k = 0; k < 2; k++) {
        kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
        cfg.backend = KVF_BACKEND_HOST;
        cfg.threads = 2;
        cfg.file.namespace_ = "engines";
        cfg.remote.url = url;
        REQUIRE(kvf_engine_create(&cfg, &e[k]) == KVF_OK);
        kvf_pool_desc prim = {KVF_MEMORY_HOST, NULL, 0, 8};
        REQUIRE(kvf_engine_add_pool(e[k], &g, &prim, NULL, NULL) == KVF_OK);
    }
    REQUIRE(kvf_geometry_block_bytes(&g, &bytes) == KVF_OK);
    kvf_move mv[8];
    for (uint32_t i = 0; i < 8; i++) {
        void *p;
        REQUIRE(kvf_engine_slot_ptr(e[0], 0, KVF_LEVEL_PRIMARY, i, &p) == KVF_OK);
        test_fill_random(p, bytes, 0xe000 + i);
        REQUIRE(kvf_engine_slot_ptr(e[1], 0, KVF_LEVEL_PRIMARY, i, &p) == KVF_OK);
        memset(p, 0xc3, bytes);
        mv[i] = test_move(KVF_TIER_REMOTE, true, i, 0xe000 + i, g.tokens_per_block);
    }
    kvf_ticket t;
    CHECK_STATUS(kvf_offload(e[0], KVF_TIER_REMOTE, mv, 8, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e[0], t, NULL), KVF_OK);
    for (uint32_t i = 0; i < 8; i++)
        mv[i] = test_move(KVF_TIER_REMOTE, false, 0xe000 + i, 7 - i, g.tokens_per_block);
    CHECK_STATUS(kvf_onboard(e[1], KVF_TIER_REMOTE, mv, 8, &t), KVF_OK);
    CHECK_STATUS(kvf_wait(e[1], t, NULL), KVF_OK);
    uint8_t *want = malloc(bytes);
    for (uint32_t i = 0; i < 8; i++) {
        void *p;
        REQUIRE(kvf_engine_slot_ptr(e[1], 0, KVF_LEVEL_PRIMARY, 7 - i, &p) == KVF_OK);
        test_fill_random(want, bytes, 0xe000 + i);
        CHECK(memcmp(p, want, bytes) == 0);
    }
    free(want);
    kvf_engine_destroy(e[0]);
    kvf_engine_destroy(e[1]);
    return 0;
}

int main(void)
{
    if (!s3_weed_found(server.weed, sizeof server.weed))
        TEST_SKIP_ALL("SeaweedFS not installed (sh scripts/install-seaweedfs.sh)");
    REQUIRE(s3_server_start(&server) == 0);
    RUN(test_bad_input_at_open);
    RUN(test_credentials_from_environment);
    RUN(test_list_continues);
    RUN(test_engine_remote_tier);
    RUN(test_server_killed);
    s3_server_stop(&server);
    test_rmtree(server.dir);
    return TEST_RESULT();
}
#endif
