/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the GPU tests (they build only with CUDA). */
#ifndef KVF_TESTUTIL_CUDA_H
#define KVF_TESTUTIL_CUDA_H

#include "testutil.h"

#include <cuda_runtime.h>

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

/* tests/late_write.cu: queues on `stream` a kernel that spins about
 * spin_ms, then copies n bytes of device memory from src to dst. */
#ifdef __cplusplus
extern "C"
#endif
    cudaError_t
    test_late_copy(void *dst, const void *src, size_t n, double spin_ms, cudaStream_t stream);

#endif
