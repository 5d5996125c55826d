/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvferry bench --mode remote`: the remote tier's put and get through
 * its store (store.h: what the engine calls), next to the ceiling measured in the same run: the
 * same bytes (header + payload) SET and GET with plain hiredis, pipelined (redisAppendCommandArgv,
 * then redisGetReply), as redis-benchmark -P does. Every block read back through the tier is
 * compared with what was written.
 */
#include "bench.h"
#include "cli.h"
#include "store.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KVF_HAVE_HIREDIS
#include "blockhdr.h"
#include "redis_url.h"
#include "sendall.h"

#include <hiredis/hiredis.h>

#define HDR KVF_BLOCK_HEADER_BYTES
#define MAX_SIZES 16

typedef struct remote_opts {
    const char *url, *json;
    size_t sizes[MAX_SIZES];
    size_t nsizes;
    size_t batch_bytes;
    uint32_t iters;
    uint32_t ttl;
} remote_opts;

/* Per-batch seconds of one operation, one entry per iteration. */
typedef struct timing {
    double *s;
    uint32_t n;
} timing;

/* The q-quantile (0..1) of t's samples, nearest rank. */
static double quantile(const timing *t, double q)
{
    double *v = malloc(t->n * sizeof *v);
    memcpy(v, t->s, t->n * sizeof *v);
    double x = kvf_bench_quantile(v, t->n, q);
    free(v);
    return x;
}

static double total(const timing *t)
{
    double sum = 0;
    for (uint32_t i = 0; i < t->n; i++)
        sum += t->s[i];
    return sum;
}

/* ---- the ceiling: plain hiredis ----------------------------------------- */

typedef struct raw_client {
    redisContext *c;
    const char *name;
} raw_client;

/* n pipelined commands "<verb> raw:<i> [value]"; 0, or -1 on an error. */
static int raw_pipeline(raw_client *rc, const char *verb, size_t n, const uint8_t *const *values,
                        size_t value_bytes)
{
    char key[32];
    for (size_t i = 0; i < n; i++) {
        int key_len = snprintf(key, sizeof key, "kvfbench:raw:%zu", i);
        const char *argv[3] = {verb, key, values ? (const char *)values[i] : NULL};
        size_t lens[3] = {strlen(verb), (size_t)key_len, value_bytes};
        if (redisAppendCommandArgv(rc->c, values ? 3 : 2, argv, lens) != REDIS_OK)
            return -1;
    }
    for (size_t i = 0; i < n; i++) {
        void *reply;
        if (redisGetReply(rc->c, &reply) != REDIS_OK) {
            fprintf(stderr, "kvferry bench: %s: %s\n", rc->name, rc->c->errstr);
            return -1;
        }
        redisReply *r = reply;
        bool ok = values ? r->type == REDIS_REPLY_STATUS
                         : r->type == REDIS_REPLY_STRING && r->len == value_bytes;
        freeReplyObject(reply);
        if (!ok) {
            fprintf(stderr, "kvferry bench: %s: unexpected reply to %s\n", rc->name, verb);
            return -1;
        }
    }
    return 0;
}

/* A stricter put ceiling: the same SETs, encoded here and written with
 * sendmsg straight from the value buffers (no copy into hiredis' output
 * buffer, as the tier does), replies read by hiredis. */
static int raw_put_socket(raw_client *rc, size_t n, const uint8_t *const *values,
                          size_t value_bytes)
{
    char(*heads)[96] = malloc(n * sizeof *heads);
    struct iovec *iov = malloc(3 * n * sizeof *iov);
    int rc_ = heads && iov ? 0 : -1;
    for (size_t i = 0; i < n && rc_ == 0; i++) {
        char key[32];
        int key_len = snprintf(key, sizeof key, "kvfbench:raw:%zu", i);
        int len = snprintf(heads[i], sizeof heads[i], "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%zu\r\n",
                           key_len, key, value_bytes);
        iov[3 * i] = (struct iovec){heads[i], (size_t)len};
        iov[3 * i + 1] = (struct iovec){(void *)values[i], value_bytes};
        iov[3 * i + 2] = (struct iovec){(void *)"\r\n", 2};
    }
    if (rc_ == 0 && kvf__send_all(rc->c->fd, iov, 3 * n, 0) != 0) {
        fprintf(stderr, "kvferry bench: %s: send: %s\n", rc->name, strerror(errno));
        rc_ = -1;
    }
    for (size_t i = 0; i < n && rc_ == 0; i++) {
        void *reply;
        if (redisGetReply(rc->c, &reply) != REDIS_OK ||
            ((redisReply *)reply)->type != REDIS_REPLY_STATUS)
            rc_ = -1;
        if (rc_ == 0)
            freeReplyObject(reply);
    }
    free(heads);
    free(iov);
    return rc_;
}

static int raw_connect(const kvf__redis_url *u, raw_client *rc, char *name, size_t cap)
{
    snprintf(name, cap, "redis %s:%d", u->seed[0].host, u->seed[0].port);
    rc->name = name;
    struct timeval tv = {10, 0};
    rc->c = redisConnectWithTimeout(u->seed[0].host, u->seed[0].port, tv);
    if (!rc->c || rc->c->err) {
        fprintf(stderr, "kvferry bench: %s: %s\n", name, rc->c ? rc->c->errstr : "no memory");
        return -1;
    }
    redisSetTimeout(rc->c, tv);
    const char *argv[3] = {"AUTH", u->user, u->pass};
    redisReply *r = NULL;
    if (u->pass[0]) {
        r = u->user[0] ? redisCommandArgv(rc->c, 3, argv, NULL)
                       : redisCommandArgv(rc->c, 2, (const char *[]){"AUTH", u->pass}, NULL);
        freeReplyObject(r);
    }
    if (u->db) {
        r = redisCommand(rc->c, "SELECT %u", u->db);
        freeReplyObject(r);
    }
    return 0;
}

/* ---- one block size -------------------------------------------------------- */

typedef struct row {
    size_t bytes, blocks;
    timing put, get, raw_put, raw_get, sock_put;
} row;

/* A line of the table, and its row in `rows` (--json) when not NULL. */
static void print_line(const char *op, const row *w, const timing *mine, const timing *raw,
                       cJSON *rows)
{
    double payload = (double)w->bytes * (double)w->blocks * mine->n;
    double gbs = payload / total(mine) / 1e9;
    if (rows) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "block_bytes", (double)w->bytes);
        cJSON_AddNumberToObject(j, "blocks", (double)w->blocks);
        cJSON_AddStringToObject(j, "op", op);
        cJSON_AddNumberToObject(j, "gbs", gbs);
        cJSON_AddNumberToObject(j, "p50_ms", quantile(mine, 0.5) * 1e3);
        cJSON_AddNumberToObject(j, "p99_ms", quantile(mine, 0.99) * 1e3);
        if (raw) {
            cJSON_AddNumberToObject(j, "hiredis_gbs", payload / total(raw) / 1e9);
            cJSON_AddNumberToObject(j, "hiredis_p50_ms", quantile(raw, 0.5) * 1e3);
            cJSON_AddNumberToObject(j, "hiredis_p99_ms", quantile(raw, 0.99) * 1e3);
        }
        cJSON_AddItemToArray(rows, j);
    }
    printf("%8zu KiB %5zu  %-4s %8.2f %8.2f %8.2f", w->bytes / 1024, w->blocks, op, gbs,
           quantile(mine, 0.5) * 1e3, quantile(mine, 0.99) * 1e3);
    if (raw) {
        double raw_gbs = payload / total(raw) / 1e9;
        printf("   %8.2f %8.2f %8.2f   %5.0f%%\n", raw_gbs, quantile(raw, 0.5) * 1e3,
               quantile(raw, 0.99) * 1e3, 100.0 * gbs / raw_gbs);
    } else {
        printf("   (no ceiling for a cluster or TLS)\n");
    }
}

/* One batch call of the store on every block; 0, or 1 after saying why. */
static int store_call(kvf__store *st, kvf__store_block *blk, size_t n, const char *what)
{
    kvf_status (*call)(kvf__store *, kvf__store_block *, size_t, uint64_t) =
        !strcmp(what, "put")   ? st->ops->write
        : !strcmp(what, "get") ? st->ops->read
                               : st->ops->remove;
    if (call(st, blk, n, 0) == KVF_OK)
        return 0;
    fprintf(stderr, "kvferry bench: %s: %s\n", what, kvf_last_error());
    return 1;
}

static int bench_size(kvf__store *r, raw_client *raw, const remote_opts *o, row *w)
{
    size_t n = w->blocks, bytes = w->bytes;
    uint8_t **payload = calloc(n, sizeof *payload);
    uint8_t **value = calloc(n, sizeof *value);
    kvf__store_block *puts = calloc(n, sizeof *puts);
    kvf__store_block *gets = calloc(n, sizeof *gets);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        value[i] = malloc(HDR + bytes);
        payload[i] = value[i] + HDR;
        gets[i].buf = malloc(bytes);
        uint64_t s = 0x9e3779b97f4a7c15ull * (i + 1) + bytes;
        for (size_t b = 0; b < HDR + bytes; b += 8) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            memcpy(value[i] + b, &s, HDR + bytes - b < 8 ? HDR + bytes - b : 8);
        }
        puts[i] = (kvf__store_block){.key = {0x6b7666, i + 1},
                                     .tokens = 32,
                                     .pools = 1,
                                     .buf = payload[i],
                                     .payload_bytes = bytes};
    }
    for (uint32_t it = 0; it < o->iters + 1 && rc == 0; it++) {
        /* the first round warms up the server (allocations) and is not counted */
        uint32_t k = it == 0 ? 0 : it - 1;
        double t0 = kvf_bench_now_s();
        if (raw && raw_pipeline(raw, "SET", n, (const uint8_t *const *)value, HDR + bytes))
            rc = 1;
        double t1 = kvf_bench_now_s();
        rc |= store_call(r, puts, n, "put");
        double t2 = kvf_bench_now_s();
        if (raw && raw_pipeline(raw, "GET", n, NULL, HDR + bytes))
            rc = 1;
        double t3 = kvf_bench_now_s();
        for (size_t i = 0; i < n; i++)
            gets[i] = (kvf__store_block){.key = puts[i].key, .buf = gets[i].buf, .cap = bytes};
        rc |= store_call(r, gets, n, "get");
        double t4 = kvf_bench_now_s();
        if (raw && raw_put_socket(raw, n, (const uint8_t *const *)value, HDR + bytes))
            rc = 1;
        w->sock_put.s[k] = kvf_bench_now_s() - t4;
        w->raw_put.s[k] = t1 - t0;
        w->put.s[k] = t2 - t1;
        w->raw_get.s[k] = t3 - t2;
        w->get.s[k] = t4 - t3;
        for (size_t i = 0; i < n && rc == 0; i++)
            if (gets[i].payload_bytes != bytes || memcmp(gets[i].buf, payload[i], bytes) != 0) {
                fprintf(stderr, "kvferry bench: block %zu of %zu bytes read back wrong\n", i,
                        bytes);
                rc = 1;
            }
    }
    store_call(r, puts, n, "remove");
    for (size_t i = 0; i < n; i++) {
        free(value[i]);
        free(gets[i].buf);
    }
    free(payload);
    free(value);
    free(puts);
    free(gets);
    return rc;
}

/* ---- options ------------------------------------------------------------------ */

static void usage(void)
{
    printf("usage: kvferry bench --mode remote --remote-url URL [options]\n"
           "  --remote-url URL        redis://[user[:pass]@]host[:port][/db] or\n"
           "                          redis-cluster://h1:p1,h2:p2 (default $KVF_REMOTE_URL;\n"
           "                          --remote too)\n"
           "  --sizes LIST            block sizes, e.g. 16K,64K,256K,1M,4M (the default)\n"
           "  --batch-bytes N         bytes per batch (default 32M): blocks = N / size\n"
           "  --iters N               timed batches per size and operation (default 20)\n"
           "%s"
           "Writes and deletes keys kvf:bench:* and kvfbench:raw:* on the server.\n"
           "Exits 1 if any block read back differs from what was written, 2 on bad options.\n",
           kvf_cli_common_usage);
}

enum { OPT_MODE = 'm', OPT_SIZES = KVF_OPT_OWN, OPT_ITERS, OPT_BATCH_BYTES };

static const struct option remote_options[] = {
    KVF_CLI_OPTS_COMMON,
    KVF_CLI_OPTS_REMOTE_URL,
    {"mode", required_argument, NULL, OPT_MODE},
    {"sizes", required_argument, NULL, OPT_SIZES},
    {"iters", required_argument, NULL, OPT_ITERS},
    {"batch-bytes", required_argument, NULL, OPT_BATCH_BYTES},
    KVF_CLI_OPTS_END};

/* 0 parsed, 1 --help printed, -1 a usage error (printed). */
static int parse_remote_args(int argc, char **argv, remote_opts *o)
{
    int c;
    uint64_t v;
    optind = 0;
    while ((c = kvf_cli_getopt("bench", argc, argv, remote_options)) != -1) {
        switch (c) {
        case 'h':
            usage();
            return 1;
        case OPT_MODE: /* remote: how this file was reached */
            break;
        case KVF_OPT_JSON:
            o->json = optarg;
            break;
        case KVF_OPT_REMOTE_URL:
            o->url = optarg;
            break;
        case OPT_SIZES:
            if (kvf_bench_parse_sizes(optarg, o->sizes, MAX_SIZES, &o->nsizes))
                return -1;
            break;
        case OPT_ITERS:
            if (kvf_cli_number("bench", "iters", optarg, 1, 1000000, &v))
                return -1;
            o->iters = (uint32_t)v;
            break;
        case OPT_BATCH_BYTES:
            if (kvf_bench_parse_size("batch-bytes", optarg, &o->batch_bytes))
                return -1;
            break;
        default:
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvferry bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->url)
        o->url = kvf__store_url_from_env();
    if (!o->url) {
        fprintf(stderr, "kvferry bench: --mode remote needs --remote-url (or $%s)\n",
                KVF_REMOTE_URL_ENV);
        return -1;
    }
    return 0;
}

int kvf_cli_bench_remote(int argc, char **argv)
{
    remote_opts o = {.sizes = {16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20},
                     .nsizes = 5,
                     .batch_bytes = 32 << 20,
                     .iters = 20};
    int parsed = parse_remote_args(argc, argv, &o);
    if (parsed)
        return parsed > 0 ? 0 : kvf_cli_usage_error("bench");
    kvf__redis_url u;
    if (kvf__redis_url_parse(o.url, &u) != KVF_OK) {
        fprintf(stderr, "kvferry bench: %s\n", kvf_last_error());
        return 2;
    }
    if (kvf_cli_json_open("bench", o.json))
        return 1;
    kvf__store_config cfg = {
        .url = o.url, .ns = "bench", .fingerprint = 0x6b766662656e6368ull, .timeout_ms = 30000};
    kvf__store *r = NULL;
    if (kvf__store_open(&cfg, &r) != KVF_OK) {
        fprintf(stderr, "kvferry bench: %s\n", kvf_last_error());
        return 1;
    }
    raw_client raw = {0};
    char name[300];
    /* the ceiling is plain hiredis on one server: none for a cluster or TLS */
    bool ceiling = !u.cluster && !u.tls;
    if (ceiling && raw_connect(&u, &raw, name, sizeof name)) {
        kvf__store_close(r);
        return 1;
    }
    printf("kvferry bench: remote tier, %s%s:%d, %u timed batches per size "
           "(GB/s of payload; p50/p99 per batch)\n",
           u.cluster ? "cluster via "
           : u.tls   ? "rediss "
                     : "redis ",
           u.seed[0].host, u.seed[0].port, o.iters);
    printf("%12s %5s  %-4s %8s %8s %8s   %8s %8s %8s   %6s\n", "block", "batch", "op", "kvferry",
           "p50 ms", "p99 ms", "hiredis", "p50 ms", "p99 ms", "ratio");
    int rc = 0;
    cJSON *doc = NULL, *rows = NULL;
    if (o.json) {
        doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "mode", "remote");
        char server[300];
        snprintf(server, sizeof server, "%s:%d", u.seed[0].host, u.seed[0].port);
        cJSON_AddStringToObject(doc, "server", server);
        cJSON_AddBoolToObject(doc, "cluster", u.cluster);
        cJSON_AddNumberToObject(doc, "iters", o.iters);
        rows = cJSON_AddArrayToObject(doc, "rows");
    }
    for (size_t s = 0; s < o.nsizes && rc == 0; s++) {
        row w = {.bytes = o.sizes[s]};
        w.blocks = o.batch_bytes / w.bytes ? o.batch_bytes / w.bytes : 1;
        timing *all[] = {&w.put, &w.get, &w.raw_put, &w.raw_get, &w.sock_put};
        for (int i = 0; i < 5; i++)
            *all[i] = (timing){calloc(o.iters, sizeof(double)), o.iters};
        rc = bench_size(r, ceiling ? &raw : NULL, &o, &w);
        if (rc == 0) {
            print_line("put", &w, &w.put, ceiling ? &w.raw_put : NULL, rows);
            print_line("get", &w, &w.get, ceiling ? &w.raw_get : NULL, rows);
            if (ceiling)
                print_line("put*", &w, &w.put, &w.sock_put, rows);
        }
        for (int i = 0; i < 5; i++)
            free(all[i]->s);
        fflush(stdout);
    }
    if (raw.c)
        redisFree(raw.c);
    kvf__store_close(r);
    if (doc) {
        cJSON_AddBoolToObject(doc, "verified", rc == 0);
        if (kvf_cli_json_emit("bench", doc) && rc == 0)
            rc = 1;
    }
    fflush(stdout);
    if (kvf_cli_json_close("bench") && rc == 0)
        rc = 1;
    return rc;
}

#else /* no hiredis */

int kvf_cli_bench_remote(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("kvferry bench --mode remote: built without hiredis (libhiredis-dev)\n");
            return 0;
        }
    fprintf(stderr, "kvferry bench: --mode remote: built without hiredis (libhiredis-dev)\n");
    return 2;
}

#endif
