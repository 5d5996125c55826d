/*
 * The gather/scatter copy kernel of the CUDA backend. One launch copies a
 * batch of 2-D copies between any mix of device memory and mapped pinned
 * host memory (zero-copy over PCIe). Work is cut into tiles of at most
 * KVF_CUDA_TILE_BYTES within one row; every warp takes an equal, contiguous
 * range of tiles, finds its first copy by binary search and walks on from
 * there, so small and large copies balance without per-tile host work.
 */
#include "cuda_kernels.h"

#define WARPS_PER_BLOCK (KVF_CUDA_COPY_THREADS / 32u)
/* Loads each lane has in flight per tile: enough bytes in flight to cover
 * PCIe read latency from host memory (a warp moves a whole tile at once). */
#define UNROLL 8

/* Copies len bytes (len <= tile) with elements of type T where dst and src
 * share alignment to sizeof(T): a few head bytes, then T-sized elements,
 * then tail bytes. */
template <typename T>
__device__ __forceinline__ void copy_span(char *dst, const char *src, uint32_t len, uint32_t lane)
{
    const uint32_t mask = (uint32_t)sizeof(T) - 1u;
    uint32_t head = (uint32_t)((sizeof(T) - ((uintptr_t)dst & mask)) & mask);
    if (head > len)
        head = len;
    if (lane < head)
        dst[lane] = src[lane];
    const T *s = reinterpret_cast<const T *>(src + head);
    T *d = reinterpret_cast<T *>(dst + head);
    const uint32_t n = (len - head) / (uint32_t)sizeof(T);
    for (uint32_t base = 0; base < n; base += 32u * UNROLL) {
        T r[UNROLL];
#pragma unroll
        for (int i = 0; i < UNROLL; i++) {
            uint32_t k = base + lane + 32u * (uint32_t)i;
            if (k < n)
                r[i] = s[k];
        }
#pragma unroll
        for (int i = 0; i < UNROLL; i++) {
            uint32_t k = base + lane + 32u * (uint32_t)i;
            if (k < n)
                d[k] = r[i];
        }
    }
    for (uint32_t i = head + n * (uint32_t)sizeof(T) + lane; i < len; i += 32u)
        dst[i] = src[i];
}

__device__ __forceinline__ void copy_tile(char *dst, const char *src, uint32_t len, uint32_t lane)
{
    const uintptr_t a = (uintptr_t)dst, b = (uintptr_t)src;
    /* the widest element both pointers can be aligned to together */
    const uintptr_t x = (a ^ b) | 16u;
    const uintptr_t common = x & (~x + 1u);
    if (common >= 16u)
        copy_span<uint4>(dst, src, len, lane);
    else if (common == 8u)
        copy_span<uint2>(dst, src, len, lane);
    else if (common == 4u)
        copy_span<uint32_t>(dst, src, len, lane);
    else if (common == 2u)
        copy_span<uint16_t>(dst, src, len, lane);
    else
        copy_span<uint8_t>(dst, src, len, lane);
}

__global__ void __launch_bounds__(KVF_CUDA_COPY_THREADS)
    kvf_copy_kernel(const kvf__cuda_desc *__restrict__ descs, uint32_t n, uint64_t total_tiles)
{
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t warp = (uint64_t)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / 32u;
    const uint64_t nwarps = (uint64_t)gridDim.x * WARPS_PER_BLOCK;
    uint64_t t = total_tiles * warp / nwarps;
    const uint64_t t_end = total_tiles * (warp + 1u) / nwarps;
    if (t >= t_end)
        return;

    /* the last copy whose first tile is <= t */
    uint32_t lo = 0, hi = n - 1u;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1u) / 2u;
        if (descs[mid].tile_begin <= t)
            lo = mid;
        else
            hi = mid - 1u;
    }
    uint32_t i = lo;
    kvf__cuda_desc c = descs[i];
    uint64_t next = i + 1u < n ? descs[i + 1u].tile_begin : total_tiles;

    for (; t < t_end; t++) {
        while (t >= next) {
            i++;
            c = descs[i];
            next = i + 1u < n ? descs[i + 1u].tile_begin : total_tiles;
        }
        const uint64_t local = t - c.tile_begin;
        const uint64_t row = local / c.tiles_per_row;
        const uint32_t col = (uint32_t)(local - row * c.tiles_per_row);
        const uint32_t off = col * KVF_CUDA_TILE_BYTES;
        const uint32_t rest = c.width - off;
        const uint32_t len = rest < KVF_CUDA_TILE_BYTES ? rest : KVF_CUDA_TILE_BYTES;
        char *dst = reinterpret_cast<char *>(c.dst + row * c.dpitch + off);
        const char *src = reinterpret_cast<const char *>(c.src + row * c.spitch + off);
        copy_tile(dst, src, len, lane);
    }
}

extern "C" cudaError_t kvf__cuda_copy_launch(const kvf__cuda_desc *descs, uint32_t n,
                                             uint64_t total_tiles, uint32_t grid,
                                             cudaStream_t stream)
{
    if (n == 0 || total_tiles == 0)
        return cudaSuccess;
    kvf_copy_kernel<<<grid, KVF_CUDA_COPY_THREADS, 0, stream>>>(descs, n, total_tiles);
    return cudaGetLastError();
}
