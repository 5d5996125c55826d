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
 * host's side of a call can outlast the spin. The gate is a one-thread
 * kernel (tests/late_write.cu) spinning on a flag in mapped host memory,
 * so it holds the stream on the GPU alone: a gate made of a CUDA host
 * function that blocked until opened made kvf_offload_after itself return
 * only when that gate timed out (seen on an H100), so it proved nothing
 * about kvferry. It opens by
 * itself after TEST_GATE_TIMEOUT_S seconds (a call that did wait for the
 * stream), and test_gate_open then returns false. Open it before waiting
 * for anything ordered after the stream; synchronize the stream before
 * test_gate_fini. */
#define TEST_GATE_TIMEOUT_S 20

typedef struct test_gate {
    volatile unsigned int *flag; /* mapped host memory the kernel reads */
    struct timespec held;
} test_gate;

/* tests/late_write.cu: queues on `stream` a one-thread kernel that spins
 * until *flag (device address of mapped host memory) is not 0 or
 * timeout_ns have passed. */
#ifdef __cplusplus
extern "C"
#endif
    cudaError_t
    test_gate_launch(volatile unsigned int *flag, unsigned long long timeout_ns,
                     cudaStream_t stream);

/* tests/late_write.cu: launches the test's kernels and the library's copy
 * kernel once (next to nothing to do) and waits for them. */
#ifdef __cplusplus
extern "C"
#endif
    cudaError_t
    test_kernels_load(void);

/* Holds `stream` at a gate. Every kernel a gated test launches has been
 * launched once before, at the process's first gate (test_kernels_load):
 * a kernel's first launch may wait for the kernels running, the gate
 * among them (under compute-sanitizer memcheck the process's first gate
 * timed out before the host got past what was queued behind it; every
 * later gate held). */
static inline cudaError_t test_gate_hold(test_gate *g, cudaStream_t stream)
{
    static bool loaded;
    void *host = NULL, *dev = NULL;
    cudaError_t e = cudaSuccess;
    if (!loaded && (e = test_kernels_load()) != cudaSuccess)
        return e;
    loaded = true;
    e = cudaHostAlloc(&host, sizeof(unsigned int), cudaHostAllocMapped);
    if (e != cudaSuccess)
        return e;
    g->flag = (volatile unsigned int *)host;
    *g->flag = 0;
    e = cudaHostGetDevicePointer(&dev, host, 0);
    if (e != cudaSuccess)
        return e;
    clock_gettime(CLOCK_MONOTONIC, &g->held);
    return test_gate_launch((volatile unsigned int *)dev, TEST_GATE_TIMEOUT_S * 1000000000ull,
                            stream);
}

/* Seconds since the gate was held (to say where a failing test's time
 * went). */
static inline double test_gate_held_s(const test_gate *g)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - g->held.tv_sec) + (double)(now.tv_nsec - g->held.tv_nsec) / 1e9;
}

/* Opens the gate; false when it had opened by itself (timed out). */
static inline bool test_gate_open(test_gate *g)
{
    *g->flag = 1;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec - g->held.tv_sec < TEST_GATE_TIMEOUT_S;
}

/* After the stream it held has been synchronized. */
static inline void test_gate_fini(test_gate *g)
{
    cudaFreeHost((void *)g->flag);
    g->flag = NULL;
}

/* tests/late_write.cu: queues on `stream` a kernel that spins about
 * spin_ms, then copies n bytes of device memory from src to dst. */
#ifdef __cplusplus
extern "C"
#endif
    cudaError_t
    test_late_copy(void *dst, const void *src, size_t n, double spin_ms, cudaStream_t stream);

#endif
