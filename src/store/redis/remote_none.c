/* SPDX-License-Identifier: Apache-2.0 */
/* The remote tier in a build without hiredis: every call says so. */
#include "remote.h"
#include "status.h"

#include <stdio.h>

#define NO_CLIENT                                                                                  \
    "remote tier: kvferry was built without hiredis (install libhiredis-dev and rebuild)"

int kvf__remote_built(void)
{
    return 0;
}

kvf_status kvf__remote_open(const kvf__remote_config *cfg, kvf__remote **remote_p)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

void kvf__remote_close(kvf__remote *r) {}

kvf_status kvf__remote_put_batch_until(kvf__remote *r, const kvf__remote_put *blocks, size_t n,
                                       uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__remote_get_batch_until(kvf__remote *r, kvf__remote_get *blocks, size_t n,
                                       uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__remote_exists_batch_until(kvf__remote *r, const uint64_t *keys, size_t n,
                                          uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__remote_delete_batch_until(kvf__remote *r, const uint64_t *keys, size_t n,
                                          uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__remote_ping(kvf__remote *r)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__remote_probe(const char *url, uint32_t timeout_ms, char *detail, size_t cap)
{
    kvf_status st = kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
    if (detail && cap)
        snprintf(detail, cap, "%s", kvf_last_error());
    return st;
}
