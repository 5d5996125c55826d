/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-wise arrival from the disk tier: the pool groups a layer-wise
 * onboard from DISK reads a block's file in, and the marks that tell a
 * pool's waiters its group has arrived for every move of the batch.
 *
 * A group is consecutive pools of at least GROUP_MIN_BYTES of a block
 * (the last may be smaller), and there are at most GROUPS_MAX of them:
 * each group of each block is one read of the file, so a group of a
 * pool per layer would make reads of a few dozen KiB for a small model,
 * below what O_DIRECT and GPUDirect Storage need to run near the disk's
 * bandwidth (256 KiB and up), while groups of a quarter of the model
 * would hold the first layer back behind a quarter of the load. A pool's
 * wait returns once its group has arrived: layers arrive group by group
 * (kvf_engine_arrival_groups says how many there are; the planner counts
 * them). KVF_DISK_GROUP_BYTES sets the minimum (1: a group per pool;
 * checked with the settings, kvf_engine_settings' disk_group_bytes).
 */
#include "engine_private.h"

#define GROUP_MIN_BYTES ((size_t)256 << 10)
#define GROUPS_MAX 32u
/* A worker's staging for a layer-wise onboard from DISK: the batch is cut
 * into one chunk per worker, so that every chunk reads its group g before
 * any reads g + 1 (chunks in rounds would hold group 0 back until the last
 * round read it), up to this much a worker (pinned on the CUDA backend);
 * a larger batch runs in rounds, its groups arriving with the last. */
#define LAYERWISE_STAGING_BUDGET ((size_t)512 << 20)

/* The minimum bytes of a block in one group: the setting, else the larger
 * of GROUP_MIN_BYTES and the block's share of GROUPS_MAX groups. */
static size_t group_min(size_t all)
{
    uint64_t set = kvf__env_size("KVF_DISK_GROUP_BYTES");
    if (set)
        return set > SIZE_MAX ? SIZE_MAX : (size_t)set;
    size_t share = (all + GROUPS_MAX - 1) / GROUPS_MAX;
    return share > GROUP_MIN_BYTES ? share : GROUP_MIN_BYTES;
}

uint32_t kvf__arrival_groups(const kvf_engine *e, uint32_t *end)
{
    size_t all = 0;
    for (uint32_t p = 0; p < e->npools; p++)
        all += e->pools[p].block_bytes;
    size_t min = group_min(all), in = 0;
    uint32_t n = 0;
    for (uint32_t p = 0; p < e->npools; p++) {
        in += e->pools[p].block_bytes;
        if (in >= min || p + 1 == e->npools) {
            /* a last group short of the minimum joins the one before */
            if (p + 1 == e->npools && in < min && n > 0)
                n--;
            if (end)
                end[n] = p + 1;
            n++;
            in = 0;
        }
    }
    return n;
}

kvf_status kvf__arrival_setup(kvf_engine *e)
{
    /* a freeze that failed after it may run it again */
    free(e->group_end);
    free(e->pool_group);
    e->group_end = malloc(e->npools * sizeof *e->group_end);
    e->pool_group = malloc(e->npools * sizeof *e->pool_group);
    if (!e->group_end || !e->pool_group) {
        free(e->group_end);
        free(e->pool_group);
        e->group_end = e->pool_group = NULL;
        return kvf__fail(KVF_ERR_NOMEM, "engine: out of memory for the pool groups");
    }
    e->ngroups = kvf__arrival_groups(e, e->group_end);
    size_t first = 0;
    for (uint32_t g = 0, p = 0; g < e->ngroups; g++)
        for (; p < e->group_end[g]; p++) {
            e->pool_group[p] = g;
            if (g == 0)
                first += e->pools[p].block_bytes;
        }
    e->group_first_bytes = kvf__staging_prefix_bytes(e) + first;
    return KVF_OK;
}

uint32_t kvf_engine_arrival_groups(const kvf_engine *e, kvf_tier tier)
{
    if (!e || (unsigned)tier >= KVF_TIER_COUNT || !(kvf_engine_layerwise_tiers(e) >> tier & 1u))
        return 0;
    if (tier == KVF_TIER_DISK)
        return e->frozen ? e->ngroups : kvf__arrival_groups(e, NULL);
    return e->npools;
}

void kvf__arrival_mark(kvf_engine *e, batch *b, uint32_t g, size_t moves)
{
    batch *root = b->group ? b->group : b;
    pool_sel *s = root->sel;
    if (!s || !s->group_moves || g >= e->ngroups)
        return;
    engine_lock(e);
    s->group_moves[g] += moves;
    uint32_t was = s->arrived;
    while (s->arrived < e->ngroups && s->group_moves[s->arrived] >= root->n)
        s->arrived++;
    if (s->arrived != was)
        pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
}

bool kvf__arrival_grouped(const kvf_engine *e, const batch *b)
{
    const batch *root = b->group ? b->group : b;
    return root->sel && root->sel->group_moves && e->ngroups > 1;
}

size_t kvf__arrival_chunk_moves(const kvf_engine *e, const batch *b)
{
    size_t share = (b->n + e->nworkers - 1) / e->nworkers;
    size_t budget = LAYERWISE_STAGING_BUDGET / kvf__staging_slot_bytes(e);
    size_t c = share < budget ? share : budget;
    return c ? c : 1;
}

bool kvf__pool_arrived(const kvf_engine *e, const batch *b, uint32_t pi)
{
    const pool_sel *s = b->sel;
    return s && s->group_moves && pi < e->npools && e->pool_group && e->pool_group[pi] < s->arrived;
}
