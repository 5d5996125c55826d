/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the S3 store's URL parser (src/store/s3/s3_url.c), which
 * takes text from the environment ($KVF_REMOTE_URL) and configs.
 * Properties: a URL taken names a bucket, prefix, endpoint, style and
 * connection count the store can use as they are; a refused one leaves no
 * secret behind, and its message holds the secret only where the rest of
 * the URL does. */
#include "common.h"
#include "fuzz.h"
#include "s3_url.h"

#include <string.h>

static bool all_zero(const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i])
            return false;
    return true;
}

static void check_taken(const kvf__s3_url *u)
{
    size_t b = strnlen(u->bucket, sizeof u->bucket), p = strnlen(u->prefix, sizeof u->prefix);
    FUZZ_CHECK(b >= 3 && b <= 63 &&
               strspn(u->bucket, "abcdefghijklmnopqrstuvwxyz0123456789.-") == b);
    FUZZ_CHECK(p < sizeof u->prefix && !strstr(u->prefix, "//"));
    FUZZ_CHECK(p == 0 || (u->prefix[0] != '/' && u->prefix[p - 1] != '/'));
    FUZZ_CHECK(strspn(u->prefix,
                      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/") == p);
    FUZZ_CHECK(!strncmp(u->endpoint, "http://", 7) || !strncmp(u->endpoint, "https://", 8));
    FUZZ_CHECK(!strpbrk(strstr(u->endpoint, "://") + 3, "/?#@ ") &&
               strstr(u->endpoint, "://")[3] != '\0');
    FUZZ_CHECK(u->style == KVF_S3_STYLE_PATH || u->style == KVF_S3_STYLE_VIRTUAL);
    FUZZ_CHECK(u->conns >= 1 && u->conns <= 256);
    FUZZ_CHECK(u->region[0] && memchr(u->region, '\0', sizeof u->region));
    FUZZ_CHECK(!u->access[0] == !u->secret[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a URL ends at its first NUL, as the environment's does */
    char *url = strndup((const char *)data, size);
    if (!url)
        return 0;
    unsetenv("AWS_ENDPOINT_URL_S3");
    unsetenv("AWS_ENDPOINT_URL");
    kvf__s3_url u;
    kvf_status st = kvf__s3_url_parse(url, &u);
    if (st == KVF_OK) {
        check_taken(&u);
    } else {
        FUZZ_CHECK(st == KVF_ERR_INVALID);
        FUZZ_CHECK(all_zero(&u, sizeof u));
        /* the user part's secret, as written: out of the message unless the
         * URL holds it elsewhere too */
        const char *auth = strncmp(url, "s3://", 5) ? NULL : url + 5;
        size_t end = auth ? strcspn(auth, "/?#") : 0;
        const char *at = auth ? memrchr(auth, '@', end) : NULL;
        const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
        size_t n = colon ? (size_t)(at - colon - 1) : 0;
        if (n >= 6) {
            char *secret = strndup(colon + 1, n);
            FUZZ_CHECK(!strstr(kvf_last_error(), secret) || strstr(at, secret) ||
                       memmem(url, (size_t)(colon + 1 - url), secret, n));
            free(secret);
        }
    }
    kvf__s3_url_wipe(&u);
    free(url);
    return 0;
}
