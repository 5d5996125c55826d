/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A gate that holds a library's thread where a test's hook runs (a file
 * read, a ranged read of a remote value) until the test releases it, and
 * tells the test when something is held there: for tests of what a
 * caller sees while later reads are still outstanding. Header-only.
 */
#ifndef KVF_TEST_HOLD_GATE_H
#define KVF_TEST_HOLD_GATE_H

#include "common.h"

#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

typedef struct hold_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int held;     /* threads waiting at the gate */
    bool release; /* open: nothing waits */
} hold_gate;

#define HOLD_GATE_INIT                                                                             \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, true                               \
    }

/* With g->mu held: waits there until the gate opens. */
static inline void hold_gate_wait(hold_gate *g)
{
    g->held++;
    pthread_cond_broadcast(&g->cv);
    while (!g->release)
        pthread_cond_wait(&g->cv, &g->mu);
    g->held--;
}

/* With g->mu held: the gate opened, its waiters woken. */
static inline void hold_gate_release(hold_gate *g)
{
    g->release = true;
    pthread_cond_broadcast(&g->cv);
}

/* Waits (up to 10 s) until a thread is held at the gate. */
static inline bool hold_gate_holding(hold_gate *g)
{
    uint64_t until = kvf__now_ns() + 10000000000ull;
    pthread_mutex_lock(&g->mu);
    while (g->held == 0 && kvf__now_ns() < until) {
        pthread_mutex_unlock(&g->mu);
        usleep(1000);
        pthread_mutex_lock(&g->mu);
    }
    bool held = g->held > 0;
    pthread_mutex_unlock(&g->mu);
    return held;
}

#endif /* KVF_TEST_HOLD_GATE_H */
