/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The gather/scatter copy kernel of the CUDA backend. One launch copies a
 * batch of 2-D copies between any mix of device memory and mapped pinned
 * host memory (zero-copy over PCIe). Work is cut into tiles of at most
 * KVF_CUDA_TILE_BYTES within one row; every warp takes an equal, contiguous
 * range of tiles, finds its first copy by a warp-wide search and walks on from
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

/* The last copy whose first tile is <= t (the whole warp calls it with
 * the same t). The warp reads 32 evenly spaced descriptors at once and
 * narrows to the span between two of them: a round of loads per factor of
 * 32 copies. A binary search waits for one load per halving, eight in a
 * row for a call of 256 copies, and every warp does it at every launch's
 * start, before its first copy is read. */
__device__ __forceinline__ uint32_t first_copy(const kvf__cuda_desc *__restrict__ descs, uint32_t n,
                                               uint64_t t, uint32_t lane)
{
    uint32_t lo = 0, end = n; /* descs[lo].tile_begin <= t: descs[0] begins at 0 */
    while (end - lo > 1u) {
        const uint32_t step = (end - lo + 31u) / 32u;
        const uint32_t idx = lo + lane * step;
        /* tile_begin increases: the lanes that hold are a prefix, lane 0 among them */
        const uint32_t below = __ballot_sync(0xffffffffu, idx < end && descs[idx].tile_begin <= t);
        const uint32_t last = 31u - (uint32_t)__clz(below);
        lo += last * step;
        end = lo + step < end ? lo + step : end;
    }
    return lo;
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

    uint32_t i = first_copy(descs, n, t, lane);
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

/* ---- CRC-32C of device memory ------------------------------------------------
 *
 * Every thread runs the raw CRC register (state 0, no conditioning) over
 * its own KVF_CUDA_CRC_CHUNK bytes with slicing-by-8 tables in shared
 * memory, then advances it over the bytes after its chunk (multiplication
 * by x^(8k) modulo the polynomial). The raw CRC is linear, so the CRC of
 * the whole range is the XOR of these terms: warps fold theirs with
 * shuffles and one lane per warp adds it to *out with atomicXor. The host
 * applies the standard conditioning (kvf__crc32c_from_raw).
 */

#define CRC_POLY 0x82F63B78u
#define CRC_THREADS 256u

/* a * b modulo the polynomial, reflected (bit 31 is x^0). */
__device__ __forceinline__ uint32_t crc_mulmod(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m)
            p ^= b;
        b = (b & 1u) ? (b >> 1) ^ CRC_POLY : b >> 1;
    }
    return p;
}

/* x^(8n) modulo the polynomial. */
__device__ uint32_t crc_x_pow_8n(uint64_t n)
{
    uint32_t result = 1u << 31, base = 1u << 23;
    while (n) {
        if (n & 1u)
            result = crc_mulmod(result, base);
        base = crc_mulmod(base, base);
        n >>= 1;
    }
    return result;
}

__global__ void __launch_bounds__(CRC_THREADS)
    kvf_crc32c_kernel(const unsigned char *p, uint64_t n, uint32_t *out)
{
    __shared__ uint32_t tab[8][256];
    for (uint32_t i = threadIdx.x; i < 256u; i += blockDim.x) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? (c >> 1) ^ CRC_POLY : c >> 1;
        tab[0][i] = c;
    }
    __syncthreads();
    for (int k = 1; k < 8; k++) {
        for (uint32_t i = threadIdx.x; i < 256u; i += blockDim.x) {
            uint32_t prev = tab[k - 1][i];
            tab[k][i] = (prev >> 8) ^ tab[0][prev & 0xffu];
        }
        __syncthreads();
    }

    const uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t begin = t * KVF_CUDA_CRC_CHUNK;
    uint32_t term = 0;
    if (begin < n) {
        const uint64_t end = begin + KVF_CUDA_CRC_CHUNK < n ? begin + KVF_CUDA_CRC_CHUNK : n;
        const unsigned char *q = p + begin, *qe = p + end;
        uint32_t s = 0;
        while (q < qe && ((uintptr_t)q & 7u))
            s = tab[0][(s ^ *q++) & 0xffu] ^ (s >> 8);
        for (; qe - q >= 8; q += 8) {
            const uint2 w = *reinterpret_cast<const uint2 *>(q);
            const uint32_t lo = w.x ^ s, hi = w.y;
            s = tab[7][lo & 0xffu] ^ tab[6][(lo >> 8) & 0xffu] ^ tab[5][(lo >> 16) & 0xffu] ^
                tab[4][lo >> 24] ^ tab[3][hi & 0xffu] ^ tab[2][(hi >> 8) & 0xffu] ^
                tab[1][(hi >> 16) & 0xffu] ^ tab[0][hi >> 24];
        }
        while (q < qe)
            s = tab[0][(s ^ *q++) & 0xffu] ^ (s >> 8);
        term = end < n ? crc_mulmod(s, crc_x_pow_8n(n - end)) : s;
    }
    for (int off = 16; off > 0; off >>= 1)
        term ^= __shfl_xor_sync(0xffffffffu, term, off);
    if ((threadIdx.x & 31u) == 0 && term)
        atomicXor(out, term);
}

extern "C" cudaError_t kvf__cuda_crc32c_launch(const void *data, uint64_t n, uint32_t *out,
                                               cudaStream_t stream)
{
    cudaError_t err = cudaMemsetAsync(out, 0, sizeof *out, stream);
    if (err != cudaSuccess || n == 0)
        return err;
    const uint64_t threads = (n + KVF_CUDA_CRC_CHUNK - 1) / KVF_CUDA_CRC_CHUNK;
    const uint64_t grid = (threads + CRC_THREADS - 1) / CRC_THREADS;
    if (grid > 0x7fffffffu)
        return cudaErrorInvalidValue;
    kvf_crc32c_kernel<<<(unsigned)grid, CRC_THREADS, 0, stream>>>(
        static_cast<const unsigned char *>(data), n, out);
    return cudaGetLastError();
}
