/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which file path an engine takes: the choice between cuFile and the POSIX
 * path, apart from cuFile itself so that it builds and is tested
 * everywhere (gds.c needs CUDA).
 */
#include "gds.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_gds_compat kvf__gds_compat_of(kvf_gds_compat c)
{
    static const char *const names[] = {"off", "on"};
    static const kvf_gds_compat values[] = {KVF_GDS_COMPAT_OFF, KVF_GDS_COMPAT_ON};
    if (c != KVF_GDS_COMPAT_AUTO)
        return c;
    int i = kvf__env_choice("KVF_GDS_COMPAT", names, 2);
    return i < 0 ? KVF_GDS_COMPAT_AUTO : values[i];
}

bool kvf__gds_choose(kvf_file_io io, kvf_gds_compat compat, const kvf__gds_probe *probe, char *why,
                     size_t cap)
{
    if (cap)
        why[0] = '\0';
    if (io == KVF_FILE_IO_POSIX)
        return false;
    switch (probe->found) {
    case KVF_GDS_STATE_P2P:
        return true;
    case KVF_GDS_STATE_COMPAT:
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
