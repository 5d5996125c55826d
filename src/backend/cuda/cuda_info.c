/* SPDX-License-Identifier: Apache-2.0 */
/* What kvf_info reports of CUDA on this machine. */
#include "cuda_private.h"

#include <dlfcn.h>
#include <stdio.h>

void kvf__cuda_info(kvf_info *info)
{
    info->cuda_built = 1;
    info->cuda_runtime = CUDART_VERSION;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        info->cuda_devices = 0;
        snprintf(info->cuda_error, sizeof info->cuda_error, "%s", kvf__cuda_error_str(e));
    } else {
        info->cuda_devices = count;
        if (count == 0) {
            snprintf(info->cuda_error, sizeof info->cuda_error, "no CUDA device");
        } else {
            struct cudaDeviceProp p;
            e = cudaGetDeviceProperties(&p, 0);
            if (e == cudaSuccess) {
                snprintf(info->device_name, sizeof info->device_name, "%.127s", p.name);
            } else {
                (void)cudaGetLastError();
                snprintf(info->cuda_error, sizeof info->cuda_error, "%s", kvf__cuda_error_str(e));
            }
        }
    }
    void *h = dlopen("libcufile.so.0", RTLD_LAZY | RTLD_LOCAL);
    info->cufile_present = h != NULL;
    if (h)
        dlclose(h);
}
