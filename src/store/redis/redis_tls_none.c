/* SPDX-License-Identifier: Apache-2.0 */
/* TLS in a build whose hiredis has none (or without hiredis): a rediss://
 * URL is refused with what the build needs. */
#include "redis.h"

bool kvf__redis_tls_built(void)
{
    return false;
}

kvf_status kvf__redis_tls_check(const kvf__redis_url *u)
{
    if (!u->tls)
        return KVF_OK;
    return kvf__fail(KVF_ERR_UNSUPPORTED,
                     "rediss:// (TLS): this build's Redis client has no TLS: it needs hiredis "
                     ">= 1.0 with hiredis_ssl at build time (scripts/install-deps.sh builds one "
                     "where the system has none)");
}
