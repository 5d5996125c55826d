/* SPDX-License-Identifier: Apache-2.0 */
/* The Redis store's URLs (redis_url.h): built with or without hiredis. */
#include "redis_url.h"
#include "status.h"

#include <stddef.h>
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

/* The TLS parameters: their name, and where each goes. */
static char *tls_param(kvf__redis_url *u, const char *name, size_t len, size_t *cap_p)
{
    static const struct {
        const char *name;
        size_t off, cap;
    } params[] = {
        {"tls_ca", offsetof(kvf__redis_url, tls_ca), sizeof u->tls_ca},
        {"tls_ca_dir", offsetof(kvf__redis_url, tls_ca_dir), sizeof u->tls_ca_dir},
        {"tls_cert", offsetof(kvf__redis_url, tls_cert), sizeof u->tls_cert},
        {"tls_key", offsetof(kvf__redis_url, tls_key), sizeof u->tls_key},
        {"tls_sni", offsetof(kvf__redis_url, tls_sni), sizeof u->tls_sni},
    };
    for (size_t i = 0; i < sizeof params / sizeof *params; i++)
        if (strlen(params[i].name) == len && !strncmp(name, params[i].name, len)) {
            *cap_p = params[i].cap;
            return (char *)u + params[i].off;
        }
    return NULL;
}

/* One "name=value" of the query, s[0..n). */
static kvf_status parse_param(const char *s, size_t n, kvf__redis_url *u, bool *verify_set)
{
    const char *eq = memchr(s, '=', n);
    size_t name_len = eq ? (size_t)(eq - s) : n;
    const char *v = eq ? eq + 1 : s + n;
    size_t vlen = (size_t)(s + n - v);
    int shown = name_len < 32 ? (int)name_len : 32;
    if (!eq || vlen == 0)
        return kvf__fail(KVF_ERR_INVALID, "remote url: parameter '%.*s' without a value", shown, s);
    if (!u->tls)
        return kvf__fail(KVF_ERR_INVALID,
                         "remote url: parameter '%.*s' needs TLS: rediss://... or "
                         "rediss-cluster://...",
                         shown, s);
    if (name_len == 10 && !strncmp(s, "tls_verify", 10)) {
        if (*verify_set)
            return kvf__fail(KVF_ERR_INVALID, "remote url: tls_verify given twice");
        *verify_set = true;
        if (vlen == 3 && !strncmp(v, "yes", 3))
            u->tls_verify = 1;
        else if (vlen == 2 && !strncmp(v, "no", 2))
            u->tls_verify = 0;
        else
            return kvf__fail(KVF_ERR_INVALID, "remote url: tls_verify is yes or no");
        return KVF_OK;
    }
    size_t cap;
    char *dst = tls_param(u, s, name_len, &cap);
    if (!dst)
        return kvf__fail(KVF_ERR_INVALID,
                         "remote url: unknown parameter '%.*s' (tls_ca, tls_ca_dir, tls_cert, "
                         "tls_key, tls_sni, tls_verify)",
                         shown, s);
    if (dst[0])
        return kvf__fail(KVF_ERR_INVALID, "remote url: %.*s given twice", shown, s);
    if (percent_decode(v, vlen, dst, cap) || !dst[0])
        return kvf__fail(KVF_ERR_INVALID, "remote url: %.*s: bad, empty or overlong value", shown,
                         s);
    return KVF_OK;
}

/* "?name=value&name=value" of s[0..n) (after the '?'), then whether the
 * TLS settings hold together. */
static kvf_status parse_query(const char *s, size_t n, kvf__redis_url *u)
{
    bool verify_set = false;
    const char *end = s + n;
    while (s < end) {
        const char *amp = memchr(s, '&', (size_t)(end - s));
        const char *item_end = amp ? amp : end;
        kvf_status st = parse_param(s, (size_t)(item_end - s), u, &verify_set);
        if (st != KVF_OK)
            return st;
        s = amp ? amp + 1 : end;
    }
    if (!u->tls_cert[0] != !u->tls_key[0])
        return kvf__fail(KVF_ERR_INVALID,
                         "remote url: tls_cert and tls_key go together (a client certificate "
                         "and its key)");
    if (!u->tls_verify && (u->tls_ca[0] || u->tls_ca_dir[0]))
        return kvf__fail(KVF_ERR_INVALID,
                         "remote url: tls_verify=no with tls_ca or tls_ca_dir: a CA that is "
                         "never checked; leave one out");
    return KVF_OK;
}

/* The scheme: how many bytes it takes, and what it says. 0: none of ours. */
static size_t parse_scheme(const char *url, kvf__redis_url *u)
{
    static const struct {
        const char *prefix;
        int cluster, tls;
    } schemes[] = {{"redis://", 0, 0},
                   {"redis-cluster://", 1, 0},
                   {"rediss://", 0, 1},
                   {"rediss-cluster://", 1, 1}};
    for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++) {
        size_t len = strlen(schemes[i].prefix);
        if (!strncmp(url, schemes[i].prefix, len)) {
            u->cluster = schemes[i].cluster;
            u->tls = schemes[i].tls;
            return len;
        }
    }
    return 0;
}

kvf_status kvf__redis_url_parse(const char *url, kvf__redis_url *out)
{
    if (!url || !out)
        return kvf__fail(KVF_ERR_INVALID, "remote url: NULL");
    kvf__redis_url u;
    memset(&u, 0, sizeof u);
    u.tls_verify = 1;
    size_t scheme_len = parse_scheme(url, &u);
    if (!scheme_len) {
        /* the scheme only: what follows may be "user:password@" */
        int shown = (int)strcspn(url, ":/@");
        return kvf__fail(KVF_ERR_INVALID,
                         "remote url: scheme '%.*s' unknown: expected redis://host[:port][/db], "
                         "redis-cluster://host:port,host:port, or rediss:// and "
                         "rediss-cluster:// for TLS",
                         shown < 32 ? shown : 32, url);
    }
    const char *p = url + scheme_len;
    const char *end = p + strlen(p);
    const char *first_slash = memchr(p, '/', (size_t)(end - p));
    /* the last '@' before the path: a password may hold an escaped '@' only */
    const char *at = NULL;
    for (const char *q = p; q < (first_slash ? first_slash : end); q++)
        if (*q == '@')
            at = q;
    kvf_status st;
    if (at) {
        if ((st = parse_userinfo(p, (size_t)(at - p), &u)) != KVF_OK)
            return st;
        p = at + 1;
    }
    /* the query: after the user part, whose password may hold a '?' */
    const char *query = memchr(p, '?', (size_t)(end - p));
    if (query) {
        if ((st = parse_query(query + 1, (size_t)(end - query - 1), &u)) != KVF_OK)
            return st;
        end = query;
    }
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *hosts_end = slash ? slash : end;
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
            "remote url: several hosts need redis-cluster:// or rediss-cluster:// (redis:// and "
            "rediss:// are one server)");
    if (slash && slash + 1 < end) {
        unsigned long db;
        if (parse_number(slash + 1, (size_t)(end - slash - 1), 1u << 20, &db))
            return kvf__fail(KVF_ERR_INVALID, "remote url: db '%.*s' is not a number",
                             (int)(end - slash - 1 < 32 ? end - slash - 1 : 32), slash + 1);
        if (db != 0 && u.cluster)
            return kvf__fail(KVF_ERR_INVALID, "remote url: a cluster has only db 0");
        u.db = (uint32_t)db;
    }
    *out = u;
    return KVF_OK;
}
