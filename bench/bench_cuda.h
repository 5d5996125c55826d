/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers shared by the CUDA benchmark programs (cuda_paths.c, latency.c):
 * a check that ends the program on any CUDA error, and a microsecond clock.
 */
#ifndef KVF_BENCH_CUDA_H
#define KVF_BENCH_CUDA_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(expr)                                                                                   \
    do {                                                                                           \
        cudaError_t ce_ = (expr);                                                                  \
        if (ce_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                          \
                    cudaGetErrorString(ce_));                                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline double bench_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#endif
