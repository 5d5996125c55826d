/* SPDX-License-Identifier: Apache-2.0 */
/* cudaError_t to kvf_status, once, at the call that failed (the CUDA_*
 * macros of cuda_private.h). */
#include "cuda_private.h"

#include <dlfcn.h>

/* cudaGetErrorString says "CUDA driver version is insufficient for CUDA
 * runtime version" also where there is no driver at all (no libcuda): the
 * case a user meets on a machine without an NVIDIA GPU. */
const char *kvf__cuda_error_str(cudaError_t err)
{
    if (err == cudaErrorInsufficientDriver) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
        if (!h)
            h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!h)
            return "no NVIDIA driver (libcuda.so.1 not found)";
        dlclose(h);
        return "the NVIDIA driver is older than this build's CUDA runtime";
    }
    if (err == cudaErrorNoDevice)
        return "no NVIDIA GPU (the driver found none)";
    return cudaGetErrorString(err);
}

kvf_status kvf__cuda_fail(cudaError_t err, const char *expr, const char *file, int line)
{
    (void)cudaGetLastError(); /* clear the sticky error */
    int name_len = 0;
    while (expr[name_len] && expr[name_len] != '(')
        name_len++;
    kvf_status st = err == cudaErrorMemoryAllocation ? KVF_ERR_NOMEM : KVF_ERR_DEVICE;
    return kvf__fail(st, "cuda: %.*s: %s (%s:%d)", name_len, expr, kvf__cuda_error_str(err), file,
                     line);
}

void kvf__cuda_warn(cudaError_t err, const char *expr, const char *file, int line)
{
    (void)cudaGetLastError();
    int name_len = 0;
    while (expr[name_len] && expr[name_len] != '(')
        name_len++;
    KVF_LOG(KVF_LOG_WARN, "cuda: %.*s: %s (%s:%d)", name_len, expr, kvf__cuda_error_str(err), file,
            line);
}
