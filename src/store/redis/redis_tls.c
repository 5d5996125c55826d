/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TLS for the Redis client (rediss://, rediss-cluster://), in builds with
 * hiredis >= 1.0 and hiredis_ssl. One OpenSSL context per store, made at
 * open from the URL's parameters (CA file or directory, else the system's
 * CAs; a client certificate and key; the name sent as SNI and verified),
 * and every connection of the store handshakes with it. The server's
 * certificate and name (or IP address) are verified unless the URL says
 * tls_verify=no.
 *
 * hiredis reads through the TLS session (redisBufferRead); pipelines are
 * written here with SSL_write, in records of up to 16 KiB gathered from
 * the caller's buffers, on the socket made non-blocking for the write so
 * that the batch's deadline holds as it does for a plain socket.
 */
#include "redis.h"
#include "redis_internal.h"
#include "sendall.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis_ssl.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RECORD 16384

struct kvf__redis_tls {
    SSL_CTX *ctx;
    char sni[256]; /* the URL's tls_sni, or "" (each node's host) */
    bool verify;
    char what[560]; /* which CA: for the handshake's messages */
};

bool kvf__redis_tls_built(void)
{
    return true;
}

kvf_status kvf__redis_tls_check(const kvf__redis_url *u)
{
    if (!u->tls)
        return KVF_OK;
    kvf__redis_tls *t;
    kvf_status st = kvf__redis_tls_new(u, &t);
    kvf__redis_tls_free(t);
    return st;
}

/* OpenSSL's queued errors as one line (and the queue emptied). */
static const char *ssl_errors(char *buf, size_t cap)
{
    unsigned long e, last = 0;
    while ((e = ERR_get_error()) != 0)
        last = e;
    if (!last)
        return snprintf(buf, cap, "no detail from OpenSSL"), buf;
    ERR_error_string_n(last, buf, cap);
    return buf;
}

/* A file the URL names: loaded by OpenSSL, or a message naming the
 * parameter and the file. */
static kvf_status load_failed(const char *param, const char *path)
{
    char why[256];
    ssl_errors(why, sizeof why);
    int err = access(path, R_OK) == 0 ? 0 : errno;
    if (err)
        return kvf__fail(KVF_ERR_INVALID, "remote url: %s '%s': %s", param, path, strerror(err));
    return kvf__fail(KVF_ERR_INVALID, "remote url: %s '%s': not usable: %s", param, path, why);
}

kvf_status kvf__redis_tls_new(const kvf__redis_url *u, kvf__redis_tls **tls_p)
{
    *tls_p = NULL;
    kvf__redis_tls *t = calloc(1, sizeof *t);
    SSL_CTX *ctx = t ? SSL_CTX_new(TLS_client_method()) : NULL;
    if (!ctx) {
        free(t);
        return kvf__fail(KVF_ERR_NOMEM, "remote url: no memory for a TLS context");
    }
    t->ctx = ctx;
    t->verify = u->tls_verify != 0;
    snprintf(t->sni, sizeof t->sni, "%s", u->tls_sni);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    kvf_status st = KVF_OK;
    if (u->tls_ca[0] && !SSL_CTX_load_verify_locations(ctx, u->tls_ca, NULL))
        st = load_failed("tls_ca", u->tls_ca);
    else if (u->tls_ca_dir[0] && !SSL_CTX_load_verify_locations(ctx, NULL, u->tls_ca_dir))
        st = load_failed("tls_ca_dir", u->tls_ca_dir);
    else if (!u->tls_ca[0] && !u->tls_ca_dir[0] && t->verify &&
             !SSL_CTX_set_default_verify_paths(ctx))
        st = load_failed("the system's CA certificates", "(default paths)");
    else if (u->tls_cert[0] && !SSL_CTX_use_certificate_chain_file(ctx, u->tls_cert))
        st = load_failed("tls_cert", u->tls_cert);
    else if (u->tls_key[0] && !SSL_CTX_use_PrivateKey_file(ctx, u->tls_key, SSL_FILETYPE_PEM))
        st = load_failed("tls_key", u->tls_key);
    else if (u->tls_key[0] && !SSL_CTX_check_private_key(ctx))
        st = kvf__fail(KVF_ERR_INVALID, "remote url: tls_key '%s' is not tls_cert '%s''s key",
                       u->tls_key, u->tls_cert);
    if (st != KVF_OK) {
        ERR_clear_error();
        kvf__redis_tls_free(t);
        return st;
    }
    SSL_CTX_set_verify(ctx, t->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    snprintf(t->what, sizeof t->what, "%s%s",
             u->tls_ca[0]       ? "tls_ca "
             : u->tls_ca_dir[0] ? "tls_ca_dir "
                                : "the system's CAs",
             u->tls_ca[0] ? u->tls_ca : u->tls_ca_dir);
    *tls_p = t;
    return KVF_OK;
}

void kvf__redis_tls_free(kvf__redis_tls *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ctx);
    free(t);
}

/* The name a node is checked against: an IP address, or a host name. */
static bool set_peer_name(SSL *ssl, const char *name)
{
    unsigned char addr[16];
    bool ip = inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1;
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    if (ip)
        return X509_VERIFY_PARAM_set1_ip_asc(param, name) == 1;
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    return SSL_set1_host(ssl, name) == 1 && SSL_set_tlsext_host_name(ssl, name) == 1;
}

kvf_status kvf__redis_tls_start(kvf__redis_node *node, redisContext *c)
{
    const kvf__redis_tls *t = node->opts->tls;
    SSL *ssl = SSL_new(t->ctx);
    if (!ssl)
        return kvf__fail(KVF_ERR_NOMEM, "redis %s: no memory for a TLS session", node->name);
    const char *name = t->sni[0] ? t->sni : node->host;
    if ((t->verify && !set_peer_name(ssl, name)) ||
        (!t->verify && t->sni[0] && SSL_set_tlsext_host_name(ssl, name) != 1)) {
        SSL_free(ssl);
        return kvf__fail(KVF_ERR_INVALID, "redis %s: TLS: server name '%s' refused by OpenSSL",
                         node->name, name);
    }
    SSL_set_mode(ssl, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_ENABLE_PARTIAL_WRITE);
    ERR_clear_error();
    errno = 0;
    /* redisInitiateSSL keeps the session when the handshake succeeds (and
     * frees it with the context); after a failure it is still ours */
    if (redisInitiateSSL(c, ssl) == REDIS_OK) {
        c->privdata = ssl;
        return KVF_OK;
    }
    int err = errno;
    long verdict = SSL_get_verify_result(ssl);
    SSL_free(ssl);
    ERR_clear_error();
    if (t->verify && verdict != X509_V_OK)
        return kvf__fail(KVF_ERR_REMOTE,
                         "redis %s: TLS handshake: the server's certificate is refused: %s "
                         "(verified against %s, name '%s')",
                         node->name, X509_verify_cert_error_string(verdict), t->what, name);
    char why[256];
    snprintf(why, sizeof why, "%s", c->errstr);
    /* a server that takes the connection and says nothing: the socket's
     * receive timeout ran out */
    if (err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT)
        return kvf__fail(KVF_ERR_TIMEOUT,
                         "redis %s: TLS handshake: no answer in time (does the server speak "
                         "TLS on this port?)",
                         node->name);
    return kvf__fail(KVF_ERR_REMOTE,
                     "redis %s: TLS handshake failed: %s (does the server speak TLS on this "
                     "port?)",
                     node->name, why[0] ? why : "connection closed");
}

bool kvf__redis_tls_pending(redisContext *c)
{
    return c->privdata && SSL_pending((SSL *)c->privdata) > 0;
}

/* SSL_write of buf[0..len) on a non-blocking socket, waiting by the
 * deadline: 0, or -1 with errno (ETIMEDOUT: the deadline passed). */
static int write_all(SSL *ssl, int fd, const char *buf, size_t len, uint64_t deadline_ns)
{
    while (len > 0) {
        ERR_clear_error();
        int n = SSL_write(ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        int e = SSL_get_error(ssl, n);
        short events = e == SSL_ERROR_WANT_WRITE ? POLLOUT : e == SSL_ERROR_WANT_READ ? POLLIN : 0;
        if (!events) {
            if (e != SSL_ERROR_SYSCALL || !errno)
                errno = EPROTO;
            return -1;
        }
        int ready = kvf__wait_fd(fd, events, kvf__ms_left(deadline_ns, UINT32_MAX));
        if (ready == 0)
            errno = ETIMEDOUT;
        if (ready <= 0)
            return -1;
    }
    return 0;
}

int kvf__redis_tls_send_all(redisContext *c, struct iovec *iov, size_t n, uint64_t deadline_ns)
{
    SSL *ssl = c->privdata;
    int flags = fcntl(c->fd, F_GETFL);
    if (flags < 0 || fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return -1;
    char *rec = malloc(RECORD);
    int rc = rec ? 0 : -1;
    size_t used = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        /* a large buffer goes straight out; small ones are gathered into
         * one record rather than a record each */
        if (left >= RECORD) {
            rc = write_all(ssl, c->fd, rec, used, deadline_ns);
            used = 0;
            if (rc == 0)
                rc = write_all(ssl, c->fd, p, left, deadline_ns);
            continue;
        }
        if (used + left > RECORD) {
            rc = write_all(ssl, c->fd, rec, used, deadline_ns);
            used = 0;
        }
        memcpy(rec + used, p, left);
        used += left;
    }
    if (rc == 0)
        rc = write_all(ssl, c->fd, rec, used, deadline_ns);
    int saved = errno;
    free(rec);
    fcntl(c->fd, F_SETFL, flags);
    errno = saved;
    return rc;
}
