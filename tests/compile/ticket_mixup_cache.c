/* SPDX-License-Identifier: Apache-2.0 */
/* Must not compile: an engine's ticket passed to kvf_cache_wait. */
#include "kvferry.h"

kvf_status mixup(kvf_engine *e, kvf_cache *c, const kvf_move *m);

kvf_status mixup(kvf_engine *e, kvf_cache *c, const kvf_move *m)
{
    kvf_ticket t = {0};
    kvf_status st = kvf_offload(e, KVF_TIER_HOST, m, 1, &t);
    return st == KVF_OK ? kvf_cache_wait(c, t, NULL) : st;
}
