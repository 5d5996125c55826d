/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A real redis-server speaking TLS on loopback, for the rediss:// tests;
 * header-only, over redis_server.h. Certificates are made here with the
 * openssl tool, in the server's directory: a CA, a server certificate for
 * IP 127.0.0.1 and DNS localhost signed by it, a client certificate signed
 * by it, and a second CA that signed none of them. The server listens with
 * TLS on tls_port and in plain TCP on port (the tests' own setup, and the
 * "server without TLS" case); it asks clients for a certificate but does
 * not require one. Tests skip where redis-server was built without TLS or
 * openssl is missing.
 */
#ifndef KVF_TEST_REDIS_TLS_SERVER_H
#define KVF_TEST_REDIS_TLS_SERVER_H

#include "redis_server.h"

typedef struct redis_tls_server {
    redis_server plain; /* the process; its plain port */
    int tls_port;
    char ca[300], other_ca[300], client_cert[300], client_key[300];
} redis_tls_server;

/* Runs a shell command in `dir`, quietly; 0 or -1. */
static inline int tls_sh(const char *dir, const char *cmd)
{
    char line[2048];
    snprintf(line, sizeof line, "cd '%s' && { %s; } >openssl.log 2>&1", dir, cmd);
    return system(line) == 0 ? 0 : -1;
}

/* The certificates, in dir: 0 or -1. */
static inline int tls_make_certs(const char *dir)
{
    static const char *const steps[] = {
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' >server.ext",
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
        "-subj /CN=kvferry-test-ca -keyout ca.key -out ca.pem",
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
        "-subj /CN=kvferry-other-ca -keyout other-ca.key -out other-ca.pem",
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-subj /CN=localhost -keyout server.key -out server.csr",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile server.ext -out server.pem",
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-subj /CN=kvferry-client -keyout client.key -out client.csr",
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-out client.pem",
    };
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
        if (tls_sh(dir, steps[i])) {
            fprintf(stderr, "certificates: '%s' failed (see %s/openssl.log)\n", steps[i], dir);
            return -1;
        }
    return 0;
}

/* Whether this machine can run the TLS tests: redis-server built with TLS,
 * and openssl. Prints why not. */
static inline bool redis_tls_available(void)
{
    if (!kvf__redis_tls_built()) {
        fprintf(stderr, "skipped: this build has no TLS (hiredis_ssl)\n");
        return false;
    }
    if (!redis_tool_found("redis-server") || !redis_tool_found("openssl")) {
        fprintf(stderr, "skipped: redis-server or openssl not installed\n");
        return false;
    }
    /* a redis-server built with TLS links OpenSSL (Debian's does) */
    if (system("ldd \"$(command -v redis-server)\" 2>/dev/null | grep -q libssl") != 0) {
        fprintf(stderr, "skipped: this redis-server has no TLS\n");
        return false;
    }
    return true;
}

/* Starts it: certificates made, then the server with `args` more options
 * (NULL-ended, e.g. "--requirepass", "pw"); 0 or -1. */
static inline int redis_tls_server_start(redis_tls_server *t, const char *const *args)
{
    memset(t, 0, sizeof *t);
    redis_server *s = &t->plain;
    if (test_tmpdir(s->dir, sizeof s->dir) || tls_make_certs(s->dir))
        return -1;
    t->tls_port = redis_pick_port();
    snprintf(t->ca, sizeof t->ca, "%s/ca.pem", s->dir);
    snprintf(t->other_ca, sizeof t->other_ca, "%s/other-ca.pem", s->dir);
    snprintf(t->client_cert, sizeof t->client_cert, "%s/client.pem", s->dir);
    snprintf(t->client_key, sizeof t->client_key, "%s/client.key", s->dir);
    const char *opts[] = {"--tls-port",         NULL,         "--tls-cert-file",    "server.pem",
                          "--tls-key-file",     "server.key", "--tls-ca-cert-file", "ca.pem",
                          "--tls-auth-clients", "optional"};
    size_t n = sizeof opts / sizeof *opts;
    for (size_t i = 0; i < n; i++)
        snprintf(s->extra[i], sizeof s->extra[i], "%s", opts[i] ? opts[i] : "");
    snprintf(s->extra[1], sizeof s->extra[1], "%d", t->tls_port);
    for (; args && *args && n < sizeof s->extra / sizeof *s->extra; args++)
        snprintf(s->extra[n++], sizeof s->extra[0], "%s", *args);
    s->extras = (int)n;
    return redis_server_start(s, NULL);
}

static inline void redis_tls_server_stop(redis_tls_server *t)
{
    redis_server_stop(&t->plain);
}

#endif /* KVF_TEST_REDIS_TLS_SERVER_H */
