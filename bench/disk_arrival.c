/* SPDX-License-Identifier: Apache-2.0 */
/*
 * disk_arrival: when a layer-wise onboard from the disk tier hands over
 * its first pool, against the whole batch. Blocks of a Llama-3-8B-shaped
 * layout (a pool per layer: K and V of 8 heads of 128, bf16, token-major,
 * 16 tokens a block: 64 KiB a pool, 2 MiB a block over 32 pools) are
 * stored as files, then read back into poisoned slots, each run:
 *
 *   whole     kvf_onboard of every block, to kvf_wait
 *   first     kvf_onboard_pools of every pool, to kvf_wait_pool of pool 0
 *   pools     the same batch: each pool's arrival (kvf_wait_pool in order),
 *             the last one's being the batch's end
 *
 * Median of the runs after one warm-up, then every byte of every slot
 * checked against what was stored. The file reads are O_DIRECT unless the
 * file system refuses it, so the page cache does not serve the second run.
 *
 * Usage: disk_arrival DIR [blocks (256)] [runs (5)] [cuda]
 *   cuda: device slots on the CUDA backend (GDS where file.io allows,
 *   KVF_FILE_IO=gds), poisoned from the host tier before each load (its
 *   slots filled once from a stored block of poison bytes) and checked
 *   after copying them back to it.
 */
#define _POSIX_C_SOURCE 200809L
#include "arrival_bench.h"

#include <stdbool.h>

static kvf_engine *open_engine(const char *dir, kvf_backend backend, uint32_t slots, bool host_tier)
{
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = backend;
    cfg.file.dir = dir;
    cfg.file.namespace_ = "disk-arrival";
    cfg.file.fsync = KVF_FSYNC_NONE;
    return open_pools(&cfg, slots, host_tier);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: disk_arrival DIR [blocks] [runs] [cuda]\n");
        return 2;
    }
    const char *dir = argv[1];
    uint32_t blocks = argc > 2 ? (uint32_t)atoi(argv[2]) : 256;
    int runs = argc > 3 ? atoi(argv[3]) : 5;
    bool cuda = argc > 4 && strcmp(argv[4], "cuda") == 0;
    if (blocks == 0 || runs < 1 || runs > 99) {
        fprintf(stderr, "disk_arrival: blocks > 0, runs 1..99\n");
        return 2;
    }
    size_t bytes;
    KV(kvf_geometry_block_bytes(&G, &bytes));

    /* store the blocks from a host engine of the same layout */
    kvf_engine *w = open_engine(dir, KVF_BACKEND_HOST, blocks, false);
    kvf_move *mv = calloc(blocks, sizeof *mv);
    kvf_ticket t;
    store_poison(w, KVF_TIER_DISK, bytes);
    fill(w, KVF_LEVEL_PRIMARY, blocks, bytes);
    for (uint32_t s = 0; s < blocks; s++)
        mv[s] = (kvf_move){.src = s, .key = {0x5eed, 1 + s}};
    KV(kvf_offload(w, KVF_TIER_DISK, mv, blocks, &t));
    KV(kvf_wait(w, t, NULL));
    kvf_engine_destroy(w);

    kvf_engine *e = open_engine(dir, cuda ? KVF_BACKEND_CUDA : KVF_BACKEND_HOST, blocks, cuda);
    for (uint32_t s = 0; s < blocks; s++)
        mv[s] = (kvf_move){.dst = s, .key = {0x5eed, 1 + s}};
    poison_args pa = {e, KVF_TIER_DISK, blocks, bytes, cuda};
    arrival_runs *m = calloc(1, sizeof *m);
    m->runs = runs;
    arrival_measure(e, KVF_TIER_DISK, mv, blocks, poison_all, &pa, m);
    size_t bad = check_slots(e, blocks, bytes, cuda);
    double mb = (double)blocks * POOLS * (double)bytes / 1e6;
    printf("disk_arrival: %u blocks of %u pools x %zu bytes (%.0f MB), %s backend, %d runs "
           "(median), %u pool groups\n",
           blocks, POOLS, bytes, mb, cuda ? "cuda" : "host", runs,
           kvf_engine_arrival_groups(e, KVF_TIER_DISK));
    arrival_print(m, mb, bad);
    free(m);
    kvf_engine_destroy(e);
    free(mv);
    return bad ? 1 : 0;
}
