/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One configuration surface: every field of kvf_engine_config and
 * kvf_cache_config from the caller's struct, the environment (KVF_<NAME>)
 * or a YAML file (<name>: value), in that order of precedence over the
 * default, each effective value recorded with its source. Sizes in bytes
 * are parsed here too ("64GB", "1.5TiB").
 *
 * A field counts as the caller's when it differs from its *_INIT value:
 * the struct has no other way to say "unset", and this keeps the meaning
 * the environment had before (it overrode AUTO values only).
 */
#include "config.h"
#include "log.h"
#include "namedfile.h"
#include "redact.h"
#include "sized.h"
#include "status.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef KVF_HAVE_YAML
#include <yaml.h>
#endif

/* ---- sizes ------------------------------------------------------------------ */

static const struct {
    const char *unit;
    uint64_t factor;
} size_units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1000ull},
    {"kb", 1000ull},
    {"m", 1000000ull},
    {"mb", 1000000ull},
    {"g", 1000000000ull},
    {"gb", 1000000000ull},
    {"t", 1000000000000ull},
    {"tb", 1000000000000ull},
    {"p", 1000000000000000ull},
    {"pb", 1000000000000000ull},
    {"kib", 1ull << 10},
    {"mib", 1ull << 20},
    {"gib", 1ull << 30},
    {"tib", 1ull << 40},
    {"pib", 1ull << 50},
};

kvf_status kvf_size_parse(const char *text, uint64_t *bytes_p)
{
    if (!text || !bytes_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_size_parse: NULL argument");
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    uint64_t whole = 0, frac = 0, frac_den = 1;
    bool digits = false, overflow = false;
    for (; isdigit((unsigned char)*p); p++, digits = true)
        overflow |= __builtin_mul_overflow(whole, 10, &whole) ||
                    __builtin_add_overflow(whole, (uint64_t)(*p - '0'), &whole);
    bool has_frac = *p == '.';
    if (has_frac)
        for (p++; isdigit((unsigned char)*p); p++, digits = true)
            if (frac_den < 1000000000000000000ull) { /* digits past 18 cannot add a byte */
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_den *= 10;
            }
    while (isspace((unsigned char)*p))
        p++;
    const char *unit = p;
    while (isalpha((unsigned char)*p))
        p++;
    size_t unit_len = (size_t)(p - unit);
    while (isspace((unsigned char)*p))
        p++;
    uint64_t factor = 0;
    for (size_t i = 0; i < sizeof size_units / sizeof *size_units && !*p; i++)
        if (strlen(size_units[i].unit) == unit_len &&
            strncasecmp(unit, size_units[i].unit, unit_len) == 0)
            factor = size_units[i].factor;
    if (!digits || factor == 0 || (has_frac && unit_len == 0))
        return kvf__fail(KVF_ERR_INVALID,
                         "size \"%s\": expected a number of bytes and an optional unit "
                         "(4096, 512M, 64GB, 64GiB, 1.5T; KB = 1000, KiB = 1024)",
                         text);
    unsigned __int128 bytes =
        (unsigned __int128)whole * factor + (unsigned __int128)frac * factor / frac_den;
    if (overflow || bytes > UINT64_MAX)
        return kvf__fail(KVF_ERR_RANGE, "size \"%s\": more than 2^64 - 1 bytes", text);
    *bytes_p = (uint64_t)bytes;
    return KVF_OK;
}

/* ---- the settings ----------------------------------------------------------- */

typedef enum kind { K_ENUM, K_BOOL, K_U32, K_U64, K_I32, K_SIZE, K_STR } kind;

typedef struct def {
    const char *name; /* the file's key; env is KVF_ + name in capitals */
    const char *env;
    kind kind;
    size_t offset;
    const char *const *names; /* K_ENUM: the values' names, by value */
    unsigned nnames;
    uint64_t max;             /* K_U32, K_U64, K_I32 */
    const char *default_text; /* K_STR: what NULL means */
    bool blank_ok;            /* K_STR: a blank value is left to its user */
    bool url;                 /* K_STR: a URL, listed without its password */
    unsigned dflt;            /* environment-only K_ENUM, K_BOOL: the default */
    const char *env_extra;    /* K_ENUM: one more value, environment only,
                                 that leaves the field AUTO for the backend
                                 to read (KVF_CUDA_COPY=staged) */
} def;

static const char *const backend_names[] = {"auto", "host", "cuda"};
static const char *const file_io_names[] = {"auto", "posix", "gds"};
static const char *const fsync_names[] = {"batch", "none", "block"};
static const char *const cuda_copy_names[] = {"auto", "kernel", "dma"};
static const char *const file_runner_names[] = {"auto", "uring", "threads"};
static const char *const gds_compat_names[] = {"auto", "off", "on"};
static const char *const cache_remote_names[] = {"off", "write_through", "read"};

#define N(a) (unsigned)(sizeof a / sizeof *a)
#define E(field) offsetof(kvf_engine_config, field)
#define C(field) offsetof(kvf_cache_config, field)

#define D(nm, ev, k, off) .name = nm, .env = ev, .kind = k, .offset = off

/* In the struct's order: its fields, then each group's. */
static const def engine_defs[] = {
    {D("backend", "KVF_BACKEND", K_ENUM, E(backend)), .names = backend_names,
     .nnames = N(backend_names)},
    {D("device", "KVF_DEVICE", K_I32, E(device)), .max = 1023},
    {D("threads", "KVF_THREADS", K_U32, E(threads)), .max = 256},
    {D("file_dir", "KVF_FILE_DIR", K_STR, E(file.dir))},
    {D("file_namespace", "KVF_FILE_NAMESPACE", K_STR, E(file.namespace_)),
     .default_text = "default"},
    {D("file_io", "KVF_FILE_IO", K_ENUM, E(file.io)), .names = file_io_names,
     .nnames = N(file_io_names)},
    {D("fsync", "KVF_FSYNC", K_ENUM, E(file.fsync)), .names = fsync_names,
     .nnames = N(fsync_names)},
    {D("file_runner", "KVF_FILE_RUNNER", K_ENUM, E(file.runner)), .names = file_runner_names,
     .nnames = N(file_runner_names)},
    {D("file_queue_depth", "KVF_FILE_QUEUE_DEPTH", K_U32, E(file.queue_depth)), .max = 65536},
    {D("gds_compat", "KVF_GDS_COMPAT", K_ENUM, E(file.gds_compat)), .names = gds_compat_names,
     .nnames = N(gds_compat_names)},
    {D("remote_url", "KVF_REMOTE_URL", K_STR, E(remote.url)), .url = true},
    {D("remote_ttl_s", "KVF_REMOTE_TTL_S", K_U32, E(remote.ttl_s)), .max = UINT32_MAX},
    {D("remote_timeout_ms", "KVF_REMOTE_TIMEOUT_MS", K_U32, E(remote.timeout_ms)),
     .max = UINT32_MAX},
    {D("cuda_copy", "KVF_CUDA_COPY", K_ENUM, E(cuda.copy)), .env_extra = "staged",
     .names = cuda_copy_names, .nnames = N(cuda_copy_names)},
    {D("cuda_copy_sms", "KVF_CUDA_COPY_SMS", K_U32, E(cuda.copy_sms)), .max = 65535},
    {D("remote_mem_bytes", "KVF_REMOTE_MEM_BYTES", K_SIZE, E(remote_mem_bytes))},
};

/* config_file names the file, so it comes from the caller or the
 * environment only. */
static const def config_file_def = {D("config_file", "KVF_CONFIG", K_STR, E(config_file))};

/* Process-wide knobs with no field in either struct: read from the
 * environment only, where they are used (kvf__env_knob), and checked and
 * listed here with the rest so that a bad value fails create. */
static const char *const bool_names[] = {"0", "1", "off", "on", "false", "true", "no", "yes"};
static const char *const fsync_method_names[] = {"syncfs", "fsync"};

static const def env_defs[] = {
    {D("file_direct", "KVF_FILE_DIRECT", K_BOOL, 0), .names = bool_names, .nnames = N(bool_names),
     .dflt = 1},
    {D("fsync_method", "KVF_FSYNC_METHOD", K_ENUM, 0), .names = fsync_method_names,
     .nnames = N(fsync_method_names)},
    {D("host_async", "KVF_HOST_ASYNC", K_BOOL, 0), .names = bool_names, .nnames = N(bool_names)},
    {D("cufile_lib", "KVF_CUFILE_LIB", K_STR, 0), .default_text = "libcufile.so.0"},
    /* the least bytes of a block in one pool group of a layer-wise read
     * from disk (src/engine/arrival.c); unset: its own rule */
    {D("disk_group_bytes", "KVF_DISK_GROUP_BYTES", K_SIZE, 0), .default_text = "auto"},
    /* the same for a layer-wise read from the remote tier */
    {D("remote_group_bytes", "KVF_REMOTE_GROUP_BYTES", K_SIZE, 0), .default_text = "auto"},
    /* the most bytes of a large batch the engine hands a device backend
     * in one call (read at create, used in src/engine/async.c); unset:
     * its own rule */
    {D("device_call_bytes", "KVF_DEVICE_CALL_BYTES", K_SIZE, 0), .default_text = "auto"},
    /* a file to append to, checked when the timeline starts (timeline.c):
     * it is process-wide, so a bad one is logged rather than failing an
     * engine */
    {D("timeline", "KVF_TIMELINE", K_STR, 0), .blank_ok = true},
};

/* In the struct's order; resolve_tier takes the first four by index. */
static const def cache_defs[] = {
    {D("cache_host_blocks", "KVF_CACHE_HOST_BLOCKS", K_U64, C(host.blocks)), .max = UINT32_MAX},
    {D("cache_host_bytes", "KVF_CACHE_HOST_BYTES", K_SIZE, C(host.bytes))},
    {D("cache_disk_blocks", "KVF_CACHE_DISK_BLOCKS", K_U64, C(disk.blocks)), .max = UINT64_MAX},
    {D("cache_disk_bytes", "KVF_CACHE_DISK_BYTES", K_SIZE, C(disk.bytes))},
    {D("cache_disk_admit_uses", "KVF_CACHE_DISK_ADMIT_USES", K_U32, C(disk.admit_uses)),
     .max = UINT32_MAX},
    {D("cache_gpu_blocks", "KVF_CACHE_GPU_BLOCKS", K_U64, C(gpu.blocks)), .max = UINT32_MAX},
    {D("cache_event_queue", "KVF_CACHE_EVENT_QUEUE", K_U32, C(events.queue)), .max = 1u << 24},
    {D("cache_remote", "KVF_CACHE_REMOTE", K_ENUM, C(remote)), .names = cache_remote_names,
     .nnames = N(cache_remote_names)},
    {D("cache_offload_min_priority", "KVF_CACHE_OFFLOAD_MIN_PRIORITY", K_U32,
       C(offload_min_priority)),
     .max = 101},
};

/* Settings that were renamed: a value under the old name is refused with
 * the new one, rather than silently ignored. */
static const struct {
    const char *name, *env, *now;
} renamed[] = {
    /* "engine" means kvf_engine only */
    {"file_engine", "KVF_FILE_ENGINE", "file_runner"},
};

#define MAX_SETTINGS (N(engine_defs) + 1 + N(env_defs) + N(cache_defs))

static const def *find_def(const char *name)
{
    for (unsigned i = 0; i < N(engine_defs); i++)
        if (strcmp(engine_defs[i].name, name) == 0)
            return &engine_defs[i];
    for (unsigned i = 0; i < N(cache_defs); i++)
        if (strcmp(cache_defs[i].name, name) == 0)
            return &cache_defs[i];
    return NULL;
}

/* Fields as numbers: enums are int-sized, device is an int. */
static uint64_t field_get(const def *d, const void *cfg)
{
    const char *p = (const char *)cfg + d->offset;
    switch (d->kind) {
    case K_ENUM:
    case K_I32: {
        int v;
        memcpy(&v, p, sizeof v);
        return (uint64_t)(int64_t)v;
    }
    case K_U32: {
        uint32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case K_STR: {
        const char *s;
        memcpy(&s, p, sizeof s);
        return s != NULL;
    }
    default: {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    }
}

static void field_set(const def *d, void *cfg, uint64_t v, const char *s)
{
    char *p = (char *)cfg + d->offset;
    if (d->kind == K_ENUM || d->kind == K_I32) {
        int i = (int)v;
        memcpy(p, &i, sizeof i);
    } else if (d->kind == K_U32) {
        uint32_t u = (uint32_t)v;
        memcpy(p, &u, sizeof u);
    } else if (d->kind == K_STR) {
        memcpy(p, &s, sizeof s);
    } else {
        memcpy(p, &v, sizeof v);
    }
}

/* Parses `text` for d into *v_p (numbers, enums) or leaves strings to the
 * caller. On failure, why[] says what was expected. */
static bool parse_value(const def *d, const char *text, bool from_env, uint64_t *v_p, char *why,
                        size_t cap)
{
    switch (d->kind) {
    case K_ENUM:
    case K_BOOL: {
        for (unsigned i = 0; i < d->nnames; i++)
            if (strcasecmp(text, d->names[i]) == 0) {
                *v_p = d->kind == K_BOOL ? i & 1 : i; /* names pair off: "0", "1", "off", "on" */
                return true;
            }
        if (from_env && d->env_extra && strcasecmp(text, d->env_extra) == 0) {
            *v_p = 0;
            return true;
        }
        size_t len = (size_t)snprintf(why, cap, "expected ");
        for (unsigned i = 0; i < d->nnames && len < cap; i++)
            len += (size_t)snprintf(why + len, cap - len, "%s%s",
                                    i == 0               ? ""
                                    : i == d->nnames - 1 ? " or "
                                                         : ", ",
                                    d->names[i]);
        if (len < cap)
            snprintf(why + len, cap - len, " (any case)");
        return false;
    }
    case K_SIZE:
        if (kvf_size_parse(text, v_p) == KVF_OK)
            return true;
        snprintf(why, cap,
                 "expected a size such as 4096, 512M, 64GB or 64GiB (KB = 1000, "
                 "KiB = 1024)");
        return false;
    case K_STR: {
        /* one rule for every source: a name, path or URL that is empty or
         * only spaces would otherwise mean "unset" (the default namespace,
         * no disk tier) or a directory named by spaces */
        const char *p = text;
        while (isspace((unsigned char)*p))
            p++;
        if (*p || d->blank_ok)
            return true;
        snprintf(why, cap, "expected a non-blank value (leave the setting unset for its default)");
        return false;
    }
    default: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(text, &end, 10);
        if (!isdigit((unsigned char)text[0]) || *end || errno || v > d->max) {
            snprintf(why, cap, "expected a whole number from 0 to %llu",
                     (unsigned long long)d->max);
            return false;
        }
        *v_p = v;
        return true;
    }
    }
}

/* ---- the config file -------------------------------------------------------- */

typedef struct file_entry {
    char *key, *value;
    unsigned line;
} file_entry;

typedef struct file_kv {
    const char *path;
    file_entry *v;
    size_t n;
} file_kv;

static void file_free(file_kv *f)
{
    for (size_t i = 0; i < f->n; i++) {
        free(f->v[i].key);
        free(f->v[i].value);
    }
    free(f->v);
    f->v = NULL;
    f->n = 0;
}

static const file_entry *file_find(const file_kv *f, const char *key)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->v[i].key, key) == 0)
            return &f->v[i];
    return NULL;
}

/* Edit distance, to suggest the key a typo meant. */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[64];
    if (la >= 64 || lb >= 64)
        return 64;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static kvf_status unknown_key(const char *path, unsigned line, const char *key)
{
    for (unsigned i = 0; i < N(renamed); i++)
        if (strcmp(key, renamed[i].name) == 0)
            return kvf__fail(KVF_ERR_INVALID,
                             "config file %s, line %u: %s is now called %s (same values)", path,
                             line, key, renamed[i].now);
    for (unsigned i = 0; i <= N(env_defs); i++) {
        const def *d = i < N(env_defs) ? &env_defs[i] : &config_file_def;
        if (strcmp(key, d->name) == 0)
            return kvf__fail(KVF_ERR_INVALID,
                             "config file %s, line %u: %s is not read from a config file "
                             "(set %s)",
                             path, line, key, d->env);
    }
    const char *best = NULL;
    size_t best_d = 4;
    for (unsigned i = 0; i < N(engine_defs) + N(cache_defs); i++) {
        const def *d = i < N(engine_defs) ? &engine_defs[i] : &cache_defs[i - N(engine_defs)];
        size_t dist = distance(key, d->name);
        if (dist < best_d) {
            best_d = dist;
            best = d->name;
        }
    }
    if (best)
        return kvf__fail(KVF_ERR_INVALID,
                         "config file %s, line %u: unknown key \"%s\" (did you "
                         "mean \"%s\"?)",
                         path, line, key, best);
    return kvf__fail(KVF_ERR_INVALID,
                     "config file %s, line %u: unknown key \"%s\" (the keys "
                     "are listed in docs/configuration.md)",
                     path, line, key);
}

#ifdef KVF_HAVE_YAML
static bool yaml_null(const yaml_event_t *ev)
{
    const char *v = (const char *)ev->data.scalar.value;
    return ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*v || strcmp(v, "~") == 0 || strcasecmp(v, "null") == 0);
}

/* Takes one scalar of the top-level mapping: a key, or the value of the
 * key before it. */
static kvf_status file_take(file_kv *f, const yaml_event_t *ev, char **key, unsigned *key_line)
{
    const char *text = (const char *)ev->data.scalar.value;
    unsigned line = (unsigned)ev->start_mark.line + 1;
    if (!*key) {
        if (!find_def(text))
            return unknown_key(f->path, line, text);
        const file_entry *dup = file_find(f, text);
        if (dup)
            return kvf__fail(KVF_ERR_INVALID,
                             "config file %s, line %u: key \"%s\" again (first on "
                             "line %u)",
                             f->path, line, text, dup->line);
        *key = strdup(text);
        *key_line = line;
        return *key ? KVF_OK : kvf__fail(KVF_ERR_NOMEM, "config file %s: out of memory", f->path);
    }
    if (!yaml_null(ev)) {
        file_entry *v = realloc(f->v, (f->n + 1) * sizeof *v);
        char *value = strdup(text);
        if (!v || !value) {
            free(value);
            if (v)
                f->v = v;
            return kvf__fail(KVF_ERR_NOMEM, "config file %s: out of memory", f->path);
        }
        f->v = v;
        f->v[f->n++] = (file_entry){*key, value, *key_line};
    } else {
        free(*key);
    }
    *key = NULL;
    return KVF_OK;
}

/* Reads a YAML file holding one mapping of keys to scalars. */
static kvf_status file_parse(file_kv *f, FILE *fp)
{
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return kvf__fail(KVF_ERR_NOMEM, "config file %s: out of memory", f->path);
    yaml_parser_set_input_file(&parser, fp);
    kvf_status st = KVF_OK;
    int depth = 0;
    char *key = NULL;
    unsigned key_line = 0;
    for (bool done = false; !done && st == KVF_OK;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            st = kvf__fail(KVF_ERR_INVALID, "config file %s, line %zu: %s", f->path,
                           parser.problem_mark.line + 1,
                           parser.problem ? parser.problem : "not YAML");
            break;
        }
        unsigned line = (unsigned)ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_MAPPING_START_EVENT:
        case YAML_SEQUENCE_START_EVENT:
        case YAML_ALIAS_EVENT:
            if (depth == 0 && ev.type == YAML_MAPPING_START_EVENT)
                depth = 1;
            else if (key)
                st = kvf__fail(KVF_ERR_INVALID,
                               "config file %s, line %u: %s: the value must be "
                               "a single value (a string or a number)",
                               f->path, line, key);
            else
                st = kvf__fail(KVF_ERR_INVALID,
                               "config file %s, line %u: expected \"key: "
                               "value\" lines",
                               f->path, line);
            break;
        case YAML_MAPPING_END_EVENT:
            depth = 0;
            break;
        case YAML_SCALAR_EVENT:
            if (depth == 0 && !yaml_null(&ev))
                st = kvf__fail(KVF_ERR_INVALID,
                               "config file %s, line %u: expected \"key: "
                               "value\" lines",
                               f->path, line);
            else if (depth == 1)
                st = file_take(f, &ev, &key, &key_line);
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    free(key);
    yaml_parser_delete(&parser);
    return st;
}
#endif

static kvf_status file_load(const char *path, file_kv *f)
{
    f->path = path;
    f->v = NULL;
    f->n = 0;
    if (!path)
        return KVF_OK;
#ifdef KVF_HAVE_YAML
    const char *why;
    FILE *fp = kvf__named_file_open(path, false, &why);
    if (!fp) /* EINVAL: not a regular file */
        return kvf__fail(errno == EINVAL ? KVF_ERR_INVALID : kvf__errno_status(errno),
                         "config file %s: %s", path, why);
    kvf_status st = file_parse(f, fp);
    fclose(fp);
    if (st != KVF_OK)
        file_free(f);
    return st;
#else
    return kvf__fail(KVF_ERR_UNSUPPORTED,
                     "config file %s: this build has no YAML parser (rebuild with libyaml-dev "
                     "installed, or set the values in the environment)",
                     path);
#endif
}

/* ---- resolution ------------------------------------------------------------- */

typedef struct entry {
    const def *d;
    kvf_setting_source source;
    char *text; /* malloc'd: what the setting lists */
    char *full; /* malloc'd, a URL's only: the value itself, password included */
} entry;

typedef struct builder {
    entry v[MAX_SETTINGS];
    size_t n;
} builder;

static void builder_free(builder *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->v[i].text);
        free(b->v[i].full);
    }
    b->n = 0;
}

/* Resolves field d of out (which starts as the caller's struct) and notes
 * its source in *source_p. */
static kvf_status resolve_field(const def *d, void *out, const void *dflt, const file_kv *f,
                                kvf_setting_source *source_p)
{
    char why[160];
    uint64_t v = 0;
    if (field_get(d, out) != field_get(d, dflt)) {
        const char *s = NULL;
        if (d->kind == K_STR)
            memcpy(&s, (const char *)out + d->offset, sizeof s);
        if (s && !parse_value(d, s, false, &v, why, sizeof why))
            return kvf__fail(KVF_ERR_INVALID, "%s \"%s\" (caller): %s", d->name, s, why);
        *source_p = KVF_SOURCE_CALLER;
        return KVF_OK;
    }
    const char *env = getenv(d->env);
    if (env && *env) {
        if (!parse_value(d, env, true, &v, why, sizeof why))
            return kvf__fail(KVF_ERR_INVALID, "%s=\"%s\": %s", d->env, env, why);
        field_set(d, out, v, env);
        *source_p = KVF_SOURCE_ENV;
        return KVF_OK;
    }
    const file_entry *fe = f ? file_find(f, d->name) : NULL;
    if (fe) {
        if (!parse_value(d, fe->value, false, &v, why, sizeof why))
            return kvf__fail(KVF_ERR_INVALID, "config file %s, line %u: %s: \"%s\": %s", f->path,
                             fe->line, d->name, fe->value, why);
        field_set(d, out, v, fe->value);
        *source_p = KVF_SOURCE_FILE;
        return KVF_OK;
    }
    *source_p = KVF_SOURCE_DEFAULT;
    return KVF_OK;
}

static kvf_status add_text(builder *b, const def *d, const char *text, kvf_setting_source source)
{
    char *copy = strdup(text), *full = NULL;
    /* a URL lists without its password; the value itself is kept apart */
    char shown[1024];
    if (copy && d->url) {
        full = copy;
        kvf__url_redact(full, shown, sizeof shown);
        copy = strdup(shown);
    }
    if (!copy || (d->url && !full)) {
        free(copy);
        free(full);
        return kvf__fail(KVF_ERR_NOMEM, "settings: out of memory");
    }
    b->v[b->n++] = (entry){d, source, copy, full};
    return KVF_OK;
}

static kvf_status add_entry(builder *b, const def *d, const void *cfg, kvf_setting_source source)
{
    char num[32];
    const char *text = num;
    uint64_t v = field_get(d, cfg);
    if (d->kind == K_STR) {
        const char *s;
        memcpy(&s, (const char *)cfg + d->offset, sizeof s);
        text = s ? s : d->default_text ? d->default_text : "";
    } else if (d->kind == K_ENUM && v < d->nnames) {
        /* the environment's extra value leaves the field at 0 */
        const char *env = getenv(d->env);
        text = source == KVF_SOURCE_ENV && d->env_extra && env && strcasecmp(env, d->env_extra) == 0
                   ? d->env_extra
                   : d->names[v];
    } else if (d->kind == K_I32 || d->kind == K_ENUM) {
        snprintf(num, sizeof num, "%d", (int)v);
    } else {
        snprintf(num, sizeof num, "%llu", (unsigned long long)v);
    }
    return add_text(b, d, text, source);
}

/* An environment-only knob: checked, then listed with its value. */
static kvf_status add_env_knob(builder *b, const def *d)
{
    char why[160];
    uint64_t v = d->dflt;
    const char *env = getenv(d->env);
    bool set = env && *env;
    if (set && !parse_value(d, env, true, &v, why, sizeof why))
        return kvf__fail(KVF_ERR_INVALID, "%s=\"%s\": %s", d->env, env, why);
    const char *text = d->kind != K_STR && d->kind != K_SIZE ? d->names[v]
                       : set                                 ? env
                       : d->default_text                     ? d->default_text
                                                             : "";
    return add_text(b, d, text, set ? KVF_SOURCE_ENV : KVF_SOURCE_DEFAULT);
}

uint64_t kvf__env_size(const char *var)
{
    for (unsigned i = 0; i < N(env_defs); i++) {
        const def *d = &env_defs[i];
        if (d->kind != K_SIZE || strcmp(d->env, var) != 0)
            continue;
        char why[160];
        uint64_t v = 0;
        const char *env = getenv(var);
        /* create refuses a bad value first */
        if (env && *env && !parse_value(d, env, true, &v, why, sizeof why)) {
            KVF_LOG(KVF_LOG_ERROR, "%s=\"%s\": %s; using %s", var, env, why, d->default_text);
            v = 0;
        }
        return v;
    }
    return 0;
}

int kvf__env_knob(const char *var)
{
    for (unsigned i = 0; i < N(env_defs); i++) {
        const def *d = &env_defs[i];
        if (d->kind == K_STR || d->kind == K_SIZE || strcmp(d->env, var) != 0)
            continue;
        char why[160];
        uint64_t v = d->dflt;
        const char *env = getenv(var);
        /* create refuses a bad value first; this is for the callers that
         * run without an engine (fsck, stats) */
        if (env && *env && !parse_value(d, env, true, &v, why, sizeof why))
            KVF_LOG(KVF_LOG_ERROR, "%s=\"%s\": %s; using %s", var, env, why, d->names[d->dflt]);
        return (int)v;
    }
    return -1;
}

/* One allocation: the settings, then their texts (a URL's listed text is
 * followed by the value itself, which point_strings gives the config). */
static kvf_status builder_pack(builder *b, kvf_setting **settings_p, size_t *n_p)
{
    size_t bytes = b->n * sizeof(kvf_setting);
    for (size_t i = 0; i < b->n; i++)
        bytes += strlen(b->v[i].text) + 1 + (b->v[i].full ? strlen(b->v[i].full) + 1 : 0);
    kvf_setting *s = malloc(bytes ? bytes : 1);
    if (!s)
        return kvf__fail(KVF_ERR_NOMEM, "settings: out of memory");
    char *text = (char *)(s + b->n);
    for (size_t i = 0; i < b->n; i++) {
        size_t len = strlen(b->v[i].text) + 1;
        memcpy(text, b->v[i].text, len);
        s[i] = (kvf_setting){b->v[i].d->name, b->v[i].d->env, text, b->v[i].source};
        text += len;
        if (b->v[i].full) {
            len = strlen(b->v[i].full) + 1;
            memcpy(text, b->v[i].full, len);
            text += len;
        }
    }
    *settings_p = s;
    *n_p = b->n;
    return KVF_OK;
}

/* Points the string fields of cfg at the settings' copies (NULL for a
 * default), so that cfg stays valid as long as the settings do. */
static void point_strings(const def *defs, unsigned ndefs, void *cfg, const kvf_setting *s,
                          size_t n)
{
    for (unsigned i = 0; i < ndefs; i++) {
        if (defs[i].kind != K_STR)
            continue;
        for (size_t j = 0; j < n; j++) {
            if (s[j].name != defs[i].name)
                continue;
            const char *v = defs[i].url ? s[j].value + strlen(s[j].value) + 1 : s[j].value;
            field_set(&defs[i], cfg, 0, s[j].source == KVF_SOURCE_DEFAULT || !*v ? NULL : v);
        }
    }
}

static kvf_status refuse_renamed_env(void)
{
    for (unsigned i = 0; i < N(renamed); i++) {
        const char *env = getenv(renamed[i].env);
        const def *now = find_def(renamed[i].now);
        if (env && *env)
            return kvf__fail(KVF_ERR_INVALID, "%s=\"%s\": %s is now called %s (same values)",
                             renamed[i].env, env, renamed[i].env, now->env);
    }
    return KVF_OK;
}

static kvf_status engine_resolve(const kvf_engine_config *caller, kvf_engine_config *out,
                                 builder *b)
{
    static const kvf_engine_config dflt = KVF_ENGINE_CONFIG_INIT;
    kvf_status st = refuse_renamed_env();
    if (st != KVF_OK)
        return st;
    *out = *caller;
    kvf_setting_source src[N(engine_defs)], file_src;
    st = resolve_field(&config_file_def, out, &dflt, NULL, &file_src);
    if (st != KVF_OK)
        return st;
    file_kv f;
    st = file_load(out->config_file, &f);
    if (st != KVF_OK)
        return st;
    for (unsigned i = 0; i < N(engine_defs) && st == KVF_OK; i++)
        st = resolve_field(&engine_defs[i], out, &dflt, &f, &src[i]);
    /* the file's cache settings are checked by the cache; its keys, here */
    for (unsigned i = 0; i < N(engine_defs) && st == KVF_OK; i++)
        st = add_entry(b, &engine_defs[i], out, src[i]);
    if (st == KVF_OK)
        st = add_entry(b, &config_file_def, out, file_src);
    for (unsigned i = 0; i < N(env_defs) && st == KVF_OK; i++)
        st = add_env_knob(b, &env_defs[i]);
    file_free(&f);
    return st;
}

/* A tier sized both in blocks and in bytes: the higher source wins; from
 * one source it is a contradiction. */
static kvf_status resolve_tier(kvf_cache_config *out, const def *blocks_d, const def *bytes_d,
                               kvf_setting_source *blocks_src, kvf_setting_source *bytes_src,
                               size_t block_bytes, const char *tier)
{
    uint64_t blocks = field_get(blocks_d, out), bytes = field_get(bytes_d, out);
    if (blocks && bytes) {
        if (*blocks_src == *bytes_src)
            return kvf__fail(KVF_ERR_INVALID,
                             "%s tier: %s (%llu) and %s (%llu) both set (%s): set one of them",
                             tier, blocks_d->name, (unsigned long long)blocks, bytes_d->name,
                             (unsigned long long)bytes, kvf_setting_source_name(*blocks_src));
        const def *loser = *blocks_src > *bytes_src ? bytes_d : blocks_d;
        field_set(loser, out, 0, NULL);
        *(loser == bytes_d ? bytes_src : blocks_src) = KVF_SOURCE_DEFAULT;
        if (loser == bytes_d)
            bytes = 0;
    }
    if (bytes && block_bytes) {
        if (bytes / block_bytes == 0)
            return kvf__fail(KVF_ERR_RANGE,
                             "%s tier: %s %llu (%s) is less than one block (%zu bytes, a slot of "
                             "every pool)",
                             tier, bytes_d->name, (unsigned long long)bytes,
                             kvf_setting_source_name(*bytes_src), block_bytes);
        field_set(blocks_d, out, bytes / block_bytes, NULL);
        *blocks_src = *bytes_src;
    }
    return KVF_OK;
}

static kvf_status cache_resolve(const kvf_cache_config *caller, const char *config_file,
                                size_t block_bytes, kvf_cache_config *out, builder *b)
{
    static const kvf_cache_config dflt = KVF_CACHE_CONFIG_INIT;
    *out = *caller;
    kvf_setting_source src[N(cache_defs)];
    file_kv f;
    kvf_status st = file_load(config_file, &f);
    if (st != KVF_OK)
        return st;
    for (unsigned i = 0; i < N(cache_defs) && st == KVF_OK; i++)
        st = resolve_field(&cache_defs[i], out, &dflt, &f, &src[i]);
    /* cache_defs: host blocks, host bytes, disk blocks, disk bytes first */
    if (st == KVF_OK)
        st = resolve_tier(out, &cache_defs[0], &cache_defs[1], &src[0], &src[1], block_bytes,
                          "host");
    if (st == KVF_OK)
        st = resolve_tier(out, &cache_defs[2], &cache_defs[3], &src[2], &src[3], block_bytes,
                          "disk");
    for (unsigned i = 0; i < N(cache_defs) && st == KVF_OK; i++)
        st = add_entry(b, &cache_defs[i], out, src[i]);
    file_free(&f);
    return st;
}

kvf_status kvf__engine_config_resolve(const kvf_engine_config *caller, kvf_engine_config *out,
                                      kvf_setting **settings_p, size_t *n_p)
{
    builder b = {.n = 0};
    kvf_engine_config c;
    kvf_status st = engine_resolve(caller, &c, &b);
    if (st == KVF_OK)
        st = builder_pack(&b, settings_p, n_p);
    builder_free(&b);
    if (st != KVF_OK)
        return st;
    point_strings(engine_defs, N(engine_defs), &c, *settings_p, *n_p);
    point_strings(&config_file_def, 1, &c, *settings_p, *n_p);
    *out = c;
    return KVF_OK;
}

kvf_status kvf__cache_config_resolve(const kvf_cache_config *caller, const char *config_file,
                                     size_t block_bytes, kvf_cache_config *out,
                                     kvf_setting **settings_p, size_t *n_p)
{
    builder b = {.n = 0};
    kvf_cache_config c;
    kvf_status st = cache_resolve(caller, config_file, block_bytes, &c, &b);
    if (st == KVF_OK)
        st = builder_pack(&b, settings_p, n_p);
    builder_free(&b);
    if (st == KVF_OK)
        *out = c;
    return st;
}

kvf_setting_source kvf__setting_source(const kvf_setting *settings, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(settings[i].name, name) == 0)
            return settings[i].source;
    return KVF_SOURCE_DEFAULT;
}

const char *kvf_setting_source_name(kvf_setting_source source)
{
    switch (source) {
    case KVF_SOURCE_DEFAULT:
        return "default";
    case KVF_SOURCE_FILE:
        return "file";
    case KVF_SOURCE_ENV:
        return "environment";
    case KVF_SOURCE_CALLER:
        return "caller";
    }
    return "?";
}

/* A caller's struct of any size made whole, as create does. */
static kvf_status whole_struct(const void *cfg, size_t min, void *out, size_t size,
                               const char *what)
{
    if (!kvf__sized_ok(cfg, min, 4096))
        return kvf__fail(KVF_ERR_INVALID, "kvf_config_settings: %s struct_size %zu", what,
                         kvf__sized_size(cfg));
    kvf__sized_copy_in(out, size, cfg);
    return KVF_OK;
}

const char *kvf_engine_config_key(size_t i, size_t *offset_p)
{
    const def *d = i < N(engine_defs)    ? &engine_defs[i]
                   : i == N(engine_defs) ? &config_file_def
                                         : NULL;
    if (d && offset_p)
        *offset_p = d->offset;
    return d ? d->name : NULL;
}

kvf_status kvf_config_settings(const kvf_engine_config *ecfg, const kvf_cache_config *ccfg,
                               kvf_setting **settings_p, size_t *n_p)
{
    kvf__clear_error();
    if (!settings_p || !n_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_config_settings: NULL argument");
    kvf_engine_config e = KVF_ENGINE_CONFIG_INIT, eout;
    kvf_cache_config c = KVF_CACHE_CONFIG_INIT, cout;
    kvf_status st = KVF_OK;
    if (ecfg)
        st = whole_struct(ecfg, offsetof(kvf_engine_config, backend) + sizeof ecfg->backend, &e,
                          sizeof e, "engine");
    if (st == KVF_OK && ccfg)
        st = whole_struct(ccfg, offsetof(kvf_cache_config, disk) + sizeof ccfg->disk, &c, sizeof c,
                          "cache");
    if (st != KVF_OK)
        return st;
    builder b = {.n = 0};
    st = engine_resolve(&e, &eout, &b);
    /* eout.config_file points at b's text until the pack */
    if (st == KVF_OK)
        st = cache_resolve(&c, eout.config_file, 0, &cout, &b);
    if (st == KVF_OK)
        st = builder_pack(&b, settings_p, n_p);
    builder_free(&b);
    return st;
}

void kvf_settings_free(kvf_setting *settings)
{
    free(settings);
}
