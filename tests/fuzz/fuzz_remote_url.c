/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the remote tier's URL parser (src/store/redis/redis_url.c), the one
 * parser that takes text from the environment ($KVF_REMOTE_URL) and the
 * command line, TLS parameters included. Properties: a URL taken describes
 * servers that can be connected to and TLS settings that hold together, no
 * message repeats the password, and neither does the URL as kvferry shows
 * it (kvf__url_redact). */
#include "common.h"
#include "fuzz.h"
#include "redact.h"
#include "redis.h"

#include <string.h>

/* The password of "scheme://user:pass@host...", as the input spells it
 * (escapes undone or not, either must stay out of messages), into `pass`,
 * and the URL without it into `rest`; false when the input has none worth
 * looking for. */
static bool password_of(const char *url, char *pass, size_t cap, char *rest)
{
    const char *p = strstr(url, "://");
    if (!p)
        return false;
    p += 3;
    const char *slash = strchr(p, '/');
    const char *end = slash ? slash : p + strlen(p);
    const char *at = NULL;
    for (const char *q = p; q < end; q++)
        if (*q == '@')
            at = q;
    const char *colon = at ? memchr(p, ':', (size_t)(at - p)) : NULL;
    if (!colon)
        return false;
    size_t n = (size_t)(at - colon - 1);
    /* short ones match by chance ("1" in a port): not evidence of a leak */
    if (n < 6 || n >= cap)
        return false;
    memcpy(pass, colon + 1, n);
    pass[n] = '\0';
    size_t head = (size_t)(colon + 1 - url);
    memcpy(rest, url, head);
    strcpy(rest + head, at);
    return true;
}

/* A failed parse's message quotes no password: one the message holds must
 * still be there once the password is taken out of the URL (then it is the
 * message's own text, or another part of the URL quoted). */
static void check_no_password(const char *url, size_t size)
{
    char pass[256];
    char *rest = malloc(size + 1), *msg = strdup(kvf_last_error());
    if (rest && msg && password_of(url, pass, sizeof pass, rest) && strstr(msg, pass)) {
        kvf__redis_url u;
        kvf__redis_url_parse(rest, &u);
        FUZZ_CHECK(strstr(kvf_last_error(), pass) != NULL);
    }
    free(rest);
    free(msg);
}

/* The URL as kvferry shows it (kvf__url_redact) is the URL with its
 * password, and only that, replaced by "***": it never holds the password
 * but where the rest of the URL, with the marker, spells it by chance (a
 * password "*@host..." beside a host "host..."). */
static void check_redacted(const char *url, size_t size)
{
    char pass[256], shown[4096], want[4096];
    char *rest = malloc(size + 1);
    if (rest && password_of(url, pass, sizeof pass, rest) && size < sizeof shown - 8) {
        kvf__url_redact(url, shown, sizeof shown);
        size_t head = (size_t)(strchr(strstr(url, "://") + 3, ':') + 1 - url);
        snprintf(want, sizeof want, "%.*s***%s", (int)head, url, rest + head);
        FUZZ_CHECK(strcmp(shown, want) == 0);
    }
    free(rest);
}

static void check_taken(const kvf__redis_url *u)
{
    /* TLS settings only over TLS, whole strings, a certificate with its key,
     * a CA only where it is checked */
    const struct {
        const char *s;
        size_t cap;
    } tls_fields[] = {{u->tls_ca, sizeof u->tls_ca},
                      {u->tls_ca_dir, sizeof u->tls_ca_dir},
                      {u->tls_cert, sizeof u->tls_cert},
                      {u->tls_key, sizeof u->tls_key},
                      {u->tls_sni, sizeof u->tls_sni}};
    for (size_t i = 0; i < sizeof tls_fields / sizeof *tls_fields; i++) {
        FUZZ_CHECK(memchr(tls_fields[i].s, '\0', tls_fields[i].cap));
        FUZZ_CHECK(u->tls || tls_fields[i].s[0] == '\0');
    }
    FUZZ_CHECK(!u->tls_cert[0] == !u->tls_key[0]);
    FUZZ_CHECK(u->tls_verify || (!u->tls_ca[0] && !u->tls_ca_dir[0]));
    FUZZ_CHECK(u->tls_verify == 0 || u->tls_verify == 1);
    FUZZ_CHECK(u->seeds >= 1 && u->seeds <= KVF_REDIS_MAX_SEEDS);
    FUZZ_CHECK(u->cluster || u->seeds == 1);
    FUZZ_CHECK(!u->cluster || u->db == 0);
    FUZZ_CHECK(memchr(u->user, '\0', sizeof u->user) && memchr(u->pass, '\0', sizeof u->pass));
    for (size_t i = 0; i < u->seeds; i++) {
        FUZZ_CHECK(memchr(u->seed[i].host, '\0', sizeof u->seed[i].host));
        FUZZ_CHECK(u->seed[i].host[0] != '\0');
        FUZZ_CHECK(u->seed[i].port >= 1 && u->seed[i].port <= 65535);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = malloc(size + 1);
    if (!url)
        return 0;
    memcpy(url, data, size);
    url[size] = '\0';
    kvf__redis_url u;
    memset(&u, 0xa5, sizeof u); /* poisoned: a failed parse must leave it alone */
    kvf_status st = kvf__redis_url_parse(url, &u);
    check_redacted(url, size);
    if (st == KVF_OK) {
        check_taken(&u);
    } else {
        FUZZ_CHECK(st == KVF_ERR_INVALID);
        FUZZ_CHECK(((const unsigned char *)&u)[0] == 0xa5);
        check_no_password(url, size);
    }
    free(url);
    return 0;
}
