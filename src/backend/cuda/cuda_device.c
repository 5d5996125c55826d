/* SPDX-License-Identifier: Apache-2.0 */
/* The device guard: every entry point of the backend runs on its device
 * and leaves the calling thread on the device it was on. */
#include "cuda_private.h"

kvf_status kvf__cuda_dev_enter(const cuda_backend *b, dev_guard *g)
{
    g->prev = -1;
    int cur = -1;
    CUDA_RET(cudaGetDevice(&cur));
    if (cur != b->device) {
        CUDA_RET(cudaSetDevice(b->device));
        g->prev = cur;
    }
    return KVF_OK;
}

void kvf__cuda_dev_leave(const dev_guard *g)
{
    if (g->prev >= 0)
        CUDA_IGNORE(cudaSetDevice(g->prev));
}
