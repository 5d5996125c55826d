/* Logging to stderr, with the level taken from KVF_LOG once; and the
 * environment's overrides of AUTO settings. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = KVF_LOG_WARN;

static void log_init(void)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    const char *env = getenv("KVF_LOG");
    if (!env)
        return;
    for (int i = 0; i < 4; i++)
        if (strcmp(env, names[i]) == 0)
            log_level = i;
    if (strcmp(env, "off") == 0 || strcmp(env, "none") == 0)
        log_level = -1;
}

bool kvf__log_enabled(kvf__log_level level)
{
    pthread_once(&log_once, log_init);
    return (int)level <= log_level;
}

void kvf__log(kvf__log_level level, const char *fmt, ...)
{
    static const char *const tags[] = {"error", "warn", "info", "debug"};
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(line, sizeof line, "kvferry %s: ", tags[level]);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* one fputs per line, so lines from several threads do not interleave */
    size_t len = strlen(line);
    if (len < sizeof line - 1) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
}

int kvf__env_choice(const char *var, const char *const *names, int n)
{
    const char *env = getenv(var);
    if (!env || !*env || strcasecmp(env, "auto") == 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (strcasecmp(env, names[i]) == 0)
            return i;
    char expected[128] = "auto";
    for (int i = 0; i < n; i++) {
        size_t len = strlen(expected);
        snprintf(expected + len, sizeof expected - len, "%s%s", i == n - 1 ? " or " : ", ",
                 names[i]);
    }
    KVF_LOG(KVF_LOG_WARN, "%s=%s: expected %s; ignored", var, env, expected);
    return -1;
}
