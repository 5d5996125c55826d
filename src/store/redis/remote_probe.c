/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvf_remote_probe: the public face of kvf__remote_probe, for tools and
 * users that ask whether a remote store answers before an engine uses it.
 * Built with and without the Redis client (remote_none.c says why not).
 */
#include "remote.h"

#include <stdio.h>

kvf_status kvf_remote_probe(const char *url, uint32_t timeout_ms, char *detail, size_t cap)
{
    if (!url)
        url = kvf__remote_url_from_env();
    if (!url) {
        kvf_status st =
            kvf__fail(KVF_ERR_NOT_FOUND, "no remote store: %s not set", KVF_REMOTE_URL_ENV);
        if (detail && cap)
            snprintf(detail, cap, "%s not set", KVF_REMOTE_URL_ENV);
        return st;
    }
    return kvf__remote_probe(url, timeout_ms, detail, cap);
}
