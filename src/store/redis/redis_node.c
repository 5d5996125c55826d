/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connections to one Redis node: made with the connect timeout, then
 * authenticated and the db selected. Single commands (AUTH, PING, CLUSTER
 * SLOTS) run under the command timeout (SO_RCVTIMEO / SO_SNDTIMEO, set by
 * redisSetTimeout). A batch's pipelines are written and read with poll()
 * against the batch's deadline instead: a socket timeout bounds each recv,
 * not the reply, so a node that sends a byte now and then would hold a
 * batch for ever.
 *
 * Pipelines are written by kvf__redis_node_send straight from the
 * caller's buffers (sendmsg on the connection's socket: no copy into
 * hiredis' output buffer) and their replies read with hiredis' reader,
 * whose string constructor hands a value to a sink when one is set (no
 * reply object of the value's size, no copy into it).
 */
#include "redis_internal.h"
#include "sendall.h"
#include "status.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* hiredis' own reply constructors, and ours: the same but for strings */
static const redisReplyObjectFunctions *default_fns;
static redisReplyObjectFunctions sink_fns;
static pthread_mutex_t fns_lock = PTHREAD_MUTEX_INITIALIZER;

static void *sink_create_string(const redisReadTask *task, char *str, size_t len)
{
    kvf__redis_sink *sink = task->privdata;
    if (sink && !task->parent && task->type == REDIS_REPLY_STRING) {
        sink->status = sink->take(sink->arg, str, len);
        sink->taken = true;
        return default_fns->createNil(task);
    }
    return default_fns->createString(task, str, len);
}

/* Gives the connection's reader our constructors (the defaults are one
 * static table in hiredis, the same for every context). */
static void use_sink_fns(redisContext *c)
{
    pthread_mutex_lock(&fns_lock);
    if (!default_fns) {
        default_fns = c->reader->fn;
        sink_fns = *default_fns;
        sink_fns.createString = sink_create_string;
    }
    pthread_mutex_unlock(&fns_lock);
    c->reader->fn = &sink_fns;
    c->reader->privdata = NULL;
}

static struct timeval ms_timeval(uint32_t ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    return tv;
}

/* A failed hiredis call on `c`: a timeout, or the connection is gone. */
static kvf_status context_failure(kvf__redis_node *node, redisContext *c, int err,
                                  const char *during, uint32_t timeout_ms)
{
    bool timed_out = (c->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK ||
                                                 err == ETIMEDOUT || err == EINPROGRESS)) ||
                     strstr(c->errstr, "timed out") || strstr(c->errstr, "temporarily unavailable");
    if (timed_out)
        return kvf__fail(KVF_ERR_TIMEOUT, "redis %s: %s: no answer within %u ms", node->name,
                         during, timeout_ms);
    /* a socket refused for want of descriptors or buffers is this
     * process's shortage, not the store's failure */
    if (c->err == REDIS_ERR_IO &&
        (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM))
        return kvf__fail(kvf__errno_status(err), "redis %s: %s: %s", node->name, during,
                         strerror(err));
    if (c->err == REDIS_ERR_EOF)
        return kvf__fail(KVF_ERR_REMOTE, "redis %s: %s: connection closed by the server",
                         node->name, during);
    return kvf__fail(KVF_ERR_REMOTE, "redis %s: %s: %s", node->name, during,
                     c->errstr[0] ? c->errstr : "connection failed");
}

kvf_status kvf__redis_node_command(kvf__redis_node *node, redisContext *c, int argc,
                                   const char **argv, const size_t *lens, redisReply **reply_p)
{
    errno = 0;
    redisReply *reply = redisCommandArgv(c, argc, argv, lens);
    if (!reply)
        return context_failure(node, c, errno, argv[0], node->opts->timeout_ms);
    *reply_p = reply;
    return KVF_OK;
}

kvf_status kvf__redis_node_reply(kvf__redis_node *node, redisContext *c, redisReply **reply_p)
{
    void *reply = NULL;
    errno = 0;
    if (redisGetReply(c, &reply) != REDIS_OK || !reply)
        return context_failure(node, c, errno, "reply", node->opts->timeout_ms);
    *reply_p = reply;
    return KVF_OK;
}

/* Runs a setup command (AUTH, SELECT) that must answer +OK. */
static kvf_status setup_command(kvf__redis_node *node, redisContext *c, int argc, const char **argv,
                                const char *what)
{
    size_t lens[3];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    redisReply *reply = NULL;
    kvf_status st = kvf__redis_node_command(node, c, argc, argv, lens, &reply);
    if (st != KVF_OK)
        return st;
    if (reply->type == REDIS_REPLY_ERROR)
        st = kvf__fail(KVF_ERR_REMOTE, "redis %s: %s refused: %.*s", node->name, what,
                       (int)reply->len, reply->str);
    freeReplyObject(reply);
    return st;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* *reached_p says whether the TCP connection was made (then a failure is
 * AUTH's or SELECT's, or a timeout of theirs). Connecting and the setup
 * commands wait no longer than `left_ms`. */
static kvf_status connect_node(kvf__redis_node *node, uint32_t left_ms, redisContext **c_p,
                               bool *reached_p)
{
    const kvf__redis_opts *o = node->opts;
    uint32_t connect_ms = min_u32(o->connect_timeout_ms, left_ms);
    errno = 0;
    redisContext *c = redisConnectWithTimeout(node->host, node->port, ms_timeval(connect_ms));
    if (!c)
        return kvf__fail(KVF_ERR_NOMEM, "redis %s: no memory for a connection", node->name);
    kvf_status st = KVF_OK;
    if (c->err) {
        st = context_failure(node, c, errno, "connect", connect_ms);
        goto free_context;
    }
    *reached_p = true;
    use_sink_fns(c);
    uint32_t setup_ms = min_u32(o->timeout_ms, left_ms);
    if (redisSetTimeout(c, ms_timeval(setup_ms)) != REDIS_OK) {
        st = context_failure(node, c, errno, "setting the timeout", setup_ms);
        goto free_context;
    }
    if (o->tls && (st = kvf__redis_tls_start(node, c)) != KVF_OK)
        goto free_context;
    if (o->pass[0]) {
        char what[192];
        if (o->user[0]) {
            snprintf(what, sizeof what, "AUTH as user '%s'", o->user);
            const char *argv[] = {"AUTH", o->user, o->pass};
            st = setup_command(node, c, 3, argv, what);
        } else {
            const char *argv[] = {"AUTH", o->pass};
            st = setup_command(node, c, 2, argv, "AUTH (password only)");
        }
        if (st != KVF_OK)
            goto free_context;
    }
    if (o->db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%u", o->db);
        const char *argv[] = {"SELECT", db};
        if ((st = setup_command(node, c, 2, argv, "SELECT")) != KVF_OK)
            goto free_context;
    }
    /* later single commands on this connection get the whole timeout */
    if (setup_ms < o->timeout_ms && redisSetTimeout(c, ms_timeval(o->timeout_ms)) != REDIS_OK) {
        st = context_failure(node, c, errno, "setting the timeout", o->timeout_ms);
        goto free_context;
    }
    *c_p = c;
    return KVF_OK;

free_context:
    redisFree(c);
    return st;
}

kvf_status kvf__redis_node_create(const char *host, int port, const kvf__redis_opts *opts,
                                  kvf__redis_node **node_p)
{
    kvf__redis_node *node = calloc(1, sizeof *node);
    if (!node)
        return kvf__fail(KVF_ERR_NOMEM, "redis %s:%d: no memory", host, port);
    node->idle = calloc(opts->pool_size ? opts->pool_size : 1, sizeof *node->idle);
    if (!node->idle) {
        free(node);
        return kvf__fail(KVF_ERR_NOMEM, "redis %s:%d: no memory", host, port);
    }
    snprintf(node->host, sizeof node->host, "%s", host);
    node->port = port;
    snprintf(node->name, sizeof node->name, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    node->opts = opts;
    pthread_mutex_init(&node->lock, NULL);
    *node_p = node;
    return KVF_OK;
}

void kvf__redis_node_destroy(kvf__redis_node *node)
{
    if (!node)
        return;
    for (uint32_t i = 0; i < node->idle_count; i++)
        redisFree(node->idle[i]);
    pthread_mutex_destroy(&node->lock);
    free(node->idle);
    free(node);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

kvf_status kvf__redis_node_check_down(kvf__redis_node *node)
{
    char why[sizeof node->down_why];
    double now = now_s(), wait = 0;
    pthread_mutex_lock(&node->lock);
    if (node->idle_count == 0 && now < node->down_until) {
        wait = node->down_until - now;
        memcpy(why, node->down_why, sizeof why);
    }
    pthread_mutex_unlock(&node->lock);
    if (wait > 0)
        return kvf__fail(KVF_ERR_REMOTE, "redis %s: down, next attempt in %.0f ms (%s)", node->name,
                         wait * 1e3, why);
    return KVF_OK;
}

kvf_status kvf__redis_node_acquire(kvf__redis_node *node, uint64_t deadline_ns, redisContext **c_p)
{
    redisContext *c = NULL;
    pthread_mutex_lock(&node->lock);
    if (node->idle_count > 0)
        c = node->idle[--node->idle_count];
    pthread_mutex_unlock(&node->lock);
    if (c) {
        *c_p = c;
        return KVF_OK;
    }
    /* a node that just failed to connect is not tried by every batch:
     * a host that drops packets would cost each one a connect timeout */
    kvf_status st = kvf__redis_node_check_down(node);
    if (st != KVF_OK)
        return st;
    uint32_t left = kvf__ms_left(deadline_ns, UINT32_MAX);
    if (left == 0)
        return kvf__fail(KVF_ERR_TIMEOUT, "redis %s: connect: the batch's deadline passed",
                         node->name);
    bool reached = false;
    st = connect_node(node, left, c_p, &reached);
    pthread_mutex_lock(&node->lock);
    if (st != KVF_OK && !reached && node->opts->down_ms) {
        /* the reason without the node's name, which the later message has */
        const char *e = kvf_last_error(), *reason = strstr(e, "connect: ");
        node->down_until = now_s() + node->opts->down_ms * 1e-3;
        snprintf(node->down_why, sizeof node->down_why, "%s", reason ? reason : e);
    } else if (st == KVF_OK) {
        node->down_until = 0;
    }
    pthread_mutex_unlock(&node->lock);
    return st;
}

void kvf__redis_node_release(kvf__redis_node *node, redisContext *c, bool broken)
{
    if (!c)
        return;
    if (!broken) {
        pthread_mutex_lock(&node->lock);
        uint32_t cap = node->opts->pool_size ? node->opts->pool_size : 1;
        if (node->idle_count < cap) {
            node->idle[node->idle_count++] = c;
            c = NULL;
        }
        pthread_mutex_unlock(&node->lock);
    }
    if (c)
        redisFree(c);
}

/* A deadline of 0: the configured timeout from now. */
static uint64_t deadline_or_timeout(const kvf__redis_node *node, uint64_t deadline_ns)
{
    return deadline_ns ? deadline_ns : kvf__now_ns() + node->opts->timeout_ms * 1000000ull;
}

kvf_status kvf__redis_node_send(kvf__redis_node *node, redisContext *c, struct iovec *iov, size_t n,
                                uint64_t deadline_ns)
{
    uint64_t deadline = deadline_or_timeout(node, deadline_ns);
    if ((node->opts->tls ? kvf__redis_tls_send_all(c, iov, n, deadline)
                         : kvf__send_all(c->fd, iov, n, deadline)) == 0)
        return KVF_OK;
    if (errno == ETIMEDOUT)
        return kvf__fail(KVF_ERR_TIMEOUT, "redis %s: send: not accepting bytes in time",
                         node->name);
    return kvf__fail(KVF_ERR_REMOTE, "redis %s: send: %s", node->name, strerror(errno));
}

kvf_status kvf__redis_node_read(kvf__redis_node *node, redisContext *c, uint64_t deadline_ns,
                                redisReply **reply_p)
{
    deadline_ns = deadline_or_timeout(node, deadline_ns);
    for (;;) {
        void *reply = NULL;
        errno = 0;
        if (redisGetReplyFromReader(c, &reply) != REDIS_OK)
            return context_failure(node, c, errno, "reply", 0);
        if (reply) {
            *reply_p = reply;
            return KVF_OK;
        }
        int ready = node->opts->tls && kvf__redis_tls_pending(c)
                        ? 1
                        : kvf__wait_fd(c->fd, POLLIN, kvf__ms_left(deadline_ns, UINT32_MAX));
        if (ready == 0)
            return kvf__fail(KVF_ERR_TIMEOUT, "redis %s: reply: not complete in time", node->name);
        if (ready < 0)
            return kvf__fail(KVF_ERR_REMOTE, "redis %s: reply: poll: %s", node->name,
                             strerror(errno));
        errno = 0;
        if (redisBufferRead(c) != REDIS_OK)
            return context_failure(node, c, errno, "reply", 0);
    }
}

kvf_status kvf__redis_node_read_into(kvf__redis_node *node, redisContext *c, kvf__redis_sink *sink,
                                     uint64_t deadline_ns, redisReply **reply_p)
{
    sink->taken = false;
    c->reader->privdata = sink;
    kvf_status st = kvf__redis_node_read(node, c, deadline_ns, reply_p);
    c->reader->privdata = NULL;
    return st;
}
