/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Counters, the transfer latency histogram, and their Prometheus text.
 */
#include "cache_private.h"
#include "sized.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void kvf__cache_record_latency(kvf_cache *c, uint64_t ns)
{
    uint64_t us = ns / 1000;
    unsigned b = 0;
    while (b < KVF_CACHE_LATENCY_BUCKETS - 1 && us > (1ull << (4 + b)))
        b++;
    c->stats.latency_us[b]++;
    c->stats.latency_count++;
    c->stats.latency_sum_us += us;
}

static void stats_now(kvf_cache *c, kvf_cache_stats *s)
{
    pthread_mutex_lock(&c->mu);
    *s = c->stats;
    for (int t = 0; t < KVF_TIER_COUNT; t++) {
        s->blocks[t] = c->used[t];
        s->capacity[t] = c->capacity[t];
    }
    _Static_assert(KVF_TIER_COUNT <= KVF_CACHE_TIER_SLOTS, "a tier without a stats slot");
    pthread_mutex_unlock(&c->mu);
}

kvf_status kvf_cache_stats_get(kvf_cache *c, kvf_cache_stats *stats)
{
    kvf__clear_error();
    if (!c || !stats)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_stats_get: NULL argument");
    if (!kvf__sized_ok(stats, sizeof(size_t), 65536))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_stats_get: struct_size %zu (start from KVF_CACHE_STATS_INIT)",
                         stats->struct_size);
    kvf_cache_stats s;
    stats_now(c, &s);
    kvf__sized_copy_out(stats, &s, sizeof s);
    return KVF_OK;
}

/* Appends to a text buffer, counting what did not fit. */
typedef struct text {
    char *buf;
    size_t cap, len;
} text;

static void __attribute__((format(printf, 2, 3))) put_text(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->len < t->cap ? t->cap - t->len : 0;
    int w = vsnprintf(room ? t->buf + t->len : NULL, room, fmt, ap);
    va_end(ap);
    if (w > 0)
        t->len += (size_t)w;
}

static void metric_head(text *t, const char *name, const char *type, const char *help)
{
    put_text(t, "# HELP kvferry_cache_%s %s\n# TYPE kvferry_cache_%s %s\n", name, help, name, type);
}

static void per_tier(text *t, const char *name, const char *type, const char *help,
                     const uint64_t *v)
{
    metric_head(t, name, type, help);
    for (int i = 0; i < KVF_TIER_COUNT; i++)
        put_text(t, "kvferry_cache_%s{tier=\"%s\"} %llu\n", name, kvf_tier_name((kvf_tier)i),
                 (unsigned long long)v[i]);
}

static void scalar(text *t, const char *name, const char *type, const char *help, uint64_t v)
{
    metric_head(t, name, type, help);
    put_text(t, "kvferry_cache_%s %llu\n", name, (unsigned long long)v);
}

kvf_status kvf_cache_stats_prometheus(kvf_cache *c, char *buf, size_t cap, size_t *len_p)
{
    kvf__clear_error();
    if (!c || (!buf && cap) || !len_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_stats_prometheus: NULL argument");
    kvf_cache_stats s;
    stats_now(c, &s);
    text t = {buf, cap, 0};
    per_tier(&t, "blocks", "gauge", "Blocks in each tier.", s.blocks);
    per_tier(&t, "capacity_blocks", "gauge", "Capacity of each tier in blocks.", s.capacity);
    scalar(&t, "lookups_total", "counter", "Lookups.", s.lookups);
    scalar(&t, "lookup_blocks_total", "counter", "Block keys asked for by lookups.",
           s.lookup_blocks);
    per_tier(&t, "hits_total", "counter", "Blocks found by lookups, by tier.", s.hits);
    scalar(&t, "misses_total", "counter", "Lookups that stopped at a block not cached.", s.misses);
    scalar(&t, "puts_total", "counter", "Blocks handed to put.", s.puts);
    scalar(&t, "put_duplicates_total", "counter", "Blocks handed to put that were cached.",
           s.put_duplicates);
    scalar(&t, "gets_total", "counter", "Blocks asked for by get.", s.gets);
    per_tier(&t, "bytes_in_total", "counter", "Bytes written into each tier.", s.bytes_in);
    per_tier(&t, "bytes_out_total", "counter", "Bytes read from each tier into primary slots.",
             s.bytes_out);
    per_tier(&t, "evictions_total", "counter", "Victims leaving each tier.", s.evictions);
    scalar(&t, "dropped_total", "counter", "Blocks that left the cache by eviction.", s.dropped);
    scalar(&t, "failures_total", "counter", "Blocks removed because a transfer failed.",
           s.failures);
    scalar(&t, "events_dropped_total", "counter", "Events lost to a full queue.", s.events_dropped);
    scalar(&t, "remote_errors_total", "counter",
           "Remote operations that failed (unreachable, timeout, damaged value).", s.remote_errors);
    metric_head(&t, "transfer_seconds", "histogram",
                "Get and put transfers, submit to completion.");
    uint64_t cum = 0;
    for (int b = 0; b < KVF_CACHE_LATENCY_BUCKETS; b++) {
        cum += s.latency_us[b];
        if (b == KVF_CACHE_LATENCY_BUCKETS - 1)
            put_text(&t, "kvferry_cache_transfer_seconds_bucket{le=\"+Inf\"} %llu\n",
                     (unsigned long long)cum);
        else
            put_text(&t, "kvferry_cache_transfer_seconds_bucket{le=\"%.6f\"} %llu\n",
                     (double)(1ull << (4 + b)) / 1e6, (unsigned long long)cum);
    }
    put_text(&t, "kvferry_cache_transfer_seconds_sum %.6f\n", (double)s.latency_sum_us / 1e6);
    put_text(&t, "kvferry_cache_transfer_seconds_count %llu\n",
             (unsigned long long)s.latency_count);
    if (cap && t.len >= cap)
        buf[cap - 1] = '\0';
    *len_p = t.len;
    return KVF_OK;
}
