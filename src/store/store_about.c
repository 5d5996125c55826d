/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the registry tells a user: the stores this build has
 * (kvf_store_info_get, `kvferry info`) and what answers at a URL
 * (kvf_remote_probe), each asked of the store that serves the scheme.
 */
#include "sized.h"
#include "store.h"

#include <stdio.h>
#include <string.h>

kvf_status kvf_store_info_get(size_t index, kvf_store_info *info)
{
    kvf__clear_error();
    if (!info ||
        !kvf__sized_ok(info, offsetof(kvf_store_info, detail) + sizeof info->detail, SIZE_MAX))
        return kvf__fail(KVF_ERR_INVALID, "kvf_store_info_get: start from KVF_STORE_INFO_INIT");
    const kvf__store_kind *k = kvf__store_kind_at(index);
    if (!k)
        return KVF_ERR_NOT_FOUND;
    kvf_store_info out = KVF_STORE_INFO_INIT;
    snprintf(out.name, sizeof out.name, "%s", k->name);
    size_t used = 0;
    for (const char *const *sch = k->schemes; *sch && used < sizeof out.schemes; sch++) {
        int w = snprintf(out.schemes + used, sizeof out.schemes - used, "%s%s://", used ? " " : "",
                         *sch);
        used += w > 0 ? (size_t)w : 0;
    }
    out.built = !k->built || k->built();
    out.remote = k->remote;
    if (out.built)
        k->describe(out.detail, sizeof out.detail);
    else
        snprintf(out.detail, sizeof out.detail, "not built: needs %s", k->missing);
    kvf__sized_copy_out(info, &out, sizeof out);
    return KVF_OK;
}

kvf_status kvf_remote_probe(const char *url, uint32_t timeout_ms, char *detail, size_t cap)
{
    if (detail && cap)
        detail[0] = '\0';
    if (!url)
        url = kvf__store_url_from_env();
    kvf_status st;
    if (!url) {
        st = kvf__fail(KVF_ERR_NOT_FOUND, "no remote store: %s not set", KVF_REMOTE_URL_ENV);
    } else if ((st = kvf__store_check_url(url)) == KVF_OK) {
        const kvf__store_kind *k = kvf__store_kind_of(url);
        char shown[512];
        kvf__url_redact(url, shown, sizeof shown);
        if (!k->remote)
            st = kvf__fail(KVF_ERR_INVALID, "%s: a %s store is no remote store", shown, k->name);
        else if (k->probe)
            return k->probe(url, timeout_ms ? timeout_ms : 1000, detail, cap);
        else if (detail && cap)
            snprintf(detail, cap, "%s: %s store, nothing to reach", shown, k->name);
    }
    if (st != KVF_OK && detail && cap)
        snprintf(detail, cap, "%s", kvf_last_error());
    return st;
}
