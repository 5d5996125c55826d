/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The S3 store's keys where the URL has none: the environment variables
 * and shared credentials file every AWS client reads, in their order.
 */
#include "s3_url.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* The [profile] section of an INI file: aws_access_key_id,
 * aws_secret_access_key, aws_session_token. 0 found (both keys), 1 no
 * such file or profile, -1 unreadable. */
static int from_file(kvf__s3_url *u, const char *path, const char *profile)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    char line[4096];
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        char *l = trim(line);
        if (*l == '#' || *l == ';' || !*l)
            continue;
        if (*l == '[') {
            char *end = strchr(l, ']');
            if (end)
                *end = '\0';
            in = !strcmp(trim(l + 1), profile);
            continue;
        }
        char *eq = strchr(l, '=');
        if (!in || !eq)
            continue;
        *eq = '\0';
        char *k = trim(l), *v = trim(eq + 1);
        if (!strcmp(k, "aws_access_key_id"))
            snprintf(u->access, sizeof u->access, "%s", v);
        else if (!strcmp(k, "aws_secret_access_key"))
            snprintf(u->secret, sizeof u->secret, "%s", v);
        else if (!strcmp(k, "aws_session_token"))
            snprintf(u->token, sizeof u->token, "%s", v);
    }
    int bad = ferror(f);
    fclose(f);
    memset(line, 0, sizeof line);
    if (bad)
        return -1;
    return u->access[0] && u->secret[0] ? 0 : 1;
}

kvf_status kvf__s3_creds_resolve(kvf__s3_url *u, const char *shown)
{
    if (u->access[0])
        return KVF_OK;
    if (env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
        snprintf(u->access, sizeof u->access, "%s", env("AWS_ACCESS_KEY_ID"));
        snprintf(u->secret, sizeof u->secret, "%s", env("AWS_SECRET_ACCESS_KEY"));
        if (env("AWS_SESSION_TOKEN"))
            snprintf(u->token, sizeof u->token, "%s", env("AWS_SESSION_TOKEN"));
        return KVF_OK;
    }
    char path[1024];
    const char *file = env("AWS_SHARED_CREDENTIALS_FILE");
    if (!file && env("HOME")) {
        snprintf(path, sizeof path, "%s/.aws/credentials", env("HOME"));
        file = path;
    }
    const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
    int rc = file ? from_file(u, file, profile) : 1;
    if (rc == 0)
        return KVF_OK;
    u->access[0] = u->secret[0] = u->token[0] = '\0';
    if (rc < 0)
        return kvf__fail(KVF_ERR_IO, "remote URL \"%s\": credentials file %s: unreadable", shown,
                         file);
    return kvf__fail(KVF_ERR_INVALID,
                     "remote URL \"%s\": no credentials: none in the URL (s3://ACCESS:SECRET@...), "
                     "in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or under [%s] of %s",
                     shown, profile, file ? file : "~/.aws/credentials (HOME unset)");
}
