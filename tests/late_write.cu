/* SPDX-License-Identifier: Apache-2.0 */
/* Kernels that hold a stream (testutil_cuda.h): one that writes late, the
 * GPU tests' stand-in for a forward pass still writing the blocks that an
 * offload is ordered after, and the gate, which holds a stream until the
 * host opens it. */
#include "cuda_kernels.h"

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

/* Launches each kernel above, and the library's copy kernel, once with
 * (next to) nothing to do, on a stream of its own, and waits for them. A
 * kernel's first launch in a process may wait for the kernels running:
 * under compute-sanitizer memcheck the process's first gate timed out
 * (20 s) before the host got past the late writes and the offload queued
 * behind it, while every later gate held (the kernels had been launched
 * by then), so the kernels a gated test launches are launched here first
 * (test_gate_hold). */
extern "C" cudaError_t test_kernels_load(void)
{
    cudaStream_t s;
    unsigned char *buf = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return e;
    /* buf: the open gate's flag, two bytes to copy, one descriptor */
    e = cudaMalloc((void **)&buf, 64 + sizeof(kvf__cuda_desc));
    kvf__cuda_desc d = {
        (uint64_t)(uintptr_t)(buf + 16), (uint64_t)(uintptr_t)(buf + 8), 0, 0, 0, 2, 1};
    if (e == cudaSuccess)
        e = cudaMemsetAsync(buf, 0xff, 64, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(buf + 64, &d, sizeof d, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) {
        gate_wait<<<1, 1, 0, s>>>((volatile unsigned int *)buf, 0);
        late_copy<<<1, 32, 0, s>>>(NULL, NULL, 0, 0);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = kvf__cuda_copy_launch((const kvf__cuda_desc *)(buf + 64), 1, 1, 1, s);
    cudaError_t e2 = cudaStreamSynchronize(s);
    if (e == cudaSuccess)
        e = e2;
    if (buf)
        cudaFree(buf);
    cudaStreamDestroy(s);
    return e;
}
