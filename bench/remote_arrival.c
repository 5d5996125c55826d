/* SPDX-License-Identifier: Apache-2.0 */
/*
 * remote_arrival: when a layer-wise onboard from the remote tier hands
 * over its first pool, against the whole batch, for the remote group size
 * of $KVF_REMOTE_GROUP_BYTES (unset: the default). Blocks of a
 * Llama-3-8B-shaped layout (a pool per layer: K and V of 8 heads of 128,
 * bf16, token-major, 16 tokens a block: 64 KiB a pool, 2 MiB a block over
 * 32 pools) are stored at URL, then read back into poisoned slots, each
 * run:
 *
 *   whole     kvf_onboard of every block, to kvf_wait
 *   first     kvf_onboard_pools of every pool, to kvf_wait_pool of pool 0
 *   pools     the same batch: each pool's arrival (kvf_wait_pool in order),
 *             the last one's being the batch's end
 *
 * Median of the runs after one warm-up, then every byte of every slot
 * checked against what was stored.
 *
 * Usage: remote_arrival URL [blocks (32)] [runs (5)] [tokens a block (16)] [cuda]
 *   cuda: device slots on the CUDA backend, poisoned from the host tier
 *   before each load (its slots filled once from a stored block of poison
 *   bytes) and checked after copying them back to it; else host slots.
 */
#define _POSIX_C_SOURCE 200809L
#include "arrival_bench.h"

static kvf_engine *open_engine(const char *url, kvf_backend backend, uint32_t slots, bool host_tier)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = backend;
    cfg.file.namespace_ = "remote-arrival";
    cfg.remote.url = url;
    cfg.remote.timeout_ms = 30000;
    return open_pools(&cfg, slots, host_tier);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: remote_arrival URL [blocks] [runs] [tokens] [cuda]\n");
        return 2;
    }
    const char *url = argv[1];
    uint32_t blocks = argc > 2 ? (uint32_t)atoi(argv[2]) : 32;
    int runs = argc > 3 ? atoi(argv[3]) : 5;
    int tokens = argc > 4 ? atoi(argv[4]) : 16;
    bool cuda = argc > 5 && strcmp(argv[5], "cuda") == 0;
    if (blocks == 0 || runs < 1 || runs > 99 || tokens < 1 || tokens > 1024) {
        fprintf(stderr, "remote_arrival: blocks > 0, runs 1..99, tokens 1..1024\n");
        return 2;
    }
    G.tokens_per_block = (uint32_t)tokens;
    size_t bytes;
    KV(kvf_geometry_block_bytes(&G, &bytes));
    /* store the blocks from a host engine of the same layout */
    kvf_engine *w = open_engine(url, KVF_BACKEND_HOST, blocks, false);
    kvf_move *mv = calloc(blocks, sizeof *mv);
    kvf_ticket t;
    store_poison(w, KVF_TIER_REMOTE, bytes);
    fill(w, KVF_LEVEL_PRIMARY, blocks, bytes);
    for (uint32_t s = 0; s < blocks; s++)
        mv[s] = (kvf_move){.src = s, .key = {0x5eed, 1 + s}};
    KV(kvf_offload(w, KVF_TIER_REMOTE, mv, blocks, &t));
    KV(kvf_wait(w, t, NULL));
    kvf_engine_destroy(w);

    kvf_engine *e = open_engine(url, cuda ? KVF_BACKEND_CUDA : KVF_BACKEND_HOST, blocks, cuda);
    for (uint32_t s = 0; s < blocks; s++)
        mv[s] = (kvf_move){.dst = s, .key = {0x5eed, 1 + s}};
    poison_args pa = {e, KVF_TIER_REMOTE, blocks, bytes, cuda};
    arrival_runs *m = calloc(1, sizeof *m);
    m->runs = runs;
    arrival_measure(e, KVF_TIER_REMOTE, mv, blocks, poison_all, &pa, m);
    size_t bad = check_slots(e, blocks, bytes, cuda);
    double mb = (double)blocks * POOLS * (double)bytes / 1e6;
    const char *set = getenv("KVF_REMOTE_GROUP_BYTES");
    printf("remote_arrival: %u blocks of %u pools x %zu bytes (%.0f MB), %s backend, %d runs "
           "(median), %u pool groups (KVF_REMOTE_GROUP_BYTES=%s)\n",
           blocks, POOLS, bytes, mb, cuda ? "cuda" : "host", runs,
           kvf_engine_arrival_groups(e, KVF_TIER_REMOTE), set && *set ? set : "default");
    arrival_print(m, mb, bad);
    free(m);
    kvf_engine_destroy(e);
    free(mv);
    return bad ? 1 : 0;
}
