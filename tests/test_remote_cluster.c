/* SPDX-License-Identifier: Apache-2.0 */
/* The remote tier against a real three-master Redis Cluster on loopback:
 * routing by slot, ASK and MOVED during a slot migration, a node killed
 * while batches run, the node restarted. */
#include "redis_internal.h"
#include "redis_list_check.h"
#include "redis_server.h"

#include <pthread.h>
#include <stdatomic.h>

#define FP 0x77aa55cc33ee11ffull
#define NODES 3
#define BYTES (32 * 1024)

static redis_server nodes[NODES];
static char cluster_url[256];

static bool cluster_ok(int port)
{
    redisContext *c = redis_connect(port, NULL);
    if (!c)
        return false;
    redisReply *r = redisCommand(c, "CLUSTER INFO");
    bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

static int wait_cluster_ok(void)
{
    double deadline = redis_now_s() + 60;
    while (redis_now_s() < deadline) {
        bool all = true;
        for (int i = 0; i < NODES && all; i++)
            all = cluster_ok(nodes[i].port);
        if (all)
            return 0;
        usleep(100000);
    }
    fprintf(stderr, "cluster did not reach cluster_state:ok\n");
    return -1;
}

static int start_cluster(void)
{
    char cmd[512];
    int n = snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    for (int i = 0; i < NODES; i++) {
        nodes[i].cluster = true;
        /* no KEYS: the store lists with SCAN, never a blocking full walk */
        strcpy(nodes[i].extra[0], "--rename-command");
        strcpy(nodes[i].extra[1], "KEYS");
        nodes[i].extra[2][0] = '\0';
        nodes[i].extras = 3;
        if (redis_server_start(&nodes[i], NULL))
            return -1;
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " 127.0.0.1:%d", nodes[i].port);
    }
    snprintf(cmd + n, sizeof cmd - (size_t)n,
             " --cluster-replicas 0 --cluster-yes >%s/create.log 2>&1", nodes[0].dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s failed (see %s/create.log)\n", cmd, nodes[0].dir);
        return -1;
    }
    n = snprintf(cluster_url, sizeof cluster_url, "redis-cluster://");
    /* one live seed and one that is not there: open still works */
    snprintf(cluster_url + n, sizeof cluster_url - (size_t)n, "127.0.0.1:1,127.0.0.1:%d",
             nodes[1].port);
    return wait_cluster_ok();
}

static kvf__redis *open_cluster(const char *ns)
{
    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    cfg.url = cluster_url;
    cfg.ns = ns;
    cfg.fingerprint = FP;
    cfg.timeout_ms = 5000;
    cfg.retry_backoff_ms = 5;
    cfg.down_ms = 100;
    kvf__redis *r = NULL;
    if (kvf__redis_open(&cfg, &r) != KVF_OK)
        fprintf(stderr, "open %s: %s\n", cluster_url, kvf_last_error());
    return r;
}

static void key_text(char *out, size_t cap, const char *ns, uint64_t key)
{
    snprintf(out, cap, "kvf:%s:" KVF_KEY_FMT, ns, KVF_KEY_ARGS(TKEY(key)));
}

/* The node that holds `key` now (the one answering EXISTS without MOVED). */
static int owner_of(const char *ns, uint64_t key)
{
    char k[128];
    key_text(k, sizeof k, ns, key);
    for (int i = 0; i < NODES; i++) {
        redisContext *c = redis_connect(nodes[i].port, NULL);
        if (!c)
            continue;
        redisReply *r = redisCommand(c, "EXISTS %s", k);
        bool mine = r && r->type == REDIS_REPLY_INTEGER;
        if (r)
            freeReplyObject(r);
        redisFree(c);
        if (mine)
            return i;
    }
    return -1;
}

static int node_id(int i, char *out, size_t cap)
{
    redisContext *c = redis_connect(nodes[i].port, NULL);
    if (!c)
        return -1;
    redisReply *r = redisCommand(c, "CLUSTER MYID");
    int rc = r && r->type == REDIS_REPLY_STRING ? 0 : -1;
    if (!rc)
        snprintf(out, cap, "%s", r->str);
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return rc;
}

static void fill_puts(kvf__redis_put *p, uint8_t **bufs, uint64_t base, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        if (!bufs[i])
            bufs[i] = malloc(BYTES);
        test_fill_random(bufs[i], BYTES, seed + base + i);
        p[i] = (kvf__redis_put){KEY(base + i), 16, 3, bufs[i], BYTES};
    }
}

typedef struct reader {
    kvf__redis *r;
    size_t n;
    uint8_t **bufs;
    atomic_bool stop;
    int wrong, rounds, failed_blocks;
} reader;

/* Gets every block, over and over: a block is either right or failed. */
static void *reader_main(void *arg)
{
    reader *rd = arg;
    kvf__redis_get *g = calloc(rd->n, sizeof *g);
    kvf_status *st = calloc(rd->n, sizeof *st);
    for (size_t i = 0; i < rd->n; i++)
        g[i] = (kvf__redis_get){.key = TKEY(1 + i), .dst = malloc(BYTES), .cap = BYTES};
    while (!atomic_load(&rd->stop)) {
        kvf__redis_get_batch(rd->r, g, rd->n, st);
        for (size_t i = 0; i < rd->n; i++) {
            if (st[i] == KVF_OK && memcmp(g[i].dst, rd->bufs[i], BYTES) != 0)
                rd->wrong++;
            else if (st[i] != KVF_OK && st[i] != KVF_ERR_REMOTE && st[i] != KVF_ERR_TIMEOUT)
                rd->wrong++;
            else if (st[i] != KVF_OK)
                rd->failed_blocks++;
        }
        rd->rounds++;
    }
    for (size_t i = 0; i < rd->n; i++)
        free(g[i].dst);
    free(g);
    free(st);
    return NULL;
}

static int test_spread_round_trip(void)
{
    enum { N = 96 };
    kvf__redis *r = open_cluster("spread");
    REQUIRE(r);
    uint8_t *bufs[N] = {0};
    kvf__redis_put p[N];
    kvf__redis_get g[N];
    kvf_status st[N];
    fill_puts(p, bufs, 1, N, 0);
    CHECK_STATUS(kvf__redis_put_batch(r, p, N, st), KVF_OK);
    int per_node[NODES] = {0};
    for (size_t i = 0; i < N; i++) {
        CHECK_STATUS(st[i], KVF_OK);
        int o = owner_of("spread", 1 + i);
        CHECK(o >= 0);
        if (o >= 0)
            per_node[o]++;
        g[i] = (kvf__redis_get){.key = TKEY(1 + i), .dst = malloc(BYTES), .cap = BYTES};
    }
    for (int i = 0; i < NODES; i++)
        CHECK(per_node[i] > 10); /* every node holds a share */
    CHECK_STATUS(kvf__redis_get_batch(r, g, N, st), KVF_OK);
    for (size_t i = 0; i < N; i++) {
        CHECK_STATUS(st[i], KVF_OK);
        CHECK_MEM_EQ(g[i].dst, bufs[i], BYTES);
        CHECK_EQ_INT(g[i].pools, 3);
        free(g[i].dst);
    }
    /* three threads on one handle, every node's pool in use at once */
    reader rd[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        rd[i] = (reader){.r = r, .n = N, .bufs = bufs};
        REQUIRE(pthread_create(&th[i], NULL, reader_main, &rd[i]) == 0);
    }
    usleep(300000);
    for (int i = 0; i < 3; i++) {
        atomic_store(&rd[i].stop, true);
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(rd[i].wrong + rd[i].failed_blocks, 0);
        CHECK(rd[i].rounds > 0);
    }
    for (size_t i = 0; i < N; i++)
        free(bufs[i]);
    char detail[256];
    CHECK_STATUS(kvf__redis_probe(cluster_url, 1000, detail, sizeof detail), KVF_OK);
    CHECK_STR_HAS(detail, "cluster");
    kvf__redis_close(r);
    return 0;
}

/* Moves the slot of one block from its owner to the next node: ASK while
 * it migrates, MOVED once it has moved. */
/* A listing over every master, more blocks than one SCAN page on each:
 * each block once. */
static int test_list_scan(void)
{
    kvf__redis *r = open_cluster("scan");
    REQUIRE(r);
    redis_check_list_many(r, 0x8000000, 4000);
    kvf__redis_close(r);
    return 0;
}

static int test_ask_and_moved(void)
{
    kvf__redis *r = open_cluster("mig");
    REQUIRE(r);
    char k[128];
    key_text(k, sizeof k, "mig", 5);
    uint16_t slot = kvf__redis_key_slot(k, strlen(k));
    /* a second key in the same slot, written during the migration */
    uint64_t k2 = 6;
    for (;; k2++) {
        char t[128];
        key_text(t, sizeof t, "mig", k2);
        if (kvf__redis_key_slot(t, strlen(t)) == slot)
            break;
    }
    uint8_t *bufs[2] = {0};
    kvf__redis_put p[2];
    kvf_status st[2];
    fill_puts(p, bufs, 5, 1, 100);
    REQUIRE(kvf__redis_put_batch(r, p, 1, st) == KVF_OK);
    int a = owner_of("mig", 5);
    REQUIRE(a >= 0);
    int b = (a + 1) % NODES;
    char id_a[64], id_b[64];
    REQUIRE(node_id(a, id_a, sizeof id_a) == 0 && node_id(b, id_b, sizeof id_b) == 0);
    CHECK(redis_run(nodes[b].port, NULL, REDIS_REPLY_STATUS, "CLUSTER SETSLOT %d IMPORTING %s",
                    slot, id_a) == 0);
    CHECK(redis_run(nodes[a].port, NULL, REDIS_REPLY_STATUS, "CLUSTER SETSLOT %d MIGRATING %s",
                    slot, id_b) == 0);
    CHECK(redis_run(nodes[a].port, NULL, REDIS_REPLY_STATUS,
                    "MIGRATE 127.0.0.1 %d %b 0 5000 KEYS %s", nodes[b].port, "", (size_t)0,
                    k) == 0);

    /* mid-migration: the old owner answers ASK for both */
    kvf__redis_get g = {.key = TKEY(5), .dst = malloc(BYTES), .cap = BYTES};
    CHECK_STATUS(kvf__redis_get_batch(r, &g, 1, st), KVF_OK);
    CHECK_MEM_EQ(g.dst, bufs[0], BYTES);
    kvf__redis_put p2;
    uint8_t *b2[1] = {0};
    fill_puts(&p2, b2, k2, 1, 200);
    CHECK_STATUS(kvf__redis_put_batch(r, &p2, 1, st), KVF_OK);

    for (int i = 0; i < NODES; i++)
        CHECK(redis_run(nodes[i].port, NULL, REDIS_REPLY_STATUS, "CLUSTER SETSLOT %d NODE %s", slot,
                        id_b) == 0);
    CHECK_EQ_INT(owner_of("mig", 5), b);
    CHECK_EQ_INT(owner_of("mig", k2), b);

    /* moved: the handle still routes to a, which answers MOVED */
    kvf__redis_get gs[2] = {{.key = TKEY(5), .dst = g.dst, .cap = BYTES},
                            {.key = TKEY(k2), .dst = malloc(BYTES), .cap = BYTES}};
    CHECK_STATUS(kvf__redis_get_batch(r, gs, 2, st), KVF_OK);
    CHECK_MEM_EQ(gs[0].dst, bufs[0], BYTES);
    CHECK_MEM_EQ(gs[1].dst, b2[0], BYTES);
    /* and again, now from the refreshed map */
    memset(gs[1].dst, 0, BYTES);
    CHECK_STATUS(kvf__redis_get_batch(r, gs, 2, st), KVF_OK);
    CHECK_MEM_EQ(gs[1].dst, b2[0], BYTES);
    free(gs[0].dst);
    free(gs[1].dst);
    free(bufs[0]);
    free(b2[0]);
    kvf__redis_close(r);
    return 0;
}

/* One node stops answering (SIGSTOP): its blocks time out within the
 * timeout, the other nodes' blocks are served. */
static int test_node_stalled(void)
{
    enum { N = 30 };
    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    cfg.url = cluster_url;
    cfg.ns = "stall";
    cfg.fingerprint = FP;
    cfg.timeout_ms = 500;
    kvf__redis *r = NULL;
    REQUIRE(kvf__redis_open(&cfg, &r) == KVF_OK);
    uint8_t *bufs[N] = {0};
    kvf__redis_put p[N];
    kvf_status st[N];
    fill_puts(p, bufs, 1, N, 500);
    REQUIRE(kvf__redis_put_batch(r, p, N, st) == KVF_OK);
    int owner[N];
    for (int i = 0; i < N; i++)
        owner[i] = owner_of("stall", 1 + (uint64_t)i);
    const int victim = 0;
    kvf__redis_get g[N];
    for (int i = 0; i < N; i++)
        g[i] = (kvf__redis_get){.key = TKEY(1 + (uint64_t)i), .dst = malloc(BYTES), .cap = BYTES};
    REQUIRE(kill(nodes[victim].pid, SIGSTOP) == 0);
    double t0 = redis_now_s();
    CHECK_STATUS(kvf__redis_get_batch(r, g, N, st), KVF_ERR_TIMEOUT);
    double waited = redis_now_s() - t0;
    kill(nodes[victim].pid, SIGCONT);
    CHECK(waited < 3.0);
    char name[32];
    snprintf(name, sizeof name, "127.0.0.1:%d", nodes[victim].port);
    CHECK_STR_HAS(kvf_last_error(), name);
    for (int i = 0; i < N; i++) {
        CHECK_STATUS(st[i], owner[i] == victim ? KVF_ERR_TIMEOUT : KVF_OK);
        if (owner[i] != victim)
            CHECK_MEM_EQ(g[i].dst, bufs[i], BYTES);
    }
    /* answering again: everything is served */
    CHECK_STATUS(kvf__redis_get_batch(r, g, N, st), KVF_OK);
    for (int i = 0; i < N; i++) {
        CHECK_MEM_EQ(g[i].dst, bufs[i], BYTES);
        free(g[i].dst);
        free(bufs[i]);
    }
    kvf__redis_close(r);
    return 0;
}

static int test_node_killed_and_back(void)
{
    enum { N = 60 };
    kvf__redis *r = open_cluster("kill");
    REQUIRE(r);
    uint8_t *bufs[N] = {0};
    kvf__redis_put p[N];
    kvf_status st[N];
    fill_puts(p, bufs, 1, N, 300);
    REQUIRE(kvf__redis_put_batch(r, p, N, st) == KVF_OK);
    int owner[N];
    for (int i = 0; i < N; i++)
        owner[i] = owner_of("kill", 1 + (uint64_t)i);
    const int victim = 2;

    reader rd = {.r = r, .n = N, .bufs = bufs};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, reader_main, &rd) == 0);
    usleep(200000);
    redis_server_kill(&nodes[victim]);
    usleep(300000);
    atomic_store(&rd.stop, true);
    pthread_join(th, NULL);
    CHECK_EQ_INT(rd.wrong, 0);
    CHECK(rd.rounds > 1);

    /* with the node down: its blocks fail, naming it; the others succeed */
    kvf__redis_get g[N];
    for (int i = 0; i < N; i++)
        g[i] = (kvf__redis_get){.key = TKEY(1 + (uint64_t)i), .dst = malloc(BYTES), .cap = BYTES};
    CHECK_STATUS(kvf__redis_get_batch(r, g, N, st), KVF_ERR_REMOTE);
    char name[32];
    snprintf(name, sizeof name, "127.0.0.1:%d", nodes[victim].port);
    CHECK_STR_HAS(kvf_last_error(), name);
    CHECK_STR_HAS(kvf_last_error(), "kvf:kill:");
    int lost = 0;
    for (int i = 0; i < N; i++) {
        if (owner[i] == victim) {
            CHECK_STATUS(st[i], KVF_ERR_REMOTE);
            lost++;
        } else {
            CHECK_STATUS(st[i], KVF_OK);
            CHECK_MEM_EQ(g[i].dst, bufs[i], BYTES);
        }
    }
    CHECK(lost > 0 && lost < N);

    /* back on its port, empty (nothing on disk): misses, then stores again */
    REQUIRE(redis_server_start(&nodes[victim], NULL) == 0);
    REQUIRE(wait_cluster_ok() == 0);
    usleep(150 * 1000); /* the handle's down window for the node passes */
    kvf_status rc = kvf__redis_get_batch(r, g, N, st);
    CHECK_STATUS(rc, KVF_OK);
    for (int i = 0; i < N; i++)
        CHECK_STATUS(st[i], owner[i] == victim ? KVF_ERR_NOT_FOUND : KVF_OK);
    CHECK_STATUS(kvf__redis_put_batch(r, p, N, st), KVF_OK);
    CHECK_STATUS(kvf__redis_get_batch(r, g, N, st), KVF_OK);
    for (int i = 0; i < N; i++) {
        CHECK_STATUS(st[i], KVF_OK);
        CHECK_MEM_EQ(g[i].dst, bufs[i], BYTES);
        free(g[i].dst);
        free(bufs[i]);
    }
    kvf__redis_close(r);
    return 0;
}

int main(void)
{
    redis_skip_unless_installed();
    if (start_cluster()) {
        for (int i = 0; i < NODES; i++)
            redis_server_stop(&nodes[i]);
        fprintf(stderr, "could not start a cluster\n");
        return 1;
    }
    RUN(test_spread_round_trip);
    RUN(test_list_scan);
    RUN(test_ask_and_moved);
    RUN(test_node_stalled);
    RUN(test_node_killed_and_back);
    for (int i = 0; i < NODES; i++)
        redis_server_stop(&nodes[i]);
    return TEST_RESULT();
}
