/* SPDX-License-Identifier: Apache-2.0 */
/* Failures against a model: random offloads, onboards and copies over
 * primary and secondary slots, queued without waiting, while injected copy
 * failures hit about one copy in twelve. Every move's status is checked, in
 * queue order, against what the slots it read held: a read of a secondary
 * slot whose last write failed is KVF_ERR_LOST, never KVF_OK; a move is never
 * lost when what it read was good; and every slot whose content is known
 * holds exactly those bytes at the end. (A read of a primary slot whose
 * failed write had already completed is not checked by the engine, unless
 * the batch is a checked one: the caller owns primary slots. The model
 * takes either outcome there, and then knows nothing of what was copied.) */
#include "backend.h"
#include "testutil.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { SLOTS = 12, BATCHES = 4000, MAXN = 5, POOLS = 2 };

static const kvf_geometry G[POOLS] = {
    {2, 2, 2, 16, 32, KVF_DTYPE_FP16, KVF_ORDER_HEAD_MAJOR},
    {1, 1, 4, 16, 8, KVF_DTYPE_INT4, KVF_ORDER_TOKEN_MAJOR},
};
static size_t bytes[POOLS];
static kvf_engine *engine;

/* what a slot holds: a tag's bytes, bytes of a failed write, or bytes the
 * model cannot know */
enum { BAD = -1, UNKNOWN = -2 };

typedef struct slot_state {
    int64_t prim[SLOTS], sec[SLOTS]; /* tag > 0, BAD, UNKNOWN; sec 0: never written */
} slot_state;

typedef struct queued {
    int kind; /* 0 offload, 1 onboard, 2 copy */
    size_t n;
    kvf_move mv[MAXN];
    kvf_ticket t;
} queued;

static atomic_uint_fast64_t fail_rng = 0x2545f4914f6cdd1dull;
static kvf_status flaky_copy(const kvf__copy *c)
{
    (void)c;
    uint64_t x = atomic_fetch_add(&fail_rng, 0x9e3779b97f4a7c15ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return x % 12 == 0 ? KVF_ERR_IO : KVF_OK;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(uint64_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % n;
}

static uint8_t *slot_ptr(uint32_t p, kvf_level lv, uint32_t s)
{
    void *ptr = NULL;
    kvf_engine_slot_ptr(engine, p, lv, s, &ptr);
    return ptr;
}

static void fill(uint32_t s, int64_t tag)
{
    for (uint32_t p = 0; p < POOLS; p++)
        test_fill_random(slot_ptr(p, KVF_LEVEL_PRIMARY, s), bytes[p], (uint64_t)tag * 7 + p);
}

static bool holds(kvf_level lv, uint32_t s, int64_t tag)
{
    bool ok = true;
    for (uint32_t p = 0; p < POOLS && ok; p++) {
        uint8_t *want = malloc(bytes[p]);
        test_fill_random(want, bytes[p], (uint64_t)tag * 7 + p);
        ok = memcmp(want, slot_ptr(p, lv, s), bytes[p]) == 0;
        free(want);
    }
    return ok;
}

/* Picks n distinct slots. */
static void pick(uint32_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        bool again;
        do {
            out[i] = (uint32_t)rnd(SLOTS);
            again = false;
            for (size_t j = 0; j < i; j++)
                again |= out[j] == out[i];
        } while (again);
    }
}

typedef struct tally {
    long ok, lost, io, errors;
} tally;

/* Applies one waited batch to the model, checking each move's status. */
static void apply(slot_state *m, const queued *q, const kvf_status *per, tally *c)
{
    for (size_t i = 0; i < q->n; i++) {
        const kvf_move *mv = &q->mv[i];
        bool from_sec = q->kind == 1;
        int64_t src = from_sec ? m->sec[mv->src] : m->prim[mv->src];
        int64_t *dst = q->kind == 0 ? &m->sec[mv->dst] : &m->prim[mv->dst];
        kvf_status s = per[i];
        if (s == KVF_OK) {
            c->ok++;
            if (from_sec && src == BAD) {
                fprintf(stderr, "move %llu -> %llu (kind %d): ok, but it read a failed write\n",
                        (unsigned long long)mv->src, (unsigned long long)mv->dst, q->kind);
                c->errors++;
            }
            *dst = src == BAD ? UNKNOWN : src;
        } else if (s == KVF_ERR_LOST) {
            c->lost++;
            if (src != BAD) {
                fprintf(stderr, "move %llu -> %llu (kind %d): lost, but what it read was good\n",
                        (unsigned long long)mv->src, (unsigned long long)mv->dst, q->kind);
                c->errors++;
            }
            *dst = BAD;
        } else if (s == KVF_ERR_IO) {
            c->io++;
            *dst = BAD;
        } else {
            fprintf(stderr, "move %llu -> %llu (kind %d): unexpected %s\n",
                    (unsigned long long)mv->src, (unsigned long long)mv->dst, q->kind,
                    kvf_status_str(s));
            c->errors++;
            *dst = UNKNOWN;
        }
    }
}

static int drain(slot_state *m, queued *qs, size_t *nq, tally *c)
{
    for (size_t k = 0; k < *nq; k++) {
        kvf_status per[MAXN];
        kvf_status st = kvf_wait(engine, qs[k].t, per);
        CHECK(st == KVF_OK || st == KVF_ERR_LOST || st == KVF_ERR_IO);
        apply(m, &qs[k], per, c);
    }
    *nq = 0;
    return 0;
}

int main(void)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_HOST;
    cfg.threads = 3;
    CHECK_STATUS(kvf_engine_create(&cfg, &engine), KVF_OK);
    for (uint32_t p = 0; p < POOLS; p++) {
        kvf_pool_desc d = {KVF_MEMORY_HOST, NULL, 0, SLOTS};
        CHECK_STATUS(kvf_engine_add_pool(engine, &G[p], &d, &d, NULL), KVF_OK);
        CHECK_STATUS(kvf_geometry_block_bytes(&G[p], &bytes[p]), KVF_OK);
    }
    slot_state m;
    memset(&m, 0, sizeof m);
    int64_t next_tag = 1;
    for (uint32_t s = 0; s < SLOTS; s++) {
        m.prim[s] = next_tag++;
        fill(s, m.prim[s]);
    }
    queued *qs = malloc(64 * sizeof *qs);
    size_t nq = 0;
    tally c = {0};
    kvf__set_copy_hook(flaky_copy);
    for (int b = 0; b < BATCHES; b++) {
        queued *q = &qs[nq];
        q->kind = (int)rnd(3);
        q->n = 1 + rnd(q->kind == 2 ? MAXN / 2 : MAXN);
        uint32_t a[2 * MAXN];
        pick(a, 2 * q->n);
        size_t k = 0;
        for (size_t i = 0; i < q->n; i++) {
            /* onboards read only secondary slots written at least once
             * (never written ones are KVF_ERR_NOT_FOUND, tested elsewhere) */
            if (q->kind == 1 && m.sec[a[i]] == 0)
                continue;
            q->mv[k++] = (kvf_move){a[i], a[q->n + i], 0};
        }
        q->n = k;
        if (k == 0)
            continue;
        kvf_status st = q->kind == 0   ? kvf_offload(engine, KVF_TIER_HOST, q->mv, k, &q->t)
                        : q->kind == 1 ? kvf_onboard(engine, KVF_TIER_HOST, q->mv, k, &q->t)
                                       : kvf_copy(engine, q->mv, k, &q->t);
        CHECK_STATUS(st, KVF_OK);
        /* the model learns a secondary slot was written once it is queued */
        for (size_t i = 0; i < k && q->kind == 0; i++)
            if (m.sec[q->mv[i].dst] == 0)
                m.sec[q->mv[i].dst] = UNKNOWN;
        nq++;
        if (nq == 64 || rnd(50) == 0) {
            /* waited in queue order: the model runs them in that order */
            if (drain(&m, qs, &nq, &c))
                return 1;
            if (rnd(3) == 0) {
                /* compute rewrites a primary slot, with nothing queued on it */
                uint32_t s = (uint32_t)rnd(SLOTS);
                m.prim[s] = next_tag++;
                fill(s, m.prim[s]);
            }
        }
    }
    if (drain(&m, qs, &nq, &c))
        return 1;
    kvf__set_copy_hook(NULL);
    long wrong = 0;
    for (uint32_t s = 0; s < SLOTS; s++) {
        if (m.prim[s] > 0 && !holds(KVF_LEVEL_PRIMARY, s, m.prim[s])) {
            fprintf(stderr, "primary slot %u: not the bytes of tag %lld\n", s,
                    (long long)m.prim[s]);
            wrong++;
        }
        if (m.sec[s] > 0 && !holds(KVF_LEVEL_SECONDARY, s, m.sec[s])) {
            fprintf(stderr, "secondary slot %u: not the bytes of tag %lld\n", s,
                    (long long)m.sec[s]);
            wrong++;
        }
    }
    kvf_engine_destroy(engine);
    free(qs);
    printf("poison: %ld moves ok, %ld lost, %ld failed (injected); %ld wrong statuses, %ld "
           "wrong slots\n",
           c.ok, c.lost, c.io, c.errors, wrong);
    CHECK(c.errors == 0 && wrong == 0);
    CHECK(c.lost > 0 && c.io > 0 && c.ok > c.io);
    return 0;
}
