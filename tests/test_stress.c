/* SPDX-License-Identifier: Apache-2.0 */
/* Stress: random batches of offloads, onboards and copies over shared slots
 * and files, queued without waiting, from two threads at once. The engine
 * must give the result of running every batch in the order it was queued;
 * a model of that order checks every byte at the end. */
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { SLOTS = 16, KEYS = 16, HALF = 8, BATCHES = 3000, MAXN = 6 };

static const kvf_geometry G[2] = {
    {2, 2, 2, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
    {1, 1, 4, 16, 8, KVF_DTYPE_FP8_E4M3, KVF_ORDER_TOKEN_MAJOR},
};
static size_t bytes[2];
static kvf_engine *engine;

typedef struct model {
    int id; /* which half of the slots and keys this thread owns */
    uint64_t rng;
    uint64_t prim[HALF], sec[HALF], file[KEYS / 2]; /* content tag, 0: none */
    uint64_t next_tag;
    int failures;
} model;

static uint64_t rnd(model *m, uint64_t n)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng % n;
}

static uint8_t *slot_ptr(uint32_t p, kvf_level lv, uint32_t s)
{
    void *ptr = NULL;
    kvf_engine_slot_ptr(engine, p, lv, s, &ptr);
    return ptr;
}

static void fill(uint32_t s, uint64_t tag)
{
    for (uint32_t p = 0; p < 2; p++)
        test_fill_random(slot_ptr(p, KVF_LEVEL_PRIMARY, s), bytes[p], tag * 7 + p);
}

static bool holds(kvf_level lv, uint32_t s, uint64_t tag)
{
    for (uint32_t p = 0; p < 2; p++) {
        uint8_t *want = malloc(bytes[p]);
        test_fill_random(want, bytes[p], tag * 7 + p);
        bool ok = memcmp(want, slot_ptr(p, lv, s), bytes[p]) == 0;
        free(want);
        if (!ok)
            return false;
    }
    return true;
}

/* Picks `n` distinct values below `range`. */
static void pick(model *m, uint32_t *out, size_t n, uint32_t range)
{
    for (size_t i = 0; i < n; i++) {
        bool again;
        do {
            out[i] = (uint32_t)rnd(m, range);
            again = false;
            for (size_t j = 0; j < i; j++)
                again |= out[j] == out[i];
        } while (again);
    }
}

static void *run(void *arg)
{
    model *m = arg;
    uint32_t base = m->id * HALF;
    uint64_t kbase = 0x51000 + (uint64_t)m->id * (KEYS / 2);
    kvf_ticket *tickets = malloc(BATCHES * sizeof *tickets);
    size_t nt = 0;
    for (int b = 0; b < BATCHES; b++) {
        size_t n = 1 + rnd(m, MAXN);
        uint32_t src[MAXN * 2], dst[MAXN];
        kvf_move mv[MAXN];
        int kind = (int)rnd(m, 5);
        kvf_status st;
        kvf_ticket t = {0};
        bool want_ticket = rnd(m, 2);
        if (kind == 4) { /* copy: sources and destinations disjoint */
            n = n > HALF / 2 ? HALF / 2 : n;
            pick(m, src, 2 * n, HALF);
            for (size_t i = 0; i < n; i++) {
                mv[i] = (kvf_move){base + src[i], base + src[n + i], 0};
                m->prim[src[n + i]] = m->prim[src[i]];
            }
            st = kvf_copy(engine, mv, n, want_ticket ? &t : NULL);
        } else {
            bool file = kind & 1, off = kind < 2;
            uint32_t range = file ? KEYS / 2 : HALF;
            pick(m, dst, n, off ? range : HALF);
            for (size_t i = 0; i < n; i++) {
                /* sources with content: onboards of empty places are tested
                 * elsewhere */
                uint64_t tag = 0;
                uint32_t s = 0;
                for (int tries = 0; tries < 64 && !tag; tries++) {
                    s = (uint32_t)rnd(m, off ? HALF : range);
                    tag = off ? m->prim[s] : file ? m->file[s] : m->sec[s];
                }
                if (!tag) { /* nothing stored yet: store something */
                    n = i;
                    break;
                }
                src[i] = s;
                if (off) {
                    mv[i] = test_move(file ? KVF_TIER_DISK : KVF_TIER_HOST, true, base + s,
                                      file ? kbase + dst[i] : base + dst[i], 0);
                    (file ? m->file : m->sec)[dst[i]] = tag;
                } else {
                    mv[i] = test_move(file ? KVF_TIER_DISK : KVF_TIER_HOST, false,
                                      file ? kbase + s : base + s, base + dst[i], 0);
                    m->prim[dst[i]] = tag;
                }
            }
            if (n == 0)
                continue;
            st = off ? kvf_offload(engine, file ? KVF_TIER_DISK : KVF_TIER_HOST, mv, n,
                                   want_ticket ? &t : NULL)
                     : kvf_onboard(engine, file ? KVF_TIER_DISK : KVF_TIER_HOST, mv, n,
                                   want_ticket ? &t : NULL);
        }
        if (st != KVF_OK) {
            fprintf(stderr, "thread %d batch %d: %s\n", m->id, b, kvf_last_error());
            m->failures++;
            break;
        }
        if (want_ticket)
            tickets[nt++] = t;
        /* now and then, refill a primary slot the way compute would: only
         * once nothing queued touches it */
        if (rnd(m, 40) == 0) {
            for (size_t i = 0; i < nt; i++)
                if (kvf_wait(engine, tickets[i], NULL) != KVF_OK)
                    m->failures++;
            nt = 0;
            /* fire-and-forget batches too: wait for this thread's share */
            kvf_sync_stream(engine, NULL);
            uint32_t s = (uint32_t)rnd(m, HALF);
            m->prim[s] = m->next_tag++;
            fill(base + s, m->prim[s]);
        }
    }
    for (size_t i = 0; i < nt; i++)
        if (kvf_wait(engine, tickets[i], NULL) != KVF_OK) {
            fprintf(stderr, "thread %d: a batch failed: %s\n", m->id, kvf_last_error());
            m->failures++;
        }
    free(tickets);
    return NULL;
}

int main(void)
{
    char dir[512];
    CHECK(test_tmpdir(dir, sizeof dir) == 0);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 4;
    cfg.file.dir = dir;
    cfg.file.fsync = KVF_FSYNC_NONE;
    CHECK_STATUS(kvf_engine_create(&cfg, &engine), KVF_OK);
    for (uint32_t p = 0; p < 2; p++) {
        kvf_pool_desc d = {KVF_MEMORY_HOST, NULL, 0, SLOTS};
        CHECK_STATUS(kvf_engine_add_pool(engine, &G[p], &d, &d, NULL), KVF_OK);
        CHECK_STATUS(kvf_geometry_block_bytes(&G[p], &bytes[p]), KVF_OK);
    }
    model m[2];
    memset(m, 0, sizeof m);
    for (int t = 0; t < 2; t++) {
        m[t].id = t;
        m[t].rng = 0x9e3779b97f4a7c15ull * (t + 1);
        m[t].next_tag = 1000 * (t + 1);
        for (uint32_t s = 0; s < HALF; s++) {
            m[t].prim[s] = m[t].next_tag++;
            fill(t * HALF + s, m[t].prim[s]);
        }
    }
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        CHECK(pthread_create(&th[t], NULL, run, &m[t]) == 0);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    CHECK_STATUS(kvf_sync_stream(engine, NULL), KVF_OK);
    CHECK(m[0].failures == 0 && m[1].failures == 0);
    long bad = 0;
    for (int t = 0; t < 2; t++)
        for (uint32_t s = 0; s < HALF; s++) {
            if (!holds(KVF_LEVEL_PRIMARY, t * HALF + s, m[t].prim[s])) {
                fprintf(stderr, "thread %d primary slot %u: wrong bytes\n", t, s);
                bad++;
            }
            if (m[t].sec[s] && !holds(KVF_LEVEL_SECONDARY, t * HALF + s, m[t].sec[s])) {
                fprintf(stderr, "thread %d secondary slot %u: wrong bytes\n", t, s);
                bad++;
            }
        }
    /* every file, read back through the engine */
    for (int t = 0; t < 2; t++)
        for (uint32_t k = 0; k < KEYS / 2; k++) {
            if (!m[t].file[k])
                continue;
            kvf_move mv = FROM_KEY(0x51000 + (uint64_t)t * (KEYS / 2) + k, 0);
            kvf_ticket tk;
            CHECK_STATUS(kvf_onboard(engine, KVF_TIER_DISK, &mv, 1, &tk), KVF_OK);
            CHECK_STATUS(kvf_wait(engine, tk, NULL), KVF_OK);
            if (!holds(KVF_LEVEL_PRIMARY, 0, m[t].file[k])) {
                fprintf(stderr, "thread %d file %u: wrong bytes\n", t, k);
                bad++;
            }
        }
    kvf_engine_destroy(engine);
    test_rmtree(dir);
    CHECK(bad == 0);
    printf("stress: %d batches from 2 threads over 4 workers, every byte checked\n", 2 * BATCHES);
    return 0;
}
