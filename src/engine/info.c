/* SPDX-License-Identifier: Apache-2.0 */
/* What this build and this machine offer. */
#include "backend.h"
#include "gds.h"
#include "sized.h"
#include "status.h"
#include "store.h"

#include <stddef.h>
#include <stdio.h>
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
    /* a caller built against an older header passes a shorter struct: it
     * gets the fields it knows */
    if (!info || !kvf__sized_ok(info, offsetof(kvf_info, remote_built), SIZE_MAX))
        return kvf__fail(KVF_ERR_INVALID, "kvf_info_get: start from KVF_INFO_INIT");
    kvf_info full = KVF_INFO_INIT;
    kvf__cuda_info(&full);
    /* what an engine's GDS path would find: cuFile loaded, its driver
     * opened (and closed again unless an engine holds it) */
    kvf__gds_probe p;
    if (kvf__gds_acquire(KVF_GDS_COMPAT_AUTO, &p) == KVF_OK)
        kvf__gds_release();
    kvf__clear_error();
    full.gds_state = p.found;
    snprintf(full.gds_detail, sizeof full.gds_detail, "%s", p.detail);
    full.remote_built = kvf__store_remote_built();
#ifdef KVF_HAVE_URING
    full.uring_built = 1;
#endif
    kvf__sized_copy_out(info, &full, sizeof full);
    return KVF_OK;
}
