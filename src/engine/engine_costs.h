/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a read from each tier costs the engine (kvf_engine_costs): a
 * latency per batch and a throughput, seeded per backend and learnt from
 * the engine's own completed onboards (costs.c).
 */
#ifndef KVF_ENGINE_COSTS_H
#define KVF_ENGINE_COSTS_H

#include "common.h"

/* The reads a tier's fit is made from: the latest ones, oldest replaced. */
#define KVF_COST_WINDOW 24

typedef struct kvf__cost_sample {
    double bytes, seconds;
} kvf__cost_sample;

typedef struct kvf__costs {
    pthread_mutex_t mu; /* a leaf lock: taken under the engine's, never the other way */
    kvf_tier_cost tier[KVF_TIER_COUNT];
    /* since the starting estimate or the last set value */
    kvf__cost_sample window[KVF_TIER_COUNT][KVF_COST_WINDOW];
    uint32_t samples[KVF_TIER_COUNT];
} kvf__costs;

/* Seeds every tier's cost for the engine's backend (cuda: pinned DMA
 * figures; host: memcpy ones). */
KVF_INTERNAL void kvf__costs_init(kvf__costs *c, bool cuda);
KVF_INTERNAL void kvf__costs_destroy(kvf__costs *c);
/* One observed read of `bytes` from `tier` taking `seconds` (both > 0). */
KVF_INTERNAL void kvf__costs_observe(kvf__costs *c, kvf_tier tier, double bytes, double seconds);

#endif /* KVF_ENGINE_COSTS_H */
