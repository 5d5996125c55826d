/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tiers as the engine sees them, one line each, indexed by kvf_tier:
 * their names, which calls take them in which direction, how their moves
 * run (a keyed tier's tier_ops) and whether an engine has them. The code
 * that runs batches asks this table and names no tier, so a new tier is
 * a line here (and, for a keyed one, its tier_ops and store).
 */
#include "engine_private.h"

static kvf_status host_ready(kvf_engine *e, const char *op)
{
    for (uint32_t p = 0; p < e->npools; p++)
        if (!e->pools[p].has_secondary)
            return kvf__fail(KVF_ERR_INVALID, "%s: pool %u has no secondary slots", op, p);
    return KVF_OK;
}

static kvf_status file_ready(kvf_engine *e, const char *op)
{
    if (!e->file_enabled)
        return kvf__fail(KVF_ERR_INVALID, "%s: the engine has no file tier (set file.dir)", op);
    return KVF_OK;
}

static kvf_status remote_ready(kvf_engine *e, const char *op)
{
    if (!e->remote_url)
        return kvf__fail(KVF_ERR_INVALID,
                         "%s: the engine has no remote tier (set remote.url or %s)", op,
                         KVF_REMOTE_URL_ENV);
    return KVF_OK;
}

/* The directions the public calls take a tier in, by the word their
 * messages call it: a slot tier is offloaded to and onboarded from; a
 * keyed one also takes secondary slots' blocks and removals. */
#define SLOT_DIRS(word)                                                                            \
    {                                                                                              \
        [OP_OFFLOAD] = "offload to " word, [OP_ONBOARD] = "onboard from " word                     \
    }
#define KEYED_DIRS(word)                                                                           \
    {                                                                                              \
        [OP_OFFLOAD] = "offload to " word, [OP_ONBOARD] = "onboard from " word,                    \
        [OP_DEMOTE] = "demote to " word, [OP_PROMOTE] = "promote from " word,                      \
        [OP_REMOVE] = "remove " word                                                               \
    }

const tier_info kvf__tiers[KVF_TIER_COUNT] = {
    [KVF_TIER_HOST] = {"host", "secondary slot", SLOT_DIRS("host"), NULL, host_ready},
    [KVF_TIER_DISK] = {"disk", "block", KEYED_DIRS("file"), &kvf__file_tier_ops, file_ready},
    [KVF_TIER_REMOTE] = {"remote", "remote block", KEYED_DIRS("remote"), &kvf__remote_tier_ops,
                         remote_ready},
    [KVF_TIER_GPU] =
        {"gpu", "primary slot", {[OP_COPY] = "copy", [OP_FENCE] = "fence"}, NULL, NULL},
};

kvf_status kvf__tier_kind(const char *fn, kvf_tier tier, op_dir dir, op_kind *kind_p)
{
    if ((unsigned)tier >= KVF_TIER_COUNT)
        return kvf__fail(KVF_ERR_INVALID, "%s: tier %d unknown", fn, (int)tier);
    if (!kvf__tiers[tier].op_names[dir])
        return kvf__fail(KVF_ERR_INVALID, "%s: tier %s is not one this call takes", fn,
                         kvf_tier_name(tier));
    *kind_p = (op_kind){dir, tier};
    return KVF_OK;
}

const char *kvf_tier_name(kvf_tier tier)
{
    return (unsigned)tier < KVF_TIER_COUNT ? kvf__tiers[tier].name : "?";
}

uint32_t kvf_engine_layerwise_tiers(const kvf_engine *e)
{
    /* an onboard from DISK reads block files pool group by pool group
     * (arrival.c), on every backend, and one from REMOTE its values where
     * the remote store reads in groups (all of them: kvf__store_kind's
     * read_groups); the GPU orders the copies between slots pool by pool;
     * the host backend between slots delivers whole batches */
    if (!e)
        return 0;
    uint32_t mask = 1u << KVF_TIER_DISK;
    const kvf__store_kind *rk = e->remote_url ? kvf__store_kind_of(e->remote_url) : NULL;
    if (rk && rk->group_bytes)
        mask |= 1u << KVF_TIER_REMOTE;
    if (kvf_engine_backend(e) != KVF_BACKEND_CUDA)
        return mask;
    for (unsigned t = 0; t < KVF_TIER_COUNT; t++)
        if (!tier_keyed((kvf_tier)t))
            mask |= 1u << t;
    return mask;
}
