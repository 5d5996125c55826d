/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Waits of every kind racing on the same tickets (test_engine_waits,
 * test_cache_waits): one racer thread per kind of wait goes through the
 * rounds in order, each round a ticket the main thread submitted (at
 * most RW_IN_FLIGHT rounds ahead of the slowest racer). A racer's answer
 * must be its round's own status, or one that says another thread has
 * the ticket (the test's `elsewhere`); exactly one racer retires each
 * ticket with its status. The program supplies the waits (rw_ops).
 */
#ifndef KVF_RACING_WAITS_H
#define KVF_RACING_WAITS_H

#include "testutil.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define RW_IN_FLIGHT 3

typedef enum rw_kind {
    RW_WAIT,
    RW_WAIT_ERRORS,
    RW_POLL,
    RW_POLL_ERRORS,
    RW_POOL_A, /* the first pool the ticket moves */
    RW_POOL_B, /* another */
    RW_STREAM_POOL_A,
    RW_STREAM_POOL_B,
    RW_KINDS
} rw_kind;

static inline bool rw_retires(rw_kind k)
{
    return k <= RW_POLL_ERRORS;
}

static inline bool rw_polls(rw_kind k)
{
    return k == RW_POLL || k == RW_POLL_ERRORS;
}

static inline bool rw_with_errors(rw_kind k)
{
    return k == RW_WAIT_ERRORS || k == RW_POLL_ERRORS;
}

typedef struct rw_round {
    _Atomic uint64_t ticket; /* 0 until submitted */
    kvf_status want;
    atomic_int retired; /* racers that got the round's own result */
    atomic_int finished;
} rw_round;

typedef struct rw_ops {
    /* the wait of kind k on ticket id; a retiring kind fills per[0..n)
     * and, for the _errors kinds, *n_errors */
    kvf_status (*wait)(void *ctx, rw_kind k, uint64_t id, kvf_status *per, size_t *n_errors);
    bool (*elsewhere)(kvf_status st); /* another thread has the ticket */
    const char *names[RW_KINDS];
} rw_ops;

typedef struct rw_race {
    const rw_ops *ops;
    void *ctx;
    size_t n; /* moves (blocks) per ticket */
    int rounds;
    rw_round *round;
    atomic_int failures;
    pthread_t th[RW_KINDS];
    struct rw_racer {
        struct rw_race *race;
        rw_kind kind;
    } racer[RW_KINDS];
} rw_race;

static inline void rw_fail(rw_race *x, int r, rw_kind k, kvf_status got)
{
    atomic_fetch_add(&x->failures, 1);
    fprintf(stderr, "round %d: %s: got %d (%s), want %d; last error: %s\n", r, x->ops->names[k],
            got, kvf_status_str(got), x->round[r].want, kvf_last_error());
}

static inline void rw_one(rw_race *x, int r, rw_kind k)
{
    kvf_status want = x->round[r].want;
    kvf_status *per = calloc(x->n, sizeof *per);
    size_t n_errors = 99;
    kvf_status st;
    /* a poll goes on until the ticket is retired, here or elsewhere */
    while ((st = x->ops->wait(x->ctx, k, atomic_load(&x->round[r].ticket), per, &n_errors)) ==
               KVF_INPROGRESS ||
           (rw_polls(k) && st == KVF_ERR_STATE))
        sched_yield();
    if (x->ops->elsewhere(st)) {
        /* told so: the result went to another racer */
    } else if (st != want) {
        rw_fail(x, r, k, st);
    } else if (rw_retires(k)) {
        atomic_fetch_add(&x->round[r].retired, 1);
        for (size_t i = 0; i < x->n; i++)
            if (per[i] != want)
                rw_fail(x, r, k, per[i]);
        if (rw_with_errors(k) && n_errors != (want == KVF_OK ? 0 : x->n)) {
            atomic_fetch_add(&x->failures, 1);
            fprintf(stderr, "round %d: %s: %zu errors\n", r, x->ops->names[k], n_errors);
        }
    }
    free(per);
}

static inline void *rw_racer_main(void *p)
{
    struct rw_racer *a = p;
    rw_race *x = a->race;
    for (int r = 0; r < x->rounds; r++) {
        while (atomic_load(&x->round[r].ticket) == 0)
            sched_yield();
        rw_one(x, r, a->kind);
        atomic_fetch_add(&x->round[r].finished, 1);
    }
    return NULL;
}

static inline int rw_start(rw_race *x, const rw_ops *ops, void *ctx, size_t n, int rounds)
{
    memset(x, 0, sizeof *x);
    x->ops = ops;
    x->ctx = ctx;
    x->n = n;
    x->rounds = rounds;
    x->round = calloc((size_t)rounds, sizeof *x->round);
    REQUIRE(x->round);
    for (int k = 0; k < RW_KINDS; k++) {
        x->racer[k] = (struct rw_racer){x, (rw_kind)k};
        REQUIRE(pthread_create(&x->th[k], NULL, rw_racer_main, &x->racer[k]) == 0);
    }
    return 0;
}

/* Round r may be submitted: the racers are close enough behind. */
static inline void rw_room(rw_race *x, int r)
{
    while (r >= RW_IN_FLIGHT && atomic_load(&x->round[r - RW_IN_FLIGHT].finished) < RW_KINDS)
        sched_yield();
}

static inline void rw_publish(rw_race *x, int r, kvf_status want, uint64_t id)
{
    x->round[r].want = want;
    atomic_store(&x->round[r].ticket, id);
}

/* Joins the racers; the failures seen, each ticket retired once included. */
static inline int rw_finish(rw_race *x)
{
    for (int k = 0; k < RW_KINDS; k++)
        pthread_join(x->th[k], NULL);
    for (int r = 0; r < x->rounds; r++)
        if (atomic_load(&x->round[r].retired) != 1) {
            atomic_fetch_add(&x->failures, 1);
            fprintf(stderr, "round %d: retired %d times\n", r, atomic_load(&x->round[r].retired));
        }
    free(x->round);
    return atomic_load(&x->failures);
}

#endif /* KVF_RACING_WAITS_H */
