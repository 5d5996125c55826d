/* What this build and this machine offer. */
#include "internal.h"

#include <string.h>

const char *kvf_version(void)
{
#ifdef KVF_HAVE_CUDA
    return KVF_VERSION_STRING " (cuda)";
#else
    return KVF_VERSION_STRING " (host only)";
#endif
}

kvf_status kvf_info_get(kvf_info *info)
{
    kvf__clear_error();
    if (!info || info->struct_size < sizeof(kvf_info))
        return kvf__fail(KVF_ERR_INVALID, "kvf_info_get: start from KVF_INFO_INIT");
    memset((char *)info + sizeof info->struct_size, 0, sizeof *info - sizeof info->struct_size);
    kvf__cuda_info(info);
#ifdef KVF_HAVE_URING
    info->uring_built = 1;
#endif
    return KVF_OK;
}
