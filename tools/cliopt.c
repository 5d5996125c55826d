/* SPDX-License-Identifier: Apache-2.0 */
/* What every kvferry subcommand parses and writes alike: options through
 * getopt_long, numbers and choices checked with messages naming the option,
 * the block geometry, --json output, byte counts in human units and the
 * progress bar. */
#include "cli.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char kvf_cli_geometry_usage[] =
    "  --layers N --kv N --heads N --tokens-per-block N --head-size N\n"
    "                          block geometry of each pool (default 4 2 8 16 128)\n"
    "  --dtype fp32|fp16|bf16|fp8_e4m3|fp8_e5m2|int8|int4|fp4   default fp16\n"
    "  --order head|token      [l][kv][h][t][d] (default) or [l][kv][t][h][d]\n";

const char kvf_cli_common_usage[] =
    "  --json FILE             also write the results as JSON (- : standard output,\n"
    "                          the text report then goes to standard error)\n"
    "  -h, --help              this help\n"
    "Exit status: 0 done, 1 the work failed (a byte read back wrong, a corrupt block,\n"
    "an error), 2 bad usage, 3 a directory, namespace, file or tool it needs is not\n"
    "there.\n";

int kvf_cli_create_exit(kvf_status st)
{
    return st == KVF_ERR_NO_DEVICE || st == KVF_ERR_NOT_FOUND ? KVF_CLI_MISSING
           : st == KVF_ERR_INVALID                            ? KVF_CLI_USAGE
                                                              : KVF_CLI_FAILED;
}

int kvf_cli_getopt(const char *cmd, int argc, char **argv, const struct option *opts)
{
    /* the short options: the table's entries whose code is a letter */
    char shorts[64] = ":";
    size_t n = 1;
    for (const struct option *o = opts; o->name && n + 3 < sizeof shorts; o++)
        if (o->val < 0x80 && ((o->val | 0x20) >= 'a' && (o->val | 0x20) <= 'z') &&
            !strchr(shorts, o->val)) {
            shorts[n++] = (char)o->val;
            if (o->has_arg == required_argument)
                shorts[n++] = ':';
        }
    shorts[n] = '\0';
    opterr = 0; /* the messages below name the subcommand */
    int c = getopt_long(argc, argv, shorts, opts, NULL);
    if (c == '?' || c == ':') {
        const char *arg = argv[optind - 1];
        if (c == ':')
            fprintf(stderr, "kvferry %s: %s needs a value\n", cmd, arg);
        else if (optopt && optopt < 0x100)
            fprintf(stderr, "kvferry %s: unknown option '-%c'\n", cmd, optopt);
        else
            fprintf(stderr, "kvferry %s: unknown option '%s'\n", cmd, arg);
        return '?';
    }
    return c;
}

int kvf_cli_usage_error(const char *cmd)
{
    fprintf(stderr, "kvferry %s --help lists the options\n", cmd);
    return KVF_CLI_USAGE;
}

int kvf_cli_number(const char *cmd, const char *name, const char *s, uint64_t min, uint64_t max,
                   uint64_t *out)
{
    const char *digits = s[0] == '-' || s[0] == '+' ? s + 1 : s;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(digits, &end, 0);
    if (end == digits || *end || digits[0] == '-' || digits[0] == '+' || digits[0] == ' ') {
        fprintf(stderr, "kvferry %s: --%s: '%s' is not a number\n", cmd, name, s);
        return -1;
    }
    if (errno == ERANGE || (s[0] == '-' && v != 0) || v < min || v > max) {
        fprintf(stderr, "kvferry %s: --%s: %s is out of range (%llu..%llu)\n", cmd, name, s,
                (unsigned long long)min, (unsigned long long)max);
        return -1;
    }
    *out = v;
    return 0;
}

int kvf_cli_u64(const char *cmd, const char *name, const char *s, uint64_t *out)
{
    return kvf_cli_number(cmd, name, s, 0, UINT64_MAX, out);
}

int kvf_cli_u32(const char *cmd, const char *name, const char *s, uint32_t *out)
{
    uint64_t v;
    if (kvf_cli_number(cmd, name, s, 0, UINT32_MAX, &v))
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int kvf_cli_choice(const char *cmd, const char *name, const char *v, const char *const *names,
                   int *index_p)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(v, names[i])) {
            *index_p = i;
            return 0;
        }
    fprintf(stderr, "kvferry %s: --%s: '%s' is not one of:", cmd, name, v);
    for (int i = 0; names[i]; i++)
        fprintf(stderr, "%s %s", i ? "," : "", names[i]);
    fputc('\n', stderr);
    return -1;
}

/* by kvf_fsync value */
const char *const kvf_cli_fsync_names[] = {"batch", "none", "block", NULL};

int kvf_cli_backend(const char *cmd, const char *v, kvf_backend *backend_p)
{
    static const char *const names[] = {"auto", "host", "cuda", NULL}; /* kvf_backend's order */
    int b;
    if (kvf_cli_choice(cmd, "backend", v, names, &b))
        return -1;
    *backend_p = (kvf_backend)b;
    return 0;
}

int kvf_cli_geometry_opt(const char *cmd, int code, const char *v, kvf_geometry *g)
{
    switch (code) {
    case KVF_OPT_LAYERS:
        return kvf_cli_u32(cmd, "layers", v, &g->layers) ? -1 : 1;
    case KVF_OPT_KV:
        return kvf_cli_u32(cmd, "kv", v, &g->kv_factor) ? -1 : 1;
    case KVF_OPT_HEADS:
        return kvf_cli_u32(cmd, "heads", v, &g->kv_heads) ? -1 : 1;
    case KVF_OPT_TOKENS_PER_BLOCK:
        return kvf_cli_u32(cmd, "tokens-per-block", v, &g->tokens_per_block) ? -1 : 1;
    case KVF_OPT_HEAD_SIZE:
        return kvf_cli_u32(cmd, "head-size", v, &g->head_size) ? -1 : 1;
    case KVF_OPT_DTYPE: {
        const char *names[KVF_DTYPE_COUNT + 1];
        for (int d = 0; d < KVF_DTYPE_COUNT; d++)
            names[d] = kvf_dtype_name((kvf_dtype)d);
        names[KVF_DTYPE_COUNT] = NULL;
        int d;
        if (kvf_cli_choice(cmd, "dtype", v, names, &d))
            return -1;
        g->dtype = (kvf_dtype)d;
        return 1;
    }
    case KVF_OPT_ORDER: {
        static const char *const orders[] = {"head", "token", NULL}; /* kvf_token_order's */
        int order;
        if (kvf_cli_choice(cmd, "order", v, orders, &order))
            return -1;
        g->order = (kvf_token_order)order;
        return 1;
    }
    default:
        return 0;
    }
}

const char *kvf_cli_bytes(uint64_t bytes, char buf[32])
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double v = (double)bytes;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0 || v == (double)(uint64_t)v)
        snprintf(buf, 32, "%.0f %s", v, units[u]);
    else
        snprintf(buf, 32, "%.*f %s", v < 10 ? 2 : 1, v, units[u]);
    return buf;
}

/* ---- --json ---------------------------------------------------------------- */

static FILE *json_out;
static const char *json_path;
static bool json_failed; /* said once: kvf_cli_json_close stays quiet */

int kvf_cli_json_open(const char *cmd, const char *path)
{
    if (!path)
        return 0;
    json_path = path;
    if (strcmp(path, "-") != 0) {
        json_out = fopen(path, "w");
        if (!json_out) {
            fprintf(stderr, "kvferry %s: --json %s: %s\n", cmd, path, strerror(errno));
            return -1;
        }
        return 0;
    }
    /* standard output carries the JSON alone: the report printed there goes
     * to standard error instead */
    fflush(stdout);
    int fd = dup(STDOUT_FILENO);
    json_out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!json_out || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        fprintf(stderr, "kvferry %s: --json -: %s\n", cmd, strerror(errno));
        if (json_out)
            fclose(json_out);
        json_out = NULL;
        return -1;
    }
    return 0;
}

int kvf_cli_json_emit(const char *cmd, cJSON *doc)
{
    if (!json_out) {
        cJSON_Delete(doc);
        return 0;
    }
    char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (!text) {
        fprintf(stderr, "kvferry %s: --json %s: out of memory\n", cmd, json_path);
        return -1;
    }
    int ok = fputs(text, json_out) >= 0 && fputc('\n', json_out) != EOF;
    free(text);
    if (!ok || fflush(json_out) != 0) {
        json_failed = true;
        fprintf(stderr, "kvferry %s: --json %s: %s\n", cmd, json_path, strerror(errno));
        return -1;
    }
    return 0;
}

int kvf_cli_json_close(const char *cmd)
{
    if (!json_out)
        return 0;
    int bad = ferror(json_out);
    if (fclose(json_out) != 0)
        bad = 1;
    else if (bad)
        errno = EIO;
    json_out = NULL;
    if (bad && !json_failed)
        fprintf(stderr, "kvferry %s: --json %s: %s\n", cmd, json_path, strerror(errno));
    return bad || json_failed ? -1 : 0;
}

static cJSON *tiers_json(const uint64_t *v)
{
    cJSON *o = cJSON_CreateObject();
    for (int t = 0; t < KVF_TIER_COUNT; t++)
        cJSON_AddNumberToObject(o, kvf_tier_name((kvf_tier)t), (double)v[t]);
    return o;
}

cJSON *kvf_cli_cache_stats_json(const kvf_cache_stats *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "blocks", tiers_json(s->blocks));
    cJSON_AddItemToObject(o, "capacity", tiers_json(s->capacity));
    cJSON_AddItemToObject(o, "hits", tiers_json(s->hits));
    cJSON_AddItemToObject(o, "bytes_in", tiers_json(s->bytes_in));
    cJSON_AddItemToObject(o, "bytes_out", tiers_json(s->bytes_out));
    cJSON_AddItemToObject(o, "evictions", tiers_json(s->evictions));
    cJSON_AddNumberToObject(o, "lookups", (double)s->lookups);
    cJSON_AddNumberToObject(o, "misses", (double)s->misses);
    cJSON_AddNumberToObject(o, "puts", (double)s->puts);
    cJSON_AddNumberToObject(o, "gets", (double)s->gets);
    cJSON_AddNumberToObject(o, "dropped", (double)s->dropped);
    cJSON_AddNumberToObject(o, "failures", (double)s->failures);
    cJSON_AddNumberToObject(o, "events_dropped", (double)s->events_dropped);
    cJSON_AddNumberToObject(o, "remote_errors", (double)s->remote_errors);
    return o;
}

/* ---- progress ---------------------------------------------------------------- */

static pthread_mutex_t progress_mu = PTHREAD_MUTEX_INITIALIZER;
static double progress_last;
static bool progress_shown;
static int progress_tty = -1; /* -1: not asked yet */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kvf_cli_progress(const char *what, uint64_t done, uint64_t total)
{
    if (pthread_mutex_trylock(&progress_mu) != 0)
        return; /* another thread is drawing it */
    if (progress_tty < 0)
        progress_tty = isatty(STDERR_FILENO) && getenv("TERM") && strcmp(getenv("TERM"), "dumb");
    double now = mono_s();
    if (progress_tty && total && (now - progress_last >= 0.1 || done == total)) {
        enum { WIDTH = 30 };
        int fill = (int)(WIDTH * done / total);
        fprintf(stderr, "\r%s [%.*s%*s] %llu/%llu (%3.0f%%)", what, fill,
                "##############################", WIDTH - fill, "", (unsigned long long)done,
                (unsigned long long)total, 100.0 * (double)done / (double)total);
        fflush(stderr);
        progress_last = now;
        progress_shown = true;
    }
    pthread_mutex_unlock(&progress_mu);
}

void kvf_cli_progress_end(void)
{
    pthread_mutex_lock(&progress_mu);
    if (progress_shown)
        fprintf(stderr, "\r\033[K");
    progress_shown = false;
    pthread_mutex_unlock(&progress_mu);
}
