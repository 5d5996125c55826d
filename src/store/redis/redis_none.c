/* SPDX-License-Identifier: Apache-2.0 */
/* The remote tier in a build without hiredis: every call says so. */
#include "redis.h"
#include "status.h"

#include <stdio.h>

#define NO_CLIENT "redis: this build has no Redis client (hiredis)"

int kvf__redis_built(void)
{
    return 0;
}

void kvf__redis_describe(char *line, size_t cap)
{
    snprintf(line, cap, "not built");
}

kvf_status kvf__redis_open(const kvf__redis_config *cfg, kvf__redis **remote_p)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

void kvf__redis_close(kvf__redis *r) {}

kvf_status kvf__redis_put_batch_until(kvf__redis *r, const kvf__redis_put *blocks, size_t n,
                                      uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__redis_get_batch_until(kvf__redis *r, kvf__redis_get *blocks, size_t n,
                                      uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__redis_range_batch_until(kvf__redis *r, kvf__redis_range *ranges, size_t n,
                                        uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__redis_exists_batch_until(kvf__redis *r, const kvf_key *keys, size_t n,
                                         uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__redis_delete_batch_until(kvf__redis *r, const kvf_key *keys, size_t n,
                                         uint64_t deadline_ns, kvf_status *status)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__redis_list(kvf__redis *r, kvf__store_visit_fn visit, void *arg)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__redis_ping(kvf__redis *r)
{
    return kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
}

kvf_status kvf__redis_probe(const char *url, uint32_t timeout_ms, char *detail, size_t cap)
{
    kvf_status st = kvf__fail(KVF_ERR_UNSUPPORTED, NO_CLIENT);
    if (detail && cap)
        snprintf(detail, cap, "%s", kvf_last_error());
    return st;
}
