/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Log lines with levels and rate limiting, and settings read from the
 * environment in any case (log.c; the process-wide knobs, config.c).
 */
#ifndef KVF_CORE_LOG_H
#define KVF_CORE_LOG_H

#include "common.h"

/* Where a log line comes from: a KVF_LOG call site, whose repeated
 * warnings are rate-limited together (kvf_log_set_rate_limit). */
typedef struct kvf__log_site {
    uint64_t last_ns;    /* when its last line was written */
    uint32_t written;    /* lines written in its current burst */
    uint64_t suppressed; /* lines dropped since the last one written */
} kvf__log_site;

/* Level from KVF_LOG (kvferry.h), read once, or kvf_log_set_level's. */
KVF_INTERNAL bool kvf__log_enabled(kvf_log_level level);
/* Writes a line from `site` (NULL: not rate-limited). */
KVF_INTERNAL void kvf__log(kvf__log_site *site, kvf_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define KVF_LOG(level, ...)                                                                        \
    do {                                                                                           \
        static kvf__log_site kvf__log_site_;                                                       \
        if (kvf__log_enabled(level))                                                               \
            kvf__log(&kvf__log_site_, level, __VA_ARGS__);                                         \
    } while (0)

/* The setting environment variable `var` names (any case): its index in
 * names[0..n), or -1 when unset, empty or "auto" (and, with a warning
 * naming what it expected, when it names none of them). Engine settings
 * are checked by kvf_engine_create first (config.c), where a bad value
 * is an error. */
KVF_INTERNAL int kvf__env_choice(const char *var, const char *const *names, int n);

/* A process-wide knob with no config field (KVF_FILE_DIRECT,
 * KVF_FSYNC_METHOD, KVF_HOST_ASYNC; config.c holds their table): the
 * index of its value among its names (0 or 1 for a switch), any case; its
 * default when unset or empty, and when invalid, with an error naming the
 * valid values (kvf_engine_create refuses such a value first). -1 for a
 * variable that is not such a knob. */
KVF_INTERNAL int kvf__env_knob(const char *var);
/* A process-wide size knob of the settings table (KVF_DISK_GROUP_BYTES):
 * its value, 0 when unset (or bad: logged; create refuses it). */
KVF_INTERNAL uint64_t kvf__env_size(const char *var);

#endif /* KVF_CORE_LOG_H */
