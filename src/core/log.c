/* SPDX-License-Identifier: Apache-2.0 */
/* Logging: the level (KVF_LOG, or kvf_log_set_level), the sink (stderr,
 * KVF_LOG_FILE, or the caller's handler), repeated warnings rate-limited
 * per call site; and the environment's overrides of AUTO settings. */
#include "log.h"
#include "namedfile.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define DEFAULT_BURST 5u
#define DEFAULT_INTERVAL_MS 10000u

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = KVF_LOG_WARN; /* read without the lock: __atomic */

/* The sink and the rate limit's state, under log_mu. Recursive, so that
 * a handler that calls kvferry (which may log) does not deadlock. */
static pthread_mutex_t log_mu;
static FILE *log_file; /* KVF_LOG_FILE, or NULL: stderr */
static kvf_log_fn log_fn;
static void *log_user;
static uint32_t log_burst = DEFAULT_BURST;
static uint64_t log_interval_ns = DEFAULT_INTERVAL_MS * 1000000ull;

static const char *const level_names[] = {"off", "error", "warn", "info", "debug", "trace"};
#define LEVELS ((int)(sizeof level_names / sizeof *level_names))

/* Writes a finished line to the current sink; the caller holds log_mu. */
static void emit_locked(kvf_log_level level, const char *msg)
{
    if (log_fn) {
        log_fn(log_user, level, msg);
        return;
    }
    FILE *out = log_file ? log_file : stderr;
    /* one write per line, so that lines of several processes sharing a
     * file do not interleave */
    char line[1024];
    snprintf(line, sizeof line, "kvferry %s: %s\n", level_names[level], msg);
    fputs(line, out);
    fflush(out);
}

/* KVF_LOG_FILE's path with %h (host name) and %p (process id) expanded,
 * as NCCL_DEBUG_FILE does. */
static void expand_path(const char *pattern, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = pattern; *p && n + 1 < cap; p++) {
        char piece[256];
        const char *add = piece;
        if (p[0] == '%' && p[1] == 'h') {
            if (gethostname(piece, sizeof piece) != 0)
                snprintf(piece, sizeof piece, "unknown-host");
            piece[sizeof piece - 1] = '\0';
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            snprintf(piece, sizeof piece, "%ld", (long)getpid());
            p++;
        } else {
            piece[0] = *p;
            piece[1] = '\0';
        }
        n += (size_t)snprintf(out + n, cap - n, "%s", add);
        if (n >= cap)
            n = cap - 1;
    }
    out[n] = '\0';
}

static void open_log_file(void)
{
    const char *pattern = getenv("KVF_LOG_FILE");
    if (!pattern || !*pattern)
        return;
    char path[4096];
    expand_path(pattern, path, sizeof path);
    const char *why;
    log_file = kvf__named_file_open(path, true, &why);
    if (!log_file) {
        char msg[960]; /* a line holds 1024 bytes: the reason must fit */
        snprintf(msg, sizeof msg,
                 "KVF_LOG_FILE=%.300s: cannot open %.500s (%.80s); logging to stderr", pattern,
                 path, why);
        emit_locked(KVF_LOG_WARN, msg);
    }
}

static void read_level(void)
{
    const char *env = getenv("KVF_LOG");
    if (!env || !*env)
        return;
    for (int i = 0; i < LEVELS; i++)
        if (strcasecmp(env, level_names[i]) == 0) {
            log_level = i;
            return;
        }
    if (strcasecmp(env, "none") == 0) {
        log_level = KVF_LOG_OFF;
        return;
    }
    char msg[256];
    snprintf(msg, sizeof msg,
             "KVF_LOG=%.64s: expected off, error, warn, info, debug or trace; using warn", env);
    emit_locked(KVF_LOG_WARN, msg);
}

static void log_init(void)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&log_mu, &attr);
    pthread_mutexattr_destroy(&attr);
    open_log_file();
    read_level();
}

bool kvf__log_enabled(kvf_log_level level)
{
    pthread_once(&log_once, log_init);
    return (int)level <= __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

/* Whether a line from `site` is written now; `suppressed_p` receives how
 * many were dropped before it. The caller holds log_mu. */
static bool site_admits(kvf__log_site *site, uint64_t *suppressed_p)
{
    uint64_t now = kvf__now_ns();
    *suppressed_p = 0;
    if (log_burst == 0)
        return true;
    bool quiet = site->written > 0 && now - site->last_ns >= log_interval_ns;
    if (quiet && site->suppressed == 0)
        site->written = 0; /* a new incident: a new burst */
    if (site->written < log_burst || quiet) {
        site->written++;
        site->last_ns = now;
        *suppressed_p = site->suppressed;
        site->suppressed = 0;
        return true;
    }
    site->suppressed++;
    return false;
}

void kvf__log(kvf__log_site *site, kvf_log_level level, const char *fmt, ...)
{
    if (level <= KVF_LOG_OFF || level >= LEVELS)
        return;
    pthread_once(&log_once, log_init);
    bool limited = site && level <= KVF_LOG_WARN;
    pthread_mutex_lock(&log_mu);
    uint64_t suppressed = 0;
    if (limited && !site_admits(site, &suppressed)) {
        pthread_mutex_unlock(&log_mu);
        return;
    }
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (suppressed && n >= 0 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, " (%llu similar suppressed)",
                 (unsigned long long)suppressed);
    emit_locked(level, msg);
    pthread_mutex_unlock(&log_mu);
}

void kvf_log_set_handler(kvf_log_fn fn, void *user)
{
    pthread_once(&log_once, log_init);
    pthread_mutex_lock(&log_mu);
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&log_mu);
}

kvf_status kvf_log_set_level(kvf_log_level level)
{
    if ((int)level < KVF_LOG_OFF || (int)level >= LEVELS)
        return kvf__fail(KVF_ERR_INVALID, "log level %d: expected %d (off) to %d (trace)",
                         (int)level, KVF_LOG_OFF, KVF_LOG_TRACE);
    /* after KVF_LOG was read, so that it cannot override this */
    pthread_once(&log_once, log_init);
    __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
    return KVF_OK;
}

kvf_log_level kvf_log_get_level(void)
{
    pthread_once(&log_once, log_init);
    return (kvf_log_level)__atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

void kvf_log_set_rate_limit(uint32_t burst, uint32_t interval_ms)
{
    pthread_once(&log_once, log_init);
    pthread_mutex_lock(&log_mu);
    log_burst = burst;
    log_interval_ns = interval_ms * 1000000ull;
    pthread_mutex_unlock(&log_mu);
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
