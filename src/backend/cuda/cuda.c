/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA memory backend: its operations, create and destroy. The
 * backend's parts and the files that hold them are listed in
 * cuda_private.h. */
#include "cuda_private.h"

#include <stddef.h>
#include <stdlib.h>

static void cuda_destroy(kvf__backend *base)
{
    cuda_backend *b = (cuda_backend *)base;
    dev_guard g;
    if (!b)
        return;
    bool entered = kvf__cuda_dev_enter(b, &g) == KVF_OK;
    /* the watcher calls the last `done`s once the streams have drained */
    for (int i = 0; i < KVF_QUEUE_COUNT; i++)
        kvf__cuda_queue_drain(&b->q[i]);
    kvf__cuda_watcher_stop(b);
    for (int i = 0; i < KVF_QUEUE_COUNT; i++)
        kvf__cuda_queue_destroy(&b->q[i], i == KVF_QUEUE_OFFLOAD ? "offload" : "onboard");
    for (int i = 0; i < b->sync_free; i++) {
        CUDA_IGNORE(cudaEventDestroy(b->sync_events[i]));
        CUDA_IGNORE(cudaStreamDestroy(b->sync_streams[i]));
    }
    if (entered)
        kvf__cuda_dev_leave(&g);
    pthread_mutex_destroy(&b->sync_lock);
    pthread_mutex_destroy(&b->range_lock);
    pthread_mutex_destroy(&b->watch_mu);
    pthread_cond_destroy(&b->watch_cv);
    free(b->ranges);
    free(b->pinned);
    free(b);
}

void *kvf__cuda_queue_stream(struct kvf__backend *base, int queue)
{
    cuda_backend *b = (cuda_backend *)base;
    return (void *)b->q[queue].stream;
}

int kvf__cuda_last_path(struct kvf__backend *base, int queue)
{
    cuda_backend *b = (cuda_backend *)base;
    return atomic_load(&b->q[queue].last_path);
}

static const kvf__backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .mem_alloc = kvf__cuda_mem_alloc,
    .mem_free = kvf__cuda_mem_free,
    .mem_register = kvf__cuda_mem_register,
    .mem_unregister = kvf__cuda_mem_unregister,
    .copy_sync = kvf__cuda_copy_sync,
    .copy_async = kvf__cuda_copy_async,
    .sync_stream = kvf__cuda_sync_stream,
    .mark = kvf__cuda_mark,
    .mark_gate = kvf__cuda_mark_gate,
    .mark_wait = kvf__cuda_mark_wait,
    .mark_free = kvf__cuda_mark_free,
    .queue_mark = kvf__cuda_queue_mark,
    .mark_join = kvf__cuda_mark_join,
};

kvf_status kvf__cuda_backend_create(const kvf_engine_config *cfg, kvf__backend **backend_p)
{
    int count = 0;
    int device = cfg ? cfg->device : 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvf__fail(KVF_ERR_NO_DEVICE, "cuda: cudaGetDeviceCount: %s", kvf__cuda_error_str(e));
    }
    if (count == 0)
        return kvf__fail(KVF_ERR_NO_DEVICE, "cuda: no CUDA device");
    if (device < 0 || device >= count)
        return kvf__fail(KVF_ERR_NO_DEVICE, "cuda: device %d: only %d device(s)", device, count);

    cuda_backend *b = calloc(1, sizeof *b);
    if (!b)
        return kvf__fail(KVF_ERR_NOMEM, "cuda: out of memory");
    b->base.ops = &cuda_ops;
    b->device = device;
    b->forced = kvf__cuda_forced_path(cfg);
    b->grid = 32;
    if (cfg &&
        cfg->struct_size >=
            offsetof(kvf_engine_config, cuda.copy_sms) + sizeof cfg->cuda.copy_sms &&
        cfg->cuda.copy_sms)
        b->grid = cfg->cuda.copy_sms > 1024 ? 1024 : cfg->cuda.copy_sms;
    pthread_mutex_init(&b->sync_lock, NULL);
    pthread_mutex_init(&b->range_lock, NULL);
    pthread_mutex_init(&b->watch_mu, NULL);
    pthread_cond_init(&b->watch_cv, NULL);

    kvf_status st;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {
        (void)cudaGetLastError();
        prev = -1;
    }
    e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = kvf__fail(KVF_ERR_NO_DEVICE, "cuda: cudaSetDevice(%d): %s", device,
                       kvf__cuda_error_str(e));
        goto out_free;
    }
    int least = 0, greatest = 0, host_ptr_ok = 0, unified = 0;
    CUDA_GOTO(cudaDeviceGetStreamPriorityRange(&least, &greatest), st, out_free);
    CUDA_GOTO(
        cudaDeviceGetAttribute(&host_ptr_ok, cudaDevAttrCanUseHostPointerForRegisteredMem, device),
        st, out_free);
    CUDA_GOTO(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device), st, out_free);
    b->kernel_ok = host_ptr_ok && unified;
    if (!b->kernel_ok && b->forced == KVF__CUDA_PATH_KERNEL)
        KVF_LOG(KVF_LOG_WARN, "cuda: device %d cannot use host pointers directly: dma copies",
                device);
    if ((st = kvf__cuda_queue_init(&b->q[KVF_QUEUE_OFFLOAD], KVF_QUEUE_OFFLOAD, least)) != KVF_OK)
        goto out_free;
    if ((st = kvf__cuda_queue_init(&b->q[KVF_QUEUE_ONBOARD], KVF_QUEUE_ONBOARD, greatest)) !=
        KVF_OK)
        goto out_free;
    if ((st = kvf__cuda_watcher_start(b)) != KVF_OK)
        goto out_free;
    /* leave the creating thread on the device it was on */
    if (prev >= 0 && prev != device)
        CUDA_IGNORE(cudaSetDevice(prev));
    KVF_LOG(KVF_LOG_INFO, "cuda: device %d, copies by %s, kernel grid %u", device,
            kvf__cuda_path_name(b->forced), b->grid);
    *backend_p = &b->base;
    return KVF_OK;
out_free:
    cuda_destroy(&b->base);
    if (prev >= 0 && prev != device)
        CUDA_IGNORE(cudaSetDevice(prev));
    return st;
}
