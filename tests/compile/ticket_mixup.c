/* SPDX-License-Identifier: Apache-2.0 */
/* Must not compile: a cache's ticket passed to kvf_wait. */
#include "kvferry.h"

kvf_status mixup(kvf_engine *e, kvf_cache *c, const kvf_key *k, const uint32_t *s);

kvf_status mixup(kvf_engine *e, kvf_cache *c, const kvf_key *k, const uint32_t *s)
{
    kvf_cache_ticket ct = {0};
    kvf_status st = kvf_cache_get(c, k, s, 1, &ct);
    return st == KVF_OK ? kvf_wait(e, ct, NULL) : st;
}
