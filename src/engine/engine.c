/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's lifetime (create, destroy, the file and remote tiers'
 * set-up) and what the cache asks of it.
 */
#include "engine_private.h"
#include "sized.h"

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* A store that asks for it is probed at create (kvf__store_kind's
 * probe_at_create): its verdict on the URL (KVF_ERR_INVALID: no such
 * bucket, keys refused) fails create; a server that does not answer now is
 * a warning, since it may answer by the first move. */
static kvf_status remote_probe_at_create(const kvf__store_kind *kind, const char *url,
                                         uint32_t timeout_ms, const char *shown)
{
    char detail[512];
    kvf_status st = kind->probe(url, timeout_ms ? timeout_ms : REMOTE_DEFAULT_TIMEOUT_MS, detail,
                                sizeof detail);
    if (st == KVF_OK || st == KVF_ERR_INVALID)
        return st;
    KVF_LOG(KVF_LOG_WARN,
            "remote tier %s: not reached at create (%s): trying again at its first move", shown,
            detail);
    return KVF_OK;
}

/* Checks the remote tier's URL (the resolved config's) and keeps it for
 * the first use. A URL the caller or the file names that this build cannot
 * serve is an error; one from the environment only a warning. */
static kvf_status remote_setup(kvf_engine *e, const kvf_engine_config *c)
{
    const char *url = c->remote.url;
    if (!url)
        return KVF_OK;
    bool from_env = kvf__setting_source(e->settings, e->nsettings, "remote_url") == KVF_SOURCE_ENV;
    const kvf__store_kind *kind = kvf__store_kind_of(url);
    char shown[512], schemes[256];
    kvf__url_redact(url, shown, sizeof shown);
    if (kind && kind->built && !kind->built()) {
        if (from_env) {
            KVF_LOG(KVF_LOG_WARN,
                    "%s is set, but this build has no %s store (it needs %s): no remote tier",
                    KVF_REMOTE_URL_ENV, kind->name, kind->missing);
            return KVF_OK;
        }
        return kvf__fail(
            KVF_ERR_UNSUPPORTED,
            "kvf_engine_create: remote.url \"%s\": this build has no %s store (it needs %s)", shown,
            kind->name, kind->missing);
    }
    kvf__store_remote_schemes(schemes, sizeof schemes);
    kvf_status st = kind && kind->remote ? kvf__store_check_url(url)
                                         : kvf__fail(KVF_ERR_INVALID,
                                                     "remote URL \"%s\": not a remote store's URL "
                                                     "(this build: %s)",
                                                     shown, schemes);
    if (st == KVF_OK && kind->probe_at_create && kind->probe)
        st = remote_probe_at_create(kind, url, c->remote.timeout_ms, shown);
    if (st != KVF_OK)
        return kvf__fail(st, "kvf_engine_create: %s%s", from_env ? KVF_REMOTE_URL_ENV ": " : "",
                         kvf_last_error());
    if (!kvf__ns_valid(e->file_namespace))
        return kvf__fail(KVF_ERR_INVALID,
                         "kvf_engine_create: namespace \"%s\" (the remote tier needs "
                         "[A-Za-z0-9._-]{1,64})",
                         e->file_namespace);
    e->remote_url = strdup(url);
    if (!e->remote_url)
        return kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: out of memory");
    return KVF_OK;
}

/* The caller's config (a shorter, older struct's missing fields at their
 * defaults), checked, with the fields left at defaults resolved from the
 * environment or config file. */
static kvf_status config_take(const kvf_engine_config *cfg, kvf_engine_config *out,
                              kvf_setting **settings_p, size_t *nsettings_p)
{
    kvf_engine_config c = KVF_ENGINE_CONFIG_INIT;
    if (cfg) {
        /* a caller built against an older, shorter struct gets defaults
         * for the fields it does not know */
        if (!kvf__sized_ok(cfg, offsetof(kvf_engine_config, backend) + sizeof cfg->backend, 4096))
            return kvf__fail(KVF_ERR_INVALID,
                             "kvf_engine_create: struct_size %zu (start from "
                             "KVF_ENGINE_CONFIG_INIT)",
                             cfg->struct_size);
        kvf__sized_copy_in(&c, sizeof c, cfg);
    }
    if ((unsigned)c.backend > KVF_BACKEND_CUDA || (unsigned)c.file.io > KVF_FILE_IO_GDS ||
        (unsigned)c.file.fsync > KVF_FSYNC_BLOCK || (unsigned)c.cuda.copy > KVF_CUDA_COPY_DMA ||
        (unsigned)c.file.runner > KVF_FILE_RUNNER_THREADS ||
        (unsigned)c.file.gds_compat > KVF_GDS_COMPAT_ON)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_create: an enum field is out of range");
    if (c.threads > 256)
        return kvf__fail(KVF_ERR_RANGE, "kvf_engine_create: threads %u (at most 256)", c.threads);
    kvf_status st = kvf__engine_config_resolve(&c, out, settings_p, nsettings_p);
    if (st != KVF_OK) {
        /* a setting the operator got wrong: said where they will look */
        kvf__fail(st, "kvf_engine_create: %s", kvf_last_error());
        KVF_LOG(KVF_LOG_ERROR, "%s", kvf_last_error());
    }
    return st;
}

/* The CUDA backend where asked for (or, under AUTO, where a GPU is
 * usable), else the host backend. */
static kvf_status backend_setup(kvf_engine *e)
{
    kvf_backend want = e->cfg.backend;
    if (want == KVF_BACKEND_CUDA || want == KVF_BACKEND_AUTO) {
        kvf_status st = kvf__cuda_backend_create(&e->cfg, &e->backend);
        if (st == KVF_OK) {
            e->backend_kind = KVF_BACKEND_CUDA;
            return KVF_OK;
        }
        if (want == KVF_BACKEND_CUDA)
            return st;
        KVF_LOG(KVF_LOG_INFO, "no usable GPU (%s): host backend", kvf_last_error());
    }
    e->backend_kind = KVF_BACKEND_HOST;
    return kvf__host_backend_create(&e->backend);
}

/* Starts `n` worker threads; on failure, stops those started. */
static kvf_status workers_start(kvf_engine *e, uint32_t n)
{
    e->workers = calloc(n, sizeof *e->workers);
    if (!e->workers)
        return kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: out of memory");
    for (uint32_t i = 0; i < n; i++) {
        e->workers[i].engine = e;
        int rc = pthread_create(&e->workers[i].thread, NULL, kvf__worker_main, &e->workers[i]);
        if (rc == 0) {
            e->nworkers++;
            continue;
        }
        kvf_status st =
            kvf__fail(kvf__errno_status(rc), "kvf_engine_create: pthread_create: %s", strerror(rc));
        engine_lock(e);
        e->stop = true;
        pthread_cond_broadcast(&e->work_cv);
        pthread_mutex_unlock(&e->mu);
        for (uint32_t k = 0; k < e->nworkers; k++)
            pthread_join(e->workers[k].thread, NULL);
        free(e->workers);
        e->workers = NULL;
        return st;
    }
    return KVF_OK;
}

/* Worker threads: as configured, else one per core up to 4. */
static uint32_t worker_count(const kvf_engine_config *c)
{
    if (c->threads)
        return c->threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > 4 ? 4 : (uint32_t)cores;
}

/* The disk tier: the file store over <file_dir>/<namespace>, which makes
 * every choice about files (runner, GPUDirect Storage) from the settings. */
static kvf_status file_setup(kvf_engine *e, const kvf_engine_config *c, uint32_t nthreads)
{
    kvf__file_tier_config fc = {
        e->file_dir,         e->file_namespace,  c->file.fsync,
        c->file.io,          c->file.gds_compat, c->file.runner,
        c->file.queue_depth, nthreads,           e->backend_kind == KVF_BACKEND_CUDA};
    kvf_status st = kvf__file_store_open_tier(&fc, &e->file_store);
    e->file_enabled = st == KVF_OK;
    return st;
}

static void log_created(const kvf_engine *e)
{
    KVF_LOG(KVF_LOG_INFO, "engine: %s backend, %u workers%s%s%s%s%s", e->backend->ops->name,
            e->nworkers, e->file_enabled ? ", files in " : "",
            e->file_enabled ? e->file_store->where : "", e->file_enabled ? " (" : "",
            e->file_enabled ? kvf__file_store_runner_name(e->file_store) : "",
            e->file_enabled ? ")" : "");
}

kvf_status kvf_engine_create(const kvf_engine_config *cfg, kvf_engine **engine_p)
{
    kvf__clear_error();
    kvf__timeline_setup();
    if (!engine_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_create: engine_p is NULL");
    kvf_engine_config c;
    kvf_setting *settings;
    size_t nsettings;
    kvf_status st = config_take(cfg, &c, &settings, &nsettings);
    if (st != KVF_OK)
        return st;

    kvf_engine *e = calloc(1, sizeof *e);
    if (!e) {
        free(settings);
        return kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: out of memory");
    }
    st = KVF_ERR_NOMEM;
    e->settings = settings;
    e->nsettings = nsettings;
    e->cfg = c;
    for (size_t t = 0; t < KVF_TIER_COUNT; t++)
        kvf__key_table_init(&e->tiers[t].hazards);
    e->next_id = 1;
    e->file_dir = dup_or_null(c.file.dir);
    e->file_namespace = strdup(c.file.namespace_ ? c.file.namespace_ : "default");
    if ((c.file.dir && !e->file_dir) || !e->file_namespace) {
        kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: out of memory");
        goto free_engine;
    }
    e->cfg.file.dir = e->file_dir;
    e->cfg.file.namespace_ = e->file_namespace;

    st = backend_setup(e);
    if (st != KVF_OK)
        goto free_engine;
    kvf__costs_init(&e->costs, e->backend_kind == KVF_BACKEND_CUDA);
    e->device_call_bytes = kvf__env_size("KVF_DEVICE_CALL_BYTES");

    uint32_t nthreads = worker_count(&c);
    if (e->file_dir && (st = file_setup(e, &c, nthreads)) != KVF_OK)
        goto destroy_backend;

    st = remote_setup(e, &c);
    if (st != KVF_OK)
        goto close_dir;

    if (pthread_mutex_init(&e->mu, NULL) != 0 || pthread_mutex_init(&e->spare_mu, NULL) != 0 ||
        pthread_mutex_init(&e->submit_mu, NULL) != 0 ||
        pthread_mutex_init(&e->remote_mu, NULL) != 0) {
        st = kvf__fail(KVF_ERR_NOMEM, "kvf_engine_create: pthread_mutex_init failed");
        goto close_dir;
    }
    pthread_cond_init(&e->work_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    pthread_mutex_init(&e->cb_mu, NULL);
    pthread_cond_init(&e->cb_cv, NULL);
    if (e->backend->ops->copy_async) {
        int rc = pthread_create(&e->cb_thread, NULL, kvf__completion_main, e);
        if (rc != 0) {
            st = kvf__fail(kvf__errno_status(rc), "kvf_engine_create: pthread_create: %s",
                           strerror(rc));
            goto destroy_sync;
        }
        e->cb_started = true;
    }

    st = workers_start(e, nthreads);
    if (st != KVF_OK)
        goto destroy_sync;
    log_created(e);
    *engine_p = e;
    return KVF_OK;

destroy_sync:
    kvf__completion_stop(e);
    pthread_cond_destroy(&e->done_cv);
    pthread_cond_destroy(&e->work_cv);
    pthread_mutex_destroy(&e->mu);
close_dir:
    free(e->remote_url);
    kvf__store_close(e->file_store);
destroy_backend:
    kvf__costs_destroy(&e->costs);
    e->backend->ops->destroy(e->backend);
free_engine:
    free(e->file_dir);
    free(e->file_namespace);
    free(e->settings);
    free(e);
    return st;
}

void kvf__mem_array_release(kvf_engine *e, mem_array *m)
{
    if (m->owned)
        e->backend->ops->mem_free(e->backend, m->kind, m->base);
    else if (m->registered)
        e->backend->ops->mem_unregister(e->backend, m->kind, m->base);
}

void kvf_engine_destroy(kvf_engine *e)
{
    if (!e)
        return;
    engine_lock(e);
    while (e->undone_count)
        pthread_cond_wait(&e->done_cv, &e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    for (uint32_t i = 0; i < e->nworkers; i++)
        pthread_join(e->workers[i].thread, NULL);
    kvf__completion_stop(e);
    kvf_memory staging_kind =
        e->backend_kind == KVF_BACKEND_CUDA ? KVF_MEMORY_HOST_PINNED : KVF_MEMORY_HOST;
    for (uint32_t i = 0; i < e->nworkers; i++) {
        const worker *w = &e->workers[i];
        if (w->store_chunks)
            KVF_LOG(KVF_LOG_DEBUG,
                    "engine: worker %u: %llu chunks of disk or remote moves, %llu moves, %.1f "
                    "ms in them, of which %.1f ms copying between slots and staging",
                    i, (unsigned long long)w->store_chunks, (unsigned long long)w->store_moves,
                    (double)w->store_ns / 1e6, (double)atomic_load(&w->copy_ns) / 1e6);
        if (e->workers[i].staging)
            e->backend->ops->mem_free(e->backend, staging_kind, e->workers[i].staging);
        kvf__gds_buf_destroy(e->workers[i].gstaging);
        free(e->workers[i].moves);
        free(e->workers[i].blocks);
        free(e->workers[i].copies);
        free(e->workers[i].pool_bytes);
    }
    free(e->workers);
    kvf__arrival_free(e);
    kvf__store_close(e->file_store);
    for (size_t i = 0; i < TICKET_BUCKETS; i++)
        for (batch *b = e->tickets[i], *next; b; b = next) {
            next = b->next_ticket;
            kvf__batch_destroy(b);
        }
    for (uint32_t i = 0; i < e->nspare; i++)
        kvf__batch_destroy(e->spare[i]);
    pthread_mutex_destroy(&e->spare_mu);
    pthread_mutex_destroy(&e->submit_mu);
    kvf__costs_destroy(&e->costs);
    for (uint32_t p = 0; p < e->npools; p++) {
        kvf__mem_array_release(e, &e->pools[p].primary);
        if (e->pools[p].has_secondary)
            kvf__mem_array_release(e, &e->pools[p].secondary);
    }
    free(e->pools);
    if (e->hz_primary)
        for (uint32_t i = 0; i < e->primary_slots; i++)
            free(e->hz_primary[i].more);
    if (e->hz_secondary)
        for (uint32_t i = 0; i < e->secondary_slots; i++)
            free(e->hz_secondary[i].more);
    free(e->hz_primary);
    free(e->hz_secondary);
    free(e->live);
    free(e->sec);
    free(e->sec_pool_bits);
    for (size_t t = 0; t < KVF_TIER_COUNT; t++)
        kvf__key_table_free(&e->tiers[t].hazards);
    kvf__store_close(e->remote);
    free(e->remote_url);
    pthread_mutex_destroy(&e->remote_mu);
    free(e->mark_primary);
    free(e->mark_secondary);
    free(e->sort_count);
    e->backend->ops->destroy(e->backend);
    pthread_cond_destroy(&e->done_cv);
    pthread_cond_destroy(&e->work_cv);
    pthread_mutex_destroy(&e->mu);
    free(e->file_dir);
    free(e->file_namespace);
    free(e->settings);
    free(e);
    kvf__timeline_flush();
}

kvf_backend kvf_engine_backend(const kvf_engine *e)
{
    return e ? e->backend_kind : KVF_BACKEND_AUTO;
}

const char *kvf_backend_name(kvf_backend backend)
{
    switch (backend) {
    case KVF_BACKEND_AUTO:
        return "auto";
    case KVF_BACKEND_HOST:
        return "host";
    case KVF_BACKEND_CUDA:
        return "cuda";
    }
    return "?";
}

/* ---- for the cache ----------------------------------------------------------- */

kvf_status kvf__engine_move_checked(kvf_engine *e, kvf_tier to, bool copy, const uint32_t *pools,
                                    size_t n_pools, const kvf_move *moves, size_t n,
                                    kvf_ticket *ticket_p)
{
    op_kind kind = KIND_COPY;
    if (!copy) {
        kvf_status st = kvf__tier_kind("offload", to, OP_OFFLOAD, &kind);
        if (st != KVF_OK)
            return st;
    }
    return kvf__submit_pools(e, kind, true, NULL, pools, n_pools, moves, n, ticket_p);
}

void kvf__engine_clear_poison(kvf_engine *e, const uint32_t *slots, size_t n)
{
    engine_lock(e);
    for (size_t i = 0; i < n && e->hz_primary; i++)
        if (slots[i] < e->primary_slots)
            e->hz_primary[slots[i]].poison = 0;
    pthread_mutex_unlock(&e->mu);
}

kvf_status kvf__engine_fence(kvf_engine *e, const uint32_t *slots, size_t n, kvf_ticket *ticket_p)
{
    if (!slots || n == 0 || n > SIZE_MAX / sizeof(kvf_move))
        return kvf__submit(e, KIND_FENCE, NULL, 0, ticket_p);
    kvf_move *moves = malloc(n * sizeof *moves);
    if (!moves)
        return kvf__fail(KVF_ERR_NOMEM, "fence: out of memory");
    for (size_t i = 0; i < n; i++)
        moves[i] = (kvf_move){.src = slots[i], .dst = slots[i]};
    kvf_status st = kvf__submit(e, KIND_FENCE, moves, n, ticket_p);
    free(moves);
    return st;
}

kvf_status kvf__engine_freeze(kvf_engine *e)
{
    engine_lock(e);
    kvf_status st = kvf__freeze(e);
    pthread_mutex_unlock(&e->mu);
    return st;
}

uint32_t kvf__engine_slots(const kvf_engine *e, kvf_level level)
{
    return level == KVF_LEVEL_PRIMARY ? e->primary_slots : e->secondary_slots;
}

size_t kvf__engine_block_bytes(const kvf_engine *e)
{
    return e->all_block_bytes;
}

uint32_t kvf__engine_tokens_per_block(const kvf_engine *e)
{
    return e->npools ? e->pools[0].g.tokens_per_block : 0;
}

const char *kvf__engine_config_file(const kvf_engine *e)
{
    return e->cfg.config_file;
}

kvf_status kvf_engine_settings(const kvf_engine *engine, const kvf_setting **settings_p,
                               size_t *n_p)
{
    if (!engine || !settings_p || !n_p)
        return kvf__fail(KVF_ERR_INVALID, "kvf_engine_settings: NULL argument");
    *settings_p = engine->settings;
    *n_p = engine->nsettings;
    return KVF_OK;
}

bool kvf__engine_gds(const kvf_engine *e)
{
    const kvf__store *s = e->file_store;
    return s && s->ops->device_staging && s->ops->device_staging(s);
}

kvf__blockfile_dir *kvf__engine_dir(kvf_engine *e)
{
    return kvf__file_store_dir(e->file_store);
}

bool kvf__engine_has_remote(const kvf_engine *e)
{
    return e->remote_url != NULL;
}

kvf__store *kvf__engine_store(kvf_engine *e, kvf_tier tier)
{
    kvf__store *s = NULL;
    if ((unsigned)tier >= KVF_TIER_COUNT || !tier_keyed(tier) ||
        kvf__tiers[tier].ops->store(e, &s) != KVF_OK)
        return NULL;
    return s;
}
