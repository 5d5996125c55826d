/* SPDX-License-Identifier: Apache-2.0 */
/* The Redis store's URLs (redis_url.h): built with or without hiredis. */
#include "redis_url.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_PORT 6379

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* %-decodes s[0..n) into out (cap bytes, NUL-terminated). -1 on a bad
 * escape or when it does not fit. */
static int percent_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= n)
                return -1;
            int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
            if (hi < 0 || lo < 0)
                return -1;
            c = (char)(hi * 16 + lo);
            i += 2;
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = c;
    }
    out[o] = '\0';
    return 0;
}

static int parse_number(const char *s, size_t n, unsigned long max, unsigned long *out)
{
    if (n == 0 || n > 10)
        return -1;
    unsigned long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

/* One "host[:port]" or "[v6]:port" of s[0..n) into seed i. */
static kvf_status parse_host_port(const char *s, size_t n, kvf__redis_url *u, size_t i)
{
    const char *host = s, *port = NULL;
    size_t host_len = n, port_len = 0;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close)
            return kvf__fail(KVF_ERR_INVALID, "remote url: host '%.*s': no closing ']'", (int)n, s);
        host = s + 1;
        host_len = (size_t)(close - host);
        size_t rest = n - (size_t)(close + 1 - s);
        if (rest > 0) {
            if (close[1] != ':')
                return kvf__fail(KVF_ERR_INVALID, "remote url: '%.*s': junk after ']'", (int)n, s);
            port = close + 2;
            port_len = rest - 1;
        }
    } else {
        const char *colon = memchr(s, ':', n);
        if (colon) {
            host_len = (size_t)(colon - s);
            port = colon + 1;
            port_len = n - host_len - 1;
        }
    }
    if (host_len == 0 || host_len >= sizeof u->seed[i].host)
        return kvf__fail(KVF_ERR_INVALID, "remote url: '%.*s': empty or overlong host", (int)n, s);
    memcpy(u->seed[i].host, host, host_len);
    u->seed[i].host[host_len] = '\0';
    unsigned long p = DEFAULT_PORT;
    if (port && (parse_number(port, port_len, 65535, &p) || p == 0))
        return kvf__fail(KVF_ERR_INVALID, "remote url: '%.*s': bad port", (int)n, s);
    u->seed[i].port = (int)p;
    return KVF_OK;
}

/* "user[:pass]" of s[0..n). */
static kvf_status parse_userinfo(const char *s, size_t n, kvf__redis_url *u)
{
    const char *colon = memchr(s, ':', n);
    size_t user_len = colon ? (size_t)(colon - s) : n;
    if (percent_decode(s, user_len, u->user, sizeof u->user))
        return kvf__fail(KVF_ERR_INVALID, "remote url: bad or overlong user name");
    if (!colon) {
        /* AUTH needs a password; a lone name is more likely a mistake */
        return kvf__fail(KVF_ERR_INVALID,
                         "remote url: user '%s' without a password "
                         "(redis://user:pass@host, or redis://:pass@host)",
                         u->user);
    }
    if (percent_decode(colon + 1, n - user_len - 1, u->pass, sizeof u->pass))
        return kvf__fail(KVF_ERR_INVALID, "remote url: bad or overlong password");
    return KVF_OK;
}

kvf_status kvf__redis_url_parse(const char *url, kvf__redis_url *out)
{
    if (!url || !out)
        return kvf__fail(KVF_ERR_INVALID, "remote url: NULL");
    kvf__redis_url u;
    memset(&u, 0, sizeof u);
    const char *p;
    if (strncmp(url, "redis://", 8) == 0) {
        p = url + 8;
    } else if (strncmp(url, "redis-cluster://", 16) == 0) {
        p = url + 16;
        u.cluster = 1;
    } else {
        /* the scheme only: what follows may be "user:password@" */
        int scheme_len = (int)strcspn(url, ":/@");
        return kvf__fail(KVF_ERR_INVALID,
                         "remote url: scheme '%.*s' unknown: expected redis://host[:port][/db] or "
                         "redis-cluster://host:port,host:port",
                         scheme_len < 32 ? scheme_len : 32, url);
    }
    const char *end = p + strlen(p);
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *hosts_end = slash ? slash : end;
    /* the last '@' before the path: a password may hold an escaped '@' only */
    const char *at = NULL;
    for (const char *q = p; q < hosts_end; q++)
        if (*q == '@')
            at = q;
    kvf_status st;
    if (at) {
        if ((st = parse_userinfo(p, (size_t)(at - p), &u)) != KVF_OK)
            return st;
        p = at + 1;
    }
    while (p < hosts_end) {
        const char *comma = memchr(p, ',', (size_t)(hosts_end - p));
        const char *item_end = comma ? comma : hosts_end;
        if (u.seeds == KVF_REDIS_MAX_SEEDS)
            return kvf__fail(KVF_ERR_INVALID, "remote url: more than %d hosts",
                             KVF_REDIS_MAX_SEEDS);
        if ((st = parse_host_port(p, (size_t)(item_end - p), &u, u.seeds)) != KVF_OK)
            return st;
        u.seeds++;
        p = comma ? comma + 1 : hosts_end;
    }
    if (u.seeds == 0)
        return kvf__fail(KVF_ERR_INVALID, "remote url: no host");
    if (u.seeds > 1 && !u.cluster)
        return kvf__fail(
            KVF_ERR_INVALID,
            "remote url: several hosts need redis-cluster:// (redis:// is one server)");
    if (slash && slash + 1 < end) {
        unsigned long db;
        if (parse_number(slash + 1, (size_t)(end - slash - 1), 1u << 20, &db))
            return kvf__fail(KVF_ERR_INVALID, "remote url: db '%s' is not a number", slash + 1);
        if (db != 0 && u.cluster)
            return kvf__fail(KVF_ERR_INVALID, "remote url: a cluster has only db 0");
        u.db = (uint32_t)db;
    }
    *out = u;
    return KVF_OK;
}
