/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-wise arrival from the slow tiers: the pool groups a layer-wise
 * onboard from DISK or REMOTE reads a stored block in, and the marks that
 * tell a pool's waiters its group has arrived for every move of the batch.
 *
 * A group is consecutive pools of at least a tier's minimum bytes of a
 * block (the last may be smaller), and there are at most GROUPS_MAX of
 * them: each group of each block is one read, so a group of a pool per
 * layer would make reads of a few dozen KiB for a small model, while
 * groups of a quarter of the model would hold the first layer back behind
 * a quarter of the load. A pool's wait returns once its group has
 * arrived: layers arrive group by group (kvf_engine_arrival_groups says
 * how many there are; the planner counts them).
 *
 * DISK: at least DISK_GROUP_MIN_BYTES, below which O_DIRECT and GPUDirect
 * Storage run far from the disk's bandwidth; KVF_DISK_GROUP_BYTES sets it.
 * REMOTE: a group is a round of ranged reads of the call's blocks (one
 * Redis pipeline per node, the S3 requests in flight together), and every
 * round pays a round trip and, on S3, a signed request per block: the
 * remote store says its own minimum (kvf__store_kind.group_bytes: Redis
 * 256 KiB, S3 32 MiB, from bench/results/remote_groups.txt);
 * KVF_REMOTE_GROUP_BYTES sets it. 1 in either setting: a group per pool
 * (checked with the settings, kvf_engine_settings' disk_group_bytes and
 * remote_group_bytes).
 */
#include "engine_private.h"

#define DISK_GROUP_MIN_BYTES ((size_t)256 << 10)
#define GROUPS_MAX 32u
/* A worker's staging for a layer-wise onboard: the batch is cut into one
 * chunk per worker, so that every chunk reads its group g before any
 * reads g + 1 (chunks in rounds would hold group 0 back until the last
 * round read it), up to this much a worker (pinned on the CUDA backend);
 * a larger batch runs in rounds, its groups arriving with the last. */
#define LAYERWISE_STAGING_BUDGET ((size_t)512 << 20)

/* arrival[] of a tier read in groups: DISK [0], REMOTE [1]; -1 otherwise */
static int arrival_index(kvf_tier tier)
{
    return tier == KVF_TIER_DISK ? 0 : tier == KVF_TIER_REMOTE ? 1 : -1;
}

/* The minimum bytes of a block in one group of `tier`: its setting, else
 * the larger of its minimum (the remote store's own) and the block's
 * share of GROUPS_MAX groups. */
static size_t group_min(const kvf_engine *e, kvf_tier tier, size_t all)
{
    bool remote = tier == KVF_TIER_REMOTE;
    uint64_t set = kvf__env_size(remote ? "KVF_REMOTE_GROUP_BYTES" : "KVF_DISK_GROUP_BYTES");
    if (set)
        return set > SIZE_MAX ? SIZE_MAX : (size_t)set;
    const kvf__store_kind *k = remote && e->remote_url ? kvf__store_kind_of(e->remote_url) : NULL;
    size_t floor = !remote ? DISK_GROUP_MIN_BYTES : k && k->group_bytes ? k->group_bytes : SIZE_MAX;
    size_t share = (all + GROUPS_MAX - 1) / GROUPS_MAX;
    return share > floor ? share : floor;
}

uint32_t kvf__arrival_groups(const kvf_engine *e, kvf_tier tier, uint32_t *end)
{
    size_t all = 0;
    for (uint32_t p = 0; p < e->npools; p++)
        all += e->pools[p].block_bytes;
    size_t min = group_min(e, tier, all), in = 0;
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

static void groups_free(arrival_groups *a)
{
    free(a->end);
    free(a->pool_group);
    *a = (arrival_groups){0};
}

void kvf__arrival_free(kvf_engine *e)
{
    for (size_t i = 0; i < 2; i++)
        groups_free(&e->arrival[i]);
}

static kvf_status groups_setup(kvf_engine *e, kvf_tier tier, arrival_groups *a)
{
    /* a freeze that failed after it may run it again */
    groups_free(a);
    a->end = malloc(e->npools * sizeof *a->end);
    a->pool_group = malloc(e->npools * sizeof *a->pool_group);
    if (!a->end || !a->pool_group) {
        groups_free(a);
        return kvf__fail(KVF_ERR_NOMEM, "engine: out of memory for the pool groups");
    }
    a->n = kvf__arrival_groups(e, tier, a->end);
    size_t first = 0;
    for (uint32_t g = 0, p = 0; g < a->n; g++)
        for (; p < a->end[g]; p++) {
            a->pool_group[p] = g;
            if (g == 0)
                first += e->pools[p].block_bytes;
        }
    a->first_bytes = kvf__staging_prefix_bytes(e) + first;
    return KVF_OK;
}

kvf_status kvf__arrival_setup(kvf_engine *e)
{
    kvf_status st = groups_setup(e, KVF_TIER_DISK, &e->arrival[0]);
    if (st == KVF_OK)
        st = groups_setup(e, KVF_TIER_REMOTE, &e->arrival[1]);
    if (st != KVF_OK)
        kvf__arrival_free(e);
    return st;
}

const arrival_groups *kvf__arrival_of(const kvf_engine *e, kvf_tier tier)
{
    int i = arrival_index(tier);
    return i < 0 ? NULL : &e->arrival[i];
}

uint32_t kvf_engine_arrival_groups(const kvf_engine *e, kvf_tier tier)
{
    if (!e || (unsigned)tier >= KVF_TIER_COUNT || !(kvf_engine_layerwise_tiers(e) >> tier & 1u))
        return 0;
    const arrival_groups *a = kvf__arrival_of(e, tier);
    if (a)
        return e->frozen ? a->n : kvf__arrival_groups(e, tier, NULL);
    return e->npools;
}

void kvf__arrival_mark(kvf_engine *e, batch *b, uint32_t g, size_t moves)
{
    batch *root = b->group ? b->group : b;
    pool_sel *s = root->sel;
    const arrival_groups *a = kvf__arrival_of(e, root->kind.tier);
    if (!s || !s->group_moves || !a || g >= a->n)
        return;
    engine_lock(e);
    s->group_moves[g] += moves;
    uint32_t was = s->arrived;
    while (s->arrived < a->n && s->group_moves[s->arrived] >= root->n)
        s->arrived++;
    if (s->arrived != was)
        pthread_cond_broadcast(&e->done_cv);
    pthread_mutex_unlock(&e->mu);
}

bool kvf__arrival_grouped(const kvf_engine *e, const batch *b)
{
    const batch *root = b->group ? b->group : b;
    const arrival_groups *a = kvf__arrival_of(e, root->kind.tier);
    return root->sel && root->sel->group_moves && a && a->n > 1;
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
    const arrival_groups *a = kvf__arrival_of(e, b->kind.tier);
    return s && s->group_moves && pi < e->npools && a && a->pool_group &&
           a->pool_group[pi] < s->arrived;
}
