/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend's copy paths by name, in the order AUTO tries them: the
 * first whose rule takes a batch moves it, and the last takes every batch.
 * X(ID, name): path `name` lives in cuda_path_<name>.c, which defines
 * kvf__cuda_<name>_fits, _submit and _fini (cuda_private.h says what each
 * does); everything else (the path's number, its name in KVF_CUDA_COPY, in
 * logs and in the benchmark, the dispatch table) is made from this list.
 * Adding a path: its file (named in KVF_CUDA_SOURCES, as every source is)
 * and its line here. Internal: nothing here is part of the API; the tests
 * and the benchmark read it.
 */
#ifndef KVF_CUDA_PATHS_H
#define KVF_CUDA_PATHS_H

#define KVF_CUDA_PATHS(X) X(STAGED, staged) X(KERNEL, kernel) X(DMA, dma)

/* A path's number: what kvf__cuda_last_path returns; NONE before any batch,
 * and, as a forced path, AUTO's choice. */
typedef enum kvf__cuda_path {
    KVF__CUDA_PATH_NONE = 0,
#define KVF__CUDA_PATH_ENUM(ID, name) KVF__CUDA_PATH_##ID,
    KVF_CUDA_PATHS(KVF__CUDA_PATH_ENUM)
#undef KVF__CUDA_PATH_ENUM
        KVF__CUDA_PATH_END /* one past the last path */
} kvf__cuda_path;

#ifdef __cplusplus
extern "C" {
#endif

struct kvf__backend;

/* A path's name ("staged", "kernel", "dma"), "auto" for NONE, "?" out of
 * range. */
__attribute__((visibility("hidden"))) const char *kvf__cuda_path_name(int path);

/* For the tests and the benchmark (cuda.c): the path the last copy_async on
 * a transfer queue (0 offload, 1 onboard) took; NONE before any. */
__attribute__((visibility("hidden"))) int kvf__cuda_last_path(struct kvf__backend *b, int queue);

#ifdef __cplusplus
}
#endif

#endif /* KVF_CUDA_PATHS_H */
