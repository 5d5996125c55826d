/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier's part in running its moves: its store (the file store,
 * opened at create) and the size of a worker's chunk. Everything about
 * files (the runner, O_DIRECT, io_uring, GPUDirect Storage, fsync, torn
 * and lost files) is the store's.
 */
#include "engine_private.h"

static kvf_status file_store_of(kvf_engine *e, kvf__store **s_p)
{
    *s_p = e->file_store; /* opened at create */
    return KVF_OK;
}

/* A few times a worker's share of the queue depth, so that its queue
 * stays full (the I/O engine submits as calls complete) and drains only
 * at the end of a chunk; within a staging budget. */
static size_t file_chunk_moves(const kvf_engine *e)
{
    size_t nw = e->nworkers, depth = kvf__file_store_depth(e->file_store);
    size_t budget = FILE_STAGING_BUDGET / kvf__staging_slot_bytes(e);
    size_t per = 4 * ((depth + nw - 1) / nw);
    return per > budget ? budget : per;
}

const tier_ops kvf__file_tier_ops = {file_store_of, file_chunk_moves, NULL};
