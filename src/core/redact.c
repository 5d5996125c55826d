/* SPDX-License-Identifier: Apache-2.0 */
/* A URL as kvferry shows it: see redact.h. */
#include "redact.h"

#include <stdio.h>
#include <string.h>

void kvf__url_redact(const char *url, char *out, size_t cap)
{
    if (!cap)
        return;
    const char *sep = url ? strstr(url, "://") : NULL;
    if (!sep) {
        snprintf(out, cap, "%s", url ? url : "(null)");
        return;
    }
    /* the user part ends at the last '@' before the path, as the URL
     * parsers read it (a password may hold a '?', never a '/') */
    const char *auth = sep + 3;
    size_t host_end = strcspn(auth, "/");
    const char *at = NULL;
    for (const char *q = auth; q < auth + host_end; q++)
        if (*q == '@')
            at = q;
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (!colon) {
        snprintf(out, cap, "%s", url);
        return;
    }
    snprintf(out, cap, "%.*s***%s", (int)(colon + 1 - url), url, at);
}
