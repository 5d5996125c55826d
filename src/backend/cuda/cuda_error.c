/* SPDX-License-Identifier: Apache-2.0 */
/* cudaError_t to kvf_status, once, at the call that failed (the CUDA_*
 * macros of cuda_private.h). */
#include "cuda_private.h"

kvf_status kvf__cuda_fail(cudaError_t err, const char *expr, const char *file, int line)
{
    (void)cudaGetLastError(); /* clear the sticky error */
    int name_len = 0;
    while (expr[name_len] && expr[name_len] != '(')
        name_len++;
    kvf_status st = err == cudaErrorMemoryAllocation ? KVF_ERR_NOMEM : KVF_ERR_DEVICE;
    return kvf__fail(st, "cuda: %.*s: %s (%s:%d)", name_len, expr, cudaGetErrorString(err), file,
                     line);
}

void kvf__cuda_warn(cudaError_t err, const char *expr, const char *file, int line)
{
    (void)cudaGetLastError();
    int name_len = 0;
    while (expr[name_len] && expr[name_len] != '(')
        name_len++;
    KVF_LOG(KVF_LOG_WARN, "cuda: %.*s: %s (%s:%d)", name_len, expr, cudaGetErrorString(err), file,
            line);
}
