/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend's copy kernel and its launch wrapper (cuda_kernels.cu),
 * shared with the backend's C files. Internal: nothing here is part of the API.
 */
#ifndef KVF_CUDA_KERNELS_H
#define KVF_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one unit of work of the copy kernel: one warp copies one tile
 * (32 lanes x 8 loads x 16 bytes) at a time. Tiles never cross a row. */
#define KVF_CUDA_TILE_BYTES 4096u

/* One 2-D copy as the kernel sees it: rows of `width` bytes. The copy's
 * tiles are numbered from `tile_begin` within the launch, row by row,
 * `tiles_per_row` per row; descriptors are in increasing tile_begin order
 * and each has at least one tile. 48 bytes. */
typedef struct kvf__cuda_desc {
    uint64_t dst;
    uint64_t src;
    uint64_t dpitch;
    uint64_t spitch;
    uint64_t tile_begin;
    uint32_t width;
    uint32_t tiles_per_row;
} kvf__cuda_desc;

/* Threads of one copy-kernel block. */
#define KVF_CUDA_COPY_THREADS 512u

/* Launches the copy kernel over descs[0..n) (device memory) holding
 * total_tiles tiles, on `grid` blocks. Returns the launch's error. */
__attribute__((visibility("hidden"))) cudaError_t
kvf__cuda_copy_launch(const kvf__cuda_desc *descs, uint32_t n, uint64_t total_tiles, uint32_t grid,
                      cudaStream_t stream);

/* Bytes of device memory one thread of the CRC-32C kernel checksums. */
#define KVF_CUDA_CRC_CHUNK 1024u

/* Queues on `stream` the raw CRC-32C register (start 0, no conditioning) of
 * n bytes of device memory at `data` into *out (4 bytes of device memory);
 * kvf__crc32c_from_raw turns it into the checksum. Returns the launch's
 * error. */
__attribute__((visibility("hidden"))) cudaError_t
kvf__cuda_crc32c_launch(const void *data, uint64_t n, uint32_t *out, cudaStream_t stream);

/* For the test and the benchmark (defined in cuda.c): the cudaStream_t of
 * a transfer queue (0 offload, 1 onboard). The path a queue's last batch
 * took: kvf__cuda_last_path (cuda_paths.h). */
struct kvf__backend;
__attribute__((visibility("hidden"))) void *kvf__cuda_queue_stream(struct kvf__backend *b,
                                                                   int queue);

#ifdef __cplusplus
}
#endif

#endif /* KVF_CUDA_KERNELS_H */
