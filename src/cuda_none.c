/*
 * The CUDA backend of a build without the CUDA toolkit: there is none.
 * kvf_engine_create with backend CUDA fails with KVF_ERR_NO_DEVICE, and AUTO
 * picks the host backend.
 */
#include "internal.h"

kvf_status kvf__cuda_backend_create(const kvf_engine_config *cfg, kvf__backend **backend_p)
{
    (void)cfg;
    (void)backend_p;
    return kvf__fail(KVF_ERR_NO_DEVICE, "built without CUDA");
}

void kvf__cuda_info(kvf_info *info)
{
    /* cuda_built, cuda_devices and cuda_runtime stay 0 */
    (void)info;
}
