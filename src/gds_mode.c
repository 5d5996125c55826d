/*
 * Which file path an engine takes: the choice between cuFile and the POSIX
 * path, apart from cuFile itself so that it builds and is tested
 * everywhere (gds.c needs CUDA).
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_gds_compat kvf__gds_compat_of(kvf_gds_compat c)
{
    const char *env = getenv("KVF_GDS_COMPAT");
    if (c != KVF_GDS_COMPAT_AUTO || !env || !*env || strcmp(env, "auto") == 0)
        return c;
    if (strcmp(env, "on") == 0)
        return KVF_GDS_COMPAT_ON;
    if (strcmp(env, "off") == 0)
        return KVF_GDS_COMPAT_OFF;
    KVF_LOG(KVF_LOG_WARN, "KVF_GDS_COMPAT=%s: unknown mode, ignored", env);
    return KVF_GDS_COMPAT_AUTO;
}

bool kvf__gds_choose(kvf_file_io io, kvf_gds_compat compat, const kvf__gds_probe *probe, char *why,
                     size_t cap)
{
    if (cap)
        why[0] = '\0';
    if (io == KVF_FILE_IO_POSIX)
        return false;
    switch (probe->found) {
    case KVF_GDS_P2P:
        return true;
    case KVF_GDS_COMPAT:
        if (compat == KVF_GDS_COMPAT_ON || (compat == KVF_GDS_COMPAT_AUTO && io == KVF_FILE_IO_GDS))
            return true;
        snprintf(why, cap, "cuFile has no P2P path here (%s)%s", probe->detail,
                 compat == KVF_GDS_COMPAT_OFF ? " and compat mode is off" : "");
        return false;
    default:
        snprintf(why, cap, "%s", probe->detail);
        return false;
    }
}
