/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier on Redis (redis.h): batches of blocks as pipelined
 * SET / GETRANGE / EXISTS / DEL, one pipeline per node and round; and
 * ranges of values (GETRANGE) for reads pool group by pool group.
 *
 * A batch runs in rounds. Each round groups the blocks still pending by
 * the node they are routed to, writes every node's pipeline first and
 * then reads the replies, so the nodes work at the same time. A MOVED or
 * ASK reply sends its block to another node in the next round; a failed
 * connection retries its blocks after a backoff; everything else ends the
 * block. Commands are encoded here (RESP) so a SET is written from three
 * pieces without a copy: command and header, the caller's payload, the
 * tail (CRLF and the optional EX).
 *
 * Blocks are read with GETRANGE up to one byte past the largest value the
 * caller's buffer can take, not GET: a value too large for any block is
 * refused having read that much of it, never buffered whole.
 *
 * Every round, wait and backoff of a batch is bounded by its deadline;
 * once it passes, the blocks left fail without another word to a node.
 */
#include "blockhdr.h"
#include "checksum.h"
#include "log.h"
#include "redis_internal.h"
#include "status.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HDR KVF_BLOCK_HEADER_BYTES
/* "kvf:" + namespace (64 at most) + ":" + 32 hex digits */
#define KEY_MAX 104
/* RESP of the command up to the value, then the header for a SET */
#define CMD_MAX (KEY_MAX + 64 + KVF_BLOCK_PREFIX_MAX)
/* redirections one block may follow before it fails */
#define REDIRECT_LIMIT 5
#define BACKOFF_CAP_MS 1000
/* a pipeline is written in pieces of about this size, so that the node
 * parses the first blocks while later ones are still being checksummed */
#define SEND_CHUNK ((size_t)256 << 10)

/* OP_RANGE: a GETRANGE of the caller's range, its bytes unchecked (the
 * store checks them: kvf__store_read_groups) */
typedef enum op_kind { OP_SET, OP_GET, OP_EXISTS, OP_DEL, OP_RANGE } op_kind;

/* One block of a batch. */
typedef struct op {
    kvf_key key;
    char key_text[KEY_MAX];
    size_t key_len;
    uint16_t slot;
    char cmd[CMD_MAX];
    size_t cmd_len;
    kvf__redis_node *node;
    size_t group;
    uint32_t attempts, redirects;
    bool asking, done;
} op;

typedef struct batch {
    kvf__redis *r;
    op_kind kind;
    op *ops;
    size_t n;
    const kvf__redis_put *puts;
    kvf__redis_get *gets;
    kvf__redis_range *ranges;
    kvf_status *status;
    bool backoff;
    uint64_t deadline_ns;          /* kvf__now_ns() time by which the call returns */
    uint32_t budget_ms;            /* the time the call was given, for messages */
    kvf__redis_node *refresh_from; /* a MOVED was seen: reread the slot map */
    kvf_status first;
    char first_msg[512];
} batch;

/* One node's share of a round. */
typedef struct group {
    kvf__redis_node *node;
    redisContext *conn;
    kvf_status st;
} group;

static const char ASKING_CMD[] = "*1\r\n$6\r\nASKING\r\n";

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Ends block `o` with `st`; a failure's detail is kvf_last_error() (which
 * names the node), recorded for the batch's return when it is the first. */
static void op_finish(batch *b, op *o, kvf_status st)
{
    size_t i = (size_t)(o - b->ops);
    o->done = true;
    b->status[i] = st;
    bool miss = st == KVF_ERR_NOT_FOUND && b->kind != OP_DEL;
    if (st == KVF_OK || miss)
        return;
    KVF_LOG(KVF_LOG_DEBUG, "block " KVF_KEY_FMT " (key %s): %s", KVF_KEY_ARGS(o->key), o->key_text,
            kvf_last_error());
    if (b->first == KVF_OK) {
        b->first = st;
        snprintf(b->first_msg, sizeof b->first_msg, "block " KVF_KEY_FMT " (key %s): %s",
                 KVF_KEY_ARGS(o->key), o->key_text, kvf_last_error());
    }
}

/* A timeout's message says how long the call had. */
static kvf_status with_budget(const batch *b, kvf_status st)
{
    if (st != KVF_ERR_TIMEOUT)
        return st;
    char why[512];
    snprintf(why, sizeof why, "%s", kvf_last_error());
    return kvf__fail(st, "%s (the call had %u ms)", why, b->budget_ms);
}

/* A failed connection: retried when attempts are left, else final. */
static void op_failed_connection(batch *b, op *o, kvf_status st)
{
    if (st == KVF_ERR_REMOTE && o->attempts < b->r->retries) {
        o->attempts++;
        b->backoff = true;
        return;
    }
    op_finish(b, o, st);
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the block's next node. */
static void op_redirect(batch *b, op *o, const char *msg, bool moved)
{
    const char *sp = strchr(msg, ' ');
    const char *addr = sp ? strchr(sp + 1, ' ') : NULL;
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || ++o->redirects > REDIRECT_LIMIT) {
        op_finish(b, o,
                  kvf__fail(KVF_ERR_REMOTE, "redis %s: %s (%s)", o->node->name, msg,
                            colon ? "too many redirections" : "unreadable redirection"));
        return;
    }
    char host[256];
    size_t host_len = (size_t)(colon - (addr + 1));
    if (host_len == 0) /* an empty host: the node that answered */
        snprintf(host, sizeof host, "%s", o->node->host);
    else
        snprintf(host, sizeof host, "%.*s", (int)host_len, addr + 1);
    int port = atoi(colon + 1);
    kvf__redis_node *to = kvf__redis_topology_node(&b->r->topo, host, port);
    if (!to) {
        op_finish(b, o,
                  kvf__fail(KVF_ERR_REMOTE, "redis %s: %s: too many nodes", o->node->name, msg));
        return;
    }
    KVF_LOG(KVF_LOG_DEBUG, "block " KVF_KEY_FMT ": redis %s answered %s", KVF_KEY_ARGS(o->key),
            o->node->name, msg);
    if (moved) {
        kvf__redis_topology_moved(&b->r->topo, o->slot, to);
        b->refresh_from = to;
    }
    o->node = to;
    o->asking = !moved;
}

/* An error reply: a redirection, a transient state, or final. */
static void op_error_reply(batch *b, op *o, const redisReply *reply)
{
    const char *msg = reply->str;
    if (strncmp(msg, "MOVED ", 6) == 0 || strncmp(msg, "ASK ", 4) == 0) {
        op_redirect(b, o, msg, msg[0] == 'M');
        return;
    }
    bool transient = !strncmp(msg, "TRYAGAIN", 8) || !strncmp(msg, "CLUSTERDOWN", 11) ||
                     !strncmp(msg, "LOADING", 7);
    kvf_status st =
        kvf__fail(KVF_ERR_REMOTE, "redis %s: %.*s", o->node->name, (int)reply->len, msg);
    if (transient)
        op_failed_connection(b, o, st);
    else
        op_finish(b, o, st);
}

/* A GET's value, still in the reader's buffer: checked in full before a
 * byte reaches the caller. */
static kvf_status take_value(batch *b, op *o, const char *str, size_t len)
{
    kvf__redis_get *g = &b->gets[o - b->ops];
    char what[320];
    snprintf(what, sizeof what, "redis %s", o->node->name);
    /* GETRANGE answers an absent key with an empty string */
    if (len == 0)
        return KVF_ERR_NOT_FOUND;
    kvf__block_header h;
    kvf_status st = kvf__block_value_take((const uint8_t *)str, len, what, b->r->fingerprint,
                                          b->r->ns_hash, o->key, g->dst, g->cap, &h);
    if (st != KVF_OK)
        return st;
    g->tokens = h.tokens;
    g->pools = h.pools;
    g->payload_bytes = h.payload_bytes;
    return KVF_OK;
}

/* A GETRANGE's bytes, as many as the range asked for. */
static kvf_status take_range(batch *b, op *o, const char *str, size_t len)
{
    kvf__redis_range *r = &b->ranges[o - b->ops];
    r->got = len < r->len ? len : r->len;
    memcpy(r->dst, str, r->got);
    return KVF_OK;
}

static void op_reply(batch *b, op *o, const redisReply *reply)
{
    if (reply->type == REDIS_REPLY_ERROR) {
        op_error_reply(b, o, reply);
        return;
    }
    kvf_status st;
    switch (b->kind) {
    case OP_SET:
        st = reply->type == REDIS_REPLY_STATUS ? KVF_OK : KVF_ERR_REMOTE;
        break;
    case OP_GET:
        st = reply->type == REDIS_REPLY_NIL      ? KVF_ERR_NOT_FOUND
             : reply->type == REDIS_REPLY_STRING ? take_value(b, o, reply->str, reply->len)
                                                 : KVF_ERR_REMOTE;
        break;
    case OP_RANGE:
        st = reply->type == REDIS_REPLY_NIL      ? KVF_ERR_NOT_FOUND
             : reply->type == REDIS_REPLY_STRING ? take_range(b, o, reply->str, reply->len)
                                                 : KVF_ERR_REMOTE;
        break;
    default: /* EXISTS, DEL */
        st = reply->type != REDIS_REPLY_INTEGER            ? KVF_ERR_REMOTE
             : b->kind == OP_EXISTS && reply->integer == 0 ? KVF_ERR_NOT_FOUND
                                                           : KVF_OK;
        break;
    }
    if (st == KVF_ERR_REMOTE && reply->type != REDIS_REPLY_STRING)
        st = kvf__fail(KVF_ERR_REMOTE, "redis %s: unexpected reply of type %d", o->node->name,
                       reply->type);
    op_finish(b, o, st);
}

/* RESP of "<verb> <key>" (and, for SET, the value's length line and the
 * header; for GETRANGE, the range) into o->cmd. */
static void op_encode(const kvf__redis *r, op *o, op_kind kind, const kvf__redis_put *put,
                      const kvf__redis_get *get, const kvf__redis_range *range)
{
    static const char *const verbs[] = {"SET", "GETRANGE", "EXISTS", "DEL", "GETRANGE"};
    const char *verb = verbs[kind];
    int argc = kind == OP_SET ? r->set_argc : kind == OP_GET || kind == OP_RANGE ? 4 : 2;
    int len = snprintf(o->cmd, sizeof o->cmd, "*%d\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", argc,
                       strlen(verb), verb, o->key_len, o->key_text);
    if (kind == OP_GET) {
        /* the range is inclusive: one byte more than a block can hold
         * tells a value too large from one that fits */
        char end[24];
        int n = get->cap > (size_t)INT64_MAX - KVF_BLOCK_PREFIX_MAX
                    ? snprintf(end, sizeof end, "-1")
                    : snprintf(end, sizeof end, "%zu", KVF_BLOCK_PREFIX_MAX + get->cap);
        len +=
            snprintf(o->cmd + len, sizeof o->cmd - (size_t)len, "$1\r\n0\r\n$%d\r\n%s\r\n", n, end);
    }
    if (kind == OP_RANGE) {
        /* inclusive at both ends; a range is never empty (the store's) */
        char from[24], to[24];
        int nf = snprintf(from, sizeof from, "%" PRIu64, range->off);
        int nt = snprintf(to, sizeof to, "%" PRIu64, range->off + range->len - 1);
        len += snprintf(o->cmd + len, sizeof o->cmd - (size_t)len, "$%d\r\n%s\r\n$%d\r\n%s\r\n", nf,
                        from, nt, to);
    }
    if (kind == OP_SET) {
        size_t pre = kvf__block_prefix_bytes(put->pools);
        len += snprintf(o->cmd + len, sizeof o->cmd - (size_t)len, "$%zu\r\n",
                        pre + put->payload_bytes);
        kvf__block_header h = {.fingerprint = r->fingerprint,
                               .ns_hash = r->ns_hash,
                               .key = put->key,
                               .tokens = put->tokens,
                               .pools = put->pools,
                               .payload_bytes = put->payload_bytes};
        /* cannot fail: the store checked the pools (redis_store.c) */
        kvf__block_prefix_make(&h, put->pool_bytes, put->payload, "redis", (uint8_t *)o->cmd + len);
        len += (int)pre;
    }
    o->cmd_len = (size_t)len;
}

typedef struct value_target {
    batch *b;
    op *o;
} value_target;

static kvf_status take_value_sink(void *arg, const char *str, size_t len)
{
    value_target *t = arg;
    return t->b->kind == OP_RANGE ? take_range(t->b, t->o, str, len)
                                  : take_value(t->b, t->o, str, len);
}

/* The pieces of op `o`'s command, ASKING first when redirected by ASK. */
static size_t op_iov(const batch *b, op *o, struct iovec *iov)
{
    const kvf__redis_put *put = b->puts ? &b->puts[o - b->ops] : NULL;
    const kvf__redis_get *get = b->gets ? &b->gets[o - b->ops] : NULL;
    const kvf__redis_range *range = b->ranges ? &b->ranges[o - b->ops] : NULL;
    /* encoded when first sent: a SET's header needs its payload's CRC */
    if (o->cmd_len == 0)
        op_encode(b->r, o, b->kind, put, get, range);
    size_t k = 0;
    if (o->asking)
        iov[k++] = (struct iovec){(void *)ASKING_CMD, sizeof ASKING_CMD - 1};
    iov[k++] = (struct iovec){o->cmd, o->cmd_len};
    if (b->kind == OP_SET) {
        iov[k++] = (struct iovec){(void *)put->payload, put->payload_bytes};
        iov[k++] = (struct iovec){(void *)b->r->set_tail, b->r->set_tail_len};
    }
    return k;
}

/* Sends group g's pipeline; a failure fails its blocks (or retries them). */
static void send_group(batch *b, group *g, size_t gi, struct iovec *iov)
{
    /* a node known to be down fails its blocks now: no retry, no backoff */
    g->st = kvf__redis_node_check_down(g->node);
    if (g->st != KVF_OK) {
        for (size_t i = 0; i < b->n; i++)
            if (!b->ops[i].done && b->ops[i].group == gi)
                op_finish(b, &b->ops[i], g->st);
        return;
    }
    g->st = kvf__redis_node_acquire(g->node, b->deadline_ns, &g->conn);
    size_t k = 0, bytes = 0;
    for (size_t i = 0; i < b->n && g->st == KVF_OK; i++) {
        if (b->ops[i].done || b->ops[i].group != gi)
            continue;
        size_t pieces = op_iov(b, &b->ops[i], iov + k);
        for (size_t j = k; j < k + pieces; j++)
            bytes += iov[j].iov_len;
        k += pieces;
        if (bytes >= SEND_CHUNK) {
            g->st = kvf__redis_node_send(g->node, g->conn, iov, k, b->deadline_ns);
            k = bytes = 0;
        }
    }
    if (g->st == KVF_OK && k > 0)
        g->st = kvf__redis_node_send(g->node, g->conn, iov, k, b->deadline_ns);
    if (g->st == KVF_OK)
        return;
    g->st = with_budget(b, g->st);
    for (size_t i = 0; i < b->n; i++)
        if (!b->ops[i].done && b->ops[i].group == gi)
            op_failed_connection(b, &b->ops[i], g->st);
    kvf__redis_node_release(g->node, g->conn, true);
    g->conn = NULL;
}

/* Reads group g's replies, in the order its commands were sent. */
static void read_group(batch *b, group *g, size_t gi)
{
    bool lost = false;
    for (size_t i = 0; i < b->n; i++) {
        op *o = &b->ops[i];
        if (o->done || o->group != gi)
            continue;
        redisReply *reply = NULL;
        if (g->st == KVF_OK && o->asking) {
            g->st = kvf__redis_node_read(g->node, g->conn, b->deadline_ns, &reply);
            freeReplyObject(reply);
            o->asking = false;
        }
        /* a GET's value goes from the reader's buffer to the caller's */
        value_target target = {b, o};
        kvf__redis_sink sink = {.take = take_value_sink, .arg = &target};
        if (g->st == KVF_OK)
            g->st = b->kind == OP_GET || b->kind == OP_RANGE
                        ? kvf__redis_node_read_into(g->node, g->conn, &sink, b->deadline_ns, &reply)
                        : kvf__redis_node_read(g->node, g->conn, b->deadline_ns, &reply);
        if (g->st != KVF_OK) {
            /* the connection is lost: this block and the rest of the group */
            if (!lost)
                g->st = with_budget(b, g->st);
            lost = true;
            op_failed_connection(b, o, g->st);
            continue;
        }
        if (sink.taken)
            op_finish(b, o, sink.status);
        else
            op_reply(b, o, reply);
        freeReplyObject(reply);
    }
    kvf__redis_node_release(g->node, g->conn, g->st != KVF_OK);
}

static void run_round(batch *b, group *groups, struct iovec *iov)
{
    size_t ngroups = 0;
    for (size_t i = 0; i < b->n; i++) {
        op *o = &b->ops[i];
        if (o->done)
            continue;
        size_t gi = 0;
        while (gi < ngroups && groups[gi].node != o->node)
            gi++;
        if (gi == ngroups)
            groups[ngroups++] = (group){o->node, NULL, KVF_OK};
        o->group = gi;
    }
    for (size_t gi = 0; gi < ngroups; gi++)
        send_group(b, &groups[gi], gi, iov);
    for (size_t gi = 0; gi < ngroups; gi++)
        if (groups[gi].conn)
            read_group(b, &groups[gi], gi);
}

/* The deadline passed: the blocks still pending fail without their node
 * being asked. */
static void fail_unsent(batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        op *o = &b->ops[i];
        if (!o->done)
            op_finish(b, o,
                      kvf__fail(KVF_ERR_TIMEOUT, "redis %s: not sent: the call's %u ms passed",
                                o->node->name, b->budget_ms));
    }
}

static kvf_status run_batch(batch *b)
{
    kvf__redis *r = b->r;
    /* a group per node at most; up to four pieces per block */
    group *groups = calloc(b->n, sizeof *groups);
    struct iovec *iov = calloc(b->n * 4, sizeof *iov);
    if (!groups || !iov) {
        free(groups);
        free(iov);
        return kvf__fail(KVF_ERR_NOMEM, "remote: no memory for a batch of %zu", b->n);
    }
    uint32_t backoff = r->retry_backoff_ms;
    for (;;) {
        bool pending = false;
        for (size_t i = 0; i < b->n && !pending; i++)
            pending = !b->ops[i].done;
        if (!pending)
            break;
        uint64_t now = kvf__now_ns();
        if (now >= b->deadline_ns) {
            fail_unsent(b);
            break;
        }
        b->backoff = false;
        b->refresh_from = NULL;
        run_round(b, groups, iov);
        if (b->refresh_from && kvf__redis_topology_refresh(&r->topo, b->refresh_from) != KVF_OK)
            KVF_LOG(KVF_LOG_WARN, "%s", kvf_last_error());
        if (b->backoff) {
            uint64_t left_ms = (b->deadline_ns - kvf__now_ns()) / 1000000u;
            sleep_ms(left_ms < backoff ? (uint32_t)left_ms : backoff);
            backoff = backoff * 2 < BACKOFF_CAP_MS ? backoff * 2 : BACKOFF_CAP_MS;
        }
    }
    free(groups);
    free(iov);
    if (b->first != KVF_OK)
        return kvf__fail(b->first, "%s", b->first_msg);
    kvf__clear_error();
    return KVF_OK;
}

/* What a batch of `kind` moves: the blocks put, got or ranged (one of
 * them, or none for exists and delete). */
typedef struct batch_io {
    const kvf__redis_put *puts;
    kvf__redis_get *gets;
    kvf__redis_range *ranges;
} batch_io;

static kvf_status batch_run(kvf__redis *r, op_kind kind, const kvf_key *keys, size_t stride,
                            size_t n, batch_io io, uint64_t deadline_ns, kvf_status *status)
{
    uint64_t start = kvf__now_ns();
    if (!deadline_ns)
        deadline_ns = start + r->topo.opts.timeout_ms * 1000000ull;
    static const char *const names[] = {"put", "get", "exists", "delete", "range"};
    if (!r || !keys || !status || n == 0)
        return kvf__fail(KVF_ERR_INVALID, "remote %s_batch: NULL argument or no blocks",
                         names[kind]);
    op *ops = calloc(n, sizeof *ops);
    if (!ops)
        return kvf__fail(KVF_ERR_NOMEM, "remote %s_batch: no memory for %zu blocks", names[kind],
                         n);
    batch b = {.r = r,
               .kind = kind,
               .ops = ops,
               .n = n,
               .puts = io.puts,
               .gets = io.gets,
               .ranges = io.ranges,
               .status = status,
               .deadline_ns = deadline_ns,
               .budget_ms = deadline_ns > start ? (uint32_t)((deadline_ns - start) / 1000000u) : 0,
               .first = KVF_OK};
    for (size_t i = 0; i < n; i++) {
        op *o = &ops[i];
        memcpy(&o->key, (const char *)keys + i * stride, sizeof o->key);
        o->key_len = (size_t)snprintf(o->key_text, sizeof o->key_text, "kvf:%s:" KVF_KEY_FMT, r->ns,
                                      KVF_KEY_ARGS(o->key));
        o->slot = kvf__redis_key_slot(o->key_text, o->key_len);
        o->node = kvf__redis_topology_route(&r->topo, o->slot);
    }
    kvf_status st = run_batch(&b);
    free(ops);
    return st;
}

kvf_status kvf__redis_put_batch_until(kvf__redis *r, const kvf__redis_put *blocks, size_t n,
                                      uint64_t deadline_ns, kvf_status *status)
{
    static _Thread_local uint8_t scratch[KVF_BLOCK_PREFIX_MAX];
    for (size_t i = 0; blocks && i < n; i++) {
        if (!blocks[i].payload && blocks[i].payload_bytes)
            return kvf__fail(KVF_ERR_INVALID, "remote put_batch: block " KVF_KEY_FMT ": no payload",
                             KVF_KEY_ARGS(blocks[i].key));
        /* the prefix is built when sent, where it cannot fail: its pools
         * are checked now (the store fails such a block alone, before) */
        kvf__block_header h = {.pools = blocks[i].pools, .payload_bytes = blocks[i].payload_bytes};
        kvf_status st =
            kvf__block_prefix_begin(&h, blocks[i].pool_bytes, "remote put_batch", scratch);
        if (st != KVF_OK)
            return st;
    }
    return batch_run(r, OP_SET, blocks ? &blocks->key : NULL, sizeof *blocks, n,
                     (batch_io){.puts = blocks}, deadline_ns, status);
}

kvf_status kvf__redis_get_batch_until(kvf__redis *r, kvf__redis_get *blocks, size_t n,
                                      uint64_t deadline_ns, kvf_status *status)
{
    for (size_t i = 0; blocks && i < n; i++)
        if (!blocks[i].dst && blocks[i].cap)
            return kvf__fail(KVF_ERR_INVALID, "remote get_batch: block " KVF_KEY_FMT ": no buffer",
                             KVF_KEY_ARGS(blocks[i].key));
    return batch_run(r, OP_GET, blocks ? &blocks->key : NULL, sizeof *blocks, n,
                     (batch_io){.gets = blocks}, deadline_ns, status);
}

kvf_status kvf__redis_range_batch_until(kvf__redis *r, kvf__redis_range *ranges, size_t n,
                                        uint64_t deadline_ns, kvf_status *status)
{
    for (size_t i = 0; ranges && i < n; i++) {
        ranges[i].got = 0;
        if (!ranges[i].dst || !ranges[i].len || ranges[i].off > (uint64_t)INT64_MAX - ranges[i].len)
            return kvf__fail(KVF_ERR_INVALID,
                             "remote range_batch: block " KVF_KEY_FMT ": no buffer, or an empty "
                             "or unreachable range",
                             KVF_KEY_ARGS(ranges[i].key));
    }
    return batch_run(r, OP_RANGE, ranges ? &ranges->key : NULL, sizeof *ranges, n,
                     (batch_io){.ranges = ranges}, deadline_ns, status);
}

kvf_status kvf__redis_exists_batch_until(kvf__redis *r, const kvf_key *keys, size_t n,
                                         uint64_t deadline_ns, kvf_status *status)
{
    return batch_run(r, OP_EXISTS, keys, sizeof *keys, n, (batch_io){0}, deadline_ns, status);
}

kvf_status kvf__redis_delete_batch_until(kvf__redis *r, const kvf_key *keys, size_t n,
                                         uint64_t deadline_ns, kvf_status *status)
{
    return batch_run(r, OP_DEL, keys, sizeof *keys, n, (batch_io){0}, deadline_ns, status);
}

/* Whether `node` owns a slot: a seed that is not (or no longer) part of
 * the cluster is not pinged. */
static kvf_status ping_node(kvf__redis_node *node)
{
    redisContext *c;
    kvf_status st = kvf__redis_node_acquire(node, 0, &c);
    if (st != KVF_OK)
        return st;
    const char *argv[] = {"PING"};
    const size_t lens[] = {4};
    redisReply *reply;
    st = kvf__redis_node_command(node, c, 1, argv, lens, &reply);
    if (st == KVF_OK) {
        if (reply->type == REDIS_REPLY_ERROR)
            st = kvf__fail(KVF_ERR_REMOTE, "redis %s: PING: %s", node->name, reply->str);
        freeReplyObject(reply);
    }
    kvf__redis_node_release(node, c, st != KVF_OK);
    return st;
}

kvf_status kvf__redis_ping(kvf__redis *r)
{
    if (!r)
        return kvf__fail(KVF_ERR_INVALID, "remote ping: NULL handle");
    for (size_t i = 0;; i++) {
        pthread_mutex_lock(&r->topo.lock);
        kvf__redis_node *node = i < r->topo.node_count ? r->topo.nodes[i] : NULL;
        pthread_mutex_unlock(&r->topo.lock);
        if (!node)
            return KVF_OK;
        kvf_status st = kvf__redis_topology_serves(&r->topo, i) ? ping_node(node) : KVF_OK;
        if (st != KVF_OK)
            return st;
    }
}

int kvf__redis_built(void)
{
    return 1;
}

void kvf__redis_describe(char *line, size_t cap)
{
    snprintf(line, cap, "hiredis %d.%d.%d, %s", HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH,
             kvf__redis_tls_built() ? "TLS (rediss://, rediss-cluster://)"
                                    : "no TLS (rediss:// needs hiredis >= 1.0 with hiredis_ssl)");
}

kvf_status kvf__redis_open(const kvf__redis_config *cfg, kvf__redis **remote_p)
{
    if (!cfg || !remote_p || !cfg->url)
        return kvf__fail(KVF_ERR_INVALID, "remote open: no URL");
    if (!cfg->ns || !kvf__ns_valid(cfg->ns))
        return kvf__fail(KVF_ERR_INVALID, "remote open: namespace '%s' is not [A-Za-z0-9._-]{1,64}",
                         cfg->ns ? cfg->ns : "(null)");
    if (cfg->timeout_ms == 0 || cfg->connect_timeout_ms == 0)
        return kvf__fail(KVF_ERR_INVALID, "remote open: timeouts must be > 0 ms");
    kvf__redis_url u;
    kvf_status st = kvf__redis_url_parse(cfg->url, &u);
    if (st != KVF_OK)
        return st;
    kvf__redis *r = calloc(1, sizeof *r);
    if (!r)
        return kvf__fail(KVF_ERR_NOMEM, "remote open: no memory");
    snprintf(r->ns, sizeof r->ns, "%s", cfg->ns);
    r->ns_hash = kvf__ns_hash(cfg->ns);
    r->fingerprint = cfg->fingerprint;
    r->retries = cfg->retries;
    r->retry_backoff_ms = cfg->retry_backoff_ms ? cfg->retry_backoff_ms : 1;
    if (cfg->ttl_s) {
        char ttl[16];
        int n = snprintf(ttl, sizeof ttl, "%u", cfg->ttl_s);
        r->set_tail_len = (size_t)snprintf(r->set_tail, sizeof r->set_tail,
                                           "\r\n$2\r\nEX\r\n$%d\r\n%s\r\n", n, ttl);
        r->set_argc = 5;
    } else {
        r->set_tail_len = (size_t)snprintf(r->set_tail, sizeof r->set_tail, "\r\n");
        r->set_argc = 3;
    }
    kvf__redis_opts opts = {.db = u.db,
                            .connect_timeout_ms = cfg->connect_timeout_ms,
                            .timeout_ms = cfg->timeout_ms,
                            .pool_size = cfg->pool_size ? cfg->pool_size : 1,
                            .down_ms = cfg->down_ms};
    memcpy(opts.user, u.user, sizeof opts.user);
    memcpy(opts.pass, u.pass, sizeof opts.pass);
#ifdef KVF_HAVE_REDIS_TLS
    if (u.tls && (st = kvf__redis_tls_new(&u, &opts.tls)) != KVF_OK) {
        memset(&u, 0, sizeof u);
        memset(&opts, 0, sizeof opts);
        free(r);
        return st;
    }
#else
    if ((st = kvf__redis_tls_check(&u)) != KVF_OK) {
        memset(&u, 0, sizeof u);
        memset(&opts, 0, sizeof opts);
        free(r);
        return st;
    }
#endif
    st = kvf__redis_topology_init(&r->topo, &u, &opts);
    /* the password lives on in the topology only */
    memset(&u, 0, sizeof u);
    memset(&opts, 0, sizeof opts);
    if (st != KVF_OK) {
        free(r);
        return st;
    }
    *remote_p = r;
    return KVF_OK;
}

void kvf__redis_close(kvf__redis *r)
{
    if (!r)
        return;
    kvf__redis_topology_fini(&r->topo);
    free(r);
}

kvf_status kvf__redis_probe(const char *url, uint32_t timeout_ms, char *detail, size_t cap)
{
    kvf__redis_config cfg = KVF_REDIS_CONFIG_INIT;
    cfg.url = url;
    cfg.ns = "probe";
    cfg.connect_timeout_ms = cfg.timeout_ms = timeout_ms ? timeout_ms : 1000;
    cfg.retries = 0;
    kvf__redis *r = NULL;
    kvf_status st = kvf__redis_open(&cfg, &r);
    if (st == KVF_OK)
        st = kvf__redis_ping(r);
    if (detail && cap) {
        if (st != KVF_OK)
            snprintf(detail, cap, "%s", kvf_last_error());
        else if (r->topo.cluster) {
            size_t serving = 0;
            for (size_t i = 0; i < r->topo.node_count; i++)
                serving += kvf__redis_topology_serves(&r->topo, i);
            snprintf(detail, cap, "redis cluster, %zu master(s) serving slots", serving);
        } else
            snprintf(detail, cap, "redis %s db %u", r->topo.nodes[0]->name, r->topo.opts.db);
    }
    kvf__redis_close(r);
    return st;
}
