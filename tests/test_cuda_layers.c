/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-wise batches on the GPU (skipped without one). An engine with a
 * pool per "layer" onboards blocks pool by pool in a shuffled order; a
 * caller's stream waits for each pool with kvf_stream_wait_pool and copies
 * that pool's slots away at once: every byte copied must be the block's
 * (the onboard is hundreds of MiB, so a wait that did not hold would copy
 * poison). Pools left out of the list keep their poison. Then a layer at a
 * time is offloaded right behind a late-writing kernel on the caller's
 * stream (kvf_offload_pools with a stream), and the secondary slots must
 * hold the late bytes. Random data, poisoned destinations.
 */
#include "testutil.h"
#include "testutil_cuda.h"

#include <cuda_runtime.h>

#define LAYERS 8
#define SLOTS 256
#define POISON 0xA5

/* 128 KiB a block and layer: 32 MiB a layer, 256 MiB in all */
static const kvf_geometry G = {1, 2, 8, 64, 64, KVF_DTYPE_BF16, KVF_ORDER_TOKEN_MAJOR};

typedef struct fixture {
    kvf_engine *e;
    size_t bytes;
    uint8_t *prim[LAYERS], *sec[LAYERS];
    uint8_t *img[LAYERS]; /* what the secondary slots hold */
} fixture;

static uint64_t seed = 101;

static int fx_open(fixture *f)
{
    memset(f, 0, sizeof *f);
    kvf_engine_config cfg = KVF_ENGINE_CONFIG_INIT;
    cfg.backend = KVF_BACKEND_CUDA;
    kvf_status st = kvf_engine_create(&cfg, &f->e);
    if (st == KVF_ERR_NO_DEVICE)
        TEST_SKIP_ALL("no CUDA device: %s", kvf_last_error());
    REQUIRE(st == KVF_OK);
    REQUIRE(kvf_geometry_block_bytes(&G, &f->bytes) == KVF_OK);
    for (uint32_t l = 0; l < LAYERS; l++) {
        kvf_pool_desc prim = {KVF_MEMORY_DEVICE, NULL, 0, SLOTS};
        kvf_pool_desc sec = {KVF_MEMORY_HOST_PINNED, NULL, 0, SLOTS};
        REQUIRE(kvf_engine_add_pool(f->e, &G, &prim, &sec, NULL) == KVF_OK);
        void *p = NULL;
        REQUIRE(kvf_engine_slot_ptr(f->e, l, KVF_LEVEL_PRIMARY, 0, &p) == KVF_OK);
        f->prim[l] = p;
        REQUIRE(kvf_engine_slot_ptr(f->e, l, KVF_LEVEL_SECONDARY, 0, &p) == KVF_OK);
        f->sec[l] = p;
        f->img[l] = malloc(SLOTS * f->bytes);
        REQUIRE(f->img[l]);
        test_fill_random(f->img[l], SLOTS * f->bytes, seed++);
        CUDA_OK(cudaMemcpy(f->prim[l], f->img[l], SLOTS * f->bytes, cudaMemcpyHostToDevice));
    }
    /* the secondary slots get their blocks as an engine's would: offloaded */
    kvf_move m[SLOTS];
    for (uint32_t i = 0; i < SLOTS; i++)
        m[i] = (kvf_move){i, i, 0};
    kvf_ticket t;
    REQUIRE(kvf_offload(f->e, KVF_TIER_HOST, m, SLOTS, &t) == KVF_OK);
    REQUIRE(kvf_wait(f->e, t, NULL) == KVF_OK);
    for (uint32_t l = 0; l < LAYERS; l++)
        CUDA_OK(cudaMemset(f->prim[l], POISON, SLOTS * f->bytes));
    CUDA_OK(cudaDeviceSynchronize());
    return 0;
}

static void fx_close(fixture *f)
{
    kvf_engine_destroy(f->e);
    for (uint32_t l = 0; l < LAYERS; l++)
        free(f->img[l]);
}

/* Onboards every block (secondary slot i -> primary slot SLOTS-1-i) for
 * the listed layers; the caller's stream copies each layer out right
 * after its kvf_stream_wait_pool. */
static int onboard_case(fixture *f, const uint32_t *order, uint32_t n_layers)
{
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t layer_bytes = SLOTS * f->bytes;
    uint8_t *out[LAYERS], *host = malloc(layer_bytes);
    REQUIRE(host);
    for (uint32_t l = 0; l < LAYERS; l++) {
        CUDA_OK(cudaMalloc((void **)&out[l], layer_bytes));
        CUDA_OK(cudaMemset(f->prim[l], POISON, layer_bytes));
    }
    CUDA_OK(cudaDeviceSynchronize());
    kvf_move m[SLOTS];
    for (uint32_t i = 0; i < SLOTS; i++)
        m[i] = (kvf_move){i, SLOTS - 1 - i, 0};
    kvf_ticket t = {0};
    CHECK_STATUS(kvf_onboard_pools(f->e, KVF_TIER_HOST, order, n_layers, m, SLOTS, &t), KVF_OK);
    for (uint32_t k = 0; k < n_layers; k++) {
        CHECK_STATUS(kvf_stream_wait_pool(f->e, t, order[k], (void *)s), KVF_OK);
        CUDA_OK(cudaMemcpyAsync(out[order[k]], f->prim[order[k]], layer_bytes,
                                cudaMemcpyDeviceToDevice, s));
    }
    /* the host wait for the last pool, then the whole ticket */
    CHECK_STATUS(kvf_wait_pool(f->e, t, order[n_layers - 1]), KVF_OK);
    CHECK_STATUS(kvf_wait(f->e, t, NULL), KVF_OK);
    CUDA_OK(cudaStreamSynchronize(s));
    uint8_t *want = malloc(layer_bytes);
    REQUIRE(want);
    for (uint32_t l = 0; l < LAYERS; l++) {
        bool listed = false;
        for (uint32_t k = 0; k < n_layers; k++)
            listed = listed || order[k] == l;
        if (listed) {
            /* what the stream copied the moment the pool had arrived */
            for (uint32_t i = 0; i < SLOTS; i++)
                memcpy(want + (SLOTS - 1 - i) * f->bytes, f->img[l] + i * f->bytes, f->bytes);
            CUDA_OK(cudaMemcpy(host, out[l], layer_bytes, cudaMemcpyDeviceToHost));
        } else {
            memset(want, POISON, layer_bytes);
            CUDA_OK(cudaMemcpy(host, f->prim[l], layer_bytes, cudaMemcpyDeviceToHost));
        }
        CHECK_MEM_EQ(host, want, layer_bytes);
    }
    free(want);
    free(host);
    for (uint32_t l = 0; l < LAYERS; l++)
        CUDA_OK(cudaFree(out[l]));
    CUDA_OK(cudaStreamDestroy(s));
    return 0;
}

static int test_onboard_layer_by_layer(void)
{
    fixture f;
    fx_open(&f);
    const uint32_t all[LAYERS] = {3, 0, 7, 1, 6, 2, 5, 4};
    for (int round = 0; round < 3; round++)
        onboard_case(&f, all, LAYERS);
    /* six of eight layers: the two left out keep their poison */
    const uint32_t some[6] = {5, 4, 0, 1, 7, 2};
    onboard_case(&f, some, 6);
    fx_close(&f);
    return 0;
}

/* Layer l's "forward pass" (a kernel that spins, then writes new bytes
 * over the layer's primary slots) is followed at once by the offload of
 * layer l alone, ordered after the stream: the secondary slots must hold
 * every late byte, and the host must not have waited: the stream waits at
 * a gate until every offload has been queued, so the check holds however
 * slow the host is (parallel tests). */
static int test_offload_layer_after_stream(void)
{
    fixture f;
    fx_open(&f);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    size_t layer_bytes = SLOTS * f.bytes;
    uint8_t *late[LAYERS];
    for (uint32_t l = 0; l < LAYERS; l++) {
        CUDA_OK(cudaMalloc((void **)&late[l], layer_bytes));
        test_fill_random(f.img[l], layer_bytes, seed++);
        CUDA_OK(cudaMemcpy(late[l], f.img[l], layer_bytes, cudaMemcpyHostToDevice));
        memset(f.sec[l], POISON, layer_bytes);
    }
    CUDA_OK(cudaDeviceSynchronize());
    kvf_move m[SLOTS];
    for (uint32_t i = 0; i < SLOTS; i++)
        m[i] = (kvf_move){i, i, 0};
    kvf_ticket t[LAYERS];
    test_gate gate;
    CUDA_OK(test_gate_hold(&gate, s));
    double t_late = 0, t_call = 0; /* the last layer's, after the gate was held */
    for (uint32_t l = 0; l < LAYERS; l++) {
        CUDA_OK(test_late_copy(f.prim[l], late[l], layer_bytes, l == 0 ? 5.0 : 0.5, s));
        t_late = test_gate_held_s(&gate);
        CHECK_STATUS(kvf_offload_pools(f.e, (void *)s, KVF_TIER_HOST, &l, 1, m, SLOTS, &t[l]),
                     KVF_OK);
        t_call = test_gate_held_s(&gate);
    }
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    if (!test_gate_open(&gate))
        TEST_FAIL_AT(__FILE__, __LINE__,
                     "the gate timed out (%d s) before it was opened: the last late write was "
                     "queued %.3f s after it was held, the last kvf_offload_pools returned at "
                     "%.3f s",
                     TEST_GATE_TIMEOUT_S, t_late, t_call);
    for (uint32_t l = 0; l < LAYERS; l++) {
        CHECK_STATUS(kvf_wait_pool(f.e, t[l], l), KVF_OK);
        CHECK_STATUS(kvf_wait_pool(f.e, t[l], (l + 1) % LAYERS), KVF_ERR_RANGE);
        CHECK_STATUS(kvf_wait(f.e, t[l], NULL), KVF_OK);
        CHECK_MEM_EQ(f.sec[l], f.img[l], layer_bytes);
    }
    CUDA_OK(cudaStreamSynchronize(s));
    test_gate_fini(&gate);
    for (uint32_t l = 0; l < LAYERS; l++)
        CUDA_OK(cudaFree(late[l]));
    CUDA_OK(cudaStreamDestroy(s));
    fx_close(&f);
    return 0;
}

int main(void)
{
    RUN(test_onboard_layer_by_layer);
    RUN(test_offload_layer_after_stream);
    return TEST_RESULT();
}
