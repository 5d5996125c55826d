/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cache's create and destroy: the config resolved and checked against
 * the engine, the tables allocated, the disk tier's blocks entered
 * (cache_restore.c). The design is described in cache_private.h.
 */
#include "cache_private.h"
#include "sized.h"

#include <stdlib.h>
#include <string.h>

/* The checks of a resolved config against the engine. */
static kvf_status cache_check(kvf_engine *engine, const kvf_cache_config *k)
{
    if (k->host.blocks == 0 && k->disk.blocks == 0 && k->gpu.blocks == 0 &&
        k->remote == KVF_CACHE_REMOTE_OFF)
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: every tier has capacity 0 (set host.blocks or "
                         "disk.blocks)");
    if (k->remote != KVF_CACHE_REMOTE_OFF && !kvf__cache_remote_usable(engine))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: a remote tier needs the engine's remote tier "
                         "(remote.url or KVF_REMOTE_URL)");
    if (k->offload_min_priority > MAX_PRIORITY + 1)
        return kvf__fail(KVF_ERR_RANGE, "kvf_cache_create: offload_min_priority %u (0-101)",
                         k->offload_min_priority);
    if (k->events.queue > (1u << 24))
        return kvf__fail(KVF_ERR_RANGE, "kvf_cache_create: events.queue %u (at most 2^24)",
                         k->events.queue);
    uint32_t sec = kvf__engine_slots(engine, KVF_LEVEL_SECONDARY);
    if (k->host.blocks && sec == 0)
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: a host tier needs secondary slots in every pool");
    if (k->host.blocks > sec)
        return kvf__fail(KVF_ERR_RANGE,
                         "kvf_cache_create: host.blocks %llu, but the pools have %u secondary "
                         "slots",
                         (unsigned long long)k->host.blocks, sec);
    uint32_t prim = kvf__engine_slots(engine, KVF_LEVEL_PRIMARY);
    if (k->gpu.blocks > prim)
        return kvf__fail(KVF_ERR_RANGE,
                         "kvf_cache_create: gpu.blocks %llu, but the pools have %u primary slots",
                         (unsigned long long)k->gpu.blocks, prim);
    if (k->disk.blocks && !kvf__cache_disk_usable(engine))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: a disk tier needs the engine's file tier (file.dir)");
    return KVF_OK;
}

/* The caller's config, its fields left at their defaults resolved from
 * the environment or config file, checked against the engine. */
static kvf_status config_of(kvf_engine *engine, const kvf_cache_config *cfg, kvf_cache_config *k,
                            kvf_setting **settings_p, size_t *nsettings_p)
{
    if (!kvf__sized_ok(cfg, offsetof(kvf_cache_config, disk) + sizeof cfg->disk, 4096))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_cache_create: struct_size %zu (start from KVF_CACHE_CONFIG_INIT)",
                         cfg->struct_size);
    *k = (kvf_cache_config)KVF_CACHE_CONFIG_INIT;
    kvf__sized_copy_in(k, sizeof *k, cfg);
    if ((unsigned)k->remote > KVF_CACHE_REMOTE_READ)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_create: remote mode %d unknown",
                         (int)k->remote);
    /* the pools are fixed first: a tier in bytes becomes blocks of them */
    kvf_status st = kvf__engine_freeze(engine);
    if (st != KVF_OK)
        return kvf__fail(st, "kvf_cache_create: %s", kvf_last_error());
    st = kvf__cache_config_resolve(k, kvf__engine_config_file(engine),
                                   kvf__engine_block_bytes(engine), k, settings_p, nsettings_p);
    if (st != KVF_OK) {
        /* a setting the operator got wrong: said where they will look */
        kvf__fail(st, "kvf_cache_create: %s", kvf_last_error());
        KVF_LOG(KVF_LOG_ERROR, "%s", kvf_last_error());
        return st;
    }
    st = cache_check(engine, k);
    if (st != KVF_OK)
        free(*settings_p);
    return st;
}

/* Frees what cache_new allocates; the entries too. */
static void cache_free(kvf_cache *c)
{
    kvf__cache_free_entries(c);
    free(c->free_slots);
    free(c->gpu_free);
    free(c->gpu_state);
    free(c->events);
    free(c->doomed);
    free(c->settings);
    free(c);
}

/* A cache with its tables allocated and every slot free; it owns
 * `settings` from here on, also on failure. */
static kvf_status cache_new(kvf_engine *engine, const kvf_cache_config *cfg, kvf_setting *settings,
                            size_t nsettings, kvf_cache **c_p)
{
    const kvf_cache_config k = *cfg;
    kvf_cache *c = calloc(1, sizeof *c);
    if (!c) {
        free(settings);
        return kvf__fail(KVF_ERR_NOMEM, "kvf_cache_create: out of memory");
    }
    c->settings = settings;
    c->nsettings = nsettings;
    c->engine = engine;
    c->cfg = k;
    c->capacity[KVF_TIER_HOST] = k.host.blocks;
    c->capacity[KVF_TIER_DISK] = k.disk.blocks;
    c->capacity[KVF_TIER_GPU] = k.gpu.blocks;
    c->block_bytes = kvf__engine_block_bytes(engine);
    c->primary_slots = kvf__engine_slots(engine, KVF_LEVEL_PRIMARY);
    c->map = (kvf__keymap)KVF_KEYMAP_INIT(entry, key, hnext, 1024);
    c->free_slots = k.host.blocks ? malloc(k.host.blocks * sizeof *c->free_slots) : NULL;
    c->events = k.events.queue ? malloc(k.events.queue * sizeof *c->events) : NULL;
    c->gpu_free = k.gpu.blocks ? malloc(k.gpu.blocks * sizeof *c->gpu_free) : NULL;
    c->gpu_state = k.gpu.blocks ? calloc(k.gpu.blocks, 1) : NULL;
    if ((k.host.blocks && !c->free_slots) || (k.events.queue && !c->events) ||
        (k.gpu.blocks && (!c->gpu_free || !c->gpu_state))) {
        cache_free(c);
        return kvf__fail(KVF_ERR_NOMEM, "kvf_cache_create: out of memory");
    }
    /* taken from the end: slot 0 first */
    for (uint64_t i = 0; i < k.host.blocks; i++)
        c->free_slots[i] = (uint32_t)(k.host.blocks - 1 - i);
    c->nfree = (uint32_t)k.host.blocks;
    for (uint64_t i = 0; i < k.gpu.blocks; i++)
        c->gpu_free[i] = (uint32_t)(k.gpu.blocks - 1 - i);
    c->ngpu_free = (uint32_t)k.gpu.blocks;
    c->stats.struct_size = sizeof c->stats;
    *c_p = c;
    return KVF_OK;
}

kvf_status kvf_cache_create(kvf_engine *engine, const kvf_cache_config *cfg, kvf_cache **cache_p)
{
    kvf__clear_error();
    if (!engine || !cfg || !cache_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_create: NULL argument");
    kvf_cache_config k;
    kvf_setting *settings;
    size_t nsettings;
    kvf_status st = config_of(engine, cfg, &k, &settings, &nsettings);
    if (st != KVF_OK)
        return st;
    kvf_cache *c = NULL;
    st = cache_new(engine, &k, settings, nsettings, &c);
    if (st != KVF_OK)
        return st;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->prefill_mu, NULL);
    if (k.disk.blocks) {
        st = kvf__cache_restore(c);
        if (st != KVF_OK) {
            pthread_mutex_destroy(&c->mu);
            pthread_mutex_destroy(&c->prefill_mu);
            cache_free(c);
            return st;
        }
    }
    *cache_p = c;
    return KVF_OK;
}

kvf_status kvf_cache_settings(const kvf_cache *cache, const kvf_setting **settings_p, size_t *n_p)
{
    if (!cache || !settings_p || !n_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_cache_settings: NULL argument");
    *settings_p = cache->settings;
    *n_p = cache->nsettings;
    return KVF_OK;
}

void kvf_cache_destroy(kvf_cache *c)
{
    if (!c)
        return;
    for (op *o = c->background, *next; o; o = next) {
        next = o->next;
        kvf_wait(c->engine, o->ticket, NULL);
        kvf__cache_op_free(o);
    }
    for (call *k = c->calls, *next; k; k = next) {
        next = k->next;
        for (op *o = k->ops; o; o = o->next)
            if (!o->done)
                kvf_wait(c->engine, o->ticket, NULL);
        kvf__cache_call_free(k);
    }
    pthread_mutex_destroy(&c->mu);
    kvf__cache_prefill_free(c);
    cache_free(c);
}
