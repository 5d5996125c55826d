/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared by the Redis client's files: redis_node.c (connections to one
 * node), redis_cluster.c (hash slots and the slot map) and redis_client.c
 * (the remote tier's batch calls). Built only with hiredis.
 */
#ifndef KVF_REDIS_INTERNAL_H
#define KVF_REDIS_INTERNAL_H

#include "common.h"
#include "redis.h"

#include <hiredis/hiredis.h>
#include <sys/uio.h>

#define KVF_REDIS_SLOTS 16384
#define KVF_REDIS_MAX_NODES 256
#define KVF_REDIS_NO_NODE 0xffffu

/* TLS (redis_tls.c): an OpenSSL context and the names its connections
 * verify, made from a rediss:// URL's parameters. */
typedef struct kvf__redis_tls kvf__redis_tls;

/* How every connection is made: from the config and the URL. */
typedef struct kvf__redis_opts {
    kvf__redis_tls *tls; /* NULL: plain TCP */
    char user[128];
    char pass[256];
    uint32_t db;
    uint32_t connect_timeout_ms;
    uint32_t timeout_ms;
    uint32_t pool_size;
    uint32_t down_ms;
} kvf__redis_opts;

/* One server: its address and a cache of idle connections. Connections are
 * taken by one thread at a time; any number may be open at once (a thread
 * never waits for another's connection, so no batch can deadlock). */
typedef struct kvf__redis_node {
    char host[256];
    int port;
    char name[272]; /* "host:port", for messages */
    const kvf__redis_opts *opts;
    pthread_mutex_t lock;
    redisContext **idle;
    uint32_t idle_count;
    double down_until; /* CLOCK_MONOTONIC seconds: no connect attempt before */
    char down_why[192];
} kvf__redis_node;

KVF_INTERNAL kvf_status kvf__redis_node_create(const char *host, int port,
                                               const kvf__redis_opts *opts,
                                               kvf__redis_node **node_p);
KVF_INTERNAL void kvf__redis_node_destroy(kvf__redis_node *node);
/* An idle connection, or a new one (connected, authenticated, db
 * selected). KVF_ERR_REMOTE / KVF_ERR_TIMEOUT naming the node; KVF_ERR_
 * REMOTE at once while the node is down (opts->down_ms after a failed
 * connect). A new connection is made before `deadline_ns` (kvf__now_ns
 * time; 0: none, the configured timeouts only), KVF_ERR_TIMEOUT at once
 * when it passed. */
KVF_INTERNAL kvf_status kvf__redis_node_acquire(kvf__redis_node *node, uint64_t deadline_ns,
                                                redisContext **c_p);
/* KVF_OK, or the failure acquire would give at once: the node is down. */
KVF_INTERNAL kvf_status kvf__redis_node_check_down(kvf__redis_node *node);
/* Gives a connection back; `broken` (an error or a timeout left it in an
 * unknown state) closes it. */
KVF_INTERNAL void kvf__redis_node_release(kvf__redis_node *node, redisContext *c, bool broken);
/* The pipeline calls below end by `deadline_ns` (kvf__now_ns time; 0: the
 * configured timeout from the call), however the node paces its bytes:
 * KVF_ERR_TIMEOUT then, and the connection is out of step (release it
 * broken). */
/* kvf__send_all on a connection, failures named after the node. */
KVF_INTERNAL kvf_status kvf__redis_node_send(kvf__redis_node *node, redisContext *c,
                                             struct iovec *iov, size_t n, uint64_t deadline_ns);
/* The next reply; the caller frees it with freeReplyObject. */
KVF_INTERNAL kvf_status kvf__redis_node_read(kvf__redis_node *node, redisContext *c,
                                             uint64_t deadline_ns, redisReply **reply_p);
/* Where a reply that is one bulk string goes instead of a copy of its own:
 * `take` sees the bytes in the reader's buffer, and its status is kept. */
typedef struct kvf__redis_sink {
    kvf_status (*take)(void *arg, const char *str, size_t len);
    void *arg;
    bool taken;
    kvf_status status;
} kvf__redis_sink;
/* kvf__redis_node_read, a bulk string reply handed to `sink` (then *reply_p
 * is a nil reply and sink->taken is set); other replies as usual. */
KVF_INTERNAL kvf_status kvf__redis_node_read_into(kvf__redis_node *node, redisContext *c,
                                                  kvf__redis_sink *sink, uint64_t deadline_ns,
                                                  redisReply **reply_p);
/* One command, sent and answered, on a connection. */
KVF_INTERNAL kvf_status kvf__redis_node_command(kvf__redis_node *node, redisContext *c, int argc,
                                                const char **argv, const size_t *lens,
                                                redisReply **reply_p);

/* The TLS context of a rediss:// URL: CA file or directory (else the
 * system's CAs), client certificate and key, the name to verify.
 * KVF_ERR_INVALID naming the parameter and file that cannot be used;
 * KVF_ERR_UNSUPPORTED in a build without TLS. */
KVF_INTERNAL kvf_status kvf__redis_tls_new(const kvf__redis_url *u, kvf__redis_tls **tls_p);
KVF_INTERNAL void kvf__redis_tls_free(kvf__redis_tls *t);
/* The handshake on a connection just made (timeouts set): KVF_OK, or
 * KVF_ERR_REMOTE naming the node and why (a certificate refused, a server
 * that does not speak TLS). */
KVF_INTERNAL kvf_status kvf__redis_tls_start(kvf__redis_node *node, redisContext *c);
/* Whether the TLS session holds bytes already read that hiredis has not
 * taken (a poll on the socket would not see them). */
KVF_INTERNAL bool kvf__redis_tls_pending(redisContext *c);
/* kvf__send_all through a connection's TLS session. */
KVF_INTERNAL int kvf__redis_tls_send_all(redisContext *c, struct iovec *iov, size_t n,
                                         uint64_t deadline_ns);

#ifndef KVF_HAVE_REDIS_TLS
/* no TLS in this build: opts->tls is never set, and these never called */
#define kvf__redis_tls_start(node, c) KVF_ERR_UNSUPPORTED
#define kvf__redis_tls_pending(c) false
#define kvf__redis_tls_send_all(c, iov, n, deadline_ns) (-1)
#endif

/* The next reply to commands appended on a connection (redisAppendCommand
 * and kin), written first where still buffered, under the command timeout;
 * failures named after the node. */
KVF_INTERNAL kvf_status kvf__redis_node_reply(kvf__redis_node *node, redisContext *c,
                                              redisReply **reply_p);

/* CRC16 (XMODEM) of the key, or of its {hashtag}, modulo 16384. */
KVF_INTERNAL uint16_t kvf__redis_key_slot(const char *key, size_t len);

/* The nodes known and, in a cluster, which one owns each slot. Nodes are
 * only added (never freed before the topology), so a node pointer stays
 * valid while the topology lives. */
typedef struct kvf__redis_topology {
    kvf__redis_opts opts;
    int cluster;
    pthread_mutex_t lock;
    kvf__redis_node *nodes[KVF_REDIS_MAX_NODES];
    size_t node_count;
    uint16_t slot_node[KVF_REDIS_SLOTS]; /* index into nodes, or KVF_REDIS_NO_NODE */
    uint16_t fallback; /* a node serving slots: where a slot nobody owns is sent */
} kvf__redis_topology;

/* Seeds from the URL; opts->tls (when set) is the topology's from then on,
 * also after a failure. A cluster's slot map read from the first seed that
 * answers CLUSTER SLOTS. A single server is connected once, to check it
 * answers and the credentials. */
KVF_INTERNAL kvf_status kvf__redis_topology_init(kvf__redis_topology *t, const kvf__redis_url *u,
                                                 const kvf__redis_opts *opts);
KVF_INTERNAL void kvf__redis_topology_fini(kvf__redis_topology *t);
/* The node for a slot: the owner, or (slot unknown) a node that serves
 * others, which will redirect or say the slot is not served. */
KVF_INTERNAL kvf__redis_node *kvf__redis_topology_route(kvf__redis_topology *t, uint16_t slot);
/* The node at host:port, added when new; NULL when the table is full. */
KVF_INTERNAL kvf__redis_node *kvf__redis_topology_node(kvf__redis_topology *t, const char *host,
                                                       int port);
/* A MOVED reply: `slot` now lives on `node`. */
KVF_INTERNAL void kvf__redis_topology_moved(kvf__redis_topology *t, uint16_t slot,
                                            kvf__redis_node *node);
/* Whether node `index` serves slots (a single server: index 0). */
KVF_INTERNAL bool kvf__redis_topology_serves(kvf__redis_topology *t, size_t index);
/* Rereads the slot map, asking `first` (may be NULL) before the others. */
KVF_INTERNAL kvf_status kvf__redis_topology_refresh(kvf__redis_topology *t, kvf__redis_node *first);

/* A handle (redis.h): what its batch calls (redis_client.c) and its
 * listing (redis_scan.c) share. */
struct kvf__redis {
    char ns[72];
    uint64_t ns_hash;
    uint64_t fingerprint;
    uint32_t retries, retry_backoff_ms;
    char set_tail[64]; /* after the value: CRLF, then EX <ttl> when asked */
    size_t set_tail_len;
    int set_argc;
    kvf__redis_topology topo;
};

#endif /* KVF_REDIS_INTERNAL_H */
