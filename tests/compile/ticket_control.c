/* SPDX-License-Identifier: Apache-2.0 */
/* Compiles: each ticket goes to the calls of its own kind. The control for
 * ticket_mixup*.c, so that their failure to compile is the mix-up's. */
#include "kvferry.h"

kvf_status control(kvf_engine *e, kvf_cache *c, const kvf_move *m, const kvf_key *k,
                   const uint32_t *s);

kvf_status control(kvf_engine *e, kvf_cache *c, const kvf_move *m, const kvf_key *k,
                   const uint32_t *s)
{
    kvf_ticket t = {0};
    kvf_cache_ticket ct = {0};
    kvf_status st = kvf_offload(e, KVF_TIER_HOST, m, 1, &t);
    if (st == KVF_OK)
        st = kvf_wait(e, t, NULL);
    if (st == KVF_OK)
        st = kvf_cache_get(c, k, s, 1, &ct);
    return st == KVF_OK ? kvf_cache_wait(c, ct, NULL) : st;
}
