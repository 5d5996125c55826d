/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 store's requests, over libcurl's multi interface: a batch of
 * requests in flight together over at most `conns` connections kept alive
 * between calls, each signed by libcurl (SigV4). Retried with backoff on a
 * 5xx answer (503 SlowDown among them) or a failed connection, send or
 * receive; never on a 4xx, never past the deadline.
 *
 * Threads: kvf__s3_run may be called from several threads at once on one
 * client (each call takes its own set of connections); kvf__s3_client_free
 * must be the last call.
 */
#ifndef KVF_S3_HTTP_H
#define KVF_S3_HTTP_H

#include "s3_url.h"

typedef enum { KVF_S3_GET, KVF_S3_PUT, KVF_S3_HEAD, KVF_S3_DELETE } kvf__s3_method;

/* One request. The caller sets the fields up to `range`; the run fills
 * the answers. */
typedef struct kvf__s3_req {
    kvf__s3_method method;
    char object[640];  /* the object's name in the bucket; "" the bucket */
    const char *query; /* sorted, %-escaped (as SigV4 signs it), or NULL */
    /* PUT's body: head[0..head_len) then body[0..body_len) */
    const void *head, *body;
    size_t head_len, body_len;
    /* GET: the body goes to dst[0..cap); a longer one stops there
     * (overflow). range: only `range` bytes from range_off are asked for
     * (0: all). A server answering a ranged GET with the whole object
     * (200, not 206: one that ignores Range) is read up to the range's
     * end, only the range kept (whole is set); a range past the object's
     * end (416) is a success of no bytes. got < range: the object ends
     * there. */
    void *dst;
    size_t cap, range;
    uint64_t range_off;
    /* answers: status KVF_OK (2xx), KVF_ERR_NOT_FOUND (404: for DELETE
     * KVF_OK), KVF_ERR_REMOTE (another answer, or failures after the
     * retries), KVF_ERR_TIMEOUT (the deadline); why says what failed. */
    kvf_status status;
    long http;
    size_t got;
    bool overflow, whole;
    char why[320];
    /* the run's own */
    void *easy;
    size_t sent;
    uint64_t seen; /* a whole answer's body bytes so far */
    unsigned attempts;
    uint64_t retry_at_ns;
    char err[1024];
    size_t err_len;
} kvf__s3_req;

typedef struct kvf__s3_client kvf__s3_client;

/* A client for u's endpoint and bucket, keys and region (copied: u may be
 * wiped after). timeout_ms: connecting's limit. Connects to nothing. */
KVF_INTERNAL kvf_status kvf__s3_client_new(const kvf__s3_url *u, uint32_t timeout_ms,
                                           kvf__s3_client **c_p);
KVF_INTERNAL void kvf__s3_client_free(kvf__s3_client *c);
/* Runs reqs[0..n) by deadline_ns (kvf__now_ns time, required). */
KVF_INTERNAL void kvf__s3_run(kvf__s3_client *c, kvf__s3_req *reqs, size_t n, uint64_t deadline_ns);
/* "libcurl 7.88.1 (OpenSSL/3.0.15), expat 2.5.0" */
KVF_INTERNAL void kvf__s3_libraries(char *out, size_t cap);

/* The Code and Message of an S3 error body, as "Code: Message" ("" when
 * the body is none). */
KVF_INTERNAL void kvf__s3_xml_error(const char *body, size_t len, char *out, size_t cap);

/* One page of a ListObjectsV2 answer: each object's name, size and time
 * (ns since the epoch; 0 unknown), and the next page's token ("" for the
 * last page). KVF_ERR_REMOTE when the body is no listing. */
typedef void (*kvf__s3_list_fn)(void *arg, const char *name, uint64_t size, int64_t mtime_ns);
KVF_INTERNAL kvf_status kvf__s3_xml_list(const char *body, size_t len, kvf__s3_list_fn fn,
                                         void *arg, char *next_token, size_t cap);

#endif /* KVF_S3_HTTP_H */
