/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Redis store's URLs (redis_url.c), on their own: the grammar of
 * redis.h's comment, parsed without the client, so a build without
 * hiredis and the CLI's benchmark ceiling read them the same way.
 */
#ifndef KVF_REDIS_URL_H
#define KVF_REDIS_URL_H

#include "common.h"
#include "status.h"

#define KVF_REDIS_MAX_SEEDS 16

/* A parsed URL. */
typedef struct kvf__redis_url {
    int cluster; /* redis-cluster:// or rediss-cluster:// */
    int tls;     /* rediss:// or rediss-cluster:// */
    /* TLS parameters (rediss:// only), "" when not given */
    char tls_ca[512];     /* ?tls_ca=FILE: CA certificates (PEM) that verify the server */
    char tls_ca_dir[512]; /* ?tls_ca_dir=DIR: a directory of them (c_rehash'd) */
    char tls_cert[512];   /* ?tls_cert=FILE: this client's certificate (PEM) */
    char tls_key[512];    /* ?tls_key=FILE: its private key (PEM) */
    char tls_sni[256];    /* ?tls_sni=NAME: the server name sent and verified; default the host */
    int tls_verify;       /* ?tls_verify=yes|no: check the server's certificate and name (yes) */
    char user[128];
    char pass[256];
    uint32_t db;
    size_t seeds;
    struct {
        char host[256];
        int port;
    } seed[KVF_REDIS_MAX_SEEDS];
} kvf__redis_url;

/* Parses `url` (KVF_ERR_INVALID naming what is wrong; the password is never
 * repeated in the message). */
KVF_INTERNAL kvf_status kvf__redis_url_parse(const char *url, kvf__redis_url *out);

#endif /* KVF_REDIS_URL_H */
