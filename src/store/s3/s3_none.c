/* SPDX-License-Identifier: Apache-2.0 */
/* The S3 store in a build without libcurl or expat: the registry names
 * what is missing (the scheme is never opened). */
#include "s3_url.h"
#include "store.h"

#include <stdio.h>

static bool s3_built(void)
{
    return false;
}

static void s3_describe(char *line, size_t cap)
{
    snprintf(line, cap, "not built");
}

static kvf_status s3_check_url(const char *url)
{
    kvf__s3_url u;
    kvf_status st = kvf__s3_url_parse(url, &u);
    kvf__s3_url_wipe(&u);
    return st;
}

static kvf_status s3_open(const kvf__store_config *cfg, kvf__store **store_p)
{
    (void)cfg;
    *store_p = NULL;
    return kvf__fail(KVF_ERR_UNSUPPORTED, "s3: this build has no S3 store: it needs %s",
                     KVF_S3_MISSING);
}

static const char *const s3_schemes[] = {"s3", NULL};

const kvf__store_kind kvf__s3_store_kind = {
    .name = "s3",
    .schemes = s3_schemes,
    .remote = true,
    .built = s3_built,
    .missing = KVF_S3_MISSING,
    .describe = s3_describe,
    .check_url = s3_check_url,
    .open = s3_open,
};
