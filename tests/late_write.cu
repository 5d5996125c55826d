/* SPDX-License-Identifier: Apache-2.0 */
/* Kernels that hold a stream (testutil_cuda.h): one that writes late, the
 * GPU tests' stand-in for a forward pass still writing the blocks that an
 * offload is ordered after, and the gate, which holds a stream until the
 * host opens it. */
#include <cuda_runtime.h>

#include <stddef.h>

/* Every thread spins until `cycles` of its SM's clock have passed, then
 * the grid copies n bytes from src to dst. */
__global__ void late_copy(unsigned char *dst, const unsigned char *src, size_t n, long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles)
        ;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i];
}

extern "C" cudaError_t test_late_copy(void *dst, const void *src, size_t n, double spin_ms,
                                      cudaStream_t stream)
{
    int dev = 0, khz = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
    if (e != cudaSuccess)
        return e;
    long long cycles = (long long)(spin_ms * (double)khz);
    late_copy<<<132, 256, 0, stream>>>((unsigned char *)dst, (const unsigned char *)src, n, cycles);
    return cudaGetLastError();
}

/* The gate: one thread reads the host's flag until it is set or timeout_ns
 * of the GPU's global timer have passed. */
__global__ void gate_wait(volatile unsigned int *flag, unsigned long long timeout_ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (*flag == 0 && t - t0 < timeout_ns);
}

extern "C" cudaError_t test_gate_launch(volatile unsigned int *flag, unsigned long long timeout_ns,
                                        cudaStream_t stream)
{
    gate_wait<<<1, 1, 0, stream>>>(flag, timeout_ns);
    return cudaGetLastError();
}
