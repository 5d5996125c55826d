/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier: blocks stored in Redis (one server or a Redis Cluster).
 * Internal to kvferry; the cache calls it.
 *
 * A block is one Redis string under `kvf:<namespace>:<key as 32 hex>`,
 * holding the stored form of a block (blockhdr.c: a 64-byte header, then
 * the payload). Every value read back is checked (header, namespace,
 * layout, key, length, CRC-32C) before a byte reaches the caller: a
 * corrupt value is KVF_ERR_CORRUPT and a foreign one KVF_ERR_MISMATCH, for
 * that block only.
 *
 * URLs:
 *   redis://[user[:pass]@]host[:port][/db]       one server (port 6379)
 *   redis-cluster://[user[:pass]@]h1:p1,h2:p2,... seed nodes of a cluster
 *   rediss://..., rediss-cluster://...[?tls_...]  the same over TLS
 * user and pass may be %-escaped; `[::1]:6379` for IPv6; db must be 0 in a
 * cluster. TLS parameters (redis_url.h): tls_ca=FILE, tls_ca_dir=DIR (else
 * the system's CAs), tls_cert=FILE and tls_key=FILE (a client
 * certificate), tls_sni=NAME (sent, and verified instead of the host),
 * tls_verify=yes|no (the server's certificate and name; yes). AUTH is `AUTH user pass` with a user
 * (Redis 6 ACL), `AUTH pass` without one. KVF_REMOTE_URL holds the URL the cache uses by default.
 *
 * In a cluster, keys go to the node owning their hash slot (CLUSTER SLOTS
 * at open); MOVED replies are followed and refresh the slot map, ASK
 * replies are followed with ASKING. A node that is down or slow fails only
 * the blocks routed to it. Failed connections are retried (`retries`
 * times, backoff doubling from `retry_backoff_ms`, within the call's
 * deadline); timeouts are not. A
 * node that cannot be connected to is left alone for `down_ms` (its
 * blocks fail at once, "down"), then connected to again.
 *
 * Threads: every function may be called from several threads at once on
 * one handle, except kvf__redis_close, which must be the last call.
 * Buffers passed to a batch call may be reused when it returns.
 */
#ifndef KVF_REDIS_H
#define KVF_REDIS_H

#include "blockhdr.h"
#include "common.h"
#include "redis_url.h"
#include "status.h"
#include "store.h"

typedef struct kvf__redis_config {
    const char *url;      /* see above; required */
    const char *ns;       /* namespace, kvf__ns_valid(); required */
    uint64_t fingerprint; /* layout of the blocks; 0 accepts any layout on read */
    uint32_t ttl_s;       /* expiry of stored blocks (SET ... EX); 0: none */
    uint32_t connect_timeout_ms;
    uint32_t timeout_ms; /* a single command's timeout, and a batch call's without a deadline */
    uint32_t pool_size;  /* idle connections kept per node */
    uint32_t retries;    /* extra attempts after a failed connection */
    uint32_t retry_backoff_ms;
    uint32_t down_ms; /* after a failed connect, no new attempt for this long; 0: always try */
} kvf__redis_config;

#define KVF_REDIS_CONFIG_INIT                                                                      \
    {                                                                                              \
        NULL, NULL, 0, 0, 1000, 2000, 4, 2, 20, 1000                                               \
    }

/* Whether this build has the Redis client (hiredis found at build time). */
KVF_INTERNAL int kvf__redis_built(void);
/* Whether this build speaks TLS (hiredis >= 1.0 with hiredis_ssl). */
KVF_INTERNAL bool kvf__redis_tls_built(void);
/* Whether the URL's TLS settings can be used: KVF_OK (no TLS asked, or the
 * files it names load and hold together), KVF_ERR_UNSUPPORTED (TLS asked
 * in a build without it: the message says how to get it),
 * KVF_ERR_INVALID (naming the parameter and file). */
KVF_INTERNAL kvf_status kvf__redis_tls_check(const kvf__redis_url *u);
/* What the client is built with, for `kvferry info`: hiredis' version and
 * whether rediss:// (TLS) works. */
KVF_INTERNAL void kvf__redis_describe(char *line, size_t cap);

typedef struct kvf__redis kvf__redis;

/* Connects to the server (or to the first seed that answers, then reads
 * the slot map), authenticates and selects the db. KVF_ERR_UNSUPPORTED
 * without hiredis; KVF_ERR_INVALID for a bad URL or namespace;
 * KVF_ERR_REMOTE / KVF_ERR_TIMEOUT when no node can be reached or AUTH is
 * refused (kvf_last_error names the node). */
KVF_INTERNAL kvf_status kvf__redis_open(const kvf__redis_config *cfg, kvf__redis **remote_p);
/* Closes every connection; accepts NULL. */
KVF_INTERNAL void kvf__redis_close(kvf__redis *r);

/* One block to store: `payload_bytes` bytes, all pools of the block. */
typedef struct kvf__redis_put {
    kvf_key key;
    uint32_t tokens, pools;
    const void *payload;
    size_t payload_bytes;
    const uint32_t *pool_bytes; /* NULL: the payload split evenly (blockhdr.h) */
} kvf__redis_put;

/* One block to fetch into dst[0..cap). The last three fields are outputs,
 * set when its status is KVF_OK. */
typedef struct kvf__redis_get {
    kvf_key key;
    void *dst;
    size_t cap;
    uint32_t tokens, pools;
    size_t payload_bytes;
} kvf__redis_get;

/* One range of a block's value to fetch: bytes [off, off + len) (len >
 * 0) into dst, unchecked (the caller checks them against the value's
 * pool table). got: the bytes the value had there (fewer where it ends;
 * 0 past its end or for an absent key, which GETRANGE cannot tell apart),
 * set when the status is KVF_OK. */
typedef struct kvf__redis_range {
    kvf_key key;
    uint64_t off;
    size_t len;
    void *dst;
    size_t got;
} kvf__redis_range;

/*
 * Batch calls: one pipelined round trip per node (more only to follow
 * redirections or retry). status[i] receives block i's outcome. The
 * return value is KVF_OK when every block succeeded (for get and exists, a
 * block that is absent, KVF_ERR_NOT_FOUND, counts as success: a miss),
 * else the first failed block's status, kvf_last_error() naming its key
 * and node. KVF_ERR_INVALID (nothing done) for a NULL or n == 0.
 *
 * A call returns by `deadline_ns` (kvf__now_ns() time; 0: timeout_ms
 * from the call), however many blocks and however slowly a node sends or
 * takes its bytes: the blocks not done by then are KVF_ERR_TIMEOUT, and
 * those not yet sent are failed without contacting their node again. A
 * connection that timed out mid-reply is closed (a later call connects
 * anew).
 *
 * put:    KVF_OK stored; KVF_ERR_REMOTE / KVF_ERR_TIMEOUT (the block may or
 *         may not be stored: a later get checks it either way).
 * get:    KVF_OK, payload copied and checked; KVF_ERR_NOT_FOUND (also for
 *         an empty value); KVF_ERR_CORRUPT / KVF_ERR_MISMATCH (never any
 *         data; a value larger than a header and `cap` payload bytes is
 *         CORRUPT, and no more than that is read of it); KVF_ERR_RANGE when
 *         cap is too small for the block its header describes; KVF_ERR_
 *         REMOTE / KVF_ERR_TIMEOUT. dst's bytes are unspecified after a
 *         failure.
 * range:  KVF_OK, got bytes copied; KVF_ERR_REMOTE / KVF_ERR_TIMEOUT.
 * exists: KVF_OK present, KVF_ERR_NOT_FOUND absent (the value is not
 *         read: a get may still find it corrupt).
 * delete: KVF_OK whether or not the block existed.
 */
KVF_INTERNAL kvf_status kvf__redis_put_batch_until(kvf__redis *r, const kvf__redis_put *blocks,
                                                   size_t n, uint64_t deadline_ns,
                                                   kvf_status *status);
KVF_INTERNAL kvf_status kvf__redis_get_batch_until(kvf__redis *r, kvf__redis_get *blocks, size_t n,
                                                   uint64_t deadline_ns, kvf_status *status);
KVF_INTERNAL kvf_status kvf__redis_range_batch_until(kvf__redis *r, kvf__redis_range *ranges,
                                                     size_t n, uint64_t deadline_ns,
                                                     kvf_status *status);
KVF_INTERNAL kvf_status kvf__redis_exists_batch_until(kvf__redis *r, const kvf_key *keys, size_t n,
                                                      uint64_t deadline_ns, kvf_status *status);
KVF_INTERNAL kvf_status kvf__redis_delete_batch_until(kvf__redis *r, const kvf_key *keys, size_t n,
                                                      uint64_t deadline_ns, kvf_status *status);

/* The batch calls with the configured timeout from the call as deadline. */
static inline kvf_status kvf__redis_put_batch(kvf__redis *r, const kvf__redis_put *blocks, size_t n,
                                              kvf_status *status)
{
    return kvf__redis_put_batch_until(r, blocks, n, 0, status);
}
static inline kvf_status kvf__redis_get_batch(kvf__redis *r, kvf__redis_get *blocks, size_t n,
                                              kvf_status *status)
{
    return kvf__redis_get_batch_until(r, blocks, n, 0, status);
}
static inline kvf_status kvf__redis_exists_batch(kvf__redis *r, const kvf_key *keys, size_t n,
                                                 kvf_status *status)
{
    return kvf__redis_exists_batch_until(r, keys, n, 0, status);
}
static inline kvf_status kvf__redis_delete_batch(kvf__redis *r, const kvf_key *keys, size_t n,
                                                 kvf_status *status)
{
    return kvf__redis_delete_batch_until(r, keys, n, 0, status);
}

/* Visits every block of the namespace whose header and length check, each
 * once (in key order; mtime_ns 0), found with SCAN on the server or on
 * every cluster node that serves slots (redis_scan.c), never a blocking
 * KEYS. KVF_ERR_REMOTE / KVF_ERR_TIMEOUT naming a node that cannot be
 * listed (nothing visited then). */
KVF_INTERNAL kvf_status kvf__redis_list(kvf__redis *r, kvf__store_visit_fn visit, void *arg);

/* PINGs the server, or every cluster node that serves slots. KVF_OK when
 * all answer. */
KVF_INTERNAL kvf_status kvf__redis_ping(kvf__redis *r);

/* For `kvferry info`: opens `url` with `timeout_ms` timeouts, pings, closes.
 * KVF_OK and a description ("redis 10.0.0.1:6379 db 0", "redis cluster, 3
 * master(s) serving slots") in `detail`, or an error and why (kvf_last_error's
 * text). */
KVF_INTERNAL kvf_status kvf__redis_probe(const char *url, uint32_t timeout_ms, char *detail,
                                         size_t cap);

#endif /* KVF_REDIS_H */
