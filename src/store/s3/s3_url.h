/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 store's URLs and credentials, parsed without libcurl so that a
 * build without it checks them the same way:
 *
 *   s3://[ACCESS:SECRET@]BUCKET[/PREFIX][?SETTING=VALUE&...]
 *
 * settings: endpoint=http(s)://host[:port] (default AWS_ENDPOINT_URL_S3,
 * AWS_ENDPOINT_URL, else https://s3.REGION.amazonaws.com), region=NAME
 * (default AWS_REGION, AWS_DEFAULT_REGION, else us-east-1), style=path or
 * virtual (bucket in the path or in the host name; default virtual on AWS,
 * path on another endpoint), conns=N (connections a batch uses, 1-256,
 * default 16). ACCESS and SECRET may be %-escaped; without them the keys
 * come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and
 * AWS_SESSION_TOKEN), else from the shared credentials file
 * (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials; profile
 * AWS_PROFILE, else default). A secret is in no message.
 */
#ifndef KVF_S3_URL_H
#define KVF_S3_URL_H

#include "common.h"
#include "status.h"

/* What a build without the S3 store lacks (the registry says it). */
#define KVF_S3_MISSING                                                                             \
    "libcurl and expat at build time (libcurl4-openssl-dev and libexpat1-dev, or "                 \
    "scripts/install-deps.sh)"

enum { KVF_S3_STYLE_DEFAULT, KVF_S3_STYLE_PATH, KVF_S3_STYLE_VIRTUAL };

typedef struct kvf__s3_url {
    char bucket[64];
    char prefix[512]; /* no leading or trailing '/'; "" for the bucket's root */
    char endpoint[256];
    char region[64];
    int style;
    uint32_t conns;
    char access[128];
    char secret[256];
    char token[2048];
} kvf__s3_url;

/* Parses `url` and fills what it leaves out from the environment
 * (KVF_ERR_INVALID naming the URL without its secret and what is wrong,
 * KVF_ERR_NOT_FOUND-free: no credentials anywhere is KVF_ERR_INVALID too).
 * Clear *out (kvf__s3_url_wipe) when done: it holds the secret. */
KVF_INTERNAL kvf_status kvf__s3_url_parse(const char *url, kvf__s3_url *out);
/* Fills access, secret and token from the environment or the shared
 * credentials file where the URL had none; `shown` names the URL. */
KVF_INTERNAL kvf_status kvf__s3_creds_resolve(kvf__s3_url *u, const char *shown);
/* Forgets the secret. */
KVF_INTERNAL void kvf__s3_url_wipe(kvf__s3_url *u);

#endif /* KVF_S3_URL_H */
