/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the GPU tests (they build only with CUDA). */
#ifndef KVF_TESTUTIL_CUDA_H
#define KVF_TESTUTIL_CUDA_H

#include "testutil.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <time.h>

/* A CUDA call of the test itself (not of kvferry) must succeed. */
#define CUDA_OK(expr)                                                                              \
    do {                                                                                           \
        cudaError_t test_ce_ = (expr);                                                             \
        if (test_ce_ != cudaSuccess) {                                                             \
            TEST_FAIL_AT(__FILE__, __LINE__, "%s: %s", #expr, cudaGetErrorString(test_ce_));       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Whether CUDA sees a device here. */
static inline bool test_have_gpu(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

/* A gate on a stream: what is queued on the stream after test_gate_hold
 * waits until test_gate_open, so a test that checks that a call did not
 * wait for the stream finds the stream still busy however long the call
 * took. A spinning kernel alone is a race against the host: under parallel
 * tests (other processes copying, pinning and calling the driver) the
 * host's side of a call can outlast the spin. The gate holds a CUDA host
 * function; it opens by itself after TEST_GATE_TIMEOUT_S seconds (a call
 * that did wait for the stream), and test_gate_open then returns false.
 * Open it before waiting for anything ordered after the stream;
 * synchronize the stream before the gate goes. */
#define TEST_GATE_TIMEOUT_S 20

typedef struct test_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open, timed_out;
    struct timespec deadline;
} test_gate;

static void CUDART_CB test_gate_wait_(void *arg)
{
    test_gate *g = (test_gate *)arg;
    pthread_mutex_lock(&g->mu);
    while (!g->open && !g->timed_out)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &g->deadline) == ETIMEDOUT && !g->open)
            g->timed_out = true;
    pthread_mutex_unlock(&g->mu);
}

static inline cudaError_t test_gate_hold(test_gate *g, cudaStream_t stream)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = g->timed_out = false;
    clock_gettime(CLOCK_REALTIME, &g->deadline);
    g->deadline.tv_sec += TEST_GATE_TIMEOUT_S;
    return cudaLaunchHostFunc(stream, test_gate_wait_, g);
}

/* Opens the gate; false when it had opened by itself (timed out). */
static inline bool test_gate_open(test_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    bool in_time = !g->timed_out;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return in_time;
}

/* After the stream it held has been synchronized. */
static inline void test_gate_fini(test_gate *g)
{
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

/* tests/late_write.cu: queues on `stream` a kernel that spins about
 * spin_ms, then copies n bytes of device memory from src to dst. */
#ifdef __cplusplus
extern "C"
#endif
    cudaError_t
    test_late_copy(void *dst, const void *src, size_t n, double spin_ms, cudaStream_t stream);

#endif
