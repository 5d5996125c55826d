/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA backend of a build without the CUDA toolkit: never usable. */
#include "backend.h"
#include "status.h"

#include <stdio.h>

kvf_status kvf__cuda_backend_create(const kvf_engine_config *cfg, kvf__backend **backend_p)
{
    (void)cfg;
    (void)backend_p;
    return kvf__fail(KVF_ERR_NO_DEVICE, "built without CUDA");
}

void kvf__cuda_info(kvf_info *info)
{
    info->cuda_built = 0;
    info->cuda_devices = 0;
    info->cuda_runtime = 0;
    info->cufile_present = 0;
    info->device_name[0] = '\0';
    snprintf(info->cuda_error, sizeof info->cuda_error, "built without CUDA");
}
