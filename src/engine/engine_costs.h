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

/* A learnt cost whose newest read is older than this is forgotten: the
 * tier's starting figure again. A tier whose reads turned slow is one the
 * plans stop reading, so nothing else would ever teach them it recovered;
 * forgotten, it is read by the next plan that pays with its starting
 * figure, whose time the hedge bounds, and learnt again from that read.
 * At most one such read a minute per tier. */
#define KVF_COST_FORGET_NS (UINT64_C(60) * 1000000000u)

typedef struct kvf__costs {
    pthread_mutex_t mu; /* a leaf lock: taken under the engine's, never the other way */
    kvf_tier_cost tier[KVF_TIER_COUNT];
    /* what a forgotten tier returns to (observed 0): its starting
     * estimate, the last set value or the last calibration's fit */
    kvf_tier_cost start[KVF_TIER_COUNT];
    /* since the starting estimate or the last set value */
    kvf__cost_sample window[KVF_TIER_COUNT][KVF_COST_WINDOW];
    uint32_t samples[KVF_TIER_COUNT];
    uint64_t last_ns[KVF_TIER_COUNT]; /* when the window's newest read was observed */
    uint64_t forget_ns;               /* KVF_COST_FORGET_NS (tests shorten it); 0: never */
} kvf__costs;

/* Seeds every tier's cost for the engine's backend (cuda: pinned DMA
 * figures; host: memcpy ones). */
KVF_INTERNAL void kvf__costs_init(kvf__costs *c, bool cuda);
KVF_INTERNAL void kvf__costs_destroy(kvf__costs *c);
/* One observed read of `bytes` from `tier` taking `seconds` (both > 0). */
KVF_INTERNAL void kvf__costs_observe(kvf__costs *c, kvf_tier tier, double bytes, double seconds);
/* For the tests: forget a tier's learnt cost after `ns` without a read
 * (0: never) instead of KVF_COST_FORGET_NS. */
KVF_INTERNAL void kvf__engine_costs_forget_after(kvf_engine *e, uint64_t ns);

#endif /* KVF_ENGINE_COSTS_H */
