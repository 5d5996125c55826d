/* SPDX-License-Identifier: Apache-2.0 */
/* The S3 store's requests over libcurl's multi interface (s3_http.h). */
#include "s3_http.h"

#include <curl/curl.h>
#include <expat.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RETRIES 3u           /* extra attempts of a request that may succeed later */
#define BACKOFF_NS 20000000u /* the first retry's wait, doubling */
#define POLL_MS 100

/* One set of connections: a multi handle (its connection cache) and an
 * easy handle per connection, taken by one call at a time. */
typedef struct s3_conns {
    CURLM *multi;
    CURL **easy;
    struct curl_slist **range; /* a ranged request's own header list */
    struct s3_conns *next;
} s3_conns;

struct kvf__s3_client {
    char base[400]; /* objects' URLs start here: ".../bucket/" */
    char sigv4[96]; /* "aws:amz:REGION:s3" */
    char access[128], secret[256];
    struct curl_slist *headers;
    uint32_t conns, connect_timeout_ms;
    pthread_mutex_t mu;
    s3_conns *idle;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

kvf_status kvf__s3_client_new(const kvf__s3_url *u, uint32_t timeout_ms, kvf__s3_client **c_p)
{
    *c_p = NULL;
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK)
        return kvf__fail(KVF_ERR_REMOTE, "s3: libcurl: %s", curl_easy_strerror(global_rc));
    kvf__s3_client *c = calloc(1, sizeof *c);
    if (!c)
        return kvf__fail(KVF_ERR_NOMEM, "s3: out of memory");
    const char *host = strstr(u->endpoint, "://") + 3;
    if (u->style == KVF_S3_STYLE_VIRTUAL)
        snprintf(c->base, sizeof c->base, "%.*s%s.%s/", (int)(host - u->endpoint), u->endpoint,
                 u->bucket, host);
    else
        snprintf(c->base, sizeof c->base, "%s/%s/", u->endpoint, u->bucket);
    snprintf(c->sigv4, sizeof c->sigv4, "aws:amz:%s:s3", u->region);
    memcpy(c->access, u->access, sizeof c->access);
    memcpy(c->secret, u->secret, sizeof c->secret);
    c->conns = u->conns;
    c->connect_timeout_ms = timeout_ms;
    pthread_mutex_init(&c->mu, NULL);
    /* the body is not hashed (SigV4's UNSIGNED-PAYLOAD): a block carries
     * its own CRC-32C, checked on every read */
    c->headers = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    bool ok = c->headers != NULL;
    if (ok && u->token[0]) {
        char tok[2100];
        snprintf(tok, sizeof tok, "x-amz-security-token: %s", u->token);
        struct curl_slist *h = curl_slist_append(c->headers, tok);
        memset(tok, 0, sizeof tok);
        ok = h != NULL;
    }
    if (!ok) {
        kvf__s3_client_free(c);
        return kvf__fail(KVF_ERR_NOMEM, "s3: out of memory");
    }
    *c_p = c;
    return KVF_OK;
}

static void conns_free(s3_conns *k, uint32_t n)
{
    for (uint32_t i = 0; k->easy && i < n; i++) {
        if (k->easy[i])
            curl_easy_cleanup(k->easy[i]);
        curl_slist_free_all(k->range[i]);
    }
    if (k->multi)
        curl_multi_cleanup(k->multi);
    free(k->easy);
    free(k->range);
    free(k);
}

void kvf__s3_client_free(kvf__s3_client *c)
{
    if (!c)
        return;
    while (c->idle) {
        s3_conns *k = c->idle;
        c->idle = k->next;
        conns_free(k, c->conns);
    }
    curl_slist_free_all(c->headers);
    pthread_mutex_destroy(&c->mu);
    memset(c->secret, 0, sizeof c->secret);
    free(c);
}

/* A set of connections for one call: an idle one, or a new one. */
static s3_conns *conns_take(kvf__s3_client *c)
{
    pthread_mutex_lock(&c->mu);
    s3_conns *k = c->idle;
    if (k)
        c->idle = k->next;
    pthread_mutex_unlock(&c->mu);
    if (k)
        return k;
    k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->multi = curl_multi_init();
    k->easy = calloc(c->conns, sizeof *k->easy);
    k->range = calloc(c->conns, sizeof *k->range);
    bool ok = k->multi && k->easy && k->range;
    for (uint32_t i = 0; ok && i < c->conns; i++)
        ok = (k->easy[i] = curl_easy_init()) != NULL;
    if (ok) {
        curl_multi_setopt(k->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)c->conns);
        curl_multi_setopt(k->multi, CURLMOPT_MAXCONNECTS, (long)c->conns);
    } else {
        conns_free(k, c->conns);
        k = NULL;
    }
    return k;
}

static void conns_give(kvf__s3_client *c, s3_conns *k)
{
    pthread_mutex_lock(&c->mu);
    k->next = c->idle;
    c->idle = k;
    pthread_mutex_unlock(&c->mu);
}

/* PUT's body: the head, then the payload */
static size_t read_body(char *out, size_t size, size_t nitems, void *arg)
{
    kvf__s3_req *r = arg;
    size_t want = size * nitems, done = 0;
    while (done < want && r->sent < r->head_len + r->body_len) {
        const char *src = r->sent < r->head_len ? (const char *)r->head + r->sent
                                                : (const char *)r->body + (r->sent - r->head_len);
        size_t left =
            r->sent < r->head_len ? r->head_len - r->sent : r->head_len + r->body_len - r->sent;
        size_t k = left < want - done ? left : want - done;
        memcpy(out + done, src, k);
        done += k;
        r->sent += k;
    }
    return done;
}

/* A 2xx body goes to dst (up to cap: more is an overflow, which stops the
 * transfer); another answer's body is kept to say what went wrong. */
static size_t write_body(char *in, size_t size, size_t nmemb, void *arg)
{
    kvf__s3_req *r = arg;
    size_t n = size * nmemb;
    long code = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code < 200 || code > 299) {
        size_t k = sizeof r->err - 1 - r->err_len;
        k = k < n ? k : n;
        memcpy(r->err + r->err_len, in, k);
        r->err_len += k;
        r->err[r->err_len] = '\0';
        return n;
    }
    if (r->range && code == 200) {
        /* the whole object for a ranged GET: the bytes before the range
         * are passed over, and the transfer stops at its end */
        r->whole = true;
        uint64_t at = r->seen;
        r->seen += n;
        if (r->seen <= r->range_off)
            return n;
        size_t skip = at < r->range_off ? (size_t)(r->range_off - at) : 0;
        size_t want = r->range - r->got, k = n - skip < want ? n - skip : want;
        if (!r->dst || k > r->cap - r->got) {
            r->overflow = true;
            return 0;
        }
        memcpy((char *)r->dst + r->got, in + skip, k);
        r->got += k;
        if (r->got < r->range)
            return n;
        r->overflow = true; /* the range is in: no more is read */
        return 0;
    }
    if (!r->dst || n > r->cap - r->got) {
        r->overflow = true;
        return 0; /* stops the transfer: no more of it is read */
    }
    memcpy((char *)r->dst + r->got, in, n);
    r->got += n;
    return n;
}

/* Sets up easy handle i of k for r, within the deadline. */
static bool start(kvf__s3_client *c, s3_conns *k, uint32_t i, kvf__s3_req *r, uint64_t now,
                  uint64_t deadline_ns)
{
    CURL *e = k->easy[i];
    curl_easy_reset(e);
    r->easy = e;
    r->sent = r->got = r->err_len = 0;
    r->seen = 0;
    r->overflow = r->whole = false;
    r->err[0] = '\0';
    r->attempts++;
    char url[1200];
    snprintf(url, sizeof url, "%s%s%s%s", c->base, r->object, r->query ? "?" : "",
             r->query ? r->query : "");
    long left_ms = (long)((deadline_ns - now) / 1000000u) + 1;
    long connect_ms = left_ms < (long)c->connect_timeout_ms ? left_ms : (long)c->connect_timeout_ms;
    struct curl_slist *hdr = c->headers;
    curl_slist_free_all(k->range[i]);
    k->range[i] = NULL;
    if (r->range) {
        char range[64];
        snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)r->range_off,
                 (unsigned long long)(r->range_off + r->range - 1));
        /* the shared headers after this request's own */
        struct curl_slist *own = curl_slist_append(NULL, range);
        for (struct curl_slist *h = c->headers; own && h; h = h->next)
            if (!curl_slist_append(own, h->data)) {
                curl_slist_free_all(own);
                own = NULL;
            }
        if (!own)
            return false;
        hdr = k->range[i] = own;
    }
    bool ok = curl_easy_setopt(e, CURLOPT_URL, url) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_PRIVATE, r) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_AWS_SIGV4, c->sigv4) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_USERNAME, c->access) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_PASSWORD, c->secret) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdr) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, left_ms) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_ms) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 512L * 1024) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_body) == CURLE_OK &&
              curl_easy_setopt(e, CURLOPT_WRITEDATA, r) == CURLE_OK;
    switch (r->method) {
    case KVF_S3_PUT:
        ok = ok && curl_easy_setopt(e, CURLOPT_UPLOAD, 1L) == CURLE_OK &&
             curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, 2L * 1024 * 1024) == CURLE_OK &&
             curl_easy_setopt(e, CURLOPT_READFUNCTION, read_body) == CURLE_OK &&
             curl_easy_setopt(e, CURLOPT_READDATA, r) == CURLE_OK &&
             curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE,
                              (curl_off_t)(r->head_len + r->body_len)) == CURLE_OK;
        break;
    case KVF_S3_HEAD:
        ok = ok && curl_easy_setopt(e, CURLOPT_NOBODY, 1L) == CURLE_OK;
        break;
    case KVF_S3_DELETE:
        ok = ok && curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE") == CURLE_OK;
        break;
    case KVF_S3_GET:
        break;
    }
    return ok && curl_multi_add_handle(k->multi, e) == CURLM_OK;
}

static void fail(kvf__s3_req *r, kvf_status st, const char *fmt, const char *detail)
{
    r->status = st;
    snprintf(r->why, sizeof r->why, fmt, detail);
}

/* Whether a failed transfer may succeed when sent again: the connection
 * broke or the server answered 5xx (busy, 503 SlowDown, a node down
 * behind it). A timeout is the deadline's, never retried. */
static bool retryable(CURLcode cc, long http)
{
    if (cc == CURLE_OK)
        return http >= 500;
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_SEND_ERROR || cc == CURLE_RECV_ERROR ||
           cc == CURLE_GOT_NOTHING || cc == CURLE_PARTIAL_FILE || cc == CURLE_WEIRD_SERVER_REPLY;
}

/* A transfer's end: r's answer, or a retry at r->retry_at_ns (true). */
static bool finish(kvf__s3_req *r, CURLcode cc, uint64_t now, uint64_t deadline_ns)
{
    long http = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &http);
    r->http = http;
    char said[280];
    if (cc == CURLE_OK || (cc == CURLE_WRITE_ERROR && r->overflow)) {
        if ((http >= 200 && http <= 299) || (http == 404 && r->method == KVF_S3_DELETE)) {
            r->status = KVF_OK;
            return false;
        }
        if (http == 416 && r->range) {
            /* the range starts past the object's end: none of it is there */
            r->got = 0;
            r->status = KVF_OK;
            return false;
        }
        if (http == 404) {
            r->status = KVF_ERR_NOT_FOUND;
            snprintf(r->why, sizeof r->why, "not found");
            return false;
        }
        char code[240];
        kvf__s3_xml_error(r->err, r->err_len, code, sizeof code);
        snprintf(said, sizeof said, "HTTP %ld%s%s", http, code[0] ? " " : "", code);
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
        fail(r, KVF_ERR_TIMEOUT, "deadline passed (%s)", curl_easy_strerror(cc));
        return false;
    } else
        snprintf(said, sizeof said, "%s", curl_easy_strerror(cc));
    uint64_t wait = (uint64_t)BACKOFF_NS << (r->attempts - 1);
    if (retryable(cc, http) && r->attempts <= RETRIES && now + wait < deadline_ns) {
        r->retry_at_ns = now + wait;
        return true;
    }
    r->status = KVF_ERR_REMOTE;
    snprintf(r->why, sizeof r->why, "%.280s%s", said,
             retryable(cc, http) && r->attempts > 1 ? " (after retries)" : "");
    return false;
}

void kvf__s3_run(kvf__s3_client *c, kvf__s3_req *reqs, size_t n, uint64_t deadline_ns)
{
    for (size_t i = 0; i < n; i++) {
        reqs[i].status = KVF_ERR_TIMEOUT;
        reqs[i].attempts = 0;
        reqs[i].retry_at_ns = 0;
        reqs[i].why[0] = '\0';
    }
    s3_conns *k = conns_take(c);
    size_t *retry = k ? malloc((n + 1) * sizeof *retry) : NULL;
    uint32_t *idle = retry ? malloc(c->conns * sizeof *idle) : NULL;
    if (!idle) {
        for (size_t i = 0; i < n; i++)
            fail(&reqs[i], KVF_ERR_NOMEM, "%s", "out of memory");
        free(retry);
        if (k)
            conns_give(c, k);
        return;
    }
    uint32_t nidle = c->conns, busy = 0;
    for (uint32_t i = 0; i < c->conns; i++)
        idle[i] = c->conns - 1 - i;
    size_t next = 0, nretry = 0;
    for (;;) {
        uint64_t now = kvf__now_ns();
        if (now >= deadline_ns)
            break;
        /* start what may start: retries that are due, then new requests */
        for (size_t j = 0; j < nretry && nidle;) {
            kvf__s3_req *r = &reqs[retry[j]];
            if (r->retry_at_ns > now) {
                j++;
                continue;
            }
            retry[j] = retry[--nretry];
            if (!start(c, k, idle[--nidle], r, now, deadline_ns)) {
                fail(r, KVF_ERR_NOMEM, "%s", "out of memory");
                nidle++;
            } else
                busy++;
        }
        while (next < n && nidle) {
            kvf__s3_req *r = &reqs[next++];
            if (!start(c, k, idle[--nidle], r, now, deadline_ns)) {
                fail(r, KVF_ERR_NOMEM, "%s", "out of memory");
                nidle++;
            } else
                busy++;
        }
        if (!busy && !nretry && next == n)
            break;
        int running = 0;
        curl_multi_perform(k->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(k->multi, &left)) != NULL) {
            if (m->msg != CURLMSG_DONE)
                continue;
            kvf__s3_req *r = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            CURLcode cc = m->data.result;
            CURL *e = m->easy_handle;
            curl_multi_remove_handle(k->multi, e);
            for (uint32_t i = 0; i < c->conns; i++)
                if (k->easy[i] == e)
                    idle[nidle++] = i;
            busy--;
            if (finish(r, cc, kvf__now_ns(), deadline_ns))
                retry[nretry++] = (size_t)(r - reqs);
        }
        if (!busy && !nretry && next == n)
            break;
        /* wait for a transfer, the next retry's time or the deadline; not
         * at all where a connection came free for a request */
        now = kvf__now_ns();
        uint64_t until = busy ? now + POLL_MS * 1000000ull : deadline_ns;
        for (size_t j = 0; j < nretry; j++)
            until = reqs[retry[j]].retry_at_ns < until ? reqs[retry[j]].retry_at_ns : until;
        int wait_ms = until > now ? (int)((until - now + 999999) / 1000000) : 0;
        if (next < n && nidle)
            wait_ms = 0;
        curl_multi_poll(k->multi, NULL, 0, wait_ms, NULL);
    }
    /* the deadline: what is still in flight or waiting ends here */
    for (uint32_t i = 0; i < c->conns; i++)
        curl_multi_remove_handle(k->multi, k->easy[i]);
    for (size_t i = 0; i < n; i++)
        if (reqs[i].status == KVF_ERR_TIMEOUT && !reqs[i].why[0])
            snprintf(reqs[i].why, sizeof reqs[i].why, "deadline passed%s",
                     reqs[i].attempts > 1 ? " while retrying"
                     : reqs[i].attempts   ? ""
                                          : " before it was sent");
    free(retry);
    free(idle);
    conns_give(c, k);
}

void kvf__s3_libraries(char *out, size_t cap)
{
    const curl_version_info_data *v = curl_version_info(CURLVERSION_NOW);
    XML_Expat_Version x = XML_ExpatVersionInfo();
    snprintf(out, cap, "libcurl %s (%s), expat %d.%d.%d", v->version,
             v->ssl_version ? v->ssl_version : "no TLS", x.major, x.minor, x.micro);
}
