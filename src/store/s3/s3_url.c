/* SPDX-License-Identifier: Apache-2.0 */
/* The S3 store's URLs (s3_url.h): built with or without libcurl. */
#include "s3_url.h"
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CONNS 16u
#define MAX_CONNS 256u
#define DEFAULT_REGION "us-east-1"

static int hex_digit(char c)
{
    char l = (char)(c | 0x20);
    return c >= '0' && c <= '9' ? c - '0' : l >= 'a' && l <= 'f' ? l - 'a' + 10 : -1;
}

/* %-decodes s[0..n) into out (cap bytes); -1 on a bad escape, a NUL or no
 * room. */
static int unescape(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = i + 1 < n ? hex_digit(s[i + 1]) : -1;
            int lo = hi >= 0 && i + 2 < n ? hex_digit(s[i + 2]) : -1;
            if (lo < 0 || (c = hi * 16 + lo) == 0)
                return -1;
            i += 2;
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* S3's bucket names: 3-63 of [a-z0-9.-], starting and ending alphanumeric. */
static bool bucket_valid(const char *b, size_t n)
{
    if (n < 3 || n > 63 || b[0] == '.' || b[0] == '-' || b[n - 1] == '.' || b[n - 1] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '.' ||
              b[i] == '-'))
            return false;
    return true;
}

/* A prefix of '/'-separated segments of [A-Za-z0-9._-], none empty, "." or
 * "..": object names need no escaping and mean one thing. */
static bool prefix_valid(const char *p)
{
    for (const char *seg = p; *seg;) {
        size_t len = strcspn(seg, "/");
        if (len == 0 || (len == 1 && seg[0] == '.') || (len == 2 && !strncmp(seg, "..", 2)))
            return false;
        for (size_t i = 0; i < len; i++) {
            char c = seg[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-'))
                return false;
        }
        seg += len;
        seg += *seg == '/';
    }
    return true;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* endpoint: http(s)://host[:port], no path (a trailing '/' dropped) */
static bool endpoint_valid(char *e)
{
    size_t n = strlen(e);
    if (n && e[n - 1] == '/')
        e[--n] = '\0';
    const char *host = !strncmp(e, "http://", 7)    ? e + 7
                       : !strncmp(e, "https://", 8) ? e + 8
                                                    : NULL;
    return host && *host && !strpbrk(host, "/?#@ ");
}

/* One setting of the query; -1 with *what naming a wrong one. */
static int setting(kvf__s3_url *u, const char *kv, size_t n, const char **what)
{
    const char *eq = memchr(kv, '=', n);
    size_t klen = eq ? (size_t)(eq - kv) : n;
    const char *v = eq ? eq + 1 : "";
    size_t vlen = eq ? n - klen - 1 : 0;
    char val[256];
    if (unescape(v, vlen, val, sizeof val) != 0) {
        *what = "a setting's value is too long or badly %-escaped";
        return -1;
    }
#define IS(k) (klen == strlen(k) && !strncmp(kv, k, klen))
    if (IS("endpoint")) {
        snprintf(u->endpoint, sizeof u->endpoint, "%s", val);
        if (!endpoint_valid(u->endpoint)) {
            *what = "endpoint is not http(s)://host[:port]";
            return -1;
        }
    } else if (IS("region")) {
        size_t len = strlen(val);
        if (len == 0 || len >= sizeof u->region ||
            strspn(val, "abcdefghijklmnopqrstuvwxyz0123456789-") != len) {
            *what = "region is not [a-z0-9-]{1,63}";
            return -1;
        }
        memcpy(u->region, val, len + 1);
    } else if (IS("style")) {
        if (!strcmp(val, "path"))
            u->style = KVF_S3_STYLE_PATH;
        else if (!strcmp(val, "virtual"))
            u->style = KVF_S3_STYLE_VIRTUAL;
        else {
            *what = "style is neither path nor virtual";
            return -1;
        }
    } else if (IS("conns")) {
        char *end;
        unsigned long c = strtoul(val, &end, 10);
        if (!*val || *end || c < 1 || c > MAX_CONNS) {
            *what = "conns is not a number from 1 to 256";
            return -1;
        }
        u->conns = (uint32_t)c;
    } else {
        *what = "unknown setting (endpoint, region, style, conns)";
        return -1;
    }
#undef IS
    return 0;
}

kvf_status kvf__s3_url_parse(const char *url, kvf__s3_url *u)
{
    memset(u, 0, sizeof *u);
    char shown[640];
    kvf__url_redact(url, shown, sizeof shown);
    const char *what = NULL;
    if (!url || strncmp(url, "s3://", 5) != 0) {
        what = "not an s3:// URL";
        goto bad;
    }
    const char *s = url + 5;
    size_t main_len = strcspn(s, "?#");
    if (s[main_len] == '#') {
        what = "a fragment (#) has no meaning";
        goto bad;
    }
    size_t auth_len = strcspn(s, "/?");
    const char *at = NULL;
    for (const char *q = s; q < s + auth_len; q++)
        if (*q == '@')
            at = q;
    if (at) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        if (!colon || colon == s || colon + 1 == at ||
            unescape(s, (size_t)(colon - s), u->access, sizeof u->access) != 0 ||
            unescape(colon + 1, (size_t)(at - colon - 1), u->secret, sizeof u->secret) != 0) {
            what = "the user part is not ACCESS:SECRET (each %-escaped)";
            goto bad;
        }
        s = at + 1;
        main_len -= (size_t)(s - (url + 5));
    }
    size_t blen = strcspn(s, "/?");
    if (!bucket_valid(s, blen)) {
        what = blen ? "the bucket is not 3-63 of [a-z0-9.-]" : "no bucket";
        goto bad;
    }
    memcpy(u->bucket, s, blen);
    size_t plen = main_len - blen;
    const char *p = s + blen;
    while (plen && *p == '/')
        p++, plen--;
    while (plen && p[plen - 1] == '/')
        plen--;
    if (plen >= sizeof u->prefix) {
        what = "the prefix is too long";
        goto bad;
    }
    memcpy(u->prefix, p, plen);
    if (!prefix_valid(u->prefix)) {
        what = "the prefix is not '/'-separated segments of [A-Za-z0-9._-]";
        goto bad;
    }
    const char *q = s + main_len;
    if (*q == '?')
        for (q++; *q;) {
            size_t n = strcspn(q, "&");
            if (n && setting(u, q, n, &what) != 0)
                goto bad;
            q += n;
            q += *q == '&';
        }
    if (!u->region[0]) {
        const char *r = env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
        snprintf(u->region, sizeof u->region, "%s", r ? r : DEFAULT_REGION);
    }
    if (!u->endpoint[0]) {
        const char *e =
            env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
        if (e)
            snprintf(u->endpoint, sizeof u->endpoint, "%s", e);
        else
            snprintf(u->endpoint, sizeof u->endpoint, "https://s3.%s.amazonaws.com", u->region);
        if (!endpoint_valid(u->endpoint)) {
            what = "AWS_ENDPOINT_URL(_S3) is not http(s)://host[:port]";
            goto bad;
        }
        if (!u->style)
            u->style = e ? KVF_S3_STYLE_PATH : KVF_S3_STYLE_VIRTUAL;
    }
    if (!u->style)
        u->style = KVF_S3_STYLE_PATH;
    if (!u->conns)
        u->conns = DEFAULT_CONNS;
    return KVF_OK;
bad:
    kvf__s3_url_wipe(u);
    return kvf__fail(KVF_ERR_INVALID, "remote URL \"%s\": %s", shown, what);
}

void kvf__s3_url_wipe(kvf__s3_url *u)
{
    volatile char *p = (volatile char *)u;
    for (size_t i = 0; i < sizeof *u; i++)
        p[i] = 0;
}
